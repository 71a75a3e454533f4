//! Where a live socket's capability stands against the lease and screen tables: the one rule
//! of this process's sweep and of `POST /internal/screen-standing`, which a screen proxy in
//! its own process asks for the sockets it relays.

use rakazo_actors::entity::screen;
use rakazo_actors::leases::{LeaseKey, Leases};
use rakazo_web_proxy::{Policy, SocketScope, Standing};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};

/// Whether `scope` is still granted: its screen row has its slot and generation active (or
/// frozen) and, for control, its fence is the live control grant's (whose expiry it answers).
/// `Unknown` on a database error: nothing is closed on it.
pub async fn standing(db: &DatabaseConnection, scope: &SocketScope) -> Standing {
    let rows = screen::Entity::find()
        .filter(screen::Column::ComputerId.eq(scope.computer_id.as_str()))
        .filter(screen::Column::BotId.eq(scope.bot_id.as_str()))
        .all(db)
        .await;
    let Ok(rows) = rows else {
        return Standing::Unknown;
    };
    let current = rows.iter().any(|r| {
        matches!(r.state.as_str(), "active" | "frozen")
            && r.slot == Some(i64::from(scope.slot))
            && r.generation == scope.generation as i64
    });
    if !current {
        return Standing::SlotRetired;
    }
    if scope.policy != Policy::Control {
        return Standing::Holds {
            expires_at_ms: None,
        };
    }
    let key = LeaseKey::control(&scope.computer_id, &scope.bot_id);
    match Leases::new(db.clone()).live(&key).await {
        Ok(Some(grant)) if grant.fence == scope.fence as i64 => Standing::Holds {
            expires_at_ms: Some(grant.expires_at_ms.max(0) as u64),
        },
        Ok(_) => Standing::ControlEnded,
        Err(_) => Standing::Unknown,
    }
}
