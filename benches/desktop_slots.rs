//! Desktop slot concurrency benchmark: eight bots opening their desktops at the same moment on
//! one machine against one bot alone (and against eight opened one after another, which is
//! what a table lock held through every start amounted to), and one bot's observe while
//! another bot's browser starts against its observe on an idle machine.
//!
//! Run with `cargo bench --bench desktop_slots` (needs `scripts/install-desktop-deps.sh`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::command::{HostRunner, sweep_script};
use rakazo::desktop::gateway::free_local_port;
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn runtime(dir: &std::path::Path, first_display: u32) -> Arc<DesktopRuntime> {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    Arc::new(DesktopRuntime::new(
        Arc::new(HostRunner::minimal()),
        RuntimeConfig {
            workspace: dir.join("workspace"),
            run_dir: dir.join("run"),
            screen_limit: 0,
            displays: DisplayPool::new(first_display),
            gateway_port: free_local_port().unwrap(),
            settle: Settle::default(),
            x11_socket_dir: None,
            commands_only: false,
            gateway_host: "127.0.0.1".into(),
            groups: None,
            freeze_after: None,
            warm_stacks: 0,
        },
    ))
}

fn sweep(dir: &std::path::Path) {
    let _ = std::process::Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", dir.join("run").display())))
        .status();
}

/// Opens `bots` desktops on a fresh runtime, all at once or one after another; the wall time.
async fn open_many(bots: usize, together: bool, first_display: u32) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), first_display);
    // A first screen outside the measurement: the runtime's one-time start (leftover reaping).
    rt.open_screen("warm", 0).await.unwrap();
    rt.close_screen("warm").await.unwrap();
    let started = Instant::now();
    if together {
        let tasks: Vec<_> = (0..bots)
            .map(|i| {
                let rt = rt.clone();
                tokio::spawn(async move { rt.open_screen(&format!("bot-{i}"), i as u32).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    } else {
        for i in 0..bots {
            rt.open_screen(&format!("bot-{i}"), i as u32).await.unwrap();
        }
    }
    let took = started.elapsed();
    rt.shutdown().await.unwrap();
    sweep(dir.path());
    took
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("desktop slots bench ({rounds} rounds, median shown)");
        let mut one = Vec::new();
        let mut eight = Vec::new();
        let mut serial = Vec::new();
        for _ in 0..rounds {
            one.push(open_many(1, true, 171).await);
            eight.push(open_many(8, true, 171).await);
            serial.push(open_many(8, false, 171).await);
        }
        let (one, eight, serial) = (
            percentile(&mut one, 0.5),
            percentile(&mut eight, 0.5),
            percentile(&mut serial, 0.5),
        );
        println!("open 1 desktop: {:.0} ms", ms(one));
        println!(
            "open 8 desktops at once: {:.0} ms ({:.2}x one)",
            ms(eight),
            ms(eight) / ms(one)
        );
        println!(
            "open 8 desktops one after another: {:.0} ms ({:.2}x one)",
            ms(serial),
            ms(serial) / ms(one)
        );

        // Observe of one bot, idle and while another bot's browser starts.
        let dir = tempfile::tempdir().unwrap();
        let desk = runtime(dir.path(), 171);
        desk.open_screen("watched", 0).await.unwrap();
        for _ in 0..5 {
            desk.observe("watched").await.unwrap();
        }
        let mut idle = Vec::new();
        for _ in 0..100 {
            let t = Instant::now();
            desk.observe("watched").await.unwrap();
            idle.push(t.elapsed());
        }
        let mut busy = Vec::new();
        for round in 0..rounds.max(3) {
            let other = format!("other-{round}");
            let opening = tokio::spawn({
                let desk = desk.clone();
                async move { desk.open_screen(&other, 1).await.map(|_| other) }
            });
            while !opening.is_finished() {
                let t = Instant::now();
                desk.observe("watched").await.unwrap();
                busy.push(t.elapsed());
            }
            let other = opening.await.unwrap().unwrap();
            desk.close_screen(&other).await.unwrap();
        }
        let idle95 = percentile(&mut idle, 0.95);
        let busy95 = percentile(&mut busy, 0.95);
        println!(
            "observe p95 idle: {:.1} ms ({} samples); while another browser starts: {:.1} ms ({} samples); ratio {:.2}",
            ms(idle95),
            idle.len(),
            ms(busy95),
            busy.len(),
            ms(busy95) / ms(idle95)
        );
        desk.shutdown().await.unwrap();
        sweep(dir.path());
    });
}
