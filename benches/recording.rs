//! The cost of recording a run, per `computer_act`: the same action batch through the
//! JSON-RPC API on two apps side by side in one process, one recording runs (the default) and
//! one with `RECORDING_RETENTION_DAYS=0` (the step is still put in the timeline, nothing is
//! recorded). Each batch types into the browser's address bar, so every act brings a new
//! frame: the worst case, a frame sealed and stored each time. Calls alternate between the
//! two apps. Also times the recording alone (`recordings::record`: timeline entry, sealing,
//! frame and step rows, which a tool call leaves to the background after its timeline entry)
//! and reports the bytes it stores per act.
//! Uses the host `desktop` provider (real Xvfb and Chromium).
//!
//! Run: `cargo bench --bench recording` (or `scripts/bench.sh recording`).

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::app::App;
use rakazo::config::Config;
use rakazo_actors::entity::run;
use rakazo_actors::provider::{Action, Frame};
use sea_orm::EntityTrait;
use serde_json::{Value, json};

const ROUNDS: usize = 60;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    ms(v[((v.len() as f64 - 1.0) * p) as usize])
}

struct Side {
    app: Arc<App>,
    base: String,
    token: String,
    run: Value,
    fence: Value,
    _dir: tempfile::TempDir,
}

async fn rpc(http: &reqwest::Client, s: &Side, method: &str, params: Value) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let v: Value = http
        .post(format!("{}/rpc", s.base))
        .bearer_auth(&s.token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

async fn side(http: &reqwest::Client, retention_days: &str) -> Side {
    let dir = tempfile::tempdir().unwrap();
    let env: std::collections::HashMap<String, String> = [
        ("DATA_DIR", dir.path().display().to_string()),
        ("SANDBOX_PROVIDER", "desktop".into()),
        ("RAKAZO_ENV", "test".into()),
        ("RAKAZO_LOG", "warn".into()),
        ("RECORDING_RETENTION_DAYS", retention_days.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let (app, token) = App::start(Config::load(&env, None).unwrap()).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    actix_rt::spawn(rakazo::server::build(app.clone(), listener, 1).unwrap());
    let mut s = Side {
        app,
        base,
        token: token.unwrap(),
        run: Value::Null,
        fence: Value::Null,
        _dir: dir,
    };
    let space = rpc(http, &s, "space.create", json!({ "name": "bench" })).await;
    let bot = rpc(
        http,
        &s,
        "bot.create",
        json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" }),
    )
    .await;
    let started = rpc(http, &s, "run.start", json!({ "botId": bot["id"] })).await;
    s.run = started["run"]["id"].clone();
    s.fence = started["lease"]["fence"].clone();
    // Warm up: the machine, the screen and the browser exist before timing.
    act(http, &s, 0).await;
    act(http, &s, 1).await;
    s
}

/// One batch that changes the screen: a new address typed into the browser's address bar.
async fn act(http: &reqwest::Client, s: &Side, i: usize) -> Value {
    let actions = json!([
        { "type": "key", "keys": "ctrl+l" },
        { "type": "type", "text": format!("example-{i}.test") },
    ]);
    rpc(
        http,
        s,
        "tools/call",
        json!({ "runId": s.run, "fence": s.fence, "name": "computer_act",
                "arguments": { "actions": actions } }),
    )
    .await
}

fn cleanup(s: &Side) {
    let _ = std::process::Command::new("bash")
        .arg("-c")
        .arg(rakazo::desktop::command::sweep_script(&format!(
            "{}/",
            s.app.config.data_dir.join("run").display()
        )))
        .status();
}

fn main() {
    actix_rt::System::new().block_on(async {
        let http = reqwest::Client::new();
        let on = side(&http, "30").await;
        let off = side(&http, "0").await;

        let (mut with, mut without) = (Vec::new(), Vec::new());
        for i in 0..ROUNDS {
            // Alternate which side goes first, so neither always follows the other's work.
            let order: [(&Side, &mut Vec<Duration>); 2] = if i % 2 == 0 {
                [(&on, &mut with), (&off, &mut without)]
            } else {
                [(&off, &mut without), (&on, &mut with)]
            };
            for (s, times) in order {
                let t = Instant::now();
                let r = act(&http, s, i + 2).await;
                times.push(t.elapsed());
                assert_eq!(r["isError"], false, "{r}");
            }
        }
        let (w50, w95, o50, o95) = (
            percentile(with.clone(), 0.5),
            percentile(with.clone(), 0.95),
            percentile(without.clone(), 0.5),
            percentile(without.clone(), 0.95),
        );
        let mean = |v: &[Duration]| v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
        println!(
            "computer_act, {ROUNDS} rounds: recorded p50 {w50:.1} ms p95 {w95:.1} ms mean {:.1} ms | not recorded p50 {o50:.1} ms p95 {o95:.1} ms mean {:.1} ms | ratio p50 {:.3} mean {:.3}",
            mean(&with),
            mean(&without),
            w50 / o50,
            mean(&with) / mean(&without)
        );

        on.app.recorder.settled().await;
        let r = run::Entity::find_by_id(on.run.as_str().unwrap())
            .one(&on.app.db)
            .await
            .unwrap()
            .unwrap();
        let replay = rakazo::recordings::replay(&on.app.db, &r).await.unwrap();
        let steps = replay["steps"].as_array().unwrap().len();
        let bytes = replay["bytes"].as_i64().unwrap();
        println!(
            "recording: {steps} steps, {} frames, {bytes} bytes sealed, {:.0} bytes per act",
            replay["frames"],
            bytes as f64 / steps as f64
        );

        // The recording alone, on a real frame of this run: new frames (worst case) and a
        // frame the run already holds.
        let frame_digest = replay["steps"][steps - 1]["frame"]["digest"].as_str().unwrap().to_owned();
        let (png, width, height) = rakazo::recordings::frame_png(
            &on.app.db,
            &on.app.recorder,
            &on.app.runtime().master_key,
            &r,
            &frame_digest,
        )
        .await
        .unwrap();
        let actions: Vec<Action> = vec![Action::Click {
            x: 10,
            y: 10,
            button: rakazo_actors::provider::Button::Left,
            double: false,
        }];
        let (mut fresh, mut same) = (Vec::new(), Vec::new());
        for i in 0..ROUNDS {
            let mut changed = png.clone();
            // A different frame each time (its bytes differ, its size does not).
            let at = changed.len() / 2;
            changed[at] = changed[at].wrapping_add(1 + (i % 250) as u8);
            let frame = Frame {
                png: changed,
                width: width as u32,
                height: height as u32,
                notice: None,
                screen: None,
            };
            for (frame, times) in [
                (&frame, &mut fresh),
                (
                    &Frame {
                        png: png.clone(),
                        width: width as u32,
                        height: height as u32,
                        notice: None,
                        screen: None,
                    },
                    &mut same,
                ),
            ] {
                // The step owns its frame; the copy is not timed.
                let frame = frame.clone();
                let t = Instant::now();
                let digest = rakazo::tools::frame_digest(&frame.png);
                rakazo::recordings::record(
                    &on.app.db,
                    &on.app.recorder,
                    &on.app.runtime().master_key,
                    rakazo::recordings::Step {
                        run: &r,
                        tool: "computer_act",
                        actions: Some(&actions),
                        result: json!({ "completed": 1, "total": 1 }),
                        frame,
                        digest: &digest,
                    },
                )
                .await
                .unwrap();
                times.push(t.elapsed());
            }
        }
        println!(
            "record() alone ({} KiB PNG): new frame p50 {:.2} ms p95 {:.2} ms | frame already held p50 {:.2} ms p95 {:.2} ms",
            png.len() / 1024,
            percentile(fresh.clone(), 0.5),
            percentile(fresh, 0.95),
            percentile(same.clone(), 0.5),
            percentile(same, 0.95)
        );
        cleanup(&on);
        cleanup(&off);
    });
}
