//! The exec agents of the supervisor's running containers ([`crate::exec_agent`]): each one
//! started through an engine exec held open, by full container id. A script then costs a
//! message instead of an engine exec (27 to 57 ms on the machines measured) and the wrapper's
//! seven process starts.

use std::sync::Arc;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use dashmap::DashMap;
use futures_util::StreamExt;
use tokio_util::io::StreamReader;

use super::engine::USER;
use crate::exec_agent::{Agent, AgentSlot, Channel, argv};

/// Starts the agent in the running container `container`.
async fn start(docker: &Docker, container: &str) -> Result<Arc<Agent>, String> {
    let failed = |e: bollard::errors::Error| format!("engine: {e}");
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                cmd: Some(argv()),
                user: Some(USER.to_string()),
                working_dir: Some("/".into()),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(failed)?;
    let started = docker
        .start_exec(
            &exec.id,
            Some(StartExecOptions {
                output_capacity: Some(64 << 10),
                ..Default::default()
            }),
        )
        .await
        .map_err(failed)?;
    let StartExecResults::Attached { output, input } = started else {
        return Err("exec did not attach".into());
    };
    // Standard output only; what the agent writes to standard error is counted and dropped.
    let stdout = output.filter_map(|chunk| {
        std::future::ready(match chunk {
            Ok(LogOutput::StdOut { message }) => Some(Ok(message)),
            Ok(LogOutput::StdErr { message }) => {
                tracing::warn!(bytes = message.len(), "exec_agent.stderr");
                None
            }
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e))),
        })
    });
    Agent::over(Channel {
        input,
        output: Box::pin(StreamReader::new(stdout)),
        keep: Box::new(()),
    })
    .await
}

/// The agents of the running containers, by full container id.
#[derive(Default)]
pub struct Agents {
    slots: DashMap<String, Arc<AgentSlot>>,
}

impl Agents {
    /// The agent of the running container `container`, started when it has none (or its last
    /// one ended); `None` when none can run there (scripts then go through the engine exec).
    pub async fn get(&self, docker: &Docker, container: &str) -> Option<Arc<Agent>> {
        let slot = self.slots.entry(container.to_owned()).or_default().clone();
        slot.get(|| start(docker, container)).await
    }

    /// The agent of `container` if one is running now (none is started).
    pub fn running(&self, container: &str) -> Option<Arc<Agent>> {
        self.slots.get(container)?.running()
    }

    /// How many containers have an agent's slot here (running or not).
    pub fn held(&self) -> usize {
        self.slots.len()
    }

    /// Forgets the agent of a container that is stopped or removed.
    pub fn forget(&self, container: &str) {
        if let Some((_, slot)) = self.slots.remove(container) {
            slot.end();
        }
    }
}
