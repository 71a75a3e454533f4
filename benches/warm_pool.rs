//! Spare desktops (`SANDBOX_DESKTOP_WARM_STACKS`) and pooled computers
//! (`SANDBOX_DOCKER_WARM_COMPUTERS`) on Docker: provision to the first screenshot of a bot's
//! desktop, a further, new bot's desktop on the running computer to its first screenshot, and
//! the first bot's desktop reopened (a bot with a profile); none against one spare per
//! computer against one pooled computer with one spare, side by side (rounds rotate which
//! goes first), on both screen paths (the shared X socket, and the command path the remote
//! providers take). Needs a Docker engine and the computer image; runs its own
//! supervisor on 127.0.0.1:0. Results are recorded in `BENCHMARKS.md`.

mod support;

use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo_actors::provider::{ProviderRef, SandboxProvider};

/// Rounds per setting.
const ROUNDS: usize = 3;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits until the provider's pool of computers is full, each with its spare ready (at once
/// without a pool).
async fn computers_ready(p: &DockerProvider) {
    let started = Instant::now();
    while let Some(w) = p.warm_desktops().await {
        let full = w.pooled_ready >= w.pooled_target && w.ready >= w.pooled_target;
        if full || started.elapsed() > Duration::from_secs(60) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the computer's pool has every spare it keeps ready and their memory read (at
/// once with none).
async fn pool_ready(p: &DockerProvider, m: &ProviderRef) {
    let runtime = p.runtime(m).await.unwrap();
    let started = Instant::now();
    loop {
        let s = runtime.warm_status();
        let measured = s.target == 0 || s.pss_kib > 0;
        if (s.ready >= s.target && measured) || started.elapsed() > Duration::from_secs(60) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Times of one round.
struct Round {
    /// Provision → the first bot's first screenshot.
    first: Duration,
    /// A further, new bot's desktop → its first screenshot, on the running computer.
    next: Duration,
    /// The first bot's desktop again, closed and reopened (it has a profile now).
    back: Duration,
    /// A spare's memory (KiB).
    pss: u64,
}

/// Opens `bot`'s desktop and takes its first screenshot.
async fn open_and_look(p: &DockerProvider, m: &ProviderRef, bot: &str, slot: u32) {
    p.open_screen(m, bot, slot).await.expect("open screen");
    let frame = p.observe(m, bot).await.expect("observe");
    assert!(frame.png.starts_with(b"\x89PNG"));
}

async fn round(p: &DockerProvider) -> Round {
    let s = support::machine_spec("warm");
    let bot = s.bot_id.clone().unwrap();
    let t0 = Instant::now();
    let m = p.provision(&s).await.expect("provision");
    open_and_look(p, &m, &bot, 0).await;
    let first = t0.elapsed();
    // The next bot arrives once the computer is up and its pool refilled.
    pool_ready(p, &m).await;
    let pss = p.runtime(&m).await.unwrap().warm_status().pss_kib;
    let t1 = Instant::now();
    open_and_look(p, &m, "bench-next", 1).await;
    let next = t1.elapsed();
    // The first bot leaves and comes back to a refilled pool.
    p.close_screen(&m, &bot).await.expect("close screen");
    pool_ready(p, &m).await;
    let t2 = Instant::now();
    open_and_look(p, &m, &bot, 0).await;
    let back = t2.elapsed();
    p.destroy(&m).await.unwrap();
    Round {
        first,
        next,
        back,
        pss,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let image = support::require_image("warm pool");
    // `RAKAZO_LOG=info`: the runtime's events beside the tables (a desktop's phases).
    if let Ok(filter) = std::env::var("RAKAZO_LOG") {
        rakazo::telemetry::init(&filter);
    }
    let dir = tempfile::tempdir().unwrap();
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let url = support::start_supervisor(
        dir.path().canonicalize().unwrap(),
        token.clone(),
        DockerNetwork::Bridge,
    );
    let rt = actix_rt::System::new();
    rt.block_on(async move {
        let provider = |commands_only, warm_stacks, computers| {
            let p = DockerProvider::new(DockerProviderConfig {
                supervisor_url: url.clone(),
                supervisor_token: token.clone(),
                screen_limit: 0,
                commands_only,
                warm_stacks,
                limits: None,
            })
            .unwrap()
            .with_warm_computers(computers);
            p.start_pool();
            p
        };
        println!("warm pool bench ({image}, Xvfb 1280x800x24 + fluxbox + Chromium per desktop)");
        // `BENCH_PATH=direct` or `BENCH_PATH=command`: only that screen path.
        let only = std::env::var("BENCH_PATH").ok();
        const SETTINGS: [&str; 3] = ["off", "1 spare", "pooled computer + 1 spare"];
        for (path, commands_only) in [("direct", false), ("command path", true)] {
            if only.as_deref().is_some_and(|o| !path.starts_with(o)) {
                continue;
            }
            let providers = [
                provider(commands_only, 0, 0),
                provider(commands_only, 1, 0),
                provider(commands_only, 1, 1),
            ];
            println!("\n{path}:\n");
            println!(
                "| round | setting | provision → first screenshot ms | next, new bot's desktop → first screenshot ms | returning bot's desktop → first screenshot ms |"
            );
            println!("| ---: | --- | ---: | ---: | ---: |");
            let mut times: [[Vec<Duration>; 3]; 3] = Default::default();
            let mut pss = 0;
            for r in 0..ROUNDS {
                // Rotate which setting goes first.
                for k in 0..3 {
                    let i = (r + k) % 3;
                    // No pool fills while another setting is timed.
                    for p in &providers {
                        computers_ready(p).await;
                    }
                    let t = round(&providers[i]).await;
                    if i == 1 {
                        pss = pss.max(t.pss);
                    }
                    println!(
                        "| {} | {} | {:.0} | {:.0} | {:.0} |",
                        r + 1,
                        SETTINGS[i],
                        ms(t.first),
                        ms(t.next),
                        ms(t.back)
                    );
                    for (k, d) in [t.first, t.next, t.back].into_iter().enumerate() {
                        times[i][k].push(d);
                    }
                }
            }
            for (k, what) in ["first screenshot", "next, new bot", "returning bot"]
                .into_iter()
                .enumerate()
            {
                let [off, spare, pooled] = [0, 1, 2].map(|i| median(times[i][k].clone()));
                println!(
                    "median {what}: off {:.0} / 1 spare {:.0} ms ({:.2}) / pooled {:.0} ms ({:.2})",
                    ms(off),
                    ms(spare),
                    spare.as_secs_f64() / off.as_secs_f64(),
                    ms(pooled),
                    pooled.as_secs_f64() / off.as_secs_f64()
                );
            }
            println!("a spare desktop holds {:.1} MiB PSS", pss as f64 / 1024.0);
            for p in &providers {
                p.shutdown().await.unwrap();
            }
        }
    });
}
