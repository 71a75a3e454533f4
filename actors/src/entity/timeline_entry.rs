//! One entry of a computer's attributed timeline, chained to the one before by its hash.

use sea_orm::entity::prelude::*;

/// One row of `timeline_entries`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "timeline_entries")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer whose timeline it is.
    pub computer_id: String,
    /// The computer's space.
    pub space_id: String,
    /// Place in the computer's timeline, from 1, without gaps.
    pub position: i64,
    /// Who did it: `bot`, `user` or `system`.
    pub actor_kind: String,
    /// The bot or user id (none for the system).
    pub actor_id: Option<String>,
    /// The bot the entry concerns, if any.
    pub bot_id: Option<String>,
    /// The run the entry belongs to, if any.
    pub run_id: Option<String>,
    /// What kind of entry (`tool.call`, `control.session`, `run.state`, ...).
    pub kind: String,
    /// Its one-word subject (the tool, the new state, ...).
    pub subject: String,
    /// Its details as JSON, secrets redacted.
    pub detail: String,
    /// When it was appended.
    pub created_at_ms: i64,
    /// The hash of the entry before (64 zeros for the first).
    pub prev_hash: String,
    /// The hash of this entry (see `timeline::entry_hash`).
    pub hash: String,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
