//! Fenced leases, decided at the database.
//!
//! Every grant is a row of `leases` with a fence that only grows per lease key (computer, kind,
//! subject); the unique index on (key, fence) makes two racing grants collide so that exactly one
//! wins, in one process or many. Decisions that read other keys (takeover rules, the maintenance
//! reservation) first bump `computers.lease_epoch` inside the transaction, which takes the
//! computer row's write lock on Postgres and the database write lock on SQLite: lease decisions
//! of one computer are serialized without any in-memory lock. The common grant (nothing live
//! on the key, no maintenance) is one statement: on SQLite an `INSERT ... SELECT`, which holds
//! the write lock for its whole run; on Postgres a function that bumps the epoch first.

use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, EntityTrait,
    QueryFilter, QueryOrder, Set, Statement, TransactionTrait,
};
use serde::Serialize;

use crate::clock::{new_id, now_ms};
use crate::entity::{bot, computer, lease, run};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::runs::RunState;

/// The three kinds of lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseKind {
    /// One driver per bot: a run's right to use the computer as that bot.
    Execution,
    /// One user per bot screen: the embedded viewer accepts input.
    Control,
    /// Computer-wide reservation for update and recovery; excludes new execution leases,
    /// takeover and stop.
    Maintenance,
}

impl LeaseKind {
    /// Stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Execution => "execution",
            Self::Control => "control",
            Self::Maintenance => "maintenance",
        }
    }

    /// From the stored form.
    pub fn parse(stored: &str) -> Option<Self> {
        match stored {
            "execution" => Some(Self::Execution),
            "control" => Some(Self::Control),
            "maintenance" => Some(Self::Maintenance),
            _ => None,
        }
    }
}

/// The subject of the computer-wide maintenance reservation.
pub const WHOLE_COMPUTER: &str = "*";

/// Identifies one lease: its fence sequence belongs to this key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseKey {
    /// The computer.
    pub computer_id: String,
    /// What kind of lease.
    pub kind: LeaseKind,
    /// The bot id, or [`WHOLE_COMPUTER`].
    pub subject: String,
}

impl LeaseKey {
    /// The execution lease of a bot on a computer.
    pub fn execution(computer_id: &str, bot_id: &str) -> Self {
        Self {
            computer_id: computer_id.into(),
            kind: LeaseKind::Execution,
            subject: bot_id.into(),
        }
    }

    /// The control lease of a bot's screen.
    pub fn control(computer_id: &str, bot_id: &str) -> Self {
        Self {
            computer_id: computer_id.into(),
            kind: LeaseKind::Control,
            subject: bot_id.into(),
        }
    }

    /// The computer-wide maintenance reservation.
    pub fn maintenance(computer_id: &str) -> Self {
        Self {
            computer_id: computer_id.into(),
            kind: LeaseKind::Maintenance,
            subject: WHOLE_COMPUTER.into(),
        }
    }
}

/// A granted lease, as handed to its holder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The computer.
    pub computer_id: String,
    /// Kind of lease.
    pub kind: LeaseKind,
    /// Bot id or `*`.
    pub subject: String,
    /// Who holds it.
    pub holder: String,
    /// The fence every mutating call must carry.
    pub fence: i64,
    /// Expiry unless renewed.
    pub expires_at_ms: i64,
}

impl Grant {
    fn from_row(kind: LeaseKind, row: &lease::Model) -> Self {
        Self {
            computer_id: row.computer_id.clone(),
            kind,
            subject: row.subject.clone(),
            holder: row.holder.clone(),
            fence: row.fence,
            expires_at_ms: row.expires_at_ms,
        }
    }
}

/// What a caller refused a lease of `kind` held by another is told.
fn held_code(kind: LeaseKind) -> ErrorCode {
    match kind {
        LeaseKind::Control => ErrorCode::ControlHeld,
        _ => ErrorCode::LeaseHeld,
    }
}

fn is_live(row: &lease::Model, now: i64) -> bool {
    row.released_at_ms.is_none() && row.expires_at_ms > now
}

async fn latest<C: ConnectionTrait>(db: &C, key: &LeaseKey) -> DomainResult<Option<lease::Model>> {
    Ok(lease::Entity::find()
        .filter(lease::Column::ComputerId.eq(&key.computer_id))
        .filter(lease::Column::Kind.eq(key.kind.as_str()))
        .filter(lease::Column::Subject.eq(&key.subject))
        .order_by_desc(lease::Column::Fence)
        .one(db)
        .await?)
}

/// [`Leases::verify`] on a key's latest grant read elsewhere (`latest`, or none): the grant
/// if it is live at `now` and its fence is `fence`; `LEASE_FENCED` otherwise.
pub fn judge_latest(
    kind: LeaseKind,
    latest: Option<lease::Model>,
    fence: i64,
    now: i64,
) -> DomainResult<Grant> {
    match latest {
        Some(row) if row.fence == fence && is_live(&row, now) => Ok(Grant::from_row(kind, &row)),
        _ => Err(DomainError::code(ErrorCode::LeaseFenced)),
    }
}

async fn live<C: ConnectionTrait>(
    db: &C,
    key: &LeaseKey,
    now: i64,
) -> DomainResult<Option<lease::Model>> {
    Ok(latest(db, key).await?.filter(|row| is_live(row, now)))
}

/// Serialize lease decisions of one computer (see the module docs).
async fn lock_computer<C: ConnectionTrait>(db: &C, computer_id: &str) -> DomainResult<()> {
    let res = computer::Entity::update_many()
        .col_expr(
            computer::Column::LeaseEpoch,
            Expr::col(computer::Column::LeaseEpoch).add(1),
        )
        .filter(computer::Column::Id.eq(computer_id))
        .exec(db)
        .await?;
    if res.rows_affected == 0 {
        return Err(DomainError::not_found("computer"));
    }
    Ok(())
}

/// [`Leases::grant_fresh`] on SQLite: the key's next fence, unless the key's latest grant or
/// the computer's latest maintenance reservation is live. Only a key's latest grant can be live
/// (a grant needs none live), so both checks read one row each through `ux_leases_fence`, never
/// the history of the computer's leases. Parameters: id, computer, kind, subject, holder, now,
/// expiry.
pub const SQLITE_FRESH_GRANT: &str = "INSERT INTO leases (id, computer_id, kind, subject, holder, fence, \
                 expires_at_ms, released_at_ms, created_at_ms) \
                 SELECT ?1, ?2, ?3, ?4, ?5, COALESCE((SELECT MAX(fence) FROM leases \
                 WHERE computer_id = ?2 AND kind = ?3 AND subject = ?4), 0) + 1, ?7, NULL, ?6 \
                 WHERE EXISTS (SELECT 1 FROM computers WHERE id = ?2) \
                 AND NOT EXISTS (SELECT 1 FROM (SELECT released_at_ms, expires_at_ms FROM leases \
                 WHERE computer_id = ?2 AND kind = ?3 AND subject = ?4 ORDER BY fence DESC LIMIT 1) \
                 AS last WHERE last.released_at_ms IS NULL AND last.expires_at_ms > ?6) \
                 AND NOT EXISTS (SELECT 1 FROM (SELECT released_at_ms, expires_at_ms FROM leases \
                 WHERE computer_id = ?2 AND kind = 'maintenance' AND subject = '*' \
                 ORDER BY fence DESC LIMIT 1) AS reserved \
                 WHERE reserved.released_at_ms IS NULL AND reserved.expires_at_ms > ?6) \
                 RETURNING fence";

/// The lease table's rules.
#[derive(Clone)]
pub struct Leases {
    db: DatabaseConnection,
}

impl Leases {
    /// Rules over a database.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// The live grant of a key, if any.
    pub async fn live(&self, key: &LeaseKey) -> DomainResult<Option<Grant>> {
        Ok(live(&self.db, key, now_ms())
            .await?
            .map(|row| Grant::from_row(key.kind, &row)))
    }

    /// Grant `key` to `holder` for `ttl_ms`, applying the kind's rules:
    /// - execution: refused with `COMPUTER_RESERVED` under maintenance, `LEASE_HELD` while
    ///   another holder drives the bot (the same holder gets its live grant back);
    /// - control: `COMPUTER_RESERVED` under maintenance; for a Team bot `STOP_BOT_FIRST` while
    ///   the bot holds a live execution lease or an active run, unless its run is
    ///   `waiting_takeover`; `CONTROL_HELD` while another user controls the screen;
    /// - maintenance: `COMPUTER_RESERVED` while another reservation is live.
    pub async fn acquire(&self, key: &LeaseKey, holder: &str, ttl_ms: i64) -> DomainResult<Grant> {
        if key.kind != LeaseKind::Control
            && let Some(grant) = self.grant_fresh(key, holder, ttl_ms).await
        {
            return Ok(grant);
        }
        self.acquire_locked(key, holder, ttl_ms).await
    }

    /// [`Self::acquire`] through its general path only: one transaction under the computer's
    /// lock, reading the rows the rules need, then inserting the grant.
    pub async fn acquire_locked(
        &self,
        key: &LeaseKey,
        holder: &str,
        ttl_ms: i64,
    ) -> DomainResult<Grant> {
        let txn = self.db.begin().await?;
        lock_computer(&txn, &key.computer_id).await?;
        let now = now_ms();
        if let Some(row) = live(&txn, &LeaseKey::maintenance(&key.computer_id), now).await? {
            if key.kind != LeaseKind::Maintenance || row.holder != holder {
                return Err(DomainError::code(ErrorCode::ComputerReserved));
            }
            return Ok(Grant::from_row(key.kind, &row));
        }
        if key.kind == LeaseKind::Control {
            check_takeover(&txn, key, now).await?;
        }
        let previous = latest(&txn, key).await?;
        if let Some(row) = previous.as_ref().filter(|row| is_live(row, now)) {
            if row.holder == holder {
                return Ok(Grant::from_row(key.kind, row));
            }
            return Err(DomainError::code(held_code(key.kind)));
        }
        let fence = previous.map_or(1, |row| row.fence + 1);
        let row = lease::ActiveModel {
            id: Set(new_id()),
            computer_id: Set(key.computer_id.clone()),
            kind: Set(key.kind.as_str().into()),
            subject: Set(key.subject.clone()),
            holder: Set(holder.into()),
            fence: Set(fence),
            expires_at_ms: Set(now + ttl_ms),
            released_at_ms: Set(None),
            created_at_ms: Set(now),
        };
        let row = match row.insert(&txn).await {
            Ok(row) => row,
            // Another process took this fence first.
            Err(_) => return Err(DomainError::code(held_code(key.kind))),
        };
        txn.commit().await?;
        tracing::debug!(event = "lease.granted", kind = key.kind.as_str(), fence);
        Ok(Grant::from_row(key.kind, &row))
    }

    /// The common grant in one statement: nothing live on the key and no live maintenance
    /// reservation, so the grant is the key's next fence. `None` when it did not apply (or
    /// failed): [`Self::acquire`]'s general path then decides, with the same rules.
    ///
    /// On SQLite one `INSERT ... SELECT` holds the database's write lock for its whole run; on
    /// Postgres `rakazo_lease_grant` (a migration) first takes the computer row's lock, as the
    /// general path does, so it is serialized with every other lease decision of the computer.
    async fn grant_fresh(&self, key: &LeaseKey, holder: &str, ttl_ms: i64) -> Option<Grant> {
        let now = now_ms();
        let id = new_id();
        let backend = self.db.get_database_backend();
        let values: Vec<sea_orm::Value> = vec![
            id.clone().into(),
            key.computer_id.clone().into(),
            key.kind.as_str().into(),
            key.subject.clone().into(),
            holder.into(),
            now.into(),
            (now + ttl_ms).into(),
        ];
        let sql = match backend {
            DbBackend::Postgres => "SELECT rakazo_lease_grant($1, $2, $3, $4, $5, $6, $7) AS fence",
            _ => SQLITE_FRESH_GRANT,
        };
        let row = self
            .db
            .query_one_raw(Statement::from_sql_and_values(backend, sql, values))
            .await
            .ok()??;
        let fence: i64 = row.try_get::<Option<i64>>("", "fence").ok()??;
        tracing::debug!(event = "lease.granted", kind = key.kind.as_str(), fence);
        Some(Grant {
            computer_id: key.computer_id.clone(),
            kind: key.kind,
            subject: key.subject.clone(),
            holder: holder.into(),
            fence,
            expires_at_ms: now + ttl_ms,
        })
    }

    /// The current grant if `fence` is it and it is live; `LEASE_FENCED` otherwise.
    pub async fn verify(&self, key: &LeaseKey, fence: i64) -> DomainResult<Grant> {
        judge_latest(key.kind, latest(&self.db, key).await?, fence, now_ms())
    }

    /// Set `column` on the live grant of `key` with `fence`; `LEASE_FENCED` when there is none.
    async fn update_live(
        &self,
        key: &LeaseKey,
        fence: i64,
        holder: Option<&str>,
        column: lease::Column,
        value: i64,
    ) -> DomainResult<()> {
        let now = now_ms();
        let mut update = lease::Entity::update_many()
            .col_expr(column, Expr::value(value))
            .filter(key_filter(key))
            .filter(lease::Column::Fence.eq(fence))
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::ExpiresAtMs.gt(now));
        if let Some(holder) = holder {
            update = update.filter(lease::Column::Holder.eq(holder));
        }
        let res = update.exec(&self.db).await?;
        if res.rows_affected == 0 {
            return Err(DomainError::code(ErrorCode::LeaseFenced));
        }
        Ok(())
    }

    /// Extend a live grant; `LEASE_FENCED` when `fence` is not the live grant.
    pub async fn renew(&self, key: &LeaseKey, fence: i64, ttl_ms: i64) -> DomainResult<Grant> {
        self.renew_held(key, fence, None, ttl_ms).await
    }

    /// [`Self::renew`], of a grant `holder` holds when given (in the same statement: a grant
    /// someone else took since the caller looked is never extended).
    pub async fn renew_held(
        &self,
        key: &LeaseKey,
        fence: i64,
        holder: Option<&str>,
        ttl_ms: i64,
    ) -> DomainResult<Grant> {
        let expires = now_ms() + ttl_ms;
        self.update_live(key, fence, holder, lease::Column::ExpiresAtMs, expires)
            .await?;
        self.verify(key, fence).await
    }

    /// Release the grant with `fence`; `LEASE_FENCED` when it is not live.
    pub async fn release(&self, key: &LeaseKey, fence: i64) -> DomainResult<()> {
        self.release_held(key, fence, None).await
    }

    /// [`Self::release`], of a grant `holder` holds when given (in the same statement: a
    /// grant someone else took since the caller looked is never released).
    pub async fn release_held(
        &self,
        key: &LeaseKey,
        fence: i64,
        holder: Option<&str>,
    ) -> DomainResult<()> {
        self.update_live(key, fence, holder, lease::Column::ReleasedAtMs, now_ms())
            .await?;
        tracing::debug!(event = "lease.released", kind = key.kind.as_str(), fence);
        Ok(())
    }

    /// Release whatever grant of `key` is live (stop, teardown); returns it.
    pub async fn revoke(&self, key: &LeaseKey) -> DomainResult<Option<Grant>> {
        let Some(grant) = self.live(key).await? else {
            return Ok(None);
        };
        match self.release(key, grant.fence).await {
            Ok(()) => Ok(Some(grant)),
            Err(e) if e.code == ErrorCode::LeaseFenced => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Live grants of a computer (for deferral rules and status).
    pub async fn live_on(&self, computer_id: &str) -> DomainResult<Vec<Grant>> {
        let now = now_ms();
        let rows = lease::Entity::find()
            .filter(lease::Column::ComputerId.eq(computer_id))
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::ExpiresAtMs.gt(now))
            .all(&self.db)
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| Some(Grant::from_row(LeaseKind::parse(&row.kind)?, row)))
            .collect())
    }

    /// Mark the grant of `key` with `fence` released once it is past its expiry; whether this
    /// call did (false: released already, renewed, or not expired).
    pub async fn mark_expired(&self, key: &LeaseKey, fence: i64) -> DomainResult<bool> {
        let now = now_ms();
        let res = lease::Entity::update_many()
            .col_expr(lease::Column::ReleasedAtMs, Expr::value(now))
            .filter(key_filter(key))
            .filter(lease::Column::Fence.eq(fence))
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::ExpiresAtMs.lte(now))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected == 1)
    }

    /// Mark released every grant past its expiry that nobody released (its holder's process
    /// stopped, or nobody watched it); answers the grants this call released. Each row is
    /// released by one statement that checks it is still unreleased, so with several
    /// processes exactly one of them answers a given grant. Grants that have not expired are
    /// never touched, whoever holds them.
    pub async fn expire_stale(&self) -> DomainResult<Vec<Grant>> {
        let now = now_ms();
        let stale = lease::Entity::find()
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::ExpiresAtMs.lte(now))
            .all(&self.db)
            .await?;
        let mut expired = Vec::new();
        for row in stale {
            let res = lease::Entity::update_many()
                .col_expr(lease::Column::ReleasedAtMs, Expr::value(now))
                .filter(lease::Column::Id.eq(&row.id))
                .filter(lease::Column::ReleasedAtMs.is_null())
                .filter(lease::Column::ExpiresAtMs.lte(now))
                .exec(&self.db)
                .await?;
            if let (1, Some(kind)) = (res.rows_affected, LeaseKind::parse(&row.kind)) {
                expired.push(Grant::from_row(kind, &row));
            }
        }
        Ok(expired)
    }
}

fn key_filter(key: &LeaseKey) -> sea_orm::Condition {
    sea_orm::Condition::all()
        .add(lease::Column::ComputerId.eq(&key.computer_id))
        .add(lease::Column::Kind.eq(key.kind.as_str()))
        .add(lease::Column::Subject.eq(&key.subject))
}

/// Take control of a Team bot's screen only while the bot is not driving, or is waiting for
/// a person (`waiting_takeover`).
async fn check_takeover<C: ConnectionTrait>(db: &C, key: &LeaseKey, now: i64) -> DomainResult<()> {
    let bot = bot::Entity::find_by_id(&key.subject)
        .one(db)
        .await?
        .ok_or_else(|| DomainError::not_found("bot"))?;
    if bot.computer_mode != "team" {
        return Ok(());
    }
    let active = run::Entity::find()
        .filter(run::Column::BotId.eq(&bot.id))
        .filter(run::Column::State.is_in([
            RunState::Running.as_str(),
            RunState::WaitingTakeover.as_str(),
        ]))
        .all(db)
        .await?;
    let waiting = active
        .iter()
        .any(|r| r.state == RunState::WaitingTakeover.as_str());
    let running = active.iter().any(|r| r.state == RunState::Running.as_str());
    let executing = live(db, &LeaseKey::execution(&key.computer_id, &bot.id), now)
        .await?
        .is_some();
    if (running || executing) && !waiting {
        return Err(DomainError::code(ErrorCode::StopBotFirst));
    }
    Ok(())
}
