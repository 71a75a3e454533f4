//! Docker computers benchmark: time from a provision request to the first screenshot of a
//! bot's desktop, and PSS memory per additional desktop inside one container. Needs a Docker
//! engine and the computer image (`scripts/build-computer-image.sh`); runs its own supervisor
//! on 127.0.0.1:0. Both screen paths are measured: the shared X socket (direct) and the plain
//! command path the remote providers take (capture helper and xdotool through exec). Results
//! are recorded in `BENCHMARKS.md`. `BENCH_ONLY=exec`: scripts through the provider against
//! the bare engine exec; `BENCH_ONLY=acts`: ten pointer moves with their settled frame on a
//! live desktop, on both paths.

mod support;

use std::time::Duration;

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo_actors::provider::{ExecRequest, ProviderRef, SandboxProvider};

/// Provision-to-first-screenshot rounds.
const ROUNDS: usize = 3;
/// Observes timed per path.
const OBSERVES: usize = 20;
/// Acts timed per path on a live desktop.
const ACTS: usize = 20;
/// Desktops opened in one container for the memory measure.
const DESKTOPS: usize = 4;

/// Total PSS in KiB of every process in the container (all run as uid 1000).
async fn container_pss_kib(p: &DockerProvider, m: &ProviderRef) -> u64 {
    let script = "t=0; for f in /proc/[0-9]*/smaps_rollup; do v=$(awk '/^Pss:/{print $2}' \"$f\" 2>/dev/null); t=$((t + ${v:-0})); done; echo $t";
    let out = p
        .exec(
            m,
            &ExecRequest {
                command: script.into(),
                cwd: String::new(),
                env: Vec::new(),
                timeout: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    out.stdout.trim().parse().unwrap_or(0)
}

/// The provider's script for `true` (a login shell, as the `shell` tool runs every command) as
/// one engine exec: create, start, read to the end, inspect.
async fn bare_exec(docker: &bollard::Docker, container: &str) {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(vec![
                    "bash".to_string(),
                    "-c".into(),
                    "exec bash -lc true".into(),
                ]),
                user: Some("1000:1000".into()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    if let StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.unwrap()
    {
        while output.next().await.is_some() {}
    }
    docker.inspect_exec(&exec.id).await.unwrap();
}

/// Scripts run back to back on one computer: `true` through the provider (as the `shell` tool
/// runs it: the supervisor, then the container's exec agent) beside the same script as a bare
/// engine exec, in turns.
async fn scripts(p: &DockerProvider) {
    const SCRIPTS: usize = 200;
    let m = p
        .provision(&support::machine_spec("exec"))
        .await
        .expect("provision");
    let docker = bollard::Docker::connect_with_unix_defaults().expect("docker");
    support::scripts_in_turns(
        p,
        &m,
        SCRIPTS,
        (
            "the provider's exec (supervisor, exec agent)",
            "the same script as a bare engine exec (bollard)",
        ),
        || bare_exec(&docker, &m.0),
    )
    .await;
    p.destroy(&m).await.unwrap();
}

fn main() {
    let image = support::require_image("docker");
    // `RAKAZO_LOG=info`: the runtime's events beside the tables (phases of a desktop's start).
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
        let provider = |commands_only| {
            DockerProvider::new(DockerProviderConfig {
                supervisor_url: url.clone(),
                supervisor_token: token.clone(),
                screen_limit: 0,
                commands_only,
                warm_stacks: 0,
                limits: None,
            })
            .unwrap()
        };
        let p = provider(false);
        println!("docker bench ({image}, Xvfb 1280x800x24 + fluxbox + Chromium per desktop)");
        // `BENCH_ONLY=exec`: only scripts against the bare engine exec.
        if std::env::var("BENCH_ONLY").as_deref() == Ok("exec") {
            scripts(&p).await;
            return;
        }
        // `BENCH_ONLY=acts`: only ten pointer moves with their settled frame, on both paths.
        if std::env::var("BENCH_ONLY").as_deref() == Ok("acts") {
            for (path, provider) in [("direct", &p), ("command path", &provider(true))] {
                support::acts(provider, path, ACTS).await;
            }
            return;
        }
        // `BENCH_MEMORY_ONLY=1`: only the memory measure below.
        if std::env::var_os("BENCH_MEMORY_ONLY").is_none() {
            for (path, provider) in [("direct", &p), ("command path", &provider(true))] {
                support::first_screenshots(provider, path, ROUNDS, OBSERVES).await;
            }
        }

        // Memory: one container, desktops added one by one.
        let s = support::machine_spec("memory");
        let m = p.provision(&s).await.unwrap();
        let idle = container_pss_kib(&p, &m).await;
        println!("\n| desktops | container PSS MiB | added by the last desktop MiB |");
        println!("| ---: | ---: | ---: |");
        println!("| 0 | {:.0} | |", idle as f64 / 1024.0);
        let mut last = idle;
        let mut readings = Vec::new();
        for n in 1..=DESKTOPS {
            let bot = format!("bot-{n}");
            p.open_screen(&m, &bot, n as u32 - 1).await.unwrap();
            p.observe(&m, &bot).await.unwrap();
            // Let the browser finish its start-up work before reading.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let now = container_pss_kib(&p, &m).await;
            println!(
                "| {n} | {:.0} | {:.0} |",
                now as f64 / 1024.0,
                (now as f64 - last as f64) / 1024.0
            );
            readings.push(now);
            last = now;
        }
        let per_additional =
            (readings[DESKTOPS - 1] as f64 - readings[0] as f64) / (DESKTOPS - 1) as f64 / 1024.0;
        println!("PSS per additional desktop (desktops 2..{DESKTOPS}): {per_additional:.0} MiB");
        p.destroy(&m).await.unwrap();
    });
}
