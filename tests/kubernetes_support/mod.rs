//! Shared by the kubernetes test binaries: one kubernetes emulator per test binary (on
//! 127.0.0.1:0, its own thread and actix system, pods backed by containers of the computer
//! image), a kubeconfig for it, and providers that reach it through kube-rs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rakazo::config::KubernetesSettings;
use rakazo::emulators::kubernetes::{Emulator, EmulatorConfig};
use rakazo::providers::kubernetes::{KubernetesProvider, KubernetesProviderConfig};

/// The namespace the tests use.
pub const NAMESPACE: &str = "rakazo-test";

/// A running emulator and the files that reach it.
pub struct TestCluster {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The bearer token it requires (empty: none).
    pub token: String,
    /// A kubeconfig for it (token auth, namespace [`NAMESPACE`]).
    pub kubeconfig: PathBuf,
    /// Scratch space of the tests (stashes, copies).
    pub dir: PathBuf,
    /// The volume of the claim [`CLAIM`]: a `DATA_DIR` its pods' homes are mounted from.
    pub claim_dir: PathBuf,
    _dir: tempfile::TempDir,
}

/// The emulator of this test binary, started on first use; it requires a bearer token.
pub fn cluster() -> &'static TestCluster {
    static SHARED: OnceLock<TestCluster> = OnceLock::new();
    SHARED.get_or_init(|| start(Some(uuid::Uuid::new_v4().simple().to_string())))
}

/// An emulator without authentication, for kubectl: client-go sends credentials over TLS
/// only, and the emulator serves plain HTTP on loopback.
pub fn open_cluster() -> &'static TestCluster {
    static SHARED: OnceLock<TestCluster> = OnceLock::new();
    SHARED.get_or_init(|| start(None))
}

/// The claim the emulator's node serves: its volume is [`TestCluster::claim_dir`].
pub const CLAIM: &str = "rakazo-data";

fn start(token: Option<String>) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let claim_dir = dir.path().join("claim");
    std::fs::create_dir_all(&claim_dir).unwrap();
    let addr = Emulator::spawn(EmulatorConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: token.clone(),
        claims: [(CLAIM.to_owned(), claim_dir)].into(),
    })
    .expect("the kubernetes emulator starts");
    let url = format!("http://{addr}");
    let kubeconfig = dir.path().join("kubeconfig");
    let user = match &token {
        Some(token) => format!("  user:\n    token: {token}\n"),
        None => "  user: {}\n".to_owned(),
    };
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: tester\n    namespace: {NAMESPACE}\ncurrent-context: emulator\nusers:\n- name: tester\n{user}"
        ),
    )
    .unwrap();
    TestCluster {
        url,
        token: token.unwrap_or_default(),
        kubeconfig,
        claim_dir: dir.path().join("claim"),
        dir: dir.path().to_path_buf(),
        _dir: dir,
    }
}

/// The settings of test computers: the built-in computer image, small requests.
pub fn settings() -> KubernetesSettings {
    KubernetesSettings {
        namespace: NAMESPACE.into(),
        image: None,
        cpu_request: "100m".into(),
        cpu_limit: "2".into(),
        memory_request: "256Mi".into(),
        memory_limit: "2Gi".into(),
        home_claim: None,
    }
}

/// A fresh provider reaching the emulator through the kubeconfig.
pub fn provider() -> Arc<KubernetesProvider> {
    let c = cluster();
    let stash = c.dir.join("stash");
    Arc::new(KubernetesProvider::new(KubernetesProviderConfig {
        settings: settings(),
        kubeconfig: Some(c.kubeconfig.clone()),
        stash_dir: stash,
        screen_limit: 0,
        homes_root: c.dir.join("homes"),
        warm_stacks: 0,
    }))
}
