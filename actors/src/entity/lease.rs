//! Lease grants: one row per grant, with a fence that only grows per lease key.

use sea_orm::entity::prelude::*;

/// One row of `leases`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "leases")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// `execution`, `control` or `maintenance`.
    pub kind: String,
    /// The bot id (execution, control) or `*` (maintenance).
    pub subject: String,
    /// Who holds it: a run id, a user id or an operation id.
    pub holder: String,
    /// Monotonic fence of this lease key.
    pub fence: i64,
    /// Expiry unless renewed.
    pub expires_at_ms: i64,
    /// Set on release.
    pub released_at_ms: Option<i64>,
    /// Grant time.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
