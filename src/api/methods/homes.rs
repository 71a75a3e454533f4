//! Workspace revisions: list the kept ones, restore one, delete a computer with its stored
//! workspace.

use rakazo_actors::checkpoint::{NewRevision, RESTORE_HOLDER, Reason};
use rakazo_actors::clock::new_id;
use rakazo_actors::computer::{ApplyRestore, CurrentMachine, SaveWorkspace};
use rakazo_actors::computers::{ComputerState, Computers, EndReason};
use rakazo_actors::entity::{computer, home_revision};
use rakazo_actors::leases::{LeaseKey, LeaseKind, Leases};
use rakazo_actors::processes;
use rakazo_actors::screen;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde::Deserialize;
use serde_json::{Value, json};

use super::computers::{handle, visible};
use super::{Ctx, access};
use crate::crash_point::crash_point;

/// Lifetime of the reservation a restore holds.
const RESTORE_RESERVATION_MS: i64 = 10 * 60 * 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ById {
    computer_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Restore {
    computer_id: String,
    revision: i64,
}

/// `computer.revisions {computerId}`: the kept checkpoint revisions, newest first; `pending`
/// marks a restored revision no machine has imported yet.
pub async fn revisions(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let kept = ctx
        .app
        .runtime()
        .homes
        .revisions(&ctx.app.runtime().home_id(&c).await?)
        .await?;
    let rows = home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(&c.id))
        .filter(home_revision::Column::Revision.is_in(kept))
        .order_by_desc(home_revision::Column::Revision)
        .all(ctx.db())
        .await?;
    Ok(Value::Array(
        rows.iter()
            .map(|r| {
                json!({ "revision": r.revision, "sizeBytes": r.size_bytes, "reason": r.reason,
                        "createdAtMs": r.created_at_ms, "current": r.revision == c.revision,
                        "pending": c.pending_restore_revision == Some(r.revision),
                        "location": r.object_key })
            })
            .collect(),
    ))
}

/// `computer.restoreRevision {computerId, revision}`: make a kept revision the workspace
/// again, as a new revision (history stays linear). Refused while a bot drives or a person
/// controls a screen; holds the maintenance reservation meanwhile.
pub async fn restore(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: Restore = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let leases = Leases::new(ctx.db().clone());
    if leases
        .live_on(&c.id)
        .await?
        .iter()
        .any(|g| g.kind != LeaseKind::Maintenance)
    {
        return Err(DomainError::new(
            ErrorCode::LeaseHeld,
            "stop the bots and release control before restoring",
        ));
    }
    let key = LeaseKey::maintenance(&c.id);
    let holder = processes::holder(&format!("{RESTORE_HOLDER}{}", new_id()));
    let reservation = leases
        .acquire(&key, &holder, RESTORE_RESERVATION_MS)
        .await?;
    // The chosen revision is read before the live work is saved: that save's retention may
    // forget it.
    let outcome = match recorded_archive(ctx, &c, p.revision).await {
        Ok(archive) => match save_before_restore(ctx, &c).await {
            Ok(()) => restore_reserved(ctx, &c, p.revision, archive).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    leases.release(&key, reservation.fence).await?;
    outcome
}

/// Saves the live workspace as a revision before it is replaced, through the computer's own
/// checkpoints (in the process that holds it): what was not saved stays restorable, and a
/// checkpoint under way ends before the restore saves (two saves of one revision number would
/// write one manifest). A quarantined machine's work is not read, a gone one has none, and
/// none is reached without a provider: the restore goes on over them.
async fn save_before_restore(ctx: &Ctx<'_>, c: &computer::Model) -> DomainResult<()> {
    match handle(ctx, c)
        .computer
        .send(SaveWorkspace(Reason::Explicit))
        .await?
    {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.code,
                ErrorCode::ComputerQuarantined | ErrorCode::NoProvider | ErrorCode::MachineGone
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The archive of `revision`, only if the database recorded it: a manifest a crash left
/// before its row is not one.
async fn recorded_archive(
    ctx: &Ctx<'_>,
    c: &computer::Model,
    revision: i64,
) -> DomainResult<Vec<u8>> {
    home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(&c.id))
        .filter(home_revision::Column::Revision.eq(revision))
        .one(ctx.db())
        .await?
        .ok_or_else(|| DomainError::not_found("revision"))?;
    let rt = ctx.app.runtime();
    let home = rt.home_id(c).await?;
    Ok(rt.homes.load(&home, revision).await?)
}

async fn restore_reserved(
    ctx: &Ctx<'_>,
    c: &computer::Model,
    revision: i64,
    archive: Vec<u8>,
) -> DomainResult<Value> {
    let rt = ctx.app.runtime();
    let home = rt.home_id(c).await?;
    let mounted = rt
        .provider()
        .is_ok_and(|p| p.describe().capabilities.mounted_home);
    let h = handle(ctx, c);
    let live = h.computer.send(CurrentMachine).await?.is_some();
    let computers = Computers::new(ctx.db().clone());
    let row = computers.get(&c.id).await?;
    // The latest copy becomes the restored one once the restore is recorded (so a crash
    // before leaves it matching the recorded revision), unless a machine may work in it: a
    // stopped machine works in no copy, so the Files view then shows what the next run sees.
    let stopped = !live && row.state == ComputerState::Stopped.as_str();
    let new_revision = row.revision + 1;
    let copy = (!mounted || stopped).then(|| archive.clone());
    let saved = rt
        .homes
        .save(&home, new_revision, archive.into(), false)
        .await?;
    crash_point("restore.saved");
    NewRevision {
        computer_id: &c.id,
        home_key: &c.home_key,
        revision: new_revision,
        size_bytes: saved.archive_bytes,
        object_key: rt.homes.location(&home.storage_id, new_revision),
        reason: format!("restore:{revision}"),
        fingerprint: None,
    }
    .record(ctx.db(), true)
    .await?;
    // From here the restore is the computer's state: every machine imports it before use.
    crash_point("restore.recorded");
    if let Some(copy) = copy
        && let Err(e) = rt.homes.replace_latest(&home, new_revision, copy).await
    {
        tracing::warn!(event = "home.restore_copy_failed", computer.id = %c.id, error = %e);
    }
    let applied = h.computer.send(ApplyRestore).await??;
    crash_point("restore.applied");
    tracing::info!(event = "home.restored", computer.id = %c.id, from = revision,
        revision = new_revision, pending = !applied);
    rakazo_actors::timeline::note(
        ctx.db(),
        rakazo_actors::timeline::NewEntry {
            computer_id: c.id.clone(),
            space_id: c.space_id.clone(),
            actor: rakazo_actors::timeline::current(),
            bot_id: None,
            run_id: None,
            kind: "restore".into(),
            subject: "restored".into(),
            detail: json!({ "from": revision, "revision": new_revision, "pending": !applied }),
        },
    )
    .await;
    Ok(json!({ "revision": new_revision, "restoredFrom": revision, "pending": !applied }))
}

/// `computer.delete {computerId}`: tear down screens, destroy the machine, forget the stored
/// workspace and the computer row (with its only wrapped data key).
pub async fn delete(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let space = access::space(ctx.db(), ctx.caller, &c.space_id).await?;
    if !ctx.caller.is_operator() && space.owner_id != ctx.caller.user_id {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "only the space owner deletes computers",
        ));
    }
    refuse_if_busy(ctx, &c).await?;
    destroy(ctx, &c).await?;
    Ok(json!({ "deleted": c.id }))
}

/// `LEASE_HELD` while a bot drives the computer or it is reserved (a person's control does
/// not keep it: deleting ends it).
pub async fn refuse_if_busy(ctx: &Ctx<'_>, c: &computer::Model) -> DomainResult<()> {
    if Leases::new(ctx.db().clone())
        .live_on(&c.id)
        .await?
        .iter()
        .any(|g| g.kind != LeaseKind::Control)
    {
        return Err(DomainError::new(
            ErrorCode::LeaseHeld,
            "stop the bots first",
        ));
    }
    Ok(())
}

/// Tear down a computer's screens, destroy its machine, close its stretches as `deleted` and
/// forget the row and the stored workspace (the caller checked who may, and
/// [`refuse_if_busy`]).
pub async fn destroy(ctx: &Ctx<'_>, c: &computer::Model) -> DomainResult<()> {
    let rt = ctx.app.runtime();
    let h = handle(ctx, c);
    for screen in rakazo_actors::entity::screen::Entity::find()
        .filter(rakazo_actors::entity::screen::Column::ComputerId.eq(&c.id))
        .all(ctx.db())
        .await?
    {
        // Best effort: the machine is destroyed next anyway.
        let _ = ctx
            .app
            .registry
            .screen(&h, &screen.bot_id)
            .send(screen::Teardown)
            .await;
    }
    if let Ok(provider) = rt.provider() {
        // The live machine, or the stored one when it belongs to this provider kind.
        let same_kind = c.provider_kind.as_deref() == Some(provider.describe().kind.as_str());
        let stored = c
            .provider_ref
            .clone()
            .filter(|_| same_kind)
            .map(rakazo_actors::provider::ProviderRef);
        if let Some(machine) = h.computer.send(CurrentMachine).await?.or(stored) {
            // Gone already: a delete that failed after it is asked again.
            match provider.destroy(&machine).await {
                Ok(()) | Err(rakazo_actors::provider::ProviderError::MachineGone) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let computers = Computers::new(ctx.db().clone());
    computers.close_runs(&c.id, EndReason::Deleted).await?;
    // Recordings still being stored land before the rows that hold them go.
    ctx.app.recorder.settled().await;
    // The stored workspace goes before the row: a failure or a crash between leaves a
    // computer to delete again, never a home (a latest copy a container mounts) that the
    // next computer of this home key would find.
    rt.homes.delete(&c.home_key, &c.storage_id).await?;
    crash_point("delete.stored_gone");
    computers.delete(c).await?;
    ctx.app.registry.forget(&c.id);
    tracing::info!(event = "computer.deleted", computer.id = %c.id);
    Ok(())
}
