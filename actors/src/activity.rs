//! The activity feed: every mutating tool call on a computer becomes a `computer.command`
//! event, recorded with secrets redacted and streamed live to the space's subscribers.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};

use regex::Regex;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde::Serialize;

use crate::clock::{new_id, now_ms};
use crate::entity::activity_event;
use crate::error::DomainResult;
use crate::events::EventBus;
use crate::timeline::{self, EntryJson, NewEntry};

/// Longest output tail kept per event, in characters.
pub const OUTPUT_TAIL_CHARS: usize = 2000;
/// Longest command kept per event, in characters.
const COMMAND_CHARS: usize = 4000;
/// What replaces a secret.
const REDACTED: &str = "[redacted]";

static SEQ: AtomicI64 = AtomicI64::new(0);

/// Patterns of secrets in command lines and output, each replacing its capture group 1.
static SECRETS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // Assignments of *_TOKEN, *_KEY, *_SECRET, *PASSWORD, *_PASS (env style or flags).
        r"(?i)\b[A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|PASS)[A-Z0-9_]*\s*=\s*('[^']*'|\x22[^\x22]*\x22|[^\s'\x22]+)",
        // Bearer and basic authorization headers.
        r"(?i)\bauthorization:\s*(?:bearer|basic|token)\s+([A-Za-z0-9._~+/=-]+)",
        r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{8,})",
        // Passwords in URLs: scheme://user:password@host.
        r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]+:([^@\s/]+)@",
        // Common token shapes: GitHub, Slack, OpenAI-style, AWS access keys, our own.
        r"\b((?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{16,})",
        r"\b(xox[abpr]-[A-Za-z0-9-]{10,})",
        r"\b(sk-[A-Za-z0-9_-]{16,})",
        r"\b(AKIA[0-9A-Z]{16})",
        r"\b(rkz_[A-Za-z0-9_-]{16,})",
        // --password VALUE / --token VALUE style flags.
        r"(?i)--(?:password|passwd|token|secret|api-key|apikey)[= ]('[^']*'|\x22[^\x22]*\x22|\S+)",
        // MySQL's -pVALUE / -p'value' (its password flag takes no space).
        r"(?i)\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\b[^|;&\n]*?(?-i:\s-p)('[^']*'|\x22[^\x22]*\x22|[^\s'\x22]+)",
        // curl's -u / --user name:password.
        r"(?i)\bcurl\b[^|;&\n]*?\s(?:-u|--user)\s*['\x22]?[^\s:'\x22]+:('[^']*'|[^\s'\x22]+)",
        // Header-style keys, named with a hyphen: X-API-Key: VALUE, PRIVATE-TOKEN: VALUE.
        r"(?i)(?:^|[\s'\x22])(?:[A-Za-z0-9]+-)+[A-Za-z0-9-]*(?:token|key|secret|passw)[A-Za-z0-9-]*:\s*([^\s'\x22]+)",
    ]
    .iter()
    .map(|p| Regex::new(p).expect("valid secret pattern"))
    .collect()
});

/// Replace every secret in `text`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_owned();
    for re in SECRETS.iter() {
        out = re
            .replace_all(&out, |caps: &regex::Captures<'_>| {
                let whole = caps.get(0).expect("match");
                let secret = caps.get(1).expect("group");
                let (start, end) = (secret.start() - whole.start(), secret.end() - whole.start());
                let w = whole.as_str();
                format!("{}{REDACTED}{}", &w[..start], &w[end..])
            })
            .into_owned();
    }
    out
}

fn tail(text: &str, chars: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(chars)).collect()
}

/// One mutating tool call, as recorded.
#[derive(Clone, Debug, Default)]
pub struct Command {
    /// The space.
    pub space_id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot.
    pub bot_id: String,
    /// `shell`, `write_file`, `attach_file`, `open_path`, `launch_app`.
    pub tool: String,
    /// The command line or a one-line description (redacted here).
    pub command: String,
    /// Output, of which the tail is kept (redacted here).
    pub output: Option<String>,
    /// Bytes written, for writes.
    pub size_bytes: Option<i64>,
    /// The error, if the call failed.
    pub error: Option<String>,
}

/// An event as clients see it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivityJson {
    /// Identifier.
    pub id: String,
    /// The bot.
    pub bot_id: String,
    /// The computer.
    pub computer_id: String,
    /// The tool.
    pub tool: String,
    /// Redacted command.
    pub command: String,
    /// Redacted output tail.
    pub output_tail: Option<String>,
    /// Bytes written.
    pub size_bytes: Option<i64>,
    /// Error.
    pub error: Option<String>,
    /// When.
    pub created_at_ms: i64,
}

impl From<&activity_event::Model> for ActivityJson {
    fn from(m: &activity_event::Model) -> Self {
        Self {
            id: m.id.clone(),
            bot_id: m.bot_id.clone(),
            computer_id: m.computer_id.clone(),
            tool: m.tool.clone(),
            command: m.command.clone(),
            output_tail: m.output_tail.clone(),
            size_bytes: m.size_bytes,
            error: m.error.clone(),
            created_at_ms: m.created_at_ms,
        }
    }
}

/// The feed's row of a call: redacted, the output cut to its tail.
fn row_of(c: Command) -> activity_event::Model {
    activity_event::Model {
        id: new_id(),
        seq: SEQ.fetch_add(1, Ordering::Relaxed),
        space_id: c.space_id,
        computer_id: c.computer_id,
        bot_id: c.bot_id,
        kind: "computer.command".into(),
        tool: c.tool,
        command: tail(&redact(&c.command), COMMAND_CHARS),
        output_tail: c
            .output
            .map(|o| redact(&tail(&o, OUTPUT_TAIL_CHARS * 2)))
            .map(|o| tail(&o, OUTPUT_TAIL_CHARS)),
        size_bytes: c.size_bytes,
        error: c.error.map(|e| redact(&e)),
        created_at_ms: now_ms(),
    }
}

/// Stream a recorded row to its space's subscribers.
fn publish(events: &EventBus, row: &activity_event::Model) -> ActivityJson {
    let json = ActivityJson::from(row);
    events.publish(
        &row.space_id,
        crate::events::Topic::ComputerCommand,
        serde_json::to_value(&json).unwrap_or_default(),
    );
    json
}

/// Record one call and stream it to the space's subscribers.
pub async fn record(
    db: &DatabaseConnection,
    events: &EventBus,
    c: Command,
) -> DomainResult<ActivityJson> {
    let row = row_of(c);
    activity_event::ActiveModel::from(row.clone())
        .insert(db)
        .await?;
    Ok(publish(events, &row))
}

/// Record calls together with the timeline entry of the tool call that made them, in one
/// transaction ([`timeline::append_with`]); they are streamed once it is committed. When the
/// timeline stays contended, the calls are still recorded on their own.
pub async fn record_with_entry(
    db: &DatabaseConnection,
    events: &EventBus,
    commands: Vec<Command>,
    entry: NewEntry,
) -> DomainResult<EntryJson> {
    let rows: Vec<_> = commands.into_iter().map(row_of).collect();
    match timeline::append_with(db, entry, &rows).await {
        Ok(entry) => {
            for row in &rows {
                publish(events, row);
            }
            Ok(entry)
        }
        Err(e) => {
            for row in &rows {
                activity_event::ActiveModel::from(row.clone())
                    .insert(db)
                    .await?;
                publish(events, row);
            }
            Err(e)
        }
    }
}

/// A bot's history, newest first.
pub async fn history(
    db: &DatabaseConnection,
    bot_id: &str,
    before_ms: Option<i64>,
    limit: u64,
) -> DomainResult<Vec<ActivityJson>> {
    let mut q = activity_event::Entity::find().filter(activity_event::Column::BotId.eq(bot_id));
    if let Some(before) = before_ms {
        q = q.filter(activity_event::Column::CreatedAtMs.lt(before));
    }
    let rows = q
        .order_by_desc(activity_event::Column::CreatedAtMs)
        .order_by_desc(activity_event::Column::Seq)
        .limit(limit.clamp(1, 500))
        .all(db)
        .await?;
    Ok(rows.iter().map(ActivityJson::from).collect())
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn secrets_are_redacted_and_the_rest_kept() {
        let cases = [
            (
                "GITHUB_TOKEN=abc123 git push",
                "GITHUB_TOKEN=[redacted] git push",
            ),
            (
                "export AWS_SECRET_ACCESS_KEY='x y z'",
                "export AWS_SECRET_ACCESS_KEY=[redacted]",
            ),
            (
                "curl -H 'Authorization: Bearer eyJhbGciOi.x.y' https://api",
                "curl -H 'Authorization: Bearer [redacted]' https://api",
            ),
            (
                "git clone https://me:hunter2@example.com/r.git",
                "git clone https://me:[redacted]@example.com/r.git",
            ),
            ("echo ghp_0123456789abcdefABCDEF", "echo [redacted]"),
            (
                "mysql --password=s3cret -u root",
                "mysql --password=[redacted] -u root",
            ),
            ("mysql -uroot -phunter2 db", "mysql -uroot -p[redacted] db"),
            ("mysqldump -p'a b' db", "mysqldump -p[redacted] db"),
            (
                "mkdir -p /tmp/x && ssh -p2222 host",
                "mkdir -p /tmp/x && ssh -p2222 host",
            ),
            (
                "mysql -h db -P3306 -uroot -phunter2",
                "mysql -h db -P3306 -uroot -p[redacted]",
            ),
            (
                "curl -u \"admin:hunter2\" https://x",
                "curl -u \"admin:[redacted]\" https://x",
            ),
            (
                "docker run quay.io/keycloak/keycloak:24.0 http://keycloak:8080/realms",
                "docker run quay.io/keycloak/keycloak:24.0 http://keycloak:8080/realms",
            ),
            (
                "curl -u admin:s3cret https://x",
                "curl -u admin:[redacted] https://x",
            ),
            (
                "curl -H 'X-API-Key: e2b_0123' -H 'PRIVATE-TOKEN: glpat-x' https://x",
                "curl -H 'X-API-Key: [redacted]' -H 'PRIVATE-TOKEN: [redacted]' https://x",
            ),
            ("ls -la /tmp", "ls -la /tmp"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }
}
