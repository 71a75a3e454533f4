//! The `CheckpointActor`: one per computer; serializes workspace checkpoints and applies the
//! deferral rules.
//!
//! A run's checkpoint defers while another bot holds an execution or control lease: the last
//! finishing run (or the idle job) saves the shared workspace. Stop and idle checkpoints never
//! defer. Checkpoints run one at a time (`AtomicResponse`), so a computer never has two.

use std::sync::Arc;

use actix::prelude::*;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set,
    TransactionTrait,
};

use crate::clock::{new_id, now_ms};
use crate::computers::Computers;
use crate::entity::{computer, home_revision};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::home_store::{Saved, StoreError, StreamSaved};
use crate::leases::{LeaseKind, Leases};
use crate::provider::{ProviderRef, Skipped, WorkspaceExport};
use crate::runtime::Runtime;

/// Why a checkpoint is asked for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reason {
    /// A run of `bot_id` ended (completed or failed).
    RunEnded {
        /// The bot whose run ended.
        bot_id: String,
    },
    /// Before an explicit stop.
    Stop,
    /// Before idle suspension.
    Idle,
    /// The server is stopping.
    Shutdown,
    /// Asked for by a person or maintenance.
    Explicit,
}

impl Reason {
    fn as_str(&self) -> &'static str {
        match self {
            Self::RunEnded { .. } => "run_ended",
            Self::Stop => "stop",
            Self::Idle => "idle",
            Self::Shutdown => "shutdown",
            Self::Explicit => "explicit",
        }
    }
}

/// What a checkpoint request did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// Saved as this revision; the entries left out (the rest is saved).
    Saved(i64, Vec<Skipped>),
    /// The workspace still matches this stored revision: nothing new was stored.
    Unchanged(i64),
    /// Deferred until the last active bot finishes.
    Deferred,
}

/// Save the workspace of `machine`.
#[derive(Message)]
#[rtype(result = "DomainResult<Outcome>")]
pub struct Checkpoint {
    /// Why.
    pub reason: Reason,
    /// The machine to export from.
    pub machine: ProviderRef,
}

/// Serializes the checkpoints of one computer.
pub struct CheckpointActor {
    computer_id: String,
    rt: Arc<Runtime>,
    /// A run's checkpoint was deferred; the next non-deferred request saves it.
    pending: bool,
}

impl CheckpointActor {
    /// The checkpoint actor of a computer.
    pub fn new(computer_id: String, rt: Arc<Runtime>) -> Self {
        Self {
            computer_id,
            rt,
            pending: false,
        }
    }
}

impl Actor for CheckpointActor {
    type Context = Context<Self>;
}

impl Handler<Checkpoint> for CheckpointActor {
    type Result = AtomicResponse<Self, DomainResult<Outcome>>;

    fn handle(&mut self, msg: Checkpoint, _: &mut Context<Self>) -> Self::Result {
        let rt = self.rt.clone();
        let computer_id = self.computer_id.clone();
        AtomicResponse::new(Box::pin(
            async move { checkpoint(&rt, &computer_id, &msg).await }
                .into_actor(self)
                .map(|res, act, _| {
                    match &res {
                        Ok(Outcome::Deferred) => act.pending = true,
                        Ok(Outcome::Saved(..) | Outcome::Unchanged(_)) => act.pending = false,
                        Err(_) => {}
                    }
                    res
                }),
        ))
    }
}

/// What a restore's maintenance reservation is held as (before the process part): a run's
/// checkpoint defers while one holds it. The restore saved the workspace first, under its
/// reservation, after every checkpoint already asked for; a run's that comes later would save
/// as the very revision the restore is saving.
pub const RESTORE_HOLDER: &str = "restore-";

async fn checkpoint(rt: &Runtime, computer_id: &str, msg: &Checkpoint) -> DomainResult<Outcome> {
    if let Reason::RunEnded { bot_id } = &msg.reason {
        let others_active = Leases::new(rt.db.clone())
            .live_on(computer_id)
            .await?
            .iter()
            .any(|g| match g.kind {
                LeaseKind::Execution | LeaseKind::Control => g.subject != *bot_id,
                LeaseKind::Maintenance => g.holder.starts_with(RESTORE_HOLDER),
            });
        if others_active {
            tracing::info!(event = "checkpoint.deferred", computer.id = computer_id);
            return Ok(Outcome::Deferred);
        }
    }
    let provider = rt.provider()?;
    let computers = Computers::new(rt.db.clone());
    let mut row = computers.get(computer_id).await?;
    if row.pending_restore_revision.is_some() {
        // Never save over a restore the machine has not taken yet: it takes it first.
        crate::computer::apply_pending_restore(rt, provider.as_ref(), &row, &msg.machine).await?;
        row = computers.get(computer_id).await?;
    }
    let since = fingerprint_of(&rt.db, computer_id, row.revision).await?;
    let revision = row.revision + 1;
    let home = rt.home_id(&row).await?;
    let mounted = provider.describe().capabilities.mounted_home;
    let streamed = if !mounted && provider.streams_workspace(&msg.machine).await {
        // A whole archive from the machine: streamed to the store, never held whole.
        let (saved, skipped) = crate::workspace_stream::save(
            provider.as_ref(),
            &msg.machine,
            rt.homes.as_ref(),
            &home,
            revision,
            since.as_deref(),
            true,
        )
        .await?;
        match saved {
            StreamSaved::Saved { saved, fingerprint } => Some((saved, Some(fingerprint), skipped)),
            StreamSaved::Unchanged => None,
        }
    } else {
        save_pieces(
            rt,
            provider.as_ref(),
            computer_id,
            msg,
            &home,
            revision,
            since.as_deref(),
            mounted,
        )
        .await?
    };
    let Some((saved, fingerprint, skipped)) = streamed else {
        tracing::info!(
            event = "checkpoint.unchanged",
            computer.id = computer_id,
            revision = row.revision,
            reason = msg.reason.as_str()
        );
        return Ok(Outcome::Unchanged(row.revision));
    };
    crate::crash_point::crash_point("checkpoint.stored");
    NewRevision {
        computer_id,
        home_key: &row.home_key,
        revision,
        size_bytes: saved.archive_bytes,
        object_key: rt.homes.location(&home.storage_id, revision),
        reason: msg.reason.as_str().into(),
        fingerprint,
    }
    .record(&rt.db, false)
    .await?;
    tracing::info!(
        event = "checkpoint.saved",
        computer.id = computer_id,
        revision,
        bytes = saved.archive_bytes,
        stored_bytes = saved.stored_bytes,
        reason = msg.reason.as_str()
    );
    crate::timeline::note(
        &rt.db,
        crate::timeline::NewEntry {
            computer_id: computer_id.to_owned(),
            space_id: row.space_id.clone(),
            actor: crate::timeline::current(),
            bot_id: match &msg.reason {
                Reason::RunEnded { bot_id } => Some(bot_id.clone()),
                _ => None,
            },
            run_id: None,
            kind: "checkpoint".into(),
            subject: msg.reason.as_str().into(),
            detail: serde_json::json!({ "revision": revision, "bytes": saved.archive_bytes,
                                        "skipped": skipped.len() }),
        },
    )
    .await;
    if !skipped.is_empty() {
        tracing::warn!(
            event = "checkpoint.skipped",
            computer.id = computer_id,
            revision,
            count = skipped.len()
        );
        record_skipped(rt, &row, msg, revision, &skipped).await;
    }
    Ok(Outcome::Saved(revision, skipped))
}

/// Exports the workspace in pieces (those `since` vouches for named only) and saves them as
/// `revision`; `None` when the workspace still matches `since`.
#[allow(clippy::too_many_arguments)]
async fn save_pieces(
    rt: &Runtime,
    provider: &dyn crate::provider::SandboxProvider,
    computer_id: &str,
    msg: &Checkpoint,
    home: &crate::home_store::HomeId,
    revision: i64,
    mut since: Option<&str>,
    mounted: bool,
) -> DomainResult<Option<(Saved, Option<String>, Vec<Skipped>)>> {
    loop {
        let (workspace, fingerprint, skipped) =
            match provider.export_workspace_since(&msg.machine, since).await? {
                WorkspaceExport::Unchanged => return Ok(None),
                WorkspaceExport::Archive {
                    workspace,
                    fingerprint,
                    skipped,
                } => (workspace, fingerprint, skipped),
            };
        match rt.homes.save(home, revision, workspace, !mounted).await {
            Ok(saved) => return Ok(Some((saved, fingerprint, skipped))),
            // The previous revision no longer holds what the export referred to: export
            // every byte once more.
            Err(StoreError::Stale(why)) if since.is_some() => {
                tracing::warn!(
                    event = "checkpoint.stale_pieces",
                    computer.id = computer_id,
                    why
                );
                since = None;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How many skipped entries the activity feed names (the count is always whole).
const SKIPPED_NAMED: usize = 20;

/// Puts a checkpoint's skipped entries in the activity feed of the bot whose run ended (or the
/// computer's own bot).
async fn record_skipped(
    rt: &Runtime,
    row: &crate::entity::computer::Model,
    msg: &Checkpoint,
    revision: i64,
    skipped: &[Skipped],
) {
    let bot_id = match &msg.reason {
        Reason::RunEnded { bot_id } => Some(bot_id.clone()),
        _ => row.bot_id.clone(),
    };
    let Some(bot_id) = bot_id else {
        return;
    };
    let named: Vec<String> = skipped
        .iter()
        .take(SKIPPED_NAMED)
        .map(|s| format!("{} ({})", s.path, s.reason))
        .collect();
    let recorded = crate::activity::record(
        &rt.db,
        &rt.events,
        crate::activity::Command {
            space_id: row.space_id.clone(),
            computer_id: row.id.clone(),
            bot_id,
            tool: "checkpoint".into(),
            command: format!("checkpoint {revision}"),
            output: None,
            size_bytes: None,
            error: Some(format!(
                "{} entries left out: {}",
                skipped.len(),
                named.join("; ")
            )),
        },
    )
    .await;
    if let Err(e) = recorded {
        tracing::warn!(event = "checkpoint.skipped_not_recorded", error = %e);
    }
}

/// The workspace fingerprint `revision` of the computer was exported at, if one was kept.
async fn fingerprint_of(
    db: &DatabaseConnection,
    computer_id: &str,
    revision: i64,
) -> DomainResult<Option<String>> {
    if revision == 0 {
        return Ok(None);
    }
    Ok(home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(computer_id))
        .filter(home_revision::Column::Revision.eq(revision))
        .one(db)
        .await?
        .and_then(|r| r.fingerprint))
}

/// The row of a stored revision.
pub struct NewRevision<'a> {
    /// The computer.
    pub computer_id: &'a str,
    /// Its home key.
    pub home_key: &'a str,
    /// The revision number.
    pub revision: i64,
    /// The archive's size.
    pub size_bytes: u64,
    /// Where the store keeps it.
    pub object_key: String,
    /// What made it.
    pub reason: String,
    /// The workspace fingerprint it was exported at.
    pub fingerprint: Option<String>,
}

impl NewRevision<'_> {
    /// Records the revision as the computer's current one (and, for a restore, as the one
    /// every machine imports before use), in one transaction and only over the revision it
    /// follows: a crash between the two writes leaves neither, and a save that another
    /// recorded first (a restore and a checkpoint at once) records nothing. A row for this
    /// revision that no computer revision names (a crash left it between the two writes, in
    /// an earlier version) is replaced.
    pub async fn record(self, db: &DatabaseConnection, restored: bool) -> DomainResult<()> {
        let txn = db.begin().await?;
        let mut update = computer::Entity::update_many()
            .col_expr(computer::Column::Revision, Expr::value(self.revision))
            .col_expr(computer::Column::UpdatedAtMs, Expr::value(now_ms()));
        if restored {
            update = update.col_expr(
                computer::Column::PendingRestoreRevision,
                Expr::value(self.revision),
            );
        }
        let moved = update
            .filter(computer::Column::Id.eq(self.computer_id))
            .filter(computer::Column::Revision.eq(self.revision - 1))
            .exec(&txn)
            .await?;
        if moved.rows_affected != 1 {
            return Err(DomainError::new(
                ErrorCode::ComputerReserved,
                "another save of this workspace was recorded first; try again",
            ));
        }
        home_revision::Entity::delete_many()
            .filter(home_revision::Column::ComputerId.eq(self.computer_id))
            .filter(home_revision::Column::Revision.gte(self.revision))
            .exec(&txn)
            .await?;
        home_revision::ActiveModel {
            id: Set(new_id()),
            computer_id: Set(self.computer_id.into()),
            home_key: Set(self.home_key.into()),
            revision: Set(self.revision),
            size_bytes: Set(self.size_bytes as i64),
            object_key: Set(Some(self.object_key)),
            reason: Set(self.reason),
            created_at_ms: Set(now_ms()),
            fingerprint: Set(self.fingerprint),
        }
        .insert(&txn)
        .await?;
        txn.commit().await?;
        Ok(())
    }
}
