//! Internal RPC for Rakazo's own processes: `POST /internal/screen-authority`, the screen
//! authority answered over HTTP for a screen proxy that runs outside the API process (or for
//! another API process, about a computer this one holds), `POST /internal/screen-url`, where
//! another API process has this one issue a URL to a screen it holds, and
//! `POST /internal/control-session`, where such a proxy reports the control sessions it relays,
//! and `POST /internal/screen-standing`, where it asks whether they are still granted.
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
use rakazo_web_proxy::standing::MAX_SCOPES;
use rakazo_web_proxy::{
    AuthorityError, AuthorityRequest, AuthorityResponse, RejectCause, SessionNotes, SessionReport,
    SocketKind, SocketScope, StandingRequest, StandingResponse,
};

use crate::app::App;
use crate::screens::{HOP_HEADER, Hop, IssueAnswer, IssueRequest};
use rakazo_actors::computers::Computers;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use rakazo_web_proxy::Channel;

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

/// Whether another API process passed the request on (then it is answered from what this
/// process holds, never passed on again).
fn forwarded_hop(req: &HttpRequest) -> Hop {
    if req.headers().contains_key(HOP_HEADER) {
        Hop::Forwarded
    } else {
        Hop::First
    }
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
    let hop = forwarded_hop(&req);
    match app
        .authority
        .resolve(&capability, request.channel, hop)
        .await
    {
        // A socket relayed through the holder's proxy is not a gateway this answer can name.
        Ok(target) if target.is_proxy() => {
            rejection(StatusCode::SERVICE_UNAVAILABLE, RejectCause::ApiError)
        }
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

/// Largest `/internal/screen-standing` body: [`MAX_SCOPES`] capabilities' fields.
const MAX_STANDING_BODY: usize = MAX_SCOPES * 512;

/// `POST /internal/screen-standing`: where each socket a proxy in its own process relays
/// stands now ([`StandingRequest`] in, [`StandingResponse`] out, in order), from the lease and
/// screen tables as this process's own sweep reads them.
pub async fn screen_standing(
    app: web::Data<App>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    if !internal_caller(&app, &req) {
        tracing::warn!(event = "screen.standing.unauthorized");
        return rejection(StatusCode::UNAUTHORIZED, RejectCause::ApiError);
    }
    let Ok(body) = super::read_body(payload, MAX_STANDING_BODY).await else {
        return rejection(StatusCode::PAYLOAD_TOO_LARGE, RejectCause::ApiError);
    };
    let Ok(request) = serde_json::from_slice::<StandingRequest>(&body) else {
        return rejection(StatusCode::BAD_REQUEST, RejectCause::ApiError);
    };
    if request.scopes.len() > MAX_SCOPES {
        return rejection(StatusCode::PAYLOAD_TOO_LARGE, RejectCause::ApiError);
    }
    let mut standing = Vec::with_capacity(request.scopes.len());
    for scope in &request.scopes {
        let scope = SocketScope::of(&scope.capability(), SocketKind::Screen);
        standing.push(crate::screens::standing(&app.db, &scope).await);
    }
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(StandingResponse { standing })
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

/// `POST /internal/screen-url`: a screen or terminal URL of a computer this process holds,
/// asked by the API process a person is connected to ([`IssueRequest`]: that process has
/// already run the method's checks and taken the lease). Answered from what this process
/// holds, never passed on again; 200 with an [`IssueAnswer`] either way.
pub async fn screen_url(
    app: web::Data<App>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    if !internal_caller(&app, &req) {
        tracing::warn!(event = "screen.issue.unauthorized");
        return HttpResponse::Unauthorized().finish();
    }
    let Ok(body) = super::read_body(payload, MAX_BODY).await else {
        return HttpResponse::PayloadTooLarge().finish();
    };
    let Ok(request) = serde_json::from_slice::<IssueRequest>(&body) else {
        return HttpResponse::BadRequest().finish();
    };
    let answer = match issue_here(&app, request).await {
        Ok(url) => IssueAnswer::Ok(url),
        Err(e) => IssueAnswer::Err {
            code: e.code,
            message: e.message,
        },
    };
    HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .json(answer)
}

async fn issue_here(app: &App, r: IssueRequest) -> DomainResult<serde_json::Value> {
    let c = Computers::new(app.db.clone()).get(&r.computer_id).await?;
    let (screens, registry) = (&app.screens, &app.registry);
    let url = match r.channel {
        Channel::Screen => {
            serde_json::to_value(screens.issue_from(registry, &c, &r, Hop::Forwarded).await?)
        }
        Channel::Terminal => serde_json::to_value(
            screens
                .terminal_from(registry, &c, &r, Hop::Forwarded)
                .await?,
        ),
    };
    url.map_err(|_| DomainError::new(ErrorCode::Internal, "could not encode a screen URL"))
}
