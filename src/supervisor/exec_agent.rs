//! The exec agent of each running computer (`exec_agent.py`): one engine exec held open per
//! container, over which the supervisor's scripts go as one JSON line each way. A script then
//! costs a message and one process start in the container instead of an engine exec (27 to
//! 57 ms on the machines measured) and the wrapper's seven process starts.
//!
//! The agent runs as uid 1000 like every script, so the bot can kill or stop it: a script under
//! way then fails ([`Ended`]) or passes its deadline, the script is killed by the engine-exec
//! path's pid file, and the next script starts a new agent. The agent makes itself undumpable
//! as it starts, so from then on the bot cannot open its pipes through `/proc`. A container
//! without `python3` (an operator's own image) runs every script through the engine exec
//! instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use dashmap::DashMap;
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, oneshot};

use super::engine::{EngineError, USER};
use super::wire::{ExecBody, ExecResult};

/// The agent's program.
const SOURCE: &str = include_str!("exec_agent.py");
/// How long a new agent has to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// How long a container whose agent could not start runs scripts through the engine exec
/// before a new agent is tried.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest line an agent may write (two capped outputs in base64, and the rest).
const MAX_LINE: usize = 4 << 20;

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// The agent ended (or was given up) before it answered.
#[derive(Debug)]
pub struct Ended;

/// One agent's answer.
#[derive(Deserialize)]
struct Answer {
    id: u64,
    #[serde(default)]
    code: i32,
    #[serde(default)]
    timed_out: bool,
    #[serde(default)]
    out: String,
    #[serde(default)]
    err: String,
    /// Set when the agent could not run the request at all.
    #[serde(default)]
    error: Option<String>,
}

/// One running agent.
pub struct Agent {
    input: Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    pending: DashMap<u64, oneshot::Sender<Answer>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    reader: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

/// Removes a request's waiter when its caller stops waiting.
struct Waiting<'a>(&'a Agent, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.pending.remove(&self.1);
    }
}

impl Agent {
    /// Starts the agent in the running container `container` and waits for it to be ready.
    async fn start(docker: &Docker, container: &str) -> Result<Arc<Self>, EngineError> {
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(vec![
                        "python3".to_string(),
                        "-I".into(),
                        "-S".into(),
                        "-c".into(),
                        SOURCE.into(),
                        "rakazo-exec-agent".into(),
                    ]),
                    user: Some(USER.to_string()),
                    working_dir: Some("/".into()),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await?;
        let started = docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    output_capacity: Some(64 << 10),
                    ..Default::default()
                }),
            )
            .await?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(EngineError::Engine("exec did not attach".into()));
        };
        let mut lines = Lines::default();
        let first = tokio::time::timeout(READY_WITHIN, lines.next(&mut output))
            .await
            .map_err(|_| EngineError::Engine("the exec agent did not start in time".into()))?;
        if first.as_deref() != Some(br#"{"ready":1}"#.as_slice()) {
            return Err(EngineError::Engine("the exec agent did not start".into()));
        }
        let agent = Arc::new(Self {
            input: Mutex::new(input),
            pending: DashMap::new(),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            reader: std::sync::Mutex::new(None),
        });
        let reading = tokio::spawn(read_answers(agent.clone(), output, lines));
        *agent.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reading.abort_handle());
        Ok(agent)
    }

    /// Whether the agent still answers.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Gives the agent up: waiters get [`Ended`], its stream is closed (its stdin with it, so
    /// an agent that runs again exits once its scripts end).
    pub fn end(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.pending.clear();
        if let Some(reader) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
    }

    async fn send(&self, line: Vec<u8>) -> Result<(), Ended> {
        let mut input = self.input.lock().await;
        let sent = async {
            input.write_all(&line).await?;
            input.flush().await
        };
        sent.await.map_err(|_| Ended)
    }

    /// Runs `body` under `run_id`; the agent kills it at `timeout`.
    pub async fn run(
        &self,
        run_id: &str,
        body: &ExecBody,
        timeout: Duration,
    ) -> Result<ExecResult, Ended> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.insert(id, tx);
        let _waiting = Waiting(self, id);
        // Checked after the waiter is in: an agent ending meanwhile has cleared it or is seen.
        if !self.alive() {
            return Err(Ended);
        }
        let mut line = serde_json::to_vec(&serde_json::json!({
            "id": id,
            "run": run_id,
            "script": body.script,
            "env": body.env,
            "cwd": body.cwd,
            "timeout": timeout.as_secs_f64(),
        }))
        .map_err(|_| Ended)?;
        line.push(b'\n');
        if self.send(line).await.is_err() {
            self.end();
            return Err(Ended);
        }
        let answer = rx.await.map_err(|_| Ended)?;
        if answer.error.is_some() {
            return Err(Ended);
        }
        let text = |b64: &str| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(ExecResult {
            exit_code: if answer.timed_out { -1 } else { answer.code },
            stdout: text(&answer.out),
            stderr: text(&answer.err),
            timed_out: answer.timed_out,
        })
    }

    /// Kills the process group of the script `run_id` (one not started yet never starts).
    pub async fn kill(&self, run_id: &str) -> Result<(), Ended> {
        let mut line = serde_json::to_vec(&serde_json::json!({ "op": "kill", "run": run_id }))
            .map_err(|_| Ended)?;
        line.push(b'\n');
        self.send(line).await
    }
}

/// Hands each answer to its waiter until the agent's stream ends.
async fn read_answers(agent: Arc<Agent>, mut output: Output, mut lines: Lines) {
    while let Some(line) = lines.next(&mut output).await {
        match serde_json::from_slice::<Answer>(&line) {
            Ok(answer) => {
                if let Some((_, waiter)) = agent.pending.remove(&answer.id) {
                    let _ = waiter.send(answer);
                }
            }
            Err(_) => tracing::warn!(bytes = line.len(), "supervisor.exec_agent.bad_answer"),
        }
    }
    agent.alive.store(false, Ordering::SeqCst);
    agent.pending.clear();
    tracing::info!("supervisor.exec_agent.ended");
}

/// The agent's standard output cut into lines.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    /// How much of `buf` holds no newline.
    scanned: usize,
}

impl Lines {
    /// The next line (without its newline); `None` at the end of the stream, on an error, or
    /// past [`MAX_LINE`].
    async fn next(&mut self, output: &mut Output) -> Option<Vec<u8>> {
        loop {
            if let Some(at) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + at;
                let line = self.buf[..end].to_vec();
                self.buf.drain(..=end);
                self.scanned = 0;
                return Some(line);
            }
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_LINE {
                return None;
            }
            match output.next().await? {
                Ok(LogOutput::StdOut { message }) => self.buf.extend_from_slice(&message),
                Ok(LogOutput::StdErr { message }) => {
                    tracing::warn!(bytes = message.len(), "supervisor.exec_agent.stderr");
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
}

/// A container's agent, or when it could not be started.
enum Slot {
    None,
    Ready(Arc<Agent>),
    Unavailable(Instant),
}

/// The agents of the running computers, by full container id.
#[derive(Default)]
pub struct Agents {
    slots: DashMap<String, Arc<Mutex<Slot>>>,
}

impl Agents {
    /// The agent of the running container `container`, started when it has none (or its last
    /// one ended); `None` when none can run there (scripts then go through the engine exec).
    pub async fn get(&self, docker: &Docker, container: &str) -> Option<Arc<Agent>> {
        let slot = self
            .slots
            .entry(container.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(Slot::None)))
            .clone();
        let mut slot = slot.lock().await;
        match &*slot {
            Slot::Ready(agent) if agent.alive() => return Some(agent.clone()),
            Slot::Unavailable(since) if since.elapsed() < RETRY_AFTER => return None,
            _ => {}
        }
        match Agent::start(docker, container).await {
            Ok(agent) => {
                tracing::info!("supervisor.exec_agent.started");
                *slot = Slot::Ready(agent.clone());
                Some(agent)
            }
            Err(e) => {
                tracing::warn!(error = %e, "supervisor.exec_agent.unavailable");
                *slot = Slot::Unavailable(Instant::now());
                None
            }
        }
    }

    /// The agent of `container` if one is running now (none is started).
    pub fn running(&self, container: &str) -> Option<Arc<Agent>> {
        let slot = self.slots.get(container)?.clone();
        let slot = slot.try_lock().ok()?;
        match &*slot {
            Slot::Ready(agent) if agent.alive() => Some(agent.clone()),
            _ => None,
        }
    }

    /// Forgets the agent of a container that is stopped or removed.
    pub fn forget(&self, container: &str) {
        if let Some((_, slot)) = self.slots.remove(container)
            && let Ok(slot) = slot.try_lock()
            && let Slot::Ready(agent) = &*slot
        {
            agent.end();
        }
    }
}
