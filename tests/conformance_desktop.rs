//! The provider conformance suite for the `desktop` provider: real processes, real Xvfb.

use std::sync::{Arc, OnceLock};

use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo_actors::provider::SandboxProvider;

/// One provider for the whole binary (one display pool), rooted in a private directory.
fn provider() -> Arc<dyn SandboxProvider> {
    static SHARED: OnceLock<(tempfile::TempDir, Arc<DesktopProvider>)> = OnceLock::new();
    let (_, p) = SHARED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = DesktopProvider::new(DesktopProviderConfig {
            homes_root: dir.path().join("homes"),
            run_root: dir.path().join("run"),
            screen_limit: 0,
            first_display: 140,
            environment: "test".into(),
            limits: None,
            warm_stacks: 0,
            // Its desktops start lowered and are raised back once open (as root).
            start_nice: 10,
        })
        .unwrap();
        (dir, Arc::new(p))
    });
    p.clone()
}

rakazo_actors::conformance_suite!(provider());

#[test]
fn production_refuses_the_desktop_provider() {
    let dir = tempfile::tempdir().unwrap();
    let refused = DesktopProvider::new(DesktopProviderConfig {
        homes_root: dir.path().join("homes"),
        run_root: dir.path().join("run"),
        screen_limit: 0,
        first_display: 150,
        environment: "production".into(),
        limits: None,
        warm_stacks: 0,
        start_nice: 0,
    });
    assert!(refused.is_err());
}
