//! Rakazo's screen capability proxy: sealed capabilities, the packaged noVNC viewer it serves
//! itself, the websocket relay to a computer's screen gateway, the gateway registry and
//! `screen.proxy.*` diagnostics.
//!
//! A tour, in the order a request meets them:
//! - [`capability`]: AES-256-GCM sealed capabilities and the rotating [`Keyring`].
//! - [`authority`]: the [`Authority`] port the proxy asks on every request for the current
//!   [`Target`] (in process, or [`HttpAuthority`] over internal RPC).
//! - [`service`]: [`configure`] mounts `/screen/{capability}/{tail}`; refusals, the viewer's
//!   files, the sandboxing content security policy on every response.
//! - [`viewer`]: noVNC's page and files, read once from the host's package directory into an
//!   allowlist; a computer never serves a page or a script.
//! - [`page`]: the reporter script named first in noVNC's page, the policy, the refusal page.
//! - [`relay`]: the websocket relay (actix-ws toward the browser, tokio-tungstenite upstream).
//! - [`connection`]: [`on_connect`] and how the relay ends a browser's TCP connection.
//! - [`rfb`]: the view-only RFB input filter (and the input counter of control sockets).
//! - [`sessions`]: control sessions as noted when their socket closes ([`SessionNotes`]).
//! - [`gateway`]: the [`GatewayActor`] registry of live sockets and their revocation.
//! - [`standing`]: for a proxy in its own process, the sweep that asks the API where its
//!   live sockets stand and closes the revoked ones.
//!
//! Wiring it into a server (what the composition root does):
//! 1. Build one [`Keyring`] (current key + older keys by id) shared by the API, which seals
//!    capabilities with [`Keyring::seal`], and the proxy.
//! 2. Start one [`GatewayActor`]; the screen and lease actors send it [`RevokeSlot`] before a
//!    slot is torn down or reused and [`RevokeControl`] when a control lease ends, and await the
//!    reply before going on. Terminal sockets register with it too
//!    ([`gateway::Register`] with [`gateway::SocketKind::Terminal`]).
//! 3. Implement [`Authority`] in process (check generation, control fence, computer running;
//!    return the websockify base URL, the socket token and the policy), or point the proxy at
//!    `POST {api}/internal/screen-authority` with [`HttpAuthority`].
//! 4. `App::new().configure(|cfg| configure(cfg, state))` with a [`ProxyState`] (its
//!    [`ProxyConfig::novnc_dir`] names noVNC's files; [`ProxyState::viewer_error`] says when
//!    they are missing), and add [`SAFE_LOG_DIRECTIVES`] to the log filter. Register
//!    [`on_connect`] with `HttpServer::on_connect` so a closed websocket's connection ends as
//!    soon as its close frame is out (without it, actix-http lingers up to its
//!    `client_disconnect_timeout`).
//! 5. Screen URLs handed to browsers: `/screen/<capability>/vnc.html?autoconnect=1&resize=scale`
//!    (the reporter points noVNC's websocket at `screen/<capability>/websockify`; the page runs
//!    sandboxed in an opaque origin, so frame it with `sandbox="allow-scripts"`); terminal
//!    URLs: the websocket `/screen/<control capability>/terminal`, relayed to the terminal
//!    server the authority names ([`Authority::terminal_target`]).
//!
//! Architecture invariants: the browser never sees an upstream host or socket token (they exist
//! only in [`Target`], whose `Debug` is redacted); logs never contain a capability, socket token,
//! upstream host, cookie or request header; a view connection never forwards input; a browser
//! never receives a page or script from the computer (only its websockets are relayed), and
//! every `/screen/` response sandboxes its page into an opaque origin.

#![forbid(unsafe_code)]

/// Log filter directives the server must add to its `EnvFilter`, whatever the operator asks
/// for: the HTTP and websocket client crates name the upstream host and port at debug and trace
/// level. With these, even `RUST_LOG=trace` logs no provider host (tested in `tests/logs.rs`).
pub const SAFE_LOG_DIRECTIVES: &str =
    "hyper_util=info,hyper=info,reqwest=info,tungstenite=info,tokio_tungstenite=info";

pub mod authority;
pub mod capability;
pub mod connection;
pub mod gateway;
pub mod page;
pub mod relay;
pub mod rfb;
pub mod service;
pub mod sessions;
pub mod standing;
pub mod viewer;

pub use authority::{
    Authority, AuthorityError, AuthorityRequest, AuthorityResponse, Channel, HttpAuthority,
    RejectCause, Target,
};
pub use capability::{Capability, Keyring, OpenError, Policy, SealError};
pub use connection::on_connect;
pub use gateway::{
    ExtendControl, GatewayActor, ListScopes, RevokeControl, RevokeSlot, SocketKind, SocketScope,
};
pub use service::{ProxyConfig, ProxyState, configure};
pub use sessions::{ControlSession, HttpSessionNotes, SessionNotes, SessionReport, SessionStart};
pub use standing::{Standing, StandingRequest, StandingResponse, spawn_standing_sweep};
pub use viewer::{Viewer, ViewerError};
