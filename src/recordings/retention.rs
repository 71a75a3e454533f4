//! Retention of run recordings: steps and frames older than `RECORDING_RETENTION_DAYS` go,
//! checked at start and every hour by every process (the deletes are idempotent).

use std::time::Duration;

use rakazo_actors::DomainResult;
use rakazo_actors::entity::{recording_frame, recording_step};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};

/// How often old recordings are looked for.
pub const RETENTION_EVERY: Duration = Duration::from_secs(3600);

const DAY_MS: i64 = 24 * 3600 * 1000;

/// Delete what was recorded before `now_ms` minus `days`; answers the frames and steps gone.
pub async fn sweep(db: &DatabaseConnection, days: u32, now_ms: i64) -> DomainResult<(u64, u64)> {
    let cutoff = now_ms - i64::from(days) * DAY_MS;
    let frames = recording_frame::Entity::delete_many()
        .filter(recording_frame::Column::CreatedAtMs.lt(cutoff))
        .exec(db)
        .await?
        .rows_affected;
    let steps = recording_step::Entity::delete_many()
        .filter(recording_step::Column::CreatedAtMs.lt(cutoff))
        .exec(db)
        .await?
        .rows_affected;
    if frames + steps > 0 {
        tracing::info!(event = "recording.expired", frames, steps);
    }
    Ok((frames, steps))
}

/// Sweep now and every [`RETENTION_EVERY`] while the process lives (with recording off,
/// whatever an earlier configuration recorded goes at the first sweep).
pub fn spawn_retention(db: DatabaseConnection, days: u32, clock: rakazo_actors::clock::Clock) {
    actix_rt::spawn(async move {
        let mut every = tokio::time::interval(RETENTION_EVERY);
        loop {
            every.tick().await;
            if let Err(e) = sweep(&db, days, clock.now_ms()).await {
                tracing::warn!(event = "recording.retention_failed", code = e.code.as_str());
            }
        }
    });
}
