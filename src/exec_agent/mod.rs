//! The exec agent of each running computer (`agent.py`): one exec held open per machine (an
//! engine exec in a Docker container, a `pods/exec` in a Kubernetes pod, a process started by
//! envd with its input kept open on an E2B sandbox), over which scripts go
//! as one JSON line each way. A script then costs a message and one process start in the
//! machine instead of a new exec and the exec wrapper's seven process starts.
//!
//! The agent runs as uid 1000 like every script, so the bot can kill or stop it: a script under
//! way then fails ([`Outcome::Ended`]) or passes its deadline ([`Outcome::Stuck`]); the agent is
//! given up, the script is killed through its pid file ([`kill_script`], by the exec that runs
//! scripts without an agent), and the next script starts a new agent. The agent makes itself
//! undumpable as it starts, so from then on the bot cannot open its pipes through `/proc`. A
//! machine without `python3` (an operator's own image) runs every script through its exec
//! instead, and a new agent is tried after [`RETRY_AFTER`].

pub mod sealed;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use dashmap::DashMap;
use rakazo_actors::provider::ExecOutput;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, oneshot};

/// The agent's program.
pub const SOURCE: &str = include_str!("agent.py");
/// How long a new agent has to say it is ready.
pub const READY_WITHIN: Duration = Duration::from_secs(10);
/// How long a machine whose agent could not start runs scripts through its exec before a new
/// agent is tried.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// The longest line an agent may write (two capped outputs in base64, and the rest).
const MAX_LINE: usize = 4 << 20;

/// The agent's command line.
pub fn argv() -> Vec<String> {
    ["python3", "-I", "-S", "-c", SOURCE, "rakazo-exec-agent"]
        .map(String::from)
        .to_vec()
}

/// [`argv`] under `env -i` with the runtime's minimal environment only, so that a script gets
/// exactly the environment it is given (nothing of the machine's own, such as what its exec
/// adds).
pub fn argv_in_minimal_env() -> Vec<String> {
    let mut all = vec!["env".to_string(), "-i".into()];
    all.extend(
        crate::desktop::command::minimal_env()
            .iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    all.extend(argv());
    all
}

/// The agent run on this host as a child process (`extra` after its name): the channel to
/// it, and the child (killed when dropped). For this host's own tests and benchmarks: no
/// provider runs scripts through an agent here.
pub fn spawn_here(extra: &[&str]) -> std::io::Result<(Channel, tokio::process::Child)> {
    let argv = argv();
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(std::io::Error::other("the agent's pipes were not made"));
    };
    let channel = Channel {
        input: Box::pin(input),
        output: Box::pin(output),
        keep: Box::new(()),
    };
    Ok((channel, child))
}

/// A script that kills the process group of the script `run_id` by the pid it left (the
/// agent's file, or the exec wrapper's), for when no agent answers. `run_id` is 32 hex digits.
pub fn kill_script(run_id: &str) -> String {
    format!(
        "for f in /dev/shm/.rakazo-exec/{run_id} /tmp/.rakazo-exec/{run_id}/pid; do p=$(cat $f 2>/dev/null) && kill -KILL -- \"-$p\" 2>/dev/null; done; rm -rf /dev/shm/.rakazo-exec/{run_id} /tmp/.rakazo-exec/{run_id}"
    )
}

/// The exec an agent runs in: its standard input and output, and what must be kept while it
/// runs (the exec's own handle, whose drop may end it).
pub struct Channel {
    /// The agent's standard input.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
    /// The agent's standard output.
    pub output: Pin<Box<dyn AsyncRead + Send>>,
    /// Kept until the agent is given up.
    pub keep: Box<dyn Send>,
}

/// A long-lived program an agent keeps for this process, asked one line at a time
/// ([`Agent::ask`]): it answers each line it reads on its standard input with one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Helper {
    /// Names the helper within its machine: the same key is the same process while it runs.
    pub key: String,
    /// Its command line (run in a session of its own, from `/`).
    pub argv: Vec<String>,
    /// What it gets beside the agent's environment.
    pub env: Vec<(String, String)>,
}

/// A script for an agent.
pub struct Script<'a> {
    /// `bash -c` this.
    pub script: &'a str,
    /// Absolute working directory.
    pub cwd: &'a str,
    /// The complete environment.
    pub env: &'a [(String, String)],
}

/// The agent ended (or was given up) before it answered.
#[derive(Debug)]
pub struct Ended;

/// Why a request got no outcome.
#[derive(Debug)]
pub enum Lost {
    /// The agent ended (or was given up) before it answered.
    Ended,
    /// No process could start it (the machine's process limit, say): nothing ran, and the agent
    /// goes on.
    Refused(String),
}

/// What became of a script sent to an agent with [`Agent::run_within`].
pub enum Outcome {
    /// The agent answered.
    Answered(ExecOutput),
    /// The agent ended with the script under way; it is given up.
    Ended,
    /// No process could start the script; nothing ran, and the agent goes on.
    Refused(String),
    /// No answer past the deadline and the grace: the agent is stuck (stopped by the bot) and
    /// given up; the script counts as timed out.
    Stuck,
}

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
    /// Set when no process could start the request (the agent goes on).
    #[serde(default)]
    refused: Option<String>,
}

/// One running agent.
pub struct Agent {
    input: Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    pending: DashMap<u64, oneshot::Sender<Answer>>,
    next_id: AtomicU64,
    alive: AtomicBool,
    reader: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    keep: std::sync::Mutex<Option<Box<dyn Send>>>,
}

/// Removes a request's waiter when its caller stops waiting.
struct Waiting<'a>(&'a Agent, u64);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.pending.remove(&self.1);
    }
}

impl Agent {
    /// The agent started over `channel`, once it says it is ready (within [`READY_WITHIN`]).
    pub async fn over(channel: Channel) -> Result<Arc<Self>, String> {
        let Channel {
            input,
            mut output,
            keep,
        } = channel;
        let mut lines = Lines::default();
        let first = tokio::time::timeout(READY_WITHIN, lines.next(&mut output))
            .await
            .map_err(|_| "the exec agent did not start in time".to_owned())?;
        if first.as_deref() != Some(br#"{"ready":1}"#.as_slice()) {
            return Err("the exec agent did not start".into());
        }
        let agent = Arc::new(Self {
            input: Mutex::new(input),
            pending: DashMap::new(),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
            reader: std::sync::Mutex::new(None),
            keep: std::sync::Mutex::new(Some(keep)),
        });
        let reading = tokio::spawn(read_answers(agent.clone(), output, lines));
        *agent.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(reading.abort_handle());
        Ok(agent)
    }

    /// Whether the agent still answers.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Gives the agent up: waiters get [`Ended`], its exec is closed (its stdin with it, so an
    /// agent that runs again exits once its scripts end).
    pub fn end(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.pending.clear();
        if let Some(reader) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
        drop(self.keep.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    async fn send(&self, line: Vec<u8>) -> Result<(), Ended> {
        let mut input = self.input.lock().await;
        let sent = async {
            input.write_all(&line).await?;
            input.flush().await
        };
        sent.await.map_err(|_| Ended)
    }

    /// Sends `request` (given its id here) and waits for its answer.
    async fn request(&self, mut request: serde_json::Value) -> Result<ExecOutput, Lost> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.insert(id, tx);
        let _waiting = Waiting(self, id);
        // Checked after the waiter is in: an agent ending meanwhile has cleared it or is seen.
        if !self.alive() {
            return Err(Lost::Ended);
        }
        request["id"] = id.into();
        let mut line = serde_json::to_vec(&request).map_err(|_| Lost::Ended)?;
        line.push(b'\n');
        if self.send(line).await.is_err() {
            self.end();
            return Err(Lost::Ended);
        }
        let answer = rx.await.map_err(|_| Lost::Ended)?;
        if let Some(reason) = answer.refused {
            return Err(Lost::Refused(reason));
        }
        if answer.error.is_some() {
            return Err(Lost::Ended);
        }
        let text = |b64: &str| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(ExecOutput {
            exit_code: if answer.timed_out { -1 } else { answer.code },
            stdout: text(&answer.out),
            stderr: text(&answer.err),
            timed_out: answer.timed_out,
        })
    }

    /// Runs `script` under `run_id`; the agent kills it at `timeout`.
    pub async fn run(
        &self,
        run_id: &str,
        script: &Script<'_>,
        timeout: Duration,
    ) -> Result<ExecOutput, Lost> {
        self.request(serde_json::json!({
            "run": run_id,
            "script": script.script,
            "env": script.env,
            "cwd": script.cwd,
            "timeout": timeout.as_secs_f64(),
        }))
        .await
    }

    /// Asks the helper `helper` one `line`: its answer line as the output's `stdout` (exit code
    /// 0), or the helper's last words (another code; `timed_out` when `timeout` passed). The
    /// agent starts the helper if it has none, and gives up one that ended or ran late. A
    /// `line` with a line end in it is refused: the helper would read it as two.
    pub async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, Lost> {
        if line.contains(['\n', '\r']) {
            return Err(Lost::Refused("a helper is asked one line at a time".into()));
        }
        self.request(serde_json::json!({
            "op": "ask",
            "helper": helper.key,
            "argv": helper.argv,
            "env": helper.env,
            "line": line,
            "timeout": timeout.as_secs_f64(),
        }))
        .await
    }

    /// [`Self::run`], waiting at most `grace` past `timeout`; an agent that ended or is stuck
    /// is given up.
    pub async fn run_within(
        &self,
        run_id: &str,
        script: &Script<'_>,
        timeout: Duration,
        grace: Duration,
    ) -> Outcome {
        match tokio::time::timeout(timeout + grace, self.run(run_id, script, timeout)).await {
            Ok(Ok(output)) => Outcome::Answered(output),
            Ok(Err(Lost::Refused(reason))) => Outcome::Refused(reason),
            Ok(Err(Lost::Ended)) => {
                self.end();
                Outcome::Ended
            }
            Err(_) => {
                self.end();
                Outcome::Stuck
            }
        }
    }

    /// [`Self::ask`], waiting at most `grace` past `timeout`: the answer line, or why there is
    /// none. An agent that ended or is stuck is given up.
    pub async fn ask_within(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
        grace: Duration,
    ) -> Result<String, String> {
        match tokio::time::timeout(timeout + grace, self.ask(helper, line, timeout)).await {
            Ok(Ok(out)) if out.exit_code == 0 => Ok(out.stdout),
            Ok(Ok(out)) if out.timed_out => Err("the helper did not answer in time".into()),
            Ok(Ok(out)) => Err(format!("the helper ended: {}", out.stderr.trim())),
            Ok(Err(Lost::Refused(reason))) => Err(format!("the helper cannot start: {reason}")),
            Ok(Err(Lost::Ended)) => {
                self.end();
                Err("the script runner ended".into())
            }
            Err(_) => {
                self.end();
                Err("the script runner did not answer in time".into())
            }
        }
    }

    /// Kills the process group of the script `run_id` (one not started yet never starts).
    pub async fn kill(&self, run_id: &str) -> Result<(), Ended> {
        let mut line = serde_json::to_vec(&serde_json::json!({ "op": "kill", "run": run_id }))
            .map_err(|_| Ended)?;
        line.push(b'\n');
        self.send(line).await
    }
}

/// The outcome of a script whose agent was stuck past its deadline ([`Outcome::Stuck`]):
/// timed out, nothing captured.
pub fn stuck_output() -> ExecOutput {
    ExecOutput {
        exit_code: -1,
        stdout: String::new(),
        stderr: String::new(),
        timed_out: true,
    }
}

type Output = Pin<Box<dyn AsyncRead + Send>>;

/// Hands each answer to its waiter until the agent's output ends.
async fn read_answers(agent: Arc<Agent>, mut output: Output, mut lines: Lines) {
    while let Some(line) = lines.next(&mut output).await {
        match serde_json::from_slice::<Answer>(&line) {
            Ok(answer) => {
                if let Some((_, waiter)) = agent.pending.remove(&answer.id) {
                    let _ = waiter.send(answer);
                }
            }
            Err(_) => tracing::warn!(bytes = line.len(), "exec_agent.bad_answer"),
        }
    }
    agent.alive.store(false, Ordering::SeqCst);
    agent.pending.clear();
    tracing::info!("exec_agent.ended");
}

/// The agent's standard output cut into lines.
#[derive(Default)]
struct Lines {
    buf: Vec<u8>,
    /// How much of `buf` holds no newline.
    scanned: usize,
}

impl Lines {
    /// The next line (without its newline); `None` at the end of the output, on an error, or
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
            self.buf.reserve(64 << 10);
            match output.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }
}

/// A machine's agent, or when it could not be started.
enum State {
    None,
    Ready(Arc<Agent>),
    Unavailable(Instant),
}

/// The agent of one machine: started on first use, started again after it ended.
pub struct AgentSlot(Mutex<State>);

impl Default for AgentSlot {
    fn default() -> Self {
        Self(Mutex::new(State::None))
    }
}

impl AgentSlot {
    /// The machine's agent, started by `start` when it has none (or its last one ended);
    /// `None` when none can run there (scripts then go through the machine's exec).
    pub async fn get<F, Fut>(&self, start: F) -> Option<Arc<Agent>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<Agent>, String>>,
    {
        let mut state = self.0.lock().await;
        match &*state {
            State::Ready(agent) if agent.alive() => return Some(agent.clone()),
            State::Unavailable(since) if since.elapsed() < RETRY_AFTER => return None,
            _ => {}
        }
        match start().await {
            Ok(agent) => {
                tracing::info!("exec_agent.started");
                *state = State::Ready(agent.clone());
                Some(agent)
            }
            Err(error) => {
                tracing::warn!(%error, "exec_agent.unavailable");
                *state = State::Unavailable(Instant::now());
                None
            }
        }
    }

    /// Whether [`get`](Self::get) would start an agent now: none runs, none is starting, and
    /// the last failed start (if any) is [`RETRY_AFTER`] old.
    pub fn may_start(&self) -> bool {
        let Ok(state) = self.0.try_lock() else {
            return false;
        };
        match &*state {
            State::Ready(agent) => !agent.alive(),
            State::Unavailable(since) => since.elapsed() >= RETRY_AFTER,
            State::None => true,
        }
    }

    /// The agent if one is running now (none is started).
    pub fn running(&self) -> Option<Arc<Agent>> {
        let state = self.0.try_lock().ok()?;
        match &*state {
            State::Ready(agent) if agent.alive() => Some(agent.clone()),
            _ => None,
        }
    }

    /// Gives up the agent, if one runs (its machine is stopped or gone).
    pub fn end(&self) {
        if let Ok(state) = self.0.try_lock()
            && let State::Ready(agent) = &*state
        {
            agent.end();
        }
    }
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel to a pretend agent, and the pretend agent's end.
    fn channel() -> (Channel, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 10);
        let (read, write) = tokio::io::split(ours);
        (
            Channel {
                input: Box::pin(write),
                output: Box::pin(read),
                keep: Box::new(()),
            },
            theirs,
        )
    }

    /// The next request the pretend agent reads.
    async fn next_request(
        requests: &mut tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
    ) -> serde_json::Value {
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(requests, &mut line)
            .await
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test]
    async fn an_agent_that_never_says_ready_is_refused() {
        let (channel, mut theirs) = channel();
        theirs.write_all(b"{\"ready\":0}\n").await.unwrap();
        assert!(Agent::over(channel).await.is_err());
    }

    #[tokio::test]
    async fn answers_reach_their_scripts_and_an_ended_agent_fails_the_rest() {
        let (channel, theirs) = channel();
        let (their_read, mut their_write) = tokio::io::split(theirs);
        their_write.write_all(b"{\"ready\":1}\n").await.unwrap();
        let agent = Agent::over(channel).await.unwrap();
        let mut requests = tokio::io::BufReader::new(their_read);
        let script = Script {
            script: "true",
            cwd: "/",
            env: &[],
        };
        let run = agent.run("r", &script, Duration::from_secs(1));
        let answer = async {
            let req = next_request(&mut requests).await;
            assert_eq!(req["script"], "true");
            let reply = format!(
                "{{\"id\":{},\"code\":3,\"out\":\"aGk=\",\"err\":\"\"}}\n",
                req["id"]
            );
            their_write.write_all(reply.as_bytes()).await.unwrap();
        };
        let (ran, ()) = tokio::join!(run, answer);
        let ran = ran.unwrap();
        assert_eq!((ran.exit_code, ran.stdout.as_str()), (3, "hi"));

        // A script no process could start is refused; the agent goes on.
        let run = agent.run_within("t", &script, Duration::from_secs(1), Duration::ZERO);
        let refuse = async {
            let req = next_request(&mut requests).await;
            let reply = format!("{{\"id\":{},\"refused\":\"no pids\"}}\n", req["id"]);
            their_write.write_all(reply.as_bytes()).await.unwrap();
        };
        let (refused, ()) = tokio::join!(run, refuse);
        assert!(matches!(refused, Outcome::Refused(r) if r == "no pids"));
        assert!(agent.alive(), "a refusal leaves the agent running");
        drop(their_write);
        drop(requests);
        let lost = agent
            .run_within("s", &script, Duration::from_secs(1), Duration::ZERO)
            .await;
        assert!(matches!(lost, Outcome::Ended));
        assert!(!agent.alive());
    }

    /// The real agent, run here with `--idle-exit`: it never ends under a request, and ends
    /// once none came for that long.
    #[tokio::test]
    async fn an_agent_told_to_exit_when_idle_waits_for_its_requests_then_exits() {
        let (channel, mut child) = spawn_here(&["--idle-exit", "0.5"]).expect("python3 runs it");
        let agent = Agent::over(channel).await.unwrap();
        let script = Script {
            script: "sleep 1; echo slept",
            cwd: "/",
            env: &[("PATH".into(), "/usr/bin:/bin".into())],
        };
        let out = agent
            .run(
                "0123456789abcdef0123456789abcdef",
                &script,
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, "slept\n", "not ended under a request");
        assert!(child.try_wait().unwrap().is_none());
        let exited = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        assert!(exited.unwrap().unwrap().success(), "ended once idle");
    }

    /// A slot may start an agent when it has none, not while one starts or runs, not within
    /// [`RETRY_AFTER`] of a failed start, and again once its agent ended.
    #[tokio::test]
    async fn a_slot_may_start_an_agent_only_when_none_runs_or_starts() {
        let slot = AgentSlot::default();
        assert!(slot.may_start());
        let (channel, mut theirs) = channel();
        theirs.write_all(b"{\"ready\":1}\n").await.unwrap();
        let started = slot.get(|| async {
            assert!(!slot.may_start(), "not while one starts");
            Agent::over(channel).await
        });
        let agent = started.await.expect("started");
        assert!(!slot.may_start(), "not while one runs");
        agent.end();
        assert!(slot.may_start(), "again once it ended");
        assert!(
            slot.get(|| async { Err("no python3".into()) })
                .await
                .is_none()
        );
        assert!(!slot.may_start(), "not right after a failed start");
    }

    #[tokio::test]
    async fn a_line_with_a_line_end_is_never_sent_to_a_helper() {
        let (channel, theirs) = channel();
        let (their_read, mut their_write) = tokio::io::split(theirs);
        their_write.write_all(b"{\"ready\":1}\n").await.unwrap();
        let agent = Agent::over(channel).await.unwrap();
        let helper = Helper {
            key: "k".into(),
            argv: vec!["cat".into()],
            env: Vec::new(),
        };
        for line in ["grab\nreads", "grab\r"] {
            let asked = agent.ask(&helper, line, Duration::from_secs(1)).await;
            assert!(matches!(asked, Err(Lost::Refused(_))), "{line:?}");
        }
        assert!(agent.alive());
        // Nothing reached the agent: the first request it reads is the next ask.
        let mut requests = tokio::io::BufReader::new(their_read);
        let ask = agent.ask(&helper, "grab", Duration::from_secs(1));
        let answer = async {
            let req = next_request(&mut requests).await;
            assert_eq!(req["line"], "grab");
            let reply = format!("{{\"id\":{},\"code\":0,\"out\":\"aGk=\"}}\n", req["id"]);
            their_write.write_all(reply.as_bytes()).await.unwrap();
        };
        let (asked, ()) = tokio::join!(ask, answer);
        assert_eq!(asked.unwrap().stdout, "hi");
    }
}
