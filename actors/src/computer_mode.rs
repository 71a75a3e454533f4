//! Moving a bot between its space's Team Computer and a Private Computer of its own
//! (`bot.setComputerMode`). A mode change runs under the computer-wide maintenance reservation
//! of every computer it concerns (the one the bot uses now and, when it exists, the one it
//! moves to), like update, recovery and idle suspension: it is refused with
//! `COMPUTER_RESERVED` while one of them is reserved (an operation, an interrupted one not yet
//! released, an idle suspension, another mode change), and while it holds them no run starts,
//! no person takes control and no maintenance begins. A bot that drives its computer or whose
//! screen a person controls is refused with `STOP_BOT_FIRST`. The reservation names this
//! process, so a crash mid-change frees it with the process.

use sea_orm::{ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};

use crate::computers::home_key;
use crate::entity::{bot, computer};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::leases::{LeaseKey, LeaseKind, Leases};

/// Who holds the reservation of a mode change (with the change's own id and this process's).
pub const HOLDER: &str = "mode-change";
/// Longest a mode change holds its computers (it is released as soon as the row is written).
const RESERVATION_TTL_MS: i64 = 5 * 60 * 1000;

/// The two modes.
pub fn valid(mode: &str) -> bool {
    matches!(mode, "team" | "private")
}

/// Change `bot`'s computer mode to `mode` under the reservation; the updated bot.
pub async fn change(
    db: &DatabaseConnection,
    bot: &bot::Model,
    mode: &str,
) -> DomainResult<bot::Model> {
    change_with(db, bot, mode, async || {}).await
}

/// [`change`], calling `reserved` while the reservations are held and before the row is
/// written (tests look at what the reservation excludes there).
pub async fn change_with(
    db: &DatabaseConnection,
    bot: &bot::Model,
    mode: &str,
    reserved: impl AsyncFnOnce(),
) -> DomainResult<bot::Model> {
    if !valid(mode) {
        return Err(DomainError::invalid("computerMode must be team or private"));
    }
    if bot.computer_mode == mode {
        return Ok(bot.clone());
    }
    let moved = bot::Model {
        computer_mode: mode.to_owned(),
        ..bot.clone()
    };
    // The computers concerned that exist, in id order (one order for every change).
    let mut concerned = Vec::new();
    for key in [home_key(bot), home_key(&moved)] {
        if let Some(c) = computer::Entity::find()
            .filter(computer::Column::HomeKey.eq(key))
            .one(db)
            .await?
        {
            concerned.push(c.id);
        }
    }
    concerned.sort();
    let leases = Leases::new(db.clone());
    // One holder per change: two changes never share a reservation.
    let holder = crate::processes::holder(&format!("{HOLDER}:{}", crate::clock::new_id()));
    let mut held: Vec<(String, i64)> = Vec::new();
    let outcome = async {
        for id in &concerned {
            let grant = leases
                .acquire(&LeaseKey::maintenance(id), &holder, RESERVATION_TTL_MS)
                .await?;
            held.push((id.clone(), grant.fence));
        }
        // No lease can be granted on them now: one the bot holds stays until it ends.
        for id in &concerned {
            if leases
                .live_on(id)
                .await?
                .iter()
                .any(|g| g.kind != LeaseKind::Maintenance && g.subject == bot.id)
            {
                return Err(DomainError::code(ErrorCode::StopBotFirst));
            }
        }
        reserved().await;
        let mut row: bot::ActiveModel = bot.clone().into();
        row.computer_mode = Set(mode.to_owned());
        Ok(row.update(db).await?)
    }
    .await;
    for (id, fence) in held {
        if let Err(e) = leases.release(&LeaseKey::maintenance(&id), fence).await {
            tracing::warn!(event = "bot.mode_change_release_failed", computer.id = %id, error = %e);
        }
    }
    if let Ok(b) = &outcome {
        tracing::info!(event = "bot.mode_changed", bot.id = %b.id, mode = %b.computer_mode);
    }
    outcome
}
