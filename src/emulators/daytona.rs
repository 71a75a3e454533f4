//! `daytona-emulator`: Daytona's sandbox API (under `/api`) and toolbox (under
//! `/toolbox/{id}`) on loopback, with real machines behind the sandboxes ([`Machines`]).
//! Faithful enough for Daytona's official Python SDK (`tests/daytona_sdk.py`).
//!
//! What it reproduces: `Authorization: Bearer` on every call (any non-empty key unless the
//! emulator is given one), the `{statusCode, message, error}` error body, every lifecycle
//! call answering the full sandbox, the states (`creating` → `started`, `stopping` →
//! `stopped`, `archiving` → `archived`, `starting`/`restoring` → `started`, `destroying` →
//! gone), archive only from `stopped`, the auto-stop interval (minutes without toolbox
//! activity) and the auto-archive interval (minutes stopped), `error` with `recoverable:
//! false` when a sandbox's machine disappeared behind the API's back, a toolbox that refuses
//! work unless the sandbox is started, `process/execute` answering stdout and stderr together
//! and 408 after killing a command at its deadline, multipart uploads and downloads, and
//! preview URLs whose token travels as `X-Daytona-Preview-Token`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use rakazo_actors::provider::ProviderError;
use serde::Deserialize;

use super::machines::Machines;
use super::{Entry, bearer_accepted, front, list, port_addr, read, running, same_secret};
use crate::desktop::shell_quote;
use crate::providers::daytona::multipart::{self, Part};
use crate::providers::daytona::wire::{
    BulkDownload, CreateSandbox, ErrorBody, ExecuteRequest, ExecuteResponse, FileInfo,
    PREVIEW_TOKEN_HEADER, PreviewUrl, SOURCE_API, SOURCE_DAEMON, Sandbox, SandboxPage, State,
};

/// How long `process/execute` lets a command run when the request names no timeout.
const DEFAULT_EXEC_SECONDS: u64 = 10;
/// Largest request body (uploads).
const BODY_LIMIT: usize = 80 << 20;
/// Most files in one bulk call.
const MAX_FILES: usize = 64;
/// The auto-archive interval of a new sandbox, in minutes (seven days).
const DEFAULT_AUTO_ARCHIVE: i64 = 7 * 24 * 60;
/// The auto-stop interval of a new sandbox, in minutes.
const DEFAULT_AUTO_STOP: i64 = 15;

/// How the emulator is set up.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The emulator's own base URL as clients reach it (`http://127.0.0.1:PORT`): the
    /// toolbox and preview URLs it hands out start with it.
    pub base_url: String,
    /// The only key accepted; `None` accepts any non-empty key.
    pub key: Option<String>,
    /// How long a "minute" of the auto-stop and auto-archive intervals lasts (tests shorten it).
    pub minute: Duration,
}

/// One sandbox as the emulator keeps it.
struct Sb {
    dto: Sandbox,
    machine: Option<String>,
    last_activity: Instant,
    stopped_since: Option<Instant>,
    /// Preview token and the loopback port of its listener, per sandbox port.
    previews: HashMap<u16, (String, u16)>,
    /// A lifecycle change is running in the background.
    busy: bool,
}

/// The emulator.
pub struct DaytonaEmulator {
    machines: Machines,
    settings: Settings,
    sandboxes: Mutex<HashMap<String, Sb>>,
}

/// An API error as Daytona answers it.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// The daemon's stable code, for toolbox errors.
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            code: None,
        }
    }

    /// A toolbox (daemon) error with its code.
    fn daemon(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            code: Some(code),
        }
    }

    fn not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("Sandbox with ID or name {id} not found"),
        )
    }

    /// The response: Daytona's error body.
    pub fn response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(ErrorBody {
            status_code: self.status.as_u16(),
            message: self.message.clone(),
            error: self.status.canonical_reason().map(str::to_string),
            code: self.code.map(str::to_string),
            source: Some(
                if self.code.is_some() {
                    SOURCE_DAEMON
                } else {
                    SOURCE_API
                }
                .into(),
            ),
        })
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::NotFound(p) => Self::daemon(
                StatusCode::NOT_FOUND,
                "FILE_NOT_FOUND",
                format!("file not found: {p}"),
            ),
            ProviderError::PathRejected(p) => {
                Self::daemon(StatusCode::BAD_REQUEST, "INVALID_FILE_PATH", p)
            }
            ProviderError::TooLarge(p) => Self::new(StatusCode::PAYLOAD_TOO_LARGE, p),
            ProviderError::MachineGone => {
                Self::new(StatusCode::CONFLICT, "the sandbox is not running")
            }
            other => Self::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

type Answer = Result<HttpResponse, ApiError>;

/// The lifecycle operations the API takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `POST /sandbox/{id}/start`.
    Start,
    /// `POST /sandbox/{id}/stop`.
    Stop,
    /// `POST /sandbox/{id}/archive`.
    Archive,
    /// `DELETE /sandbox/{id}`.
    Delete,
}

/// What `op` does from `state`: the transitional state it enters and the final one, `None`
/// when the sandbox is already where the call leads (answered as it is), or the refusal.
pub fn transition(state: State, op: Op) -> Result<Option<(State, State)>, (StatusCode, String)> {
    use State::*;
    let refuse = |what: &str| {
        Err((
            StatusCode::BAD_REQUEST,
            format!("Sandbox is {}: cannot {what}", state.as_str()),
        ))
    };
    match (op, state) {
        (Op::Delete, Destroyed | Destroying) => Ok(None),
        (Op::Delete, _) if state.in_transition() => Err((
            StatusCode::CONFLICT,
            format!("Sandbox is {}: wait for it to settle", state.as_str()),
        )),
        (Op::Delete, _) => Ok(Some((Destroying, Destroyed))),
        (Op::Start, Started) => Ok(None),
        (Op::Start, Stopped) => Ok(Some((Starting, Started))),
        (Op::Start, Archived) => Ok(Some((Restoring, Started))),
        (Op::Start, _) => refuse("start"),
        (Op::Stop, Stopped) => Ok(None),
        (Op::Stop, Started) => Ok(Some((Stopping, Stopped))),
        (Op::Stop, _) => refuse("stop"),
        (Op::Archive, Archived) => Ok(None),
        (Op::Archive, Stopped) => Ok(Some((Archiving, Archived))),
        (Op::Archive, _) => Err((
            StatusCode::BAD_REQUEST,
            "Sandbox must be stopped before it can be archived".into(),
        )),
    }
}

fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(now.as_secs() as i64)
}

/// Seconds since the epoch as RFC 3339 (UTC).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl DaytonaEmulator {
    /// An emulator over `machines`.
    pub fn new(machines: Machines, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            machines,
            settings,
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sb>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn auth(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if bearer_accepted(req, self.settings.key.as_deref()) {
            Ok(())
        } else {
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized"))
        }
    }

    /// The id of the sandbox named `id_or_name`.
    fn resolve(&self, id_or_name: &str) -> Result<String, ApiError> {
        let map = self.lock();
        if map.contains_key(id_or_name) {
            return Ok(id_or_name.to_string());
        }
        map.iter()
            .find(|(_, sb)| sb.dto.name == id_or_name)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| ApiError::not_found(id_or_name))
    }

    fn dto(&self, id: &str) -> Result<Sandbox, ApiError> {
        self.lock()
            .get(id)
            .map(|sb| sb.dto.clone())
            .ok_or_else(|| ApiError::not_found(id))
    }

    fn set_state(&self, id: &str, state: State, error: Option<String>) {
        if let Some(sb) = self.lock().get_mut(id) {
            sb.dto.state = Some(state.as_str().into());
            sb.dto.updated_at = Some(now_rfc3339());
            if state == State::Error {
                sb.dto.error_reason = error;
                sb.dto.recoverable = Some(false);
            } else {
                sb.dto.error_reason = None;
                sb.dto.recoverable = None;
            }
            if state == State::Started {
                sb.last_activity = Instant::now();
                sb.stopped_since = None;
            }
            if state == State::Stopped {
                sb.stopped_since = Some(Instant::now());
            }
        }
    }

    /// A started sandbox whose machine disappeared is in `error` for good; one whose machine
    /// stopped behind the API's back is `stopped`.
    async fn refresh(&self, id: &str) {
        let (state, machine, busy) = match self.lock().get(id) {
            Some(sb) => (sb.dto.state(), sb.machine.clone(), sb.busy),
            None => return,
        };
        if busy || !matches!(state, State::Started | State::Stopped | State::Archived) {
            return;
        }
        let Some(machine) = machine else { return };
        match running(&self.machines, &machine).await {
            Ok(None) => {
                tracing::info!("emulator.daytona.machine_lost");
                self.set_state(
                    id,
                    State::Error,
                    Some("the sandbox's machine is gone".into()),
                );
            }
            Ok(Some(false)) if state == State::Started => self.set_state(id, State::Stopped, None),
            _ => {}
        }
    }

    async fn create(self: &Arc<Self>, body: CreateSandbox) -> Answer {
        let id = new_id();
        if let Some(name) = &body.name
            && self.lock().values().any(|sb| &sb.dto.name == name)
        {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Sandbox with name {name} already exists"),
            ));
        }
        let now = now_rfc3339();
        let dto = Sandbox {
            id: id.clone(),
            organization_id: "emulator".into(),
            name: body.name.clone().unwrap_or_else(|| id.clone()),
            snapshot: body
                .snapshot
                .clone()
                .or_else(|| Some("rakazo-computer".into())),
            user: body.user.clone().unwrap_or_else(|| "rakazo".into()),
            env: body.env.clone(),
            labels: body.labels.clone(),
            public: body.public.unwrap_or(false),
            network_block_all: false,
            kvm: false,
            target: body.target.clone().unwrap_or_else(|| "us".into()),
            cpu: 2,
            gpu: 0,
            memory: 4,
            disk: 10,
            state: Some(State::Creating.as_str().into()),
            desired_state: Some("started".into()),
            error_reason: None,
            recoverable: None,
            auto_stop_interval: Some(body.auto_stop_interval.unwrap_or(DEFAULT_AUTO_STOP)),
            auto_archive_interval: Some(body.auto_archive_interval.unwrap_or(DEFAULT_AUTO_ARCHIVE)),
            auto_delete_interval: Some(body.auto_delete_interval.unwrap_or(-1)),
            created_at: Some(now.clone()),
            updated_at: Some(now),
            daemon_version: Some("rakazo-emulator".into()),
            toolbox_proxy_url: format!("{}/toolbox", self.settings.base_url),
        };
        self.lock().insert(
            id.clone(),
            Sb {
                dto: dto.clone(),
                machine: None,
                last_activity: Instant::now(),
                stopped_since: None,
                previews: HashMap::new(),
                busy: true,
            },
        );
        let this = self.clone();
        let sid = id.clone();
        actix_rt::spawn(async move {
            let made = this
                .machines
                .create("daytona", &sid)
                .await
                .map(|info| info.id);
            let (state, error) = match made {
                Ok(machine) => {
                    if let Some(sb) = this.lock().get_mut(&sid) {
                        sb.machine = Some(machine);
                    }
                    (State::Started, None)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "emulator.daytona.create_failed");
                    (
                        State::Error,
                        Some(format!("the machine could not be created: {e}")),
                    )
                }
            };
            this.set_state(&sid, state, error);
            if let Some(sb) = this.lock().get_mut(&sid) {
                sb.busy = false;
            }
        });
        Ok(HttpResponse::Ok().json(dto))
    }

    /// Runs a lifecycle operation: answers the sandbox in its transitional state at once
    /// and finishes in the background.
    async fn lifecycle(self: &Arc<Self>, id: &str, op: Op) -> Answer {
        self.refresh(id).await;
        let (from, to, machine) = {
            let mut map = self.lock();
            let sb = map.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
            match transition(sb.dto.state(), op).map_err(|(s, m)| ApiError::new(s, m))? {
                None => return Ok(HttpResponse::Ok().json(sb.dto.clone())),
                Some(_) if sb.busy => {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        format!(
                            "Sandbox is {}: wait for it to settle",
                            sb.dto.state().as_str()
                        ),
                    ));
                }
                Some((via, to)) => {
                    sb.busy = true;
                    sb.dto.state = Some(via.as_str().into());
                    (sb.dto.clone(), to, sb.machine.clone())
                }
            }
        };
        let this = self.clone();
        let sid = id.to_string();
        actix_rt::spawn(async move {
            let result = match (op, &machine) {
                (_, None) if op != Op::Delete => Err(ProviderError::MachineGone),
                (Op::Start, Some(m)) => this.machines.start(m).await.map(|_| ()),
                (Op::Stop, Some(m)) => this.machines.stop(m).await,
                (Op::Archive, _) => Ok(()),
                (Op::Delete, Some(m)) => this.machines.remove(m).await,
                (_, None) => Ok(()),
            };
            match result {
                Ok(()) if op == Op::Delete => {
                    this.lock().remove(&sid);
                }
                Ok(()) => this.set_state(&sid, to, None),
                Err(e) => {
                    tracing::warn!(error = %e, "emulator.daytona.lifecycle_failed");
                    this.set_state(&sid, State::Error, Some(format!("{op:?} failed")));
                }
            }
            if let Some(sb) = this.lock().get_mut(&sid) {
                sb.busy = false;
            }
        });
        Ok(HttpResponse::Ok().json(from))
    }

    /// One sweep of the timing rules: started sandboxes idle past their auto-stop interval
    /// stop; stopped ones past their auto-archive interval are archived.
    pub async fn sweep(self: &Arc<Self>) {
        let minute = self.settings.minute;
        let due: Vec<(String, Op)> = self
            .lock()
            .iter()
            .filter(|(_, sb)| !sb.busy)
            .filter_map(|(id, sb)| {
                let after = |m: Option<i64>| {
                    m.filter(|m| *m > 0)
                        .map(|m| minute.saturating_mul(m as u32))
                };
                match sb.dto.state() {
                    State::Started => after(sb.dto.auto_stop_interval)
                        .filter(|d| sb.last_activity.elapsed() >= *d)
                        .map(|_| (id.clone(), Op::Stop)),
                    State::Stopped => after(sb.dto.auto_archive_interval)
                        .zip(sb.stopped_since)
                        .filter(|(d, since)| since.elapsed() >= *d)
                        .map(|_| (id.clone(), Op::Archive)),
                    _ => None,
                }
            })
            .collect();
        for (id, op) in due {
            tracing::info!(op = ?op, "emulator.daytona.auto");
            let _ = self.lifecycle(&id, op).await;
        }
    }

    /// The started sandbox's machine, noting toolbox activity; the toolbox refuses work on a
    /// sandbox that is not started.
    async fn started(&self, id: &str) -> Result<String, ApiError> {
        self.refresh(id).await;
        let mut map = self.lock();
        let sb = map.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        match (&sb.machine, sb.dto.state()) {
            (Some(m), State::Started) if !sb.busy => {
                sb.last_activity = Instant::now();
                Ok(m.clone())
            }
            (_, state) => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Sandbox is {}: start it first", state.as_str()),
            )),
        }
    }

    /// A path of the toolbox: absolute as given, relative to the user's home otherwise.
    fn path(&self, p: &str) -> Result<String, ApiError> {
        if p.is_empty() || p.contains('\0') {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "path is required"));
        }
        Ok(if p.starts_with('/') {
            p.to_string()
        } else {
            format!("{}/{p}", self.machines.home().trim_end_matches('/'))
        })
    }

    async fn execute(&self, id: &str, body: ExecuteRequest) -> Answer {
        let machine = self.started(id).await?;
        let secs = body
            .timeout
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_EXEC_SECONDS);
        let cwd = match &body.cwd {
            Some(c) => self.path(c)?,
            None => self.machines.home(),
        };
        let env: Vec<(String, String)> = body.envs.unwrap_or_default().into_iter().collect();
        // The daemon runs the command with the user's shell, stdout and stderr together.
        let script = format!("exec 2>&1\nexec sh -c {}", shell_quote(&body.command));
        let out = self
            .machines
            .exec(&machine, &script, &cwd, &env, Duration::from_secs(secs))
            .await?;
        if out.timed_out {
            return Err(ApiError::daemon(
                StatusCode::REQUEST_TIMEOUT,
                "PROCESS_EXECUTION_TIMEOUT",
                "command execution timeout",
            ));
        }
        Ok(HttpResponse::Ok().json(ExecuteResponse {
            exit_code: Some(out.exit_code),
            result: out.stdout,
        }))
    }

    async fn upload(&self, id: &str, req: &HttpRequest, body: web::Bytes) -> Answer {
        let machine = self.started(id).await?;
        let boundary = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(multipart::boundary_of)
            .ok_or_else(|| {
                ApiError::new(StatusCode::BAD_REQUEST, "expected multipart/form-data")
            })?;
        let parts = multipart::decode(&body, &boundary, MAX_FILES * 2)
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "malformed multipart body"))?;
        let mut paths: BTreeMap<String, String> = BTreeMap::new();
        let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for p in parts {
            if let Some(i) = p.name.strip_suffix(".path") {
                paths.insert(i.to_string(), String::from_utf8_lossy(&p.data).into_owned());
            } else if let Some(i) = p.name.strip_suffix(".file") {
                files.insert(i.to_string(), p.data);
            }
        }
        if files.is_empty() {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "no files"));
        }
        for (i, data) in files {
            let dest = paths
                .get(&i)
                .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, format!("{i}: no path")))?;
            let dest = self.path(dest)?;
            self.machines.write_file(&machine, &dest, &data).await?;
        }
        Ok(HttpResponse::Ok().finish())
    }

    async fn download(&self, id: &str, body: BulkDownload) -> Answer {
        let machine = self.started(id).await?;
        if body.paths.len() > MAX_FILES {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "too many paths"));
        }
        let mut parts = Vec::new();
        for requested in &body.paths {
            let got = match self.path(requested) {
                Ok(p) => read(&self.machines, &machine, &p)
                    .await
                    .map_err(ApiError::from),
                Err(e) => Err(e),
            };
            match got {
                Ok(data) => parts.push(Part::file("file", requested, data)),
                Err(e) => parts.push(Part {
                    name: "error".into(),
                    filename: Some(requested.clone()),
                    content_type: Some("application/json".into()),
                    data: serde_json::to_vec(&serde_json::json!({
                        "message": e.message,
                        "statusCode": e.status.as_u16(),
                        "code": e.code.unwrap_or("FILE_READ_FAILED"),
                    }))
                    .unwrap_or_default(),
                }),
            }
        }
        let b = multipart::boundary();
        Ok(HttpResponse::Ok()
            .content_type(multipart::content_type(&b))
            .body(multipart::encode(&b, &parts)))
    }

    fn file_info(dir: &str, e: &Entry) -> FileInfo {
        let perms = e.mode & 0o777;
        FileInfo {
            name: e.name.clone(),
            is_dir: e.dir,
            size: e.size,
            mode: mode_string(e.mode),
            permissions: format!("{perms:04o}"),
            owner: e.owner.clone(),
            group: e.group.clone(),
            mod_time: rfc3339(e.mtime),
            modified_at: Some(rfc3339(e.mtime)),
            path: Some(format!("{}/{}", dir.trim_end_matches('/'), e.name)),
        }
    }

    async fn list(&self, id: &str, path: &str) -> Answer {
        let machine = self.started(id).await?;
        let dir = self.path(if path.is_empty() { "." } else { path })?;
        let entries = list(&self.machines, &machine, &dir).await?;
        let infos: Vec<FileInfo> = entries.iter().map(|e| Self::file_info(&dir, e)).collect();
        Ok(HttpResponse::Ok().json(infos))
    }

    async fn info(&self, id: &str, path: &str) -> Answer {
        let machine = self.started(id).await?;
        let full = self.path(path)?;
        let (dir, name) = full.rsplit_once('/').unwrap_or(("/", full.as_str()));
        let dir = if dir.is_empty() { "/" } else { dir };
        let entries = list(&self.machines, &machine, dir).await?;
        let e = entries.iter().find(|e| e.name == name).ok_or_else(|| {
            ApiError::daemon(
                StatusCode::NOT_FOUND,
                "FILE_NOT_FOUND",
                format!("file not found: {path}"),
            )
        })?;
        Ok(HttpResponse::Ok().json(Self::file_info(dir, e)))
    }

    async fn simple(&self, id: &str, script: String) -> Answer {
        let machine = self.started(id).await?;
        let out = self
            .machines
            .exec(&machine, &script, "/", &[], Duration::from_secs(30))
            .await?;
        match out.exit_code {
            0 => Ok(HttpResponse::Ok().finish()),
            3 => Err(ApiError::daemon(
                StatusCode::NOT_FOUND,
                "FILE_NOT_FOUND",
                "file not found",
            )),
            _ => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                out.stderr.trim().chars().take(200).collect::<String>(),
            )),
        }
    }

    async fn preview(self: &Arc<Self>, id: &str, port: u16) -> Answer {
        self.refresh(id).await;
        let known = {
            let map = self.lock();
            let sb = map.get(id).ok_or_else(|| ApiError::not_found(id))?;
            sb.previews.get(&port).cloned()
        };
        let (token, local) = match known {
            Some(p) => p,
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                    .port();
                let token = token();
                let this = self.clone();
                let (sid, tok) = (id.to_string(), token.clone());
                actix_rt::spawn(async move {
                    while let Ok((conn, _)) = listener.accept().await {
                        let (emu, name, t) = (this.clone(), sid.clone(), tok.clone());
                        actix_rt::spawn(async move {
                            if let Err(e) = emu.relay_preview(conn, &name, port, &t).await {
                                tracing::debug!(error = %e.kind(), "emulator.daytona.preview_closed");
                            }
                        });
                        if !this.lock().contains_key(&sid) {
                            break;
                        }
                    }
                });
                let mut map = self.lock();
                let sb = map.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
                sb.previews.entry(port).or_insert((token, local)).clone()
            }
        };
        Ok(HttpResponse::Ok().json(PreviewUrl {
            sandbox_id: id.to_string(),
            url: format!("http://127.0.0.1:{local}"),
            token,
        }))
    }

    /// One connection to a preview URL: its first request must carry the port's token in
    /// [`PREVIEW_TOKEN_HEADER`]; then it is relayed to the machine's port as it is.
    async fn relay_preview(
        &self,
        mut conn: tokio::net::TcpStream,
        id: &str,
        port: u16,
        token: &str,
    ) -> std::io::Result<()> {
        let Some((buf, end)) = front::read_head(&mut conn).await? else {
            return Ok(());
        };
        let head = String::from_utf8_lossy(&buf[..end]);
        let presented = front::header(&head, PREVIEW_TOKEN_HEADER).unwrap_or_default();
        let target = if same_secret(&presented, token) {
            self.preview_target(id, port).await
        } else {
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized"))
        };
        match target {
            Ok(target) => front::splice(&mut conn, target, &buf, &[]).await,
            Err(e) => {
                let body =
                    serde_json::json!({"statusCode": e.status.as_u16(), "message": e.message})
                        .to_string();
                front::refuse(&mut conn, e.status.as_u16(), &body).await
            }
        }
    }

    /// The machine address behind a sandbox's port.
    async fn preview_target(&self, id: &str, port: u16) -> Result<std::net::SocketAddr, ApiError> {
        let machine = self.started(id).await?;
        port_addr(&self.machines, &machine, port)
            .await?
            .ok_or_else(|| ApiError::new(StatusCode::BAD_GATEWAY, "nothing listens on that port"))
    }
}

/// `st_mode` as `ls -l` shows it (`-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`).
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o010000 => 'p',
        0o140000 => 's',
        0o020000 => 'c',
        0o060000 => 'b',
        _ => '-',
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

type Emu = web::Data<Arc<DaytonaEmulator>>;

fn answer(a: Answer) -> HttpResponse {
    a.unwrap_or_else(|e| e.response())
}

#[derive(Deserialize)]
struct PathQuery {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: Option<bool>,
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    labels: Option<String>,
}

async fn guarded<F, Fut>(emu: &Emu, req: &HttpRequest, f: F) -> HttpResponse
where
    F: FnOnce(Arc<DaytonaEmulator>) -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    if let Err(e) = emu.auth(req) {
        return e.response();
    }
    answer(f(emu.get_ref().clone()).await)
}

fn json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

/// Mounts the API under `/api` and the toolbox under `/toolbox`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::PayloadConfig::new(BODY_LIMIT))
        .route("/api/sandbox", web::post().to(|e: Emu, r: HttpRequest, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.create(json(&b)?).await }).await
        }))
        .route("/api/sandbox", web::get().to(|e: Emu, r: HttpRequest, q: web::Query<ListQuery>| async move {
            guarded(&e, &r, |emu| async move {
                let want: BTreeMap<String, String> = match &q.labels {
                    Some(l) if !l.is_empty() => json(l.as_bytes())?,
                    _ => BTreeMap::new(),
                };
                let ids: Vec<String> = emu.lock().keys().cloned().collect();
                for id in &ids {
                    emu.refresh(id).await;
                }
                let items: Vec<Sandbox> = emu
                    .lock()
                    .values()
                    .map(|sb| sb.dto.clone())
                    .filter(|d| want.iter().all(|(k, v)| d.labels.get(k) == Some(v)))
                    .collect();
                Ok(HttpResponse::Ok().json(SandboxPage { items, next_cursor: None }))
            })
            .await
        }))
        .route("/api/sandbox/{id}", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            guarded(&e, &r, |emu| async move {
                let id = emu.resolve(&p)?;
                emu.refresh(&id).await;
                Ok(HttpResponse::Ok().json(emu.dto(&id)?))
            })
            .await
        }))
        .route("/api/sandbox/{id}", web::delete().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            guarded(&e, &r, |emu| async move {
                let id = emu.resolve(&p)?;
                emu.lifecycle(&id, Op::Delete).await
            })
            .await
        }))
        .route("/api/sandbox/{id}/{op}", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<(String, String)>| async move {
            guarded(&e, &r, |emu| async move {
                let (id, op) = p.into_inner();
                let id = emu.resolve(&id)?;
                let op = match op.as_str() {
                    "start" => Op::Start,
                    "stop" => Op::Stop,
                    "archive" => Op::Archive,
                    _ => return Err(ApiError::new(StatusCode::NOT_FOUND, "Cannot POST")),
                };
                emu.lifecycle(&id, op).await
            })
            .await
        }))
        .route("/api/sandbox/{id}/autostop/{minutes}", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<(String, i64)>| async move {
            guarded(&e, &r, |emu| async move {
                let (id, minutes) = p.into_inner();
                let id = emu.resolve(&id)?;
                if minutes < 0 {
                    return Err(ApiError::new(StatusCode::BAD_REQUEST, "autoStopInterval must be 0 or more"));
                }
                let mut map = emu.lock();
                let sb = map.get_mut(&id).ok_or_else(|| ApiError::not_found(&id))?;
                sb.dto.auto_stop_interval = Some(minutes);
                sb.last_activity = Instant::now();
                Ok(HttpResponse::Ok().json(sb.dto.clone()))
            })
            .await
        }))
        .route("/api/sandbox/{id}/autoarchive/{minutes}", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<(String, i64)>| async move {
            guarded(&e, &r, |emu| async move {
                let (id, minutes) = p.into_inner();
                let id = emu.resolve(&id)?;
                let mut map = emu.lock();
                let sb = map.get_mut(&id).ok_or_else(|| ApiError::not_found(&id))?;
                sb.dto.auto_archive_interval = Some(minutes);
                Ok(HttpResponse::Ok().json(sb.dto.clone()))
            })
            .await
        }))
        .route("/api/sandbox/{id}/ports/{port}/preview-url", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<(String, u16)>| async move {
            guarded(&e, &r, |emu| async move {
                let (id, port) = p.into_inner();
                let id = emu.resolve(&id)?;
                emu.preview(&id, port).await
            })
            .await
        }))
        .route("/api/sandbox/{id}/toolbox-proxy-url", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>| async move {
            guarded(&e, &r, |emu| async move {
                let id = emu.resolve(&p)?;
                let url = emu.dto(&id)?.toolbox_proxy_url;
                Ok(HttpResponse::Ok().json(serde_json::json!({ "url": url })))
            })
            .await
        }))
        .route("/toolbox/{id}/process/execute", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.execute(&p, json(&b)?).await }).await
        }))
        .route("/toolbox/{id}/files/bulk-upload", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            let r2 = r.clone();
            guarded(&e, &r, |emu| async move { emu.upload(&p, &r2, b).await }).await
        }))
        .route("/toolbox/{id}/files/bulk-download", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, b: web::Bytes| async move {
            guarded(&e, &r, |emu| async move { emu.download(&p, json(&b)?).await }).await
        }))
        .route("/toolbox/{id}/files", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>, q: web::Query<PathQuery>| async move {
            guarded(&e, &r, |emu| async move { emu.list(&p, &q.path).await }).await
        }))
        .route("/toolbox/{id}/files/info", web::get().to(|e: Emu, r: HttpRequest, p: web::Path<String>, q: web::Query<PathQuery>| async move {
            guarded(&e, &r, |emu| async move { emu.info(&p, &q.path).await }).await
        }))
        .route("/toolbox/{id}/files/folder", web::post().to(|e: Emu, r: HttpRequest, p: web::Path<String>, q: web::Query<PathQuery>| async move {
            guarded(&e, &r, |emu| async move {
                let path = emu.path(&q.path)?;
                emu.simple(&p, format!("mkdir -p -- {}", shell_quote(&path))).await
            })
            .await
        }))
        .route("/toolbox/{id}/files", web::delete().to(|e: Emu, r: HttpRequest, p: web::Path<String>, q: web::Query<PathQuery>| async move {
            guarded(&e, &r, |emu| async move {
                let path = shell_quote(&emu.path(&q.path)?);
                let rm = if q.recursive == Some(true) { "rm -rf" } else { "rm -f" };
                emu.simple(&p, format!("[ -e {path} ] || [ -L {path} ] || exit 3\n[ -d {path} ] && [ ! -L {path} ] && {{ {rm} -- {path} 2>/dev/null || rmdir -- {path}; exit $?; }}\nrm -f -- {path}")).await
            })
            .await
        }));
}

/// Serves the emulator on `listener` and runs its timing rules; the server runs until
/// stopped.
pub fn serve(
    listener: std::net::TcpListener,
    emulator: Arc<DaytonaEmulator>,
) -> std::io::Result<actix_web::dev::Server> {
    let sweeper = emulator.clone();
    let tick =
        (emulator.settings.minute / 4).clamp(Duration::from_millis(100), Duration::from_secs(15));
    actix_rt::spawn(async move {
        let mut interval = tokio::time::interval(tick);
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
                ApiError::new(StatusCode::NOT_FOUND, "Not Found").response()
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
    fn the_lifecycle_follows_the_vendor_states() {
        assert_eq!(transition(Started, Op::Stop), Ok(Some((Stopping, Stopped))));
        assert_eq!(
            transition(Stopped, Op::Start),
            Ok(Some((Starting, Started)))
        );
        assert_eq!(
            transition(Archived, Op::Start),
            Ok(Some((Restoring, Started)))
        );
        assert_eq!(
            transition(Stopped, Op::Archive),
            Ok(Some((Archiving, Archived)))
        );
        assert_eq!(transition(Started, Op::Start), Ok(None));
        assert_eq!(transition(Stopped, Op::Stop), Ok(None));
        assert_eq!(
            transition(Started, Op::Delete),
            Ok(Some((Destroying, Destroyed)))
        );
        assert_eq!(
            transition(Error, Op::Delete),
            Ok(Some((Destroying, Destroyed)))
        );
    }

    #[test]
    fn archive_needs_a_stopped_sandbox_and_errors_do_not_start() {
        let (status, msg) = transition(Started, Op::Archive).unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(msg.contains("stopped"));
        assert!(transition(Error, Op::Start).is_err());
        assert!(transition(Creating, Op::Stop).is_err());
        assert_eq!(
            transition(Starting, Op::Delete).unwrap_err().0,
            StatusCode::CONFLICT
        );
    }

    #[test]
    fn errors_carry_the_vendor_body() {
        let resp = ApiError::not_found("abc").response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let body = actix_web::body::to_bytes(resp.into_body());
        let body = futures_util::FutureExt::now_or_never(body)
            .unwrap()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["statusCode"], 404);
        assert_eq!(v["error"], "Not Found");
        assert!(v["message"].as_str().unwrap().contains("abc"));
    }

    #[test]
    fn times_and_modes_print_as_the_daemon_prints_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_556_800), "2025-12-01T02:40:00Z");
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
    }
}
