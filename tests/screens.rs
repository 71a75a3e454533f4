//! Live screens for people, end to end on the `desktop` provider: a real Xvfb, x11vnc behind
//! websockify, our screen proxy and sealed capabilities issued through the RPC API.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn desktop_server() -> TestServer {
    TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap()
}

async fn connect(s: &TestServer, url: &str) -> Result<Client, tungstenite::Error> {
    let path = url
        .split('?')
        .next()
        .unwrap()
        .replace("/vnc.html", "/websockify");
    let mut request = format!("{}{path}", s.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(ws, _)| ws)
}

/// Reads an RFB stream out of websocket frames.
struct Rfb {
    ws: Client,
    buf: Vec<u8>,
}

impl Rfb {
    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), self.ws.next())
                .await
                .expect("RFB data")
            {
                Some(Ok(Message::Binary(b))) => self.buf.extend_from_slice(&b),
                Some(Ok(_)) => {}
                other => panic!("socket ended: {other:?}"),
            }
        }
        self.buf.drain(..n).collect()
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::Binary(bytes.to_vec().into()))
            .await
            .unwrap();
    }

    async fn handshake(&mut self) {
        assert_eq!(self.read(12).await, b"RFB 003.008\n");
        self.send(b"RFB 003.008\n").await;
        let count = self.read(1).await[0] as usize;
        let types = self.read(count).await;
        assert!(types.contains(&1), "{types:?}");
        self.send(&[1]).await;
        assert_eq!(self.read(4).await, [0, 0, 0, 0]);
        self.send(&[1]).await;
        let init = self.read(24).await;
        let name = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
        self.read(name).await;
    }

    async fn pointer(&mut self, x: u16, y: u16) {
        let (x, y) = (x.to_be_bytes(), y.to_be_bytes());
        self.send(&[5, 0, x[0], x[1], y[0], y[1]]).await;
    }
}

/// The X display of the only screen of the test's data dir.
fn display_of(data_dir: &Path) -> String {
    let run = data_dir.join("run/desktop");
    for machine in std::fs::read_dir(run).unwrap().flatten() {
        for f in std::fs::read_dir(machine.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("xvfb-")
                .and_then(|n| n.strip_suffix(".log"))
            {
                return format!(":{n}");
            }
        }
    }
    panic!("no display");
}

fn pointer_at(display: &str) -> (i32, i32) {
    let out = Command::new("xdotool")
        .args(["getmouselocation", "--shell"])
        .env("DISPLAY", display)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1)
    };
    (field("X="), field("Y="))
}

async fn settle_pointer(display: &str, want: (i32, i32)) -> (i32, i32) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let now = pointer_at(display);
        if now == want || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn closed_within(ws: &mut Client, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Err(_) => return false,
            Ok(None | Some(Err(_)) | Some(Ok(Message::Close(_)))) => return true,
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[actix_rt::test]
async fn view_watches_control_drives_and_old_links_die() {
    let s = desktop_server().await;
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    // A person watches: the view URL reaches a real x11vnc, and never moves the pointer.
    let view = s.ok("computer.screenUrl", json!({ "botId": bot })).await;
    let view_url = view["url"].as_str().unwrap().to_owned();
    assert!(view_url.starts_with("/screen/") && !view_url.contains("127.0.0.1"));
    let display = display_of(&s.app.config.data_dir);
    let mut watcher = Rfb {
        ws: connect(&s, &view_url).await.unwrap(),
        buf: Vec::new(),
    };
    watcher.handshake().await;
    let before = pointer_at(&display);
    watcher.pointer(101, 77).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pointer_at(&display),
        before,
        "a view capability moved the pointer"
    );

    // The page is the proxy's own packaged viewer naming the reporter, sandboxed, never cached
    // by intermediaries.
    let page = s
        .http
        .get(format!("{}{}", s.base, view_url))
        .send()
        .await
        .unwrap();
    assert!(
        page.headers()["cache-control"]
            .to_str()
            .unwrap()
            .contains("no-transform")
    );
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox allow-scripts;")
    );
    let html = page.text().await.unwrap();
    assert!(
        html.contains("<script src=\"rakazo-reporter.js\"></script>")
            && !html.contains("127.0.0.1")
    );

    // Take control: the control URL drives the pointer.
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let control_url = control["controlUrl"]["url"].as_str().unwrap().to_owned();
    // Host computers never expose a browser shell.
    let no_shell = s
        .call("computer.terminalUrl", json!({ "botId": bot }))
        .await
        .unwrap_err();
    assert_eq!((no_shell.0, no_shell.1.as_str()), (422, "UNSUPPORTED"));
    let mut driver = Rfb {
        ws: connect(&s, &control_url).await.unwrap(),
        buf: Vec::new(),
    };
    driver.handshake().await;
    driver.pointer(333, 222).await;
    assert_eq!(settle_pointer(&display, (333, 222)).await, (333, 222));

    // Release: the live control socket closes within a second, its URL is refused; the view
    // keeps working.
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    assert!(
        closed_within(&mut driver.ws, Duration::from_secs(1)).await,
        "control socket still open"
    );
    assert!(
        connect(&s, &control_url).await.is_err(),
        "a released control URL still connects"
    );
    let mut again = Rfb {
        ws: connect(&s, &view_url).await.unwrap(),
        buf: Vec::new(),
    };
    again.handshake().await;

    // A failed run tears the screen down: old view links die, and stay dead after the slot
    // serves the next screen.
    let (run, fence) = s.start_run(bot).await;
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "failed" }),
    )
    .await;
    assert!(
        closed_within(&mut watcher.ws, Duration::from_secs(2)).await,
        "view socket survived teardown"
    );
    let fresh = s.ok("computer.screenUrl", json!({ "botId": bot })).await;
    assert_ne!(fresh["generation"], view["generation"]);
    assert!(
        connect(&s, &view_url).await.is_err(),
        "an old view URL reached the reused slot"
    );
    let mut newest = Rfb {
        ws: connect(&s, fresh["url"].as_str().unwrap()).await.unwrap(),
        buf: Vec::new(),
    };
    newest.handshake().await;
}

#[actix_rt::test]
async fn tampered_or_foreign_capabilities_are_refused() {
    let s = desktop_server().await;
    let (_, bots) = s.space_with_bots(1, "team").await;
    let view = s
        .ok("computer.screenUrl", json!({ "botId": bots[0] }))
        .await;
    let url = view["url"].as_str().unwrap();
    let token = url
        .trim_start_matches("/screen/")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut chars: Vec<char> = token.chars().collect();
    let mid = chars.len() / 2;
    chars[mid] = if chars[mid] == 'A' { 'B' } else { 'A' };
    let tampered: String = chars.into_iter().collect();
    let resp = s
        .http
        .get(format!("{}/screen/{tampered}/vnc.html", s.base))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(resp.headers()["x-rakazo-screen-reason"], "invalid_path");
    // A capability sealed by another deployment's key is refused the same way.
    let other = desktop_server().await;
    let resp = other
        .http
        .get(format!("{}{}", other.base, url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let body: Value = s
        .http
        .get(format!("{}{}", s.base, url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .map(|t| json!(t))
        .unwrap();
    assert!(body.as_str().unwrap().contains("rakazo-reporter.js"));
}

/// Without noVNC's files on the host, screen pages are refused with a stable reason and the
/// health report says what to install; the RFB relay itself still works.
#[actix_rt::test]
async fn without_novnc_screens_say_what_is_missing() {
    let missing = tempfile::tempdir().unwrap();
    let dir = missing.path().join("novnc").display().to_string();
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "desktop"),
            ("RAKAZO_ENV", "test"),
            ("SCREEN_NOVNC_DIR", &dir),
        ],
    )
    .await
    .unwrap();
    let health = s.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    let why = health["screenViewerError"].as_str().unwrap();
    assert!(why.contains(&dir) && why.contains("novnc package"), "{why}");
    let (_, bots) = s.space_with_bots(1, "team").await;
    let url = s
        .ok("computer.screenUrl", json!({ "botId": bots[0] }))
        .await["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let resp = s
        .http
        .get(format!("{}{url}", s.base))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["x-rakazo-screen-reason"], "viewer_missing");
    assert_eq!(resp.headers()["x-rakazo-screen-detail"], "novnc_missing");
    let mut rfb = Rfb {
        ws: connect(&s, &url).await.unwrap(),
        buf: Vec::new(),
    };
    rfb.handshake().await;
}

/// At the Team screen limit a new screen takes the place of the oldest idle one, never a
/// screen a person controls nor the screen of a bot whose run executes; the evicted bot's row,
/// its `screen.state` event and its old URLs all say it is gone.
#[actix_rt::test]
async fn eviction_at_the_limit_spares_controlled_and_running_screens() {
    use rakazo_actors::entity::screen;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "desktop"),
            ("RAKAZO_ENV", "test"),
            ("SANDBOX_TEAM_SCREEN_LIMIT", "2"),
        ],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(3, "team").await;
    let (held, running, newcomer) = (&bots[0], &bots[1], &bots[2]);
    let mut events = s.app.registry.runtime().events.subscribe();
    let row = |bot: &str| {
        let (db, bot) = (s.app.db.clone(), bot.to_owned());
        async move {
            screen::Entity::find()
                .filter(screen::Column::BotId.eq(bot))
                .one(&db)
                .await
                .unwrap()
                .expect("a screen row")
        }
    };

    // A person controls the first bot's screen; the second bot's run executes on its own.
    let control = s.ok("computer.takeControl", json!({ "botId": held })).await;
    let control_url = control["controlUrl"]["url"].as_str().unwrap().to_owned();
    let mut driver = Rfb {
        ws: connect(&s, &control_url).await.unwrap(),
        buf: Vec::new(),
    };
    driver.handshake().await;
    let (run, fence) = s.start_run(running).await;
    let view = s
        .ok("computer.screenUrl", json!({ "botId": running }))
        .await;
    let view_url = view["url"].as_str().unwrap().to_owned();

    // Nothing may give way: the third bot is refused, the two screens stay as they were.
    let refused = s
        .call("computer.screenUrl", json!({ "botId": newcomer }))
        .await
        .unwrap_err();
    assert_eq!(refused.1, "MULTI_SCREEN_UNAVAILABLE", "{refused:?}");
    assert_eq!(row(running).await.state, "active");
    assert_eq!(row(held).await.state, "active");

    // The run completes: its screen stays, now idle and uncontrolled, and a person watches it.
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    let mut watcher = Rfb {
        ws: connect(&s, &view_url).await.unwrap(),
        buf: Vec::new(),
    };
    watcher.handshake().await;

    // The third bot's screen opens in its place.
    let fresh = s
        .ok("computer.screenUrl", json!({ "botId": newcomer }))
        .await;
    let mut newest = Rfb {
        ws: connect(&s, fresh["url"].as_str().unwrap()).await.unwrap(),
        buf: Vec::new(),
    };
    newest.handshake().await;
    assert!(
        closed_within(&mut watcher.ws, Duration::from_secs(2)).await,
        "the evicted screen's socket is still open"
    );
    assert!(
        connect(&s, &view_url).await.is_err(),
        "an evicted screen's URL still connects"
    );
    let evicted = row(running).await;
    assert_eq!(
        (evicted.state.as_str(), evicted.slot),
        ("evicted", None),
        "{evicted:?}"
    );
    assert!(evicted.generation > view["generation"].as_i64().unwrap());
    let said = loop {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("a screen.state event for the evicted bot")
            .unwrap();
        if event.topic == rakazo_actors::events::Topic::ScreenState
            && event.data["botId"] == json!(running)
            && event.data["state"] != "active"
        {
            break event.data;
        }
    };
    assert_eq!(said["state"], "evicted", "{said}");
    assert_eq!(said["generation"], json!(evicted.generation));

    // The controlled screen was never touched: same generation, its URL still connects.
    let kept = row(held).await;
    assert_eq!(
        (kept.state.as_str(), kept.generation),
        (
            "active",
            control["controlUrl"]["generation"].as_i64().unwrap()
        ),
    );
    let mut second = Rfb {
        ws: connect(&s, &control_url).await.unwrap(),
        buf: Vec::new(),
    };
    second.handshake().await;

    // The evicted bot comes back by evicting the oldest idle screen again (the newcomer's),
    // never the controlled one.
    let back = s
        .ok("computer.screenUrl", json!({ "botId": running }))
        .await;
    assert!(back["generation"].as_i64().unwrap() > evicted.generation);
    assert_eq!(row(newcomer).await.state, "evicted");
    assert_eq!(row(held).await.state, "active");
    drop(driver);
}
