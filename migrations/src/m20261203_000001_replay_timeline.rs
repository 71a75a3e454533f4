//! The attributed timeline of each computer (a hash chain anchored by its head row) and run
//! recordings: the steps a bot took and the sealed frames it saw, each frame stored once.

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
                    .table(Alias::new("timeline_entries"))
                    .col(col("id").text().not_null().primary_key())
                    .col(col("computer_id").text().not_null())
                    .col(col("space_id").text().not_null())
                    .col(col("position").big_integer().not_null())
                    .col(col("actor_kind").text().not_null())
                    .col(col("actor_id").text().null())
                    .col(col("bot_id").text().null())
                    .col(col("run_id").text().null())
                    .col(col("kind").text().not_null())
                    .col(col("subject").text().not_null())
                    .col(col("detail").text().not_null())
                    .col(col("created_at_ms").big_integer().not_null())
                    .col(col("prev_hash").text().not_null())
                    .col(col("hash").text().not_null())
                    .to_owned(),
            )
            .await?;
        // Two appends racing for the same next position collide here; the head's
        // compare-and-set decides first, this holds even if it did not.
        manager
            .create_index(
                Index::create()
                    .name("ux_timeline_position")
                    .table(Alias::new("timeline_entries"))
                    .col(Alias::new("computer_id"))
                    .col(Alias::new("position"))
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("timeline_heads"))
                    .col(col("computer_id").text().not_null().primary_key())
                    .col(col("position").big_integer().not_null())
                    .col(col("hash").text().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("recording_steps"))
                    .col(col("id").text().not_null().primary_key())
                    .col(col("run_id").text().not_null())
                    .col(col("computer_id").text().not_null())
                    .col(col("bot_id").text().not_null())
                    .col(col("timeline_position").big_integer().not_null())
                    .col(col("tool").text().not_null())
                    .col(col("actions").text().null())
                    .col(col("result").text().not_null())
                    .col(col("frame_digest").text().null())
                    .col(col("bytes").big_integer().not_null())
                    .col(col("created_at_ms").big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_recording_steps_run")
                    .table(Alias::new("recording_steps"))
                    .col(Alias::new("run_id"))
                    .col(Alias::new("timeline_position"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Alias::new("recording_frames"))
                    .col(col("run_id").text().not_null())
                    .col(col("digest").text().not_null())
                    .col(col("computer_id").text().not_null())
                    .col(col("width").integer().not_null())
                    .col(col("height").integer().not_null())
                    .col(col("sealed").blob().not_null())
                    .col(col("created_at_ms").big_integer().not_null())
                    .primary_key(
                        Index::create()
                            .col(Alias::new("run_id"))
                            .col(Alias::new("digest")),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("ix_recording_frames_computer")
                    .table(Alias::new("recording_frames"))
                    .col(Alias::new("computer_id"))
                    .to_owned(),
            )
            .await
    }
}
