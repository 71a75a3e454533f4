//! The `mcp_sessions` table: the one record of every MCP session, so whichever API process a
//! call reaches answers it, and whichever process sweeps first ends it. Every change that
//! decides something (an end, a use) is one conditional statement, so processes racing on
//! one session never both act.

use rakazo_actors::entity::mcp_session::{self, Column, Entity, Model};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, Set};
use sha2::{Digest, Sha256};

/// The key a session is stored and cached under: the SHA-256 of its id, so neither the table
/// nor a log ever holds an id a client could use.
pub fn key(session_id: &str) -> String {
    hex::encode(Sha256::digest(session_id.as_bytes()))
}

/// Records a new session.
pub async fn insert(db: &DatabaseConnection, row: Model) -> Result<(), DbErr> {
    Entity::insert(mcp_session::ActiveModel {
        id_hash: Set(row.id_hash),
        user_id: Set(row.user_id),
        bot_id: Set(row.bot_id),
        space_id: Set(row.space_id),
        computer_id: Set(row.computer_id),
        run_id: Set(row.run_id),
        fence: Set(row.fence),
        created_at_ms: Set(row.created_at_ms),
        last_used_ms: Set(row.last_used_ms),
        lease_expires_ms: Set(row.lease_expires_ms),
    })
    .exec(db)
    .await?;
    Ok(())
}

/// The session stored under `key`, if it still lives.
pub async fn load(db: &DatabaseConnection, key: &str) -> Result<Option<Model>, DbErr> {
    Entity::find_by_id(key).one(db).await
}

/// Every live session (one per MCP client connected to the deployment).
pub async fn all(db: &DatabaseConnection) -> Result<Vec<Model>, DbErr> {
    Entity::find().all(db).await
}

/// Writes down a use at `at_ms` (never moving it back); `false` when the session is gone.
pub async fn used(db: &DatabaseConnection, key: &str, at_ms: i64) -> Result<bool, DbErr> {
    let moved = Entity::update_many()
        .col_expr(Column::LastUsedMs, Expr::value(at_ms))
        .filter(Column::IdHash.eq(key))
        .filter(Column::LastUsedMs.lt(at_ms))
        .exec(db)
        .await?
        .rows_affected;
    Ok(moved == 1 || load(db, key).await?.is_some())
}

/// Writes down the lease's new expiry (never moving it back).
pub async fn lease_renewed(
    db: &DatabaseConnection,
    key: &str,
    expires_ms: i64,
) -> Result<(), DbErr> {
    Entity::update_many()
        .col_expr(Column::LeaseExpiresMs, Expr::value(expires_ms))
        .filter(Column::IdHash.eq(key))
        .filter(Column::LeaseExpiresMs.lt(expires_ms))
        .exec(db)
        .await?;
    Ok(())
}

/// Ends the session if nothing used it after `idle_before_ms`; `true` for the one process
/// whose statement ended it.
pub async fn end_idle(
    db: &DatabaseConnection,
    key: &str,
    idle_before_ms: i64,
) -> Result<bool, DbErr> {
    let gone = Entity::delete_many()
        .filter(Column::IdHash.eq(key))
        .filter(Column::LastUsedMs.lte(idle_before_ms))
        .exec(db)
        .await?
        .rows_affected;
    Ok(gone == 1)
}

/// Ends the session whatever its use; `true` for the one caller whose statement ended it.
pub async fn end(db: &DatabaseConnection, key: &str) -> Result<bool, DbErr> {
    let gone = Entity::delete_by_id(key).exec(db).await?.rows_affected;
    Ok(gone == 1)
}
