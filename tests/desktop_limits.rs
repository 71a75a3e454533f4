//! Per-desktop control groups on the host `desktop` provider: memory ceilings that cost a tab,
//! not the computer; freezing idle desktops; and what a process inside a group cannot do.
//!
//! Needs root and cgroup v1 or v2 with the cpu, memory and freezer controllers (the machine's
//! own groups, under this test process's), and the packages of
//! `scripts/install-desktop-deps.sh`. Tests run one at a time.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rakazo::desktop::cgroup::{Node, Phase, Usage, group_name, hold_for_phase};
use rakazo::desktop::command::{TAG_VAR, sweep_script};
use rakazo::desktop::groups::{DesktopLimits, host_parent};
use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo_actors::provider::{MachineSpec, ProviderRef, SandboxProvider};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Kills every process the test's runtimes started, even when the test fails halfway.
struct Sweep(std::path::PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        let script = sweep_script(&format!("{}/", self.0.display()));
        let _ = Command::new("bash").arg("-c").arg(script).status();
    }
}

fn provider(dir: &std::path::Path, first_display: u32, limits: DesktopLimits) -> DesktopProvider {
    DesktopProvider::new(DesktopProviderConfig {
        homes_root: dir.join("homes"),
        run_root: dir.join("run"),
        screen_limit: 0,
        first_display,
        environment: "test".into(),
        limits: Some(limits),
        warm_stacks: 0,
        start_nice: 0,
    })
    .unwrap()
}

async fn machine(p: &DesktopProvider, key: &str) -> ProviderRef {
    p.provision(&MachineSpec {
        computer_id: key.into(),
        space_id: "s".into(),
        bot_id: None,
        home_key: key.into(),
    })
    .await
    .unwrap()
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim().starts_with('Z'))
}

#[tokio::test]
async fn a_memory_hog_loses_its_tab_while_the_other_desktop_keeps_its_browser() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().join("run"));
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 800,
        freeze_after: None,
        hold_starts: true,
    };
    let p = provider(dir.path(), 161, limits);
    assert!(p.describe().capabilities.desktop_limits);
    assert_eq!(
        p.desktop_groups().await.unwrap().unwrap().split(' ').next(),
        Some("active")
    );
    let m = machine(&p, "team-limits").await;
    let runtime = p.runtime(&m).await.unwrap();
    p.open_screen(&m, "hog", 0).await.unwrap();
    p.open_screen(&m, "calm", 1).await.unwrap();
    let hog_browser = runtime.browser_pid("hog").await.unwrap();
    let calm_browser = runtime.browser_pid("calm").await.unwrap();
    assert_eq!(runtime.group_usage("hog").await.unwrap().oom_kills, 0);
    assert!(p.observe(&m, "hog").await.unwrap().notice.is_none());

    // A page that keeps taking memory (typed arrays live outside the JavaScript heap, so only
    // the desktop's ceiling stops it).
    let page = "<title>hog</title><script>const k=[];setInterval(()=>{for(let i=0;i<4;i++)k.push(new Uint8Array(16<<20).fill(7))},20)</script>";
    p.write_file(&m, "hog.html", page.as_bytes()).await.unwrap();
    p.open(&m, "hog", "hog.html").await.unwrap();
    let started = Instant::now();
    let notice = loop {
        let frame = p.observe(&m, "hog").await.unwrap();
        if let Some(n) = frame.notice {
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
    assert!(notice.contains("reload"), "{notice}");
    // Told once.
    assert!(p.observe(&m, "hog").await.unwrap().notice.is_none());
    // The tab went, not the hog's browser, and not the other desktop.
    assert!(running(hog_browser), "the hog's browser itself was killed");
    assert!(running(calm_browser));
    assert_eq!(runtime.browser_pid("calm").await, Some(calm_browser));
    assert_eq!(runtime.group_usage("calm").await.unwrap().oom_kills, 0);
    let frame = p.observe(&m, "calm").await.unwrap();
    assert_eq!((frame.width, frame.notice), (1280, None));
    p.destroy(&m).await.unwrap();
}

#[tokio::test]
async fn an_idle_desktop_freezes_uses_no_cpu_and_thaws_on_the_next_observe() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().join("run"));
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 0,
        freeze_after: Some(Duration::from_secs(1)),
        hold_starts: true,
    };
    let p = provider(dir.path(), 171, limits);
    assert!(p.describe().capabilities.desktop_freezing);
    let m = machine(&p, "team-freeze").await;
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
    let before: Usage = runtime.group_usage("sleeper").await.unwrap();
    assert!(before.frozen);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = runtime.group_usage("sleeper").await.unwrap();
    assert!(after.frozen);
    assert_eq!(after.cpu_ns, before.cpu_ns, "a frozen desktop used CPU");

    let frame = p.observe(&m, "sleeper").await.unwrap();
    assert_eq!((frame.width, frame.height), (1280, 800));
    assert!(!runtime.group_usage("sleeper").await.unwrap().frozen);
    // Thawed, its page runs again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let running_again = runtime.group_usage("sleeper").await.unwrap();
    assert!(running_again.cpu_ns > after.cpu_ns);
    // A viewer keeps it awake: with a live capability it is not frozen again.
    let route = p
        .open_route(&m, "sleeper", rakazo_actors::provider::ScreenPolicy::View)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!runtime.is_frozen("sleeper").await);
    p.close_route(&m, &route.token).await.unwrap();
    let started = Instant::now();
    while !runtime.is_frozen("sleeper").await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never frozen again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Teardown of a frozen desktop still stops everything and removes its group.
    p.destroy(&m).await.unwrap();
}

/// Shell lines that wait (up to 20 s) until the shell itself sits in an `attack-` group, so a
/// slow placement on a busy machine is not mistaken for an escape.
const WAIT_PLACED: &str =
    "for i in $(seq 200); do grep -q attack- /proc/self/cgroup && break; sleep 0.1; done;";

/// A process the desktop starts later stays in its group (without the tag, too), and a process
/// of the workspace user can neither leave it nor change its limits or freezer.
#[tokio::test]
async fn a_process_inside_cannot_leave_or_steer_its_group() {
    let _serial = SERIAL.lock().await;
    let parent = host_parent().unwrap();
    let node: Node = parent.child(&format!("attack-{}", std::process::id()));
    node.create().unwrap();
    let tag = format!("/attack/{}", std::process::id());
    // Forks an untagged child a moment after it is placed, and prints that child's pid.
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{WAIT_PLACED} env -u RAKAZO_DESKTOP_TAG sleep 60 & echo $!; wait"
        ))
        .env(TAG_VAR, &tag)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(node.place_tagged(&tag, None).unwrap() >= 1);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(shell.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let child: u32 = line.trim().parse().unwrap();
    assert!(
        node.procs().unwrap().contains(&child),
        "the child left the group"
    );

    // The workspace user (uid 1000) tries to move itself out, lift the ceiling and thaw.
    let dirs = ["memory", "freezer", "cpu", "cpuset"]
        .map(|c| format!("/sys/fs/cgroup/{c}"))
        .to_vec();
    let script = format!(
        "{WAIT_PLACED} grep -q attack- /proc/self/cgroup || echo not-inside
         for d in {dirs}; do echo $$ > $d/cgroup.procs && echo escaped $d; done
         for f in $(find {dirs} -path '*attack-{pid}*' -name 'memory.limit_in_bytes' -o -path '*attack-{pid}*' -name freezer.state -o -path '*attack-{pid}*' -name cpu.shares -o -path '*attack-{pid}*' -name cpuset.cpus 2>/dev/null); do
           echo 1 > $f 2>/dev/null && echo wrote $f
         done; exit 0",
        dirs = dirs.join(" "),
        pid = std::process::id()
    );
    let attacker = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "sh", "-c"])
        .arg(&script)
        .env(TAG_VAR, &tag)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(node.place_tagged(&tag, None).unwrap() >= 1);
    let out = attacker.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !said.contains("escaped") && !said.contains("wrote") && !said.contains("not-inside"),
        "{said}"
    );

    let _ = Command::new("kill").arg(child.to_string()).status();
    let _ = shell.kill();
    let _ = shell.wait();
    node.remove().unwrap();
}

/// The CPUs process `pid` may run on, as the kernel lists them.
fn allowed_cpus(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned()
}

/// A desktop starting while another is at work runs on every CPU but the first, and on all of
/// them once at work; alone, or beside a frozen desktop, it is not held.
#[tokio::test]
async fn a_starting_desktop_is_held_off_the_first_cpu_while_another_works() {
    let _serial = SERIAL.lock().await;
    let scope = host_parent()
        .unwrap()
        .child(&format!("hold-{}", std::process::id()));
    scope.create().unwrap();
    let (work, start) = (
        scope.child(&group_name("/hold/work")),
        scope.child(&group_name("/hold/start")),
    );
    work.create().unwrap();
    start.create().unwrap();
    let cpus = start
        .parent_cpus()
        .expect("the cpuset controller reaches desktop groups");
    assert!(cpus.len() > 1, "this test needs two CPUs: {cpus:?}");
    let all = rakazo::desktop::cgroup::format_cpu_list(&cpus);
    let rest = rakazo::desktop::cgroup::format_cpu_list(&cpus[1..]);
    let mut starting = Command::new("sleep").arg("60").spawn().unwrap();
    start.place(starting.id()).unwrap();
    let canonical = |pid| {
        rakazo::desktop::cgroup::parse_cpu_list(&allowed_cpus(pid))
            .map(|c| rakazo::desktop::cgroup::format_cpu_list(&c))
            .unwrap()
    };

    // Alone: the other group holds no process.
    assert!(!hold_for_phase(&start, &scope, 1, Phase::Starting));
    assert_eq!(canonical(starting.id()), all);

    let mut working = Command::new("sleep").arg("60").spawn().unwrap();
    work.place(working.id()).unwrap();
    assert!(work.is_at_work());
    assert!(hold_for_phase(&start, &scope, 1, Phase::Starting));
    assert_eq!(canonical(starting.id()), rest);
    assert!(!start.is_at_work(), "a held desktop is not at work");
    // The desktop at work keeps every CPU, and a held one does not hold it in turn.
    assert!(!hold_for_phase(&work, &scope, 1, Phase::Starting));
    assert_eq!(canonical(working.id()), all);

    // Once at work, every CPU again.
    assert!(!hold_for_phase(&start, &scope, 1, Phase::AtWork));
    assert_eq!(canonical(starting.id()), all);

    // Beside a frozen desktop, a start is not held.
    work.set_frozen(true).unwrap();
    assert!(!hold_for_phase(&start, &scope, 1, Phase::Starting));
    work.set_frozen(false).unwrap();

    for child in [&mut starting, &mut working] {
        let _ = child.kill();
        let _ = child.wait();
    }
    work.remove().unwrap();
    start.remove().unwrap();
    scope.remove().unwrap();
}

/// A process caught between changing its user and starting its next program (its environment
/// reads empty then) is still found by its tag: twenty times in a row, read straight after
/// spawning.
#[tokio::test]
async fn a_process_changing_its_user_is_placed_all_the_same() {
    let _serial = SERIAL.lock().await;
    let parent = host_parent().unwrap();
    let node: Node = parent.child(&format!("setpriv-{}", std::process::id()));
    node.create().unwrap();
    let tag = format!("/setpriv/{}", std::process::id());
    for round in 0..20 {
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "sleep",
                "30",
            ])
            .env(TAG_VAR, &tag)
            .spawn()
            .unwrap();
        // Only the child is scanned, so it is read at once, as a busy machine's scan may: once
        // it runs `setpriv` (before, it is this test's fork, whose environment has no tag yet;
        // the runtime's spawn waits for the tag for that reason).
        let pid = child.id();
        let cmdline = format!("/proc/{pid}/cmdline");
        for _ in 0..1000 {
            match std::fs::read(&cmdline) {
                Ok(argv) if argv.starts_with(b"setpriv\0") || argv.starts_with(b"sleep\0") => break,
                _ => std::thread::sleep(std::time::Duration::from_micros(200)),
            }
        }
        let moved = node.place_tagged(&tag, Some(&move || vec![pid])).unwrap();
        let inside = node.procs().unwrap().contains(&child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            moved >= 1 && inside,
            "round {round}: moved {moved}, inside {inside}"
        );
    }
    node.remove().unwrap();
}

async fn screen_state(s: &common::TestServer, bot: &str) -> Option<String> {
    use rakazo_actors::entity::screen;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    screen::Entity::find()
        .filter(screen::Column::BotId.eq(bot))
        .one(&s.app.db)
        .await
        .unwrap()
        .map(|r| r.state)
}

/// Through the whole app: health says the groups are active, the bot's screen row turns
/// `frozen` when its desktop is frozen, and the bot's next `computer_observe` thaws it and
/// returns a frame.
#[actix_rt::test]
async fn the_screen_row_says_frozen_and_the_next_observe_thaws_it() {
    let _serial = SERIAL.lock().await;
    let s = common::TestServer::start(
        common::Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "desktop"),
            ("RAKAZO_ENV", "test"),
            ("SANDBOX_DESKTOP_FREEZE_MS", "1000"),
        ],
    )
    .await
    .unwrap();
    let health = s.health().await;
    assert!(
        health["desktopGroups"]
            .as_str()
            .unwrap()
            .starts_with("active (cgroup v"),
        "{health}"
    );
    let (_, bots) = s.space_with_bots(1, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let observe = serde_json::json!({ "runId": run, "fence": fence, "name": "computer_observe", "arguments": {} });
    let first = s.ok("tools/call", observe.clone()).await;
    assert_eq!(first["isError"], false, "{first}");
    let started = Instant::now();
    while screen_state(&s, &bots[0]).await.as_deref() != Some("frozen") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the row never said frozen"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = s.ok("tools/call", observe).await;
    assert_eq!(next["isError"], false, "{next}");
    assert_eq!(next["structuredContent"]["width"], 1280);
    let started = Instant::now();
    while screen_state(&s, &bots[0]).await.as_deref() != Some("active") {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the row never said active again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
