//! The supervisor `rakazo serve` starts itself: with the docker provider and no supervisor
//! configured (neither `SANDBOX_SUPERVISOR_URL` nor `SANDBOX_SUPERVISOR_TOKEN`), serve runs
//! `rakazo supervisor` (this same binary) as a child process on a free loopback port, with a
//! fresh token kept in `DATA_DIR/supervisor-token` (owner-only). The child is the only process
//! that talks to the Docker engine; it builds a missing computer image of the built-in recipe.
//! It stops when serve exits (dropped, or by `PR_SET_PDEATHSIG`, which the child asks for, when
//! serve is killed). When it cannot start (no Docker engine answers), serve goes on without it
//! and `/internal/health` keeps reporting the missing supervisor as a setup error.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::config::{Config, Secret};

/// The file in `DATA_DIR` that holds the managed supervisor's token.
pub const TOKEN_FILE: &str = "supervisor-token";
/// How long the child gets to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the child gets to stop on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Whether serve should start its own supervisor for `config`.
pub fn wanted(config: &Config) -> bool {
    matches!(
        config.provider.as_str(),
        "docker" | "e2b-emulator" | "novita-emulator"
    ) && !config.supervisor_configured
}

/// A running child supervisor; dropping it stops the child.
pub struct ManagedSupervisor {
    child: Child,
}

impl ManagedSupervisor {
    /// Starts the child and waits until it listens; on success `config` points the docker
    /// provider at it. `None` (logged) when it could not start, for example when no Docker
    /// engine answers. Call from the thread that lives as long as serve (the main thread):
    /// the child's parent-death signal follows that thread.
    pub fn start(config: &mut Config, config_file: Option<&Path>) -> Option<Self> {
        match Self::spawn(config, config_file) {
            Ok((child, addr, token)) => {
                tracing::info!(pid = child.id(), addr = %addr, "supervisor.managed.started");
                config.supervisor_url = format!("http://{addr}");
                config.supervisor_token = Some(Secret(token));
                config.supervisor_managed = true;
                Some(Self { child })
            }
            Err(why) => {
                tracing::warn!(reason = %why, "supervisor.managed.unavailable");
                None
            }
        }
    }

    fn spawn(
        config: &Config,
        config_file: Option<&Path>,
    ) -> Result<(Child, SocketAddr, String), String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let token = hex::encode(rakazo_actors::keys::random_key());
        let token_path = config.data_dir.join(TOKEN_FILE);
        crate::auth::write_private(&token_path, &token)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&token_path, std::fs::Permissions::from_mode(0o600))
            })
            .map_err(|e| format!("{TOKEN_FILE}: {e}"))?;
        // A free loopback port, released for the child to bind.
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("loopback port: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("supervisor")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--build-image")
            .arg("--parent")
            .arg(std::process::id().to_string());
        if let Some(file) = config_file {
            cmd.arg("--config").arg(file);
        }
        cmd.env("SANDBOX_SUPERVISOR_TOKEN", &token)
            .env("DATA_DIR", &config.data_dir)
            .env_remove("SANDBOX_SUPERVISOR_URL")
            .stdin(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the supervisor exited ({status})"));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok((child, addr, token));
            }
            if started.elapsed() > READY_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the supervisor did not listen in time".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// In the child: ask for SIGTERM when the parent thread that started it ends
/// (`PR_SET_PDEATHSIG`), then check that the parent is still `parent` (it may have ended
/// before the request). False when it already ended.
pub fn follow_parent(parent: u32) -> bool {
    if rustix::process::set_parent_process_death_signal(Some(Signal::TERM)).is_err() {
        return false;
    }
    rustix::process::getppid().is_some_and(|p| p.as_raw_nonzero().get() as u32 == parent)
}

impl Drop for ManagedSupervisor {
    fn drop(&mut self) {
        let pid = self.child.id();
        // SIGTERM first, so the child's server stops cleanly; SIGKILL after the grace.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            Signal::TERM,
        );
        let started = Instant::now();
        while started.elapsed() < STOP_GRACE {
            if let Ok(Some(_)) = self.child.try_wait() {
                tracing::info!(pid, "supervisor.managed.stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        tracing::info!(pid, "supervisor.managed.stopped");
    }
}
