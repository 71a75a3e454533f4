//! The `docker` provider (`SANDBOX_PROVIDER=docker`): computers are containers that the
//! supervisor (`rakazo supervisor`, the only process with the Docker socket) creates from the
//! computer image, with screens from the shared [`DesktopRuntime`].
//!
//! - [`client`]: the supervisor's HTTP client; its errors become [`ProviderError`] there.
//! - [`groups`]: the desktops' control groups (CPU weight, memory ceiling, freezer), which
//!   the supervisor creates under the container's own.
//! - [`runner`]: the runtime's [`crate::desktop::command::CommandRunner`] through the
//!   supervisor's exec (every script runs in the container as uid 1000).
//!
//! How the pieces reach the container:
//! - commands: the supervisor's exec;
//! - files: the home is `DATA_DIR/homes/<home key>` bind-mounted at `/home/rakazo`
//!   (`mountedHome`), so list/read/export read the host directory directly and writes/imports
//!   write it and give what they wrote to uid 1000;
//! - screens: the container's `/tmp/.X11-unix` is a host directory (`DATA_DIR/run/x11/<hash>`),
//!   so this process connects to each Xvfb's unix socket for capture and XTEST input exactly
//!   as it does on the host; nothing graphical crosses HTTP. This needs the API process on the
//!   supervisor's host with the same `DATA_DIR`, as the Compose layout has it;
//! - the screen gateway (websockify) listens on port 6080 in the container, published on
//!   127.0.0.1 only, on an ephemeral host port ([`DockerProvider::gateway_addr`]); with
//!   `SANDBOX_DOCKER_NETWORK=none` there is no published port.

mod attach;
pub mod client;
pub mod groups;
mod pool;
pub mod runner;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use rakazo_actors::provider::{
    ActOutcome, Action, BrowserCommand, Capabilities, Description, DesktopFreeze, ExecOutput,
    ExecRequest, FileEntry, Frame, FrameSize, ListingPage, ListingRange, MachineSpec, Preparation,
    ProviderError, ProviderRef, ProviderResult, SandboxProvider, ScreenInfo, ScreenPolicy,
    ScreenRoute, WorkspaceExport,
};
use tokio::sync::Mutex;

use crate::desktop::DesktopError;
use crate::desktop::cdp::Cdp;
use crate::desktop::command::minimal_env;
use crate::desktop::files::blocking;
use crate::desktop::gateway_stream;
use crate::desktop::groups::DesktopLimits;
use crate::desktop::page::PageSessions;
use crate::desktop::runtime::DesktopRuntime;
use crate::desktop::terminal::ShellSpec;
use crate::desktop::{files, shell_quote};
use crate::supervisor::engine::{UID, WORKSPACE, chown_tree};
use crate::supervisor::wire::{ComputerInfo, CreateComputer, ExecBody};
use attach::{Attacher, Machine};
use client::SupervisorClient;
use pool::ComputerPool;

/// Inside every computer: logs, the window manager's home and the gateway's sockets.
pub const RUN_DIR: &str = "/tmp/rakazo-run";

/// How the provider is set up.
#[derive(Clone, Debug)]
pub struct DockerProviderConfig {
    /// `SANDBOX_SUPERVISOR_URL`.
    pub supervisor_url: String,
    /// `SANDBOX_SUPERVISOR_TOKEN` (never logged).
    pub supervisor_token: String,
    /// `SANDBOX_TEAM_SCREEN_LIMIT` (0 = none).
    pub screen_limit: usize,
    /// Reach screens through commands only (the capture helper and xdotool through the
    /// supervisor's exec), the path remote providers take, instead of the shared X sockets.
    pub commands_only: bool,
    /// `SANDBOX_DESKTOP_WARM_STACKS`: spare display stacks per computer.
    pub warm_stacks: usize,
    /// Per-desktop control groups (`SANDBOX_DESKTOP_*`), where the supervisor can give them;
    /// `None` = none.
    pub limits: Option<DesktopLimits>,
}

/// The `docker` provider.
pub struct DockerProvider {
    client: SupervisorClient,
    config: DockerProviderConfig,
    machines: Mutex<HashMap<String, Arc<Machine>>>,
    pages: PageSessions,
    /// Attaches runtimes to containers; knows whether desktops get control groups.
    attacher: Attacher,
    /// Computers created ahead, for the next provisions.
    pool: ComputerPool,
}

impl DockerProvider {
    /// A provider talking to the configured supervisor; refuses an empty token.
    pub fn new(config: DockerProviderConfig) -> ProviderResult<Self> {
        if config.supervisor_token.is_empty() {
            return Err(ProviderError::Unsupported(
                "SANDBOX_PROVIDER=docker requires SANDBOX_SUPERVISOR_TOKEN".into(),
            ));
        }
        let client = SupervisorClient::new(&config.supervisor_url, &config.supervisor_token)?;
        Ok(Self {
            attacher: Attacher::new(client.clone(), config.clone()),
            client,
            config,
            machines: Mutex::new(HashMap::new()),
            pages: PageSessions::default(),
            pool: ComputerPool::new(0),
        })
    }

    /// Keeps `n` computers created and started ahead, each with the spare desktops of
    /// [`DockerProviderConfig::warm_stacks`] (`SANDBOX_DOCKER_WARM_COMPUTERS`); they are
    /// made once [`Self::start_pool`] runs (at start-up, through `recover`).
    pub fn with_warm_computers(mut self, n: usize) -> Self {
        self.pool = ComputerPool::new(n);
        self
    }

    /// Starts filling the pool of computers (nothing with a size of 0).
    pub fn start_pool(&self) {
        self.pool.start(self.attacher.clone());
    }

    /// The desktop runtime of a computer (its gateway and teardown events).
    pub async fn runtime(&self, machine: &ProviderRef) -> ProviderResult<Arc<DesktopRuntime>> {
        Ok(self.machine(machine).await?.runtime.clone())
    }

    /// Where this host reaches the computer's screen gateway (127.0.0.1 and the published
    /// port), when it has one.
    pub async fn gateway_addr(&self, machine: &ProviderRef) -> ProviderResult<Option<SocketAddr>> {
        let m = self.machine(machine).await?;
        Ok(m.info
            .gateway_port
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p))))
    }

    /// The container of a computer as the supervisor reports it.
    pub async fn info(&self, machine: &ProviderRef) -> ProviderResult<ComputerInfo> {
        self.client.inspect(&machine.0).await
    }

    /// The running machine behind `machine`, attaching to it if this process has not yet.
    async fn machine(&self, machine: &ProviderRef) -> ProviderResult<Arc<Machine>> {
        if let Some(m) = self.machines.lock().await.get(&machine.0) {
            return Ok(m.clone());
        }
        let info = self.client.inspect(&machine.0).await?;
        if !info.running {
            return Err(ProviderError::MachineGone);
        }
        let grouped = self.attacher.groups_taking_over(&info.id).await;
        let mut machines = self.machines.lock().await;
        let m = machines
            .entry(machine.0.clone())
            .or_insert_with(|| self.attacher.attach(info, grouped))
            .clone();
        Ok(m)
    }

    /// Reconnects through the labels: a managed container of this very computer that outlived
    /// its providerRef (a lost database write, a restored database) is started if needed and
    /// used instead of being replaced. `None` when there is none or it cannot run.
    async fn adopt(&self, spec: &MachineSpec) -> Option<ProviderRef> {
        let info = self.client.find(&spec.home_key).await.ok()?;
        if info.computer_id != spec.computer_id || info.space_id != spec.space_id {
            return None;
        }
        let info = if info.running {
            info
        } else {
            self.client.start(&info.id).await.ok()?
        };
        tracing::info!(computer.id = %spec.computer_id, "docker.computer.adopted");
        let machine = ProviderRef(info.id.clone());
        let m = self
            .attacher
            .attach(info, self.attacher.groups_taking_over(&machine.0).await);
        self.machines.lock().await.insert(machine.0.clone(), m);
        Some(machine)
    }

    /// A pooled computer claimed for `req`, when one is ready and the supervisor gives it
    /// (`None`: create one). A claim refused because the home holds files changes nothing and
    /// the computer stays pooled; any other failure discards it.
    async fn claim_pooled(&self, req: &CreateComputer) -> Option<ProviderRef> {
        let pooled = self.pool.take().await?;
        match self.client.claim(&pooled.info.id, req).await {
            Ok(Some(info)) => {
                self.pool.refill();
                tracing::info!(computer.id = %req.computer_id, "docker.computer.claimed");
                let machine = ProviderRef(info.id.clone());
                let m = Arc::new(Machine {
                    info,
                    runtime: pooled.runtime.clone(),
                });
                self.machines.lock().await.insert(machine.0.clone(), m);
                Some(machine)
            }
            Ok(None) => {
                self.pool.give_back(pooled, &self.client);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "docker.pool.claim_failed");
                self.pool.refill();
                pool::discard(self.client.clone(), pooled).await;
                None
            }
        }
    }

    /// Closes every screen (browsers save their sessions) and forgets the machine.
    async fn detach(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.pages.forget_machine(&machine.0);
        let m = self.machines.lock().await.remove(&machine.0);
        if let Some(m) = m
            && let Err(e) = m.runtime.shutdown().await
        {
            tracing::warn!(error = %e, "docker.screens.shutdown_failed");
        }
        Ok(())
    }

    /// `f` on the machine's record; its failure [classified](Self::classify).
    async fn on<T, F, Fut>(&self, machine: &ProviderRef, f: F) -> ProviderResult<T>
    where
        F: FnOnce(Arc<Machine>) -> Fut,
        Fut: std::future::Future<Output = ProviderResult<T>>,
    {
        let m = self.machine(machine).await?;
        match f(m).await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.classify(machine, e).await),
        }
    }

    /// A failed call on a container that is no longer there (or no longer running) is
    /// `MachineGone`, whatever failed first (a broken X connection, an exec error); the stale
    /// machine is forgotten so the next call looks again.
    async fn classify(&self, machine: &ProviderRef, err: ProviderError) -> ProviderError {
        let gone = match &err {
            ProviderError::MachineGone => true,
            ProviderError::Failed(_) => match self.client.inspect(&machine.0).await {
                Ok(info) => !info.running,
                Err(ProviderError::MachineGone) => true,
                Err(_) => false,
            },
            _ => false,
        };
        if gone {
            self.machines.lock().await.remove(&machine.0);
            tracing::info!("docker.computer.gone");
            ProviderError::MachineGone
        } else {
            err
        }
    }

    fn home(m: &Machine) -> ProviderResult<PathBuf> {
        if m.info.home_dir.is_empty() {
            return Err(ProviderError::Failed(
                "the computer has no mounted home".into(),
            ));
        }
        Ok(PathBuf::from(&m.info.home_dir))
    }

    /// The workspace path `rel` resolved beneath the host's view of the home, and the same
    /// place as the container names it.
    fn in_container(home: &Path, rel: &str) -> ProviderResult<(PathBuf, PathBuf)> {
        let resolved = files::resolve(home, rel)?;
        let inside = resolved
            .strip_prefix(home)
            .map_err(|_| ProviderError::PathRejected("outside the workspace".into()))?;
        let inside = Path::new(WORKSPACE).join(inside);
        Ok((resolved, inside))
    }

    /// The environment of the workspace user's shells: nothing of the server's own.
    fn shell_env(term: &str) -> Vec<(String, String)> {
        let mut env = minimal_env();
        env.push(("HOME".into(), WORKSPACE.into()));
        env.push(("SHELL".into(), "/bin/bash".into()));
        env.push(("TERM".into(), term.into()));
        env
    }

    /// The environment of the shell tool.
    fn exec_env(request: &ExecRequest) -> Vec<(String, String)> {
        let mut env = Self::shell_env("dumb");
        env.extend(request.env.iter().cloned());
        env
    }
}

#[async_trait]
impl SandboxProvider for DockerProvider {
    async fn health(&self) -> Result<(), String> {
        self.client
            .health()
            .await
            .map(|_| ())
            .map_err(|_| "the Docker supervisor or its engine does not answer".to_owned())
    }

    async fn warm_desktops(&self) -> Option<rakazo_actors::provider::WarmDesktops> {
        let target = self.config.warm_stacks;
        if target == 0 && self.pool.target() == 0 {
            return None;
        }
        let (pooled, pooled_spares) = self.pool.status();
        let machines = self.machines.lock().await;
        let mut sum = crate::desktop::warm::summary(
            target,
            machines
                .values()
                .map(|m| m.runtime.warm_status())
                .chain(pooled_spares),
        );
        sum.computers = machines.len();
        sum.pooled_target = pooled.target;
        sum.pooled_ready = pooled.ready;
        Some(sum)
    }

    async fn egress_guard(&self) -> Option<Result<String, String>> {
        let health = self.client.health().await.ok()?;
        Some(if health.egress_active {
            Ok(health.egress_guard)
        } else {
            Err(health.egress_guard)
        })
    }

    fn desktop_freezes(&self) -> Option<tokio::sync::broadcast::Receiver<DesktopFreeze>> {
        Some(self.attacher.freezes.subscribe())
    }

    async fn desktop_groups(&self) -> Option<Result<String, String>> {
        self.config.limits?;
        self.attacher.ask_groups().await
    }

    fn describe(&self) -> Description {
        Description {
            kind: "docker".into(),
            capabilities: Capabilities {
                multi_screen: true,
                terminal: true,
                // DevTools is reached through a bridge in the shared X socket directory, or
                // through the published gateway when screens are reached by commands only.
                page_browser: true,
                bills_while_running: false,
                mounted_home: true,
                desktop_freezing: self.attacher.groups_known()
                    && self.config.limits.is_some_and(|l| l.freeze_after.is_some()),
                desktop_limits: self.attacher.groups_known(),
            },
        }
    }

    /// A missing computer image is built first (the supervisor builds one of the built-in
    /// recipe), reported as `image_build`; then `container_start`. A supervisor that cannot
    /// say whether the image is there leaves it to the create call.
    async fn prepare(&self, stage: &(dyn Fn(Preparation) + Send + Sync)) -> ProviderResult<()> {
        if let Ok(status) = self.client.image_status().await
            && !status.present
        {
            stage(Preparation::ImageBuild);
            self.client.ensure_image().await?;
        }
        stage(Preparation::ContainerStart);
        Ok(())
    }

    /// Start-up: the pool of computers starts filling.
    async fn recover(&self) -> ProviderResult<()> {
        self.start_pool();
        Ok(())
    }

    /// The pooled computers are removed (the ones in use outlive this process).
    async fn shutdown(&self) -> ProviderResult<()> {
        self.pool.close(&self.client).await;
        Ok(())
    }

    async fn provision(&self, spec: &MachineSpec) -> ProviderResult<ProviderRef> {
        if let Some(machine) = self.adopt(spec).await {
            return Ok(machine);
        }
        let req = CreateComputer {
            computer_id: spec.computer_id.clone(),
            space_id: spec.space_id.clone(),
            bot_id: spec.bot_id.clone(),
            home_key: spec.home_key.clone(),
            account: None,
        };
        if let Some(machine) = self.claim_pooled(&req).await {
            return Ok(machine);
        }
        let info = self.client.create(&req).await?;
        tracing::info!(computer.id = %spec.computer_id, "docker.computer.provisioned");
        let machine = ProviderRef(info.id.clone());
        let m = self.attacher.attach(info, self.attacher.groups_on().await);
        self.machines.lock().await.insert(machine.0.clone(), m);
        Ok(machine)
    }

    async fn reconnect(&self, machine: &ProviderRef, spec: &MachineSpec) -> ProviderResult<()> {
        let info = self.client.inspect(&machine.0).await?;
        if info.home_key != spec.home_key || info.space_id != spec.space_id {
            return Err(ProviderError::MachineGone);
        }
        if let Some(m) = self.machines.lock().await.get(&machine.0)
            && info.running
            && m.info.id == info.id
        {
            return Ok(());
        }
        let info = self.client.start(&machine.0).await?;
        tracing::info!(computer.id = %spec.computer_id, "docker.computer.reconnected");
        let m = self
            .attacher
            .attach(info, self.attacher.groups_taking_over(&machine.0).await);
        self.machines.lock().await.insert(machine.0.clone(), m);
        Ok(())
    }

    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await?;
        self.client.stop(&machine.0).await
    }

    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await?;
        match self.client.remove(&machine.0).await {
            Ok(()) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn open_screen(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        slot: u32,
    ) -> ProviderResult<ScreenInfo> {
        self.on(machine, |m| async move {
            let screen = m.runtime.open_screen(bot_id, slot).await?;
            Ok(ScreenInfo { slot: screen.slot })
        })
        .await
    }

    async fn open_route(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        policy: ScreenPolicy,
    ) -> ProviderResult<ScreenRoute> {
        self.on(machine, |m| async move {
            let Some(port) = m.info.gateway_port else {
                return Err(ProviderError::Unsupported(
                    "live screens need a published gateway (SANDBOX_DOCKER_NETWORK=bridge)".into(),
                ));
            };
            Ok(m.runtime.route(bot_id, policy, Some(port)).await?)
        })
        .await
    }

    async fn connect_terminal(
        &self,
        machine: &ProviderRef,
        _bot_id: &str,
        control: Option<&ScreenRoute>,
    ) -> ProviderResult<ScreenRoute> {
        self.on(machine, |m| async move {
            let (Some(port), Some(control)) = (m.info.gateway_port, control) else {
                return Err(ProviderError::Unsupported(
                    "the terminal needs the screen gateway and a control route".into(),
                ));
            };
            // The shell tool's environment, with a terminal that can draw.
            let shell = ShellSpec {
                cwd: WORKSPACE.into(),
                env: Self::shell_env("xterm-256color"),
            };
            let route = m.runtime.terminal_route(&control.token, &shell, Some(port));
            Ok(route.await?)
        })
        .await
    }

    async fn close_route(&self, machine: &ProviderRef, token: &str) -> ProviderResult<()> {
        Ok(self.machine(machine).await?.runtime.revoke(token).await?)
    }

    async fn launch(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        argv: &[String],
    ) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        Ok(m.runtime.launch(bot_id, argv.to_vec()).await?)
    }

    async fn open(&self, machine: &ProviderRef, bot_id: &str, target: &str) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        let target = if crate::providers::workspace_path::is_web_url(target) {
            target.to_owned()
        } else {
            let home = Self::home(&m)?;
            let target = target.to_owned();
            let (_, inside) = blocking(move || Self::in_container(&home, &target)).await?;
            inside.to_string_lossy().into_owned()
        };
        Ok(m.runtime.open_in_browser(bot_id, &target).await?)
    }

    async fn browser(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        command: &BrowserCommand,
    ) -> ProviderResult<serde_json::Value> {
        let m = self.machine(machine).await?;
        if let Err(e) = m.runtime.wake_browser(bot_id).await {
            return Err(self.classify(machine, e.into()).await);
        }
        let key = format!("{}/{bot_id}", machine.0);
        if self.config.commands_only {
            // The X sockets are not shared: DevTools goes through the gateway, as screens do.
            let Some(port) = m.info.gateway_port else {
                return Err(ProviderError::Unsupported(
                    "page tools need a published gateway (SANDBOX_DOCKER_NETWORK=bridge): use computer_observe and computer_act"
                        .into(),
                ));
            };
            let connect = || gateway_stream::devtools(&m.runtime, bot_id, Some(port), |r| r);
            let home = m.runtime.workspace();
            return self.pages.run(key, home, connect, command).await;
        }
        let home = Self::home(&m)?;
        let sockets = PathBuf::from(&m.info.x11_dir);
        let connect = || async {
            let (port, path) = Cdp::endpoint(&home, bot_id).await?;
            let name = m.runtime.devtools_bridge(bot_id, port).await?;
            // The computer can write the socket directory: no link is followed to the socket.
            let bridge = |e: std::io::Error| DesktopError::Browser(format!("DevTools bridge: {e}"));
            let sockets = sockets.clone();
            let stream = tokio::task::spawn_blocking(move || {
                let stream = crate::providers::beneath::connect_socket(&sockets, &name)?;
                stream.set_nonblocking(true)?;
                Ok(stream)
            })
            .await
            .map_err(|e| bridge(std::io::Error::other(e)))?
            .and_then(tokio::net::UnixStream::from_std)
            .map_err(bridge)?;
            Cdp::over(Box::new(stream), port, &path).await
        };
        let home = m.runtime.workspace();
        self.pages.run(key, home, connect, command).await
    }

    async fn close_screen(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<()> {
        self.on(machine, |m| async move {
            Ok(m.runtime.close_screen(bot_id).await?)
        })
        .await
    }

    async fn observe_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        size: FrameSize,
    ) -> ProviderResult<Frame> {
        self.on(machine, |m| async move {
            Ok(m.runtime.observe_sized(bot_id, size).await?.frame)
        })
        .await
    }

    async fn act_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        actions: &[Action],
        size: FrameSize,
    ) -> ProviderResult<ActOutcome> {
        self.on(machine, |m| async move {
            Ok(m.runtime.act_sized(bot_id, actions, size).await?.into())
        })
        .await
    }

    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        let m = self.machine(machine).await?;
        let home = Self::home(&m)?;
        let rel = request.cwd.clone();
        let cwd = blocking(move || {
            let (resolved, inside) = Self::in_container(&home, &rel)?;
            if !resolved.is_dir() {
                return Err(ProviderError::NotFound(rel.chars().take(200).collect()));
            }
            Ok(inside)
        })
        .await?;
        let body = ExecBody {
            script: format!("exec bash -lc {}", shell_quote(&request.command)),
            cwd: cwd.to_string_lossy().into_owned(),
            env: Self::exec_env(request),
            timeout_ms: request.timeout.as_millis() as u64,
            run_id: None,
        };
        let out = match self.client.exec(&m.info.id, &body).await {
            Ok(out) => out,
            Err(e) => return Err(self.classify(machine, e).await),
        };
        Ok(out.into())
    }

    async fn list_files(
        &self,
        machine: &ProviderRef,
        path: &str,
    ) -> ProviderResult<Vec<FileEntry>> {
        let home = Self::home(&*self.machine(machine).await?)?;
        let path = path.to_string();
        blocking(move || files::list(&home, &path)).await
    }

    async fn list_files_first(
        &self,
        machine: &ProviderRef,
        path: &str,
        range: &ListingRange,
    ) -> ProviderResult<ListingPage> {
        let home = Self::home(&*self.machine(machine).await?)?;
        let (path, range) = (path.to_string(), range.clone());
        blocking(move || files::list_first(&home, &path, &range)).await
    }

    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>> {
        let home = Self::home(&*self.machine(machine).await?)?;
        let path = path.to_string();
        blocking(move || files::read(&home, &path)).await
    }

    async fn read_file_within(
        &self,
        machine: &ProviderRef,
        path: &str,
        max: u64,
    ) -> ProviderResult<Vec<u8>> {
        let home = Self::home(&*self.machine(machine).await?)?;
        let path = path.to_string();
        blocking(move || files::read_within(&home, &path, max)).await
    }

    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()> {
        let home = Self::home(&*self.machine(machine).await?)?;
        let (path, data) = (path.to_string(), data.to_vec());
        blocking(move || files::write(&home, &path, &data, Some(UID))).await
    }

    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport> {
        let m = self.machine(machine).await?;
        files::export_consistent(&m.runtime, Self::home(&m)?, since).await
    }

    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        // Browsers hold files of the old workspace open: a replaced workspace starts fresh.
        m.runtime.shutdown().await?;
        let (home, archive) = (Self::home(&m)?, archive.to_vec());
        blocking(move || {
            files::import(&home, &archive)?;
            if let Err(e) = chown_tree(&home) {
                tracing::debug!(error = %e.kind(), "docker.files.chown_skipped");
            }
            Ok(())
        })
        .await
    }
}
