//! The activity feed: `computer.command` events of mutating tools.

use sea_orm::entity::prelude::*;

/// One row of `activity_events`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "activity_events")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// Monotonic order within the process that wrote it.
    pub seq: i64,
    /// The space.
    pub space_id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot.
    pub bot_id: String,
    /// Event kind (`computer.command`).
    pub kind: String,
    /// The tool (`shell`, `write_file`, ...).
    pub tool: String,
    /// The command, secrets redacted.
    pub command: String,
    /// Tail of the output.
    pub output_tail: Option<String>,
    /// Size for writes.
    pub size_bytes: Option<i64>,
    /// The error, if it failed.
    pub error: Option<String>,
    /// When it happened.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
