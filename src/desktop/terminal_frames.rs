//! The terminal frame protocol (version 1), as spoken by every terminal server and client.
//!
//! A terminal socket is a byte stream (websockify relays websocket messages to a unix socket
//! without keeping their boundaries), so each frame carries its own:
//!
//! ```text
//! frame = kind u8 | length u32 (big endian) | payload (length bytes, at most 65536)
//! 0x01 data    both ways       terminal bytes: keystrokes in, shell output out
//! 0x02 resize  to the server   columns u16 BE | rows u16 BE
//! 0x03 exit    to the client   the shell's exit status, i32 BE; the server then closes
//! 0x04 hello   to the client   the first frame: protocol version u8 (1)
//! ```
//!
//! A client may split or join frames across websocket messages as it likes; a frame longer
//! than the limit or of an unknown kind ends the connection.

/// Protocol version sent in `hello`.
pub const VERSION: u8 = 1;
/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = 65536;
const HEADER: usize = 5;

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TerminalFrame {
    /// Terminal bytes.
    Data(Vec<u8>),
    /// A new window size.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// The shell ended with this status.
    Exit(i32),
    /// The server's greeting.
    Hello(u8),
}

impl TerminalFrame {
    /// The frame's bytes on the wire. Data longer than the limit becomes several frames.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            TerminalFrame::Data(data) => {
                let mut out = Vec::with_capacity(data.len() + HEADER);
                for chunk in data.chunks(MAX_PAYLOAD) {
                    push(&mut out, 1, chunk);
                }
                if data.is_empty() {
                    push(&mut out, 1, &[]);
                }
                out
            }
            TerminalFrame::Resize { cols, rows } => {
                let mut payload = cols.to_be_bytes().to_vec();
                payload.extend_from_slice(&rows.to_be_bytes());
                one(2, &payload)
            }
            TerminalFrame::Exit(status) => one(3, &status.to_be_bytes()),
            TerminalFrame::Hello(version) => one(4, &[*version]),
        }
    }
}

fn one(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + HEADER);
    push(&mut out, kind, payload);
    out
}

fn push(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A malformed stream: the connection must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame announced more than [`MAX_PAYLOAD`] bytes.
    #[error("terminal frame too long")]
    TooLong,
    /// An unknown kind, or a known kind with the wrong payload size.
    #[error("malformed terminal frame")]
    Malformed,
}

/// Reassembles frames from bytes as they arrive.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<TerminalFrame>, FrameError> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let kind = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLong);
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buf.drain(..HEADER + len).skip(HEADER).collect();
        let frame = match (kind, payload.len()) {
            (1, _) => TerminalFrame::Data(payload),
            (2, 4) => TerminalFrame::Resize {
                cols: u16::from_be_bytes([payload[0], payload[1]]),
                rows: u16::from_be_bytes([payload[2], payload[3]]),
            },
            (3, 4) => TerminalFrame::Exit(i32::from_be_bytes([
                payload[0], payload[1], payload[2], payload[3],
            ])),
            (4, 1) => TerminalFrame::Hello(payload[0]),
            _ => return Err(FrameError::Malformed),
        };
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split() {
        let frames = vec![
            TerminalFrame::Hello(VERSION),
            TerminalFrame::Data(b"echo hi\r".to_vec()),
            TerminalFrame::Resize {
                cols: 120,
                rows: 40,
            },
            TerminalFrame::Exit(-3),
        ];
        let wire: Vec<u8> = frames.iter().flat_map(TerminalFrame::encode).collect();
        for step in [1, 2, 3, 7, wire.len()] {
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(step) {
                reader.push(chunk);
                while let Some(f) = reader.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "split every {step} bytes");
        }
    }

    #[test]
    fn hostile_frames_are_refused() {
        let mut r = FrameReader::default();
        r.push(&[1, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.next_frame(), Err(FrameError::TooLong));
        let mut r = FrameReader::default();
        r.push(&[9, 0, 0, 0, 0]);
        assert_eq!(r.next_frame(), Err(FrameError::Malformed));
        let mut r = FrameReader::default();
        r.push(&[2, 0, 0, 0, 1, 5]);
        assert_eq!(r.next_frame(), Err(FrameError::Malformed));
    }

    #[test]
    fn long_data_is_split() {
        let data = vec![b'x'; MAX_PAYLOAD + 10];
        let mut r = FrameReader::default();
        r.push(&TerminalFrame::Data(data).encode());
        assert!(
            matches!(r.next_frame(), Ok(Some(TerminalFrame::Data(d))) if d.len() == MAX_PAYLOAD)
        );
        assert!(matches!(r.next_frame(), Ok(Some(TerminalFrame::Data(d))) if d.len() == 10));
    }
}
