//! Processes of the deployment: each `rakazo serve` registers a row and beats its heartbeat.
//! A maintenance reservation names the process that holds it (`<what>@<process id>`), so a
//! reservation held by a process that is gone is released once that process provably
//! stopped: its heartbeat is older than [`GONE_AFTER_MS`], or the caller proved it otherwise
//! (a process on the same data directory whose lock is free).

use std::sync::OnceLock;
use std::time::Duration;

use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};

use crate::clock::{new_id, now_ms};
use crate::entity::{lease, process};
use crate::error::DomainResult;

/// How often a process beats its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);
/// A process whose heartbeat is older than this is gone (six missed beats).
pub const GONE_AFTER_MS: i64 = 60_000;

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
        now.saturating_sub(row.heartbeat_at_ms) > GONE_AFTER_MS
    }

    /// A process is gone: releases the maintenance reservations it held and forgets it.
    /// Returns how many reservations were released.
    pub async fn gone(&self, process_id: &str) -> DomainResult<u64> {
        let released = lease::Entity::update_many()
            .col_expr(lease::Column::ReleasedAtMs, Expr::value(now_ms()))
            .filter(lease::Column::Kind.eq("maintenance"))
            .filter(lease::Column::ReleasedAtMs.is_null())
            .filter(lease::Column::Holder.like(format!("%@{process_id}")))
            .exec(&self.db)
            .await?
            .rows_affected;
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
