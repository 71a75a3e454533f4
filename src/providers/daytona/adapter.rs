//! The `daytona` adapter of the shared remote provider ([`RemoteSandboxes`]): sandboxes
//! through Daytona's API, commands and files through the sandbox's toolbox, the screen
//! gateway through the port's preview URL with its token header.
//!
//! Lifecycle: create waits for `started`; connect starts a `stopped` or `archived` sandbox
//! and waits; a sandbox the API cannot bring back (destroyed, a failed build, an error that
//! is not recoverable) is `MachineGone`, so the computer is replaced and its checkpoint
//! restored. The auto-stop interval follows our idle setting and is set again as the TTL
//! refresh while the computer is used. Stop stops (Daytona archives later on its own).
//!
//! Commands: the toolbox runs a command line and answers stdout and stderr together, so the
//! script's stderr goes to a file that is sent back after a per-call marker; past the
//! deadline the daemon kills the command and answers 408 (`timed_out`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use rakazo_actors::provider::{ExecOutput, MachineSpec, ProviderError, ProviderResult};

use super::client::{DaytonaClient, Executed};
use super::wire::{CreateSandbox, PREVIEW_TOKEN_HEADER, PreviewUrl, Sandbox, State};
use crate::desktop::shell_quote;
use crate::providers::remote::{Layout, PortEndpoint, RemoteCommand, RemoteSandboxes};
use crate::supervisor::engine::GATEWAY_PORT;

/// The workspace on Daytona machines (under the `daytona` user's home).
pub const WORKSPACE: &str = "/home/daytona/rakazo-home";
/// The runtime's private directory.
pub const RUN_DIR: &str = "/tmp/rakazo-run";
/// How long a sandbox may take to reach `started` or `stopped`.
const SETTLE: Duration = Duration::from_secs(300);

/// How the adapter is set up.
#[derive(Clone)]
pub struct DaytonaConfig {
    /// `daytona` or `daytona-emulator`.
    pub kind: &'static str,
    /// `DAYTONA_API_URL` (with its `/api` prefix).
    pub api_url: String,
    /// `DAYTONA_API_KEY` (never logged).
    pub api_key: String,
    /// `DAYTONA_TARGET` (empty: the organization's default).
    pub target: String,
    /// `DAYTONA_SNAPSHOT` (empty: Daytona's default).
    pub snapshot: String,
    /// `SANDBOX_IDLE_MS`: the auto-stop interval is this (in minutes, rounded up) plus a margin.
    pub idle: Duration,
}

impl std::fmt::Debug for DaytonaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaytonaConfig")
            .field("kind", &self.kind)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// A connected sandbox.
#[derive(Clone)]
pub struct Session {
    id: String,
    sandbox: Sandbox,
    gateway: PreviewUrl,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The adapter.
pub struct Daytona {
    config: DaytonaConfig,
    client: DaytonaClient,
}

impl Daytona {
    /// An adapter for `config`.
    pub fn new(config: DaytonaConfig) -> ProviderResult<Self> {
        Ok(Self {
            client: DaytonaClient::new(&config.api_url, &config.api_key)?,
            config,
        })
    }

    /// The auto-stop interval in minutes: the idle setting, rounded up, plus five minutes,
    /// so Daytona never stops a computer our idle rule still keeps.
    pub fn auto_stop_minutes(&self) -> u64 {
        self.config.idle.as_secs().div_ceil(60) + 5
    }

    async fn session(&self, sandbox: Sandbox) -> ProviderResult<Session> {
        let gateway = self.client.preview_url(&sandbox.id, GATEWAY_PORT).await?;
        Ok(Session {
            id: sandbox.id.clone(),
            sandbox,
            gateway,
        })
    }

    /// The script that runs `script` with its stderr in a file, printed after `marker`.
    fn wrap(script: &str, marker: &str) -> String {
        format!(
            "e=$(mktemp) || exit 125\nbash -c {s} 2>\"$e\"\nc=$?\nprintf '\\n%s\\n' {m}\nbase64 -w0 \"$e\"\nrm -f \"$e\"\nexit $c",
            s = shell_quote(script),
            m = shell_quote(marker),
        )
    }

    /// Splits the toolbox's output into stdout and stderr at the last `marker`.
    fn unwrap(output: &str, marker: &str) -> (String, String) {
        let sep = format!("\n{marker}\n");
        match output.rfind(&sep) {
            Some(i) => {
                let err = base64::engine::general_purpose::STANDARD
                    .decode(output[i + sep.len()..].trim())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                (output[..i].to_string(), err)
            }
            None => (output.to_string(), String::new()),
        }
    }
}

#[async_trait]
impl RemoteSandboxes for Daytona {
    type Session = Session;

    fn kind(&self) -> &'static str {
        self.config.kind
    }

    fn layout(&self) -> Layout {
        Layout {
            workspace: WORKSPACE.into(),
            run_dir: RUN_DIR.into(),
            gateway_port: GATEWAY_PORT,
        }
    }

    fn id(session: &Session) -> &str {
        &session.id
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.auto_stop_minutes() * 60)
    }

    async fn health(&self) -> Result<(), String> {
        self.client
            .health()
            .await
            .map_err(|_| "the Daytona API does not answer this key".to_owned())
    }

    async fn create(&self, spec: &MachineSpec) -> ProviderResult<Session> {
        let mut labels = BTreeMap::new();
        labels.insert("rakazo.computerId".to_string(), spec.computer_id.clone());
        labels.insert("rakazo.workspaceId".to_string(), spec.space_id.clone());
        let body = CreateSandbox {
            snapshot: (!self.config.snapshot.is_empty()).then(|| self.config.snapshot.clone()),
            target: (!self.config.target.is_empty()).then(|| self.config.target.clone()),
            labels,
            auto_stop_interval: Some(self.auto_stop_minutes() as i64),
            ..Default::default()
        };
        let created = self.client.create(&body).await?;
        let started = match self
            .client
            .wait_for(&created.id, &[State::Started], SETTLE)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = self.client.delete(&created.id).await;
                return Err(match e {
                    ProviderError::MachineGone => {
                        ProviderError::Failed("the new Daytona sandbox failed to start".into())
                    }
                    e => e,
                });
            }
        };
        tracing::info!(computer.id = %spec.computer_id, "daytona.sandbox.created");
        self.session(started).await
    }

    async fn connect(&self, id: &str) -> ProviderResult<Session> {
        let mut sb = self.client.get(id).await?;
        if sb.is_gone() {
            return Err(ProviderError::MachineGone);
        }
        if sb.state().in_transition() {
            sb = self
                .client
                .wait_for(
                    id,
                    &[State::Started, State::Stopped, State::Archived],
                    SETTLE,
                )
                .await?;
        }
        if sb.state() != State::Started {
            self.client.start(id).await?;
            sb = self.client.wait_for(id, &[State::Started], SETTLE).await?;
            tracing::info!("daytona.sandbox.started");
        }
        self.session(sb).await
    }

    async fn refresh(&self, s: &Session) -> ProviderResult<()> {
        let sb = self
            .client
            .set_autostop(&s.id, self.auto_stop_minutes())
            .await?;
        if sb.is_gone() {
            return Err(ProviderError::MachineGone);
        }
        Ok(())
    }

    async fn pause(&self, id: &str) -> ProviderResult<()> {
        let sb = self.client.get(id).await?;
        match sb.state() {
            State::Stopped | State::Archived => return Ok(()),
            _ if sb.is_gone() => return Err(ProviderError::MachineGone),
            _ => {}
        }
        self.client.stop(id).await?;
        self.client
            .wait_for(id, &[State::Stopped, State::Archived], SETTLE)
            .await
            .map(|_| ())
    }

    async fn kill(&self, id: &str) -> ProviderResult<()> {
        self.client.delete(id).await
    }

    async fn run(&self, s: &Session, command: &RemoteCommand) -> ProviderResult<ExecOutput> {
        let marker = format!("rakazo-stderr-{}", uuid::Uuid::new_v4().simple());
        // Extra environment as assignments before the wrapped script (the toolbox's `envs`
        // is not sent: the script sees exactly what the runtime asks for).
        let exports = command.exports();
        let line = format!(
            "bash -c {}",
            shell_quote(&format!(
                "{exports}{}",
                Self::wrap(&command.script, &marker)
            ))
        );
        match self
            .client
            .execute(&s.sandbox, &line, Some(&command.cwd), command.timeout)
            .await
        {
            Ok(Executed::Exited { exit_code, output }) => {
                let (stdout, stderr) = Self::unwrap(&output, &marker);
                Ok(ExecOutput {
                    exit_code,
                    stdout,
                    stderr,
                    timed_out: false,
                })
            }
            Ok(Executed::TimedOut) => Ok(ExecOutput {
                exit_code: -1,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            }),
            Err(e) => Err(self.gone_or(&s.id, e).await),
        }
    }

    async fn upload(&self, s: &Session, path: &str, data: Vec<u8>) -> ProviderResult<()> {
        match self.client.upload(&s.sandbox, path, data).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.gone_or(&s.id, e).await),
        }
    }

    async fn download(&self, s: &Session, path: &str, limit: u64) -> ProviderResult<Vec<u8>> {
        let data = match self.client.download(&s.sandbox, path).await {
            Ok(d) => d,
            Err(e) => return Err(self.gone_or(&s.id, e).await),
        };
        if data.len() as u64 > limit {
            return Err(ProviderError::TooLarge(path.chars().take(200).collect()));
        }
        Ok(data)
    }

    fn port(&self, s: &Session, port: u16) -> PortEndpoint {
        if port != GATEWAY_PORT {
            tracing::warn!(port, "daytona.port.unknown");
        }
        PortEndpoint {
            url: s.gateway.url.trim_end_matches('/').to_string(),
            headers: vec![(PREVIEW_TOKEN_HEADER.into(), s.gateway.token.clone())],
            query: Vec::new(),
        }
    }
}

impl Daytona {
    /// A toolbox failure on a sandbox the API says is gone is `MachineGone`.
    async fn gone_or(&self, id: &str, err: ProviderError) -> ProviderError {
        if matches!(err, ProviderError::Failed(_)) {
            match self.client.get(id).await {
                Err(ProviderError::MachineGone) => return ProviderError::MachineGone,
                Ok(sb) if sb.is_gone() => return ProviderError::MachineGone,
                _ => {}
            }
        }
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_comes_back_after_the_last_marker() {
        let (out, err) = Daytona::unwrap("a\nrakazo-m\nb\nrakazo-m\nZXJy", "rakazo-m");
        assert_eq!(out, "a\nrakazo-m\nb");
        assert_eq!(err, "err");
        let (out, err) = Daytona::unwrap("no marker", "rakazo-m");
        assert_eq!((out.as_str(), err.as_str()), ("no marker", ""));
    }

    #[test]
    fn the_auto_stop_interval_covers_the_idle_setting() {
        let d = Daytona::new(DaytonaConfig {
            kind: "daytona",
            api_url: "http://127.0.0.1:9/api".into(),
            api_key: "k".into(),
            target: String::new(),
            snapshot: String::new(),
            idle: Duration::from_secs(601),
        })
        .unwrap();
        assert_eq!(d.auto_stop_minutes(), 16);
        assert!(!format!("{:?}", d.config).contains("\"k\""));
    }
}
