//! Keeps the screens' rows in step with the provider's freezes and thaws of desktops: an
//! `active` row becomes `frozen` and back, and a `screen.state` event says so. Rows in any
//! other state (torn down, released) are left alone.

use rakazo_actors::entity::{computer, screen};
use rakazo_actors::events::{EventBus, Topic};
use rakazo_actors::provider::DesktopFreeze;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use tokio::sync::broadcast::{Receiver, error::RecvError};

/// Follows `freezes` for as long as the provider sends them.
pub fn follow_desktop_freezes(
    db: DatabaseConnection,
    events: EventBus,
    mut freezes: Receiver<DesktopFreeze>,
) {
    tokio::spawn(async move {
        loop {
            match freezes.recv().await {
                Ok(change) => {
                    if let Err(e) = apply(&db, &events, &change).await {
                        tracing::warn!(bot.id = %change.bot_id, error = %e, "screen.freeze.row_failed");
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "screen.freeze.lagged");
                }
                Err(RecvError::Closed) => break,
            }
        }
    });
}

async fn apply(
    db: &DatabaseConnection,
    events: &EventBus,
    change: &DesktopFreeze,
) -> Result<(), sea_orm::DbErr> {
    let (from, to) = if change.frozen {
        ("active", "frozen")
    } else {
        ("frozen", "active")
    };
    let computers = computer::Entity::find()
        .filter(computer::Column::ProviderRef.eq(change.machine.0.as_str()))
        .all(db)
        .await?;
    for c in computers {
        let updated = screen::Entity::update_many()
            .col_expr(screen::Column::State, Expr::value(to))
            .col_expr(
                screen::Column::UpdatedAtMs,
                Expr::value(rakazo_actors::clock::now_ms()),
            )
            .filter(screen::Column::ComputerId.eq(c.id.as_str()))
            .filter(screen::Column::BotId.eq(change.bot_id.as_str()))
            .filter(screen::Column::State.eq(from))
            .exec(db)
            .await?;
        if updated.rows_affected > 0 {
            tracing::info!(computer.id = %c.id, bot.id = %change.bot_id, screen.state = to, "screen.freeze.row");
            events.publish(
                &c.space_id,
                Topic::ScreenState,
                serde_json::json!({ "computerId": c.id, "botId": change.bot_id, "state": to }),
            );
        }
    }
    Ok(())
}
