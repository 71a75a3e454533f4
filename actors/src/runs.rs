//! Bot runs and their states; a run drives its bot's computer through an execution lease.

use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, QueryFilter,
    Set,
};
use serde::Serialize;

use crate::clock::{Clock, new_id, now_ms};
use crate::entity::run;
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::leases::{Grant, LeaseKey, Leases};

/// Default execution-lease lifetime; runs renew while they work.
pub const EXECUTION_LEASE_TTL_MS: i64 = 5 * 60 * 1000;

/// The states of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// The bot is working.
    Running,
    /// The bot asked for a person (`request_takeover`).
    WaitingTakeover,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
    /// Stopped by a person or the system.
    Canceled,
}

impl RunState {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::WaitingTakeover => "waiting_takeover",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    /// Parse the stored form of a terminal outcome.
    pub fn parse_outcome(s: &str) -> Option<Self> {
        match s {
            "completed" => Some(Self::Completed),
            "failed" => Some(Self::Failed),
            "canceled" => Some(Self::Canceled),
            _ => None,
        }
    }

    /// Whether the run is over.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled)
    }
}

/// Why `fence` cannot act for `run` before its lease is even looked at: the run has finished,
/// or the fence is not the one its `run.start` granted (`LEASE_FENCED` either way, saying
/// which).
pub fn fence_refusal(run: &run::Model, fence: i64) -> Option<DomainError> {
    if RunState::parse_outcome(&run.state).is_some() {
        return Some(DomainError::new(
            ErrorCode::LeaseFenced,
            format!(
                "run {} has finished ({}) and its lease is released: start a new run with run.start",
                run.id, run.state
            ),
        ));
    }
    if fence != run.lease_fence {
        return Some(DomainError::new(
            ErrorCode::LeaseFenced,
            format!(
                "fence {fence} is unknown: it is not the current fence of run {} (use the lease.fence that run.start returned)",
                run.id
            ),
        ));
    }
    None
}

/// Where a run happens.
#[derive(Clone, Debug)]
pub struct RunTarget {
    /// The space.
    pub space_id: String,
    /// The bot.
    pub bot_id: String,
    /// The computer the bot uses.
    pub computer_id: String,
}

/// Run rules over the database.
#[derive(Clone)]
pub struct Runs {
    db: DatabaseConnection,
    leases: Leases,
    lease_ttl_ms: i64,
    clock: Clock,
}

impl Runs {
    /// Rules over a database.
    pub fn new(db: DatabaseConnection) -> Self {
        Self {
            leases: Leases::new(db.clone()),
            db,
            lease_ttl_ms: EXECUTION_LEASE_TTL_MS,
            clock: Clock::system(),
        }
    }

    /// The same rules, granting execution leases for `ttl_ms` (the configured lifetime).
    pub fn with_lease_ttl(mut self, ttl_ms: i64) -> Self {
        self.lease_ttl_ms = ttl_ms;
        self
    }

    /// The same rules, stamping takeover requests by `clock` (the runtime's, which the idle
    /// rules read).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Start a run: grant the bot's execution lease to a new run. A second driver for the same
    /// bot is refused with `LEASE_HELD`; a previous run whose lease lapsed is marked failed.
    pub async fn start(&self, target: &RunTarget) -> DomainResult<(run::Model, Grant)> {
        let key = LeaseKey::execution(&target.computer_id, &target.bot_id);
        let run_id = new_id();
        let grant = self
            .leases
            .acquire(&key, &run_id, self.lease_ttl_ms)
            .await?;
        for stale in self.active_for_bot(&target.bot_id).await? {
            self.set_state(stale, RunState::Failed).await?;
        }
        let now = now_ms();
        let row = run::ActiveModel {
            id: Set(run_id),
            space_id: Set(target.space_id.clone()),
            bot_id: Set(target.bot_id.clone()),
            computer_id: Set(target.computer_id.clone()),
            state: Set(RunState::Running.as_str().into()),
            lease_fence: Set(grant.fence),
            takeover_requested_at_ms: Set(None),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
            ended_at_ms: Set(None),
        }
        .insert(&self.db)
        .await?;
        Ok((row, grant))
    }

    /// A run by id.
    pub async fn get(&self, run_id: &str) -> DomainResult<run::Model> {
        run::Entity::find_by_id(run_id)
            .one(&self.db)
            .await?
            .ok_or_else(|| DomainError::not_found("run"))
    }

    /// Active (running or waiting) runs of a bot.
    pub async fn active_for_bot(&self, bot_id: &str) -> DomainResult<Vec<run::Model>> {
        Ok(run::Entity::find()
            .filter(run::Column::BotId.eq(bot_id))
            .filter(run::Column::State.is_in([
                RunState::Running.as_str(),
                RunState::WaitingTakeover.as_str(),
            ]))
            .all(&self.db)
            .await?)
    }

    /// Runs on a computer that wait for a person (`waiting_takeover`).
    pub async fn waiting_on(&self, computer_id: &str) -> DomainResult<Vec<run::Model>> {
        Ok(run::Entity::find()
            .filter(run::Column::ComputerId.eq(computer_id))
            .filter(run::Column::State.eq(RunState::WaitingTakeover.as_str()))
            .all(&self.db)
            .await?)
    }

    /// The execution lease of a run, checked against `fence`.
    pub async fn verify(&self, run: &run::Model, fence: i64) -> DomainResult<Grant> {
        if let Some(refused) = fence_refusal(run, fence) {
            return Err(refused);
        }
        self.leases
            .verify(&LeaseKey::execution(&run.computer_id, &run.bot_id), fence)
            .await
            .map_err(|e| match e.code {
                ErrorCode::LeaseFenced => DomainError::new(
                    ErrorCode::LeaseFenced,
                    format!(
                        "the lease of run {} is no longer live (it expired, or the bot was stopped): start a new run with run.start",
                        run.id
                    ),
                ),
                _ => e,
            })
    }

    /// The bot asks for a person: the run waits for takeover (the lease stays with it).
    pub async fn request_takeover(&self, run_id: &str, fence: i64) -> DomainResult<run::Model> {
        let run = self.get(run_id).await?;
        self.verify(&run, fence).await?;
        if run.state != RunState::Running.as_str()
            && run.state != RunState::WaitingTakeover.as_str()
        {
            return Err(DomainError::code(ErrorCode::RunStateConflict));
        }
        let mut active = run.into_active_model();
        active.state = Set(RunState::WaitingTakeover.as_str().into());
        active.takeover_requested_at_ms = Set(Some(self.clock.now_ms()));
        active.updated_at_ms = Set(now_ms());
        Ok(active.update(&self.db).await?)
    }

    /// The run continues after a person released control.
    pub async fn resume(&self, run_id: &str, fence: i64) -> DomainResult<run::Model> {
        let run = self.get(run_id).await?;
        self.verify(&run, fence).await?;
        if run.state != RunState::WaitingTakeover.as_str() {
            return Err(DomainError::code(ErrorCode::RunStateConflict));
        }
        self.set_state(run, RunState::Running).await
    }

    /// End a run with `outcome` and release its execution lease.
    pub async fn finish(
        &self,
        run_id: &str,
        fence: i64,
        outcome: RunState,
    ) -> DomainResult<run::Model> {
        if !outcome.is_terminal() {
            return Err(DomainError::invalid(
                "outcome must be completed, failed or canceled",
            ));
        }
        let run = self.get(run_id).await?;
        self.verify(&run, fence).await?;
        let key = LeaseKey::execution(&run.computer_id, &run.bot_id);
        let run = self.set_state(run, outcome).await?;
        self.leases.release(&key, fence).await?;
        Ok(run)
    }

    /// Stop a bot: cancel its active runs and revoke its execution lease, so its driver's
    /// fence is stale from now on.
    pub async fn stop_bot(&self, computer_id: &str, bot_id: &str) -> DomainResult<Vec<run::Model>> {
        let mut canceled = Vec::new();
        for run in self.active_for_bot(bot_id).await? {
            canceled.push(self.set_state(run, RunState::Canceled).await?);
        }
        self.leases
            .revoke(&LeaseKey::execution(computer_id, bot_id))
            .await?;
        Ok(canceled)
    }

    /// A finished run's checkpoint failed: a completed run is failed now (its work was not
    /// saved); a failed or canceled one stays as it is.
    pub async fn checkpoint_failed(&self, run: run::Model) -> DomainResult<run::Model> {
        if run.state != RunState::Completed.as_str() {
            return Ok(run);
        }
        let mut active = run.into_active_model();
        active.state = Set(RunState::Failed.as_str().into());
        active.updated_at_ms = Set(now_ms());
        Ok(active.update(&self.db).await?)
    }

    async fn set_state(&self, run: run::Model, state: RunState) -> DomainResult<run::Model> {
        let now = now_ms();
        let mut active = run.into_active_model();
        active.state = Set(state.as_str().into());
        active.updated_at_ms = Set(now);
        if state.is_terminal() {
            active.ended_at_ms = Set(Some(now));
        }
        Ok(active.update(&self.db).await?)
    }
}
