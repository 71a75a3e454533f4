//! Running one maintenance operation (see [`crate::maintenance`]) on this process's actors:
//! claim it (once), beat its heartbeat while it works, report each lifecycle stage, and end
//! it. [`publish`] is the one entry point: whatever hands a queued operation to a worker calls
//! it: [`listen`] for every operation announced as queued (by this process or, through the
//! event relay, by an API process), and the reconciler for one whose announcement was missed.

use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::Reason;
use crate::computer::{Ensure, SaveWorkspace, TearDown};
use crate::computers::Computers;
use crate::events::Topic;
use tokio::sync::broadcast::error::RecvError;

use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::maintenance::{HEARTBEAT_EVERY_MS, Maintenance, OpKind, Stage};
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

/// In a process that does the worker's part: hand every operation announced as `queued` to
/// [`publish`], whichever process queued it (the announcement reaches the other processes
/// through the event relay). Subscribes before it returns. An announcement missed here (a
/// lagged subscriber, a relay gap) is caught by the reconciler's republish.
pub fn listen(registry: Arc<Registry>, arbiter: &actix::ArbiterHandle) {
    if registry.runtime().provider.is_none() {
        return;
    }
    let mut events = registry.runtime().events.subscribe();
    arbiter.spawn(async move {
        loop {
            match events.recv().await {
                Ok(e) if e.topic == Topic::MaintenanceChanged && e.data["state"] == "queued" => {
                    if let Some(id) = e.data["id"].as_str() {
                        publish(registry.clone(), id.to_owned());
                    }
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
/// before, or is no longer queued).
pub async fn run(registry: &Registry, op_id: &str, worker: &str) -> DomainResult<bool> {
    let rt = registry.runtime().clone();
    let ops = Maintenance::new(rt.db.clone(), rt.clock.clone());
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
