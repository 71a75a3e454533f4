//! Durable maintenance operations (`computer.update`, `computer.recover`, `computer.reset`)
//! in `maintenance_operations`, and the rules a worker follows with them.
//!
//! An operation takes the computer-wide maintenance reservation (a `leases` row held by
//! `maintenance-operation:<id>`) when it is queued and gives it back only when it completes,
//! fails, or an interrupted operation is released. While it holds it, new execution leases,
//! takeover, stop, idle suspension and other maintenance are refused with
//! `COMPUTER_RESERVED` (see `leases`). The reservation never expires on its own and names no
//! process, so a worker whose heartbeat went stale never frees it: only
//! [`Maintenance::release_interrupted`], which a server owner calls after asserting the
//! workers and provider calls have stopped.
//!
//! States: `queued` → (claimed by one worker, once) `running` → `completed` | `failed`; a
//! running operation without a heartbeat for the timeout becomes `interrupted` and stays
//! reserved; `release_interrupted` makes it `released` and recovery available. A claim is a
//! conditional update from `queued`, so an operation is run at most once: it is never
//! claimed again, whatever happens to its worker (no destructive replay).

use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, Set,
};
use serde::Serialize;

use crate::clock::{Clock, new_id};
use crate::entity::{computer, maintenance_operation as op};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::leases::{LeaseKey, LeaseKind, Leases};

/// The default of `COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS`: a worker that has not beaten
/// for this long is taken as gone and its operation is `interrupted`.
pub const HEARTBEAT_TIMEOUT_MS: i64 = 10 * 60 * 1000;
/// How often a worker beats while it runs an operation.
pub const HEARTBEAT_EVERY_MS: i64 = 30 * 1000;
/// A queued operation not claimed this long after it was published is published again.
pub const REPUBLISH_AFTER_MS: i64 = 60 * 1000;
/// Lifetime of the reservation's lease row: it is released explicitly, never by expiry.
const RESERVATION_TTL_MS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Rebuild with the configured provider and image; checkpoints live work first and
    /// fails without touching the machine when it cannot.
    Update,
    /// Replace the machine; tries to checkpoint live work and falls back to the last saved
    /// workspace (unsaved work may be lost).
    Recovery,
    /// Replace the machine from the last saved workspace without reading the old machine.
    Reset,
}

impl OpKind {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Update => "update",
            Self::Recovery => "recovery",
            Self::Reset => "reset",
        }
    }

    /// From the stored form.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "update" => Some(Self::Update),
            "recovery" => Some(Self::Recovery),
            "reset" => Some(Self::Reset),
            _ => None,
        }
    }
}

/// The states of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    /// Waiting for a worker.
    Queued,
    /// A worker claimed it and beats.
    Running,
    /// Its worker stopped beating; still reserved.
    Interrupted,
    /// An interrupted operation a server owner released.
    Released,
    /// Done.
    Completed,
    /// Ended with an error; the reservation is released.
    Failed,
}

impl OpState {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Interrupted => "interrupted",
            Self::Released => "released",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

/// The lifecycle stages an operation reports, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Saving live work to a checkpoint.
    Checkpointing,
    /// Stopping and destroying the old machine.
    TearingDown,
    /// Creating the new machine and importing the workspace.
    Provisioning,
    /// The new machine is ready.
    Ready,
}

impl Stage {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checkpointing => "checkpointing",
            Self::TearingDown => "tearing_down",
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
        }
    }
}

/// JSON form of an operation (the API's answers and the `maintenance.changed` events).
pub fn operation_json(o: &op::Model) -> serde_json::Value {
    serde_json::json!({
        "id": o.id, "computerId": o.computer_id, "spaceId": o.space_id, "kind": o.kind,
        "state": o.state, "stage": o.stage, "error": o.error, "note": o.note,
        "heartbeatAtMs": o.heartbeat_at_ms, "createdAtMs": o.created_at_ms,
        "updatedAtMs": o.updated_at_ms, "finishedAtMs": o.finished_at_ms,
    })
}

/// Tell the space's subscribers (and, through the relay, the other processes) how an
/// operation stands now.
pub fn announce(events: &crate::events::EventBus, o: &op::Model) {
    events.publish(
        o.space_id.as_deref().unwrap_or_default(),
        crate::events::Topic::MaintenanceChanged,
        operation_json(o),
    );
}

/// The reservation holder of an operation.
pub fn holder(op_id: &str) -> String {
    format!("maintenance-operation:{op_id}")
}

/// Maintenance rules over the database, timed by `clock`.
#[derive(Clone)]
pub struct Maintenance {
    db: DatabaseConnection,
    clock: Clock,
}

impl Maintenance {
    /// Rules over a database.
    pub fn new(db: DatabaseConnection, clock: Clock) -> Self {
        Self { db, clock }
    }

    /// An operation by id.
    pub async fn get(&self, id: &str) -> DomainResult<op::Model> {
        op::Entity::find_by_id(id)
            .one(&self.db)
            .await?
            .ok_or_else(|| DomainError::not_found("operation"))
    }

    /// Queue an operation on a computer, taking its reservation. `COMPUTER_RESERVED` while
    /// another reservation is live (another operation, an interrupted one not yet released,
    /// an idle suspension); `STOP_BOT_FIRST` while a bot drives the computer or a person
    /// controls a screen of it (they would act on the machine being replaced).
    pub async fn enqueue(
        &self,
        row: &computer::Model,
        kind: OpKind,
        requested_by: &str,
    ) -> DomainResult<op::Model> {
        let leases = Leases::new(self.db.clone());
        if leases
            .live_on(&row.id)
            .await?
            .iter()
            .any(|g| g.kind != LeaseKind::Maintenance)
        {
            return Err(DomainError::code(ErrorCode::StopBotFirst));
        }
        let id = new_id();
        let grant = leases
            .acquire(
                &LeaseKey::maintenance(&row.id),
                &holder(&id),
                RESERVATION_TTL_MS,
            )
            .await?;
        let now = self.clock.now_ms();
        let inserted = op::ActiveModel {
            id: Set(id),
            computer_id: Set(row.id.clone()),
            space_id: Set(Some(row.space_id.clone())),
            kind: Set(kind.as_str().into()),
            state: Set(OpState::Queued.as_str().into()),
            stage: Set(None),
            worker_id: Set(None),
            heartbeat_at_ms: Set(None),
            error: Set(None),
            requested_by: Set(Some(requested_by.into())),
            lease_fence: Set(Some(grant.fence)),
            claimed_at_ms: Set(None),
            finished_at_ms: Set(None),
            published_at_ms: Set(Some(now)),
            note: Set(None),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
        }
        .insert(&self.db)
        .await;
        match inserted {
            Ok(row) => Ok(row),
            Err(e) => {
                let _ = leases
                    .release(&LeaseKey::maintenance(&row.id), grant.fence)
                    .await;
                Err(e.into())
            }
        }
    }

    /// Claim a queued operation for `worker`; `None` when it is not queued any more (another
    /// worker claimed it, or it ended). The one way an operation starts running.
    pub async fn claim(&self, id: &str, worker: &str) -> DomainResult<Option<op::Model>> {
        let now = self.clock.now_ms();
        let res = op::Entity::update_many()
            .col_expr(op::Column::State, Expr::value(OpState::Running.as_str()))
            .col_expr(op::Column::WorkerId, Expr::value(worker))
            .col_expr(op::Column::HeartbeatAtMs, Expr::value(now))
            .col_expr(op::Column::ClaimedAtMs, Expr::value(now))
            .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
            .filter(op::Column::Id.eq(id))
            .filter(op::Column::State.eq(OpState::Queued.as_str()))
            .exec(&self.db)
            .await?;
        if res.rows_affected == 0 {
            return Ok(None);
        }
        Ok(Some(self.get(id).await?))
    }

    /// Beat `worker`'s heartbeat on its running operation; false when the operation is no
    /// longer running under it (it was marked interrupted): the worker must stop.
    pub async fn heartbeat(&self, id: &str, worker: &str) -> DomainResult<bool> {
        let now = self.clock.now_ms();
        let res = op::Entity::update_many()
            .col_expr(op::Column::HeartbeatAtMs, Expr::value(now))
            .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
            .filter(op::Column::Id.eq(id))
            .filter(op::Column::WorkerId.eq(worker))
            .filter(op::Column::State.eq(OpState::Running.as_str()))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected == 1)
    }

    /// Record the stage `worker` reached (and beat); false as for [`Self::heartbeat`].
    pub async fn stage(&self, id: &str, worker: &str, stage: Stage) -> DomainResult<bool> {
        let now = self.clock.now_ms();
        let res = op::Entity::update_many()
            .col_expr(op::Column::Stage, Expr::value(stage.as_str()))
            .col_expr(op::Column::HeartbeatAtMs, Expr::value(now))
            .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
            .filter(op::Column::Id.eq(id))
            .filter(op::Column::WorkerId.eq(worker))
            .filter(op::Column::State.eq(OpState::Running.as_str()))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected == 1)
    }

    /// Record a note for the person (a recovery that fell back to the last saved workspace).
    pub async fn note(&self, id: &str, note: &str) -> DomainResult<()> {
        op::Entity::update_many()
            .col_expr(op::Column::Note, Expr::value(note))
            .filter(op::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// End `worker`'s running operation as completed (`error` none) or failed, and release
    /// its reservation; false when it was not running under `worker` any more (an
    /// interrupted operation keeps its reservation until released).
    pub async fn finish(&self, id: &str, worker: &str, error: Option<&str>) -> DomainResult<bool> {
        let now = self.clock.now_ms();
        let state = if error.is_some() {
            OpState::Failed
        } else {
            OpState::Completed
        };
        let res = op::Entity::update_many()
            .col_expr(op::Column::State, Expr::value(state.as_str()))
            .col_expr(op::Column::Error, Expr::value(error.map(str::to_owned)))
            .col_expr(op::Column::FinishedAtMs, Expr::value(now))
            .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
            .filter(op::Column::Id.eq(id))
            .filter(op::Column::WorkerId.eq(worker))
            .filter(op::Column::State.eq(OpState::Running.as_str()))
            .exec(&self.db)
            .await?;
        if res.rows_affected == 0 {
            return Ok(false);
        }
        self.release_reservation(&self.get(id).await?).await?;
        Ok(true)
    }

    /// Mark interrupted every running operation whose heartbeat is older than `timeout_ms`;
    /// answers them. Their reservations stay.
    pub async fn mark_interrupted(&self, timeout_ms: i64) -> DomainResult<Vec<op::Model>> {
        let now = self.clock.now_ms();
        let cutoff = now - timeout_ms;
        let stale = op::Entity::find()
            .filter(op::Column::State.eq(OpState::Running.as_str()))
            .filter(op::Column::HeartbeatAtMs.lt(cutoff))
            .all(&self.db)
            .await?;
        let mut marked = Vec::new();
        for row in stale {
            let res = op::Entity::update_many()
                .col_expr(
                    op::Column::State,
                    Expr::value(OpState::Interrupted.as_str()),
                )
                .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
                .filter(op::Column::Id.eq(&row.id))
                .filter(op::Column::State.eq(OpState::Running.as_str()))
                .filter(op::Column::HeartbeatAtMs.lt(cutoff))
                .exec(&self.db)
                .await?;
            if res.rows_affected == 1 {
                tracing::warn!(event = "maintenance.interrupted", operation.id = %row.id,
                    computer.id = %row.computer_id);
                marked.push(self.get(&row.id).await?);
            }
        }
        Ok(marked)
    }

    /// `computer.releaseInterrupted`: a server owner asserts that the workers and provider
    /// calls of an interrupted operation in `space_id` have stopped; the operation becomes
    /// `released` and its reservation is given back, so recovery can be asked for.
    /// `INVALID_PARAMS` without the assertion or for an operation that is not interrupted;
    /// `NOT_FOUND` for an operation of another space.
    pub async fn release_interrupted(
        &self,
        id: &str,
        space_id: &str,
        workers_stopped: bool,
    ) -> DomainResult<op::Model> {
        if !workers_stopped {
            return Err(DomainError::invalid(
                "releasing an interrupted operation needs workersStopped: true (stop the workers and make sure provider operations have stopped first)",
            ));
        }
        let row = self.get(id).await?;
        if row.space_id.as_deref() != Some(space_id) {
            return Err(DomainError::not_found("operation"));
        }
        let now = self.clock.now_ms();
        let res = op::Entity::update_many()
            .col_expr(op::Column::State, Expr::value(OpState::Released.as_str()))
            .col_expr(op::Column::FinishedAtMs, Expr::value(now))
            .col_expr(op::Column::UpdatedAtMs, Expr::value(now))
            .filter(op::Column::Id.eq(id))
            .filter(op::Column::State.eq(OpState::Interrupted.as_str()))
            .exec(&self.db)
            .await?;
        if res.rows_affected == 0 {
            return Err(DomainError::invalid(format!(
                "only an interrupted operation can be released; this one is {}",
                row.state
            )));
        }
        let row = self.get(id).await?;
        self.release_reservation(&row).await?;
        tracing::warn!(event = "maintenance.released", operation.id = %row.id,
            computer.id = %row.computer_id);
        Ok(row)
    }

    /// Queued operations published longer than `after_ms` ago (a missed enqueue): stamped as
    /// published now and answered, for the caller to hand to the workers again.
    pub async fn republish_due(&self, after_ms: i64) -> DomainResult<Vec<op::Model>> {
        let now = self.clock.now_ms();
        let due = op::Entity::find()
            .filter(op::Column::State.eq(OpState::Queued.as_str()))
            .filter(op::Column::PublishedAtMs.lt(now - after_ms))
            .all(&self.db)
            .await?;
        let mut again = Vec::new();
        for row in due {
            let res = op::Entity::update_many()
                .col_expr(op::Column::PublishedAtMs, Expr::value(now))
                .filter(op::Column::Id.eq(&row.id))
                .filter(op::Column::State.eq(OpState::Queued.as_str()))
                .filter(op::Column::PublishedAtMs.lt(now - after_ms))
                .exec(&self.db)
                .await?;
            if res.rows_affected == 1 {
                again.push(row);
            }
        }
        Ok(again)
    }

    /// Operations of a space the dashboard restores: every queued, running or interrupted
    /// one, and the failed ones of the last day.
    pub async fn for_space(&self, space_id: &str) -> DomainResult<Vec<op::Model>> {
        let day_ago = self.clock.now_ms() - 24 * 60 * 60 * 1000;
        let rows = op::Entity::find()
            .filter(op::Column::SpaceId.eq(space_id))
            .order_by_desc(op::Column::CreatedAtMs)
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .filter(|r| match r.state.as_str() {
                "queued" | "running" | "interrupted" => true,
                "failed" => r.updated_at_ms >= day_ago,
                _ => false,
            })
            .collect())
    }

    async fn release_reservation(&self, row: &op::Model) -> DomainResult<()> {
        let Some(fence) = row.lease_fence else {
            return Ok(());
        };
        let key = LeaseKey::maintenance(&row.computer_id);
        match Leases::new(self.db.clone()).release(&key, fence).await {
            Ok(()) => Ok(()),
            // Already released.
            Err(e) if e.code == ErrorCode::LeaseFenced => Ok(()),
            Err(e) => Err(e),
        }
    }
}
