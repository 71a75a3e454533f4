//! Bearer tokens; only a SHA-256 hash of each token is stored.

use sea_orm::entity::prelude::*;

/// One row of `api_tokens`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_tokens")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The user the token signs in as.
    pub user_id: String,
    /// Hex SHA-256 of the token.
    pub token_hash: String,
    /// What the token is for.
    pub label: String,
    /// Set for tokens scoped to one bot (agent runtimes, MCP).
    pub bot_id: Option<String>,
    /// Creation time.
    pub created_at_ms: i64,
    /// Set once revoked; a revoked token never signs in.
    pub revoked_at_ms: Option<i64>,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
