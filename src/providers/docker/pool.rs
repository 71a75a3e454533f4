//! [`ComputerPool`]: computers the supervisor created and started ahead
//! (`SANDBOX_DOCKER_WARM_COMPUTERS`), each with its runtime attached and its spare desktops
//! starting, so that a new computer is claimed instead of created: no container to create
//! and start, and a browser already running for its first bot.
//!
//! The pool belongs to this process (its owner id, renewed with the supervisor while the
//! process runs): another process never claims it, and the supervisor removes it once the
//! renewals stop (a killed process). A pooled computer is handed out once; it comes back only
//! when the supervisor refused its claim before changing anything (the new computer's home
//! holds files: a restore creates its computer as before).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::attach::{Attacher, Machine};
use super::client::SupervisorClient;
use crate::desktop::warm::{WarmPool, WarmStatus};

/// How often the owner renews its pool with the supervisor (its time to live is 90 s).
const RENEW_EVERY: Duration = Duration::from_secs(20);
/// Longest wait after failed starts before the next try.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// This process's ready computers.
pub(super) struct ComputerPool {
    owner: String,
    pool: Arc<WarmPool<Arc<Machine>>>,
    started: AtomicBool,
}

impl ComputerPool {
    /// A pool of `target` computers (0: none), owned by a new owner id.
    pub(super) fn new(target: usize) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            owner: format!("api-{}", &id[..16]),
            pool: Arc::new(WarmPool::new(target)),
            started: AtomicBool::new(false),
        }
    }

    /// The configured number of computers.
    pub(super) fn target(&self) -> usize {
        self.pool.target()
    }

    /// Starts the filler (once; nothing for a size of 0).
    pub(super) fn start(&self, attacher: Attacher) {
        if self.pool.target() == 0 || self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        tokio::spawn(fill(self.pool.clone(), self.owner.clone(), attacher));
    }

    /// A ready computer, if there is one now.
    pub(super) async fn take(&self) -> Option<Arc<Machine>> {
        self.pool.take(Duration::ZERO).await
    }

    /// A computer taken and claimed (or discarded): the filler makes the next.
    pub(super) fn refill(&self) {
        self.pool.want();
    }

    /// A computer whose claim the supervisor refused before changing anything.
    pub(super) fn give_back(&self, machine: Arc<Machine>, client: &SupervisorClient) {
        if let Some(closed) = self.pool.put_back(machine) {
            tokio::spawn(discard(client.clone(), closed));
        }
    }

    /// The ready computers' runtimes' spare desktops, and the pool's own state.
    pub(super) fn status(&self) -> (WarmStatus, Vec<WarmStatus>) {
        (
            self.pool.status(),
            self.pool.map_ready(|m| m.runtime.warm_status()),
        )
    }

    /// Closes the pool for good and removes its ready computers.
    pub(super) async fn close(&self, client: &SupervisorClient) {
        for machine in self.pool.close() {
            discard(client.clone(), machine).await;
        }
    }
}

impl Drop for ComputerPool {
    /// The filler stops; computers still pooled are removed by the supervisor once this
    /// owner's renewals stop.
    fn drop(&mut self) {
        self.pool.close();
    }
}

/// Stops a pooled computer's desktops and removes its container (and its pool home).
pub(super) async fn discard(client: SupervisorClient, machine: Arc<Machine>) {
    if let Err(e) = machine.runtime.shutdown().await {
        tracing::warn!(error = %e, "docker.pool.shutdown_failed");
    }
    match client.remove(&machine.info.id).await {
        Ok(()) | Err(rakazo_actors::provider::ProviderError::MachineGone) => {}
        Err(e) => tracing::warn!(error = %e, "docker.pool.remove_failed"),
    }
}

/// Creates and attaches one pooled computer.
async fn make(attacher: &Attacher, owner: &str) -> Result<Arc<Machine>, String> {
    let info = attacher
        .client
        .create_pooled(owner)
        .await
        .map_err(|e| e.to_string())?;
    let grouped = attacher.groups_on().await;
    Ok(attacher.attach(info, grouped))
}

/// Keeps the pool full and renews it, until it closes. After a failed start it waits (2 s,
/// doubling, at most [`MAX_BACKOFF`]) before the next: a missing image or an inactive egress
/// guard is not retried in a loop.
async fn fill(pool: Arc<WarmPool<Arc<Machine>>>, owner: String, attacher: Attacher) {
    let mut failures = 0u32;
    loop {
        if pool.is_closed() {
            return;
        }
        match attacher.client.renew_pool(&owner).await {
            // Computers no longer there (removed behind this process's back, or with a
            // supervisor that stopped) leave the pool; their spares' runtimes stop.
            Ok(running) => {
                for gone in pool.retain(|m| running.contains(&m.info.id)) {
                    tracing::info!(container.name = %gone.info.name, "docker.pool.gone");
                    let _ = gone.runtime.shutdown().await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "docker.pool.renew_failed"),
        }
        while pool.begin_fill() {
            match make(&attacher, &owner).await {
                Ok(machine) => {
                    failures = 0;
                    tracing::info!(container.name = %machine.info.name, "docker.pool.ready");
                    if let Some(closed) = pool.finish_fill(Some((machine, 0))) {
                        discard(attacher.client.clone(), closed).await;
                    }
                }
                Err(e) => {
                    pool.finish_fill(None);
                    failures += 1;
                    tracing::warn!(error = %e, failures, "docker.pool.start_failed");
                    let wait = Duration::from_secs(1u64 << failures.min(6)).min(MAX_BACKOFF);
                    tokio::time::sleep(wait).await;
                    break;
                }
            }
        }
        tokio::select! {
            _ = pool.wanted() => {}
            _ = tokio::time::sleep(RENEW_EVERY) => {}
        }
    }
}
