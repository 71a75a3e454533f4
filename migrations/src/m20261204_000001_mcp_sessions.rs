//! MCP sessions live in the database, so any API process answers a session another opened,
//! and any process's sweeper ends it when it idles or renews its lease while it lives.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

fn col(name: &str) -> ColumnDef {
    ColumnDef::new(Alias::new(name))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("mcp_sessions"))
                    .col(col("id_hash").text().not_null().primary_key())
                    .col(col("user_id").text().not_null())
                    .col(col("bot_id").text().not_null())
                    .col(col("space_id").text().not_null())
                    .col(col("computer_id").text().not_null())
                    .col(col("run_id").text().not_null())
                    .col(col("fence").big_integer().not_null())
                    .col(col("created_at_ms").big_integer().not_null())
                    .col(col("last_used_ms").big_integer().not_null())
                    .col(col("lease_expires_ms").big_integer().not_null())
                    .to_owned(),
            )
            .await
    }
}
