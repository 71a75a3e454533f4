//! The spec's team-screens regression, shared by the provider test binaries: a fixture site
//! served inside the computer, two bots' browsers on separate displays keeping their cookies
//! apart, and (for providers reached through routes, as the remote ones are) old gateway
//! tokens refused after the slot is reused. Docker runs its own variant over the supervisor's
//! gateway on top of the shared parts.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use rakazo_actors::provider::{
    Action, ExecRequest, MachineSpec, ProviderRef, SandboxProvider, ScreenPolicy,
};

/// A site served inside the computer: `/set/<v>` sets a persistent cookie (logged as
/// `set:<v>`), `/check/<tag>` logs `<tag> <cookie header>` to `fixture/seen.log` in the
/// workspace.
pub const SITE: &str = r#"import http.server, os
LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen.log")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        parts = self.path.strip("/").split("/")
        headers = []
        if parts[0] == "set":
            headers.append(("Set-Cookie", "session=%s; Path=/; Max-Age=86400" % parts[1]))
        if parts[0] in ("set", "check"):
            tag = parts[1] if parts[0] == "check" else "set:" + parts[1]
            with open(LOG, "a") as f:
                f.write("%s %s\n" % (tag, self.headers.get("Cookie", "-")))
        body = ("<html><head><title>%s</title></head><body><h1>%s</h1></body></html>" % (self.path, self.path)).encode()
        self.send_response(200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), H).serve_forever()
"#;

/// A shell command with a 30 s deadline.
pub fn cmd(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

/// `prefix` and 12 random characters.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A fresh Team Computer's spec.
pub fn team_spec() -> MachineSpec {
    let space = unique("space");
    MachineSpec {
        computer_id: unique("computer"),
        space_id: space.clone(),
        bot_id: None,
        home_key: format!("team-{space}"),
    }
}

/// Starts the fixture site inside the computer, as the workspace user, on its loopback port
/// 8765.
pub async fn start_site<P: SandboxProvider + ?Sized>(p: &P, m: &ProviderRef) {
    p.write_file(m, "fixture/site.py", SITE.as_bytes())
        .await
        .unwrap();
    let started = p.exec(
        m,
        &cmd("setsid python3 fixture/site.py >/dev/null 2>&1 </dev/null & python3 -c 'import socket, time\nfor _ in range(100):\n    try:\n        socket.create_connection((\"127.0.0.1\", 8765), 1).close()\n        break\n    except OSError:\n        time.sleep(0.1)\nelse:\n    raise SystemExit(1)'"),
    )
    .await
    .unwrap();
    assert_eq!(started.exit_code, 0, "fixture site: {started:?}");
}

/// Keystrokes that send a bot's browser to `url`.
pub fn navigate(url: &str) -> Vec<Action> {
    vec![
        Action::Key {
            keys: "ctrl+l".into(),
        },
        Action::Wait { ms: 300 },
        Action::Type { text: url.into() },
        Action::Key {
            keys: "Delete".into(),
        },
        Action::Key {
            keys: "Return".into(),
        },
    ]
}

/// Sends `bot` to `path` of the fixture site and waits until the site saw the request;
/// returns the cookie header the browser sent.
/// A browser that has just restored its session can swallow the first address typed while
/// the restored page still loads: the navigation is retried, at most three times.
pub async fn go<P: SandboxProvider + ?Sized>(
    p: &P,
    m: &ProviderRef,
    bot: &str,
    path: &str,
) -> Option<String> {
    let url = format!("http://127.0.0.1:8765{path}");
    let tag = match path.strip_prefix("/set/") {
        Some(v) => format!("set:{v}"),
        None => path.trim_start_matches("/check/").to_string(),
    };
    let tag = tag.as_str();
    for attempt in 0..3 {
        let outcome = p.act(m, bot, &navigate(&url)).await.unwrap();
        assert_eq!(outcome.completed, 5);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            if let Ok(log) = p.read_file(m, "fixture/seen.log").await
                && let Some(line) = String::from_utf8_lossy(&log)
                    .lines()
                    .find(|l| l.split(' ').next() == Some(tag))
            {
                return Some(line.split_once(' ').unwrap().1.to_string());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!("{bot}: navigation to {path} not seen (attempt {attempt}); retrying");
    }
    let frame = p.observe(m, bot).await.unwrap();
    let shot = std::env::temp_dir().join(format!("team-screens-{bot}.png"));
    std::fs::write(&shot, frame.png).unwrap();
    panic!("{bot} never reached {path}; its screen: {}", shot.display());
}

/// bot-a and bot-b open their screens in parallel (separate slots) and keep their cookies
/// apart on the fixture site; returns their slots.
pub async fn cookies_stay_apart<P: SandboxProvider + ?Sized>(p: &P, m: &ProviderRef) -> (u32, u32) {
    let (a, b) = tokio::join!(p.open_screen(m, "bot-a", 0), p.open_screen(m, "bot-b", 1));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.slot, b.slot);
    go(p, m, "bot-a", "/set/alpha").await;
    assert_eq!(
        go(p, m, "bot-a", "/check/a1").await.as_deref(),
        Some("session=alpha")
    );
    assert_eq!(
        go(p, m, "bot-b", "/check/b1").await.as_deref(),
        Some("-"),
        "bot-b sees bot-a's cookie"
    );
    go(p, m, "bot-b", "/set/beta").await;
    assert_eq!(
        go(p, m, "bot-b", "/check/b2").await.as_deref(),
        Some("session=beta")
    );
    (a.slot, b.slot)
}

/// Reads the first websocket message of a gateway route, if any comes.
pub async fn gateway_greeting(upstream: &str, token: &str) -> Option<Vec<u8>> {
    use futures_util::StreamExt;
    let url = format!(
        "{}/websockify?token={token}",
        upstream.replacen("http://", "ws://", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
    match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
        Ok(Some(Ok(msg))) if msg.is_binary() || msg.is_text() => Some(msg.into_data().to_vec()),
        _ => None,
    }
}

/// The regression on a provider whose screens are reached through routes (the remote
/// providers): two bots at once on one Team Computer with separate displays and cookies,
/// routes that name only an upstream starting with `upstream_prefix` (a loopback forwarder for
/// the remote providers, the pod IP for kubernetes; never `hidden`, the vendor's host), a view
/// token refused once its slot is released and reused by another bot while the other bot's
/// route keeps working, and a profile that keeps its cookie across the release.
pub async fn over_routes(p: &dyn SandboxProvider, hidden: &str, upstream_prefix: &str) {
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    start_site(p, &m).await;
    let (a_slot, _) = cookies_stay_apart(p, &m).await;

    let ra = p.open_route(&m, "bot-a", ScreenPolicy::View).await.unwrap();
    let rb = p
        .open_route(&m, "bot-b", ScreenPolicy::Control)
        .await
        .unwrap();
    for r in [&ra, &rb] {
        assert!(r.upstream.starts_with(upstream_prefix), "{r:?}");
        assert!(
            !r.upstream.contains(hidden) && !r.upstream.contains(&m.0),
            "{r:?}"
        );
    }
    assert_ne!(ra.token, rb.token);
    for r in [&ra, &rb] {
        let greeting = gateway_greeting(&r.upstream, &r.token).await;
        assert!(greeting.is_some_and(|g| g.starts_with(b"RFB 003.008")));
    }

    // bot-a's slot is released and reused by bot-c: bot-a's old token is refused, bot-b's
    // route keeps working.
    p.close_screen(&m, "bot-a").await.unwrap();
    let c = p.open_screen(&m, "bot-c", a_slot).await.unwrap();
    assert_eq!(c.slot, a_slot, "the freed slot is reused");
    let rc = p.open_route(&m, "bot-c", ScreenPolicy::View).await.unwrap();
    assert_ne!(rc.token, ra.token);
    assert_eq!(gateway_greeting(&ra.upstream, &ra.token).await, None);
    assert!(gateway_greeting(&rc.upstream, &rc.token).await.is_some());
    assert!(gateway_greeting(&rb.upstream, &rb.token).await.is_some());

    // bot-a's profile persisted in the workspace: reopened in another slot it still has its
    // cookie, and bot-c has none.
    let a2 = p.open_screen(&m, "bot-a", 2).await.unwrap();
    assert_ne!(a2.slot, a_slot);
    assert_eq!(
        go(p, &m, "bot-a", "/check/a2").await.as_deref(),
        Some("session=alpha")
    );
    assert_eq!(go(p, &m, "bot-c", "/check/c1").await.as_deref(), Some("-"));
    p.destroy(&m).await.unwrap();
}
