//! Desktop runtime benchmark: our observe and action batches against ImageMagick `import`,
//! `scrot` and `xdotool` on the same Xvfb display with a running Chromium, plus PSS memory.
//!
//! Run with `cargo bench --bench desktop` (needs `scripts/install-desktop-deps.sh`).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::capture::XDisplay;
use rakazo::desktop::command::{HostRunner, sweep_script};
use rakazo::desktop::gateway::free_local_port;
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use rakazo_actors::provider::Action;

mod support;

use support::pss::pss_kib;

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
        warm_stacks: 0,
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
    let mut x = XDisplay::connect(d).unwrap();
    let mut grab = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        x.grab().unwrap();
        grab.push(started.elapsed());
    }
    let grab = stats(grab);
    // What every observe did before frames were kept: capture, hash and encode each time.
    let mut encode = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        x.grab().unwrap().encode_png().unwrap();
        encode.push(started.elapsed());
    }
    let encode = stats(encode);
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
        "  rakazo grab + hash + PNG   {:8.1} {:8.1}   (every observe before frames were kept)",
        ms(encode.p50),
        ms(encode.p95)
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
    // The same batch settled as before DAMAGE: 50 ms, then a capture every 50 ms until two
    // are equal, then PNG.
    let mut polled = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        x.apply_batch(&batch).unwrap();
        let settle = Settle::default();
        x.settle_by_polling(settle.first_delay, settle.interval, settle.timeout)
            .unwrap()
            .encode_png()
            .unwrap();
        polled.push(started.elapsed());
    }
    let polled = stats(polled);
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
        "  rakazo act (damage settle) {:8.1} {:8.1}",
        ms(with_settle.p50),
        ms(with_settle.p95)
    );
    println!(
        "  act, polling settle (old)  {:8.1} {:8.1}",
        ms(polled.p50),
        ms(polled.p95)
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
        "  speedup, act vs xdotool    {:8.1}x   (polling settle: {:.1}x)",
        ms(xdo.p50) / ms(with_settle.p50),
        ms(xdo.p50) / ms(polled.p50)
    );

    // Memory: one active desktop (Xvfb + fluxbox + Chromium on the busy page), then what a
    // second one (on about:blank) adds. Counted over the process trees of the tagged
    // processes, and, for comparison, over the tagged processes alone.
    let prefix = format!("{}/screen-", run_dir.display());
    std::thread::sleep(Duration::from_secs(3));
    let ((one_tagged, n_tagged), (one, n_tree)) = pss_kib(&prefix);
    rt.block_on(runtime.open_screen("bench-2"))
        .expect("open a second screen");
    std::thread::sleep(Duration::from_secs(3));
    let ((two_tagged, _), (two, n_tree_two)) = pss_kib(&prefix);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let extra = two.saturating_sub(one);
    let fit = 1.0 + (22.0 * 1024.0 - mib(one)) / mib(extra).max(1.0);
    println!();
    println!(
        "PSS, tagged processes only: one desktop {:.0} MiB ({n_tagged} processes), two {:.0} MiB",
        mib(one_tagged),
        mib(two_tagged)
    );
    println!(
        "PSS, whole process trees: one desktop {:.0} MiB ({n_tree} processes), two {:.0} MiB ({n_tree_two}); the second adds {:.0} MiB",
        mib(one),
        mib(two),
        mib(extra)
    );
    println!("desktops per host: about {fit:.0} in 22 GiB (24 GiB less 2 GiB for the system)");

    rt.block_on(runtime.shutdown()).unwrap();
    let _ = Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", run_dir.display())))
        .status();
}
