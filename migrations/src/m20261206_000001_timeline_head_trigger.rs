//! The timeline's head follows its entries: a trigger moves `timeline_heads` to every entry
//! inserted, in the inserting statement, so an append is one statement (the entry goes in
//! only where the head is still the entry it chained to) instead of a transaction that moves
//! the head and then inserts.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

const SQLITE_UP: &str = "CREATE TRIGGER timeline_head_follows AFTER INSERT ON timeline_entries \
BEGIN \
    INSERT OR REPLACE INTO timeline_heads (computer_id, position, hash) \
    VALUES (NEW.computer_id, NEW.position, NEW.hash); \
END";

const POSTGRES_UP: [&str; 2] = [
    r#"
CREATE OR REPLACE FUNCTION rakazo_timeline_head_follows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO timeline_heads (computer_id, position, hash)
    VALUES (NEW.computer_id, NEW.position, NEW.hash)
    ON CONFLICT (computer_id) DO UPDATE SET position = EXCLUDED.position, hash = EXCLUDED.hash;
    RETURN NEW;
END
$$
"#,
    "CREATE TRIGGER timeline_head_follows AFTER INSERT ON timeline_entries \
     FOR EACH ROW EXECUTE FUNCTION rakazo_timeline_head_follows()",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match db.get_database_backend() {
            DbBackend::Postgres => {
                for sql in POSTGRES_UP {
                    db.execute_unprepared(sql).await?;
                }
            }
            _ => {
                db.execute_unprepared(SQLITE_UP).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match db.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared(
                    "DROP TRIGGER IF EXISTS timeline_head_follows ON timeline_entries",
                )
                .await?;
                db.execute_unprepared("DROP FUNCTION IF EXISTS rakazo_timeline_head_follows()")
                    .await?;
            }
            _ => {
                db.execute_unprepared("DROP TRIGGER IF EXISTS timeline_head_follows")
                    .await?;
            }
        }
        Ok(())
    }
}
