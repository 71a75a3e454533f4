//! The supervisor's HTTP routes: parsing and authentication only; the engine does the work.

use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::engine::{Engine, EngineError};
use super::wire::{
    AskBody, CreateComputer, CreatePooled, DesktopEnter, ErrorBody, ErrorCode, ExecBody,
};

/// Largest request body (an exec script).
pub const BODY_LIMIT: usize = 4 << 20;

/// The shared state of the routes.
pub struct State {
    /// The engine.
    pub engine: Engine,
    /// SHA-256 of the token: compared in constant time, whatever the presented length.
    token_digest: [u8; 32],
}

impl State {
    /// State for `engine`, accepting `token` only.
    pub fn new(engine: Engine, token: &str) -> Self {
        Self {
            engine,
            token_digest: Sha256::digest(token.as_bytes()).into(),
        }
    }
}

/// Mounts every route under `/v1` (one function for `main` and the tests).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::JsonConfig::default().limit(BODY_LIMIT))
        .service(
            web::scope("/v1")
                .route("/health", web::get().to(health))
                .route("/image", web::get().to(image))
                .route("/image", web::post().to(build_image))
                .route("/computers", web::post().to(create))
                .route("/computers", web::get().to(find))
                .route("/computers/{id}", web::get().to(inspect))
                .route("/computers/{id}", web::delete().to(remove))
                .route("/computers/{id}/start", web::post().to(start))
                .route("/computers/{id}/claim", web::post().to(claim))
                .route("/pool", web::post().to(create_pooled))
                .route("/pool/{owner}/renew", web::post().to(renew_pool))
                .route("/computers/{id}/stop", web::post().to(stop))
                .route("/computers/{id}/exec", web::post().to(exec))
                .route("/computers/{id}/exec/{run}/kill", web::post().to(kill))
                .route("/computers/{id}/ask", web::post().to(ask))
                .route(
                    "/computers/{id}/desktops/{desktop}",
                    web::put().to(desktop_enter),
                )
                .route(
                    "/computers/{id}/desktops/{desktop}",
                    web::get().to(desktop_usage),
                )
                .route(
                    "/computers/{id}/desktops/{desktop}",
                    web::delete().to(desktop_remove),
                )
                .route(
                    "/computers/{id}/desktops/{desktop}/freeze",
                    web::post().to(desktop_freeze),
                )
                .route(
                    "/computers/{id}/desktops/{desktop}/thaw",
                    web::post().to(desktop_thaw),
                )
                .route(
                    "/computers/{id}/thaw-desktops",
                    web::post().to(thaw_desktops),
                ),
        );
}

/// Proof that the request carried the token.
pub struct Authorized;

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(state) = req.app_data::<web::Data<State>>() else {
            return ready(Err(ApiError::Unauthorized));
        };
        let presented = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let ok = bool::from(digest.ct_eq(&state.token_digest)) && !presented.is_empty();
        ready(if ok {
            Ok(Authorized)
        } else {
            tracing::warn!("supervisor.auth.refused");
            Err(ApiError::Unauthorized)
        })
    }
}

/// Errors as responses, in one place, by cause.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Missing or wrong token.
    #[error("unauthorized")]
    Unauthorized,
    /// From the engine.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Engine(EngineError::Gone) => StatusCode::NOT_FOUND,
            ApiError::Engine(EngineError::Invalid(_)) => StatusCode::BAD_REQUEST,
            ApiError::Engine(EngineError::ImageMissing(_)) => StatusCode::FAILED_DEPENDENCY,
            ApiError::Engine(EngineError::Engine(_)) => StatusCode::BAD_GATEWAY,
            ApiError::Engine(EngineError::DesktopGroups(_)) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Engine(EngineError::Group(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Engine(EngineError::HomeInUse) => StatusCode::CONFLICT,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let code = match self {
            ApiError::Unauthorized => ErrorCode::Unauthorized,
            ApiError::Engine(EngineError::Gone) => ErrorCode::MachineGone,
            ApiError::Engine(EngineError::Invalid(_)) => ErrorCode::InvalidRequest,
            ApiError::Engine(EngineError::ImageMissing(_)) => ErrorCode::ImageMissing,
            ApiError::Engine(EngineError::Engine(_)) => ErrorCode::Engine,
            ApiError::Engine(EngineError::DesktopGroups(_)) => ErrorCode::DesktopGroupsUnavailable,
            ApiError::Engine(EngineError::Group(_)) => ErrorCode::DesktopGroupFailed,
            ApiError::Engine(EngineError::HomeInUse) => ErrorCode::HomeInUse,
        };
        match self {
            ApiError::Engine(EngineError::Engine(reason)) => {
                tracing::warn!(error = %reason, "supervisor.engine.failed")
            }
            ApiError::Engine(EngineError::Group(reason)) => {
                tracing::warn!(error = %reason, "supervisor.desktop.failed")
            }
            _ => {}
        }
        HttpResponse::build(self.status_code()).json(ErrorBody {
            code,
            message: self.to_string(),
        })
    }
}

type Answer = Result<HttpResponse, ApiError>;

async fn create(_: Authorized, s: web::Data<State>, body: web::Json<CreateComputer>) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.create(&body).await?))
}

async fn create_pooled(
    _: Authorized,
    s: web::Data<State>,
    body: web::Json<CreatePooled>,
) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.create_pooled(&body.owner).await?))
}

async fn renew_pool(_: Authorized, s: web::Data<State>, owner: web::Path<String>) -> Answer {
    let containers = s.engine.renew_pool(&owner).await?;
    Ok(HttpResponse::Ok().json(super::wire::PoolRenewal { containers }))
}

async fn claim(
    _: Authorized,
    s: web::Data<State>,
    id: web::Path<String>,
    body: web::Json<CreateComputer>,
) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.claim(&id, &body).await?))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FindQuery {
    home_key: String,
}

async fn find(_: Authorized, s: web::Data<State>, q: web::Query<FindQuery>) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.find(&q.home_key).await?))
}

async fn inspect(_: Authorized, s: web::Data<State>, id: web::Path<String>) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.inspect(&id).await?))
}

async fn start(_: Authorized, s: web::Data<State>, id: web::Path<String>) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.start(&id).await?))
}

async fn health(_: Authorized, s: web::Data<State>) -> Answer {
    s.engine.ping().await?;
    let guard = s.engine.egress().await;
    Ok(HttpResponse::Ok().json(super::wire::Health {
        egress_guard: guard.describe(),
        egress_active: matches!(
            guard,
            super::egress::GuardState::Active | super::egress::GuardState::NoNetwork
        ),
        desktop_groups: s.engine.desktops().describe(),
        desktop_groups_active: s.engine.desktops().active(),
    }))
}

/// Whether the computer image is on the engine.
async fn image(_: Authorized, s: web::Data<State>) -> Answer {
    Ok(HttpResponse::Ok().json(super::wire::ImageStatus {
        image: s.engine.settings().image.clone(),
        present: s.engine.image_present().await?,
    }))
}

/// Make the computer image present (a missing image of the built-in recipe is built when this
/// supervisor builds images); answers once it is.
async fn build_image(_: Authorized, s: web::Data<State>) -> Answer {
    s.engine.ensure_image().await?;
    Ok(HttpResponse::Ok().json(super::wire::ImageStatus {
        image: s.engine.settings().image.clone(),
        present: true,
    }))
}

async fn stop(_: Authorized, s: web::Data<State>, id: web::Path<String>) -> Answer {
    s.engine.stop(&id).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn remove(_: Authorized, s: web::Data<State>, id: web::Path<String>) -> Answer {
    s.engine.remove(&id).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn exec(
    _: Authorized,
    s: web::Data<State>,
    id: web::Path<String>,
    body: web::Json<ExecBody>,
) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.exec(&id, &body).await?))
}

async fn ask(
    _: Authorized,
    s: web::Data<State>,
    id: web::Path<String>,
    body: web::Json<AskBody>,
) -> Answer {
    Ok(HttpResponse::Ok().json(s.engine.ask(&id, &body).await?))
}

async fn kill(_: Authorized, s: web::Data<State>, path: web::Path<(String, String)>) -> Answer {
    let (id, run) = path.into_inner();
    s.engine.kill(&id, &run).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn desktop_enter(
    _: Authorized,
    s: web::Data<State>,
    path: web::Path<(String, String)>,
    body: web::Json<DesktopEnter>,
) -> Answer {
    let (id, desktop) = path.into_inner();
    s.engine.desktop_enter(&id, &desktop, &body).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn desktop_usage(
    _: Authorized,
    s: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    let (id, desktop) = path.into_inner();
    Ok(HttpResponse::Ok().json(s.engine.desktop_usage(&id, &desktop).await?))
}

async fn desktop_remove(
    _: Authorized,
    s: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    let (id, desktop) = path.into_inner();
    s.engine.desktop_remove(&id, &desktop).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn desktop_freeze(
    _: Authorized,
    s: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    let (id, desktop) = path.into_inner();
    s.engine.desktop_freeze(&id, &desktop, true).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Thaws every desktop of the computer (a new API process takes over a computer whose
/// desktops an earlier one may have left frozen).
async fn thaw_desktops(_: Authorized, s: web::Data<State>, id: web::Path<String>) -> Answer {
    s.engine.thaw_desktops(&id).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn desktop_thaw(
    _: Authorized,
    s: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    let (id, desktop) = path.into_inner();
    s.engine.desktop_freeze(&id, &desktop, false).await?;
    Ok(HttpResponse::NoContent().finish())
}
