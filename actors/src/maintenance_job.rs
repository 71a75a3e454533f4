//! Running one maintenance operation (see [`crate::maintenance`]) on this process's actors:
//! claim it (once), beat its heartbeat while it works, report each lifecycle stage, and end
//! it. [`publish`] is the one entry point: whatever hands a queued operation to a worker calls
//! it: [`listen`] for every operation announced as queued (by this process or, through the
//! event relay, by another one; the reconciler announces a missed one again). The process
//! that holds the computer runs the operation.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use crate::checkpoint::Reason;
use crate::computer::{Ensure, SaveWorkspace, TearDown};
use crate::computers::Computers;
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::events::Topic;
use crate::maintenance::{HEARTBEAT_EVERY_MS, Maintenance, OpKind, Stage};
use crate::owners::{Owner, Owners};
use crate::registry::Registry;

/// The note of a recovery whose live work could not be saved.
pub const UNSAVED_WORK_NOTE: &str = "The live workspace could not be saved; the computer was restored from the last saved workspace, so unsaved work may be lost.";

/// Hand a queued operation to this process's worker: it runs in the background if this
/// worker claims it. Calling it again for the same operation is harmless.
pub fn publish(registry: Arc<Registry>, op_id: String) {
    actix::spawn(async move {
        let worker = crate::processes::holder("maintenance-worker");
        if let Err(e) = run(&registry, &op_id, &worker).await {
            tracing::warn!(event = "maintenance.run_failed", operation.id = %op_id, code = e.code.as_str());
        }
    });
}

/// Hand every operation announced as `queued` to [`publish`], whichever process queued it
/// (the announcement reaches the other processes through the event relay); [`run`] leaves it
/// to the process that holds its computer, or takes the computer over when no live process
/// does. Every process with a provider listens (an API-only process may hold computers).
/// Subscribes before it returns. An announcement missed here (a lagged subscriber, a relay
/// gap) is caught by the reconciler, which announces queued operations again.
///
/// `takes_free`: whether this process takes over computers no live process holds (a process
/// doing the worker's part); one that does not runs only what it already holds.
pub fn listen(registry: Arc<Registry>, arbiter: &actix::ArbiterHandle, takes_free: bool) {
    if registry.runtime().provider.is_none() {
        return;
    }
    let mut events = registry.runtime().events.subscribe();
    arbiter.spawn(async move {
        loop {
            match events.recv().await {
                Ok(e) if e.topic == Topic::MaintenanceChanged && e.data["state"] == "queued" => {
                    let (Some(id), Some(computer)) =
                        (e.data["id"].as_str(), e.data["computerId"].as_str())
                    else {
                        continue;
                    };
                    if !takes_free {
                        let held = Owners::new(registry.runtime().db.clone())
                            .holder(computer)
                            .await;
                        if !matches!(held, Ok(Some(Owner::Me))) {
                            continue;
                        }
                    }
                    publish(registry.clone(), id.to_owned());
                }
                Ok(_) => {}
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(event = "maintenance.listen_lagged", missed);
                }
                Err(RecvError::Closed) => break,
            }
        }
    });
}

/// Claim and run an operation as `worker`; whether this call ran it (false: it was claimed
/// before, is no longer queued, or another live process holds its computer).
pub async fn run(registry: &Registry, op_id: &str, worker: &str) -> DomainResult<bool> {
    let rt = registry.runtime().clone();
    let ops = Maintenance::new(rt.db.clone(), rt.clock.clone());
    // The process that holds the computer runs its operations (they tear down and provision
    // its machine); one no live process holds is taken over here.
    let queued = ops.get(op_id).await?;
    if queued.state != crate::maintenance::OpState::Queued.as_str() {
        return Ok(false);
    }
    if let Owner::Elsewhere { process_id, .. } = Owners::new(rt.db.clone())
        .claim(&queued.computer_id)
        .await?
    {
        tracing::debug!(event = "maintenance.left_to_owner", operation.id = %op_id, process.id = %process_id);
        return Ok(false);
    }
    let Some(op) = ops.claim(op_id, worker).await? else {
        return Ok(false);
    };
    tracing::info!(event = "maintenance.claimed", operation.id = %op.id, computer.id = %op.computer_id, kind = %op.kind);
    crate::maintenance::announce(&rt.events, &op);
    let beats = {
        let (ops, id, worker) = (ops.clone(), op.id.clone(), worker.to_owned());
        actix::spawn(async move {
            let every = Duration::from_millis(HEARTBEAT_EVERY_MS as u64);
            loop {
                tokio::time::sleep(every).await;
                if !matches!(ops.heartbeat(&id, &worker).await, Ok(true)) {
                    break;
                }
            }
        })
    };
    let outcome = work(registry, &ops, &op, worker).await;
    beats.abort();
    let error = outcome.as_ref().err().map(|e| e.message.clone());
    let ended = ops.finish(&op.id, worker, error.as_deref()).await?;
    tracing::info!(event = "maintenance.finished", operation.id = %op.id, computer.id = %op.computer_id,
        ok = outcome.is_ok(), ended);
    crate::maintenance::announce(&rt.events, &ops.get(&op.id).await?);
    Ok(true)
}

async fn work(
    registry: &Registry,
    ops: &Maintenance,
    op: &crate::entity::maintenance_operation::Model,
    worker: &str,
) -> DomainResult<()> {
    let rt = registry.runtime();
    let kind = OpKind::parse(&op.kind)
        .ok_or_else(|| DomainError::invalid(format!("unknown operation kind {}", op.kind)))?;
    let row = Computers::new(rt.db.clone()).get(&op.computer_id).await?;
    let handle = registry.computer(&row.id, &row.space_id);
    let stage = async |stage: Stage| -> DomainResult<()> {
        if !ops.stage(&op.id, worker, stage).await? {
            // Marked interrupted meanwhile: its reservation stays; stop here.
            return Err(DomainError::new(
                ErrorCode::ComputerReserved,
                "the operation was interrupted",
            ));
        }
        crate::maintenance::announce(&rt.events, &ops.get(&op.id).await?);
        Ok(())
    };
    if kind != OpKind::Reset {
        stage(Stage::Checkpointing).await?;
        let saved = handle
            .computer
            .send(SaveWorkspace(Reason::Explicit))
            .await?;
        match (kind, saved) {
            (_, Ok(_)) => {}
            // An update never tears down work it could not save.
            (OpKind::Update, Err(e)) => return Err(e),
            (_, Err(e)) => {
                tracing::warn!(event = "maintenance.unsaved", operation.id = %op.id, code = e.code.as_str());
                ops.note(&op.id, UNSAVED_WORK_NOTE).await?;
            }
        }
    }
    stage(Stage::TearingDown).await?;
    handle.computer.send(TearDown).await??;
    crate::crash_point::crash_point("maintenance.torn_down");
    stage(Stage::Provisioning).await?;
    handle.computer.send(Ensure).await??;
    stage(Stage::Ready).await?;
    Ok(())
}
