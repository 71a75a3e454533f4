//! The whole app on the `kubernetes` provider (kube-rs against the kubernetes emulator): a pod
//! deleted behind the API's back is replaced by a new pod holding the last checkpoint on the
//! next use.

mod common;
mod docker_support;
mod kubernetes_support;

use std::time::Duration;

use common::{Backend, TestServer};
use serde_json::json;

use docker_support::docker_ready;
use kubernetes_support::{NAMESPACE, cluster};

async fn provider_ref(s: &TestServer, computer: &serde_json::Value) -> Option<String> {
    let m = s
        .ok("computer.machine", json!({ "computerId": computer["id"] }))
        .await;
    m["providerRef"].as_str().map(str::to_owned)
}

#[actix_rt::test]
async fn a_pod_deleted_behind_our_back_is_replaced_with_the_last_checkpoint() {
    if !docker_ready() {
        return;
    }
    let c = cluster();
    let kubeconfig = c.kubeconfig.display().to_string();
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "kubernetes"),
            ("KUBECONFIG", &kubeconfig),
            ("KUBERNETES_NAMESPACE", NAMESPACE),
            ("KUBERNETES_SANDBOX_CPU_REQUEST", "100m"),
            ("KUBERNETES_SANDBOX_MEMORY_REQUEST", "256Mi"),
        ],
    )
    .await
    .expect("the app starts");
    let health = s.health().await;
    assert_eq!(health["sandbox"], "kubernetes", "{health}");
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo saved > notes.txt").await.unwrap();
    let finished = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert_eq!(finished["checkpoint"]["saved"], 1);

    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo unsaved > later.txt")
        .await
        .unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let before = provider_ref(&s, &computer).await.expect("a pod runs");

    // Deleted behind the API's back (as `kubectl delete pod` or an eviction would).
    let deleted = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .delete(format!(
            "{}/api/v1/namespaces/{NAMESPACE}/pods/{before}",
            c.url
        ))
        .bearer_auth(&c.token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 200);

    // The next use finds it gone (MACHINE_GONE) or already on its replacement.
    let mut restored = None;
    for _ in 0..60 {
        match s.exec(&run, fence, "cat notes.txt").await {
            Ok(out) => {
                restored = Some(out);
                break;
            }
            Err(err) => {
                assert!(
                    err.1 == "MACHINE_GONE" || err.1 == "COMPUTER_UNAVAILABLE",
                    "{err:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let restored = restored.expect("the computer came back");
    assert_eq!(restored["stdout"], "saved\n", "{restored}");
    let after = provider_ref(&s, &computer).await.unwrap();
    assert_ne!(after, before, "a new pod");
    // Work after the checkpoint went with the old pod.
    assert_eq!(
        s.exec(&run, fence, "cat later.txt").await.unwrap()["exitCode"],
        1
    );
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    s.ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
}
