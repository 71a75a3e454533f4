//! Processes of the deployment: each `rakazo serve` and `rakazo worker` registers a row (with
//! the address of its internal endpoints) and beats its heartbeat.
//! A maintenance reservation names the process that holds it (`<what>@<process id>`), so a
//! reservation held by a process that is gone is released once that process provably
//! stopped: its heartbeat is older than [`GONE_AFTER_MS`], or the caller proved it otherwise
//! (a process on the same data directory whose lock is free).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};

use crate::clock::{new_id, now_ms};
use crate::entity::{computer_owner, lease, process};
use crate::error::DomainResult;

/// How often a process beats its heartbeat by default.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// By default a process whose heartbeat is older than this is gone (six missed beats).
pub const GONE_AFTER_MS: i64 = 60_000;

static GONE_AFTER: AtomicI64 = AtomicI64::new(GONE_AFTER_MS);

/// Sets how long a silent process counts as alive (`RAKAZO_PROCESS_GONE_MS`); heartbeats
/// come six times as often. Every process of a deployment must use the same value.
pub fn set_gone_after(ms: i64) {
    GONE_AFTER.store(ms.max(600), Ordering::Relaxed);
}

/// How long a silent process counts as alive.
pub fn gone_after_ms() -> i64 {
    GONE_AFTER.load(Ordering::Relaxed)
}

/// How often this process beats its heartbeat (a sixth of [`gone_after_ms`]).
pub fn heartbeat_every() -> Duration {
    Duration::from_millis((gone_after_ms() / 6).max(100) as u64)
}

static ADDRESS: OnceLock<String> = OnceLock::new();

/// Records where this process serves its internal endpoints, before it registers.
pub fn set_address(address: String) {
    let _ = ADDRESS.set(address);
}

static HOST: OnceLock<String> = OnceLock::new();

/// Names the loopback this process shares (`RAKAZO_HOST`), before it registers; without it
/// the kernel's boot id and this process's network namespace name it.
pub fn set_host(host: String) {
    let _ = HOST.set(host);
}

/// The loopback this process shares: processes of one host reach each other's services on
/// 127.0.0.1 (the same kernel and network namespace).
pub fn host() -> &'static str {
    HOST.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let net = std::fs::read_link("/proc/self/ns/net").unwrap_or_default();
        format!("{}/{}", boot.trim(), net.display())
    })
}

/// Whether a process registered with `host` reaches this one's loopback (a row written
/// before hosts were named is taken to: every such deployment shared one host).
pub fn shares_loopback(host: Option<&str>) -> bool {
    host.is_none_or(|h| h == self::host())
}

/// This process's id, random per start.
pub fn id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(new_id)
}

/// A reservation holder that names this process.
pub fn holder(what: &str) -> String {
    format!("{what}@{}", id())
}

/// The process rows of a database.
pub struct Processes {
    db: DatabaseConnection,
}

impl Processes {
    /// Rules over a database.
    pub fn new(db: DatabaseConnection) -> Self {
        Self { db }
    }

    /// Registers this process (again, after a reconnect) with a fresh heartbeat.
    pub async fn register(&self) -> DomainResult<()> {
        let now = now_ms();
        if process::Entity::find_by_id(id())
            .one(&self.db)
            .await?
            .is_some()
        {
            return self.beat().await;
        }
        process::ActiveModel {
            id: Set(id().into()),
            started_at_ms: Set(now),
            heartbeat_at_ms: Set(now),
            address: Set(ADDRESS.get().cloned()),
            host: Set(Some(host().to_owned())),
        }
        .insert(&self.db)
        .await?;
        Ok(())
    }

    /// Beats this process's heartbeat.
    pub async fn beat(&self) -> DomainResult<()> {
        process::Entity::update_many()
            .col_expr(process::Column::HeartbeatAtMs, Expr::value(now_ms()))
            .filter(process::Column::Id.eq(id()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Every other registered process.
    pub async fn others(&self) -> DomainResult<Vec<process::Model>> {
        Ok(process::Entity::find()
            .filter(process::Column::Id.ne(id()))
            .all(&self.db)
            .await?)
    }

    /// Whether a process's heartbeat says it is gone.
    pub fn silent(row: &process::Model, now: i64) -> bool {
        now.saturating_sub(row.heartbeat_at_ms) > gone_after_ms()
    }

    /// A live process by id (`None` when unknown or silent).
    pub async fn live(&self, process_id: &str) -> DomainResult<Option<process::Model>> {
        let row = process::Entity::find_by_id(process_id)
            .one(&self.db)
            .await?;
        Ok(row.filter(|r| !Self::silent(r, now_ms())))
    }

    /// A process is gone: releases the maintenance reservations it held, its claims on
    /// computers (their actors may start elsewhere), and forgets it. Returns how many
    /// reservations were released.
    pub async fn gone(&self, process_id: &str) -> DomainResult<u64> {
        let released = lease::Entity::update_many()
            .col_expr(lease::Column::ReleasedAtMs, Expr::value(now_ms()))
            .filter(lease::Column::Kind.eq("maintenance"))
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::Holder.like(format!("%@{process_id}")))
            .exec(&self.db)
            .await?
            .rows_affected;
        computer_owner::Entity::delete_many()
            .filter(computer_owner::Column::ProcessId.eq(process_id))
            .exec(&self.db)
            .await?;
        process::Entity::delete_by_id(process_id)
            .exec(&self.db)
            .await?;
        tracing::info!(event = "process.gone", reservations_released = released);
        Ok(released)
    }

    /// Forgets every process whose heartbeat stopped, releasing its reservations.
    pub async fn sweep_silent(&self) -> DomainResult<u64> {
        let now = now_ms();
        let mut released = 0;
        for row in self.others().await? {
            if Self::silent(&row, now) {
                released += self.gone(&row.id).await?;
            }
        }
        Ok(released)
    }
}
