//! The MCP endpoint (streamable HTTP, JSON responses): any MCP client drives a bot's computer
//! with the same tools as `tools/call`.
//!
//! Authenticated by a bearer token scoped to one bot, checked before the body is read (at
//! most `rpc::MAX_REQUEST_BYTES`; one message per request, batches are not answered). `initialize` starts a run for that bot
//! (its execution lease) and opens a session (`Mcp-Session-Id`); `tools/list` and
//! `tools/call` act under that run; `DELETE /mcp` ends it (completed, with a checkpoint).

use actix_web::{HttpRequest, HttpResponse, web};
use dashmap::DashMap;
use rakazo_actors::computers::Computers;
use rakazo_actors::runs::{RunState, RunTarget, Runs};
use rakazo_actors::{DomainError, ErrorCode};
use serde_json::{Value, json};

use super::methods::{self, Ctx};
use super::rpc;
use crate::app::App;
use crate::auth::Caller;
use crate::tools::{self, ToolCtx};

/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// Protocol versions this endpoint speaks, newest first.
const VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

/// One MCP session: a run of the token's bot.
#[derive(Clone, Debug)]
pub struct Session {
    user_id: String,
    bot_id: String,
    run_id: String,
    fence: i64,
}

/// Live sessions by id.
pub type Sessions = DashMap<String, Session>;

fn session_of(app: &App, req: &HttpRequest, caller: &Caller) -> Result<Session, DomainError> {
    let id = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| DomainError::invalid("missing Mcp-Session-Id: call initialize first"))?;
    let s = app
        .mcp
        .get(id)
        .map(|s| s.clone())
        .ok_or_else(|| DomainError::not_found("MCP session"))?;
    if s.user_id != caller.user_id || caller.bot_id() != Some(s.bot_id.as_str()) {
        return Err(DomainError::not_found("MCP session"));
    }
    Ok(s)
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
    let outcome = match method.as_str() {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": tools::definitions() })),
        "tools/call" => call_tool(&app, &caller, &session, params).await,
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
    let ctx = Ctx { app, caller };
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
        Runs::new(app.db.clone()).start(&target).await
    };
    let (run, grant) = match started.await {
        Ok(r) => r,
        Err(e) => return HttpResponse::Ok().json(rpc::error(id, &e)),
    };
    app.runtime()
        .events
        .publish(&run.space_id, "run.state", methods::run_json(&run));
    let session_id = crate::auth::generate();
    app.mcp.insert(
        session_id.clone(),
        Session {
            user_id: caller.user_id.clone(),
            bot_id: bot_id.into(),
            run_id: run.id,
            fence: grant.fence,
        },
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
    let ctx = Ctx { app, caller };
    let (run, handle) = methods::fenced(&ctx, &s.run_id, s.fence).await?;
    let team = ctx.is_team_bot(&run).await?;
    let tcx = ToolCtx {
        app,
        run,
        team,
        handle,
        vision: true,
    };
    Ok(tools::call(&tcx, &name, arguments).await)
}

/// `DELETE /mcp`: end the session's run (completed) and checkpoint.
pub async fn delete(app: web::Data<App>, req: HttpRequest) -> HttpResponse {
    let (caller, _) = match bot_caller(&app, &req).await {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    let Ok(s) = session_of(&app, &req, &caller) else {
        return HttpResponse::NotFound().finish();
    };
    app.mcp.retain(|_, v| v.run_id != s.run_id);
    app.tools.forget(&s.run_id);
    match Runs::new(app.db.clone())
        .finish(&s.run_id, s.fence, RunState::Completed)
        .await
    {
        Ok(run) => {
            app.runtime()
                .events
                .publish(&run.space_id, "run.state", methods::run_json(&run));
            HttpResponse::NoContent().finish()
        }
        Err(e) => HttpResponse::Conflict().json(rpc::error(Value::Null, &e)),
    }
}

/// `GET /mcp`: this endpoint opens no server-initiated stream.
pub async fn get() -> HttpResponse {
    HttpResponse::MethodNotAllowed()
        .insert_header(("allow", "POST, DELETE"))
        .finish()
}
