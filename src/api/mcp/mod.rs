//! The MCP endpoint (streamable HTTP, JSON responses): any MCP client drives a bot's computer
//! with the same tools as `tools/call`.
//!
//! Authenticated by a bearer token scoped to one bot, checked before the body is read (at
//! most `rpc::MAX_REQUEST_BYTES`; one message per request, batches are not answered). `initialize` starts a run for that bot
//! (its execution lease) and opens a session (`Mcp-Session-Id`); `tools/list` and
//! `tools/call` act under that run. A session is a row of `mcp_sessions` ([`table`]), so any
//! API process answers it, whichever answered `initialize`. While the session lives its lease
//! is renewed (by a call once past half its life, and by the sweeper of any process), so a
//! session is usable for as long as it is used. `DELETE /mcp` ends the run as completed, a
//! session without a call for `MCP_SESSION_IDLE_MS` ends it as canceled: both through
//! `methods::end_run`, the end of every run (control revoked, workspace checkpointed). A call
//! on an ended session answers 404 `NOT_FOUND`, which tells an MCP client to start a new
//! session.

mod sweep;
mod table;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use actix_web::{HttpRequest, HttpResponse, web};
use dashmap::DashMap;
use rakazo_actors::clock::now_ms;
use rakazo_actors::computers::Computers;
use rakazo_actors::entity::mcp_session;
use rakazo_actors::lease_actor::Renew;
use rakazo_actors::leases::LeaseKey;
use rakazo_actors::runs::{RunState, RunTarget};
use rakazo_actors::{DomainError, ErrorCode};
use serde_json::{Value, json};

pub use sweep::sweep;
use sweep::sweep_every;

use super::methods::{self, Ctx, EndedBy};
use super::rpc;
use crate::app::App;
use crate::auth::Caller;
use crate::tools::{self, ToolCtx};

/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// Protocol versions this endpoint speaks, newest first.
const VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// One MCP session as this process knows it: a run of the token's bot. The row in
/// `mcp_sessions` is the truth; this is its cache plus this process's own use of it.
#[derive(Debug)]
pub struct Session {
    /// The row's key ([`table::key`]).
    key: String,
    user_id: String,
    bot_id: String,
    space_id: String,
    computer_id: String,
    run_id: String,
    fence: i64,
    /// When a call here last began or ended.
    last_used_ms: AtomicI64,
    /// The last use this process knows the row holds.
    stored_ms: AtomicI64,
    /// Calls being answered here now; a busy session is never idle.
    in_flight: AtomicUsize,
    /// When the execution lease expires unless renewed.
    lease_expires_ms: AtomicI64,
}

impl Session {
    fn from_row(row: mcp_session::Model) -> Session {
        Session {
            key: row.id_hash,
            user_id: row.user_id,
            bot_id: row.bot_id,
            space_id: row.space_id,
            computer_id: row.computer_id,
            run_id: row.run_id,
            fence: row.fence,
            last_used_ms: AtomicI64::new(row.last_used_ms),
            stored_ms: AtomicI64::new(row.last_used_ms),
            in_flight: AtomicUsize::new(0),
            lease_expires_ms: AtomicI64::new(row.lease_expires_ms),
        }
    }

    /// A use to write down, if this process saw one the row may not hold: `now` while a call
    /// runs here, else the end of the last call since the last write.
    fn unwritten_use(&self, now: i64) -> Option<i64> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Some(now);
        }
        let used = self.last_used_ms.load(Ordering::SeqCst);
        (used > self.stored_ms.load(Ordering::SeqCst)).then_some(used)
    }
}

/// Sessions this process has answered, by [`table::key`]: a cache of their rows.
pub type Sessions = DashMap<String, Arc<Session>>;

/// A call in progress on a session: keeps it from idling out until the call is answered.
struct InUse(Arc<Session>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.last_used_ms.store(now_ms(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn session_key(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(table::key)
}

/// The caller's session, from this process's cache or from its row; counted in use.
async fn session_of(app: &App, req: &HttpRequest, caller: &Caller) -> Result<InUse, DomainError> {
    let key = session_key(req)
        .ok_or_else(|| DomainError::invalid("missing Mcp-Session-Id: call initialize first"))?;
    let cached = app.mcp.get(&key).map(|e| e.value().clone());
    let s = match cached {
        Some(s) => s,
        None => {
            let row = table::load(&app.db, &key)
                .await?
                .ok_or_else(|| DomainError::not_found("MCP session"))?;
            app.mcp
                .entry(key)
                .or_insert_with(|| Arc::new(Session::from_row(row)))
                .value()
                .clone()
        }
    };
    if s.user_id != caller.user_id || caller.bot_id() != Some(s.bot_id.as_str()) {
        return Err(DomainError::not_found("MCP session"));
    }
    s.in_flight.fetch_add(1, Ordering::SeqCst);
    let now = now_ms();
    s.last_used_ms.store(now, Ordering::SeqCst);
    let in_use = InUse(s);
    // The row may lag this process's use by one sweep interval, and no more: a process
    // deciding the session idle allows for that lag.
    if now - in_use.0.stored_ms.load(Ordering::SeqCst) >= sweep_every(app).as_millis() as i64 {
        if !table::used(&app.db, &in_use.0.key, now).await? {
            app.mcp.remove(&in_use.0.key);
            return Err(DomainError::not_found("MCP session"));
        }
        in_use.0.stored_ms.fetch_max(now, Ordering::SeqCst);
    }
    Ok(in_use)
}

/// Renew the session's execution lease when it is past half its life.
async fn keep_lease(app: &App, s: &Session) -> Result<(), DomainError> {
    let ttl = methods::lease_ttl_ms(app);
    if now_ms() < s.lease_expires_ms.load(Ordering::SeqCst) - ttl / 2 {
        return Ok(());
    }
    renew(app, s).await
}

/// Renew the session's execution lease now, and write its new expiry down.
async fn renew(app: &App, s: &Session) -> Result<(), DomainError> {
    let grant = app
        .registry
        .computer(&s.computer_id, &s.space_id)
        .leases
        .send(Renew {
            key: LeaseKey::execution(&s.computer_id, &s.bot_id),
            fence: s.fence,
            holder: None,
            ttl_ms: methods::lease_ttl_ms(app),
        })
        .await??;
    s.lease_expires_ms
        .fetch_max(grant.expires_at_ms, Ordering::SeqCst);
    table::lease_renewed(&app.db, &s.key, grant.expires_at_ms).await?;
    Ok(())
}

async fn bot_caller(app: &App, req: &HttpRequest) -> Result<(Caller, String), HttpResponse> {
    let caller = super::caller(app, req)
        .await
        .map_err(|e| super::json_status(e.code.http_status(), rpc::error(Value::Null, &e)))?;
    let Some(bot) = caller.bot_id().map(str::to_owned) else {
        let e = DomainError::new(
            ErrorCode::Forbidden,
            "the MCP endpoint needs a token scoped to one bot",
        );
        return Err(HttpResponse::Forbidden().json(rpc::error(Value::Null, &e)));
    };
    Ok((caller, bot))
}

/// `POST /mcp`.
pub async fn post(app: web::Data<App>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    let (caller, bot_id) = match bot_caller(&app, &req).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let body = match super::read_body(payload, rpc::MAX_REQUEST_BYTES).await {
        Ok(body) => body,
        Err(err) => return super::body_error(err),
    };
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return HttpResponse::BadRequest().json(rpc::protocol_error(
            Value::Null,
            -32700,
            "parse error",
        ));
    };
    let Some(method) = msg["method"].as_str().map(str::to_owned) else {
        // A response or something else from the client: nothing to answer.
        return HttpResponse::Accepted().finish();
    };
    let id = msg.get("id").cloned();
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    if id.is_none() {
        return HttpResponse::Accepted().finish();
    }
    let id = id.unwrap_or(Value::Null);
    if method == "initialize" {
        return initialize(&app, &caller, &bot_id, id, &params).await;
    }
    let session = match session_of(&app, &req, &caller).await {
        Ok(s) => s,
        Err(e) => return session_error(id, &e),
    };
    if let Err(e) = keep_lease(&app, &session.0).await {
        // The call itself reports what became of the run.
        tracing::debug!(event = "mcp.lease_not_renewed", code = ?e.code);
    }
    let outcome = match method.as_str() {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools::definitions() })),
        "tools/call" => call_tool(&app, &caller, &session.0, params).await,
        other => Err(DomainError::new(
            ErrorCode::MethodNotFound,
            format!("unknown method `{other}`"),
        )),
    };
    match outcome {
        Ok(v) => HttpResponse::Ok().json(rpc::result(id, v)),
        // The run was ended through another process (`DELETE /mcp`, the sweeper): the
        // session is gone, which a client hears as 404 whichever process it asks.
        Err(e) if e.code == ErrorCode::LeaseFenced && !still_open(&app, &session.0).await => {
            session_error(id, &DomainError::not_found("MCP session"))
        }
        Err(e) => HttpResponse::Ok().json(rpc::error(id, &e)),
    }
}

/// Whether the session's row is still there; forgets it here when it is not.
async fn still_open(app: &App, s: &Session) -> bool {
    match table::load(&app.db, &s.key).await {
        Ok(Some(_)) => true,
        Ok(None) => {
            app.mcp.remove(&s.key);
            false
        }
        Err(_) => true,
    }
}

/// The answer when no session can be had: 404 for an unknown or ended one (an MCP client
/// starts a new session on it), 400 without the header, 503 when the database failed.
fn session_error(id: Value, e: &DomainError) -> HttpResponse {
    match e.code {
        ErrorCode::NotFound => HttpResponse::NotFound().json(rpc::error(id, e)),
        ErrorCode::InvalidParams => HttpResponse::BadRequest().json(rpc::error(id, e)),
        _ => HttpResponse::ServiceUnavailable().json(rpc::error(id, e)),
    }
}

async fn initialize(
    app: &App,
    caller: &Caller,
    bot_id: &str,
    id: Value,
    params: &Value,
) -> HttpResponse {
    let ctx = Ctx {
        app,
        caller,
        attachments: None,
    };
    let started = async {
        let (b, space) = methods::access_bot(&ctx, bot_id).await?;
        let c = Computers::new(app.db.clone())
            .for_bot(&b, &space.owner_id)
            .await?;
        let target = RunTarget {
            space_id: c.space_id.clone(),
            bot_id: b.id.clone(),
            computer_id: c.id.clone(),
        };
        methods::runs(app).start(&target).await
    };
    let (run, grant) = match started.await {
        Ok(r) => r,
        Err(e) => return HttpResponse::Ok().json(rpc::error(id, &e)),
    };
    app.runtime().events.publish(
        &run.space_id,
        rakazo_actors::events::Topic::RunState,
        methods::run_json(&run),
    );
    let session_id = crate::auth::generate();
    let now = now_ms();
    let row = mcp_session::Model {
        id_hash: table::key(&session_id),
        user_id: caller.user_id.clone(),
        bot_id: bot_id.into(),
        space_id: run.space_id.clone(),
        computer_id: run.computer_id.clone(),
        run_id: run.id.clone(),
        fence: grant.fence,
        created_at_ms: now,
        last_used_ms: now,
        lease_expires_ms: grant.expires_at_ms,
    };
    if let Err(e) = table::insert(&app.db, row.clone()).await {
        // No session without its row: the run just started ends again.
        let _ = methods::end_run(
            app,
            &run.id,
            grant.fence,
            RunState::Canceled,
            EndedBy::McpNotOpened,
        )
        .await;
        return HttpResponse::ServiceUnavailable().json(rpc::error(id, &e.into()));
    }
    app.mcp
        .insert(row.id_hash.clone(), Arc::new(Session::from_row(row)));
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let version = VERSIONS
        .iter()
        .find(|v| **v == asked)
        .copied()
        .unwrap_or(VERSIONS[0]);
    let result = json!({
        "protocolVersion": version,
        "capabilities": { "tools": { "listChanged": false } },
        "serverInfo": { "name": "rakazo", "version": env!("CARGO_PKG_VERSION") },
        "instructions": "Tools of one Rakazo computer. Each session is one run of your bot.",
    });
    HttpResponse::Ok()
        .insert_header((SESSION_HEADER, session_id))
        .json(rpc::result(id, result))
}

async fn call_tool(
    app: &App,
    caller: &Caller,
    s: &Session,
    params: Value,
) -> Result<Value, DomainError> {
    let name = params["name"]
        .as_str()
        .ok_or_else(|| DomainError::invalid("tools/call needs a name"))?
        .to_owned();
    let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
    let ctx = Ctx {
        app,
        caller,
        attachments: None,
    };
    let fenced = methods::fenced(&ctx, &s.run_id, s.fence).await?;
    let tcx = ToolCtx::new(app, fenced, true, None);
    Ok(tools::call(&tcx, &name, arguments).await)
}

/// `DELETE /mcp`: end the session's run (completed) through `methods::end_run`, which
/// checkpoints the workspace.
pub async fn delete(app: web::Data<App>, req: HttpRequest) -> HttpResponse {
    let (caller, _) = match bot_caller(&app, &req).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let in_use = match session_of(&app, &req, &caller).await {
        Ok(in_use) => in_use,
        Err(e) => return session_error(Value::Null, &e),
    };
    let s = in_use.0.clone();
    drop(in_use);
    app.mcp.remove(&s.key);
    match table::end(&app.db, &s.key).await {
        Ok(true) => {}
        // Another DELETE or a sweeper, in this process or another, ended it first.
        Ok(false) => return HttpResponse::NotFound().finish(),
        Err(e) => return session_error(Value::Null, &e.into()),
    }
    match methods::end_run(
        &app,
        &s.run_id,
        s.fence,
        RunState::Completed,
        EndedBy::McpDelete,
    )
    .await
    {
        Ok(_) => HttpResponse::NoContent().finish(),
        Err(e) => HttpResponse::Conflict().json(rpc::error(Value::Null, &e)),
    }
}

/// `GET /mcp`: this endpoint opens no server-initiated stream.
pub async fn get() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header(("allow", "POST, DELETE"))
        .finish()
}
