//! Each stretch a computer runs at its provider (`computer_runs`).

use sea_orm::entity::prelude::*;

/// One row of `computer_runs`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "computer_runs")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// Attributed user (cleared on user deletion).
    pub user_id: Option<String>,
    /// Attributed space.
    pub space_id: Option<String>,
    /// `team` or `private`.
    pub kind: String,
    /// Provider it ran at.
    pub provider_kind: String,
    /// When it became ready.
    pub started_at_ms: i64,
    /// When it stopped.
    pub ended_at_ms: Option<i64>,
    /// `stopped`, `idle`, `active_limit`, `replaced`, `gone`, `deleted` or `reconciled`.
    pub end_reason: Option<String>,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
