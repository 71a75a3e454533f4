//! The computer's attributed timeline and the run replays: `activity.timeline`,
//! `activity.verify`, `run.replay`, `run.replayFrame`.

use base64::Engine;
use rakazo_actors::DomainResult;
use rakazo_actors::runs::Runs;
use rakazo_actors::timeline;
use serde::Deserialize;
use serde_json::{Value, json};

use super::computers::visible;
use super::{Ctx, access};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Timeline {
    computer_id: String,
    #[serde(default)]
    after: i64,
    limit: Option<u64>,
}

/// `activity.timeline {computerId, after?, limit?}`: entries oldest first, after a position.
pub async fn list(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Timeline = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let entries = timeline::entries(ctx.db(), &c.id, p.after, p.limit.unwrap_or(200)).await?;
    Ok(json!({ "entries": entries }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ById {
    computer_id: String,
}

/// `activity.verify {computerId}`: recompute the hash chain; names the first entry that does
/// not match.
pub async fn verify(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    let found = timeline::verify(ctx.db(), &c.id).await?;
    if !found.intact {
        tracing::warn!(event = "timeline.mismatch", computer.id = %c.id,
            position = found.first_mismatch.as_ref().map(|m| m.position));
    }
    Ok(serde_json::to_value(found).unwrap_or_default())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Replay {
    run_id: String,
}

async fn run_of(ctx: &Ctx<'_>, run_id: &str) -> DomainResult<rakazo_actors::entity::run::Model> {
    let r = Runs::new(ctx.db().clone()).get(run_id).await?;
    access::bot(ctx.db(), ctx.caller, &r.bot_id)
        .await
        .map_err(|_| rakazo_actors::DomainError::not_found("run"))?;
    Ok(r)
}

/// `run.replay {runId}`: the run's steps in order, the bot's and people's.
pub async fn replay(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Replay = super::params(params)?;
    let r = run_of(ctx, &p.run_id).await?;
    ctx.app.recorder.settled().await;
    crate::recordings::replay(ctx.db(), &r).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Frame {
    run_id: String,
    digest: String,
}

/// `run.replayFrame {runId, digest}`: one recorded frame as a base64 PNG.
pub async fn replay_frame(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Frame = super::params(params)?;
    let r = run_of(ctx, &p.run_id).await?;
    ctx.app.recorder.settled().await;
    let (png, width, height) = crate::recordings::frame_png(
        ctx.db(),
        &ctx.app.recorder,
        &ctx.app.runtime().master_key,
        &r,
        &p.digest,
    )
    .await?;
    Ok(json!({
        "digest": p.digest, "width": width, "height": height, "mimeType": "image/png",
        "data": base64::engine::general_purpose::STANDARD.encode(png),
    }))
}
