//! Spare desktops (`SANDBOX_DESKTOP_WARM_STACKS`) against real Xvfb, fluxbox and Chromium: a
//! new bot's desktop takes a spare with its running browser, whose profile becomes the bot's;
//! a returning bot gets the stack and its own browser; nothing of an earlier bot reaches
//! another, the pool refills in the background, and size 0 starts nothing. A spare's windows
//! are watched by events, so taking it asks the X server nothing; a window gone, whoever
//! took it away, sends the spare back to the full check.
//!
//! Needs the packages of `scripts/install-desktop-deps.sh`. Tests run one at a time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::command::{CommandRunner, HostRunner, TAG_VAR, sweep_script};
use rakazo::desktop::runtime::{DesktopRuntime, RuntimeConfig};

#[path = "common/desktop.rs"]
mod desktop_config;
mod windows;
#[path = "xvfb/mod.rs"]
mod xvfb;

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
    RuntimeConfig {
        warm_stacks,
        ..desktop_config::runtime_config(dir, first_display)
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

/// One test's runtime with its directory, the paths the test looks at, and the sweep of its
/// processes (dropped after the runtime, before the directory).
struct Warm {
    runtime: Arc<DesktopRuntime>,
    run: std::path::PathBuf,
    profiles: std::path::PathBuf,
    _sweep: Sweep,
    _dir: tempfile::TempDir,
}

/// A runtime on displays from `first_display` keeping `spares` spare desktops (on the command
/// path when `commands_only`), its pool started and every spare of it ready.
async fn warm_runtime(first_display: u32, spares: usize, commands_only: bool) -> Warm {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut config = config(dir.path(), first_display, spares);
    config.commands_only = commands_only;
    let runtime = Arc::new(DesktopRuntime::new(Arc::new(HostRunner::minimal()), config));
    runtime.start_warm_pool();
    until_ready(&runtime, spares).await;
    Warm {
        runtime,
        profiles: dir.path().join("workspace/.browser-profiles"),
        _sweep: Sweep(run.clone()),
        run,
        _dir: dir,
    }
}

/// Whether the process runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// The profile directory a running browser was started on (its `--user-data-dir`).
fn user_data_dir(pid: u32) -> std::path::PathBuf {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let arg = cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .find_map(|a| a.strip_prefix("--user-data-dir="))
        .expect("a --user-data-dir argument")
        .trim_end_matches('/')
        .to_owned();
    arg.into()
}

/// The names in the workspace's profiles directory that belong to spares.
fn spare_names(profiles: &Path) -> Vec<String> {
    std::fs::read_dir(profiles)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".spare-"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_new_bot_takes_a_spare_with_its_running_browser_and_the_pool_refills() {
    let _serial = SERIAL.lock().await;
    let Warm {
        runtime,
        run,
        profiles,
        ..
    } = &warm_runtime(191, 1, false).await;
    let status = runtime.warm_status();
    assert_eq!((status.target, status.ready), (1, 1));
    // Its memory is read once it is ready, its browser's with it.
    let started = Instant::now();
    while runtime.warm_status().pss_kib < 60 * 1024 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the spare's memory is counted: {:?}",
            runtime.warm_status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spare = our_xservers(run).await;
    assert_eq!(
        spare.len(),
        1,
        "one spare stack and nothing else: {spare:?}"
    );
    let (spare_pid, spare_display) = spare[0];
    // The spare runs a browser already, on a profile of no bot's.
    windows::assert_only_the_browser(&windows::connect_local(spare_display));
    let spare_profile = spare_names(profiles);
    assert_eq!(spare_profile.len(), 1, "{spare_profile:?}");

    // Bot A, new, gets the spare: the same X server and the same browser, started before A
    // asked, its profile now A's.
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert_eq!(a.display, spare_display);
    assert!(alive(spare_pid));
    let a_browser = runtime.browser_pid("bot-a").await.unwrap();
    assert_eq!(
        std::fs::canonicalize(user_data_dir(a_browser)).unwrap(),
        std::fs::canonicalize(profiles.join("bot-a")).unwrap(),
        "the spare's browser runs on what is now A's profile"
    );
    assert!(profiles.join("bot-a/Default").is_dir());
    assert!(our_xservers(run).await.contains(&(spare_pid, a.display)));
    windows::assert_only_the_browser(&windows::connect_local(a.display));
    let first = runtime.observe("bot-a").await.unwrap();
    assert!(
        windows::painted_in_row(&first.frame.png, 20) > first.frame.width as usize / 2,
        "A's first frame shows its browser"
    );

    // The pool refills in the background on another display, with a browser of its own.
    until_ready(runtime, 1).await;
    let now = our_xservers(run).await;
    assert_eq!(now.len(), 2, "A's desktop and one new spare: {now:?}");
    let (refill_pid, refill_display) = *now.iter().find(|(p, _)| *p != spare_pid).unwrap();
    assert_ne!(refill_display, a.display);
    windows::assert_only_the_browser(&windows::connect_local(refill_display));

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
    assert!(!alive(a_browser));
    assert!(
        profiles.join("bot-a/Default").is_dir(),
        "A's profile stays in the workspace"
    );
    assert_eq!(
        spare_names(profiles).len(),
        1,
        "A's link is gone, the refill's profile is there"
    );

    // Bot B, new, gets the refilled spare: its own display, its own profile, nothing of A's.
    let b = runtime.open_screen("bot-b", 0).await.unwrap();
    assert_eq!(b.display, refill_display);
    assert!(alive(refill_pid));
    windows::assert_only_the_browser(&windows::connect_local(b.display));
    let b_browser = runtime.browser_pid("bot-b").await.unwrap();
    let b_profile = std::fs::canonicalize(user_data_dir(b_browser)).unwrap();
    assert_eq!(
        b_profile,
        std::fs::canonicalize(profiles.join("bot-b")).unwrap(),
        "B's browser runs on B's profile"
    );
    assert!(!b_profile.starts_with(profiles.join("bot-a")));

    // A comes back later with its profile: the next spare's display stack, A's own browser on
    // A's profile, the spare's browser and profile gone.
    until_ready(runtime, 1).await;
    let unowned: Vec<String> = spare_names(profiles)
        .into_iter()
        .filter(|n| !profiles.join(n).symlink_metadata().unwrap().is_symlink())
        .collect();
    assert_eq!(unowned.len(), 1, "the ready spare's profile: {unowned:?}");
    let a2 = runtime.open_screen("bot-a", 1).await.unwrap();
    assert_ne!(a2.display, b.display);
    windows::assert_only_the_browser(&windows::connect_local(a2.display));
    let a2_browser = runtime.browser_pid("bot-a").await.unwrap();
    assert_eq!(user_data_dir(a2_browser), profiles.join("bot-a"));
    let started = Instant::now();
    while profiles.join(&unowned[0]).exists() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the replaced spare's profile is removed: {:?}",
            spare_names(profiles)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    runtime.shutdown().await.unwrap();
    assert!(
        our_xservers(run).await.is_empty(),
        "shutdown stops the spares with the desktops"
    );
    assert!(
        spare_names(profiles).is_empty(),
        "no spare profile or link is left: {:?}",
        spare_names(profiles)
    );
}

#[tokio::test]
async fn pool_size_zero_starts_nothing_ahead_and_desktops_open_as_before() {
    let _serial = SERIAL.lock().await;
    let Warm { runtime, run, .. } = &warm_runtime(195, 0, false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(our_xservers(run).await.is_empty(), "no spare started");
    assert_eq!(runtime.warm_status().target, 0);

    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    windows::assert_only_the_browser(&windows::connect_local(a.display));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        our_xservers(run).await.len(),
        1,
        "only A's own X server, no refill"
    );
    assert_eq!(runtime.warm_status().ready, 0);
    runtime.shutdown().await.unwrap();
}

/// Kills the X server of the one spare under `run`; its pid.
async fn kill_the_spare(run: &Path) -> u32 {
    let (pid, _) = our_xservers(run).await[0];
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    while alive(pid) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pid
}

/// The desktop on `display` is not the dead spare's (X server `pid`) and shows only a browser.
async fn assert_not_handed_out(run: &Path, pid: u32, display: u32) {
    assert!(
        !our_xservers(run).await.iter().any(|(p, _)| *p == pid),
        "the dead spare was not handed out"
    );
    windows::assert_only_the_browser(&windows::connect_local(display));
}

#[tokio::test]
async fn a_spare_that_died_is_replaced_by_a_new_stack() {
    let _serial = SERIAL.lock().await;
    let Warm { runtime, run, .. } = &warm_runtime(198, 1, false).await;
    let pid = kill_the_spare(run).await;
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert_not_handed_out(run, pid, a.display).await;
    assert!(runtime.observe("bot-a").await.is_ok());
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn on_the_command_path_a_spare_that_died_is_found_out_when_it_is_handed_over() {
    let _serial = SERIAL.lock().await;
    let Warm {
        runtime,
        run,
        profiles,
        ..
    } = &warm_runtime(202, 1, true).await;
    let pid = kill_the_spare(run).await;
    // Bot A, new, would take the spare's browser: the hand-over finds it gone.
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert_not_handed_out(run, pid, a.display).await;
    let browser = runtime.browser_pid("bot-a").await.unwrap();
    assert_eq!(user_data_dir(browser), profiles.join("bot-a"));
    assert!(runtime.observe("bot-a").await.is_ok());
    runtime.shutdown().await.unwrap();
    assert!(
        spare_names(profiles).is_empty(),
        "{:?}",
        spare_names(profiles)
    );
}

/// The top-level windows of `conn`'s display that hold a Chromium client (the window manager's
/// frames).
fn browser_frames(conn: &x11rb::rust_connection::RustConnection) -> Vec<u32> {
    windows::viewable_top_levels(conn)
        .into_iter()
        .filter(|t| t.classes.iter().any(|c| c.eq_ignore_ascii_case("chromium")))
        .map(|t| t.window)
        .collect()
}

#[tokio::test]
async fn a_spare_whose_browser_window_another_client_hid_is_not_handed_out() {
    use x11rb::protocol::xproto::ConnectionExt as _;
    use x11rb::wrapper::ConnectionExt as _;
    let _serial = SERIAL.lock().await;
    let Warm {
        runtime,
        run,
        profiles,
        ..
    } = &warm_runtime(206, 1, false).await;
    // A process of the computer reaches the spare's display and hides its browser's window:
    // the browser runs on, so only its windows tell.
    let (xvfb, display) = our_xservers(run).await[0];
    let other = windows::connect_local(display);
    let frames = browser_frames(&other);
    assert_eq!(frames.len(), 1, "the spare shows its browser");
    other.unmap_window(frames[0]).unwrap();
    other.sync().unwrap();
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    assert_not_handed_out(run, xvfb, a.display).await;
    let browser = runtime.browser_pid("bot-a").await.unwrap();
    assert_eq!(user_data_dir(browser), profiles.join("bot-a"));
    runtime.shutdown().await.unwrap();
}

#[test]
fn a_watched_display_tells_a_window_gone_without_asking_the_server() {
    use x11rb::connection::Connection as _;
    use x11rb::protocol::xproto::{
        ConfigureWindowAux, ConnectionExt as _, CreateWindowAux, WindowClass,
    };
    use x11rb::wrapper::ConnectionExt as _;
    let mut server = xvfb::Xvfb::start(470);
    let mut x = rakazo::desktop::capture::XDisplay::connect(server.display).unwrap();
    assert!(!x.end_window_watch().unwrap(), "not watched yet");
    let other = windows::connect_local(server.display);
    let root = other.setup().roots[0].root;
    let window = |conn: &x11rb::rust_connection::RustConnection| {
        let id = conn.generate_id().unwrap();
        conn.create_window(
            0,
            id,
            root,
            0,
            0,
            50,
            50,
            0,
            WindowClass::INPUT_OUTPUT,
            0,
            &CreateWindowAux::new(),
        )
        .unwrap();
        conn.map_window(id).unwrap();
        conn.sync().unwrap();
        id
    };
    let first = window(&other);
    x.watch_windows().unwrap();
    // A new window, moved, is no window gone.
    let second = window(&other);
    let moved = ConfigureWindowAux::new().x(20);
    other.configure_window(second, &moved).unwrap();
    other.sync().unwrap();
    assert!(x.end_window_watch().unwrap());
    assert!(!x.end_window_watch().unwrap(), "the watch ended");
    x.watch_windows().unwrap();
    other.destroy_window(first).unwrap();
    other.sync().unwrap();
    assert!(!x.end_window_watch().unwrap(), "a destroyed window is seen");
    x.watch_windows().unwrap();
    other.unmap_window(second).unwrap();
    other.sync().unwrap();
    assert!(!x.end_window_watch().unwrap(), "an unmapped window is seen");
    // Windows gone around the end of a watch (the server may do another client's requests
    // before the end reaches it) do not count against the next watch.
    other.map_window(second).unwrap();
    other.destroy_window(second).unwrap();
    other.sync().unwrap();
    x.watch_windows().unwrap();
    assert!(
        x.end_window_watch().unwrap(),
        "nothing of the last watch is left"
    );
    // A server that is gone is an error.
    x.watch_windows().unwrap();
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(x.end_window_watch().is_err(), "the server's end is seen");
}
