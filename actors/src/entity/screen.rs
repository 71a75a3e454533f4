//! Bot screens on a computer: display slot and generation.

use sea_orm::entity::prelude::*;

/// One row of `screens`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "screens")]
pub struct Model {
    /// Identifier.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The computer.
    pub computer_id: String,
    /// The bot this screen belongs to.
    pub bot_id: String,
    /// Display slot while active (display `:slot+1`); empty when released.
    pub slot: Option<i64>,
    /// Grows whenever the slot is (re)assigned or torn down; capabilities bind it.
    pub generation: i64,
    /// `active`, `released`, `evicted` (gave way at the screen limit), or `teardown_failed`
    /// (slot kept reserved for retry).
    pub state: String,
    /// The bot's persistent browser profile, relative to the workspace.
    pub profile_path: String,
    /// Last graphical use, for eviction under a screen limit.
    pub last_used_at_ms: i64,
    /// Last change.
    pub updated_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
