//! A frame a bot saw during a run, sealed under its computer's recording key, stored once per
//! run by content digest.

use sea_orm::entity::prelude::*;

/// One row of `recording_frames`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "recording_frames")]
pub struct Model {
    /// The run.
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    /// The PNG's digest (the tools' `frameDigest`).
    #[sea_orm(primary_key, auto_increment = false)]
    pub digest: String,
    /// The computer (deleted with it).
    pub computer_id: String,
    /// Width in pixels.
    pub width: i32,
    /// Height in pixels.
    pub height: i32,
    /// The PNG, sealed.
    pub sealed: Vec<u8>,
    /// When it was first seen.
    pub created_at_ms: i64,
}

/// No declared relations: queries join explicitly.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
