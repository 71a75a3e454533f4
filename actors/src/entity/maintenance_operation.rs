//! Durable maintenance jobs (update, recovery) with their reservation.

use sea_orm::entity::prelude::*;

/// One row of `maintenance_operations`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "maintenance_operations")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// `update` or `recovery`.
    pub kind: String,
    /// `queued`, `running`, `interrupted`, `completed` or `failed`.
    pub state: String,
    /// Actual lifecycle stage.
    pub stage: Option<String>,
    /// The worker that claimed it.
    pub worker_id: Option<String>,
    /// Last worker heartbeat.
    pub heartbeat_at_ms: Option<i64>,
    /// Failure reason.
    pub error: Option<String>,
    /// Creation time.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
