//! The whole app on the `kubernetes` provider (kube-rs against the kubernetes emulator): a pod
//! deleted behind the API's back is replaced by a new pod holding the last checkpoint on the
//! next use; with `KUBERNETES_SANDBOX_HOME_CLAIM`, pods mount their home from the claim that
//! holds `DATA_DIR` and nothing is copied.

mod common;
mod docker_support;
mod kubernetes_support;

use std::time::Duration;

use common::{Backend, TestServer};
use serde_json::json;

use docker_support::docker_ready;
use kubernetes_support::{CLAIM, NAMESPACE, cluster};

async fn provider_ref(s: &TestServer, computer: &serde_json::Value) -> Option<String> {
    let m = s
        .ok("computer.machine", json!({ "computerId": computer["id"] }))
        .await;
    m["providerRef"].as_str().map(str::to_owned)
}

/// Ends a run as completed; the answer (with its checkpoint).
async fn finish(s: &TestServer, run: &str, fence: i64) -> serde_json::Value {
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await
}

/// The app on SQLite with the `kubernetes` provider against the emulator, and `extra`.
async fn kube_server(extra: &[(&str, &str)]) -> TestServer {
    let kubeconfig = cluster().kubeconfig.display().to_string();
    let mut env = vec![
        ("SANDBOX_PROVIDER", "kubernetes"),
        ("KUBECONFIG", kubeconfig.as_str()),
        ("KUBERNETES_NAMESPACE", NAMESPACE),
        ("KUBERNETES_SANDBOX_CPU_REQUEST", "100m"),
        ("KUBERNETES_SANDBOX_MEMORY_REQUEST", "256Mi"),
    ];
    env.extend_from_slice(extra);
    TestServer::start(Backend::Sqlite, &env)
        .await
        .expect("the app starts")
}

#[actix_rt::test]
async fn a_pod_deleted_behind_our_back_is_replaced_with_the_last_checkpoint() {
    if !docker_ready() {
        return;
    }
    let s = kube_server(&[]).await;
    let health = s.health().await;
    assert_eq!(health["sandbox"], "kubernetes", "{health}");
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo saved > notes.txt").await.unwrap();
    let finished = finish(&s, &run, fence).await;
    assert_eq!(finished["checkpoint"]["saved"], 1);

    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo unsaved > later.txt")
        .await
        .unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let before = provider_ref(&s, &computer).await.expect("a pod runs");

    // Deleted behind the API's back (as `kubectl delete pod` or an eviction would); the next
    // use finds it gone (MACHINE_GONE) or already on its replacement.
    delete_pod(&before).await;
    let restored = exec_when_back(&s, &run, fence, "cat notes.txt").await;
    assert_eq!(restored["stdout"], "saved\n", "{restored}");
    let after = provider_ref(&s, &computer).await.unwrap();
    assert_ne!(after, before, "a new pod");
    // Work after the checkpoint went with the old pod.
    assert_eq!(
        s.exec(&run, fence, "cat later.txt").await.unwrap()["exitCode"],
        1
    );
    finish(&s, &run, fence).await;
    s.ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
}

fn emulator_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn get_pod(name: &str) -> serde_json::Value {
    let c = cluster();
    emulator_client()
        .get(format!(
            "{}/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            c.url
        ))
        .bearer_auth(&c.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A pod standing for the API's own, which holds the claim's volume: computer pods have a
/// required affinity to it.
async fn start_api_pod(labels: serde_json::Value) -> String {
    let c = cluster();
    let name = format!("api-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": { "containers": [{
            "name": "api",
            "image": rakazo::image::default_image(),
            "command": ["bash", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
        }]}
    });
    let created = emulator_client()
        .post(format!("{}/api/v1/namespaces/{NAMESPACE}/pods", c.url))
        .bearer_auth(&c.token)
        .json(&pod)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    name
}

async fn delete_pod(name: &str) {
    let c = cluster();
    let deleted = emulator_client()
        .delete(format!(
            "{}/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            c.url
        ))
        .bearer_auth(&c.token)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 200);
}

/// Retries `command` while the computer comes back (`MACHINE_GONE` or unavailable).
async fn exec_when_back(s: &TestServer, run: &str, fence: i64, command: &str) -> serde_json::Value {
    for _ in 0..120 {
        match s.exec(run, fence, command).await {
            Ok(out) => return out,
            Err(err) => {
                assert!(
                    err.1 == "MACHINE_GONE" || err.1 == "COMPUTER_UNAVAILABLE",
                    "{err:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    panic!("the computer did not come back");
}

#[actix_rt::test]
async fn a_mounted_home_is_never_copied_and_outlives_its_pods() {
    if !docker_ready() {
        return;
    }
    let c = cluster();
    // The claim holds DATA_DIR, as the API's own volume does in a cluster.
    let data_dir = c.claim_dir.display().to_string();
    let app = format!(
        "rakazo-api-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let labels = json!({ "app": app }).to_string();
    let api_pod = start_api_pod(json!({ "app": app })).await;
    let s = kube_server(&[
        ("DATA_DIR", &data_dir),
        ("KUBERNETES_SANDBOX_HOME_CLAIM", CLAIM),
        ("KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE", NAMESPACE),
        ("KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS", &labels),
    ])
    .await;
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo mounted > notes.txt")
        .await
        .unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let first = provider_ref(&s, &computer).await.expect("a pod runs");
    let first_uid = get_pod(&first).await["metadata"]["uid"].clone();

    // The pod mounts homes/<home key> of the claim, with fsGroup 1000 and the affinity.
    let pod = get_pod(&first).await;
    let spec = &pod["spec"];
    assert_eq!(
        spec["volumes"][0]["persistentVolumeClaim"]["claimName"], CLAIM,
        "{pod}"
    );
    let sub = spec["containers"][0]["volumeMounts"][0]["subPath"]
        .as_str()
        .expect("a sub-path")
        .to_owned();
    assert!(sub.starts_with("homes/"), "{sub}");
    assert_eq!(spec["securityContext"]["fsGroup"], 1000);
    assert_eq!(
        spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
            ["matchLabels"]["app"],
        app.as_str()
    );
    // What the bot wrote is on the claim itself: nothing was copied.
    let home = c.claim_dir.join(&sub);
    assert_eq!(
        std::fs::read_to_string(home.join("notes.txt")).unwrap(),
        "mounted\n"
    );

    // A checkpoint reads the mounted home on this host; with nothing changed, the next one
    // stores nothing (once the last write is older than the clock's racy window).
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let finished = finish(&s, &run, fence).await;
    assert_eq!(finished["checkpoint"]["saved"], 1, "{finished}");
    let (run, fence) = s.start_run(&bots[0]).await;
    let finished = finish(&s, &run, fence).await;
    assert_eq!(finished["checkpoint"]["unchanged"], true, "{finished}");

    // The bot's links never lead this process out of the home.
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "ln -s /etc/hostname escape")
        .await
        .unwrap();
    let read = s
        .call(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": "read_file", "arguments": { "path": "escape" } }),
        )
        .await;
    let refused = match &read {
        Err(err) => err.1.clone(),
        Ok(v) => v["structuredContent"]["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
    };
    assert_eq!(refused, "PATH_REJECTED", "{read:?}");
    s.exec(&run, fence, "rm escape").await.unwrap();

    // Stopped: the pod goes, the home stays on the claim, nothing is stashed; the next pod
    // mounts it again.
    finish(&s, &run, fence).await;
    s.ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
    let stash = c.claim_dir.join("run").join("kubernetes");
    let stashed = std::fs::read_dir(&stash).map(|d| d.count()).unwrap_or(0);
    assert_eq!(stashed, 0, "nothing is stashed for a mounted home");
    assert!(home.join("notes.txt").exists());
    let (run, fence) = s.start_run(&bots[0]).await;
    let out = exec_when_back(&s, &run, fence, "cat notes.txt").await;
    assert_eq!(out["stdout"], "mounted\n", "{out}");
    let second = provider_ref(&s, &computer).await.unwrap();
    assert_ne!(
        get_pod(&second).await["metadata"]["uid"],
        first_uid,
        "a new pod (of the same name)"
    );

    // A pod deleted behind our back takes nothing with it: its replacement mounts the same
    // home, unsaved work included.
    s.exec(&run, fence, "echo unsaved > later.txt")
        .await
        .unwrap();
    delete_pod(&second).await;
    let out = exec_when_back(&s, &run, fence, "cat later.txt").await;
    assert_eq!(out["stdout"], "unsaved\n", "{out}");
    finish(&s, &run, fence).await;
    s.ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
    delete_pod(&api_pod).await;
}
