//! Computer rows: creation for Team and Private bots, lifecycle states, machine records and
//! `computer_runs` accounting.

use sea_orm::sea_query::{Expr, OnConflict, Query};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, IntoActiveModel, ModelTrait,
    QueryFilter, QueryOrder, Set, TransactionTrait,
};
use serde::Serialize;

use crate::clock::{new_id, now_ms};
use crate::entity::{bot, computer, computer_run, home_tombstone};
use crate::error::{DomainError, DomainResult};
use crate::provider::ProviderRef;

/// Lifecycle states of a computer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputerState {
    /// No machine runs; the workspace is stored.
    Stopped,
    /// A machine is being created or reattached.
    Provisioning,
    /// A machine runs and serves tools.
    Running,
    /// Checkpointing and stopping.
    Stopping,
    /// The machine was lost; a replacement is being made.
    Replacing,
}

impl ComputerState {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Provisioning => "provisioning",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Replacing => "replacing",
        }
    }
}

/// Why a `computer_runs` stretch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// Explicit stop.
    Stopped,
    /// Idle suspension.
    Idle,
    /// Uptime cap on billed providers.
    ActiveLimit,
    /// Replaced (update, recovery, reset, provider change).
    Replaced,
    /// The provider had lost the machine.
    Gone,
    /// The computer was deleted.
    Deleted,
    /// The end was never seen (the process that watched the machine stopped); closed by
    /// whoever adopted the computer or found it no longer running.
    Reconciled,
}

impl EndReason {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Idle => "idle",
            Self::ActiveLimit => "active_limit",
            Self::Replaced => "replaced",
            Self::Gone => "gone",
            Self::Deleted => "deleted",
            Self::Reconciled => "reconciled",
        }
    }
}

/// The home key of a bot's computer: `team-<space id>` or the bot id.
pub fn home_key(bot: &bot::Model) -> String {
    if bot.computer_mode == "private" {
        bot.id.clone()
    } else {
        format!("team-{}", bot.space_id)
    }
}

/// Computer rules over the database.
#[derive(Clone)]
pub struct Computers {
    db: DatabaseConnection,
}

impl Computers {
    /// Rules over a database.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// A computer by id.
    pub async fn get(&self, id: &str) -> DomainResult<computer::Model> {
        computer::Entity::find_by_id(id)
            .one(&self.db)
            .await?
            .ok_or_else(|| DomainError::not_found("computer"))
    }

    /// Computers of a space.
    pub async fn in_space(&self, space_id: &str) -> DomainResult<Vec<computer::Model>> {
        Ok(computer::Entity::find()
            .filter(computer::Column::SpaceId.eq(space_id))
            .all(&self.db)
            .await?)
    }

    /// The computer a bot uses, created on first need (the space's Team Computer, or the
    /// bot's Private Computer).
    pub async fn for_bot(&self, bot: &bot::Model, owner_id: &str) -> DomainResult<computer::Model> {
        let key = home_key(bot);
        if let Some(found) = computer::Entity::find()
            .filter(computer::Column::HomeKey.eq(&key))
            .one(&self.db)
            .await?
        {
            return Ok(found);
        }
        let now = now_ms();
        let private = bot.computer_mode == "private";
        let row = computer::ActiveModel {
            id: Set(new_id()),
            space_id: Set(bot.space_id.clone()),
            owner_id: Set(owner_id.into()),
            bot_id: Set(private.then(|| bot.id.clone())),
            kind: Set(if private { "private" } else { "team" }.into()),
            home_key: Set(key.clone()),
            provider_kind: Set(None),
            provider_ref: Set(None),
            state: Set(ComputerState::Stopped.as_str().into()),
            revision: Set(0),
            pending_restore_revision: Set(None),
            storage_id: Set(new_id()),
            wrapped_data_key: Set(None),
            provisioning_fence: Set(0),
            lease_epoch: Set(0),
            quarantined: Set(false),
            last_active_at_ms: Set(now),
            created_at_ms: Set(now),
            updated_at_ms: Set(now),
        };
        match row.insert(&self.db).await {
            Ok(row) => Ok(row),
            // Created concurrently by another request: the unique home key decides.
            Err(_) => computer::Entity::find()
                .filter(computer::Column::HomeKey.eq(&key))
                .one(&self.db)
                .await?
                .ok_or_else(|| DomainError::not_found("computer")),
        }
    }

    /// Record a lifecycle state.
    pub async fn set_state(&self, id: &str, state: ComputerState) -> DomainResult<()> {
        computer::Entity::update_many()
            .col_expr(computer::Column::State, Expr::value(state.as_str()))
            .col_expr(computer::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(computer::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Record use, for idle suspension.
    pub async fn touch(&self, id: &str) -> DomainResult<()> {
        self.touch_at(id, now_ms()).await
    }

    /// Record use at `at_ms` (the runtime clock's now), for idle suspension.
    pub async fn touch_at(&self, id: &str, at_ms: i64) -> DomainResult<()> {
        computer::Entity::update_many()
            .col_expr(computer::Column::LastActiveAtMs, Expr::value(at_ms))
            .filter(computer::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Record a new machine: provider kind and reference, the next provisioning fence.
    pub async fn record_machine(
        &self,
        id: &str,
        kind: &str,
        machine: &ProviderRef,
    ) -> DomainResult<computer::Model> {
        let row = self.get(id).await?;
        let fence = row.provisioning_fence + 1;
        let mut active = row.into_active_model();
        active.provider_kind = Set(Some(kind.into()));
        active.provider_ref = Set(Some(machine.0.clone()));
        active.provisioning_fence = Set(fence);
        active.state = Set(ComputerState::Running.as_str().into());
        active.updated_at_ms = Set(now_ms());
        Ok(active.update(&self.db).await?)
    }

    /// Forget the machine of a computer torn down for a replacement: no reference is kept,
    /// so the next use provisions a new machine that imports the latest checkpoint.
    pub async fn forget_machine(&self, id: &str) -> DomainResult<()> {
        let forgotten = computer::Entity::update_many()
            .col_expr(
                computer::Column::ProviderRef,
                Expr::value(Option::<String>::None),
            )
            // No machine is left to keep from resuming.
            .col_expr(computer::Column::Quarantined, Expr::value(false));
        self.mark_stopped(id, forgotten).await
    }

    /// Quarantines a computer whose machine may hold a suspended command (its stop was not
    /// confirmed): the row says stopped, with the machine's reference kept for the recover or
    /// reset that replaces it, and the stretch at the provider is closed as `stopped` (the
    /// machine was paused, or the vendor's lifetime for it, no longer pushed, ends it). Nothing reconnects a quarantined
    /// computer ([`crate::computer`]); [`Self::forget_machine`] lifts the quarantine.
    pub async fn quarantine(&self, id: &str) -> DomainResult<()> {
        let quarantined = computer::Entity::update_many()
            .col_expr(computer::Column::Quarantined, Expr::value(true));
        self.mark_stopped(id, quarantined).await?;
        self.close_runs(id, EndReason::Stopped).await?;
        Ok(())
    }

    /// Runs `update` on computer `id`'s row, the row marked stopped as well.
    async fn mark_stopped(
        &self,
        id: &str,
        update: sea_orm::UpdateMany<computer::Entity>,
    ) -> DomainResult<()> {
        update
            .col_expr(
                computer::Column::State,
                Expr::value(ComputerState::Stopped.as_str()),
            )
            .col_expr(computer::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(computer::Column::Id.eq(id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// A machine imported the pending restore `revision` (a newer pending one stays).
    pub async fn restore_applied(&self, id: &str, revision: i64) -> DomainResult<()> {
        computer::Entity::update_many()
            .col_expr(
                computer::Column::PendingRestoreRevision,
                Expr::value(Option::<i64>::None),
            )
            .col_expr(computer::Column::UpdatedAtMs, Expr::value(now_ms()))
            .filter(computer::Column::Id.eq(id))
            .filter(computer::Column::PendingRestoreRevision.eq(revision))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Open a `computer_runs` stretch for a machine that became ready.
    pub async fn open_run(&self, row: &computer::Model, provider_kind: &str) -> DomainResult<()> {
        computer_run::ActiveModel {
            id: Set(new_id()),
            computer_id: Set(row.id.clone()),
            user_id: Set(Some(row.owner_id.clone())),
            space_id: Set(Some(row.space_id.clone())),
            kind: Set(row.kind.clone()),
            provider_kind: Set(provider_kind.into()),
            started_at_ms: Set(now_ms()),
            ended_at_ms: Set(None),
            end_reason: Set(None),
        }
        .insert(&self.db)
        .await?;
        Ok(())
    }

    /// Open a stretch for a running computer unless one is open already (a start that was
    /// not recorded); whether it opened one.
    pub async fn ensure_open_run(
        &self,
        row: &computer::Model,
        provider_kind: &str,
    ) -> DomainResult<bool> {
        if self.oldest_open_run_start(&row.id).await?.is_some() {
            return Ok(false);
        }
        self.open_run(row, provider_kind).await?;
        Ok(true)
    }

    /// When the oldest open stretch of a computer started, if one is open.
    pub async fn oldest_open_run_start(&self, id: &str) -> DomainResult<Option<i64>> {
        Ok(computer_run::Entity::find()
            .filter(computer_run::Column::ComputerId.eq(id))
            .filter(computer_run::Column::EndedAtMs.is_null())
            .order_by_asc(computer_run::Column::StartedAtMs)
            .one(&self.db)
            .await?
            .map(|r| r.started_at_ms))
    }

    /// Close, as `reconciled`, every open stretch of a computer that no longer reads as
    /// running (its row says stopped, or is gone): their end was never seen. One statement
    /// per stretch, each checking the computer's state as it writes, so a stretch opened
    /// by a computer that just started is never taken. Answers the closed stretches.
    pub async fn close_orphaned_runs(&self) -> DomainResult<Vec<computer_run::Model>> {
        let not_running = || {
            computer_run::Column::ComputerId.not_in_subquery(
                Query::select()
                    .column(computer::Column::Id)
                    .from(computer::Entity)
                    .and_where(computer::Column::State.ne(ComputerState::Stopped.as_str()))
                    .to_owned(),
            )
        };
        let open = computer_run::Entity::find()
            .filter(computer_run::Column::EndedAtMs.is_null())
            .filter(not_running())
            .all(&self.db)
            .await?;
        let mut closed = Vec::new();
        for run in open {
            let res = computer_run::Entity::update_many()
                .col_expr(computer_run::Column::EndedAtMs, Expr::value(now_ms()))
                .col_expr(
                    computer_run::Column::EndReason,
                    Expr::value(EndReason::Reconciled.as_str()),
                )
                .filter(computer_run::Column::Id.eq(&run.id))
                .filter(computer_run::Column::EndedAtMs.is_null())
                .filter(not_running())
                .exec(&self.db)
                .await?;
            if res.rows_affected == 1 {
                closed.push(run);
            }
        }
        Ok(closed)
    }

    /// Rows whose machine should run (running, provisioning, replacing) or was being
    /// stopped and that no other live process owns: what this process adopts when no actor
    /// of its own holds them (every process that may own a computer calls it).
    pub async fn meant_to_run(&self) -> DomainResult<Vec<computer::Model>> {
        let rows = computer::Entity::find()
            .filter(computer::Column::State.ne(ComputerState::Stopped.as_str()))
            .all(&self.db)
            .await?;
        let owners = crate::owners::Owners::new(self.db.clone());
        let mut mine = Vec::with_capacity(rows.len());
        for row in rows {
            if !matches!(
                owners.holder(&row.id).await?,
                Some(crate::owners::Owner::Elsewhere { .. })
            ) {
                mine.push(row);
            }
        }
        Ok(mine)
    }

    /// A space is deleted: its `computer_runs` rows stay, with the space id cleared.
    pub async fn forget_space_in_runs(&self, space_id: &str) -> DomainResult<u64> {
        let res = computer_run::Entity::update_many()
            .col_expr(
                computer_run::Column::SpaceId,
                Expr::value(Option::<String>::None),
            )
            .filter(computer_run::Column::SpaceId.eq(space_id))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected)
    }

    /// A user is deleted: their `computer_runs` rows stay, with the user id cleared.
    pub async fn forget_user_in_runs(&self, user_id: &str) -> DomainResult<u64> {
        let res = computer_run::Entity::update_many()
            .col_expr(
                computer_run::Column::UserId,
                Expr::value(Option::<String>::None),
            )
            .filter(computer_run::Column::UserId.eq(user_id))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected)
    }

    /// Close every open `computer_runs` stretch of a computer; how many it closed.
    pub async fn close_runs(&self, id: &str, reason: EndReason) -> DomainResult<u64> {
        let res = computer_run::Entity::update_many()
            .col_expr(computer_run::Column::EndedAtMs, Expr::value(now_ms()))
            .col_expr(
                computer_run::Column::EndReason,
                Expr::value(reason.as_str()),
            )
            .filter(computer_run::Column::ComputerId.eq(id))
            .filter(computer_run::Column::EndedAtMs.is_null())
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected)
    }

    /// Delete a computer row and, in the same transaction, tombstone its storage id: its
    /// stored objects become provably this deployment's orphans, which the reconciler removes
    /// even when the store's own delete fails or a late write lands after it.
    pub async fn delete(&self, row: &computer::Model) -> DomainResult<()> {
        let txn = self.db.begin().await?;
        home_tombstone::Entity::insert(home_tombstone::ActiveModel {
            storage_id: Set(row.storage_id.clone()),
            deleted_at_ms: Set(now_ms()),
        })
        .on_conflict(
            OnConflict::column(home_tombstone::Column::StorageId)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(&txn)
        .await?;
        // Its recordings go with it: their frames are sealed under its data key, which goes
        // with the row.
        crate::entity::recording_frame::Entity::delete_many()
            .filter(crate::entity::recording_frame::Column::ComputerId.eq(&row.id))
            .exec(&txn)
            .await?;
        crate::entity::recording_step::Entity::delete_many()
            .filter(crate::entity::recording_step::Column::ComputerId.eq(&row.id))
            .exec(&txn)
            .await?;
        row.clone().delete(&txn).await?;
        txn.commit().await?;
        Ok(())
    }
}
