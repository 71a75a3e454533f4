//! Control sessions as the proxy saw them: who held control of which screen, from when to
//! when, and how many inputs of each kind they sent (counts only, never keys, text or
//! points). The composition root hands them to its timeline through [`SessionNotes`]; a proxy
//! in its own process reports them over internal RPC with [`HttpSessionNotes`].

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::capability::Capability;
use crate::gateway::SocketKind;
use crate::rfb::InputCounts;

/// A control socket that just opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionStart {
    /// The session's id (random; the same in its [`ControlSession`]).
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot whose screen it is.
    pub bot_id: String,
    /// The control grant's fence.
    pub fence: u64,
    /// The screen or the terminal.
    pub socket: SocketKind,
    /// When the socket opened, unix milliseconds.
    pub started_at_ms: i64,
}

/// One control socket from its upgrade to its close.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlSession {
    /// The session's id (as in its [`SessionStart`]).
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot whose screen it was.
    pub bot_id: String,
    /// The control grant's fence (names the person who held it).
    pub fence: u64,
    /// The screen or the terminal.
    pub socket: SocketKind,
    /// When the socket opened, unix milliseconds.
    pub started_at_ms: i64,
    /// When it closed, unix milliseconds.
    pub ended_at_ms: i64,
    /// Inputs by kind.
    pub inputs: InputCounts,
    /// Whether the counts are whole (false when the stream could no longer be parsed).
    pub counted: bool,
    /// Why it ended (`client`, `upstream`, `revoked`, ...).
    pub closed_by: Cow<'static, str>,
}

/// Where the proxy hands a control session when it starts and when it ends.
pub trait SessionNotes: Send + Sync + 'static {
    /// A control socket opened (before any byte is relayed).
    fn control_session_started(&self, _session: SessionStart) {}

    /// A control session ended; called once per control socket, off the revocation path.
    fn control_session_ended(&self, session: ControlSession);
}

/// The internal RPC path that [`HttpSessionNotes`] calls under the API base URL.
pub const SESSIONS_RPC_PATH: &str = "internal/control-session";

/// The JSON body of `POST {api}/internal/control-session`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "event", deny_unknown_fields)]
pub enum SessionReport {
    /// A control socket opened.
    Started {
        /// The session.
        session: SessionStart,
    },
    /// A control socket closed.
    Ended {
        /// The session.
        session: ControlSession,
    },
}

/// [`SessionNotes`] of a proxy in its own process: each start and end is posted to
/// `{api}/internal/control-session` with the internal credential, so sessions relayed here
/// reach the same timeline as the API's own. A report that fails is logged
/// (`screen.proxy.session_report_failed`) and dropped.
pub struct HttpSessionNotes {
    client: reqwest::Client,
    endpoint: Url,
    bearer: String,
}

impl HttpSessionNotes {
    /// Notes posting to `{api_base}/internal/control-session` with `Authorization: Bearer
    /// {bearer}`, each call bounded by `timeout`.
    pub fn new(
        api_base: &str,
        bearer: impl Into<String>,
        timeout: Duration,
    ) -> Result<HttpSessionNotes, crate::authority::HttpAuthorityError> {
        let (endpoint, client) =
            crate::authority::internal_endpoint(api_base, SESSIONS_RPC_PATH, timeout)?;
        Ok(HttpSessionNotes {
            client,
            endpoint,
            bearer: bearer.into(),
        })
    }

    fn post(&self, report: SessionReport) {
        let request = self
            .client
            .post(self.endpoint.clone())
            .bearer_auth(&self.bearer)
            .json(&report);
        tokio::spawn(async move {
            let failed = match request.send().await {
                Ok(r) if r.status().is_success() => None,
                Ok(r) => Some(format!("status {}", r.status().as_u16())),
                Err(e) => Some(crate::authority::request_failure(&e).to_owned()),
            };
            if let Some(error) = failed {
                tracing::event!(
                    name: "screen.proxy.session_report_failed",
                    tracing::Level::WARN,
                    error = %error,
                    "screen.proxy.session_report_failed"
                );
            }
        });
    }
}

impl SessionNotes for HttpSessionNotes {
    fn control_session_started(&self, session: SessionStart) {
        self.post(SessionReport::Started { session });
    }

    fn control_session_ended(&self, session: ControlSession) {
        self.post(SessionReport::Ended { session });
    }
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What a relay keeps of a control socket while it lives.
pub(crate) struct Tally {
    pub(crate) id: String,
    pub(crate) capability: Capability,
    pub(crate) socket: SocketKind,
    pub(crate) started_at_ms: i64,
}

impl Tally {
    /// A control socket opening now.
    pub(crate) fn new(capability: Capability, socket: SocketKind) -> Tally {
        Tally {
            id: uuid::Uuid::new_v4().simple().to_string(),
            capability,
            socket,
            started_at_ms: now_ms(),
        }
    }

    /// The session as it starts.
    pub(crate) fn start(&self) -> SessionStart {
        SessionStart {
            id: self.id.clone(),
            computer_id: self.capability.computer_id.clone(),
            bot_id: self.capability.bot_id.clone(),
            fence: self.capability.fence,
            socket: self.socket,
            started_at_ms: self.started_at_ms,
        }
    }

    /// The session, now that the socket closed.
    pub(crate) fn ended(
        self,
        inputs: InputCounts,
        counted: bool,
        closed_by: &'static str,
    ) -> ControlSession {
        ControlSession {
            id: self.id,
            computer_id: self.capability.computer_id,
            bot_id: self.capability.bot_id,
            fence: self.capability.fence,
            socket: self.socket,
            started_at_ms: self.started_at_ms,
            ended_at_ms: now_ms(),
            inputs,
            counted,
            closed_by: Cow::Borrowed(closed_by),
        }
    }
}

/// Counts a control socket's input as it passes (the bytes themselves go on unchanged).
pub(crate) struct Counter {
    /// The RFB parser of a screen socket; none for a terminal or once it lost the stream.
    rfb: Option<crate::rfb::ViewFilter>,
    /// Messages of a terminal socket.
    messages: InputCounts,
    /// Whether the counts are whole.
    counted: bool,
    scratch: Vec<u8>,
}

impl Counter {
    pub(crate) fn new(socket: SocketKind) -> Self {
        Self {
            rfb: (socket == SocketKind::Screen).then(crate::rfb::ViewFilter::new),
            messages: InputCounts::default(),
            counted: true,
            scratch: Vec::new(),
        }
    }

    /// Bytes the client sent.
    pub(crate) fn binary(&mut self, bytes: &[u8]) {
        match &mut self.rfb {
            Some(rfb) => {
                if rfb.feed(bytes, &mut self.scratch).is_err() {
                    // A message the parser does not know: the session goes on uncounted.
                    self.messages = rfb.counts();
                    self.rfb = None;
                    self.counted = false;
                }
                self.scratch.clear();
            }
            None if self.counted => self.messages.count_other(),
            None => {}
        }
    }

    /// A text message the client sent.
    pub(crate) fn text(&mut self) {
        if self.rfb.is_none() && self.counted {
            self.messages.count_other();
        }
    }

    /// The counts and whether they are whole.
    pub(crate) fn finish(&self) -> (InputCounts, bool) {
        let counts = self.rfb.as_ref().map_or(self.messages, |r| r.counts());
        (counts, self.counted)
    }
}
