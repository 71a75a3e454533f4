//! The computers' seccomp profile is an allowlist: its default action refuses, a system call
//! outside the list is refused inside a computer (and answers normally without the profile),
//! and Chromium keeps its own sandbox under it: renderers run in their own user and PID
//! namespaces under an extra seccomp filter, and the browser runs without `--no-sandbox`.
//! A computer's control groups are not delegated to it, and `describe()` says desktop
//! freezing and per-desktop limits are off.

mod docker_support;

use std::time::Duration;

use rakazo::config::DockerNetwork;
use rakazo::supervisor::engine::SECCOMP_PROFILE;
use rakazo_actors::provider::{ExecRequest, MachineSpec, SandboxProvider};
use serde_json::Value;

use docker_support::{RemoveOnDrop, TestSupervisor, docker_ready};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

fn cmd(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(60),
    }
}

/// `process_madvise(-1, NULL, 0, 0, 0)`: outside the allowlist (Docker grants it only with
/// CAP_SYS_PTRACE); without a filter the kernel answers EBADF for the bad descriptor.
const PROBE_SYSCALL: &str = r#"
import ctypes, os
nr = {"x86_64": 440, "aarch64": 440}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(nr, -1, 0, 0, 0, 0)
print(r, ctypes.get_errno())
"#;

#[test]
fn the_profile_refuses_by_default() {
    let profile: Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    let allowed: Vec<&str> = profile["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "SCMP_ACT_ALLOW")
        .flat_map(|e| e["names"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    for needed in ["clone", "unshare", "chroot", "read", "execve"] {
        assert!(allowed.contains(&needed), "{needed} allowed");
    }
    for refused in [
        "process_madvise",
        "keyctl",
        "bpf",
        "userfaultfd",
        "io_uring_setup",
        "mount",
        "setns",
        "kexec_load",
        "perf_event_open",
    ] {
        assert!(!allowed.contains(&refused), "{refused} refused");
    }
}

#[actix_rt::test]
async fn chromium_keeps_its_sandbox_and_unlisted_calls_are_refused() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let space = unique("space");
    let spec = MachineSpec {
        computer_id: unique("computer"),
        space_id: space.clone(),
        bot_id: None,
        home_key: format!("team-{space}"),
    };
    let m = p.provision(&spec).await.expect("computer");
    let _gone = RemoveOnDrop(m.0.clone());

    // A call outside the list is refused in the computer...
    p.write_file(&m, "probe_syscall.py", PROBE_SYSCALL.as_bytes())
        .await
        .unwrap();
    let refused = p.exec(&m, &cmd("python3 probe_syscall.py")).await.unwrap();
    assert_eq!(
        refused.stdout.trim(),
        "-1 1",
        "EPERM from the filter: {refused:?}"
    );
    // ...and reaches the kernel in a container of the test's own without the profile.
    let out = std::process::Command::new("docker")
        .args(["run", "--rm", "--user", "1000:1000", "--cap-drop", "ALL"])
        .args(["--security-opt", "seccomp=unconfined", "--network", "none"])
        .arg(rakazo::image::default_image())
        .args(["python3", "-c", PROBE_SYSCALL])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "-1 9",
        "EBADF from the kernel"
    );

    // Chromium under the profile keeps its sandbox.
    p.write_file(
        &m,
        "sandbox_probe.py",
        include_bytes!("sandbox_probe.py").as_slice(),
    )
    .await
    .unwrap();
    // A renderer that has just started has not installed its own filter yet: the probe is
    // taken again until every renderer it finds has (or the tries run out).
    let mut procs: Vec<Value> = Vec::new();
    for _ in 0..20 {
        let probe = p.exec(&m, &cmd("python3 sandbox_probe.py")).await.unwrap();
        assert_eq!(probe.exit_code, 0, "{probe:?}");
        procs = serde_json::from_str(probe.stdout.trim()).expect("probe output");
        let filters = |kind: &str| {
            procs
                .iter()
                .filter(|p| p["type"] == kind)
                .map(|p| p["seccompFilters"].as_u64())
                .collect::<Vec<_>>()
        };
        let (browser, renderers) = (filters("browser"), filters("renderer"));
        if !renderers.is_empty() && renderers.iter().all(|r| browser.iter().all(|b| r > b)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let browser = procs
        .iter()
        .find(|p| p["type"] == "browser")
        .expect("a browser process");
    assert!(procs.iter().all(|p| p["noSandbox"] == false), "{procs:?}");
    let renderers: Vec<&Value> = procs.iter().filter(|p| p["type"] == "renderer").collect();
    assert!(!renderers.is_empty(), "a renderer: {procs:?}");
    for r in renderers {
        assert_ne!(r["ns"]["user"], browser["ns"]["user"], "own user namespace");
        assert_ne!(r["ns"]["pid"], browser["ns"]["pid"], "own PID namespace");
        assert!(
            r["seccompFilters"].as_u64() > browser["seccompFilters"].as_u64(),
            "Chromium's seccomp-bpf filter on top of the computer's: {r} vs {browser}"
        );
    }

    // The computer cannot be given control groups of its own (they are mounted read-only for
    // its user), so describe() says freezing and per-desktop limits are off.
    let cgroups = p
        .exec(&m, &cmd("mkdir /sys/fs/cgroup/rakazo-probe 2>/dev/null || mkdir /sys/fs/cgroup/freezer/rakazo-probe"))
        .await
        .unwrap();
    assert_ne!(
        cgroups.exit_code, 0,
        "control groups are not delegated: {cgroups:?}"
    );
    let caps = p.describe().capabilities;
    assert!(!caps.desktop_freezing && !caps.desktop_limits);
    p.destroy(&m).await.unwrap();
}
