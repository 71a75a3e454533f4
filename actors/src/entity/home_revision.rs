//! Checkpointed workspace revisions.

use sea_orm::entity::prelude::*;

/// One row of `home_revisions`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "home_revisions")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// The workspace's home key.
    pub home_key: String,
    /// Revision number.
    pub revision: i64,
    /// Archive size.
    pub size_bytes: i64,
    /// Object-store key, when stored remotely.
    pub object_key: Option<String>,
    /// What triggered it.
    pub reason: String,
    /// Creation time.
    pub created_at_ms: i64,
    /// The workspace fingerprint the revision was exported at, when the provider gave one.
    pub fingerprint: Option<String>,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
