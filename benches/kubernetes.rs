//! Kubernetes computers benchmark, through kube-rs against the kubernetes emulator in its own
//! process (pods are containers of the computer image, `pods/exec` a Docker exec): scripts through the provider
//! (the pod's exec agent) beside the same script as a bare `pods/exec`, as `kubectl exec` runs
//! it, in turns; and the time from a provision request to the first screenshot of a bot's
//! desktop (every step of the desktop's start is a script), and `computer_act` of ten pointer
//! moves with its settled frame on a live desktop. Needs a Docker engine and the computer
//! image. Results are recorded in `BENCHMARKS.md`.
//!
//! Run: `cargo bench --profile dev --bench kubernetes`.

mod support;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use rakazo::providers::kubernetes::{KubernetesProvider, KubernetesProviderConfig};
use rakazo_actors::provider::SandboxProvider;
use tokio::io::AsyncReadExt;

const NAMESPACE: &str = "rakazo-bench";
/// Scripts timed per path.
const SCRIPTS: usize = 100;
/// Provision-to-first-screenshot rounds.
const ROUNDS: usize = 3;
/// Observes timed on a live desktop.
const OBSERVES: usize = 20;
/// Acts timed on a live desktop.
const ACTS: usize = 20;

/// The same script the provider's `shell` runs, as one bare `pods/exec` read to its end.
async fn bare_exec(api: &Api<Pod>, pod: &str) {
    let params = AttachParams::default().stdout(true).stderr(true);
    let argv = ["bash", "-c", "exec bash -lc true"];
    let mut proc = api.exec(pod, argv, &params).await.expect("pods/exec");
    let status = proc.take_status();
    let (mut out, mut err) = (proc.stdout().unwrap(), proc.stderr().unwrap());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let _ = tokio::join!(out.read_to_end(&mut a), err.read_to_end(&mut b));
    if let Some(status) = status {
        status.await;
    }
    let _ = proc.join().await;
}

async fn scripts(p: &KubernetesProvider, api: &Api<Pod>) {
    let m = p
        .provision(&support::machine_spec("exec"))
        .await
        .expect("provision");
    support::scripts_in_turns(
        p,
        &m,
        SCRIPTS,
        (
            "the provider's exec (the pod's exec agent)",
            "the same script as a bare `pods/exec` (kube-rs)",
        ),
        || bare_exec(api, &m.0),
    )
    .await;
    p.destroy(&m).await.unwrap();
}

fn main() {
    let image = support::require_image("kubernetes");
    let emulator = support::kubernetes::EmulatorProcess::start(NAMESPACE);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = emulator.kubeconfig.clone();
    let rt = actix_rt::System::new();
    rt.block_on(async move {
        let p = Arc::new(KubernetesProvider::new(KubernetesProviderConfig {
            settings: support::kubernetes::settings(NAMESPACE),
            kubeconfig: Some(kubeconfig.clone()),
            stash_dir: dir.path().join("stash"),
            screen_limit: 0,
            homes_root: dir.path().join("homes"),
            warm_stacks: 0,
        }));
        let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        let api: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), NAMESPACE);
        println!("kubernetes bench ({image} pods on the kubernetes emulator, its own process)");
        scripts(&p, &api).await;
        if std::env::var("BENCH_ONLY").as_deref() != Ok("exec") {
            support::first_screenshots(&*p, "command path (pods/exec)", ROUNDS, OBSERVES).await;
            support::acts(&*p, "command path (pods/exec)", ACTS).await;
        }
    });
    drop(emulator);
}
