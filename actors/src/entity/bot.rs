//! Bots: agents that drive computers.

use sea_orm::entity::prelude::*;

/// One row of `bots`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "bots")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The space the bot belongs to.
    pub space_id: String,
    /// Display name.
    pub name: String,
    /// `team` (the space's Team Computer) or `private` (its own computer).
    pub computer_mode: String,
    /// Creation time.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
