//! Maintenance jobs: what a durable update, recovery or reset job needs beyond its state and
//! stage (its space, who asked, the fence of its computer-wide reservation, when a worker
//! claimed and finished it, when it was last published to the workers, and its note).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let table = Alias::new("maintenance_operations");
        let columns = [
            ColumnDef::new(Alias::new("space_id"))
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("requested_by"))
                .text()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("lease_fence"))
                .big_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("claimed_at_ms"))
                .big_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("finished_at_ms"))
                .big_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("published_at_ms"))
                .big_integer()
                .null()
                .to_owned(),
            ColumnDef::new(Alias::new("note")).text().null().to_owned(),
        ];
        // One column per statement: SQLite alters one at a time.
        for mut column in columns {
            manager
                .alter_table(
                    Table::alter()
                        .table(table.clone())
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
