//! `rakazo_lease_grant`: on Postgres, the common lease grant (nothing live on the key, no live
//! maintenance reservation) in one round trip, under the computer row's lock. SQLite needs no
//! function: one `INSERT ... SELECT` statement already holds the database's write lock.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Takes the computer row's lock (as every lease decision of the computer does), then inserts
/// the next fence of the key unless a grant of the key or the computer's maintenance
/// reservation is live. Each statement of a volatile function reads a fresh snapshot, so the
/// insert sees whatever the lock waited for. Answers the fence, or NULL when nothing was
/// granted (the caller then decides through the general path).
pub(crate) const GRANT: &str = r#"
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
        SELECT 1 FROM leases
        WHERE computer_id = p_computer
          AND ((kind = p_kind AND subject = p_subject) OR (kind = 'maintenance' AND subject = '*'))
          AND released_at_ms IS NULL AND expires_at_ms > p_now)
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
            db.execute_unprepared(
                "DROP FUNCTION IF EXISTS rakazo_lease_grant(TEXT, TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT)",
            )
            .await?;
        }
        Ok(())
    }
}
