//! Running programs in a computer pod through `pods/exec` (kube-rs over WebSockets): scripts
//! with a deadline and captured output, and streamed transfers whose bytes pass through this
//! process in bounded buffers, never whole. Scripts go through the pod's exec agent
//! ([`crate::exec_agent`], one `pods/exec` held open) while one runs there, else through a
//! `pods/exec` each with the exec wrapper.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::AttachParams;
use rakazo_actors::provider::{ExecOutput, ProviderError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::desktop::DesktopError;
use crate::desktop::command::{CommandRunner, OUTPUT_CAP, script_env};
use crate::exec_agent::{
    Agent, AgentSlot, Channel, Helper, Outcome, Script, kill_script, stuck_output,
};
use crate::supervisor::engine::EXEC_WRAPPER;

/// Extra time an exec gets past the script's own deadline before it is abandoned.
const EXEC_GRACE: Duration = Duration::from_secs(10);

/// Buffer of the agent's standard input and output in this process.
const AGENT_BUFFER: usize = 64 << 10;

/// How `pods/exec` reaches one pod.
#[derive(Clone)]
pub struct PodExec {
    /// The pods of the computer namespace.
    pub api: Api<Pod>,
    /// The pod's name.
    pub pod: String,
    /// The pod's exec agent, shared by the clones.
    pub agent: Arc<AgentSlot>,
}

/// What an exec ended with.
#[derive(Debug)]
pub struct Ended {
    /// The exit code (`-1` when the status said nothing usable).
    pub exit_code: i32,
    /// Standard error, capped.
    pub stderr: String,
}

/// A kube error as a provider error: a missing pod is `MachineGone`; nothing of the API
/// server's address is kept.
pub fn provider_error(e: kube::Error) -> ProviderError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ProviderError::MachineGone,
        kube::Error::Api(s) => {
            ProviderError::Failed(format!("Kubernetes API: {} ({})", s.reason, s.code))
        }
        other => ProviderError::Failed(format!(
            "Kubernetes API unreachable ({})",
            match other {
                kube::Error::HyperError(_) | kube::Error::Service(_) => "connection",
                _ => "protocol",
            }
        )),
    }
}

fn exit_code(status: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>) -> i32 {
    let Some(status) = status else { return -1 };
    if status.status.as_deref() == Some("Success") {
        return 0;
    }
    status
        .details
        .and_then(|d| d.causes)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message?.parse().ok())
        .unwrap_or(-1)
}

/// Reads all of `r` keeping the first [`OUTPUT_CAP`] bytes.
async fn capped(mut r: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

impl PodExec {
    /// How `pods/exec` reaches the pod `pod`.
    pub fn new(api: Api<Pod>, pod: &str) -> Self {
        Self {
            api,
            pod: pod.to_owned(),
            agent: Arc::default(),
        }
    }

    /// Starts the pod's exec agent in the background (a pod just attached): the interpreter's
    /// start overlaps what comes before the first script, which waits for it.
    pub fn start_agent_soon(&self) {
        let exec = self.clone();
        tokio::spawn(async move { exec.agent.get(|| exec.start_agent()).await });
    }

    /// Starts the pod's exec agent over a `pods/exec` held open (its standard error is not
    /// asked for: nothing reads it). It starts with the minimal environment only, so that a
    /// script gets exactly the environment it is given, as through `env -i` without an agent
    /// (nothing of the pod's own, such as what a kubelet adds, reaches the bot's scripts).
    async fn start_agent(&self) -> Result<Arc<Agent>, String> {
        let argv = crate::exec_agent::argv_in_minimal_env();
        let params = AttachParams::default()
            .stdin(true)
            .stdout(true)
            .stderr(false)
            .max_stdin_buf_size(AGENT_BUFFER)
            .max_stdout_buf_size(AGENT_BUFFER);
        let mut proc = self
            .api
            .exec(&self.pod, argv, &params)
            .await
            .map_err(|e| provider_error(e).to_string())?;
        let (Some(input), Some(output)) = (proc.stdin(), proc.stdout()) else {
            return Err("the exec did not attach".into());
        };
        // The exec's handle is kept with the agent: dropping it ends the exec.
        Agent::over(Channel {
            input: Box::pin(input),
            output: Box::pin(output),
            keep: Box::new(proc),
        })
        .await
    }

    /// Runs `argv` in the pod: `input` (if any) streamed to its stdin then closed, its stdout
    /// streamed to `output`; standard error is captured (capped).
    pub async fn stream(
        &self,
        argv: Vec<String>,
        input: Option<&mut (dyn AsyncRead + Unpin + Send)>,
        output: &mut (dyn AsyncWrite + Unpin + Send),
    ) -> Result<Ended, ProviderError> {
        let params = AttachParams::default()
            .stdin(input.is_some())
            .stdout(true)
            .stderr(true);
        let mut proc = self
            .api
            .exec(&self.pod, argv, &params)
            .await
            .map_err(provider_error)?;
        let status = proc.take_status();
        let stdout = proc.stdout();
        let stderr = proc.stderr();
        let stdin = proc.stdin();
        let feed = async {
            if let (Some(input), Some(mut stdin)) = (input, stdin) {
                let copied = tokio::io::copy(input, &mut stdin).await;
                // The command sees its end of input only after the writer is shut down.
                let _ = stdin.shutdown().await;
                copied.map(drop)
            } else {
                Ok(())
            }
        };
        let drain = async {
            match stdout {
                Some(mut out) => tokio::io::copy(&mut out, output).await.map(drop),
                None => Ok(()),
            }
        };
        let errors = async {
            match stderr {
                Some(err) => capped(err).await,
                None => Vec::new(),
            }
        };
        let (fed, drained, stderr) = tokio::join!(feed, drain, errors);
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        // No status: the connection ended before the command did (its pod went away).
        let Some(status) = status else {
            let _ = proc.join().await;
            return Err(ProviderError::Failed(
                "the exec ended without a status".into(),
            ));
        };
        let exit_code = exit_code(Some(status));
        let _ = proc.join().await;
        output
            .flush()
            .await
            .map_err(|e| ProviderError::Failed(format!("transfer: {e}")))?;
        if let Err(e) = fed.and(drained) {
            return Err(ProviderError::Failed(format!("transfer: {}", e.kind())));
        }
        Ok(Ended {
            exit_code,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// Runs `script` with `bash` in `cwd` with exactly `env`, stopping it (its whole process
    /// group) at `timeout`, as the docker supervisor's exec does. Dropping the future kills
    /// what it started.
    pub async fn script(
        &self,
        script: &str,
        cwd: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, ProviderError> {
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        if let Some(agent) = self.agent.get(|| self.start_agent()).await {
            return self
                .script_by_agent(agent, run_id, &Script { script, cwd, env }, timeout)
                .await;
        }
        let mut argv = vec!["env".to_string(), "-i".into()];
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.extend([
            "bash".into(),
            "-c".into(),
            EXEC_WRAPPER.into(),
            "rakazo-exec".into(),
            run_id.clone(),
            format!("{:.3}", timeout.as_secs_f64()),
            format!(
                "cd {} || exit 125\n{script}",
                crate::desktop::shell_quote(cwd)
            ),
        ]);
        let mut guard = KillOnDrop {
            exec: Some(self.clone()),
            run_id,
            agent: None,
        };
        let started = Instant::now();
        let mut stdout = CappedWriter::default();
        let ran =
            tokio::time::timeout(timeout + EXEC_GRACE, self.stream(argv, None, &mut stdout)).await;
        let Ok(ended) = ran else {
            return Ok(ExecOutput {
                exit_code: -1,
                stdout: String::from_utf8_lossy(&stdout.0).into_owned(),
                stderr: String::new(),
                timed_out: true,
            });
        };
        let ended = ended?;
        guard.exec = None;
        // `timeout -s KILL` ends a script past its deadline with 128 + 9.
        let timed_out = ended.exit_code == 137 && started.elapsed() >= timeout;
        Ok(ExecOutput {
            exit_code: if timed_out { -1 } else { ended.exit_code },
            stdout: String::from_utf8_lossy(&stdout.0).into_owned(),
            stderr: ended.stderr,
            timed_out,
        })
    }

    /// [`Self::script`] through the pod's exec agent.
    async fn script_by_agent(
        &self,
        agent: Arc<Agent>,
        run_id: String,
        script: &Script<'_>,
        timeout: Duration,
    ) -> Result<ExecOutput, ProviderError> {
        let mut guard = KillOnDrop {
            exec: Some(self.clone()),
            run_id,
            agent: Some(agent.clone()),
        };
        match agent
            .run_within(&guard.run_id, script, timeout, EXEC_GRACE)
            .await
        {
            Outcome::Answered(out) => {
                guard.exec = None;
                Ok(out)
            }
            // The bot killed the agent, or the pod is going (the caller asks which): the guard
            // kills the script by its pid file, the next script starts a new agent.
            Outcome::Ended => {
                tracing::warn!("kubernetes.exec_agent.lost_script");
                Err(ProviderError::Failed(
                    "the computer's script runner ended while the script ran".into(),
                ))
            }
            // Nothing ran: the guard has nothing to kill.
            Outcome::Refused(reason) => {
                guard.exec = None;
                Err(ProviderError::Failed(format!(
                    "the computer cannot start the script: {reason}"
                )))
            }
            // Stuck past the deadline (stopped by the bot): the guard kills the script.
            Outcome::Stuck => Ok(stuck_output()),
        }
    }
}

/// Keeps the first bytes written to it, up to its cap ([`OUTPUT_CAP`] by default), and drops
/// the rest.
pub struct CappedWriter(pub Vec<u8>, usize);

impl Default for CappedWriter {
    fn default() -> Self {
        Self::with_cap(OUTPUT_CAP)
    }
}

impl CappedWriter {
    /// A writer that keeps up to `cap` bytes.
    pub fn with_cap(cap: usize) -> Self {
        Self(Vec::new(), cap)
    }

    /// Whether bytes were dropped (or the cap was reached exactly).
    pub fn full(&self) -> bool {
        self.0.len() >= self.1
    }
}

impl AsyncWrite for CappedWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let room = self.1.saturating_sub(self.0.len());
        self.0.extend_from_slice(&buf[..buf.len().min(room)]);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Passes bytes on to `inner` until more than `max` came, then fails every write: a stream the
/// computer sends is cut off at the most a valid one can hold, whatever it keeps sending.
pub struct Bounded<'a> {
    inner: &'a mut (dyn AsyncWrite + Unpin + Send),
    left: u64,
    /// More than `max` bytes came.
    pub over: bool,
}

impl<'a> Bounded<'a> {
    /// `inner`, taking at most `max` bytes.
    pub fn new(inner: &'a mut (dyn AsyncWrite + Unpin + Send), max: u64) -> Self {
        Self {
            inner,
            left: max,
            over: false,
        }
    }
}

impl AsyncWrite for Bounded<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            self.over = true;
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "more than a workspace archive holds",
            )));
        }
        let this = &mut *self;
        let written = std::pin::Pin::new(&mut *this.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &written {
            this.left -= *n as u64;
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

/// Kills an exec's process group in the pod unless disarmed (`exec = None`): through the agent
/// that runs it while that agent answers, else through a `pods/exec` reading its pid file.
struct KillOnDrop {
    exec: Option<PodExec>,
    run_id: String,
    agent: Option<Arc<Agent>>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(exec) = self.exec.take() {
            let run_id = self.run_id.clone();
            let agent = self.agent.take().filter(|a| a.alive());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    if let Some(agent) = agent
                        && agent.kill(&run_id).await.is_ok()
                    {
                        return;
                    }
                    let argv = vec!["bash".to_string(), "-c".into(), kill_script(&run_id)];
                    let _ = exec.stream(argv, None, &mut tokio::io::sink()).await;
                });
            }
        }
    }
}

/// The desktop runtime's [`CommandRunner`] for one pod: scripts run as the pod's user
/// (uid 1000) with the runtime's minimal environment, from `/`.
pub struct PodRunner(pub PodExec);

#[async_trait]
impl CommandRunner for PodRunner {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.run_with_env(script, &[], timeout).await
    }

    async fn run_with_env(
        &self,
        script: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, DesktopError> {
        self.0
            .script(script, "/", &script_env(env), timeout)
            .await
            .map_err(|e| DesktopError::Command(e.to_string()))
    }

    fn sets_env(&self) -> bool {
        true
    }

    fn keeps_helpers(&self) -> bool {
        true
    }

    async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Option<Result<String, DesktopError>> {
        let exec = &self.0;
        let agent = exec.agent.get(|| exec.start_agent()).await?;
        Some(
            agent
                .ask_within(helper, line, timeout, EXEC_GRACE)
                .await
                .map_err(DesktopError::Command),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

    /// A stream past its bound fails its writes from there on and says so; what came before
    /// was passed on.
    #[tokio::test]
    async fn a_bounded_stream_fails_past_its_bound() {
        let mut sink = Vec::new();
        let mut bounded = Bounded::new(&mut sink, 10);
        bounded.write_all(b"0123456789").await.unwrap();
        assert!(!bounded.over);
        assert!(bounded.write_all(b"x").await.is_err());
        assert!(bounded.over);
        assert_eq!(sink, b"0123456789");
    }

    #[test]
    fn exit_codes_come_from_the_status() {
        assert_eq!(exit_code(None), -1);
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(ok)), 0);
        let failed = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_code(Some(failed)), 3);
    }
}
