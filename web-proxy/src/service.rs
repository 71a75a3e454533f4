//! The actix-web service: `/screen/{capability}/{tail}` for the viewer's files and websockets.
//!
//! Every request: open the capability, check the tail, ask the [`Authority`] for the current
//! target, then either serve a file of the packaged viewer ([`crate::viewer`]; never anything
//! from the computer) or relay a websocket ([`crate::relay`]). Every response carries the
//! sandboxing [`CSP`]. Refusals become responses in one place (`Refusal::response`): a fixed
//! human page, or JSON for callers that accept it, with the machine reason in headers. Logs
//! carry only the connection id, policy, reasons, statuses and durations.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, web};
use rand::RngCore as _;

use crate::authority::{
    Authority, AuthorityError, Channel, DEFAULT_AUTHORITY_TIMEOUT, FORWARDED_HEADER,
};
use crate::capability::{Keyring, OpenError, Policy, now_ms};
use crate::gateway::{GatewayActor, SocketKind};
use crate::page::{CSP, SCREEN_FAILURE_MESSAGE, refusal_page};
use crate::viewer::{DEFAULT_NOVNC_DIR, PAGE_PATH, Viewer, ViewerError, ViewerFile};

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
    /// Longest wait for an upstream websocket handshake.
    pub upstream_timeout: Duration,
    /// The directory of noVNC's files the proxy serves (Debian's `novnc` package).
    pub novnc_dir: PathBuf,
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
/// Default [`ProxyConfig::max_client_message_bytes`].
pub const DEFAULT_MAX_CLIENT_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Default [`ProxyConfig::max_upstream_message_bytes`]: the computer serves its gateway, and
/// every message it sends may wait in a socket's send queue (32 messages) while a viewer reads
/// slowly. Its servers send at most 64 KiB at once (websockify's reads, the terminal's frames).
pub const DEFAULT_MAX_UPSTREAM_MESSAGE_BYTES: usize = 1024 * 1024;
/// Default [`ProxyConfig::upstream_read_buffer_bytes`].
pub const DEFAULT_UPSTREAM_READ_BUFFER_BYTES: usize = 16 * 1024;

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            authority_timeout: DEFAULT_AUTHORITY_TIMEOUT,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            novnc_dir: PathBuf::from(DEFAULT_NOVNC_DIR),
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
    pub(crate) viewer: Result<Viewer, ViewerError>,
    pub(crate) config: ProxyConfig,
    /// Where control sessions are noted when they end (set once by the composition root).
    pub(crate) notes: std::sync::OnceLock<Arc<dyn crate::sessions::SessionNotes>>,
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
    /// request, the gateway registry of live sockets, and limits. Reads the viewer's files from
    /// `config.novnc_dir`; without them the proxy still runs, refuses pages with
    /// `viewer_missing`, and [`ProxyState::viewer_error`] says what to install.
    pub fn new(
        keyring: Arc<Keyring>,
        authority: Arc<dyn Authority>,
        gateway: Addr<GatewayActor>,
        config: ProxyConfig,
    ) -> ProxyState {
        let viewer = Viewer::load(&config.novnc_dir);
        match &viewer {
            Ok(v) => tracing::event!(
                name: "screen.proxy.viewer_loaded",
                tracing::Level::INFO,
                files = v.len() as u64,
                "screen.proxy.viewer_loaded"
            ),
            Err(e) => tracing::event!(
                name: "screen.proxy.viewer_missing",
                tracing::Level::ERROR,
                error = e.as_str(),
                message = %e,
                "screen.proxy.viewer_missing"
            ),
        }
        ProxyState {
            inner: Arc::new(Shared {
                keyring,
                authority,
                gateway,
                viewer,
                config,
                notes: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Note every control session in `notes` when its socket closes; answers false when
    /// notes were already set.
    pub fn set_session_notes(&self, notes: Arc<dyn crate::sessions::SessionNotes>) -> bool {
        self.inner.notes.set(notes).is_ok()
    }

    /// Why the viewer's files could not be loaded, if they could not (screens then show the
    /// refusal page).
    pub fn viewer_error(&self) -> Option<&ViewerError> {
        self.inner.viewer.as_ref().err()
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
    /// The server has no viewer to serve (noVNC's files are not installed).
    ViewerMissing,
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
            RefusalReason::ViewerMissing => "viewer_missing",
        }
    }

    fn status(self) -> StatusCode {
        match self {
            RefusalReason::InvalidPath => StatusCode::NOT_FOUND,
            RefusalReason::AuthorityRejected => StatusCode::FORBIDDEN,
            RefusalReason::InvalidAuthorityResponse | RefusalReason::UpstreamFailed => {
                StatusCode::BAD_GATEWAY
            }
            RefusalReason::AuthorityUnavailable | RefusalReason::ViewerMissing => {
                StatusCode::SERVICE_UNAVAILABLE
            }
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
    builder.insert_header((header::CONTENT_SECURITY_POLICY, CSP.as_str()));
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

/// Whether a websocket upgrade carries what the handshake needs (RFC 6455 4.2.1): a GET with
/// `Connection: upgrade`, version 13 and a key.
fn handshake_complete(req: &HttpRequest) -> bool {
    let has = |name: header::HeaderName, check: &dyn Fn(&str) -> bool| {
        req.headers()
            .get_all(name)
            .filter_map(|v| v.to_str().ok())
            .any(check)
    };
    req.method() == actix_web::http::Method::GET
        && has(header::CONNECTION, &|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
        && has(header::SEC_WEBSOCKET_VERSION, &|v| v.trim() == "13")
        && has(header::SEC_WEBSOCKET_KEY, &|v| !v.trim().is_empty())
}

/// The tail as a plain relative file path, or `None` when it is not one. An empty tail is the
/// viewer page.
fn clean_tail(tail: &str) -> Option<&str> {
    if tail.is_empty() {
        return Some(PAGE_PATH);
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
    // Relative to `/screen/<capability>`, the last segment names the directory. It comes from
    // whoever sent the link: only a capability's characters go back, and always as a path
    // (`./`), so no `/screen/https:elsewhere` sends a browser off this origin.
    let last = req.path().rsplit('/').next().unwrap_or_default();
    let plain = last
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~'));
    if last.is_empty() || !plain {
        let mut builder = HttpResponse::NotFound();
        common_headers(&mut builder);
        return builder.finish();
    }
    let mut builder = HttpResponse::PermanentRedirect();
    common_headers(&mut builder);
    builder
        .insert_header((header::LOCATION, format!("./{last}/")))
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
    let asked_policy = capability.policy;
    let refuse = |refusal: Refusal| reject(conn, Some(asked_policy), refusal, json);
    // A websocket is relayed to the computer; anything else is a file of our own viewer.
    let want = match tail {
        Some("websockify") if websocket => Want::Socket(Channel::Screen),
        Some(TERMINAL_TAIL) if websocket && capability.policy == Policy::Control => {
            Want::Socket(Channel::Terminal)
        }
        Some(tail) if !websocket => match &shared.viewer {
            Err(e) => return refuse(Refusal::new(RefusalReason::ViewerMissing, e.as_str())),
            Ok(viewer) => match viewer.get(tail) {
                Some(file) => Want::File(tail, file),
                None => {
                    return refuse(Refusal::new(RefusalReason::InvalidPath, "unknown_file"));
                }
            },
        },
        _ => return refuse(Refusal::new(RefusalReason::InvalidPath, "bad_path")),
    };
    let channel = match want {
        // A malformed upgrade is refused before the API is asked (`invalid_path` means the
        // API was not contacted).
        Want::Socket(_) if !handshake_complete(&req) => {
            return refuse(Refusal::new(RefusalReason::InvalidPath, "bad_upgrade"));
        }
        Want::Socket(channel) => channel,
        Want::File(..) => Channel::Screen,
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
        // A socket another proxy relayed here is never relayed on to a third.
        Ok(Ok(t)) if t.is_proxy() && req.headers().contains_key(FORWARDED_HEADER) => {
            return refuse(Refusal::new(RefusalReason::UpstreamFailed, "second_hop"));
        }
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return refuse((&e).into()),
        Err(_) => return refuse(Refusal::new(RefusalReason::AuthorityUnavailable, "timeout")),
    };
    let policy = capability.policy.weakest(target.policy());
    match want {
        Want::Socket(channel) => {
            let kind = match channel {
                Channel::Screen => SocketKind::Screen,
                Channel::Terminal => SocketKind::Terminal,
            };
            crate::relay::start(
                &req, body, &state, capability, target, policy, kind, conn, json,
            )
            .await
        }
        Want::File(path, file) => serve_file(path, file, policy, conn),
    }
}

/// What a request under a capability asks for.
enum Want<'a> {
    /// A websocket relayed to the computer.
    Socket(Channel),
    /// A file of the packaged viewer.
    File(&'a str, &'a ViewerFile),
}

/// A file of the viewer. Module scripts and `fetch` from the sandbox's opaque origin are
/// cross-origin requests, so files allow any origin to read them (they are noVNC's public
/// files; the capability was checked before).
fn serve_file(path: &str, file: &ViewerFile, policy: Policy, conn: ConnectionId) -> HttpResponse {
    tracing::event!(
        name: "screen.proxy.file_served",
        tracing::Level::DEBUG,
        screen.connection_id = %conn,
        policy = policy.as_str(),
        file = path,
        bytes = file.body.len() as u64,
        "screen.proxy.file_served"
    );
    let mut builder = HttpResponse::Ok();
    common_headers(&mut builder);
    builder
        .insert_header((header::CONTENT_TYPE, file.content_type))
        .insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"))
        .body(file.body.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(clean_tail(""), Some(PAGE_PATH));
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
