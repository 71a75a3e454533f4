//! Per-object checks after dispatch admitted the caller's scope (`METHODS`): operators reach
//! every space, users the spaces they are members of, a bot token only its own bot, its space
//! (for events filtered to its bot) and the computer its bot uses.

use rakazo_actors::entity::{bot, computer, space, space_member};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};

use crate::auth::{Caller, Scope};

/// A space the caller may use.
pub async fn space(
    db: &DatabaseConnection,
    caller: &Caller,
    space_id: &str,
) -> DomainResult<space::Model> {
    let found = space::Entity::find_by_id(space_id)
        .one(db)
        .await?
        .ok_or_else(|| DomainError::not_found("space"))?;
    let member = match caller.scope {
        Scope::User => space_member::Entity::find()
            .filter(space_member::Column::SpaceId.eq(space_id))
            .filter(space_member::Column::UserId.eq(&caller.user_id))
            .one(db)
            .await?
            .is_some(),
        _ => false,
    };
    // Not reached: the space is invisible, not forbidden.
    if space_reached(caller, &found.id, member) {
        Ok(found)
    } else {
        Err(DomainError::not_found("space"))
    }
}

/// Whether the caller may use an existing space: operators every one, a bot token its bot's,
/// a user those it is a `member` of.
pub fn space_reached(caller: &Caller, space_id: &str, member: bool) -> bool {
    match &caller.scope {
        Scope::Operator => true,
        Scope::Bot { space_id: own, .. } => own == space_id,
        Scope::User => member,
    }
}

/// A bot the caller may use, with its space.
pub async fn bot(
    db: &DatabaseConnection,
    caller: &Caller,
    bot_id: &str,
) -> DomainResult<(bot::Model, space::Model)> {
    if caller.bot_id().is_some_and(|scoped| scoped != bot_id) {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "this token is scoped to another bot",
        ));
    }
    let found = bot::Entity::find_by_id(bot_id)
        .one(db)
        .await?
        .ok_or_else(|| DomainError::not_found("bot"))?;
    let space = space(db, caller, &found.space_id)
        .await
        .map_err(|_| DomainError::not_found("bot"))?;
    Ok((found, space))
}

/// Whether a computer is one a bot token may reach: its bot's private computer, or the Team
/// Computer of its space when its bot is a Team bot. Other scopes are checked by space.
pub async fn bot_reaches(
    db: &DatabaseConnection,
    caller: &Caller,
    c: &computer::Model,
) -> DomainResult<bool> {
    let Some(scoped) = caller.bot_id() else {
        return Ok(true);
    };
    if c.bot_id.as_deref() == Some(scoped) {
        return Ok(true);
    }
    if c.bot_id.is_some() || c.kind != "team" {
        return Ok(false);
    }
    let own = bot::Entity::find_by_id(scoped).one(db).await?;
    Ok(own.is_some_and(|b| b.computer_mode == "team" && b.space_id == c.space_id))
}

/// Refuse bot-scoped tokens for space-level administration.
pub fn not_bot_scoped(caller: &Caller) -> DomainResult<()> {
    if caller.bot_id().is_some() {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "bot-scoped tokens cannot do this",
        ));
    }
    Ok(())
}
