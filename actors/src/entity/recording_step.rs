//! One recorded step of a run: an observation or an action batch, with its result.

use sea_orm::entity::prelude::*;

/// One row of `recording_steps`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "recording_steps")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The run.
    pub run_id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot.
    pub bot_id: String,
    /// The step's entry in the computer's timeline (its order).
    pub timeline_position: i64,
    /// `computer_observe` or `computer_act`.
    pub tool: String,
    /// The action batch as JSON (typed text redacted), for `computer_act`.
    pub actions: Option<String>,
    /// The result as JSON (completed, total, the stop).
    pub result: String,
    /// The frame the bot saw after the step (a `recording_frames` digest).
    pub frame_digest: Option<String>,
    /// Bytes this step added to the recording (its new frame sealed, if any).
    pub bytes: i64,
    /// When.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
