//! Spare display stacks (`SANDBOX_DESKTOP_WARM_STACKS`) on Docker computers: provision to
//! the first screenshot of a bot's desktop, and a further bot's desktop on a running
//! computer to its first screenshot, with one spare per computer against none, side by side
//! (rounds alternate), on both screen paths (the shared X socket, and the command path the
//! remote providers take). Needs a Docker engine and the computer image; runs its own
//! supervisor on 127.0.0.1:0. Results are recorded in `BENCHMARKS.md`.

mod support;

use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo_actors::provider::{MachineSpec, ProviderRef, SandboxProvider};

/// Rounds per setting.
const ROUNDS: usize = 3;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn spec() -> MachineSpec {
    let id = format!(
        "bench-warm-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    MachineSpec {
        computer_id: id.clone(),
        space_id: "bench".into(),
        bot_id: Some(id.clone()),
        home_key: id,
    }
}

/// Waits until the computer's pool has every spare it keeps ready (at once with none).
async fn pool_ready(p: &DockerProvider, m: &ProviderRef) {
    let runtime = p.runtime(m).await.unwrap();
    let started = Instant::now();
    loop {
        let s = runtime.warm_status();
        if s.ready >= s.target || started.elapsed() > Duration::from_secs(60) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One round: (provision → first screenshot, a further bot's open → first screenshot,
/// the spare's memory in KiB).
async fn round(p: &DockerProvider) -> (Duration, Duration, u64) {
    let s = spec();
    let bot = s.bot_id.clone().unwrap();
    let t0 = Instant::now();
    let m = p.provision(&s).await.expect("provision");
    p.open_screen(&m, &bot, 0).await.expect("open screen");
    let frame = p.observe(&m, &bot).await.expect("observe");
    let first = t0.elapsed();
    assert!(frame.png.starts_with(b"\x89PNG"));
    // The next bot arrives once the computer is up and its pool refilled.
    pool_ready(p, &m).await;
    let pss = p.runtime(&m).await.unwrap().warm_status().pss_kib;
    let t1 = Instant::now();
    p.open_screen(&m, "bench-next", 1)
        .await
        .expect("open screen");
    p.observe(&m, "bench-next").await.expect("observe");
    let next = t1.elapsed();
    p.destroy(&m).await.unwrap();
    (first, next, pss)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let image = rakazo::image::default_image();
    if !rakazo::image::exists(&image) {
        eprintln!("warm pool bench: {image} is missing; run scripts/build-computer-image.sh");
        std::process::exit(if std::env::var_os("CI").is_some() {
            1
        } else {
            0
        });
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
        let provider = |commands_only, warm_stacks| {
            DockerProvider::new(DockerProviderConfig {
                supervisor_url: url.clone(),
                supervisor_token: token.clone(),
                screen_limit: 0,
                commands_only,
                warm_stacks,
                limits: None,
            })
            .unwrap()
        };
        println!("warm pool bench ({image}, Xvfb 1280x800x24 + fluxbox + Chromium per desktop)");
        for (path, commands_only) in [("direct", false), ("command path", true)] {
            let off = provider(commands_only, 0);
            let on = provider(commands_only, 1);
            println!("\n{path}:\n");
            println!(
                "| round | pool | provision → first screenshot ms | next bot's desktop → first screenshot ms |"
            );
            println!("| ---: | --- | ---: | ---: |");
            let (mut first, mut next) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
            let mut pss = 0;
            for r in 1..=ROUNDS {
                // Alternate which setting goes first.
                let order = if r % 2 == 1 { [0, 1] } else { [1, 0] };
                for i in order {
                    let (p, name) = if i == 0 { (&off, "off") } else { (&on, "1 spare") };
                    let (f, n, kib) = round(p).await;
                    if i == 1 {
                        pss = pss.max(kib);
                    }
                    println!("| {r} | {name} | {:.0} | {:.0} |", ms(f), ms(n));
                    first[i].push(f);
                    next[i].push(n);
                }
            }
            let (f0, f1) = (median(first[0].clone()), median(first[1].clone()));
            let (n0, n1) = (median(next[0].clone()), median(next[1].clone()));
            println!(
                "medians: first screenshot off {:.0} / on {:.0} ms (ratio on/off {:.2}); next desktop off {:.0} / on {:.0} ms (ratio {:.2}); a spare stack holds {:.1} MiB PSS",
                ms(f0),
                ms(f1),
                f1.as_secs_f64() / f0.as_secs_f64(),
                ms(n0),
                ms(n1),
                n1.as_secs_f64() / n0.as_secs_f64(),
                pss as f64 / 1024.0
            );
        }
    });
}
