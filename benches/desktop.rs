//! Desktop runtime benchmark: our observe and action batches against ImageMagick `import`,
//! `scrot` and `xdotool` on the same Xvfb display with a running Chromium, plus PSS memory.
//! Capture is measured through shared memory and through the X socket side by side, with the
//! CPU time it costs this process and the X server, and full against scaled frames.
//!
//! Run with `cargo bench --bench desktop` (needs `scripts/install-desktop-deps.sh`).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::capture::{CapturePath, RawFrame, XDisplay, frame_hash};
use rakazo::desktop::command::{HostRunner, sweep_script};
use rakazo::desktop::png_bands::BandPng;
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use rakazo_actors::provider::{Action, FrameSize};

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

/// CPU time all threads of process `pid` have run, in nanoseconds (`/proc/<pid>/task/*/schedstat`).
fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// The Xvfb process serving display `:display`.
fn xvfb_pid(display: u32) -> Option<u32> {
    let want = format!(":{display}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let mut args = cmdline.split(|&b| b == 0).map(String::from_utf8_lossy);
        let program = args.next()?;
        (program.ends_with("Xvfb") && args.any(|a| a == want)).then_some(pid)
    })
}

/// The word-wise multiply-xorshift hash frames had before XXH3: the baseline of the hash row.
fn word_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    for w in bytes.chunks_exact(8) {
        let v = u64::from_le_bytes(w.try_into().unwrap_or_default());
        h = (h ^ v).wrapping_mul(K);
        h ^= h >> 32;
    }
    h
}

/// A copy of `raw` with a `side` x `side` square in its top left corner painted over.
fn with_square(raw: &RawFrame, side: usize) -> RawFrame {
    let mut bgrx = raw.bgrx.clone();
    let stride = raw.width as usize * 4;
    for y in 0..side {
        for px in bgrx[y * stride..y * stride + side * 4].chunks_exact_mut(4) {
            px.copy_from_slice(&[0x20, 0x80, 0xe0, 0]);
        }
    }
    RawFrame {
        width: raw.width,
        height: raw.height,
        hash: frame_hash(&bgrx),
        bgrx,
    }
}

/// Wall time percentiles of `n` calls of `f`, with the mean CPU time per call of this process
/// and of the X server, in milliseconds.
struct Cost {
    wall: Stats,
    cpu_ms: f64,
    x_cpu_ms: f64,
}

fn cost(n: usize, xvfb: u32, mut f: impl FnMut()) -> Cost {
    f();
    let mut samples = Vec::with_capacity(n);
    let (cpu, x_cpu) = (cpu_ns(std::process::id()), cpu_ns(xvfb));
    for _ in 0..n {
        let started = Instant::now();
        f();
        samples.push(started.elapsed());
    }
    let per = |ns: u64| ns as f64 / 1e6 / n as f64;
    Cost {
        wall: stats(samples),
        cpu_ms: per(cpu_ns(std::process::id()) - cpu),
        x_cpu_ms: per(cpu_ns(xvfb) - x_cpu),
    }
}

fn print_cost(label: &str, c: &Cost) {
    println!(
        "  {label:<34} {:8.2} {:8.2} {:9.2} {:9.2}",
        ms(c.wall.p50),
        ms(c.wall.p95),
        c.cpu_ms,
        c.x_cpu_ms
    );
}
/// A page like a real site (a screenful of coloured text) with a clock that repaints every
/// 5 ms: every observation finds a small part of the screen changed.
const CLOCK_PAGE: &str = "data:text/html,<body style='font:14px serif'><h1 id=t></h1><script>\
for(let i=0;i<400;i++)document.write('<span style=color:%23'+(i*2654435761%2516777216).toString(16).padStart(6,0)+'>Rakazo desktop '+i+' </span>');\
setInterval(()=>{t.textContent=performance.now().toFixed(1)},5)</script>";

/// One bot's observe on the clock page, alone and while three other bots observe theirs (back
/// to back, and at an agent's pace of one every 100 ms): its p50 and p95 against alone, its CPU
/// per observe alone, and how many observes the others made.
fn concurrent_observers(rt: &tokio::runtime::Runtime, runtime: &Arc<DesktopRuntime>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let bots = ["bench", "bench-2", "bench-3", "bench-4"];
    for (slot, bot) in bots.iter().enumerate().skip(2) {
        rt.block_on(runtime.open_screen(bot, slot as u32))
            .expect("open a further screen");
    }
    for bot in bots {
        rt.block_on(runtime.open_in_browser(bot, CLOCK_PAGE))
            .unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    // One bot's observes, 20 ms apart (the clock has moved), while the others observe theirs
    // with `pause_others` between calls; the others' observes per second.
    let measure = |pause_others: Option<Duration>| {
        let stop = Arc::new(AtomicBool::new(false));
        let others_done = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = pause_others
            .map(|pause| {
                bots[1..]
                    .iter()
                    .map(|bot| {
                        let (runtime, stop, done) =
                            (runtime.clone(), stop.clone(), others_done.clone());
                        let bot = bot.to_string();
                        std::thread::spawn(move || {
                            let rt = tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                                .unwrap();
                            while !stop.load(Ordering::Relaxed) {
                                rt.block_on(runtime.observe(&bot)).unwrap();
                                done.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(pause);
                            }
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        std::thread::sleep(Duration::from_millis(300));
        let (cpu, others_before, started) = (
            cpu_ns(std::process::id()),
            others_done.load(Ordering::Relaxed),
            Instant::now(),
        );
        let mut samples = Vec::new();
        for _ in 0..150 {
            std::thread::sleep(Duration::from_millis(20));
            let t = Instant::now();
            let o = rt.block_on(runtime.observe("bench")).unwrap();
            samples.push(t.elapsed());
            assert!(!o.frame.png.is_empty());
        }
        let cpu_ms = (cpu_ns(std::process::id()) - cpu) as f64 / 1e6 / samples.len() as f64;
        let others_rate = (others_done.load(Ordering::Relaxed) - others_before) as f64
            / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        (stats(samples), cpu_ms, others_rate)
    };
    let (alone, alone_cpu, _) = measure(None);
    let (paced, _, paced_rate) = measure(Some(Duration::from_millis(100)));
    let (busy, _, busy_rate) = measure(Some(Duration::ZERO));
    println!();
    println!(
        "one bot's observe on the clock page    p50 ms   p95 ms  p50 / alone  p95 / alone  others' observes/s"
    );
    for (label, s, rate) in [
        ("alone", &alone, 0.0),
        ("3 others, one every 100 ms each", &paced, paced_rate),
        ("3 others, back to back", &busy, busy_rate),
    ] {
        println!(
            "  {label:<34} {:8.2} {:8.2} {:11.2}x {:11.2}x {:12.0}",
            ms(s.p50),
            ms(s.p95),
            ms(s.p50) / ms(alone.p50),
            ms(s.p95) / ms(alone.p95),
            rate
        );
    }
    println!("  CPU of this process per observe, alone: {alone_cpu:.2} ms");
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("workspace")).unwrap();
    let run_dir = dir.path().join("run");
    let config = RuntimeConfig::on_host(
        dir.path().join("workspace"),
        run_dir.clone(),
        DisplayPool::new(71),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = Arc::new(DesktopRuntime::new(Arc::new(HostRunner::minimal()), config));
    let screen = rt
        .block_on(runtime.open_screen("bench", 0))
        .expect("open screen");
    let d = screen.display;
    // A busy page: gradient background and a screenful of text, like real sites.
    let page = "data:text/html,<body style='background:linear-gradient(45deg,%23f06,%2348f);font:14px serif'>\
        <script>for(let i=0;i<400;i++)document.write('<span style=color:%23'+(i*2654435761%2516777216).toString(16).padStart(6,0)+'>Rakazo desktop '+i+' </span>')</script>";
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
    let xvfb = xvfb_pid(d).expect("the display's Xvfb");
    let mut x = XDisplay::connect(d).unwrap();
    assert_eq!(x.capture_path(), CapturePath::SharedMemory);
    let full = FrameSize::FULL;
    let half = FrameSize {
        max_width: Some(640),
        max_height: None,
    };
    // What an observe of a changed screen costs: capture, hash, PNG; through shared memory,
    // then through the socket, then scaled; and the capture alone both ways.
    let shm_observe = cost(50, xvfb, || {
        x.grab().unwrap().shot(full).unwrap();
    });
    let shm_grab = cost(50, xvfb, || {
        x.grab().unwrap();
    });
    // The same into the buffer of the frame before, as the runtime's observe captures now.
    let shm_grab_reused = cost(50, xvfb, || {
        let frame = x.grab().unwrap();
        x.recycle(frame);
    });
    let shm_half = cost(50, xvfb, || {
        x.grab().unwrap().shot(half).unwrap();
    });
    x.set_shared_memory(false);
    assert_eq!(x.capture_path(), CapturePath::Socket);
    let socket_observe = cost(50, xvfb, || {
        x.grab().unwrap().shot(full).unwrap();
    });
    let socket_grab = cost(50, xvfb, || {
        x.grab().unwrap();
    });
    x.set_shared_memory(true);
    // Encoding alone, from one captured frame.
    let raw = x.grab().unwrap();
    let (full_len, half_len) = (
        raw.shot(full).unwrap().png.len(),
        raw.shot(half).unwrap().png.len(),
    );
    let encode_full = cost(30, xvfb, || {
        raw.shot(full).unwrap();
    });
    let encode_half = cost(30, xvfb, || {
        raw.shot(half).unwrap();
    });
    // Band encoding, what a full-size observe does now: every band deflated (a screen changed
    // everywhere, or the first frame), and a 120x120 square changed (a caret, a spinner, a
    // clock), each frame alternating with the one before.
    let mut bands = BandPng::new();
    let bands_len = bands.encode(&raw, None).unwrap().png.len();
    let encode_bands_all = cost(30, xvfb, || {
        bands.encode(&raw, None).unwrap();
    });
    let square = with_square(&raw, 120);
    bands.encode(&raw, None).unwrap();
    let mut back = false;
    let encode_bands_square = cost(30, xvfb, || {
        let (next, last) = if back {
            (&raw, &square)
        } else {
            (&square, &raw)
        };
        bands.encode(next, Some(last)).unwrap();
        back = !back;
    });
    // The hash of every captured frame and the digest of every answered PNG, each against
    // what it was before, and a whole small-change observe as the server does it: capture and
    // hash, bands with the square changed, digest.
    let mut sink = 0u64;
    let hash_xxh3 = cost(50, xvfb, || sink ^= frame_hash(&raw.bgrx));
    let hash_words = cost(50, xvfb, || sink ^= word_hash(&raw.bgrx));
    let png = bands.encode(&raw, None).unwrap().png;
    let digest_blake3 = cost(50, xvfb, || {
        sink ^= u64::from(rakazo::tools::frame_digest(&png).as_bytes()[0]);
    });
    let digest_sha256 = cost(50, xvfb, || {
        use sha2::Digest;
        sink ^= u64::from(sha2::Sha256::digest(&png)[0]);
    });
    std::hint::black_box(sink);
    // Reusing the buffer of the frame before (as the runtime's observe does), or not.
    let mut back = false;
    let mut small_observe_with = |reuse: bool| {
        cost(30, xvfb, || {
            let grabbed = x.grab().unwrap();
            let (next, last) = if back {
                (&raw, &square)
            } else {
                (&square, &raw)
            };
            std::hint::black_box(grabbed.hash);
            let png = bands.encode(next, Some(last)).unwrap().png;
            rakazo::tools::frame_digest(&png);
            if reuse {
                x.recycle(grabbed);
            }
            back = !back;
        })
    };
    let small_observe = small_observe_with(true);
    let small_observe_fresh = small_observe_with(false);
    let out = dir.path().join("shot.png");
    let out_s = out.to_string_lossy().into_owned();
    let import = time_command(8, d, "import", &["-window", "root", &out_s]);
    let scrot = time_command(20, d, "scrot", &["-o", &out_s]);
    println!();
    println!("observe (1280x800 PNG)         p50 ms   p95 ms");
    println!(
        "  rakazo observe             {:8.1} {:8.1}   ({} KiB PNG; kept frame when nothing was drawn)",
        ms(ours.p50),
        ms(ours.p95),
        png_len / 1024
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
        "  speedup vs import (p50)    {:8.1}x   (fresh capture, shared memory)",
        ms(import.p50) / ms(shm_observe.wall.p50)
    );
    println!(
        "  speedup vs scrot (p50)     {:8.1}x   (fresh capture, shared memory)",
        ms(scrot.p50) / ms(shm_observe.wall.p50)
    );
    println!();
    println!("fresh capture (screen changed)       p50 ms   p95 ms  cpu ms/op  Xvfb cpu ms/op");
    print_cost("shared memory + hash + PNG", &shm_observe);
    print_cost("GetImage + hash + PNG", &socket_observe);
    print_cost("shared memory capture + hash", &shm_grab);
    print_cost("the same into the last frame's buffer", &shm_grab_reused);
    print_cost("GetImage capture + hash", &socket_grab);
    print_cost("shared memory + hash + PNG 640 wide", &shm_half);
    print_cost("PNG encode, full 1280x800", &encode_full);
    print_cost("PNG encode, scaled to 640x400", &encode_half);
    print_cost("band PNG, every band deflated", &encode_bands_all);
    print_cost("band PNG, 120x120 square changed", &encode_bands_square);
    print_cost("frame hash, 4000 KiB, XXH3", &hash_xxh3);
    print_cost("frame hash, word-wise (before)", &hash_words);
    print_cost("frame digest, BLAKE3", &digest_blake3);
    print_cost("frame digest, SHA-256 (before)", &digest_sha256);
    print_cost("observe, square changed: all above", &small_observe);
    print_cost("the same, a fresh buffer per capture", &small_observe_fresh);
    println!(
        "  cpu ratio, hash before / XXH3: {:.2}x; digest SHA-256 / BLAKE3: {:.2}x (PNG {} KiB)",
        hash_words.cpu_ms / hash_xxh3.cpu_ms,
        digest_sha256.cpu_ms / digest_blake3.cpu_ms,
        png.len() / 1024
    );
    println!(
        "  cpu ratio, whole-frame encode / bands with a square changed: {:.2}x; every band / whole frame: {:.2}x   (PNG {} KiB / {} KiB)",
        encode_full.cpu_ms / encode_bands_square.cpu_ms,
        encode_bands_all.cpu_ms / encode_full.cpu_ms,
        bands_len / 1024,
        full_len / 1024
    );
    println!(
        "  cpu ratio, GetImage / shared memory (observe): {:.2}x; capture alone: {:.2}x",
        socket_observe.cpu_ms / shm_observe.cpu_ms,
        socket_grab.cpu_ms / shm_grab.cpu_ms
    );
    println!(
        "  cpu ratio, full / scaled encode: {:.2}x   (PNG {} KiB / {} KiB)",
        encode_full.cpu_ms / encode_half.cpu_ms,
        full_len / 1024,
        half_len / 1024
    );

    // Ten pointer moves: one XTEST batch against ten xdotool processes.
    let points: Vec<(i32, i32)> = (0..10).map(|i| (600 + i * 7, 400 + i * 5)).collect();
    let batch: Vec<Action> = points.iter().map(|&(x, y)| Action::Move { x, y }).collect();
    let mut ours = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        x.apply_batch(&batch).unwrap();
        ours.push(started.elapsed());
    }
    let ours = stats(ours);
    let mut with_settle = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        rt.block_on(runtime.act("bench", &batch)).unwrap();
        with_settle.push(started.elapsed());
    }
    let with_settle = stats(with_settle);
    // The same batch settled with the quiet window every batch had before pointer-only
    // batches got their own.
    let settle = Settle::default();
    let mut common_quiet = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        x.apply_batch(&batch).unwrap();
        x.settle(Duration::ZERO, settle.quiet, settle.timeout)
            .unwrap();
        common_quiet.push(started.elapsed());
    }
    let common_quiet = stats(common_quiet);
    // The same batch settled as before DAMAGE: 50 ms, then a capture every 50 ms until two
    // are equal, then PNG.
    let mut polled = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        x.apply_batch(&batch).unwrap();
        x.settle_by_polling(settle.first_delay, settle.interval, settle.timeout)
            .unwrap()
            .encode_png()
            .unwrap();
        polled.push(started.elapsed());
    }
    let polled = stats(polled);
    let mut xdo = Vec::new();
    for _ in 0..20 {
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
        "  rakazo act (damage settle) {:8.1} {:8.1}   (pointer-only quiet window {} ms)",
        ms(with_settle.p50),
        ms(with_settle.p95),
        settle.pointer_quiet.as_millis()
    );
    println!(
        "  act, {} ms quiet window    {:8.1} {:8.1}   (every batch before)",
        settle.quiet.as_millis(),
        ms(common_quiet.p50),
        ms(common_quiet.p95)
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
        "  speedup, act vs xdotool    {:8.2}x   ({} ms quiet: {:.2}x; polling settle: {:.2}x)",
        ms(xdo.p50) / ms(with_settle.p50),
        settle.quiet.as_millis(),
        ms(xdo.p50) / ms(common_quiet.p50),
        ms(xdo.p50) / ms(polled.p50)
    );

    // Memory: one active desktop (Xvfb + fluxbox + Chromium on the busy page), then what a
    // second one (on about:blank) adds. Counted over the process trees of the tagged
    // processes, and, for comparison, over the tagged processes alone.
    let prefix = format!("{}/screen-", run_dir.display());
    std::thread::sleep(Duration::from_secs(3));
    let ((one_tagged, n_tagged), (one, n_tree)) = pss_kib(&prefix);
    rt.block_on(runtime.open_screen("bench-2", 1))
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

    concurrent_observers(&rt, &runtime);

    rt.block_on(runtime.shutdown()).unwrap();
    let _ = Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", run_dir.display())))
        .status();
}
