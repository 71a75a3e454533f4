//! A test hook: `RAKAZO_CRASH_AT=<point>` makes the process abort at that named point, so tests
//! prove what a crash there leaves behind. The points are listed in the server's
//! `crash_point` module. Never set in a deployment; unset, a point costs one environment
//! lookup.

/// The environment variable naming the point where the process aborts.
pub const CRASH_AT_ENV: &str = "RAKAZO_CRASH_AT";

/// Aborts the process when `CRASH_AT_ENV` names `point`.
pub fn crash_point(point: &str) {
    if std::env::var(CRASH_AT_ENV).is_ok_and(|v| v == point) {
        std::process::abort();
    }
}
