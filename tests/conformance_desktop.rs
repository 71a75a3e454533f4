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

/// A folder of more than `MAX_LISTED_ENTRIES` names (the bot makes them) is refused with
/// `TooLarge`, read no further; its parent still lists.
#[actix_rt::test]
async fn a_folder_past_the_listing_limit_is_refused() {
    use rakazo::providers::beneath::MAX_LISTED_ENTRIES;
    use rakazo_actors::conformance::{cmd, spec};
    use rakazo_actors::provider::ProviderError;
    let p = provider();
    let m = p.provision(&spec("listing-limit")).await.unwrap();
    let make = format!(
        "mkdir huge && cd huge && python3 -c 'import os\nfor i in range({}): os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY))'",
        MAX_LISTED_ENTRIES + 1
    );
    assert_eq!(p.exec(&m, &cmd(&make)).await.unwrap().exit_code, 0);
    let refused = p.list_files(&m, "huge").await;
    assert!(
        matches!(&refused, Err(ProviderError::TooLarge(why)) if why.contains("use shell")),
        "{refused:?}"
    );
    assert!(
        p.list_files(&m, "")
            .await
            .unwrap()
            .iter()
            .any(|e| e.name == "huge")
    );
    p.destroy(&m).await.unwrap();
}
