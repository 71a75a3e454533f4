//! What the benches share: an in-process supervisor on 127.0.0.1:0, one JSON-RPC call, the
//! computer image they need, bench computers and their first screenshots, the PSS of desktops
//! ([`pss`]) and the kubernetes emulator ([`kubernetes`]).

#![allow(dead_code)]

pub mod kubernetes;
pub mod pss;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use rakazo::config::{DockerNetwork, DockerSettings};
use rakazo::supervisor::engine::{Engine, EngineSettings};
use rakazo::supervisor::routes::State;
use rakazo_actors::provider::{Action, ExecRequest, MachineSpec, ProviderRef, SandboxProvider};
use serde_json::{Value, json};

/// The computer image, built; `bench` stops (failing under CI) without it.
pub fn require_image(bench: &str) -> String {
    let image = rakazo::image::default_image();
    if !rakazo::image::exists(&image) {
        eprintln!("{bench} bench: {image} is missing; run scripts/build-computer-image.sh");
        std::process::exit(if std::env::var_os("CI").is_some() {
            1
        } else {
            0
        });
    }
    image
}

/// A bench computer, its bot and its home named by `tag` and a random suffix.
pub fn machine_spec(tag: &str) -> MachineSpec {
    let id = format!(
        "bench-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    MachineSpec {
        computer_id: id.clone(),
        space_id: "bench".into(),
        bot_id: Some(id.clone()),
        home_key: id,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Ten pointer moves and the settled frame after them (`computer_act`'s path), `rounds` times
/// on one live desktop of `path`, then a move and a key, then 40 typed characters, as many
/// times: p50 and p95 of each.
pub async fn acts(p: &dyn SandboxProvider, path: &str, rounds: usize) {
    let s = machine_spec("act");
    let bot = s.bot_id.clone().unwrap();
    let m = p.provision(&s).await.expect("provision");
    p.open_screen(&m, &bot, 0).await.expect("open screen");
    let timed = |what: &'static str, batch: fn(usize) -> Vec<Action>| {
        let (m, bot) = (m.clone(), bot.clone());
        async move {
            let mut times = Vec::new();
            for round in 0..rounds {
                let actions = batch(round);
                let t = Instant::now();
                let outcome = p.act(&m, &bot, &actions).await.expect("act");
                times.push(t.elapsed());
                assert_eq!(outcome.completed, actions.len());
            }
            times.sort();
            println!(
                "{path}: {what} with the settled frame, {rounds} times: p50 {:.1} ms, p95 {:.1} ms",
                ms(times[rounds / 2]),
                ms(times[rounds * 95 / 100])
            );
        }
    };
    println!();
    timed("ten pointer moves", |round| {
        (0..10)
            .map(|i| Action::Move {
                x: 100 + 40 * i + round as i32 % 2,
                y: 300 + 10 * i,
            })
            .collect()
    })
    .await;
    // A key goes through `xdotool` on the command path, where XTEST plays only the pointer.
    timed("a move and a key", |round| {
        vec![
            Action::Move {
                x: 200 + round as i32 % 2,
                y: 200,
            },
            Action::Key {
                keys: "shift".into(),
            },
        ]
    })
    .await;
    timed("typing 40 characters", |round| {
        vec![Action::Type {
            text: format!("{round:02} the quick brown fox jumps over a dog."),
        }]
    })
    .await;
    p.destroy(&m).await.unwrap();
}

/// Provision → open desktop → first screenshot, `rounds` times, then observe latency on the
/// last round's desktop (p50 and p95 of `observes`); the median total.
pub async fn first_screenshots(
    p: &dyn SandboxProvider,
    path: &str,
    rounds: usize,
    observes: usize,
) -> Duration {
    println!("\n{path}:\n");
    println!("| round | provision ms | open desktop ms | first observe ms | total ms |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    let mut totals = Vec::new();
    for round in 1..=rounds {
        let s = machine_spec("first");
        let bot = s.bot_id.clone().unwrap();
        let t0 = Instant::now();
        let m = p.provision(&s).await.expect("provision");
        let t1 = Instant::now();
        p.open_screen(&m, &bot, 0).await.expect("open screen");
        let t2 = Instant::now();
        let frame = p.observe(&m, &bot).await.expect("observe");
        let t3 = Instant::now();
        assert!(frame.png.starts_with(b"\x89PNG"));
        totals.push(t3 - t0);
        println!(
            "| {round} | {:.0} | {:.0} | {:.1} | **{:.0}** |",
            ms(t1 - t0),
            ms(t2 - t1),
            ms(t3 - t2),
            ms(t3 - t0)
        );
        if round == rounds {
            let mut times = Vec::new();
            for _ in 0..observes {
                let t = Instant::now();
                p.observe(&m, &bot).await.expect("observe");
                times.push(t.elapsed());
            }
            times.sort();
            println!(
                "observe on a live desktop: p50 {:.1} ms, p95 {:.1} ms",
                ms(times[observes / 2]),
                ms(times[observes * 95 / 100])
            );
        }
        p.destroy(&m).await.unwrap();
    }
    totals.sort();
    let median = totals[totals.len() / 2];
    println!("provision → first screenshot: median {:.0} ms", ms(median));
    median
}

/// Starts a supervisor on its own thread, keeping its state in `data_dir` and giving its
/// computers `network` and every core; returns its URL.
pub fn start_supervisor(
    data_dir: std::path::PathBuf,
    token: String,
    network: DockerNetwork,
) -> String {
    let settings = EngineSettings {
        data_dir,
        image: rakazo::image::default_image(),
        docker: DockerSettings {
            image: None,
            nano_cpus: 0,
            memory_bytes: 0,
            pids_limit: 4096,
            network,
            egress: Default::default(),
        },
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let engine = Engine::connect(settings).await.expect("docker engine");
            let state = actix_web::web::Data::new(State::new(engine, &token));
            rakazo::supervisor::serve(listener, state)
                .unwrap()
                .await
                .unwrap();
        })
    });
    url
}

/// One JSON-RPC call to the API at `base` as `token`; its result (an error panics).
pub async fn rpc(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    params: Value,
) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let v: Value = http
        .post(format!("{base}/rpc"))
        .bearer_auth(token)
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

/// `true` through the provider's exec (as the `shell` tool runs it) `count` times back to back,
/// in turns with `bare` (the same script through the machine's bare exec); prints both and
/// their ratio.
pub async fn scripts_in_turns<F, Fut>(
    p: &dyn SandboxProvider,
    m: &ProviderRef,
    count: usize,
    (ours_label, bare_label): (&str, &str),
    mut bare: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let request = ExecRequest {
        command: "true".into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    // One of each first: the agent, started with the machine, is ready.
    p.exec(m, &request).await.unwrap();
    bare().await;
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let t = Instant::now();
        let out = p.exec(m, &request).await.unwrap();
        ours.push(t.elapsed());
        assert_eq!(out.exit_code, 0);
        let t = Instant::now();
        bare().await;
        base.push(t.elapsed());
    }
    let pct = |v: &mut Vec<Duration>, q: usize| {
        v.sort();
        ms(v[(v.len() * q / 100).min(v.len() - 1)])
    };
    let (o50, o95) = (pct(&mut ours, 50), pct(&mut ours, 95));
    let (b50, b95) = (pct(&mut base, 50), pct(&mut base, 95));
    println!("\n`true` run {count} times back to back, in turns:\n");
    println!("| path | p50 ms | p95 ms |");
    println!("| --- | ---: | ---: |");
    println!("| {ours_label} | {o50:.2} | {o95:.2} |");
    println!("| {bare_label} | {b50:.2} | {b95:.2} |");
    println!("ours / bare, p50: {:.2}x", o50 / b50);
}
