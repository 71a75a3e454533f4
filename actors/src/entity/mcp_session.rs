//! MCP sessions: each is one run of a bot, answered by any API process.

use sea_orm::entity::prelude::*;

/// One row of `mcp_sessions`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "mcp_sessions")]
pub struct Model {
    /// SHA-256 (hex) of the `Mcp-Session-Id`; the id itself is never stored.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id_hash: String,
    /// The token's user.
    pub user_id: String,
    /// The bot whose run the session is.
    pub bot_id: String,
    pub space_id: String,
    pub computer_id: String,
    pub run_id: String,
    /// The run's execution fence.
    pub fence: i64,
    pub created_at_ms: i64,
    /// When a call last began or ended, as far as any process has written it down (at most
    /// one sweep interval behind a process's own view).
    pub last_used_ms: i64,
    /// When the run's execution lease expires unless renewed.
    pub lease_expires_ms: i64,
}

/// No declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
