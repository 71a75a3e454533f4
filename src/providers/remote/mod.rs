//! Remote computers: a vendor-neutral port for sandbox vendors ([`RemoteSandboxes`]) and the
//! one [`provider::RemoteProvider`] that implements `SandboxProvider` on top of any of them.
//!
//! A vendor adapter (`e2b`, and others beside it) implements only [`RemoteSandboxes`]: create,
//! connect-or-resume, pause, kill and TTL refresh of a sandbox; run a script with a deadline
//! (the process is killed when it passes, and a kill that is not confirmed is an error);
//! upload and download one file; and the address of a sandbox port with the headers and query
//! parameters that reach it. Everything else is shared and lives here:
//!
//! - [`runner`]: the desktop runtime's [`crate::desktop::command::CommandRunner`] over the
//!   vendor's run call, or over the machine's exec agent where the vendor keeps a process's
//!   input open (every script, the bot's shell commands too), so every bot display (its own
//!   Xvfb, browser profile, x11vnc per capability behind the one token gateway) is the same
//!   runtime Docker uses;
//! - [`files`]: workspace files through the command path: paths confined to the workspace on
//!   the machine by a helper that opens every segment without following links; whole-workspace
//!   export and import as a tar stream with the archive rules of [`crate::stores::archive`]
//!   (transient browser files left out, links, fifos and devices never packed), checked again
//!   on this host before it is used;
//! - [`forward`]: a loopback forwarder per sandbox port, so the screen proxy reaches the
//!   gateway at `http://127.0.0.1:<port>` and the vendor host, its headers and any traffic
//!   token (a header or a query parameter) stay in the provider (never in a route, a
//!   browser or a log line);
//! - [`provider`]: lifecycle (a sandbox the vendor no longer knows is `MachineGone`, which
//!   makes the computer actor provision a replacement and restore the last checkpoint), TTL
//!   refresh while the computer is used, pause on stop, kill on destroy, and `describe()`
//!   billing while running.

pub mod files;
pub mod forward;
pub mod provider;
pub mod runner;

use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, MachineSpec, ProviderError, ProviderResult};

use crate::desktop::shell_quote;

/// The body of a vendor's answer, read as it comes; `None` as soon as it passes `cap` bytes
/// (what the machine serves is the bot's: nothing past the cap is held).
pub async fn body_within(
    mut resp: reqwest::Response,
    cap: u64,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if resp.content_length().is_some_and(|n| n > cap) {
        return Ok(None);
    }
    let mut data = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        data.extend_from_slice(&chunk);
        if data.len() as u64 > cap {
            return Ok(None);
        }
    }
    Ok(Some(data))
}

/// A vendor's JSON answer read within `cap` bytes: the errors say what failed, never the
/// request's address (reqwest's own text of a body error names the URL, a vendor host).
pub async fn json_within<T: serde::de::DeserializeOwned>(
    resp: reqwest::Response,
    cap: u64,
    what: &str,
) -> ProviderResult<T> {
    let body = body_within(resp, cap).await.map_err(|e| {
        let kind = if e.is_timeout() { "timeout" } else { "cut" };
        ProviderError::Failed(format!("{what}: the answer could not be read ({kind})"))
    })?;
    let body =
        body.ok_or_else(|| ProviderError::TooLarge(format!("{what}: an answer past {cap} bytes")))?;
    serde_json::from_slice(&body).map_err(|e| ProviderError::Failed(format!("{what}: {e}")))
}

/// Where things live on a vendor's machine.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The workspace (browser profiles live under its `.browser-profiles`).
    pub workspace: String,
    /// A private directory for the runtime's logs, sockets and file transfers.
    pub run_dir: String,
    /// The port the screen gateway listens on inside the machine.
    pub gateway_port: u16,
}

/// A script to run on the machine as the vendor's default user.
#[derive(Clone, Debug)]
pub struct RemoteCommand {
    /// Run with `bash -c`.
    pub script: String,
    /// Absolute working directory.
    pub cwd: String,
    /// Environment variables set for the script: added to the vendor's defaults by its run
    /// call, the whole environment through the machine's exec agent.
    pub env: Vec<(String, String)>,
    /// Deadline: when it passes the process is killed and `timed_out` is set.
    pub timeout: Duration,
}

impl RemoteCommand {
    /// The extra environment as `export` lines for the front of a wrapping script, for
    /// vendors whose command call runs a line without environment of its own.
    pub fn exports(&self) -> String {
        self.env
            .iter()
            .map(|(k, v)| format!("export {}\n", shell_quote(&format!("{k}={v}"))))
            .collect()
    }
}

/// How this host reaches a port of a sandbox: a base URL (`http://` or `https://`), the
/// headers every request needs (a `Host` for vendors that route by host name, a traffic
/// token) and the query parameters every request needs (a token vendors such as Box take as
/// `?_token=`). All of it is secret from browsers, routes and logs.
#[derive(Clone, Default)]
pub struct PortEndpoint {
    /// Base URL without a trailing slash; a path in it is put before every request's path.
    pub url: String,
    /// Headers to send; a `host` entry replaces the URL's host name in the `Host` header.
    pub headers: Vec<(String, String)>,
    /// Query parameters added to every request (HTTP and websocket upgrade alike), replacing
    /// any of the same name the local request carries.
    pub query: Vec<(String, String)>,
}

impl std::fmt::Debug for PortEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortEndpoint([redacted])")
    }
}

/// A sandbox vendor, as the shared remote provider uses it. Vendor errors are translated at
/// the adapter's edge: a sandbox the vendor does not know (any more) is
/// [`rakazo_actors::provider::ProviderError::MachineGone`].
#[async_trait]
pub trait RemoteSandboxes: Send + Sync + 'static {
    /// A connected sandbox: its id and whatever the adapter needs to reach it (tokens, URLs).
    /// Its `Debug` must not show secrets.
    type Session: Clone + Send + Sync + std::fmt::Debug + 'static;

    /// The `SANDBOX_PROVIDER` name (`e2b`, ...).
    fn kind(&self) -> &'static str;

    /// Where the workspace and the runtime's files live on this vendor's machines.
    fn layout(&self) -> Layout;

    /// The sandbox id of a session (stored as the providerRef).
    fn id(session: &Self::Session) -> &str;

    /// How long a sandbox lives without a refresh; refreshed well before it passes while the
    /// computer is used.
    fn ttl(&self) -> Duration;

    /// Why sandbox `id` is quarantined (a command's stop was not confirmed, see
    /// [`rakazo_actors::provider::ProviderError::Quarantined`]); `None` when it is not. Every
    /// call on a quarantined sandbox is refused with that error.
    fn quarantined(&self, _id: &str) -> Option<String> {
        None
    }

    /// Whether a machine can host more than one desktop (`multiScreen`). A vendor whose
    /// machines ship one desktop answers false: a second bot's graphical tools then get
    /// `MultiScreenUnavailable` while the first keeps its screen (never evicted for it).
    fn multi_screen(&self) -> bool {
        true
    }

    /// Whether the vendor answers (for `/internal/health`); a plain sentence when not.
    async fn health(&self) -> Result<(), String>;

    /// Creates a sandbox for `spec` and waits until commands can run in it.
    async fn create(&self, spec: &MachineSpec) -> ProviderResult<Self::Session>;

    /// Connects to sandbox `id`, resuming it when paused; `MachineGone` when the vendor does
    /// not know it.
    async fn connect(&self, id: &str) -> ProviderResult<Self::Session>;

    /// Pushes the sandbox's end of life to now + [`Self::ttl`].
    async fn refresh(&self, session: &Self::Session) -> ProviderResult<()>;

    /// Pauses (suspends) the sandbox; pausing a paused one succeeds.
    async fn pause(&self, id: &str) -> ProviderResult<()>;

    /// Kills the sandbox; killing one that is gone succeeds.
    async fn kill(&self, id: &str) -> ProviderResult<()>;

    /// Runs a script. A non-zero exit is an outcome. When the deadline passes, or the future
    /// is dropped, the process is killed; a kill the vendor does not confirm is an error.
    async fn run(
        &self,
        session: &Self::Session,
        command: &RemoteCommand,
    ) -> ProviderResult<ExecOutput>;

    /// Writes `data` to the absolute `path` on the machine (parents created).
    async fn upload(
        &self,
        session: &Self::Session,
        path: &str,
        data: Vec<u8>,
    ) -> ProviderResult<()>;

    /// Reads the absolute `path` on the machine, refusing more than `limit` bytes.
    async fn download(
        &self,
        session: &Self::Session,
        path: &str,
        limit: u64,
    ) -> ProviderResult<Vec<u8>>;

    /// How this host reaches `port` of the sandbox.
    fn port(&self, session: &Self::Session, port: u16) -> PortEndpoint;

    /// Whether [`Self::attach`] starts programs whose standard input stays open: then the
    /// machine keeps an exec agent for its long-lived helpers (frames and pointer input
    /// without a process start).
    fn attaches(&self) -> bool {
        false
    }

    /// Starts `command` (its `script` run with `bash -c`, no deadline) with its standard
    /// input and output attached to this host, until the channel is dropped (which kills
    /// it). Only where [`Self::attaches`].
    async fn attach(
        &self,
        session: &Self::Session,
        command: &RemoteCommand,
    ) -> ProviderResult<crate::exec_agent::Channel> {
        let _ = (session, command);
        Err(rakazo_actors::provider::ProviderError::Unsupported(
            format!("{} keeps no standard input open", self.kind()),
        ))
    }
}
