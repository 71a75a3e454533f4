//! Structured logging: `tracing` events with stable dotted names, filtered by `RAKAZO_LOG`.
//! Events never carry secrets, capability URLs, socket tokens, cookies or provider hosts.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Install the global subscriber (once; later calls are ignored).
pub fn init(filter: &str) {
    // The HTTP and websocket client crates name upstream hosts at debug level: they stay
    // quiet whatever the operator asks for.
    let safe = rakazo_web_proxy::SAFE_LOG_DIRECTIVES;
    let filter = EnvFilter::try_new(format!("{filter},{safe}"))
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{safe}")));
    // Colour codes only for a person's terminal, never into a file, pipe or journal.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal())
        .try_init();
}
