//! The provider conformance suite for the `kubernetes` provider, through kube-rs against the
//! kubernetes emulator (pods are real containers of the computer image); and what only this
//! provider does: the pod it creates, a pod gone behind its back, stop and resume; and the
//! team-screens regression over the pods' gateway.

mod docker_support;
mod kubernetes_support;
mod team_screens;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use rakazo_actors::conformance::{cmd, spec};
use rakazo_actors::provider::{ProviderError, SandboxProvider};

use docker_support::docker_ready;
use kubernetes_support::{NAMESPACE, cluster, provider};

fn suite_provider() -> Arc<dyn SandboxProvider> {
    provider()
}

rakazo_actors::conformance_suite!(suite_provider(), gate = docker_ready());

async fn pods() -> Api<Pod> {
    let file = kube::config::Kubeconfig::read_from(&cluster().kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .unwrap();
    Api::namespaced(kube::Client::try_from(config).unwrap(), NAMESPACE)
}

#[actix_rt::test]
async fn the_pod_is_the_computer_image_as_uid_1000_without_a_token() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let mut s = spec("pod");
    s.bot_id = Some("bot-9".into());
    let m = p.provision(&s).await.unwrap();
    let pod = pods().await.get(&m.0).await.unwrap();
    let labels = pod.metadata.labels.clone().unwrap();
    assert_eq!(labels["app.kubernetes.io/name"], "rakazo-computer");
    assert_eq!(labels["rakazo-bot-id"], "bot-9");
    let ps = pod.spec.clone().unwrap();
    assert_eq!(ps.automount_service_account_token, Some(false));
    assert_eq!(ps.enable_service_links, Some(false));
    // Inside: uid 1000, no service account token, nothing of this process's environment.
    let out = p
        .exec(
            &m,
            &cmd("id -u; ls /var/run/secrets/kubernetes.io 2>&1 | head -1; env | grep -c '^KUBE' || true"),
        )
        .await
        .unwrap();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "1000", "{out:?}");
    assert!(lines[1].contains("No such file"), "{out:?}");
    assert_eq!(lines[2], "0", "{out:?}");
    // The pod IP answers from this host on the gateway port once the gateway runs.
    let ip = p.pod_ip(&m).await.unwrap();
    assert!(ip.starts_with("127."), "{ip}");
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_pod_deleted_behind_our_back_is_machine_gone() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let s = spec("gone");
    let m = p.provision(&s).await.unwrap();
    p.write_file(&m, "a.txt", b"a").await.unwrap();
    pods()
        .await
        .delete(&m.0, &Default::default())
        .await
        .unwrap();
    // Once the pod is gone (its container removed), the computer is gone.
    let api = pods().await;
    for _ in 0..100 {
        if api.get_opt(&m.0).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        p.exec(&m, &cmd("true")).await.unwrap_err(),
        ProviderError::MachineGone
    );
    assert_eq!(p.reconnect(&m, &s).await, Err(ProviderError::MachineGone));
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn stop_saves_the_home_and_reconnect_brings_it_back_in_a_new_pod() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let s = spec("resume");
    let m = p.provision(&s).await.unwrap();
    p.write_file(&m, "docs/kept.txt", b"kept").await.unwrap();
    let before = pods().await.get(&m.0).await.unwrap().metadata.uid;
    p.stop(&m).await.unwrap();
    p.reconnect(&m, &s).await.unwrap();
    let after = pods().await.get(&m.0).await.unwrap().metadata.uid;
    assert_ne!(before, after, "a new pod");
    assert_eq!(p.read_file(&m, "docs/kept.txt").await.unwrap(), b"kept");
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn the_team_screens_regression() {
    if !docker_ready() {
        return;
    }
    // Screens are reached on the pod IP (a loopback address of the emulator's one node).
    team_screens::over_routes(&*provider(), NAMESPACE, "http://127.").await;
}
