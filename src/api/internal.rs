//! Internal RPC for Rakazo's own processes: `POST /internal/screen-authority`, the screen
//! authority answered over HTTP for a screen proxy that runs outside the API process.
//!
//! The proxy opens the sealed capability itself and sends its fields (an
//! [`AuthorityRequest`]); the answer is the same as the in-process authority's: 200 with an
//! [`AuthorityResponse`] (upstream, socket token, policy), or a non-OK status with an
//! [`AuthorityRejection`] naming the cause. Only an operator token may ask: the answer holds
//! the secrets a browser must never see.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use rakazo_web_proxy::authority::AuthorityRejection;
use rakazo_web_proxy::capability::now_ms;
use rakazo_web_proxy::{AuthorityError, AuthorityRequest, AuthorityResponse, RejectCause};

use crate::app::App;

/// Largest request body (the capability fields).
const MAX_BODY: usize = 4096;

fn rejection(status: StatusCode, reason: RejectCause) -> HttpResponse {
    HttpResponse::build(status)
        .insert_header(("cache-control", "no-store"))
        .json(AuthorityRejection { reason })
}

/// `POST /internal/screen-authority`.
pub async fn screen_authority(
    app: web::Data<App>,
    req: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let operator = super::caller(&app, &req).await.is_ok_and(|c| c.is_operator);
    if !operator {
        tracing::warn!(event = "screen.authority.unauthorized");
        return rejection(StatusCode::UNAUTHORIZED, RejectCause::ApiError);
    }
    if body.len() > MAX_BODY {
        return rejection(StatusCode::PAYLOAD_TOO_LARGE, RejectCause::ApiError);
    }
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
