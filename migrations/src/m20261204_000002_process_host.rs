//! Each process names the loopback it shares (`host`), so a process relays another's screens
//! straight to its gateways only when it can reach them, and through that process's proxy
//! otherwise.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("processes"))
                    .add_column(ColumnDef::new(Alias::new("host")).text().null())
                    .to_owned(),
            )
            .await
    }
}
