//! Per-desktop control groups on the host `desktop` provider: memory ceilings that cost a tab,
//! not the computer; freezing idle desktops; and what a process inside a group cannot do.
//!
//! Needs root and cgroup v1 or v2 with the cpu, memory and freezer controllers (the machine's
//! own groups, under this test process's), and the packages of
//! `scripts/install-desktop-deps.sh`. Tests run one at a time.

mod common;

use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rakazo::desktop::cgroup::{Node, Phase, Usage, Version, group_name, hold_for_phase};
use rakazo::desktop::command::{CommandRunner, HostRunner, SpawnSpec, TAG_VAR, sweep_script};
use rakazo::desktop::groups::{DesktopLimits, HostGroups, host_parent};
use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo::desktop::runtime::{DesktopRuntime, RuntimeConfig};
use rakazo::desktop::start_group::{host_group, joins_for_phase, weigh_for_phase, weight_of_nice};
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
    assert!(!hold_for_phase(&work, &scope, 1, Phase::AtWork));

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

/// Starts are held only while they fit the CPUs they are held to: on 2 CPUs, one desktop
/// starting beside one at work is held, two are not (the one held before is let go at its next
/// entry), and one said to be starting never counts as at work, though it holds processes
/// that no entry of its own has held yet (as when eight open at once).
#[tokio::test]
async fn starts_beyond_the_cpus_they_would_be_held_to_are_not_held() {
    let _serial = SERIAL.lock().await;
    let scope = host_parent()
        .unwrap()
        .child(&format!("crowd-{}", std::process::id()));
    scope.create().unwrap();
    let [work, first, second] =
        ["work", "first", "second"].map(|n| scope.child(&group_name(&format!("/crowd/{n}"))));
    let mut sleepers = Vec::new();
    let mut occupy = |node: &Node| {
        let sleeper = Command::new("sleep").arg("60").spawn().unwrap();
        node.place(sleeper.id()).unwrap();
        sleepers.push(sleeper);
    };
    for node in [&work, &first, &second] {
        node.create().unwrap();
    }
    let cpus = first
        .parent_cpus()
        .expect("the cpuset controller reaches desktop groups");
    assert_eq!(cpus.len(), 2, "this test counts on two CPUs: {cpus:?}");

    // Two say they start before their first process, as the host's desktops do: once both
    // hold processes, neither is at work for the other.
    assert!(!hold_for_phase(&first, &scope, 1, Phase::Starting));
    assert!(!hold_for_phase(&second, &scope, 1, Phase::Starting));
    occupy(&first);
    occupy(&second);
    assert!(!hold_for_phase(&first, &scope, 1, Phase::Starting));
    assert!(!hold_for_phase(&second, &scope, 1, Phase::Starting));
    // One at work: two starting would share the one CPU left to them, so neither is held.
    occupy(&work);
    assert!(!hold_for_phase(&work, &scope, 1, Phase::AtWork));
    assert!(work.is_at_work());
    assert!(!hold_for_phase(&first, &scope, 1, Phase::Starting));
    // The second at work too: the first, alone starting, is held, then let go once a second
    // start begins.
    assert!(!hold_for_phase(&second, &scope, 1, Phase::AtWork));
    assert!(hold_for_phase(&first, &scope, 1, Phase::Starting));
    assert!(!hold_for_phase(&second, &scope, 1, Phase::Starting));
    assert!(!hold_for_phase(&first, &scope, 1, Phase::Starting));

    for sleeper in &mut sleepers {
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }
    for node in [&work, &first, &second] {
        node.remove().unwrap();
    }
    // A removed group is no longer said to be starting: a new one beside the one at work is
    // held alone.
    let (work, late) = (
        scope.child(&group_name("/crowd/work-2")),
        scope.child(&group_name("/crowd/late")),
    );
    work.create().unwrap();
    late.create().unwrap();
    let mut working = Command::new("sleep").arg("60").spawn().unwrap();
    work.place(working.id()).unwrap();
    assert!(hold_for_phase(&late, &scope, 1, Phase::Starting));
    let _ = working.kill();
    let _ = working.wait();
    work.remove().unwrap();
    late.remove().unwrap();
    scope.remove().unwrap();
}

/// The line of `/proc/<pid>/cgroup` for v1 hierarchy `controller`: the process's group there.
fn group_in(pid: u32, controller: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
        .unwrap_or_default()
}

/// The children of process `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// While a desktop starts, the CPU part of its processes, and of what they fork meanwhile,
/// weighs in the low group beside the runtime's own (its weight that of a thread ten steps
/// below), while memory and freezer stay the desktop's; at work, every process is back in its
/// own group.
#[tokio::test]
async fn a_starting_desktop_weighs_in_the_low_group_until_it_is_at_work() {
    let _serial = SERIAL.lock().await;
    let Some(low) = low_group() else {
        return;
    };
    let node = host_parent()
        .unwrap()
        .child(&group_name(&format!("/weigh/{}", std::process::id())));
    node.create().unwrap();
    // A browser's start: a process that forks its helper once told to (it forks nothing
    // before: `read` is the shell's own).
    let mut start = Command::new("sh")
        .args(["-c", "read go; sleep 60 & wait"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = start.id();
    node.place(pid).unwrap();
    let own_cpu = group_in(pid, "cpu");
    assert_eq!(weigh_for_phase(&node, &low, Phase::Starting).unwrap(), 1);
    let low_cpu = group_in(pid, "cpu");
    assert!(low_cpu.contains("/rakazo-start-"), "{low_cpu}");
    assert_ne!(low_cpu, own_cpu);
    let shares =
        std::fs::read_to_string(format!("/sys/fs/cgroup/cpu{low_cpu}/cpu.shares")).unwrap();
    assert_eq!(
        shares.trim(),
        "102",
        "a thread ten steps below weighs 110 of 1024"
    );
    assert!(
        node.procs().unwrap().contains(&pid),
        "the freezer moved too"
    );
    let name = group_name(&format!("/weigh/{}", std::process::id()));
    for controller in ["memory", "freezer"] {
        assert!(group_in(pid, controller).ends_with(&name), "{controller}");
    }

    use std::io::Write;
    writeln!(start.stdin.as_mut().unwrap(), "go").unwrap();
    let helper = loop {
        if let Some(child) = children_of(pid).first() {
            break *child;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        group_in(helper, "cpu"),
        low_cpu,
        "a helper is born where its parent weighs"
    );
    // Entered again while starting (as the runtime does once the window is up): nothing moves.
    assert_eq!(weigh_for_phase(&node, &low, Phase::Starting).unwrap(), 0);

    assert_eq!(weigh_for_phase(&node, &low, Phase::AtWork).unwrap(), 2);
    for p in [pid, helper] {
        assert_eq!(group_in(p, "cpu"), own_cpu);
    }
    assert!(
        low.cpu_procs()
            .unwrap()
            .iter()
            .all(|p| ![pid, helper].contains(p))
    );

    let _ = Command::new("kill").arg(helper.to_string()).status();
    let _ = start.kill();
    let _ = start.wait();
    node.remove().unwrap();
}

/// A desktop of a runtime whose starts are lowered (`SANDBOX_DESKTOP_START_NICE` with desktop
/// groups): its processes weigh in the low group while it starts, and none of them is left
/// there once its screen is open.
#[tokio::test]
async fn a_lowered_desktop_start_leaves_the_low_group_once_open() {
    let _serial = SERIAL.lock().await;
    let Some(low) = low_group() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().join("run"));
    let (runtime, groups) = lowered_runtime(dir.path(), 211);
    let seen_low = open_seeing_low(&runtime, "bot-a", &low).await;
    assert!(seen_low, "the start never weighed in the low group");
    let browser = runtime.browser_pid("bot-a").await.unwrap();
    assert!(
        low.cpu_procs().unwrap().is_empty(),
        "a process stayed in the low group"
    );
    assert!(!group_in(browser, "cpu").contains("/rakazo-start-"));
    runtime.shutdown().await.unwrap();
    groups.remove_machine();
}

/// The product's log lines of this test binary (`info` and up), kept from its first call on.
fn logged() -> &'static Mutex<Vec<u8>> {
    static LINES: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let lines: &'static Mutex<Vec<u8>> = Box::leak(Box::default());
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter("warn,rakazo=info")
            .with_writer(move || Lines(lines))
            .try_init();
        lines
    })
}

struct Lines(&'static Mutex<Vec<u8>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A lowered start that CPU-bound work at normal priority starves is raised by its watch while
/// it is still starting (the watch ends with the start), not only once its screen is open.
#[tokio::test]
async fn a_lowered_desktop_start_starved_by_busy_work_leaves_the_low_group_before_it_opens() {
    let _serial = SERIAL.lock().await;
    let Some(low) = low_group() else {
        return;
    };
    let lines = logged();
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().join("run"));
    let (runtime, groups) = lowered_runtime(dir.path(), 221);
    // One CPU-bound loop at normal priority per CPU, and one more.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut loops: Vec<_> = (0..=cpus)
        .map(|_| {
            Command::new("setsid")
                .args(["sh", "-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    let seen_low = open_seeing_low(&runtime, "starved", &low).await;
    for child in &mut loops {
        let _ = child.kill();
        let _ = child.wait();
    }
    let said = String::from_utf8_lossy(&lines.lock().unwrap()).into_owned();
    assert!(seen_low, "the start never weighed in the low group");
    assert!(
        said.lines()
            .any(|l| l.contains("desktop.priority.raised_starved") && l.contains("bot.id=starved")),
        "the starved start stayed low until its desktop opened: {said}"
    );
    assert!(low.cpu_procs().unwrap().is_empty());
    runtime.shutdown().await.unwrap();
    groups.remove_machine();
}

/// The low group starting desktops weigh in at ten steps below (`None`, said, with v2).
fn low_group() -> Option<Node> {
    let low = host_group(weight_of_nice(10)).unwrap();
    if low.is_none() {
        eprintln!("cgroup v2: a starting desktop keeps its group's weight; nothing to check");
    }
    low
}

/// Opens `bot`'s screen on `runtime`, looking every 20 ms meanwhile whether any process weighs
/// in `low`; answers whether one was seen.
async fn open_seeing_low(runtime: &DesktopRuntime, bot: &str, low: &Node) -> bool {
    let open = runtime.open_screen(bot, 0);
    tokio::pin!(open);
    let mut seen_low = false;
    loop {
        tokio::select! {
            opened = &mut open => {
                opened.unwrap();
                return seen_low;
            }
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                seen_low |= !low.cpu_procs().unwrap().is_empty();
            }
        }
    }
}

/// A runtime of one machine with desktop groups whose starts weigh ten steps below this
/// process's priority until they are at work.
fn lowered_runtime(
    dir: &std::path::Path,
    first_display: u32,
) -> (std::sync::Arc<DesktopRuntime>, std::sync::Arc<HostGroups>) {
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 0,
        freeze_after: None,
        hold_starts: true,
    };
    let name = format!("lowered-{first_display}-{}", std::process::id());
    let groups = HostGroups::new(&name, limits, 10).unwrap();
    let config = RuntimeConfig {
        groups: Some(groups.clone()),
        ..common::desktop::runtime_config(dir, first_display)
    };
    let runtime = std::sync::Arc::new(DesktopRuntime::new(
        std::sync::Arc::new(HostRunner::minimal()),
        config,
    ));
    (runtime, groups)
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

/// A program started for a desktop on this host is born in the desktop's group: the script
/// starting it joins the group first, so the program, and what it forks at once, are inside
/// when the start returns, with no search by tag (it carries none); while the desktop starts
/// with its starts lowered, only its CPU part is born in the low group. A group that refuses
/// the script starts nothing.
#[tokio::test]
async fn a_spawned_program_and_what_it_forks_at_once_are_born_in_the_desktops_group() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let name = format!("born-{}", std::process::id());
    let node = host_parent().unwrap().child(&name);
    node.create().unwrap();
    let runner = HostRunner::minimal();
    let spec = |join| SpawnSpec {
        argv: ["sh", "-c", "sleep 60 & exec sleep 61"]
            .map(String::from)
            .into(),
        join,
        ..Default::default()
    };
    let forked = |pid: u32| {
        for _ in 0..250 {
            if let Some(child) = children_of(pid).first() {
                return *child;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("process {pid} forked nothing");
    };

    let pid = runner.spawn(&spec(node.joins())).await.unwrap();
    assert!(
        node.procs().unwrap().contains(&pid),
        "the program was born outside"
    );
    let child = forked(pid);
    assert!(node.procs().unwrap().contains(&child));
    if node.version() == Version::V1 {
        for controller in ["cpu", "memory", "freezer"] {
            assert!(group_in(pid, controller).ends_with(&name), "{controller}");
        }
    }
    runner.stop(pid, Duration::from_millis(100)).await.unwrap();

    if let Some(low) = low_group() {
        let joins = joins_for_phase(&node, &low, Phase::Starting);
        let pid = runner.spawn(&spec(joins)).await.unwrap();
        let child = forked(pid);
        for p in [pid, child] {
            assert!(group_in(p, "cpu").contains("/rakazo-start-"), "{p}");
            for controller in ["memory", "freezer"] {
                assert!(group_in(p, controller).ends_with(&name), "{controller}");
            }
        }
        assert_eq!(weigh_for_phase(&node, &low, Phase::AtWork).unwrap(), 2);
        runner.stop(pid, Duration::from_millis(100)).await.unwrap();
    }

    let marker = dir.path().join("started");
    let refused = SpawnSpec {
        argv: vec!["touch".into(), marker.to_string_lossy().into_owned()],
        join: host_parent()
            .unwrap()
            .child(&format!("{name}-missing"))
            .joins(),
        ..Default::default()
    };
    let err = runner.spawn(&refused).await.unwrap_err();
    assert!(
        err.to_string().contains("cannot join the control group"),
        "{err}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!marker.exists(), "a program started outside its group");
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
