//! The `kubernetes` provider (`SANDBOX_PROVIDER=kubernetes`): each computer is one pod of the
//! computer image in `KUBERNETES_NAMESPACE`, created and reached with kube-rs; no supervisor
//! and no Docker socket.
//!
//! - [`pod`]: the pod (uid 1000, no service account token, no service links, labels,
//!   resources from configuration).
//! - [`exec`]: scripts and streamed transfers through `pods/exec`.
//!
//! How the pieces reach the pod:
//! - commands and the desktop runtime's scripts: the pod's exec agent over one `pods/exec`
//!   held open ([`crate::exec_agent`]), or where none runs (no `python3` in the image) a
//!   `pods/exec` each with the supervisor's exec wrapper (deadline, process group, capped
//!   output);
//! - files: an in-pod helper (`pod_files.py`, sent with every call) that walks the home one
//!   name at a time without following links;
//! - workspace save and restore: one tar stream through `pods/exec` each way; stopping a
//!   computer saves its home to `DATA_DIR/run/kubernetes/<pod>.tar` on this host (streamed,
//!   never whole in memory) and deletes the pod, and reconnecting creates the pod again and
//!   streams the home back;
//! - screens: through commands (capture helper, xdotool), and for people the image's desktop
//!   gateway on the pod IP (port 6080), reached by this process only and behind the screen
//!   proxy's sealed capabilities.
//!
//! Pods are ephemeral: a pod that is gone (deleted, evicted) is `MachineGone`, and the
//! computer actor replaces it with a fresh pod and the last checkpoint.
//!
//! Mounted homes (`KUBERNETES_SANDBOX_HOME_CLAIM`): new pods mount `homes/<home key>` of the
//! claim that holds `DATA_DIR` at the workspace, so the home is never copied: this process
//! reads and writes it as `DATA_DIR/homes/<home key>` (beneath a held handle, never following
//! a link), as the docker provider does, and a stopped computer's next pod finds it there. A
//! pod created before the claim was configured keeps copying until it is stopped; its stashed
//! home is then streamed into the mounted one by its next pod.

pub mod exec;
pub mod pod;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rakazo_actors::provider::{
    ActOutcome, Action, BrowserCommand, Capabilities, Description, ExecOutput, ExecRequest,
    FileEntry, Frame, FrameSize, ListingPage, ListingRange, MachineSpec, ProviderError,
    ProviderRef, ProviderResult, SandboxProvider, ScreenInfo, ScreenPolicy, ScreenRoute, Skipped,
    WorkspaceExport,
};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Mutex, OnceCell};

use crate::config::KubernetesSettings;
use crate::desktop::command::minimal_env;
use crate::desktop::files::{self as host_files, blocking};
use crate::desktop::gateway_stream;
use crate::desktop::page::PageSessions;
use crate::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use crate::desktop::shell_quote;
use crate::desktop::terminal::ShellSpec;
use crate::providers::workspace_path::{is_web_url, segments};
use crate::stores::archive::{self, TRANSIENT};
use crate::supervisor::engine::{GATEWAY_PORT, UID, WORKSPACE, chown_tree};
use exec::{PodExec, PodRunner, provider_error};

/// Inside every computer: logs, the window manager's home and the gateway's sockets.
pub const RUN_DIR: &str = "/tmp/rakazo-run";

/// The in-pod file helper.
const POD_FILES: &str = include_str!("pod_files.py");

/// The annotation naming the home a pod holds.
const HOME_ANNOTATION: &str = "rakazo.dev/home-key";

/// How long a new pod may take to run.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Deadline of a file call.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a whole home's export may stream (it is as large as the home).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How the provider is set up.
#[derive(Clone, Debug)]
pub struct KubernetesProviderConfig {
    /// `KUBERNETES_*`.
    pub settings: KubernetesSettings,
    /// A kubeconfig file to use; `None`: `KUBECONFIG`, `~/.kube/config` or the in-cluster
    /// service account, in kube-rs's order.
    pub kubeconfig: Option<PathBuf>,
    /// Where homes of stopped computers wait for their next pod (`DATA_DIR/run/kubernetes`).
    pub stash_dir: PathBuf,
    /// `SANDBOX_TEAM_SCREEN_LIMIT` (0 = none).
    pub screen_limit: usize,
    /// `DATA_DIR/homes`: where this process finds the homes pods mount from the claim
    /// (`settings.home_claim`).
    pub homes_root: PathBuf,
    /// `SANDBOX_DESKTOP_WARM_STACKS`: spare display stacks per computer.
    pub warm_stacks: usize,
}

struct Machine {
    exec: PodExec,
    ip: String,
    runtime: Arc<DesktopRuntime>,
    /// The home on this host when the pod mounts it from the claim (`None`: copied).
    home: Option<PathBuf>,
    /// The page tools' DevTools connections to the pod's browsers (through its gateway).
    pages: PageSessions,
}

/// What this process needs of a running pod.
struct RunningPod {
    ip: String,
    home_key: String,
    mounted: bool,
}

/// The `kubernetes` provider.
pub struct KubernetesProvider {
    config: KubernetesProviderConfig,
    client: OnceCell<kube::Client>,
    machines: Mutex<HashMap<String, Arc<Machine>>>,
}

fn kube_setup(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Failed(format!("Kubernetes client setup: {e}"))
}

impl KubernetesProvider {
    /// A provider; the cluster is first reached on first use.
    pub fn new(config: KubernetesProviderConfig) -> Self {
        Self {
            config,
            client: OnceCell::new(),
            machines: Mutex::new(HashMap::new()),
        }
    }

    async fn client(&self) -> ProviderResult<kube::Client> {
        self.client
            .get_or_try_init(|| async {
                let config = match &self.config.kubeconfig {
                    Some(path) => {
                        let file = kube::config::Kubeconfig::read_from(path).map_err(kube_setup)?;
                        kube::Config::from_custom_kubeconfig(file, &Default::default())
                            .await
                            .map_err(kube_setup)?
                    }
                    None => kube::Config::infer().await.map_err(kube_setup)?,
                };
                kube::Client::try_from(config).map_err(kube_setup)
            })
            .await
            .cloned()
    }

    async fn api(&self) -> ProviderResult<Api<Pod>> {
        Ok(Api::namespaced(
            self.client().await?,
            &self.config.settings.namespace,
        ))
    }

    async fn pod_exec(&self, name: &str) -> ProviderResult<PodExec> {
        Ok(PodExec::new(self.api().await?, name))
    }

    fn stash(&self, name: &str) -> PathBuf {
        self.config.stash_dir.join(format!("{name}.tar"))
    }

    /// The home of `home_key` on this host, for a pod that mounts it.
    fn host_home(&self, home_key: &str) -> ProviderResult<PathBuf> {
        pod::home_sub_path(home_key)
            .map(|_| self.config.homes_root.join(home_key))
            .ok_or_else(|| ProviderError::Failed("the home key is not a plain name".into()))
    }

    fn attach(&self, exec: PodExec, ip: String, home: Option<PathBuf>) -> Arc<Machine> {
        exec.start_agent_soon();
        let config = RuntimeConfig {
            workspace: PathBuf::from(WORKSPACE),
            run_dir: PathBuf::from(RUN_DIR),
            screen_limit: self.config.screen_limit,
            displays: DisplayPool::new(1),
            gateway_port: GATEWAY_PORT,
            settle: Settle::default(),
            x11_socket_dir: None,
            commands_only: true,
            gateway_host: "0.0.0.0".into(),
            groups: None,
            freeze_after: None,
            warm_stacks: self.config.warm_stacks,
        };
        let runtime = Arc::new(DesktopRuntime::new(
            Arc::new(PodRunner(exec.clone())),
            config,
        ));
        runtime.start_warm_pool();
        Arc::new(Machine {
            exec,
            ip,
            runtime,
            home,
            pages: PageSessions::default(),
        })
    }

    /// Creates the pod `name` for `spec` and waits until it runs; the machine attached to it.
    /// With a home claim, the pod mounts the home, made ready first on this host.
    async fn create_pod(&self, name: &str, spec: &MachineSpec) -> ProviderResult<Arc<Machine>> {
        let api = self.api().await?;
        let mounted = match &self.config.settings.home_claim {
            Some(claim) => {
                let home = self.host_home(&spec.home_key)?;
                let dir = home.clone();
                blocking(move || {
                    std::fs::create_dir_all(&dir)
                        .and_then(|()| chown_tree(&dir))
                        .map_err(|e| ProviderError::Failed(format!("home: {}", e.kind())))
                })
                .await?;
                let sub_path = pod::home_sub_path(&spec.home_key).unwrap_or_default();
                Some((claim, sub_path, home))
            }
            None => None,
        };
        let mut pod = pod::computer_pod(
            name,
            spec,
            &self.config.settings,
            mounted.as_ref().map(|(c, sub, _)| (*c, sub.clone())),
        );
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(HOME_ANNOTATION.into(), spec.home_key.clone());
        api.create(&PostParams::default(), &pod)
            .await
            .map_err(provider_error)?;
        match self.wait_running(&api, name).await {
            Ok(ip) => Ok(self.attach(
                self.pod_exec(name).await?,
                ip,
                mounted.map(|(_, _, home)| home),
            )),
            Err(e) => {
                let _ = api.delete(name, &DeleteParams::default()).await;
                Err(e)
            }
        }
    }

    /// Polls the pod (the role grants `get`, not `watch`) until it runs with an IP.
    async fn wait_running(&self, api: &Api<Pod>, name: &str) -> ProviderResult<String> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let pod = api.get_opt(name).await.map_err(provider_error)?;
            let Some(pod) = pod else {
                return Err(ProviderError::MachineGone);
            };
            let status = pod.status.unwrap_or_default();
            match status.phase.as_deref() {
                Some("Running") => {
                    if let Some(ip) = status.pod_ip.filter(|ip| !ip.is_empty()) {
                        return Ok(ip);
                    }
                }
                Some("Failed") | Some("Succeeded") => {
                    return Err(ProviderError::Failed(
                        "the computer pod ended as it started".into(),
                    ));
                }
                _ => {}
            }
            let waiting = status
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.state?.waiting?.reason)
                .find(|r| {
                    matches!(
                        r.as_str(),
                        "ErrImagePull"
                            | "ImagePullBackOff"
                            | "InvalidImageName"
                            | "CreateContainerError"
                            | "CreateContainerConfigError"
                            | "RunContainerError"
                    )
                });
            if let Some(reason) = waiting {
                return Err(ProviderError::Failed(format!(
                    "the computer pod cannot start: {reason}"
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::Failed(
                    "the computer pod did not start in time".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The running pod behind `machine`, or `MachineGone`.
    async fn running_pod(&self, name: &str) -> ProviderResult<RunningPod> {
        let pod = self
            .api()
            .await?
            .get_opt(name)
            .await
            .map_err(provider_error)?
            .ok_or(ProviderError::MachineGone)?;
        let home = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOME_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(ProviderError::MachineGone);
        }
        let mounted = pod::mounts_home(&pod);
        let status = pod.status.unwrap_or_default();
        match (status.phase.as_deref(), status.pod_ip) {
            (Some("Running"), Some(ip)) if !ip.is_empty() => Ok(RunningPod {
                ip,
                home_key: home,
                mounted,
            }),
            _ => Err(ProviderError::MachineGone),
        }
    }

    /// The machine behind `machine`, attaching to its pod if this process has not yet.
    async fn machine(&self, machine: &ProviderRef) -> ProviderResult<Arc<Machine>> {
        if let Some(m) = self.machines.lock().await.get(&machine.0) {
            return Ok(m.clone());
        }
        let running = self.running_pod(&machine.0).await?;
        let exec = self.pod_exec(&machine.0).await?;
        let home = self.attached_home(&running)?;
        let mut machines = self.machines.lock().await;
        Ok(machines
            .entry(machine.0.clone())
            .or_insert_with(|| self.attach(exec, running.ip, home))
            .clone())
    }

    /// The home on this host of a pod that mounts it.
    fn attached_home(&self, running: &RunningPod) -> ProviderResult<Option<PathBuf>> {
        if running.mounted {
            self.host_home(&running.home_key).map(Some)
        } else {
            Ok(None)
        }
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

    /// A failed call on a pod that is gone (or no longer running) is `MachineGone`; the stale
    /// machine is forgotten so that the next call looks again.
    async fn classify(&self, machine: &ProviderRef, err: ProviderError) -> ProviderError {
        let gone = match &err {
            ProviderError::MachineGone => true,
            ProviderError::Failed(_) => matches!(
                self.running_pod(&machine.0).await,
                Err(ProviderError::MachineGone)
            ),
            _ => false,
        };
        if gone {
            self.machines.lock().await.remove(&machine.0);
            tracing::info!("kubernetes.computer.gone");
            ProviderError::MachineGone
        } else {
            err
        }
    }

    async fn detach(&self, machine: &ProviderRef) {
        let m = self.machines.lock().await.remove(&machine.0);
        if let Some(m) = m
            && let Err(e) = m.runtime.shutdown().await
        {
            tracing::warn!(error = %e, "kubernetes.screens.shutdown_failed");
        }
    }

    /// The pod's IP as this process reaches it (the screen gateway listens there on 6080).
    pub async fn pod_ip(&self, machine: &ProviderRef) -> ProviderResult<String> {
        Ok(self.machine(machine).await?.ip.clone())
    }

    /// The pod helper's listing of the folder `rel`: whole, or the page `range` names, how
    /// many entries it holds and where the next page starts (the helper then looks at only the
    /// page's entries).
    async fn pod_listing(
        &self,
        machine: &ProviderRef,
        m: &Machine,
        rel: &str,
        range: Option<&ListingRange>,
    ) -> ProviderResult<ListingPage> {
        let mut out = exec::CappedWriter::with_cap(super::MAX_LISTING);
        let args = match range {
            Some(r) => vec![r.first.to_string(), r.from.clone()],
            None => Vec::new(),
        };
        let listed = self
            .files_within(m, "list", rel, &args, None, &mut out)
            .await;
        if let Err(e) = listed {
            return Err(self.classify(machine, e).await);
        }
        if out.full() {
            return Err(ProviderError::TooLarge(super::LISTING_TOO_LARGE.into()));
        }
        let bad = || ProviderError::Failed("the computer's file listing is malformed".into());
        let (mut entries, mut total, mut next) = (Vec::new(), None, None);
        for line in out.0.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).map_err(|_| bad())?;
            if let Some(n) = v["total"].as_u64() {
                total = Some(n as usize);
                next = v["next"].as_str().map(str::to_owned);
                continue;
            }
            let field = |k: &str| v[k].as_str().map(str::to_owned).ok_or_else(bad);
            let kind = field("kind")?;
            if !["dir", "file", "link", "other"].contains(&kind.as_str()) {
                return Err(bad());
            }
            let name = field("name")?;
            let path = field("path")?;
            // Whatever the pod says, a name stays one name below the listed folder.
            segments(&path, false).map_err(|_| bad())?;
            let expected = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if name.contains('/') || path != expected {
                return Err(bad());
            }
            entries.push(FileEntry {
                name,
                path,
                kind,
                size: v["size"].as_u64().unwrap_or(0),
            });
        }
        let total = match (range, total) {
            (None, _) => entries.len(),
            (Some(r), Some(total)) if r.holds(&entries, next.as_deref(), total) => total,
            _ => return Err(bad()),
        };
        Ok(ListingPage {
            entries,
            total,
            next,
        })
    }

    /// Runs the in-pod file helper.
    async fn files(
        &self,
        m: &Machine,
        op: &str,
        path: &str,
        input: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        output: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> ProviderResult<()> {
        self.files_within(m, op, path, &[], input, output).await
    }

    /// [`Self::files`] with the helper's bounds (`args`): a read's most bytes (a larger file
    /// is refused with `TooLarge`, read no further), a listing page's size and first name.
    async fn files_within(
        &self,
        m: &Machine,
        op: &str,
        path: &str,
        args: &[String],
        input: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        output: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> ProviderResult<()> {
        let argv = vec![
            "python3".to_string(),
            "-I".into(),
            "-c".into(),
            POD_FILES.into(),
            op.into(),
            path.into(),
            TRANSIENT.join("\n"),
        ];
        let argv = [argv, args.to_vec()].concat();
        let timeout = if op == "export" {
            EXPORT_TIMEOUT
        } else {
            FILE_TIMEOUT
        };
        let ended = tokio::time::timeout(timeout, m.exec.stream(argv, input, output))
            .await
            .map_err(|_| ProviderError::Failed(format!("file {op}: timed out")))??;
        match ended.exit_code {
            0 => Ok(()),
            3 => Err(ProviderError::PathRejected(
                "the path is a link, a special file or a file with several names".into(),
            )),
            4 => Err(ProviderError::NotFound(path.chars().take(200).collect())),
            5 => Err(ProviderError::TooLarge(format!("{op}: past its bound"))),
            code => Err(ProviderError::Failed(format!(
                "file {op} ended with {code}: {}",
                ended
                    .stderr
                    .lines()
                    .last()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
        }
    }

    /// Streams the computer's home, as one tar of its directories and regular files, into
    /// `out`; no more than a transfer buffer of it is in this process at once.
    pub async fn save_home(
        &self,
        machine: &ProviderRef,
        out: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        let max = archive::Limits::default().max_archive_bytes();
        let mut bounded = exec::Bounded::new(out, max);
        let saved = m
            .runtime
            .with_browser_state_saved(self.files(&m, "export", "", None, &mut bounded))
            .await?;
        match saved {
            Ok(()) => Ok(()),
            Err(_) if bounded.over => Err(ProviderError::ArchiveRejected(format!(
                "the computer sent more than {max} bytes"
            ))),
            Err(e) => Err(self.classify(machine, e).await),
        }
    }

    /// Replaces the computer's home with the tar archive read from `input`, streamed.
    pub async fn restore_home(
        &self,
        machine: &ProviderRef,
        input: &mut (dyn AsyncRead + Unpin + Send),
    ) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        // Browsers hold files of the old workspace open: a replaced workspace starts fresh.
        m.runtime.shutdown().await?;
        let script = format!(
            "set -e\npython3 -I -c \"$1\" clear '' \ncd {home}\nexec tar -x --no-same-owner --no-same-permissions -f -",
            home = shell_quote(WORKSPACE)
        );
        let argv = vec![
            "bash".to_string(),
            "-c".into(),
            script,
            "rakazo-restore".into(),
            POD_FILES.into(),
        ];
        let ended = match m
            .exec
            .stream(argv, Some(input), &mut tokio::io::sink())
            .await
        {
            Ok(ended) => ended,
            Err(e) => return Err(self.classify(machine, e).await),
        };
        if ended.exit_code != 0 {
            return Err(ProviderError::Failed(format!(
                "restore ended with {}: {}",
                ended.exit_code,
                ended
                    .stderr
                    .lines()
                    .last()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            )));
        }
        Ok(())
    }

    /// The environment of the workspace user's shells: nothing of the server's own.
    fn shell_env(term: &str) -> Vec<(String, String)> {
        let mut env = minimal_env();
        env.push(("HOME".into(), WORKSPACE.into()));
        env.push(("SHELL".into(), "/bin/bash".into()));
        env.push(("TERM".into(), term.into()));
        env
    }

    fn in_workspace(path: &str, allow_root: bool) -> ProviderResult<String> {
        let segs = segments(path, allow_root)?;
        Ok(std::iter::once(WORKSPACE.to_owned())
            .chain(segs)
            .collect::<Vec<_>>()
            .join("/"))
    }

    fn upstream(ip: &str, route: ScreenRoute) -> ScreenRoute {
        ScreenRoute {
            upstream: format!("http://{ip}:{GATEWAY_PORT}"),
            token: route.token,
        }
    }
}

#[async_trait]
impl SandboxProvider for KubernetesProvider {
    async fn health(&self) -> Result<(), String> {
        let client = self
            .client()
            .await
            .map_err(|_| "the Kubernetes client cannot be set up".to_owned())?;
        client
            .apiserver_version()
            .await
            .map(drop)
            .map_err(|_| "the Kubernetes API does not answer".to_owned())
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

    fn describe(&self) -> Description {
        Description {
            kind: "kubernetes".into(),
            capabilities: Capabilities {
                multi_screen: true,
                terminal: true,
                page_browser: true,
                bills_while_running: false,
                mounted_home: self.config.settings.home_claim.is_some(),
                desktop_freezing: false,
                desktop_limits: false,
            },
        }
    }

    async fn provision(&self, spec: &MachineSpec) -> ProviderResult<ProviderRef> {
        let name = pod::pod_name(&spec.computer_id);
        let m = self.create_pod(&name, spec).await?;
        tracing::info!(
            computer.id = %spec.computer_id,
            mounted = m.home.is_some(),
            "kubernetes.computer.provisioned"
        );
        self.machines.lock().await.insert(name.clone(), m);
        Ok(ProviderRef(name))
    }

    async fn reconnect(&self, machine: &ProviderRef, spec: &MachineSpec) -> ProviderResult<()> {
        match self.running_pod(&machine.0).await {
            Ok(running) => {
                if running.home_key != spec.home_key {
                    return Err(ProviderError::MachineGone);
                }
                let home = self.attached_home(&running)?;
                let exec = self.pod_exec(&machine.0).await?;
                let mut machines = self.machines.lock().await;
                if !machines.contains_key(&machine.0) {
                    let m = self.attach(exec, running.ip, home);
                    machines.insert(machine.0.clone(), m);
                }
                return Ok(());
            }
            Err(ProviderError::MachineGone) => {}
            Err(e) => return Err(e),
        }
        self.machines.lock().await.remove(&machine.0);
        // A stopped computer: a new pod of the same name, and the home it had: the mounted
        // one, and over it what a copying pod stashed when it stopped.
        let stash = self.stash(&machine.0);
        let file = tokio::fs::File::open(&stash).await.ok();
        let mounted = self.config.settings.home_claim.is_some();
        if file.is_none() && !mounted {
            return Err(ProviderError::MachineGone);
        }
        // The old pod may still be going away.
        let api = self.api().await?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while api
            .get_opt(&machine.0)
            .await
            .map_err(provider_error)?
            .is_some()
        {
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::Failed("the old pod does not go away".into()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let m = self.create_pod(&machine.0, spec).await?;
        self.machines.lock().await.insert(machine.0.clone(), m);
        if let Some(mut file) = file {
            self.restore_home(machine, &mut file).await?;
            let _ = tokio::fs::remove_file(&stash).await;
        }
        tracing::info!(
            computer.id = %spec.computer_id,
            mounted,
            "kubernetes.computer.resumed"
        );
        Ok(())
    }

    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()> {
        // A pod that mounts its home leaves it where it is; a copying pod stashes it.
        if self
            .running_pod(&machine.0)
            .await
            .is_ok_and(|running| !running.mounted)
        {
            // The home waits on this host for the next pod; streamed to a file, then renamed.
            tokio::fs::create_dir_all(&self.config.stash_dir)
                .await
                .map_err(|e| ProviderError::Failed(format!("stash: {}", e.kind())))?;
            let stash = self.stash(&machine.0);
            let partial = stash.with_extension("partial");
            let mut file = tokio::fs::File::create(&partial)
                .await
                .map_err(|e| ProviderError::Failed(format!("stash: {}", e.kind())))?;
            let saved = self.save_home(machine, &mut file).await;
            drop(file);
            match saved {
                Ok(()) => tokio::fs::rename(&partial, &stash)
                    .await
                    .map_err(|e| ProviderError::Failed(format!("stash: {}", e.kind())))?,
                Err(e) => {
                    let _ = tokio::fs::remove_file(&partial).await;
                    if e != ProviderError::MachineGone {
                        return Err(e);
                    }
                }
            }
        }
        self.detach(machine).await;
        match self
            .api()
            .await?
            .delete(&machine.0, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match provider_error(e) {
                ProviderError::MachineGone => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.detach(machine).await;
        let _ = tokio::fs::remove_file(self.stash(&machine.0)).await;
        match self
            .api()
            .await?
            .delete(&machine.0, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match provider_error(e) {
                ProviderError::MachineGone => Ok(()),
                other => Err(other),
            },
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
        // Through the pod's gateway, as its screens are reached.
        let connect = || {
            let reach = |route| Self::upstream(&m.ip, route);
            gateway_stream::devtools(&m.runtime, bot_id, Some(GATEWAY_PORT), reach)
        };
        let home = m.runtime.workspace();
        m.pages.run(bot_id.to_owned(), home, connect, command).await
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

    async fn open_route(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        policy: ScreenPolicy,
    ) -> ProviderResult<ScreenRoute> {
        self.on(machine, |m| async move {
            let route = m.runtime.route(bot_id, policy, Some(GATEWAY_PORT)).await?;
            Ok(Self::upstream(&m.ip, route))
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
            let Some(control) = control else {
                return Err(ProviderError::Unsupported(
                    "the terminal needs a control route".into(),
                ));
            };
            let shell = ShellSpec {
                cwd: WORKSPACE.into(),
                env: Self::shell_env("xterm-256color"),
            };
            let route = m
                .runtime
                .terminal_route(&control.token, &shell, Some(GATEWAY_PORT));
            Ok(Self::upstream(&m.ip, route.await?))
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
        let target = if is_web_url(target) {
            target.to_owned()
        } else {
            Self::in_workspace(target, false)?
        };
        Ok(m.runtime.open_in_browser(bot_id, &target).await?)
    }

    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        let cwd = Self::in_workspace(&request.cwd, true)?;
        let mut env = Self::shell_env("dumb");
        env.extend(request.env.iter().cloned());
        let script = format!("exec bash -lc {}", shell_quote(&request.command));
        self.on(machine, |m| async move {
            m.exec.script(&script, &cwd, &env, request.timeout).await
        })
        .await
    }

    async fn list_files(
        &self,
        machine: &ProviderRef,
        path: &str,
    ) -> ProviderResult<Vec<FileEntry>> {
        let rel = segments(path, true)?.join("/");
        let m = self.machine(machine).await?;
        if let Some(home) = m.home.clone() {
            return blocking(move || host_files::list(&home, &rel)).await;
        }
        Ok(self.pod_listing(machine, &m, &rel, None).await?.entries)
    }

    async fn list_files_first(
        &self,
        machine: &ProviderRef,
        path: &str,
        range: &ListingRange,
    ) -> ProviderResult<ListingPage> {
        let m = self.machine(machine).await?;
        let rel = segments(path, true)?.join("/");
        if let Some(home) = m.home.clone() {
            let range = range.clone();
            return blocking(move || host_files::list_first(&home, &rel, &range)).await;
        }
        self.pod_listing(machine, &m, &rel, Some(range)).await
    }

    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>> {
        self.read_file_within(machine, path, host_files::MAX_READ_BYTES)
            .await
    }

    async fn read_file_within(
        &self,
        machine: &ProviderRef,
        path: &str,
        max: u64,
    ) -> ProviderResult<Vec<u8>> {
        let rel = segments(path, false)?.join("/");
        let max = max.min(host_files::MAX_READ_BYTES);
        let m = self.machine(machine).await?;
        if let Some(home) = m.home.clone() {
            return blocking(move || host_files::read_within(&home, &rel, max)).await;
        }
        let mut out = exec::CappedWriter::with_cap(max as usize + 1);
        match self
            .files_within(&m, "read", &rel, &[max.to_string()], None, &mut out)
            .await
        {
            Ok(()) if out.0.len() as u64 > max => Err(ProviderError::file_too_large(&rel, max)),
            Ok(()) => Ok(out.0),
            Err(ProviderError::TooLarge(_)) => Err(ProviderError::file_too_large(&rel, max)),
            Err(e) => Err(self.classify(machine, e).await),
        }
    }

    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()> {
        let rel = segments(path, false)?.join("/");
        let m = self.machine(machine).await?;
        if let Some(home) = m.home.clone() {
            let data = data.to_vec();
            return blocking(move || host_files::write(&home, &rel, &data, Some(UID))).await;
        }
        let mut input = data;
        match self
            .files(&m, "write", &rel, Some(&mut input), &mut tokio::io::sink())
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err(self.classify(machine, e).await),
        }
    }

    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport> {
        let m = self.machine(machine).await?;
        if let Some(home) = &m.home {
            return host_files::export_consistent(&m.runtime, home.clone(), since).await;
        }
        let mut archive = Vec::new();
        self.save_home(machine, &mut archive).await?;
        // What the computer sent is checked against every restore rule before it is kept.
        archive::check(&archive, archive::Limits::default())
            .map_err(|e| ProviderError::ArchiveRejected(e.to_string()))?;
        // The pod packs names in order with their times: the same home is the same archive.
        let fingerprint = hex::encode(sha2::Sha256::digest(&archive));
        if since == Some(fingerprint.as_str()) {
            return Ok(WorkspaceExport::Unchanged);
        }
        Ok(WorkspaceExport::Archive {
            workspace: archive.into(),
            fingerprint: Some(fingerprint),
            skipped: Vec::new(),
        })
    }

    async fn streams_workspace(&self, machine: &ProviderRef) -> bool {
        // A copied home comes out of the pod as one tar stream; a mounted one is read here.
        self.machine(machine).await.is_ok_and(|m| m.home.is_none())
    }

    async fn export_workspace_to(
        &self,
        machine: &ProviderRef,
        out: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> ProviderResult<Vec<Skipped>> {
        let m = self.machine(machine).await?;
        if m.home.is_some() {
            let archive = self.export_workspace(machine).await?;
            tokio::io::AsyncWriteExt::write_all(out, &archive)
                .await
                .map_err(|e| ProviderError::Failed(format!("transfer: {}", e.kind())))?;
            return Ok(Vec::new());
        }
        self.save_home(machine, out).await?;
        Ok(Vec::new())
    }

    async fn import_workspace_from(
        &self,
        machine: &ProviderRef,
        input: &mut (dyn AsyncRead + Unpin + Send),
    ) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        if m.home.is_some() {
            let mut archive = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(input, &mut archive)
                .await
                .map_err(|e| ProviderError::Failed(format!("transfer: {e}")))?;
            return self.import_workspace(machine, &archive).await;
        }
        self.restore_home(machine, input).await
    }

    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()> {
        let m = self.machine(machine).await?;
        if let Some(home) = m.home.clone() {
            // Browsers hold files of the old workspace open: a replaced workspace starts fresh.
            m.runtime.shutdown().await?;
            let archive = archive.to_vec();
            return blocking(move || {
                host_files::import(&home, &archive)?;
                if let Err(e) = chown_tree(&home) {
                    tracing::debug!(error = %e.kind(), "kubernetes.files.chown_skipped");
                }
                Ok(())
            })
            .await;
        }
        let mut input = archive;
        self.restore_home(machine, &mut input).await
    }
}
