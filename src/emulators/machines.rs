//! The machines behind the emulators' sandboxes: [`Machines`] is what an emulator needs of
//! one (create, start, stop, remove, whether it is still there, run a script with a deadline
//! that kills it, and files), and [`SupervisorMachines`] gives it with real containers of the
//! computer image through the supervisor. Files travel as base64 through scripts, in chunks
//! under the supervisor's output and body caps.

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use rakazo_actors::provider::{ExecOutput, ProviderError, ProviderResult};
use serde::Deserialize;

use crate::desktop::command::minimal_env;
use crate::desktop::shell_quote;
use crate::providers::docker::client::SupervisorClient;
use crate::supervisor::engine::{GATEWAY_PORT, WORKSPACE};
use crate::supervisor::wire::{CreateComputer, ExecBody};

/// Largest file the emulators read or write.
pub const MAX_FILE: u64 = 64 << 20;
/// Raw bytes per chunk of a file transfer (base64 keeps it under the supervisor's caps).
const CHUNK: usize = 512 << 10;
/// Deadline of the file scripts.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// An entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Entry {
    /// Name within the directory.
    pub name: String,
    /// A directory.
    pub dir: bool,
    /// Size in bytes.
    pub size: u64,
    /// `st_mode`.
    pub mode: u32,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// What an emulator needs of its machines. Paths are absolute paths on the machine.
#[async_trait]
pub trait Machines: Send + Sync + 'static {
    /// Creates and starts a machine for sandbox `name` of `vendor`; returns its id.
    async fn create(&self, vendor: &str, name: &str) -> ProviderResult<String>;
    /// Starts a stopped machine; `MachineGone` when it is not there.
    async fn start(&self, id: &str) -> ProviderResult<()>;
    /// Stops it, keeping its disk.
    async fn stop(&self, id: &str) -> ProviderResult<()>;
    /// Removes it (a machine already gone is fine).
    async fn remove(&self, id: &str) -> ProviderResult<()>;
    /// Whether it is still there, and whether it runs: `None` when it is gone.
    async fn running(&self, id: &str) -> ProviderResult<Option<bool>>;
    /// Runs `script` with bash as the machine's user; past `timeout` the script's whole
    /// process group is killed and `timed_out` is set.
    async fn exec(
        &self,
        id: &str,
        script: &str,
        cwd: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> ProviderResult<ExecOutput>;
    /// The machine user's home directory.
    fn home(&self) -> &str;
    /// Where this host reaches `port` of the machine, when it is published.
    async fn port_addr(&self, id: &str, port: u16) -> ProviderResult<Option<SocketAddr>>;

    /// Reads a regular file; `NotFound` when there is none, `TooLarge` past [`MAX_FILE`].
    async fn read(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let q = shell_quote(path);
        let head = self
            .exec(
                id,
                &format!("[ -e {q} ] || exit 3; [ -f {q} ] || exit 4; stat -c %s -- {q}"),
                "/",
                &[],
                FILE_TIMEOUT,
            )
            .await?;
        match head.exit_code {
            0 => {}
            3 => return Err(ProviderError::NotFound(path.chars().take(200).collect())),
            4 => {
                return Err(ProviderError::PathRejected(format!(
                    "{}: not a regular file",
                    path.chars().take(200).collect::<String>()
                )));
            }
            _ => return Err(ProviderError::Failed(head.stderr.trim().chars().take(200).collect())),
        }
        let size: u64 = head
            .stdout
            .trim()
            .parse()
            .map_err(|_| ProviderError::Failed("file size unreadable".into()))?;
        if size > MAX_FILE {
            return Err(ProviderError::TooLarge(path.chars().take(200).collect()));
        }
        let mut data = Vec::with_capacity(size as usize);
        loop {
            let out = self
                .exec(
                    id,
                    &format!(
                        "tail -c +{} -- {q} | head -c {CHUNK} | base64 -w0",
                        data.len() + 1
                    ),
                    "/",
                    &[],
                    FILE_TIMEOUT,
                )
                .await?;
            if out.exit_code != 0 {
                return Err(ProviderError::Failed(out.stderr.trim().chars().take(200).collect()));
            }
            let chunk = base64::engine::general_purpose::STANDARD
                .decode(out.stdout.trim())
                .map_err(|_| ProviderError::Failed("file chunk unreadable".into()))?;
            let n = chunk.len();
            data.extend_from_slice(&chunk);
            if n < CHUNK || data.len() as u64 > MAX_FILE {
                break;
            }
        }
        Ok(data)
    }

    /// Writes a file, creating its parent directories; replaces it whole at the end.
    async fn write(&self, id: &str, path: &str, data: &[u8]) -> ProviderResult<()> {
        if data.len() as u64 > MAX_FILE {
            return Err(ProviderError::TooLarge(path.chars().take(200).collect()));
        }
        let q = shell_quote(path);
        let tmp = shell_quote(&format!("{path}.rakazo-upload"));
        let mut first = true;
        let mut chunks: Vec<&[u8]> = data.chunks(CHUNK).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for chunk in chunks {
            let b64 = base64::engine::general_purpose::STANDARD.encode(chunk);
            let redirect = if first { ">" } else { ">>" };
            let prep = if first {
                format!("mkdir -p -- \"$(dirname -- {q})\" || exit 5\n[ -d {q} ] && exit 4\n")
            } else {
                String::new()
            };
            let out = self
                .exec(
                    id,
                    &format!("{prep}printf %s '{b64}' | base64 -d {redirect} {tmp} || exit 6"),
                    "/",
                    &[],
                    FILE_TIMEOUT,
                )
                .await?;
            match out.exit_code {
                0 => {}
                4 => {
                    return Err(ProviderError::PathRejected(format!(
                        "{}: a directory",
                        path.chars().take(200).collect::<String>()
                    )));
                }
                _ => {
                    return Err(ProviderError::Failed(
                        out.stderr.trim().chars().take(200).collect(),
                    ));
                }
            }
            first = false;
        }
        let out = self
            .exec(id, &format!("mv -f -- {tmp} {q}"), "/", &[], FILE_TIMEOUT)
            .await?;
        if out.exit_code != 0 {
            return Err(ProviderError::Failed(out.stderr.trim().chars().take(200).collect()));
        }
        Ok(())
    }

    /// Lists a directory (links are listed, not followed); `NotFound` when it is not one.
    async fn list(&self, id: &str, path: &str) -> ProviderResult<Vec<Entry>> {
        let out = self
            .exec(
                id,
                &format!("[ -d {} ] || exit 3\npython3 -c {} {}", shell_quote(path), shell_quote(LIST_PY), shell_quote(path)),
                "/",
                &[],
                FILE_TIMEOUT,
            )
            .await?;
        match out.exit_code {
            0 => out
                .stdout
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| {
                    serde_json::from_str(l)
                        .map_err(|_| ProviderError::Failed("listing unreadable".into()))
                })
                .collect(),
            3 => Err(ProviderError::NotFound(path.chars().take(200).collect())),
            _ => Err(ProviderError::Failed(out.stderr.trim().chars().take(200).collect())),
        }
    }
}

/// Prints one JSON line per entry of `argv[1]`, never following a link.
const LIST_PY: &str = r#"import grp, json, os, pwd, stat, sys
d = sys.argv[1]
def name(f, i):
    try:
        return f(i)[0]
    except KeyError:
        return str(i)
for n in sorted(os.listdir(d)):
    try:
        s = os.lstat(os.path.join(d, n))
    except OSError:
        continue
    print(json.dumps({"name": n, "dir": stat.S_ISDIR(s.st_mode), "size": s.st_size, "mode": s.st_mode, "owner": name(pwd.getpwuid, s.st_uid), "group": name(grp.getgrgid, s.st_gid), "mtime": int(s.st_mtime)}))
"#;

/// Machines as containers of the computer image, through the supervisor.
pub struct SupervisorMachines {
    client: SupervisorClient,
}

impl SupervisorMachines {
    /// Machines through the supervisor at `url` with `token`.
    pub fn new(url: &str, token: &str) -> ProviderResult<Self> {
        Ok(Self {
            client: SupervisorClient::new(url, token)?,
        })
    }
}

#[async_trait]
impl Machines for SupervisorMachines {
    async fn create(&self, vendor: &str, name: &str) -> ProviderResult<String> {
        let info = self
            .client
            .create(&CreateComputer {
                computer_id: format!("{vendor}-{name}"),
                space_id: format!("emulator-{vendor}"),
                bot_id: None,
                home_key: format!("emulator-{vendor}-{name}"),
            })
            .await?;
        Ok(info.id)
    }

    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.client.start(id).await.map(|_| ())
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.client.stop(id).await
    }

    async fn remove(&self, id: &str) -> ProviderResult<()> {
        match self.client.remove(id).await {
            Ok(()) | Err(ProviderError::MachineGone) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn running(&self, id: &str) -> ProviderResult<Option<bool>> {
        match self.client.inspect(id).await {
            Ok(info) => Ok(Some(info.running)),
            Err(ProviderError::MachineGone) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn exec(
        &self,
        id: &str,
        script: &str,
        cwd: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let mut all = minimal_env();
        all.push(("HOME".into(), WORKSPACE.into()));
        all.extend(env.iter().cloned());
        let out = self
            .client
            .exec(
                id,
                &ExecBody {
                    script: script.to_string(),
                    cwd: cwd.to_string(),
                    env: all,
                    timeout_ms: timeout.as_millis() as u64,
                    run_id: None,
                },
            )
            .await?;
        Ok(ExecOutput {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            timed_out: out.timed_out,
        })
    }

    fn home(&self) -> &str {
        WORKSPACE
    }

    async fn port_addr(&self, id: &str, port: u16) -> ProviderResult<Option<SocketAddr>> {
        if port != GATEWAY_PORT {
            return Ok(None);
        }
        let info = self.client.inspect(id).await?;
        Ok(info
            .gateway_port
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p))))
    }
}
