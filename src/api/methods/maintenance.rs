//! Maintenance: `computer.update`, `computer.recover`, `computer.reset` queue a durable
//! operation under the computer-wide reservation; `computer.operations` restores a space's
//! active and failed operations; `computer.releaseInterrupted` (the server owner, in a space
//! they own) releases an interrupted one.

use rakazo_actors::maintenance::{Maintenance, OpKind};
use rakazo_actors::{DomainError, DomainResult};
use serde::Deserialize;
use serde_json::{Value, json};

use super::computers::visible;
use super::{Ctx, access};

pub use rakazo_actors::maintenance::operation_json;

fn ops(ctx: &Ctx<'_>) -> Maintenance {
    Maintenance::new(ctx.db().clone(), ctx.app.runtime().clock.clone())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ById {
    computer_id: String,
}

/// Queue `kind` on a computer and hand it to the workers.
pub async fn enqueue(ctx: &Ctx<'_>, params: Value, kind: OpKind) -> DomainResult<Value> {
    let p: ById = super::params(params)?;
    let c = visible(ctx, &p.computer_id).await?;
    ctx.app.runtime().provider()?;
    let queued = ops(ctx).enqueue(&c, kind, &ctx.caller.user_id).await?;
    tracing::info!(event = "maintenance.queued", operation.id = %queued.id, computer.id = %c.id, kind = kind.as_str());
    // Workers (this process too when it does the worker's part) run what is announced queued.
    rakazo_actors::maintenance::announce(&ctx.app.runtime().events, &queued);
    Ok(operation_json(&queued))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BySpace {
    space_id: String,
}

/// `computer.operations {spaceId}`: queued, running and interrupted operations of a space and
/// its failures of the last day (what the dashboard restores on reopening).
pub async fn list(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: BySpace = super::params(params)?;
    access::space(ctx.db(), ctx.caller, &p.space_id).await?;
    let rows = ops(ctx).for_space(&p.space_id).await?;
    Ok(json!({ "operations": rows.iter().map(operation_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Release {
    id: String,
    #[serde(default)]
    workers_stopped: bool,
}

/// `computer.releaseInterrupted {id, workersStopped: true}`: the server owner asserts the
/// operation's workers and provider calls stopped; recovery becomes available.
pub async fn release_interrupted(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: Release = super::params(params)?;
    let ops = ops(ctx);
    let found = ops.get(&p.id).await?;
    let space_id = found
        .space_id
        .clone()
        .ok_or_else(|| DomainError::not_found("operation"))?;
    // The server owner (operator scope, checked by dispatch), and only in a space they own.
    let space = access::space(ctx.db(), ctx.caller, &space_id)
        .await
        .map_err(|_| DomainError::not_found("operation"))?;
    if space.owner_id != ctx.caller.user_id {
        return Err(DomainError::not_found("operation"));
    }
    let released = ops
        .release_interrupted(&p.id, &space_id, p.workers_stopped)
        .await?;
    rakazo_actors::maintenance::announce(&ctx.app.runtime().events, &released);
    Ok(operation_json(&released))
}
