//! Tool-call overhead, side by side in one run: `shell` running `true` and
//! `computer_observe` through the JSON-RPC API (HTTP on loopback, auth, lease fence check,
//! actor mailbox, activity record) against the same calls made straight on the provider.
//! Uses the host `desktop` provider (real Xvfb and Chromium). Both browsers show a page that
//! repaints all the time, so every observation captures and encodes a fresh screenshot and
//! every answer carries it; the calls go over `POST /rpc`, over `/rpc/ws` with the image as
//! base64, and over `/rpc/ws?images=binary` with the image as a binary message.
//!
//! Then `browser_snapshot` on the provider straight (the page tools' DevTools round trips:
//! following the tab on the screen, the isolated world, the snapshot script) against the least
//! a snapshot needs: the same script evaluated once over a DevTools connection of its own; and
//! `browser_navigate` against `Page.navigate` and the load event on that connection.
//!
//! Last, `shell` on the in-process `fake` provider shows what the API adds with no process
//! start around it.
//!
//! Run: `scripts/bench.sh tools`; `cargo bench --bench tools -- fake` runs the last leg alone,
//! `-- spawn` only the start of a script by a server holding much memory, `-- page` only the
//! page commands, `-- observe` only the observations (`BENCH_ROUNDS` rounds, 50 unless set).
//! The bench applies the server's allocator settings (`rakazo::malloc`) as `main` does;
//! `RAKAZO_BENCH_MALLOC=default` leaves glibc's own, for the figure beside them.

mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use rakazo::app::App;
use rakazo::config::Config;
use rakazo_actors::provider::{
    BrowserCommand, ExecRequest, MachineSpec, ProviderRef, SandboxProvider,
};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A page that repaints every few milliseconds: text like a real site, and a clock.
const REPAINTING_PAGE: &str = "<!doctype html><body style='font:14px serif'><h1 id=t></h1>\
<script>for(let i=0;i<400;i++)document.write('<span style=color:#'+(i*2654435761%16777216).toString(16).padStart(6,0)+'>Rakazo desktop '+i+' </span>');\
setInterval(()=>{t.textContent=performance.now().toFixed(1)},5)</script></body>";

/// One JSON-RPC socket on `/rpc/ws` (with `?images=binary` when `binary`).
struct Ws {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Ws {
    async fn connect(base: &str, token: &str, binary: bool) -> Ws {
        let query = if binary { "?images=binary" } else { "" };
        let mut request = format!("{}/rpc/ws{query}", base.replace("http://", "ws://"))
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Ws { ws, next_id: 1 }
    }

    /// One call: its result and the bytes of binary messages that came with it.
    async fn call(&mut self, method: &str, params: Value) -> (Value, usize) {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.ws
            .send(Message::Text(body.to_string().into()))
            .await
            .unwrap();
        let mut binary = 0;
        loop {
            match self.ws.next().await.unwrap().unwrap() {
                Message::Binary(b) => binary += b.len(),
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    assert!(v.get("error").is_none(), "{method}: {v}");
                    return (v["result"].clone(), binary);
                }
                _ => {}
            }
        }
    }
}

/// Whether a tool answer carries an image (base64 or as an attachment).
fn has_image(result: &Value) -> bool {
    result["content"]
        .as_array()
        .is_some_and(|c| c.iter().any(|i| i["type"] == "image"))
}

const ROUNDS: usize = 200;
/// Pause before each timed navigation: the page before it has loaded and drawn.
const SETTLE: Duration = Duration::from_millis(300);
/// Pause before each timed observe: longer than one of the browser's frames (16.7 ms).
const FRAME_PAUSE: Duration = Duration::from_millis(25);

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e3
}

fn report(label: &str, raw: Vec<Duration>, rpc: Vec<Duration>) {
    let (r50, r95, a50, a95) = (
        percentile(raw.clone(), 0.5),
        percentile(raw, 0.95),
        percentile(rpc.clone(), 0.5),
        percentile(rpc, 0.95),
    );
    println!(
        "{label}: raw p50 {r50:.2} ms p95 {r95:.2} ms | rpc p50 {a50:.2} ms p95 {a95:.2} ms | overhead p50 +{:.2} ms (ratio {:.2})",
        a50 - r50,
        a50 / r50.max(1e-9)
    );
}

/// The API on loopback over `provider`, with a Private Computer's bot and its run started.
struct Api {
    dir: tempfile::TempDir,
    app: std::sync::Arc<App>,
    base: String,
    token: String,
    http: reqwest::Client,
    /// `run.start`'s answer.
    started: Value,
}

impl Api {
    async fn start(provider: &str) -> Api {
        let dir = tempfile::tempdir().unwrap();
        let env: std::collections::HashMap<String, String> = [
            ("DATA_DIR", dir.path().display().to_string()),
            ("SANDBOX_PROVIDER", provider.to_owned()),
            ("RAKAZO_ENV", "test".into()),
            ("RAKAZO_LOG", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        // `RECORDING_MAX_RUN_BYTES=1` measures the calls without storing their frames.
        .chain(
            std::env::var("RECORDING_MAX_RUN_BYTES")
                .ok()
                .map(|v| ("RECORDING_MAX_RUN_BYTES".to_owned(), v)),
        )
        .collect();
        let (app, token) = App::start(Config::load(&env, None).unwrap()).await.unwrap();
        let token = token.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        actix_rt::spawn(rakazo::server::build(app.clone(), listener, 1).unwrap());
        let http = reqwest::Client::new();
        let space = support::rpc(
            &http,
            &base,
            &token,
            "space.create",
            json!({ "name": "bench" }),
        )
        .await;
        let bot = support::rpc(
            &http,
            &base,
            &token,
            "bot.create",
            json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" }),
        )
        .await;
        let started = support::rpc(
            &http,
            &base,
            &token,
            "run.start",
            json!({ "botId": bot["id"] }),
        )
        .await;
        Api {
            dir,
            app,
            base,
            token,
            http,
            started,
        }
    }
}

fn main() {
    // The server's allocator settings, as `rakazo serve` has them; `RAKAZO_BENCH_MALLOC=default`
    // leaves glibc's own, for the side-by-side figure.
    if std::env::var("RAKAZO_BENCH_MALLOC").as_deref() != Ok("default") {
        assert!(rakazo::malloc::tune(), "glibc took the allocator settings");
    }
    // `cargo bench --bench tools -- fake`: only the fake provider's leg, on a quiet machine.
    if std::env::args().skip(1).any(|a| a == "fake") {
        actix_rt::System::new().block_on(shell_on_the_fake_provider());
        return;
    }
    // `cargo bench --bench tools -- spawn`: only the script start of a large server.
    if std::env::args().skip(1).any(|a| a == "spawn") {
        actix_rt::System::new().block_on(scripts_of_a_large_server());
        return;
    }
    // `cargo bench --bench tools -- page`: only the page commands.
    let only_page = std::env::args().skip(1).any(|a| a == "page");
    // `cargo bench --bench tools -- observe`: only the observations (`BENCH_ROUNDS` of each).
    let only_observe = std::env::args().skip(1).any(|a| a == "observe");
    let observe_rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS / 4);
    actix_rt::System::new().block_on(async {
        let Api { dir, app, base, token, http, started } = Api::start("desktop").await;
        let (run, fence) = (started["run"]["id"].clone(), started["lease"]["fence"].clone());
        let call = |name: &str, arguments: Value| json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments });
        // Warm up: the machine, the screen and the browser exist before timing.
        support::rpc(&http, &base, &token, "tools/call", call("computer_observe", json!({}))).await;

        // Raw: the same provider, a separate machine with its own screen.
        let provider = app.runtime().provider().unwrap();
        let spec = MachineSpec { computer_id: "raw".into(), space_id: "raw".into(), bot_id: None, home_key: "raw-bench".into() };
        let machine = provider.provision(&spec).await.unwrap();
        provider.open_screen(&machine, "raw-bot", 0).await.unwrap();
        let req = ExecRequest { command: "true".into(), cwd: String::new(), env: Vec::new(), timeout: Duration::from_secs(30) };

        let mut ws_text = Ws::connect(&base, &token, false).await;
        let mut ws_binary = Ws::connect(&base, &token, true).await;

        let (mut raw, mut api, mut over_ws) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..if only_page || only_observe { 0 } else { ROUNDS } {
            let t = Instant::now();
            provider.exec(&machine, &req).await.unwrap();
            raw.push(t.elapsed());
            let t = Instant::now();
            support::rpc(&http, &base, &token, "tools/call", call("shell", json!({ "command": "true" }))).await;
            api.push(t.elapsed());
            let t = Instant::now();
            ws_text.call("tools/call", call("shell", json!({ "command": "true" }))).await;
            over_ws.push(t.elapsed());
        }
        if !only_page && !only_observe {
            report("shell `true`, POST /rpc", raw.clone(), api);
            report("shell `true`, /rpc/ws", raw, over_ws);
            team_folder_prefix(provider.as_ref(), &machine).await;
        }

        // Both browsers on the repainting page: every observation is a fresh screenshot.
        let page = actix_web::HttpServer::new(|| {
            actix_web::App::new().default_service(actix_web::web::to(|| async {
                actix_web::HttpResponse::Ok().content_type("text/html").body(REPAINTING_PAGE)
            }))
        })
        .workers(1)
        .bind("127.0.0.1:0")
        .unwrap();
        let page_url = format!("http://{}/", page.addrs()[0]);
        actix_rt::spawn(page.run());
        support::rpc(&http, &base, &token, "tools/call", call("open_path", json!({ "path": page_url }))).await;
        provider.open(&machine, "raw-bot", &page_url).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;

        let (mut raw, mut api, mut text, mut binary) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut text_bytes, mut binary_bytes) = (0usize, 0usize);
        // Observations that found the screen as the last one left it (no image): the page
        // repaints every 5 ms, but the browser draws at most one frame per 16.7 ms, so each
        // timed observe comes FRAME_PAUSE (not timed) after the last and these stay near zero.
        let mut unchanged = 0usize;
        if !only_observe {
            page_commands(provider.as_ref(), &machine, &dir.path().join("homes/raw-bench"), &page_url).await;
        }
        for _ in 0..if only_page { 0 } else { observe_rounds } {
            tokio::time::sleep(FRAME_PAUSE).await;
            let t = Instant::now();
            provider.observe(&machine, "raw-bot").await.unwrap();
            raw.push(t.elapsed());
            tokio::time::sleep(FRAME_PAUSE).await;
            let t = Instant::now();
            let answer = support::rpc(&http, &base, &token, "tools/call", call("computer_observe", json!({}))).await;
            api.push(t.elapsed());
            unchanged += usize::from(!has_image(&answer));
            tokio::time::sleep(FRAME_PAUSE).await;
            let t = Instant::now();
            let (answer, _) = ws_text.call("tools/call", call("computer_observe", json!({}))).await;
            text.push(t.elapsed());
            unchanged += usize::from(!has_image(&answer));
            text_bytes += answer.to_string().len();
            tokio::time::sleep(FRAME_PAUSE).await;
            let t = Instant::now();
            let (answer, attached) = ws_binary.call("tools/call", call("computer_observe", json!({}))).await;
            binary.push(t.elapsed());
            binary_bytes += answer.to_string().len() + attached;
            unchanged += usize::from(attached == 0);
        }
        let rounds = observe_rounds as f64;
        if !only_page {
        println!(
            "bytes per observation: /rpc/ws base64 {:.0} KiB, /rpc/ws?images=binary {:.0} KiB",
            text_bytes as f64 / rounds / 1024.0,
            binary_bytes as f64 / rounds / 1024.0
        );
        println!("observations through the API that found an unchanged screen: {unchanged} of {}", observe_rounds * 3);
        report("computer_observe, POST /rpc", raw.clone(), api);
        report("computer_observe, /rpc/ws (base64)", raw.clone(), text);
        report("computer_observe, /rpc/ws?images=binary", raw, binary);
        }
        // The app's own desktop stops with it: nothing of this leg runs on beside the next.
        app.shutdown().await;
        provider.destroy(&machine).await.unwrap();
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(rakazo::desktop::command::sweep_script(&format!("{}/", dir.path().join("run").display())))
            .status();

        if !only_page && !only_observe {
            shell_on_the_fake_provider().await;
        }
    });
}

/// `browser_snapshot` of the repainting page on the provider straight, against the same
/// snapshot script evaluated once over a DevTools connection of the bench's own, in an
/// isolated world made beforehand: what the page tools add in round trips to the browser.
async fn page_commands(
    provider: &dyn SandboxProvider,
    machine: &ProviderRef,
    home: &std::path::Path,
    url: &str,
) {
    let mut bare = rakazo::desktop::cdp::Cdp::connect(home, "raw-bot")
        .await
        .unwrap();
    let tree = bare.call("Page.getFrameTree", json!({})).await.unwrap();
    let world = json!({ "frameId": tree["frameTree"]["frame"]["id"], "worldName": "bench" });
    let made = bare.call("Page.createIsolatedWorld", world).await.unwrap();
    let evaluate = json!({
        "expression": rakazo::desktop::page::snapshot_script(1),
        "contextId": made["executionContextId"],
        "returnByValue": true,
    });
    let snapshot = BrowserCommand::Snapshot;
    provider
        .browser(machine, "raw-bot", &snapshot)
        .await
        .unwrap();
    let (mut base, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let answer = bare
            .call("Runtime.evaluate", evaluate.clone())
            .await
            .unwrap();
        base.push(t.elapsed());
        assert!(answer["result"]["value"]["elements"].is_array(), "{answer}");
        let t = Instant::now();
        let answer = provider
            .browser(machine, "raw-bot", &snapshot)
            .await
            .unwrap();
        ours.push(t.elapsed());
        assert!(answer["elements"].is_array(), "{answer}");
    }
    report(
        "browser_snapshot, provider straight (raw: one bare evaluate)",
        base,
        ours,
    );

    // A navigation: the provider's, against `Page.navigate` and the tab's load event on the
    // bench's own connection.
    let navigate = BrowserCommand::Navigate {
        url: url.to_owned(),
    };
    let (mut base, mut ours, mut polled) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS / 10 {
        // What navigations did before (side by side): ask `document.readyState` every 100 ms,
        // each question three round trips (here: the read of the tab's events, the visibility
        // check, the question), then the URL and title from the page.
        tokio::time::sleep(SETTLE).await;
        let t = Instant::now();
        bare.call("Page.navigate", json!({ "url": url }))
            .await
            .unwrap();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            bare.follow_screen().await.unwrap();
            if bare.evaluate("document.readyState").await.unwrap() == "complete" {
                break;
            }
        }
        bare.follow_screen().await.unwrap();
        bare.evaluate("({ url: location.href, title: document.title })")
            .await
            .unwrap();
        polled.push(t.elapsed());
        // Each navigation starts on a page done loading, as an agent's next step would.
        tokio::time::sleep(SETTLE).await;
        let t = Instant::now();
        let started = bare
            .call("Page.navigate", json!({ "url": url }))
            .await
            .unwrap();
        let loader = started["loaderId"].as_str().unwrap().to_owned();
        assert!(
            bare.wait_loaded(&loader, Duration::from_secs(20))
                .await
                .unwrap()
        );
        base.push(t.elapsed());
        tokio::time::sleep(SETTLE).await;
        let t = Instant::now();
        let answer = provider
            .browser(machine, "raw-bot", &navigate)
            .await
            .unwrap();
        ours.push(t.elapsed());
        assert_eq!(answer["loaded"], true, "{answer}");
    }
    report(
        "browser_navigate, provider straight (raw: navigate and the load event)",
        base.clone(),
        ours,
    );
    report(
        "browser_navigate as it was, polling (raw: navigate and the load event)",
        base,
        polled,
    );
}

/// How a Team bot's shell enters its folder, on the provider straight: the command the API
/// sends ([`rakazo::tools::in_own_folder`]) against the `mkdir -p` it sent before, alternating.
async fn team_folder_prefix(
    provider: &dyn rakazo_actors::provider::SandboxProvider,
    machine: &rakazo_actors::provider::ProviderRef,
) {
    let exec = |command: String| ExecRequest {
        command,
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    let before = exec("mkdir -p 'bots/bench' && cd 'bots/bench' || exit 1\ntrue".into());
    let now = exec(rakazo::tools::in_own_folder("bots/bench", "true"));
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        provider.exec(machine, &before).await.unwrap();
        old.push(t.elapsed());
        let t = Instant::now();
        provider.exec(machine, &now).await.unwrap();
        new.push(t.elapsed());
    }
    let (o50, n50) = (percentile(old, 0.5), percentile(new, 0.5));
    println!(
        "shell `true` in a Team bot's folder, on the provider: `mkdir -p` p50 {o50:.2} ms, `[ -d ]` p50 {n50:.2} ms ({:.2}x)",
        n50 / o50.max(1e-9)
    );
}

/// A script through the host runner (`bash` by its full path: `posix_spawn`) against the same
/// command started as before (a bare `bash` with a `PATH` of its own: the standard library
/// forks, copying the page tables of the whole process), alternating, while this process holds
/// 0, 256 and 1,024 MiB as a server with many screens does.
async fn scripts_of_a_large_server() {
    use rakazo::desktop::command::{CommandRunner, HostRunner, minimal_env};
    let runner = HostRunner::minimal();
    let mut held: Vec<u8> = Vec::new();
    for mib in [0usize, 256, 1024] {
        held.resize(mib << 20, 1);
        std::hint::black_box(&held);
        let (mut before, mut now) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t = Instant::now();
            tokio::process::Command::new("bash")
                .args(["-c", "true"])
                .env_clear()
                .envs(minimal_env())
                .current_dir("/")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .output()
                .await
                .unwrap();
            before.push(t.elapsed());
            let t = Instant::now();
            runner.run("true", Duration::from_secs(30)).await.unwrap();
            now.push(t.elapsed());
        }
        let (b50, n50) = (percentile(before, 0.5), percentile(now, 0.5));
        println!(
            "a script while holding {mib} MiB: bare `bash` (fork) p50 {b50:.2} ms, host runner p50 {n50:.2} ms ({:.2}x)",
            n50 / b50.max(1e-9)
        );
    }
}

/// `shell` on the in-process `fake` provider, whose command costs microseconds: what the API
/// adds to a call, with no process start around it to hide in.
async fn shell_on_the_fake_provider() {
    let Api {
        dir: _dir,
        app,
        base,
        token,
        http,
        started,
    } = Api::start("fake").await;
    let call = json!({ "runId": started["run"]["id"], "fence": started["lease"]["fence"], "name": "shell", "arguments": { "command": "true" } });
    let provider = app.runtime().provider().unwrap();
    let spec = MachineSpec {
        computer_id: "raw".into(),
        space_id: "raw".into(),
        bot_id: None,
        home_key: "raw-bench".into(),
    };
    let machine = provider.provision(&spec).await.unwrap();
    let req = ExecRequest {
        command: "true".into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    let mut ws = Ws::connect(&base, &token, false).await;
    ws.call("tools/call", call.clone()).await;
    let (mut raw, mut api, mut over_ws) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS * 2 {
        let t = Instant::now();
        provider.exec(&machine, &req).await.unwrap();
        raw.push(t.elapsed());
        let t = Instant::now();
        support::rpc(&http, &base, &token, "tools/call", call.clone()).await;
        api.push(t.elapsed());
        let t = Instant::now();
        ws.call("tools/call", call.clone()).await;
        over_ws.push(t.elapsed());
    }
    report(
        "shell `true` on the fake provider, POST /rpc",
        raw.clone(),
        api,
    );
    report("shell `true` on the fake provider, /rpc/ws", raw, over_ws);
    app.shutdown().await;
}
