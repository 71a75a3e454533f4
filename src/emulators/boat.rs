//! `box-emulator`: Box's API (the vendor the spec calls Box or Boat) under `/api/v1` on
//! loopback, with real machines behind the sandboxes ([`Machines`]). Box has no SDK we can
//! install; this follows `shared/reference/vendors.md`.
//!
//! What it reproduces: `Authorization: Bearer` on every call, the `{ok:false, status, code,
//! message, requestId}` error envelope, `Idempotency-Key` on create (required; a replay
//! answers the same sandbox), `noEnv` (without it the account's environment is injected into
//! every command, as the vendor does), the TTL (`archiveAfter`: a running sandbox past it is
//! archived; `PATCH ttlSeconds` extends it), stop = snapshot then `archiving` → `archived`,
//! resume of the same id while the snapshot is kept, `snapshot_expired` once it is not, a
//! machine lost behind the API's back as `error` that resume cannot fix, delete only with
//! `X-Ascii-Confirm-Delete: <id>` (202 and an operation), commands with `timeoutSeconds`
//! 1..600 that are killed at the deadline (`timedOut`), files only under the user's home and
//! `/tmp`, and host URLs of a sandbox port.
//!
//! Host URLs: `POST /sandboxes/{id}/host` gives each port of a sandbox its own origin, a
//! listener on loopback (`http://127.0.0.1:<port>/`); a protected one carries its token as
//! `?_token=`, one per sandbox port. Every request to it (HTTP or websocket upgrade) must
//! carry that token, or it is refused with the error envelope (`401 unauthorized`); another
//! sandbox's token is just as wrong. The token is consumed there: the machine's port sees the
//! request without it. Like the daytona-emulator's previews, only the screen gateway's port
//! is published by the machines, so another port answers `502 port_unreachable`.
//!
//! The single screen: Box machines ship one desktop, not the secondary-display stack. The
//! emulator's machines are the computer image, which could run more; the adapter is what
//! keeps to one screen per machine (`multiScreen: false`), and the tests drive it here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine as _;
use rakazo_actors::provider::ProviderError;
use serde::Deserialize;

use super::daytona::rfc3339;
use super::front;
use super::machines::Machines;
use super::{bearer_accepted, port_addr, read, running, same_secret};
use crate::desktop::shell_quote;
use crate::providers::boat::wire::{
    CONFIRM_DELETE_HEADER, Command, CommandResult, CreateSandbox, Envelope, ErrorEnvelope,
    FileContent, HOST_TOKEN_PARAM, HostPort, HostUrl, IDEMPOTENCY_HEADER, MAX_COMMAND_SECONDS,
    Operation, Patch, Resume, Sandbox, State, codes,
};

/// Longest TTL a create, resume or patch may ask for.
pub const MAX_TTL_SECONDS: u64 = 24 * 60 * 60;
/// Largest request body (file writes in base64).
const BODY_LIMIT: usize = 96 << 20;
/// The account environment a sandbox gets unless it was created with `noEnv: true`.
pub const ACCOUNT_ENV: (&str, &str) = ("BOAT_ACCOUNT_TOKEN", "account-secret-of-the-key-holder");

/// How the emulator is set up.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The emulator's base URL as clients reach it (`http://127.0.0.1:PORT`).
    pub base_url: String,
    /// The only key accepted; `None` accepts any non-empty key.
    pub key: Option<String>,
    /// How long an archived sandbox keeps its snapshot.
    pub snapshot_retention: Duration,
}

struct Sb {
    dto: Sandbox,
    machine: Option<String>,
    no_env: bool,
    archive_at: Option<Instant>,
    archived_at: Option<Instant>,
    hosts: HashMap<u16, HostRoute>,
    busy: bool,
}

/// A sandbox port's host URL.
#[derive(Clone)]
struct HostRoute {
    /// Its `?_token=`.
    token: String,
    /// The loopback port of its listener.
    local: u16,
    /// Whether it was last asked for as public (no token needed).
    public: bool,
}

/// The emulator.
pub struct BoatEmulator {
    machines: Machines,
    settings: Settings,
    sandboxes: Mutex<HashMap<String, Sb>>,
    /// Idempotency key → sandbox id.
    idempotency: Mutex<HashMap<String, String>>,
}

/// An error as Box answers it.
#[derive(Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code.
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, "sandbox not found")
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, message)
    }

    fn state(state: State, what: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            codes::INVALID_STATE,
            format!("cannot {what} a sandbox that is {}", state.as_str()),
        )
    }

    /// The envelope.
    pub fn envelope(&self) -> ErrorEnvelope {
        ErrorEnvelope {
            ok: false,
            status: self.status.as_u16(),
            code: self.code.into(),
            message: self.message.clone(),
            request_id: format!("req_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        }
    }

    /// The envelope response.
    pub fn response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(self.envelope())
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::NotFound(_) => Self::new(
                StatusCode::NOT_FOUND,
                codes::FILE_NOT_FOUND,
                "file not found",
            ),
            ProviderError::PathRejected(m) => Self::invalid(m),
            ProviderError::TooLarge(_) => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                codes::INVALID_REQUEST,
                "file too large",
            ),
            ProviderError::MachineGone => Self::new(
                StatusCode::CONFLICT,
                codes::INVALID_STATE,
                "the sandbox is not running",
            ),
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                other.to_string(),
            ),
        }
    }
}

type Answer = Result<HttpResponse, ApiError>;

/// The lifecycle calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `POST /sandboxes/{id}/stop` (and a TTL expiry).
    Stop,
    /// `POST /sandboxes/{id}/resume`.
    Resume,
}

/// What `op` does from `state` (with `snapshot` telling whether an archived sandbox still has
/// its snapshot): the transitional and final states, `None` when it is already there, or the
/// refusal.
pub fn transition(
    state: State,
    snapshot: bool,
    op: Op,
) -> Result<Option<(State, State)>, ApiError> {
    use State::*;
    match (op, state) {
        (Op::Stop, Archived) => Ok(None),
        (Op::Stop, s) if s.usable() => Ok(Some((Archiving, Archived))),
        (Op::Stop, s) => Err(ApiError::state(s, "stop")),
        (Op::Resume, s) if s.usable() => Ok(None),
        (Op::Resume, Archived) if snapshot => Ok(Some((Provisioning, Running))),
        (Op::Resume, Archived) => Err(ApiError::new(
            StatusCode::GONE,
            codes::SNAPSHOT_EXPIRED,
            "the sandbox's snapshot expired: it cannot be resumed",
        )),
        (Op::Resume, Error) => Ok(Some((Provisioning, Running))),
        (Op::Resume, s) => Err(ApiError::state(s, "resume")),
    }
}

/// Whether a file path is one Box lets the API touch: absolute, no `.`/`..` segments, under
/// `home` or `/tmp`.
pub fn path_allowed(path: &str, home: &str) -> bool {
    if !path.starts_with('/') || path.contains('\0') {
        return false;
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return false;
    }
    let under = |root: &str| {
        let root = root.trim_end_matches('/');
        path.len() > root.len() + 1 && path.starts_with(root) && path.as_bytes()[root.len()] == b'/'
    };
    under(home) || under("/tmp")
}

/// A host URL request's head: the token it presents (`?_token=`) and the head the machine's
/// port gets, without the token, closed after its answer unless it is an upgrade (so each
/// later request on the connection would need its own token). `None` for a head that is not
/// an origin-form request.
pub fn host_request(head: &str) -> Option<(Option<String>, String)> {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let mut request = lines.next()?.splitn(3, ' ');
    let (method, target, version) = (request.next()?, request.next()?, request.next()?);
    if !target.starts_with('/') || target.starts_with("//") {
        return None;
    }
    let mut url = reqwest::Url::parse("http://host.invalid")
        .ok()?
        .join(target)
        .ok()?;
    let mut presented = None;
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .into_owned()
        .filter(|(k, v)| {
            let token = k == HOST_TOKEN_PARAM;
            if token && presented.is_none() {
                presented = Some(v.clone());
            }
            !token
        })
        .collect();
    url.set_query(None);
    if !kept.is_empty() {
        url.query_pairs_mut().extend_pairs(&kept);
    }
    let headers: Vec<&str> = lines.collect();
    let name = |l: &str| l.split(':').next().unwrap_or_default().trim().to_string();
    let upgrade = headers
        .iter()
        .any(|l| name(l).eq_ignore_ascii_case("upgrade"));
    let query = url.query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut out = format!("{method} {}{query} {version}\r\n", url.path());
    for line in headers {
        if !upgrade && name(line).eq_ignore_ascii_case("connection") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !upgrade {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    Some((presented, out))
}

fn epoch_in(d: Duration) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339((now + d).as_secs() as i64)
}

fn ok(kind: &str, sandbox: Sandbox) -> HttpResponse {
    HttpResponse::Ok().json(Envelope {
        ok: true,
        r#type: Some(kind.into()),
        sandbox: Some(sandbox),
        operation: None,
    })
}

impl BoatEmulator {
    /// An emulator over `machines`.
    pub fn new(machines: Machines, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            machines,
            settings,
            sandboxes: Mutex::new(HashMap::new()),
            idempotency: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sb>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn auth(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if bearer_accepted(req, self.settings.key.as_deref()) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                codes::UNAUTHORIZED,
                "missing or invalid API key",
            ))
        }
    }

    fn set_state(&self, id: &str, state: State, error: Option<String>) {
        if let Some(sb) = self.lock().get_mut(id) {
            sb.dto.state = state.as_str().into();
            sb.dto.error = error;
            match state {
                State::Archived => {
                    sb.archived_at = Some(Instant::now());
                    sb.archive_at = None;
                    sb.dto.archive_after = None;
                    sb.dto.snapshot_available = true;
                }
                s if s.usable() => {
                    sb.archived_at = None;
                    sb.dto.snapshot_available = false;
                }
                _ => {}
            }
        }
    }

    /// Reconciles a sandbox with its machine and its clocks: a machine gone behind the API's
    /// back is an `error`; a running sandbox past its TTL is archived; an archived one past
    /// the snapshot retention loses its snapshot.
    async fn refresh(self: &Arc<Self>, id: &str) {
        let (state, machine, busy, expired) = match self.lock().get_mut(id) {
            Some(sb) => {
                if sb.dto.state() == State::Archived
                    && sb
                        .archived_at
                        .is_some_and(|t| t.elapsed() >= self.settings.snapshot_retention)
                {
                    sb.dto.snapshot_available = false;
                }
                let expired = sb.archive_at.is_some_and(|t| Instant::now() >= t);
                (sb.dto.state(), sb.machine.clone(), sb.busy, expired)
            }
            None => return,
        };
        if busy {
            return;
        }
        let Some(machine) = machine else { return };
        if (state.usable() || state == State::Archived)
            && let Ok(None) = running(&self.machines, &machine).await
        {
            tracing::info!("emulator.box.machine_lost");
            if let Some(sb) = self.lock().get_mut(id) {
                sb.machine = None;
            }
            self.set_state(id, State::Error, Some("the machine was lost".into()));
            return;
        }
        if state.usable() && expired {
            tracing::info!("emulator.box.ttl_expired");
            let _ = self.lifecycle(id, Op::Stop).await;
        }
    }

    fn dto(&self, id: &str) -> Result<Sandbox, ApiError> {
        self.lock()
            .get(id)
            .map(|sb| sb.dto.clone())
            .ok_or_else(ApiError::not_found)
    }

    fn ttl(ttl: u64) -> Result<Duration, ApiError> {
        if ttl == 0 || ttl > MAX_TTL_SECONDS {
            return Err(ApiError::invalid(format!(
                "ttlSeconds must be 1..{MAX_TTL_SECONDS}"
            )));
        }
        Ok(Duration::from_secs(ttl))
    }

    async fn create(self: &Arc<Self>, req: &HttpRequest, body: CreateSandbox) -> Answer {
        let key = req
            .headers()
            .get(IDEMPOTENCY_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|k| !k.is_empty() && k.len() <= 200)
            .ok_or_else(|| ApiError::invalid("an Idempotency-Key header is required"))?
            .to_string();
        let ttl = Self::ttl(body.ttl_seconds)?;
        let id = {
            let mut idem = self.idempotency.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(id) = idem.get(&key) {
                let id = id.clone();
                drop(idem);
                return Ok(ok("sandbox.created", self.dto(&id)?));
            }
            let id = format!("bx_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
            idem.insert(key, id.clone());
            id
        };
        let dto = Sandbox {
            id: id.clone(),
            state: State::Provisioning.as_str().into(),
            url: format!("{}/sandboxes/{id}", self.settings.base_url),
            subdomain: id.replace('_', "-"),
            archive_after: Some(epoch_in(ttl)),
            snapshot_available: false,
            error: None,
            created_at: Some(epoch_in(Duration::ZERO)),
        };
        self.lock().insert(
            id.clone(),
            Sb {
                dto: dto.clone(),
                machine: None,
                no_env: body.no_env,
                archive_at: Some(Instant::now() + ttl),
                archived_at: None,
                hosts: HashMap::new(),
                busy: true,
            },
        );
        let this = self.clone();
        let sid = id.clone();
        actix_rt::spawn(async move {
            match this.machines.create("box", &sid).await.map(|info| info.id) {
                Ok(machine) => {
                    if let Some(sb) = this.lock().get_mut(&sid) {
                        sb.machine = Some(machine);
                    }
                    this.set_state(&sid, State::Ready, None);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "emulator.box.create_failed");
                    this.set_state(
                        &sid,
                        State::Error,
                        Some(format!("provisioning failed: {e}")),
                    );
                }
            }
            if let Some(sb) = this.lock().get_mut(&sid) {
                sb.busy = false;
            }
        });
        Ok(HttpResponse::Created().json(Envelope {
            ok: true,
            r#type: Some("sandbox.created".into()),
            sandbox: Some(dto),
            operation: None,
        }))
    }

    async fn lifecycle(self: &Arc<Self>, id: &str, op: Op) -> Answer {
        let (answer, to, machine) = {
            let mut map = self.lock();
            let sb = map.get_mut(id).ok_or_else(ApiError::not_found)?;
            if sb.busy {
                return Err(ApiError::state(sb.dto.state(), "change"));
            }
            match transition(sb.dto.state(), sb.dto.snapshot_available, op)? {
                None => return Ok(ok("sandbox.unchanged", sb.dto.clone())),
                Some((via, to)) => {
                    sb.busy = true;
                    sb.dto.state = via.as_str().into();
                    (sb.dto.clone(), to, sb.machine.clone())
                }
            }
        };
        let this = self.clone();
        let sid = id.to_string();
        actix_rt::spawn(async move {
            let result = match (op, &machine) {
                (_, None) => Err(ProviderError::MachineGone),
                (Op::Stop, Some(m)) => this.machines.stop(m).await,
                (Op::Resume, Some(m)) => this.machines.start(m).await.map(|_| ()),
            };
            match result {
                Ok(()) => this.set_state(&sid, to, None),
                Err(e) => {
                    tracing::info!(error = %e, "emulator.box.lifecycle_failed");
                    this.set_state(&sid, State::Error, Some(format!("{op:?} failed")));
                }
            }
            if let Some(sb) = this.lock().get_mut(&sid) {
                sb.busy = false;
            }
        });
        let kind = match op {
            Op::Stop => "sandbox.archiving",
            Op::Resume => "sandbox.resuming",
        };
        Ok(ok(kind, answer))
    }

    async fn resume(self: &Arc<Self>, id: &str, body: Resume) -> Answer {
        self.refresh(id).await;
        let ttl = Self::ttl(body.ttl_seconds.unwrap_or(3600))?;
        let state = self.dto(id)?.state();
        if state == State::Error && self.lock().get(id).is_some_and(|sb| sb.machine.is_none()) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                codes::INVALID_STATE,
                "the sandbox failed and cannot be resumed",
            ));
        }
        let answer = self.lifecycle(id, Op::Resume).await?;
        if let Some(sb) = self.lock().get_mut(id) {
            sb.no_env = body.no_env;
            sb.archive_at = Some(Instant::now() + ttl);
            sb.dto.archive_after = Some(epoch_in(ttl));
        }
        Ok(answer)
    }

    async fn patch(self: &Arc<Self>, id: &str, body: Patch) -> Answer {
        self.refresh(id).await;
        let ttl = Self::ttl(body.ttl_seconds)?;
        let mut map = self.lock();
        let sb = map.get_mut(id).ok_or_else(ApiError::not_found)?;
        if !sb.dto.state().usable() {
            return Err(ApiError::state(sb.dto.state(), "extend"));
        }
        sb.archive_at = Some(Instant::now() + ttl);
        sb.dto.archive_after = Some(epoch_in(ttl));
        Ok(ok("sandbox.updated", sb.dto.clone()))
    }

    async fn delete(self: &Arc<Self>, req: &HttpRequest, id: &str) -> Answer {
        let confirmed = req
            .headers()
            .get(CONFIRM_DELETE_HEADER)
            .and_then(|v| v.to_str().ok())
            == Some(id);
        let machine = {
            let map = self.lock();
            let sb = map.get(id).ok_or_else(ApiError::not_found)?;
            if !confirmed {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_REQUIRED,
                    codes::CONFIRMATION_REQUIRED,
                    format!("send {CONFIRM_DELETE_HEADER}: <sandbox id> to delete"),
                ));
            }
            sb.machine.clone()
        };
        self.lock().remove(id);
        if let Some(m) = machine {
            let machines = self.machines.clone();
            actix_rt::spawn(async move {
                if let Err(e) = machines.remove(&m).await {
                    tracing::warn!(error = %e, "emulator.box.remove_failed");
                }
            });
        }
        Ok(HttpResponse::Accepted().json(Envelope {
            ok: true,
            r#type: Some("operation".into()),
            sandbox: None,
            operation: Some(Operation {
                id: format!("op_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]),
                kind: "delete".into(),
                status: "pending".into(),
            }),
        }))
    }

    /// The usable sandbox's machine and its command environment; a command marks it running.
    async fn usable(
        self: &Arc<Self>,
        id: &str,
    ) -> Result<(String, Vec<(String, String)>), ApiError> {
        self.refresh(id).await;
        let mut map = self.lock();
        let sb = map.get_mut(id).ok_or_else(ApiError::not_found)?;
        let state = sb.dto.state();
        match (&sb.machine, state.usable() && !sb.busy) {
            (Some(m), true) => {
                sb.dto.state = State::Running.as_str().into();
                let env = if sb.no_env {
                    Vec::new()
                } else {
                    vec![(ACCOUNT_ENV.0.to_string(), ACCOUNT_ENV.1.to_string())]
                };
                Ok((m.clone(), env))
            }
            _ => Err(ApiError::state(state, "use")),
        }
    }

    async fn command(self: &Arc<Self>, id: &str, body: Command) -> Answer {
        if body.timeout_seconds == 0 || body.timeout_seconds > MAX_COMMAND_SECONDS {
            return Err(ApiError::invalid(format!(
                "timeoutSeconds must be 1..{MAX_COMMAND_SECONDS}"
            )));
        }
        let (machine, env) = self.usable(id).await?;
        let cwd = body.cwd.clone().unwrap_or_else(|| self.machines.home());
        if body.detached {
            let script = format!(
                "setsid sh -c {} >/dev/null 2>&1 </dev/null &",
                shell_quote(&body.command)
            );
            self.machines
                .exec(&machine, &script, &cwd, &env, Duration::from_secs(10))
                .await?;
            return Ok(HttpResponse::Accepted().json(serde_json::json!({"ok": true})));
        }
        let out = self
            .machines
            .exec(
                &machine,
                &format!("exec sh -c {}", shell_quote(&body.command)),
                &cwd,
                &env,
                Duration::from_secs(body.timeout_seconds),
            )
            .await?;
        let result = CommandResult {
            exit_code: (!out.timed_out).then_some(out.exit_code),
            stdout: out.stdout,
            stderr: out.stderr,
            timed_out: out.timed_out,
        };
        let mut v = serde_json::to_value(&result).unwrap_or_default();
        v["ok"] = serde_json::Value::Bool(true);
        Ok(HttpResponse::Ok().json(v))
    }

    fn check_path(&self, path: &str) -> Result<(), ApiError> {
        if path_allowed(path, &self.machines.home()) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                codes::PATH_NOT_ALLOWED,
                "files are only reachable under the user's home and /tmp",
            ))
        }
    }

    async fn read_file(self: &Arc<Self>, id: &str, path: &str, encoding: &str) -> Answer {
        self.check_path(path)?;
        let (machine, _) = self.usable(id).await?;
        let data = read(&self.machines, &machine, path).await?;
        let content = match encoding {
            "base64" => base64::engine::general_purpose::STANDARD.encode(&data),
            "utf8" | "" => String::from_utf8(data)
                .map_err(|_| ApiError::invalid("the file is not UTF-8: ask for base64"))?,
            _ => return Err(ApiError::invalid("encoding must be utf8 or base64")),
        };
        let mut v = serde_json::to_value(FileContent {
            path: path.to_string(),
            content,
            encoding: if encoding.is_empty() {
                "utf8"
            } else {
                encoding
            }
            .into(),
        })
        .unwrap_or_default();
        v["ok"] = serde_json::Value::Bool(true);
        Ok(HttpResponse::Ok().json(v))
    }

    async fn write_file(self: &Arc<Self>, id: &str, body: FileContent) -> Answer {
        self.check_path(&body.path)?;
        let data = match body.encoding.as_str() {
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(&body.content)
                .map_err(|_| ApiError::invalid("content is not base64"))?,
            "utf8" | "" => body.content.into_bytes(),
            _ => return Err(ApiError::invalid("encoding must be utf8 or base64")),
        };
        let (machine, _) = self.usable(id).await?;
        self.machines
            .write_file(&machine, &body.path, &data)
            .await?;
        Ok(HttpResponse::Ok()
            .json(serde_json::json!({"ok": true, "path": body.path, "size": data.len()})))
    }

    async fn host(self: &Arc<Self>, id: &str, body: HostPort) -> Answer {
        self.usable(id).await?;
        let known = self
            .lock()
            .get(id)
            .ok_or_else(ApiError::not_found)?
            .hosts
            .get(&body.port)
            .map(|h| h.local);
        let local = match known {
            Some(local) => local,
            None => self.listen_host(id, body.port).await?,
        };
        let route = {
            let mut map = self.lock();
            let sb = map.get_mut(id).ok_or_else(ApiError::not_found)?;
            let route = sb.hosts.entry(body.port).or_insert_with(|| HostRoute {
                token: uuid::Uuid::new_v4().simple().to_string(),
                local,
                public: body.public,
            });
            route.public = body.public;
            route.clone()
        };
        let base = format!("http://127.0.0.1:{}/", route.local);
        let url = if body.public {
            base
        } else {
            format!("{base}?{HOST_TOKEN_PARAM}={}", route.token)
        };
        let mut v = serde_json::to_value(HostUrl {
            url,
            access: if body.public { "public" } else { "protected" }.into(),
            is_protected: !body.public,
        })
        .unwrap_or_default();
        v["ok"] = serde_json::Value::Bool(true);
        Ok(HttpResponse::Ok().json(v))
    }

    /// Starts the listener of a sandbox port's host URL; it stops with the sandbox.
    async fn listen_host(self: &Arc<Self>, id: &str, port: u16) -> Result<u16, ApiError> {
        let failed = |e: std::io::Error| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                e.kind().to_string(),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(failed)?;
        let local = listener.local_addr().map_err(failed)?.port();
        let this = self.clone();
        let sid = id.to_string();
        actix_rt::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                if !this.lock().contains_key(&sid) {
                    break;
                }
                let (emu, sid) = (this.clone(), sid.clone());
                actix_rt::spawn(async move {
                    if let Err(e) = emu.relay_host(conn, &sid, port).await {
                        tracing::debug!(error = %e.kind(), "emulator.box.host_closed");
                    }
                });
            }
        });
        Ok(local)
    }

    /// One connection to a host URL: its first request must carry the port's current token
    /// (unless the port is public); the request reaches the machine's port without it.
    async fn relay_host(
        self: &Arc<Self>,
        mut conn: tokio::net::TcpStream,
        id: &str,
        port: u16,
    ) -> std::io::Result<()> {
        let Some((buf, end)) = front::read_head(&mut conn).await? else {
            return Ok(());
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let passed = match host_request(&head) {
            Some((presented, forwarded)) => self
                .host_allowed(id, port, presented.as_deref())
                .map(|()| forwarded),
            None => Err(ApiError::invalid("malformed request")),
        };
        let target = match passed {
            Ok(forwarded) => self.host_target(id, port).await.map(|t| (t, forwarded)),
            Err(e) => Err(e),
        };
        match target {
            Ok((target, forwarded)) => {
                front::splice(&mut conn, target, forwarded.as_bytes(), &buf[end..]).await
            }
            Err(e) => {
                if e.code == codes::UNAUTHORIZED {
                    tracing::info!("emulator.box.host_refused");
                }
                let body = serde_json::to_string(&e.envelope()).unwrap_or_default();
                front::refuse(&mut conn, e.status.as_u16(), &body).await
            }
        }
    }

    /// Whether `presented` opens the sandbox port's host URL.
    fn host_allowed(&self, id: &str, port: u16, presented: Option<&str>) -> Result<(), ApiError> {
        let map = self.lock();
        let route = map
            .get(id)
            .ok_or_else(ApiError::not_found)?
            .hosts
            .get(&port)
            .ok_or_else(ApiError::not_found)?;
        if route.public || presented.is_some_and(|p| same_secret(p, &route.token)) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                codes::UNAUTHORIZED,
                "this host URL needs its token",
            ))
        }
    }

    /// The machine address behind a running sandbox's port.
    async fn host_target(
        self: &Arc<Self>,
        id: &str,
        port: u16,
    ) -> Result<std::net::SocketAddr, ApiError> {
        let (machine, _) = self.usable(id).await?;
        port_addr(&self.machines, &machine, port)
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    codes::PORT_UNREACHABLE,
                    "nothing listens on that port",
                )
            })
    }

    /// One sweep of the clocks over every sandbox.
    pub async fn sweep(self: &Arc<Self>) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            self.refresh(&id).await;
        }
    }
}

type Emu = web::Data<Arc<BoatEmulator>>;

async fn guarded<F, Fut>(emu: &Emu, req: &HttpRequest, f: F) -> HttpResponse
where
    F: FnOnce(Arc<BoatEmulator>) -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    if let Err(e) = emu.auth(req) {
        return e.response();
    }
    f(emu.get_ref().clone())
        .await
        .unwrap_or_else(|e| e.response())
}

fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("invalid body: {e}")))
}

#[derive(Deserialize)]
struct FileQuery {
    #[serde(default)]
    path: String,
    #[serde(default)]
    encoding: String,
}

/// Mounts the API under `/api/v1`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::PayloadConfig::new(BODY_LIMIT))
        .route("/api/v1/sandboxes", web::post().to(|e: Emu, r: HttpRequest, b: web::Bytes| async move {
            let r2 = r.clone();
            guarded(&e, &r, |emu| async move { emu.create(&r2, json(&b)?).await }).await
        }))
        .route("/api/v1/sandboxes", web::get().to(|e: Emu, r: HttpRequest| async move {
            guarded(&e, &r, |emu| async move {
                emu.sweep().await;
                let list: Vec<Sandbox> = emu.lock().values().map(|sb| sb.dto.clone()).collect();
                Ok(HttpResponse::Ok().json(serde_json::json!({"ok": true, "sandboxes": list})))
            })
            .await
        }))
        .route("/api/v1/sandboxes/{id}", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            guarded(&e, &r, |emu| async move {
                emu.refresh(&p).await;
                Ok(ok("sandbox", emu.dto(&p)?))
            })
            .await
        }))
        .route("/api/v1/sandboxes/{id}", web::patch().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.patch(&p, json(&b)?).await }).await
        }))
        .route("/api/v1/sandboxes/{id}", web::delete().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            let r2 = r.clone();
            guarded(&e, &r, |emu| async move { emu.delete(&r2, &p).await }).await
        }))
        .route("/api/v1/sandboxes/{id}/stop", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            guarded(&e, &r, |emu| async move {
                emu.refresh(&p).await;
                emu.lifecycle(&p, Op::Stop).await
            })
            .await
        }))
        .route("/api/v1/sandboxes/{id}/resume", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move {
                let body: Resume = if b.is_empty() { Resume::default() } else { json(&b)? };
                emu.resume(&p, body).await
            })
            .await
        }))
        .route("/api/v1/sandboxes/{id}/commands", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.command(&p, json(&b)?).await }).await
        }))
        .route("/api/v1/sandboxes/{id}/files", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>, q: web::Query<FileQuery>| async move {
            guarded(&e, &r, |emu| async move { emu.read_file(&p, &q.path, &q.encoding).await }).await
        }))
        .route("/api/v1/sandboxes/{id}/files", web::put().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.write_file(&p, json(&b)?).await }).await
        }))
        .route("/api/v1/sandboxes/{id}/host", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.host(&p, json(&b)?).await }).await
        }));
}

/// Serves the emulator on `listener` and runs its clocks.
pub fn serve(
    listener: std::net::TcpListener,
    emulator: Arc<BoatEmulator>,
) -> std::io::Result<actix_web::dev::Server> {
    let sweeper = emulator.clone();
    actix_rt::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(500));
        loop {
            interval.tick().await;
            sweeper.sweep().await;
        }
    });
    let data = web::Data::new(emulator);
    Ok(actix_web::HttpServer::new(move || {
        actix_web::App::new()
            .app_data(data.clone())
            .configure(configure)
            .default_service(web::to(|| async {
                ApiError::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, "no such route").response()
            }))
    })
    .workers(1)
    .listen(listener)?
    .run())
}

#[cfg(test)]
mod tests {
    use super::*;
    use State::*;

    #[test]
    fn stop_archives_and_resume_needs_the_snapshot() {
        for usable in [Ready, Idle, Running] {
            assert_eq!(
                transition(usable, false, Op::Stop),
                Ok(Some((Archiving, Archived)))
            );
            assert_eq!(transition(usable, false, Op::Resume), Ok(None));
        }
        assert_eq!(transition(Archived, true, Op::Stop), Ok(None));
        assert_eq!(
            transition(Archived, true, Op::Resume),
            Ok(Some((Provisioning, Running)))
        );
        let expired = transition(Archived, false, Op::Resume).unwrap_err();
        assert_eq!(expired.status, StatusCode::GONE);
        assert_eq!(expired.code, codes::SNAPSHOT_EXPIRED);
        assert_eq!(
            transition(Cancelled, false, Op::Resume).unwrap_err().code,
            codes::INVALID_STATE
        );
        assert_eq!(
            transition(Provisioning, false, Op::Stop)
                .unwrap_err()
                .status,
            StatusCode::CONFLICT
        );
    }

    #[test]
    fn files_are_only_under_the_home_and_tmp() {
        let home = "/home/user";
        assert!(path_allowed("/home/user/a.txt", home));
        assert!(path_allowed("/tmp/x/y", home));
        for bad in [
            "/home/user",
            "/home/username/a",
            "/etc/passwd",
            "relative.txt",
            "/home/user/../../etc/passwd",
            "/tmp/./x",
            "/tmp",
            "/tmpfoo/x",
        ] {
            assert!(!path_allowed(bad, home), "{bad}");
        }
    }

    #[test]
    fn errors_come_in_the_vendor_envelope() {
        let resp = ApiError::not_found().response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let body = actix_web::body::to_bytes(resp.into_body());
        let body = futures_util::FutureExt::now_or_never(body)
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["ok"], false);
        assert_eq!(v["status"], 404);
        assert_eq!(v["code"], codes::NOT_FOUND);
        assert!(v["requestId"].as_str().unwrap().starts_with("req_"));
    }
    #[test]
    fn a_host_request_loses_its_token_before_the_machine_sees_it() {
        let (presented, out) = host_request(
            "GET /websockify?token=abc&_token=t0k HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .unwrap();
        assert_eq!(presented.as_deref(), Some("t0k"));
        assert_eq!(
            out,
            "GET /websockify?token=abc HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        );
        let (presented, out) =
            host_request("GET / HTTP/1.1\r\nConnection: keep-alive\r\n\r\n").unwrap();
        assert_eq!(presented, None);
        assert_eq!(out, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(host_request("GET http://elsewhere/ HTTP/1.1\r\n\r\n").is_none());
    }
}
