//! A person or service that signs in with API tokens.

use sea_orm::entity::prelude::*;

/// One row of `users`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "users")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Display name.
    pub name: String,
    /// Contact address, if known.
    pub email: Option<String>,
    /// Operators see every space and run maintenance.
    pub is_operator: bool,
    /// Creation time.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
