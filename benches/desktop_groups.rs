//! Per-desktop control groups benchmark on the host `desktop` provider: one bot's observe p95
//! idle and while another bot's desktop burns every core, with and without desktop groups
//! side by side; and the time to thaw a frozen desktop (and its first observe after).
//!
//! Run as root with `cargo bench --bench desktop_groups` (needs the desktop packages and the
//! cpu, cpuacct, memory and freezer controllers).

use std::time::{Duration, Instant};

use rakazo::desktop::command::sweep_script;
use rakazo::desktop::groups::DesktopLimits;
use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo_actors::provider::{MachineSpec, SandboxProvider};

/// Busy loops started in the burning desktop (more than the cores of a small machine).
const BURNERS: usize = 4;
const SAMPLES: usize = 60;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Pass {
    idle_p50: Duration,
    idle_p95: Duration,
    burn_p50: Duration,
    burn_p95: Duration,
}

async fn observe_samples(
    p: &DesktopProvider,
    m: &rakazo_actors::provider::ProviderRef,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        p.observe(m, "victim").await.unwrap();
        out.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out
}

async fn pass(dir: &std::path::Path, first_display: u32, limits: Option<DesktopLimits>) -> Pass {
    let p = DesktopProvider::new(DesktopProviderConfig {
        homes_root: dir.join("homes"),
        run_root: dir.join("run"),
        screen_limit: 0,
        first_display,
        environment: "test".into(),
        limits,
        warm_stacks: 0,
    })
    .unwrap();
    let m = p
        .provision(&MachineSpec {
            computer_id: "bench".into(),
            space_id: "s".into(),
            bot_id: None,
            home_key: "team-bench".into(),
        })
        .await
        .unwrap();
    p.open_screen(&m, "victim").await.unwrap();
    p.open_screen(&m, "burner").await.unwrap();
    for _ in 0..5 {
        p.observe(&m, "victim").await.unwrap();
    }
    let mut idle = observe_samples(&p, &m).await;
    for _ in 0..BURNERS {
        p.launch(
            &m,
            "burner",
            &["sh".into(), "-c".into(), "while :; do :; done".into()],
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut burn = observe_samples(&p, &m).await;
    p.destroy(&m).await.unwrap();
    Pass {
        idle_p50: percentile(&mut idle, 0.5),
        idle_p95: percentile(&mut idle, 0.95),
        burn_p50: percentile(&mut burn, 0.5),
        burn_p95: percentile(&mut burn, 0.95),
    }
}

async fn thaw(dir: &std::path::Path) -> (Vec<Duration>, Vec<Duration>, Vec<Duration>) {
    let p = DesktopProvider::new(DesktopProviderConfig {
        homes_root: dir.join("homes"),
        run_root: dir.join("run"),
        screen_limit: 0,
        first_display: 131,
        environment: "test".into(),
        limits: Some(DesktopLimits {
            cpu_weight: 100,
            memory_mb: 2048,
            freeze_after: Some(Duration::from_millis(400)),
        }),
        warm_stacks: 0,
    })
    .unwrap();
    let m = p
        .provision(&MachineSpec {
            computer_id: "thaw".into(),
            space_id: "s".into(),
            bot_id: None,
            home_key: "team-thaw".into(),
        })
        .await
        .unwrap();
    let runtime = p.runtime(&m).await.unwrap();
    p.open_screen(&m, "victim").await.unwrap();
    let (mut wake, mut first, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..20 {
        while !runtime.is_frozen("victim").await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let started = Instant::now();
        if round % 2 == 0 {
            runtime.wake("victim").await.unwrap();
            wake.push(started.elapsed());
        } else {
            p.observe(&m, "victim").await.unwrap();
            first.push(started.elapsed());
            let started = Instant::now();
            p.observe(&m, "victim").await.unwrap();
            warm.push(started.elapsed());
        }
    }
    p.destroy(&m).await.unwrap();
    (wake, first, warm)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let cleanup = move || {
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(sweep_script(&format!("{}/", run.display())))
            .status();
    };
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 2048,
        freeze_after: None,
    };
    println!("victim observe p50/p95 ms, idle and with {BURNERS} busy loops in another desktop");
    for round in 0..2 {
        let without = pass(&dir.path().join(format!("plain-{round}")), 111, None).await;
        let with = pass(
            &dir.path().join(format!("groups-{round}")),
            121,
            Some(limits),
        )
        .await;
        for (name, r) in [("no groups", without), ("desktop groups", with)] {
            println!(
                "  round {round} {name:15} idle {:6.1}/{:6.1}  burning {:6.1}/{:6.1}  p95 ratio {:4.2}x",
                ms(r.idle_p50),
                ms(r.idle_p95),
                ms(r.burn_p50),
                ms(r.burn_p95),
                ms(r.burn_p95) / ms(r.idle_p95)
            );
        }
    }
    let (mut wake, mut first, mut warm) = thaw(&dir.path().join("thaw")).await;
    println!("thaw of a frozen desktop, ms (p50 / p95 / max)");
    for (name, s) in [
        ("thaw only", &mut wake),
        ("first observe after freeze", &mut first),
        ("warm observe", &mut warm),
    ] {
        let max = *s.iter().max().unwrap();
        println!(
            "  {name:27} {:6.1} / {:6.1} / {:6.1}",
            ms(percentile(s, 0.5)),
            ms(percentile(s, 0.95)),
            ms(max)
        );
    }
    cleanup();
}
