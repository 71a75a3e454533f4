//! Revisions remember the workspace fingerprint they were exported at, so a checkpoint of an
//! unchanged workspace stores nothing new.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("home_revisions"))
                    .add_column(ColumnDef::new(Alias::new("fingerprint")).text().null())
                    .to_owned(),
            )
            .await
    }
}
