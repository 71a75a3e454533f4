//! Membership of users in spaces.

use sea_orm::entity::prelude::*;

/// One row of `space_members`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "space_members")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The space.
    pub space_id: String,
    /// The member.
    pub user_id: String,
    /// `owner` or `member`.
    pub role: String,
    /// Creation time.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
