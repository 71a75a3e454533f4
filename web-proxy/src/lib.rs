//! Rakazo's screen capability proxy: sealed capabilities, the HTTP + websocket relay to a
//! computer's screen gateway, the noVNC page shim, the gateway registry and `screen.proxy.*`
//! diagnostics.
//!
//! A tour, in the order a request meets them:
//! - [`capability`]: AES-256-GCM sealed capabilities and the rotating [`Keyring`].
//! - [`authority`]: the [`Authority`] port the proxy asks on every request for the current
//!   [`Target`] (in process, or [`HttpAuthority`] over internal RPC).
//! - [`service`]: [`configure`] mounts `/screen/{capability}/{tail}`; refusals and HTTP proxying.
//! - [`page`]: the reporter script injected into noVNC pages, and the refusal page.
//! - [`relay`]: the websocket relay (actix-ws toward the browser, tokio-tungstenite upstream).
//! - [`rfb`]: the view-only RFB input filter.
//! - [`gateway`]: the [`GatewayActor`] registry of live sockets and their revocation.
//!
//! Architecture invariants: the browser never sees an upstream host or socket token (they exist
//! only in [`Target`], whose `Debug` is redacted); logs never contain a capability, socket token,
//! upstream host, cookie or request header; a view connection never forwards input.

#![forbid(unsafe_code)]

/// Log filter directives the server must add to its `EnvFilter`, whatever the operator asks
/// for: the HTTP and websocket client crates name the upstream host and port at debug and trace
/// level. With these, even `RUST_LOG=trace` logs no provider host (tested in `tests/logs.rs`).
pub const SAFE_LOG_DIRECTIVES: &str =
    "hyper_util=info,hyper=info,reqwest=info,tungstenite=info,tokio_tungstenite=info";

pub mod authority;
pub mod capability;
pub mod gateway;
pub mod page;
pub mod relay;
pub mod rfb;
pub mod service;

pub use authority::{Authority, AuthorityError, HttpAuthority, RejectCause, Target};
pub use capability::{Capability, Keyring, OpenError, Policy, SealError};
pub use gateway::{GatewayActor, RevokeControl, RevokeSlot};
pub use service::{ProxyConfig, ProxyState, configure};
