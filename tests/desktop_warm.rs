//! Spare display stacks (`SANDBOX_DESKTOP_WARM_STACKS`) against real Xvfb, fluxbox and
//! Chromium: a bot's new desktop takes a spare, shows only its own browser, nothing of an
//! earlier bot reaches it, the pool refills in the background, and size 0 starts nothing.
//!
//! Needs the packages of `scripts/install-desktop-deps.sh`. Tests run one at a time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::command::{CommandRunner, HostRunner, TAG_VAR, sweep_script};
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};

mod windows;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Kills every process the test's runtimes started, even when the test fails halfway.
struct Sweep(std::path::PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        let script = sweep_script(&format!("{}/", self.0.display()));
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .status();
    }
}

fn config(dir: &Path, first_display: u32, warm_stacks: usize) -> RuntimeConfig {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    RuntimeConfig {
        workspace: dir.join("workspace"),
        run_dir: dir.join("run"),
        screen_limit: 0,
        displays: DisplayPool::new(first_display),
        gateway_port: 0,
        settle: Settle::default(),
        x11_socket_dir: None,
        commands_only: false,
        gateway_host: "127.0.0.1".into(),
        groups: None,
        freeze_after: None,
        warm_stacks,
    }
}

/// The X servers this test's runtime runs: (pid, display), found by their tag.
async fn our_xservers(run_dir: &Path) -> Vec<(u32, u32)> {
    let script = format!(
        "for p in $(pgrep -x Xvfb); do\n\
           tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -q '^{TAG_VAR}={}/' || continue\n\
           echo \"$p $(tr '\\0' ' ' < /proc/$p/cmdline | cut -d' ' -f2)\"\n\
         done",
        run_dir.display()
    );
    let out = HostRunner::minimal()
        .run(&script, Duration::from_secs(10))
        .await
        .unwrap();
    let mut found: Vec<(u32, u32)> = out
        .stdout
        .lines()
        .filter_map(|l| {
            let (pid, display) = l.split_once(' ')?;
            Some((
                pid.parse().ok()?,
                display.trim_start_matches(':').parse().ok()?,
            ))
        })
        .collect();
    found.sort();
    found
}

/// Waits until the runtime has `ready` spares.
async fn until_ready(runtime: &DesktopRuntime, ready: usize) {
    let started = Instant::now();
    while runtime.warm_status().ready != ready {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the pool reached {ready} ready spares: {:?}",
            runtime.warm_status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the process runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[tokio::test]
async fn a_bot_takes_a_spare_sees_only_its_browser_and_the_pool_refills() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let _sweep = Sweep(run.clone());
    let runtime = Arc::new(DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        config(dir.path(), 191, 1),
    ));
    runtime.start_warm_pool();
    until_ready(&runtime, 1).await;
    let status = runtime.warm_status();
    assert_eq!((status.target, status.ready), (1, 1));
    assert!(status.pss_kib > 0, "the spare's memory is counted");
    let spare = our_xservers(&run).await;
    assert_eq!(
        spare.len(),
        1,
        "one spare stack and nothing else: {spare:?}"
    );
    let (spare_pid, spare_display) = spare[0];

    // Bot A's desktop is the spare: the same X server, started before A asked.
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert_eq!(a.display, spare_display);
    assert!(alive(spare_pid));
    assert!(our_xservers(&run).await.contains(&(spare_pid, a.display)));
    windows::assert_only_the_browser(&windows::connect_local(a.display));
    let first = runtime.observe("bot-a").await.unwrap();
    assert!(
        windows::painted_in_row(&first.frame.png, 20) > first.frame.width as usize / 2,
        "A's first frame shows its browser"
    );

    // The pool refills in the background on another display, with no browser on it.
    until_ready(&runtime, 1).await;
    let now = our_xservers(&run).await;
    assert_eq!(now.len(), 2, "A's desktop and one new spare: {now:?}");
    let (refill_pid, refill_display) = *now.iter().find(|(p, _)| *p != spare_pid).unwrap();
    assert_ne!(refill_display, a.display);
    let tops = windows::viewable_top_levels(&windows::connect_local(refill_display));
    assert!(
        tops.iter().all(|t| t.classes.is_empty()),
        "a spare holds no client window: {tops:?}"
    );

    // A leaves a window of its own on its screen, then its desktop is torn down whole.
    runtime
        .launch("bot-a", vec!["xmessage".into(), "bot-a was here".into()])
        .await
        .unwrap();
    let a_conn = windows::connect_local(a.display);
    let started = Instant::now();
    while windows::viewable_top_levels(&a_conn)
        .iter()
        .filter(|t| !t.classes.is_empty())
        .count()
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "xmessage is up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(a_conn);
    runtime.close_screen("bot-a").await.unwrap();
    assert!(
        !alive(spare_pid),
        "A's X server is gone, never back in the pool"
    );

    // Bot B gets the refilled spare: its own display, its own profile, only its browser.
    let b = runtime.open_screen("bot-b", 0).await.unwrap();
    assert_eq!(b.display, refill_display);
    assert!(alive(refill_pid));
    windows::assert_only_the_browser(&windows::connect_local(b.display));
    assert!(
        dir.path()
            .join("workspace/.browser-profiles/bot-b")
            .is_dir()
    );
    let b_browser = runtime.browser_pid("bot-b").await.unwrap();
    let env = std::fs::read(format!("/proc/{b_browser}/cmdline")).unwrap();
    let args = String::from_utf8_lossy(&env);
    assert!(args.contains("bot-b"), "B's browser runs on B's profile");
    assert!(!args.contains("bot-a"), "and on nothing of A's");

    // A comes back later: a fresh desktop again (a refill), its own profile kept.
    until_ready(&runtime, 1).await;
    let a2 = runtime.open_screen("bot-a", 1).await.unwrap();
    assert_ne!(a2.display, b.display);
    windows::assert_only_the_browser(&windows::connect_local(a2.display));

    runtime.shutdown().await.unwrap();
    assert!(
        our_xservers(&run).await.is_empty(),
        "shutdown stops the spares with the desktops"
    );
}

#[tokio::test]
async fn pool_size_zero_starts_nothing_ahead_and_desktops_open_as_before() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let _sweep = Sweep(run.clone());
    let runtime = Arc::new(DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        config(dir.path(), 195, 0),
    ));
    runtime.start_warm_pool();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(our_xservers(&run).await.is_empty(), "no spare started");
    assert_eq!(runtime.warm_status().target, 0);

    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    windows::assert_only_the_browser(&windows::connect_local(a.display));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        our_xservers(&run).await.len(),
        1,
        "only A's own X server, no refill"
    );
    assert_eq!(runtime.warm_status().ready, 0);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_spare_that_died_is_replaced_by_a_new_stack() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let _sweep = Sweep(run.clone());
    let runtime = Arc::new(DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        config(dir.path(), 198, 1),
    ));
    runtime.start_warm_pool();
    until_ready(&runtime, 1).await;
    let (pid, _) = our_xservers(&run).await[0];
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    while alive(pid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert!(
        !our_xservers(&run).await.iter().any(|(p, _)| *p == pid),
        "the dead spare was not handed out"
    );
    windows::assert_only_the_browser(&windows::connect_local(a.display));
    assert!(runtime.observe("bot-a").await.is_ok());
    runtime.shutdown().await.unwrap();
}
