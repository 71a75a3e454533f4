//! Desktop slot concurrency benchmark: eight bots opening their desktops at the same moment on
//! one machine against one bot alone (and, with `BENCH_SERIAL=1`, against eight opened one
//! after another, which is what a table lock held through every start amounted to), and one
//! bot's observe while another bot's browser starts against its observe on an idle machine,
//! and the memory (PSS over the desktops' whole process trees) of each further desktop.
//! Every figure is taken for the runtime's start and for the plain start before it
//! ([`Launch::plain`]: every Chromium feature, GLX, the runtime's CPU priority), rounds
//! alternating, so the two are compared in the same run; the runtime's start is taken once more
//! with a control group per desktop, as the host provider runs it as root, and once with those
//! groups but without holding a starting desktop off the first CPU (`hold_starts`); the lowered
//! starts are taken for good ([`Launch::lowered`]) and only while they last
//! ([`Launch::lowered_while_starting`], root raising the desktop back once its browser is open),
//! and with groups, a starting desktop weighed in a low group until it is at work
//! ([`rakazo::desktop::start_group`]).
//! `BENCH_ONLY=spares` takes the opening figures of the runtime's start without spares and with
//! [`SPARES`] spare desktops ready (`SANDBOX_DESKTOP_WARM_STACKS`), for bots new to the
//! computer, which take a spare's running browser (`BENCH_SKIP_COLD=1`: only the leg with
//! spares). Each opening's figures include the CPU time of this process and of its runtime
//! thread.
//!
//! Run with `cargo bench --bench desktop_slots` (needs `scripts/install-desktop-deps.sh`, and
//! root for the desktop groups); `BENCH_ONLY=memory` takes only the memory figures,
//! `BENCH_ONLY=observe` only the observe figures, `BENCH_STARTS=N` observes through N other
//! bots' starts (default: the rounds, at least 3), `BENCH_ONLY=open` only the opening figures;
//! `RAKAZO_LOG` (for example `info`) prints the runtime's events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::desktop::browser::Launch;
use rakazo::desktop::command::{HostRunner, sweep_script};
use rakazo::desktop::groups::{DesktopGroups, DesktopLimits, HostGroups};
use rakazo::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig};

mod support;

/// The watched bot's page: a busy page (gradient background, a screenful of coloured text, as in
/// `benches/desktop.rs`) with a square in its corner that takes a new colour every 100 ms, so
/// that every observe made [`REPAINT_PAUSE`] after the last captures a changed frame (an
/// unchanged screen would be answered from its last frame) and encodes the bands of rows the
/// square covers.
const WATCHED_PAGE: &str = "data:text/html,<body style='background:linear-gradient(45deg,%23f06,%2348f);font:14px serif'>\
    <div id=t style='position:fixed;top:0;left:0;width:120px;height:120px'></div>\
    <script>for(let i=0;i<400;i++)document.write('<span style=color:%23'+(i*2654435761%2516777216).toString(16).padStart(6,0)+'>Rakazo desktop '+i+' </span>');\
    let n=1;setInterval(()=>{n=(n*7919+104729)%2516777216;t.style.background='%23'+n.toString(16).padStart(6,0)},100)</script>";

/// Pause before each timed observe: longer than the watched page's 100 ms repaint period.
const REPAINT_PAUSE: Duration = Duration::from_millis(110);

/// Desktops opened one by one for the memory figure.
const MEMORY_DESKTOPS: usize = 4;

/// Spare desktops of the spares leg: one per bot of the eight.
const SPARES: usize = 8;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One way of starting desktops: how the browser starts, and whether each desktop has its own
/// control group (as the host provider gives it when run as root, `SANDBOX_DESKTOP_CPU_WEIGHT`
/// 100, no memory ceiling, no freezing).
#[derive(Clone, Copy)]
struct Setup {
    launch: Launch,
    grouped: bool,
    /// With groups: a starting desktop is held off the first CPU while another is at work.
    hold_starts: bool,
    /// With groups: how far below the runtime a starting desktop's group weighs until it is
    /// at work (`SANDBOX_DESKTOP_START_NICE`, [`rakazo::desktop::start_group`]).
    start_nice: u8,
    /// Spare desktops kept ready, every one of them ready before a measurement.
    spares: usize,
}

/// Desktop groups of a fresh machine, named after its directory.
fn groups(dir: &std::path::Path, hold_starts: bool, start_nice: u8) -> Arc<dyn DesktopGroups> {
    let name = format!(
        "bench-{}",
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('.')
    );
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 0,
        freeze_after: None,
        hold_starts,
    };
    HostGroups::new(&name, limits, start_nice).expect("desktop groups (run the bench as root)")
}

fn runtime(dir: &std::path::Path, first_display: u32, setup: Setup) -> Arc<DesktopRuntime> {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    Arc::new(
        DesktopRuntime::new(
            Arc::new(HostRunner::minimal()),
            RuntimeConfig {
                groups: setup
                    .grouped
                    .then(|| groups(dir, setup.hold_starts, setup.start_nice)),
                warm_stacks: setup.spares,
                ..RuntimeConfig::on_host(
                    dir.join("workspace"),
                    dir.join("run"),
                    DisplayPool::new(first_display),
                )
            },
        )
        .with_launch(setup.launch),
    )
}

/// Waits until every spare desktop of `rt` is ready and its memory read (the pool reads it a
/// moment after each start), so nothing of theirs runs in the measurement.
async fn spares_ready(rt: &DesktopRuntime, spares: usize) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while rt.warm_status().ready < spares || rt.warm_status().filling > 0 {
        assert!(Instant::now() < deadline, "the spares did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    until_quiet().await;
    let status = rt.warm_status();
    println!(
        "{} spares ready hold {:.0} MiB PSS ({:.0} MiB each)",
        status.ready,
        status.pss_kib as f64 / 1024.0,
        status.pss_kib as f64 / 1024.0 / status.ready.max(1) as f64
    );
}

/// Busy and total CPU time of the machine so far (`/proc/stat`, clock ticks).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Waits until the machine's CPUs are at most 10% busy over a quarter of a second (the spares'
/// browsers finish what they do after their start), at most 30 s.
async fn until_quiet() {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (busy, total) = cpu_ticks();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (busy2, total2) = cpu_ticks();
        let share = (busy2 - busy) as f64 / (total2 - total).max(1) as f64;
        if share <= 0.10 || Instant::now() > deadline {
            return;
        }
    }
}

fn sweep(dir: &std::path::Path) {
    let _ = std::process::Command::new("bash")
        .arg("-c")
        .arg(sweep_script(&format!("{}/", dir.join("run").display())))
        .status();
}

/// CPU time this process (all its threads, ended ones too) and this thread (the runtime's,
/// on the bench's current-thread runtime) have run so far.
fn cpu_now() -> (Duration, Duration) {
    use rustix::time::{ClockId, clock_gettime};
    let of = |clock| {
        let t = clock_gettime(clock);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };
    (of(ClockId::ProcessCPUTime), of(ClockId::ThreadCPUTime))
}

/// What an opening of desktops took: wall time, and the CPU time of this process and of its
/// runtime thread.
#[derive(Clone, Copy)]
struct Opening {
    wall: Duration,
    cpu: Duration,
    runtime_cpu: Duration,
}

/// Opens `bots` desktops on a fresh runtime, all at once or one after another.
async fn open_many(bots: usize, together: bool, first_display: u32, setup: Setup) -> Opening {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), first_display, setup);
    rt.start_warm_pool();
    // A first screen outside the measurement: the runtime's one-time start (leftover reaping).
    rt.open_screen("warm", 0).await.unwrap();
    rt.close_screen("warm").await.unwrap();
    if setup.spares > 0 {
        spares_ready(&rt, setup.spares).await;
    }
    let (cpu, runtime_cpu) = cpu_now();
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
    let wall = started.elapsed();
    let (cpu2, runtime_cpu2) = cpu_now();
    rt.shutdown().await.unwrap();
    sweep(dir.path());
    Opening {
        wall,
        cpu: cpu2 - cpu,
        runtime_cpu: runtime_cpu2 - runtime_cpu,
    }
}

/// PSS in KiB of every desktop of a runtime, after each of [`MEMORY_DESKTOPS`] desktops
/// (about:blank) opened one by one, read 3 s after it opened.
async fn memory(first_display: u32, setup: Setup) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(dir.path(), first_display, setup);
    let prefix = format!("{}/screen-", dir.path().join("run").display());
    let mut out = Vec::new();
    for i in 0..MEMORY_DESKTOPS {
        rt.open_screen(&format!("mem-{i}"), i as u32).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        out.push(support::pss::pss_kib(&prefix).1.0);
    }
    rt.shutdown().await.unwrap();
    sweep(dir.path());
    out
}

/// Figures of one way of starting desktops.
#[derive(Default)]
struct Figures {
    one: Vec<Opening>,
    eight: Vec<Opening>,
    serial: Vec<Opening>,
    idle: Vec<Duration>,
    busy: Vec<Duration>,
    /// PSS KiB after each desktop, per round.
    memory: Vec<Vec<u64>>,
}

impl Figures {
    fn report(&mut self, name: &str) {
        if !self.one.is_empty() {
            self.report_opens(name);
        }
        if !self.idle.is_empty() {
            self.report_observes(name);
        }
        let mib = |kib: u64| kib as f64 / 1024.0;
        for pss in &self.memory {
            let first = pss[0];
            let last = pss[pss.len() - 1];
            println!(
                "{name}: PSS after each desktop {:?} MiB; the first {:.0} MiB, each further one {:.0} MiB",
                pss.iter()
                    .map(|&k| mib(k).round() as u64)
                    .collect::<Vec<_>>(),
                mib(first),
                mib(last.saturating_sub(first)) / (pss.len() - 1) as f64
            );
        }
    }

    fn report_opens(&mut self, name: &str) {
        let median = |runs: &[Opening], of: fn(&Opening) -> Duration| {
            let mut samples: Vec<Duration> = runs.iter().map(of).collect();
            percentile(&mut samples, 0.5)
        };
        let one = median(&self.one, |o| o.wall);
        let eight = median(&self.eight, |o| o.wall);
        // Two decimals: with spares ready an opening takes about a millisecond.
        println!("{name}: open 1 desktop: {:.2} ms", ms(one));
        println!(
            "{name}: open 8 desktops at once: {:.2} ms ({:.2}x one)",
            ms(eight),
            ms(eight) / ms(one)
        );
        for (what, runs) in [("1 desktop", &self.one), ("8 at once", &self.eight)] {
            println!(
                "{name}: CPU of this process opening {what}: {:.2} ms (its runtime thread {:.2} ms)",
                ms(median(runs, |o| o.cpu)),
                ms(median(runs, |o| o.runtime_cpu))
            );
        }
        if !self.serial.is_empty() {
            let serial = median(&self.serial, |o| o.wall);
            println!(
                "{name}: open 8 desktops one after another: {:.0} ms ({:.2}x one)",
                ms(serial),
                ms(serial) / ms(one)
            );
        }
    }

    fn report_observes(&mut self, name: &str) {
        let idle50 = percentile(&mut self.idle, 0.5);
        let busy50 = percentile(&mut self.busy, 0.5);
        let idle95 = percentile(&mut self.idle, 0.95);
        let busy95 = percentile(&mut self.busy, 0.95);
        println!(
            "{name}: observe p95 idle: {:.1} ms ({} samples); while another browser starts: {:.1} ms ({} samples); ratio {:.2}",
            ms(idle95),
            self.idle.len(),
            ms(busy95),
            self.busy.len(),
            ms(busy95) / ms(idle95)
        );
        println!(
            "{name}: observe p50 idle: {:.1} ms; while another browser starts: {:.1} ms; ratio {:.2}",
            ms(idle50),
            ms(busy50),
            ms(busy50) / ms(idle50)
        );
    }
}

/// A desktop that is observed while others start on its runtime.
struct Watched {
    desk: Arc<DesktopRuntime>,
    dir: tempfile::TempDir,
}

impl Watched {
    async fn open(first_display: u32, setup: Setup) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let desk = runtime(dir.path(), first_display, setup);
        desk.open_screen("watched", 0).await.unwrap();
        // Opened in a new tab of the bot's browser (typing it into the address bar raced the
        // omnibox's suggestions, which dropped keys): the page then repaints its corner every
        // 100 ms, which the bench checks before measuring.
        desk.open_in_browser("watched", WATCHED_PAGE).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let first = desk.observe("watched").await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        let second = desk.observe("watched").await.unwrap();
        assert_ne!(
            first.hash, second.hash,
            "the watched page does not repaint: observes would be answered from the kept frame"
        );
        Self { desk, dir }
    }

    /// One observe, timed, after a pause longer than the page's repaint period, so every
    /// observe captures and encodes a changed screen (one answered from the kept frame would
    /// only time the scheduler); the pause is not timed.
    async fn observe(&self, into: &mut Vec<Duration>) {
        tokio::time::sleep(REPAINT_PAUSE).await;
        let t = Instant::now();
        self.desk.observe("watched").await.unwrap();
        into.push(t.elapsed());
    }

    async fn idle(&self, samples: usize, into: &mut Vec<Duration>) {
        for _ in 0..samples {
            self.observe(into).await;
        }
    }

    /// Observes, as [`Self::idle`], while another bot's desktop opens on the same runtime.
    async fn while_another_starts(&self, other: String, into: &mut Vec<Duration>) {
        let opening = tokio::spawn({
            let desk = self.desk.clone();
            async move { desk.open_screen(&other, 1).await.map(|_| other) }
        });
        while !opening.is_finished() {
            self.observe(into).await;
        }
        let other = opening.await.unwrap().unwrap();
        self.desk.close_screen(&other).await.unwrap();
    }

    async fn close(self) {
        self.desk.shutdown().await.unwrap();
        sweep(self.dir.path());
    }
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // Other bots' starts to observe through (`BENCH_STARTS`, at least 3); each gives 6 to 8
    // samples.
    let starts: usize = std::env::var("BENCH_STARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rounds)
        .max(3);
    let serial = std::env::var_os("BENCH_SERIAL").is_some();
    // `BENCH_ONLY=memory`: only the memory figures, `rounds` of each start, alternating.
    let memory_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "memory");
    // `BENCH_ONLY=observe`: only one bot's observe, idle and while another browser starts.
    let observe_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "observe");
    // `BENCH_ONLY=spares`: only the opening figures, without spares and with [`SPARES`].
    let spares_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "spares");
    // `BENCH_ONLY=open`: only the opening figures of every start.
    let open_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "open");
    if let Ok(filter) = std::env::var("RAKAZO_LOG") {
        rakazo::telemetry::init(&filter);
    }
    // One thread is enough: captures and encodes run on the blocking pool, as in the API.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "desktop slots bench ({rounds} rounds, median shown; plain start against the runtime's)"
        );
        let bare = |launch| Setup {
            launch,
            grouped: false,
            hold_starts: false,
            start_nice: 0,
            spares: 0,
        };
        if spares_only {
            let legs = [
                ("runtime (lean), no spares", bare(Launch::default())),
                (
                    "runtime (lean), 8 spares ready",
                    Setup {
                        spares: SPARES,
                        ..bare(Launch::default())
                    },
                ),
            ];
            let mut figures: [Figures; 2] = Default::default();
            for _ in 0..rounds {
                for ((_, setup), f) in legs.iter().zip(figures.iter_mut()) {
                    if setup.spares == 0 && std::env::var_os("BENCH_SKIP_COLD").is_some() {
                        continue;
                    }
                    f.one.push(open_many(1, true, 171, *setup).await);
                    f.eight.push(open_many(8, true, 171, *setup).await);
                }
            }
            for ((name, _), f) in legs.iter().zip(figures.iter_mut()) {
                if !f.one.is_empty() {
                    f.report(name);
                }
            }
            return;
        }
        let launches = [
            ("plain", bare(Launch::plain())),
            ("runtime (lean)", bare(Launch::default())),
            ("lean, lowered", bare(Launch::lowered())),
            (
                "desktop groups, starts not held",
                Setup {
                    launch: Launch::default(),
                    grouped: true,
                    hold_starts: false,
                    start_nice: 0,
                    spares: 0,
                },
            ),
            (
                "runtime, desktop groups",
                Setup {
                    launch: Launch::default(),
                    grouped: true,
                    hold_starts: true,
                    start_nice: 0,
                    spares: 0,
                },
            ),
            (
                "lean, lowered while starting",
                bare(Launch::lowered_while_starting()),
            ),
            (
                "desktop groups, lowered while starting",
                Setup {
                    launch: Launch::default(),
                    grouped: true,
                    hold_starts: true,
                    start_nice: rakazo::desktop::browser::DESKTOP_NICE,
                    spares: 0,
                },
            ),
        ];
        let mut figures: [Figures; 7] = Default::default();
        if memory_only {
            for _ in 0..rounds {
                for ((_, setup), f) in launches.iter().zip(figures.iter_mut()).step_by(2) {
                    f.memory.push(memory(171, *setup).await);
                }
            }
            for ((name, _), f) in launches.iter().zip(figures.iter_mut()).step_by(2) {
                f.report(name);
            }
            return;
        }
        for _ in 0..if observe_only { 0 } else { rounds } {
            for ((_, setup), f) in launches.iter().zip(figures.iter_mut()) {
                f.one.push(open_many(1, true, 171, *setup).await);
                f.eight.push(open_many(8, true, 171, *setup).await);
                if serial {
                    f.serial.push(open_many(8, false, 171, *setup).await);
                }
            }
        }

        if open_only {
            for ((name, _), f) in launches.iter().zip(figures.iter_mut()) {
                f.report(name);
            }
            return;
        }
        // Observe of one bot, idle and while another bot's browser starts (on 171, 181, ...).
        let mut watched = Vec::new();
        for (i, (_, setup)) in launches.iter().enumerate() {
            watched.push(Watched::open(171 + 10 * i as u32, *setup).await);
        }
        for (w, f) in watched.iter().zip(figures.iter_mut()) {
            w.idle(100, &mut f.idle).await;
        }
        for round in 0..starts {
            for (w, f) in watched.iter().zip(figures.iter_mut()) {
                w.while_another_starts(format!("other-{round}"), &mut f.busy)
                    .await;
            }
        }
        for w in watched {
            w.close().await;
        }
        for _ in 0..if observe_only { 0 } else { rounds.min(2) } {
            for ((_, setup), f) in launches.iter().zip(figures.iter_mut()).step_by(2) {
                f.memory.push(memory(171, *setup).await);
            }
        }
        for ((name, _), f) in launches.iter().zip(figures.iter_mut()) {
            f.report(name);
        }
    });
}
