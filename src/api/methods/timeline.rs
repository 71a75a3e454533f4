//! The computer's attributed timeline and the replays: `activity.timeline`,
//! `activity.verify`, `run.replay`, `run.replayFrame`, and the screen recordings of control
//! sessions, `control.replay` and `control.replayFrame`.

use base64::Engine;
use rakazo_actors::DomainResult;
use rakazo_actors::runs::Runs;
use rakazo_actors::timeline;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
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

/// The computer whose timeline the caller may read: a visible computer, or a deleted one's
/// (its timeline stays, recording its deletion) for the operator and the people of the space
/// that held it. Anything else is `NOT_FOUND`, as if it never existed.
async fn timeline_of(ctx: &Ctx<'_>, computer_id: &str) -> DomainResult<String> {
    let err = match visible(ctx, computer_id).await {
        Ok(c) => return Ok(c.id),
        Err(e) => e,
    };
    let gone = rakazo_actors::entity::computer::Entity::find_by_id(computer_id)
        .one(ctx.db())
        .await?
        .is_none();
    if !gone {
        return Err(err);
    }
    use rakazo_actors::entity::timeline_entry;
    let Some(first) = timeline_entry::Entity::find()
        .filter(timeline_entry::Column::ComputerId.eq(computer_id))
        .one(ctx.db())
        .await?
    else {
        return Err(err);
    };
    if !ctx.caller.is_operator() {
        access::space(ctx.db(), ctx.caller, &first.space_id)
            .await
            .map_err(|_| err)?;
    }
    Ok(computer_id.to_owned())
}

/// `activity.timeline {computerId, after?, limit?}`: entries oldest first, after a position.
pub async fn list(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Timeline = super::params(params)?;
    let id = timeline_of(ctx, &p.computer_id).await?;
    let entries = timeline::entries(ctx.db(), &id, p.after, p.limit.unwrap_or(200)).await?;
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
    let id = timeline_of(ctx, &p.computer_id).await?;
    let found = timeline::verify(ctx.db(), &id).await?;
    if !found.intact {
        tracing::warn!(event = "timeline.mismatch", computer.id = %id,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Recording {
    recording_id: String,
}

/// The computer of a control session's recording, if the caller may see it (else the
/// recording is `NOT_FOUND`, whether or not it exists).
async fn recording_of(ctx: &Ctx<'_>, recording_id: &str) -> DomainResult<String> {
    let computer_id = crate::recordings::control::computer_of(ctx.db(), recording_id).await?;
    visible(ctx, &computer_id)
        .await
        .map_err(|_| rakazo_actors::DomainError::not_found("recording"))?;
    Ok(computer_id)
}

/// `control.replay {recordingId}`: the frames of a control session's screen recording, in
/// order (the id is in the session's `control.session` timeline entry).
pub async fn control_replay(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Recording = super::params(params)?;
    recording_of(ctx, &p.recording_id).await?;
    crate::recordings::control::replay(ctx.db(), &p.recording_id).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RecordingFrame {
    recording_id: String,
    digest: String,
}

/// `control.replayFrame {recordingId, digest}`: one frame of a control session's recording
/// as a base64 PNG.
pub async fn control_replay_frame(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: RecordingFrame = super::params(params)?;
    let computer_id = recording_of(ctx, &p.recording_id).await?;
    let (png, width, height) = crate::recordings::open_stored(
        ctx.db(),
        &ctx.app.recorder,
        &ctx.app.runtime().master_key,
        &p.recording_id,
        &computer_id,
        &p.digest,
    )
    .await?;
    Ok(json!({
        "digest": p.digest, "width": width, "height": height, "mimeType": "image/png",
        "data": base64::engine::general_purpose::STANDARD.encode(png),
    }))
}
