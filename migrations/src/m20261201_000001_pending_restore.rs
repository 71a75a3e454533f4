//! A restore is a state of the computer: the revision a machine must import before it is
//! next used, kept until it has.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Alias::new("computers"))
                    .add_column(
                        ColumnDef::new(Alias::new("pending_restore_revision"))
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await
    }
}
