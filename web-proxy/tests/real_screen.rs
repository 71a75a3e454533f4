//! The slow tier: a real Xvfb display, x11vnc on unix sockets, websockify, Debian's noVNC served
//! by the proxy, and headless Chromium framing it sandboxed, all reached through the proxy.
//!
//! Needs `scripts/install-screen-deps.sh` (`scripts/test.sh` runs it). Without the tools the
//! tests fail saying what is missing, unless `RAKAZO_TEST_SKIP_MISSING=1` (see `gate`).

mod common;
#[path = "../../tests/gate/mod.rs"]
mod gate;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use common::*;
use rakazo_web_proxy::capability::{Keyring, Policy};
use rakazo_web_proxy::gateway::{GatewayActor, RevokeControl};
use rakazo_web_proxy::viewer::DEFAULT_NOVNC_DIR;
use rakazo_web_proxy::{ProxyConfig, ProxyState, configure};

const VIEW_TOKEN: &str = "viewSock_4f2a9c";
const CONTROL_TOKEN: &str = "controlSock_8b1d77";

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn tools_present(extra: &[&str]) -> bool {
    let mut tools = vec!["Xvfb", "x11vnc", "websockify", "xdotool"];
    tools.extend(extra);
    let missing: Vec<_> = tools.into_iter().filter(|t| !have(t)).collect();
    if missing.is_empty() && Path::new("/usr/share/novnc/vnc.html").exists() {
        return true;
    }
    gate::missing(
        &format!("the screen tools {missing:?} (or noVNC)"),
        "scripts/test.sh installs them (scripts/install-screen-deps.sh)",
    );
    false
}

/// Children started in their own process groups, killed (group by group, by id) when dropped,
/// so websockify's per-connection forks and Chromium's renderers go with them.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A command in a new process group of its own, with quiet output.
/// Headless Chromium on a fresh profile, opening `url`; stopped, and its profile removed, when
/// the pair is dropped.
fn headless_chromium(browser: &str, url: &str) -> (Procs, tempfile::TempDir) {
    let profile = tempfile::tempdir().unwrap();
    let procs = Procs(vec![
        command(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .spawn()
            .unwrap(),
    ]);
    (procs, profile)
}

fn command(program: &str) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut c = Command::new(program);
    c.process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A display with a view-only and a full x11vnc, and websockify (websockets only) in front.
struct Desktop {
    display: String,
    gateway: SocketAddr,
    _dir: tempfile::TempDir,
    _procs: Procs,
}

fn start_desktop() -> Desktop {
    let mut procs = Procs(Vec::new());
    // Tests of this binary run in parallel: each call starts its search at a number of its
    // own, so two desktops never race for the same display.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let offset = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) * 37;
    let n = (100..400)
        .map(|i| i + (std::process::id() % 200) + offset)
        .find(|n| {
            !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .unwrap();
    let display = format!(":{n}");
    // Servers starting at once on a machine without the socket directory race to make it,
    // and the one whose `mkdir` loses runs on without a socket: it is made first.
    let _ = Command::new("mkdir")
        .args(["-p", "-m", "1777", "/tmp/.X11-unix"])
        .status();
    procs.0.push(
        command("Xvfb")
            .args([&display, "-screen", "0", "1024x768x24", "-nolisten", "tcp"])
            .spawn()
            .unwrap(),
    );
    wait_for("Xvfb", || {
        Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
    });
    let dir = tempfile::tempdir().unwrap();
    for (token, view_only) in [(VIEW_TOKEN, true), (CONTROL_TOKEN, false)] {
        let socket: PathBuf = dir.path().join(token);
        let mut args = vec![
            "-display".to_string(),
            display.clone(),
            "-unixsock".into(),
            socket.display().to_string(),
            "-rfbport".into(),
            "0".into(),
            "-shared".into(),
            "-forever".into(),
            "-nopw".into(),
            "-quiet".into(),
        ];
        if view_only {
            args.push("-viewonly".into());
        }
        procs.0.push(command("x11vnc").args(&args).spawn().unwrap());
        wait_for("x11vnc", || socket.exists());
    }
    let port = free_port();
    procs.0.push(
        command("websockify")
            .args([
                "--token-plugin",
                "UnixDomainSocketDirectory",
                "--token-source",
            ])
            .arg(dir.path())
            .arg(format!("127.0.0.1:{port}"))
            .spawn()
            .unwrap(),
    );
    let gateway: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_for("websockify", || {
        std::net::TcpStream::connect(gateway).is_ok()
    });
    Desktop {
        display,
        gateway,
        _dir: dir,
        _procs: procs,
    }
}

impl Desktop {
    fn pointer(&self) -> (i32, i32) {
        let out = Command::new("xdotool")
            .args(["getmouselocation", "--shell"])
            .env("DISPLAY", &self.display)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(-1)
        };
        (field("X="), field("Y="))
    }
}

/// Reads an RFB byte stream out of websocket messages, whatever their framing.
struct Rfb {
    ws: Client,
    buf: Vec<u8>,
}

impl Rfb {
    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let more = next_binary(&mut self.ws).await;
            self.buf.extend(more);
        }
        self.buf.drain(..n).collect()
    }

    /// Completes the handshake with security None; returns the ServerInit size.
    async fn handshake(&mut self) -> (u16, u16) {
        assert_eq!(self.read(12).await, b"RFB 003.008\n");
        send(&mut self.ws, b"RFB 003.008\n").await;
        let count = self.read(1).await[0] as usize;
        assert!(count > 0, "server refused the connection");
        let types = self.read(count).await;
        assert!(types.contains(&1), "no None security: {types:?}");
        send(&mut self.ws, &[1]).await;
        assert_eq!(self.read(4).await, [0, 0, 0, 0], "security failed");
        send(&mut self.ws, &[1]).await;
        let init = self.read(24).await;
        let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
        self.read(name_len).await;
        (
            u16::from_be_bytes([init[0], init[1]]),
            u16::from_be_bytes([init[2], init[3]]),
        )
    }

    async fn pointer(&mut self, x: u16, y: u16) {
        let [x0, x1] = x.to_be_bytes();
        let [y0, y1] = y.to_be_bytes();
        send(&mut self.ws, &[5, 0, x0, x1, y0, y1]).await;
    }
}

async fn wait_pointer(desktop: &Desktop, want: (i32, i32), within: Duration) -> (i32, i32) {
    let deadline = Instant::now() + within;
    loop {
        let now = desktop.pointer();
        if now == want || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_rt::test]
async fn real_x11vnc_through_the_proxy() {
    if !tools_present(&[]) {
        return;
    }
    let desktop = start_desktop();
    let authority = TestAuthority::new(&format!("http://{}", desktop.gateway), CONTROL_TOKEN);
    authority.update(|l| l.control_fence = Some(1));
    let keyring = Arc::new(Keyring::random(1));
    let (proxy, gateway) = start_proxy_serving(
        keyring.clone(),
        Arc::new(authority.clone()),
        Path::new(DEFAULT_NOVNC_DIR),
    );

    // The noVNC page is Debian's, served by the proxy, naming the reporter first and the screen
    // stylesheet last in its head.
    let view = keyring.seal(&capability(Policy::View, 1, 0)).unwrap();
    let page = reqwest::get(format!("http://{proxy}/screen/{view}/vnc.html"))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let packaged = std::fs::read_to_string(Path::new(DEFAULT_NOVNC_DIR).join("vnc.html")).unwrap();
    let served = page.text().await.unwrap();
    assert_eq!(
        served
            .replacen("<script src=\"rakazo-reporter.js\"></script>", "", 1)
            .replacen(
                "<link rel=\"stylesheet\" href=\"rakazo-screen.css\"></head>",
                "</head>",
                1
            ),
        packaged
    );

    // View: routed on purpose to the x11vnc WITHOUT -viewonly, so only the proxy's RFB
    // filter stands between the pointer events and the display.
    let start = desktop.pointer();
    let mut rfb = Rfb {
        ws: connect(proxy, &view).await.unwrap(),
        buf: Vec::new(),
    };
    assert_eq!(rfb.handshake().await, (1024, 768));
    for (x, y) in [(101, 202), (303, 404), (7, 9)] {
        rfb.pointer(x, y).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        desktop.pointer(),
        start,
        "a view capability moved the pointer"
    );

    // Control moves it.
    let control = keyring.seal(&capability(Policy::Control, 1, 1)).unwrap();
    let mut ctl = Rfb {
        ws: connect(proxy, &control).await.unwrap(),
        buf: Vec::new(),
    };
    ctl.handshake().await;
    ctl.pointer(321, 123).await;
    assert_eq!(
        wait_pointer(&desktop, (321, 123), Duration::from_secs(5)).await,
        (321, 123),
        "a control capability did not move the pointer"
    );

    // Release: the live control socket closes within a second, the URL is refused after.
    let released = Instant::now();
    authority.update(|l| l.control_fence = None);
    gateway
        .send(RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence: 1,
        })
        .await
        .unwrap();
    let reason = wait_close(&mut ctl.ws, Duration::from_secs(1)).await;
    assert_eq!(reason.as_deref(), Some("revoked"));
    assert!(released.elapsed() < Duration::from_secs(1));
    assert_eq!(refused_status(proxy, &control).await, 403);

    // The realistic view route: x11vnc -viewonly behind the filter still serves the screen.
    authority.update(|l| l.socket_token = VIEW_TOKEN.into());
    let mut real_view = Rfb {
        ws: connect(proxy, &view).await.unwrap(),
        buf: Vec::new(),
    };
    assert_eq!(real_view.handshake().await, (1024, 768));
    real_view.pointer(10, 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(desktop.pointer(), (321, 123));
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| have(c))
}

#[actix_rt::test]
async fn novnc_in_headless_chromium_reports_connected() {
    if !tools_present(&[]) {
        return;
    }
    let Some(browser) = chromium() else {
        gate::missing(
            "chromium",
            "scripts/test.sh installs it (scripts/install-screen-deps.sh)",
        );
        return;
    };
    let desktop = start_desktop();
    let authority = TestAuthority::new(&format!("http://{}", desktop.gateway), VIEW_TOKEN);
    let keyring = Arc::new(Keyring::random(1));
    let view = keyring.seal(&capability(Policy::View, 1, 0)).unwrap();
    let state = ProxyState::new(
        keyring.clone(),
        Arc::new(authority),
        GatewayActor::start_default(),
        ProxyConfig {
            novnc_dir: DEFAULT_NOVNC_DIR.into(),
            ..ProxyConfig::default()
        },
    );

    // The embedding app, on the proxy's origin like the dashboard: frames the page sandboxed
    // with scripts only (an opaque origin) and reports what the frame posts.
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let frame = format!("/screen/{view}/vnc.html?autoconnect=1&resize=scale");
    let embed = format!(
        "<!doctype html><html><body><iframe id=\"f\" sandbox=\"allow-scripts\" src=\"{frame}\" width=800 height=600></iframe>\
         <iframe id=\"r\" sandbox=\"allow-scripts\" src=\"/screen/not-a-capability/vnc.html\" width=200 height=100></iframe>\
         <script>window.addEventListener('message', function (e) {{\
           var from = e.source === document.getElementById('f').contentWindow ? '' :\
             e.source === document.getElementById('r').contentWindow ? 'refused:' : null;\
           if (from === null) return;\
           if (e.data && e.data.type === 'rakazo.screen') fetch('/report?state=' + from + e.data.state + '&origin=' + e.origin);\
         }});</script></body></html>"
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let app_addr = listener.local_addr().unwrap();
    let seen = reports.clone();
    let server = HttpServer::new(move || {
        let embed = embed.clone();
        let seen = seen.clone();
        let state = state.clone();
        App::new()
            .configure(move |cfg| configure(cfg, state))
            .route(
                "/embed",
                web::get().to(move || {
                    let embed = embed.clone();
                    async move { HttpResponse::Ok().content_type("text/html").body(embed) }
                }),
            )
            .route(
                "/report",
                web::get().to(
                    move |q: web::Query<std::collections::HashMap<String, String>>| {
                        let seen = seen.clone();
                        async move {
                            let state = q.get("state").cloned().unwrap_or_default();
                            let origin = q.get("origin").cloned().unwrap_or_default();
                            seen.lock().unwrap().push(format!("{state}@{origin}"));
                            HttpResponse::NoContent().finish()
                        }
                    },
                ),
            )
    })
    .on_connect(rakazo_web_proxy::on_connect)
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_rt::spawn(server);

    let _browser = headless_chromium(browser, &format!("http://{app_addr}/embed"));
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let all = reports.lock().unwrap().clone();
        // The refusal page's one inline script runs under the screen policy (allowed by hash).
        let (refused, states): (Vec<String>, Vec<String>) =
            all.into_iter().partition(|s| s.starts_with("refused:"));
        if states.iter().any(|s| s.starts_with("connected@")) && !refused.is_empty() {
            assert_eq!(refused, ["refused:failed@null"]);
            eprintln!("reported states: {states:?}");
            // The frame runs in an opaque origin: its messages come from "null".
            assert_eq!(
                states.first().map(String::as_str),
                Some("loading@null"),
                "{states:?}"
            );
            assert!(states.iter().all(|s| s.ends_with("@null")), "{states:?}");
            assert!(
                !states.iter().any(|s| s.starts_with("failed")),
                "{states:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "noVNC never reported connected (or the refusal page stayed silent): {states:?} {refused:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Headless Chromium sees a revoked screen socket close cleanly: the close frame (1008,
/// "revoked"), then the server ends the TCP connection (`wasClean`), on a server registering
/// `on_connect` as the servers do.
#[actix_rt::test]
async fn chromium_sees_a_revoked_socket_close_cleanly() {
    let Some(browser) = chromium() else {
        gate::missing(
            "chromium",
            "scripts/test.sh installs it (scripts/install-screen-deps.sh)",
        );
        return;
    };
    let (upstream, _) = start_fake_gateway(CONTROL_TOKEN);
    let authority = TestAuthority::new(&format!("http://{upstream}"), CONTROL_TOKEN);
    authority.update(|l| l.control_fence = Some(1));
    let keyring = Arc::new(Keyring::random(1));
    let control = keyring.seal(&capability(Policy::Control, 1, 1)).unwrap();
    let gateway = GatewayActor::start_default();
    let novnc = fake_novnc();
    let state = ProxyState::new(
        keyring,
        Arc::new(authority.clone()),
        gateway.clone(),
        ProxyConfig {
            novnc_dir: novnc.path().to_path_buf(),
            ..ProxyConfig::default()
        },
    );
    // A page on the proxy's origin opening the screen socket and reporting its events.
    let page = format!(
        "<!doctype html><html><body><script>\
         var ws = new WebSocket('ws://' + location.host + '/screen/{control}/websockify', 'binary');\
         ws.onopen = function () {{ fetch('/report?state=open'); }};\
         ws.onclose = function (e) {{ fetch('/report?state=' + encodeURIComponent('closed ' + e.code + ' ' + e.wasClean + ' ' + e.reason)); }};\
         </script></body></html>"
    );
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = reports.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let app_addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        let state = state.clone();
        let page = page.clone();
        let seen = seen.clone();
        App::new()
            .configure(move |cfg| configure(cfg, state))
            .route(
                "/page",
                web::get().to(move || {
                    let page = page.clone();
                    async move { HttpResponse::Ok().content_type("text/html").body(page) }
                }),
            )
            .route(
                "/report",
                web::get().to(
                    move |q: web::Query<std::collections::HashMap<String, String>>| {
                        let seen = seen.clone();
                        async move {
                            let state = q.get("state").cloned().unwrap_or_default();
                            seen.lock().unwrap().push(state);
                            HttpResponse::NoContent().finish()
                        }
                    },
                ),
            )
    })
    .on_connect(rakazo_web_proxy::on_connect)
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_rt::spawn(server);

    let _browser = headless_chromium(browser, &format!("http://{app_addr}/page"));
    let wait_for = |what: &'static str| {
        let reports = reports.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(45);
            loop {
                let all = reports.lock().unwrap().clone();
                if let Some(found) = all.iter().find(|s| s.starts_with(what)) {
                    return found.clone();
                }
                assert!(Instant::now() < deadline, "no {what:?} report: {all:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_for("open").await;
    authority.update(|l| l.control_fence = None);
    let revoked = gateway
        .send(RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence: 1,
        })
        .await
        .unwrap();
    assert_eq!(revoked.closed, 1);
    assert_eq!(wait_for("closed").await, "closed 1008 true revoked");
}
