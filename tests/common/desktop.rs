//! A desktop runtime's configuration for tests on this host: one machine in `dir`, displays from
//! `first_display` on, no screen limit, no groups, no spares (callers change what they need).

use std::path::Path;

use rakazo::desktop::runtime::{DisplayPool, RuntimeConfig};

/// The configuration of a runtime whose workspace and run directory are in `dir`.
pub fn runtime_config(dir: &Path, first_display: u32) -> RuntimeConfig {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    RuntimeConfig::on_host(
        dir.join("workspace"),
        dir.join("run"),
        DisplayPool::new(first_display),
    )
}
