//! Spaces (workspaces): the unit of sharing, each with one owner.

use sea_orm::entity::prelude::*;

/// One row of `spaces`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "spaces")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Display name.
    pub name: String,
    /// The owning user.
    pub owner_id: String,
    /// The space's content key, wrapped by the server key.
    pub wrapped_content_key: Option<Vec<u8>>,
    /// Creation time.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
