//! Terminal servers beside the screen gateway: one PTY server per control capability, reached
//! through websockify by its own socket token, speaking the frames of `terminal_server.py`.
//!
//! The server is the small Python program embedded here, written into the machine on first use
//! and started as the workspace user with the shell tool's environment. Each websocket that
//! reaches its socket gets its own shell, so later sessions under the same control lease join
//! the running server. Revoking the control capability stops the server: every shell is hung
//! up, and its socket and session files are removed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::command::{
    CommandRunner, Readiness, SCRIPT_TIMEOUT, SpawnSpec, TAG_VAR, install_program, wait_ready,
};
use super::gateway::Token;
use super::{DesktopError, shell_quote};

/// The terminal server program (Python 3 standard library only).
pub const SERVER_SOURCE: &str = include_str!("terminal_server.py");

/// How long a fresh terminal server gets to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a terminal server gets to hang up its shells on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Where and as what the shells run.
#[derive(Clone, Debug, Default)]
pub struct ShellSpec {
    /// The shells' working directory (the workspace).
    pub cwd: String,
    /// The shells' complete environment (the shell tool's, with a real `TERM`).
    pub env: Vec<(String, String)>,
}

/// A running terminal server.
struct Server {
    /// Its socket's token in the gateway directory.
    token: Token,
    /// The server's pid (and process group).
    pid: u32,
    /// Its session directory (shell records).
    session: PathBuf,
}

/// The terminal servers of one machine, by the control capability each is bound to.
pub struct Terminals {
    runner: Arc<dyn CommandRunner>,
    /// The gateway's socket directory (websockify's token source).
    socket_dir: PathBuf,
    /// Where the program and the session directories live.
    run_dir: PathBuf,
    servers: Mutex<HashMap<Token, Server>>,
}

impl Terminals {
    /// Terminal servers whose sockets live in `socket_dir`, with their files under `run_dir`.
    pub fn new(runner: Arc<dyn CommandRunner>, socket_dir: PathBuf, run_dir: PathBuf) -> Self {
        Self {
            runner,
            socket_dir,
            run_dir: run_dir.join("terminals"),
            servers: Mutex::new(HashMap::new()),
        }
    }

    /// The socket token of the terminal server bound to `control`, starting it when it is not
    /// running.
    pub async fn open(&self, control: &Token, shell: &ShellSpec) -> Result<Token, DesktopError> {
        let mut servers = self.servers.lock().await;
        if let Some(server) = servers.get(control) {
            if self.runner.is_running(server.pid).await? {
                return Ok(server.token.clone());
            }
            let server = servers.remove(control).expect("present");
            self.clean(&server).await?;
        }
        let server = self.start(shell).await?;
        let token = server.token.clone();
        servers.insert(control.clone(), server);
        tracing::info!("desktop.terminal.started");
        Ok(token)
    }

    /// Stops the terminal server bound to `control`, if any: shells hung up, files removed.
    pub async fn close(&self, control: &Token) -> Result<(), DesktopError> {
        let server = self.servers.lock().await.remove(control);
        let Some(server) = server else {
            return Ok(());
        };
        let stopped = self.runner.stop(server.pid, STOP_GRACE).await;
        let cleaned = self.clean(&server).await;
        if stopped.is_err() || cleaned.is_err() {
            self.servers.lock().await.insert(control.clone(), server);
            stopped?;
            cleaned?;
        }
        tracing::info!("desktop.terminal.stopped");
        Ok(())
    }

    /// Stops the terminal server whose own socket token is `token`, if any.
    pub async fn close_serving(&self, token: &Token) -> Result<(), DesktopError> {
        let control = self
            .servers
            .lock()
            .await
            .iter()
            .find(|(_, s)| &s.token == token)
            .map(|(c, _)| c.clone());
        match control {
            Some(control) => self.close(&control).await,
            None => Ok(()),
        }
    }

    /// Stops every terminal server.
    pub async fn close_all(&self) -> Result<(), DesktopError> {
        let controls: Vec<Token> = self.servers.lock().await.keys().cloned().collect();
        let mut failure = None;
        for control in controls {
            if let Err(e) = self.close(&control).await {
                failure = Some(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// How many terminal servers run.
    pub async fn count(&self) -> usize {
        self.servers.lock().await.len()
    }

    async fn start(&self, shell: &ShellSpec) -> Result<Server, DesktopError> {
        let token = Token::fresh();
        let socket = self.socket_dir.join(token.expose());
        let session = self
            .run_dir
            .join(format!("session-{}", &token.expose()[..16]));
        let program = install_program(
            &*self.runner,
            &self.run_dir,
            "terminal-server",
            SERVER_SOURCE,
        )
        .await?;
        // The socket directory is the gateway's, created when it started (the gateway starts
        // before it opens a terminal).
        let mut env = shell.env.clone();
        env.push((TAG_VAR.into(), self.run_dir.to_string_lossy().into_owned()));
        let pid = self
            .runner
            .spawn(&SpawnSpec {
                argv: vec![
                    "python3".into(),
                    "-I".into(),
                    program.to_string_lossy().into_owned(),
                    socket.to_string_lossy().into_owned(),
                    session.to_string_lossy().into_owned(),
                ],
                env,
                cwd: shell.cwd.clone(),
                log: String::new(),
                ..Default::default()
            })
            .await?;
        let server = Server {
            token,
            pid,
            session,
        };
        let probe = format!("test -S {}", shell_quote(&socket.to_string_lossy()));
        if wait_ready(&*self.runner, pid, &probe, LISTEN_TIMEOUT).await? != Readiness::Ready {
            let _ = self.runner.stop(pid, STOP_GRACE).await;
            let _ = self.clean(&server).await;
            return Err(DesktopError::Stack(
                "the terminal server did not start listening".into(),
            ));
        }
        Ok(server)
    }

    /// Removes a stopped server's socket and session files.
    async fn clean(&self, server: &Server) -> Result<(), DesktopError> {
        let socket = self.socket_dir.join(server.token.expose());
        let out = self
            .runner
            .run(
                &format!(
                    "rm -rf {} {}",
                    shell_quote(&socket.to_string_lossy()),
                    shell_quote(&server.session.to_string_lossy())
                ),
                SCRIPT_TIMEOUT,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(DesktopError::Stack(
                "could not remove a terminal's session files".into(),
            ));
        }
        Ok(())
    }
}
