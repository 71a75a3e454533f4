//! The tools' side of the timeline and the recordings: what a tool call leaves there.

use rakazo_actors::DomainError;
use rakazo_actors::activity::{self, Command};
use rakazo_actors::entity::run;
use rakazo_actors::provider::{Action, Frame};
use rakazo_actors::timeline::{self, Actor, NewEntry};
use serde_json::{Value, json};

use crate::app::App;

/// Longest argument text kept in a tool call's entry, in characters.
const ARGUMENT_CHARS: usize = 2000;

/// Whether a tool puts itself in the timeline (with its recording) when it succeeds.
pub fn records_itself(tool: &str) -> bool {
    matches!(tool, "computer_observe" | "computer_act")
}

fn cut(text: &str) -> String {
    text.chars().take(ARGUMENT_CHARS).collect()
}

/// A tool call's arguments as its timeline entry keeps them: file contents are left out
/// (their size is kept), long text is cut; secrets are redacted when the entry is stored.
pub fn summary(arguments: &Value) -> Value {
    let Value::Object(args) = arguments else {
        return json!({});
    };
    let mut kept = serde_json::Map::new();
    for (k, v) in args {
        let v = match (k.as_str(), v) {
            ("content" | "content_base64", Value::String(s)) => {
                kept.insert(format!("{k}_bytes"), json!(s.len()));
                continue;
            }
            (_, Value::String(s)) => Value::String(cut(s)),
            (_, other) => {
                let text = other.to_string();
                if text.len() > ARGUMENT_CHARS {
                    json!({ "truncated": true })
                } else {
                    other.clone()
                }
            }
        };
        kept.insert(k.clone(), v);
    }
    Value::Object(kept)
}

/// The timeline entry of a tool call of `r`'s bot.
pub(crate) fn entry(r: &run::Model, tool: &str, detail: Value) -> NewEntry {
    NewEntry {
        computer_id: r.computer_id.clone(),
        space_id: r.space_id.clone(),
        actor: Actor::bot(&r.bot_id),
        bot_id: Some(r.bot_id.clone()),
        run_id: Some(r.id.clone()),
        kind: "tool.call".into(),
        subject: tool.into(),
        detail,
    }
}

/// Note a tool call (its arguments and whether it failed) in the computer's timeline.
pub async fn note(
    app: &App,
    r: &run::Model,
    tool: &str,
    arguments: Value,
    error: Option<&DomainError>,
    commands: Vec<Command>,
) {
    let outcome = match error {
        None => json!({ "ok": true }),
        Some(e) => json!({ "ok": false, "code": e.code.as_str(), "message": e.message }),
    };
    let entry = entry(
        r,
        tool,
        json!({ "arguments": arguments, "outcome": outcome }),
    );
    if commands.is_empty() {
        timeline::note(&app.db, entry).await;
        return;
    }
    // The activity rows the call made, in the same transaction as its entry.
    let events = &app.runtime().events;
    if let Err(e) = activity::record_with_entry(&app.db, events, commands, entry).await {
        tracing::warn!(
            event = "timeline.note_failed",
            kind = "tool.call",
            code = e.code.as_str()
        );
    }
}

/// Record an observation or an action batch: the timeline entry, and the step with its frame
/// (and the frame's digest, which the tool's answer uses too) in the run's recording. A
/// failure is logged; the tool's answer does not depend on it.
pub async fn step(
    app: &App,
    r: &run::Model,
    tool: &str,
    actions: Option<&[Action]>,
    result: Value,
    (frame, digest): (Frame, &str),
) {
    let step = super::Step {
        run: r,
        tool,
        actions,
        result,
        frame,
        digest,
    };
    let master = &app.runtime().master_key;
    if let Err(e) = super::record_in_background(&app.db, &app.recorder, master, step).await {
        tracing::warn!(event = "recording.step_failed", run.id = %r.id, code = e.code.as_str());
    }
}
