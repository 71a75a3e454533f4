//! The computer reconciler: at start-up and on an interval, makes this process's actors and
//! the rows agree after anything that went unseen (a restart, a crash, a lost message).
//!
//! One pass:
//! - adopts every computer whose row says a machine runs (running, provisioning, replacing)
//!   or is being stopped, by sending its `ComputerActor` [`Adopt`]: the actor reconnects
//!   through the stored providerRef (a gone machine is replaced as usual; a stopping one is
//!   stopped), closes the stretches it did not watch as `reconciled` and opens its own, and
//!   from then on its idle and uptime timers run;
//! - closes, as `reconciled`, the open `computer_runs` stretches of computers that no longer
//!   read as running (the end was never seen);
//! - marks `interrupted` the maintenance operations whose worker stopped beating for
//!   `COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS` (they stay reserved), and hands queued operations whose
//!   publication was missed to the workers again (a claimed one is never run again);
//! - releases leases and control grants past their expiry that nobody released, publishing
//!   the `lease.changed` event the `LeaseActor` would, so sockets of an expired control grant
//!   close. Grants not yet expired are never touched.
//!
//! A computer started at another provider kind than this process's is not adopted: its row
//! is marked stopped (the next use provisions here). Which computers a process adopts is
//! decided in this one place (`Computers::meant_to_run`): the computers no other live process
//! owns (`owners`), so after a process stops heartbeating, any other process adopts what it
//! held; an actor claims the computer before it reconnects, so exactly one does.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures_util::StreamExt;

use crate::computer::{Adopt, Adoption};
use crate::computers::Computers;
use crate::error::DomainResult;
use crate::lease_actor::publish_control_ended;
use crate::leases::{LeaseKind, Leases};
use crate::maintenance::{Maintenance, REPUBLISH_AFTER_MS};
use crate::registry::Registry;

/// How often a pass runs after the one at start-up.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(60);
/// How many computers one pass adopts at once.
const ADOPT_CONCURRENCY: usize = 4;

/// What one pass did (counts only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Computers whose machine an actor of this process now holds.
    pub adopted: u32,
    /// Computers whose row said a machine runs but there was none to adopt (stopped
    /// meanwhile, or started at another provider kind).
    pub not_running: u32,
    /// Computers whose adoption failed (tried again next pass).
    pub failed: u32,
    /// Stretches closed as `reconciled` because their computer no longer runs.
    pub runs_closed: u32,
    /// Stale grants released.
    pub leases_expired: u32,
    /// Maintenance operations marked interrupted.
    pub interrupted: u32,
    /// Queued maintenance operations handed to the workers again.
    pub republished: u32,
}

/// Run one pass now and answer what it did (start-up, tests).
#[derive(Message)]
#[rtype(result = "DomainResult<Reconciled>")]
pub struct ReconcileNow;

/// The reconciler of this process's computers.
pub struct ComputerReconciler {
    registry: Arc<Registry>,
    every: Duration,
    /// A pass is under way (the interval skips rather than overlapping it).
    busy: bool,
}

impl ComputerReconciler {
    /// A reconciler over this process's registry, passing every `every`.
    pub fn new(registry: Arc<Registry>, every: Duration) -> Self {
        Self {
            registry,
            every,
            busy: false,
        }
    }
}

impl Actor for ComputerReconciler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.notify(Tick);
        ctx.run_interval(self.every, |_, ctx| ctx.notify(Tick));
    }
}

/// Internal: a timed pass.
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

impl Handler<Tick> for ComputerReconciler {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        self.busy = true;
        let registry = self.registry.clone();
        ctx.spawn(pass(registry).into_actor(self).map(|res, act, _| {
            act.busy = false;
            if let Err(e) = res {
                tracing::warn!(event = "reconciler.failed", error = %e);
            }
        }));
    }
}

impl Handler<ReconcileNow> for ComputerReconciler {
    type Result = ResponseFuture<DomainResult<Reconciled>>;

    fn handle(&mut self, _: ReconcileNow, _: &mut Context<Self>) -> Self::Result {
        Box::pin(pass(self.registry.clone()))
    }
}

/// One pass (see the module docs).
pub async fn pass(registry: Arc<Registry>) -> DomainResult<Reconciled> {
    let rt = registry.runtime().clone();
    let computers = Computers::new(rt.db.clone());
    let mut done = Reconciled::default();

    if rt.provider.is_some() {
        let rows = computers.meant_to_run().await?;
        let outcomes: Vec<_> = futures_util::stream::iter(rows)
            .map(|row| {
                let handle = registry.computer(&row.id, &row.space_id);
                async move { (row.id, handle.computer.send(Adopt).await) }
            })
            .buffer_unordered(ADOPT_CONCURRENCY)
            .collect()
            .await;
        for (id, outcome) in outcomes {
            match outcome {
                Ok(Ok(Adoption::Held)) => {}
                Ok(Ok(Adoption::Adopted)) => {
                    done.adopted += 1;
                    tracing::info!(event = "reconciler.adopted", computer.id = %id);
                }
                Ok(Ok(Adoption::NotRunning | Adoption::Elsewhere)) => done.not_running += 1,
                Ok(Err(e)) => {
                    done.failed += 1;
                    tracing::warn!(event = "reconciler.adopt_failed", computer.id = %id, code = e.code.as_str());
                }
                Err(_) => {
                    done.failed += 1;
                    tracing::warn!(event = "reconciler.adopt_failed", computer.id = %id, code = "COMPUTER_UNAVAILABLE");
                }
            }
        }
    }

    for run in computers.close_orphaned_runs().await? {
        done.runs_closed += 1;
        tracing::info!(event = "reconciler.run_closed", computer.id = %run.computer_id, run.id = %run.id);
    }

    let ops = Maintenance::new(rt.db.clone(), rt.clock.clone());
    let timeout_ms = rt.settings.maintenance_heartbeat_timeout.as_millis() as i64;
    for op in ops.mark_interrupted(timeout_ms).await? {
        done.interrupted += 1;
        crate::maintenance::announce(&rt.events, &op);
    }
    if rt.provider.is_some() {
        for op in ops.republish_due(REPUBLISH_AFTER_MS).await? {
            done.republished += 1;
            tracing::info!(event = "maintenance.republished", operation.id = %op.id);
            // To every process: the one holding the computer runs it.
            crate::maintenance::announce(&rt.events, &op);
        }
    }

    for grant in Leases::new(rt.db.clone()).expire_stale().await? {
        done.leases_expired += 1;
        tracing::info!(event = "reconciler.lease_expired", computer.id = %grant.computer_id,
            kind = grant.kind.as_str(), fence = grant.fence);
        if grant.kind == LeaseKind::Control
            && let Ok(row) = computers.get(&grant.computer_id).await
        {
            publish_control_ended(&rt, &row.space_id, &grant, "expired");
        }
    }

    if done != Reconciled::default() {
        tracing::info!(
            event = "reconciler.passed",
            adopted = done.adopted,
            not_running = done.not_running,
            failed = done.failed,
            runs_closed = done.runs_closed,
            leases_expired = done.leases_expired,
            interrupted = done.interrupted,
            republished = done.republished
        );
    }
    Ok(done)
}
