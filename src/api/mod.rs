//! The HTTP surface: health, JSON-RPC over `POST /rpc` and over the `/rpc/ws` websocket.
//! One [`configure`] serves both `main` and the tests.

mod internal;
pub mod mcp;
pub mod methods;
pub mod rpc;
pub mod ws;

pub(crate) use internal::internal_caller;

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use rakazo_actors::{DomainError, ErrorCode};
use serde_json::{Value, json};

use crate::app::App;
use crate::auth::{self, Caller};

/// Mount every route.
pub fn configure(app: Arc<App>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        let api = app.config.role.api();
        cfg.app_data(web::Data::from(app))
            .route("/internal/health", web::get().to(health))
            .route(
                "/internal/screen-authority",
                web::post().to(internal::screen_authority),
            )
            .route(
                "/internal/control-session",
                web::post().to(internal::control_session),
            )
            .route(
                "/internal/screen-standing",
                web::post().to(internal::screen_standing),
            )
            .route(
                crate::screens::ISSUE_PATH,
                web::post().to(internal::screen_url),
            )
            .route("/internal/computer", web::post().to(crate::forward::serve));
        if !api {
            // `rakazo worker`: health and the internal endpoints only.
            return;
        }
        cfg.route("/rpc", web::post().to(rpc_http))
            .route("/rpc/ws", web::get().to(ws::upgrade))
            .service(
                web::resource("/mcp")
                    .route(web::post().to(mcp::post))
                    .route(web::delete().to(mcp::delete))
                    .route(web::get().to(mcp::get)),
            )
            .configure(crate::dashboard::configure);
    }
}

async fn health(app: web::Data<App>) -> HttpResponse {
    let db_ok = app.db.ping().await.is_ok();
    let status = &app.provider_status;
    let (backend, egress, groups, warm) = match &app.runtime().provider {
        Some(p) => (
            p.health().await,
            p.egress_guard().await,
            p.desktop_groups().await,
            p.warm_desktops().await,
        ),
        None => (Ok(()), None, None, None),
    };
    let viewer = app.proxy.viewer_error();
    let ok = db_ok
        && status.setup_error.is_none()
        && backend.is_ok()
        && viewer.is_none()
        && !matches!(egress, Some(Err(_)));
    let mut body = json!({
        "status": if ok { "ok" } else { "degraded" },
        "sandbox": status.sandbox,
        "database": app.config.database_kind(),
        "role": app.config.role.as_str(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    if let Some(err) = &status.setup_error {
        body["setupError"] = json!(err);
    } else if status.sandbox == "docker" {
        // Whether serve started the supervisor itself or one was configured.
        body["supervisor"] = json!(if app.config.supervisor_managed {
            "managed"
        } else {
            "external"
        });
    }
    match egress {
        Some(Ok(state)) => {
            body["egressGuard"] = json!(state);
        }
        Some(Err(why)) => {
            body["egressGuard"] = json!("inactive");
            body["egressGuardError"] = json!(why);
        }
        None => {}
    }
    // Optional: a host that cannot delegate control groups runs desktops without limits or
    // freezing, and says so here without being degraded.
    match groups {
        Some(Ok(state)) => body["desktopGroups"] = json!(state),
        Some(Err(why)) => {
            body["desktopGroups"] = json!("off");
            body["desktopGroupsError"] = json!(why);
        }
        None => {}
    }
    if let Some(warm) = warm {
        body["warmDesktops"] = json!(warm);
    }
    if let Err(why) = backend {
        body["sandboxError"] = json!(why);
    }
    if !db_ok {
        body["databaseError"] = json!("the database did not answer");
    }
    if let Some(why) = viewer {
        body["screenViewerError"] = json!(why.to_string());
    }
    HttpResponse::Ok().json(body)
}

/// The bearer token of a request, if any.
pub fn bearer(req: &HttpRequest) -> Option<String> {
    let value = req.headers().get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(|t| t.trim().to_owned())
}

/// Authenticate a request's bearer token.
pub async fn caller(app: &App, req: &HttpRequest) -> Result<Caller, DomainError> {
    match bearer(req) {
        Some(token) => auth::authenticate(&app.db, &token).await,
        None => Err(DomainError::new(
            ErrorCode::Unauthorized,
            "a bearer token is required",
        )),
    }
}

pub fn json_status(status: u16, body: Value) -> HttpResponse {
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::OK)).json(body)
}

/// Why a body could not be read.
pub enum BodyError {
    /// The connection failed mid-body.
    Unreadable,
    /// The body is longer than allowed.
    TooLarge,
}

/// Read a request body of at most `limit` bytes; stops reading at the first byte beyond it.
pub async fn read_body(
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, BodyError> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The response to a body that could not be read.
pub fn body_error(err: BodyError) -> HttpResponse {
    match err {
        BodyError::Unreadable => json_status(
            400,
            rpc::protocol_error(Value::Null, -32700, "unreadable body"),
        ),
        BodyError::TooLarge => {
            let err = DomainError::new(ErrorCode::TooLarge, "request exceeds 12 MiB");
            json_status(413, rpc::error(Value::Null, &err))
        }
    }
}

/// `POST /rpc`: the bearer token is checked from the header before the body is read, so an
/// unauthenticated request is answered 401 without buffering its body.
async fn rpc_http(app: web::Data<App>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    let caller = match caller(&app, &req).await {
        Ok(c) => c,
        Err(err) => return json_status(err.code.http_status(), rpc::error(Value::Null, &err)),
    };
    let body = match read_body(payload, rpc::MAX_REQUEST_BYTES).await {
        Ok(body) => body,
        Err(err) => return body_error(err),
    };
    let ctx = methods::Ctx {
        app: &app,
        caller: &caller,
        attachments: None,
    };
    let (resp, status) = rpc::handle_body(&ctx, &body).await;
    if status == 204 {
        return HttpResponse::NoContent().finish();
    }
    json_status(status, resp)
}
