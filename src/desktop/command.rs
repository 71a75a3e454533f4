//! Running commands on the machine: the [`CommandRunner`] port and its host implementation.
//!
//! The desktop runtime needs nothing else from a provider to start and stop its processes:
//! every operation is a short shell script, so a remote provider implements [`CommandRunner::run`]
//! with its vendor's "run a command" call and inherits `spawn`, `stop` and `is_running`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::ExecOutput;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::cgroup::Join;
use super::{DesktopError, shell_quote};
use crate::exec_agent::Helper;

/// How long the short lifecycle scripts of the runtime may take.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(20);

/// Cap on captured stdout and stderr, each; the rest is drained and dropped.
pub const OUTPUT_CAP: usize = 1 << 20;

/// A long-lived process to start in the background.
#[derive(Clone, Debug, Default)]
pub struct SpawnSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// The complete environment of the process (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Working directory (absolute); `/` when empty.
    pub cwd: String,
    /// File receiving stdout and stderr; `/dev/null` when empty.
    pub log: String,
    /// How much lower than the runner's the process's CPU priority is: its nice value and that
    /// of its session's scheduling autogroup are raised by this much (0 = the runner's). An
    /// unprivileged process can lower its priority but never raise it back, so this is for
    /// good, and every process it starts inherits it.
    pub nice: u8,
    /// Control groups the process joins before its program starts, so that it and everything
    /// it forks is born there: the script starting it writes its own pid into each file, in
    /// order, and starts nothing when a required one refuses. Only for a machine whose group
    /// files are this host's ([`CommandRunner::on_this_host`]).
    pub join: Vec<Join>,
}

/// Runs shell scripts on the machine.
#[async_trait]
pub trait CommandRunner: Send + Sync + 'static {
    /// Runs `script` with `bash -c`, waiting at most `timeout` (then the script is killed and
    /// `timed_out` is set). A non-zero exit is an outcome, not an error.
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError>;

    /// Starts a process in its own session and process group, detached from the runner, and
    /// returns its pid (which is also its process group id).
    async fn spawn(&self, spec: &SpawnSpec) -> Result<u32, DesktopError> {
        let out = self.run_spawn("", spec).await?;
        spawned_pid(spec, &out)
    }

    /// [`Self::spawn`] after `before`, in one script (one round trip on a machine reached
    /// through its vendor's exec). `before` prints nothing and ends with `exit` only to refuse:
    /// then nothing starts and its outcome is the inner error.
    async fn spawn_after(
        &self,
        before: &str,
        spec: &SpawnSpec,
    ) -> Result<Result<u32, ExecOutput>, DesktopError> {
        let out = self.run_spawn(&format!("{before}\n"), spec).await?;
        if out.exit_code != 0 {
            return Ok(Err(out));
        }
        spawned_pid(spec, &out).map(Ok)
    }

    /// Runs `before`, then the script that starts `spec`. A tagged program outside its group
    /// must carry its tag before the answer (the group's scan for it comes next): where the
    /// machine's exec sets the script's own environment, the script is given the tag, so the
    /// program's fork carries it from the start; elsewhere the script waits for the exec.
    async fn run_spawn(&self, before: &str, spec: &SpawnSpec) -> Result<ExecOutput, DesktopError> {
        let tag = spec
            .env
            .iter()
            .find(|(k, _)| k == TAG_VAR)
            .filter(|_| spec.join.is_empty());
        match tag {
            Some(tag) if self.sets_env() => {
                let script = format!("{before}{}", spawn_script(spec, false));
                self.run_with_env(&script, std::slice::from_ref(tag), SCRIPT_TIMEOUT)
                    .await
            }
            _ => {
                let script = format!("{before}{}", spawn_script(spec, tag.is_some()));
                self.run(&script, SCRIPT_TIMEOUT).await
            }
        }
    }

    /// [`Self::run`] with `env` added to the script's own environment where the machine's exec
    /// sets one ([`Self::sets_env`]); elsewhere `env` is not set.
    async fn run_with_env(
        &self,
        script: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, DesktopError> {
        let _ = env;
        self.run(script, timeout).await
    }

    /// Whether [`Self::run_with_env`] starts the script with the environment it is given.
    fn sets_env(&self) -> bool {
        false
    }

    /// Whether this runner keeps long-lived helpers ([`Self::ask`] answers).
    fn keeps_helpers(&self) -> bool {
        false
    }

    /// Asks the machine's long-lived `helper` one line, through a runner that keeps helpers
    /// (a machine's exec agent): its answer line, or why there is none. `None` where this
    /// runner keeps no helpers: the caller runs a script instead.
    async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Option<Result<String, DesktopError>> {
        let _ = (helper, line, timeout);
        None
    }

    /// Called before the machine's screen gateway stops: a runner whose scripts reach the
    /// machine through that gateway (an exec agent listening behind it) gives that way up
    /// first, and until [`Self::gateway_started`], so the scripts that stop the gateway do not
    /// go through what they stop.
    fn gateway_stopping(&self) {}

    /// Called once the machine's screen gateway listens again after it was started.
    fn gateway_started(&self) {}

    /// Stops the process group led by `pid`: SIGTERM to the leader (so a browser can save its
    /// session and cookies), up to `grace` for it to exit, then SIGKILL to the whole group.
    /// Succeeds when the leader is gone (or was never there).
    async fn stop(&self, pid: u32, grace: Duration) -> Result<(), DesktopError> {
        let out = self
            .run(&stop_script(pid, grace), grace + SCRIPT_TIMEOUT)
            .await?;
        if out.exit_code == 0 {
            Ok(())
        } else {
            Err(DesktopError::Stack(format!(
                "process {pid} survived SIGKILL"
            )))
        }
    }

    /// Waits up to `timeout` for every process of the group led by `pid` to exit on its own;
    /// answers whether they did.
    async fn wait_exit(&self, pid: u32, timeout: Duration) -> Result<bool, DesktopError> {
        let steps = (timeout.as_millis() / 50).max(1);
        let script = format!(
            "{GROUP_ALIVE_FN}\ni=0; while group_alive {pid}; do [ $i -ge {steps} ] && exit 1; sleep 0.05; i=$((i+1)); done\n"
        );
        let out = self.run(&script, timeout + SCRIPT_TIMEOUT).await?;
        Ok(out.exit_code == 0)
    }

    /// Whether scripts run on this host as this process's user, so that what a short script
    /// would do to the machine's files and processes can be done here by system calls
    /// ([`super::profile_local`]) without starting a process.
    fn on_this_host(&self) -> bool {
        false
    }

    /// Whether `pid` is a live (not zombie) process.
    async fn is_running(&self, pid: u32) -> Result<bool, DesktopError> {
        let out = self
            .run(&format!("{}\nalive {pid}", ALIVE_FN), SCRIPT_TIMEOUT)
            .await?;
        Ok(out.exit_code == 0)
    }
}

fn program(spec: &SpawnSpec) -> &str {
    spec.argv.first().map(String::as_str).unwrap_or("<nothing>")
}

/// Writes an embedded helper program into `dir` on the machine, once per version (its file
/// name carries a hash of `source`), and returns its path there. Concurrent installs (two
/// screens opening at once) each write their own temporary file and rename it into place.
pub async fn install_program(
    runner: &dyn CommandRunner,
    dir: &std::path::Path,
    name: &str,
    source: &str,
) -> Result<PathBuf, DesktopError> {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(source.as_bytes());
    let hex = hex::encode(&hash[..8]);
    let path = dir.join(format!("{name}-{hex}.py"));
    let q = shell_quote(&path.to_string_lossy());
    let script = format!(
        "set -e\nmkdir -p {d}\nchmod 700 {d}\nif [ ! -s {q} ]; then\ncat > {q}.tmp.$$ <<'RAKAZO_PROGRAM_EOF'\n{source}RAKAZO_PROGRAM_EOF\nmv -f {q}.tmp.$$ {q}\nfi\ncommand -v python3 >/dev/null || {{ echo 'python3 is missing' >&2; exit 127; }}",
        d = shell_quote(&dir.to_string_lossy()),
    );
    let out = runner.run(&script, SCRIPT_TIMEOUT).await?;
    if out.exit_code != 0 {
        return Err(DesktopError::Stack(format!(
            "{name}: the helper could not be installed on the computer ({})",
            out.stderr.trim()
        )));
    }
    Ok(path)
}

/// How a freshly spawned process came up (see [`wait_ready`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The probe succeeded.
    Ready,
    /// The process exited (or became a zombie) first.
    Exited,
    /// Time ran out with the process still alive.
    TimedOut,
}

/// The last line of a log on the machine, with each of `secrets` replaced by `<redacted>`,
/// then cut to 200 characters (empty when unreadable): what a program that would not start
/// said last.
pub async fn last_log_line(runner: &dyn CommandRunner, log: &str, secrets: &[&str]) -> String {
    let out = runner
        .run(
            &format!("tail -n 1 {} 2>/dev/null", shell_quote(log)),
            SCRIPT_TIMEOUT,
        )
        .await
        .map(|o| o.stdout)
        .unwrap_or_default();
    let line = secrets.iter().fold(out.trim().to_string(), |line, s| {
        line.replace(s, "<redacted>")
    });
    line.chars().take(200).collect()
}

/// Polls `probe` (a shell test) every 50 ms until it succeeds, `pid` dies or `timeout` passes.
pub async fn wait_ready(
    runner: &dyn CommandRunner,
    pid: u32,
    probe: &str,
    timeout: Duration,
) -> Result<Readiness, DesktopError> {
    let script = format!(
        "{ALIVE_FN}\nfor i in $(seq 1 {n}); do ({probe}) 2>/dev/null && exit 0; alive {pid} || exit 2; sleep 0.05; done; exit 1",
        n = (timeout.as_millis() / 50).max(1),
    );
    let out = runner.run(&script, timeout + SCRIPT_TIMEOUT).await?;
    Ok(match out.exit_code {
        0 => Readiness::Ready,
        2 => Readiness::Exited,
        _ => Readiness::TimedOut,
    })
}

const GROUP_ALIVE_FN: &str =
    r#"group_alive() { ps -o stat= -g "$1" 2>/dev/null | grep -qv '^Z'; }"#;

/// `alive PID`: whether the process runs (a zombie or a dead one does not), read from its
/// `/proc` entry by shell builtins: no process starts for it (a `ps` each took a millisecond or
/// more, and readiness loops ask every 50 ms). The state is the first field after the last `)`
/// (a process name may hold spaces and parentheses).
pub const ALIVE_FN: &str = r#"alive() { local s; { read -r s < "/proc/$1/stat"; } 2>/dev/null || return 1; s=${s##*") "}; [ -n "$s" ] && [ "${s#[ZX]}" = "$s" ]; }"#;

/// `release_shm PID...`: removes the System V shared memory segments that the given (now
/// dead) processes created. x11vnc and Chromium attach dozens of segments and remove them only
/// on an orderly exit; after a SIGKILL they would stay until the machine reboots, and once the
/// kernel's table (`kernel.shmmni`, 4096) is full no new screen can start. `ipcrm` where the
/// machine has it, else the same system call through Python.
const RELEASE_SHM_FN: &str = r#"release_shm() {
  [ $# -gt 0 ] || return 0
  for id in $(ipcs -m -p 2>/dev/null | awk -v list=" $* " 'NR>3 && $1 ~ /^[0-9]+$/ && index(list, " " $3 " ") {print $1}'); do
    ipcrm -m "$id" 2>/dev/null || python3 -I -c 'import ctypes,sys; ctypes.CDLL(None).shmctl(int(sys.argv[1]), 0, None)' "$id" 2>/dev/null
  done
  return 0
}"#;

/// The pid a spawn script printed.
fn spawned_pid(spec: &SpawnSpec, out: &ExecOutput) -> Result<u32, DesktopError> {
    out.stdout.trim().parse::<u32>().map_err(|_| {
        DesktopError::Command(format!(
            "spawn of {} printed no pid: {}",
            program(spec),
            out.stderr.trim()
        ))
    })
}

/// The script that starts `spec` and prints its pid; with `wait_for_tag`, only once the
/// program carries its [`TAG_VAR`].
fn spawn_script(spec: &SpawnSpec, wait_for_tag: bool) -> String {
    let cwd = if spec.cwd.is_empty() {
        "/"
    } else {
        spec.cwd.as_str()
    };
    let log = if spec.log.is_empty() {
        "/dev/null"
    } else {
        spec.log.as_str()
    };
    let env: Vec<String> = spec
        .env
        .iter()
        .map(|(k, v)| shell_quote(&format!("{k}={v}")))
        .collect();
    let argv: Vec<String> = spec.argv.iter().map(|a| shell_quote(a)).collect();
    // The script joins the groups first: the program, forked next, is born in them.
    let join: String = spec
        .join
        .iter()
        .map(|j| {
            let file = shell_quote(&j.procs.to_string_lossy());
            let refused = if j.required {
                format!(
                    " || {{ echo {} >&2; exit 5; }}",
                    shell_quote(&format!(
                        "cannot join the control group of {}",
                        j.procs.display()
                    ))
                )
            } else {
                String::new()
            };
            format!("{{ echo $$ > {file}; }} 2>/dev/null{refused}\n")
        })
        .collect();
    // A tagged program started outside its group is waited for until it carries its tag (the
    // fork runs with this shell's environment until `env` execs), so a control group's scan
    // for the tag right after the spawn finds it.
    let wait = if wait_for_tag {
        format!(
            "n=0; while [ $n -lt 400 ] && [ -e /proc/$pid ] && ! grep -qz '^{TAG_VAR}=' /proc/$pid/environ 2>/dev/null; do sleep 0.005; n=$((n+1)); done\n"
        )
    } else {
        String::new()
    };
    // `setsid` is not a group leader here (no job control), so it calls setsid() itself and
    // execs: `$!` is the pid of the final program and of its new process group.
    format!(
        "cd {cwd} || exit 1\n{join}env -i {env} setsid {lower}{argv} >{log} 2>&1 </dev/null &\npid=$!\n{wait}echo $pid",
        cwd = shell_quote(cwd),
        env = env.join(" "),
        lower = lower_priority(spec.nice),
        argv = argv.join(" "),
        log = shell_quote(log),
    )
}

/// The words before a program that start it `nice` steps below the runner's CPU priority
/// (empty for 0), each word exec'ing the next so the program keeps the spawned pid.
///
/// `nice` lowers the process's own priority. Where the kernel groups processes by session for
/// scheduling (autogroups: on a host whose processes share the root CPU control group), the
/// new session that `setsid` made is a group of its own and competes with every other session
/// as a whole, whatever the nice values inside it; so the group's nice value is set too,
/// through `/proc/self/autogroup`, before the program starts. The kernel lets an
/// unprivileged process change a group's value only once in a tenth of a second (machine-wide),
/// hence a few tries; when they all fail (many desktops starting at once as an unprivileged
/// user on a host) the program starts with its own nice value only. Inside a container,
/// whose processes share its control group, autogroups play no part and the write is harmless.
fn lower_priority(nice: u8) -> String {
    if nice == 0 {
        return String::new();
    }
    let group = format!(
        "i=0; while [ -e /proc/self/autogroup ] && [ $i -lt 8 ]; do \
         {{ echo {nice} > /proc/self/autogroup; }} 2>/dev/null && break; sleep 0.03; i=$((i+1)); done; \
         exec \"$@\""
    );
    format!(
        "nice -n {nice} bash -c {} rakazo-lower ",
        shell_quote(&group)
    )
}

fn stop_script(pid: u32, grace: Duration) -> String {
    let steps = (grace.as_millis() / 50).max(1);
    // Wait for the whole group, not just its leader: Chromium's network service writes the
    // cookie database after the browser process is gone.
    // The group's members are listed before anything is killed, so that the shared memory
    // they leave behind can be released once they are gone.
    format!(
        "{ALIVE_FN}\n{GROUP_ALIVE_FN}\n{RELEASE_SHM_FN}\npid={pid}\n\
         members=$(ps -eo pid=,pgid= | awk -v g=\"$pid\" '$2 == g {{print $1}}')\n\
         kill -TERM \"$pid\" 2>/dev/null\n\
         i=0; while group_alive \"$pid\" && [ $i -lt {steps} ]; do sleep 0.05; i=$((i+1)); done\n\
         kill -KILL -- \"-$pid\" 2>/dev/null; kill -KILL \"$pid\" 2>/dev/null\n\
         i=0; while alive \"$pid\" && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done\n\
         alive \"$pid\" && exit 1\nrelease_shm $members\nexit 0\n"
    )
}

/// Runs scripts as local processes on this host, with a fixed minimal environment.
#[derive(Clone, Debug)]
pub struct HostRunner {
    /// The whole environment of every script (nothing of the server's own is inherited).
    env: Vec<(String, String)>,
    /// Working directory of every script.
    cwd: PathBuf,
    /// `bash` as found on the environment's `PATH`, by its full path: the standard library
    /// then starts it with `posix_spawn` (the child shares the server's memory until it
    /// executes), where a bare name with a `PATH` of its own makes it fork, copying the page
    /// tables of the whole server for every script (BENCHMARKS.md, "Tool-call overhead").
    bash: PathBuf,
}

impl HostRunner {
    /// A runner whose scripts see only `env` and start in `cwd`.
    pub fn new(env: Vec<(String, String)>, cwd: PathBuf) -> Self {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str());
        let bash = on_path(path.unwrap_or_default(), "bash").unwrap_or_else(|| "bash".into());
        Self { env, cwd, bash }
    }

    /// A runner with just `PATH` and `LANG`, starting in `/`.
    pub fn minimal() -> Self {
        Self::new(minimal_env(), PathBuf::from("/"))
    }

    /// Runs `script` in `cwd` with `env` added to the runner's environment.
    pub async fn run_in(
        &self,
        script: &str,
        cwd: &std::path::Path,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, DesktopError> {
        let mut cmd = tokio::process::Command::new(&self.bash);
        cmd.arg("-c")
            .arg(script)
            .env_clear()
            .envs(self.env.iter().cloned())
            .envs(env.iter().cloned())
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| DesktopError::Command(format!("bash: {e}")))?;
        // Kills the whole process group if this future is dropped or the deadline passes.
        let mut guard = GroupKill(child.id());
        let stdout = Captured::start(child.stdout.take());
        let stderr = Captured::start(child.stderr.take());
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => status.map_err(|e| DesktopError::Command(format!("wait: {e}")))?,
            Err(_) => {
                drop(guard);
                return Ok(ExecOutput {
                    exit_code: -1,
                    stdout: stdout.finish().await,
                    stderr: stderr.finish().await,
                    timed_out: true,
                });
            }
        };
        // The script finished: what it started in the background keeps running.
        guard.0 = None;
        Ok(ExecOutput {
            exit_code: status.code().unwrap_or(-1),
            stdout: stdout.finish().await,
            stderr: stderr.finish().await,
            timed_out: false,
        })
    }
}

/// How long output is still collected after the script exits (a background child may hold
/// the pipe open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Output collected from a pipe by a background task, capped at [`OUTPUT_CAP`].
struct Captured {
    buf: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Captured {
    fn start<R: AsyncRead + Unpin + Send + 'static>(reader: Option<R>) -> Self {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buf.clone();
        let task = tokio::spawn(async move {
            let Some(mut reader) = reader else { return };
            let mut chunk = [0u8; 8192];
            loop {
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut out = sink.lock().unwrap_or_else(|e| e.into_inner());
                        let room = OUTPUT_CAP.saturating_sub(out.len());
                        out.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
            }
        });
        Self { buf, task }
    }

    async fn finish(mut self) -> String {
        if tokio::time::timeout(DRAIN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        let out = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[async_trait]
impl CommandRunner for HostRunner {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.run_in(script, &self.cwd, &[], timeout).await
    }

    async fn run_with_env(
        &self,
        script: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecOutput, DesktopError> {
        self.run_in(script, &self.cwd, env, timeout).await
    }

    fn sets_env(&self) -> bool {
        true
    }

    fn on_this_host(&self) -> bool {
        true
    }

    /// Read from `/proc` here: a returning bot's call asks this of its browser.
    async fn is_running(&self, pid: u32) -> Result<bool, DesktopError> {
        Ok(super::profile_local::alive(pid))
    }
}

/// The environment variable that tags every process the runtime starts, so that what escapes
/// its process group (Chromium's crash handler, a window manager's dialogs) can still be found.
pub const TAG_VAR: &str = "RAKAZO_DESKTOP_TAG";

/// A script that SIGKILLs every process of this user whose environment has a [`TAG_VAR`]
/// value starting with `prefix`.
pub fn sweep_script(prefix: &str) -> String {
    let want = shell_quote(&format!("{TAG_VAR}={prefix}"));
    format!(
        r#"{RELEASE_SHM_FN}
want={want}
pids=""
for e in /proc/[0-9]*/environ; do
  p=${{e#/proc/}}; p=${{p%/environ}}
  [ "$p" = "$$" ] && continue
  while IFS= read -r -d '' line; do
    case "$line" in "$want"*) kill -KILL "$p" 2>/dev/null; pids="$pids $p"; break ;; esac
  done 2>/dev/null < "$e"
done
[ -n "$pids" ] && sleep 0.1
release_shm $pids
exit 0
"#
    )
}

/// A script that stops every process of this user whose environment has a [`TAG_VAR`] value
/// starting with `prefix`, and everything else in their sessions (Chromium's helpers, which
/// may not let their environment be read): SIGTERM first to all but the X servers, so
/// browsers write their cookies and session, up to `grace` for those to end, then SIGTERM
/// to what is left, and SIGKILL after two more seconds. Prints how many processes it found.
pub fn reap_script(prefix: &str, grace: Duration) -> String {
    let want = shell_quote(&format!("{TAG_VAR}={prefix}"));
    let steps = (grace.as_millis() / 100).max(1);
    format!(
        r#"{RELEASE_SHM_FN}
want={want}
me=$(ps -o sid= -p $$ | tr -d ' ')
pids=""
for e in /proc/[0-9]*/environ; do
  p=${{e#/proc/}}; p=${{p%/environ}}
  [ "$p" = "$$" ] && continue
  while IFS= read -r -d '' line; do
    case "$line" in "$want"*) pids="$pids $p"; break ;; esac
  done 2>/dev/null < "$e"
done
[ -z "$pids" ] && {{ echo 0; exit 0; }}
sids=$(for p in $pids; do ps -o sid= -p "$p"; done | tr -d ' ' | grep -v "^$me\$" | sort -u | paste -sd, -)
members() {{ [ -n "$sids" ] && ps -o pid=,stat=,comm= -s "$sids" | awk '$2 !~ /^Z/'; }}
for p in $pids; do
  [ "$(ps -o comm= -p "$p")" = Xvfb ] || kill -TERM "$p" 2>/dev/null
done
i=0; while [ $i -lt {steps} ] && members | awk '$3 != "Xvfb"' | grep -q .; do sleep 0.1; i=$((i+1)); done
for p in $pids $(members | awk '{{print $1}}'); do kill -TERM "$p" 2>/dev/null; done
i=0; while [ $i -lt 20 ] && members | grep -q .; do sleep 0.1; i=$((i+1)); done
gone="$pids $(members | awk '{{print $1}}')"
for p in $gone; do kill -KILL "$p" 2>/dev/null; done
sleep 0.1
release_shm $gone
echo $pids | wc -w
exit 0
"#
    )
}

/// `PATH`, `LANG`: enough for the runtime's own tools.
pub fn minimal_env() -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

/// A runtime script's environment: [`minimal_env`] and then `extra`.
pub fn script_env(extra: &[(String, String)]) -> Vec<(String, String)> {
    let mut env = minimal_env();
    env.extend_from_slice(extra);
    env
}

/// The first executable file named `program` in the directories of `path` (`PATH`'s form).
fn on_path(path: &str, program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| std::path::Path::new(dir).join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Sends SIGKILL to a process group when dropped.
struct GroupKill(Option<u32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // Best effort; the group may already be gone.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bash_is_started_by_its_full_path() {
        let runner = HostRunner::minimal();
        assert!(runner.bash.is_absolute(), "{:?}", runner.bash);
        assert!(runner.bash.ends_with("bash"));
        assert_eq!(on_path("/nowhere:relative/bin", "bash"), None);
        // A directory of that name is not a program.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bash")).unwrap();
        let path = format!("{}:/usr/bin:/bin", dir.path().display());
        assert!(on_path(&path, "bash").is_some_and(|p| !p.starts_with(dir.path())));
    }

    #[tokio::test]
    async fn runs_scripts_with_only_the_given_environment() {
        let runner = HostRunner::minimal();
        let out = runner
            .run("echo \"$PATH|${HOME:-none}\"; exit 3", SCRIPT_TIMEOUT)
            .await
            .unwrap();
        assert_eq!(out.exit_code, 3);
        assert!(out.stdout.trim().ends_with("|none"), "{}", out.stdout);
    }

    #[tokio::test]
    async fn deadline_kills_the_script() {
        let runner = HostRunner::minimal();
        let started = std::time::Instant::now();
        let out = runner
            .run("sleep 30", Duration::from_millis(200))
            .await
            .unwrap();
        assert!(out.timed_out);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A program that creates a System V shared memory segment, prints its id, ignores
    /// SIGTERM and sleeps: it dies only by SIGKILL, which skips its own clean-up.
    const SHM_HOLDER: &str = "import ctypes, signal, sys, time\n\
        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
        libc = ctypes.CDLL(None)\n\
        print(libc.shmget(0, 65536, 0o1600), flush=True)\n\
        time.sleep(60)\n";

    async fn shm_exists(runner: &HostRunner, id: &str) -> bool {
        let out = runner
            .run(
                &format!("ipcs -m | awk '$2 == \"{id}\"' | grep -q ."),
                SCRIPT_TIMEOUT,
            )
            .await
            .unwrap();
        out.exit_code == 0
    }

    async fn spawn_shm_holder(runner: &HostRunner, env: Vec<(String, String)>) -> (u32, String) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("id");
        let pid = runner
            .spawn(&SpawnSpec {
                argv: vec!["python3".into(), "-c".into(), SHM_HOLDER.into()],
                env,
                log: log.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await
            .unwrap();
        let mut id = String::new();
        for _ in 0..100 {
            id = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .trim()
                .to_string();
            if !id.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            id.parse::<i64>().is_ok_and(|n| n >= 0),
            "shmget said {id:?}"
        );
        (pid, id)
    }

    #[tokio::test]
    async fn killed_processes_leave_no_shared_memory_behind() {
        let runner = HostRunner::minimal();
        // Stopped: SIGTERM is ignored, so the group dies by SIGKILL.
        let (pid, id) = spawn_shm_holder(&runner, minimal_env()).await;
        assert!(shm_exists(&runner, &id).await);
        runner.stop(pid, Duration::from_millis(200)).await.unwrap();
        assert!(
            !shm_exists(&runner, &id).await,
            "segment {id} outlived its creator"
        );
        // Swept by tag.
        let tag = format!("/test-shm-{}", std::process::id());
        let mut env = minimal_env();
        env.push((TAG_VAR.into(), format!("{tag}/a")));
        let (pid, id) = spawn_shm_holder(&runner, env).await;
        runner
            .run(&sweep_script(&tag), SCRIPT_TIMEOUT)
            .await
            .unwrap();
        assert!(!runner.is_running(pid).await.unwrap());
        assert!(
            !shm_exists(&runner, &id).await,
            "segment {id} outlived its creator"
        );
    }

    #[tokio::test]
    async fn sweep_kills_tagged_processes_outside_the_group() {
        let runner = HostRunner::minimal();
        let tag = format!("/test-sweep-{}", std::process::id());
        let mut env = minimal_env();
        env.push((TAG_VAR.into(), format!("{tag}/a")));
        // The child leaves the group and session, as Chromium's crash handler does.
        let spec = SpawnSpec {
            argv: vec![
                "bash".into(),
                "-c".into(),
                "setsid sleep 30 & echo $! >&2; wait".into(),
            ],
            env,
            ..Default::default()
        };
        let pid = runner.spawn(&spec).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let out = runner
            .run(
                &format!("ps -eo pid=,ppid= | awk '$2=={pid}{{print $1}}'"),
                SCRIPT_TIMEOUT,
            )
            .await
            .unwrap();
        let child: u32 = out.stdout.trim().parse().unwrap();
        runner
            .run(&sweep_script(&tag), SCRIPT_TIMEOUT)
            .await
            .unwrap();
        assert!(!runner.is_running(pid).await.unwrap());
        assert!(!runner.is_running(child).await.unwrap());
    }

    /// The nice value of `pid` (`/proc/<pid>/stat`, the 19th field).
    fn nice_of(pid: &str) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        rest.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn a_lowered_process_keeps_its_pid_and_runs_below_the_runner() {
        let runner = HostRunner::minimal();
        let plain = runner
            .spawn(&SpawnSpec {
                argv: vec!["sleep".into(), "30".into()],
                env: minimal_env(),
                ..Default::default()
            })
            .await
            .unwrap();
        let lowered = runner
            .spawn(&SpawnSpec {
                argv: vec!["sleep".into(), "30".into()],
                env: minimal_env(),
                nice: 7,
                ..Default::default()
            })
            .await
            .unwrap();
        // The pid is the program's own (every wrapper exec'd into the next).
        let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        for _ in 0..100 {
            if comm(lowered).trim() == "sleep" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(comm(lowered).trim(), "sleep");
        let own = nice_of("self");
        assert_eq!(nice_of(&plain.to_string()), own);
        assert_eq!(nice_of(&lowered.to_string()), (own + 7).min(19));
        // Its own session's scheduling group is lowered too, where the kernel has them.
        if let Ok(group) = std::fs::read_to_string(format!("/proc/{lowered}/autogroup")) {
            assert!(group.trim().ends_with("nice 7"), "{group}");
            let plain_group = std::fs::read_to_string(format!("/proc/{plain}/autogroup")).unwrap();
            assert!(plain_group.trim().ends_with("nice 0"), "{plain_group}");
        }
        for pid in [plain, lowered] {
            runner.stop(pid, Duration::from_millis(500)).await.unwrap();
        }
    }

    #[tokio::test]
    async fn spawn_and_stop_a_background_process() {
        let runner = HostRunner::minimal();
        let spec = SpawnSpec {
            argv: vec!["sleep".into(), "30".into()],
            env: minimal_env(),
            ..Default::default()
        };
        let pid = runner.spawn(&spec).await.unwrap();
        assert!(runner.is_running(pid).await.unwrap());
        runner.stop(pid, Duration::from_millis(500)).await.unwrap();
        assert!(!runner.is_running(pid).await.unwrap());
    }

    /// A runner whose exec cannot set the script's environment.
    struct NoEnv(HostRunner);

    #[async_trait]
    impl CommandRunner for NoEnv {
        async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
            self.0.run(script, timeout).await
        }
    }

    /// The group's scan for a tag comes right after a spawn: the program carries its tag by
    /// then, given to the script (the fork inherits it) or waited for. Its environment reads
    /// empty only while it is between two programs, which the scan waits out.
    #[tokio::test]
    async fn a_spawned_program_carries_its_tag_when_the_spawn_answers() {
        let tagged = |n: usize| SpawnSpec {
            argv: vec!["sleep".into(), "30".into()],
            env: [
                minimal_env(),
                vec![(TAG_VAR.into(), format!("spawn-test-{n}"))],
            ]
            .concat(),
            ..Default::default()
        };
        let host = HostRunner::minimal();
        let runners: [&dyn CommandRunner; 2] = [&host, &NoEnv(HostRunner::minimal())];
        for (r, runner) in runners.into_iter().enumerate() {
            for n in 0..10 {
                let pid = runner.spawn(&tagged(n)).await.unwrap();
                // Read again while it is between two programs (empty or cut short), as the
                // scan does (on a busy machine a process can sit in an exec for a while).
                let mut environ = Vec::new();
                let deadline = std::time::Instant::now() + Duration::from_secs(2);
                while std::time::Instant::now() < deadline {
                    environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
                    if crate::desktop::cgroup::environ_whole(&environ) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                let want = format!("{TAG_VAR}=spawn-test-{n}");
                assert!(
                    environ.split(|&b| b == 0).any(|kv| kv == want.as_bytes()),
                    "runner {r}, spawn {n}: {:?}",
                    String::from_utf8_lossy(&environ)
                );
                runner.stop(pid, Duration::from_millis(200)).await.unwrap();
            }
        }
    }

    #[tokio::test]
    async fn spawn_after_starts_nothing_when_the_script_before_refuses() {
        let runner = HostRunner::minimal();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("started");
        let spec = SpawnSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                format!("touch {}; exec sleep 30", marker.display()),
            ],
            env: minimal_env(),
            ..Default::default()
        };
        let refused = runner.spawn_after("exit 3", &spec).await.unwrap();
        assert_eq!(refused.map_err(|out| out.exit_code), Err(3));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!marker.exists(), "the program started after a refusal");

        let pid = runner
            .spawn_after("true", &spec)
            .await
            .unwrap()
            .expect("started");
        assert!(runner.is_running(pid).await.unwrap());
        runner.stop(pid, Duration::from_millis(500)).await.unwrap();
    }
}
