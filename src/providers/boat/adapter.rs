//! The `box` adapter of the shared remote provider ([`RemoteSandboxes`]), for the vendor the
//! spec calls Box or Boat. Creates and resumes with `noEnv: true` (the key belongs to a third
//! party: the account's environment must never reach a computer), an `Idempotency-Key` on
//! create, a two-hour TTL pushed again while the computer is used; stop archives the machine
//! and connect resumes the same opaque id. Deleted, cancelled, an expired snapshot, and an
//! error that resume cannot fix are gone: the computer is replaced and restored.
//!
//! One desktop per machine: Box machines ship the primary desktop, not the secondary-display
//! stack, so `multiScreen` is false and a second bot's graphical tools get
//! `MULTI_SCREEN_UNAVAILABLE` while its shell and file tools keep working.
//!
//! Live screens: the screen gateway's port is reached through a protected host URL (`POST
//! /sandboxes/{id}/host` with `public: false`), asked for on every create and connect. Its
//! token is a query parameter (`?_token=`): the adapter moves it out of the URL into the
//! [`PortEndpoint`]'s parameters, which the shared loopback forwarder adds to every request,
//! so the URL and its token stay in this process (never in a route, a browser or a log).

use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, MachineSpec, ProviderError, ProviderResult};

use super::client::{BoatClient, TTL};
use super::wire::{HOST_TOKEN_PARAM, HostUrl, State};
use crate::desktop::shell_quote;
use crate::providers::remote::{Layout, PortEndpoint, RemoteCommand, RemoteSandboxes};
use crate::supervisor::engine::GATEWAY_PORT;

/// The workspace on Box machines (the spec's `/home/user/rakazo-home`).
pub const WORKSPACE: &str = "/home/user/rakazo-home";
/// The runtime's private directory (under `/tmp`, which Box's file API also allows).
pub const RUN_DIR: &str = "/tmp/rakazo-run";
/// How long a sandbox may take to become usable or archived.
const SETTLE: Duration = Duration::from_secs(300);

/// How the adapter is set up.
#[derive(Clone)]
pub struct BoatConfig {
    /// `box` or `box-emulator`.
    pub kind: &'static str,
    /// `BOAT_API_URL`.
    pub api_url: String,
    /// `BOAT_API_KEY` (never logged).
    pub api_key: String,
}

impl std::fmt::Debug for BoatConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoatConfig")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// A connected sandbox.
#[derive(Clone, Debug)]
pub struct Session {
    id: String,
    /// The protected host URL of the screen gateway (its `Debug` shows nothing of it).
    gateway: PortEndpoint,
}

/// The endpoint of a protected host URL: its token (and any other parameter) moved from the
/// URL into the parameters the forwarder adds to every request. No error names the URL.
pub fn host_endpoint(host: &HostUrl) -> ProviderResult<PortEndpoint> {
    let mut url = reqwest::Url::parse(&host.url)
        .map_err(|_| ProviderError::Failed("box gave an unreadable host URL".into()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ProviderError::Failed(
            "box gave a host URL that is not http or https".into(),
        ));
    }
    let query: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    if !query
        .iter()
        .any(|(k, v)| k == HOST_TOKEN_PARAM && !v.is_empty())
    {
        return Err(ProviderError::Failed(
            "box gave a protected host URL without its token".into(),
        ));
    }
    url.set_query(None);
    url.set_fragment(None);
    Ok(PortEndpoint {
        url: url.as_str().trim_end_matches('/').to_string(),
        headers: Vec::new(),
        query,
    })
}

/// The adapter.
pub struct Boat {
    config: BoatConfig,
    client: BoatClient,
}

impl Boat {
    /// An adapter for `config`.
    pub fn new(config: BoatConfig) -> ProviderResult<Self> {
        Ok(Self {
            client: BoatClient::new(&config.api_url, &config.api_key)?,
            config,
        })
    }

    /// The endpoint of the sandbox's screen gateway, through a protected host URL.
    async fn gateway(&self, id: &str) -> ProviderResult<PortEndpoint> {
        let host = self.client.host(id, GATEWAY_PORT).await?;
        host_endpoint(&host)
    }

    /// A failed call on a sandbox the API says is gone is `MachineGone`.
    async fn gone_or(&self, id: &str, err: ProviderError) -> ProviderError {
        if matches!(err, ProviderError::Failed(_)) {
            match self.client.get(id).await {
                Err(ProviderError::MachineGone) => return ProviderError::MachineGone,
                Ok(sb) if sb.is_gone() || sb.state() == State::Error => {
                    return ProviderError::MachineGone;
                }
                _ => {}
            }
        }
        err
    }
}

#[async_trait]
impl RemoteSandboxes for Boat {
    type Session = Session;

    fn kind(&self) -> &'static str {
        self.config.kind
    }

    fn layout(&self) -> Layout {
        Layout {
            workspace: WORKSPACE.into(),
            run_dir: RUN_DIR.into(),
            gateway_port: GATEWAY_PORT,
        }
    }

    fn id(session: &Session) -> &str {
        &session.id
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn multi_screen(&self) -> bool {
        false
    }

    async fn health(&self) -> Result<(), String> {
        self.client
            .health()
            .await
            .map_err(|_| "the Box API does not answer this key".to_owned())
    }

    async fn create(&self, spec: &MachineSpec) -> ProviderResult<Session> {
        // One key per attempt: a retried request of this attempt gets the same sandbox.
        let key = format!(
            "rakazo-{}-{}",
            spec.computer_id,
            uuid::Uuid::new_v4().simple()
        );
        let created = self.client.create(None, &key).await?;
        if let Err(e) = self.client.wait_usable(&created.id, SETTLE).await {
            let _ = self.client.delete(&created.id).await;
            return Err(match e {
                ProviderError::MachineGone => {
                    ProviderError::Failed("the new Box sandbox failed to start".into())
                }
                e => e,
            });
        }
        let gateway = match self.gateway(&created.id).await {
            Ok(g) => g,
            Err(e) => {
                let _ = self.client.delete(&created.id).await;
                return Err(e);
            }
        };
        tracing::info!(computer.id = %spec.computer_id, "box.sandbox.created");
        Ok(Session {
            id: created.id,
            gateway,
        })
    }

    async fn connect(&self, id: &str) -> ProviderResult<Session> {
        let mut sb = self.client.get(id).await?;
        if sb.is_gone() {
            return Err(ProviderError::MachineGone);
        }
        if sb.state() == State::Archiving {
            sb = self.client.wait_archived(id, SETTLE).await?;
        }
        if !sb.state().usable() {
            // Archived (or in error): resume the same id; a refusal it cannot get past means
            // the machine is gone.
            match self.client.resume(id).await {
                Ok(_) => {}
                Err(ProviderError::Failed(m)) if sb.state() == State::Error => {
                    tracing::info!(reason = %m.chars().take(120).collect::<String>(), "box.sandbox.unrecoverable");
                    return Err(ProviderError::MachineGone);
                }
                Err(e) => return Err(e),
            }
            match self.client.wait_usable(id, SETTLE).await {
                Ok(_) => {}
                Err(ProviderError::Failed(_))
                    if self
                        .client
                        .get(id)
                        .await
                        .is_ok_and(|s| s.state() == State::Error) =>
                {
                    return Err(ProviderError::MachineGone);
                }
                Err(e) => return Err(e),
            }
            tracing::info!("box.sandbox.resumed");
        }
        let gateway = match self.gateway(id).await {
            Ok(g) => g,
            Err(e) => return Err(self.gone_or(id, e).await),
        };
        Ok(Session {
            id: id.to_string(),
            gateway,
        })
    }

    async fn refresh(&self, s: &Session) -> ProviderResult<()> {
        match self.client.refresh_ttl(&s.id).await {
            Ok(sb) if sb.is_gone() => Err(ProviderError::MachineGone),
            Ok(_) => Ok(()),
            Err(e) => Err(self.gone_or(&s.id, e).await),
        }
    }

    async fn pause(&self, id: &str) -> ProviderResult<()> {
        let sb = self.client.get(id).await?;
        if sb.is_gone() {
            return Err(ProviderError::MachineGone);
        }
        if sb.state() != State::Archived {
            self.client.stop(id).await?;
        }
        self.client.wait_archived(id, SETTLE).await.map(|_| ())
    }

    async fn kill(&self, id: &str) -> ProviderResult<()> {
        self.client.delete(id).await
    }

    async fn run(&self, s: &Session, command: &RemoteCommand) -> ProviderResult<ExecOutput> {
        let exports = command.exports();
        let line = format!(
            "exec bash -c {}",
            shell_quote(&format!(
                "{exports}exec bash -c {}",
                shell_quote(&command.script)
            ))
        );
        match self
            .client
            .command(&s.id, &line, Some(&command.cwd), command.timeout)
            .await
        {
            Ok(r) => Ok(ExecOutput {
                exit_code: if r.timed_out {
                    -1
                } else {
                    r.exit_code.unwrap_or(-1)
                },
                stdout: r.stdout,
                stderr: r.stderr,
                timed_out: r.timed_out,
            }),
            Err(e) => Err(self.gone_or(&s.id, e).await),
        }
    }

    async fn upload(&self, s: &Session, path: &str, data: Vec<u8>) -> ProviderResult<()> {
        match self.client.write_file(&s.id, path, &data).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.gone_or(&s.id, e).await),
        }
    }

    async fn download(&self, s: &Session, path: &str, limit: u64) -> ProviderResult<Vec<u8>> {
        let data = match self.client.read_file(&s.id, path, limit).await {
            Ok(d) => d,
            Err(e) => return Err(self.gone_or(&s.id, e).await),
        };
        if data.len() as u64 > limit {
            return Err(ProviderError::TooLarge(path.chars().take(200).collect()));
        }
        Ok(data)
    }

    fn port(&self, s: &Session, port: u16) -> PortEndpoint {
        if port != GATEWAY_PORT {
            tracing::warn!(port, "box.port.unknown");
        }
        s.gateway.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(url: &str) -> HostUrl {
        HostUrl {
            url: url.into(),
            access: "protected".into(),
            is_protected: true,
        }
    }

    #[test]
    fn the_host_token_leaves_the_url_for_the_forwarder() {
        let e = host_endpoint(&host(
            "https://6080-bx-1a2b3c4d.boat.dev/some/path/?_token=s3cret&x=1",
        ))
        .unwrap();
        assert_eq!(e.url, "https://6080-bx-1a2b3c4d.boat.dev/some/path");
        assert!(!e.url.contains("s3cret"));
        assert_eq!(
            e.query,
            [
                ("_token".to_string(), "s3cret".to_string()),
                ("x".to_string(), "1".to_string())
            ]
        );
        let root = host_endpoint(&host("http://127.0.0.1:4000/?_token=t")).unwrap();
        assert_eq!(root.url, "http://127.0.0.1:4000");
    }

    #[test]
    fn a_host_url_without_its_token_or_unreadable_is_refused_without_naming_it() {
        for bad in [
            "https://6080-bx-1.boat.dev/",
            "https://6080-bx-1.boat.dev/?_token=",
            "ftp://6080-bx-1.boat.dev/?_token=t",
            "not a url ?_token=t",
        ] {
            let ProviderError::Failed(m) = host_endpoint(&host(bad)).unwrap_err() else {
                panic!("{bad}");
            };
            assert!(!m.contains("boat.dev") && !m.contains("_token=t"), "{m}");
        }
    }
}
