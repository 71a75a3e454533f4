//! The anchor of a computer's timeline: its last position and hash, moved by compare-and-set.

use sea_orm::entity::prelude::*;

/// One row of `timeline_heads`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "timeline_heads")]
pub struct Model {
    /// The computer.
    #[sea_orm(primary_key, auto_increment = false)]
    pub computer_id: String,
    /// The last entry's position.
    pub position: i64,
    /// The last entry's hash.
    pub hash: String,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
