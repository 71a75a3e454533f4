//! Bucket safety: the deployment's own settings (its random id, which names its prefix in the
//! bucket) and tombstones of deleted computers' storage ids (what the reconciler may remove).

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let text = |name: &str| {
            ColumnDef::new(Alias::new(name))
                .text()
                .not_null()
                .to_owned()
        };
        let int = |name: &str| {
            ColumnDef::new(Alias::new(name))
                .big_integer()
                .not_null()
                .to_owned()
        };
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("deployment_settings"))
                    .if_not_exists()
                    .col(text("name").primary_key())
                    .col(text("value"))
                    .col(int("created_at_ms"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("home_tombstones"))
                    .if_not_exists()
                    .col(text("storage_id").primary_key())
                    .col(int("deleted_at_ms"))
                    .to_owned(),
            )
            .await
    }
}
