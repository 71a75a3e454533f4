//! Control sessions into the computer's timeline: the proxy reports each control socket when
//! it opens and when it closes; the person is the holder of the control grant its capability
//! names. With `RECORD_CONTROL_SESSIONS` a screen's session is recorded meanwhile, and its
//! entry names the recording.

use rakazo_actors::entity::{computer, lease};
use rakazo_actors::timeline::{self, Actor, NewEntry};
use rakazo_web_proxy::gateway::SocketKind;
use rakazo_web_proxy::{ControlSession, SessionNotes, SessionStart};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use serde_json::json;

/// Notes control sessions in the timeline of their computer.
pub struct TimelineNotes {
    /// The database.
    pub db: DatabaseConnection,
    /// Records the screen of control sessions (`RECORD_CONTROL_SESSIONS`).
    pub recording: Option<crate::recordings::control::ControlRecorder>,
}

impl SessionNotes for TimelineNotes {
    fn control_session_started(&self, session: SessionStart) {
        if let Some(r) = &self.recording {
            r.started(session);
        }
    }

    fn control_session_ended(&self, session: ControlSession) {
        let db = self.db.clone();
        let recording = self.recording.clone();
        actix_rt::spawn(async move {
            let recorded = match &recording {
                Some(r) => r.ended(&session).await,
                None => None,
            };
            if let Err(e) = note(&db, &session, recorded).await {
                tracing::warn!(event = "timeline.control_session_failed", computer.id = %session.computer_id,
                    code = e.code.as_str());
            }
        });
    }
}

/// The entry of one control session.
pub async fn note(
    db: &DatabaseConnection,
    s: &ControlSession,
    recording: Option<serde_json::Value>,
) -> rakazo_actors::DomainResult<()> {
    let Some(c) = computer::Entity::find_by_id(&s.computer_id).one(db).await? else {
        return Ok(());
    };
    let grant = lease::Entity::find()
        .filter(lease::Column::ComputerId.eq(&s.computer_id))
        .filter(lease::Column::Kind.eq("control"))
        .filter(lease::Column::Subject.eq(&s.bot_id))
        .filter(lease::Column::Fence.eq(s.fence as i64))
        .one(db)
        .await?;
    let actor = grant.map_or_else(Actor::system, |g| Actor::user(g.holder));
    let socket = match s.socket {
        SocketKind::Screen => "screen",
        SocketKind::Terminal => "terminal",
    };
    let mut detail = json!({
        "startedAtMs": s.started_at_ms, "endedAtMs": s.ended_at_ms,
        "durationMs": (s.ended_at_ms - s.started_at_ms).max(0),
        "inputs": s.inputs, "counted": s.counted, "closedBy": s.closed_by,
        "fence": s.fence,
    });
    if let Some(recording) = recording {
        detail["recording"] = recording;
    }
    timeline::append(
        db,
        NewEntry {
            computer_id: c.id.clone(),
            space_id: c.space_id.clone(),
            actor,
            bot_id: Some(s.bot_id.clone()),
            run_id: None,
            kind: "control.session".into(),
            subject: socket.into(),
            detail,
        },
    )
    .await?;
    tracing::info!(event = "timeline.control_session", computer.id = %c.id, bot.id = %s.bot_id,
        duration_ms = s.ended_at_ms - s.started_at_ms);
    Ok(())
}
