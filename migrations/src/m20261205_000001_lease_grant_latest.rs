//! `rakazo_lease_grant` reads only the latest grant of the key and of the maintenance
//! reservation (by the `ux_leases_fence` index), not every lease of the computer: only a
//! key's latest grant can be live, as the general path already assumes, and a check over every
//! row made each grant slower with the history of leases.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The grant of `m20261203_000001_perf_lease_grant`, with the live check on the latest rows.
const GRANT: &str = r#"
CREATE OR REPLACE FUNCTION rakazo_lease_grant(
    p_id TEXT, p_computer TEXT, p_kind TEXT, p_subject TEXT, p_holder TEXT,
    p_now BIGINT, p_expires BIGINT
) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    granted BIGINT;
BEGIN
    UPDATE computers SET lease_epoch = lease_epoch + 1 WHERE id = p_computer;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO leases (id, computer_id, kind, subject, holder, fence, expires_at_ms,
                        released_at_ms, created_at_ms)
    SELECT p_id, p_computer, p_kind, p_subject, p_holder,
           COALESCE((SELECT MAX(fence) FROM leases
                     WHERE computer_id = p_computer AND kind = p_kind AND subject = p_subject), 0) + 1,
           p_expires, NULL, p_now
    WHERE NOT EXISTS (
        SELECT 1 FROM (SELECT released_at_ms, expires_at_ms FROM leases
                       WHERE computer_id = p_computer AND kind = p_kind AND subject = p_subject
                       ORDER BY fence DESC LIMIT 1) AS last
        WHERE last.released_at_ms IS NULL AND last.expires_at_ms > p_now)
      AND NOT EXISTS (
        SELECT 1 FROM (SELECT released_at_ms, expires_at_ms FROM leases
                       WHERE computer_id = p_computer AND kind = 'maintenance' AND subject = '*'
                       ORDER BY fence DESC LIMIT 1) AS reserved
        WHERE reserved.released_at_ms IS NULL AND reserved.expires_at_ms > p_now)
    RETURNING fence INTO granted;
    RETURN granted;
END
$$
"#;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if db.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(GRANT).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if db.get_database_backend() == DbBackend::Postgres {
            db.execute_unprepared(crate::m20261203_000001_perf_lease_grant::GRANT)
                .await?;
        }
        Ok(())
    }
}
