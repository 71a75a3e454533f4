//! The desktop runtime's [`CommandRunner`] on a vendor's sandbox, with the runtime's minimal
//! environment, and the machine's exec agent ([`crate::exec_agent`]), which keeps the
//! long-lived helpers (the capture helper of each display), so a frame or a batch of pointer
//! moves is a line to it, not a process start:
//!
//! - where the vendor keeps a program's standard input open ([`RemoteSandboxes::attaches`]),
//!   the agent runs attached to this host and every script goes through it too (the runtime's
//!   and the bot's shell commands): a line and one `bash` in the machine, not a vendor call that
//!   starts a login shell;
//! - elsewhere the agent listens on a socket in the screen gateway's directory, started by the
//!   vendor's run call that hands back its key, for the first screen helper or in the
//!   background at the bot's first shell command or file tool, and is reached through the
//!   gateway, every line sealed with that key ([`crate::exec_agent::sealed`]); while it runs,
//!   scripts go through it too, and through the vendor's run call before (the gateway itself
//!   is started by them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, ProviderError, ProviderResult};

use super::forward::Forwarder;
use super::{RemoteCommand, RemoteSandboxes};
use crate::desktop::command::{CommandRunner, minimal_env};
use crate::desktop::gateway::Token;
use crate::desktop::gateway_stream;
use crate::desktop::runtime::DesktopRuntime;
use crate::desktop::{DesktopError, shell_quote};
use crate::exec_agent::{
    Agent, AgentSlot, Helper, Outcome, READY_WITHIN, Script, kill_script, sealed, stuck_output,
};

/// How long past a helper's own deadline its agent may take to answer before it is given up.
const AGENT_GRACE: Duration = Duration::from_secs(10);
/// An agent ends itself once idle this long (`--idle-exit`): envd keeps an attached agent's
/// input open, and a listening agent's connection may stay half open, so an agent whose
/// process here went (killed, restarted) would otherwise stay, with its helpers, for the
/// sandbox's life.
const AGENT_IDLE_EXIT: Duration = Duration::from_secs(1800);
/// An agent idle this long is replaced here before the next request, so that no request
/// meets an agent ending itself.
const AGENT_RETIRE: Duration = Duration::from_secs(900);
/// How long the script that kills a lost script's process group by its pid file may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// When the agent last had a request, and how many it has under way.
struct AgentUse {
    last: Instant,
    under_way: usize,
}

/// A request under way at the agent, until dropped (the agent is never retired under it).
struct UnderWay<'a>(&'a std::sync::Mutex<AgentUse>);

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        let mut usage = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        usage.under_way -= 1;
        usage.last = Instant::now();
    }
}

/// Runs scripts in one sandbox.
pub struct RemoteRunner<V: RemoteSandboxes> {
    /// The vendor.
    pub vendor: Arc<V>,
    /// The connected sandbox.
    pub session: V::Session,
    /// The machine's exec agent, attached where the vendor keeps standard input open.
    agent: AgentSlot,
    /// The agent's requests.
    usage: std::sync::Mutex<AgentUse>,
    /// The desktop runtime over this runner, whose screen gateway carries a listening agent.
    desktop: OnceLock<Weak<DesktopRuntime>>,
    /// The loopback forwarder to the machine's screen gateway, made on first use.
    gateway: tokio::sync::Mutex<Option<Forwarder>>,
    /// The screen gateway is stopping or stopped: a listening agent, reached through it, is
    /// not used.
    gateway_down: AtomicBool,
}

impl<V: RemoteSandboxes> RemoteRunner<V> {
    /// A runner on `session`.
    pub fn new(vendor: Arc<V>, session: V::Session) -> Self {
        Self {
            vendor,
            session,
            agent: AgentSlot::default(),
            usage: std::sync::Mutex::new(AgentUse {
                last: Instant::now(),
                under_way: 0,
            }),
            desktop: OnceLock::new(),
            gateway: tokio::sync::Mutex::new(None),
            gateway_down: AtomicBool::new(false),
        }
    }

    /// Tells the runner the desktop runtime it serves (whose screen gateway carries the agent
    /// where the vendor attaches nothing).
    pub fn serve(&self, runtime: &Arc<DesktopRuntime>) {
        let _ = self.desktop.set(Arc::downgrade(runtime));
    }

    /// The local port of the loopback forwarder to the machine's screen gateway.
    pub async fn gateway_port(&self) -> ProviderResult<u16> {
        let mut gateway = self.gateway.lock().await;
        if let Some(f) = gateway.as_ref() {
            return Ok(f.port());
        }
        let port = self.vendor.layout().gateway_port;
        let f = Forwarder::start(self.vendor.port(&self.session, port)).await?;
        let port = f.port();
        *gateway = Some(f);
        Ok(port)
    }

    /// The agent's command line as a script, with its arguments after its name.
    fn agent_script(extra: &[String]) -> String {
        let mut argv = crate::exec_agent::argv_in_minimal_env();
        argv.extend_from_slice(extra);
        argv.extend([
            "--idle-exit".to_string(),
            AGENT_IDLE_EXIT.as_secs().to_string(),
        ]);
        format!(
            "exec {}",
            argv.iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        )
    }

    /// Starts the machine's exec agent: attached where the vendor keeps standard input open,
    /// listening behind the screen gateway elsewhere.
    async fn start_agent(&self) -> Result<Arc<Agent>, String> {
        if self.vendor.attaches() {
            self.start_attached_agent().await
        } else {
            self.start_listening_agent().await
        }
    }

    /// Starts the agent on a socket of the screen gateway's directory (named by a fresh
    /// token, as a capability's is), takes the key it hands to the vendor's run call, and
    /// reaches it through the gateway.
    async fn start_listening_agent(&self) -> Result<Arc<Agent>, String> {
        let runtime = self
            .desktop
            .get()
            .and_then(Weak::upgrade)
            .ok_or("no desktop runtime on this machine")?;
        let gateway = runtime.started_gateway().await.map_err(|e| e.to_string())?;
        let token = Token::fresh();
        let socket = gateway.socket_of(&token).to_string_lossy().into_owned();
        let command = RemoteCommand {
            script: Self::agent_script(&["--listen".into(), socket]),
            cwd: "/".into(),
            env: Vec::new(),
            timeout: READY_WITHIN,
        };
        let out = self
            .vendor
            .run(&self.session, &command)
            .await
            .map_err(|e| e.to_string())?;
        let key = (out.exit_code == 0)
            .then(|| sealed::key_from_hex(&out.stdout))
            .flatten()
            .ok_or("the exec agent did not start")?;
        let port = self.gateway_port().await.map_err(|e| e.to_string())?;
        let upstream = format!("http://127.0.0.1:{port}");
        let stream = gateway_stream::connect(&upstream, token.expose())
            .await
            .map_err(|e| e.to_string())?;
        Agent::over(sealed::channel(stream, key)).await
    }

    /// Starts the machine's exec agent attached to this host, with the minimal environment
    /// only (as every runtime script gets it).
    async fn start_attached_agent(&self) -> Result<Arc<Agent>, String> {
        let command = RemoteCommand {
            script: Self::agent_script(&[]),
            cwd: "/".into(),
            env: Vec::new(),
            timeout: Duration::ZERO,
        };
        let channel = self
            .vendor
            .attach(&self.session, &command)
            .await
            .map_err(|e| e.to_string())?;
        Agent::over(channel).await
    }

    /// The machine's agent with a request marked under way; `None` when no agent can start
    /// (then for [`RETRY_AFTER`](crate::exec_agent::RETRY_AFTER)). An agent idle for
    /// [`AGENT_RETIRE`] is replaced first.
    async fn agent(&self) -> Option<(Arc<Agent>, UnderWay<'_>)> {
        let under_way = self.under_way();
        let agent = self.agent.get(|| self.start_agent()).await?;
        Some((agent, under_way))
    }

    /// Marks a request under way at the agent, first giving up an agent idle for
    /// [`AGENT_RETIRE`] with nothing under way (so no request meets one ending itself).
    fn under_way(&self) -> UnderWay<'_> {
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        if usage.under_way == 0 && usage.last.elapsed() > AGENT_RETIRE {
            self.agent.end();
        }
        usage.under_way += 1;
        UnderWay(&self.usage)
    }

    /// The listening agent if one runs now, with a request marked under way. None is started
    /// here for a script: starting one takes the screen gateway, whose own start runs scripts
    /// (see [`start_agent_soon`](Self::start_agent_soon)).
    fn running_agent(&self) -> Option<(Arc<Agent>, UnderWay<'_>)> {
        if self.gateway_down.load(Ordering::SeqCst) {
            return None;
        }
        let under_way = self.under_way();
        let agent = self.agent.running()?;
        Some((agent, under_way))
    }

    /// Starts the listening agent in the background when none runs or is starting (and the
    /// last failed start is old enough), so that a computer used only for scripts has its
    /// scripts go through it too, from the first one that finds it running. The script that
    /// asked goes on through the vendor's run call meanwhile; where the vendor attaches the
    /// agent, the script itself starts it.
    pub fn start_agent_soon(self: &Arc<Self>) {
        if self.vendor.attaches() || !self.agent.may_start() {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            drop(me.agent().await);
        });
    }

    /// Runs `command` in the sandbox: through the machine's agent (killed at its deadline, or
    /// when this call is dropped), where the vendor attaches it (started for the script when
    /// none runs) or where one listens behind the gateway already (started by the first
    /// screen helper); through the vendor's run call otherwise. `command.env` is then the
    /// script's whole environment. A script whose agent ended or stopped answering is killed
    /// by the pid file it left (through the vendor's run call), and a new agent is started by
    /// the next request that starts one.
    pub async fn run_command(&self, command: &RemoteCommand) -> ProviderResult<ExecOutput> {
        let agent = match self.vendor.attaches() {
            true => self.agent().await,
            false => self.running_agent(),
        };
        let Some((agent, _under_way)) = agent else {
            return self.vendor.run(&self.session, command).await;
        };
        let mut guard = KillOnDrop {
            armed: Some((self.vendor.clone(), self.session.clone(), agent.clone())),
            run_id: uuid::Uuid::new_v4().simple().to_string(),
        };
        let script = Script {
            script: &command.script,
            cwd: &command.cwd,
            env: &command.env,
        };
        let outcome = agent
            .run_within(&guard.run_id, &script, command.timeout, AGENT_GRACE)
            .await;
        guard.armed = None;
        match outcome {
            Outcome::Answered(out) => Ok(out),
            Outcome::Refused(reason) => Err(ProviderError::Failed(format!(
                "the computer cannot start the script: {reason}"
            ))),
            // The bot killed the agent, or the sandbox went: the script may still run.
            Outcome::Ended => {
                kill_lost(&*self.vendor, &self.session, &guard.run_id).await?;
                tracing::warn!("remote.exec_agent.lost_script");
                Err(ProviderError::Failed(
                    "the computer's script runner ended while the script ran".into(),
                ))
            }
            // No answer past the deadline: the agent is stopped (by the bot).
            Outcome::Stuck => {
                kill_lost(&*self.vendor, &self.session, &guard.run_id).await?;
                Ok(stuck_output())
            }
        }
    }
}

/// Kills the process group of the script `run_id` by the pid file it left, through the
/// vendor's run call (its own stop rules apply).
async fn kill_lost<V: RemoteSandboxes>(
    vendor: &V,
    session: &V::Session,
    run_id: &str,
) -> ProviderResult<()> {
    let command = RemoteCommand {
        script: kill_script(run_id),
        cwd: "/".into(),
        env: minimal_env(),
        timeout: KILL_TIMEOUT,
    };
    vendor.run(session, &command).await.map(drop)
}

/// Kills a script sent to the agent whose caller stopped waiting: by a line to the agent while
/// it runs, by its pid file otherwise.
struct KillOnDrop<V: RemoteSandboxes> {
    armed: Option<(Arc<V>, V::Session, Arc<Agent>)>,
    run_id: String,
}

impl<V: RemoteSandboxes> Drop for KillOnDrop<V> {
    fn drop(&mut self) {
        let (Some((vendor, session, agent)), Ok(runtime)) =
            (self.armed.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let run_id = std::mem::take(&mut self.run_id);
        runtime.spawn(async move {
            if agent.alive() && agent.kill(&run_id).await.is_ok() {
                return;
            }
            if let Err(e) = kill_lost(&*vendor, &session, &run_id).await {
                tracing::debug!(error = %e, "remote.exec_agent.kill_failed");
            }
        });
    }
}

#[async_trait]
impl<V: RemoteSandboxes> CommandRunner for RemoteRunner<V> {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        let command = RemoteCommand {
            script: script.to_string(),
            cwd: "/".into(),
            env: minimal_env(),
            timeout,
        };
        self.run_command(&command).await.map_err(|e| match e {
            ProviderError::MachineGone => DesktopError::Command("machine gone".into()),
            other => DesktopError::Command(other.to_string()),
        })
    }

    fn keeps_helpers(&self) -> bool {
        true
    }

    /// The listening agent is reached through the gateway: it is given up (its scripts under
    /// way end with it), and until the gateway listens again no script goes through a
    /// listening agent (not even one whose start was under way): the scripts that stop the
    /// gateway go through the vendor's run call. The agent's connection closes with the
    /// gateway, and the agent then exits; the next one started starts the gateway again.
    fn gateway_stopping(&self) {
        if !self.vendor.attaches() {
            self.gateway_down.store(true, Ordering::SeqCst);
            self.agent.end();
        }
    }

    fn gateway_started(&self) {
        self.gateway_down.store(false, Ordering::SeqCst);
    }

    async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Option<Result<String, DesktopError>> {
        let (agent, _under_way) = self.agent().await?;
        Some(
            agent
                .ask_within(helper, line, timeout, AGENT_GRACE)
                .await
                .map_err(DesktopError::Command),
        )
    }
}
