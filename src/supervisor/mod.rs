//! `rakazo supervisor`: the only process that talks to the Docker engine.
//!
//! A small HTTP API (actix-web) on loopback or a private address, authenticated by
//! `SANDBOX_SUPERVISOR_TOKEN`, that creates, inspects, starts, stops and removes computer
//! containers and runs scripts in them as uid 1000. The API and worker processes reach it
//! through the docker provider (`src/providers/docker`).
//!
//! - [`wire`]: the JSON types of the API, shared with the provider's client.
//! - [`engine`]: bollard; container shape (labels, mounts, ceilings, loopback-only port);
//!   exec with deadline and kill; Docker errors translated at this edge.
//! - [`exec_agent`]: each running computer's exec agent, one engine exec held open that runs
//!   every script after the first (the engine exec stays the way in without one).
//! - [`egress`]: the egress guard: the computers' own Docker network and the firewall rules
//!   refusing private destinations, the host and other computers.
//! - [`desktops`]: per-desktop control groups nested under a container's own (CPU weight,
//!   memory ceiling, freezer), which uid 1000 inside cannot leave or steer.
//! - [`routes`]: parsing and constant-time token check only.
//! - [`listen`]: the address rule.

pub mod desktops;
pub mod egress;
pub mod engine;
pub mod exec_agent;
pub mod listen;
pub mod pool;
pub mod routes;
pub mod wire;

use std::net::TcpListener;
use std::path::PathBuf;

use actix_web::{App, HttpServer, web};

use crate::config::Config;
use engine::{Engine, EngineSettings};

/// Why the supervisor cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The token is missing or empty.
    #[error("SANDBOX_SUPERVISOR_TOKEN is required (non-empty, distinct from other secrets)")]
    NoToken,
    /// The listen address is public.
    #[error("{0}")]
    PublicAddress(String),
    /// `DATA_DIR` cannot be used.
    #[error("DATA_DIR: {0}")]
    DataDir(std::io::Error),
    /// The engine does not answer.
    #[error("{0}")]
    Engine(#[from] engine::EngineError),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The engine settings from the configuration (absolute `DATA_DIR`, image, ceilings).
pub fn settings(config: &Config) -> Result<EngineSettings, SupervisorError> {
    std::fs::create_dir_all(&config.data_dir).map_err(SupervisorError::DataDir)?;
    let data_dir: PathBuf = config
        .data_dir
        .canonicalize()
        .map_err(SupervisorError::DataDir)?;
    Ok(EngineSettings {
        data_dir,
        image: config
            .docker
            .image
            .clone()
            .unwrap_or_else(crate::image::default_image),
        docker: config.docker.clone(),
    })
}

/// Checks the token and address, connects to the engine and binds: everything that can
/// refuse the start, before anything is served.
pub async fn prepare(
    config: &Config,
) -> Result<(TcpListener, web::Data<routes::State>), SupervisorError> {
    prepare_with(config, false).await
}

/// [`prepare`]; with `build_image`, a missing image of the built-in recipe is built here, in
/// the background from the start and awaited by the first computer that needs it (the
/// supervisor `rakazo serve` starts itself).
pub async fn prepare_with(
    config: &Config,
    build_image: bool,
) -> Result<(TcpListener, web::Data<routes::State>), SupervisorError> {
    let token = config
        .supervisor_token
        .as_ref()
        .map(|t| t.0.clone())
        .filter(|t| !t.is_empty())
        .ok_or(SupervisorError::NoToken)?;
    listen::check(config.supervisor_listen).map_err(SupervisorError::PublicAddress)?;
    let mut engine = Engine::connect(settings(config)?).await?;
    if build_image {
        engine = engine.building_missing_image();
    }
    if !engine.image_present().await? {
        tracing::warn!(image = %engine.settings().image, "supervisor.image.missing");
        if build_image {
            let engine = engine.clone();
            actix_rt::spawn(async move { engine.ensure_image().await });
        }
    }
    actix_rt::spawn(pool::reap(engine.clone()));
    let listener = TcpListener::bind(config.supervisor_listen)?;
    Ok((listener, web::Data::new(routes::State::new(engine, &token))))
}

/// Serves the API on `listener` until the server is stopped.
pub fn serve(
    listener: TcpListener,
    state: web::Data<routes::State>,
) -> std::io::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .configure(routes::configure)
    })
    .workers(2)
    .listen(listener)?
    .run();
    Ok(server)
}
