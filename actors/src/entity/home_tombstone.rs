//! Tombstones: the storage id of a deleted computer, written with the row's deletion, so the
//! reconciler knows which stored objects this deployment orphaned.

use sea_orm::entity::prelude::*;

/// One row of `home_tombstones`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "home_tombstones")]
pub struct Model {
    /// The deleted computer's storage id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub storage_id: String,
    /// When the computer was deleted.
    pub deleted_at_ms: i64,
}

/// No declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
