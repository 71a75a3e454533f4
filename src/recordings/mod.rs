//! Run recordings: every `computer_observe` and `computer_act` of a run is a step (its action
//! batch with the target coordinates, its result, and the frame the bot then saw), ordered by
//! its entry in the computer's timeline. A frame is sealed under a key derived from the
//! computer's data key (wrapped by its space's content key) and stored once per run by its
//! digest. Recordings are kept `RECORDING_RETENTION_DAYS`, frames up to
//! `RECORDING_MAX_RUN_BYTES` per run, and are deleted with their computer. People's control
//! sessions are recorded on the same store when the operator turns it on ([`control`]).

pub mod calls;
pub mod control;
mod replay;
mod retention;

use std::sync::Arc;

use dashmap::DashMap;
use rakazo_actors::entity::{recording_frame, recording_step, run};
use rakazo_actors::provider::{Action, Frame};
use rakazo_actors::timeline;
use rakazo_actors::{DomainError, DomainResult, ErrorCode, keys};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect, Set,
};
use serde_json::{Value, json};

pub use replay::{frame_png, open_stored, replay};
pub use retention::{RETENTION_EVERY, spawn_retention, sweep};

use crate::stores::seal::{self, Binding};

/// Longest wait of [`Recorder::settled`].
pub const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The key-derivation context of recording keys (never the workspace's own key).
const RECORDING_KEY_CONTEXT: &str = "rakazo 2026-12 run recording frame key v1";

/// Keys and settings of this process's recorder.
#[derive(Clone)]
pub struct Recorder {
    /// Recording keys by computer id (a computer id is never reused).
    keys: Arc<DashMap<String, ([u8; 32], String)>>,
    /// Days kept (0: nothing is recorded).
    pub retention_days: u32,
    /// Sealed frame bytes kept per run.
    pub max_run_bytes: u64,
    /// Recordings handed to the background and not yet stored: `run.replay` waits for them.
    pending: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Recorder {
    /// A recorder with these limits.
    pub fn new(retention_days: u32, max_run_bytes: u64) -> Self {
        Self {
            keys: Arc::default(),
            retention_days,
            max_run_bytes,
            pending: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }

    /// Count one recording handed to the background; [`Recorder::done`] when it is stored.
    fn begin(&self) {
        self.pending.send_modify(|n| *n += 1);
    }

    fn done(&self) {
        self.pending.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Waits (at most [`SETTLE_WAIT`]) until every recording handed to the background so far
    /// is stored.
    pub async fn settled(&self) {
        let mut rx = self.pending.subscribe();
        let _ = tokio::time::timeout(SETTLE_WAIT, rx.wait_for(|n| *n == 0)).await;
    }

    /// Whether runs are recorded.
    pub fn enabled(&self) -> bool {
        self.retention_days > 0
    }

    /// A computer's recording key and storage id.
    pub async fn key(
        &self,
        db: &DatabaseConnection,
        master: &keys::KeyBytes,
        computer_id: &str,
    ) -> DomainResult<([u8; 32], String)> {
        if let Some(k) = self.keys.get(computer_id) {
            return Ok(k.clone());
        }
        let data = keys::data_key(db, master, computer_id).await?;
        let row = rakazo_actors::computers::Computers::new(db.clone())
            .get(computer_id)
            .await?;
        let key = (
            blake3::derive_key(RECORDING_KEY_CONTEXT, &data),
            row.storage_id,
        );
        self.keys.insert(computer_id.to_owned(), key.clone());
        Ok(key)
    }
}

/// The name a frame is sealed under: it binds the frame to its run and digest, so a frame of
/// another run or computer does not open in its place.
fn sealed_name(run_id: &str, digest: &str) -> String {
    format!(
        "rec-{}",
        blake3::hash(format!("{run_id}/{digest}").as_bytes()).to_hex()
    )
}

/// What a recorded step did.
pub struct Step<'a> {
    /// The run.
    pub run: &'a run::Model,
    /// `computer_observe` or `computer_act`.
    pub tool: &'a str,
    /// The batch, for `computer_act`.
    pub actions: Option<&'a [Action]>,
    /// The result (completed, total, the stop).
    pub result: Value,
    /// The frame the bot saw after it (owned: the background store takes it as it is).
    pub frame: Frame,
    /// The frame's digest.
    pub digest: &'a str,
}

/// The batch as stored: typed text and key names redacted like the activity feed.
fn stored_actions(actions: &[Action]) -> Value {
    timeline::redact_value(&serde_json::to_value(actions).unwrap_or_default())
}

/// Bytes a run's recording holds.
async fn run_bytes(db: &DatabaseConnection, run_id: &str) -> DomainResult<i64> {
    let sizes: Vec<i64> = recording_step::Entity::find()
        .select_only()
        .column(recording_step::Column::Bytes)
        .filter(recording_step::Column::RunId.eq(run_id))
        .into_tuple()
        .all(db)
        .await?;
    Ok(sizes.into_iter().sum())
}

/// The step's entry in the computer's timeline, and its actions as stored.
async fn append_call(
    db: &DatabaseConnection,
    step: &Step<'_>,
) -> DomainResult<(timeline::EntryJson, Option<Value>)> {
    let run = step.run;
    let actions = step.actions.map(stored_actions);
    let detail = json!({ "actions": actions, "result": step.result, "frameDigest": step.digest });
    let entry = timeline::append(db, calls::entry(run, step.tool, detail)).await?;
    Ok((entry, actions))
}

/// Put a step in the computer's timeline (always) and in the run's recording (when runs are
/// recorded): its frame sealed once per run, under the size cap.
pub async fn record(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    step: Step<'_>,
) -> DomainResult<i64> {
    let (entry, actions) = append_call(db, &step).await?;
    if !recorder.enabled() {
        return Ok(entry.position);
    }
    store(
        db,
        recorder,
        master,
        &step,
        actions,
        entry.position,
        entry.created_at_ms,
    )
    .await?;
    Ok(entry.position)
}

/// Like [`record`], but only the timeline entry is written before it returns: sealing and
/// storing the frame and the step go on in the background (counted, so `run.replay` waits for
/// them), off the tool's answer.
pub async fn record_in_background(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    step: Step<'_>,
) -> DomainResult<i64> {
    let run = step.run;
    let (entry, actions) = append_call(db, &step).await?;
    if !recorder.enabled() {
        return Ok(entry.position);
    }
    let (db, recorder, master) = (db.clone(), recorder.clone(), *master);
    let (r, tool, result, frame, digest) = (
        run.clone(),
        step.tool.to_owned(),
        step.result,
        step.frame,
        step.digest.to_owned(),
    );
    recorder.begin();
    tokio::spawn(async move {
        let step = Step {
            run: &r,
            tool: &tool,
            actions: None,
            result,
            frame,
            digest: &digest,
        };
        if let Err(e) = store(
            &db,
            &recorder,
            &master,
            &step,
            actions,
            entry.position,
            entry.created_at_ms,
        )
        .await
        {
            tracing::warn!(event = "recording.step_failed", run.id = %r.id, code = e.code.as_str());
        }
        recorder.done();
    });
    Ok(entry.position)
}

/// Store a frame of a recording (a run, or a control session) sealed, once per recording by
/// its digest and under the size cap. Answers the digest the step may name (none when the cap
/// left no room) and the bytes it added.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn store_frame(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    recording_id: &str,
    computer_id: &str,
    frame: &Frame,
    digest: &str,
    at_ms: i64,
) -> DomainResult<(Option<String>, i64)> {
    let stored = recording_frame::Entity::find_by_id((recording_id.to_owned(), digest.to_owned()))
        .select_only()
        .column(recording_frame::Column::Digest)
        .into_tuple::<String>()
        .one(db)
        .await?
        .is_some();
    if stored {
        return Ok((Some(digest.to_owned()), 0));
    }
    let (key, storage_id) = recorder.key(db, master, computer_id).await?;
    let name = sealed_name(recording_id, digest);
    let room = recorder.max_run_bytes as i64 - run_bytes(db, recording_id).await?;
    let sealed_len = seal::sealed_len(&Binding::chunk(&storage_id, &name), frame.png.len());
    if (sealed_len as i64) > room {
        tracing::info!(event = "recording.cap_reached", recording.id = %recording_id);
        return Ok((None, 0));
    }
    let sealed = seal::seal(&key, &Binding::chunk(&storage_id, &name), &frame.png);
    let bytes = sealed.len() as i64;
    recording_frame::Entity::insert(recording_frame::ActiveModel {
        run_id: Set(recording_id.to_owned()),
        digest: Set(digest.to_owned()),
        computer_id: Set(computer_id.to_owned()),
        width: Set(frame.width as i32),
        height: Set(frame.height as i32),
        sealed: Set(sealed),
        created_at_ms: Set(at_ms),
    })
    .on_conflict(
        sea_orm::sea_query::OnConflict::columns([
            recording_frame::Column::RunId,
            recording_frame::Column::Digest,
        ])
        .do_nothing()
        .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok((Some(digest.to_owned()), bytes))
}

/// Store a step and, once per run, its frame sealed (under the size cap).
async fn store(
    db: &DatabaseConnection,
    recorder: &Recorder,
    master: &keys::KeyBytes,
    step: &Step<'_>,
    actions: Option<Value>,
    position: i64,
    at_ms: i64,
) -> DomainResult<()> {
    let run = step.run;
    let (frame_digest, bytes) = store_frame(
        db,
        recorder,
        master,
        &run.id,
        &run.computer_id,
        &step.frame,
        step.digest,
        at_ms,
    )
    .await?;
    recording_step::ActiveModel {
        id: Set(rakazo_actors::clock::new_id()),
        run_id: Set(run.id.clone()),
        computer_id: Set(run.computer_id.clone()),
        bot_id: Set(run.bot_id.clone()),
        timeline_position: Set(position),
        tool: Set(step.tool.into()),
        actions: Set(actions.map(|a| a.to_string())),
        result: Set(step.result.to_string()),
        frame_digest: Set(frame_digest),
        bytes: Set(bytes),
        created_at_ms: Set(at_ms),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// Open a sealed frame.
pub fn open_frame(
    key: &[u8; 32],
    storage_id: &str,
    run_id: &str,
    digest: &str,
    sealed: &[u8],
) -> DomainResult<Vec<u8>> {
    let name = sealed_name(run_id, digest);
    seal::open(key, &Binding::chunk(storage_id, &name), sealed).map_err(|e| {
        tracing::warn!(event = "recording.frame_unreadable", run.id = %run_id, error = %e);
        DomainError::new(ErrorCode::Internal, "a recorded frame failed to open")
    })
}
