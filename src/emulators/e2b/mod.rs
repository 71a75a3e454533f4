//! The e2b-emulator: an offline E2B serving the control plane and envd over real HTTP on
//! loopback, faithful enough that E2B's official SDK and our `e2b` adapter run against it.
//!
//! - [`control`]: `/v2/sandboxes` (create, list, connect/resume), `/sandboxes/{id}` (detail,
//!   timeout, pause, kill), `{code, message}` errors, `X-API-KEY` required;
//! - [`envd`]: `/health`, `/files`, and Connect RPC `process.Process/*` (server-streaming
//!   `Start` and `Connect` with envelope framing and keepalives) and `filesystem.Filesystem/*`,
//!   each call checked against the sandbox's `X-Access-Token`; the sandbox is named by the
//!   `E2b-Sandbox-Id` header (the SDK with `E2B_SANDBOX_URL`) or the `49983-<id>.<domain>`
//!   host;
//! - port hosts `<port>-<id>.<domain>` are routed by the `Host` header ([`super::front`]) to
//!   the machine's screen gateway (port 6080, the only port a computer container publishes).
//!
//! A sandbox is a real machine ([`super::machines`]): ids of 20 `[a-z0-9]` characters,
//! `running` and `paused` states, TTL expiry kills, pause stops the container (processes end,
//! files stay: unlike E2B, memory is not kept), resume starts it, a killed sandbox is 404.
//!
//! In Novita mode (`rakazo emulator novita`, [`Settings::novita`]) it answers as Novita's
//! E2B-compatible API does where our adapter tells them apart: sandbox ids carry a hyphen, and
//! only the templates built in the account exist ([`NOVITA_TEMPLATES`]; another is 404, where
//! E2B mode takes any name).

pub mod control;
pub mod envd;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use actix_web::{App as ActixApp, HttpServer, web};

use super::front::{PortRoutes, PortTarget};
use super::machines::{Machines, Spawned};

/// The envd version the emulator reports (>= 0.4.0: the default user is applied here; >= 0.5.2:
/// `CloseStdin`, which the SDK asks for only from that version).
pub const ENVD_VERSION: &str = "0.5.2";
/// envd's port.
pub const ENVD_PORT: u16 = 49983;
/// The screen gateway port computers publish.
pub const GATEWAY_PORT: u16 = crate::supervisor::engine::GATEWAY_PORT;
/// The domain of the emulator's port hosts.
pub const DOMAIN: &str = "e2b.localhost";
/// The account of E2B sandboxes.
pub const ACCOUNT: &str = "user";
/// The templates a Novita-mode emulator has (the one a deployment builds).
pub const NOVITA_TEMPLATES: &[&str] = &["rakazo-computer"];

/// Settings of one emulator.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The supervisor that creates machines.
    pub supervisor_url: String,
    /// Its token (never logged).
    pub supervisor_token: String,
    /// The domain of port hosts, as returned in create/connect (`e2b.localhost`).
    pub domain: String,
    /// Answer as Novita does (ids with a hyphen, only built templates).
    pub novita: bool,
}

/// Lifecycle state of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Running.
    Running,
    /// Paused (the container is stopped).
    Paused,
}

/// A process envd started.
#[derive(Clone, Debug)]
pub struct Process {
    /// Where it is recorded on the machine.
    pub spawned: Spawned,
    /// `cmd`, `args`, `envs`, `cwd`, `tag` as started.
    pub config: serde_json::Value,
    /// Its tag, if any.
    pub tag: Option<String>,
}

/// One sandbox.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// The template it was created from.
    pub template: String,
    /// The container.
    pub container: String,
    /// `envdAccessToken`.
    pub access_token: String,
    /// Running or paused.
    pub state: State,
    /// Start time.
    pub started_at: SystemTime,
    /// When it expires (killed).
    pub end_at: SystemTime,
    /// Metadata given at creation.
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Environment given at creation, applied to every process.
    pub env: Vec<(String, String)>,
    /// Published port of the screen gateway on 127.0.0.1.
    pub gateway_port: Option<u16>,
    /// Processes started through envd, by pid.
    pub processes: HashMap<u32, Process>,
    /// How many processes envd started, and how many `SendInput` calls it took (test hook:
    /// what the vendor was asked to do).
    pub calls: EnvdCalls,
}

/// Counts of envd calls on one sandbox ([`Sandbox::calls`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvdCalls {
    /// `Start` calls that started a process.
    pub starts: u64,
    /// `SendInput` calls.
    pub inputs: u64,
}

/// The emulator's state.
pub struct Emulator {
    /// Settings.
    pub settings: Settings,
    /// The machine backend.
    pub machines: Machines,
    /// The sandboxes the emulator knows (killed ones are removed).
    pub sandboxes: Mutex<HashMap<String, Sandbox>>,
    /// How many times a paused sandbox was resumed (test hook).
    pub resumes: std::sync::atomic::AtomicU64,
    /// While set, envd answers `unavailable` to every signal, as when its process service
    /// cannot be reached (test hook: a kill that is never confirmed).
    pub signals_unavailable: std::sync::atomic::AtomicBool,
    /// How long envd takes to answer a signal, in milliseconds (test hook: a slow network).
    pub signal_delay_ms: std::sync::atomic::AtomicU64,
}

impl Emulator {
    /// An emulator on the configured supervisor.
    pub fn new(settings: Settings) -> Result<Arc<Self>, String> {
        let machines = Machines::new(
            &settings.supervisor_url,
            &settings.supervisor_token,
            ACCOUNT,
        )
        .map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            settings,
            machines,
            sandboxes: Mutex::new(HashMap::new()),
            resumes: Default::default(),
            signals_unavailable: Default::default(),
            signal_delay_ms: Default::default(),
        }))
    }

    /// A copy of sandbox `id`.
    pub fn get(&self, id: &str) -> Option<Sandbox> {
        self.lock().get(id).cloned()
    }

    /// The table.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills sandbox `id`: its machine is removed and the id forgotten (404 from now on).
    /// False when it was not there.
    pub async fn kill(&self, id: &str) -> bool {
        let Some(sandbox) = self.lock().remove(id) else {
            return false;
        };
        if let Err(e) = self.machines.remove(&sandbox.container).await {
            tracing::warn!(error = %e, "emulator.e2b.remove_failed");
        }
        tracing::info!(sandbox.id = %id, "emulator.e2b.killed");
        true
    }

    /// Kills every running sandbox past its end of life.
    async fn expire(&self) {
        let now = SystemTime::now();
        let due: Vec<String> = self
            .lock()
            .values()
            .filter(|s| s.state == State::Running && s.end_at <= now)
            .map(|s| s.id.clone())
            .collect();
        for id in due {
            tracing::info!(sandbox.id = %id, "emulator.e2b.expired");
            self.kill(&id).await;
        }
    }

    /// Kills every sandbox (the emulator is stopping).
    pub async fn kill_all(&self) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            self.kill(&id).await;
        }
    }
}

/// Port hosts: `<port>-<id>.<domain>`.
struct Routes(Arc<Emulator>);

impl PortRoutes for Routes {
    fn route(&self, host: &str) -> PortTarget {
        let name = host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        });
        let Some(rest) = name.strip_suffix(&format!(".{}", self.0.settings.domain)) else {
            return PortTarget::App;
        };
        let Some((port, id)) = rest.split_once('-') else {
            return PortTarget::App;
        };
        let Ok(port) = port.parse::<u16>() else {
            return PortTarget::App;
        };
        if port == ENVD_PORT {
            return PortTarget::App;
        }
        let unavailable = |msg: &str| {
            PortTarget::Unavailable(
                serde_json::json!({"code": 502, "message": msg, "sandboxId": id, "port": port})
                    .to_string(),
            )
        };
        match self.0.get(id) {
            Some(s) if s.state == State::Running => match (port, s.gateway_port) {
                (GATEWAY_PORT, Some(p)) => {
                    PortTarget::Machine(SocketAddr::from(([127, 0, 0, 1], p)))
                }
                _ => unavailable("The sandbox is running but port is not open"),
            },
            _ => unavailable("The sandbox was not found"),
        }
    }
}

/// A running emulator.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state (test hooks: kill a sandbox behind a client's back).
    pub emulator: Arc<Emulator>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    server: actix_web::dev::ServerHandle,
}

impl Running {
    /// Stops serving and kills every sandbox.
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.server.stop(false).await;
        self.emulator.kill_all().await;
    }
}

/// Starts the emulator on `listener` (front) with its app on an internal loopback port. Must
/// run inside an actix system.
pub async fn start(listener: std::net::TcpListener, settings: Settings) -> Result<Running, String> {
    let emulator = Emulator::new(settings)?;
    let app_listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let app_addr = app_listener.local_addr().map_err(|e| e.to_string())?;
    let data = web::Data::from(emulator.clone());
    let server = HttpServer::new(move || {
        ActixApp::new()
            .app_data(data.clone())
            .app_data(web::PayloadConfig::new(256 << 20))
            .configure(control::routes)
            .configure(envd::routes)
    })
    .workers(2)
    .disable_signals()
    .listen(app_listener)
    .map_err(|e| e.to_string())?
    .run();
    let handle = server.handle();
    let mut tasks = vec![tokio::spawn(async move {
        let _ = server.await;
    })];
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let front = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    tasks.push(tokio::spawn(super::front::serve(
        front,
        app_addr,
        Arc::new(Routes(emulator.clone())),
    )));
    let reaper = emulator.clone();
    tasks.push(tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            reaper.expire().await;
        }
    }));
    tracing::info!(addr = %addr, "emulator.e2b.started");
    Ok(Running {
        addr,
        emulator,
        tasks,
        server: handle,
    })
}
