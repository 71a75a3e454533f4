//! Computers: listing, the bot's computer, commands under an execution lease, screens,
//! stop.

use rakazo_actors::checkpoint::{Outcome, Reason};
use rakazo_actors::clock::now_ms;
use rakazo_actors::computer::{CurrentMachine, SaveWorkspace, Suspend};
use rakazo_actors::computers::{Computers, EndReason};
use rakazo_actors::entity::{computer, run};
use rakazo_actors::leases::{LeaseKey, LeaseKind, Leases, judge_latest};
use rakazo_actors::registry::ComputerHandle;
use rakazo_actors::run_checks;
use rakazo_actors::screen;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Ctx, access};
use crate::auth::{Caller, Scope};

/// JSON form of a computer for a caller: the providerRef is shown to operators only, the
/// home key to people only (never to a bot token).
pub fn computer_json(c: &computer::Model, caller: &Caller) -> Value {
    let mut v = json!({
        "id": c.id, "spaceId": c.space_id, "kind": c.kind, "botId": c.bot_id,
        "providerKind": c.provider_kind, "state": c.state, "revision": c.revision,
        "provisioningFence": c.provisioning_fence, "lastActiveAtMs": c.last_active_at_ms,
        "pendingRestore": c.pending_restore_revision, "quarantined": c.quarantined,
    });
    if caller.bot_id().is_none() {
        v["homeKey"] = json!(c.home_key);
    }
    if caller.is_operator() {
        v["providerRef"] = json!(c.provider_ref);
    }
    v
}

/// The actors of a computer.
pub fn handle(ctx: &Ctx<'_>, c: &computer::Model) -> ComputerHandle {
    ctx.app.registry.computer(&c.id, &c.space_id)
}

/// The computer of a bot (created on first need).
pub async fn of_bot(ctx: &Ctx<'_>, bot_id: &str) -> DomainResult<computer::Model> {
    let (b, s) = access::bot(ctx.db(), ctx.caller, bot_id).await?;
    Computers::new(ctx.db().clone())
        .for_bot(&b, &s.owner_id)
        .await
}

/// A computer the caller may see.
pub async fn visible(ctx: &Ctx<'_>, computer_id: &str) -> DomainResult<computer::Model> {
    let c = Computers::new(ctx.db().clone()).get(computer_id).await?;
    access::space(ctx.db(), ctx.caller, &c.space_id)
        .await
        .map_err(|_| DomainError::not_found("computer"))?;
    if !access::bot_reaches(ctx.db(), ctx.caller, &c).await? {
        return Err(DomainError::not_found("computer"));
    }
    Ok(c)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ById {
    computer_id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ByBot {
    bot_id: String,
}

/// `computer.get {computerId}`.
pub async fn get(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ById = super::params(params)?;
    Ok(computer_json(
        &visible(ctx, &p.computer_id).await?,
        ctx.caller,
    ))
}

/// `computer.list {spaceId}`.
pub async fn list(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: super::spaces::InSpace = super::params(params)?;
    let s = access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    let rows = Computers::new(ctx.db().clone()).in_space(&s.id).await?;
    Ok(Value::Array(
        rows.iter().map(|c| computer_json(c, ctx.caller)).collect(),
    ))
}

/// `computer.forBot {botId}`: the bot's computer, created on first need.
pub async fn for_bot(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByBot = super::params(params)?;
    Ok(computer_json(&of_bot(ctx, &p.bot_id).await?, ctx.caller))
}

/// The run behind a `{runId, fence}` pair, with its fence checked through the lease actor.
pub async fn fenced_run(
    ctx: &Ctx<'_>,
    run_id: &str,
    fence: i64,
) -> DomainResult<(run::Model, ComputerHandle)> {
    let f = fenced_tool_run(ctx, run_id, fence).await?;
    Ok((f.run, f.handle))
}

/// A run whose fence holds, with its computer's actors and where its bot works.
pub struct FencedRun {
    /// The run.
    pub run: run::Model,
    /// Its computer's actors.
    pub handle: ComputerHandle,
    /// Its computer's row as the checks read it (the computer actor's first operation takes
    /// it instead of reading it again).
    pub computer: computer::Model,
    /// Whether its bot works on a Team Computer (its shell starts in `bots/<id>`).
    pub team: bool,
}

/// [`fenced_run`], with what the checks read. Everything is read in one statement
/// ([`run_checks::read`]), and judged in the order a caller is owed: the run and access to
/// its bot (`NOT_FOUND`), then the run's own fence, then the computer, then the lease.
pub async fn fenced_tool_run(ctx: &Ctx<'_>, run_id: &str, fence: i64) -> DomainResult<FencedRun> {
    let unreachable = || DomainError::not_found("run");
    let member_of = matches!(ctx.caller.scope, Scope::User).then_some(ctx.caller.user_id.as_str());
    let checks = run_checks::read(ctx.db(), run_id, member_of)
        .await?
        .ok_or_else(unreachable)?;
    let run = checks.run;
    let bot = checks.bot.ok_or_else(unreachable)?;
    let reached = checks.space_found
        && access::space_reached(ctx.caller, &run.space_id, checks.member)
        && ctx
            .caller
            .bot_id()
            .is_none_or(|scoped| scoped == run.bot_id)
        && bot.space_id == run.space_id;
    if !reached {
        return Err(unreachable());
    }
    if let Some(refused) = rakazo_actors::runs::fence_refusal(&run, fence) {
        return Err(refused);
    }
    let computer = checks
        .computer
        .ok_or_else(|| DomainError::not_found("computer"))?;
    judge_latest(LeaseKind::Execution, checks.lease, fence, now_ms())?;
    Ok(FencedRun {
        handle: handle(ctx, &computer),
        run,
        computer,
        team: bot.computer_mode == "team",
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Exec {
    run_id: String,
    fence: i64,
    command: String,
    #[serde(default)]
    cwd: String,
    timeout_ms: Option<u64>,
}

/// `computer.exec {runId, fence, command, cwd?, timeoutMs?}`: a shell command on the bot's
/// computer under its execution lease (the `shell` tool, with the whole output).
pub async fn exec(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Exec = super::params(params)?;
    let fenced = fenced_tool_run(ctx, &p.run_id, p.fence).await?;
    let tcx = crate::tools::ToolCtx::new(ctx.app, fenced, false, None);
    let out = crate::tools::shell_recorded(&tcx, p.command, Some(p.cwd), p.timeout_ms).await?;
    Ok(serde_json::to_value(out).unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Fenced {
    run_id: String,
    fence: i64,
}

/// `computer.openScreen {runId, fence}`: the bot's screen (display slot and generation).
pub async fn open_screen(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Fenced = super::params(params)?;
    let (run, h) = fenced_run(ctx, &p.run_id, p.fence).await?;
    let state = ctx
        .app
        .registry
        .screen(&h, &run.bot_id)
        .send(screen::Open)
        .await??;
    Ok(serde_json::to_value(state).unwrap_or_default())
}

/// `computer.machine {computerId}`: operators see the machine the actor holds right now.
pub async fn machine(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    if !ctx.caller.is_operator() {
        return Err(DomainError::new(ErrorCode::Forbidden, "operators only"));
    }
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let current = handle(ctx, &c).computer.send(CurrentMachine).await?;
    Ok(json!({ "providerRef": current.map(|r| r.0) }))
}

/// `computer.stop {computerId}`: checkpoint, then stop the machine. Refused under a
/// maintenance reservation. A bot token stops only its own private computer, never the Team
/// Computer other bots use.
pub async fn stop(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    if ctx.caller.bot_id().is_some() && c.kind == "team" {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "a bot token cannot stop a Team Computer",
        ));
    }
    if Leases::new(ctx.db().clone())
        .live(&LeaseKey::maintenance(&c.id))
        .await?
        .is_some()
    {
        return Err(DomainError::code(ErrorCode::ComputerReserved));
    }
    handle(ctx, &c)
        .computer
        .send(Suspend(EndReason::Stopped))
        .await??;
    Ok(computer_json(
        &Computers::new(ctx.db().clone()).get(&c.id).await?,
        ctx.caller,
    ))
}

/// How many skipped entries a checkpoint result lists (`skippedCount` is always whole).
const SKIPPED_LISTED: usize = 100;

/// Checkpoint after a run ended; the result says saved (revision), deferred or nothing to do.
pub async fn checkpoint_after_run(h: &ComputerHandle, bot_id: &str) -> DomainResult<Value> {
    let outcome = h
        .computer
        .send(SaveWorkspace(Reason::RunEnded {
            bot_id: bot_id.into(),
        }))
        .await??;
    Ok(match outcome {
        Some(Outcome::Saved(revision, skipped)) if !skipped.is_empty() => json!({
            "saved": revision,
            "skipped": &skipped[..skipped.len().min(SKIPPED_LISTED)],
            "skippedCount": skipped.len(),
        }),
        Some(Outcome::Saved(revision, _)) => json!({ "saved": revision }),
        Some(Outcome::Unchanged(revision)) => json!({ "saved": revision, "unchanged": true }),
        Some(Outcome::Deferred) => json!({ "deferred": true }),
        // No machine runs (none was started, or it was lost): nothing new to save.
        None => json!({ "noMachine": true }),
    })
}
