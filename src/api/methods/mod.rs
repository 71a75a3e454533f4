//! The RPC methods, transport-free: HTTP and websocket both call [`call`].

mod access;
mod activity;
mod computers;
mod homes;
mod maintenance;
mod runs;
mod tool_calls;

pub use computers::FencedRun;
pub use runs::{EndedBy, end_run, lease_ttl_ms, run_json, runs};
mod spaces;
mod timeline;

use rakazo_actors::maintenance::OpKind;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::DatabaseConnection;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::app::App;
use crate::auth::{Caller, ScopeKind};

/// A call's context: the app and who is calling.
pub struct Ctx<'a> {
    /// The app.
    pub app: &'a App,
    /// The authenticated caller.
    pub caller: &'a Caller,
    /// Where tool answers put their images when the transport carries binary messages.
    pub attachments: Option<&'a crate::tools::Attachments>,
}

impl Ctx<'_> {
    /// The database.
    pub fn db(&self) -> &DatabaseConnection {
        &self.app.db
    }
}

/// Deserialize parameters, turning every mismatch into `INVALID_PARAMS`.
pub fn params<T: DeserializeOwned>(params: Value) -> DomainResult<T> {
    refuse_positional(&params)?;
    let params = if params.is_null() {
        Value::Object(Default::default())
    } else {
        params
    };
    serde_json::from_value(params).map_err(|e| DomainError::invalid(format!("invalid params: {e}")))
}

/// Parameters are named: an array (positional parameters) is `INVALID_PARAMS`.
fn refuse_positional(params: &Value) -> DomainResult<()> {
    if params.is_array() {
        return Err(DomainError::invalid(
            "params must be an object of named parameters, not an array",
        ));
    }
    Ok(())
}

/// One RPC method and the scopes that may call it. Dispatch refuses every other scope with
/// `FORBIDDEN` before the method runs; the method then checks the objects it touches
/// (space membership, the bot of a bot token, control holders) through [`access`].
#[derive(Debug)]
pub struct Method {
    /// The method name.
    pub name: &'static str,
    /// The scopes admitted.
    pub scopes: &'static [ScopeKind],
}

/// Operators, users and bot tokens (a bot token only for its own bot).
const ANY: &[ScopeKind] = &[ScopeKind::Operator, ScopeKind::User, ScopeKind::Bot];
/// People: operators and users, never a bot token.
const PEOPLE: &[ScopeKind] = &[ScopeKind::Operator, ScopeKind::User];
/// Operators only.
const OPERATOR: &[ScopeKind] = &[ScopeKind::Operator];

const fn m(name: &'static str, scopes: &'static [ScopeKind]) -> Method {
    Method { name, scopes }
}

/// Every method with its scopes: the one place a method's callers are decided.
pub const METHODS: &[Method] = &[
    m("space.create", PEOPLE),
    m("space.list", PEOPLE),
    m("space.addMember", PEOPLE),
    m("user.create", OPERATOR),
    m("user.delete", OPERATOR),
    m("space.delete", PEOPLE),
    m("bot.setComputerMode", PEOPLE),
    m("bot.create", PEOPLE),
    m("bot.list", PEOPLE),
    m("bot.stop", ANY),
    m("bot.status", ANY),
    m("token.createForBot", PEOPLE),
    m("computer.get", ANY),
    m("computer.list", PEOPLE),
    m("computer.forBot", ANY),
    m("computer.exec", ANY),
    m("computer.openScreen", ANY),
    m("computer.machine", OPERATOR),
    m("computer.stop", ANY),
    m("computer.revisions", ANY),
    m("computer.restoreRevision", PEOPLE),
    m("computer.delete", PEOPLE),
    m("computer.takeControl", PEOPLE),
    m("computer.screenUrl", ANY),
    m("computer.releaseControl", PEOPLE),
    m("computer.renewControl", PEOPLE),
    m("computer.terminalUrl", PEOPLE),
    m("computer.update", PEOPLE),
    m("computer.recover", PEOPLE),
    m("computer.reset", PEOPLE),
    m("computer.operations", PEOPLE),
    m("computer.releaseInterrupted", OPERATOR),
    m("run.start", ANY),
    m("run.get", ANY),
    m("run.renew", ANY),
    m("run.requestTakeover", ANY),
    m("run.resume", ANY),
    m("run.finish", ANY),
    m("tools/list", ANY),
    m("tools/call", ANY),
    m("activity.list", ANY),
    m("files.list", ANY),
    m("files.read", ANY),
    m("files.upload", PEOPLE),
    m("activity.timeline", PEOPLE),
    m("activity.verify", PEOPLE),
    m("run.replay", PEOPLE),
    m("run.replayFrame", PEOPLE),
    m("control.replay", PEOPLE),
    m("control.replayFrame", PEOPLE),
];

/// The method of a name.
pub fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// Refuse a caller whose scope the method does not admit (unknown methods are
/// `METHOD_NOT_FOUND`).
pub fn admit(caller: &Caller, name: &str) -> DomainResult<()> {
    let Some(found) = method(name) else {
        return Err(unknown_method(name));
    };
    if !found.scopes.contains(&caller.kind()) {
        return Err(DomainError::new(
            ErrorCode::Forbidden,
            format!("this token's scope cannot call `{name}`"),
        ));
    }
    Ok(())
}

fn unknown_method(name: &str) -> DomainError {
    DomainError::new(
        ErrorCode::MethodNotFound,
        format!(
            "unknown method `{name}`: see tools/list for the agent tools and the README's method table"
        ),
    )
}

/// Who a caller is on the timeline: a bot token is its bot, any other token a person.
pub fn actor_of(caller: &Caller) -> rakazo_actors::timeline::Actor {
    match caller.bot_id() {
        Some(bot) => rakazo_actors::timeline::Actor::bot(bot),
        None => rakazo_actors::timeline::Actor::user(&caller.user_id),
    }
}

/// Dispatch one method call, acting as its caller on the timeline.
pub async fn call(ctx: &Ctx<'_>, method: &str, params: Value) -> DomainResult<Value> {
    admit(ctx.caller, method)?;
    refuse_positional(&params)?;
    let answer =
        rakazo_actors::timeline::acting_as(actor_of(ctx.caller), dispatch(ctx, method, params))
            .await;
    // The state changes the call made are in the timeline before its caller goes on.
    ctx.app.runtime().events.journaled().await;
    answer
}

async fn dispatch(ctx: &Ctx<'_>, method: &str, params: Value) -> DomainResult<Value> {
    match method {
        "space.create" => spaces::create_space(ctx, params).await,
        "space.list" => spaces::list_spaces(ctx).await,
        "space.addMember" => spaces::add_member(ctx, params).await,
        "user.create" => spaces::create_user(ctx, params).await,
        "user.delete" => spaces::delete_user(ctx, params).await,
        "space.delete" => spaces::delete_space(ctx, params).await,
        "bot.setComputerMode" => spaces::set_bot_mode(ctx, params).await,
        "bot.create" => spaces::create_bot(ctx, params).await,
        "bot.list" => spaces::list_bots(ctx, params).await,
        "bot.stop" => runs::stop_bot(ctx, params).await,
        "token.createForBot" => spaces::create_bot_token(ctx, params).await,
        "computer.get" => computers::get(ctx, params).await,
        "computer.list" => computers::list(ctx, params).await,
        "computer.forBot" => computers::for_bot(ctx, params).await,
        "computer.exec" => computers::exec(ctx, params).await,
        "computer.openScreen" => computers::open_screen(ctx, params).await,
        "computer.machine" => computers::machine(ctx, params).await,
        "computer.stop" => computers::stop(ctx, params).await,
        "computer.revisions" => homes::revisions(ctx, params).await,
        "computer.restoreRevision" => homes::restore(ctx, params).await,
        "computer.delete" => homes::delete(ctx, params).await,
        "computer.takeControl" => runs::take_control(ctx, params).await,
        "computer.screenUrl" => runs::screen_url(ctx, params).await,
        "computer.terminalUrl" => runs::terminal_url(ctx, params).await,
        "computer.renewControl" => runs::renew_control(ctx, params).await,
        "bot.status" => runs::bot_status(ctx, params).await,
        "computer.releaseControl" => runs::release_control(ctx, params).await,
        "computer.update" => maintenance::enqueue(ctx, params, OpKind::Update).await,
        "computer.recover" => maintenance::enqueue(ctx, params, OpKind::Recovery).await,
        "computer.reset" => maintenance::enqueue(ctx, params, OpKind::Reset).await,
        "computer.operations" => maintenance::list(ctx, params).await,
        "computer.releaseInterrupted" => maintenance::release_interrupted(ctx, params).await,
        "run.start" => runs::start(ctx, params).await,
        "run.get" => runs::get(ctx, params).await,
        "run.renew" => runs::renew(ctx, params).await,
        "run.requestTakeover" => runs::request_takeover(ctx, params).await,
        "run.resume" => runs::resume(ctx, params).await,
        "run.finish" => runs::finish(ctx, params).await,
        "tools/list" => Ok(serde_json::json!({ "tools": crate::tools::definitions() })),
        "tools/call" => tool_calls::call(ctx, params).await,
        "activity.list" => activity::list(ctx, params).await,
        "files.list" => activity::list_files(ctx, params).await,
        "files.read" => activity::read_file(ctx, params).await,
        "files.upload" => activity::upload(ctx, params).await,
        "activity.timeline" => timeline::list(ctx, params).await,
        "activity.verify" => timeline::verify(ctx, params).await,
        "run.replay" => timeline::replay(ctx, params).await,
        "run.replayFrame" => timeline::replay_frame(ctx, params).await,
        "control.replay" => timeline::control_replay(ctx, params).await,
        "control.replayFrame" => timeline::control_replay_frame(ctx, params).await,
        other => Err(unknown_method(other)),
    }
}

/// Whether the caller may see a space (for subscriptions).
pub async fn visible_space(ctx: &Ctx<'_>, space_id: &str) -> DomainResult<()> {
    access::space(ctx.db(), ctx.caller, space_id)
        .await
        .map(|_| ())
}

/// Whether a bot-scoped caller reaches a computer (always true for people; for event
/// filtering outside `call`).
pub async fn bot_reaches(
    db: &DatabaseConnection,
    caller: &Caller,
    c: &rakazo_actors::entity::computer::Model,
) -> DomainResult<bool> {
    access::bot_reaches(db, caller, c).await
}

/// A bot the caller may use, with its space (for transports outside `call`).
pub async fn access_bot(
    ctx: &Ctx<'_>,
    bot_id: &str,
) -> DomainResult<(
    rakazo_actors::entity::bot::Model,
    rakazo_actors::entity::space::Model,
)> {
    access::bot(ctx.db(), ctx.caller, bot_id).await
}

/// A run with its fence checked, its computer's actors and where its bot works.
pub async fn fenced(ctx: &Ctx<'_>, run_id: &str, fence: i64) -> DomainResult<FencedRun> {
    computers::fenced_tool_run(ctx, run_id, fence).await
}
