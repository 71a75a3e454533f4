//! Binary attachments of tool answers: on a transport that carries binary messages (the
//! `/rpc/ws` socket opened with `?images=binary`), a screenshot travels as its own binary
//! message beside the JSON answer, instead of as base64 inside it.
//!
//! The answer's image item names its attachment (`{"type":"image","mimeType":"image/png",
//! "attachment":7}`), and the attachment's message, sent on the same socket before the answer,
//! is the id as 8 big-endian bytes followed by the image's bytes. Ids count up per socket, so
//! answers of calls that run at once never claim each other's images.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the id before an attachment's bytes.
pub const ID_BYTES: usize = 8;

/// The attachments of one answer, numbered from its socket's counter.
pub struct Attachments {
    next: Arc<AtomicU64>,
    /// Each attachment's binary message.
    messages: Mutex<Vec<Vec<u8>>>,
}

impl Attachments {
    /// An empty set numbered from `next` (one counter per socket).
    pub fn new(next: Arc<AtomicU64>) -> Self {
        Self {
            next,
            messages: Mutex::new(Vec::new()),
        }
    }

    /// Keeps `bytes` for the answer's transport; answers the id the answer names it by.
    pub fn attach(&self, bytes: &[u8]) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.messages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message(id, bytes));
        id
    }

    /// The binary messages to send before the answer, in the order they were attached.
    pub fn into_messages(self) -> Vec<Vec<u8>> {
        self.messages
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// One attachment's binary message: the id (8 bytes, big-endian), then the bytes.
pub fn message(id: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ID_BYTES + bytes.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_count_up_per_socket_and_lead_each_message() {
        let socket = Arc::new(AtomicU64::new(1));
        let (first, second) = (
            Attachments::new(socket.clone()),
            Attachments::new(socket.clone()),
        );
        assert_eq!(first.attach(b"png-a"), 1);
        assert_eq!(second.attach(b"png-b"), 2);
        assert_eq!(first.attach(b"png-c"), 3);
        let messages = first.into_messages();
        assert_eq!(messages.len(), 2);
        assert_eq!(&messages[0][..ID_BYTES], &1u64.to_be_bytes());
        assert_eq!(&messages[0][ID_BYTES..], b"png-a");
        assert_eq!(&messages[1][..ID_BYTES], &3u64.to_be_bytes());
        assert_eq!(second.into_messages()[0][ID_BYTES..], *b"png-b");
    }
}
