//! Each computer's actor lives in one process: `computer_owners` names it, and `processes`
//! learns where another process can reach it (its internal address).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("computer_owners"))
                    .col(
                        ColumnDef::new(Alias::new("computer_id"))
                            .text()
                            .not_null()
                            .primary_key(),
                    )
                    .col(ColumnDef::new(Alias::new("process_id")).text().not_null())
                    .col(
                        ColumnDef::new(Alias::new("claimed_at_ms"))
                            .big_integer()
                            .not_null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("processes"))
                    .add_column(ColumnDef::new(Alias::new("address")).text().null())
                    .to_owned(),
            )
            .await
    }
}
