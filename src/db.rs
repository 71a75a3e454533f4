//! Database connection and migrations (SQLite by default, Postgres by `DATABASE_URL`).

use std::time::Duration;

use rakazo_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr};

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
        .max_connections(16);
    let db = Database::connect(options).await?;
    if db.get_database_backend() == DbBackend::Sqlite {
        // Readers never wait for the writer; the busy timeout covers writer contention.
        db.execute_unprepared(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;",
        )
        .await?;
    }
    Ok(db)
}

/// Apply every pending migration.
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}
