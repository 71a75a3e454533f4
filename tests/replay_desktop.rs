//! Run replay on a real desktop (the `desktop` provider: Xvfb, x11vnc, our screen proxy): a
//! scripted run (observe, click, type, observe) and then a person's control session through
//! the proxy yield a replay whose frames are the very frames the bot saw and whose steps list
//! both actors in order (the session with input counts, never what was typed); the dashboard
//! plays it in headless Chromium, a click drawn over its frame, and keeps screenshots in
//! `target/dashboard-artifacts/`. With `RECORD_CONTROL_SESSIONS` on, the screen of the
//! person's session is recorded (sealed frames, deduplicated, replayed by `control.replay`);
//! off, the session is noted with its counts only; either way the typed text is stored nowhere.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{Backend, TestServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    let r = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await;
    assert_eq!(r["isError"], false, "{name}: {r}");
    r
}

fn image_of(result: &Value) -> Option<Vec<u8>> {
    result["content"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "image")
        .map(|img| {
            base64::engine::general_purpose::STANDARD
                .decode(img["data"].as_str().unwrap())
                .unwrap()
        })
}

/// A person's RFB client through the proxy: the handshake, then input.
struct Rfb {
    ws: Socket,
    buf: Vec<u8>,
}

impl Rfb {
    async fn connect(s: &TestServer, url: &str) -> Rfb {
        Rfb::connect_to(&s.base, url).await
    }

    async fn connect_to(base: &str, url: &str) -> Rfb {
        let path = url
            .split('?')
            .next()
            .unwrap()
            .replace("/vnc.html", "/websockify");
        let mut request = format!("{}{path}", base.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("sec-websocket-protocol", "binary".parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Rfb {
            ws,
            buf: Vec::new(),
        }
    }

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

    async fn pointer(&mut self, buttons: u8, x: u16, y: u16) {
        let (x, y) = (x.to_be_bytes(), y.to_be_bytes());
        self.send(&[5, buttons, x[0], x[1], y[0], y[1]]).await;
    }

    async fn key(&mut self, down: bool, keysym: u32) {
        let k = keysym.to_be_bytes();
        self.send(&[4, u8::from(down), 0, 0, k[0], k[1], k[2], k[3]])
            .await;
    }
}

/// Headless Chromium; killed (by its own pid) when dropped.
struct Chromium {
    child: Child,
    _profile: tempfile::TempDir,
    port: u16,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Chromium {
    async fn launch() -> Chromium {
        let bin = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("chromium is installed");
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1400,1000",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromium");
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok())
            {
                break port;
            }
            assert!(Instant::now() < deadline, "no DevToolsActivePort");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Chromium {
            child,
            _profile: profile,
            port,
        }
    }

    async fn page(&self) -> Cdp {
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = loop {
            let list: Value =
                match reqwest::get(format!("http://127.0.0.1:{}/json/list", self.port)).await {
                    Ok(r) => r.json().await.unwrap_or(Value::Null),
                    Err(_) => Value::Null,
                };
            if let Some(url) = list
                .as_array()
                .and_then(|l| l.iter().find(|t| t["type"] == "page"))
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                break url.to_owned();
            }
            assert!(Instant::now() < deadline, "no page target");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        Cdp { ws, id: 0 }
    }
}

/// A DevTools session on a page.
struct Cdp {
    ws: Socket,
    id: u64,
}

impl Cdp {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws.send(Message::text(msg)).await.unwrap();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(60), self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method}"))
                .expect("devtools socket open")
                .unwrap();
            let Message::Text(text) = frame else { continue };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == id {
                // An evaluation racing a navigation fails; the caller asks again.
                if v.get("error").is_some() && method != "Runtime.evaluate" {
                    panic!("{method}: {v}");
                }
                return v["result"].clone();
            }
        }
    }

    async fn eval(&mut self, expr: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "awaitPromise": true, "returnByValue": true }),
            )
            .await;
        r["result"]["value"].clone()
    }

    async fn wait_for(&mut self, what: &str, expr: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.eval(expr).await;
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            if Instant::now() > deadline {
                let text = self.eval("document.body.innerText").await;
                panic!("waited for {what}; the page says: {text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn shot(&mut self, name: &str) -> PathBuf {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let r = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// Headless Chromium on the dashboard, signed in as the operator, opening `run`'s replay.
async fn open_replay(s: &TestServer, run: &str) -> (Chromium, Cdp) {
    let chromium = Chromium::launch().await;
    let mut page = chromium.page().await;
    page.call("Page.enable", json!({})).await;
    page.call("Page.navigate", json!({ "url": format!("{}/", s.base) }))
        .await;
    page.wait_for("the dashboard", "document.readyState === 'complete'")
        .await;
    page.eval(&format!(
        "sessionStorage.setItem('rakazo.token', {}); true",
        json!(s.operator_token)
    ))
    .await;
    page.call(
        "Page.navigate",
        json!({ "url": format!("{}/?replay#replay={run}", s.base) }),
    )
    .await;
    (chromium, page)
}

#[actix_rt::test]
async fn a_scripted_run_and_a_control_session_replay_in_order_on_a_real_desktop() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;

    // The scripted run: observe, click, type, observe.
    let mut seen = Vec::new();
    let first = tool(&s, &run, fence, "computer_observe", json!({})).await;
    seen.push(first.clone());
    let click = tool(
        &s,
        &run,
        fence,
        "computer_act",
        json!({ "actions": [{ "type": "click", "x": 640, "y": 400 }] }),
    )
    .await;
    seen.push(click);
    let typed = tool(
        &s,
        &run,
        fence,
        "computer_act",
        json!({ "actions": [{ "type": "type", "text": "hello replay" }] }),
    )
    .await;
    seen.push(typed);
    let last = tool(&s, &run, fence, "computer_observe", json!({})).await;
    seen.push(last);

    // Then a person: the bot asks, they take control, click and press keys through the proxy.
    let (control, url) = take_control(&s, &run, fence, bot).await;
    let mut person = Rfb::connect(&s, &url).await;
    person.handshake().await;
    person.pointer(0, 100, 100).await;
    person.pointer(1, 100, 100).await;
    person.pointer(0, 100, 100).await;
    for key in [0x61u32, 0x62, 0x63] {
        person.key(true, key).await;
        person.key(false, key).await;
    }
    person.ws.close(None).await.unwrap();
    // The proxy relays all of it before it answers the close.
    while let Ok(Some(Ok(_))) =
        tokio::time::timeout(Duration::from_secs(10), person.ws.next()).await
    {}
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;

    // The session is noted when its socket closes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let replay = loop {
        let r = s.ok("run.replay", json!({ "runId": run })).await;
        if r["steps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["actor"] == "user")
        {
            break r;
        }
        assert!(Instant::now() < deadline, "no control session in {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let steps = replay["steps"].as_array().unwrap();
    let order: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| {
            (
                s["actor"].as_str().unwrap(),
                s["tool"].as_str().or(s["kind"].as_str()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("bot", "computer_observe"),
            ("bot", "computer_act"),
            ("bot", "computer_act"),
            ("bot", "computer_observe"),
            ("user", "control.session"),
        ],
        "{replay}"
    );
    assert!(
        steps
            .windows(2)
            .all(|w| w[0]["position"].as_i64() < w[1]["position"].as_i64())
    );
    assert_eq!(steps[1]["actions"][0]["x"], 640);
    assert_eq!(steps[1]["actions"][0]["y"], 400);
    let session = &steps[4]["session"];
    assert_eq!(session["inputs"]["clicks"], 1, "{session}");
    assert_eq!(session["inputs"]["keys"], 3, "{session}");
    assert_eq!(session["counted"], true);
    assert_eq!(session["closedBy"], "client");
    assert!(!steps[4].to_string().contains("\"abc\""));
    assert!(steps[4]["actorId"].is_string());

    // Every frame is the frame the bot saw.
    for (step, result) in steps.iter().zip(&seen) {
        let digest = result["structuredContent"]["frameDigest"].as_str().unwrap();
        assert_eq!(step["frame"]["digest"], digest);
        let frame = s
            .ok("run.replayFrame", json!({ "runId": run, "digest": digest }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(frame["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(blake3::hash(&png).to_hex().to_string(), digest);
        if let Some(shown) = image_of(result) {
            assert_eq!(
                png, shown,
                "the replayed frame differs from the observation"
            );
        }
        assert_eq!(frame["width"], 1280);
        assert_eq!(frame["height"], 800);
    }

    // The dashboard plays it: step by step, the click drawn over the frame the bot clicked on.
    let (_chromium, mut page) = open_replay(&s, &run).await;
    page.wait_for(
        "the replay",
        "document.querySelector('[data-role=replay]')?.dataset.ready === 'true' && document.querySelector('[data-role=replay]').dataset.step === '0'",
    )
    .await;
    let count = page
        .eval("Number(document.querySelector('[data-role=replay]').dataset.steps)")
        .await;
    assert_eq!(count, 5);
    page.shot("replay-0-observe").await;
    let mut actors = vec![
        page.eval("document.querySelector('[data-role=replay]').dataset.actor")
            .await,
    ];
    for i in 1..5 {
        page.eval("document.querySelector('[data-action=replay-next]').click(); true")
            .await;
        page.wait_for(
            "the next step",
            &format!("document.querySelector('[data-role=replay]').dataset.step === '{i}'"),
        )
        .await;
        actors.push(
            page.eval("document.querySelector('[data-role=replay]').dataset.actor")
                .await,
        );
        if i == 1 {
            let marks = page
                .eval("Number(document.querySelector('[data-role=replay]').dataset.marks)")
                .await;
            assert_eq!(marks, 1);
            // The click's dot, in the bot's colour, at the point it clicked.
            let pixel = page
                .eval(
                    "Array.from(document.querySelector('[data-role=replay-frame]').getContext('2d').getImageData(640, 400, 1, 1).data)",
                )
                .await;
            assert_eq!(pixel, json!([228, 87, 46, 255]), "{pixel}");
            let shot = page.shot("replay-1-click").await;
            assert!(std::fs::metadata(shot).unwrap().len() > 1000);
        }
    }
    page.shot("replay-4-person").await;
    assert_eq!(
        actors,
        [
            json!("bot"),
            json!("bot"),
            json!("bot"),
            json!("bot"),
            json!("user")
        ]
    );
    let caption = page
        .eval("document.querySelector('[data-role=replay-caption]').textContent")
        .await;
    assert!(
        caption.as_str().unwrap().contains("1 clicks, 3 keys"),
        "{caption}"
    );
}

/// The keys a person types in [`typed_session`]: the text never to be found stored.
const TYPED: &str = "zqxsecretzqx";

/// A run that looked at its screen, then a person's control session through the proxy at
/// `proxy` (the API's own when it is `s.base`): a click and [`TYPED`] typed, held for
/// `hold`. Answers the run, the computer and the session's timeline entry.
async fn typed_session(s: &TestServer, proxy: &str, hold: Duration) -> (String, String, Value) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    tool(s, &run, fence, "computer_observe", json!({})).await;
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (control, url) = take_control(s, &run, fence, bot).await;
    let mut person = Rfb::connect_to(proxy, &url).await;
    person.handshake().await;
    person.pointer(1, 200, 200).await;
    person.pointer(0, 200, 200).await;
    for c in TYPED.bytes() {
        person.key(true, u32::from(c)).await;
        person.key(false, u32::from(c)).await;
    }
    tokio::time::sleep(hold).await;
    person.ws.close(None).await.unwrap();
    while let Ok(Some(Ok(_))) =
        tokio::time::timeout(Duration::from_secs(10), person.ws.next()).await
    {}
    let deadline = Instant::now() + Duration::from_secs(30);
    let entry = loop {
        let t = s
            .ok("activity.timeline", json!({ "computerId": computer }))
            .await;
        if let Some(e) = t["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "control.session")
        {
            break e.clone();
        }
        assert!(Instant::now() < deadline, "no control session in {t}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    (run, computer, entry)
}

/// The bot asks for a person and one takes control: the grant and its control URL.
async fn take_control(s: &TestServer, run: &str, fence: i64, bot: &str) -> (Value, String) {
    tool(
        s,
        run,
        fence,
        "request_takeover",
        json!({ "reason": "check" }),
    )
    .await;
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let url = control["controlUrl"]["url"].as_str().unwrap().to_owned();
    (control, url)
}

/// Every stored row of the timeline and the recordings, as text (sealed frames as bytes).
async fn stored_rows(s: &TestServer) -> String {
    use rakazo_actors::entity::{recording_frame, recording_step, timeline_entry};
    use sea_orm::EntityTrait;
    let db = &s.app.db;
    let entries = timeline_entry::Entity::find().all(db).await.unwrap();
    let steps = recording_step::Entity::find().all(db).await.unwrap();
    let frames: Vec<_> = recording_frame::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|f| {
            (
                f.run_id,
                f.digest,
                f.computer_id,
                f.width,
                f.height,
                f.created_at_ms,
            )
        })
        .collect();
    format!("{entries:?}\n{steps:?}\n{frames:?}")
}

#[actix_rt::test]
async fn with_record_control_sessions_on_a_person_s_screen_is_recorded_and_replays() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "desktop"),
            ("RAKAZO_ENV", "test"),
            ("RECORD_CONTROL_SESSIONS", "true"),
        ],
    )
    .await
    .unwrap();
    let (run, computer, entry) = typed_session(&s, &s.base, Duration::from_millis(2500)).await;
    let session = &entry["detail"];
    assert_eq!(session["inputs"]["keys"], TYPED.len(), "{entry}");
    let recording = &session["recording"];
    let id = recording["id"]
        .as_str()
        .expect("the entry names its recording");
    assert!(recording["frames"].as_u64().unwrap() >= 1, "{recording}");
    assert!(recording["bytes"].as_i64().unwrap() > 0, "{recording}");

    let replay = s.ok("control.replay", json!({ "recordingId": id })).await;
    assert_eq!(replay["computerId"], computer.as_str());
    let frames = replay["frames"].as_array().unwrap();
    assert_eq!(frames.len() as u64, recording["frames"].as_u64().unwrap());
    // A sample equal to the one before is no new step.
    assert!(frames.windows(2).all(|w| w[0]["digest"] != w[1]["digest"]));
    for f in frames {
        let digest = f["digest"].as_str().unwrap();
        let frame = s
            .ok(
                "control.replayFrame",
                json!({ "recordingId": id, "digest": digest }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(frame["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(blake3::hash(&png).to_hex().to_string(), digest);
        assert_eq!(
            (frame["width"].clone(), frame["height"].clone()),
            (json!(1280), json!(800))
        );
    }
    // Stored sealed, never as text; what was typed is in no row.
    let rows = stored_rows(&s).await;
    assert!(rows.contains(id), "the recording is stored");
    assert!(!rows.contains(TYPED), "typed text stored: {rows}");

    // Only people of the space read it: never a bot token (which may view the screen), nor
    // another user; a view URL reaches nothing but the screen.
    let bot = replay["botId"].as_str().unwrap();
    let bot_token = s.ok("token.createForBot", json!({ "botId": bot })).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for method in ["control.replay", "control.replayFrame"] {
        let p = json!({ "recordingId": id, "digest": frames[0]["digest"] });
        let p = if method == "control.replay" {
            json!({ "recordingId": id })
        } else {
            p
        };
        let got = s.call_as(&bot_token, method, p.clone()).await;
        assert_eq!(got.unwrap_err().1, "FORBIDDEN", "{method} as the bot");
        let stranger = s.ok("user.create", json!({ "name": "stranger" })).await["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let got = s.call_as(&stranger, method, p).await;
        assert_eq!(got.unwrap_err().1, "NOT_FOUND", "{method} as a stranger");
    }
    let view = s
        .call_as(&bot_token, "computer.screenUrl", json!({ "botId": bot }))
        .await
        .unwrap();
    let view_url = view["url"].as_str().unwrap();
    let base = view_url.split("/vnc.html").next().unwrap();
    for tail in ["recording", &format!("recording/{id}"), "control.replay"] {
        let resp = s
            .http
            .get(format!("{}{base}/{tail}", s.base))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_client_error(), "{tail}: {}", resp.status());
    }

    // The dashboard plays the recorded screen at the person's step of the run's replay.
    let (_chromium, mut page) = open_replay(&s, &run).await;
    page.wait_for(
        "the replay",
        "document.querySelector('[data-role=replay]')?.dataset.ready === 'true'",
    )
    .await;
    page.eval("document.querySelector('li[data-actor=user]').click(); true")
        .await;
    let count = frames.len();
    page.wait_for(
        "the session's recorded screen",
        &format!(
            "document.querySelector('[data-role=replay]').dataset.sessionFrames === '{count}'"
        ),
    )
    .await;
    page.eval("document.querySelector('[data-action=replay-session]').click(); true")
        .await;
    page.wait_for(
        "the recording played to its end",
        &format!(
            "document.querySelector('[data-role=replay]').dataset.sessionFrame === '{}'",
            count - 1
        ),
    )
    .await;
    let shot = page.shot("replay-session-recording").await;
    assert!(std::fs::metadata(shot).unwrap().len() > 1000);
}

#[actix_rt::test]
async fn with_record_control_sessions_off_a_session_is_counted_only() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (_, _, entry) = typed_session(&s, &s.base, Duration::from_millis(1500)).await;
    let session = &entry["detail"];
    assert_eq!(session["inputs"]["keys"], TYPED.len(), "{entry}");
    assert_eq!(session["inputs"]["clicks"], 1, "{entry}");
    assert!(session.get("recording").is_none(), "{entry}");
    let rows = stored_rows(&s).await;
    assert!(!rows.contains("control.frame"), "{rows}");
    assert!(!rows.contains("ctl_"), "{rows}");
    assert!(!rows.contains(TYPED), "typed text stored: {rows}");
}

/// `rakazo screen-proxy` in its own process beside the test's API; killed when dropped.
struct ProxyProcess {
    child: Child,
    base: String,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ProxyProcess {
    fn start(s: &TestServer) -> ProxyProcess {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_rakazo"))
            .args(["screen-proxy", "--listen", "127.0.0.1:0", "--api", &s.base])
            .env("DATA_DIR", &s.app.config.data_dir)
            .env("SCREEN_NOVNC_DIR", &s.app.config.novnc_dir)
            .env("RAKAZO_ENV", "test")
            .env_remove("RAKAZO_INTERNAL_TOKEN")
            .env_remove("SCREEN_CAPABILITY_SECRET")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the screen proxy");
        // Logs go to stdout too: the address is the line that says it.
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let base = loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the proxy ended");
            if let Some(base) = line.trim().strip_prefix("screen proxy listening on ") {
                break base.to_owned();
            }
        };
        // Keep draining its output so that it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        ProxyProcess { child, base }
    }
}

#[actix_rt::test]
async fn a_screen_proxy_in_its_own_process_reports_sessions_to_the_same_record() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "desktop"),
            ("RAKAZO_ENV", "test"),
            ("RECORD_CONTROL_SESSIONS", "true"),
        ],
    )
    .await
    .unwrap();
    let proxy = ProxyProcess::start(&s);
    assert_ne!(proxy.base, s.base);
    let (_, _, entry) = typed_session(&s, &proxy.base, Duration::from_millis(2000)).await;
    let session = &entry["detail"];
    assert_eq!(entry["actor"], "user", "{entry}");
    assert_eq!(session["inputs"]["keys"], TYPED.len(), "{entry}");
    assert_eq!(session["inputs"]["clicks"], 1, "{entry}");
    assert_eq!(session["closedBy"], "client", "{entry}");
    let id = session["recording"]["id"].as_str().expect("recorded");
    let replay = s.ok("control.replay", json!({ "recordingId": id })).await;
    assert!(!replay["frames"].as_array().unwrap().is_empty(), "{replay}");
    assert!(!stored_rows(&s).await.contains(TYPED));

    // Only the internal credential may report: an operator token or none is refused, and a
    // forged session is noted nowhere.
    let forged = json!({ "event": "ended", "session": {
        "id": "forged", "computerId": replay["computerId"], "botId": replay["botId"], "fence": 1,
        "socket": "screen", "startedAtMs": 0, "endedAtMs": 1, "inputs": {}, "counted": true,
        "closedBy": "client",
    }});
    for bearer in [Some(s.operator_token.as_str()), None] {
        let mut req = s
            .http
            .post(format!("{}/internal/control-session", s.base))
            .json(&forged);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        assert_eq!(req.send().await.unwrap().status(), 401);
    }
    let accepted = s
        .http
        .post(format!("{}/internal/control-session", s.base))
        .bearer_auth(&s.app.internal_token.0)
        .json(&json!({ "event": "ended", "session": { "id": "x" } }))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 400, "a malformed report");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = s
        .ok(
            "activity.timeline",
            json!({ "computerId": replay["computerId"] }),
        )
        .await;
    let sessions = t["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "control.session")
        .count();
    assert_eq!(sessions, 1, "{t}");
}

/// A proxy in its own process hears no revocation: it asks the API where its sockets stand.
/// The API answers from its tables (a live control grant with its expiry, a view on the
/// current generation, a retired one; then the ended grant), a released control grant closes
/// the person's control socket relayed there within a second, and the endpoint answers only
/// the internal credential.
#[actix_rt::test]
async fn a_screen_proxy_in_its_own_process_closes_a_released_control_socket() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    let proxy = ProxyProcess::start(&s);
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    tool(&s, &run, fence, "computer_observe", json!({})).await;
    let (control, url) = take_control(&s, &run, fence, bot).await;
    let mut person = Rfb::connect_to(&proxy.base, &url).await;
    person.handshake().await;
    person.pointer(0, 10, 10).await;
    // What the proxy asks, and what the API answers from its tables.
    let row = {
        use rakazo_actors::entity::screen;
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        screen::Entity::find()
            .filter(screen::Column::BotId.eq(bot.as_str()))
            .one(&s.app.db)
            .await
            .unwrap()
            .unwrap()
    };
    let scope = |policy: &str, generation: i64, fence: &Value| {
        json!({ "computerId": row.computer_id, "botId": bot, "slot": row.slot,
                "generation": generation, "policy": policy, "fence": fence,
                "expiresAtMs": 4_102_444_800_000u64 })
    };
    let ask = || async {
        let scopes = [
            scope("control", row.generation, &control["fence"]),
            scope("view", row.generation, &json!(0)),
            scope("view", row.generation + 1, &json!(0)),
        ];
        let answer: Value = s
            .http
            .post(format!("{}/internal/screen-standing", s.base))
            .bearer_auth(&s.app.internal_token.0)
            .json(&json!({ "scopes": scopes }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["standing"].clone()
    };
    let before = ask().await;
    assert_eq!(before[0]["standing"], "holds", "{before}");
    assert!(before[0]["expiresAtMs"].as_u64().is_some(), "{before}");
    assert_eq!(before[1], json!({ "standing": "holds" }), "{before}");
    assert_eq!(before[2], json!({ "standing": "slotRetired" }), "{before}");
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    let released = Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), person.ws.next())
            .await
            .expect("the released socket stayed open")
        {
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "closed {:?} after the release",
        released.elapsed()
    );
    let after = ask().await;
    assert_eq!(after[0], json!({ "standing": "controlEnded" }), "{after}");
    assert_eq!(after[1], json!({ "standing": "holds" }), "{after}");

    for bearer in [Some(s.operator_token.as_str()), None] {
        let mut req = s
            .http
            .post(format!("{}/internal/screen-standing", s.base))
            .json(&json!({ "scopes": [] }));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        assert_eq!(req.send().await.unwrap().status(), 401);
    }
}
