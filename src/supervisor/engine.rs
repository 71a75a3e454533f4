//! The supervisor's side of the Docker engine (bollard over the local socket): computer
//! containers shaped from [`EngineSettings`], and scripts run in them as uid 1000.
//!
//! Docker's errors are translated here, at the edge, into [`EngineError`]: a 404 (or a
//! container without the `rakazo.managed=true` label) is [`EngineError::Gone`]; nothing above
//! matches on bollard's types.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ContainerInspectResponse, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StopContainerOptions,
};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use super::desktops::Desktops;
use super::egress::{Guard, GuardState};
use super::exec_agent::Agents;
use super::pool::{LABEL_POOL_OWNER, PoolBook};
use super::wire::{
    AskAnswer, AskBody, ComputerInfo, CreateComputer, DesktopEnter, DesktopUsage, ExecBody,
    ExecResult,
};
use crate::config::{DockerNetwork, DockerSettings};
use crate::exec_agent::{Agent, Helper, Outcome, Script, kill_script, stuck_output};

/// Where the workspace is mounted in every computer (the home of user `rakazo`, uid 1000).
pub const WORKSPACE: &str = "/home/rakazo";
/// The screen gateway's port inside every computer.
pub const GATEWAY_PORT: u16 = 6080;
/// uid:gid every process of a computer runs as.
pub const USER: &str = "1000:1000";
/// The uid and gid of [`USER`].
pub const UID: u32 = 1000;
/// Shared memory of every computer (Chromium needs more than Docker's 64 MB).
pub const SHM_BYTES: i64 = 256 << 20;
/// Cap on each of stdout and stderr of one exec.
pub const OUTPUT_CAP: usize = 1 << 20;
/// How long a stopping container gets before SIGKILL.
const STOP_GRACE_SECS: i32 = 10;
/// Extra time past an exec's deadline before the supervisor kills it itself.
const EXEC_GRACE: Duration = Duration::from_secs(5);
/// How long a container whose exec agent ended is watched for its stop.
const AGENT_END_SETTLE: Duration = Duration::from_secs(1);

/// The seccomp profile of every computer (`config/computer-seccomp.json`): an allowlist (the
/// default action refuses) built from Docker's default for a container without capabilities,
/// minus interfaces a sandboxed browser never needs, plus the user namespaces and chroot
/// Chromium's own sandbox needs, so Chromium keeps its sandbox.
pub const SECCOMP_PROFILE: &str = include_str!("../../config/computer-seccomp.json");

/// Label keys.
pub const LABEL_MANAGED: &str = "rakazo.managed";
/// Label: the bot of a Private Computer.
pub const LABEL_BOT: &str = "rakazo.botId";
/// Label: the space.
pub const LABEL_SPACE: &str = "rakazo.workspaceId";
/// Label: the computer.
pub const LABEL_COMPUTER: &str = "rakazo.computerId";
/// Label: the home key.
pub const LABEL_HOME: &str = "rakazo.homeKey";

/// Failures, classified at the edge.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No such managed container.
    #[error("no such computer")]
    Gone,
    /// The request cannot be honoured as given.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The computer image is missing.
    #[error("computer image {0} is not on the engine; run `rakazo image build`")]
    ImageMissing(String),
    /// The engine failed.
    #[error("docker engine: {0}")]
    Engine(String),
    /// This host gives desktops no control groups.
    #[error("per-desktop control groups are unavailable: {0}")]
    DesktopGroups(String),
    /// A desktop's control group could not be used.
    #[error("{0}")]
    Group(String),
    /// A pooled computer was not claimed: the home it would take holds files.
    #[error("the home is in use; create the computer instead")]
    HomeInUse,
}

impl From<bollard::errors::Error> for EngineError {
    fn from(err: bollard::errors::Error) -> Self {
        match err {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => EngineError::Gone,
            bollard::errors::Error::DockerResponseServerError {
                status_code,
                message,
            } => EngineError::Engine(format!("{status_code}: {message}")),
            other => EngineError::Engine(other.to_string()),
        }
    }
}

/// How computer containers are shaped.
#[derive(Clone, Debug)]
pub struct EngineSettings {
    /// Absolute `DATA_DIR` (homes under `homes/`, X socket directories under `run/x11/`).
    pub data_dir: PathBuf,
    /// Image reference.
    pub image: String,
    /// Ceilings and network.
    pub docker: DockerSettings,
}

/// The engine connection and the settings.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    settings: EngineSettings,
    /// Set when a missing image of the built-in recipe is built here (the supervisor `rakazo
    /// serve` starts itself); held while a build runs, so creates wait for it.
    builds: Option<Arc<tokio::sync::Mutex<()>>>,
    /// The egress guard of bridged computers (`None`: off or no network); one check at a time.
    guard: Option<Arc<(Guard, tokio::sync::Mutex<()>)>>,
    /// Whether computers' desktops get their own control groups.
    desktops: Arc<Desktops>,
    /// Pooled containers' owners and claims.
    pool: Arc<PoolBook>,
    /// The first process of each running container a desktop request or an exec named, so
    /// the requests of a desktop's every observe and act, and every script, need no inspect.
    init_pids: Arc<dashmap::DashMap<String, InitProcess>>,
    /// The exec agent of each running container a script was run in.
    agents: Arc<Agents>,
}

/// A running container's first process, as the engine named it.
#[derive(Clone)]
struct InitProcess {
    /// Its host process id.
    pid: u32,
    /// Its start time (`/proc/<pid>/stat`): a pid handed out again never matches.
    started: u64,
    /// The container's full id.
    id: String,
}

/// Accepts ids used in container names, labels and host paths.
fn check_id(what: &str, id: &str) -> Result<(), EngineError> {
    crate::desktop::check_id(id).map_err(|_| EngineError::Invalid(format!("bad {what}")))
}

impl Engine {
    /// Whether the Docker engine answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        self.docker.ping().await?;
        Ok(())
    }

    /// Connects to the local engine socket (`DOCKER_HOST=unix://...` or the default).
    pub async fn connect(settings: EngineSettings) -> Result<Self, EngineError> {
        let docker = Docker::connect_with_unix_defaults()?
            .negotiate_version()
            .await?;
        let d = &settings.docker;
        let guard = (d.network == DockerNetwork::Bridge && d.egress.guard).then(|| {
            Arc::new((
                Guard::new(&d.egress.network, &d.egress.allow),
                Default::default(),
            ))
        });
        let pool = Arc::new(PoolBook::load(&settings.data_dir));
        let engine = Self {
            docker,
            pool,
            settings,
            builds: None,
            guard,
            desktops: Arc::new(Desktops::detect()),
            init_pids: Arc::default(),
            agents: Arc::default(),
        };
        // Installed at start; creates and health checks check it again.
        if let GuardState::Failed(why) = engine.egress().await {
            tracing::warn!(error = %why, "supervisor.egress.inactive");
        }
        Ok(engine)
    }

    /// The egress guard's state, reinstalling its network and rules when they are missing.
    pub async fn egress(&self) -> GuardState {
        let Some(guard) = &self.guard else {
            return match self.settings.docker.network {
                DockerNetwork::None => GuardState::NoNetwork,
                DockerNetwork::Bridge => GuardState::Off,
            };
        };
        let _one = guard.1.lock().await;
        guard.0.ensure(&self.docker).await
    }

    /// Whether computers' desktops get their own control groups.
    pub fn desktops(&self) -> &Desktops {
        &self.desktops
    }

    /// Gives computers' desktops no control groups, saying `why` (for tests of that path).
    pub fn without_desktop_groups(mut self, why: &str) -> Self {
        self.desktops = Arc::new(Desktops::unavailable(why));
        self
    }

    /// The host process id of the running managed container `id`'s first process.
    async fn init_pid(&self, id: &str) -> Result<u32, EngineError> {
        self.init_process(id).await.map(|p| p.pid)
    }

    /// The first process of the running managed container `id`, with the container's full id.
    async fn init_process(&self, id: &str) -> Result<InitProcess, EngineError> {
        // The container's first process, seen before and still the same process: it runs
        // for exactly as long as the container does.
        if let Some(known) = self.init_pids.get(id).map(|k| k.clone()) {
            if crate::desktop::cgroup::started_at(known.pid) == Some(known.started) {
                return Ok(known);
            }
            // That process ended: the container stopped, restarted or was removed, perhaps
            // behind the supervisor's back, and the agent it ran ended with it.
            self.init_pids.remove(id);
            self.agents.forget(&known.id);
        }
        let gone = |e: bollard::errors::Error| {
            if matches!(
                e,
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                }
            ) {
                self.agents.forget(id);
            }
            EngineError::from(e)
        };
        let raw = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .map_err(gone)?;
        let Some(info) = to_info(&raw) else {
            return Err(EngineError::Gone);
        };
        let pid = raw.state.as_ref().and_then(|s| s.pid).unwrap_or(0);
        if !info.running || pid <= 0 {
            self.agents.forget(&info.id);
            return Err(EngineError::Gone);
        }
        let pid = pid as u32;
        // Read after the engine named it: a process that ended meanwhile is not kept.
        let started = crate::desktop::cgroup::started_at(pid);
        let known = InitProcess {
            pid,
            started: started.unwrap_or(0),
            id: info.id,
        };
        match started {
            Some(_) => {
                self.init_pids.insert(id.to_owned(), known.clone());
            }
            None => {
                self.init_pids.remove(id);
            }
        }
        Ok(known)
    }

    /// Runs `f` on the desktops of the running container `id` (its first process's pid).
    async fn on_desktops<T: Send + 'static>(
        &self,
        id: &str,
        f: impl FnOnce(&Desktops, u32) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        if !self.desktops.active() {
            return Err(EngineError::DesktopGroups(
                self.desktops
                    .describe()
                    .trim_start_matches("unavailable: ")
                    .into(),
            ));
        }
        let pid = self.init_pid(id).await?;
        let desktops = self.desktops.clone();
        tokio::task::spawn_blocking(move || f(desktops.as_ref(), pid))
            .await
            .map_err(|e| EngineError::Group(format!("control group task: {e}")))?
    }

    /// Creates desktop `name`'s group in computer `id` and moves its tagged processes in.
    pub async fn desktop_enter(
        &self,
        id: &str,
        name: &str,
        body: &DesktopEnter,
    ) -> Result<(), EngineError> {
        let (name, body) = (name.to_owned(), body.clone());
        let moved = self
            .on_desktops(id, move |d, pid| d.enter(pid, &name, &body))
            .await?;
        tracing::debug!(desktop.moved = moved, "supervisor.desktop.entered");
        Ok(())
    }

    /// Freezes or thaws desktop `name` of computer `id`.
    pub async fn desktop_freeze(
        &self,
        id: &str,
        name: &str,
        frozen: bool,
    ) -> Result<(), EngineError> {
        let name = name.to_owned();
        self.on_desktops(id, move |d, pid| d.set_frozen(pid, &name, frozen))
            .await?;
        tracing::info!(desktop.frozen = frozen, "supervisor.desktop.freeze");
        Ok(())
    }

    /// CPU time, OOM kills and the frozen state of desktop `name` of computer `id`.
    pub async fn desktop_usage(&self, id: &str, name: &str) -> Result<DesktopUsage, EngineError> {
        let name = name.to_owned();
        let u = self
            .on_desktops(id, move |d, pid| d.usage(pid, &name))
            .await?;
        Ok(DesktopUsage {
            cpu_ns: u.cpu_ns,
            oom_kills: u.oom_kills,
            frozen: u.frozen,
        })
    }

    /// Removes desktop `name`'s group of computer `id` (its processes were stopped).
    pub async fn desktop_remove(&self, id: &str, name: &str) -> Result<(), EngineError> {
        let name = name.to_owned();
        self.on_desktops(id, move |d, pid| d.remove(pid, &name))
            .await
    }

    /// Thaws every desktop of computer `id` (before it is stopped: a frozen process ignores
    /// the stop signals until thawed).
    pub async fn thaw_desktops(&self, id: &str) -> Result<(), EngineError> {
        self.on_desktops(id, |d, pid| {
            d.thaw_all(pid);
            Ok(())
        })
        .await
    }

    /// The guard (network name, bridge, chains) when it is on.
    pub fn guard(&self) -> Option<&Guard> {
        self.guard.as_ref().map(|g| &g.0)
    }

    /// Builds the image of the built-in recipe when a computer needs it and it is missing
    /// (`rakazo image build`'s logic), rather than refusing the computer.
    pub fn building_missing_image(mut self) -> Self {
        self.builds = Some(Arc::new(tokio::sync::Mutex::new(())));
        self
    }

    /// Makes sure the image is present: with [`Self::building_missing_image`], a missing
    /// image of the built-in recipe is built (one build at a time; others wait for it).
    pub async fn ensure_image(&self) -> Result<(), EngineError> {
        if self.image_present().await? {
            return Ok(());
        }
        let missing = || EngineError::ImageMissing(self.settings.image.clone());
        let Some(builds) = &self.builds else {
            return Err(missing());
        };
        if self.settings.image != crate::image::default_image() {
            return Err(missing());
        }
        let _building = builds.lock().await;
        if self.image_present().await? {
            return Ok(());
        }
        tracing::info!(image = %self.settings.image, "supervisor.image.building");
        let work = std::env::temp_dir();
        match tokio::task::spawn_blocking(move || crate::image::build(&work)).await {
            Ok(Ok(_)) => {
                tracing::info!(image = %self.settings.image, "supervisor.image.ready");
                Ok(())
            }
            Ok(Err(e)) => {
                tracing::error!(image = %self.settings.image, error = %e, "supervisor.image.build_failed");
                Err(EngineError::Engine(format!("image build: {e}")))
            }
            Err(e) => Err(EngineError::Engine(format!("image build task: {e}"))),
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Whether the computer image is on the engine.
    pub async fn image_present(&self) -> Result<bool, EngineError> {
        match self.docker.inspect_image(&self.settings.image).await {
            Ok(_) => Ok(true),
            Err(e) => match EngineError::from(e) {
                EngineError::Gone => Ok(false),
                other => Err(other),
            },
        }
    }

    /// The container name for a request: `rakazo-bot-<bot>`, `rakazo-team-<space>` for the
    /// space's Team Computer, `rakazo-home-<home key>` for any other home.
    pub fn container_name(req: &CreateComputer) -> Result<String, EngineError> {
        check_id("space id", &req.space_id)?;
        check_id("home key", &req.home_key)?;
        check_id("computer id", &req.computer_id)?;
        if let Some(bot) = &req.bot_id {
            check_id("bot id", bot)?;
            return Ok(format!("rakazo-bot-{bot}"));
        }
        if req.home_key == format!("team-{}", req.space_id) {
            Ok(format!("rakazo-team-{}", req.space_id))
        } else {
            Ok(format!("rakazo-home-{}", req.home_key))
        }
    }

    fn home_dir(&self, home_key: &str) -> PathBuf {
        self.homes().join(home_key)
    }

    /// `DATA_DIR/homes`.
    pub(super) fn homes(&self) -> PathBuf {
        self.settings.data_dir.join("homes")
    }

    pub(super) fn pool(&self) -> &PoolBook {
        &self.pool
    }

    pub(super) fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Short, so that `<dir>/X<n>` stays within a unix socket path's 108 bytes.
    fn x11_dir(&self, name: &str) -> PathBuf {
        let digest = Sha256::digest(name.as_bytes());
        let hex = hex::encode(&digest[..8]);
        self.settings.data_dir.join("run").join("x11").join(hex)
    }

    /// Creates and starts a computer, replacing a container of the same name.
    pub async fn create(&self, req: &CreateComputer) -> Result<ComputerInfo, EngineError> {
        let name = Self::container_name(req)?;
        let mut labels = HashMap::new();
        labels.insert(LABEL_BOT.into(), req.bot_id.clone().unwrap_or_default());
        labels.insert(LABEL_SPACE.into(), req.space_id.clone());
        labels.insert(LABEL_COMPUTER.into(), req.computer_id.clone());
        labels.insert(LABEL_HOME.into(), req.home_key.clone());
        let home = self.home_dir(&req.home_key);
        self.create_container(&name, labels, home, req.account.as_deref())
            .await
    }

    /// Removes the container named `name`, if there is one (its name is about to be reused):
    /// a computer as [`Self::remove`] does, anything else by force.
    pub(super) async fn replace(&self, name: &str) -> Result<(), EngineError> {
        match self.remove(name).await {
            Err(EngineError::Gone) => self.remove_named(name).await,
            other => other,
        }
    }

    async fn remove_named(&self, name: &str) -> Result<(), EngineError> {
        match self
            .docker
            .remove_container(
                name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(EngineError::from)
        {
            Ok(()) => {
                tracing::info!(container.name = %name, "supervisor.container.replaced");
                Ok(())
            }
            Err(EngineError::Gone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates and starts container `name` with `labels` (plus `rakazo.managed`), `home`
    /// mounted at the workspace.
    pub(super) async fn create_container(
        &self,
        name: &str,
        mut labels: HashMap<String, String>,
        home: PathBuf,
        account: Option<&str>,
    ) -> Result<ComputerInfo, EngineError> {
        let bridge_network = match (&self.guard, self.egress().await) {
            (Some(g), GuardState::Active) => g.0.network.clone(),
            (Some(_), state) => {
                return Err(EngineError::Engine(format!(
                    "egress guard {}; computers are not created without it (SANDBOX_EGRESS_GUARD=off turns it off)",
                    state.describe()
                )));
            }
            (None, _) => "bridge".to_string(),
        };
        self.ensure_image().await?;
        self.replace(name).await?;
        let x11 = self.x11_dir(name);
        let workspace = match account {
            Some(account) => {
                check_account(account)?;
                format!("/home/{account}")
            }
            None => WORKSPACE.to_string(),
        };
        let accounts = account.map(|a| (a.to_string(), x11.with_extension("accounts")));
        let (home2, x112, accounts2) = (home.clone(), x11.clone(), accounts.clone());
        tokio::task::spawn_blocking(move || {
            prepare_dirs(&home2, &x112)?;
            match accounts2 {
                Some((account, dir)) => write_accounts(&dir, &account),
                None => Ok(()),
            }
        })
        .await
        .map_err(|e| EngineError::Engine(format!("directory task: {e}")))?
        .map_err(|e| EngineError::Engine(format!("host directories: {e}")))?;
        let mut binds = vec![
            format!("{}:{workspace}:rw", home.display()),
            format!("{}:/tmp/.X11-unix:rw", x11.display()),
        ];
        if let Some((_, dir)) = &accounts {
            binds.push(format!("{}:/etc/passwd:ro", dir.join("passwd").display()));
            binds.push(format!("{}:/etc/group:ro", dir.join("group").display()));
        }
        labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
        let d = &self.settings.docker;
        let port_key = format!("{GATEWAY_PORT}/tcp");
        let (network_mode, port_bindings, exposed) = match d.network {
            DockerNetwork::Bridge => {
                let mut map = HashMap::new();
                map.insert(
                    port_key.clone(),
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".into()),
                        // Empty: the engine picks a free ephemeral port.
                        host_port: Some(String::new()),
                    }]),
                );
                (bridge_network, Some(map), Some(vec![port_key]))
            }
            DockerNetwork::None => ("none".to_string(), None, None),
        };
        let positive = |v: i64| (v > 0).then_some(v);
        let body = ContainerCreateBody {
            image: Some(self.settings.image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            user: Some(USER.into()),
            hostname: Some("computer".into()),
            working_dir: Some(workspace.clone()),
            env: Some(vec![
                format!("HOME={workspace}"),
                "LANG=C.UTF-8".into(),
                "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            ]),
            labels: Some(labels),
            exposed_ports: exposed,
            host_config: Some(HostConfig {
                binds: Some(binds),
                shm_size: Some(SHM_BYTES),
                nano_cpus: positive(d.nano_cpus),
                memory: positive(d.memory_bytes),
                pids_limit: positive(d.pids_limit),
                network_mode: Some(network_mode),
                port_bindings,
                // docker-init as pid 1 reaps the orphans of detached desktop processes.
                init: Some(true),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec![
                    "no-new-privileges:true".into(),
                    format!("seccomp={SECCOMP_PROFILE}"),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                body,
            )
            .await?;
        self.docker.start_container(&created.id, None).await?;
        tracing::info!(container.name = %name, "supervisor.container.created");
        self.start_agent(&created.id);
        self.inspect(&created.id).await
    }

    /// The managed container `id` (a container id or name).
    pub async fn inspect(&self, id: &str) -> Result<ComputerInfo, EngineError> {
        Ok(self.inspect_raw(id).await?.0)
    }

    /// [`Self::inspect`], with a claim applied, and the pool owner of a pooled container.
    pub(super) async fn inspect_raw(
        &self,
        id: &str,
    ) -> Result<(ComputerInfo, Option<String>), EngineError> {
        let raw = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await?;
        let mut info = to_info(&raw).ok_or(EngineError::Gone)?;
        let owner = raw
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(LABEL_POOL_OWNER).cloned());
        if owner.is_some()
            && let Some(claim) = self.pool.claim_of(&info.id)
        {
            super::pool::apply(&mut info, &claim, &self.homes());
        }
        Ok((info, owner))
    }

    /// The managed container of `home_key`, found by its labels (reconnect without an id).
    pub async fn find(&self, home_key: &str) -> Result<ComputerInfo, EngineError> {
        check_id("home key", home_key)?;
        if let Some(id) = self.pool.claimed_home(home_key) {
            match self.inspect(&id).await {
                Err(EngineError::Gone) => {
                    self.pool.forget(&id);
                }
                found => return found,
            }
        }
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            vec![
                format!("{LABEL_MANAGED}=true"),
                format!("{LABEL_HOME}={home_key}"),
            ],
        );
        let found = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        let id = found
            .into_iter()
            .find_map(|c| c.id)
            .ok_or(EngineError::Gone)?;
        self.inspect(&id).await
    }

    /// How many containers this engine holds an exec agent's slot for: only running ones
    /// once a script or a removal has noticed the others gone.
    pub fn agents_held(&self) -> usize {
        self.agents.held()
    }

    /// Starts a stopped computer (a running one stays as it is).
    pub async fn start(&self, id: &str) -> Result<ComputerInfo, EngineError> {
        let info = self.inspect(id).await?;
        if !info.running {
            self.docker.start_container(&info.id, None).await?;
            tracing::info!(container.name = %info.name, "supervisor.container.started");
            self.start_agent(&info.id);
        }
        self.inspect(&info.id).await
    }

    /// Starts the exec agent of the container `id`, just started, in the background: its
    /// interpreter's start overlaps what the caller does before its first script, which waits
    /// for it.
    fn start_agent(&self, id: &str) {
        let (agents, docker, id) = (self.agents.clone(), self.docker.clone(), id.to_owned());
        tokio::spawn(async move { agents.get(&docker, &id).await });
    }

    /// Stops a computer, keeping it (and its container layer) for a later start.
    pub async fn stop(&self, id: &str) -> Result<(), EngineError> {
        let info = self.inspect(id).await?;
        let _ = self.thaw_desktops(&info.id).await;
        self.docker
            .stop_container(
                &info.id,
                Some(StopContainerOptions {
                    t: Some(STOP_GRACE_SECS),
                    ..Default::default()
                }),
            )
            .await?;
        // Its agent ended with it (the scripts under way are told the machine is gone).
        self.agents.forget(&info.id);
        tracing::info!(container.name = %info.name, "supervisor.container.stopped");
        Ok(())
    }

    /// Removes a computer; its home directory stays (it is the durable workspace).
    pub async fn remove(&self, id: &str) -> Result<(), EngineError> {
        let info = self.inspect(id).await?;
        let _ = self.thaw_desktops(&info.id).await;
        self.docker
            .remove_container(
                &info.id,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await?;
        self.forget_pooled(&info.id, &info.home_key).await;
        self.agents.forget(&info.id);
        // Whatever name a desktop request gave it (and any other container gone meanwhile,
        // with its agent).
        self.init_pids.retain(|_, known| {
            let running = crate::desktop::cgroup::started_at(known.pid) == Some(known.started);
            if !running {
                self.agents.forget(&known.id);
            }
            running
        });
        let x11 = PathBuf::from(&info.x11_dir);
        let _ = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(x11.with_extension("accounts"));
            std::fs::remove_dir_all(x11)
        })
        .await;
        tracing::info!(container.name = %info.name, "supervisor.container.removed");
        Ok(())
    }

    /// Runs a script as uid 1000 with a deadline; the script's process group is killed when
    /// the deadline passes or when this future is dropped (the caller went away).
    pub async fn exec(&self, id: &str, body: &ExecBody) -> Result<ExecResult, EngineError> {
        if !body.cwd.starts_with('/') {
            return Err(EngineError::Invalid("cwd must be absolute".into()));
        }
        // A running managed container, known by its first process after the first exec (no
        // inspect per script).
        let container = self.init_process(id).await?.id;
        let id = container.as_str();
        let timeout = Duration::from_millis(body.timeout_ms.max(1));
        let run_id = match &body.run_id {
            Some(id) => {
                check_run_id(id)?;
                id.clone()
            }
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        if let Some(agent) = self.agents.get(&self.docker, id).await {
            return self.exec_by_agent(agent, id, run_id, body, timeout).await;
        }
        let secs = format!("{:.3}", timeout.as_secs_f64());
        let cmd = vec![
            "bash".to_string(),
            "-c".into(),
            EXEC_WRAPPER.into(),
            "rakazo-exec".into(),
            run_id.clone(),
            secs,
            body.script.clone(),
        ];
        let env: Vec<String> = body.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let exec = self
            .docker
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env),
                    working_dir: Some(body.cwd.clone()),
                    user: Some(USER.to_string()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        let mut guard = KillOnDrop {
            engine: Some(self.clone()),
            container: id.to_owned(),
            run_id,
            agent: None,
        };
        let started = Instant::now();
        let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&exec.id, None).await?
        else {
            return Err(EngineError::Engine("exec did not attach".into()));
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let collect = async {
            while let Some(chunk) = output.next().await {
                match chunk? {
                    bollard::container::LogOutput::StdOut { message } => {
                        append_capped(&mut stdout, &message)
                    }
                    bollard::container::LogOutput::StdErr { message } => {
                        append_capped(&mut stderr, &message)
                    }
                    _ => {}
                }
            }
            Ok::<(), EngineError>(())
        };
        if tokio::time::timeout(timeout + EXEC_GRACE, collect)
            .await
            .is_err()
        {
            // The guard kills the group when dropped at return.
            return Ok(ExecResult {
                exit_code: -1,
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
                timed_out: true,
            });
        }
        guard.engine = None;
        let code = self
            .docker
            .inspect_exec(&exec.id)
            .await?
            .exit_code
            .unwrap_or(-1) as i32;
        // `timeout -s KILL` ends a script past its deadline with 128 + 9.
        let timed_out = code == 137 && started.elapsed() >= timeout;
        Ok(ExecResult {
            exit_code: if timed_out { -1 } else { code },
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            timed_out,
        })
    }

    /// Asks the helper `body.helper` of the running container `id` one line, through the
    /// container's exec agent (see [`AskBody`]).
    pub async fn ask(&self, id: &str, body: &AskBody) -> Result<AskAnswer, EngineError> {
        if body.line.contains(['\n', '\r']) {
            return Err(EngineError::Invalid("line must be one line".into()));
        }
        if body.helper.is_empty() || body.helper.len() > 128 || body.argv.is_empty() {
            return Err(EngineError::Invalid(
                "a helper needs a key and a command line".into(),
            ));
        }
        let container = self.init_process(id).await?.id;
        let Some(agent) = self.agents.get(&self.docker, &container).await else {
            return Ok(AskAnswer::NoAgent);
        };
        let helper = Helper {
            key: body.helper.clone(),
            argv: body.argv.clone(),
            env: body.env.clone(),
        };
        let timeout = Duration::from_millis(body.timeout_ms.max(1));
        Ok(
            match agent
                .ask_within(&helper, &body.line, timeout, EXEC_GRACE)
                .await
            {
                Ok(line) => AskAnswer::Answered { line },
                Err(reason) => AskAnswer::Failed { reason },
            },
        )
    }

    /// [`Self::exec`] through the container's exec agent: `container` is its full id.
    async fn exec_by_agent(
        &self,
        agent: Arc<Agent>,
        container: &str,
        run_id: String,
        body: &ExecBody,
        timeout: Duration,
    ) -> Result<ExecResult, EngineError> {
        let mut guard = KillOnDrop {
            engine: Some(self.clone()),
            container: container.to_owned(),
            run_id,
            agent: Some(agent.clone()),
        };
        let script = Script {
            script: &body.script,
            cwd: &body.cwd,
            env: &body.env,
        };
        match agent
            .run_within(&guard.run_id, &script, timeout, EXEC_GRACE)
            .await
        {
            Outcome::Answered(out) => {
                guard.engine = None;
                Ok(out.into())
            }
            // The agent ended with the script under way (the bot killed it, or the container
            // stopped): the guard kills the script by its pid file, the next script starts a
            // new agent.
            Outcome::Ended => {
                self.gone_with_its_agent(container).await?;
                tracing::warn!("supervisor.exec_agent.lost_script");
                Err(EngineError::Engine(
                    "the computer's script runner ended while the script ran".into(),
                ))
            }
            // Nothing ran: the guard has nothing to kill.
            Outcome::Refused(reason) => {
                guard.engine = None;
                Err(EngineError::Engine(format!(
                    "the computer cannot start the script: {reason}"
                )))
            }
            // No answer past the deadline: the agent is stuck (stopped by the bot); the guard
            // kills the script by its pid file.
            Outcome::Stuck => Ok(stuck_output().into()),
        }
    }

    /// [`EngineError::Gone`] when the container `id`, whose agent just ended, is stopping or
    /// gone. A stopping container's processes are killed as its first process ends, the agent
    /// with them, a moment before the engine says it stopped: it is asked for up to
    /// [`AGENT_END_SETTLE`].
    async fn gone_with_its_agent(&self, id: &str) -> Result<(), EngineError> {
        let until = Instant::now() + AGENT_END_SETTLE;
        loop {
            let raw = self
                .docker
                .inspect_container(id, None::<InspectContainerOptions>)
                .await?;
            if !to_info(&raw).is_some_and(|info| info.running) {
                return Err(EngineError::Gone);
            }
            if Instant::now() >= until {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process group of the exec `run_id` in the computer `id`, if it still runs.
    pub async fn kill(&self, id: &str, run_id: &str) -> Result<(), EngineError> {
        check_run_id(run_id)?;
        let info = self.inspect(id).await?;
        if let Some(agent) = self.agents.running(&info.id)
            && agent.kill(run_id).await.is_ok()
        {
            return Ok(());
        }
        self.kill_run(&info.id, run_id).await;
        Ok(())
    }

    async fn kill_run(&self, container: &str, run_id: &str) {
        let script = kill_script(run_id);
        let exec = self
            .docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(vec!["bash".to_string(), "-c".into(), script]),
                    user: Some(USER.to_string()),
                    ..Default::default()
                },
            )
            .await;
        if let Ok(exec) = exec {
            let _ = self
                .docker
                .start_exec(
                    &exec.id,
                    Some(bollard::exec::StartExecOptions {
                        detach: true,
                        ..Default::default()
                    }),
                )
                .await;
        }
        tracing::info!("supervisor.exec.killed");
    }
}

/// The exec wrapper: `$1` run id, `$2` deadline in seconds, `$3` the script. The script runs
/// in its own session under `timeout -s KILL`, which kills its whole process group at the
/// deadline; its output goes to files so that background processes it leaves behind cannot
/// hold the exec open. The group's pid is kept where a kill can find it.
pub const EXEC_WRAPPER: &str = r#"d=/tmp/.rakazo-exec/$1
mkdir -p "$d" || exit 125
setsid timeout -s KILL "$2" bash -c "$3" >"$d/out" 2>"$d/err" </dev/null &
echo $! >"$d/pid"
wait $!
rc=$?
head -c 1048576 "$d/out"
head -c 1048576 "$d/err" >&2
rm -rf "$d"
exit $rc"#;

/// Run ids name a directory in the container: 32 lowercase hex digits only.
fn check_run_id(id: &str) -> Result<(), EngineError> {
    if id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(EngineError::Invalid("bad run id".into()))
    }
}

fn append_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = OUTPUT_CAP.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// Kills an exec's process group unless disarmed (`engine = None`): through the agent that
/// runs it while that agent answers, else through an engine exec reading its pid file.
struct KillOnDrop {
    engine: Option<Engine>,
    container: String,
    run_id: String,
    agent: Option<Arc<Agent>>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            let (container, run_id) = (self.container.clone(), self.run_id.clone());
            let agent = self.agent.take().filter(|a| a.alive());
            tokio::spawn(async move {
                if let Some(agent) = agent
                    && agent.kill(&run_id).await.is_ok()
                {
                    return;
                }
                engine.kill_run(&container, &run_id).await
            });
        }
    }
}

/// Creates the home (owned by uid 1000, recursively: a restore may have written it as
/// another user) and the X socket directory (mode 1777, as `/tmp/.X11-unix` must be).
/// Accepts an emulated account name: a lowercase POSIX user name.
fn check_account(account: &str) -> Result<(), EngineError> {
    let ok = (1..=32).contains(&account.len())
        && account.starts_with(|c: char| c.is_ascii_lowercase())
        && account
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && account != "root";
    if ok {
        Ok(())
    } else {
        Err(EngineError::Invalid("bad account".into()))
    }
}

/// The `passwd` and `group` files of an emulated account's machine: uid/gid 1000 named
/// `account`, home `/home/<account>` (mounted read-only over the image's own).
fn write_accounts(dir: &Path, account: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("passwd"),
        format!(
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n{account}:x:{UID}:{UID}::/home/{account}:/bin/bash\n"
        ),
    )?;
    std::fs::write(
        dir.join("group"),
        format!("root:x:0:\nnogroup:x:65534:\n{account}:x:{UID}:\n"),
    )
}

fn prepare_dirs(home: &Path, x11: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(home)?;
    chown_tree(home)?;
    std::fs::create_dir_all(x11)?;
    std::fs::set_permissions(x11, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// Gives `root` and everything under it to uid/gid 1000, through handles that never follow
/// a link ([`crate::providers::beneath::chown_tree`]; files with another hard link are left
/// alone).
pub fn chown_tree(root: &Path) -> std::io::Result<()> {
    crate::providers::beneath::chown_tree(root, UID)
}

fn to_info(raw: &ContainerInspectResponse) -> Option<ComputerInfo> {
    let config = raw.config.as_ref()?;
    let labels = config.labels.as_ref()?;
    if labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
        return None;
    }
    let label = |k: &str| labels.get(k).cloned().unwrap_or_default();
    let binds = raw
        .host_config
        .as_ref()
        .and_then(|h| h.binds.clone())
        .unwrap_or_default();
    let source_of = |target: &str| {
        binds
            .iter()
            .find_map(|b| {
                let mut parts = b.split(':');
                let (src, dst) = (parts.next()?, parts.next()?);
                (dst == target).then(|| src.to_string())
            })
            .unwrap_or_default()
    };
    let gateway_port = raw
        .network_settings
        .as_ref()
        .and_then(|n| n.ports.as_ref())
        .and_then(|p| p.get(&format!("{GATEWAY_PORT}/tcp")).cloned().flatten())
        .and_then(|bindings| {
            bindings
                .into_iter()
                .find(|b| b.host_ip.as_deref() == Some("127.0.0.1"))
        })
        .and_then(|b| b.host_port?.parse().ok());
    Some(ComputerInfo {
        id: raw.id.clone()?,
        name: raw.name.clone()?.trim_start_matches('/').to_string(),
        running: raw.state.as_ref().and_then(|s| s.running).unwrap_or(false),
        computer_id: label(LABEL_COMPUTER),
        space_id: label(LABEL_SPACE),
        bot_id: label(LABEL_BOT),
        home_key: label(LABEL_HOME),
        home_dir: binds
            .iter()
            .find_map(|b| {
                let mut parts = b.split(':');
                let (src, dst) = (parts.next()?, parts.next()?);
                (dst == WORKSPACE || (dst.starts_with("/home/") && !dst[6..].contains('/')))
                    .then(|| src.to_string())
            })
            .unwrap_or_default(),
        x11_dir: source_of("/tmp/.X11-unix"),
        gateway_port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(bot: Option<&str>, space: &str, home: &str) -> CreateComputer {
        CreateComputer {
            computer_id: "c1".into(),
            space_id: space.into(),
            bot_id: bot.map(Into::into),
            account: None,
            home_key: home.into(),
        }
    }

    #[test]
    fn names_follow_the_computer_kind() {
        let name = |r| Engine::container_name(&r).unwrap();
        assert_eq!(name(req(Some("b1"), "s1", "b1")), "rakazo-bot-b1");
        assert_eq!(name(req(None, "s1", "team-s1")), "rakazo-team-s1");
        assert_eq!(name(req(None, "s1", "other")), "rakazo-home-other");
        assert!(Engine::container_name(&req(Some("../x"), "s1", "h")).is_err());
        assert!(Engine::container_name(&req(None, "s1", "a/b")).is_err());
    }
}
