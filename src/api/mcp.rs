//! The MCP endpoint (streamable HTTP, JSON responses): any MCP client drives a bot's computer
//! with the same tools as `tools/call`.
//!
//! Authenticated by a bearer token scoped to one bot, checked before the body is read (at
//! most `rpc::MAX_REQUEST_BYTES`; one message per request, batches are not answered). `initialize` starts a run for that bot
//! (its execution lease) and opens a session (`Mcp-Session-Id`); `tools/list` and
//! `tools/call` act under that run. While the session lives its lease is renewed (by a call
//! once past half its life, and by the sweeper), so a session is usable for as long as it is
//! used. `DELETE /mcp` ends the run as completed, a session without a call for
//! `MCP_SESSION_IDLE_MS` ends it as canceled: both through `methods::end_run`, the end of
//! every run (control revoked, workspace checkpointed). A call on an ended session answers
//! 404 `NOT_FOUND`, which tells an MCP client to start a new session.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use dashmap::DashMap;
use rakazo_actors::clock::now_ms;
use rakazo_actors::computers::Computers;
use rakazo_actors::entity::run;
use rakazo_actors::lease_actor::Renew;
use rakazo_actors::leases::LeaseKey;
use rakazo_actors::runs::{RunState, RunTarget};
use rakazo_actors::{DomainError, ErrorCode};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::{Value, json};

use super::methods::{self, Ctx, EndedBy};
use super::rpc;
use crate::app::App;
use crate::auth::Caller;
use crate::tools::{self, ToolCtx};

/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// Protocol versions this endpoint speaks, newest first.
const VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// One MCP session: a run of the token's bot.
#[derive(Debug)]
pub struct Session {
    user_id: String,
    bot_id: String,
    space_id: String,
    computer_id: String,
    run_id: String,
    fence: i64,
    /// When the last call began or ended.
    last_used_ms: AtomicI64,
    /// Calls being answered now; a busy session is never idle.
    in_flight: AtomicUsize,
    /// When the execution lease expires unless renewed.
    lease_expires_ms: AtomicI64,
}

impl Session {
    fn idle_since(&self, now: i64, idle_ms: i64) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
            && now - self.last_used_ms.load(Ordering::SeqCst) >= idle_ms
    }
}

/// Live sessions by id.
pub type Sessions = DashMap<String, Arc<Session>>;

/// A call in progress on a session: keeps it from idling out until the call is answered.
struct InUse(Arc<Session>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.last_used_ms.store(now_ms(), Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn session_of(app: &App, req: &HttpRequest, caller: &Caller) -> Result<InUse, DomainError> {
    let id = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| DomainError::invalid("missing Mcp-Session-Id: call initialize first"))?;
    // Counted in use under the map's guard, so the sweeper (which removes under the same
    // shard's lock) never ends a session a call has just taken.
    let entry = app
        .mcp
        .get(id)
        .ok_or_else(|| DomainError::not_found("MCP session"))?;
    let s = entry.value();
    if s.user_id != caller.user_id || caller.bot_id() != Some(s.bot_id.as_str()) {
        return Err(DomainError::not_found("MCP session"));
    }
    s.in_flight.fetch_add(1, Ordering::SeqCst);
    s.last_used_ms.store(now_ms(), Ordering::SeqCst);
    Ok(InUse(s.clone()))
}

/// Renew the session's execution lease when it is past half its life.
async fn keep_lease(app: &App, s: &Session) -> Result<(), DomainError> {
    let ttl = methods::lease_ttl_ms(app);
    if now_ms() < s.lease_expires_ms.load(Ordering::SeqCst) - ttl / 2 {
        return Ok(());
    }
    let grant = app
        .registry
        .computer(&s.computer_id, &s.space_id)
        .leases
        .send(Renew {
            key: LeaseKey::execution(&s.computer_id, &s.bot_id),
            fence: s.fence,
            ttl_ms: ttl,
        })
        .await??;
    s.lease_expires_ms
        .fetch_max(grant.expires_at_ms, Ordering::SeqCst);
    Ok(())
}

async fn bot_caller(app: &App, req: &HttpRequest) -> Result<(Caller, String), HttpResponse> {
    let caller = super::caller(app, req)
        .await
        .map_err(|e| HttpResponse::Unauthorized().json(rpc::error(Value::Null, &e)))?;
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
    let session = match session_of(&app, &req, &caller) {
        Ok(s) => s,
        Err(e) => return HttpResponse::NotFound().json(rpc::error(id, &e)),
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
        Err(e) => HttpResponse::Ok().json(rpc::error(id, &e)),
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
    app.mcp.insert(
        session_id.clone(),
        Arc::new(Session {
            user_id: caller.user_id.clone(),
            bot_id: bot_id.into(),
            space_id: run.space_id.clone(),
            computer_id: run.computer_id.clone(),
            run_id: run.id,
            fence: grant.fence,
            last_used_ms: AtomicI64::new(now_ms()),
            in_flight: AtomicUsize::new(0),
            lease_expires_ms: AtomicI64::new(grant.expires_at_ms),
        }),
    );
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
    let (run, handle) = methods::fenced(&ctx, &s.run_id, s.fence).await?;
    let team = ctx.is_team_bot(&run).await?;
    let tcx = ToolCtx {
        app,
        run,
        team,
        handle,
        vision: true,
        attachments: None,
    };
    Ok(tools::call(&tcx, &name, arguments).await)
}

/// `DELETE /mcp`: end the session's run (completed) through `methods::end_run`, which
/// checkpoints the workspace.
pub async fn delete(app: web::Data<App>, req: HttpRequest) -> HttpResponse {
    let (caller, _) = match bot_caller(&app, &req).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let Ok(in_use) = session_of(&app, &req, &caller) else {
        return HttpResponse::NotFound().finish();
    };
    let s = in_use.0.clone();
    drop(in_use);
    let Some(id) = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return HttpResponse::NotFound().finish();
    };
    if app.mcp.remove(id).is_none() {
        // Another DELETE or the sweeper ended it first.
        return HttpResponse::NotFound().finish();
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

/// How often the sweeper looks at sessions: often enough to renew a lease before it is
/// past half its life and to end an idle session close to its time.
pub fn sweep_every(app: &App) -> Duration {
    let shortest = app.config.run_lease_ttl.min(app.config.mcp_session_idle);
    (shortest / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// The session sweeper, for as long as the app lives: ends idle sessions and renews the
/// leases of the others.
pub async fn sweep(app: Weak<App>) {
    let Some(every) = app.upgrade().map(|a| sweep_every(&a)) else {
        return;
    };
    let mut tick = actix_rt::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(app) = app.upgrade() else { return };
        sweep_once(&app).await;
    }
}

/// The runs of these sessions that are over.
async fn ended_runs(
    app: &App,
    live: &[(String, Arc<Session>)],
) -> Result<std::collections::HashSet<String>, sea_orm::DbErr> {
    let ids = live.iter().map(|(_, s)| s.run_id.clone());
    Ok(run::Entity::find()
        .filter(run::Column::Id.is_in(ids))
        .all(&app.db)
        .await?
        .into_iter()
        .filter(|r| RunState::parse_outcome(&r.state).is_some())
        .map(|r| r.id)
        .collect())
}

/// One look at every session.
pub async fn sweep_once(app: &App) {
    let idle_ms = app.config.mcp_session_idle.as_millis() as i64;
    let live: Vec<(String, Arc<Session>)> = app
        .mcp
        .iter()
        .map(|e| (e.key().clone(), e.value().clone()))
        .collect();
    if live.is_empty() {
        return;
    }
    let ended = match ended_runs(app, &live).await {
        Ok(ended) => ended,
        Err(e) => {
            tracing::warn!(event = "mcp.sweep_failed", error = %e);
            return;
        }
    };
    for (id, s) in live {
        if ended.contains(&s.run_id) {
            // The run ended elsewhere (`bot.stop`, `run.finish`): so does the session.
            app.mcp.remove(&id);
            tracing::info!(event = "mcp.session_lost");
            continue;
        }
        let now = now_ms();
        if s.idle_since(now, idle_ms) {
            // Decided again under the shard's lock: a call that took the session since stays.
            let Some((_, s)) = app.mcp.remove_if(&id, |_, s| s.idle_since(now, idle_ms)) else {
                continue;
            };
            match methods::end_run(
                app,
                &s.run_id,
                s.fence,
                RunState::Canceled,
                EndedBy::McpIdle,
            )
            .await
            {
                Ok(_) => tracing::info!(event = "mcp.session_expired"),
                Err(e) => {
                    tracing::warn!(event = "mcp.session_expired", code = ?e.code, error = %e.message)
                }
            }
            continue;
        }
        match keep_lease(app, &s).await {
            Ok(()) => {}
            Err(e) if matches!(e.code, ErrorCode::LeaseFenced | ErrorCode::NotFound) => {
                // The run ended elsewhere (`bot.stop`, `run.finish`): so does the session.
                app.mcp.remove(&id);
                tracing::info!(event = "mcp.session_lost", code = ?e.code);
            }
            Err(e) => tracing::warn!(event = "mcp.lease_not_renewed", code = ?e.code),
        }
    }
}

/// `GET /mcp`: this endpoint opens no server-initiated stream.
pub async fn get() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header(("allow", "POST, DELETE"))
        .finish()
}
