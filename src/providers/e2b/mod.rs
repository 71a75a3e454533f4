//! The `e2b` adapter (`SANDBOX_PROVIDER=e2b`, and `e2b-emulator` pointed at the in-process
//! emulator): E2B's control plane and envd over reqwest, behind the shared remote port
//! ([`RemoteSandboxes`]), so the generic [`crate::providers::remote::provider::RemoteProvider`]
//! gives it screens, files and lifecycle.
//!
//! - control plane (`X-API-KEY`): `POST /v2/sandboxes` from `SANDBOX_TEMPLATE`, `POST
//!   /v2/sandboxes/{id}/connect` (resumes a paused one), `POST /sandboxes/{id}/timeout`
//!   (TTL refresh), `POST /sandboxes/{id}/pause`, `DELETE /sandboxes/{id}`; 404 is
//!   `MachineGone`;
//! - envd (`X-Access-Token`, `E2b-Sandbox-Id`): `process.Process/Start` server-streaming
//!   with its envelope framing ([`connect`]), `SendSignal` to kill a command whose deadline
//!   passed or whose caller went away, asked again until confirmed ([`stop`]; still
//!   unconfirmed, an error and a log event), and a program attached to this host (`stdin:
//!   true`, `SendInput`; [`attach`]) for the machine's exec agent,
//!   `/files` up (multipart) and down;
//! - ports: `https://<port>-<id>.<domain>` (or, for the emulator, its address with that
//!   `Host`), reached only through the remote provider's loopback forwarder.
//!
//! Novita ([`Vendor::Novita`], `SANDBOX_PROVIDER=novita`) speaks the same API at its own
//! domain, with its differences: the template is required (no stock template is tried
//! instead), a pause is confirmed by reading the sandbox's state back (retried), and sandbox
//! ids carry a hyphen, and a command whose stop stays unconfirmed pauses the sandbox and
//! quarantines it ([`stop`]). Pause on idle and stop, resume on reconnect and destroy without
//! a resume are what both do.
//!
//! Errors never carry the vendor's host, key or tokens.

mod attach;
pub mod connect;
mod stop;

use std::time::Duration;

use async_trait::async_trait;
use rakazo_actors::provider::{ExecOutput, MachineSpec, ProviderError, ProviderResult};
use serde_json::{Value, json};

use super::remote::{Layout, PortEndpoint, RemoteCommand, RemoteSandboxes};
use connect::{Decoder, Frame};

/// envd's port.
pub const ENVD_PORT: u16 = 49983;
/// The workspace on E2B machines.
pub const WORKSPACE: &str = "/home/user/rakazo-home";
/// The runtime's private directory on E2B machines.
pub const RUN_DIR: &str = "/tmp/rakazo-run";
/// Sandbox lifetime without a refresh.
const TTL: Duration = Duration::from_secs(600);
/// Deadline of control-plane calls (creating a sandbox takes a while).
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Extra time given to the server past a command's own deadline (the adapter kills first).
const RUN_SLACK: Duration = Duration::from_secs(2);
/// How long a command past its deadline may take to report its pid, so it can be killed.
const START_GRACE: Duration = Duration::from_secs(30);
/// Cap on each of stdout and stderr of one command.
const OUTPUT_CAP: usize = 1 << 20;

/// Which vendor speaks E2B's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// E2B.
    E2b,
    /// Novita (E2B-compatible, with the differences above).
    Novita,
}

impl Vendor {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::E2b => "E2B",
            Vendor::Novita => "Novita",
        }
    }
}

/// How many times a Novita pause is asked for before it is reported unconfirmed.
const PAUSE_ATTEMPTS: u32 = 3;

/// How the adapter is set up.
#[derive(Clone)]
pub struct E2bConfig {
    /// `SANDBOX_PROVIDER` name it reports (`e2b`, `e2b-emulator`, `novita`).
    pub kind: &'static str,
    /// Whose API it is.
    pub vendor: Vendor,
    /// `E2B_API_KEY` (`NOVITA_API_KEY`).
    pub api_key: String,
    /// `E2B_DOMAIN` (default `e2b.app`; `NOVITA_DOMAIN`).
    pub domain: String,
    /// `E2B_API_URL` (default `https://api.<domain>`; `NOVITA_API_URL`).
    pub api_url: String,
    /// envd's base URL for every sandbox (the emulator's address); `None`: E2B's own hosts.
    pub sandbox_url: Option<String>,
    /// `SANDBOX_TEMPLATE`.
    pub template: String,
}

impl std::fmt::Debug for E2bConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("E2bConfig([redacted])")
    }
}

/// A connected sandbox.
#[derive(Clone)]
pub struct Session {
    /// The sandbox id.
    pub id: String,
    /// envd's base URL.
    envd: String,
    /// `envdAccessToken`.
    access_token: Option<String>,
    /// `trafficAccessToken`.
    traffic_token: Option<String>,
    /// The domain of its port hosts.
    domain: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({})", self.id)
    }
}

/// The adapter.
#[derive(Clone)]
pub struct E2b {
    config: E2bConfig,
    http: reqwest::Client,
    /// Novita sandboxes whose command's stop was not confirmed ([`stop`]).
    quarantine: stop::Quarantine,
}

/// A reqwest failure without its URL (which names the vendor's host).
fn transport(what: &str, e: &reqwest::Error) -> ProviderError {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection"
    } else {
        "transport"
    };
    ProviderError::Failed(format!("E2B {what}: {kind}"))
}

/// Accepts sandbox ids as E2B (`[a-z0-9]`) and Novita (with hyphens) make them.
fn check_id(id: &str) -> ProviderResult<()> {
    if !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Ok(())
    } else {
        Err(ProviderError::MachineGone)
    }
}

impl E2b {
    /// An adapter; refuses an empty key.
    pub fn new(config: E2bConfig) -> ProviderResult<Self> {
        if config.api_key.trim().is_empty() {
            return Err(ProviderError::Unsupported(match config.vendor {
                Vendor::E2b => "SANDBOX_PROVIDER=e2b requires E2B_API_KEY".into(),
                Vendor::Novita => "SANDBOX_PROVIDER=novita requires NOVITA_API_KEY".into(),
            }));
        }
        if config.vendor == Vendor::Novita && config.template.trim().is_empty() {
            return Err(ProviderError::Unsupported(
                "SANDBOX_PROVIDER=novita requires SANDBOX_TEMPLATE (Novita has no stock fallback)"
                    .into(),
            ));
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ProviderError::Failed(format!("E2B client: {e}")))?;
        Ok(Self {
            config,
            http,
            quarantine: stop::Quarantine::default(),
        })
    }

    fn name(&self) -> &'static str {
        self.config.vendor.name()
    }

    /// Novita: the sandbox's state as the control plane reports it (`MachineGone` on 404).
    async fn state(&self, id: &str) -> ProviderResult<String> {
        match self
            .control(reqwest::Method::GET, &format!("/sandboxes/{id}"), None)
            .await?
        {
            (200, v) => Ok(v["state"].as_str().unwrap_or("").to_string()),
            (404, _) => Err(ProviderError::MachineGone),
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to a state read",
                self.name()
            ))),
        }
    }

    /// One `POST /sandboxes/{id}/pause`.
    async fn pause_once(&self, id: &str) -> ProviderResult<()> {
        match self
            .control(
                reqwest::Method::POST,
                &format!("/sandboxes/{id}/pause"),
                Some(json!({})),
            )
            .await?
        {
            (200..=299 | 409, _) => Ok(()),
            (404, _) => Err(ProviderError::MachineGone),
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to pause",
                self.name()
            ))),
        }
    }

    async fn control(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> ProviderResult<(u16, Value)> {
        let mut req = self
            .http
            .request(
                method,
                format!("{}{path}", self.config.api_url.trim_end_matches('/')),
            )
            .header("X-API-KEY", &self.config.api_key)
            .timeout(CALL_TIMEOUT);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| transport("control plane", &e))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| transport("control plane", &e))?;
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match status {
            200..=299 | 404 | 409 => Ok((status, value)),
            401 | 403 => Err(ProviderError::Failed(format!(
                "{} refused the API key",
                self.name()
            ))),
            _ => Err(ProviderError::Failed(format!(
                "{} answered {status}: {}",
                self.name(),
                value["message"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
        }
    }

    fn session(&self, v: &Value) -> ProviderResult<Session> {
        let id = v["sandboxID"]
            .as_str()
            .ok_or_else(|| ProviderError::Failed("E2B answered without a sandbox id".into()))?;
        check_id(id)
            .map_err(|_| ProviderError::Failed("E2B answered an unexpected sandbox id".into()))?;
        let domain = v["domain"]
            .as_str()
            .filter(|d| !d.is_empty())
            .unwrap_or(&self.config.domain)
            .to_string();
        let envd = match &self.config.sandbox_url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None if matches!(domain.as_str(), "e2b.app" | "e2b.dev" | "e2b.pro") => {
                format!("https://sandbox.{domain}")
            }
            None => format!("https://{ENVD_PORT}-{id}.{domain}"),
        };
        Ok(Session {
            id: id.to_string(),
            envd,
            access_token: v["envdAccessToken"].as_str().map(str::to_owned),
            traffic_token: v["trafficAccessToken"].as_str().map(str::to_owned),
            domain,
        })
    }

    fn envd(&self, s: &Session, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .request(method, format!("{}{path}", s.envd))
            .header("E2b-Sandbox-Id", &s.id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        if let Some(t) = &s.access_token {
            req = req.header("X-Access-Token", t);
        }
        req
    }

    /// A `process.Process/Start` of `command`'s script with `bash -c` (its standard input kept
    /// open with `stdin`), server-streaming; without a deadline until one is added.
    fn start_request(
        &self,
        s: &Session,
        command: &RemoteCommand,
        stdin: bool,
    ) -> reqwest::RequestBuilder {
        let envs: serde_json::Map<String, Value> = command
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let body = connect::encode(
            0,
            &json!({
                "process": {"cmd": "/bin/bash", "args": ["-c", command.script], "envs": envs, "cwd": command.cwd},
                "stdin": stdin,
            }),
        );
        self.envd(s, reqwest::Method::POST, "/process.Process/Start")
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Connect-Content-Encoding", "identity")
            .header("Connect-Accept-Encoding", "identity")
            .header("Keepalive-Ping-Interval", "50")
            .body(body)
    }

    /// `SendSignal` SIGKILL: `Ok(true)` killed, `Ok(false)` no such process (it ended).
    async fn kill_process(&self, s: &Session, pid: u64) -> ProviderResult<bool> {
        let resp = self
            .envd(s, reqwest::Method::POST, "/process.Process/SendSignal")
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .timeout(Duration::from_secs(30))
            .body(json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}).to_string())
            .send()
            .await
            .map_err(|e| transport("envd", &e))?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            502 => Err(ProviderError::MachineGone),
            other => Err(ProviderError::Failed(format!(
                "envd answered {other} to a kill"
            ))),
        }
    }

    /// Reads a `Start` stream to its end.
    async fn read_stream(
        &self,
        resp: reqwest::Response,
        pid_tx: &tokio::sync::watch::Sender<Option<u64>>,
    ) -> ProviderResult<ExecOutput> {
        let mut pid: Option<u64> = None;
        let mut resp = resp;
        let mut decoder = Decoder::default();
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let b64 = |v: &Value| {
            use base64::Engine as _;
            v.as_str()
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                .unwrap_or_default()
        };
        let mut exit: Option<i32> = None;
        loop {
            while let Some(frame) = decoder.next_frame().map_err(ProviderError::Failed)? {
                match frame {
                    Frame::Message(m) => {
                        let event = &m["event"];
                        if pid.is_none() {
                            match event["start"]["pid"].as_u64() {
                                Some(p) => {
                                    pid = Some(p);
                                    let _ = pid_tx.send(Some(p));
                                }
                                None => {
                                    return Err(ProviderError::Failed(
                                        "envd's stream did not begin with the process start".into(),
                                    ));
                                }
                            }
                        } else if let Some(data) = event.get("data") {
                            for (key, buf) in [("stdout", &mut stdout), ("stderr", &mut stderr)] {
                                if let Some(v) = data.get(key) {
                                    let bytes = b64(v);
                                    let room = OUTPUT_CAP.saturating_sub(buf.len());
                                    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
                                }
                            }
                        } else if let Some(end) = event.get("end") {
                            exit = Some(end["exitCode"].as_i64().unwrap_or(0) as i32);
                        }
                    }
                    Frame::End(end) => {
                        if let Some(err) = end.get("error") {
                            let code = err["code"].as_str().unwrap_or("unknown");
                            if code == "unavailable" || code == "not_found" && pid.is_none() {
                                return Err(ProviderError::MachineGone);
                            }
                            return Err(ProviderError::Failed(format!(
                                "envd: {code}: {}",
                                err["message"]
                                    .as_str()
                                    .unwrap_or("")
                                    .chars()
                                    .take(200)
                                    .collect::<String>()
                            )));
                        }
                        let Some(exit_code) = exit else {
                            return Err(ProviderError::Failed(
                                "the command ended without an end event".into(),
                            ));
                        };
                        return Ok(ExecOutput {
                            exit_code,
                            stdout: String::from_utf8_lossy(&stdout).into_owned(),
                            stderr: String::from_utf8_lossy(&stderr).into_owned(),
                            timed_out: false,
                        });
                    }
                }
            }
            match resp
                .chunk()
                .await
                .map_err(|e| transport("envd stream", &e))?
            {
                Some(bytes) => decoder.push(&bytes),
                None => return Err(ProviderError::Failed("envd's stream ended early".into())),
            }
        }
    }
}

/// `/files?path=<path>`, the path percent-encoded.
fn files_path(path: &str) -> String {
    let mut out = String::from("/files?path=");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Kills a started command when the call is dropped before it ended (its caller went away).
struct KillOnDrop<'a> {
    adapter: Option<(&'a E2b, Session)>,
    pid: Option<u64>,
    rx: Option<tokio::sync::watch::Receiver<Option<u64>>>,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let Some((adapter, session)) = self.adapter.take() else {
            return;
        };
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let pid = self
            .pid
            .or_else(|| self.rx.as_ref().and_then(|rx| *rx.borrow()));
        let e2b = adapter.clone();
        tokio::spawn(async move {
            let why = match pid {
                Some(pid) => match e2b.kill_confirmed(&session, pid).await {
                    Ok(()) | Err(ProviderError::MachineGone) => {
                        tracing::debug!("e2b.command.cancelled");
                        return;
                    }
                    Err(e) => format!("a cancelled command's kill was not confirmed: {e}"),
                },
                None => "a cancelled command never reported its process, so it could not be killed"
                    .into(),
            };
            let _ = e2b.stop_unconfirmed(&session, &why).await;
        });
    }
}

#[async_trait]
impl RemoteSandboxes for E2b {
    type Session = Session;

    fn kind(&self) -> &'static str {
        self.config.kind
    }

    fn layout(&self) -> Layout {
        Layout {
            workspace: WORKSPACE.into(),
            run_dir: RUN_DIR.into(),
            gateway_port: crate::supervisor::engine::GATEWAY_PORT,
        }
    }

    fn id(session: &Session) -> &str {
        &session.id
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    async fn health(&self) -> Result<(), String> {
        match self
            .control(reqwest::Method::GET, "/v2/sandboxes?limit=1", None)
            .await
        {
            Ok((200, _)) => Ok(()),
            Ok((status, _)) => Err(format!("{} answered {status}", self.name())),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn create(&self, spec: &MachineSpec) -> ProviderResult<Session> {
        let body = json!({
            "templateID": self.config.template,
            "timeout": TTL.as_secs(),
            "autoPause": false,
            "metadata": {
                "rakazoComputerId": spec.computer_id,
                "rakazoWorkspaceId": spec.space_id,
                "rakazoHomeKey": spec.home_key,
            },
        });
        match self
            .control(reqwest::Method::POST, "/v2/sandboxes", Some(body))
            .await?
        {
            (201 | 200, v) => {
                let s = self.session(&v)?;
                tracing::info!(sandbox.id = %s.id, "e2b.sandbox.created");
                Ok(s)
            }
            // The template is not in the key's account: said plainly, nothing else is tried.
            (404, _) => Err(ProviderError::Failed(format!(
                "{} has no template `{}` in this account: build it, or set SANDBOX_TEMPLATE",
                self.name(),
                self.config.template
            ))),
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to create",
                self.name()
            ))),
        }
    }

    async fn connect(&self, id: &str) -> ProviderResult<Session> {
        check_id(id)?;
        // A quarantined sandbox is never resumed by this process (its row says so for all).
        self.refuse_quarantined(id)?;
        match self
            .control(
                reqwest::Method::POST,
                &format!("/v2/sandboxes/{id}/connect"),
                Some(json!({"timeout": TTL.as_secs()})),
            )
            .await?
        {
            (200 | 201, v) => self.session(&v),
            (404, _) => Err(ProviderError::MachineGone),
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to connect",
                self.name()
            ))),
        }
    }

    async fn refresh(&self, s: &Session) -> ProviderResult<()> {
        match self
            .control(
                reqwest::Method::POST,
                &format!("/sandboxes/{}/timeout", s.id),
                Some(json!({"timeout": TTL.as_secs()})),
            )
            .await?
        {
            (200..=299, _) => Ok(()),
            (404, _) => Err(ProviderError::MachineGone),
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to a timeout",
                self.name()
            ))),
        }
    }

    async fn pause(&self, id: &str) -> ProviderResult<()> {
        check_id(id)?;
        if self.config.vendor == Vendor::Novita {
            // Asked again until the state reads back as paused.
            for _ in 0..PAUSE_ATTEMPTS {
                match self.pause_once(id).await {
                    Ok(()) | Err(ProviderError::Failed(_)) => {}
                    Err(e) => return Err(e),
                }
                if self.state(id).await? == "paused" {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            tracing::warn!(sandbox.id = %id, "novita.sandbox.pause_unconfirmed");
            return Err(ProviderError::Failed(
                "Novita did not confirm the pause".into(),
            ));
        }
        self.pause_once(id).await
    }

    async fn kill(&self, id: &str) -> ProviderResult<()> {
        if check_id(id).is_err() {
            return Ok(());
        }
        match self
            .control(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None)
            .await?
        {
            (200..=299 | 404, _) => {
                self.quarantine.clear(id);
                Ok(())
            }
            (status, _) => Err(ProviderError::Failed(format!(
                "{} answered {status} to kill",
                self.name()
            ))),
        }
    }

    async fn run(&self, s: &Session, command: &RemoteCommand) -> ProviderResult<ExecOutput> {
        self.refuse_quarantined(&s.id)?;
        let server_deadline = command.timeout + RUN_SLACK;
        let deadline = tokio::time::Instant::now() + command.timeout;
        let request = self.start_request(s, command, false).header(
            "Connect-Timeout-Ms",
            server_deadline.as_millis().to_string(),
        );
        // The stream is read by a task that reports the pid as soon as it is known: when the
        // deadline passes (or this call is dropped) the command is killed by that pid, waiting
        // up to a grace for it if the command has not reported it yet.
        let (pid_tx, mut pid_rx) = tokio::sync::watch::channel(None::<u64>);
        let reader = self.clone();
        let mut task = tokio::spawn(async move {
            let resp = request.send().await.map_err(|e| transport("envd", &e))?;
            match resp.status().as_u16() {
                200 => {}
                502 => return Err(ProviderError::MachineGone),
                other => {
                    return Err(ProviderError::Failed(format!(
                        "envd answered {other} to a command"
                    )));
                }
            }
            reader.read_stream(resp, &pid_tx).await
        });
        let mut guard = KillOnDrop {
            adapter: Some((self, s.clone())),
            pid: None,
            rx: Some(pid_rx.clone()),
            task: Some(task.abort_handle()),
        };
        if let Ok(joined) = tokio::time::timeout_at(deadline, &mut task).await {
            guard.adapter = None;
            return joined
                .map_err(|_| ProviderError::Failed("the command's reader failed".into()))?;
        }
        let known = tokio::time::timeout(START_GRACE, pid_rx.wait_for(Option::is_some)).await;
        let pid = known.ok().and_then(|r| r.ok().and_then(|p| *p));
        task.abort();
        // The guard stays armed until the stop is settled: a caller that stops waiting
        // meanwhile leaves the kill (and, unconfirmed, the quarantine) to the background.
        (guard.pid, guard.rx, guard.task) = (pid, None, None);
        let outcome = match pid {
            None => Err(self
                .stop_unconfirmed(
                    s,
                    "the command passed its deadline without reporting its process, which could not be killed",
                )
                .await),
            Some(pid) => match self.kill_confirmed(s, pid).await {
                Ok(()) => Ok(ExecOutput {
                    exit_code: -1,
                    stdout: String::new(),
                    stderr: String::new(),
                    timed_out: true,
                }),
                Err(ProviderError::MachineGone) => Err(ProviderError::MachineGone),
                Err(e) => Err(self
                    .stop_unconfirmed(
                        s,
                        &format!(
                            "the command passed its deadline and its kill was not confirmed: {e}"
                        ),
                    )
                    .await),
            },
        };
        guard.adapter = None;
        outcome
    }

    async fn upload(&self, s: &Session, path: &str, data: Vec<u8>) -> ProviderResult<()> {
        let boundary = format!("rakazo{}", uuid::Uuid::new_v4().simple());
        let name = path.replace(['"', '\r', '\n'], "_");
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(&data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let resp = self
            .envd(s, reqwest::Method::POST, &files_path(path))
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .timeout(Duration::from_secs(600))
            .body(body)
            .send()
            .await
            .map_err(|e| transport("envd files", &e))?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            502 => Err(ProviderError::MachineGone),
            other => Err(ProviderError::Failed(format!(
                "envd answered {other} to an upload"
            ))),
        }
    }

    async fn download(&self, s: &Session, path: &str, limit: u64) -> ProviderResult<Vec<u8>> {
        let resp = self
            .envd(s, reqwest::Method::GET, &files_path(path))
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .map_err(|e| transport("envd files", &e))?;
        match resp.status().as_u16() {
            200 => {}
            404 => return Err(ProviderError::NotFound("file".into())),
            502 => return Err(ProviderError::MachineGone),
            other => {
                return Err(ProviderError::Failed(format!(
                    "envd answered {other} to a download"
                )));
            }
        }
        crate::providers::remote::body_within(resp, limit)
            .await
            .map_err(|e| transport("envd files", &e))?
            .ok_or_else(|| ProviderError::TooLarge(path.chars().take(200).collect()))
    }

    /// E2B's envd keeps a process's input open (`stdin: true`, `SendInput`). Novita's is not
    /// known to: there a batch and its frame stay one command.
    fn attaches(&self) -> bool {
        self.config.vendor == Vendor::E2b
    }

    async fn attach(
        &self,
        s: &Session,
        command: &RemoteCommand,
    ) -> ProviderResult<crate::exec_agent::Channel> {
        self.refuse_quarantined(&s.id)?;
        attach::attach(self, s, command).await
    }

    fn quarantined(&self, id: &str) -> Option<String> {
        self.quarantine.why(id)
    }

    fn port(&self, s: &Session, port: u16) -> PortEndpoint {
        let host = format!("{port}-{}.{}", s.id, s.domain);
        let mut headers = Vec::new();
        if let Some(t) = &s.traffic_token {
            headers.push(("e2b-traffic-access-token".to_string(), t.clone()));
        }
        match &self.config.sandbox_url {
            Some(base) => {
                headers.push(("Host".into(), host));
                PortEndpoint {
                    url: base.trim_end_matches('/').to_string(),
                    headers,
                    query: Vec::new(),
                }
            }
            None => PortEndpoint {
                url: format!("https://{host}"),
                headers,
                query: Vec::new(),
            },
        }
    }
}
