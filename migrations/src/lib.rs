//! Database migrations for Rakazo Runtime; the same set runs on SQLite and Postgres.
//!
//! Times are stored as integer milliseconds since the Unix epoch (`*_at_ms`) and identifiers
//! as text, so both backends see exactly the same column types.

pub use sea_orm_migration::MigratorTrait;
use sea_orm_migration::prelude::*;

mod m20261129_000001_initial;
mod m20261129_000002_revision_fingerprint;
mod m20261201_000001_pending_restore;
mod m20261201_000002_processes;
mod m20261201_000003_bucket_safety;
mod m20261202_000001_computer_owners;
mod m20261202_000010_maintenance_jobs;
mod m20261203_000001_perf_lease_grant;
mod m20261203_000001_replay_timeline;
mod m20261204_000001_mcp_sessions;
mod m20261204_000002_process_host;
mod m20261205_000001_lease_grant_latest;
mod m20261206_000001_timeline_head_trigger;

/// Every migration of the product, oldest first.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_initial::Migration),
            Box::new(m20261129_000002_revision_fingerprint::Migration),
            Box::new(m20261201_000001_pending_restore::Migration),
            Box::new(m20261201_000002_processes::Migration),
            Box::new(m20261201_000003_bucket_safety::Migration),
            Box::new(m20261202_000001_computer_owners::Migration),
            Box::new(m20261202_000010_maintenance_jobs::Migration),
            Box::new(m20261203_000001_perf_lease_grant::Migration),
            Box::new(m20261203_000001_replay_timeline::Migration),
            Box::new(m20261204_000001_mcp_sessions::Migration),
            Box::new(m20261204_000002_process_host::Migration),
            Box::new(m20261205_000001_lease_grant_latest::Migration),
            Box::new(m20261206_000001_timeline_head_trigger::Migration),
        ]
    }
}
