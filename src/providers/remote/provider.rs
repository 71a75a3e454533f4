//! [`RemoteProvider`]: `SandboxProvider` for any [`RemoteSandboxes`] vendor, with screens
//! from the shared [`DesktopRuntime`] over the vendor's run call (commands only: the capture
//! helper and xdotool on the machine), files through [`super::files`] and live screens
//! through a loopback [`Forwarder`] to the vendor's port address of the screen gateway.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use rakazo_actors::provider::{
    ActOutcome, Action, BrowserCommand, Capabilities, Description, ExecOutput, ExecRequest,
    FileEntry, Frame, FrameSize, ListingPage, ListingRange, MachineSpec, ProviderError,
    ProviderRef, ProviderResult, SandboxProvider, ScreenInfo, ScreenPolicy, ScreenRoute,
    WorkspaceExport,
};
use tokio::sync::Mutex;

use super::files::RemoteFiles;
use super::runner::RemoteRunner;
use super::{Layout, RemoteCommand, RemoteSandboxes};
use crate::desktop::command::{CommandRunner, SCRIPT_TIMEOUT, minimal_env};
use crate::desktop::files::MAX_READ_BYTES;
use crate::desktop::gateway_stream;
use crate::desktop::page::PageSessions;
use crate::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use crate::desktop::shell_quote;
use crate::desktop::terminal::ShellSpec;
use crate::providers::workspace_path::{is_web_url, segments};

/// One connected sandbox as this process knows it.
struct Machine<V: RemoteSandboxes> {
    session: V::Session,
    runner: Arc<RemoteRunner<V>>,
    runtime: Arc<DesktopRuntime>,
    /// When the sandbox's TTL was last pushed.
    refreshed: std::sync::Mutex<Instant>,
    /// The workspace helper's path on the machine, once installed.
    helper: tokio::sync::OnceCell<PathBuf>,
    /// The page tools' DevTools connections to the machine's browsers (through the gateway).
    pages: PageSessions,
}

/// The remote provider.
pub struct RemoteProvider<V: RemoteSandboxes> {
    vendor: Arc<V>,
    layout: Layout,
    screen_limit: usize,
    warm_stacks: usize,
    machines: Mutex<HashMap<String, Arc<Machine<V>>>>,
}

impl<V: RemoteSandboxes> RemoteProvider<V> {
    /// A provider on `vendor`; `screen_limit` is `SANDBOX_TEAM_SCREEN_LIMIT` (0 = none).
    pub fn new(vendor: Arc<V>, screen_limit: usize) -> Self {
        Self {
            layout: vendor.layout(),
            vendor,
            screen_limit,
            warm_stacks: 0,
            machines: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps `n` spare display stacks started on each machine (`SANDBOX_DESKTOP_WARM_STACKS`).
    pub fn with_warm_stacks(mut self, n: usize) -> Self {
        self.warm_stacks = n;
        self
    }

    /// The vendor adapter.
    pub fn vendor(&self) -> &Arc<V> {
        &self.vendor
    }

    fn attach(&self, session: V::Session) -> Arc<Machine<V>> {
        let runner = Arc::new(RemoteRunner::new(self.vendor.clone(), session.clone()));
        let config = RuntimeConfig {
            workspace: PathBuf::from(&self.layout.workspace),
            run_dir: PathBuf::from(&self.layout.run_dir),
            screen_limit: self.screen_limit,
            displays: DisplayPool::new(1),
            gateway_port: self.layout.gateway_port,
            settle: Settle::default(),
            x11_socket_dir: None,
            commands_only: true,
            // The vendor's port proxy reaches the machine's interface, not its loopback.
            gateway_host: "0.0.0.0".into(),
            groups: None,
            freeze_after: None,
            warm_stacks: self.warm_stacks,
        };
        let runtime = Arc::new(DesktopRuntime::new(runner.clone(), config));
        runner.serve(&runtime);
        runtime.start_warm_pool();
        Arc::new(Machine {
            session,
            runner,
            runtime,
            refreshed: std::sync::Mutex::new(Instant::now()),
            helper: tokio::sync::OnceCell::new(),
            pages: PageSessions::default(),
        })
    }

    /// Makes the workspace and the private run directory of a fresh or resumed machine.
    async fn prepare(&self, m: &Machine<V>) -> ProviderResult<()> {
        let script = format!(
            "mkdir -p {ws} {run} && chmod 700 {run}",
            ws = shell_quote(&self.layout.workspace),
            run = shell_quote(&self.layout.run_dir),
        );
        let out = m
            .runner
            .run(&script, SCRIPT_TIMEOUT)
            .await
            .map_err(to_provider)?;
        if out.exit_code != 0 {
            return Err(ProviderError::Failed(format!(
                "preparing the workspace: {}",
                out.stderr.trim().chars().take(200).collect::<String>()
            )));
        }
        Ok(())
    }

    /// The connected machine behind `machine`, connecting (and resuming) it if this process
    /// has not yet; its TTL is pushed when a third of it has passed.
    async fn machine(&self, machine: &ProviderRef) -> ProviderResult<Arc<Machine<V>>> {
        let cached = self.machines.lock().await.get(&machine.0).cloned();
        let m = match cached {
            Some(m) => m,
            None => {
                let session = self
                    .forget_if_gone(machine, self.vendor.connect(&machine.0).await)
                    .await?;
                let m = self.attach(session);
                self.prepare(&m).await?;
                self.machines
                    .lock()
                    .await
                    .entry(machine.0.clone())
                    .or_insert(m)
                    .clone()
            }
        };
        let due = {
            let mut at = m.refreshed.lock().unwrap_or_else(|e| e.into_inner());
            let due = at.elapsed() > self.vendor.ttl() / 3;
            if due {
                *at = Instant::now();
            }
            due
        };
        if due {
            let refreshed = self.vendor.refresh(&m.session).await;
            self.forget_if_gone(machine, refreshed).await?;
            tracing::debug!(
                provider = self.vendor.kind(),
                "remote.sandbox.ttl_refreshed"
            );
        }
        Ok(m)
    }

    /// A `MachineGone` answer makes this process forget the machine.
    async fn forget_if_gone<T>(
        &self,
        machine: &ProviderRef,
        r: ProviderResult<T>,
    ) -> ProviderResult<T> {
        if let Err(ProviderError::MachineGone) = &r
            && self.machines.lock().await.remove(&machine.0).is_some()
        {
            tracing::info!(provider = self.vendor.kind(), "remote.sandbox.gone");
        }
        r
    }

    /// Closes every screen (browsers save their sessions) and forgets the machine.
    async fn detach(&self, machine: &ProviderRef) {
        let m = self.machines.lock().await.remove(&machine.0);
        if let Some(m) = m
            && let Err(e) = m.runtime.shutdown().await
        {
            tracing::warn!(provider = self.vendor.kind(), error = %e, "remote.screens.shutdown_failed");
        }
    }

    fn files<'a>(&'a self, m: &'a Machine<V>) -> RemoteFiles<'a, V> {
        RemoteFiles {
            vendor: &self.vendor,
            session: &m.session,
            workspace: &self.layout.workspace,
            run_dir: &self.layout.run_dir,
            runner: m.runner.as_ref(),
            helper: &m.helper,
        }
    }

    /// The local port of the forwarder to the machine's screen gateway.
    async fn gateway_port(&self, m: &Machine<V>) -> ProviderResult<u16> {
        m.runner.gateway_port().await
    }

    /// The environment of the workspace user's shells: nothing of the server's own.
    fn shell_env(&self, term: &str) -> Vec<(String, String)> {
        let mut env = minimal_env();
        env.push(("HOME".into(), self.layout.workspace.clone()));
        env.push(("SHELL".into(), "/bin/bash".into()));
        env.push(("TERM".into(), term.into()));
        env
    }

    /// Runs `f` on the connected machine; a machine the vendor reports gone is forgotten. A
    /// quarantined machine is refused, and one that `f` quarantined (a command's stop was not
    /// confirmed, whatever part of the runtime ran it) answers `Quarantined` and is forgotten
    /// untouched: its screens are not closed, nothing runs on it again.
    async fn on<T, F, Fut>(&self, machine: &ProviderRef, f: F) -> ProviderResult<T>
    where
        F: FnOnce(Arc<Machine<V>>) -> Fut,
        Fut: std::future::Future<Output = ProviderResult<T>>,
    {
        self.refuse_quarantined(machine).await?;
        let m = self.machine(machine).await?;
        let r = f(m).await;
        if r.is_err() {
            self.refuse_quarantined(machine).await?;
        }
        self.forget_if_gone(machine, r).await
    }

    /// `Quarantined` (the machine forgotten) when the vendor quarantined `machine`.
    async fn refuse_quarantined(&self, machine: &ProviderRef) -> ProviderResult<()> {
        let Some(why) = self.vendor.quarantined(&machine.0) else {
            return Ok(());
        };
        self.machines.lock().await.remove(&machine.0);
        Err(ProviderError::Quarantined(why))
    }
}

/// The runner's errors: a gone machine stays `MachineGone`.
fn to_provider(e: crate::desktop::DesktopError) -> ProviderError {
    match e {
        crate::desktop::DesktopError::Command(m) if m == "machine gone" => {
            ProviderError::MachineGone
        }
        other => other.into(),
    }
}

#[async_trait]
impl<V: RemoteSandboxes> SandboxProvider for RemoteProvider<V> {
    fn describe(&self) -> Description {
        Description {
            kind: self.vendor.kind().into(),
            capabilities: Capabilities {
                multi_screen: self.vendor.multi_screen(),
                terminal: true,
                page_browser: true,
                bills_while_running: true,
                mounted_home: false,
                desktop_freezing: false,
                desktop_limits: false,
            },
        }
    }

    async fn health(&self) -> Result<(), String> {
        self.vendor.health().await
    }

    fn quarantined(&self, machine: &ProviderRef) -> Option<String> {
        self.vendor.quarantined(&machine.0)
    }

    async fn warm_desktops(&self) -> Option<rakazo_actors::provider::WarmDesktops> {
        let target = self.warm_stacks;
        if target == 0 {
            return None;
        }
        let machines = self.machines.lock().await;
        Some(crate::desktop::warm::summary(
            target,
            machines.values().map(|m| m.runtime.warm_status()),
        ))
    }

    async fn provision(&self, spec: &MachineSpec) -> ProviderResult<ProviderRef> {
        let session = self.vendor.create(spec).await?;
        let machine = ProviderRef(V::id(&session).to_string());
        let m = self.attach(session);
        if let Err(e) = self.prepare(&m).await {
            let _ = self.vendor.kill(&machine.0).await;
            return Err(e);
        }
        tracing::info!(provider = self.vendor.kind(), computer.id = %spec.computer_id, "remote.sandbox.provisioned");
        self.machines.lock().await.insert(machine.0.clone(), m);
        Ok(machine)
    }

    async fn reconnect(&self, machine: &ProviderRef, spec: &MachineSpec) -> ProviderResult<()> {
        self.refuse_quarantined(machine).await?;
        if self.machines.lock().await.contains_key(&machine.0) {
            // Known and running here: confirm the vendor still has it and push its TTL.
            let m = self.machine(machine).await?;
            let refreshed = self.vendor.refresh(&m.session).await;
            return self.forget_if_gone(machine, refreshed).await;
        }
        let session = self.vendor.connect(&machine.0).await?;
        let m = self.attach(session);
        self.prepare(&m).await?;
        tracing::info!(provider = self.vendor.kind(), computer.id = %spec.computer_id, "remote.sandbox.reconnected");
        self.machines.lock().await.insert(machine.0.clone(), m);
        Ok(())
    }

    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await;
        match self.vendor.pause(&machine.0).await {
            Ok(()) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await;
        match self.vendor.kill(&machine.0).await {
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
        let single = !self.vendor.multi_screen();
        self.on(machine, |m| async move {
            // A single-screen vendor hosts one display, slot 0, for one bot at a time.
            if single {
                let screens = m.runtime.screens().await;
                if screens.keys().any(|b| b != bot_id) {
                    tracing::info!(bot.id = bot_id, "remote.screen.single_taken");
                    return Err(ProviderError::MultiScreenUnavailable);
                }
                if slot != 0 && screens.is_empty() {
                    tracing::info!(
                        bot.id = bot_id,
                        screen.slot = slot,
                        "remote.screen.single_slot"
                    );
                    return Err(ProviderError::MultiScreenUnavailable);
                }
            }
            let screen = m
                .runtime
                .open_screen(bot_id, slot)
                .await
                .map_err(to_provider)?;
            Ok(ScreenInfo { slot: screen.slot })
        })
        .await
    }

    async fn close_screen(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<()> {
        self.on(machine, |m| async move {
            m.runtime.close_screen(bot_id).await.map_err(to_provider)
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
            let observed = m.runtime.observe_sized(bot_id, size).await;
            Ok(observed.map_err(to_provider)?.frame)
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
            let acted = m.runtime.act_sized(bot_id, actions, size).await;
            Ok(acted.map_err(to_provider)?.into())
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
            let port = self.gateway_port(&m).await?;
            m.runtime
                .route(bot_id, policy, Some(port))
                .await
                .map_err(to_provider)
        })
        .await
    }

    async fn browser(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        command: &BrowserCommand,
    ) -> ProviderResult<serde_json::Value> {
        self.on(machine, |m| async move {
            m.runtime.wake_browser(bot_id).await.map_err(to_provider)?;
            // No socket of the machine can be dialed from here: DevTools goes through the
            // screen gateway, on a bridge of its own token.
            let connect = || async {
                let port = self
                    .gateway_port(&m)
                    .await
                    .map_err(|e| crate::desktop::DesktopError::Browser(e.to_string()))?;
                gateway_stream::devtools(&m.runtime, bot_id, Some(port), |route| route).await
            };
            let home = m.runtime.workspace();
            m.pages.run(bot_id.to_owned(), home, connect, command).await
        })
        .await
    }

    async fn connect_terminal(
        &self,
        machine: &ProviderRef,
        _bot_id: &str,
        control: Option<&ScreenRoute>,
    ) -> ProviderResult<ScreenRoute> {
        let Some(control) = control else {
            return Err(ProviderError::Unsupported(
                "the terminal needs a control route".into(),
            ));
        };
        self.on(machine, |m| async move {
            let port = self.gateway_port(&m).await?;
            let shell = ShellSpec {
                cwd: self.layout.workspace.clone(),
                env: self.shell_env("xterm-256color"),
            };
            m.runtime
                .terminal_route(&control.token, &shell, Some(port))
                .await
                .map_err(to_provider)
        })
        .await
    }

    async fn close_route(&self, machine: &ProviderRef, token: &str) -> ProviderResult<()> {
        let m = self.machines.lock().await.get(&machine.0).cloned();
        match m {
            Some(m) => m.runtime.revoke(token).await.map_err(to_provider),
            None => Ok(()),
        }
    }

    async fn launch(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        argv: &[String],
    ) -> ProviderResult<()> {
        self.on(machine, |m| async move {
            m.runtime
                .launch(bot_id, argv.to_vec())
                .await
                .map_err(to_provider)
        })
        .await
    }

    async fn open(&self, machine: &ProviderRef, bot_id: &str, target: &str) -> ProviderResult<()> {
        let target = if is_web_url(target) {
            target.to_owned()
        } else {
            let segs = segments(target, false)?;
            format!("{}/{}", self.layout.workspace, segs.join("/"))
        };
        self.on(machine, |m| async move {
            m.runtime
                .open_in_browser(bot_id, &target)
                .await
                .map_err(to_provider)
        })
        .await
    }

    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        self.on(machine, |m| async move {
            let cwd = self.files(&m).dir(&request.cwd).await?;
            let mut env = self.shell_env("dumb");
            env.extend(request.env.iter().cloned());
            let command = RemoteCommand {
                script: format!("exec bash -lc {}", shell_quote(&request.command)),
                cwd,
                env,
                timeout: request.timeout,
            };
            m.runner.start_agent_soon();
            m.runner.run_command(&command).await
        })
        .await
    }

    async fn list_files(
        &self,
        machine: &ProviderRef,
        path: &str,
    ) -> ProviderResult<Vec<FileEntry>> {
        self.on(machine, |m| async move {
            m.runner.start_agent_soon();
            self.files(&m).list(path).await
        })
        .await
    }

    async fn list_files_first(
        &self,
        machine: &ProviderRef,
        path: &str,
        range: &ListingRange,
    ) -> ProviderResult<ListingPage> {
        self.on(machine, |m| async move {
            m.runner.start_agent_soon();
            self.files(&m).list_first(path, range).await
        })
        .await
    }

    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>> {
        self.read_file_within(machine, path, MAX_READ_BYTES).await
    }

    async fn read_file_within(
        &self,
        machine: &ProviderRef,
        path: &str,
        max: u64,
    ) -> ProviderResult<Vec<u8>> {
        self.on(machine, |m| async move {
            m.runner.start_agent_soon();
            self.files(&m).read(path, max).await
        })
        .await
    }

    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()> {
        self.on(machine, |m| async move {
            m.runner.start_agent_soon();
            self.files(&m).write(path, data).await
        })
        .await
    }

    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport> {
        self.on(machine, |m| async move {
            let files = self.files(&m);
            m.runtime
                .with_browser_state_saved(files.export(since))
                .await
                .map_err(to_provider)?
        })
        .await
    }

    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()> {
        self.on(machine, |m| async move {
            // Browsers hold files of the old workspace open: a replaced workspace starts fresh.
            m.runtime.shutdown().await.map_err(to_provider)?;
            self.files(&m).import(archive).await
        })
        .await
    }
}
