//! Tool-call overhead, side by side in one run: `shell` running `true` and
//! `computer_observe` through the JSON-RPC API (HTTP on loopback, auth, lease fence check,
//! actor mailbox, activity record) against the same calls made straight on the provider.
//! Uses the host `desktop` provider (real Xvfb and Chromium).
//!
//! Run: `scripts/bench.sh tools`.

mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use rakazo::app::App;
use rakazo::config::Config;
use rakazo_actors::provider::{ExecRequest, MachineSpec};
use serde_json::{Value, json};

const ROUNDS: usize = 200;

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

fn main() {
    actix_rt::System::new().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let env: std::collections::HashMap<String, String> = [
            ("DATA_DIR", dir.path().display().to_string()),
            ("SANDBOX_PROVIDER", "desktop".into()),
            ("RAKAZO_ENV", "test".into()),
            ("RAKAZO_LOG", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let (app, token) = App::start(Config::load(&env, None).unwrap()).await.unwrap();
        let token = token.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        actix_rt::spawn(rakazo::server::build(app.clone(), listener, 1).unwrap());
        let http = reqwest::Client::new();

        let space = support::rpc(&http, &base, &token, "space.create", json!({ "name": "bench" })).await;
        let bot = support::rpc(&http, &base, &token, "bot.create", json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" })).await;
        let started = support::rpc(&http, &base, &token, "run.start", json!({ "botId": bot["id"] })).await;
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

        let (mut raw, mut api) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let t = Instant::now();
            provider.exec(&machine, &req).await.unwrap();
            raw.push(t.elapsed());
            let t = Instant::now();
            support::rpc(&http, &base, &token, "tools/call", call("shell", json!({ "command": "true" }))).await;
            api.push(t.elapsed());
        }
        report("shell `true`", raw, api);

        let (mut raw, mut api) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS / 4 {
            let t = Instant::now();
            provider.observe(&machine, "raw-bot").await.unwrap();
            raw.push(t.elapsed());
            let t = Instant::now();
            support::rpc(&http, &base, &token, "tools/call", call("computer_observe", json!({}))).await;
            api.push(t.elapsed());
        }
        report("computer_observe", raw, api);
        provider.destroy(&machine).await.unwrap();
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(rakazo::desktop::command::sweep_script(&format!("{}/", dir.path().join("run").display())))
            .status();
    });
}
