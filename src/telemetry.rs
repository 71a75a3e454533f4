//! Structured logging: `tracing` events with stable dotted names, filtered by `RAKAZO_LOG`.
//! Events never carry secrets, capability URLs, socket tokens, cookies or provider hosts.

use tracing_subscriber::EnvFilter;

/// Install the global subscriber (once; later calls are ignored).
pub fn init(filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}
