//! Memory of a copied home's checkpoint: a `kubernetes` pod (through kube-rs against the
//! kubernetes emulator, run as its own process so only the API side is measured) whose home
//! holds one file of incompressible bytes is checkpointed into the local home store (sealed
//! chunks plus the store's unpacked copy) and restored into a fresh pod. Each leg runs in a
//! process of its own and reports its peak resident memory (`VmHWM`) before the save, after it
//! and after the restore: a 64 MiB home (the baseline) and a 1 GiB home through the streamed
//! path, and the 1 GiB home exported whole (the path before streaming) for contrast.
//! Run: `cargo bench --bench checkpoint_memory` (needs Docker and the computer image).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rakazo::config::KubernetesSettings;
use rakazo::providers::kubernetes::{KubernetesProvider, KubernetesProviderConfig};
use rakazo::stores::archive::Limits;
use rakazo::stores::local::LocalHomeStore;
use rakazo_actors::home_store::{HomeId, HomeStore, StreamSaved};
use rakazo_actors::provider::{ExecRequest, SandboxProvider, WorkspaceExport};
use rakazo_actors::workspace_stream;

const NAMESPACE: &str = "rakazo-bench";

/// This process's peak resident memory so far, in KiB.
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn exec(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(600),
    }
}

fn spec(tag: &str) -> rakazo_actors::provider::MachineSpec {
    let id = format!("bench-{tag}-{}", uuid::Uuid::new_v4().simple());
    rakazo_actors::provider::MachineSpec {
        computer_id: id.clone(),
        space_id: "bench".into(),
        bot_id: None,
        home_key: id,
    }
}

/// One leg, in this process: prints one line of JSON.
fn leg(mib: u64, whole: bool, kubeconfig: PathBuf) {
    actix_rt::System::new().block_on(async move {
        let scratch = tempfile::tempdir().unwrap();
        let p = KubernetesProvider::new(KubernetesProviderConfig {
            settings: KubernetesSettings {
                memory_limit: "4Gi".into(),
                ..support::kubernetes::settings(NAMESPACE)
            },
            kubeconfig: Some(kubeconfig),
            stash_dir: scratch.path().join("stash"),
            screen_limit: 0,
            homes_root: scratch.path().join("mounted"),
            warm_stacks: 0,
        });
        let m = p.provision(&spec("save")).await.unwrap();
        let sum = "sha256sum big.bin | cut -d' ' -f1";
        let made = p
            .exec(
                &m,
                &exec(&format!("head -c {mib}M /dev/urandom > big.bin && {sum}")),
            )
            .await
            .unwrap();
        assert_eq!(made.exit_code, 0, "{made:?}");
        let store = LocalHomeStore::new(&scratch.path().join("data"), 3, Limits::default());
        let home = HomeId {
            home_key: "bench-home".into(),
            storage_id: "bench-storage".into(),
            data_key: [5; 32],
        };
        let before = peak_kib();
        let started = Instant::now();
        if whole {
            let WorkspaceExport::Archive { workspace, .. } =
                p.export_workspace_since(&m, None).await.unwrap()
            else {
                panic!("a first export is an archive");
            };
            store.save(&home, 1, workspace, true).await.unwrap();
        } else {
            let (saved, _) = workspace_stream::save(&p, &m, &store, &home, 1, None, true)
                .await
                .unwrap();
            assert!(matches!(saved, StreamSaved::Saved { .. }));
        }
        let save_s = started.elapsed().as_secs_f64();
        let after_save = peak_kib();
        let back = p.provision(&spec("restore")).await.unwrap();
        let started = Instant::now();
        workspace_stream::restore(&p, &back, &store, &home, 1)
            .await
            .unwrap();
        let restore_s = started.elapsed().as_secs_f64();
        let after_restore = peak_kib();
        let restored = p.exec(&back, &exec(sum)).await.unwrap();
        assert_eq!(restored.stdout, made.stdout, "restored byte for byte");
        let _ = p.destroy(&back).await;
        let _ = p.destroy(&m).await;
        println!(
            "{}",
            serde_json::json!({
                "mib": mib, "whole": whole, "before_kib": before, "after_save_kib": after_save,
                "after_restore_kib": after_restore, "save_s": save_s, "restore_s": restore_s,
            })
        );
    });
}

/// Runs a leg in a child process of this binary and reads its line.
fn run_leg(mib: u64, whole: bool, kubeconfig: &Path) -> Option<serde_json::Value> {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--leg",
            &mib.to_string(),
            if whole { "whole" } else { "stream" },
        ])
        .arg(kubeconfig)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last()?).ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--leg") {
        let mib = args[i + 1].parse().unwrap();
        leg(mib, args[i + 2] == "whole", PathBuf::from(&args[i + 3]));
        return;
    }
    let emulator = support::kubernetes::EmulatorProcess::start(NAMESPACE);
    let kubeconfig = emulator.kubeconfig.clone();
    let legs = [(64, false), (1024, false), (1024, true)];
    let results: Vec<_> = legs
        .iter()
        .map(|(mib, whole)| run_leg(*mib, *whole, &kubeconfig))
        .collect();
    drop(emulator);
    let results: Vec<serde_json::Value> = results
        .into_iter()
        .zip(legs)
        .map(|(r, (mib, _))| r.unwrap_or_else(|| panic!("the {mib} MiB leg failed")))
        .collect();
    let base = results[0]["after_save_kib"].as_f64().unwrap();
    println!(
        "| leg | peak RSS before | after save | after restore | save | restore | peak / 64 MiB streamed |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &results {
        let mib = |k: &str| r[k].as_f64().unwrap() / 1024.0;
        println!(
            "| {} MiB home, {} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.2} s | {:.2} s | {:.2} |",
            r["mib"],
            if r["whole"].as_bool().unwrap() {
                "exported whole"
            } else {
                "streamed"
            },
            mib("before_kib"),
            mib("after_save_kib"),
            mib("after_restore_kib"),
            r["save_s"].as_f64().unwrap(),
            r["restore_s"].as_f64().unwrap(),
            r["after_save_kib"].as_f64().unwrap() / base,
        );
    }
}
