//! Runs and control: start, renew, request takeover, resume, finish, stop a bot, take and
//! release control.

use rakazo_actors::computers::Computers;
use rakazo_actors::entity::run;
use rakazo_actors::lease_actor::{Acquire, Release, Renew};
use rakazo_actors::leases::{Grant, LeaseKey, Leases};
use rakazo_actors::provider::ScreenPolicy;
use rakazo_actors::runs::{RunState, RunTarget, Runs};
use rakazo_actors::screen;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};

use crate::app::App;
use crate::screens::VIEW_TTL;
use rakazo_web_proxy::ExtendControl;
use serde::Deserialize;
use serde_json::{Value, json};

use super::computers::{checkpoint_after_run, fenced_run, handle, of_bot};
use super::{Ctx, access};

/// Lifetime of a control lease unless renewed.
const CONTROL_LEASE_TTL_MS: i64 = 15 * 60 * 1000;

/// JSON form of a run.
pub fn run_json(r: &run::Model) -> Value {
    json!({ "id": r.id, "spaceId": r.space_id, "botId": r.bot_id, "computerId": r.computer_id,
            "state": r.state, "leaseFence": r.lease_fence, "takeoverRequestedAtMs": r.takeover_requested_at_ms,
            "createdAtMs": r.created_at_ms, "endedAtMs": r.ended_at_ms })
}

fn lease_json(g: &Grant) -> Value {
    serde_json::to_value(g).unwrap_or_default()
}

fn publish_run(ctx: &Ctx<'_>, r: &run::Model) {
    ctx.app.runtime().events.publish(
        &r.space_id,
        rakazo_actors::events::Topic::RunState,
        run_json(r),
    );
}

/// The configured lifetime of an execution lease (`RUN_LEASE_TTL_MS`).
pub fn lease_ttl_ms(app: &App) -> i64 {
    app.config.run_lease_ttl.as_millis() as i64
}

/// Run rules granting execution leases of the configured lifetime.
pub fn runs(app: &App) -> Runs {
    Runs::new(app.db.clone()).with_lease_ttl(lease_ttl_ms(app))
}

/// Which transport ended a run (for the log).
#[derive(Clone, Copy, Debug)]
pub enum EndedBy {
    /// `run.finish`.
    Finish,
    /// `DELETE /mcp`.
    McpDelete,
    /// An MCP session idle past `MCP_SESSION_IDLE_MS`.
    McpIdle,
    /// An MCP session whose row could not be written, so it never opened.
    McpNotOpened,
}

impl EndedBy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Finish => "finish",
            Self::McpDelete => "mcp_delete",
            Self::McpIdle => "mcp_idle",
            Self::McpNotOpened => "mcp_not_opened",
        }
    }
}

/// The one end of a run, for every transport (`run.finish`, `DELETE /mcp`, an idle MCP
/// session): end the run with `outcome` under its fence and release its lease, forget its
/// tool economy, revoke its bot's control (completion keeps the screen; failure and
/// cancelation tear it down), then checkpoint the workspace (or defer to the last bot).
/// The caller has checked that it may end this run.
pub async fn end_run(
    app: &App,
    run_id: &str,
    fence: i64,
    outcome: RunState,
    by: EndedBy,
) -> DomainResult<Value> {
    let r = Runs::new(app.db.clone())
        .finish(run_id, fence, outcome)
        .await?;
    app.tools.forget(run_id);
    app.runtime().events.publish(
        &r.space_id,
        rakazo_actors::events::Topic::RunState,
        run_json(&r),
    );
    let leases = Leases::new(app.db.clone());
    if let Some(grant) = leases
        .revoke(&LeaseKey::control(&r.computer_id, &r.bot_id))
        .await?
    {
        rakazo_actors::lease_actor::announce_control_end(
            app.runtime(),
            &r.space_id,
            &r.computer_id,
            &r.bot_id,
            grant.fence,
            "revoked",
        );
    }
    let h = app.registry.computer(&r.computer_id, &r.space_id);
    if outcome != RunState::Completed {
        app.registry
            .screen(&h, &r.bot_id)
            .send(screen::Teardown)
            .await??;
    }
    let (r, checkpoint) = match checkpoint_after_run(&h, &r.bot_id).await {
        Ok(checkpoint) => (r, checkpoint),
        // The run ended either way; its outcome says its work was not saved.
        Err(e) => {
            tracing::warn!(event = "checkpoint.failed", computer.id = %r.computer_id, code = e.code.as_str());
            let r = Runs::new(app.db.clone()).checkpoint_failed(r).await?;
            app.runtime().events.publish(
                &r.space_id,
                rakazo_actors::events::Topic::RunState,
                run_json(&r),
            );
            let failed = json!({ "failed": true, "code": e.code.as_str(), "message": e.message });
            (r, failed)
        }
    };
    tracing::info!(
        event = "run.ended",
        outcome = %r.state,
        by = by.as_str(),
        checkpoint.saved = checkpoint.get("saved").and_then(serde_json::Value::as_i64),
        checkpoint.skipped = checkpoint.get("skippedCount").and_then(serde_json::Value::as_u64)
    );
    Ok(json!({ "run": run_json(&r), "checkpoint": checkpoint }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ByBot {
    bot_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Fenced {
    run_id: String,
    fence: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Finish {
    run_id: String,
    fence: i64,
    outcome: String,
}

/// `run.start {botId}`: a run with the bot's execution lease; a second driver is refused.
pub async fn start(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let target = RunTarget {
        space_id: c.space_id.clone(),
        bot_id: p.bot_id,
        computer_id: c.id.clone(),
    };
    let (r, grant) = runs(ctx.app).start(&target).await?;
    publish_run(ctx, &r);
    Ok(json!({ "run": run_json(&r), "lease": lease_json(&grant) }))
}

/// `run.get {runId}`.
pub async fn get(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct ById {
        run_id: String,
    }
    let p: ById = super::params(params)?;
    Ok(run_json(&reachable_run(ctx, &p.run_id).await?))
}

/// `run.renew {runId, fence}`: extend the execution lease.
pub async fn renew(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Fenced = super::params(params)?;
    let (r, h) = fenced_run(ctx, &p.run_id, p.fence).await?;
    let key = LeaseKey::execution(&r.computer_id, &r.bot_id);
    let grant = h
        .leases
        .send(Renew {
            key,
            fence: p.fence,
            holder: None,
            ttl_ms: lease_ttl_ms(ctx.app),
        })
        .await??;
    Ok(lease_json(&grant))
}

/// A run the caller may act on: its bot must be reachable (`NOT_FOUND` otherwise).
async fn reachable_run(ctx: &Ctx<'_>, run_id: &str) -> DomainResult<run::Model> {
    let r = Runs::new(ctx.db().clone()).get(run_id).await?;
    access::bot(ctx.db(), ctx.caller, &r.bot_id)
        .await
        .map_err(|_| DomainError::not_found("run"))?;
    Ok(r)
}

/// `run.requestTakeover {runId, fence}`: the bot asks for a person.
pub async fn request_takeover(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Fenced = super::params(params)?;
    reachable_run(ctx, &p.run_id).await?;
    let clock = ctx.app.runtime().clock.clone();
    let r = Runs::new(ctx.db().clone())
        .with_clock(clock.clone())
        .request_takeover(&p.run_id, p.fence)
        .await?;
    // Asking for takeover restarts the idle timer.
    Computers::new(ctx.db().clone())
        .touch_at(&r.computer_id, clock.now_ms())
        .await?;
    publish_run(ctx, &r);
    Ok(run_json(&r))
}

/// `run.resume {runId, fence}`: continue after the person released control.
pub async fn resume(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Fenced = super::params(params)?;
    reachable_run(ctx, &p.run_id).await?;
    let r = Runs::new(ctx.db().clone())
        .resume(&p.run_id, p.fence)
        .await?;
    publish_run(ctx, &r);
    Ok(run_json(&r))
}

/// `run.finish {runId, fence, outcome}`: end the run through [`end_run`].
pub async fn finish(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Finish = super::params(params)?;
    let outcome = RunState::parse_outcome(&p.outcome)
        .ok_or_else(|| DomainError::invalid("outcome must be completed, failed or canceled"))?;
    // The run must be the caller's to end (and the fence its own) before anything changes.
    fenced_run(ctx, &p.run_id, p.fence).await?;
    end_run(ctx.app, &p.run_id, p.fence, outcome, EndedBy::Finish).await
}

/// `bot.stop {botId}`: cancel the bot's runs and revoke its execution lease.
pub async fn stop_bot(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let canceled = Runs::new(ctx.db().clone())
        .stop_bot(&c.id, &p.bot_id)
        .await?;
    for r in &canceled {
        publish_run(ctx, r);
    }
    if !canceled.is_empty() {
        ctx.app
            .registry
            .screen(&handle(ctx, &c), &p.bot_id)
            .send(screen::Teardown)
            .await??;
    }
    Ok(json!({ "canceled": canceled.iter().map(run_json).collect::<Vec<_>>() }))
}

/// `computer.takeControl {botId}`: an exclusive control lease on the bot's screen, and a
/// control URL bound to its fence (on providers with live screens).
pub async fn take_control(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let key = LeaseKey::control(&c.id, &p.bot_id);
    let acquire = Acquire {
        key: key.clone(),
        holder: ctx.caller.user_id.clone(),
        ttl_ms: CONTROL_LEASE_TTL_MS,
    };
    let h = handle(ctx, &c);
    // Asking again for control one already holds (a reloaded page) is not a new takeover: the
    // live grant comes back, with a fresh URL, even while the bot has since started a run.
    let held = Leases::new(ctx.db().clone())
        .live(&key)
        .await?
        .filter(|g| g.holder == ctx.caller.user_id);
    let grant = match held {
        Some(g) => g,
        None => h.leases.send(acquire).await??,
    };
    Computers::new(ctx.db().clone())
        .touch_at(&c.id, ctx.app.runtime().clock.now_ms())
        .await?;
    let issued = ctx
        .app
        .screens
        .issue(
            &ctx.app.registry,
            &c,
            &p.bot_id,
            ScreenPolicy::Control,
            grant.fence,
            grant.expires_at_ms,
        )
        .await;
    let control_url = match issued {
        Ok(url) => Some(url),
        Err(e) if e.code == ErrorCode::Unsupported => None,
        Err(e) => {
            let _ = h
                .leases
                .send(Release {
                    key,
                    fence: grant.fence,
                    holder: None,
                })
                .await;
            return Err(e);
        }
    };
    ctx.app.runtime().events.publish(
        &c.space_id,
        rakazo_actors::events::Topic::LeaseChanged,
        json!({
            "computerId": c.id, "botId": p.bot_id, "kind": "control", "fence": grant.fence,
            "holder": grant.holder, "state": "granted",
        }),
    );
    let mut out = lease_json(&grant);
    out["controlUrl"] = json!(control_url);
    Ok(out)
}

/// `bot.status {botId}`: what a client that just (re)loaded needs before live events arrive:
/// the bot's active run, who controls its screen (and whether it is the caller), and its
/// computer.
pub async fn bot_status(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let run = Runs::new(ctx.db().clone())
        .active_for_bot(&p.bot_id)
        .await?
        .into_iter()
        .max_by_key(|r| r.created_at_ms);
    let control = Leases::new(ctx.db().clone())
        .live(&LeaseKey::control(&c.id, &p.bot_id))
        .await?;
    let control = control.map(|g| {
        let mine = g.holder == ctx.caller.user_id;
        let mut v = lease_json(&g);
        v["mine"] = json!(mine);
        v
    });
    Ok(json!({
        "botId": p.bot_id,
        "run": run.as_ref().map(run_json),
        "control": control,
        "computer": super::computers::computer_json(&c, ctx.caller),
    }))
}

/// `computer.screenUrl {botId}`: a view URL of the bot's screen, for anyone in the space.
pub async fn screen_url(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let expires = rakazo_actors::clock::now_ms() + VIEW_TTL.as_millis() as i64;
    let url = ctx
        .app
        .screens
        .issue(
            &ctx.app.registry,
            &c,
            &p.bot_id,
            ScreenPolicy::View,
            0,
            expires,
        )
        .await?;
    Ok(serde_json::to_value(url).unwrap_or_default())
}

/// `computer.terminalUrl {botId}`: the terminal websocket of the bot's computer for the
/// person holding control of its screen, under the same control capability (bound to the
/// lease's fence; ends with it). Refused with `CONTROL_REQUIRED` without control.
pub async fn terminal_url(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: ByBot = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let live = Leases::new(ctx.db().clone())
        .live(&LeaseKey::control(&c.id, &p.bot_id))
        .await?;
    let Some(grant) = live.filter(|g| g.holder == ctx.caller.user_id) else {
        return Err(DomainError::code(ErrorCode::ControlRequired));
    };
    let url = ctx
        .app
        .screens
        .terminal(
            &ctx.app.registry,
            &c,
            &p.bot_id,
            grant.fence,
            grant.expires_at_ms,
        )
        .await?;
    Ok(serde_json::to_value(url).unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReleaseControl {
    bot_id: String,
    fence: i64,
}

/// `computer.renewControl {botId, fence}`: the person holding control keeps it (another
/// `CONTROL_LEASE_TTL_MS` from now); its live screen and terminal sockets stay open with it.
/// A stale fence is `LEASE_FENCED`; someone else's lease is `CONTROL_HELD`.
pub async fn renew_control(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: ReleaseControl = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let key = LeaseKey::control(&c.id, &p.bot_id);
    let live = Leases::new(ctx.db().clone()).live(&key).await?;
    if live.is_some_and(|g| g.fence == p.fence && g.holder != ctx.caller.user_id) {
        return Err(DomainError::code(ErrorCode::ControlHeld));
    }
    let grant = handle(ctx, &c)
        .leases
        .send(Renew {
            key,
            fence: p.fence,
            // In the statement too: a grant taken by someone else since the look above is
            // never extended.
            holder: Some(ctx.caller.user_id.clone()),
            ttl_ms: CONTROL_LEASE_TTL_MS,
        })
        .await??;
    let extended = ctx
        .app
        .screens
        .gateway()
        .send(ExtendControl {
            computer_id: c.id.clone(),
            bot_id: p.bot_id.clone(),
            fence: grant.fence.max(0) as u64,
            expires_at_ms: grant.expires_at_ms.max(0) as u64,
        })
        .await
        .unwrap_or(0);
    tracing::debug!(event = "screen.control_renewed", sockets = extended);
    ctx.app.runtime().events.publish(
        &c.space_id,
        rakazo_actors::events::Topic::LeaseChanged,
        json!({
            "computerId": c.id, "botId": p.bot_id, "kind": "control", "fence": grant.fence,
            "holder": grant.holder, "state": "renewed", "expiresAtMs": grant.expires_at_ms,
        }),
    );
    Ok(lease_json(&grant))
}

/// `computer.releaseControl {botId, fence}`: by the person holding control, or an operator;
/// someone else's lease is `CONTROL_HELD`.
pub async fn release_control(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: ReleaseControl = super::params(params)?;
    let c = of_bot(ctx, &p.bot_id).await?;
    let key = LeaseKey::control(&c.id, &p.bot_id);
    let live = Leases::new(ctx.db().clone()).live(&key).await?;
    if !ctx.caller.is_operator() && live.is_some_and(|g| g.holder != ctx.caller.user_id) {
        return Err(DomainError::code(ErrorCode::ControlHeld));
    }
    // In the statement too: a grant taken by someone else since the look above is never
    // released (an operator may release anyone's).
    let holder = (!ctx.caller.is_operator()).then(|| ctx.caller.user_id.clone());
    handle(ctx, &c)
        .leases
        .send(Release {
            key,
            fence: p.fence,
            holder,
        })
        .await??;
    Ok(json!({ "released": true }))
}
