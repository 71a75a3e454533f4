//! The `desktop` provider (`SANDBOX_PROVIDER=desktop`): computers that are workspace
//! directories on this host, with screens from the shared [`DesktopRuntime`].
//!
//! For development and tests only: commands run as the server's own user, so the constructor
//! refuses any environment but `development` and `test`. The workspace of a computer is
//! `<homes root>/<home key>`, the very directory the local home store keeps, so neither
//! `provision` nor `destroy` empties it: the host directory already is the latest workspace.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rakazo_actors::provider::{
    ActOutcome, Action, BrowserCommand, Capabilities, Description, DesktopFreeze, ExecOutput,
    ExecRequest, FileEntry, Frame, FrameSize, ListingPage, ListingRange, MachineSpec,
    ProviderError, ProviderRef, ProviderResult, SandboxProvider, ScreenInfo, ScreenPolicy,
    ScreenRoute, WorkspaceExport,
};
use tokio::sync::Mutex;

use super::browser::Launch;
use super::cgroup::Version;
use super::command::{
    CommandRunner as _, HostRunner, SCRIPT_TIMEOUT, minimal_env, reap_script, sweep_script,
};
use super::files::blocking;
use super::groups::{DesktopGroups, DesktopLimits, HostGroups, forward_freezes, host_parent};
use super::runtime::{DesktopRuntime, DisplayPool, REAP_GRACE, RuntimeConfig};
use super::{check_id, files, shell_quote};

/// The environments the provider agrees to run in (`RAKAZO_ENV`).
pub const ALLOWED_ENVIRONMENTS: [&str; 2] = ["development", "test"];

/// How the provider is set up.
#[derive(Clone, Debug)]
pub struct DesktopProviderConfig {
    /// `DATA_DIR/homes`: one workspace directory per home key.
    pub homes_root: PathBuf,
    /// Where runtimes keep logs, window-manager homes and gateway sockets (one folder per
    /// computer); should be private to the server's user.
    pub run_root: PathBuf,
    /// `SANDBOX_TEAM_SCREEN_LIMIT` (0 = none).
    pub screen_limit: usize,
    /// First X display number to use (`:1` by default).
    pub first_display: u32,
    /// `RAKAZO_ENV`.
    pub environment: String,
    /// Per-desktop control groups (`SANDBOX_DESKTOP_*`); `None` = none.
    pub limits: Option<DesktopLimits>,
    /// `SANDBOX_DESKTOP_WARM_STACKS`: spare display stacks per computer.
    pub warm_stacks: usize,
    /// `SANDBOX_DESKTOP_START_NICE`: how far below this process's CPU priority a desktop runs
    /// while it starts (0 = not lowered): by nice value without desktop groups
    /// ([`Launch::start_only`]), by the weight of the group its CPU is weighed in with them
    /// ([`super::start_group`]).
    pub start_nice: u8,
}

/// One host computer.
struct Machine {
    home: PathBuf,
    runtime: Arc<DesktopRuntime>,
    groups: Option<Arc<HostGroups>>,
}

/// The `desktop` provider.
pub struct DesktopProvider {
    config: DesktopProviderConfig,
    displays: Arc<DisplayPool>,
    machines: Mutex<HashMap<String, Arc<Machine>>>,
    /// Machines destroyed in this process: their references never attach again (a host
    /// directory outlives its machine, so without this a destroyed reference would revive).
    destroyed: Mutex<std::collections::HashSet<String>>,
    /// DevTools connections of the page-browser tools, by machine and bot.
    pages: super::page::PageSessions,
    /// Whether this host gives desktops control groups: the interface, or why not.
    groups: Result<Version, String>,
    /// Freezes and thaws of every machine's desktops.
    freezes: tokio::sync::broadcast::Sender<DesktopFreeze>,
}

impl DesktopProvider {
    /// Creates the provider; refuses unless `environment` is `development` or `test`.
    pub fn new(config: DesktopProviderConfig) -> ProviderResult<Self> {
        if !ALLOWED_ENVIRONMENTS.contains(&config.environment.as_str()) {
            return Err(ProviderError::Unsupported(format!(
                "the desktop provider runs commands on this host and only starts when RAKAZO_ENV is development or test (got {:?})",
                config.environment
            )));
        }
        std::fs::create_dir_all(&config.homes_root)
            .map_err(|e| ProviderError::Failed(format!("homes root: {e}")))?;
        // Every host provider of this process shares one pool: two pools would race for the
        // same display numbers (and clear each other's X sockets) on this one host.
        static HOST_DISPLAYS: std::sync::OnceLock<Arc<DisplayPool>> = std::sync::OnceLock::new();
        let displays = HOST_DISPLAYS
            .get_or_init(|| DisplayPool::new(config.first_display.max(1)))
            .clone();
        let groups = match config.limits {
            None => Err("per-desktop limits are not configured".to_string()),
            Some(_) => host_parent()
                .map(|p| p.version())
                .map_err(|e| e.to_string()),
        };
        match &groups {
            Ok(version) => tracing::info!(cgroup = version.as_str(), "desktop.limits.active"),
            Err(why) if config.limits.is_some() => {
                tracing::warn!(error = %why, "desktop.limits.unavailable")
            }
            Err(_) => {}
        }
        Ok(Self {
            groups,
            freezes: tokio::sync::broadcast::channel(256).0,
            config,
            displays,
            machines: Mutex::new(HashMap::new()),
            destroyed: Mutex::new(Default::default()),
            pages: Default::default(),
        })
    }

    /// The desktop runtime of a computer, for wiring its gateway and teardown events.
    pub async fn runtime(&self, machine: &ProviderRef) -> ProviderResult<Arc<DesktopRuntime>> {
        Ok(self.machine(machine).await?.runtime.clone())
    }

    fn home_of(&self, key: &str) -> ProviderResult<PathBuf> {
        check_id(key).map_err(|e| ProviderError::PathRejected(e.to_string()))?;
        Ok(self.config.homes_root.join(key))
    }

    /// The machine behind `machine`, attaching to its directory if this process has not yet.
    async fn machine(&self, machine: &ProviderRef) -> ProviderResult<Arc<Machine>> {
        let home = self.home_of(&machine.0)?;
        if self.destroyed.lock().await.contains(&machine.0) {
            return Err(ProviderError::MachineGone);
        }
        let mut machines = self.machines.lock().await;
        if let Some(m) = machines.get(&machine.0) {
            return Ok(m.clone());
        }
        if !home.is_dir() {
            return Err(ProviderError::MachineGone);
        }
        let groups = match (&self.groups, self.config.limits) {
            (Ok(_), Some(limits)) => {
                match HostGroups::new(&short_name(&machine.0), limits, self.config.start_nice) {
                    Ok(g) => Some(g),
                    Err(e) => {
                        tracing::warn!(error = %e, "desktop.limits.unavailable");
                        None
                    }
                }
            }
            _ => None,
        };
        let config = RuntimeConfig {
            screen_limit: self.config.screen_limit,
            groups: groups.clone().map(|g| g as Arc<dyn DesktopGroups>),
            freeze_after: self.config.limits.and_then(|l| l.freeze_after),
            warm_stacks: self.config.warm_stacks,
            // Short: the gateway's unix sockets live below it (108-byte path limit).
            ..RuntimeConfig::on_host(
                home.clone(),
                self.config.run_root.join(short_name(&machine.0)),
                self.displays.clone(),
            )
        };
        // A start lowered while it lasts: with desktop groups, by the group its CPU part is
        // weighed in (`start_group`, given to `HostGroups` above), since a nice value would
        // count only inside the desktop's own group; without, by nice value (where this process
        // may raise it back).
        let launch = match (&groups, self.config.start_nice) {
            (None, nice @ 1..) => Launch {
                nice: nice.min(19),
                ..Launch::lowered_while_starting()
            },
            _ => Launch::default(),
        };
        let runtime = Arc::new(
            DesktopRuntime::new(Arc::new(HostRunner::minimal()), config).with_launch(launch),
        );
        runtime.start_freezer();
        runtime.start_warm_pool();
        forward_freezes(&runtime, self.freezes.clone(), machine.clone());
        let m = Arc::new(Machine {
            home,
            runtime,
            groups,
        });
        machines.insert(machine.0.clone(), m.clone());
        Ok(m)
    }

    async fn detach(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.pages.forget_machine(&machine.0);
        let Some(m) = self.machines.lock().await.remove(&machine.0) else {
            return Ok(());
        };
        if let Err(e) = m.runtime.shutdown().await {
            // Keep it attached so a retry finds the reserved slots.
            self.machines.lock().await.insert(machine.0.clone(), m);
            return Err(e.into());
        }
        if let Some(groups) = &m.groups {
            groups.remove_machine();
        }
        Ok(())
    }

    /// The environment of the shell tool: nothing of the server's own.
    fn exec_env(home: &std::path::Path) -> Vec<(String, String)> {
        let mut env = minimal_env();
        let home = home.to_string_lossy().into_owned();
        env.push(("HOME".into(), home));
        env.push(("TERM".into(), "dumb".into()));
        env
    }
}

/// A short, stable directory name for a machine (12 hex characters of a SHA-256).
fn short_name(machine: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(machine.as_bytes())[..6])
}

#[async_trait]
impl SandboxProvider for DesktopProvider {
    fn describe(&self) -> Description {
        Description {
            kind: "desktop".into(),
            capabilities: Capabilities {
                multi_screen: true,
                terminal: false,
                page_browser: true,
                bills_while_running: false,
                mounted_home: true,
                desktop_freezing: self.groups.is_ok()
                    && self.config.limits.is_some_and(|l| l.freeze_after.is_some()),
                desktop_limits: self.groups.is_ok(),
            },
        }
    }

    async fn provision(&self, spec: &MachineSpec) -> ProviderResult<ProviderRef> {
        let home = self.home_of(&spec.home_key)?;
        std::fs::create_dir_all(&home).map_err(|e| ProviderError::Failed(format!("home: {e}")))?;
        let machine = ProviderRef(spec.home_key.clone());
        self.destroyed.lock().await.remove(&machine.0);
        self.machine(&machine).await?;
        Ok(machine)
    }

    async fn reconnect(&self, machine: &ProviderRef, spec: &MachineSpec) -> ProviderResult<()> {
        if machine.0 != spec.home_key {
            return Err(ProviderError::MachineGone);
        }
        self.machine(machine).await.map(|_| ())
    }

    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await
    }

    async fn recover(&self) -> ProviderResult<()> {
        let prefix = format!("{}/", self.config.run_root.to_string_lossy());
        let out = HostRunner::minimal()
            .run(
                &reap_script(&prefix, REAP_GRACE),
                REAP_GRACE + SCRIPT_TIMEOUT,
            )
            .await?;
        let found: u64 = out.stdout.trim().parse().unwrap_or(0);
        tracing::info!(processes = found, "desktop.leftovers.reaped");
        Ok(())
    }

    async fn shutdown(&self) -> ProviderResult<()> {
        let machines: Vec<String> = self.machines.lock().await.keys().cloned().collect();
        let stops = machines
            .into_iter()
            .map(|m| async move { (self.detach(&ProviderRef(m.clone())).await, m) });
        let mut failed = 0;
        for (result, machine) in futures_util::future::join_all(stops).await {
            if let Err(e) = result {
                failed += 1;
                tracing::warn!(machine = %short_name(&machine), error = %e, "desktop.shutdown_failed");
            }
        }
        // What a failed teardown left goes too: nothing of this server's desktops outlives it.
        if failed > 0 {
            let prefix = format!("{}/", self.config.run_root.to_string_lossy());
            HostRunner::minimal()
                .run(&sweep_script(&prefix), SCRIPT_TIMEOUT)
                .await?;
        }
        Ok(())
    }

    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.home_of(&machine.0)?;
        self.detach(machine).await?;
        self.destroyed.lock().await.insert(machine.0.clone());
        Ok(())
    }

    fn desktop_freezes(&self) -> Option<tokio::sync::broadcast::Receiver<DesktopFreeze>> {
        Some(self.freezes.subscribe())
    }

    async fn desktop_groups(&self) -> Option<Result<String, String>> {
        self.config.limits?;
        Some(
            self.groups
                .as_ref()
                .map(|v| format!("active (cgroup {})", v.as_str()))
                .map_err(Clone::clone),
        )
    }

    async fn warm_desktops(&self) -> Option<rakazo_actors::provider::WarmDesktops> {
        let target = self.config.warm_stacks;
        if target == 0 {
            return None;
        }
        let machines = self.machines.lock().await;
        Some(crate::desktop::warm::summary(
            target,
            machines.values().map(|m| m.runtime.warm_status()),
        ))
    }

    async fn open_screen(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        slot: u32,
    ) -> ProviderResult<ScreenInfo> {
        let m = self.machine(machine).await?;
        let screen = m.runtime.open_screen(bot_id, slot).await?;
        Ok(ScreenInfo { slot: screen.slot })
    }

    async fn open_route(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        policy: ScreenPolicy,
    ) -> ProviderResult<ScreenRoute> {
        let m = self.machine(machine).await?;
        Ok(m.runtime.route(bot_id, policy, None).await?)
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
            files::resolve(&m.home, target)?
                .to_string_lossy()
                .into_owned()
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
        m.runtime.wake_browser(bot_id).await?;
        let key = format!("{}/{bot_id}", machine.0);
        let connect = || super::cdp::Cdp::connect(&m.home, bot_id);
        let home = m.runtime.workspace();
        self.pages.run(key, home, connect, command).await
    }

    async fn close_route(&self, machine: &ProviderRef, token: &str) -> ProviderResult<()> {
        Ok(self.machine(machine).await?.runtime.revoke(token).await?)
    }

    async fn close_screen(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<()> {
        Ok(self
            .machine(machine)
            .await?
            .runtime
            .close_screen(bot_id)
            .await?)
    }

    async fn observe_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        size: FrameSize,
    ) -> ProviderResult<Frame> {
        Ok(self
            .machine(machine)
            .await?
            .runtime
            .observe_sized(bot_id, size)
            .await?
            .frame)
    }

    async fn act_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        actions: &[Action],
        size: FrameSize,
    ) -> ProviderResult<ActOutcome> {
        let m = self.machine(machine).await?;
        Ok(m.runtime.act_sized(bot_id, actions, size).await?.into())
    }

    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        let m = self.machine(machine).await?;
        let home = m.home.clone();
        let cwd_rel = request.cwd.clone();
        let cwd = blocking(move || files::resolve(&home, &cwd_rel)).await?;
        if !cwd.is_dir() {
            return Err(ProviderError::NotFound(
                request.cwd.chars().take(200).collect(),
            ));
        }
        let runner = HostRunner::new(Self::exec_env(&m.home), cwd.clone());
        let script = format!("exec bash -lc {}", shell_quote(&request.command));
        Ok(runner
            .run_in(&script, &cwd, &request.env, request.timeout)
            .await?)
    }

    async fn list_files(
        &self,
        machine: &ProviderRef,
        path: &str,
    ) -> ProviderResult<Vec<FileEntry>> {
        let home = self.machine(machine).await?.home.clone();
        let path = path.to_string();
        blocking(move || files::list(&home, &path)).await
    }

    async fn list_files_first(
        &self,
        machine: &ProviderRef,
        path: &str,
        range: &ListingRange,
    ) -> ProviderResult<ListingPage> {
        let home = self.machine(machine).await?.home.clone();
        let (path, range) = (path.to_string(), range.clone());
        blocking(move || files::list_first(&home, &path, &range)).await
    }

    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>> {
        let home = self.machine(machine).await?.home.clone();
        let path = path.to_string();
        blocking(move || files::read(&home, &path)).await
    }

    async fn read_file_within(
        &self,
        machine: &ProviderRef,
        path: &str,
        max: u64,
    ) -> ProviderResult<Vec<u8>> {
        let home = self.machine(machine).await?.home.clone();
        let path = path.to_string();
        blocking(move || files::read_within(&home, &path, max)).await
    }

    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()> {
        let home = self.machine(machine).await?.home.clone();
        let (path, data) = (path.to_string(), data.to_vec());
        blocking(move || files::write(&home, &path, &data, None)).await
    }

    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport> {
        let m = self.machine(machine).await?;
        files::export_consistent(&m.runtime, m.home.clone(), since).await
    }

    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        // Browsers hold files of the old workspace open: a replaced workspace starts fresh.
        m.runtime.shutdown().await?;
        let (home, archive) = (m.home.clone(), archive.to_vec());
        blocking(move || files::import(&home, &archive)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(env: &str, dir: &std::path::Path) -> DesktopProviderConfig {
        DesktopProviderConfig {
            homes_root: dir.join("homes"),
            run_root: dir.join("run"),
            screen_limit: 0,
            first_display: 1,
            environment: env.into(),
            limits: None,
            warm_stacks: 0,
            start_nice: 0,
        }
    }

    #[test]
    fn refuses_to_start_outside_development_and_test() {
        let dir = tempfile::tempdir().unwrap();
        for env in ["production", "", "Development"] {
            assert!(matches!(
                DesktopProvider::new(config(env, dir.path())),
                Err(ProviderError::Unsupported(_))
            ));
        }
        assert!(DesktopProvider::new(config("test", dir.path())).is_ok());
    }

    #[tokio::test]
    async fn exec_runs_in_the_home_without_server_secrets() {
        let dir = tempfile::tempdir().unwrap();
        let provider = DesktopProvider::new(config("test", dir.path())).unwrap();
        let spec = MachineSpec {
            computer_id: "c".into(),
            space_id: "s".into(),
            bot_id: None,
            home_key: "team-s".into(),
        };
        let machine = provider.provision(&spec).await.unwrap();
        provider
            .write_file(&machine, "bots/b/x.txt", b"hello")
            .await
            .unwrap();
        // A variable the test process certainly has (CARGO) must not reach the command.
        let request = ExecRequest {
            command: "pwd; cat x.txt; echo \"[${CARGO:-}]\"; echo \"$EXTRA\"".into(),
            cwd: "bots/b".into(),
            env: vec![("EXTRA".into(), "given".into())],
            timeout: std::time::Duration::from_secs(10),
        };
        let out = provider.exec(&machine, &request).await.unwrap();
        let home = dir.path().join("homes/team-s/bots/b");
        assert_eq!(out.exit_code, 0, "{out:?}");
        assert_eq!(out.stdout, format!("{}\nhello[]\ngiven\n", home.display()));
        let escape = ExecRequest {
            cwd: "../".into(),
            ..request
        };
        assert!(matches!(
            provider.exec(&machine, &escape).await,
            Err(ProviderError::PathRejected(_))
        ));
    }
}
