//! Database connection and migrations (SQLite by default, Postgres by `DATABASE_URL`).

use std::time::Duration;

use rakazo_migrations::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// Connect to `url`, creating the SQLite file's directory when needed.
pub async fn connect(url: &str) -> Result<DatabaseConnection, DbErr> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let path = path.split('?').next().unwrap_or_default();
        if let Some(dir) = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| DbErr::Custom(format!("create {}: {e}", dir.display())))?;
        }
    }
    let mut options = ConnectOptions::new(url.to_owned());
    options
        .sqlx_logging(false)
        .connect_timeout(Duration::from_secs(10))
        .max_connections(16)
        // A connection is pinged only after a pause long enough for a server, proxy or
        // firewall to have dropped it, not on every checkout: a ping per statement was one
        // extra round trip (to Postgres, or to a SQLite connection's worker thread) each.
        .test_before_acquire_if_idle_for(PING_AFTER_IDLE)
        // Set on every pooled connection as it opens (a pragma run through the pool reaches
        // only the one connection that ran it). Readers never wait for the writer, the WAL is
        // synced at checkpoints rather than on every commit, and the busy timeout covers
        // writer contention.
        .map_sqlx_sqlite_opts(|o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
        });
    Database::connect(options).await
}

/// How long a pooled connection may sit idle before it is pinged on its next checkout.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(30);

/// How long a SQLite connection waits for another writer before `SQLITE_BUSY`.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Apply every pending migration.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}
