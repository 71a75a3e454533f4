//! Wall-clock milliseconds, the one time unit stored in the database.

use std::time::{SystemTime, UNIX_EPOCH};

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
