//! Scoping: every call sees only the spaces of its caller (operators see all), and
//! bot-scoped tokens see only their bot.

use rakazo_actors::entity::{bot, space, space_member};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};

use crate::auth::Caller;

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
    if caller.is_operator {
        return Ok(found);
    }
    let member = space_member::Entity::find()
        .filter(space_member::Column::SpaceId.eq(space_id))
        .filter(space_member::Column::UserId.eq(&caller.user_id))
        .one(db)
        .await?;
    // Not a member: the space is invisible, not forbidden.
    member
        .map(|_| found)
        .ok_or_else(|| DomainError::not_found("space"))
}

/// A bot the caller may use, with its space.
pub async fn bot(
    db: &DatabaseConnection,
    caller: &Caller,
    bot_id: &str,
) -> DomainResult<(bot::Model, space::Model)> {
    if caller
        .bot_id
        .as_deref()
        .is_some_and(|scoped| scoped != bot_id)
    {
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

/// Refuse bot-scoped tokens for space-level administration.
pub fn not_bot_scoped(caller: &Caller) -> DomainResult<()> {
    if caller.bot_id.is_some() {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "bot-scoped tokens cannot do this",
        ));
    }
    Ok(())
}
