//! Control sessions as the proxy saw them: who held control of which screen, from when to
//! when, and how many inputs of each kind they sent (counts only, never keys, text or
//! points). The composition root hands them to its timeline through [`SessionNotes`].

use std::time::{SystemTime, UNIX_EPOCH};

use crate::capability::Capability;
use crate::gateway::SocketKind;
use crate::rfb::InputCounts;

/// One control socket from its upgrade to its close.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlSession {
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
    pub closed_by: &'static str,
}

/// Where the proxy hands a control session that ended.
pub trait SessionNotes: Send + Sync + 'static {
    /// A control session ended; called once per control socket, off the revocation path.
    fn control_session_ended(&self, session: ControlSession);
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
    pub(crate) capability: Capability,
    pub(crate) socket: SocketKind,
    pub(crate) started_at_ms: i64,
}

impl Tally {
    /// The session, now that the socket closed.
    pub(crate) fn ended(
        self,
        inputs: InputCounts,
        counted: bool,
        closed_by: &'static str,
    ) -> ControlSession {
        ControlSession {
            computer_id: self.capability.computer_id,
            bot_id: self.capability.bot_id,
            fence: self.capability.fence,
            socket: self.socket,
            started_at_ms: self.started_at_ms,
            ended_at_ms: now_ms(),
            inputs,
            counted,
            closed_by,
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
