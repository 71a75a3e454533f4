//! The MCP session sweeper, one in every process: it writes down this process's use of
//! sessions, ends sessions idle past `MCP_SESSION_IDLE_MS` and renews the leases of the
//! others, over every session of the deployment (so a session outlives the process that
//! answered it). Processes sweeping at once agree through the table's conditional statements:
//! one of them ends an idle session, and a use written down by any keeps it.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rakazo_actors::ErrorCode;
use rakazo_actors::clock::now_ms;
use rakazo_actors::entity::{mcp_session, run};
use rakazo_actors::runs::RunState;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter};

use super::{Session, renew, table};
use crate::api::methods::{self, EndedBy};
use crate::app::App;

/// How often the sweeper looks at sessions: often enough to renew a lease before it is
/// past half its life and to end an idle session close to its time. It is also the most a
/// row's last use lags a process's own view.
pub fn sweep_every(app: &App) -> Duration {
    let shortest = app.config.run_lease_ttl.min(app.config.mcp_session_idle);
    (shortest / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// The session sweeper, for as long as the app lives.
pub async fn sweep(app: Weak<App>) {
    let Some(every) = app.upgrade().map(|a| sweep_every(&a)) else {
        return;
    };
    let mut tick = actix_rt::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(app) = app.upgrade() else { return };
        sweep_once(&app).await;
    }
}

/// The runs among these that are over.
async fn ended_runs(app: &App, rows: &[mcp_session::Model]) -> Result<HashSet<String>, DbErr> {
    let ids = rows.iter().map(|r| r.run_id.clone());
    Ok(run::Entity::find()
        .filter(run::Column::Id.is_in(ids))
        .all(&app.db)
        .await?
        .into_iter()
        .filter(|r| RunState::parse_outcome(&r.state).is_some())
        .map(|r| r.id)
        .collect())
}

/// One look at every session of the deployment.
async fn sweep_once(app: &App) {
    if let Err(e) = look(app).await {
        tracing::warn!(event = "mcp.sweep_failed", error = %e);
    }
}

async fn look(app: &App) -> Result<(), DbErr> {
    let rows = table::all(&app.db).await?;
    // Sessions ended elsewhere leave this process's cache.
    let live: HashSet<&str> = rows.iter().map(|r| r.id_hash.as_str()).collect();
    app.mcp.retain(|key, _| live.contains(key.as_str()));
    if rows.is_empty() {
        return Ok(());
    }
    let ended = ended_runs(app, &rows).await?;
    let idle_ms = app.config.mcp_session_idle.as_millis() as i64;
    let lag_ms = sweep_every(app).as_millis() as i64;
    let half_lease = methods::lease_ttl_ms(app) / 2;
    for row in rows {
        let now = now_ms();
        let here = app.mcp.get(&row.id_hash).map(|e| e.value().clone());
        if ended.contains(&row.run_id) {
            // The run ended elsewhere (`bot.stop`, `run.finish`): so does the session.
            if table::end(&app.db, &row.id_hash).await? {
                tracing::info!(event = "mcp.session_lost");
            }
            app.mcp.remove(&row.id_hash);
            continue;
        }
        let mut last_used = row.last_used_ms;
        if let Some(s) = &here
            && let Some(at) = s.unwritten_use(now)
        {
            if !table::used(&app.db, &row.id_hash, at).await? {
                // Ended by another process since this look began.
                app.mcp.remove(&row.id_hash);
                continue;
            }
            s.stored_ms.fetch_max(at, Ordering::SeqCst);
            last_used = last_used.max(at);
        }
        // Idle past its time even if some process used it up to one sweep before writing
        // that down: decided by the row, so a use written since keeps the session.
        if last_used <= now - idle_ms - lag_ms {
            if table::end_idle(&app.db, &row.id_hash, now - idle_ms - lag_ms).await? {
                app.mcp.remove(&row.id_hash);
                expire(app, &row).await;
            }
            continue;
        }
        let lease_expires = here
            .as_ref()
            .map_or(0, |s| s.lease_expires_ms.load(Ordering::SeqCst))
            .max(row.lease_expires_ms);
        if now >= lease_expires - half_lease {
            let s = here.unwrap_or_else(|| Arc::new(Session::from_row(row.clone())));
            match renew(app, &s).await {
                Ok(()) => {}
                Err(e) if matches!(e.code, ErrorCode::LeaseFenced | ErrorCode::NotFound) => {
                    // The run ended elsewhere (`bot.stop`, `run.finish`): so does the session.
                    table::end(&app.db, &row.id_hash).await?;
                    app.mcp.remove(&row.id_hash);
                    tracing::info!(event = "mcp.session_lost", code = ?e.code);
                }
                Err(e) => tracing::warn!(event = "mcp.lease_not_renewed", code = ?e.code),
            }
        }
    }
    Ok(())
}

/// Ends an idle session's run as canceled (control revoked, workspace checkpointed).
async fn expire(app: &App, row: &mcp_session::Model) {
    match methods::end_run(
        app,
        &row.run_id,
        row.fence,
        RunState::Canceled,
        EndedBy::McpIdle,
    )
    .await
    {
        Ok(_) => tracing::info!(event = "mcp.session_expired"),
        Err(e) => {
            tracing::warn!(event = "mcp.session_expired", code = ?e.code, error = %e.message)
        }
    }
}
