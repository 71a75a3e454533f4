//! The machine backend every vendor emulator shares: a sandbox is a real container of the
//! computer image, created through the supervisor as Docker computers are, whose uid 1000
//! goes by the vendor's account name (E2B's `user`, home `/home/user`). Commands run through
//! the supervisor's exec; long-lived processes (a vendor's background commands) are started
//! detached in their own process group with their output in files on the machine, and are
//! followed, signalled and listed from here. Bytes of files travel base64-encoded in chunks,
//! within the exec's output cap.

use std::time::Duration;

use base64::Engine as _;
use rakazo_actors::provider::{ProviderError, ProviderResult};

use crate::desktop::shell_quote;
use crate::providers::docker::client::SupervisorClient;
use crate::supervisor::wire::{ComputerInfo, CreateComputer, ExecBody, ExecResult};

/// Where the emulated daemon keeps its process records on a machine.
const PROCS: &str = "/tmp/.rakazo-emulator/procs";
/// Bytes of a file per exec (base64 keeps them under the exec's 1 MiB output cap).
const CHUNK: usize = 600 << 10;
/// Bytes of a file per write (base64 in the script, which is one argument: under Linux's
/// 128 KiB limit of a single argument).
const WRITE_CHUNK: usize = 90_000;
/// The poll of a spawned process where the machine has `python3` (see [`poll_script`]).
const POLL_PROGRAM: &str = include_str!("poll_process.py");
/// Bytes of output one poll by [`POLL_PROGRAM`] returns (base64 keeps them, and the lines
/// around them, under the exec's 1 MiB output cap).
const POLL_BUDGET: usize = 720 << 10;
/// Deadline of the short bookkeeping scripts.
const SCRIPT: Duration = Duration::from_secs(30);

/// A process started with [`Machines::spawn`].
#[derive(Clone, Debug)]
pub struct Spawned {
    /// Its pid (also its process group).
    pub pid: u32,
    /// Its record directory on the machine.
    pub dir: String,
}

/// What a process did since the offsets of a [`Machines::poll`].
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// New standard output.
    pub stdout: Vec<u8>,
    /// New standard error.
    pub stderr: Vec<u8>,
    /// Its exit status once it exited on its own.
    pub exit: Option<i32>,
    /// Whether the process is still running.
    pub alive: bool,
}

/// What a [`Machines::write_stdin`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinWrite {
    /// The bytes are in the process's stdin.
    Written,
    /// Its stdin was not kept open, or was closed.
    NotOpen,
    /// The process ended.
    Ended,
}

/// The vendor emulators' machines, through one supervisor.
#[derive(Clone)]
pub struct Machines {
    client: SupervisorClient,
    account: String,
}

impl Machines {
    /// Machines through the supervisor at `url`, whose uid 1000 is named `account`.
    pub fn new(url: &str, token: &str, account: &str) -> ProviderResult<Self> {
        Ok(Self {
            client: SupervisorClient::new(url, token)?,
            account: account.to_string(),
        })
    }

    /// The account's home on every machine.
    pub fn home(&self) -> String {
        format!("/home/{}", self.account)
    }

    /// The default environment of the account's processes.
    pub fn default_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "PATH".into(),
                "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
            ),
            ("LANG".into(), "C.UTF-8".into()),
            ("HOME".into(), self.home()),
            ("USER".into(), self.account.clone()),
            ("LOGNAME".into(), self.account.clone()),
            ("SHELL".into(), "/bin/bash".into()),
        ]
    }

    /// Whether the supervisor answers.
    pub async fn health(&self) -> ProviderResult<()> {
        self.client.health().await.map(|_| ())
    }

    /// Creates and starts the machine of sandbox `id` of `vendor`.
    pub async fn create(&self, vendor: &str, id: &str) -> ProviderResult<ComputerInfo> {
        self.client
            .create(&CreateComputer {
                computer_id: id.to_string(),
                space_id: format!("{vendor}-emulator"),
                bot_id: None,
                home_key: format!("{vendor}-{id}"),
                account: Some(self.account.clone()),
            })
            .await
    }

    /// Starts a stopped machine.
    pub async fn start(&self, container: &str) -> ProviderResult<ComputerInfo> {
        self.client.start(container).await
    }

    /// Stops a machine (its processes end; its files stay).
    pub async fn stop(&self, container: &str) -> ProviderResult<()> {
        self.client.stop(container).await
    }

    /// Removes a machine.
    pub async fn remove(&self, container: &str) -> ProviderResult<()> {
        match self.client.remove(container).await {
            Ok(()) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The machine as the supervisor reports it.
    pub async fn inspect(&self, container: &str) -> ProviderResult<ComputerInfo> {
        self.client.inspect(container).await
    }

    /// Runs a script as the account, with its default environment plus `env`.
    pub async fn exec(
        &self,
        container: &str,
        script: &str,
        cwd: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> ProviderResult<ExecResult> {
        let mut all = self.default_env();
        for (k, v) in env {
            all.retain(|(key, _)| key != k);
            all.push((k.clone(), v.clone()));
        }
        self.client
            .exec(
                container,
                &ExecBody {
                    script: script.to_string(),
                    cwd: cwd.to_string(),
                    env: all,
                    timeout_ms: timeout.as_millis() as u64,
                    run_id: None,
                },
            )
            .await
    }

    async fn script(&self, container: &str, script: &str) -> ProviderResult<ExecResult> {
        self.exec(container, script, "/", &[], SCRIPT).await
    }

    /// Starts `argv` detached in its own session and process group, in `cwd` (created if
    /// missing is not done: a missing directory fails the start), with the account's
    /// environment plus `env`. Its stdin is empty, or with `stdin` a FIFO held open for
    /// writing (by a `sleep` in its group) until [`Self::close_stdin`], fed by
    /// [`Self::write_stdin`]. Waits up to `wait` for it to end (or print), so that a short
    /// command needs no further call.
    pub async fn spawn(
        &self,
        container: &str,
        argv: &[String],
        cwd: &str,
        env: &[(String, String)],
        stdin: bool,
        wait: Duration,
    ) -> ProviderResult<(Spawned, Progress)> {
        let dir = format!("{PROCS}/{}", uuid::Uuid::new_v4().simple());
        let args: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
        // The holder opens the FIFO for writing in the background (the open waits for the
        // process's open for reading); it ends with the process, or at a close.
        let (fifo, hold, input, release) = if stdin {
            (
                format!("mkfifo {}/in || exit 90\n", shell_quote(&dir)),
                "sleep 2147483647 >\"$0/in\" & echo $! >\"$0/holder\"; ",
                "\"$0/in\"",
                " kill $(cat \"$0/holder\" 2>/dev/null) 2>/dev/null;",
            )
        } else {
            (String::new(), "", "/dev/null", "")
        };
        let script = format!(
            "umask 077; mkdir -p {dir} || exit 90\n{fifo}cd {cwd} 2>/dev/null || exit 91\n\
             setsid sh -c '{hold}\"$@\" >\"$0/out\" 2>\"$0/err\" <{input}; echo $? >\"$0/exit.tmp\";{release} mv \"$0/exit.tmp\" \"$0/exit\"' {dir} {args} >/dev/null 2>&1 </dev/null &\n\
             echo $! >{dir}/pid\necho $!\n{poll}",
            dir = shell_quote(&dir),
            cwd = shell_quote(cwd),
            args = args.join(" "),
            poll = poll_script(&dir, "$!", 0, 0, wait),
        );
        let out = self
            .exec(container, &script, "/", env, wait + SCRIPT)
            .await?;
        match out.exit_code {
            90 => return Err(ProviderError::Failed("cannot record the process".into())),
            91 => {
                return Err(ProviderError::NotFound(format!(
                    "cwd '{cwd}' does not exist"
                )));
            }
            _ => {}
        }
        let mut lines = out.stdout.splitn(2, '\n');
        let pid = lines
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
            .ok_or_else(|| ProviderError::Failed(format!("start failed: {}", out.stderr.trim())))?;
        let progress = parse_progress(lines.next().unwrap_or_default())?;
        Ok((Spawned { pid, dir }, progress))
    }

    /// New output of a spawned process past the given offsets, waiting up to `wait` for
    /// something to happen.
    pub async fn poll(
        &self,
        container: &str,
        p: &Spawned,
        out_off: u64,
        err_off: u64,
        wait: Duration,
    ) -> ProviderResult<Progress> {
        let script = poll_script(&p.dir, &p.pid.to_string(), out_off, err_off, wait);
        let out = self
            .exec(container, &script, "/", &[], wait + SCRIPT)
            .await?;
        parse_progress(&out.stdout)
    }

    /// Writes `data` to the standard input of a process started with `stdin`.
    pub async fn write_stdin(
        &self,
        container: &str,
        p: &Spawned,
        data: &[u8],
    ) -> ProviderResult<StdinWrite> {
        for chunk in data.chunks(WRITE_CHUNK) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(chunk);
            // The FIFO is opened for reading and writing: such an open never waits for a
            // reader (a process that ended meanwhile loses the bytes, as it would at envd).
            // Shell builtins but for `base64`.
            let script = format!(
                "d={d}\n[ -e \"$d/exit\" ] && exit 3\nkill -0 {pid} 2>/dev/null || exit 3\n\
                 {{ read -r h <\"$d/holder\"; }} 2>/dev/null && kill -0 \"$h\" 2>/dev/null || exit 4\n\
                 base64 -d <<'EOF' 1<>\"$d/in\" || exit 5\n{b64}\nEOF",
                d = shell_quote(&p.dir),
                pid = p.pid,
            );
            let out = self.script(container, &script).await?;
            match out.exit_code {
                0 => {}
                3 => return Ok(StdinWrite::Ended),
                4 => return Ok(StdinWrite::NotOpen),
                _ => {
                    return Err(ProviderError::Failed(format!(
                        "writing to stdin: {}",
                        out.stderr.trim().chars().take(200).collect::<String>()
                    )));
                }
            }
        }
        Ok(StdinWrite::Written)
    }

    /// Closes the standard input of a process started with `stdin` (it reads its end); one
    /// started without it, or closed before, is left as it is.
    pub async fn close_stdin(&self, container: &str, p: &Spawned) -> ProviderResult<()> {
        let script = format!(
            "d={d}\nh=$(cat \"$d/holder\" 2>/dev/null) || exit 0\nrm -f \"$d/holder\"\nkill \"$h\" 2>/dev/null; exit 0",
            d = shell_quote(&p.dir),
        );
        check(self.script(container, &script).await?)
    }

    /// Sends `signal` (`KILL`, `TERM`) to the process group of `pid`; false when no such
    /// process runs.
    pub async fn signal(&self, container: &str, pid: u32, signal: &str) -> ProviderResult<bool> {
        if !matches!(signal, "KILL" | "TERM") {
            return Err(ProviderError::Failed("unsupported signal".into()));
        }
        let out = self
            .script(
                container,
                &format!("kill -0 {pid} 2>/dev/null || exit 3\nkill -{signal} -- -{pid} 2>/dev/null || kill -{signal} {pid}"),
            )
            .await?;
        Ok(out.exit_code == 0)
    }

    /// Reads a file (at most `limit` bytes; more is an error); `None` when it does not exist.
    pub async fn read_file(
        &self,
        container: &str,
        path: &str,
        limit: u64,
    ) -> ProviderResult<Option<Vec<u8>>> {
        let q = shell_quote(path);
        let size = self
            .script(
                container,
                &format!("[ -f {q} ] || exit 3\n[ -r {q} ] || exit 4\nstat -c %s {q}"),
            )
            .await?;
        match size.exit_code {
            0 => {}
            3 => return Ok(None),
            4 => return Err(ProviderError::PathRejected("permission denied".into())),
            _ => return Err(ProviderError::Failed(size.stderr.trim().to_string())),
        }
        let size: u64 = size.stdout.trim().parse().unwrap_or(0);
        if size > limit {
            return Err(ProviderError::Failed("file too large".into()));
        }
        let mut data = Vec::with_capacity(size as usize);
        loop {
            let out = self
                .script(
                    container,
                    &format!(
                        "tail -c +{} {q} | head -c {CHUNK} | base64 -w0",
                        data.len() + 1
                    ),
                )
                .await?;
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(out.stdout.trim())
                .map_err(|_| ProviderError::Failed("unreadable file chunk".into()))?;
            if chunk.is_empty() {
                break;
            }
            data.extend_from_slice(&chunk);
            if data.len() as u64 > limit {
                return Err(ProviderError::Failed("file too large".into()));
            }
            if chunk.len() < CHUNK {
                break;
            }
        }
        Ok(Some(data))
    }

    /// Writes a file, creating its parent directories.
    pub async fn write_file(&self, container: &str, path: &str, data: &[u8]) -> ProviderResult<()> {
        let q = shell_quote(path);
        let tmp = shell_quote(&format!("{path}.rakazo-upload"));
        let mut first = true;
        let mut chunks = data.chunks(WRITE_CHUNK).peekable();
        if chunks.peek().is_none() {
            let out = self
                .script(
                    container,
                    &format!("mkdir -p \"$(dirname {q})\" && : > {q}"),
                )
                .await?;
            return check(out);
        }
        for chunk in chunks {
            let b64 = base64::engine::general_purpose::STANDARD.encode(chunk);
            let redirect = if first { ">" } else { ">>" };
            let prefix = if first {
                format!("mkdir -p \"$(dirname {q})\" || exit 1\n")
            } else {
                String::new()
            };
            let out = self
                .script(
                    container,
                    &format!("{prefix}base64 -d {redirect} {tmp} <<'EOF'\n{b64}\nEOF"),
                )
                .await?;
            check(out)?;
            first = false;
        }
        check(self.script(container, &format!("mv -f {tmp} {q}")).await?)
    }
}

fn check(out: ExecResult) -> ProviderResult<()> {
    if out.exit_code == 0 {
        Ok(())
    } else {
        Err(ProviderError::Failed(
            out.stderr.trim().chars().take(300).collect(),
        ))
    }
}

/// Waits up to `wait` for new output or the end, then prints `<exit or -> <alive 0/1>`,
/// the new stdout and the new stderr (base64, one line each, capped): with `python3` one
/// process looking every 5 ms ([`POLL_PROGRAM`]), else a shell loop looking every 20 ms.
fn poll_script(dir: &str, pid: &str, out_off: u64, err_off: u64, wait: Duration) -> String {
    let steps = (wait.as_millis() / 20).max(1);
    format!(
        "if command -v python3 >/dev/null; then exec python3 -I -S -c {program} {d} {pid} {out_off} {err_off} {secs:.3} {budget}; fi\n\
         d={d}; p={pid}; i=0\n\
         while :; do\n\
           [ -e \"$d/exit\" ] && break\n\
           kill -0 \"$p\" 2>/dev/null || break\n\
           [ \"$(stat -c %s \"$d/out\" 2>/dev/null || echo 0)\" -gt {out_off} ] && break\n\
           [ \"$(stat -c %s \"$d/err\" 2>/dev/null || echo 0)\" -gt {err_off} ] && break\n\
           [ $i -ge {steps} ] && break\n\
           sleep 0.02; i=$((i+1))\n\
         done\n\
         ex=-; [ -e \"$d/exit\" ] && ex=$(cat \"$d/exit\")\n\
         al=1; kill -0 \"$p\" 2>/dev/null || al=0\n\
         [ \"$ex\" != - ] && al=0\n\
         echo \"$ex $al\"\n\
         tail -c +{o1} \"$d/out\" 2>/dev/null | head -c {cap} | base64 -w0; echo\n\
         tail -c +{o2} \"$d/err\" 2>/dev/null | head -c {cap} | base64 -w0; echo\n",
        program = shell_quote(POLL_PROGRAM),
        d = shell_quote(dir),
        secs = wait.as_secs_f64(),
        o1 = out_off + 1,
        o2 = err_off + 1,
        cap = CHUNK / 2,
        budget = POLL_BUDGET,
    )
}

fn parse_progress(text: &str) -> ProviderResult<Progress> {
    let bad = || ProviderError::Failed("unreadable process state".into());
    let mut lines = text.lines();
    let state = lines.next().ok_or_else(bad)?;
    let mut parts = state.split_whitespace();
    let exit = match parts.next().ok_or_else(bad)? {
        "-" => None,
        code => Some(code.parse::<i32>().map_err(|_| bad())?),
    };
    let alive = parts.next() == Some("1");
    let b64 = |l: Option<&str>| {
        base64::engine::general_purpose::STANDARD
            .decode(l.unwrap_or_default().trim())
            .map_err(|_| bad())
    };
    Ok(Progress {
        stdout: b64(lines.next())?,
        stderr: b64(lines.next())?,
        exit,
        alive,
    })
}
