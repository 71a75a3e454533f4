//! Which process holds each computer's actor. A computer's machine, timers and stretches
//! belong to one process at a time: the one named by its `computer_owners` row. A process
//! claims a computer before its actor gets a machine; a claim held by a process that is gone
//! (no row, or a silent heartbeat) is taken over by one conditional update, so exactly one
//! claimant wins. A process that is not the owner forwards machine calls and screen
//! operations to it.

use async_trait::async_trait;
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{Outcome, Reason};
use crate::clock::now_ms;
use crate::computer::{Op, OpOutput};
use crate::entity::computer_owner;
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::processes::{self, Processes};
use crate::screen::{ScreenOp, ScreenState};

/// Who holds a computer's actor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This process.
    Me,
    /// Another live process, reachable at `address` (`None`: it serves no internal endpoint).
    Elsewhere {
        /// The owning process.
        process_id: String,
        /// Its internal endpoints' base URL.
        address: Option<String>,
        /// The loopback it shares ([`crate::processes::host`]).
        host: Option<String>,
    },
}

/// Claims over the database.
#[derive(Clone)]
pub struct Owners {
    db: DatabaseConnection,
}

impl Owners {
    /// Claims over a database.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// Claims `computer_id` for this process unless a live process holds it; answers who
    /// holds it now.
    pub async fn claim(&self, computer_id: &str) -> DomainResult<Owner> {
        let me = processes::id();
        computer_owner::Entity::insert(computer_owner::ActiveModel {
            computer_id: Set(computer_id.to_owned()),
            process_id: Set(me.to_owned()),
            claimed_at_ms: Set(now_ms()),
        })
        .on_conflict(
            OnConflict::column(computer_owner::Column::ComputerId)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(&self.db)
        .await?;
        for _ in 0..3 {
            let Some(row) = computer_owner::Entity::find_by_id(computer_id)
                .one(&self.db)
                .await?
            else {
                // Released meanwhile: claim again.
                return Box::pin(self.claim(computer_id)).await;
            };
            if row.process_id == me {
                return Ok(Owner::Me);
            }
            if let Some(owner) = Processes::new(self.db.clone())
                .live(&row.process_id)
                .await?
            {
                return Ok(Owner::Elsewhere {
                    process_id: owner.id,
                    address: owner.address,
                    host: owner.host,
                });
            }
            // The owner is gone: take over, unless someone else did first.
            let taken = computer_owner::Entity::update_many()
                .col_expr(computer_owner::Column::ProcessId, Expr::value(me))
                .col_expr(computer_owner::Column::ClaimedAtMs, Expr::value(now_ms()))
                .filter(computer_owner::Column::ComputerId.eq(computer_id))
                .filter(computer_owner::Column::ProcessId.eq(row.process_id.as_str()))
                .exec(&self.db)
                .await?
                .rows_affected;
            if taken == 1 {
                tracing::info!(event = "computer.taken_over", computer.id = computer_id);
                return Ok(Owner::Me);
            }
        }
        Err(DomainError::new(
            ErrorCode::ComputerUnavailable,
            "the computer's owner is changing; try again",
        ))
    }

    /// Who holds `computer_id` now, without claiming it (`None`: nobody, or a gone process).
    pub async fn holder(&self, computer_id: &str) -> DomainResult<Option<Owner>> {
        let Some(row) = computer_owner::Entity::find_by_id(computer_id)
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        if row.process_id == processes::id() {
            return Ok(Some(Owner::Me));
        }
        Ok(Processes::new(self.db.clone())
            .live(&row.process_id)
            .await?
            .map(|p| Owner::Elsewhere {
                process_id: p.id,
                address: p.address,
                host: p.host,
            }))
    }

    /// Gives up this process's claim (its actor holds no machine any more).
    pub async fn release(&self, computer_id: &str) -> DomainResult<()> {
        computer_owner::Entity::delete_many()
            .filter(computer_owner::Column::ComputerId.eq(computer_id))
            .filter(computer_owner::Column::ProcessId.eq(processes::id()))
            .exec(&self.db)
            .await?;
        Ok(())
    }
}

/// What a process sends the owner of a computer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Remote {
    /// A machine call.
    Call(Op),
    /// `computer.stop`.
    Stop,
    /// A checkpoint (after a run ended, or asked for).
    Save(Reason),
    /// An operation on a bot's screen: the screen slots of a computer are decided only by the
    /// process that holds its actor.
    #[serde(rename_all = "camelCase")]
    Screen {
        /// Whose screen.
        bot_id: String,
        /// What to do.
        op: ScreenOp,
    },
}

/// What the owner answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RemoteOutput {
    /// A machine call's result.
    Call(OpOutput),
    /// The stop is done.
    Stopped,
    /// What the checkpoint did (`None`: no machine runs).
    Saved(Option<Outcome>),
    /// The screen after a [`Remote::Screen`] (`None` after a teardown or an eviction).
    Screen(Option<ScreenState>),
}

/// The port through which a process reaches the owner of a computer (an adapter speaks the
/// internal HTTP endpoint).
#[async_trait]
pub trait Forward: Send + Sync {
    /// Sends `what` for `computer_id` to the process serving `address`.
    async fn send(
        &self,
        address: &str,
        computer_id: &str,
        what: Remote,
    ) -> DomainResult<RemoteOutput>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A process that does not hold the computer forwards the screen operation without a
    /// slot number: only the holder's slot table numbers slots, and its answer names the slot.
    #[test]
    fn a_forwarded_screen_open_names_no_slot_and_the_holders_answer_does() {
        let sent = serde_json::to_value(Remote::Screen {
            bot_id: "bot-a".into(),
            op: ScreenOp::Open,
        })
        .unwrap();
        assert_eq!(
            sent,
            json!({ "screen": { "botId": "bot-a", "op": "open" } })
        );
        let answer: RemoteOutput =
            serde_json::from_value(json!({ "screen": { "slot": 3, "generation": 9 } })).unwrap();
        assert!(matches!(
            answer,
            RemoteOutput::Screen(Some(ScreenState {
                slot: 3,
                generation: 9
            }))
        ));
    }
}
