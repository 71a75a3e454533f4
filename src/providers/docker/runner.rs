//! The desktop runtime's [`CommandRunner`] for docker computers: every script runs through
//! the supervisor's exec, as uid 1000, with the runtime's minimal environment; helpers (the
//! capture helper of the plain command path) are kept by the container's exec agent.

use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, ProviderError};

use super::client::SupervisorClient;
use crate::desktop::DesktopError;
use crate::desktop::command::{CommandRunner, script_env};
use crate::exec_agent::Helper;
use crate::supervisor::wire::{AskAnswer, AskBody, ExecBody};

/// Runs scripts in one container.
pub struct SupervisorRunner {
    /// The supervisor.
    pub client: SupervisorClient,
    /// The container id.
    pub container: String,
}

#[async_trait]
impl CommandRunner for SupervisorRunner {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.run_with_env(script, &[], timeout).await
    }

    async fn run_with_env(
        &self,
        script: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, DesktopError> {
        let body = ExecBody {
            script: script.to_string(),
            cwd: "/".into(),
            env: script_env(env),
            timeout_ms: timeout.as_millis() as u64,
            run_id: None,
        };
        let out = self
            .client
            .exec(&self.container, &body)
            .await
            .map_err(|e| match e {
                ProviderError::MachineGone => DesktopError::Command("machine gone".into()),
                other => DesktopError::Command(other.to_string()),
            })?;
        Ok(out.into())
    }

    /// The engine's exec and the exec agent both start the script with the body's `env`.
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
        let body = AskBody {
            helper: helper.key.clone(),
            argv: helper.argv.clone(),
            env: script_env(&helper.env),
            line: line.to_owned(),
            timeout_ms: timeout.as_millis() as u64,
        };
        Some(match self.client.ask(&self.container, &body).await {
            Ok(AskAnswer::Answered { line }) => Ok(line),
            Ok(AskAnswer::Failed { reason }) => Err(DesktopError::Command(reason)),
            Ok(AskAnswer::NoAgent) => return None,
            Err(e) => Err(DesktopError::Command(e.to_string())),
        })
    }
}
