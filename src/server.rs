//! The HTTP server: binds the API to a listener. Tests bind `127.0.0.1:0`.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::Server;

use crate::api;
use crate::app::App;

/// Build the server on an already-bound listener; the caller runs (awaits or spawns) it.
pub fn build(app: Arc<App>, listener: TcpListener, workers: usize) -> std::io::Result<Server> {
    let server = actix_web::HttpServer::new(move || {
        let proxy = app.proxy.clone();
        let api = app.config.role.api();
        actix_web::App::new()
            .configure(api::configure(app.clone()))
            .configure(move |cfg| {
                if api {
                    rakazo_web_proxy::configure(cfg, proxy)
                }
            })
    })
    .on_connect(rakazo_web_proxy::on_connect)
    .workers(workers.max(1))
    .disable_signals()
    .shutdown_timeout(5)
    .listen(listener)?
    .run();
    Ok(server)
}
