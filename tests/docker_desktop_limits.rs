//! Per-desktop control groups of Docker computers: the supervisor nests one group per bot's
//! desktop under the container's own, so a memory hog costs its own tab only, an idle desktop
//! freezes and thaws on the next observe, and uid 1000 inside can neither leave its group nor
//! steer it or another desktop's. Needs a Docker engine on cgroup v1, the computer image and
//! root (the in-process supervisor writes the groups).

mod docker_support;
mod team_screens;

use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::desktop::groups::DesktopLimits;
use rakazo::providers::docker::DockerProvider;
use rakazo_actors::provider::{ProviderRef, SandboxProvider};

use docker_support::{TestSupervisor, docker_ready};
use team_screens::{cmd, team_spec};

fn limits(memory_mb: u64, freeze_after: Option<Duration>) -> DesktopLimits {
    DesktopLimits {
        cpu_weight: 100,
        memory_mb,
        freeze_after,
        hold_starts: true,
    }
}

/// Whether process `pid` (as the container numbers it) runs in the computer.
async fn alive(p: &DockerProvider, m: &ProviderRef, pid: u32) -> bool {
    let out = p
        .exec(m, &cmd(&format!("kill -0 {pid} && echo alive")))
        .await
        .unwrap();
    out.stdout.contains("alive")
}

/// The host's directory of the container's group in `controller`'s hierarchy.
fn container_group(container: &str, controller: &str) -> std::path::PathBuf {
    let out = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{.State.Pid}}", container])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let rel = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, cs, path) = (parts.next()?, parts.next()?, parts.next()?);
            cs.split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
        .unwrap();
    std::path::Path::new("/sys/fs/cgroup")
        .join(controller)
        .join(rel.trim_start_matches('/'))
}

/// The host pids whose innermost pid (as the container numbers it) is `inner`, among `pids`.
fn with_inner_pid(pids: &str, inner: u32) -> bool {
    pids.lines().any(|p| {
        std::fs::read_to_string(format!("/proc/{}/status", p.trim())).is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("NSpid:"))
                .and_then(|l| l.split_whitespace().last())
                .is_some_and(|last| last == inner.to_string())
        })
    })
}

#[actix_rt::test]
async fn a_memory_hog_loses_its_tab_while_the_other_bots_browser_survives() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider_with_limits(limits(800, None));
    assert_eq!(
        p.desktop_groups().await,
        Some(Ok("active (cgroup v1)".to_owned()))
    );
    assert!(p.describe().capabilities.desktop_limits);
    let m = p.provision(&team_spec()).await.unwrap();
    let runtime = p.runtime(&m).await.unwrap();
    p.open_screen(&m, "hog", 0).await.unwrap();
    p.open_screen(&m, "calm", 1).await.unwrap();
    let hog_browser = runtime.browser_pid("hog").await.unwrap();
    let calm_browser = runtime.browser_pid("calm").await.unwrap();
    assert_eq!(runtime.group_usage("hog").await.unwrap().oom_kills, 0);
    assert!(p.observe(&m, "hog").await.unwrap().notice.is_none());

    // Typed arrays live outside the JavaScript heap: only the desktop's ceiling stops them.
    let page = "<title>hog</title><script>const k=[];setInterval(()=>{for(let i=0;i<4;i++)k.push(new Uint8Array(16<<20).fill(7))},20)</script>";
    p.write_file(&m, "hog.html", page.as_bytes()).await.unwrap();
    p.open(&m, "hog", "hog.html").await.unwrap();
    let started = Instant::now();
    let notice = loop {
        if let Some(n) = p.observe(&m, "hog").await.unwrap().notice {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the hog never met its ceiling: {:?}",
            runtime.group_usage("hog").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(notice.contains("memory ceiling (800 MiB)"), "{notice}");
    assert!(p.observe(&m, "hog").await.unwrap().notice.is_none());
    // The tab went; the hog's browser, the other bot's browser and the computer did not.
    assert!(alive(&p, &m, hog_browser).await, "the hog's browser died");
    assert!(alive(&p, &m, calm_browser).await, "the other browser died");
    assert_eq!(runtime.browser_pid("calm").await, Some(calm_browser));
    assert_eq!(runtime.group_usage("calm").await.unwrap().oom_kills, 0);
    let frame = p.observe(&m, "calm").await.unwrap();
    assert_eq!((frame.width, frame.notice), (1280, None));
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_frozen_desktop_uses_no_cpu_and_the_next_observe_thaws_it() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider_with_limits(limits(0, Some(Duration::from_secs(1))));
    let mut freezes = p.desktop_freezes().unwrap();
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    assert!(p.describe().capabilities.desktop_freezing);
    let runtime = p.runtime(&m).await.unwrap();
    p.open_screen(&m, "sleeper", 0).await.unwrap();
    // A page that would keep a core busy if it could run.
    let page = "<script>setInterval(()=>{const t=Date.now();while(Date.now()-t<40){}},50)</script>";
    p.write_file(&m, "busy.html", page.as_bytes())
        .await
        .unwrap();
    p.open(&m, "sleeper", "busy.html").await.unwrap();
    let started = Instant::now();
    while !runtime.is_frozen("sleeper").await {
        assert!(started.elapsed() < Duration::from_secs(60), "never frozen");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The screen row follows: the provider announces the freeze for the machine.
    let change = tokio::time::timeout(Duration::from_secs(5), freezes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            change.machine.0.as_str(),
            change.bot_id.as_str(),
            change.frozen
        ),
        (m.0.as_str(), "sleeper", true)
    );

    // Read from the group itself on the host, and through the supervisor.
    let groups = container_group(&m.0, "cpuacct");
    let desktops: Vec<_> = std::fs::read_dir(&groups)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("desktop-"))
        .map(|e| e.path())
        .collect();
    assert_eq!(desktops.len(), 1, "{desktops:?}");
    let cpu = || -> u64 {
        std::fs::read_to_string(desktops[0].join("cpuacct.usage"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = (cpu(), runtime.group_usage("sleeper").await.unwrap());
    assert!(before.1.frozen);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = (cpu(), runtime.group_usage("sleeper").await.unwrap());
    assert!(after.1.frozen);
    assert_eq!(after.0, before.0, "a frozen desktop used CPU");
    assert_eq!(after.1.cpu_ns, before.1.cpu_ns);

    let frame = p.observe(&m, "sleeper").await.unwrap();
    assert_eq!((frame.width, frame.height), (1280, 800));
    assert!(!runtime.group_usage("sleeper").await.unwrap().frozen);
    let change = tokio::time::timeout(Duration::from_secs(5), freezes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((change.bot_id.as_str(), change.frozen), ("sleeper", false));
    // Thawed, its page runs again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(cpu() > after.0);
    let started = Instant::now();
    while !runtime.is_frozen("sleeper").await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never frozen again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new API process taking the computer over thaws what the old one left frozen, so it
    // can stop those leftovers; the computer is then removed.
    let state = desktops[0]
        .to_string_lossy()
        .replace("/cpuacct/", "/freezer/");
    let state = std::path::Path::new(&state).join("freezer.state");
    assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "FROZEN");
    let next = sup.provider_with_limits(limits(0, None));
    next.reconnect(&m, &spec).await.unwrap();
    assert_eq!(std::fs::read_to_string(&state).unwrap().trim(), "THAWED");
    next.destroy(&m).await.unwrap();
}

/// The attacker is the bot: a process its desktop starts later, without the desktop's tag, as
/// uid 1000, tries to leave its group, lift its limits, thaw or freeze groups and join the
/// other desktop's group.
#[actix_rt::test]
async fn a_later_process_stays_in_its_group_and_cannot_leave_or_steer_any() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider_with_limits(limits(1024, None));
    let m = p.provision(&team_spec()).await.unwrap();
    p.open_screen(&m, "a", 0).await.unwrap();
    p.open_screen(&m, "b", 1).await.unwrap();
    let attack = r#"sleep 2; exec env -u RAKAZO_DESKTOP_TAG sh -c '
{
  echo "pid $$"; echo "before $(grep freezer /proc/self/cgroup)"
  for c in cpu cpuacct memory freezer; do
    echo $$ > /sys/fs/cgroup/$c/cgroup.procs 2>/dev/null && echo "escaped $c"
    echo THAWED > /sys/fs/cgroup/$c/freezer.state 2>/dev/null && echo "wrote $c top"
  done
  for d in /sys/fs/cgroup/*/desktop-*; do
    echo $$ > $d/cgroup.procs 2>/dev/null && echo "joined $d"
    echo -1 > $d/memory.limit_in_bytes 2>/dev/null && echo "wrote $d"
    echo 262144 > $d/cpu.shares 2>/dev/null && echo "wrote $d"
    echo FROZEN > $d/freezer.state 2>/dev/null && echo "wrote $d"
  done
  echo "after $(grep freezer /proc/self/cgroup)"; echo done
} > /home/rakazo/attack.txt 2>&1
exec sleep 120'"#;
    p.launch(&m, "a", &["sh".into(), "-c".into(), attack.into()])
        .await
        .unwrap();
    let started = Instant::now();
    let said = loop {
        if let Ok(b) = p.read_file(&m, "attack.txt").await
            && String::from_utf8_lossy(&b).contains("done")
        {
            break String::from_utf8_lossy(&b).into_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no report");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for refused in ["escaped", "joined", "wrote"] {
        assert!(!said.contains(refused), "{said}");
    }
    let line = |key: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (before, after) = (line("before "), line("after "));
    assert!(
        before.contains("/desktop-"),
        "not in a desktop group: {said}"
    );
    assert_eq!(before, after, "it left its group");
    let pid: u32 = line("pid ").parse().unwrap();

    // On the host: the process is in desktop a's group (with a's browser), not in b's, and the
    // groups kept their limits.
    let freezer = container_group(&m.0, "freezer");
    let memory = container_group(&m.0, "memory");
    let name = before.rsplit('/').next().unwrap().to_owned();
    let runtime = p.runtime(&m).await.unwrap();
    let procs = std::fs::read_to_string(freezer.join(&name).join("cgroup.procs")).unwrap();
    assert!(with_inner_pid(&procs, pid), "not in its group on the host");
    let browser_a = runtime.browser_pid("a").await.unwrap();
    let browser_b = runtime.browser_pid("b").await.unwrap();
    assert!(with_inner_pid(&procs, browser_a));
    assert!(!with_inner_pid(&procs, browser_b));
    let mut others = 0;
    for entry in std::fs::read_dir(&freezer).unwrap().flatten() {
        let n = entry.file_name().to_string_lossy().into_owned();
        if !n.starts_with("desktop-") {
            continue;
        }
        assert_eq!(
            std::fs::read_to_string(entry.path().join("freezer.state"))
                .unwrap()
                .trim(),
            "THAWED"
        );
        let limit = std::fs::read_to_string(memory.join(&n).join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (1024u64 << 20).to_string());
        if n != name {
            others += 1;
            let procs = std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap();
            assert!(!with_inner_pid(&procs, pid));
            assert!(with_inner_pid(&procs, browser_b));
        }
    }
    assert_eq!(others, 1);

    // Without the supervisor's token nobody reaches the desktop routes.
    let url = format!("{}/v1/computers/{}/desktops/{name}/thaw", sup.url, m.0);
    let http = reqwest::Client::new();
    for token in ["", "wrong"] {
        let status = http
            .post(&url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED);
    }
    let status = http
        .put(format!(
            "{}/v1/computers/{}/desktops/desktop-..%2F..",
            sup.url, m.0
        ))
        .bearer_auth(&sup.token)
        .json(&serde_json::json!({"tag": "x", "cpuWeight": 100, "memoryMb": 0}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST);
    let _ = p.exec(&m, &cmd("pkill -f 'sleep 120'")).await;
    p.destroy(&m).await.unwrap();
}

/// A supervisor that cannot delegate control groups says so; desktops then run without them.
#[actix_rt::test]
async fn without_delegated_groups_health_says_so_and_desktops_still_run() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start_without_desktop_groups("cgroup v2 on this host");
    let p = sup.provider_with_limits(limits(800, Some(Duration::from_secs(1))));
    assert_eq!(
        p.desktop_groups().await,
        Some(Err("unavailable: cgroup v2 on this host".to_owned()))
    );
    let caps = p.describe().capabilities;
    assert!(!caps.desktop_limits && !caps.desktop_freezing);
    let m = p.provision(&team_spec()).await.unwrap();
    p.open_screen(&m, "bot", 0).await.unwrap();
    let runtime = p.runtime(&m).await.unwrap();
    assert!(runtime.group_usage("bot").await.is_err());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!runtime.is_frozen("bot").await);
    let frame = p.observe(&m, "bot").await.unwrap();
    assert_eq!((frame.width, frame.notice), (1280, None));
    p.destroy(&m).await.unwrap();
}
