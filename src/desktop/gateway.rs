//! The screen gateway of one machine: one websockify for every display, and one x11vnc per
//! view or control capability, listening on a unix socket named by a fresh 128-bit token.
//!
//! websockify's `UnixDomainSocketDirectory` plugin maps `?token=<t>` to `<dir>/<t>`, so a
//! capability lives exactly as long as its socket: revoking removes the socket and stops its
//! x11vnc, and a display slot that is recycled can never be reached with an old token. A control
//! capability may also have a terminal server ([`super::terminal`]) on a socket of its own in
//! the same directory; revoking the capability stops it too. websockify serves websockets only:
//! the viewer's page and scripts come from the screen proxy, never from the machine. Tokens are
//! handed to the caller only; they are never logged (websockify's own output, which names socket paths, goes to
//! `/dev/null`).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Mutex;

use super::command::{
    CommandRunner, Readiness, SCRIPT_TIMEOUT, SpawnSpec, TAG_VAR, last_log_line, minimal_env,
    wait_ready,
};
use super::terminal::{ShellSpec, Terminals};
use super::{DesktopError, shell_quote};

/// How long a fresh x11vnc or websockify gets to start listening.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long x11vnc and websockify get to exit on SIGTERM.
const STOP_GRACE: Duration = Duration::from_millis(1500);
/// How many x11vnc starts a grant tries.
const VNC_ATTEMPTS: u32 = 2;
/// How many free ports a host gateway tries before it gives up.
const PORT_ATTEMPTS: u32 = 3;

/// What a capability allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Watch only (`x11vnc -viewonly`).
    View,
    /// Watch and send input.
    Control,
}

/// A socket token: 128 random bits in hex. Its `Debug` never shows it, and it has no `Display`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    /// A token the gateway handed out earlier, given back to revoke it.
    pub fn from_secret(secret: &str) -> Self {
        Self(secret.to_owned())
    }

    pub(crate) fn fresh() -> Self {
        Self(format!("{:032x}", rand::rng().random::<u128>()))
    }

    /// The token itself, for the one caller that puts it in a gateway URL.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// A live view or control capability on one slot generation.
#[derive(Clone, Debug)]
pub struct Capability {
    /// The display slot.
    pub slot: u32,
    /// The slot generation the capability was granted for.
    pub generation: u64,
    /// View or control.
    pub policy: Policy,
    /// The gateway's TCP port on the machine (websockify).
    pub port: u16,
    /// The socket token (`?token=` of the gateway URL).
    pub token: Token,
}

/// A granted capability's process.
struct Grant {
    slot: u32,
    generation: u64,
    policy: Policy,
    /// x11vnc's pid (and process group).
    pid: u32,
}

/// The gateway of one machine.
pub struct Gateway {
    runner: Arc<dyn CommandRunner>,
    /// Directory of the capability sockets (mode 0700).
    dir: PathBuf,
    /// Directory for x11vnc's home and logs.
    run_dir: PathBuf,
    /// websockify's listening port (0 before a host gateway's first start).
    port: AtomicU16,
    /// Whether the port is this host's to choose: a free loopback port at each start, and
    /// another one when something else took it first.
    choose_port: bool,
    /// websockify's listening address (loopback unless the machine is a container).
    host: String,
    /// websockify's pid, once started.
    websockify: Mutex<Option<u32>>,
    /// Live capabilities by token.
    grants: Mutex<HashMap<Token, Grant>>,
    /// Terminal servers by the control capability they are bound to.
    terminals: Terminals,
}

impl Gateway {
    /// A gateway whose sockets live in `run_dir/gateway` and that listens on loopback `port`;
    /// port 0 picks a free loopback port each time websockify starts.
    pub fn new(runner: Arc<dyn CommandRunner>, run_dir: PathBuf, port: u16) -> Self {
        let dir = run_dir.join("gateway");
        Self {
            terminals: Terminals::new(runner.clone(), dir.clone(), run_dir.clone()),
            runner,
            dir,
            run_dir,
            port: AtomicU16::new(port),
            choose_port: port == 0,
            host: "127.0.0.1".into(),
            websockify: Mutex::new(None),
            grants: Mutex::new(HashMap::new()),
        }
    }

    /// Listens on `host` instead of loopback: inside a container, whose gateway port the
    /// engine publishes on the host's loopback, websockify must accept on every interface.
    pub fn listening_on(mut self, host: &str) -> Self {
        self.host = host.to_string();
        self
    }

    /// The environment of the gateway's processes, tagged for the runtime's final sweep.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = minimal_env();
        env.push((
            TAG_VAR.into(),
            format!("{}/gateway", self.run_dir.to_string_lossy()),
        ));
        env
    }

    /// Where the socket of `token` lives: websockify reaches it by `?token=`.
    pub fn socket_of(&self, token: &Token) -> PathBuf {
        self.dir.join(token.expose())
    }

    /// The gateway's TCP port (0 while a host gateway has not started yet).
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::Acquire)
    }

    /// Starts websockify unless it is already running.
    pub async fn ensure_started(&self) -> Result<(), DesktopError> {
        let mut ws = self.websockify.lock().await;
        if let Some(pid) = *ws
            && self.runner.is_running(pid).await?
        {
            return Ok(());
        }
        let dir = shell_quote(&self.dir.to_string_lossy());
        let out = self
            .runner
            .run(
                &format!("mkdir -p {dir} && chmod 700 {dir}"),
                SCRIPT_TIMEOUT,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(DesktopError::Stack(format!(
                "gateway directory: {}",
                out.stderr.trim()
            )));
        }
        let attempts = if self.choose_port { PORT_ATTEMPTS } else { 1 };
        for attempt in 1..=attempts {
            let port = if self.choose_port {
                free_local_port()?
            } else {
                self.port()
            };
            match self.start_websockify(port).await? {
                (Readiness::Ready, pid) => {
                    *ws = Some(pid);
                    self.port.store(port, Ordering::Release);
                    self.runner.gateway_started();
                    tracing::info!(gateway.port = port, "desktop.gateway.started");
                    return Ok(());
                }
                (Readiness::Exited, _) if attempt < attempts => {
                    tracing::warn!(gateway.port = port, "desktop.gateway.port_taken");
                }
                (Readiness::Exited, _) => {
                    return Err(DesktopError::Stack(format!(
                        "the screen gateway exited before listening (is port {port} taken?)"
                    )));
                }
                (Readiness::TimedOut, _) => {
                    return Err(DesktopError::Stack(
                        "the screen gateway did not start listening in time".into(),
                    ));
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Starts websockify on `port` and waits until it listens there itself: a probe that
    /// merely connects could reach whatever else holds the port while websockify, unable to
    /// bind, is on its way out. Stops it again unless it became ready.
    async fn start_websockify(&self, port: u16) -> Result<(Readiness, u32), DesktopError> {
        let spec = SpawnSpec {
            argv: vec![
                "websockify".into(),
                "--token-plugin".into(),
                "UnixDomainSocketDirectory".into(),
                "--token-source".into(),
                self.dir.to_string_lossy().into_owned(),
                format!("{}:{port}", self.host),
            ],
            env: self.env(),
            ..Default::default()
        };
        let pid = self.runner.spawn(&spec).await?;
        let ready = wait_ready(
            &*self.runner,
            pid,
            &listens_probe(pid, port),
            LISTEN_TIMEOUT,
        )
        .await?;
        if ready != Readiness::Ready {
            let _ = self.runner.stop(pid, STOP_GRACE).await;
        }
        Ok((ready, pid))
    }

    /// Grants a capability on display `:display` of `slot` at `generation`: a fresh token and
    /// its own x11vnc (`-viewonly` for [`Policy::View`]).
    pub async fn grant(
        &self,
        slot: u32,
        generation: u64,
        display: u32,
        policy: Policy,
    ) -> Result<Capability, DesktopError> {
        self.ensure_started().await?;
        // x11vnc now and then fails to open a display that is busy starting a browser, and
        // it exits when the machine's shared memory table is full: one more try with a fresh
        // token, and without shared memory, before the grant fails.
        let mut attempt = 0;
        let (token, pid) = loop {
            attempt += 1;
            match self.start_vnc(display, policy, attempt > 1).await? {
                Ok(started) => break started,
                Err(detail) if attempt < VNC_ATTEMPTS => {
                    tracing::warn!(screen.slot = slot, detail = %detail, "desktop.gateway.vnc_retry");
                }
                Err(detail) => {
                    return Err(DesktopError::Stack(format!(
                        "the screen's VNC server did not start: {detail}"
                    )));
                }
            }
        };
        self.grants.lock().await.insert(
            token.clone(),
            Grant {
                slot,
                generation,
                policy,
                pid,
            },
        );
        tracing::info!(screen.slot = slot, screen.generation = generation, screen.policy = ?policy, "desktop.gateway.granted");
        Ok(Capability {
            slot,
            generation,
            policy,
            port: self.port(),
            token,
        })
    }

    /// Starts an x11vnc for `display` on a fresh token's socket (`without_shm`: reading the
    /// screen without MIT-SHM, slower but independent of the machine's shared memory). The
    /// inner error says why it did not come up (its last log line, with the token redacted).
    async fn start_vnc(
        &self,
        display: u32,
        policy: Policy,
        without_shm: bool,
    ) -> Result<Result<(Token, u32), String>, DesktopError> {
        let token = Token::fresh();
        let socket = self.dir.join(token.expose());
        let log = self.run_dir.join(format!("x11vnc-{display}.log"));
        let mut argv: Vec<String> = vec![
            "x11vnc".into(),
            "-display".into(),
            format!(":{display}"),
            "-unixsock".into(),
            socket.to_string_lossy().into_owned(),
            "-rfbport".into(),
            "0".into(),
            "-shared".into(),
            "-forever".into(),
            "-nopw".into(),
            "-quiet".into(),
            "-noxdamage".into(),
            // The desktop name reaches the viewer: never the machine's host name.
            "-desktop".into(),
            "Rakazo".into(),
        ];
        if policy == Policy::View {
            argv.push("-viewonly".into());
        }
        if without_shm {
            argv.push("-noshm".into());
        }
        let mut env = self.env();
        env.push(("HOME".into(), self.run_dir.to_string_lossy().into_owned()));
        let pid = self
            .runner
            .spawn(&SpawnSpec {
                argv,
                env,
                log: log.to_string_lossy().into_owned(),
                ..Default::default()
            })
            .await?;
        let socket = shell_quote(&socket.to_string_lossy());
        let ready = wait_ready(
            &*self.runner,
            pid,
            &format!("test -S {socket}"),
            LISTEN_TIMEOUT,
        )
        .await?;
        if ready == Readiness::Ready {
            return Ok(Ok((token, pid)));
        }
        let _ = self.runner.stop(pid, STOP_GRACE).await;
        let _ = self
            .runner
            .run(&format!("rm -f {socket}"), SCRIPT_TIMEOUT)
            .await;
        let last = last_log_line(&*self.runner, &log.to_string_lossy(), &[token.expose()]).await;
        Ok(Err(match ready {
            Readiness::Exited => format!("it exited ({last})"),
            _ => "it did not listen in time".into(),
        }))
    }

    /// Revokes one capability. Revoking an unknown token succeeds.
    pub async fn revoke(&self, token: &Token) -> Result<(), DesktopError> {
        let grant = self.grants.lock().await.remove(token);
        match grant {
            Some(grant) => {
                let result = self.stop_grant(token, &grant).await;
                if result.is_err() {
                    self.grants.lock().await.insert(token.clone(), grant);
                }
                result
            }
            None => self.terminals.close_serving(token).await,
        }
    }

    /// The socket token of the terminal server bound to the `control` capability, starting the
    /// server when needed; it stops when that capability is revoked.
    pub async fn open_terminal(
        &self,
        control: &Token,
        shell: &ShellSpec,
    ) -> Result<Token, DesktopError> {
        let bound = self
            .grants
            .lock()
            .await
            .get(control)
            .is_some_and(|g| g.policy == Policy::Control);
        if !bound {
            return Err(DesktopError::Invalid(
                "a terminal needs a live control capability".into(),
            ));
        }
        self.ensure_started().await?;
        self.terminals.open(control, shell).await
    }

    /// How many terminal servers run.
    pub async fn terminal_count(&self) -> usize {
        self.terminals.count().await
    }

    /// Revokes every capability of `slot`. Capabilities that could not be stopped stay listed
    /// (so a retry finds them) and make the call fail.
    pub async fn revoke_slot(&self, slot: u32) -> Result<(), DesktopError> {
        let tokens: Vec<Token> = self
            .grants
            .lock()
            .await
            .iter()
            .filter(|(_, g)| g.slot == slot)
            .map(|(t, _)| t.clone())
            .collect();
        let mut failure = None;
        for token in tokens {
            if let Err(e) = self.revoke(&token).await {
                failure = Some(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// How many capabilities of `slot` are live.
    pub async fn live_count(&self, slot: u32) -> usize {
        self.grants
            .lock()
            .await
            .values()
            .filter(|g| g.slot == slot)
            .count()
    }

    async fn stop_grant(&self, token: &Token, grant: &Grant) -> Result<(), DesktopError> {
        self.terminals.close(token).await?;
        // The socket goes first: from this moment the token reaches nothing.
        let socket = shell_quote(&self.dir.join(token.expose()).to_string_lossy());
        let out = self
            .runner
            .run(&format!("rm -f {socket}"), SCRIPT_TIMEOUT)
            .await?;
        if out.exit_code != 0 {
            return Err(DesktopError::Stack(
                "could not remove a capability socket".into(),
            ));
        }
        self.runner.stop(grant.pid, STOP_GRACE).await?;
        tracing::info!(
            screen.slot = grant.slot,
            screen.generation = grant.generation,
            screen.policy = ?grant.policy,
            "desktop.gateway.revoked"
        );
        Ok(())
    }

    /// Revokes everything and stops websockify.
    pub async fn shutdown(&self) -> Result<(), DesktopError> {
        let tokens: Vec<Token> = self.grants.lock().await.keys().cloned().collect();
        let mut failure = self.terminals.close_all().await.err();
        for token in tokens {
            if let Err(e) = self.revoke(&token).await {
                failure = Some(e);
            }
        }
        self.runner.gateway_stopping();
        if let Some(pid) = self.websockify.lock().await.take()
            && let Err(e) = self.runner.stop(pid, STOP_GRACE).await
        {
            failure = Some(e);
        }
        failure.map_or(Ok(()), Err)
    }
}

/// A shell probe that succeeds once process `pid` itself holds a socket listening on TCP
/// `port` (IPv4 or IPv6): the kernel's listening sockets on the port, matched by inode against
/// the process's descriptors.
fn listens_probe(pid: u32, port: u16) -> String {
    format!(
        "for i in $(awk '$4 == \"0A\" && $2 ~ /:{port:04X}$/ {{print $10}}' /proc/net/tcp /proc/net/tcp6 2>/dev/null); do \
           for f in /proc/{pid}/fd/*; do [ \"$(readlink \"$f\")\" = \"socket:[$i]\" ] && exit 0; done; \
         done; exit 1"
    )
}

/// Picks a free loopback TCP port on this host (for host-run gateways). Another program may
/// take it before websockify binds it; [`Gateway::ensure_started`] then picks another.
fn free_local_port() -> Result<u16, DesktopError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| DesktopError::Stack(format!("port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| DesktopError::Stack(format!("port: {e}")))
}

/// The spec's per-screen port formula for providers that publish one port per capability:
/// view `6080 + 2i`, control `6081 + 2i` for slot `i`.
pub fn published_port(slot: u32, policy: Policy) -> u32 {
    6080 + 2 * slot + u32::from(policy == Policy::Control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_never_printed() {
        let (a, b) = (Token::fresh(), Token::fresh());
        assert_eq!(a.expose().len(), 32);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.expose()));
    }

    #[test]
    fn published_ports_follow_the_spec() {
        assert_eq!(published_port(0, Policy::View), 6080);
        assert_eq!(published_port(0, Policy::Control), 6081);
        assert_eq!(published_port(3, Policy::View), 6086);
    }
}
