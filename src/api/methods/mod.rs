//! The RPC methods, transport-free: HTTP and websocket both call [`call`].

mod access;
mod activity;
mod computers;
mod homes;
mod runs;
mod tool_calls;

pub use runs::run_json;
mod spaces;

use rakazo_actors::entity::run;
use rakazo_actors::{DomainError, DomainResult, ErrorCode};
use sea_orm::{DatabaseConnection, EntityTrait};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::app::App;
use crate::auth::Caller;

/// A call's context: the app and who is calling.
pub struct Ctx<'a> {
    /// The app.
    pub app: &'a App,
    /// The authenticated caller.
    pub caller: &'a Caller,
}

impl Ctx<'_> {
    /// The database.
    pub fn db(&self) -> &DatabaseConnection {
        &self.app.db
    }

    /// Whether a run's bot works on a Team Computer.
    pub async fn is_team_bot(&self, run: &run::Model) -> DomainResult<bool> {
        let bot = rakazo_actors::entity::bot::Entity::find_by_id(&run.bot_id)
            .one(self.db())
            .await?;
        Ok(bot.is_some_and(|b| b.computer_mode == "team"))
    }
}

/// Deserialize parameters, turning every mismatch into `INVALID_PARAMS`.
pub fn params<T: DeserializeOwned>(params: Value) -> DomainResult<T> {
    let params = if params.is_null() {
        Value::Object(Default::default())
    } else {
        params
    };
    serde_json::from_value(params).map_err(|e| DomainError::invalid(format!("invalid params: {e}")))
}

/// Every method name, for discovery.
pub const METHODS: &[&str] = &[
    "space.create",
    "space.list",
    "space.addMember",
    "user.create",
    "bot.create",
    "bot.list",
    "bot.stop",
    "bot.status",
    "token.createForBot",
    "computer.get",
    "computer.list",
    "computer.forBot",
    "computer.exec",
    "computer.openScreen",
    "computer.machine",
    "computer.stop",
    "computer.revisions",
    "computer.restoreRevision",
    "computer.delete",
    "computer.takeControl",
    "computer.screenUrl",
    "computer.releaseControl",
    "computer.renewControl",
    "computer.terminalUrl",
    "run.start",
    "run.get",
    "run.renew",
    "run.requestTakeover",
    "run.resume",
    "run.finish",
    "tools/list",
    "tools/call",
    "activity.list",
    "files.list",
    "files.read",
    "files.upload",
];

/// Dispatch one method call.
pub async fn call(ctx: &Ctx<'_>, method: &str, params: Value) -> DomainResult<Value> {
    match method {
        "space.create" => spaces::create_space(ctx, params).await,
        "space.list" => spaces::list_spaces(ctx).await,
        "space.addMember" => spaces::add_member(ctx, params).await,
        "user.create" => spaces::create_user(ctx, params).await,
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
        other => Err(DomainError::new(
            ErrorCode::InvalidParams,
            format!("unknown method `{other}`"),
        )),
    }
}

/// Whether the caller may see a space (for subscriptions).
pub async fn visible_space(ctx: &Ctx<'_>, space_id: &str) -> DomainResult<()> {
    access::space(ctx.db(), ctx.caller, space_id)
        .await
        .map(|_| ())
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

/// A run with its fence checked, and its computer's actors.
pub async fn fenced(
    ctx: &Ctx<'_>,
    run_id: &str,
    fence: i64,
) -> DomainResult<(run::Model, rakazo_actors::registry::ComputerHandle)> {
    computers::fenced_run(ctx, run_id, fence).await
}
