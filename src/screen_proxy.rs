//! The screen proxy in its own process (`rakazo screen-proxy --api URL`): it opens capabilities
//! with the deployment's screen key, asks the API for every target over internal RPC
//! (`/internal/screen-authority`) and reports every control session to it
//! (`/internal/control-session`), both with the internal credential, so sessions it relays
//! reach the same timeline (and, with `RECORD_CONTROL_SESSIONS`, the same recordings) as the
//! API's own proxy. It hears no revocation: every half second it asks where its live sockets
//! stand (`/internal/screen-standing`) and closes those no longer granted.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;
use rakazo_web_proxy::{GatewayActor, HttpAuthority, HttpSessionNotes, Keyring, ProxyConfig};

use crate::config::Config;

/// Build the proxy's server on an already-bound listener; the caller runs it. The keys are
/// the configured ones, or those kept in `DATA_DIR` (a proxy beside the API shares them).
pub fn build(config: &Config, api: &str, listener: TcpListener) -> Result<Server, String> {
    let screen_key = crate::keyfile::load_or_create(
        config.screen_secret.as_ref(),
        &config.data_dir,
        "screen-capability.key",
    )?;
    let internal = crate::keyfile::load_or_create(
        config.internal_token.as_ref(),
        &config.data_dir,
        crate::app::INTERNAL_TOKEN_FILE,
    )?;
    let bearer = hex::encode(internal);
    let proxy_config = ProxyConfig {
        novnc_dir: config.novnc_dir.clone(),
        ..ProxyConfig::default()
    };
    let authority = HttpAuthority::new(api, bearer.clone(), proxy_config.authority_timeout)
        .map_err(|e| format!("the API URL: {e}"))?;
    let notes = HttpSessionNotes::new(api, bearer, proxy_config.authority_timeout)
        .map_err(|e| format!("the API URL: {e}"))?;
    let authority = Arc::new(authority);
    let gateway = GatewayActor::start_default();
    // This process hears no revocation: it asks where its sockets stand.
    rakazo_web_proxy::spawn_standing_sweep(
        gateway.clone(),
        authority.clone(),
        rakazo_web_proxy::standing::STANDING_EVERY,
    );
    let state = rakazo_web_proxy::ProxyState::new(
        Arc::new(Keyring::new(1, &screen_key)),
        authority,
        gateway,
        proxy_config,
    );
    state.set_session_notes(Arc::new(notes));
    let server = actix_web::HttpServer::new(move || {
        let state = state.clone();
        actix_web::App::new().configure(move |cfg| rakazo_web_proxy::configure(cfg, state))
    })
    .on_connect(rakazo_web_proxy::on_connect)
    .workers(1)
    .disable_signals()
    .shutdown_timeout(5)
    .listen(listener)
    .map_err(|e| format!("listen: {e}"))?
    .run();
    Ok(server)
}
