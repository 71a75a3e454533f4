//! Bot runs on computers.

use sea_orm::entity::prelude::*;

/// One row of `runs`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "runs")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The space.
    pub space_id: String,
    /// The bot.
    pub bot_id: String,
    /// The computer it drives.
    pub computer_id: String,
    /// `running`, `waiting_takeover`, `completed`, `failed` or `canceled`.
    pub state: String,
    /// The execution-lease fence the run holds.
    pub lease_fence: i64,
    /// When the bot asked for takeover.
    pub takeover_requested_at_ms: Option<i64>,
    /// Start.
    pub created_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
    /// End, once terminal.
    pub ended_at_ms: Option<i64>,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
