//! One attributed, tamper-evident timeline per computer: agent tool calls, people's control
//! sessions, run and computer state changes, checkpoints, restores and maintenance, each with
//! its actor (bot, user or system), in the order the database accepted them.
//!
//! Every entry carries the hash of the entry before it; the computer's `timeline_heads` row
//! anchors the last one. An append is one statement that inserts the entry only where the head
//! is still the entry it chained to; the `timeline_head_follows` trigger moves the head in the
//! same statement, so appends from any number of processes form one chain; the unique
//! (computer, position) index backs that up. [`verify`] recomputes the chain and names the
//! first entry that does not match.
//!
//! Who acts is carried as a task-local [`Actor`] ([`acting_as`]): the methods set the caller,
//! the tools the bot; everything else (actors, timers, reconcilers) is the system. Events
//! published on the bus while an actor is set are journaled under it ([`start_journal`]).

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use dashmap::DashMap;
use sea_orm::sea_query::{Expr, ExprTrait, InsertStatement, Query};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    Iterable, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::activity::redact;
use crate::clock::{new_id, now_ms};
use crate::entity::{activity_event, timeline_entry, timeline_head};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::events::{EventBus, Journaled, Topic};

/// The hash before the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Longest detail kept per entry, in bytes of JSON.
pub const MAX_DETAIL_BYTES: usize = 8 * 1024;
/// How often an append retries after losing a race for the head.
const APPEND_ATTEMPTS: u32 = 200;

/// Who did something.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// A bot (its tools, its runs).
    Bot,
    /// A person (a user or operator token, a control session).
    User,
    /// The runtime itself (timers, reconcilers, actors).
    System,
}

impl ActorKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bot => "bot",
            Self::User => "user",
            Self::System => "system",
        }
    }
}

/// An actor: its kind and, for bots and people, its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The kind.
    pub kind: ActorKind,
    /// The bot or user id.
    pub id: Option<String>,
}

impl Actor {
    /// A bot.
    pub fn bot(id: impl Into<String>) -> Self {
        Self {
            kind: ActorKind::Bot,
            id: Some(id.into()),
        }
    }

    /// A person.
    pub fn user(id: impl Into<String>) -> Self {
        Self {
            kind: ActorKind::User,
            id: Some(id.into()),
        }
    }

    /// The runtime.
    pub fn system() -> Self {
        Self {
            kind: ActorKind::System,
            id: None,
        }
    }
}

tokio::task_local! {
    static ACTOR: Actor;
}

/// Run `f` with `actor` as the one acting (see the module docs).
pub async fn acting_as<F: Future>(actor: Actor, f: F) -> F::Output {
    ACTOR.scope(actor, f).await
}

/// Who acts in this task: the system unless [`acting_as`] said otherwise.
pub fn current() -> Actor {
    ACTOR
        .try_with(Clone::clone)
        .unwrap_or_else(|_| Actor::system())
}

/// An entry to append.
#[derive(Clone, Debug)]
pub struct NewEntry {
    /// The computer.
    pub computer_id: String,
    /// Its space.
    pub space_id: String,
    /// Who did it.
    pub actor: Actor,
    /// The bot it concerns.
    pub bot_id: Option<String>,
    /// The run it belongs to.
    pub run_id: Option<String>,
    /// `tool.call`, `control.session`, `run.state`, `computer.state`, `control.lease`,
    /// `checkpoint`, `restore`, `maintenance`.
    pub kind: String,
    /// Its subject (the tool, the state, ...).
    pub subject: String,
    /// Details; string values are redacted and the whole is bounded before storing.
    pub detail: Value,
}

/// An entry as clients see it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryJson {
    /// Identifier.
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// Place in the timeline.
    pub position: i64,
    /// `bot`, `user` or `system`.
    pub actor: String,
    /// The bot or user id.
    pub actor_id: Option<String>,
    /// The bot it concerns.
    pub bot_id: Option<String>,
    /// The run.
    pub run_id: Option<String>,
    /// Kind.
    pub kind: String,
    /// Subject.
    pub subject: String,
    /// Details.
    pub detail: Value,
    /// When.
    pub created_at_ms: i64,
    /// The hash of the entry before.
    pub prev_hash: String,
    /// This entry's hash.
    pub hash: String,
}

impl From<&timeline_entry::Model> for EntryJson {
    fn from(m: &timeline_entry::Model) -> Self {
        Self {
            id: m.id.clone(),
            computer_id: m.computer_id.clone(),
            position: m.position,
            actor: m.actor_kind.clone(),
            actor_id: m.actor_id.clone(),
            bot_id: m.bot_id.clone(),
            run_id: m.run_id.clone(),
            kind: m.kind.clone(),
            subject: m.subject.clone(),
            detail: serde_json::from_str(&m.detail).unwrap_or(Value::Null),
            created_at_ms: m.created_at_ms,
            prev_hash: m.prev_hash.clone(),
            hash: m.hash.clone(),
        }
    }
}

/// Redact every string of `v` (keys are ours, values may hold secrets).
pub fn redact_value(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(redact(s)),
        Value::Array(a) => Value::Array(a.iter().map(redact_value).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), redact_value(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The stored form of a detail: redacted, and cut to a marker when too long.
fn stored_detail(detail: &Value) -> String {
    let text = redact_value(detail).to_string();
    if text.len() <= MAX_DETAIL_BYTES {
        return text;
    }
    json!({ "truncated": true, "bytes": text.len() }).to_string()
}

/// The hash of an entry: SHA-256 over every stored field but the hash itself, each
/// length-prefixed, so no two different entries share an encoding.
pub fn entry_hash(m: &timeline_entry::Model) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(b"rakazo.timeline.v1");
    field(m.id.as_bytes());
    field(m.computer_id.as_bytes());
    field(m.space_id.as_bytes());
    field(&m.position.to_be_bytes());
    field(m.actor_kind.as_bytes());
    field(m.actor_id.as_deref().unwrap_or("").as_bytes());
    field(m.bot_id.as_deref().unwrap_or("").as_bytes());
    field(m.run_id.as_deref().unwrap_or("").as_bytes());
    field(m.kind.as_bytes());
    field(m.subject.as_bytes());
    field(m.detail.as_bytes());
    field(&m.created_at_ms.to_be_bytes());
    field(m.prev_hash.as_bytes());
    hex::encode(h.finalize())
}

/// Whether a failed attempt lost a race (and is worth another try).
fn contended(e: &DbErr) -> bool {
    if matches!(
        e.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    ) {
        return true;
    }
    let text = e.to_string().to_ascii_lowercase();
    [
        "locked",
        "busy",
        "could not serialize",
        "deadlock",
        "unique",
    ]
    .iter()
    .any(|w| text.contains(w))
}

enum Attempt {
    Done(Box<timeline_entry::Model>),
    /// Another writer moved the head first.
    Lost,
    /// The head was not where this process last saw it: read it and try again at once.
    Stale,
}

/// Most computers whose head [`HEADS`] keeps; past it, the hints start over.
const HINTED_HEADS: usize = 65_536;

/// The head each computer's timeline had after this process last appended to it: a hint that
/// spares an append reading the head first. It is only ever a guess: the append moves the head
/// only from that exact position and hash, and a head found elsewhere is read and the append
/// tried again.
static HEADS: LazyLock<DashMap<String, (i64, String)>> = LazyLock::new(DashMap::new);

fn remember_head(computer_id: &str, position: i64, hash: &str) {
    if HEADS.len() >= HINTED_HEADS {
        HEADS.clear();
    }
    HEADS.insert(computer_id.to_owned(), (position, hash.to_owned()));
}

async fn attempt(
    db: &DatabaseConnection,
    e: &NewEntry,
    detail: &str,
    also: &[activity_event::Model],
) -> Result<Attempt, DbErr> {
    let hint = HEADS.get(&e.computer_id).map(|h| h.value().clone());
    let head = match hint.clone() {
        Some(head) => Some(head),
        None => timeline_head::Entity::find_by_id(&e.computer_id)
            .one(db)
            .await?
            .map(|h| (h.position, h.hash)),
    };
    let (position, prev_hash) = head.clone().unwrap_or((0, GENESIS.to_owned()));
    let mut row = timeline_entry::Model {
        id: new_id(),
        computer_id: e.computer_id.clone(),
        space_id: e.space_id.clone(),
        position: position + 1,
        actor_kind: e.actor.kind.as_str().to_owned(),
        actor_id: e.actor.id.clone(),
        bot_id: e.bot_id.clone(),
        run_id: e.run_id.clone(),
        kind: e.kind.clone(),
        subject: e.subject.clone(),
        detail: detail.to_owned(),
        created_at_ms: now_ms(),
        prev_hash,
        hash: String::new(),
    };
    row.hash = entry_hash(&row);
    let insert = chained_insert(&row, head.is_some());
    let inserted = if also.is_empty() {
        db.execute(&insert).await?.rows_affected()
    } else {
        let txn = db.begin().await?;
        let inserted = txn.execute(&insert).await?.rows_affected();
        if inserted == 1 {
            activity_event::Entity::insert_many(
                also.iter().cloned().map(activity_event::ActiveModel::from),
            )
            .exec_without_returning(&txn)
            .await?;
            txn.commit().await?;
        } else {
            txn.rollback().await?;
        }
        inserted
    };
    if inserted != 1 {
        HEADS.remove(&e.computer_id);
        return Ok(if hint.is_some() {
            Attempt::Stale
        } else {
            Attempt::Lost
        });
    }
    remember_head(&row.computer_id, row.position, &row.hash);
    Ok(Attempt::Done(Box::new(row)))
}

/// The one statement of an append: `row` goes in only where the computer's head is still the
/// entry it chained to (`chained`), or where it has no head yet; the `timeline_head_follows`
/// trigger moves the head to it in the same statement.
fn chained_insert(row: &timeline_entry::Model, chained: bool) -> InsertStatement {
    let head = || {
        Query::select()
            .expr(Expr::val(1))
            .from(timeline_head::Entity)
            .and_where(timeline_head::Column::ComputerId.eq(&row.computer_id))
            .to_owned()
    };
    let still = if chained {
        Expr::exists(
            head()
                .and_where(timeline_head::Column::Position.eq(row.position - 1))
                .and_where(timeline_head::Column::Hash.eq(&row.prev_hash))
                .to_owned(),
        )
    } else {
        Expr::exists(head()).not()
    };
    // Every column of the row, in the entity's order.
    let columns: Vec<timeline_entry::Column> = timeline_entry::Column::iter().collect();
    let set = timeline_entry::ActiveModel::from(row.clone());
    let values = columns
        .iter()
        .map(|c| Expr::val(set.get(*c).into_value().expect("a model sets every column")));
    let select = Query::select().exprs(values).and_where(still).to_owned();
    Query::insert()
        .into_table(timeline_entry::Entity)
        .columns(columns)
        .select_from(select)
        .expect("as many values as columns")
        .to_owned()
}

/// Append an entry to its computer's timeline (see the module docs).
pub async fn append(db: &DatabaseConnection, e: NewEntry) -> DomainResult<EntryJson> {
    append_with(db, e, &[]).await
}

/// [`append`], inserting `also` (the activity feed's rows of the same tool call) in the same
/// transaction: one commit for both.
pub async fn append_with(
    db: &DatabaseConnection,
    e: NewEntry,
    also: &[activity_event::Model],
) -> DomainResult<EntryJson> {
    let detail = stored_detail(&e.detail);
    let mut last = None;
    for round in 0..APPEND_ATTEMPTS {
        match attempt(db, &e, &detail, also).await {
            Ok(Attempt::Done(row)) => return Ok(EntryJson::from(row.as_ref())),
            Ok(Attempt::Stale) => continue,
            Ok(Attempt::Lost) => {}
            Err(err) if contended(&err) => last = Some(err),
            Err(err) => return Err(err.into()),
        }
        // A little jitter, so racing writers do not collide again in step.
        let pause = u64::from(round % 8) * 2 + u64::from(rand::random::<u8>() % 4);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    tracing::warn!(event = "timeline.append_failed", computer.id = %e.computer_id, kind = %e.kind);
    Err(last.map_or_else(
        || DomainError::new(ErrorCode::Internal, "the timeline stayed contended"),
        DomainError::from,
    ))
}

/// Append, logging instead of failing: for callers whose own work already happened.
pub async fn note(db: &DatabaseConnection, e: NewEntry) -> Option<EntryJson> {
    let kind = e.kind.clone();
    match append(db, e).await {
        Ok(entry) => Some(entry),
        Err(err) => {
            tracing::warn!(event = "timeline.note_failed", kind = %kind, code = err.code.as_str());
            None
        }
    }
}

/// A page of a computer's timeline, oldest first, after `after` (a position).
pub async fn entries(
    db: &DatabaseConnection,
    computer_id: &str,
    after: i64,
    limit: u64,
) -> DomainResult<Vec<EntryJson>> {
    let rows = timeline_entry::Entity::find()
        .filter(timeline_entry::Column::ComputerId.eq(computer_id))
        .filter(timeline_entry::Column::Position.gt(after))
        .order_by_asc(timeline_entry::Column::Position)
        .limit(limit.clamp(1, 1000))
        .all(db)
        .await?;
    Ok(rows.iter().map(EntryJson::from).collect())
}

/// The control sessions of a bot's screen on a computer noted between two times.
pub async fn control_sessions(
    db: &DatabaseConnection,
    computer_id: &str,
    bot_id: &str,
    from_ms: i64,
    to_ms: Option<i64>,
) -> DomainResult<Vec<EntryJson>> {
    let mut q = timeline_entry::Entity::find()
        .filter(timeline_entry::Column::ComputerId.eq(computer_id))
        .filter(timeline_entry::Column::BotId.eq(bot_id))
        .filter(timeline_entry::Column::Kind.eq("control.session"))
        .filter(timeline_entry::Column::CreatedAtMs.gte(from_ms));
    if let Some(to) = to_ms {
        q = q.filter(timeline_entry::Column::CreatedAtMs.lte(to));
    }
    let rows = q
        .order_by_asc(timeline_entry::Column::Position)
        .all(db)
        .await?;
    Ok(rows.iter().map(EntryJson::from).collect())
}

/// The first entry of a timeline that does not match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mismatch {
    /// The entry's id (none when the entry is missing).
    pub id: Option<String>,
    /// Its position.
    pub position: i64,
    /// `hash` (its fields were changed), `prev_hash` (the chain is broken before it),
    /// `position` (an entry before it is missing), `missing` (entries after it are gone; the
    /// head names a later one) or `head` (the anchor does not name the last entry).
    pub reason: &'static str,
}

/// What [`verify`] found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    /// The computer.
    pub computer_id: String,
    /// Entries read.
    pub entries: u64,
    /// Whether every entry matched and the head names the last.
    pub intact: bool,
    /// The first entry that does not match.
    pub first_mismatch: Option<Mismatch>,
    /// The hash the head anchors.
    pub head_hash: Option<String>,
}

/// Entries read per page while verifying.
const VERIFY_PAGE: u64 = 500;

/// Recompute a computer's chain from its first entry and compare it with the head.
pub async fn verify(db: &impl ConnectionTrait, computer_id: &str) -> DomainResult<Verification> {
    let head = timeline_head::Entity::find_by_id(computer_id)
        .one(db)
        .await?;
    // Entries appended after the head was read are not looked at: a head and its entry are
    // written in one transaction, so everything up to the head read is there.
    let upto = head.as_ref().map_or(i64::MAX, |h| h.position);
    let mut prev = GENESIS.to_owned();
    let mut expected = 1i64;
    let mut read = 0u64;
    let mut mismatch = None;
    'pages: loop {
        let rows = timeline_entry::Entity::find()
            .filter(timeline_entry::Column::ComputerId.eq(computer_id))
            .filter(timeline_entry::Column::Position.gte(expected))
            .filter(timeline_entry::Column::Position.lte(upto))
            .order_by_asc(timeline_entry::Column::Position)
            .limit(VERIFY_PAGE)
            .all(db)
            .await?;
        let n = rows.len() as u64;
        for row in rows {
            read += 1;
            let reason = if row.position != expected {
                Some("position")
            } else if row.prev_hash != prev {
                Some("prev_hash")
            } else if entry_hash(&row) != row.hash {
                Some("hash")
            } else {
                None
            };
            if let Some(reason) = reason {
                mismatch = Some(Mismatch {
                    id: Some(row.id.clone()),
                    position: row.position,
                    reason,
                });
                break 'pages;
            }
            prev = row.hash;
            expected += 1;
        }
        if n < VERIFY_PAGE {
            break;
        }
    }
    let last = expected - 1;
    if mismatch.is_none() {
        mismatch = match &head {
            Some(h) if h.position > last => Some(Mismatch {
                id: None,
                position: last + 1,
                reason: "missing",
            }),
            Some(h) if h.position != last || h.hash != prev => Some(Mismatch {
                id: None,
                position: h.position,
                reason: "head",
            }),
            None if last > 0 => Some(Mismatch {
                id: None,
                position: 0,
                reason: "head",
            }),
            _ => None,
        };
    }
    Ok(Verification {
        computer_id: computer_id.to_owned(),
        entries: read,
        intact: mismatch.is_none(),
        first_mismatch: mismatch,
        head_hash: head.map(|h| h.hash),
    })
}

/// The entry a published event makes, if it is one the timeline keeps.
pub fn entry_of_event(journaled: &Journaled) -> Option<NewEntry> {
    let e = &journaled.event;
    let data = &e.data;
    let computer_id = data["computerId"].as_str()?.to_owned();
    let text = |k: &str| data[k].as_str().map(str::to_owned);
    let (kind, subject, bot_id, run_id, detail) = match e.topic {
        Topic::RunState => (
            "run.state",
            text("state")?,
            text("botId"),
            text("id"),
            json!({ "leaseFence": data["leaseFence"] }),
        ),
        Topic::ComputerState => (
            "computer.state",
            text("state")?,
            None,
            None,
            json!({ "reason": data["reason"] }),
        ),
        Topic::MaintenanceChanged => (
            "maintenance",
            text("state").unwrap_or_else(|| "changed".into()),
            None,
            None,
            json!({ "operationId": data["id"] }),
        ),
        Topic::LeaseChanged if data["kind"] == "control" => (
            "control.lease",
            text("state")?,
            text("botId"),
            None,
            json!({ "fence": data["fence"], "holder": data["holder"] }),
        ),
        _ => return None,
    };
    Some(NewEntry {
        computer_id,
        space_id: e.space_id.clone(),
        actor: journaled.actor.clone(),
        bot_id,
        run_id,
        kind: kind.into(),
        subject,
        detail,
    })
}

/// Journal what `events` publishes from now on: state changes become timeline entries, in the
/// order this process published them, under the actor that published them.
pub fn start_journal(db: DatabaseConnection, events: &EventBus) -> bool {
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, Journaled)>();
    let (done_tx, done_rx) = tokio::sync::watch::channel(0u64);
    if !events.set_journal(tx, done_rx) {
        return false;
    }
    tokio::spawn(async move {
        while let Some((n, j)) = rx.recv().await {
            if let Some(entry) = entry_of_event(&j) {
                note(&db, entry).await;
            }
            done_tx.send_replace(n);
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> timeline_entry::Model {
        timeline_entry::Model {
            id: "e1".into(),
            computer_id: "c".into(),
            space_id: "s".into(),
            position: 1,
            actor_kind: "bot".into(),
            actor_id: Some("b".into()),
            bot_id: Some("b".into()),
            run_id: None,
            kind: "tool.call".into(),
            subject: "shell".into(),
            detail: "{}".into(),
            created_at_ms: 5,
            prev_hash: GENESIS.into(),
            hash: String::new(),
        }
    }

    #[test]
    fn every_field_is_in_the_hash() {
        let base = entry_hash(&row());
        type Edit = Box<dyn Fn(&mut timeline_entry::Model)>;
        let edits: Vec<Edit> = vec![
            Box::new(|m: &mut timeline_entry::Model| m.id.push('x')),
            Box::new(|m: &mut timeline_entry::Model| m.computer_id.push('x')),
            Box::new(|m: &mut timeline_entry::Model| m.space_id.push('x')),
            Box::new(|m: &mut timeline_entry::Model| m.position += 1),
            Box::new(|m: &mut timeline_entry::Model| m.actor_kind = "user".into()),
            Box::new(|m: &mut timeline_entry::Model| m.actor_id = None),
            Box::new(|m: &mut timeline_entry::Model| m.bot_id = Some("c".into())),
            Box::new(|m: &mut timeline_entry::Model| m.run_id = Some(String::new() + "r")),
            Box::new(|m: &mut timeline_entry::Model| m.kind.push('x')),
            Box::new(|m: &mut timeline_entry::Model| m.subject.push('x')),
            Box::new(|m: &mut timeline_entry::Model| m.detail = "{\"a\":1}".into()),
            Box::new(|m: &mut timeline_entry::Model| m.created_at_ms += 1),
            Box::new(|m: &mut timeline_entry::Model| m.prev_hash = "1".repeat(64)),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut m = row();
            edit(&mut m);
            assert_ne!(entry_hash(&m), base, "edit {i} left the hash as it was");
        }
    }

    #[test]
    fn details_are_redacted_and_bounded() {
        let stored = stored_detail(&json!({ "command": "GITHUB_TOKEN=abc123 git push" }));
        assert!(!stored.contains("abc123"), "{stored}");
        let huge = stored_detail(&json!({ "x": "a".repeat(MAX_DETAIL_BYTES * 2) }));
        assert!(huge.len() < 100 && huge.contains("truncated"), "{huge}");
    }

    #[tokio::test]
    async fn the_actor_is_the_system_unless_set() {
        assert_eq!(current(), Actor::system());
        let inside = acting_as(Actor::bot("b1"), async { current() }).await;
        assert_eq!(inside, Actor::bot("b1"));
    }
}
