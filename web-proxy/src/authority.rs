//! The authority port: who tells the proxy, on every request, where a capability's screen is now.
//!
//! The proxy opens a capability itself (it holds the [`Keyring`](crate::capability::Keyring)),
//! but only the API knows whether its slot generation and control lease are still current and
//! which screen gateway serves the slot. The server implements [`Authority`] in process; a
//! proxy running as its own process uses [`HttpAuthority`] over internal RPC.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::capability::{Capability, Policy};
use crate::gateway::SocketScope;
use crate::standing::{STANDING_RPC_PATH, Standing, StandingRequest};

/// Longest socket token accepted from an authority, in characters.
pub const MAX_SOCKET_TOKEN_CHARS: usize = 128;
/// Default time the proxy waits for an authority answer.
pub const DEFAULT_AUTHORITY_TIMEOUT: Duration = Duration::from_secs(5);
/// The internal RPC path that [`HttpAuthority`] calls under the API base URL.
pub const AUTHORITY_RPC_PATH: &str = "internal/screen-authority";
/// Header of an authority request one API process forwards to another: the receiver answers
/// from what it holds itself and never forwards it again.
pub const FORWARDED_HEADER: &str = "x-rakazo-forwarded";

/// Where the proxy sends a capability's traffic. Never logged, never shown to a browser.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    upstream: Url,
    socket_token: String,
    policy: Policy,
    /// The websocket of another proxy instead of a gateway: its full URL, a capability in it.
    through: Option<Url>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("upstream", &"<redacted>")
            .field("socket_token", &"<redacted>")
            .field("policy", &self.policy)
            .finish()
    }
}

/// Why a target given by an authority is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The upstream is not `http://host:port[/prefix]` without credentials, query or fragment.
    #[error("upstream is not a plain http base URL")]
    BadUpstream,
    /// The socket token is empty, too long, or not `[A-Za-z0-9_-]`.
    #[error("socket token is not a plain token")]
    BadToken,
}

impl Target {
    /// Validates an upstream base URL (`http://host:port`, optionally with a path prefix), a
    /// socket token (the name of the x11vnc unix socket in websockify's token directory) and
    /// the policy the upstream enforces.
    pub fn new(upstream: &str, socket_token: &str, policy: Policy) -> Result<Target, TargetError> {
        let mut url = Url::parse(upstream).map_err(|_| TargetError::BadUpstream)?;
        if url.scheme() != "http"
            || url.host_str().is_none_or(str::is_empty)
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(TargetError::BadUpstream);
        }
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        if socket_token.is_empty()
            || socket_token.len() > MAX_SOCKET_TOKEN_CHARS
            || !socket_token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(TargetError::BadToken);
        }
        Ok(Target {
            upstream: url,
            socket_token: socket_token.to_string(),
            policy,
            through: None,
        })
    }

    /// The same socket relayed through the proxy of another API process (`proxy`, the base
    /// URL `http://host:port` it serves `/screen/` under), which runs every check on
    /// `capability` again and relays it to its own gateway: for a computer held by a process
    /// whose gateways are not reachable from here. The request carries
    /// [`FORWARDED_HEADER`], so that proxy never relays it a second time.
    pub fn through_proxy(
        proxy: &str,
        capability: &str,
        channel: Channel,
        policy: Policy,
    ) -> Result<Target, TargetError> {
        let base = Target::new(proxy, "proxy", policy)?;
        if capability.is_empty()
            || !capability
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(TargetError::BadToken);
        }
        let tail = match channel {
            Channel::Screen => "websockify",
            Channel::Terminal => crate::service::TERMINAL_TAIL,
        };
        let mut url = base.http_url(&format!("screen/{capability}/{tail}"));
        let _ = url.set_scheme("ws");
        Ok(Target {
            through: Some(url),
            ..base
        })
    }

    /// Whether this target is another proxy ([`Target::through_proxy`]).
    pub fn is_proxy(&self) -> bool {
        self.through.is_some()
    }

    /// The policy the upstream serves (x11vnc `-viewonly` or not).
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The upstream base URL (secret: for an authority answering over internal RPC only).
    pub fn upstream(&self) -> &str {
        self.upstream.as_str()
    }

    /// The socket token (secret: for an authority answering over internal RPC only).
    pub fn socket_token(&self) -> &str {
        &self.socket_token
    }

    /// The URL of `tail` under the gateway (split on `/`, each segment percent-encoded).
    fn http_url(&self, tail: &str) -> Url {
        let mut url = self.upstream.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
            segments.extend(tail.split('/'));
        }
        url
    }

    /// The websockify URL for this socket: `ws://host:port[/prefix]/websockify?token=...`.
    pub(crate) fn websocket_url(&self) -> String {
        if let Some(url) = &self.through {
            return url.to_string();
        }
        let mut url = self.http_url("websockify");
        url.query_pairs_mut()
            .append_pair("token", &self.socket_token);
        // http -> ws keeps everything else; Url::set_scheme refuses special-to-special changes
        // only between special and non-special schemes, and both are special.
        let _ = url.set_scheme("ws");
        url.to_string()
    }
}

/// Why the API refused a capability (the detail of an `authority_rejected` refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectCause {
    /// The capability (or the session behind it) expired.
    Expired,
    /// Explicitly revoked.
    Revoked,
    /// The slot was torn down or reused: the capability's generation is not current.
    StaleGeneration,
    /// The control lease behind a control capability ended or moved to another fence.
    LeaseEnded,
    /// The computer, bot or screen no longer exists, or the computer is not running.
    NotFound,
    /// The API failed or answered with something else.
    ApiError,
}

impl RejectCause {
    /// The stable name used as refusal detail.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectCause::Expired => "expired",
            RejectCause::Revoked => "revoked",
            RejectCause::StaleGeneration => "stale_generation",
            RejectCause::LeaseEnded => "lease_ended",
            RejectCause::NotFound => "not_found",
            RejectCause::ApiError => "api_error",
        }
    }
}

/// Why the proxy has no target; each variant is one `screen.proxy.target_rejected` reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// A non-OK answer: `authority_rejected`.
    #[error("authority rejected the capability: {}", .0.as_str())]
    Rejected(RejectCause),
    /// An OK answer with an unusable body: `invalid_authority_response`.
    #[error("invalid authority response: {0}")]
    InvalidResponse(&'static str),
    /// No answer (connect, request or timeout failure): `authority_unavailable`.
    #[error("authority unavailable: {0}")]
    Unavailable(&'static str),
}

impl From<TargetError> for AuthorityError {
    fn from(e: TargetError) -> Self {
        match e {
            TargetError::BadUpstream => AuthorityError::InvalidResponse("bad_upstream"),
            TargetError::BadToken => AuthorityError::InvalidResponse("bad_socket_token"),
        }
    }
}

/// Asked on every proxied request (page, static file, websocket) for the capability's current
/// target. Implementations must check that the slot generation is current, that a control
/// capability's lease fence is the live control lease, and that the computer is running.
#[async_trait]
pub trait Authority: Send + Sync + 'static {
    /// The current target of an opened (authentic, unexpired) capability.
    async fn target(&self, capability: &Capability) -> Result<Target, AuthorityError>;

    /// The current terminal server of a control capability (the same checks, then the
    /// terminal route bound to that control). Authorities without terminals reject.
    async fn terminal_target(&self, _capability: &Capability) -> Result<Target, AuthorityError> {
        Err(AuthorityError::Rejected(RejectCause::NotFound))
    }

    /// Where each of `scopes` stands now, in order, for a proxy whose process hears no
    /// revocation ([`crate::standing`]). `None`: this authority's process hears them itself.
    async fn standing(
        &self,
        _scopes: &[SocketScope],
    ) -> Option<Result<Vec<Standing>, AuthorityError>> {
        None
    }
}

/// What a proxied connection reaches under a capability.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// The screen (noVNC page, static files, the VNC websocket).
    #[default]
    Screen,
    /// The terminal websocket (control capabilities only).
    Terminal,
}

/// The JSON body of `POST {api}/internal/screen-authority`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthorityRequest {
    /// Computer id from the capability.
    pub computer_id: String,
    /// Bot id from the capability.
    pub bot_id: String,
    /// Screen slot.
    pub slot: u16,
    /// Slot generation at issue time.
    pub generation: u64,
    /// `view` or `control`.
    pub policy: Policy,
    /// Control lease fence (0 for view).
    pub fence: u64,
    /// Capability expiry, unix ms.
    pub expires_at_ms: u64,
    /// The screen or the terminal (absent means the screen).
    #[serde(default)]
    pub channel: Channel,
}

impl From<&Capability> for AuthorityRequest {
    fn from(c: &Capability) -> Self {
        AuthorityRequest {
            computer_id: c.computer_id.clone(),
            bot_id: c.bot_id.clone(),
            slot: c.slot,
            generation: c.generation,
            policy: c.policy,
            fence: c.fence,
            expires_at_ms: c.expires_at_ms,
            channel: Channel::Screen,
        }
    }
}

impl AuthorityRequest {
    /// The capability this request carries.
    pub fn capability(&self) -> Capability {
        Capability {
            computer_id: self.computer_id.clone(),
            bot_id: self.bot_id.clone(),
            slot: self.slot,
            generation: self.generation,
            policy: self.policy,
            fence: self.fence,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// The JSON body of a 200 answer: the current target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthorityResponse {
    /// `http://host:port` of the computer's screen gateway (websockify).
    pub upstream: String,
    /// The socket token (x11vnc unix socket name) for this capability.
    pub socket_token: String,
    /// The policy the upstream enforces.
    pub policy: Policy,
}

/// The JSON body of a non-OK answer (optional; any non-OK status is a rejection).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorityRejection {
    /// Why, as a [`RejectCause`] name.
    pub reason: RejectCause,
}

/// [`Authority`] over internal RPC: `POST {api}/internal/screen-authority` with a bearer token.
pub struct HttpAuthority {
    client: reqwest::Client,
    endpoint: Url,
    /// `{api}/internal/screen-standing`.
    standing: Url,
    bearer: String,
    /// Whether requests carry [`FORWARDED_HEADER`].
    forwarded: bool,
}

impl fmt::Debug for HttpAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpAuthority").finish_non_exhaustive()
    }
}

/// Why an [`HttpAuthority`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpAuthorityError {
    /// The API base is not an http(s) URL.
    #[error("API base URL is invalid")]
    BadBase,
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The endpoint `path` under the API's `api_base` (an http(s) URL), and a client for it that
/// bounds each call by `timeout` and follows no proxy and no redirect.
pub(crate) fn internal_endpoint(
    api_base: &str,
    path: &str,
    timeout: Duration,
) -> Result<(Url, reqwest::Client), HttpAuthorityError> {
    let mut base = Url::parse(api_base).map_err(|_| HttpAuthorityError::BadBase)?;
    if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
        return Err(HttpAuthorityError::BadBase);
    }
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    let endpoint = base.join(path).map_err(|_| HttpAuthorityError::BadBase)?;
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    Ok((endpoint, client))
}

impl HttpAuthority {
    /// An authority calling `{api_base}/internal/screen-authority` with `Authorization: Bearer
    /// {bearer}` and a total timeout per call.
    pub fn new(
        api_base: &str,
        bearer: impl Into<String>,
        timeout: Duration,
    ) -> Result<HttpAuthority, HttpAuthorityError> {
        let (endpoint, client) = internal_endpoint(api_base, AUTHORITY_RPC_PATH, timeout)?;
        let (standing, _) = internal_endpoint(api_base, STANDING_RPC_PATH, timeout)?;
        Ok(HttpAuthority {
            client,
            endpoint,
            standing,
            bearer: bearer.into(),
            forwarded: false,
        })
    }

    /// The same authority for an API process asking another one (the process holding the
    /// computer): its requests carry [`FORWARDED_HEADER`].
    pub fn forwarded(mut self) -> Self {
        self.forwarded = true;
        self
    }
}

/// Largest authority answer read, in bytes.
const MAX_AUTHORITY_BODY: usize = 16 * 1024;

#[async_trait]
impl Authority for HttpAuthority {
    async fn target(&self, capability: &Capability) -> Result<Target, AuthorityError> {
        self.ask(AuthorityRequest::from(capability)).await
    }

    async fn terminal_target(&self, capability: &Capability) -> Result<Target, AuthorityError> {
        let mut request = AuthorityRequest::from(capability);
        request.channel = Channel::Terminal;
        self.ask(request).await
    }

    async fn standing(
        &self,
        scopes: &[SocketScope],
    ) -> Option<Result<Vec<Standing>, AuthorityError>> {
        Some(self.ask_standing(scopes).await)
    }
}

impl HttpAuthority {
    async fn ask(&self, request: AuthorityRequest) -> Result<Target, AuthorityError> {
        let mut post = self
            .client
            .post(self.endpoint.clone())
            .bearer_auth(&self.bearer)
            .json(&request);
        if self.forwarded {
            post = post.header(FORWARDED_HEADER, "1");
        }
        let response = post
            .send()
            .await
            .map_err(|e| AuthorityError::Unavailable(request_failure(&e)))?;
        let status = response.status();
        let body = match body_within(response, MAX_AUTHORITY_BODY).await? {
            Some(body) => body,
            None if status.is_success() => {
                return Err(AuthorityError::InvalidResponse("body_too_large"));
            }
            None => Vec::new(),
        };
        if status != reqwest::StatusCode::OK {
            let cause = serde_json::from_slice::<AuthorityRejection>(&body)
                .map(|r| r.reason)
                .unwrap_or(match status.as_u16() {
                    404 | 410 => RejectCause::NotFound,
                    _ => RejectCause::ApiError,
                });
            return Err(AuthorityError::Rejected(cause));
        }
        let answer: AuthorityResponse = serde_json::from_slice(&body)
            .map_err(|_| AuthorityError::InvalidResponse("malformed_body"))?;
        Ok(Target::new(
            &answer.upstream,
            &answer.socket_token,
            answer.policy,
        )?)
    }
}

impl HttpAuthority {
    async fn ask_standing(&self, scopes: &[SocketScope]) -> Result<Vec<Standing>, AuthorityError> {
        let response = self
            .client
            .post(self.standing.clone())
            .bearer_auth(&self.bearer)
            .json(&StandingRequest::of(scopes))
            .send()
            .await
            .map_err(|e| AuthorityError::Unavailable(request_failure(&e)))?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(AuthorityError::Rejected(RejectCause::ApiError));
        }
        let body = body_within(response, MAX_STANDING_BODY)
            .await?
            .ok_or(AuthorityError::InvalidResponse("body_too_large"))?;
        crate::standing::read_answer(&body, scopes.len())
    }
}

/// Largest standing answer read, in bytes (about 60 per scope).
const MAX_STANDING_BODY: usize = 256 * 1024;

/// The body of `response` as it comes, up to `max` bytes; `None` when it is longer.
async fn body_within(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Option<Vec<u8>>, AuthorityError> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > max {
                    return Ok(None);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Some(body)),
            Err(e) => return Err(AuthorityError::Unavailable(request_failure(&e))),
        }
    }
}

/// A failure class of a reqwest error that names no URL or host.
pub(crate) fn request_failure(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls() {
        let t = Target::new("http://10.0.0.5:6080", "abc_DEF-1", Policy::View).unwrap();
        assert_eq!(
            t.http_url("vnc.html").as_str(),
            "http://10.0.0.5:6080/vnc.html"
        );
        assert_eq!(
            t.http_url("app/ui.js").as_str(),
            "http://10.0.0.5:6080/app/ui.js"
        );
        assert_eq!(
            t.http_url("a b/%2e%2e").as_str(),
            "http://10.0.0.5:6080/a%20b/%252e%252e"
        );
        assert_eq!(
            t.websocket_url(),
            "ws://10.0.0.5:6080/websockify?token=abc_DEF-1"
        );
        let p = Target::new("http://gw.internal:80/screens/", "t", Policy::View).unwrap();
        assert_eq!(
            p.websocket_url(),
            "ws://gw.internal/screens/websockify?token=t"
        );
        assert_eq!(
            Target::new("http://h:1/p", "t", Policy::View)
                .unwrap()
                .http_url("x")
                .as_str(),
            "http://h:1/p/x"
        );
    }

    #[test]
    fn target_validation() {
        for bad in [
            "https://h:1",
            "ws://h:1",
            "http://u:p@h:1",
            "http://h:1/?q=1",
            "http://h:1/#f",
            "not a url",
            "file:///tmp",
        ] {
            assert_eq!(
                Target::new(bad, "t", Policy::View),
                Err(TargetError::BadUpstream),
                "{bad}"
            );
        }
        for bad in ["", "../x", "a/b", "a?b", "a b", &"a".repeat(129)] {
            assert_eq!(
                Target::new("http://h:1", bad, Policy::View),
                Err(TargetError::BadToken),
                "{bad}"
            );
        }
    }

    #[test]
    fn debug_redacts_target() {
        let t = Target::new("http://secret-host:1", "secret-token", Policy::View).unwrap();
        let s = format!("{t:?}");
        assert!(!s.contains("secret"), "{s}");
    }
}
