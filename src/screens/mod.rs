//! Live screens for people: routes to a bot's screen, sealed capabilities that name them, the
//! in-process authority the screen proxy asks, and revocation.
//!
//! A capability URL is issued for one (computer, bot, slot, generation, policy, fence). The
//! route behind it (a VNC server on a fresh gateway socket) lives in the [`RouteBook`] only
//! while that tuple is current: the slot's generation moves on teardown, control ends with its
//! lease, and then the route is dropped and every live socket of it is closed.

mod authority;
mod elsewhere;
mod revoke;
mod sessions;
mod standing;

mod freeze_rows;

pub use freeze_rows::follow_desktop_freezes;

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use dashmap::DashMap;
use rakazo_actors::computer::CurrentMachine;
use rakazo_actors::entity::computer;
use rakazo_actors::provider::{ProviderRef, SandboxProvider, ScreenPolicy, ScreenRoute};
use rakazo_actors::registry::Registry;
use rakazo_actors::{DomainError, DomainResult, ErrorCode, screen};
use rakazo_web_proxy::service::TERMINAL_TAIL;
use rakazo_web_proxy::{Capability, Channel, GatewayActor, Keyring, Policy};
use serde::{Deserialize, Serialize};

use elsewhere::Holder;

pub use authority::ScreenAuthority;
pub use elsewhere::{Elsewhere, HOP_HEADER, ISSUE_PATH, IssueAnswer, IssueRequest};
pub use revoke::{GatewayRevoker, Watch, spawn_revocation_watch, sweep};
pub use sessions::TimelineNotes;
pub use standing::standing;

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
    /// The screen itself, or the terminal bound to its control.
    pub channel: Channel,
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
#[derive(Clone, Debug, Serialize, Deserialize)]
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

/// The terminal frame protocol a terminal URL speaks (see `desktop::terminal_frames`).
pub const TERMINAL_PROTOCOL: &str = "rakazo.terminal.v1";

/// A terminal websocket URL handed to the browser of the person holding control.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminalUrl {
    /// Path of the terminal websocket through the screen proxy (relative to the API's origin).
    pub url: String,
    /// When it stops working (the control lease's expiry).
    pub expires_at_ms: i64,
    /// The frame protocol spoken on it ([`TERMINAL_PROTOCOL`]).
    pub protocol: String,
}

/// The screen capability service of the app.
pub struct Screens {
    keyring: Arc<Keyring>,
    gateway: Addr<GatewayActor>,
    routes: Arc<RouteBook>,
    elsewhere: Arc<Elsewhere>,
}

/// A screen's route key, or the process that holds its computer.
enum Keyed {
    /// This process holds the computer (on `ProviderRef`).
    Here(RouteKey, ProviderRef),
    /// Another live process does, at this internal address.
    Elsewhere(String),
}

/// Whether a request may be passed on to the process holding the computer: not when it was
/// itself passed on (never a second hop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Asked by a client of this process.
    First,
    /// Forwarded by another process.
    Forwarded,
}

fn policy_of(p: ScreenPolicy) -> Policy {
    match p {
        ScreenPolicy::View => Policy::View,
        ScreenPolicy::Control => Policy::Control,
    }
}

impl Screens {
    /// A service sealing with `keyring`, revoking through `gateway`, asking the process that
    /// holds a computer through `elsewhere`.
    pub fn new(
        keyring: Arc<Keyring>,
        gateway: Addr<GatewayActor>,
        routes: Arc<RouteBook>,
        elsewhere: Arc<Elsewhere>,
    ) -> Self {
        Self {
            keyring,
            gateway,
            routes,
            elsewhere,
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

    /// Issue a URL to the bot's screen, opening the screen (and a route) when needed; the
    /// process holding the computer issues it when that is not this one.
    pub async fn issue(
        &self,
        registry: &Registry,
        c: &computer::Model,
        bot_id: &str,
        policy: ScreenPolicy,
        fence: i64,
        expires_at_ms: i64,
    ) -> DomainResult<ScreenUrl> {
        let request = IssueRequest {
            computer_id: c.id.clone(),
            bot_id: bot_id.into(),
            policy,
            fence,
            expires_at_ms,
            channel: Channel::Screen,
        };
        self.issue_from(registry, c, &request, Hop::First).await
    }

    /// [`Self::issue`] of `r`, passed on to the holding process only on the [`Hop::First`] hop.
    pub async fn issue_from(
        &self,
        registry: &Registry,
        c: &computer::Model,
        r: &IssueRequest,
        hop: Hop,
    ) -> DomainResult<ScreenUrl> {
        let (policy, expires_at_ms) = (r.policy, r.expires_at_ms);
        let (key, machine) = match self
            .key(registry, c, &r.bot_id, policy, r.fence, hop)
            .await?
        {
            Keyed::Here(key, machine) => (key, machine),
            Keyed::Elsewhere(address) => return self.elsewhere.issue(&address, r).await,
        };
        self.screen_route(registry, &key, &machine).await?;
        let token = self.seal(&key, expires_at_ms)?;
        tracing::info!(event = "screen.capability_issued", computer.id = %c.id, policy = ?policy,
            generation = key.generation);
        Ok(ScreenUrl {
            url: format!("/screen/{token}/vnc.html?autoconnect=1&resize=scale"),
            expires_at_ms,
            slot: key.slot,
            generation: key.generation,
            policy,
        })
    }

    /// Issue the terminal URL of the bot's screen under the control lease at `fence`: the
    /// provider's terminal server, bound to the control route (opened when missing) and
    /// started on first use; later calls under the same lease join the same server. The
    /// process holding the computer issues it when that is not this one.
    pub async fn terminal(
        &self,
        registry: &Registry,
        c: &computer::Model,
        bot_id: &str,
        fence: i64,
        expires_at_ms: i64,
    ) -> DomainResult<TerminalUrl> {
        let request = IssueRequest {
            computer_id: c.id.clone(),
            bot_id: bot_id.into(),
            policy: ScreenPolicy::Control,
            fence,
            expires_at_ms,
            channel: Channel::Terminal,
        };
        self.terminal_from(registry, c, &request, Hop::First).await
    }

    /// [`Self::terminal`] of `r` (its policy is control whatever it says), passed on to the
    /// holding process only on the [`Hop::First`] hop.
    pub async fn terminal_from(
        &self,
        registry: &Registry,
        c: &computer::Model,
        r: &IssueRequest,
        hop: Hop,
    ) -> DomainResult<TerminalUrl> {
        let (bot_id, fence, expires_at_ms) = (r.bot_id.as_str(), r.fence, r.expires_at_ms);
        let provider = registry.runtime().provider()?;
        if !provider.describe().capabilities.terminal {
            return Err(DomainError::new(
                ErrorCode::Unsupported,
                "this computer has no browser terminal",
            ));
        }
        let (screen_key, machine) = match self
            .key(registry, c, bot_id, ScreenPolicy::Control, fence, hop)
            .await?
        {
            Keyed::Here(key, machine) => (key, machine),
            Keyed::Elsewhere(address) => return self.elsewhere.issue(&address, r).await,
        };
        // The terminal is bound to the control route, on providers that serve screens.
        let control = match self.screen_route(registry, &screen_key, &machine).await {
            Ok(route) => Some(route),
            Err(e) if e.code == ErrorCode::Unsupported => None,
            Err(e) => return Err(e),
        };
        let key = RouteKey {
            channel: Channel::Terminal,
            ..screen_key
        };
        if !self.routes.contains_key(&key) {
            let route = provider
                .connect_terminal(&machine, bot_id, control.as_ref())
                .await?;
            self.record(
                provider.as_ref(),
                key.clone(),
                RouteEntry { route, machine },
            )
            .await;
        }
        let token = self.seal(&key, expires_at_ms)?;
        tracing::info!(event = "screen.terminal_issued", computer.id = %c.id,
            generation = key.generation);
        Ok(TerminalUrl {
            url: format!("/screen/{token}/{TERMINAL_TAIL}"),
            expires_at_ms,
            protocol: TERMINAL_PROTOCOL.into(),
        })
    }

    /// The route of `key` (a screen route), opened through the provider when the book has
    /// none.
    async fn screen_route(
        &self,
        registry: &Registry,
        key: &RouteKey,
        machine: &ProviderRef,
    ) -> DomainResult<ScreenRoute> {
        if let Some(entry) = self.routes.get(key) {
            return Ok(entry.route.clone());
        }
        let provider = registry.runtime().provider()?;
        let route = provider
            .open_route(machine, &key.bot_id, key.policy)
            .await?;
        let entry = RouteEntry {
            route,
            machine: machine.clone(),
        };
        Ok(self.record(provider.as_ref(), key.clone(), entry).await)
    }

    /// Records a route just opened for `key` and answers the one that serves it: a request
    /// beside this one may have recorded its own meanwhile, and then that one serves and the
    /// route just opened is closed (never left running unrecorded, past every revocation).
    async fn record(
        &self,
        provider: &dyn SandboxProvider,
        key: RouteKey,
        entry: RouteEntry,
    ) -> ScreenRoute {
        let (serving, surplus) = match self.routes.entry(key) {
            dashmap::Entry::Occupied(recorded) => (recorded.get().route.clone(), Some(entry)),
            dashmap::Entry::Vacant(vacant) => (vacant.insert(entry).route.clone(), None),
        };
        if let Some(surplus) = surplus {
            let _ = provider
                .close_route(&surplus.machine, &surplus.route.token)
                .await;
        }
        serving
    }

    /// Opens the bot's screen and names the screen route a capability for it would reach, or
    /// the process that holds the computer (on the [`Hop::First`] hop only).
    async fn key(
        &self,
        registry: &Registry,
        c: &computer::Model,
        bot_id: &str,
        policy: ScreenPolicy,
        fence: i64,
        hop: Hop,
    ) -> DomainResult<Keyed> {
        let handle = registry.computer(&c.id, &c.space_id);
        let state = registry
            .screen(&handle, bot_id)
            .send(screen::Open)
            .await??;
        let Some(machine) = handle.computer.send(CurrentMachine).await? else {
            if hop == Hop::First
                && let Holder::Elsewhere { address, .. } =
                    Elsewhere::holder(&registry.runtime().db, &c.id).await?
            {
                return Ok(Keyed::Elsewhere(address));
            }
            return Err(DomainError::code(ErrorCode::ComputerUnavailable));
        };
        let key = RouteKey {
            computer_id: c.id.clone(),
            bot_id: bot_id.into(),
            slot: state.slot,
            generation: state.generation,
            policy,
            fence,
            channel: Channel::Screen,
        };
        Ok(Keyed::Here(key, machine))
    }

    /// Seals the capability of a route key.
    fn seal(&self, key: &RouteKey, expires_at_ms: i64) -> DomainResult<String> {
        let capability = Capability {
            computer_id: key.computer_id.clone(),
            bot_id: key.bot_id.clone(),
            slot: u16::try_from(key.slot)
                .map_err(|_| DomainError::new(ErrorCode::Internal, "slot out of range"))?,
            generation: key.generation.max(0) as u64,
            policy: policy_of(key.policy),
            fence: key.fence.max(0) as u64,
            expires_at_ms: expires_at_ms.max(0) as u64,
        };
        self.keyring.seal(&capability).map_err(|_| {
            DomainError::new(ErrorCode::Internal, "could not seal a screen capability")
        })
    }
}
