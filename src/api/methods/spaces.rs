//! Spaces, bots and users.

use rakazo_actors::clock::{new_id, now_ms};
use rakazo_actors::computers::Computers;
use rakazo_actors::entity::{
    activity_event, api_token, bot, maintenance_operation, run, space, space_member, user,
};
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SetMode {
    bot_id: String,
    computer_mode: String,
}

/// `bot.setComputerMode {botId, computerMode: team|private}`: move a bot between the Team
/// Computer and a Private Computer, under the maintenance reservation of both
/// (`COMPUTER_RESERVED` while one is reserved, `STOP_BOT_FIRST` while the bot drives or a
/// person controls its screen). Its workspace folder is not carried over.
pub async fn set_bot_mode(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: SetMode = super::params(params)?;
    let (b, _) = access::bot(ctx.db(), ctx.caller, &p.bot_id).await?;
    let changed =
        rakazo_actors::computer_mode::change(ctx.db(), &b, p.computer_mode.as_str()).await?;
    Ok(bot_json(&changed))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BySpace {
    space_id: String,
}

/// `space.delete {spaceId}` (the space owner, or the operator): the space with its computers
/// (machines destroyed, stored workspaces forgotten, as `computer.delete`), bots and their
/// tokens, members, runs, activity and maintenance operations. Its `computer_runs` rows stay
/// with `spaceId` cleared. `LEASE_HELD` while a bot drives one of its computers or one is
/// reserved; nothing is deleted then.
pub async fn delete_space(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    access::not_bot_scoped(ctx.caller)?;
    let p: BySpace = super::params(params)?;
    let s = access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    if !ctx.caller.is_operator() && s.owner_id != ctx.caller.user_id {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            "only the space owner deletes a space",
        ));
    }
    let computers = Computers::new(ctx.db().clone()).in_space(&s.id).await?;
    for c in &computers {
        super::homes::refuse_if_busy(ctx, c).await?;
    }
    remove_space(ctx, &s, &computers).await?;
    Ok(json!({ "deleted": s.id }))
}

async fn remove_space(
    ctx: &Ctx<'_>,
    s: &space::Model,
    computers: &[rakazo_actors::entity::computer::Model],
) -> DomainResult<()> {
    for c in computers {
        super::homes::destroy(ctx, c).await?;
    }
    let bots: Vec<String> = bot::Entity::find()
        .filter(bot::Column::SpaceId.eq(&s.id))
        .all(ctx.db())
        .await?
        .into_iter()
        .map(|b| b.id)
        .collect();
    Computers::new(ctx.db().clone())
        .forget_space_in_runs(&s.id)
        .await?;
    let txn = ctx.db().begin().await?;
    api_token::Entity::delete_many()
        .filter(api_token::Column::BotId.is_in(bots))
        .exec(&txn)
        .await?;
    bot::Entity::delete_many()
        .filter(bot::Column::SpaceId.eq(&s.id))
        .exec(&txn)
        .await?;
    space_member::Entity::delete_many()
        .filter(space_member::Column::SpaceId.eq(&s.id))
        .exec(&txn)
        .await?;
    run::Entity::delete_many()
        .filter(run::Column::SpaceId.eq(&s.id))
        .exec(&txn)
        .await?;
    activity_event::Entity::delete_many()
        .filter(activity_event::Column::SpaceId.eq(&s.id))
        .exec(&txn)
        .await?;
    maintenance_operation::Entity::delete_many()
        .filter(maintenance_operation::Column::SpaceId.eq(&s.id))
        .exec(&txn)
        .await?;
    space::Entity::delete_by_id(&s.id).exec(&txn).await?;
    txn.commit().await?;
    tracing::info!(event = "space.deleted", space.id = %s.id, computers = computers.len());
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ByUser {
    user_id: String,
}

/// `user.delete {userId}` (the operator): the user with their tokens and memberships, and the
/// spaces they own (as `space.delete`). Their `computer_runs` rows stay with `userId` cleared.
/// The operator cannot delete an operator. `LEASE_HELD` while a bot drives a computer of one
/// of their spaces or one is reserved; nothing is deleted then.
pub async fn delete_user(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: ByUser = super::params(params)?;
    let u = user::Entity::find_by_id(&p.user_id)
        .one(ctx.db())
        .await?
        .ok_or_else(|| DomainError::not_found("user"))?;
    if u.is_operator {
        return Err(DomainError::invalid("an operator cannot be deleted"));
    }
    let owned = space::Entity::find()
        .filter(space::Column::OwnerId.eq(&u.id))
        .all(ctx.db())
        .await?;
    let mut spaces = Vec::new();
    for s in owned {
        let computers = Computers::new(ctx.db().clone()).in_space(&s.id).await?;
        for c in &computers {
            super::homes::refuse_if_busy(ctx, c).await?;
        }
        spaces.push((s, computers));
    }
    for (s, computers) in &spaces {
        remove_space(ctx, s, computers).await?;
    }
    Computers::new(ctx.db().clone())
        .forget_user_in_runs(&u.id)
        .await?;
    let txn = ctx.db().begin().await?;
    api_token::Entity::delete_many()
        .filter(api_token::Column::UserId.eq(&u.id))
        .exec(&txn)
        .await?;
    space_member::Entity::delete_many()
        .filter(space_member::Column::UserId.eq(&u.id))
        .exec(&txn)
        .await?;
    user::Entity::delete_by_id(&u.id).exec(&txn).await?;
    txn.commit().await?;
    tracing::info!(event = "user.deleted", user.id = %u.id, spaces = spaces.len());
    Ok(json!({ "deleted": u.id }))
}
