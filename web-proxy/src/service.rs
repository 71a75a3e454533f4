//! The actix-web service: `/screen/{capability}/{tail}` for pages, static files and websockets.
//!
//! Every request: open the capability, check the tail, ask the [`Authority`] for the current
//! target, then either proxy an HTTP GET (rewriting HTML with the reporter) or relay a websocket
//! ([`crate::relay`]). Refusals become responses in one place (`Refusal::response`): a fixed
//! human page, or JSON for callers that accept it, with the machine reason in headers. Logs
//! carry only the connection id, policy, reasons, statuses and durations.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, web};
use rand::RngCore as _;

use crate::authority::{
    Authority, AuthorityError, Channel, DEFAULT_AUTHORITY_TIMEOUT, request_failure,
};
use crate::capability::{Keyring, OpenError, Policy, now_ms};
use crate::gateway::{GatewayActor, SocketKind};
use crate::page::{SCREEN_FAILURE_MESSAGE, inject_reporter, refusal_page};

/// Header carrying the machine-readable refusal reason (`invalid_path`, ...).
pub const REASON_HEADER: &str = "x-rakazo-screen-reason";
/// Header carrying the refusal detail (`tampered`, `stale_generation`, ...).
pub const DETAIL_HEADER: &str = "x-rakazo-screen-detail";
/// The tail of the terminal websocket under a control capability.
pub const TERMINAL_TAIL: &str = "terminal";
/// `Cache-Control` of every response under `/screen/`.
pub const CACHE_CONTROL: &str = "private, no-store, no-transform";

/// Limits and timeouts of the proxy. Defaults are the `DEFAULT_*` constants.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Longest wait for the authority.
    pub authority_timeout: Duration,
    /// Longest wait for an upstream HTTP answer or websocket handshake.
    pub upstream_timeout: Duration,
    /// Largest upstream HTTP body relayed (noVNC's largest file is far below).
    pub max_body_bytes: usize,
    /// Largest websocket message accepted from a browser.
    pub max_client_message_bytes: usize,
    /// Largest websocket message accepted from the screen gateway.
    pub max_upstream_message_bytes: usize,
    /// Read buffer of each upstream websocket (allocated up front: the main cost of an idle
    /// socket).
    pub upstream_read_buffer_bytes: usize,
}

/// Default [`ProxyConfig::upstream_timeout`].
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ProxyConfig::max_body_bytes`].
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Default [`ProxyConfig::max_client_message_bytes`].
pub const DEFAULT_MAX_CLIENT_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Default [`ProxyConfig::max_upstream_message_bytes`].
pub const DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Default [`ProxyConfig::upstream_read_buffer_bytes`].
pub const DEFAULT_UPSTREAM_READ_BUFFER_BYTES: usize = 16 * 1024;

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            authority_timeout: DEFAULT_AUTHORITY_TIMEOUT,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_client_message_bytes: DEFAULT_MAX_CLIENT_MESSAGE_BYTES,
            max_upstream_message_bytes: DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES,
            upstream_read_buffer_bytes: DEFAULT_UPSTREAM_READ_BUFFER_BYTES,
        }
    }
}

/// Everything the proxy needs; cheap to clone.
#[derive(Clone)]
pub struct ProxyState {
    pub(crate) inner: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) keyring: Arc<Keyring>,
    pub(crate) authority: Arc<dyn Authority>,
    pub(crate) gateway: Addr<GatewayActor>,
    pub(crate) http: reqwest::Client,
    pub(crate) config: ProxyConfig,
}

impl fmt::Debug for ProxyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyState")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl ProxyState {
    /// The proxy state: the keyring that opens capabilities, the authority asked on every
    /// request, the gateway registry of live sockets, and limits.
    pub fn new(
        keyring: Arc<Keyring>,
        authority: Arc<dyn Authority>,
        gateway: Addr<GatewayActor>,
        config: ProxyConfig,
    ) -> Result<ProxyState, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(config.upstream_timeout)
            .connect_timeout(config.upstream_timeout)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(ProxyState {
            inner: Arc::new(Shared {
                keyring,
                authority,
                gateway,
                http,
                config,
            }),
        })
    }

    /// The gateway registry this proxy registers sockets with.
    pub fn gateway(&self) -> &Addr<GatewayActor> {
        &self.inner.gateway
    }
}

/// Mounts `/screen/{capability}/{tail:.*}` (and a redirect from `/screen/{capability}`).
pub fn configure(cfg: &mut web::ServiceConfig, state: ProxyState) {
    cfg.service(
        web::scope("/screen")
            .app_data(web::Data::new(state))
            .route("/{capability}", web::get().to(add_slash))
            .route("/{capability}/{tail:.*}", web::get().to(handle)),
    );
}

/// A random id that ties the events of one request or websocket together.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionId(u64);

impl ConnectionId {
    fn random() -> ConnectionId {
        ConnectionId(rand::rng().next_u64())
    }
}

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The machine-readable reason of a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// Not a session path (bad capability or path); the authority was not contacted.
    InvalidPath,
    /// The authority answered non-OK (expired, revoked, stale, API error).
    AuthorityRejected,
    /// The authority answered OK with an unusable body.
    InvalidAuthorityResponse,
    /// The authority could not be reached in time.
    AuthorityUnavailable,
    /// The target was fine but the computer's screen gateway failed.
    UpstreamFailed,
}

impl RefusalReason {
    /// Stable name (header, JSON, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::InvalidPath => "invalid_path",
            RefusalReason::AuthorityRejected => "authority_rejected",
            RefusalReason::InvalidAuthorityResponse => "invalid_authority_response",
            RefusalReason::AuthorityUnavailable => "authority_unavailable",
            RefusalReason::UpstreamFailed => "upstream_failed",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            RefusalReason::InvalidPath => StatusCode::NOT_FOUND,
            RefusalReason::AuthorityRejected => StatusCode::FORBIDDEN,
            RefusalReason::InvalidAuthorityResponse | RefusalReason::UpstreamFailed => {
                StatusCode::BAD_GATEWAY
            }
            RefusalReason::AuthorityUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// A refusal: reason plus a stable detail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why, by class.
    pub reason: RefusalReason,
    /// Why, precisely (`tampered`, `expired`, `stale_generation`, `timeout`, ...).
    pub detail: &'static str,
}

impl Refusal {
    pub(crate) fn new(reason: RefusalReason, detail: &'static str) -> Refusal {
        Refusal { reason, detail }
    }

    /// The response: JSON for callers that accept it, else the fixed page.
    pub(crate) fn response(self, wants_json: bool) -> HttpResponse {
        let mut builder = HttpResponse::build(self.reason.status());
        common_headers(&mut builder);
        builder.insert_header((REASON_HEADER, self.reason.as_str()));
        builder.insert_header((DETAIL_HEADER, self.detail));
        if wants_json {
            builder.json(serde_json::json!({
                "error": {
                    "reason": self.reason.as_str(),
                    "detail": self.detail,
                    "message": SCREEN_FAILURE_MESSAGE,
                }
            }))
        } else {
            builder
                .content_type("text/html; charset=utf-8")
                .body(refusal_page())
        }
    }
}

impl From<OpenError> for Refusal {
    fn from(e: OpenError) -> Self {
        let reason = match e {
            // Authentic but out of date: what the API itself would have said.
            OpenError::Expired => RefusalReason::AuthorityRejected,
            OpenError::Malformed | OpenError::UnknownKey | OpenError::Tampered => {
                RefusalReason::InvalidPath
            }
        };
        Refusal::new(reason, e.as_str())
    }
}

impl From<&AuthorityError> for Refusal {
    fn from(e: &AuthorityError) -> Self {
        match e {
            AuthorityError::Rejected(cause) => {
                Refusal::new(RefusalReason::AuthorityRejected, cause.as_str())
            }
            AuthorityError::InvalidResponse(d) => {
                Refusal::new(RefusalReason::InvalidAuthorityResponse, d)
            }
            AuthorityError::Unavailable(d) => Refusal::new(RefusalReason::AuthorityUnavailable, d),
        }
    }
}

/// Headers every response under `/screen/` carries.
pub(crate) fn common_headers(builder: &mut HttpResponseBuilder) {
    builder.insert_header((header::CACHE_CONTROL, CACHE_CONTROL));
    builder.insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"));
    builder.insert_header((header::REFERRER_POLICY, "no-referrer"));
}

/// Logs `screen.proxy.target_rejected` and builds the refusal response.
pub(crate) fn reject(
    conn: ConnectionId,
    policy: Option<Policy>,
    refusal: Refusal,
    wants_json: bool,
) -> HttpResponse {
    tracing::event!(
        name: "screen.proxy.target_rejected",
        tracing::Level::WARN,
        screen.connection_id = %conn,
        policy = policy.map_or("unknown", Policy::as_str),
        reason = refusal.reason.as_str(),
        detail = refusal.detail,
        "screen.proxy.target_rejected"
    );
    refusal.response(wants_json)
}

fn wants_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"))
}

fn is_websocket(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The upstream path under the gateway, or `None` when it is not a plain relative file path.
/// An empty tail is the viewer page.
fn clean_tail(tail: &str) -> Option<&str> {
    if tail.is_empty() {
        return Some("vnc.html");
    }
    let plain = tail
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~' | b'/'));
    let last = tail.split('/').count() - 1;
    let segments_ok = tail
        .split('/')
        .enumerate()
        .all(|(i, s)| !matches!(s, "." | "..") && (!s.is_empty() || (i == last && i > 0)));
    (plain && segments_ok && tail.len() <= 512).then_some(tail)
}

async fn add_slash(req: HttpRequest) -> HttpResponse {
    // Relative to `/screen/<capability>`, the last segment names the directory.
    let last = req.path().rsplit('/').next().unwrap_or_default();
    let mut builder = HttpResponse::PermanentRedirect();
    common_headers(&mut builder);
    builder
        .insert_header((header::LOCATION, format!("{last}/")))
        .finish()
}

async fn handle(
    req: HttpRequest,
    body: web::Payload,
    path: web::Path<(String, String)>,
    state: web::Data<ProxyState>,
) -> HttpResponse {
    let conn = ConnectionId::random();
    let json = wants_json(&req);
    let (token, tail) = path.into_inner();
    let shared = &state.inner;
    let capability = match shared.keyring.open(&token, now_ms()) {
        Ok(c) => c,
        Err(e) => return reject(conn, None, e.into(), json),
    };
    let websocket = is_websocket(&req);
    let tail = clean_tail(&tail);
    let channel = match tail {
        Some("websockify") if websocket => Some(Channel::Screen),
        Some(TERMINAL_TAIL) if websocket && capability.policy == Policy::Control => {
            Some(Channel::Terminal)
        }
        Some(TERMINAL_TAIL) => None,
        Some(_) if !websocket => Some(Channel::Screen),
        _ => None,
    };
    let (Some(channel), Some(tail)) = (channel, tail) else {
        return reject(
            conn,
            Some(capability.policy),
            Refusal::new(RefusalReason::InvalidPath, "bad_path"),
            json,
        );
    };
    let authority = &shared.authority;
    let asked = tokio::time::timeout(shared.config.authority_timeout, async {
        match channel {
            Channel::Screen => authority.target(&capability).await,
            Channel::Terminal => authority.terminal_target(&capability).await,
        }
    })
    .await;
    let target = match asked {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return reject(conn, Some(capability.policy), (&e).into(), json),
        Err(_) => {
            return reject(
                conn,
                Some(capability.policy),
                Refusal::new(RefusalReason::AuthorityUnavailable, "timeout"),
                json,
            );
        }
    };
    let policy = capability.policy.weakest(target.policy());
    if websocket {
        let kind = match channel {
            Channel::Screen => SocketKind::Screen,
            Channel::Terminal => SocketKind::Terminal,
        };
        crate::relay::start(
            &req, body, &state, capability, target, policy, kind, conn, json,
        )
        .await
    } else {
        proxy_http(shared, &target, tail, policy, conn, json).await
    }
}

async fn proxy_http(
    shared: &Shared,
    target: &crate::authority::Target,
    tail: &str,
    policy: Policy,
    conn: ConnectionId,
    json: bool,
) -> HttpResponse {
    let started = Instant::now();
    let failed = |stage: &'static str, error: &'static str| {
        tracing::event!(
            name: "screen.proxy.http_failed",
            tracing::Level::WARN,
            screen.connection_id = %conn,
            policy = policy.as_str(),
            stage,
            error,
            duration_ms = started.elapsed().as_millis() as u64,
            "screen.proxy.http_failed"
        );
        Refusal::new(RefusalReason::UpstreamFailed, error).response(json)
    };
    let sent = shared
        .http
        .get(target.http_url(tail))
        .header(reqwest::header::ACCEPT_ENCODING, "identity")
        .send()
        .await;
    let mut upstream = match sent {
        Ok(r) => r,
        Err(e) => return failed("request", request_failure(&e)),
    };
    let status = upstream.status().as_u16();
    let content_type = upstream
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::new();
    loop {
        match upstream.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > shared.config.max_body_bytes {
                    return failed("body", "too_large");
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return failed("body", request_failure(&e)),
        }
    }
    tracing::event!(
        name: "screen.proxy.http_upstream_response",
        tracing::Level::INFO,
        screen.connection_id = %conn,
        policy = policy.as_str(),
        status,
        bytes = body.len() as u64,
        duration_ms = started.elapsed().as_millis() as u64,
        "screen.proxy.http_upstream_response"
    );
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut builder = HttpResponse::build(status);
    common_headers(&mut builder);
    let is_html = content_type
        .as_deref()
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/html"));
    if let Some(value) = content_type
        .as_deref()
        .and_then(|t| HeaderValue::from_str(t).ok())
    {
        builder.insert_header((header::CONTENT_TYPE, value));
    }
    if is_html {
        let html = String::from_utf8_lossy(&body);
        builder.body(inject_reporter(&html))
    } else {
        builder.body(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(clean_tail(""), Some("vnc.html"));
        assert_eq!(clean_tail("app/ui.js"), Some("app/ui.js"));
        assert_eq!(clean_tail("app/"), Some("app/"));
        for bad in [
            "../x",
            "a/../b",
            "./a",
            "/etc/passwd",
            "a//b",
            "a%2e",
            "a b",
            "a\\b",
        ] {
            assert_eq!(clean_tail(bad), None, "{bad}");
        }
    }

    #[test]
    fn reasons_of_open_errors() {
        let r: Refusal = OpenError::Tampered.into();
        assert_eq!(r.reason, RefusalReason::InvalidPath);
        let r: Refusal = OpenError::Expired.into();
        assert_eq!(r.reason, RefusalReason::AuthorityRejected);
        assert_eq!(r.detail, "expired");
    }
}
