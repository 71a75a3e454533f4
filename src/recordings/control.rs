//! Screen recordings of people's control sessions (`RECORD_CONTROL_SESSIONS`): while a
//! control socket of a bot's screen is open, the screen is sampled every [`SAMPLE_EVERY`] (and
//! once more when it closes); a sample that differs from the one before is a step of the
//! session's recording, its frame sealed and stored once per recording by its digest, on the
//! run recordings' store (same key, size cap, retention, and deletion with the computer).
//! Only frames are kept: never the input, never typed text. The session's `control.session`
//! timeline entry names its recording (`recording: {id, frames, bytes, capped}`).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rakazo_actors::computer::{Call, Op, OpOutput};
use rakazo_actors::entity::{computer, recording_frame, recording_step};
use rakazo_actors::provider::FrameSize;
use rakazo_actors::registry::Registry;
use rakazo_actors::{DomainError, DomainResult, keys};
use rakazo_web_proxy::gateway::SocketKind;
use rakazo_web_proxy::{ControlSession, SessionStart};
use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use sea_orm::{QueryOrder, Set};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Recorder;

/// How often a control session's screen is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The tool name of a control session's recorded frame.
pub const FRAME_STEP: &str = "control.frame";

/// Longest wait for a session's last frame when it ends.
const FINISH_WAIT: Duration = Duration::from_secs(10);

/// The recording id of a control session (never a run id: those carry no `ctl_`).
pub fn recording_id(session_id: &str) -> String {
    format!("ctl_{session_id}")
}

/// What a finished recording holds.
#[derive(Clone, Copy, Debug, Default)]
struct Summary {
    frames: u64,
    bytes: i64,
    capped: bool,
}

struct Live {
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<Summary>,
}

/// Records the screens of control sessions while their sockets are open.
#[derive(Clone)]
pub struct ControlRecorder {
    db: DatabaseConnection,
    registry: Arc<Registry>,
    recorder: Recorder,
    every: Duration,
    live: Arc<DashMap<String, Live>>,
}

impl ControlRecorder {
    /// A recorder sampling every `every`, storing through `recorder`.
    pub fn new(
        db: DatabaseConnection,
        registry: Arc<Registry>,
        recorder: Recorder,
        every: Duration,
    ) -> Self {
        Self {
            db,
            registry,
            recorder,
            every,
            live: Arc::default(),
        }
    }

    /// A control socket opened: a screen's starts being recorded.
    pub fn started(&self, s: SessionStart) {
        if s.socket != SocketKind::Screen || !self.recorder.enabled() {
            return;
        }
        let (stop, stopped) = watch::channel(false);
        let this = self.clone();
        let id = s.id.clone();
        let done = actix_rt::spawn(async move { this.sample(s, stopped).await });
        self.live.insert(id, Live { stop, done });
    }

    /// A control socket closed: its recording ends (with one last frame); answers what the
    /// timeline entry says of it.
    pub async fn ended(&self, s: &ControlSession) -> Option<Value> {
        let (_, live) = self.live.remove(&s.id)?;
        let _ = live.stop.send(true);
        let summary = match tokio::time::timeout(FINISH_WAIT, live.done).await {
            Ok(Ok(summary)) => summary,
            _ => return None,
        };
        tracing::info!(event = "recording.control_session", computer.id = %s.computer_id,
            frames = summary.frames, bytes = summary.bytes, capped = summary.capped);
        Some(json!({
            "id": recording_id(&s.id), "frames": summary.frames, "bytes": summary.bytes,
            "capped": summary.capped,
        }))
    }

    async fn sample(self, s: SessionStart, mut stopped: watch::Receiver<bool>) -> Summary {
        let mut summary = Summary::default();
        let Ok(Some(c)) = computer::Entity::find_by_id(&s.computer_id)
            .one(&self.db)
            .await
        else {
            return summary;
        };
        let handle = self.registry.computer(&c.id, &c.space_id);
        let master = self.registry.runtime().master_key;
        let id = recording_id(&s.id);
        let mut last: Option<String> = None;
        loop {
            let stopping = *stopped.borrow();
            match handle
                .computer
                .send(Call(Op::Observe(s.bot_id.clone(), FrameSize::FULL)))
                .await
            {
                Ok(Ok(OpOutput::Frame(frame))) => {
                    let digest = crate::tools::frame_digest(&frame.png);
                    if last.as_deref() != Some(digest.as_str()) {
                        match self
                            .keep(&master, &id, &s, &frame, &digest, summary.frames)
                            .await
                        {
                            Ok(Some(bytes)) => {
                                summary.frames += 1;
                                summary.bytes += bytes;
                                last = Some(digest);
                            }
                            Ok(None) => {
                                summary.capped = true;
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(event = "recording.control_frame_failed",
                                    computer.id = %s.computer_id, code = e.code.as_str());
                            }
                        }
                    }
                }
                _ => {
                    tracing::debug!(event = "recording.control_frame_missed", computer.id = %s.computer_id);
                }
            }
            if stopping {
                break;
            }
            tokio::select! {
                changed = stopped.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = tokio::time::sleep(self.every) => {}
            }
        }
        summary
    }

    /// Store one sampled frame as the recording's next step; answers the bytes it added, or
    /// none when the size cap left no room.
    async fn keep(
        &self,
        master: &keys::KeyBytes,
        id: &str,
        s: &SessionStart,
        frame: &rakazo_actors::provider::Frame,
        digest: &str,
        index: u64,
    ) -> DomainResult<Option<i64>> {
        let at_ms = rakazo_web_proxy::sessions::now_ms();
        let (stored, bytes) = super::store_frame(
            &self.db,
            &self.recorder,
            master,
            id,
            &s.computer_id,
            frame,
            digest,
            at_ms,
        )
        .await?;
        let Some(stored) = stored else {
            return Ok(None);
        };
        recording_step::ActiveModel {
            id: Set(rakazo_actors::clock::new_id()),
            run_id: Set(id.to_owned()),
            computer_id: Set(s.computer_id.clone()),
            bot_id: Set(s.bot_id.clone()),
            timeline_position: Set(index as i64),
            tool: Set(FRAME_STEP.into()),
            actions: Set(None),
            result: Set("{}".into()),
            frame_digest: Set(Some(stored)),
            bytes: Set(bytes),
            created_at_ms: Set(at_ms),
        }
        .insert(&self.db)
        .await?;
        Ok(Some(bytes))
    }
}

/// The computer a control session's recording belongs to (none for anything else, a run's
/// recording included).
pub async fn computer_of(db: &DatabaseConnection, recording_id: &str) -> DomainResult<String> {
    let missing = || DomainError::not_found("recording");
    if !recording_id.starts_with("ctl_") {
        return Err(missing());
    }
    recording_step::Entity::find()
        .filter(recording_step::Column::RunId.eq(recording_id))
        .one(db)
        .await?
        .map(|s| s.computer_id)
        .ok_or_else(missing)
}

/// A control session's recording: its frames in order, each with when it was seen.
pub async fn replay(db: &DatabaseConnection, recording_id: &str) -> DomainResult<Value> {
    let steps = recording_step::Entity::find()
        .filter(recording_step::Column::RunId.eq(recording_id))
        .order_by_asc(recording_step::Column::TimelinePosition)
        .all(db)
        .await?;
    let frames = recording_frame::Entity::find()
        .filter(recording_frame::Column::RunId.eq(recording_id))
        .all(db)
        .await?;
    let Some(first) = steps.first() else {
        return Err(DomainError::not_found("recording"));
    };
    let shown: Vec<Value> = steps
        .iter()
        .filter_map(|s| {
            let digest = s.frame_digest.as_ref()?;
            let f = frames.iter().find(|f| &f.digest == digest)?;
            Some(json!({ "digest": digest, "width": f.width, "height": f.height, "atMs": s.created_at_ms }))
        })
        .collect();
    Ok(json!({
        "recordingId": recording_id, "computerId": first.computer_id, "botId": first.bot_id,
        "frames": shown, "bytes": steps.iter().map(|s| s.bytes).sum::<i64>(),
    }))
}
