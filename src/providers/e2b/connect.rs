//! Connect RPC framing as envd speaks it with the JSON codec: the envelope of a streaming
//! request or response (one flag byte, a 4-byte big-endian length, the JSON message), and a
//! decoder that takes response bytes as they arrive.

use serde_json::Value;

/// Flag of a compressed message (never sent or accepted here).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the end-of-stream message.
pub const FLAG_END: u8 = 0x02;
/// Largest message accepted.
pub const MAX_MESSAGE: usize = 16 << 20;

/// One envelope.
pub fn encode(flags: u8, message: &Value) -> Vec<u8> {
    let json = serde_json::to_vec(message).unwrap_or_default();
    let mut out = Vec::with_capacity(json.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// A decoded envelope.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A message.
    Message(Value),
    /// The end of the stream: `{}` or `{"error": {code, message}}`.
    End(Value),
}

/// Collects response bytes and yields whole envelopes.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Adds bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole envelope, if one is there; an error for a malformed stream.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err("a stream message is too large".into());
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err("a compressed stream message".into());
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let value: Value = serde_json::from_slice(&self.buf[5..5 + len])
            .map_err(|_| "an unreadable stream message".to_string())?;
        self.buf.drain(..5 + len);
        Ok(Some(if flags & FLAG_END != 0 {
            Frame::End(value)
        } else {
            Frame::Message(value)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_envelopes_split_anywhere() {
        let mut bytes = encode(0, &json!({"event": {"start": {"pid": 7}}}));
        bytes.extend(encode(FLAG_END, &json!({})));
        for cut in 0..bytes.len() {
            let mut d = Decoder::default();
            let mut frames = Vec::new();
            for part in [&bytes[..cut], &bytes[cut..]] {
                d.push(part);
                while let Some(f) = d.next_frame().unwrap() {
                    frames.push(f);
                }
            }
            assert_eq!(
                frames,
                vec![
                    Frame::Message(json!({"event": {"start": {"pid": 7}}})),
                    Frame::End(json!({}))
                ]
            );
        }
    }

    #[test]
    fn refuses_compressed_and_oversized_messages() {
        let mut d = Decoder::default();
        d.push(&encode(FLAG_COMPRESSED, &json!({})));
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err());
    }
}
