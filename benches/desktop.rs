//! Desktop runtime benchmark: our observe and action batches against ImageMagick `import`,
//! `scrot` and `xdotool` on the same Xvfb display with a running Chromium, plus PSS memory.
//!
//! Run with `cargo bench --bench desktop` (needs `scripts/install-desktop-deps.sh`).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::capture::XDisplay;
use rakazo::desktop::command::{HostRunner, TAG_VAR, sweep_script};
use rakazo::desktop::gateway::free_local_port;
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use rakazo_actors::provider::Action;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Stats {
    p50: Duration,
    p95: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    Stats {
        p50: percentile(&mut samples, 0.5),
        p95: percentile(&mut samples, 0.95),
    }
}

fn time_command(n: usize, display: u32, program: &str, args: &[&str]) -> Stats {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let status = Command::new(program)
            .args(args)
            .env("DISPLAY", format!(":{display}"))
            .status()
            .expect(program);
        assert!(status.success(), "{program} failed");
        samples.push(started.elapsed());
    }
    stats(samples)
}

/// Total PSS in KiB of every process whose runtime tag starts with `prefix`.
fn pss_kib(prefix: &str) -> u64 {
    let want = format!("{TAG_VAR}={prefix}");
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let path = entry.path();
        let Ok(environ) = std::fs::read(path.join("environ")) else {
            continue;
        };
        if !environ
            .split(|&b| b == 0)
            .any(|v| v.starts_with(want.as_bytes()))
        {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(path.join("smaps_rollup")) else {
            continue;
        };
        total += rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    let run_dir = dir.path().join("run");
    let config = RuntimeConfig {
        workspace: dir.path().join("workspace"),
        run_dir: run_dir.clone(),
        screen_limit: 0,
        displays: DisplayPool::new(71),
        gateway_port: free_local_port().unwrap(),
        settle: Settle::default(),
        x11_socket_dir: None,
        commands_only: false,
        gateway_host: "127.0.0.1".into(),
        groups: None,
        freeze_after: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = Arc::new(DesktopRuntime::new(Arc::new(HostRunner::minimal()), config));
    let screen = rt
        .block_on(runtime.open_screen("bench"))
        .expect("open screen");
    let d = screen.display;
    // A busy page: gradient background and a screenful of text, like real sites.
    let page = "data:text/html,<body style='background:linear-gradient(45deg,%23f06,%2348f);font:14px serif'>\
        <script>for(let i=0;i<400;i++)document.write('<span style=color:%23'+(i*2654435761%16777216).toString(16).padStart(6,0)+'>Rakazo desktop '+i+' </span>')</script>";
    let go = [
        Action::Key {
            keys: "ctrl+l".into(),
        },
        Action::Wait { ms: 300 },
        Action::Type { text: page.into() },
        Action::Key {
            keys: "Return".into(),
        },
        Action::Wait { ms: 1500 },
    ];
    rt.block_on(runtime.act("bench", &go)).unwrap();
    println!("desktop bench on :{d} (1280x800x24, fluxbox + Chromium on a busy page)");

    // Observe: capture + hash + PNG, as the tools call it.
    for _ in 0..5 {
        rt.block_on(runtime.observe("bench")).unwrap();
    }
    let mut samples = Vec::new();
    let mut png_len = 0;
    for _ in 0..50 {
        let started = Instant::now();
        let o = rt.block_on(runtime.observe("bench")).unwrap();
        samples.push(started.elapsed());
        png_len = o.frame.png.len();
    }
    let ours = stats(samples);
    let x = XDisplay::connect(d).unwrap();
    let mut grab = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        x.grab().unwrap();
        grab.push(started.elapsed());
    }
    let grab = stats(grab);
    let out = dir.path().join("shot.png");
    let out_s = out.to_string_lossy().into_owned();
    let import = time_command(8, d, "import", &["-window", "root", &out_s]);
    let scrot = time_command(20, d, "scrot", &["-o", &out_s]);
    println!();
    println!("observe (1280x800 PNG)         p50 ms   p95 ms");
    println!(
        "  rakazo observe             {:8.1} {:8.1}   ({} KiB PNG)",
        ms(ours.p50),
        ms(ours.p95),
        png_len / 1024
    );
    println!(
        "  rakazo raw grab + hash     {:8.1} {:8.1}",
        ms(grab.p50),
        ms(grab.p95)
    );
    println!(
        "  import -window root        {:8.1} {:8.1}",
        ms(import.p50),
        ms(import.p95)
    );
    println!(
        "  scrot                      {:8.1} {:8.1}",
        ms(scrot.p50),
        ms(scrot.p95)
    );
    println!(
        "  speedup vs import (p50)    {:8.1}x",
        ms(import.p50) / ms(ours.p50)
    );
    println!(
        "  speedup vs scrot (p50)     {:8.1}x",
        ms(scrot.p50) / ms(ours.p50)
    );

    // Ten pointer moves: one XTEST batch against ten xdotool processes.
    let points: Vec<(i32, i32)> = (0..10).map(|i| (600 + i * 7, 400 + i * 5)).collect();
    let batch: Vec<Action> = points.iter().map(|&(x, y)| Action::Move { x, y }).collect();
    let mut x = x;
    let mut ours = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        x.apply_batch(&batch).unwrap();
        ours.push(started.elapsed());
    }
    let ours = stats(ours);
    let mut with_settle = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        rt.block_on(runtime.act("bench", &batch)).unwrap();
        with_settle.push(started.elapsed());
    }
    let with_settle = stats(with_settle);
    let mut xdo = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        for &(px, py) in &points {
            let status = Command::new("xdotool")
                .args(["mousemove", &px.to_string(), &py.to_string()])
                .env("DISPLAY", format!(":{d}"))
                .status()
                .unwrap();
            assert!(status.success());
        }
        xdo.push(started.elapsed());
    }
    let xdo = stats(xdo);
    println!();
    println!("10-action batch                p50 ms   p95 ms");
    println!(
        "  rakazo XTEST batch         {:8.2} {:8.2}",
        ms(ours.p50),
        ms(ours.p95)
    );
    println!(
        "  rakazo act (+settle+PNG)   {:8.1} {:8.1}",
        ms(with_settle.p50),
        ms(with_settle.p95)
    );
    println!(
        "  10 x xdotool mousemove     {:8.1} {:8.1}",
        ms(xdo.p50),
        ms(xdo.p95)
    );
    println!(
        "  speedup, batch vs xdotool  {:8.0}x",
        ms(xdo.p50) / ms(ours.p50)
    );
    println!(
        "  speedup, act vs xdotool    {:8.1}x",
        ms(xdo.p50) / ms(with_settle.p50)
    );

    // Memory of one active desktop (Xvfb + fluxbox + Chromium on about:blank).
    let kib = pss_kib(&format!("{}/screen-", run_dir.display()));
    let per_gib = kib as f64 / (1024.0 * 1024.0);
    println!();
    println!(
        "PSS per active desktop: {:.0} MiB; about {:.0} fit in 22 GiB (24 GiB less 2 GiB for the system)",
        kib as f64 / 1024.0,
        22.0 / per_gib
    );

    rt.block_on(runtime.shutdown()).unwrap();
    let _ = Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", run_dir.display())))
        .status();
}
