//! The computer tools agents call (`computer_observe`, `computer_act`, `shell`, files,
//! `request_takeover`, ...): one transport-free dispatcher behind the JSON-RPC `tools/*`
//! methods and the MCP endpoint. Results use MCP's `CallToolResult` shape; a failed tool is an
//! `isError` result carrying the stable error code, so the agent can read it.

mod attachments;
mod economy;
mod schema;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use rakazo_actors::activity::{self, Command};
use rakazo_actors::computer::{Call, CallRead, Op, OpOutput};
use rakazo_actors::entity::{computer, run};
use rakazo_actors::provider::{
    ActStop, Action, BrowserCommand, ExecRequest, Frame, FrameSize, ListingPage, ListingRange,
};
use rakazo_actors::registry::ComputerHandle;
use rakazo_actors::runs::Runs;
use rakazo_actors::{DomainError, DomainResult, ErrorCode, screen};
use serde::Deserialize;
use serde_json::{Value, json};

pub use attachments::{Attachments, ID_BYTES as ATTACHMENT_ID_BYTES};
pub use economy::{Economy, digest as frame_digest};
pub use schema::definitions;

use crate::api::methods::FencedRun;
use crate::app::App;
use crate::providers::workspace_path;

/// Largest file `read_file` and `attach_file` return.
pub const MAX_READ_BYTES: usize = 8 * 1024 * 1024;
/// Entries of a folder `list_files` shows (the first, by name): a larger listing would fill
/// the model's context.
pub const MAX_LISTED: usize = 1000;
/// Output kept from each stream of a shell command.
const SHELL_TAIL_BYTES: usize = 16 * 1024;

/// Who is calling, on which run.
pub struct ToolCtx<'a> {
    /// The app.
    pub app: &'a App,
    /// The run (its fence was checked).
    pub run: run::Model,
    /// Whether the bot works on a Team Computer (its shell starts in `bots/<id>`).
    pub team: bool,
    /// The computer's actors.
    pub handle: ComputerHandle,
    /// Whether the caller can read images.
    pub vision: bool,
    /// Where images go when the transport carries them as binary messages (`None`: base64
    /// inside the answer).
    pub attachments: Option<&'a Attachments>,
    /// The computer's row as the call's checks read it, taken by its first operation.
    read: Mutex<Option<computer::Model>>,
    /// The activity rows of a call made through [`call`], written with its timeline entry
    /// (`None`: each is written at once).
    pending: Mutex<Option<Vec<Command>>>,
}

fn text(t: impl Into<String>) -> Value {
    json!({ "type": "text", "text": t.into() })
}

fn ok(content: Vec<Value>, structured: Value) -> Value {
    json!({ "content": content, "structuredContent": structured, "isError": false })
}

fn failed(e: &DomainError) -> Value {
    let mut content = vec![text(format!("{}: {}", e.code.as_str(), e.message))];
    if e.code == ErrorCode::ComputerQuarantined {
        // Only a person may recover or reset a computer; the bot can only say so.
        content.push(text(QUARANTINED_HINT));
    }
    json!({ "content": content,
            "structuredContent": { "error": { "code": e.code.as_str(), "message": e.message } }, "isError": true })
}

/// What a bot is told to do about its quarantined computer.
pub const QUARANTINED_HINT: &str = "No tool works on this computer until a person recovers or resets it: call request_takeover saying a command could not be stopped, or end your run.";

fn args<T: for<'de> Deserialize<'de>>(v: Value) -> DomainResult<T> {
    crate::api::methods::params(v)
}

fn tail(bytes: &str, max: usize) -> (String, bool) {
    if bytes.len() <= max {
        return (bytes.to_owned(), false);
    }
    let mut start = bytes.len() - max;
    while !bytes.is_char_boundary(start) {
        start += 1;
    }
    (bytes[start..].to_owned(), true)
}

impl<'a> ToolCtx<'a> {
    /// The context of a call on a run whose fence held.
    pub fn new(
        app: &'a App,
        fenced: FencedRun,
        vision: bool,
        attachments: Option<&'a Attachments>,
    ) -> Self {
        Self {
            app,
            run: fenced.run,
            team: fenced.team,
            handle: fenced.handle,
            vision,
            attachments,
            read: Mutex::new(Some(fenced.computer)),
            pending: Mutex::new(None),
        }
    }

    /// The folder relative paths start from: `bots/<bot id>` on a Team Computer, the
    /// workspace root otherwise.
    fn base(&self) -> String {
        if self.team {
            format!("bots/{}", self.run.bot_id)
        } else {
            String::new()
        }
    }

    /// The workspace path an agent's path means (see [`workspace_path::resolve`]).
    fn path(&self, path: &str, allow_root: bool) -> DomainResult<String> {
        Ok(workspace_path::resolve(&self.base(), path, allow_root)?)
    }

    /// A workspace path as the agent writes it.
    fn shown(&self, workspace_path: &str) -> String {
        workspace_path::shown(&self.base(), workspace_path)
    }

    async fn op(&self, op: Op) -> DomainResult<OpOutput> {
        let read = self
            .read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match read {
            Some(row) => {
                self.handle
                    .computer
                    .send(CallRead(op, Box::new(row)))
                    .await?
            }
            None => self.handle.computer.send(Call(op)).await?,
        }
    }

    async fn record(
        &self,
        tool: &str,
        command: String,
        output: Option<String>,
        size: Option<i64>,
        error: Option<String>,
    ) {
        let c = Command {
            space_id: self.run.space_id.clone(),
            computer_id: self.run.computer_id.clone(),
            bot_id: self.run.bot_id.clone(),
            tool: tool.into(),
            command,
            output,
            size_bytes: size,
            error,
        };
        if let Some(pending) = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            pending.push(c);
            return;
        }
        if let Err(e) = activity::record(&self.app.db, &self.app.runtime().events, c).await {
            tracing::warn!(event = "activity.record_failed", code = e.code.as_str());
        }
    }

    /// The answer of a tool that returns a screenshot: `frame`, whose digest is `digest`.
    async fn frame_result(&self, frame: &Frame, digest: &str, extra: Value) -> Value {
        let unchanged = self.app.tools.seen(&self.run.id, digest);
        let mut meta = json!({ "width": frame.width, "height": frame.height, "frameDigest": digest, "unchanged": unchanged });
        if let (Value::Object(m), Value::Object(e)) = (&mut meta, extra) {
            m.extend(e);
        }
        let mut content = Vec::new();
        if let (Some((screen_width, screen_height)), Some(scale)) = (frame.screen, scale_of(frame))
        {
            meta["scale"] = json!(scale);
            meta["screenWidth"] = json!(screen_width);
            meta["screenHeight"] = json!(screen_height);
            content.push(text(format!(
                "This screenshot is the {screen_width}x{screen_height} screen scaled to {}x{} (scale {scale}). Actions take screen pixels: divide image coordinates by {scale}.",
                frame.width, frame.height
            )));
        }
        if let Some(notice) = &frame.notice {
            meta["desktopNotice"] = json!(notice);
            content.push(text(notice));
        }
        if !self.vision {
            content.push(text("This caller reads no images: use browser_snapshot and browser_act for page text, or request_takeover."));
        } else if unchanged {
            content.push(text(
                "The screen has not changed: the previous screenshot remains valid.",
            ));
        } else {
            content.push(match self.attachments {
                Some(attachments) => json!({ "type": "image", "mimeType": "image/png",
                                             "attachment": attachments.attach(&frame.png) }),
                None => json!({ "type": "image", "mimeType": "image/png",
                                "data": base64::engine::general_purpose::STANDARD.encode(&frame.png) }),
            });
        }
        content.push(text(meta.to_string()));
        ok(content, meta)
    }
}

/// Call one tool. Precondition failures (unknown tool, bad arguments) and tool failures both
/// come back as `isError` results.
pub async fn call(ctx: &ToolCtx<'_>, name: &str, arguments: Value) -> Value {
    let summary = crate::recordings::calls::summary(&arguments);
    match as_tool_call(ctx, name, summary, dispatch(ctx, name, arguments)).await {
        Ok(v) => v,
        Err(e) => failed(&e),
    }
}

/// `computer.exec`: the `shell` tool's command with its whole output, in the activity feed and
/// the timeline as the tool's.
pub async fn shell_recorded(
    ctx: &ToolCtx<'_>,
    command: String,
    cwd: Option<String>,
    timeout_ms: Option<u64>,
) -> DomainResult<rakazo_actors::provider::ExecOutput> {
    let arguments = json!({ "command": command, "cwd": cwd, "timeoutMs": timeout_ms });
    let summary = crate::recordings::calls::summary(&arguments);
    let work = shell_exec(ctx, command, cwd, timeout_ms);
    as_tool_call(ctx, "shell", summary, work).await
}

/// Runs one tool's `work` as its bot, then puts it in the activity feed and the timeline
/// (observations and action batches put themselves there with their recording).
async fn as_tool_call<T>(
    ctx: &ToolCtx<'_>,
    name: &str,
    summary: Value,
    work: impl std::future::Future<Output = DomainResult<T>>,
) -> DomainResult<T> {
    let actor = rakazo_actors::timeline::Actor::bot(&ctx.run.bot_id);
    *ctx.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
    let outcome = rakazo_actors::timeline::acting_as(actor, work).await;
    let commands = ctx
        .pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .unwrap_or_default();
    ctx.app.runtime().events.journaled().await;
    if outcome.is_ok() && crate::recordings::calls::records_itself(name) {
        for c in commands {
            if let Err(e) = activity::record(&ctx.app.db, &ctx.app.runtime().events, c).await {
                tracing::warn!(event = "activity.record_failed", code = e.code.as_str());
            }
        }
    } else {
        let error = outcome.as_ref().err();
        crate::recordings::calls::note(ctx.app, &ctx.run, name, summary, error, commands).await;
    }
    outcome
}

async fn dispatch(ctx: &ToolCtx<'_>, name: &str, a: Value) -> DomainResult<Value> {
    match name {
        "computer_observe" => observe(ctx, a).await,
        "computer_act" => act(ctx, a).await,
        "shell" => shell(ctx, a).await,
        "read_file" => read_file(ctx, a, false).await,
        "attach_file" => read_file(ctx, a, true).await,
        "write_file" => write_file(ctx, a).await,
        "list_files" => list_files(ctx, a).await,
        "open_path" => open_path(ctx, a).await,
        "launch_app" => launch_app(ctx, a).await,
        "request_takeover" => request_takeover(ctx, a).await,
        "browser_navigate" | "browser_snapshot" | "browser_act" | "browser_dialog" => {
            browser(ctx, name, a).await
        }
        other => Err(DomainError::invalid(format!("unknown tool `{other}`"))),
    }
}

/// The bot's screen, made sure of before the tool's operation on it, which comes next and
/// checks the computer's row (so the held screen's own check needs no database read).
async fn open_screen(ctx: &ToolCtx<'_>) -> DomainResult<screen::ScreenState> {
    ctx.app
        .registry
        .screen(&ctx.handle, &ctx.run.bot_id)
        .send(screen::OpenBeforeOp)
        .await?
}

/// How much a scaled-down frame was shrunk (image width / screen width, four decimals);
/// `None` for a full-size frame.
fn scale_of(frame: &Frame) -> Option<f64> {
    let (screen_width, _) = frame.screen?;
    let scale = f64::from(frame.width) / f64::from(screen_width.max(1));
    Some((scale * 10_000.0).round() / 10_000.0)
}

/// A recorded step's result with the frame's `scale` when it was scaled down (the replay
/// draws the actions' screen points on it).
fn with_scale(mut result: Value, frame: &Frame) -> Value {
    if let Some(scale) = scale_of(frame) {
        result["scale"] = json!(scale);
    }
    result
}

/// The smallest `max_width` or `max_height` a screenshot may be asked for.
pub const MIN_FRAME_SIDE: u32 = 64;

/// The screenshot size a tool call asks for (`max_width`, `max_height`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SizeArgs {
    #[serde(default)]
    max_width: Option<u32>,
    #[serde(default)]
    max_height: Option<u32>,
}

impl SizeArgs {
    fn size(&self) -> DomainResult<FrameSize> {
        for (name, v) in [
            ("max_width", self.max_width),
            ("max_height", self.max_height),
        ] {
            if v.is_some_and(|v| v < MIN_FRAME_SIDE) {
                return Err(DomainError::invalid(format!(
                    "{name} must be at least {MIN_FRAME_SIDE}"
                )));
            }
        }
        Ok(FrameSize {
            max_width: self.max_width,
            max_height: self.max_height,
        })
    }
}

/// `frame` fitted to `size`: providers that capture only at full size leave the scaling here.
fn fit(frame: Frame, size: FrameSize) -> DomainResult<Frame> {
    if frame.screen.is_some() || size.fit(frame.width, frame.height) == (frame.width, frame.height)
    {
        return Ok(frame);
    }
    crate::desktop::frame_scale::fit_png(frame, size)
        .map_err(|e| DomainError::new(ErrorCode::Internal, e.to_string()))
}

async fn observe(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let size = args::<SizeArgs>(a)?.size()?;
    let state = open_screen(ctx).await?;
    let OpOutput::Frame(frame) = ctx.op(Op::Observe(ctx.run.bot_id.clone(), size)).await? else {
        return Err(DomainError::new(
            ErrorCode::Internal,
            "unexpected provider reply",
        ));
    };
    let frame = fit(frame, size)?;
    let digest = economy::digest(&frame.png);
    // The answer first: the frame then moves into its recording without a copy.
    let result = ctx
        .frame_result(
            &frame,
            &digest,
            json!({ "slot": state.slot, "generation": state.generation }),
        )
        .await;
    crate::recordings::calls::step(
        ctx.app,
        &ctx.run,
        "computer_observe",
        None,
        with_scale(json!({}), &frame),
        (frame, &digest),
    )
    .await;
    Ok(result)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActArgs {
    actions: Vec<Action>,
    #[serde(default)]
    max_width: Option<u32>,
    #[serde(default)]
    max_height: Option<u32>,
}

async fn act(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let ActArgs {
        actions,
        max_width,
        max_height,
    } = args(a)?;
    let size = SizeArgs {
        max_width,
        max_height,
    }
    .size()?;
    if actions.is_empty() || actions.len() > 50 {
        return Err(DomainError::invalid(format!(
            "actions holds {} steps: give 1 to 50",
            actions.len()
        )));
    }
    let batch = serde_json::to_string(&actions).unwrap_or_default();
    if ctx.app.tools.exhausted(&ctx.run.id, &batch) {
        return Err(DomainError::new(
            ErrorCode::RepeatedNoOp,
            "this exact action left the screen unchanged several times: read the page with browser_snapshot and act with browser_act, or request_takeover",
        ));
    }
    open_screen(ctx).await?;
    let total = actions.len();
    let kinds: Vec<&'static str> = actions
        .iter()
        .map(crate::desktop::action_rules::kind)
        .collect();
    let recorded = actions.clone();
    let OpOutput::Act(mut outcome) = ctx
        .op(Op::Act(ctx.run.bot_id.clone(), actions, size))
        .await?
    else {
        return Err(DomainError::new(
            ErrorCode::Internal,
            "unexpected provider reply",
        ));
    };
    outcome.frame = fit(outcome.frame, size)?;
    let digest = economy::digest(&outcome.frame.png);
    let completed = outcome.completed;
    let stop = outcome
        .stopped
        .as_ref()
        .map(|s| json!({ "code": s.code.as_str(), "reason": s.reason }));
    let result = ctx
        .frame_result(
            &outcome.frame,
            &digest,
            json!({ "completed": completed, "total": total }),
        )
        .await;
    let recorded_result = with_scale(
        json!({ "completed": completed, "total": total, "stopped": stop }),
        &outcome.frame,
    );
    crate::recordings::calls::step(
        ctx.app,
        &ctx.run,
        "computer_act",
        Some(recorded.as_slice()),
        recorded_result,
        (outcome.frame, &digest),
    )
    .await;
    let unchanged = result["structuredContent"]["unchanged"]
        .as_bool()
        .unwrap_or(false);
    ctx.app.tools.count(&ctx.run.id, &batch, unchanged);
    if completed < total {
        let stop = outcome
            .stopped
            .unwrap_or_else(|| ActStop::failed("the computer stopped the batch"));
        return Ok(act_stopped(
            result,
            &stop,
            completed,
            total,
            kinds[completed],
        ));
    }
    Ok(result)
}

/// A batch that stopped early: an `isError` result with the code and reason of the step that
/// was not done, plus the frame so the agent sees where things stand.
fn act_stopped(
    mut result: Value,
    stop: &ActStop,
    completed: usize,
    total: usize,
    kind: &str,
) -> Value {
    let message = format!(
        "action {} of {total} ({kind}) was not done: {}",
        completed + 1,
        stop.reason
    );
    result["isError"] = json!(true);
    result["structuredContent"]["error"] = json!({ "code": stop.code.as_str(), "message": message,
                                                   "reason": stop.reason, "index": completed });
    if let Some(c) = result["content"].as_array_mut() {
        let note = format!(
            "{}: {message}. Only {completed} of {total} actions completed; nothing was replayed. Look at the screen before going on.",
            stop.code.as_str()
        );
        c.insert(0, text(note));
    }
    result
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellArgs {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// `command` run in `folder` (relative to the workspace), made on the way in if missing: a
/// Team bot's shell in one command, not a `mkdir` round trip before every call, and with no
/// `mkdir` process once the folder is there (`[` is a shell builtin).
pub fn in_own_folder(folder: &str, command: &str) -> String {
    let folder = crate::desktop::shell_quote(folder);
    format!("[ -d {folder} ] || mkdir -p {folder}; cd {folder} || exit 1\n{command}")
}

/// Run a shell command for the bot (its Team folder by default) and record it in the
/// activity feed, redacted; the full output comes back.
pub async fn shell_exec(
    ctx: &ToolCtx<'_>,
    command: String,
    cwd: Option<String>,
    timeout_ms: Option<u64>,
) -> DomainResult<rakazo_actors::provider::ExecOutput> {
    if command.trim().is_empty() || command.len() > 64 * 1024 {
        return Err(DomainError::invalid("command must be 1 byte to 64 KiB"));
    }
    let max = ctx.app.config.command_timeout;
    let timeout = timeout_ms.map_or(max, |ms| Duration::from_millis(ms.max(1)).min(max));
    let (cwd, run) = match cwd.filter(|c| !c.is_empty()) {
        Some(c) => (ctx.path(&c, true)?, command.clone()),
        None if ctx.team => (String::new(), in_own_folder(&ctx.base(), &command)),
        None => (String::new(), command.clone()),
    };
    let req = ExecRequest {
        command: run,
        cwd,
        env: Vec::new(),
        timeout,
    };
    match ctx.op(Op::Exec(req)).await {
        Ok(OpOutput::Exec(out)) => {
            let error = out.timed_out.then(|| "timed out".to_owned());
            let output = format!("{}{}", out.stdout, out.stderr);
            ctx.record("shell", command, Some(output), None, error)
                .await;
            Ok(out)
        }
        Ok(_) => Err(DomainError::new(
            ErrorCode::Internal,
            "unexpected provider reply",
        )),
        Err(e) => {
            ctx.record("shell", command, None, None, Some(e.message.clone()))
                .await;
            Err(e)
        }
    }
}

async fn shell(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let ShellArgs {
        command,
        cwd,
        timeout_ms,
    } = args(a)?;
    let out = shell_exec(ctx, command, cwd, timeout_ms).await?;
    let (stdout, cut_out) = tail(&out.stdout, SHELL_TAIL_BYTES);
    let (stderr, cut_err) = tail(&out.stderr, SHELL_TAIL_BYTES);
    let structured = json!({ "exitCode": out.exit_code, "stdout": stdout, "stderr": stderr, "timedOut": out.timed_out,
                             "stdoutTruncated": cut_out, "stderrTruncated": cut_err });
    let mut summary = format!(
        "exit code {}{}",
        out.exit_code,
        if out.timed_out { " (timed out)" } else { "" }
    );
    if !stdout.is_empty() {
        summary.push_str(&format!("\nstdout:\n{stdout}"));
    }
    if !stderr.is_empty() {
        summary.push_str(&format!("\nstderr:\n{stderr}"));
    }
    Ok(ok(vec![text(summary)], structured))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    #[serde(default)]
    path: String,
}

async fn read_file(ctx: &ToolCtx<'_>, a: Value, attach: bool) -> DomainResult<Value> {
    let PathArgs { path } = args(a)?;
    let path = ctx.path(&path, false)?;
    // A file past the limit is refused by its size where the provider can tell, unread.
    let bytes = match ctx
        .op(Op::ReadFile(path.clone(), MAX_READ_BYTES as u64))
        .await
    {
        Ok(OpOutput::Bytes(bytes)) => bytes,
        Ok(_) => {
            return Err(DomainError::new(
                ErrorCode::Internal,
                "unexpected provider reply",
            ));
        }
        Err(e) if e.code == ErrorCode::TooLarge => {
            let err = DomainError::new(
                ErrorCode::TooLarge,
                format!("{} is larger than 8 MiB", ctx.shown(&path)),
            );
            if attach {
                let line = format!("attach {path}");
                ctx.record("attach_file", line, None, None, Some(err.message.clone()))
                    .await;
            }
            return Err(err);
        }
        Err(e) => return Err(e),
    };
    let size = bytes.len();
    if attach {
        ctx.record(
            "attach_file",
            format!("attach {path}"),
            None,
            Some(size as i64),
            None,
        )
        .await;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let resource = json!({ "type": "resource", "resource": { "uri": format!("workspace:///{path}"),
                               "mimeType": "application/octet-stream", "blob": data } });
        return Ok(ok(
            vec![resource],
            json!({ "path": ctx.shown(&path), "size": size }),
        ));
    }
    let path = ctx.shown(&path);
    Ok(match String::from_utf8(bytes) {
        Ok(s) => ok(
            vec![text(s.clone())],
            json!({ "path": path, "size": size, "content": s }),
        ),
        Err(e) => {
            let data = base64::engine::general_purpose::STANDARD.encode(e.as_bytes());
            ok(
                vec![text(format!(
                    "{path}: {size} bytes of binary data (base64 in structuredContent)"
                ))],
                json!({ "path": path, "size": size, "contentBase64": data }),
            )
        }
    })
}

/// The workspace path of a file an upload names (as the agent writes paths): a regular file
/// as the workspace's listing shows it (a link is refused, never followed). Only its own
/// entry of its folder is looked at.
async fn upload_file(ctx: &ToolCtx<'_>, path: &str) -> DomainResult<String> {
    let path = ctx.path(path, false)?;
    let name = &path[path.rfind('/').map_or(0, |i| i + 1)..];
    let range = ListingRange::from(name, 1);
    let OpOutput::Page(page) = ctx
        .op(Op::ListFirst(parent(&path).to_owned(), range))
        .await?
    else {
        return Err(DomainError::new(
            ErrorCode::Internal,
            "unexpected provider reply",
        ));
    };
    match page.entries.first().filter(|e| e.path == path) {
        Some(e) if e.kind == "file" => Ok(path),
        Some(e) => Err(DomainError::new(
            ErrorCode::PathRejected,
            format!("{} is a {}, not a file", ctx.shown(&path), e.kind),
        )),
        None => Err(DomainError::not_found(&ctx.shown(&path))),
    }
}

fn parent(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    content_base64: Option<String>,
}

async fn write_file(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let WriteArgs {
        path,
        content,
        content_base64,
    } = args(a)?;
    let data = match (content, content_base64) {
        (Some(t), None) => t.into_bytes(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|_| DomainError::invalid("content_base64 is not base64"))?,
        _ => {
            return Err(DomainError::invalid(
                "give exactly one of content and content_base64",
            ));
        }
    };
    let size = data.len() as i64;
    let path = ctx.path(&path, false)?;
    let outcome = ctx.op(Op::WriteFile(path.clone(), data)).await;
    ctx.record(
        "write_file",
        format!("write {path}"),
        None,
        Some(size),
        outcome.as_ref().err().map(|e| e.message.clone()),
    )
    .await;
    outcome?;
    let path = ctx.shown(&path);
    Ok(ok(
        vec![text(format!("wrote {size} bytes to {path}"))],
        json!({ "path": path, "size": size }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    path: String,
    #[serde(default)]
    from: String,
}

/// The most bytes of a name a listing's page may start at (a file name's most, on Linux).
const MAX_NAME_BYTES: usize = 255;

/// The page of a listing that starts at the name `from` ("": the folder's first entries) and
/// holds at most `first` entries; `from` is a name, never a path.
pub fn listing_range(from: String, first: usize) -> DomainResult<ListingRange> {
    if from.len() > MAX_NAME_BYTES || from.contains(['/', '\0']) {
        return Err(DomainError::invalid(format!(
            "from must be a name of at most {MAX_NAME_BYTES} bytes, without / or NUL"
        )));
    }
    Ok(ListingRange::from(from, first))
}

async fn list_files(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let ListArgs { path, from } = args(a)?;
    let path = ctx.path(&path, true)?;
    let range = listing_range(from, MAX_LISTED)?;
    let ListingPage {
        mut entries,
        total,
        next,
    } = match ctx.op(Op::ListFirst(path.clone(), range)).await {
        Ok(OpOutput::Page(page)) => page,
        // The bot's own folder before anything was put in it.
        Err(e) if e.code == ErrorCode::NotFound && ctx.team && path == ctx.base() => {
            ListingPage::default()
        }
        Err(e) => return Err(e),
        Ok(_) => {
            return Err(DomainError::new(
                ErrorCode::Internal,
                "unexpected provider reply",
            ));
        }
    };
    for e in &mut entries {
        e.path = ctx.shown(&e.path);
    }
    let path = ctx.shown(&path);
    let mut lines: Vec<String> = entries
        .iter()
        .map(|e| {
            format!(
                "{}{} {}",
                e.name,
                if e.kind == "dir" { "/" } else { "" },
                e.size
            )
        })
        .collect();
    if let Some(next) = &next {
        lines.push(format!(
            "... more entries follow ({total} in the folder, listed by name): list_files with from {} for the next {MAX_LISTED}, or use shell (ls with a pattern, find).",
            serde_json::to_string(next).unwrap_or_default()
        ));
    }
    let truncated = next.is_some();
    Ok(ok(
        vec![text(lines.join("\n"))],
        json!({ "path": path, "entries": entries, "total": total, "truncated": truncated, "next": next }),
    ))
}

/// Run a one-line mutating operation and record it in the activity feed, failed or not.
async fn recorded(ctx: &ToolCtx<'_>, tool: &str, line: String, op: Op) -> DomainResult<OpOutput> {
    let outcome = ctx.op(op).await;
    let error = outcome.as_ref().err().map(|e| e.message.clone());
    ctx.record(tool, line, None, None, error).await;
    outcome
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenArgs {
    path: String,
}

async fn open_path(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let OpenArgs { path } = args(a)?;
    let path = if workspace_path::is_web_url(&path) {
        path
    } else {
        ctx.path(&path, false)?
    };
    open_screen(ctx).await?;
    let op = Op::Open(ctx.run.bot_id.clone(), path.clone());
    recorded(ctx, "open_path", format!("open {path}"), op).await?;
    Ok(ok(
        vec![text(format!("opened {path}"))],
        json!({ "path": path }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LaunchArgs {
    command: String,
    #[serde(default)]
    args: Vec<String>,
}

async fn launch_app(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let LaunchArgs {
        command,
        args: rest,
    } = args(a)?;
    if command.trim().is_empty() {
        return Err(DomainError::invalid("command is empty"));
    }
    open_screen(ctx).await?;
    let line = std::iter::once(command.clone())
        .chain(rest.iter().cloned())
        .collect::<Vec<_>>();
    let op = Op::Launch(ctx.run.bot_id.clone(), line.clone());
    recorded(ctx, "launch_app", line.join(" "), op).await?;
    Ok(ok(
        vec![text(format!("started {command}"))],
        json!({ "command": command }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TakeoverArgs {
    #[serde(default)]
    reason: Option<String>,
}

async fn request_takeover(ctx: &ToolCtx<'_>, a: Value) -> DomainResult<Value> {
    let TakeoverArgs { reason } = args(a)?;
    let clock = ctx.app.runtime().clock.clone();
    let run = Runs::new(ctx.app.db.clone())
        .with_clock(clock.clone())
        .request_takeover(&ctx.run.id, ctx.run.lease_fence)
        .await?;
    rakazo_actors::computers::Computers::new(ctx.app.db.clone())
        .touch_at(&run.computer_id, clock.now_ms())
        .await?;
    ctx.app.runtime().events.publish(
        &run.space_id,
        rakazo_actors::events::Topic::RunState,
        crate::api::methods::run_json(&run),
    );
    let why = reason.unwrap_or_default();
    Ok(ok(
        vec![text(
            "A person has been asked to take over. Wait: your run continues after they release control.",
        )],
        json!({ "state": run.state, "reason": why }),
    ))
}

async fn browser(ctx: &ToolCtx<'_>, name: &str, a: Value) -> DomainResult<Value> {
    let mut a = if a.is_null() { json!({}) } else { a };
    let Value::Object(m) = &mut a else {
        return Err(DomainError::invalid("arguments must be an object"));
    };
    m.insert("command".into(), json!(name.trim_start_matches("browser_")));
    let mut command: BrowserCommand = serde_json::from_value(a)
        .map_err(|e| DomainError::invalid(format!("invalid arguments: {e}")))?;
    if let BrowserCommand::Act {
        action,
        text: Some(file),
        ..
    } = &mut command
        && action == "upload"
    {
        *file = upload_file(ctx, file).await?;
    }
    open_screen(ctx).await?;
    let OpOutput::Json(v) = ctx.op(Op::Browser(ctx.run.bot_id.clone(), command)).await? else {
        return Err(DomainError::new(
            ErrorCode::Internal,
            "unexpected provider reply",
        ));
    };
    Ok(ok(vec![text(v.to_string())], v))
}
