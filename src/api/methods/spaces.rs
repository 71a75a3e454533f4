//! Spaces, bots and users.

use rakazo_actors::clock::{new_id, now_ms};
use rakazo_actors::entity::{bot, space, space_member};
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Ctx, access};
use crate::auth;

/// JSON form of a space.
pub fn space_json(s: &space::Model) -> Value {
    json!({ "id": s.id, "name": s.name, "ownerId": s.owner_id, "createdAtMs": s.created_at_ms })
}

/// JSON form of a bot.
pub fn bot_json(b: &bot::Model) -> Value {
    json!({ "id": b.id, "spaceId": b.space_id, "name": b.name, "computerMode": b.computer_mode,
            "createdAtMs": b.created_at_ms })
}

fn check_name(name: &str) -> DomainResult<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 120 {
        return Err(DomainError::invalid("name must be 1 to 120 characters"));
    }
    if name.chars().any(char::is_control) {
        return Err(DomainError::invalid(
            "names hold no NUL or control characters",
        ));
    }
    Ok(name.to_owned())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Named {
    name: String,
}

/// `space.create {name}`: the caller becomes owner and member.
pub async fn create_space(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: Named = super::params(params)?;
    let name = check_name(&p.name)?;
    let now = now_ms();
    let txn = ctx.db().begin().await?;
    let s = space::ActiveModel {
        id: Set(new_id()),
        name: Set(name),
        owner_id: Set(ctx.caller.user_id.clone()),
        wrapped_content_key: Set(None),
        created_at_ms: Set(now),
    }
    .insert(&txn)
    .await?;
    space_member::ActiveModel {
        id: Set(new_id()),
        space_id: Set(s.id.clone()),
        user_id: Set(ctx.caller.user_id.clone()),
        role: Set("owner".into()),
        created_at_ms: Set(now),
    }
    .insert(&txn)
    .await?;
    txn.commit().await?;
    Ok(space_json(&s))
}

/// `space.list`: the caller's spaces.
pub async fn list_spaces(ctx: &Ctx<'_>) -> DomainResult<Value> {
    let mut query = space::Entity::find().order_by_asc(space::Column::CreatedAtMs);
    if !ctx.caller.is_operator() {
        let ids: Vec<String> = space_member::Entity::find()
            .filter(space_member::Column::UserId.eq(&ctx.caller.user_id))
            .all(ctx.db())
            .await?
            .into_iter()
            .map(|m| m.space_id)
            .collect();
        query = query.filter(space::Column::Id.is_in(ids));
    }
    Ok(Value::Array(
        query.all(ctx.db()).await?.iter().map(space_json).collect(),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AddMember {
    space_id: String,
    user_id: String,
}

/// `space.addMember {spaceId, userId}`: owners and operators only.
pub async fn add_member(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: AddMember = super::params(params)?;
    let s = access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    if !ctx.caller.is_operator() && s.owner_id != ctx.caller.user_id {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "only the space owner adds members",
        ));
    }
    let inserted = space_member::ActiveModel {
        id: Set(new_id()),
        space_id: Set(s.id.clone()),
        user_id: Set(p.user_id.clone()),
        role: Set("member".into()),
        created_at_ms: Set(now_ms()),
    }
    .insert(ctx.db())
    .await;
    if inserted.is_err() {
        return Err(DomainError::invalid("already a member, or no such user"));
    }
    Ok(json!({ "spaceId": s.id, "userId": p.user_id }))
}

/// `user.create {name}`: operators create users and get their first token.
pub async fn create_user(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    if !ctx.caller.is_operator() {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "only operators create users",
        ));
    }
    let p: Named = super::params(params)?;
    let user = auth::create_user(ctx.db(), &check_name(&p.name)?, false).await?;
    let token = auth::issue(ctx.db(), &user.id, "first token", None).await?;
    Ok(json!({ "id": user.id, "name": user.name, "token": token }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateBot {
    space_id: String,
    name: String,
    #[serde(default = "team")]
    computer_mode: String,
}

fn team() -> String {
    "team".into()
}

/// `bot.create {spaceId, name, computerMode: team|private}`.
pub async fn create_bot(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: CreateBot = super::params(params)?;
    if p.computer_mode != "team" && p.computer_mode != "private" {
        return Err(DomainError::invalid("computerMode must be team or private"));
    }
    let s = access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    let b = bot::ActiveModel {
        id: Set(new_id()),
        space_id: Set(s.id),
        name: Set(check_name(&p.name)?),
        computer_mode: Set(p.computer_mode),
        created_at_ms: Set(now_ms()),
    }
    .insert(ctx.db())
    .await?;
    Ok(bot_json(&b))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct InSpace {
    pub space_id: String,
}

/// `bot.list {spaceId}`.
pub async fn list_bots(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: InSpace = super::params(params)?;
    let s = access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    let bots = bot::Entity::find()
        .filter(bot::Column::SpaceId.eq(s.id))
        .order_by_asc(bot::Column::CreatedAtMs)
        .all(ctx.db())
        .await?;
    Ok(Value::Array(bots.iter().map(bot_json).collect()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateToken {
    bot_id: String,
}

/// `token.createForBot {botId}`: a token scoped to one bot, for an agent runtime.
pub async fn create_bot_token(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: CreateToken = super::params(params)?;
    let (b, _) = access::bot(ctx.db(), ctx.caller, &p.bot_id).await?;
    let token = auth::issue(ctx.db(), &ctx.caller.user_id, "bot", Some(b.id.clone())).await?;
    Ok(json!({ "botId": b.id, "token": token }))
}
