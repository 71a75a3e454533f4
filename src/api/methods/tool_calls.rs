//! `tools/call {runId, fence, name, arguments, vision?}`: an agent runtime calls one computer
//! tool under its run's execution lease.

use rakazo_actors::DomainResult;
use serde::Deserialize;
use serde_json::Value;

use super::Ctx;
use super::computers::fenced_tool_run;
use crate::tools::{self, ToolCtx};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CallParams {
    run_id: String,
    fence: i64,
    name: String,
    #[serde(default)]
    arguments: Value,
    #[serde(default = "yes")]
    vision: bool,
}

fn yes() -> bool {
    true
}

/// Call a tool; the answer is an MCP `CallToolResult`.
pub async fn call(ctx: &Ctx<'_>, params: Value) -> DomainResult<Value> {
    let p: CallParams = super::params(params)?;
    let fenced = fenced_tool_run(ctx, &p.run_id, p.fence).await?;
    let tcx = ToolCtx::new(ctx.app, fenced, p.vision, ctx.attachments);
    Ok(tools::call(&tcx, &p.name, p.arguments).await)
}
