//! E2B's control plane as the official SDK speaks it: `POST /v2/sandboxes`, `POST
//! /v2/sandboxes/{id}/connect`, `GET /v2/sandboxes`, `GET /sandboxes/{id}`, `POST
//! /sandboxes/{id}/timeout`, `POST /sandboxes/{id}/pause`, `DELETE /sandboxes/{id}`. Every
//! call needs a non-empty `X-API-KEY`; errors are `{code, message}`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ENVD_VERSION, Emulator, Sandbox, State};

/// Default sandbox lifetime (E2B's).
const DEFAULT_TIMEOUT: u64 = 300;
/// Longest accepted lifetime (E2B's Pro tier: 24 h).
const MAX_TIMEOUT: u64 = 86_400;

/// Registers the routes.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v2/sandboxes", web::post().to(create))
        .route("/v2/sandboxes", web::get().to(list))
        .route("/sandboxes", web::get().to(list))
        .route("/v2/sandboxes/{id}/connect", web::post().to(connect))
        .route("/sandboxes/{id}/resume", web::post().to(connect))
        .route("/sandboxes/{id}", web::get().to(detail))
        .route("/sandboxes/{id}", web::delete().to(kill))
        .route("/sandboxes/{id}/timeout", web::post().to(set_timeout))
        .route("/sandboxes/{id}/pause", web::post().to(pause));
}

/// A `{code, message}` error.
pub fn error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({"code": status.as_u16(), "message": message}))
}

fn authorized(req: &HttpRequest) -> Result<(), Box<HttpResponse>> {
    match req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(k) if !k.trim().is_empty() => Ok(()),
        _ => Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "Invalid API key, it must start with 'e2b_' prefix",
        ))),
    }
}

fn not_found(id: &str) -> HttpResponse {
    error(
        StatusCode::NOT_FOUND,
        &format!(
            "sandbox \"{}\" not found",
            id.chars().take(64).collect::<String>()
        ),
    )
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
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

fn sandbox_json(s: &Sandbox, domain: &str) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "emulator",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token,
        "domain": domain,
        "alias": s.template,
    })
}

fn detail_json(s: &Sandbox, domain: &str) -> Value {
    json!({
        "templateID": s.template,
        "sandboxID": s.id,
        "clientID": "emulator",
        "alias": s.template,
        "startedAt": rfc3339(s.started_at),
        "endAt": rfc3339(s.end_at),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": s.access_token,
        "domain": domain,
        "cpuCount": 2,
        "memoryMB": 4096,
        "diskSizeMB": 10240,
        "metadata": s.metadata,
        "state": match s.state { State::Running => "running", State::Paused => "paused" },
    })
}

fn lifetime(timeout: Option<u64>) -> Result<Duration, Box<HttpResponse>> {
    let t = timeout.unwrap_or(DEFAULT_TIMEOUT);
    if t > MAX_TIMEOUT {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("timeout cannot be greater than {MAX_TIMEOUT} seconds"),
        )));
    }
    Ok(Duration::from_secs(t))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    env_vars: Option<HashMap<String, String>>,
}

async fn create(
    em: web::Data<Emulator>,
    req: HttpRequest,
    body: web::Json<CreateBody>,
) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    let body = body.into_inner();
    let ttl = match lifetime(body.timeout) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    if body.template_id.is_empty() || body.template_id.len() > 128 {
        return error(StatusCode::BAD_REQUEST, "templateID is required");
    }
    let id = if em.settings.novita {
        if !super::NOVITA_TEMPLATES.contains(&body.template_id.as_str()) {
            return error(
                StatusCode::NOT_FOUND,
                &format!(
                    "template '{}' not found",
                    body.template_id.chars().take(128).collect::<String>()
                ),
            );
        }
        format!(
            "{}-{}",
            super::super::random_id(20),
            super::super::random_id(8)
        )
    } else {
        super::super::random_id(20)
    };
    let info = match em.machines.create("e2b", &id).await {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(error = %e, "emulator.e2b.create_failed");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("failed to create the sandbox: {e}"),
            );
        }
    };
    let now = SystemTime::now();
    let sandbox = Sandbox {
        id: id.clone(),
        template: body.template_id,
        container: info.id,
        access_token: format!("ea_{}", super::super::random_id(32)),
        state: State::Running,
        started_at: now,
        end_at: now + ttl,
        metadata: body.metadata.unwrap_or_default(),
        env: body.env_vars.unwrap_or_default().into_iter().collect(),
        gateway_port: info.gateway_port,
        processes: HashMap::new(),
        calls: Default::default(),
    };
    let answer = sandbox_json(&sandbox, &em.settings.domain);
    em.lock().insert(id.clone(), sandbox);
    tracing::info!(sandbox.id = %id, "emulator.e2b.created");
    HttpResponse::Created().json(answer)
}

#[derive(Deserialize, Default)]
struct TimeoutBody {
    timeout: Option<u64>,
}

async fn connect(
    em: web::Data<Emulator>,
    req: HttpRequest,
    id: web::Path<String>,
    body: Option<web::Json<TimeoutBody>>,
) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    let ttl = match lifetime(body.and_then(|b| b.timeout)) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let Some(sandbox) = em.get(&id) else {
        return not_found(&id);
    };
    let resumed = sandbox.state == State::Paused;
    let mut gateway_port = sandbox.gateway_port;
    if resumed {
        match em.machines.start(&sandbox.container).await {
            Ok(info) => gateway_port = info.gateway_port,
            Err(rakazo_actors::provider::ProviderError::MachineGone) => {
                em.lock().remove(id.as_str());
                return not_found(&id);
            }
            Err(e) => {
                tracing::warn!(error = %e, "emulator.e2b.resume_failed");
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed to resume the sandbox",
                );
            }
        }
    }
    let mut table = em.lock();
    let Some(s) = table.get_mut(id.as_str()) else {
        return not_found(&id);
    };
    s.state = State::Running;
    s.gateway_port = gateway_port;
    if resumed {
        s.processes.clear();
    }
    let end = SystemTime::now() + ttl;
    if resumed || end > s.end_at {
        s.end_at = end;
    }
    let answer = sandbox_json(s, &em.settings.domain);
    if resumed {
        em.resumes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(sandbox.id = %s.id, "emulator.e2b.resumed");
        HttpResponse::Created().json(answer)
    } else {
        HttpResponse::Ok().json(answer)
    }
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    metadata: Option<String>,
}

async fn list(em: web::Data<Emulator>, req: HttpRequest, q: web::Query<ListQuery>) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    let states: Vec<&str> = q
        .state
        .as_deref()
        .map_or(vec!["running", "paused"], |s| s.split(',').collect());
    let wanted: Vec<(String, String)> = q.metadata.as_deref().map(url_pairs).unwrap_or_default();
    let table = em.lock();
    let items: Vec<Value> = table
        .values()
        .filter(|s| {
            states.contains(&match s.state {
                State::Running => "running",
                State::Paused => "paused",
            })
        })
        .filter(|s| {
            wanted
                .iter()
                .all(|(k, v)| s.metadata.get(k).and_then(Value::as_str) == Some(v.as_str()))
        })
        .map(|s| detail_json(s, &em.settings.domain))
        .collect();
    HttpResponse::Ok().json(items)
}

/// `k=v&k2=v2`, percent-decoded.
fn url_pairs(s: &str) -> Vec<(String, String)> {
    let decode = |p: &str| {
        let bytes = p.replace('+', " ").into_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%'
                && let Some(h) = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
            {
                out.push(h);
                i += 3;
                continue;
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

async fn detail(em: web::Data<Emulator>, req: HttpRequest, id: web::Path<String>) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    match em.get(&id) {
        Some(s) => HttpResponse::Ok().json(detail_json(&s, &em.settings.domain)),
        None => not_found(&id),
    }
}

async fn kill(em: web::Data<Emulator>, req: HttpRequest, id: web::Path<String>) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    if em.kill(&id).await {
        HttpResponse::NoContent().finish()
    } else {
        not_found(&id)
    }
}

async fn set_timeout(
    em: web::Data<Emulator>,
    req: HttpRequest,
    id: web::Path<String>,
    body: web::Json<TimeoutBody>,
) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    let ttl = match lifetime(body.timeout) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let mut table = em.lock();
    match table.get_mut(id.as_str()) {
        Some(s) => {
            s.end_at = SystemTime::now() + ttl;
            HttpResponse::NoContent().finish()
        }
        None => not_found(&id),
    }
}

async fn pause(em: web::Data<Emulator>, req: HttpRequest, id: web::Path<String>) -> HttpResponse {
    if let Err(r) = authorized(&req) {
        return *r;
    }
    let Some(s) = em.get(&id) else {
        return not_found(&id);
    };
    if s.state == State::Paused {
        return error(
            StatusCode::CONFLICT,
            &format!("sandbox \"{}\" is already paused", s.id),
        );
    }
    if let Err(e) = em.machines.stop(&s.container).await {
        tracing::warn!(error = %e, "emulator.e2b.pause_failed");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failed to pause the sandbox",
        );
    }
    if let Some(s) = em.lock().get_mut(id.as_str()) {
        s.state = State::Paused;
        s.processes.clear();
    }
    tracing::info!(sandbox.id = %s.id, "emulator.e2b.paused");
    HttpResponse::NoContent().finish()
}
