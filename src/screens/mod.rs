//! Live screens for people: routes to a bot's screen, sealed capabilities that name them, the
//! in-process authority the screen proxy asks, and revocation.
//!
//! A capability URL is issued for one (computer, bot, slot, generation, policy, fence). The
//! route behind it (a VNC server on a fresh gateway socket) lives in the [`RouteBook`] only
//! while that tuple is current: the slot's generation moves on teardown, control ends with its
//! lease, and then the route is dropped and every live socket of it is closed.

mod authority;
mod revoke;

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use dashmap::DashMap;
use rakazo_actors::computer::CurrentMachine;
use rakazo_actors::entity::computer;
use rakazo_actors::provider::{ProviderRef, ScreenPolicy, ScreenRoute};
use rakazo_actors::registry::Registry;
use rakazo_actors::{DomainError, DomainResult, ErrorCode, screen};
use rakazo_web_proxy::{Capability, GatewayActor, Keyring, Policy};
use serde::Serialize;

pub use authority::ScreenAuthority;
pub use revoke::{GatewayRevoker, spawn_control_watch};

/// Lifetime of a view URL.
pub const VIEW_TTL: Duration = Duration::from_secs(15 * 60);

/// What a route is for; a route serves exactly one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteKey {
    /// The computer.
    pub computer_id: String,
    /// The bot whose screen it is.
    pub bot_id: String,
    /// Display slot.
    pub slot: u32,
    /// Screen generation.
    pub generation: i64,
    /// View or control.
    pub policy: ScreenPolicy,
    /// Control-lease fence (0 for view).
    pub fence: i64,
}

/// A live route and the machine that serves it.
#[derive(Clone, Debug)]
pub struct RouteEntry {
    /// Where the proxy connects (secret).
    pub route: ScreenRoute,
    /// The machine behind it.
    pub machine: ProviderRef,
}

/// Live routes by key.
pub type RouteBook = DashMap<RouteKey, RouteEntry>;

/// A URL handed to a person's browser.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScreenUrl {
    /// Path of the noVNC page through the screen proxy (relative to the API's origin).
    pub url: String,
    /// When it stops working.
    pub expires_at_ms: i64,
    /// Display slot.
    pub slot: u32,
    /// Screen generation it is bound to.
    pub generation: i64,
    /// `view` or `control`.
    pub policy: ScreenPolicy,
}

/// The screen capability service of the app.
pub struct Screens {
    keyring: Arc<Keyring>,
    gateway: Addr<GatewayActor>,
    routes: Arc<RouteBook>,
}

fn policy_of(p: ScreenPolicy) -> Policy {
    match p {
        ScreenPolicy::View => Policy::View,
        ScreenPolicy::Control => Policy::Control,
    }
}

impl Screens {
    /// A service sealing with `keyring`, revoking through `gateway`.
    pub fn new(keyring: Arc<Keyring>, gateway: Addr<GatewayActor>, routes: Arc<RouteBook>) -> Self {
        Self {
            keyring,
            gateway,
            routes,
        }
    }

    /// The keyring (shared with the proxy).
    pub fn keyring(&self) -> &Arc<Keyring> {
        &self.keyring
    }

    /// The socket registry (shared with the proxy).
    pub fn gateway(&self) -> &Addr<GatewayActor> {
        &self.gateway
    }

    /// Issue a URL to the bot's screen, opening the screen (and a route) when needed.
    pub async fn issue(
        &self,
        registry: &Registry,
        c: &computer::Model,
        bot_id: &str,
        policy: ScreenPolicy,
        fence: i64,
        expires_at_ms: i64,
    ) -> DomainResult<ScreenUrl> {
        let handle = registry.computer(&c.id, &c.space_id);
        let state = registry
            .screen(&handle, bot_id)
            .send(screen::Open)
            .await??;
        let machine = handle
            .computer
            .send(CurrentMachine)
            .await?
            .ok_or_else(|| DomainError::code(ErrorCode::ComputerUnavailable))?;
        let key = RouteKey {
            computer_id: c.id.clone(),
            bot_id: bot_id.into(),
            slot: state.slot,
            generation: state.generation,
            policy,
            fence,
        };
        if !self.routes.contains_key(&key) {
            let provider = registry.runtime().provider()?;
            let route = provider.open_route(&machine, bot_id, policy).await?;
            self.routes
                .insert(key.clone(), RouteEntry { route, machine });
        }
        let capability = Capability {
            computer_id: c.id.clone(),
            bot_id: bot_id.into(),
            slot: u16::try_from(state.slot)
                .map_err(|_| DomainError::new(ErrorCode::Internal, "slot out of range"))?,
            generation: state.generation.max(0) as u64,
            policy: policy_of(policy),
            fence: fence.max(0) as u64,
            expires_at_ms: expires_at_ms.max(0) as u64,
        };
        let token = self.keyring.seal(&capability).map_err(|_| {
            DomainError::new(ErrorCode::Internal, "could not seal a screen capability")
        })?;
        tracing::info!(event = "screen.capability_issued", computer.id = %c.id, policy = ?policy,
            generation = state.generation);
        Ok(ScreenUrl {
            url: format!("/screen/{token}/vnc.html?autoconnect=1&resize=scale"),
            expires_at_ms,
            slot: state.slot,
            generation: state.generation,
            policy,
        })
    }
}
