//! `run.replay`: a run's steps in timeline order, the bot's recorded steps and the control
//! sessions people held on its screen meanwhile; and the frames behind them.

use rakazo_actors::entity::{recording_frame, recording_step, run};
use rakazo_actors::{DomainError, DomainResult, keys, timeline};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};

use super::{Recorder, open_frame};

fn parsed(text: Option<&str>) -> Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null)
}

/// The steps of a run, oldest first: `{position, actor, ...}` for the bot's observations and
/// action batches and for people's control sessions of its screen during the run.
pub async fn replay(db: &DatabaseConnection, r: &run::Model) -> DomainResult<Value> {
    let steps = recording_step::Entity::find()
        .filter(recording_step::Column::RunId.eq(&r.id))
        .order_by_asc(recording_step::Column::TimelinePosition)
        .all(db)
        .await?;
    let frames: Vec<(String, i32, i32)> = recording_frame::Entity::find()
        .filter(recording_frame::Column::RunId.eq(&r.id))
        .all(db)
        .await?
        .into_iter()
        .map(|f| (f.digest, f.width, f.height))
        .collect();
    let frame_of = |digest: &Option<String>| {
        digest
            .as_ref()
            .and_then(|d| frames.iter().find(|f| &f.0 == d))
            .map(|(digest, width, height)| json!({ "digest": digest, "width": width, "height": height }))
    };
    let mut out: Vec<(i64, Value)> = steps
        .iter()
        .map(|s| {
            (
                s.timeline_position,
                json!({
                    "position": s.timeline_position, "actor": "bot", "actorId": s.bot_id,
                    "kind": "tool.call", "tool": s.tool,
                    "actions": parsed(s.actions.as_deref()), "result": parsed(Some(&s.result)),
                    "frame": frame_of(&s.frame_digest), "atMs": s.created_at_ms,
                }),
            )
        })
        .collect();
    for c in timeline::control_sessions(
        db,
        &r.computer_id,
        &r.bot_id,
        r.created_at_ms,
        r.ended_at_ms,
    )
    .await?
    {
        out.push((
            c.position,
            json!({
                "position": c.position, "actor": c.actor, "actorId": c.actor_id,
                "kind": c.kind, "session": c.detail, "atMs": c.created_at_ms,
            }),
        ));
    }
    out.sort_by_key(|(p, _)| *p);
    let bytes: i64 = steps.iter().map(|s| s.bytes).sum();
    Ok(json!({
        "run": crate::api::methods::run_json(r),
        "steps": out.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "frames": frames.len(),
        "bytes": bytes,
    }))
}

/// A recorded frame of a run, opened: its PNG, width and height.
pub async fn frame_png(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    r: &run::Model,
    digest: &str,
) -> DomainResult<(Vec<u8>, i32, i32)> {
    open_stored(db, recorder, master, &r.id, &r.computer_id, digest).await
}

/// A stored frame of a recording (a run or a control session) of a computer, opened: its
/// PNG, width and height.
pub async fn open_stored(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    recording_id: &str,
    computer_id: &str,
    digest: &str,
) -> DomainResult<(Vec<u8>, i32, i32)> {
    let row = recording_frame::Entity::find_by_id((recording_id.to_owned(), digest.to_owned()))
        .one(db)
        .await?
        .filter(|f| f.computer_id == computer_id)
        .ok_or_else(|| DomainError::not_found("frame"))?;
    let (key, storage_id) = recorder.key(db, master, computer_id).await?;
    let png = open_frame(&key, &storage_id, recording_id, digest, &row.sealed)?;
    Ok((png, row.width, row.height))
}
