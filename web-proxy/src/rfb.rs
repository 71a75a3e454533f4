//! The view-only input filter: parses the RFB client-to-server stream and drops input messages.
//!
//! x11vnc already runs `-viewonly` for view capabilities; this is the second, independent line.
//! The filter follows the client side of the RFB 3.7/3.8 handshake (version, chosen security
//! type, VNC authentication response, ClientInit) and then every client message, whatever the
//! websocket framing: a message may be split across frames or several may share one frame.
//!
//! Forwarded: SetPixelFormat (0), SetEncodings (2), FramebufferUpdateRequest (3),
//! EnableContinuousUpdates (150), ClientFence (248).
//! Dropped: KeyEvent (4), PointerEvent (5), ClientCutText (6, including extended clipboard),
//! xvp (250), SetDesktopSize (251), QEMU extended key events (255/0).
//! Anything else (RFB 3.3, other security types, unknown messages) is a [`FilterError`]: the
//! filter cannot know its length, so it fails closed and the connection is closed.

/// Why the filter gave up on a view connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The client did not announce RFB 3.7 or 3.8.
    #[error("unsupported RFB version")]
    UnsupportedVersion,
    /// The client chose a security type other than None (1) or VNC authentication (2).
    #[error("unsupported RFB security type {0}")]
    UnsupportedSecurity(u8),
    /// A client message type (or QEMU subtype) whose length the filter does not know.
    #[error("unknown RFB client message {0}")]
    UnknownMessage(u8),
    /// A message field out of the protocol's range.
    #[error("invalid RFB client message")]
    Invalid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Version,
    SecurityType,
    VncAuth,
    ClientInit,
    Messages,
}

enum Step {
    /// At least this many bytes of the current unit are needed to decide.
    More(usize),
    /// The unit in the buffer is complete; forward it or not, then skip (drop) `skip` more
    /// bytes and continue in phase `next`.
    Done {
        forward: bool,
        skip: u64,
        next: Phase,
    },
}

/// How many input messages of each kind a connection sent (never their contents: no key
/// symbol, no text, no coordinates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InputCounts {
    /// Key presses (a key going down).
    pub keys: u64,
    /// Button presses of the left, middle or right button.
    pub clicks: u64,
    /// Wheel notches.
    pub scrolls: u64,
    /// Pointer moves (pointer events that press no new button).
    pub pointer_moves: u64,
    /// Clipboard texts sent to the computer.
    pub clipboard: u64,
    /// Other input (screen size, xvp) and terminal messages.
    pub other: u64,
    /// The button mask of the last pointer event (to tell presses from moves).
    #[serde(skip)]
    buttons: u8,
}

impl InputCounts {
    /// Count one whole input message (its type byte first).
    fn count(&mut self, message: &[u8]) {
        match message.first() {
            Some(4) if message.get(1).is_some_and(|down| *down != 0) => self.keys += 1,
            Some(4) => {}
            Some(5) => {
                let mask = message.get(1).copied().unwrap_or(0);
                let pressed = mask & !self.buttons;
                if pressed & 0b0111 != 0 {
                    self.clicks += 1;
                } else if pressed & 0b0111_1000 != 0 {
                    self.scrolls += 1;
                } else {
                    self.pointer_moves += 1;
                }
                self.buttons = mask;
            }
            Some(6) => self.clipboard += 1,
            Some(255) if message.get(3).is_some_and(|down| *down != 0) => self.keys += 1,
            Some(255) => {}
            _ => self.other += 1,
        }
    }

    /// Count a message whose contents are not parsed (a terminal's input).
    pub fn count_other(&mut self) {
        self.other += 1;
    }
}

/// Streaming filter state for one view connection (client to upstream direction). A control
/// connection runs one as a counter only: its output is discarded and the input it would drop
/// is counted ([`ViewFilter::counts`]).
#[derive(Debug)]
pub struct ViewFilter {
    phase: Phase,
    buf: Vec<u8>,
    skip: u64,
    dropped: u64,
    counts: InputCounts,
}

impl Default for ViewFilter {
    fn default() -> Self {
        ViewFilter::new()
    }
}

impl ViewFilter {
    /// A filter at the start of a connection.
    pub fn new() -> ViewFilter {
        ViewFilter {
            phase: Phase::Version,
            buf: Vec::with_capacity(32),
            skip: 0,
            dropped: 0,
            counts: InputCounts::default(),
        }
    }

    /// The input messages seen so far, by kind.
    pub fn counts(&self) -> InputCounts {
        self.counts
    }

    /// How many input messages were dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Feeds client bytes; appends the bytes that may go upstream to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), FilterError> {
        loop {
            if self.skip > 0 {
                let n = self.skip.min(input.len() as u64) as usize;
                input = &input[n..];
                self.skip -= n as u64;
                if self.skip > 0 {
                    return Ok(());
                }
            }
            match self.step()? {
                Step::More(need) => {
                    if input.is_empty() {
                        return Ok(());
                    }
                    let n = (need - self.buf.len()).min(input.len());
                    self.buf.extend_from_slice(&input[..n]);
                    input = &input[n..];
                }
                Step::Done {
                    forward,
                    skip,
                    next,
                } => {
                    if forward {
                        out.extend_from_slice(&self.buf);
                    } else {
                        self.dropped += 1;
                        self.counts.count(&self.buf);
                    }
                    self.buf.clear();
                    self.skip = skip;
                    self.phase = next;
                }
            }
        }
    }

    fn step(&self) -> Result<Step, FilterError> {
        let b = &self.buf;
        let done = |forward, next| Step::Done {
            forward,
            skip: 0,
            next,
        };
        Ok(match self.phase {
            Phase::Version => {
                if b.len() < 12 {
                    return Ok(Step::More(12));
                }
                if b.as_slice() != b"RFB 003.008\n" && b.as_slice() != b"RFB 003.007\n" {
                    return Err(FilterError::UnsupportedVersion);
                }
                done(true, Phase::SecurityType)
            }
            Phase::SecurityType => match b.first() {
                None => Step::More(1),
                Some(1) => done(true, Phase::ClientInit),
                Some(2) => done(true, Phase::VncAuth),
                Some(&other) => return Err(FilterError::UnsupportedSecurity(other)),
            },
            Phase::VncAuth => fixed(b, 16, true, Phase::ClientInit),
            Phase::ClientInit => fixed(b, 1, true, Phase::Messages),
            Phase::Messages => {
                let Some(&kind) = b.first() else {
                    return Ok(Step::More(1));
                };
                let m = Phase::Messages;
                match kind {
                    0 => fixed(b, 20, true, m),
                    2 => match b.get(2..4) {
                        None => Step::More(4),
                        Some(n) => {
                            let n = u16::from_be_bytes([n[0], n[1]]) as usize;
                            fixed(b, 4 + 4 * n, true, m)
                        }
                    },
                    3 => fixed(b, 10, true, m),
                    4 => fixed(b, 8, false, m),
                    5 => fixed(b, 6, false, m),
                    6 => match b.get(4..8) {
                        None => Step::More(8),
                        Some(l) => {
                            // Negative lengths are the extended clipboard: |len| bytes follow.
                            let len = i32::from_be_bytes([l[0], l[1], l[2], l[3]]);
                            Step::Done {
                                forward: false,
                                skip: u64::from(len.unsigned_abs()),
                                next: m,
                            }
                        }
                    },
                    150 => fixed(b, 10, true, m),
                    248 => match b.get(8) {
                        None => Step::More(9),
                        Some(&len) if len > 64 => return Err(FilterError::Invalid),
                        Some(&len) => fixed(b, 9 + len as usize, true, m),
                    },
                    250 => fixed(b, 4, false, m),
                    251 => match b.get(6) {
                        None => Step::More(8),
                        Some(&screens) => fixed(b, 8 + 16 * screens as usize, false, m),
                    },
                    255 => match b.get(1) {
                        None => Step::More(2),
                        Some(0) => fixed(b, 12, false, m),
                        Some(_) => return Err(FilterError::UnknownMessage(255)),
                    },
                    other => return Err(FilterError::UnknownMessage(other)),
                }
            }
        })
    }
}

fn fixed(buf: &[u8], len: usize, forward: bool, next: Phase) -> Step {
    if buf.len() < len {
        Step::More(len)
    } else {
        Step::Done {
            forward,
            skip: 0,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const HANDSHAKE: &[u8] = b"RFB 003.008\n\x01\x01";

    /// A random client message and whether a view connection may send it.
    fn message(rng: &mut StdRng) -> (Vec<u8>, bool) {
        let mut m = Vec::new();
        let allowed = match rng.random_range(0..11) {
            0 => {
                m.push(0);
                m.extend((0..19).map(|_| rng.random::<u8>()));
                true
            }
            1 => {
                let n: u16 = rng.random_range(0..40);
                m.extend([2, 0]);
                m.extend(n.to_be_bytes());
                m.extend((0..4 * n).map(|_| rng.random::<u8>()));
                true
            }
            2 => {
                m.push(3);
                m.extend((0..9).map(|_| rng.random::<u8>()));
                true
            }
            3 => {
                m.extend([4, 1, 0, 0, 0, 0, 0, 0x61]);
                false
            }
            4 => {
                m.extend([5, 1, 0, 10, 0, 20]);
                false
            }
            5 => {
                let len: i32 = rng.random_range(0..3000);
                let len = if rng.random() { -len } else { len };
                m.extend([6, 0, 0, 0]);
                m.extend(len.to_be_bytes());
                m.extend((0..len.unsigned_abs()).map(|_| 5u8));
                false
            }
            6 => {
                m.push(150);
                m.extend((0..9).map(|_| rng.random::<u8>()));
                true
            }
            7 => {
                let len: u8 = rng.random_range(0..=64);
                m.extend([248, 0, 0, 0, 0, 0, 0, 1, len]);
                m.extend((0..len).map(|_| rng.random::<u8>()));
                true
            }
            8 => {
                m.extend([250, 0, 1, 2]);
                false
            }
            9 => {
                let screens: u8 = rng.random_range(0..4);
                m.extend([251, 0, 4, 0, 3, 0, screens, 0]);
                m.extend((0..16 * screens as usize).map(|_| 0u8));
                false
            }
            _ => {
                m.extend([255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 30]);
                false
            }
        };
        (m, allowed)
    }

    fn feed_in_chunks(
        filter: &mut ViewFilter,
        stream: &[u8],
        rng: &mut StdRng,
    ) -> Result<Vec<u8>, FilterError> {
        let mut out = Vec::new();
        let mut rest = stream;
        while !rest.is_empty() {
            let n = rng.random_range(1..=rest.len().min(300));
            filter.feed(&rest[..n], &mut out)?;
            rest = &rest[n..];
        }
        Ok(out)
    }

    /// Property: for any message sequence and any framing, the output is exactly the allowed
    /// messages in order, and every input message is counted as dropped.
    #[test]
    fn random_streams_keep_exactly_the_allowed_messages() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let mut stream = HANDSHAKE.to_vec();
            let mut expected = HANDSHAKE.to_vec();
            let mut dropped = 0;
            for _ in 0..rng.random_range(0..60) {
                let (m, allowed) = message(&mut rng);
                stream.extend(&m);
                if allowed {
                    expected.extend(&m);
                } else {
                    dropped += 1;
                }
            }
            let mut filter = ViewFilter::new();
            let out = feed_in_chunks(&mut filter, &stream, &mut rng).unwrap();
            assert_eq!(out, expected);
            assert_eq!(filter.dropped(), dropped);
        }
    }

    #[test]
    fn byte_by_byte_pointer_event_never_leaks() {
        let mut filter = ViewFilter::new();
        let mut out = Vec::new();
        for b in HANDSHAKE.iter().chain(&[5u8, 1, 0, 10, 0, 20]) {
            filter.feed(&[*b], &mut out).unwrap();
        }
        assert_eq!(out, HANDSHAKE);
        assert_eq!(filter.dropped(), 1);
    }

    #[test]
    fn vnc_auth_response_is_forwarded() {
        let mut filter = ViewFilter::new();
        let mut out = Vec::new();
        let mut stream = b"RFB 003.008\n\x02".to_vec();
        stream.extend([9u8; 16]);
        stream.push(1);
        stream.extend([5, 0, 0, 0, 0, 0]);
        filter.feed(&stream, &mut out).unwrap();
        assert_eq!(out, &stream[..stream.len() - 6]);
    }

    #[test]
    fn fails_closed_on_what_it_cannot_parse() {
        let cases: &[(&[u8], FilterError)] = &[
            (b"RFB 003.003\n", FilterError::UnsupportedVersion),
            (b"RFB 003.889\n", FilterError::UnsupportedVersion),
            (b"RFB 003.008\n\x13", FilterError::UnsupportedSecurity(19)),
            (b"RFB 003.008\n\x01\x01\x07", FilterError::UnknownMessage(7)),
            (
                b"RFB 003.008\n\x01\x01\xff\x01",
                FilterError::UnknownMessage(255),
            ),
            (
                b"RFB 003.008\n\x01\x01\xf8\0\0\0\0\0\0\0\x41",
                FilterError::Invalid,
            ),
        ];
        for (stream, err) in cases {
            let mut out = Vec::new();
            assert_eq!(ViewFilter::new().feed(stream, &mut out), Err(*err));
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..2000 {
            let mut stream = HANDSHAKE.to_vec();
            stream.extend((0..rng.random_range(0..400)).map(|_| rng.random::<u8>()));
            let mut filter = ViewFilter::new();
            let _ = feed_in_chunks(&mut filter, &stream, &mut rng);
        }
    }

    #[test]
    fn input_is_counted_by_kind_and_nothing_else_is_kept() {
        let mut stream = HANDSHAKE.to_vec();
        // Three keys typed (down and up each), a click (move, press, release), a wheel notch,
        // a clipboard text split across chunks, a screen size request.
        for k in [b'a', b'b', b'c'] {
            stream.extend([4, 1, 0, 0, 0, 0, 0, k]);
            stream.extend([4, 0, 0, 0, 0, 0, 0, k]);
        }
        stream.extend([5, 0, 0, 10, 0, 10]);
        stream.extend([5, 1, 0, 10, 0, 10]);
        stream.extend([5, 0, 0, 10, 0, 10]);
        stream.extend([5, 8, 0, 10, 0, 10]);
        stream.extend([5, 0, 0, 10, 0, 10]);
        stream.extend([6, 0, 0, 0, 0, 0, 0, 6]);
        stream.extend(b"secret");
        stream.extend([251, 0, 5, 0, 3, 32, 0, 0]);
        let mut rng = StdRng::seed_from_u64(3);
        let mut filter = ViewFilter::new();
        feed_in_chunks(&mut filter, &stream, &mut rng).unwrap();
        let c = filter.counts();
        assert_eq!(
            (
                c.keys,
                c.clicks,
                c.scrolls,
                c.pointer_moves,
                c.clipboard,
                c.other
            ),
            (3, 1, 1, 3, 1, 1)
        );
        let shown = serde_json::to_string(&c).unwrap();
        assert!(
            !shown.contains("secret") && !shown.contains("buttons"),
            "{shown}"
        );
    }
}
