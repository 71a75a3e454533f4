//! Revocation: a torn-down slot closes every socket of its older generations before the slot
//! serves anyone else, and an ended control grant closes its control sockets and routes.
//!
//! The single writers of grants (the lease rules) and slot generations (the screen actor) send
//! typed [`Revocation`]s on the event bus; the relay carries them to every other process. The
//! watcher of each process tells its `GatewayActor` at once and cleans routes up after. After
//! any gap (a lagged subscription, a relay reconnect, and at start and on an interval for
//! whatever another process changed unseen) it sweeps: every live socket is checked against
//! the lease and screen tables, and each one no longer granted is closed.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use async_trait::async_trait;
use rakazo_actors::events::{EventBus, Revocation};
use rakazo_actors::provider::{SandboxProvider, ScreenPolicy};
use rakazo_actors::screen::ScreenRevoker;
use rakazo_web_proxy::{
    GatewayActor, ListScopes, RevokeControl, RevokeSlot, SocketKind, SocketScope, Standing,
};
use sea_orm::DatabaseConnection;
use tokio::sync::broadcast::error::RecvError;

use super::RouteBook;

/// How often the watcher sweeps even without a known gap.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// The `ScreenRevoker` the screen actors call before a slot is reused.
pub struct GatewayRevoker {
    gateway: Addr<GatewayActor>,
    routes: Arc<RouteBook>,
    events: EventBus,
}

impl GatewayRevoker {
    /// A revoker over the app's socket registry and routes; it tells other processes by
    /// `events`.
    pub fn new(gateway: Addr<GatewayActor>, routes: Arc<RouteBook>, events: EventBus) -> Self {
        Self {
            gateway,
            routes,
            events,
        }
    }
}

#[async_trait]
impl ScreenRevoker for GatewayRevoker {
    async fn revoke_slot(&self, computer_id: &str, slot: u32, generation: i64) {
        // The routes themselves end with the slot's processes (the provider's teardown).
        self.routes.retain(|k, _| {
            !(k.computer_id == computer_id && k.slot == slot && k.generation < generation)
        });
        let retired = (generation - 1).max(0);
        // Other processes' sockets of the slot (their own watchers close them).
        self.events.revoke(Revocation::SlotRetired {
            computer_id: computer_id.to_owned(),
            slot,
            generation: retired,
        });
        let Ok(slot) = u16::try_from(slot) else {
            return;
        };
        let revoke = RevokeSlot {
            computer_id: computer_id.into(),
            slot,
            generation: retired as u64,
        };
        match self.gateway.send(revoke).await {
            Ok(done) => tracing::info!(
                event = "screen.revoked",
                cause = "slot",
                closed = done.closed
            ),
            Err(_) => tracing::error!(event = "screen.revoke_failed", cause = "slot"),
        }
    }
}

/// What the watcher needs.
#[derive(Clone)]
pub struct Watch {
    /// The database (the sweep's truth).
    pub db: DatabaseConnection,
    /// This process's socket registry.
    pub gateway: Addr<GatewayActor>,
    /// This process's routes.
    pub routes: Arc<RouteBook>,
    /// The provider, which closes routes upstream.
    pub provider: Option<Arc<dyn SandboxProvider>>,
}

/// Watch typed revocations (and gaps) for as long as the process lives.
pub fn spawn_revocation_watch(events: &EventBus, watch: Watch) {
    let mut rx = events.revocations();
    let mut gaps = events.gaps();
    actix::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                got = rx.recv() => match got {
                    Ok(revocation) => apply(&watch, revocation),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(event = "screen.revocations_lagged", missed);
                        sweep(&watch).await;
                    }
                    Err(RecvError::Closed) => return,
                },
                changed = gaps.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    sweep(&watch).await;
                }
                _ = every.tick() => {
                    sweep(&watch).await;
                }
            }
        }
    });
}

/// Closes what one revocation names: the sockets are told at once, routes after. The
/// gateway's answer (it waits for the sockets to acknowledge) is awaited off the watcher, so
/// the revocations of one bot (its control grant, its slot) close their sockets together,
/// never one after the other.
fn apply(watch: &Watch, revocation: Revocation) {
    match revocation {
        Revocation::ControlEnded {
            computer_id,
            bot_id,
            fence,
        } => {
            let revoked = watch.gateway.send(RevokeControl {
                computer_id: computer_id.clone(),
                bot_id: bot_id.clone(),
                fence: fence.max(0) as u64,
            });
            let watch = watch.clone();
            actix::spawn(async move {
                if let Ok(done) = revoked.await {
                    tracing::info!(
                        event = "screen.revoked",
                        cause = "control",
                        closed = done.closed
                    );
                }
                close_control_routes(&watch, &computer_id, &bot_id, fence).await;
            });
        }
        Revocation::SlotRetired {
            computer_id,
            slot,
            generation,
        } => {
            watch.routes.retain(|k, _| {
                !(k.computer_id == computer_id && k.slot == slot && k.generation <= generation)
            });
            let Ok(slot) = u16::try_from(slot) else {
                return;
            };
            let revoked = watch.gateway.send(RevokeSlot {
                computer_id,
                slot,
                generation: generation.max(0) as u64,
            });
            actix::spawn(async move {
                if let Ok(done) = revoked.await
                    && done.closed > 0
                {
                    tracing::info!(
                        event = "screen.revoked",
                        cause = "slot",
                        closed = done.closed
                    );
                }
            });
        }
    }
}

/// Drops a control grant's routes and closes them upstream (off the revocation path).
async fn close_control_routes(watch: &Watch, computer_id: &str, bot_id: &str, fence: i64) {
    let ended: Vec<_> = watch
        .routes
        .iter()
        .filter(|e| {
            let k = e.key();
            k.computer_id == computer_id
                && k.bot_id == bot_id
                && k.policy == ScreenPolicy::Control
                && k.fence <= fence
        })
        .map(|e| e.key().clone())
        .collect();
    for key in ended {
        if let (Some((key, entry)), Some(p)) = (watch.routes.remove(&key), watch.provider.as_ref())
            && p.close_route(&entry.machine, &entry.route.token)
                .await
                .is_err()
        {
            // Kept, so that the next sweep closes it again: nothing serves an ended grant
            // unrecorded (no proxy reaches it, since the authority refuses the grant).
            tracing::warn!(event = "screen.route.close_failed", channel = ?key.channel);
            watch.routes.insert(key, entry);
        }
    }
}

/// Checks every live socket against the lease and screen tables and closes each one no
/// longer granted: a control socket whose grant is not the live one, any socket whose screen
/// row no longer has its slot and generation active. The routes this process holds are
/// checked too: a person may reach them through another process's proxy, so a revocation
/// this one missed finds no socket here. Answers how many scopes it revoked.
pub async fn sweep(watch: &Watch) -> usize {
    let Ok(mut scopes) = watch.gateway.send(ListScopes).await else {
        return 0;
    };
    for route in watch.routes.iter() {
        let k = route.key();
        let (Ok(slot), Ok(generation)) = (u16::try_from(k.slot), u64::try_from(k.generation))
        else {
            continue;
        };
        let scope = SocketScope {
            computer_id: k.computer_id.clone(),
            bot_id: k.bot_id.clone(),
            slot,
            generation,
            policy: super::policy_of(k.policy),
            fence: k.fence.max(0) as u64,
            expires_at_ms: 0,
            kind: SocketKind::Screen,
        };
        let known = |s: &SocketScope| {
            (
                &s.computer_id,
                &s.bot_id,
                s.slot,
                s.generation,
                s.policy,
                s.fence,
            ) == (
                &scope.computer_id,
                &scope.bot_id,
                slot,
                generation,
                scope.policy,
                scope.fence,
            )
        };
        if !scopes.iter().any(known) {
            scopes.push(scope);
        }
    }
    let mut revoked = 0;
    for scope in scopes {
        let revocation = match super::standing::standing(&watch.db, &scope).await {
            Standing::SlotRetired => Revocation::SlotRetired {
                computer_id: scope.computer_id.clone(),
                slot: u32::from(scope.slot),
                generation: scope.generation as i64,
            },
            Standing::ControlEnded => Revocation::ControlEnded {
                computer_id: scope.computer_id.clone(),
                bot_id: scope.bot_id.clone(),
                fence: scope.fence as i64,
            },
            Standing::Holds { .. } | Standing::Unknown => continue,
        };
        revoked += 1;
        apply(watch, revocation);
    }
    if revoked > 0 {
        tracing::info!(event = "screen.swept", revoked);
    }
    revoked
}
