//! The `ScreenActor`: one per bot screen. Allocates the display slot lazily, tracks the slot
//! generation that capabilities bind, and tears down in the safe order: revoke every
//! capability of the slot first, then stop its processes. A failed teardown keeps the slot
//! reserved for retry.

use std::sync::Arc;

use actix::prelude::*;
use async_trait::async_trait;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, Set, TransactionTrait,
};
use serde::Serialize;

use crate::clock::{new_id, now_ms};
use crate::computer::{Call, ComputerActor, Op, OpOutput};
use crate::entity::{computer, screen};
use crate::error::{DomainError, DomainResult};
use crate::runtime::Runtime;

/// Closes live sockets of a slot before it is reused (the screen gateway implements it).
#[async_trait]
pub trait ScreenRevoker: Send + Sync + 'static {
    /// Close every socket bound to `(computer, slot)` at a generation below `generation`;
    /// returns once they were told to close.
    async fn revoke_slot(&self, computer_id: &str, slot: u32, generation: i64);
}

/// A revoker for deployments without a screen gateway.
pub struct NoRevoker;

#[async_trait]
impl ScreenRevoker for NoRevoker {
    async fn revoke_slot(&self, _: &str, _: u32, _: i64) {}
}

/// A screen's current assignment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScreenState {
    /// Display slot.
    pub slot: u32,
    /// Generation that capabilities bind.
    pub generation: i64,
}

/// Open (or get) the screen.
#[derive(Message)]
#[rtype(result = "DomainResult<ScreenState>")]
pub struct Open;

/// Tear the screen down (failed or canceled run, computer deletion, eviction).
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct Teardown;

/// One bot's screen on one computer.
pub struct ScreenActor {
    computer_id: String,
    space_id: String,
    bot_id: String,
    rt: Arc<Runtime>,
    computer: Addr<ComputerActor>,
    revoker: Arc<dyn ScreenRevoker>,
    current: Option<ScreenState>,
}

impl ScreenActor {
    /// The screen actor of `bot_id` on a computer.
    pub fn new(
        computer_id: String,
        space_id: String,
        bot_id: String,
        rt: Arc<Runtime>,
        computer: Addr<ComputerActor>,
        revoker: Arc<dyn ScreenRevoker>,
    ) -> Self {
        Self {
            computer_id,
            space_id,
            bot_id,
            rt,
            computer,
            revoker,
            current: None,
        }
    }
}

impl Actor for ScreenActor {
    type Context = Context<Self>;
}

async fn row(rt: &Runtime, computer_id: &str, bot_id: &str) -> DomainResult<screen::Model> {
    if let Some(found) = screen::Entity::find()
        .filter(screen::Column::ComputerId.eq(computer_id))
        .filter(screen::Column::BotId.eq(bot_id))
        .one(&rt.db)
        .await?
    {
        return Ok(found);
    }
    let now = now_ms();
    Ok(screen::ActiveModel {
        id: Set(new_id()),
        computer_id: Set(computer_id.into()),
        bot_id: Set(bot_id.into()),
        slot: Set(None),
        generation: Set(0),
        state: Set("released".into()),
        profile_path: Set(format!(".browser-profiles/{bot_id}")),
        last_used_at_ms: Set(now),
        updated_at_ms: Set(now),
    }
    .insert(&rt.db)
    .await?)
}

/// The next screen generation of a computer: one counter for all its slots (the computer
/// row's epoch, bumped under its row lock), so a generation never repeats on any slot and a
/// revocation watermark of one bot's slot can never cover the next bot's capabilities.
async fn next_generation(rt: &Runtime, computer_id: &str) -> DomainResult<i64> {
    let txn = rt.db.begin().await?;
    computer::Entity::update_many()
        .col_expr(
            computer::Column::LeaseEpoch,
            Expr::col(computer::Column::LeaseEpoch).add(1),
        )
        .filter(computer::Column::Id.eq(computer_id))
        .exec(&txn)
        .await?;
    let row = computer::Entity::find_by_id(computer_id)
        .one(&txn)
        .await?
        .ok_or_else(|| DomainError::not_found("computer"))?;
    txn.commit().await?;
    Ok(row.lease_epoch)
}

impl Handler<Open> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<ScreenState>>;

    fn handle(&mut self, _: Open, _: &mut Context<Self>) -> Self::Result {
        let (rt, computer, computer_id, bot_id) = (
            self.rt.clone(),
            self.computer.clone(),
            self.computer_id.clone(),
            self.bot_id.clone(),
        );
        let current = self.current.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let OpOutput::Screen(info) = computer
                    .send(Call(Op::OpenScreen(bot_id.clone())))
                    .await??
                else {
                    return Err(DomainError::new(
                        crate::ErrorCode::Internal,
                        "unexpected provider reply",
                    ));
                };
                // This actor is the only writer of its row: a screen it already holds on the
                // same slot needs no database round trip (observe and act call this each time).
                if let Some(held) = current.as_ref().filter(|c| c.slot == info.slot) {
                    return Ok(held.clone());
                }
                // A newly held slot always gets a new generation.
                let existing = row(&rt, &computer_id, &bot_id).await?;
                let mut active = existing.into_active_model();
                let generation = next_generation(&rt, &computer_id).await?;
                active.slot = Set(Some(info.slot as i64));
                active.generation = Set(generation);
                active.state = Set("active".into());
                active.last_used_at_ms = Set(now_ms());
                active.updated_at_ms = Set(now_ms());
                active.update(&rt.db).await?;
                Ok(ScreenState {
                    slot: info.slot,
                    generation,
                })
            }
            .into_actor(self)
            .map(|res, act, _| {
                if let Ok(state) = &res {
                    act.current = Some(state.clone());
                }
                res
            }),
        ))
    }
}

impl Handler<Teardown> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, _: Teardown, _: &mut Context<Self>) -> Self::Result {
        let (rt, computer, computer_id, bot_id) = (
            self.rt.clone(),
            self.computer.clone(),
            self.computer_id.clone(),
            self.bot_id.clone(),
        );
        let revoker = self.revoker.clone();
        let space_id = self.space_id.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let existing = row(&rt, &computer_id, &bot_id).await?;
                let Some(slot) = existing.slot else { return Ok(()) };
                // The generation moves first: every capability bound to the old one is dead.
                let generation = next_generation(&rt, &computer_id).await?;
                let mut active = existing.into_active_model();
                active.generation = Set(generation);
                active.state = Set("teardown_failed".into());
                active.updated_at_ms = Set(now_ms());
                let existing = active.update(&rt.db).await?;
                revoker.revoke_slot(&computer_id, slot as u32, generation).await;
                rt.events.publish(&space_id, crate::events::Topic::ScreenState, serde_json::json!({
                    "computerId": computer_id, "botId": bot_id, "slot": slot, "generation": generation,
                    "state": "torn_down",
                }));
                computer.send(Call(Op::CloseScreen(bot_id.clone()))).await??;
                let mut active = existing.into_active_model();
                active.slot = Set(None);
                active.state = Set("released".into());
                active.updated_at_ms = Set(now_ms());
                active.update(&rt.db).await?;
                Ok(())
            }
            .into_actor(self)
            .map(|res, act, _| {
                if res.is_ok() {
                    act.current = None;
                }
                res
            }),
        ))
    }
}
