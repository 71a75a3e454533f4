//! Processes of the deployment and their heartbeats.

use sea_orm::entity::prelude::*;

/// One row of `processes`.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "processes")]
pub struct Model {
    /// Random id of one run of a `rakazo serve` or `rakazo worker` process.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// When it started.
    pub started_at_ms: i64,
    /// Its last heartbeat.
    pub heartbeat_at_ms: i64,
    /// Where other processes reach its internal endpoints (`http://host:port`); `None` when
    /// it serves none.
    pub address: Option<String>,
    /// The loopback it shares ([`crate::processes::host`]): processes with the same host reach
    /// each other's services on 127.0.0.1; `None` for a row written before hosts were named.
    pub host: Option<String>,
}

/// No declared relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
