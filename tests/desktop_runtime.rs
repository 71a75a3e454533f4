//! The shared desktop runtime against real Xvfb, fluxbox, Chromium, x11vnc and websockify.
//!
//! Needs the packages of `scripts/install-desktop-deps.sh`. Tests run one at a time (each
//! starts several browsers on a 2-core machine) and use their own X display numbers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use rakazo::desktop::DesktopError;
use rakazo::desktop::command::{CommandRunner, HostRunner, sweep_script};
use rakazo::desktop::gateway::Policy;
use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo::desktop::runtime::{DesktopRuntime, RuntimeConfig, ScreenHandle};
use rakazo_actors::provider::{
    Action, Button, ExecOutput, ExecRequest, MachineSpec, ProviderError, SandboxProvider,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[path = "common/desktop.rs"]
mod desktop_config;
mod windows;

/// One test at a time: each runs real browsers.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a browser gets to fetch a page after an action.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

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

fn require_tools() {
    for tool in ["Xvfb", "fluxbox", "chromium", "x11vnc", "websockify"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "{tool} is missing: run scripts/install-desktop-deps.sh"
        );
    }
}

/// A request the fixture site saw.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    cookie: Option<String>,
}

/// A tiny HTTP site on loopback that records every request.
struct Fixture {
    port: u16,
    seen: Arc<StdMutex<Vec<Seen>>>,
}

const FORM_PAGE: &str = r#"<!doctype html><html><body style="margin:0">
<input id="f" autofocus style="position:fixed;left:0;top:0;width:100vw;height:100vh;font-size:48px;border:0">
<script>
document.getElementById('f').addEventListener('input', e => {
  fetch('/typed?v=' + encodeURIComponent(e.target.value));
});
</script></body></html>"#;

impl Fixture {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    break;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let cookie = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("Cookie: ")
                                .or_else(|| l.strip_prefix("cookie: "))
                        })
                        .map(str::to_string);
                    log.lock().unwrap().push(Seen {
                        path: path.clone(),
                        cookie,
                    });
                    let (extra, body) = if let Some(who) = path.strip_prefix("/set/") {
                        (
                            format!("Set-Cookie: session={who}; Max-Age=86400; Path=/\r\n"),
                            format!("<h1>set {who}</h1>"),
                        )
                    } else if path.starts_with("/form/") {
                        (String::new(), FORM_PAGE.to_string())
                    } else {
                        (String::new(), format!("<h1>{path}</h1>"))
                    };
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nCache-Control: no-store\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Waits until a request matches `pred` and returns it.
    async fn wait_for(&self, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
        let started = Instant::now();
        loop {
            if let Some(s) = self.seen.lock().unwrap().iter().find(|s| pred(s)) {
                return s.clone();
            }
            assert!(
                started.elapsed() < PAGE_TIMEOUT,
                "the fixture never saw {what}; saw {:?}",
                self.seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The batch that makes a browser go to `url` through its address bar.
fn navigate(url: &str) -> Vec<Action> {
    vec![
        Action::Key {
            keys: "ctrl+l".into(),
        },
        // The address bar takes the focus asynchronously; keys sent before that reach the page.
        Action::Wait { ms: 300 },
        Action::Type { text: url.into() },
        // Drops any inline autocompletion before going.
        Action::Key {
            keys: "Delete".into(),
        },
        Action::Key {
            keys: "Return".into(),
        },
    ]
}

/// Navigates `bot`'s browser to `path` of the site and waits until the request arrived and the
/// page stopped changing; returns what the site saw.
async fn go(runtime: &DesktopRuntime, site: &Fixture, bot: &str, path: &str) -> Seen {
    let done = runtime.act(bot, &navigate(&site.url(path))).await.unwrap();
    assert_eq!(done.completed, 5, "{:?}", done.error);
    let _ = std::fs::write(
        std::env::temp_dir().join(format!("desktop-go-{bot}.png")),
        &done.observation.frame.png,
    );
    let seen = site
        .wait_for(&format!("{bot}'s {path}"), |s| s.path == path)
        .await;
    let mut last = runtime.observe(bot).await.unwrap().hash;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let next = runtime.observe(bot).await.unwrap().hash;
        if next == last {
            break;
        }
        last = next;
    }
    seen
}

/// What every test here holds while it runs: its turn (one desktop test at a time), and a
/// temporary directory whose processes are swept when the test ends, passed or not.
struct Begun {
    _sweep: Sweep,
    dir: tempfile::TempDir,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

/// Waits for the test's turn, checks the desktop tools and makes its directory.
async fn begin() -> Begun {
    let serial = SERIAL.lock().await;
    require_tools();
    let dir = tempfile::tempdir().unwrap();
    Begun {
        _sweep: Sweep(dir.path().join("run")),
        dir,
        _serial: serial,
    }
}

fn runtime_config(dir: &Path, first_display: u32, limit: usize) -> RuntimeConfig {
    RuntimeConfig {
        screen_limit: limit,
        ..desktop_config::runtime_config(dir, first_display)
    }
}

/// Reads the first websocket message from the gateway for `token`, if any comes.
async fn gateway_greeting(port: u16, token: &str) -> Option<Vec<u8>> {
    let url = format!("ws://127.0.0.1:{port}/websockify?token={token}");
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
        Ok(Some(Ok(msg))) if msg.is_binary() || msg.is_text() => Some(msg.into_data().to_vec()),
        _ => None,
    }
}

#[tokio::test]
async fn bots_get_separate_browsers_profiles_survive_and_old_tokens_die() {
    let begun = begin().await;
    let dir = &begun.dir;
    let site = Fixture::start().await;
    let runtime = DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        runtime_config(dir.path(), 41, 0),
    );
    let mut events = runtime.subscribe();

    // Two bots, two displays, two browsers.
    let a = runtime.open_screen("bot-a", 0).await.unwrap();
    let b = runtime.open_screen("bot-b", 1).await.unwrap();
    assert_eq!((a.slot, b.slot), (0, 1), "each on the slot asked for");
    assert_ne!(a.display, b.display);
    assert!(
        dir.path()
            .join("workspace/.browser-profiles/bot-a")
            .is_dir()
    );
    assert!(
        dir.path()
            .join("workspace/.browser-profiles/bot-b")
            .is_dir()
    );

    // A gets a cookie; B does not have it.
    go(&runtime, &site, "bot-a", "/set/a").await;
    let seen = go(&runtime, &site, "bot-a", "/check/a-1").await;
    assert_eq!(seen.cookie.as_deref(), Some("session=a"));
    let seen = go(&runtime, &site, "bot-b", "/check/b-1").await;
    assert_eq!(seen.cookie, None, "bot-b sees bot-a's cookie");

    // A click into a text field and typing reach the page.
    go(&runtime, &site, "bot-b", "/form/1").await;
    let typed = "Hello, Rakazo 42!";
    let batch = [
        Action::Click {
            x: 640,
            y: 500,
            button: Button::Left,
            double: false,
        },
        Action::Type { text: typed.into() },
    ];
    let result = runtime.act("bot-b", &batch).await.unwrap();
    assert_eq!(result.completed, 2, "{:?}", result.error);
    assert_eq!(
        (
            result.observation.frame.width,
            result.observation.frame.height
        ),
        (1280, 800)
    );
    assert!(result.observation.frame.png.starts_with(b"\x89PNG"));
    let expected = format!("/typed?v={}", "Hello%2C%20Rakazo%2042!");
    site.wait_for("the typed value", |s| s.path == expected)
        .await;

    // Identical consecutive frames hash alike; a failing action reports progress.
    let first = runtime.observe("bot-b").await.unwrap();
    let second = runtime.observe("bot-b").await.unwrap();
    assert_eq!(first.hash, second.hash);
    let bad = [
        Action::Move { x: 10, y: 10 },
        Action::Move { x: 5000, y: 10 },
        Action::Move { x: 20, y: 20 },
    ];
    let result = runtime.act("bot-b", &bad).await.unwrap();
    assert_eq!(result.completed, 1);
    let stop = result.error.unwrap();
    assert_eq!(stop.code, rakazo_actors::ErrorCode::InvalidParams);
    assert_eq!(
        stop.reason,
        "point (5000, 10) is outside the 1280x800 screen"
    );

    // A view capability reaches x11vnc through the gateway.
    let cap = runtime.grant("bot-a", Policy::View).await.unwrap();
    assert_eq!((cap.slot, cap.generation), (a.slot, a.generation));
    let greeting = gateway_greeting(cap.port, cap.token.expose())
        .await
        .expect("no greeting through the gateway");
    assert!(
        greeting.starts_with(b"RFB 003.008"),
        "{:?}",
        String::from_utf8_lossy(&greeting)
    );
    let socket = dir.path().join("run/gateway").join(cap.token.expose());
    assert!(socket.exists());

    // Teardown announces the ended generation, removes the socket, and the slot's next bot
    // cannot be reached with the old token.
    runtime.close_screen("bot-a").await.unwrap();
    let event = events.try_recv().expect("no teardown event");
    assert_eq!(
        (event.slot, event.ended, event.bot_id.as_str()),
        (a.slot, a.generation, "bot-a")
    );
    assert!(event.generation > a.generation);
    assert!(!socket.exists());
    let c = runtime.open_screen("bot-c", a.slot).await.unwrap();
    assert_eq!(c.slot, a.slot, "the freed slot is reused");
    assert!(c.generation > event.generation - 1);
    let _c_view = runtime.grant("bot-c", Policy::View).await.unwrap();
    assert_eq!(
        gateway_greeting(cap.port, cap.token.expose()).await,
        None,
        "an old token reached the recycled slot"
    );

    // Reopened in another slot, bot-a still has its cookie and its restored session.
    let a2 = runtime.open_screen("bot-a", 2).await.unwrap();
    assert_ne!(a2.slot, a.slot);
    let restored = site
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.path == "/check/a-1")
        .count();
    let seen = go(&runtime, &site, "bot-a", "/check/a-2").await;
    assert_eq!(
        seen.cookie.as_deref(),
        Some("session=a"),
        "bot-a lost its cookie"
    );
    assert!(
        restored >= 2,
        "the restarted browser did not restore its last tab"
    );

    runtime.shutdown().await.unwrap();
    assert!(
        dir.path()
            .join("workspace/.browser-profiles/bot-a")
            .is_dir(),
        "profiles are kept"
    );
}

#[tokio::test]
async fn screen_limit_refuses_while_shell_works_and_never_evicts_by_itself() {
    let begun = begin().await;
    let dir = &begun.dir;
    let provider = DesktopProvider::new(DesktopProviderConfig {
        homes_root: dir.path().join("homes"),
        run_root: dir.path().join("run"),
        screen_limit: 1,
        first_display: 51,
        environment: "test".into(),
        limits: None,
        warm_stacks: 0,
        start_nice: 0,
    })
    .unwrap();
    let spec = MachineSpec {
        computer_id: "c1".into(),
        space_id: "s1".into(),
        bot_id: None,
        home_key: "team-s1".into(),
    };
    let machine = provider.provision(&spec).await.unwrap();
    let runtime = provider.runtime(&machine).await.unwrap();

    provider.open_screen(&machine, "bot-1", 0).await.unwrap();
    // Which screen gives way is the screen actors' decision: the runtime only refuses.
    let refused = provider.open_screen(&machine, "bot-2", 1).await;
    assert_eq!(refused, Err(ProviderError::MultiScreenUnavailable));
    assert_eq!(
        runtime.screens().await.keys().collect::<Vec<_>>(),
        vec!["bot-1"]
    );
    let shell = ExecRequest {
        command: "echo shell-ok".into(),
        cwd: String::new(),
        env: vec![],
        timeout: Duration::from_secs(10),
    };
    assert_eq!(
        provider.exec(&machine, &shell).await.unwrap().stdout,
        "shell-ok\n"
    );

    provider.close_screen(&machine, "bot-1").await.unwrap();
    let screen = provider.open_screen(&machine, "bot-2", 0).await.unwrap();
    assert_eq!(screen.slot, 0);
    let frame = provider.observe(&machine, "bot-2").await.unwrap();
    assert!(frame.png.starts_with(b"\x89PNG"));

    provider.stop(&machine).await.unwrap();
}

/// What a [`Held`] runner holds.
enum Hold {
    /// The start of the browser of the bot with this profile directory name.
    BrowserStart(&'static str),
    /// The first cookie save (the DevTools script a checkpoint runs) of this bot's browser.
    CookieSave(&'static str),
    /// The first VNC server a capability starts.
    ViewerStart,
    /// The first program a bot starts whose command line holds this word.
    Program(&'static str),
}

/// A host runner that holds one step of a desktop until the test lets it go.
struct Held {
    inner: HostRunner,
    hold: Hold,
    /// Set once the step was held: the same step later (a screen's stop saves too) runs at once.
    held: AtomicBool,
    arrived: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Held {
    fn new(hold: Hold) -> Arc<Self> {
        Arc::new(Self {
            inner: HostRunner::minimal(),
            hold,
            held: AtomicBool::new(false),
            arrived: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        })
    }

    /// Waits for the test's release the first time `this` step comes.
    async fn maybe_hold(&self, this: bool) {
        if this && !self.held.swap(true, Ordering::SeqCst) {
            self.arrived.notify_one();
            self.release.notified().await;
        }
    }
}

#[async_trait]
impl CommandRunner for Held {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        let save = match self.hold {
            Hold::CookieSave(bot) => script.contains(&format!("/.browser-profiles/{bot}' save <<")),
            _ => false,
        };
        self.maybe_hold(save).await;
        self.inner.run(script, timeout).await
    }

    async fn spawn(&self, spec: &rakazo::desktop::command::SpawnSpec) -> Result<u32, DesktopError> {
        // The browser may be started through `setpriv` (as root): look past the first word.
        let start = match self.hold {
            Hold::BrowserStart(bot) => {
                spec.argv.iter().any(|p| p == "chromium")
                    && spec.argv.iter().any(|a| a.contains(bot))
            }
            Hold::ViewerStart => spec.argv.iter().any(|p| p == "x11vnc"),
            Hold::Program(word) => spec.argv.iter().any(|a| a.contains(word)),
            Hold::CookieSave(_) => false,
        };
        self.maybe_hold(start).await;
        self.inner.spawn(spec).await
    }

    async fn stop(&self, pid: u32, grace: Duration) -> Result<(), DesktopError> {
        self.inner.stop(pid, grace).await
    }

    async fn wait_exit(&self, pid: u32, timeout: Duration) -> Result<bool, DesktopError> {
        self.inner.wait_exit(pid, timeout).await
    }

    async fn is_running(&self, pid: u32) -> Result<bool, DesktopError> {
        self.inner.is_running(pid).await
    }
}

/// Opening one bot's desktop never holds up another bot's tools: while bot B's browser start
/// is held, bot A observes, acts and opens its screen again, and B's start then completes.
#[tokio::test]
async fn one_bots_tools_work_while_another_bots_desktop_starts() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runner = Held::new(Hold::BrowserStart("bot-late"));
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 81, 0),
    ));
    let first = runtime.open_screen("bot-first", 0).await.unwrap();
    let opening = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.open_screen("bot-late", 1).await }
    });
    runner.arrived.notified().await;

    // A hang guard, not a timing assertion: before the fix these waited for the other start.
    let guard = Duration::from_secs(120);
    let frame = tokio::time::timeout(guard, runtime.observe("bot-first"))
        .await
        .expect("observe waited behind another bot's desktop start")
        .unwrap();
    assert!(frame.frame.png.starts_with(b"\x89PNG"));
    let acted = tokio::time::timeout(guard, runtime.act("bot-first", &[Action::Wait { ms: 10 }]))
        .await
        .expect("act waited behind another bot's desktop start")
        .unwrap();
    assert_eq!(acted.completed, 1);
    let again = tokio::time::timeout(guard, runtime.open_screen("bot-first", 0))
        .await
        .expect("reopening waited behind another bot's desktop start")
        .unwrap();
    assert_eq!(again, first);
    assert!(
        !opening.is_finished(),
        "the other bot's start was held all along"
    );
    assert!(
        runtime.screen("bot-late").await.is_none(),
        "not open before its start ends"
    );

    runner.release.notify_one();
    let late = opening.await.unwrap().unwrap();
    assert_ne!(late.slot, first.slot);
    assert_ne!(late.display, first.display);
    assert!(
        runtime
            .observe("bot-late")
            .await
            .unwrap()
            .frame
            .png
            .starts_with(b"\x89PNG")
    );
    runtime.shutdown().await.unwrap();
}

/// Each of `bots` observes and acts while `held` is held (a hang guard, not a timing
/// assertion).
async fn tools_answer(runtime: &DesktopRuntime, bots: &[&str], held: &str) {
    let guard = Duration::from_secs(120);
    for bot in bots {
        let frame = tokio::time::timeout(guard, runtime.observe(bot))
            .await
            .unwrap_or_else(|_| panic!("observe waited behind {held}"))
            .unwrap();
        assert!(frame.frame.png.starts_with(b"\x89PNG"));
        let acted = tokio::time::timeout(guard, runtime.act(bot, &[Action::Wait { ms: 10 }]))
            .await
            .unwrap_or_else(|_| panic!("act waited behind {held}"))
            .unwrap();
        assert_eq!(acted.completed, 1);
    }
}

/// A checkpoint saving the browsers' state never holds up the bots' tools: while one bot's
/// cookie save is held, both bots observe and act, and the save then completes.
#[tokio::test]
async fn the_bots_tools_work_while_a_checkpoint_saves_their_browsers() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runner = Held::new(Hold::CookieSave("bot-slow"));
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 85, 0),
    ));
    runtime.open_screen("bot-quick", 0).await.unwrap();
    runtime.open_screen("bot-slow", 1).await.unwrap();
    let exported = Arc::new(AtomicBool::new(false));
    let saving = tokio::spawn({
        let (runtime, exported) = (runtime.clone(), exported.clone());
        async move {
            runtime
                .with_browser_state_saved(async move { exported.store(true, Ordering::SeqCst) })
                .await
        }
    });
    runner.arrived.notified().await;

    // Before the fix these waited for every save.
    tools_answer(
        &runtime,
        &["bot-quick", "bot-slow"],
        "a checkpoint's cookie save",
    )
    .await;
    assert!(!saving.is_finished(), "the save was held all along");
    assert!(
        !exported.load(Ordering::SeqCst),
        "nothing is exported before the saves end"
    );

    runner.release.notify_one();
    saving.await.unwrap().unwrap();
    assert!(exported.load(Ordering::SeqCst));
    runtime.shutdown().await.unwrap();
}

/// A person opening a bot's screen never holds up the bots' tools: while the VNC server of a
/// capability starts, both bots observe and act; the capability then reaches the screen.
#[tokio::test]
async fn the_bots_tools_work_while_a_person_opens_a_screen() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runner = Held::new(Hold::ViewerStart);
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 87, 0),
    ));
    let watched = runtime.open_screen("bot-watched", 0).await.unwrap();
    runtime.open_screen("bot-busy", 1).await.unwrap();
    let granting = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.grant("bot-watched", Policy::View).await }
    });
    runner.arrived.notified().await;

    // Before the fix these waited for the VNC server.
    tools_answer(
        &runtime,
        &["bot-busy", "bot-watched"],
        "a capability's VNC server",
    )
    .await;
    assert!(!granting.is_finished(), "the VNC server was held all along");

    runner.release.notify_one();
    let cap = granting.await.unwrap().unwrap();
    assert_eq!(
        (cap.slot, cap.generation),
        (watched.slot, watched.generation)
    );
    assert!(
        gateway_greeting(cap.port, cap.token.expose())
            .await
            .is_some()
    );
    runtime.shutdown().await.unwrap();
}

/// A screen torn down while a capability's VNC server starts leaves no live capability: the
/// grant is refused, and the slot's next screen, on the same display number, has none it
/// did not grant.
#[tokio::test]
async fn a_capability_granted_while_its_screen_is_torn_down_is_refused_and_dead() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runner = Held::new(Hold::ViewerStart);
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 89, 0),
    ));
    let old = runtime.open_screen("bot-old", 0).await.unwrap();
    let granting = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.grant("bot-old", Policy::Control).await }
    });
    runner.arrived.notified().await;
    runtime.close_screen("bot-old").await.unwrap();
    let new = runtime.open_screen("bot-new", 0).await.unwrap();
    assert_eq!(new.slot, old.slot);
    assert!(new.generation > old.generation);

    runner.release.notify_one();
    let refused = granting.await.unwrap();
    assert!(refused.is_err(), "a grant outlived its screen: {refused:?}");
    if new.display == old.display {
        // The VNC server found a display there (the new screen's): the grant itself saw its
        // screen gone.
        assert!(
            matches!(refused, Err(DesktopError::NoScreen)),
            "{refused:?}"
        );
    }
    assert_eq!(runtime.gateway().live_count(old.slot).await, 0);
    runtime.shutdown().await.unwrap();
}

/// Whether a process whose command line holds `word` runs on this host.
async fn runs(word: &str) -> bool {
    let out = tokio::process::Command::new("pgrep")
        .args(["-f", word])
        .output()
        .await
        .unwrap();
    out.status.success()
}

/// A bot starting a program never holds up the bots' tools: while the program's start is
/// held, both bots observe and act; it then starts on the bot's screen and goes with it.
#[tokio::test]
async fn the_bots_tools_work_while_a_bot_starts_a_program() {
    let begun = begin().await;
    let dir = &begun.dir;
    let word = "rakazo-launch-held-95";
    let runner = Held::new(Hold::Program(word));
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 95, 0),
    ));
    runtime.open_screen("bot-app", 0).await.unwrap();
    runtime.open_screen("bot-other", 1).await.unwrap();
    let launching = tokio::spawn({
        let runtime = runtime.clone();
        let argv = ["sh", "-c", &format!("sleep 300; : {word}")].map(String::from);
        async move { runtime.launch("bot-app", argv.to_vec()).await }
    });
    runner.arrived.notified().await;

    // Before the fix these waited for the program's start.
    tools_answer(&runtime, &["bot-other", "bot-app"], "a program's start").await;
    assert!(!launching.is_finished(), "the start was held all along");

    runner.release.notify_one();
    launching.await.unwrap().unwrap();
    assert!(runs(word).await, "the program runs");
    runtime.close_screen("bot-app").await.unwrap();
    assert!(!runs(word).await, "the program went with its screen");
    runtime.shutdown().await.unwrap();
}

/// A program whose start is under way when its screen is torn down never outlives the
/// screen: the teardown waits for the start and sweeps it, and the slot's next screen, on the
/// same display number, runs nothing of the old bot's; a start after the teardown is refused.
#[tokio::test]
async fn a_program_started_while_its_screen_is_torn_down_goes_with_it() {
    let begun = begin().await;
    let dir = &begun.dir;
    let word = "rakazo-launch-held-97";
    let runner = Held::new(Hold::Program(word));
    let runtime = Arc::new(DesktopRuntime::new(
        runner.clone(),
        runtime_config(dir.path(), 97, 0),
    ));
    let old = runtime.open_screen("bot-old", 0).await.unwrap();
    let argv = ["sh", "-c", &format!("sleep 300; : {word}")].map(String::from);
    let launching = tokio::spawn({
        let (runtime, argv) = (runtime.clone(), argv.to_vec());
        async move { runtime.launch("bot-old", argv).await }
    });
    runner.arrived.notified().await;
    let closing = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.close_screen("bot-old").await }
    });
    // The teardown has begun (the bot has no screen) and waits for the start.
    while runtime.screen("bot-old").await.is_some() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!closing.is_finished(), "the teardown waits for the start");

    runner.release.notify_one();
    launching.await.unwrap().unwrap();
    closing.await.unwrap().unwrap();
    assert!(
        !runs(word).await,
        "a program outlived its screen's teardown"
    );
    let new = runtime.open_screen("bot-new", 0).await.unwrap();
    assert_eq!(new.slot, old.slot);
    assert!(!runs(word).await);
    assert!(matches!(
        runtime.launch("bot-old", argv.to_vec()).await,
        Err(DesktopError::NoScreen)
    ));
    runtime.shutdown().await.unwrap();
}

/// A host runner whose `stop` can be made to fail.
struct FlakyStop {
    inner: HostRunner,
    fail: AtomicBool,
}

#[async_trait]
impl CommandRunner for FlakyStop {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.inner.run(script, timeout).await
    }

    async fn stop(&self, pid: u32, grace: Duration) -> Result<(), DesktopError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(DesktopError::Stack("injected failure".into()));
        }
        let out = self
            .inner
            .run(
                &format!("kill -TERM {pid}; sleep 0.5; kill -KILL -- -{pid} 2>/dev/null; true"),
                grace,
            )
            .await?;
        assert_eq!(out.exit_code, 0);
        Ok(())
    }
}

#[tokio::test]
async fn failed_teardown_keeps_the_slot_reserved_until_a_retry() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runner = Arc::new(FlakyStop {
        inner: HostRunner::minimal(),
        fail: AtomicBool::new(false),
    });
    let runtime = DesktopRuntime::new(runner.clone(), runtime_config(dir.path(), 61, 0));

    let x = runtime.open_screen("bot-x", 0).await.unwrap();
    runner.fail.store(true, Ordering::SeqCst);
    assert!(runtime.close_screen("bot-x").await.is_err());
    assert!(runtime.screen("bot-x").await.is_none());
    match runtime.open_screen("bot-y", x.slot).await {
        Err(DesktopError::SlotBusy { slot, .. }) => assert_eq!(slot, x.slot),
        other => panic!("a reserved slot was reused: {other:?}"),
    }
    let y = runtime.open_screen("bot-y", 1).await.unwrap();
    assert_eq!(y.slot, 1, "the slot asked for, never another");
    assert!(
        runtime.open_screen("bot-x", 2).await.is_err(),
        "bot-x reopened while its old browser may run"
    );
    assert_eq!(runtime.retry_teardowns().await, 1);

    runner.fail.store(false, Ordering::SeqCst);
    assert_eq!(runtime.retry_teardowns().await, 0);
    let x2 = runtime.open_screen("bot-x", x.slot).await.unwrap();
    assert_eq!(x2.slot, x.slot);
    assert!(x2.generation > x.generation + 1);
    let all: HashMap<_, _> = runtime.screens().await;
    assert_eq!(all.len(), 2);
    runtime.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_fresh_screen_shows_its_browser_and_nothing_else() {
    let begun = begin().await;
    let dir = &begun.dir;
    let runtime = DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        runtime_config(dir.path(), 71, 0),
    );
    let screen = runtime.open_screen("bot-a", 0).await.unwrap();
    // The first frame a bot gets: taken before anything else looks at the screen.
    let first = runtime.observe("bot-a").await.unwrap();
    let conn = windows::connect_local(screen.display);
    windows::assert_only_the_browser(&conn);
    // No wallpaper setter ran (its failure opens a dialog on computers without one).
    let out = HostRunner::minimal()
        .run(
            &format!(
                "ps -eo pid=,args= | grep -E 'fbsetbg|xmessage' | grep -v grep | while read p a; do tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -q 'DISPLAY=:{}$' && echo \"$a\"; done",
                screen.display
            ),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "", "a wallpaper setter ran");
    // The frame shows the browser's window: its top rows (tab strip and toolbar) are painted,
    // not the black desktop.
    let painted = windows::painted_in_row(&first.frame.png, 20);
    assert!(
        painted > first.frame.width as usize / 2,
        "the first frame's title area is the browser's ({painted} pixels painted)"
    );
    runtime.shutdown().await.unwrap();
}

/// Field `n` after the name (0: the state) of a `stat` file of `/proc` (a process name may
/// hold spaces and parentheses); `None` once the process or thread is gone.
fn stat_field(path: &str, n: usize) -> Option<i64> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n)?.parse().ok()
}

/// The nice value of `pid` (`/proc/<pid>/stat`, the 19th field).
fn nice_of(pid: u32) -> i32 {
    stat_field(&format!("/proc/{pid}/stat"), 16).unwrap() as i32
}

/// `pid`'s parent (`/proc/<pid>/stat`, the 4th field).
fn parent_of(pid: u32) -> Option<u32> {
    stat_field(&format!("/proc/{pid}/stat"), 1).map(|p| p as u32)
}

/// The numbered entries of a `/proc` directory: its processes, or a process's threads.
fn numbered(dir: &str) -> Vec<u32> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .collect()
}

/// The processes whose program is `comm` and whose environment names display `:display`.
fn on_display(comm: &str, display: u32) -> Vec<u32> {
    let want = format!("DISPLAY=:{display}");
    numbered("/proc")
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
        })
        .collect()
}

/// `pid`'s session scheduling group (`/proc/<pid>/autogroup`), where the kernel has them.
fn autogroup(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/autogroup"))
        .ok()
        .map(|g| g.trim().to_string())
}

/// A runtime starting desktops as `launch` says, with bot-a's screen open on it (from display
/// `first`), and the browser's pid.
async fn opened_with(
    dir: &Path,
    first: u32,
    launch: rakazo::desktop::browser::Launch,
) -> (DesktopRuntime, ScreenHandle, u32) {
    let runtime = DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        runtime_config(dir, first, 0),
    )
    .with_launch(launch);
    let screen = runtime.open_screen("bot-a", 0).await.unwrap();
    let browser = runtime.browser_pid("bot-a").await.unwrap();
    (runtime, screen, browser)
}

#[tokio::test]
async fn the_browser_and_window_manager_run_below_the_x_server() {
    let begun = begin().await;
    let (runtime, screen, browser) = opened_with(
        begun.dir.path(),
        71,
        rakazo::desktop::browser::Launch::lowered(),
    )
    .await;
    let own = nice_of(std::process::id());
    let lowered = (own + i32::from(rakazo::desktop::browser::DESKTOP_NICE)).min(19);
    assert_eq!(nice_of(browser), lowered, "the browser");
    // Its helpers (zygotes, renderers, services) inherit the priority.
    let helpers: Vec<u32> = numbered("/proc")
        .into_iter()
        .filter(|&pid| parent_of(pid) == Some(browser))
        .collect();
    assert!(!helpers.is_empty(), "the browser started no helper");
    for pid in helpers {
        assert_eq!(nice_of(pid), lowered, "browser helper {pid}");
    }
    let wm = on_display("fluxbox", screen.display);
    assert_eq!(wm.len(), 1, "{wm:?}");
    assert_eq!(nice_of(wm[0]), lowered, "the window manager");
    // The X server answers observe and act: it keeps the runtime's priority.
    let xvfb: Vec<u32> = numbered("/proc")
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0).take(2).collect::<Vec<_>>()
                    == [
                        b"Xvfb".as_slice(),
                        format!(":{}", screen.display).as_bytes(),
                    ]
            })
        })
        .collect();
    assert_eq!(xvfb.len(), 1, "{xvfb:?}");
    assert_eq!(nice_of(xvfb[0]), own, "the X server");
    // Where sessions are scheduled as groups, the browser's group is lowered as a whole.
    if let (Some(browser_group), Some(x_group)) = (autogroup(browser), autogroup(xvfb[0])) {
        let suffix = format!("nice {}", rakazo::desktop::browser::DESKTOP_NICE);
        assert!(browser_group.ends_with(&suffix), "{browser_group}");
        assert!(x_group.ends_with("nice 0"), "{x_group}");
    }
    runtime.shutdown().await.unwrap();
}

/// The `stat` file of every thread of `pid` and of the processes whose parent it is.
fn threads_of_tree(pid: u32) -> Vec<String> {
    numbered("/proc")
        .into_iter()
        .filter(|&p| p == pid || parent_of(p) == Some(pid))
        .flat_map(|p| {
            numbered(&format!("/proc/{p}/task"))
                .into_iter()
                .map(move |t| format!("/proc/{p}/task/{t}/stat"))
        })
        .collect()
}

#[tokio::test]
async fn a_desktop_lowered_while_it_starts_runs_at_the_runtimes_priority_once_open() {
    use rakazo::desktop::priority_local::may_raise;
    let begun = begin().await;
    let (runtime, screen, browser) = opened_with(
        begun.dir.path(),
        76,
        rakazo::desktop::browser::Launch::lowered_while_starting(),
    )
    .await;
    let own = nice_of(std::process::id());
    // Started lowered where the runtime can raise it back (a browser run by root then starts
    // without the capability to raise its own threads); not lowered at all where it cannot.
    let status = std::fs::read_to_string(format!("/proc/{browser}/status")).unwrap();
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .is_some_and(|uids| uids.split_whitespace().next() == Some("0"));
    if root && may_raise() {
        assert_eq!(bounding & (1 << 23), 0, "the browser started lowered");
    }
    let threads = threads_of_tree(browser);
    assert!(threads.len() > 5, "{threads:?}");
    for thread in threads {
        // A thread may end while it is looked at.
        if let Some(nice) = stat_field(&thread, 16) {
            assert!(nice <= i64::from(own), "{thread}: nice {nice}");
        }
    }
    // What the bot launches starts at the runtime's priority.
    runtime
        .launch("bot-a", vec!["sleep".into(), "30".into()])
        .await
        .unwrap();
    let mut sleeps = Vec::new();
    for _ in 0..100 {
        sleeps = on_display("sleep", screen.display);
        if !sleeps.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sleeps.len(), 1, "{sleeps:?}");
    assert_eq!(nice_of(sleeps[0]), own, "the bot's program");
    runtime.shutdown().await.unwrap();
}

/// CPU-bound loops at normal priority in sessions of their own, one per CPU and one more;
/// killed when dropped.
struct BusyLoops(Vec<std::process::Child>);

impl BusyLoops {
    fn start() -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self(
            (0..=cpus)
                .map(|_| {
                    std::process::Command::new("setsid")
                        .args(["sh", "-c", "while :; do :; done"])
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Resolves once a browser on `display` that was seen lowered below `own` runs at `own`.
async fn browser_raised(display: u32, own: i32) {
    let mut seen_lowered = false;
    loop {
        for pid in on_display("chromium", display) {
            match stat_field(&format!("/proc/{pid}/stat"), 16) {
                Some(nice) if nice > i64::from(own) => seen_lowered = true,
                Some(nice) if seen_lowered && nice == i64::from(own) => return,
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A start lowered while it lasts that CPU-bound work at normal priority starves is raised while
/// it is still starting, not only once its browser is open.
#[tokio::test]
async fn a_desktop_start_starved_by_busy_work_is_raised_before_it_opens() {
    use rakazo::desktop::priority_local::may_raise;
    if !may_raise() {
        eprintln!("a start is lowered only where the runtime may raise it: nothing to check");
        return;
    }
    let begun = begin().await;
    let runtime = DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        runtime_config(begun.dir.path(), 77, 0),
    )
    .with_launch(rakazo::desktop::browser::Launch::lowered_while_starting());
    let own = nice_of(std::process::id());
    let busy = BusyLoops::start();
    let open = runtime.open_screen("bot-a", 0);
    tokio::pin!(open);
    let raised_first = tokio::select! {
        _ = browser_raised(77, own) => true,
        opened = &mut open => {
            opened.unwrap();
            false
        }
    };
    drop(busy);
    assert!(
        raised_first,
        "the starved start stayed lowered until its desktop opened"
    );
    open.await.unwrap();
    runtime.shutdown().await.unwrap();
}

/// DevTools through the screen gateway (how the page tools reach a machine whose sockets this
/// process cannot dial): the route speaks to the bot's own browser, and once the bot's screen
/// closes, its token reaches nothing and the open connection ends.
#[tokio::test]
async fn devtools_through_the_gateway_reach_the_bots_browser_until_its_screen_closes() {
    use rakazo::desktop::{cdp::Cdp, gateway_stream, page};
    use rakazo_actors::provider::BrowserCommand;

    let begun = begin().await;
    let dir = &begun.dir;
    let site = Fixture::start().await;
    let runtime = DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        runtime_config(dir.path(), 91, 0),
    );
    runtime.open_screen("bot-a", 0).await.unwrap();
    go(&runtime, &site, "bot-a", "/through-the-gateway").await;

    let route = runtime.devtools_route("bot-a", None).await.unwrap();
    let connect = || gateway_stream::connect(&route.route.upstream, &route.route.token);
    let mut cdp = Cdp::over(connect().await.unwrap(), route.port, &route.path)
        .await
        .unwrap();
    let snapshot = page::run(&mut cdp, &BrowserCommand::Snapshot, dir.path())
        .await
        .unwrap();
    assert_eq!(
        snapshot["url"],
        site.url("/through-the-gateway"),
        "{snapshot}"
    );
    // A token nobody was given reaches nothing.
    let guessed = gateway_stream::connect(&route.route.upstream, &"0".repeat(32)).await;
    let guessed = match guessed {
        Ok(stream) => Cdp::over(stream, route.port, &route.path).await.err(),
        Err(e) => Some(e),
    };
    assert!(guessed.is_some(), "a made-up token reached a browser");

    runtime.close_screen("bot-a").await.unwrap();
    assert!(
        page::run(&mut cdp, &BrowserCommand::Snapshot, dir.path())
            .await
            .is_err(),
        "the connection outlived the screen"
    );
    let again = match connect().await {
        Ok(stream) => Cdp::over(stream, route.port, &route.path).await.err(),
        Err(e) => Some(e),
    };
    assert!(again.is_some(), "the route's token outlived the screen");
    runtime.shutdown().await.unwrap();
}
