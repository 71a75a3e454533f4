//! The desktop runtime's [`CommandRunner`] on a vendor's sandbox: every runtime script goes
//! through the vendor's run call, with the runtime's minimal environment. Where the vendor
//! keeps a program's standard input open ([`RemoteSandboxes::attaches`]), the machine's exec
//! agent ([`crate::exec_agent`]) runs attached to this host and keeps the long-lived helpers
//! (the capture helper of each display): a frame or a batch of pointer moves is a line to it,
//! not a process start.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, ProviderError};

use super::{RemoteCommand, RemoteSandboxes};
use crate::desktop::command::{CommandRunner, minimal_env};
use crate::desktop::{DesktopError, shell_quote};
use crate::exec_agent::{Agent, AgentSlot, Helper};

/// How long past a helper's own deadline its agent may take to answer before it is given up.
const AGENT_GRACE: Duration = Duration::from_secs(10);
/// An attached agent ends itself once idle this long (`--idle-exit`): envd keeps its input
/// open, so an agent whose process here went (killed, restarted) would otherwise stay, with its
/// helpers, for the sandbox's life.
const AGENT_IDLE_EXIT: Duration = Duration::from_secs(1800);
/// An agent idle this long is replaced here before the next ask, so that no ask meets an agent
/// ending itself.
const AGENT_RETIRE: Duration = Duration::from_secs(900);

/// Runs scripts in one sandbox.
pub struct RemoteRunner<V: RemoteSandboxes> {
    /// The vendor.
    pub vendor: Arc<V>,
    /// The connected sandbox.
    pub session: V::Session,
    /// The machine's exec agent, attached where the vendor keeps standard input open.
    agent: AgentSlot,
    /// When the agent was last asked.
    asked: std::sync::Mutex<Instant>,
}

impl<V: RemoteSandboxes> RemoteRunner<V> {
    /// A runner on `session`.
    pub fn new(vendor: Arc<V>, session: V::Session) -> Self {
        Self {
            vendor,
            session,
            agent: AgentSlot::default(),
            asked: std::sync::Mutex::new(Instant::now()),
        }
    }

    /// Starts the machine's exec agent attached to this host, with the minimal environment
    /// only (as every runtime script gets it).
    async fn start_agent(&self) -> Result<Arc<Agent>, String> {
        let mut argv = crate::exec_agent::argv_in_minimal_env();
        argv.extend([
            "--idle-exit".to_string(),
            AGENT_IDLE_EXIT.as_secs().to_string(),
        ]);
        let script = format!(
            "exec {}",
            argv.iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let command = RemoteCommand {
            script,
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
        self.vendor
            .run(&self.session, &command)
            .await
            .map_err(|e| match e {
                ProviderError::MachineGone => DesktopError::Command("machine gone".into()),
                other => DesktopError::Command(other.to_string()),
            })
    }

    fn keeps_helpers(&self) -> bool {
        self.vendor.attaches()
    }

    async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Option<Result<String, DesktopError>> {
        if !self.vendor.attaches() {
            return None;
        }
        {
            let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
            if asked.elapsed() > AGENT_RETIRE {
                self.agent.end();
            }
            *asked = Instant::now();
        }
        let agent = self.agent.get(|| self.start_agent()).await?;
        Some(
            agent
                .ask_within(helper, line, timeout, AGENT_GRACE)
                .await
                .map_err(DesktopError::Command),
        )
    }
}
