//! Rakazo Runtime: self-hostable computers for AI agents.
//!
//! A tour of this crate (the composition root):
//! - [`config`]: typed configuration from `config/default.toml`, a file and the environment.
//! - [`db`]: database connection and migrations.
//! - [`auth`]: bearer tokens and the operator token.
//! - [`app`]: wiring of database, provider, stores and actors.
//! - [`api`]: health, JSON-RPC over HTTP and websocket, live subscriptions.
//! - [`dashboard`]: the web dashboard's static files, served at `/`.
//! - [`desktop`]: the shared Linux desktop runtime (Xvfb, browser, screen gateway, capture, input).
//! - [`providers`]: `SandboxProvider` adapters (the `fake` emulator, `docker`, ...).
//! - [`supervisor`]: `rakazo supervisor`, the only process that talks to the Docker engine.
//! - [`image`]: the computer image recipe, its tag and `rakazo image build`.
//! - [`screens`]: live screens for people: capabilities, routes, the proxy's authority.
//! - [`stores`]: `HomeStore` adapters.
//! - [`tools`]: the computer tools agents call (JSON-RPC `tools/*` and MCP).
//! - [`server`]: the HTTP server around [`api::configure`].
//!
//! The actors and domain rules live in the `rakazo-actors` crate; the screen proxy in
//! `rakazo-web-proxy`.

// One audited call into the C library (`malloc::tune`) allows itself; nothing else may.
#![deny(unsafe_code)]

pub mod api;
pub mod app;
pub mod auth;
pub mod config;
pub mod crash_point;
pub mod dashboard;
pub mod db;
pub mod desktop;
pub mod emulators;
pub mod exec_agent;
pub mod forward;
pub mod image;
pub mod keyfile;
pub mod malloc;
pub mod managed;
pub mod notify;
pub mod providers;
pub mod recordings;
pub mod recovery;
pub mod screen_proxy;
pub mod screens;
pub mod server;
pub mod stores;
pub mod supervisor;
pub mod telemetry;
pub mod tools;
