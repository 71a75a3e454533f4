//! Internal RPC for Rakazo's own processes: `POST /internal/screen-authority`, the screen
//! authority answered over HTTP for a screen proxy that runs outside the API process, and
//! `POST /internal/control-session`, where such a proxy reports the control sessions it relays.
//!
//! The proxy opens the sealed capability itself and sends its fields (an
//! [`AuthorityRequest`]); the answer is the same as the in-process authority's: 200 with an
//! [`AuthorityResponse`] (upstream, socket token, policy), or a non-OK status with an
//! [`AuthorityRejection`] naming the cause. Only the internal credential may ask
//! (`RAKAZO_INTERNAL_TOKEN`, or the one generated in `DATA_DIR/internal-token`), never an API
//! token of any scope: the answer holds the secrets a browser must never see. The credential
//! is checked before the body is read.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use rakazo_web_proxy::authority::AuthorityRejection;
use rakazo_web_proxy::capability::now_ms;
use rakazo_web_proxy::{
    AuthorityError, AuthorityRequest, AuthorityResponse, RejectCause, SessionNotes, SessionReport,
};

use crate::app::App;

/// Largest request body (the capability fields).
const MAX_BODY: usize = 4096;

fn rejection(status: StatusCode, reason: RejectCause) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header(("cache-control", "no-store"))
        .json(AuthorityRejection { reason })
}

/// Whether the request carries the internal credential (compared in constant time).
pub(crate) fn internal_caller(app: &App, req: &HttpRequest) -> bool {
    use subtle::ConstantTimeEq;
    super::bearer(req).is_some_and(|token| {
        token
            .as_bytes()
            .ct_eq(app.internal_token.0.as_bytes())
            .into()
    })
}

/// `POST /internal/screen-authority`.
pub async fn screen_authority(
    app: web::Data<App>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    if !internal_caller(&app, &req) {
        tracing::warn!(event = "screen.authority.unauthorized");
        return rejection(StatusCode::UNAUTHORIZED, RejectCause::ApiError);
    }
    let Ok(body) = super::read_body(payload, MAX_BODY).await else {
        return rejection(StatusCode::PAYLOAD_TOO_LARGE, RejectCause::ApiError);
    };
    let Ok(request) = serde_json::from_slice::<AuthorityRequest>(&body) else {
        return rejection(StatusCode::BAD_REQUEST, RejectCause::ApiError);
    };
    if request.expires_at_ms <= now_ms() {
        return rejection(StatusCode::FORBIDDEN, RejectCause::Expired);
    }
    let capability = request.capability();
    match app.authority.resolve(&capability, request.channel).await {
        Ok(target) => HttpResponse::Ok()
            .insert_header(("cache-control", "no-store"))
            .json(AuthorityResponse {
                upstream: target.upstream().to_owned(),
                socket_token: target.socket_token().to_owned(),
                policy: target.policy(),
            }),
        Err(AuthorityError::Rejected(cause)) => {
            let status = match cause {
                RejectCause::NotFound => StatusCode::NOT_FOUND,
                _ => StatusCode::FORBIDDEN,
            };
            rejection(status, cause)
        }
        Err(AuthorityError::Unavailable(_) | AuthorityError::InvalidResponse(_)) => {
            rejection(StatusCode::SERVICE_UNAVAILABLE, RejectCause::ApiError)
        }
    }
}

/// `POST /internal/control-session`: a control session's start or end, as a proxy in its own
/// process saw it ([`SessionReport`]); it goes to the timeline (and the recorder) like the
/// sessions of the API's own proxy. 204 when taken.
pub async fn control_session(
    app: web::Data<App>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    if !internal_caller(&app, &req) {
        tracing::warn!(event = "screen.sessions.unauthorized");
        return rejection(StatusCode::UNAUTHORIZED, RejectCause::ApiError);
    }
    let Ok(body) = super::read_body(payload, MAX_BODY).await else {
        return rejection(StatusCode::PAYLOAD_TOO_LARGE, RejectCause::ApiError);
    };
    let Ok(report) = serde_json::from_slice::<SessionReport>(&body) else {
        return rejection(StatusCode::BAD_REQUEST, RejectCause::ApiError);
    };
    match report {
        SessionReport::Started { session } => app.session_notes.control_session_started(session),
        SessionReport::Ended { session } => app.session_notes.control_session_ended(session),
    }
    HttpResponse::NoContent().finish()
}
