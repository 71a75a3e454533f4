//! Which process holds each computer's actor (`computer_owners`).

use sea_orm::entity::prelude::*;

/// One row of `computer_owners`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "computer_owners")]
pub struct Model {
    /// The computer.
    #[sea_orm(primary_key, auto_increment = false)]
    pub computer_id: String,
    /// The process (a `processes` row) whose actor holds it.
    pub process_id: String,
    /// When that process claimed it.
    pub claimed_at_ms: i64,
}

/// No declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
