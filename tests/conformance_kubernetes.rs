//! The provider conformance suite for the `kubernetes` provider, through kube-rs against the
//! kubernetes emulator (pods are real containers of the computer image); and what only this
//! provider does: the pod it creates, a pod gone behind its back, stop and resume; each pod's
//! exec agent over one `pods/exec`; and the team-screens regression and the page tools over the
//! pods' gateway.

mod docker_support;
#[path = "exec_agent/checks.rs"]
mod exec_agent_checks;
mod gateway_pages;
mod kubernetes_support;
mod team_screens;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use rakazo::providers::kubernetes::{KubernetesProvider, KubernetesProviderConfig};
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
async fn scripts_in_a_pod_run_through_one_exec_agent() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("agent")).await.unwrap();
    exec_agent_checks::scripts_run_through_one_agent(&*p, &m, exec_agent_checks::AGENT).await;
    // A script gets exactly the environment it is given: nothing of the pod's own (the
    // container's `HOSTNAME`, say) comes through the agent.
    assert_eq!(
        exec_agent_checks::run(
            &*p,
            &m,
            "printenv HOSTNAME >/dev/null && echo leaked || echo clean"
        )
        .await
        .1,
        "clean\n"
    );
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn the_bot_can_kill_a_pods_agent_but_never_read_or_answer_through_its_pipes() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("agent-attack")).await.unwrap();
    exec_agent_checks::a_lost_agent_is_replaced_and_its_pipes_stay_closed(
        &*p,
        &m,
        exec_agent_checks::AGENT,
    )
    .await;
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_script_under_way_when_its_pod_is_deleted_is_told_the_machine_is_gone() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("agent-gone")).await.unwrap();
    exec_agent_checks::agent_pid(&*p, &m, exec_agent_checks::AGENT).await;
    let running = {
        let (p, m) = (p.clone(), m.clone());
        tokio::spawn(async move { p.exec(&m, &cmd("sleep 30")).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    pods()
        .await
        .delete(&m.0, &Default::default())
        .await
        .unwrap();
    let out = running.await.unwrap();
    assert_eq!(out.unwrap_err(), ProviderError::MachineGone);
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_pod_without_python_runs_scripts_through_a_pods_exec_each() {
    if !docker_ready() {
        return;
    }
    let image = exec_agent_checks::ImageWithoutPython::make();
    let c = cluster();
    let mut settings = kubernetes_support::settings();
    settings.image = Some(image.0.clone());
    let p = Arc::new(KubernetesProvider::new(KubernetesProviderConfig {
        settings,
        kubeconfig: Some(c.kubeconfig.clone()),
        stash_dir: c.dir.join("stash"),
        screen_limit: 0,
        homes_root: c.dir.join("homes"),
        warm_stacks: 0,
    }));
    let m = p.provision(&spec("nopython")).await.unwrap();
    exec_agent_checks::scripts_run_without_python(&*p, &m).await;
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_pods_screen_is_read_by_one_capture_helper_kept_for_its_display() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("capture")).await.unwrap();
    p.open_screen(&m, "bot-capture", 0).await.unwrap();
    exec_agent_checks::frames_come_from_one_kept_helper(&*p, &m, "bot-capture").await;
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_pods_pointer_input_is_played_through_xtest_in_the_kept_helper() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("xtest")).await.unwrap();
    p.open_screen(&m, "bot-xtest", 0).await.unwrap();
    exec_agent_checks::pointer_input_goes_through_xtest(&*p, &m, "bot-xtest").await;
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

/// The page tools, DevTools through the pod's gateway.
#[actix_rt::test]
async fn page_tools_reach_the_pod_browser_through_its_gateway() {
    if !docker_ready() {
        return;
    }
    gateway_pages::through_the_gateway(&*provider(), "kubernetes").await;
}

/// Files (names and SHA-256) under `dir` of a checkout, in name order.
fn digests_under(dir: &std::path::Path) -> Vec<(String, String)> {
    use sha2::Digest as _;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let mut file = std::fs::File::open(&path).unwrap();
                let mut sha = sha2::Sha256::new();
                std::io::copy(&mut file, &mut sha).unwrap();
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                out.push((rel, hex::encode(sha.finalize())));
            }
        }
    }
    out.sort();
    out
}

/// Chunk files a local store holds for a storage id.
fn chunk_files(data_dir: &std::path::Path, storage_id: &str) -> usize {
    std::fs::read_dir(
        data_dir
            .join("home-revisions")
            .join(storage_id)
            .join("chunks"),
    )
    .map_or(0, |d| d.count())
}

#[actix_rt::test]
async fn a_copied_home_streams_to_the_store_and_back_byte_for_byte() {
    use rakazo::stores::archive::Limits;
    use rakazo::stores::local::LocalHomeStore;
    use rakazo_actors::home_store::{HomeId, HomeStore, StreamSaved};
    use rakazo_actors::workspace_stream;
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&spec("stream")).await.unwrap();
    assert!(p.streams_workspace(&m).await, "a copied home streams");
    // 96 MiB of incompressible bytes in one file (cut inside its data) and small files.
    let made = p
        .exec(
            &m,
            &cmd(
                "mkdir -p data/small && head -c 96M /dev/urandom > data/big.bin && \
                  for i in $(seq 1 40); do head -c 30000 /dev/urandom > data/small/f$i; done && \
                  cd data && sha256sum big.bin small/* | sha256sum",
            ),
        )
        .await
        .unwrap();
    assert_eq!(made.exit_code, 0, "{made:?}");
    let data = tempfile::tempdir().unwrap();
    let store = LocalHomeStore::new(data.path(), 3, Limits::default());
    let home = HomeId {
        home_key: "stream-home".into(),
        storage_id: "stream-storage".into(),
        data_key: [7; 32],
    };
    let (saved, skipped) = workspace_stream::save(p.as_ref(), &m, &store, &home, 1, None, true)
        .await
        .unwrap();
    assert!(skipped.is_empty());
    let StreamSaved::Saved { saved, fingerprint } = saved else {
        panic!("a first save stores");
    };
    assert!(saved.archive_bytes > 96 << 20, "{saved:?}");
    assert!(saved.stored_bytes > 96 << 20, "{saved:?}");
    // The big file is cut inside its data: no chunk is larger than a piece.
    let chunks = chunk_files(data.path(), &home.storage_id);
    assert!(chunks >= 12, "{chunks} chunks");
    // The store's latest copy is the home, file for file.
    let copy = digests_under(&data.path().join("homes/stream-home/data"));
    assert_eq!(copy.len(), 41);

    // Unchanged: the same fingerprint, nothing stored, no revision.
    let (again, _) =
        workspace_stream::save(p.as_ref(), &m, &store, &home, 2, Some(&fingerprint), true)
            .await
            .unwrap();
    assert_eq!(again, StreamSaved::Unchanged);
    assert_eq!(store.revisions(&home).await.unwrap(), vec![1]);
    assert_eq!(chunk_files(data.path(), &home.storage_id), chunks);
    assert_eq!(
        digests_under(&data.path().join("homes/stream-home/data")),
        copy
    );

    // One small file changed: a new revision that stores only the chunk holding it.
    p.exec(&m, &cmd("echo changed > data/small/f1"))
        .await
        .unwrap();
    let (changed, _) =
        workspace_stream::save(p.as_ref(), &m, &store, &home, 2, Some(&fingerprint), true)
            .await
            .unwrap();
    let StreamSaved::Saved { saved: second, .. } = changed else {
        panic!("a changed home is saved");
    };
    assert!(second.stored_bytes < 8 << 20, "{second:?}");

    // Restored into a fresh pod, streamed: byte for byte.
    let back = p.provision(&spec("stream-back")).await.unwrap();
    workspace_stream::restore(p.as_ref(), &back, &store, &home, 1)
        .await
        .unwrap();
    let restored = p
        .exec(
            &back,
            &cmd("cd data && sha256sum big.bin small/* | sha256sum"),
        )
        .await
        .unwrap();
    assert_eq!(restored.stdout, made.stdout);
    p.destroy(&back).await.unwrap();
    p.destroy(&m).await.unwrap();
}
