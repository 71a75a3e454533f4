//! Revocation: a torn-down slot closes every socket of its older generations before the slot
//! serves anyone else, and an ended control lease closes its control sockets and routes.

use std::sync::Arc;

use actix::Addr;
use async_trait::async_trait;
use rakazo_actors::events::EventBus;
use rakazo_actors::provider::{SandboxProvider, ScreenPolicy};
use rakazo_actors::screen::ScreenRevoker;
use rakazo_web_proxy::{GatewayActor, RevokeControl, RevokeSlot};

use super::RouteBook;

/// The `ScreenRevoker` the screen actors call before a slot is reused.
pub struct GatewayRevoker {
    gateway: Addr<GatewayActor>,
    routes: Arc<RouteBook>,
}

impl GatewayRevoker {
    /// A revoker over the app's socket registry and routes.
    pub fn new(gateway: Addr<GatewayActor>, routes: Arc<RouteBook>) -> Self {
        Self { gateway, routes }
    }
}

#[async_trait]
impl ScreenRevoker for GatewayRevoker {
    async fn revoke_slot(&self, computer_id: &str, slot: u32, generation: i64) {
        // The routes themselves end with the slot's processes (the provider's teardown).
        self.routes.retain(|k, _| {
            !(k.computer_id == computer_id && k.slot == slot && k.generation < generation)
        });
        let Ok(slot) = u16::try_from(slot) else {
            return;
        };
        let retired = (generation - 1).max(0) as u64;
        let revoke = RevokeSlot {
            computer_id: computer_id.into(),
            slot,
            generation: retired,
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

/// Watch the event bus for ended control leases: close their sockets, then their routes.
pub fn spawn_control_watch(
    events: &EventBus,
    gateway: Addr<GatewayActor>,
    routes: Arc<RouteBook>,
    provider: Option<Arc<dyn SandboxProvider>>,
) {
    let mut rx = events.subscribe();
    actix::spawn(async move {
        loop {
            let event = match rx.recv().await {
                Ok(e) => e,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            };
            let d = &event.data;
            let ended = matches!(
                d["state"].as_str(),
                Some("released" | "expired" | "revoked")
            );
            if event.topic != "lease.changed" || d["kind"] != "control" || !ended {
                continue;
            }
            let (Some(computer_id), Some(bot_id), Some(fence)) = (
                d["computerId"].as_str(),
                d["botId"].as_str(),
                d["fence"].as_i64(),
            ) else {
                continue;
            };
            let revoke = RevokeControl {
                computer_id: computer_id.into(),
                bot_id: bot_id.into(),
                fence: fence as u64,
            };
            if let Ok(done) = gateway.send(revoke).await {
                tracing::info!(
                    event = "screen.revoked",
                    cause = "control",
                    closed = done.closed
                );
            }
            let ended: Vec<_> = routes
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
                if let (Some((_, entry)), Some(p)) = (routes.remove(&key), provider.as_ref()) {
                    let _ = p.close_route(&entry.machine, &entry.route.token).await;
                }
            }
        }
    });
}
