//! envd, E2B's in-sandbox daemon, as the e2b-emulator serves it: `GET /health`, `GET` and
//! `POST /files`, and Connect RPC (JSON codec) `process.Process/{Start, Connect, List,
//! SendSignal, SendInput, CloseStdin}` and `filesystem.Filesystem/{Stat, ListDir, MakeDir, Remove, Move}`.
//!
//! `Start` and `Connect` are server-streaming: the response is `application/connect+json`
//! made of envelopes (flag byte, 4-byte big-endian length, JSON): `start` first, then `data`
//! and `keepalive` events, the `end` event, and the end-of-stream envelope (`{}`, or
//! `{"error": ...}` when the `Connect-Timeout-Ms` deadline killed the process). A client that
//! disconnects leaves the process running (E2B's background commands).

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{ENVD_PORT, Emulator, Process, Sandbox, State};
use crate::desktop::shell_quote;
use crate::emulators::machines::{Progress, Spawned, StdinWrite};

const FS_HELPER: &str = include_str!("fs_helper.py");
/// Largest file `/files` serves.
const MAX_FILE: u64 = 256 << 20;
/// How long the first call of a command waits for it to end.
const FIRST_WAIT: Duration = Duration::from_secs(2);
/// How long each following poll waits for output.
const POLL_WAIT: Duration = Duration::from_secs(1);

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/files", web::get().to(read_file))
        .route("/files", web::post().to(write_file))
        .route("/process.Process/Start", web::post().to(start))
        .route("/process.Process/Connect", web::post().to(connect))
        .route("/process.Process/List", web::post().to(list))
        .route("/process.Process/SendSignal", web::post().to(send_signal))
        .route("/process.Process/SendInput", web::post().to(send_input))
        .route("/process.Process/CloseStdin", web::post().to(close_stdin))
        .route("/process.Process/{method}", web::post().to(unimplemented))
        .route(
            "/filesystem.Filesystem/{method}",
            web::post().to(filesystem),
        );
}

/// A Connect error.
fn connect_error(code: &str, message: &str) -> HttpResponse {
    let status = match code {
        "not_found" => StatusCode::NOT_FOUND,
        "invalid_argument" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "permission_denied" => StatusCode::FORBIDDEN,
        "already_exists" => StatusCode::CONFLICT,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    HttpResponse::build(status).json(json!({"code": code, "message": message}))
}

/// A plain envd HTTP error.
fn http_error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({"code": status.as_u16(), "message": message}))
}

/// The sandbox a call is for (by `E2b-Sandbox-Id`, else by the `49983-<id>.` host), once its
/// access token matches; otherwise the answer to send.
fn sandbox(em: &Emulator, req: &HttpRequest) -> Result<Sandbox, Box<HttpResponse>> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let id = header("e2b-sandbox-id").or_else(|| {
        let host = header("host")?;
        let rest = host.strip_prefix(&format!("{ENVD_PORT}-"))?;
        Some(rest.split('.').next()?.to_string())
    });
    let Some(id) = id else {
        return Err(Box::new(http_error(
            StatusCode::BAD_GATEWAY,
            "sandbox not found",
        )));
    };
    let sandbox = match em.get(&id) {
        Some(s) if s.state == State::Running => s,
        _ => {
            return Err(Box::new(http_error(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "The sandbox {} was not found",
                    id.chars().take(64).collect::<String>()
                ),
            )));
        }
    };
    use subtle::ConstantTimeEq;
    let given = header("x-access-token").unwrap_or_default();
    if !bool::from(given.as_bytes().ct_eq(sandbox.access_token.as_bytes())) {
        return Err(Box::new(http_error(
            StatusCode::UNAUTHORIZED,
            "invalid access token",
        )));
    }
    Ok(sandbox)
}

/// A path as envd resolves it: relative to the user's home.
fn resolve(em: &Emulator, path: &str) -> String {
    let home = em.machines.home();
    if path.is_empty() || path == "~" {
        home
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    }
}

async fn health(em: web::Data<Emulator>, req: HttpRequest) -> HttpResponse {
    match sandbox(&em, &req) {
        Ok(_) => HttpResponse::NoContent().finish(),
        Err(r) => *r,
    }
}

fn query(req: &HttpRequest, key: &str) -> Option<String> {
    web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get(key).cloned())
}

async fn read_file(em: web::Data<Emulator>, req: HttpRequest) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Some(path) = query(&req, "path") else {
        return http_error(StatusCode::BAD_REQUEST, "path is required");
    };
    let path = resolve(&em, &path);
    match em.machines.read_file(&s.container, &path, MAX_FILE).await {
        Ok(Some(data)) => HttpResponse::Ok()
            .content_type("application/octet-stream")
            .body(data),
        Ok(None) => http_error(
            StatusCode::NOT_FOUND,
            &format!("path '{path}' does not exist"),
        ),
        Err(rakazo_actors::provider::ProviderError::PathRejected(m)) => {
            http_error(StatusCode::FORBIDDEN, &m)
        }
        Err(e) => http_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// The parts of a `multipart/form-data` body: (raw filename, bytes).
fn multipart_parts(content_type: &str, body: &[u8]) -> Option<Vec<(Option<String>, Vec<u8>)>> {
    let boundary = content_type
        .split(';')
        .find_map(|p| p.trim().strip_prefix("boundary="))?
        .trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
    let find = |hay: &[u8], from: usize| {
        hay.get(from..)?
            .windows(delim.len())
            .position(|w| w == delim.as_slice())
            .map(|i| i + from)
    };
    let mut parts = Vec::new();
    let mut at = find(body, 0)? + delim.len();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            break;
        }
        at += 2; // CRLF after the delimiter
        let next = find(body, at)?;
        let part = &body[at..next];
        let split = part.windows(4).position(|w| w == b"\r\n\r\n")?;
        let headers = String::from_utf8_lossy(&part[..split]);
        let mut data = &part[split + 4..];
        if data.ends_with(b"\r\n") {
            data = &data[..data.len() - 2];
        }
        let filename = headers.lines().find_map(|l| {
            let lower = l.to_ascii_lowercase();
            if !lower.starts_with("content-disposition") {
                return None;
            }
            let i = l.find("filename=\"")? + 10;
            let rest = &l[i..];
            Some(rest[..rest.rfind('"')?].to_string())
        });
        parts.push((filename, data.to_vec()));
        at = next + delim.len();
    }
    Some(parts)
}

async fn write_file(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let path = query(&req, "path");
    let files: Vec<(String, Vec<u8>)> = if content_type.starts_with("multipart/form-data") {
        let Some(parts) = multipart_parts(&content_type, &body) else {
            return http_error(StatusCode::BAD_REQUEST, "unreadable multipart body");
        };
        let mut files = Vec::new();
        for (filename, data) in parts {
            match (&path, filename) {
                (Some(p), _) => files.push((p.clone(), data)),
                (None, Some(f)) if !f.is_empty() => files.push((f, data)),
                _ => return http_error(StatusCode::BAD_REQUEST, "a part names no file"),
            }
        }
        files
    } else {
        let Some(p) = path else {
            return http_error(StatusCode::BAD_REQUEST, "path is required");
        };
        if req
            .headers()
            .get("content-encoding")
            .is_some_and(|v| v.as_bytes() != b"identity")
        {
            return http_error(StatusCode::BAD_REQUEST, "content encoding not supported");
        }
        vec![(p, body.to_vec())]
    };
    if files.is_empty() {
        return http_error(StatusCode::BAD_REQUEST, "no file");
    }
    let mut written = Vec::new();
    for (target, data) in files {
        let target = resolve(&em, &target);
        if let Err(e) = em.machines.write_file(&s.container, &target, &data).await {
            return http_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
        }
        let name = target.rsplit('/').next().unwrap_or_default().to_string();
        written.push(json!({"name": name, "type": "file", "path": target}));
    }
    HttpResponse::Ok().json(written)
}

/// The message of a streaming request's first envelope.
fn envelope_message(body: &[u8]) -> Option<Value> {
    let flags = *body.first()?;
    if flags & 0x01 != 0 {
        return None;
    }
    let len = u32::from_be_bytes(body.get(1..5)?.try_into().ok()?) as usize;
    serde_json::from_slice(body.get(5..5 + len)?).ok()
}

fn envelope(flags: u8, message: &Value) -> web::Bytes {
    let json = serde_json::to_vec(message).unwrap_or_default();
    let mut out = Vec::with_capacity(json.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    web::Bytes::from(out)
}

fn header_u64(req: &HttpRequest, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.trim().parse().ok()
}

/// A streaming response fed by a channel.
fn stream_response(rx: tokio::sync::mpsc::Receiver<web::Bytes>) -> HttpResponse {
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, actix_web::Error>(b), rx))
    });
    HttpResponse::Ok()
        .insert_header(("content-type", "application/connect+json"))
        .streaming(body)
}

/// A streaming error answered as the end-of-stream envelope of a 200 response.
fn stream_error(code: &str, message: &str) -> HttpResponse {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(envelope(
        0x02,
        &json!({"error": {"code": code, "message": message}}),
    ));
    stream_response(rx)
}

async fn start(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Some(msg) = envelope_message(&body) else {
        return stream_error("invalid_argument", "unreadable request envelope");
    };
    let process = &msg["process"];
    let Some(cmd) = process["cmd"].as_str() else {
        return stream_error("invalid_argument", "process.cmd is required");
    };
    let mut argv = vec![cmd.to_string()];
    argv.extend(
        process["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned)),
    );
    let mut env = s.env.clone();
    if let Some(envs) = process["envs"].as_object() {
        for (k, v) in envs {
            if let Some(v) = v.as_str() {
                env.retain(|(key, _)| key != k);
                env.push((k.clone(), v.to_string()));
            }
        }
    }
    let cwd = resolve(&em, process["cwd"].as_str().unwrap_or_default());
    let deadline =
        header_u64(&req, "connect-timeout-ms").map(|ms| Instant::now() + Duration::from_millis(ms));
    let keepalive = Duration::from_secs(
        header_u64(&req, "keepalive-ping-interval")
            .unwrap_or(50)
            .clamp(1, 3600),
    );
    // `stdin: true` keeps the process's standard input open for `SendInput`.
    let stdin = msg["stdin"].as_bool().unwrap_or(false);
    let first_wait = deadline.map_or(FIRST_WAIT, |d| {
        FIRST_WAIT.min(d.saturating_duration_since(Instant::now()) / 2)
    });
    if let Some(sb) = em.lock().get_mut(&s.id) {
        sb.calls.starts += 1;
    }
    let (spawned, progress) = match em
        .machines
        .spawn(&s.container, &argv, &cwd, &env, stdin, first_wait)
        .await
    {
        Ok(r) => r,
        Err(rakazo_actors::provider::ProviderError::NotFound(m)) => {
            return stream_error("invalid_argument", &m);
        }
        Err(rakazo_actors::provider::ProviderError::MachineGone) => {
            return stream_error("unavailable", "sandbox is not running");
        }
        Err(e) => return stream_error("internal", &e.to_string()),
    };
    let tag = msg["tag"].as_str().map(str::to_owned);
    let config = json!({
        "cmd": cmd,
        "args": argv[1..],
        "envs": process["envs"].as_object().cloned().unwrap_or_default(),
        "cwd": cwd,
    });
    if let Some(sb) = em.lock().get_mut(&s.id) {
        sb.processes.insert(
            spawned.pid,
            Process {
                spawned: spawned.clone(),
                config,
                tag,
            },
        );
    }
    tracing::debug!(sandbox.id = %s.id, pid = spawned.pid, "emulator.e2b.process.started");
    follow(
        em.into_inner(),
        s,
        spawned,
        Some(progress),
        deadline,
        keepalive,
    )
}

async fn connect(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Some(msg) = envelope_message(&body) else {
        return stream_error("invalid_argument", "unreadable request envelope");
    };
    let Some(p) = find_process(&s, &msg["process"]) else {
        return stream_error("not_found", "process not found");
    };
    let deadline =
        header_u64(&req, "connect-timeout-ms").map(|ms| Instant::now() + Duration::from_millis(ms));
    let keepalive = Duration::from_secs(
        header_u64(&req, "keepalive-ping-interval")
            .unwrap_or(50)
            .clamp(1, 3600),
    );
    follow(em.into_inner(), s, p.spawned, None, deadline, keepalive)
}

fn find_process(s: &Sandbox, selector: &Value) -> Option<Process> {
    if let Some(pid) = selector["pid"].as_u64() {
        return s.processes.get(&(pid as u32)).cloned();
    }
    let tag = selector["tag"].as_str()?;
    s.processes
        .values()
        .find(|p| p.tag.as_deref() == Some(tag))
        .cloned()
}

/// Streams a process's events until it ends, the deadline kills it or the client leaves.
fn follow(
    em: std::sync::Arc<Emulator>,
    s: Sandbox,
    p: Spawned,
    first: Option<Progress>,
    deadline: Option<Instant>,
    keepalive: Duration,
) -> HttpResponse {
    let (tx, rx) = tokio::sync::mpsc::channel::<web::Bytes>(16);
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    tokio::spawn(async move {
        let send = |v: Value| tx.send(envelope(0x00, &json!({"event": v})));
        if send(json!({"start": {"pid": p.pid}})).await.is_err() {
            return;
        }
        let (mut out_off, mut err_off) = (0u64, 0u64);
        let mut progress = first;
        let mut last_sent = Instant::now();
        loop {
            let pr = match progress.take() {
                Some(pr) => pr,
                None => {
                    let mut wait = POLL_WAIT;
                    if let Some(d) = deadline {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            let _ = em.machines.signal(&s.container, p.pid, "KILL").await;
                            forget(&em, &s.id, p.pid);
                            let _ = tx
                                .send(envelope(0x02, &json!({"error": {"code": "deadline_exceeded", "message": "the command's deadline passed: it was killed"}})))
                                .await;
                            return;
                        }
                        wait = wait.min(left);
                    }
                    match em
                        .machines
                        .poll(&s.container, &p, out_off, err_off, wait)
                        .await
                    {
                        Ok(pr) => pr,
                        Err(e) => {
                            let _ = tx
                                .send(envelope(0x02, &json!({"error": {"code": "unavailable", "message": e.to_string()}})))
                                .await;
                            return;
                        }
                    }
                }
            };
            out_off += pr.stdout.len() as u64;
            err_off += pr.stderr.len() as u64;
            let drained = pr.stdout.is_empty() && pr.stderr.is_empty();
            if !pr.stdout.is_empty() {
                if send(json!({"data": {"stdout": b64(&pr.stdout)}}))
                    .await
                    .is_err()
                {
                    return;
                }
                last_sent = Instant::now();
            }
            if !pr.stderr.is_empty() {
                if send(json!({"data": {"stderr": b64(&pr.stderr)}}))
                    .await
                    .is_err()
                {
                    return;
                }
                last_sent = Instant::now();
            }
            if !pr.alive && drained {
                let end = match pr.exit {
                    Some(code) => {
                        json!({"exitCode": code, "exited": true, "status": format!("exit status {code}")})
                    }
                    None => json!({"exitCode": -1, "exited": false, "status": "signal: killed"}),
                };
                forget(&em, &s.id, p.pid);
                if send(json!({"end": end})).await.is_ok() {
                    let _ = tx.send(envelope(0x02, &json!({}))).await;
                }
                return;
            }
            if !pr.alive {
                // Ended, with output left to read: poll again at once.
                progress = None;
                continue;
            }
            if last_sent.elapsed() >= keepalive {
                if send(json!({"keepalive": {}})).await.is_err() {
                    return;
                }
                last_sent = Instant::now();
            }
        }
    });
    stream_response(rx)
}

fn forget(em: &Emulator, id: &str, pid: u32) {
    if let Some(s) = em.lock().get_mut(id) {
        s.processes.remove(&pid);
    }
}

async fn list(em: web::Data<Emulator>, req: HttpRequest) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let pids: Vec<u32> = s.processes.keys().copied().collect();
    let script = pids
        .iter()
        .map(|p| format!("kill -0 {p} 2>/dev/null && echo {p}"))
        .collect::<Vec<_>>()
        .join("\n");
    let alive: Vec<u32> = match em
        .machines
        .exec(
            &s.container,
            &format!("{script}\ntrue"),
            "/",
            &[],
            Duration::from_secs(20),
        )
        .await
    {
        Ok(out) => out
            .stdout
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect(),
        Err(e) => return connect_error("unavailable", &e.to_string()),
    };
    let processes: Vec<Value> = s
        .processes
        .iter()
        .filter(|(pid, _)| alive.contains(pid))
        .map(|(pid, p)| {
            let mut v = json!({"pid": pid, "config": p.config});
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    HttpResponse::Ok().json(json!({"processes": processes}))
}

async fn send_signal(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return connect_error("invalid_argument", "unreadable request");
    };
    let delay = em.signal_delay_ms.load(std::sync::atomic::Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    if em
        .signals_unavailable
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return connect_error("unavailable", "the process service is unavailable");
    }
    let Some(p) = find_process(&s, &msg["process"]) else {
        return connect_error("not_found", "process not found");
    };
    let signal = match msg["signal"].as_str() {
        Some("SIGNAL_SIGKILL") | Some("9") => "KILL",
        Some("SIGNAL_SIGTERM") | Some("15") => "TERM",
        _ => return connect_error("invalid_argument", "unsupported signal"),
    };
    match em
        .machines
        .signal(&s.container, p.spawned.pid, signal)
        .await
    {
        Ok(true) => HttpResponse::Ok().json(json!({})),
        Ok(false) => {
            forget(&em, &s.id, p.spawned.pid);
            connect_error("not_found", "process not found")
        }
        Err(e) => connect_error("unavailable", &e.to_string()),
    }
}

/// The process a unary `process.Process` call names, or the Connect error to answer.
fn unary_process(
    em: &Emulator,
    req: &HttpRequest,
    body: &[u8],
) -> Result<(Sandbox, Process, Value), Box<HttpResponse>> {
    let s = sandbox(em, req)?;
    let Ok(msg) = serde_json::from_slice::<Value>(body) else {
        return Err(Box::new(connect_error(
            "invalid_argument",
            "unreadable request",
        )));
    };
    let Some(p) = find_process(&s, &msg["process"]) else {
        return Err(Box::new(connect_error("not_found", "process not found")));
    };
    Ok((s, p, msg))
}

/// `SendInput`: bytes for the standard input of a process started with `stdin: true`.
async fn send_input(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let (s, p, msg) = match unary_process(&em, &req, &body) {
        Ok(found) => found,
        Err(r) => return *r,
    };
    let input = &msg["input"];
    if input.get("pty").is_some() {
        return connect_error(
            "internal",
            "error writing to tty: tty not assigned to process",
        );
    }
    let Some(data) = input["stdin"]
        .as_str()
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
    else {
        return connect_error("invalid_argument", "input.stdin must be base64 bytes");
    };
    if let Some(sb) = em.lock().get_mut(&s.id) {
        sb.calls.inputs += 1;
    }
    match em
        .machines
        .write_stdin(&s.container, &p.spawned, &data)
        .await
    {
        Ok(StdinWrite::Written) => HttpResponse::Ok().json(json!({})),
        Ok(StdinWrite::NotOpen) => connect_error(
            "failed_precondition",
            "error writing to stdin: stdin not enabled or closed",
        ),
        Ok(StdinWrite::Ended) => {
            forget(&em, &s.id, p.spawned.pid);
            connect_error("not_found", "process not found")
        }
        Err(e) => connect_error("unavailable", &e.to_string()),
    }
}

/// `CloseStdin`: the process reads the end of its standard input.
async fn close_stdin(em: web::Data<Emulator>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let (s, p, _) = match unary_process(&em, &req, &body) {
        Ok(found) => found,
        Err(r) => return *r,
    };
    match em.machines.close_stdin(&s.container, &p.spawned).await {
        Ok(()) => HttpResponse::Ok().json(json!({})),
        Err(e) => connect_error("unavailable", &e.to_string()),
    }
}

async fn unimplemented(path: web::Path<String>) -> HttpResponse {
    connect_error(
        "unimplemented",
        &format!(
            "process.Process/{} is not emulated",
            path.chars().take(40).collect::<String>()
        ),
    )
}

async fn filesystem(
    em: web::Data<Emulator>,
    req: HttpRequest,
    method: web::Path<String>,
    body: web::Bytes,
) -> HttpResponse {
    let s = match sandbox(&em, &req) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return connect_error("invalid_argument", "unreadable request");
    };
    let path = |k: &str| resolve(&em, msg[k].as_str().unwrap_or_default());
    let (op, args) = match method.as_str() {
        "Stat" => ("stat", json!({"path": path("path")})),
        "ListDir" => (
            "list",
            json!({"path": path("path"), "depth": msg["depth"].as_u64().unwrap_or(1)}),
        ),
        "MakeDir" => ("mkdir", json!({"path": path("path")})),
        "Remove" => ("remove", json!({"path": path("path")})),
        "Move" => (
            "move",
            json!({"source": path("source"), "destination": path("destination")}),
        ),
        other => {
            return connect_error(
                "unimplemented",
                &format!(
                    "filesystem.Filesystem/{} is not emulated",
                    other.chars().take(40).collect::<String>()
                ),
            );
        }
    };
    let script = format!(
        "exec python3 -c {src} {op} {args}",
        src = shell_quote(&format!(
            "import sys; sys.argv = ['fs'] + sys.argv[1:]\n{FS_HELPER}"
        )),
        args = shell_quote(&args.to_string()),
    );
    let out = match em
        .machines
        .exec(&s.container, &script, "/", &[], Duration::from_secs(60))
        .await
    {
        Ok(out) => out,
        Err(e) => return connect_error("unavailable", &e.to_string()),
    };
    let message = out.stderr.trim().chars().take(300).collect::<String>();
    match out.exit_code {
        0 => match serde_json::from_str::<Value>(&out.stdout) {
            Ok(v) => HttpResponse::Ok().json(v),
            Err(_) => connect_error("internal", "unreadable answer"),
        },
        3 => connect_error("not_found", &message),
        4 => connect_error("already_exists", &message),
        5 => connect_error("invalid_argument", &message),
        6 => connect_error("permission_denied", &message),
        _ => connect_error("internal", &message),
    }
}
