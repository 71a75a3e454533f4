//! Per-desktop control groups benchmark: one bot's observe p95 idle and while another bot's
//! desktop burns every core, with and without desktop groups side by side; and the time to
//! thaw a frozen desktop (and its first observe after); and one bot's observe while another
//! bot starts programs back to back (`launch_app`), with desktop groups (`BENCH_ONLY=launch`
//! measures only that).
//!
//! Run as root with `cargo bench --bench desktop_groups` for the host `desktop` provider
//! (needs the desktop packages and the cpu, cpuacct, memory and freezer controllers), or
//! `cargo bench --bench desktop_groups -- docker` for a Docker Team computer through an
//! in-process supervisor (needs the engine on cgroup v1 and the computer image).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::desktop::command::sweep_script;
use rakazo::desktop::groups::DesktopLimits;
use rakazo::desktop::provider::{DesktopProvider, DesktopProviderConfig};
use rakazo::desktop::runtime::DesktopRuntime;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo_actors::provider::{MachineSpec, ProviderRef, SandboxProvider};

/// Busy loops started in the burning desktop (more than the cores of a small machine).
const BURNERS: usize = 4;
const SAMPLES: usize = 60;
/// A page whose text changes every 30 ms.
const TICK: &str = "<body style='font:80px monospace'><div id=t></div><script>setInterval(()=>{t.textContent=performance.now().toFixed(1)},30)</script>";

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

async fn observe_samples(p: &dyn SandboxProvider, m: &ProviderRef) -> Vec<Duration> {
    let mut out = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        p.observe(m, "victim").await.unwrap();
        out.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out
}

/// The machines a pass measures: the host provider or Docker computers.
enum Machines {
    Host(std::path::PathBuf),
    Docker { url: String, token: String },
}

impl Machines {
    /// A provider with `limits`, its first display `first_display` on the host.
    fn provider(&self, first_display: u32, limits: Option<DesktopLimits>) -> Arc<dyn Bench> {
        match self {
            Machines::Host(dir) => {
                let dir = dir.join(format!("d{first_display}"));
                Arc::new(
                    DesktopProvider::new(DesktopProviderConfig {
                        homes_root: dir.join("homes"),
                        run_root: dir.join("run"),
                        screen_limit: 0,
                        first_display,
                        environment: "test".into(),
                        limits,
                        warm_stacks: 0,
                        start_nice: 0,
                    })
                    .unwrap(),
                )
            }
            Machines::Docker { url, token } => Arc::new(
                DockerProvider::new(DockerProviderConfig {
                    supervisor_url: url.clone(),
                    supervisor_token: token.clone(),
                    screen_limit: 0,
                    commands_only: false,
                    limits,
                    warm_stacks: 0,
                })
                .unwrap(),
            ),
        }
    }
}

/// A provider with desktop runtimes.
#[async_trait::async_trait]
trait Bench: Send + Sync {
    fn provider(&self) -> &dyn SandboxProvider;
    async fn desktops(&self, m: &ProviderRef) -> Arc<DesktopRuntime>;
}

#[async_trait::async_trait]
impl Bench for DesktopProvider {
    fn provider(&self) -> &dyn SandboxProvider {
        self
    }
    async fn desktops(&self, m: &ProviderRef) -> Arc<DesktopRuntime> {
        self.runtime(m).await.unwrap()
    }
}

#[async_trait::async_trait]
impl Bench for DockerProvider {
    fn provider(&self) -> &dyn SandboxProvider {
        self
    }
    async fn desktops(&self, m: &ProviderRef) -> Arc<DesktopRuntime> {
        self.runtime(m).await.unwrap()
    }
}

fn team(name: &str) -> MachineSpec {
    let space = format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    MachineSpec {
        computer_id: space.clone(),
        space_id: space.clone(),
        bot_id: None,
        home_key: format!("team-{space}"),
    }
}

/// A Team computer with the victim's screen, its page changing every 30 ms (so every observe
/// has a new frame to capture and encode, drawn by the victim's own browser), and `other`'s.
async fn victim_beside(p: &dyn SandboxProvider, name: &str, other: &str) -> ProviderRef {
    let m = p.provision(&team(name)).await.unwrap();
    p.open_screen(&m, "victim", 0).await.unwrap();
    p.open_screen(&m, other, 1).await.unwrap();
    p.write_file(&m, "tick.html", TICK.as_bytes())
        .await
        .unwrap();
    p.open(&m, "victim", "tick.html").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..5 {
        p.observe(&m, "victim").await.unwrap();
    }
    m
}

async fn pass(machines: &Machines, first_display: u32, limits: Option<DesktopLimits>) -> Pass {
    let bench = machines.provider(first_display, limits);
    let p = bench.provider();
    let m = victim_beside(p, "bench", "burner").await;
    let mut idle = observe_samples(p, &m).await;
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
    let mut burn = observe_samples(p, &m).await;
    p.destroy(&m).await.unwrap();
    Pass {
        idle_p50: percentile(&mut idle, 0.5),
        idle_p95: percentile(&mut idle, 0.95),
        burn_p50: percentile(&mut burn, 0.5),
        burn_p95: percentile(&mut burn, 0.95),
    }
}

async fn thaw(machines: &Machines) -> (Vec<Duration>, Vec<Duration>, Vec<Duration>) {
    let bench = machines.provider(
        131,
        Some(DesktopLimits {
            cpu_weight: 100,
            memory_mb: 2048,
            freeze_after: Some(Duration::from_millis(400)),
            hold_starts: true,
        }),
    );
    let p = bench.provider();
    let m = p.provision(&team("thaw")).await.unwrap();
    let runtime = bench.desktops(&m).await;
    p.open_screen(&m, "victim", 0).await.unwrap();
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

/// The victim's observe samples idle and while another bot on the computer starts short
/// programs back to back, with desktop groups; and the time each start took.
async fn launches(
    machines: &Machines,
    limits: DesktopLimits,
) -> (Vec<Duration>, Vec<Duration>, Vec<Duration>) {
    let bench = machines.provider(151, Some(limits));
    let p = bench.provider();
    let m = victim_beside(p, "launch", "starter").await;
    let idle = observe_samples(p, &m).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let starter = tokio::spawn({
        let (bench, m, stop) = (bench.clone(), m.clone(), stop.clone());
        async move {
            let mut starts = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let began = Instant::now();
                bench
                    .provider()
                    .launch(&m, "starter", &["true".into()])
                    .await
                    .unwrap();
                starts.push(began.elapsed());
            }
            starts
        }
    });
    let during = observe_samples(p, &m).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let starts = starter.await.unwrap();
    p.destroy(&m).await.unwrap();
    (idle, during, starts)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let docker = std::env::args().any(|a| a == "docker");
    let machines = if docker {
        let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let url = support::start_supervisor(
            dir.path().canonicalize().unwrap(),
            token.clone(),
            DockerNetwork::None,
        );
        Machines::Docker { url, token }
    } else {
        Machines::Host(dir.path().to_path_buf())
    };
    let prefix = format!("{}/", dir.path().display());
    let cleanup = move || {
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(sweep_script(&prefix))
            .status();
    };
    let limits = DesktopLimits {
        cpu_weight: 100,
        memory_mb: 2048,
        freeze_after: None,
        hold_starts: true,
    };
    let only_launch = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "launch");
    println!(
        "{}: victim observe p50/p95 ms, idle and with {BURNERS} busy loops in another desktop",
        if docker { "docker" } else { "host" }
    );
    for round in (0..2).filter(|_| !only_launch) {
        let without = pass(&machines, 111 + round * 20, None).await;
        let with = pass(&machines, 121 + round * 20, Some(limits)).await;
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
    let (mut wake, mut first, mut warm) = if only_launch {
        Default::default()
    } else {
        thaw(&machines).await
    };
    println!("thaw of a frozen desktop, ms (p50 / p95 / max)");
    for (name, s) in [
        ("thaw only", &mut wake),
        ("first observe after freeze", &mut first),
        ("warm observe", &mut warm),
    ] {
        let Some(&max) = s.iter().max() else {
            continue;
        };
        println!(
            "  {name:27} {:6.1} / {:6.1} / {:6.1}",
            ms(percentile(s, 0.5)),
            ms(percentile(s, 0.95)),
            ms(max)
        );
    }
    let (mut idle, mut during, mut starts) = launches(&machines, limits).await;
    println!(
        "victim observe p50/p95 ms, idle {:6.1}/{:6.1}  while another bot started {} programs (p50 {:.1} ms each) {:6.1}/{:6.1}  p95 ratio {:4.2}x",
        ms(percentile(&mut idle, 0.5)),
        ms(percentile(&mut idle, 0.95)),
        starts.len(),
        ms(percentile(&mut starts, 0.5)),
        ms(percentile(&mut during, 0.5)),
        ms(percentile(&mut during, 0.95)),
        ms(percentile(&mut during, 0.95)) / ms(percentile(&mut idle, 0.95))
    );
    cleanup();
}
