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
    /// The computer's space (releaseInterrupted accepts only the caller's).
    pub space_id: Option<String>,
    /// `update`, `recovery` or `reset`.
    pub kind: String,
    /// `queued`, `running`, `interrupted`, `released`, `completed` or `failed`.
    pub state: String,
    /// Actual lifecycle stage.
    pub stage: Option<String>,
    /// The worker that claimed it.
    pub worker_id: Option<String>,
    /// Last worker heartbeat.
    pub heartbeat_at_ms: Option<i64>,
    /// Failure reason.
    pub error: Option<String>,
    /// The user who asked.
    pub requested_by: Option<String>,
    /// Fence of the computer-wide maintenance reservation the job holds.
    pub lease_fence: Option<i64>,
    /// When a worker claimed it.
    pub claimed_at_ms: Option<i64>,
    /// When it completed, failed or was released.
    pub finished_at_ms: Option<i64>,
    /// When it was last handed to the workers (the reconciler republishes a missed one).
    pub published_at_ms: Option<i64>,
    /// What the person should know (a recovery that fell back to the last saved workspace).
    pub note: Option<String>,
    /// Creation time.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
