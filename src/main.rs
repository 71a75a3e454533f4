//! The `rakazo` binary: `serve`, `worker`, `screen-proxy`, `supervisor`, `migrate`, `doctor`,
//! `image build`, `config example`.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rakazo::app::App;
use rakazo::config::{Config, ProcessEnv, Role};

/// Rakazo Runtime: self-hostable computers for AI agents.
#[derive(Parser)]
#[command(name = "rakazo", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API, the dashboard and the screen proxy, with the worker's timers, jobs and
    /// reconcilers unless `--no-worker`.
    Serve {
        /// Address to listen on (overrides RAKAZO_LISTEN).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// A TOML configuration file (keys are the variable names in lower case).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Serve the API only; timers, jobs and reconcilers run in `rakazo worker` processes
        /// on the same Postgres database.
        #[arg(long)]
        no_worker: bool,
    },
    /// Run timers, jobs and reconcilers without the API (beside `serve --no-worker`
    /// processes on the same Postgres database); listens for internal endpoints and health.
    Worker {
        /// Address of the internal endpoints (overrides RAKAZO_LISTEN).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the screen proxy alone: it asks the API at `--api` for every screen over internal
    /// RPC and reports control sessions to it (with the deployment's internal credential and
    /// screen key: `RAKAZO_INTERNAL_TOKEN`, `SCREEN_CAPABILITY_SECRET`, or those in DATA_DIR).
    ScreenProxy {
        /// Address to listen on.
        #[arg(long)]
        listen: SocketAddr,
        /// The API's base URL (`http://host:port`).
        #[arg(long)]
        api: String,
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Verify every stored workspace revision (manifests, chunks, seals, references) and
    /// report what is missing, damaged or orphaned, changing nothing; exits 1 on a problem.
    Doctor {
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Apply database migrations and exit.
    Migrate {
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run the Docker supervisor: the only process that talks to the Docker engine.
    Supervisor {
        /// Address to listen on (overrides SANDBOX_SUPERVISOR_LISTEN); loopback or private only.
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Build a missing computer image of the built-in recipe (as `rakazo image build`)
        /// rather than refusing computers.
        #[arg(long)]
        build_image: bool,
        /// Stop when this process (the `rakazo serve` that started it) ends.
        #[arg(long, hide = true)]
        parent: Option<u32>,
    },
    /// Run an offline vendor emulator: `e2b` (`novita`: its Novita mode), `daytona` and
    /// `box`, whose sandboxes are Docker computers through the supervisor
    /// (SANDBOX_SUPERVISOR_URL and SANDBOX_SUPERVISOR_TOKEN), or `kubernetes`, whose pods are
    /// Docker containers of this host.
    Emulator {
        /// The vendor to emulate.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(rakazo::emulators::VENDORS))]
        vendor: String,
        /// Address to listen on: loopback or private only.
        #[arg(long)]
        listen: SocketAddr,
        /// A TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// `kubernetes`: a file holding the bearer token every request must carry (none: no
        /// authentication).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// `kubernetes`: a PersistentVolumeClaim this node serves, as `NAME=DIR` (the host
        /// directory that holds its volume); repeatable.
        #[arg(long, value_parser = parse_claim)]
        claim: Vec<(String, PathBuf)>,
    },
    /// Computer image helpers.
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build the computer image from the built-in recipe unless its tag exists; prints it.
    Build,
    /// Print the image reference of the built-in recipe.
    Tag,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the annotated example environment file.
    Example,
}

fn load(file: Option<&PathBuf>) -> Result<Config, ExitCode> {
    Config::load(&ProcessEnv, file.map(PathBuf::as_path)).map_err(|err| {
        eprintln!("rakazo: {err}");
        ExitCode::from(2)
    })
}

/// `rakazo emulator <vendor>`: serves until interrupted, then kills its sandboxes.
async fn emulate(config: Config, vendor: &str, listen: SocketAddr) -> ExitCode {
    if let Err(why) = rakazo::supervisor::listen::check(listen) {
        eprintln!("rakazo: {why}");
        return ExitCode::from(2);
    }
    let Some(token) = config.supervisor_token.as_ref().filter(|t| !t.0.is_empty()) else {
        eprintln!(
            "rakazo: the {vendor} emulator needs the supervisor: set SANDBOX_SUPERVISOR_TOKEN (and SANDBOX_SUPERVISOR_URL)"
        );
        return ExitCode::from(2);
    };
    let listener = match TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rakazo: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings = rakazo::emulators::e2b::Settings {
        supervisor_url: config.supervisor_url.clone(),
        supervisor_token: token.0.clone(),
        domain: rakazo::emulators::e2b::DOMAIN.into(),
        novita: vendor == "novita",
    };
    let running = match rakazo::emulators::e2b::start(listener, settings).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rakazo: the {vendor} emulator did not start: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{vendor} emulator listening on http://{}", running.addr);
    let _ = tokio::signal::ctrl_c().await;
    running.stop().await;
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    rakazo::malloc::tune();
    let cli = Cli::parse();
    match cli.command {
        Command::Config {
            command: ConfigCommand::Example,
        } => {
            print!("{}", rakazo::config::render_example());
            ExitCode::SUCCESS
        }
        Command::Emulator {
            vendor,
            listen,
            token_file,
            claim,
            ..
        } if vendor == "kubernetes" => {
            rakazo::telemetry::init("info");
            let token = match token_file.map(std::fs::read_to_string).transpose() {
                Ok(token) => token.map(|t| t.trim().to_owned()),
                Err(err) => {
                    eprintln!("rakazo: token file: {err}");
                    return ExitCode::from(2);
                }
            };
            let config = rakazo::emulators::kubernetes::EmulatorConfig {
                listen,
                token,
                claims: claim.into_iter().collect(),
            };
            actix_rt::System::new().block_on(async move {
                match rakazo::emulators::kubernetes::Emulator::start(config).await {
                    Ok(emulator) => {
                        println!("listening on {}", emulator.addr);
                        let _ = tokio::signal::ctrl_c().await;
                        emulator.stop().await;
                        ExitCode::SUCCESS
                    }
                    Err(err) => {
                        eprintln!("rakazo: kubernetes emulator: {err}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Image {
            command: ImageCommand::Tag,
        } => {
            println!("{}", rakazo::image::default_image());
            ExitCode::SUCCESS
        }
        Command::Image {
            command: ImageCommand::Build,
        } => {
            rakazo::telemetry::init("info");
            match rakazo::image::build(&std::env::temp_dir()) {
                Ok((image, _)) => {
                    println!("{image}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("rakazo: image build failed: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Supervisor {
            listen,
            config,
            build_image,
            parent,
        } => {
            if let Some(parent) = parent
                && !rakazo::managed::follow_parent(parent)
            {
                eprintln!("rakazo: the process that started this supervisor has ended");
                return ExitCode::FAILURE;
            }
            let mut config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Some(listen) = listen {
                config.supervisor_listen = listen;
            }
            rakazo::telemetry::init(&config.log_filter);
            actix_rt::System::new().block_on(supervise(config, build_image))
        }
        Command::Emulator {
            vendor,
            listen,
            config,
            ..
        } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            rakazo::telemetry::init(&config.log_filter);
            if vendor == "e2b" || vendor == "novita" {
                actix_rt::System::new().block_on(emulate(config, &vendor, listen))
            } else {
                actix_rt::System::new().block_on(emulate_vendor(config, vendor, listen))
            }
        }
        Command::ScreenProxy {
            listen,
            api,
            config,
        } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            rakazo::telemetry::init(&config.log_filter);
            actix_rt::System::new().block_on(screen_proxy(config, listen, api))
        }
        Command::Doctor { config } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            actix_rt::System::new().block_on(doctor(config))
        }
        Command::Migrate { config } => {
            let config = match load(config.as_ref()) {
                Ok(c) => c,
                Err(code) => return code,
            };
            rakazo::telemetry::init(&config.log_filter);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            match rt.block_on(async {
                let db = rakazo::db::connect(&config.database_url.0).await?;
                rakazo::db::migrate(&db).await
            }) {
                Ok(()) => {
                    tracing::info!(event = "db.migrated", database = config.database_kind());
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("rakazo: migration failed: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve {
            listen,
            config,
            no_worker,
        } => run_app(
            listen,
            config,
            if no_worker { Role::Api } else { Role::Both },
        ),
        Command::Worker { listen, config } => run_app(listen, config, Role::Worker),
    }
}

/// `rakazo emulator daytona|box`: serves until the process ends.
async fn emulate_vendor(config: Config, vendor: String, listen: SocketAddr) -> ExitCode {
    use std::time::Duration;

    use rakazo::emulators::{boat, daytona, machines::Machines};
    if let Err(err) = rakazo::supervisor::listen::check(listen) {
        eprintln!("rakazo: emulator: {err}");
        return ExitCode::from(2);
    }
    let Some(token) = config
        .supervisor_token
        .as_ref()
        .map(|t| t.0.clone())
        .filter(|t| !t.is_empty())
    else {
        eprintln!(
            "rakazo: the emulator's machines need SANDBOX_SUPERVISOR_URL and SANDBOX_SUPERVISOR_TOKEN"
        );
        return ExitCode::from(2);
    };
    let account = if vendor == "box" { "user" } else { "daytona" };
    let machines = match Machines::new(&config.supervisor_url, &token, account) {
        Ok(m) => m,
        Err(err) => {
            eprintln!("rakazo: {err}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(listen) {
        Ok(l) => l,
        Err(err) => {
            eprintln!("rakazo: cannot listen on {listen}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let base_url = format!("http://{listen}");
    let server = match vendor.as_str() {
        "daytona" => daytona::serve(
            listener,
            daytona::DaytonaEmulator::new(
                machines,
                daytona::Settings {
                    base_url,
                    key: None,
                    minute: Duration::from_secs(60),
                },
            ),
        ),
        "box" => boat::serve(
            listener,
            boat::BoatEmulator::new(
                machines,
                boat::Settings {
                    base_url,
                    key: None,
                    snapshot_retention: Duration::from_secs(7 * 24 * 3600),
                },
            ),
        ),
        other => {
            eprintln!("rakazo: no emulator for {other:?} (daytona or box)");
            return ExitCode::from(2);
        }
    };
    match server {
        Ok(server) => {
            tracing::info!(event = "emulator.listening", vendor = %vendor, addr = %listen);
            match server.await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("rakazo: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(err) => {
            eprintln!("rakazo: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `serve`, `serve --no-worker` or `worker`.
fn run_app(listen: Option<SocketAddr>, config: Option<PathBuf>, role: Role) -> ExitCode {
    let file = config.clone();
    let mut config = match load(config.as_ref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(listen) = listen {
        config.listen = listen;
    }
    config.role = role;
    if role != Role::Both && config.database_kind() != "postgres" {
        eprintln!(
            "rakazo: several processes share a Postgres database only; SQLite serves one `rakazo serve`"
        );
        return ExitCode::from(2);
    }
    rakazo::telemetry::init(&config.log_filter);
    // Started on the main thread, which outlives the server: the child's parent-death
    // signal follows it.
    let managed = rakazo::managed::wanted(&config)
        .then(|| rakazo::managed::ManagedSupervisor::start(&mut config, file.as_deref()))
        .flatten();
    let code = actix_rt::System::new().block_on(serve(config));
    drop(managed);
    code
}

/// `rakazo screen-proxy`: serves until interrupted.
async fn screen_proxy(config: Config, listen: SocketAddr, api: String) -> ExitCode {
    let listener = match TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rakazo: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let server = match rakazo::screen_proxy::build(&config, &api, listener) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rakazo: screen proxy: {e}");
            return ExitCode::from(2);
        }
    };
    let handle = server.handle();
    actix_rt::spawn(server);
    tracing::info!(event = "screen.proxy.started");
    println!("screen proxy listening on http://{addr}");
    let _ = tokio::signal::ctrl_c().await;
    handle.stop(true).await;
    ExitCode::SUCCESS
}

async fn doctor(config: Config) -> ExitCode {
    match rakazo::stores::doctor::run(&config).await {
        Ok(report) if report.findings.is_empty() => {
            println!(
                "clean: {} computers, {} revisions, {} chunks verified",
                report.computers, report.revisions, report.chunks
            );
            ExitCode::SUCCESS
        }
        Ok(report) => {
            for finding in &report.findings {
                println!("{finding}");
            }
            println!(
                "{} problems: {} computers, {} revisions, {} chunks verified",
                report.findings.len(),
                report.computers,
                report.revisions,
                report.chunks
            );
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("rakazo doctor: {err}");
            ExitCode::from(2)
        }
    }
}

async fn serve(config: Config) -> ExitCode {
    let listen = config.listen;
    let (app, operator_token) = match App::start(config).await {
        Ok(started) => started,
        Err(err) => {
            eprintln!("rakazo: cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(token) = operator_token {
        // Printed once, to the terminal only (never to the log).
        println!("Operator token (also stored in DATA_DIR/operator-token): {token}");
    }
    let listener = match TcpListener::bind(listen) {
        Ok(l) => l,
        Err(err) => {
            eprintln!("rakazo: cannot listen on {listen}: {err}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(event = "server.listening", addr = %listen, sandbox = %app.provider_status.sandbox,
        database = app.config.database_kind());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = match rakazo::server::build(app.clone(), listener, workers) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("rakazo: {err}");
            return ExitCode::FAILURE;
        }
    };
    let handle = server.handle();
    actix_rt::spawn(async move {
        let signal = stop_signal().await;
        tracing::info!(event = "server.stopping", signal);
        handle.stop(true).await;
    });
    let served = server.await;
    // The server takes no more requests: drain (last checkpoints, host desktops stopped). A
    // second signal ends the process at once.
    tokio::select! {
        () = app.shutdown() => {}
        signal = stop_signal() => {
            tracing::warn!(event = "server.drain_abandoned", signal);
            return ExitCode::from(130);
        }
    }
    tracing::info!(event = "server.stopped");
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rakazo: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Waits for SIGTERM or SIGINT (Ctrl-C); answers which.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

async fn supervise(config: Config, build_image: bool) -> ExitCode {
    let (listener, state) = match rakazo::supervisor::prepare_with(&config, build_image).await {
        Ok(ready) => ready,
        Err(err) => {
            tracing::error!(error = %err, "supervisor.refused");
            eprintln!("rakazo: supervisor cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(event = "supervisor.listening", addr = %config.supervisor_listen);
    let engine = state.engine.clone();
    let server = match rakazo::supervisor::serve(listener, state) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("rakazo: {err}");
            return ExitCode::FAILURE;
        }
    };
    let served = server.await;
    // Unclaimed pooled computers do not outlive their supervisor: no owner can claim them
    // while it is down, and each owner makes new ones once it is back.
    match engine.reap_pool(std::time::Duration::ZERO).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(containers = n, "supervisor.pool.removed"),
        Err(e) => tracing::warn!(error = %e, "supervisor.pool.reap_failed"),
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rakazo: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `NAME=DIR` of `rakazo emulator kubernetes --claim`.
fn parse_claim(v: &str) -> Result<(String, PathBuf), String> {
    match v.split_once('=') {
        Some((name, dir)) if !name.is_empty() && dir.starts_with('/') => {
            Ok((name.to_owned(), PathBuf::from(dir)))
        }
        _ => Err("expected NAME=/absolute/dir".into()),
    }
}
