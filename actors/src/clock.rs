//! Wall-clock milliseconds, the one time unit stored in the database, and the injectable
//! [`Clock`] the timed rules (idle suspension, the uptime cap, maintenance heartbeats) read.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A fresh random identifier (UUID v4, hyphenated).
pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The time the timed rules decide by: the wall clock plus an offset that only tests move
/// ([`Clock::advance`]), so idle, cap and heartbeat rules are tested without real waiting.
/// Rows written at the wall-clock time stay comparable: moving the clock forward makes them
/// look older, exactly as real waiting would. Clones share the offset.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// The wall clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// Milliseconds since the Unix epoch, as this clock reads.
    pub fn now_ms(&self) -> i64 {
        now_ms().saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Test hook: move this clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.offset_ms
            .fetch_add(by.as_millis() as i64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advancing_moves_every_clone() {
        let clock = Clock::system();
        let shared = clock.clone();
        let before = clock.now_ms();
        shared.advance(Duration::from_secs(3600));
        assert!(clock.now_ms() >= before + 3_600_000);
    }
}
