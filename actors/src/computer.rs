//! The `ComputerActor`: one per active computer. Owns the machine handle and its lifecycle.
//!
//! Lifecycle: stopped → provisioning → running → stopping → stopped; a provider call that
//! reports "machine gone" stops the actor, its `actix::Supervisor` restarts it (with backoff)
//! and the restarted actor reconnects through the stored providerRef or provisions a
//! replacement that imports the last checkpoint. A call in flight during the restart is
//! answered `MACHINE_GONE` (the call that saw the loss) or `COMPUTER_UNAVAILABLE` (dropped
//! with the old context), never left hanging.
//!
//! Getting a machine runs under `ctx.wait`, so no other message interleaves with it; tool
//! calls themselves run concurrently (different bots work at once).
//!
//! Adoption: the first machine an actor gets in this process is adopted. A machine that
//! another process (or this one before a restart) watched is reconnected through the stored
//! providerRef; the stretches that process left open are closed as `reconciled` (their end
//! was never seen) and a new one opens, so every running machine has exactly one open
//! stretch, opened by the process that watches it. The reconciler sends [`Adopt`] to every
//! computer whose row says a machine runs; `computer.stop` reconnects the same way, so a stop
//! always reaches the machine the row names, or marks the row stopped when it is gone.

use std::sync::Arc;
use std::sync::{Arc as SharedArc, Mutex};
use std::time::Duration;

use actix::prelude::*;

use crate::agent_sessions::{self, AgentWatch};
use crate::awake::held_awake;
use crate::checkpoint::{Checkpoint, CheckpointActor, Outcome, Reason};
use crate::computers::{ComputerState, Computers, EndReason};
use crate::entity::computer;
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::leases::{LeaseKey, LeaseKind, Leases};
use crate::owners::{Owner, Owners, Remote, RemoteOutput};
use crate::provider::{
    ActOutcome, Action, BrowserCommand, ExecOutput, ExecRequest, FileEntry, Frame, FrameSize,
    ListingPage, ListingRange, MachineSpec, ProviderError, ProviderRef, ScreenInfo,
};
use crate::runs::Runs;
use crate::runtime::Runtime;

/// First restart delay; doubles per consecutive restart.
const RESTART_BACKOFF_BASE: Duration = Duration::from_millis(50);
/// Who holds the maintenance reservation of an idle suspension (with this process's id).
const IDLE_CLAIM_HOLDER: &str = "idle-suspend";
/// Longest an idle suspension holds the computer (a crash mid-suspension frees it then).
const IDLE_CLAIM_TTL_MS: i64 = 30 * 60 * 1000;
/// Upper bound of the restart delay.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How often the idle timer looks.
const IDLE_CHECK_INTERVAL: Duration = Duration::from_secs(15);
/// Grace past a command's own timeout before the actor gives up on the provider.
const EXEC_GRACE: Duration = Duration::from_secs(5);

/// One provider operation on the computer's machine.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// Run a command.
    Exec(ExecRequest),
    /// List a workspace directory.
    ListFiles(String),
    /// A page of a workspace directory's entries by name, and how many it holds.
    ListFirst(String, ListingRange),
    /// Read a workspace file of at most so many bytes (a larger one is `TOO_LARGE`).
    ReadFile(String, u64),
    /// Write a workspace file.
    WriteFile(String, Vec<u8>),
    /// Open (or get) a bot's screen on a display slot (numbered by the computer's slot table).
    OpenScreen(String, u32),
    /// Tear down a bot's screen.
    CloseScreen(String),
    /// Capture a bot's screen, no larger than the size given.
    Observe(String, FrameSize),
    /// Perform an action batch on a bot's screen; its screenshot no larger than the size
    /// given.
    Act(String, Vec<Action>, FrameSize),
    /// Replace the whole workspace with an archive (restore of a revision).
    ImportWorkspace(Vec<u8>),
    /// Start a graphical program on a bot's screen.
    Launch(String, Vec<String>),
    /// Open a URL or workspace file in a bot's browser.
    Open(String, String),
    /// A page-browser command on a bot's browser.
    Browser(String, BrowserCommand),
    /// An operation a person asks for to look at the workspace (the Files window): done as
    /// asked, without counting as the computer's use, so an open window does not hold an
    /// otherwise idle computer awake (when it stops, the window shows the stored copy).
    Look(Box<Op>),
}

/// What an [`Op`] returned.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum OpOutput {
    /// From `Exec`.
    Exec(ExecOutput),
    /// From `ListFiles`.
    Files(Vec<FileEntry>),
    /// From `ListFirst`.
    Page(ListingPage),
    /// From `ReadFile`.
    Bytes(Vec<u8>),
    /// From `OpenScreen`.
    Screen(ScreenInfo),
    /// From `Observe`.
    Frame(Frame),
    /// From `Act`.
    Act(ActOutcome),
    /// From `Browser`.
    Json(serde_json::Value),
    /// From operations with no result.
    Done,
}

/// Run an operation on the machine, getting one first if needed.
#[derive(Message)]
#[rtype(result = "DomainResult<OpOutput>")]
pub struct Call(pub Op);

/// [`Call`] with the computer's row as its caller has just read it (a tool call's checks), so
/// the actor does not read it again.
#[derive(Message)]
#[rtype(result = "DomainResult<OpOutput>")]
pub struct CallRead(pub Op, pub Box<computer::Model>);

/// [`Call`] without the computer's row: for an operation that comes just before another of the
/// same tool call (the bot's held screen made sure of before its observation), whose own
/// [`Call`] or [`CallRead`] then applies a pending restore and writes the use stamp.
#[derive(Message)]
#[rtype(result = "DomainResult<OpOutput>")]
pub struct CallBeforeOp(pub Op);

/// Where [`ComputerActor::call`] gets the computer's row for its checks.
enum RowCheck {
    /// Read it now.
    Read,
    /// The caller's copy, just read.
    Given(Box<computer::Model>),
    /// No check: the call's next operation makes it.
    Skip,
}

/// Make sure a machine runs; answers its reference.
#[derive(Message)]
#[rtype(result = "DomainResult<ProviderRef>")]
pub struct Ensure;

/// Checkpoint the workspace now (if a machine runs).
#[derive(Message)]
#[rtype(result = "DomainResult<Option<Outcome>>")]
pub struct SaveWorkspace(pub Reason);

/// Checkpoint and stop the machine.
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct Suspend(pub EndReason);

/// Import the computer's pending restore into the machine in use, if there is one; answers
/// whether a machine took it. A restore recorded while no machine was held is applied when a
/// machine is next acquired instead.
#[derive(Message)]
#[rtype(result = "DomainResult<bool>")]
pub struct ApplyRestore;

/// Hold the machine the row says runs (running, provisioning, replacing: reconnect, or
/// replace a gone one; stopping: reconnect and finish the stop). Nothing for a stopped row.
#[derive(Message)]
#[rtype(result = "DomainResult<Adoption>")]
pub struct Adopt;

/// What [`Adopt`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// This actor already held the machine.
    Held,
    /// The machine is now held here (and, for a row that said stopping, being stopped).
    Adopted,
    /// The row says no machine runs.
    NotRunning,
    /// Another live process holds the computer's actor.
    Elsewhere,
}

/// Tear the machine down for a replacement (update, recovery, reset): destroy the machine
/// this actor holds, or the one the row names, close its stretch as `replaced`, and forget
/// it; the next [`Ensure`] provisions a new machine that imports the latest checkpoint.
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct TearDown;

/// The machine reference currently in use, if any (for status and tests).
#[derive(Message)]
#[rtype(result = "Option<ProviderRef>")]
pub struct CurrentMachine;

/// One computer's actor.
pub struct ComputerActor {
    id: String,
    rt: Arc<Runtime>,
    /// The machine in use; `None` until the first call, after a stop, or after a loss.
    machine: Option<ProviderRef>,
    /// Why the last attempt to get a machine failed (answered to the calls that waited).
    last_error: Option<DomainError>,
    /// Consecutive supervised restarts, for backoff; reset by a successful call.
    restarts: u32,
    /// Serializes checkpoints.
    checkpoints: Option<Addr<CheckpointActor>>,
    /// When the current machine became ready (by the runtime's clock), for the uptime cap.
    running_since_ms: Option<i64>,
    /// What the coding-agent session files looked like at the last uptime check.
    agents: SharedArc<Mutex<AgentWatch>>,
    /// Whether this actor got (or settled) a machine once: the first time is an adoption.
    adopted: bool,
    /// Another live process owns the computer (its internal address, if it serves one):
    /// machine calls are forwarded there. Checked again before every call made without a
    /// machine, so a gone owner is taken over by the next call or reconciler pass.
    elsewhere: Option<Option<String>>,
    /// The computer's screen slots in this process (emptied when a new machine is held).
    slots: Option<Arc<crate::slots::Slots>>,
}

/// What getting a machine found.
enum Got {
    /// A machine, or (adoption) none because the row says stopped.
    Machine(Option<Acquired>),
    /// Another live process owns the computer.
    Elsewhere(Option<String>),
}

/// Which machine a caller wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// A machine, provisioned when none runs (tool calls).
    Any,
    /// The machine the row says runs, if any (adoption).
    IfRunning,
    /// The machine the row names, reconnected and never replaced (to save its work).
    Reconnect,
}

/// A machine this actor now holds.
struct Acquired {
    machine: ProviderRef,
    /// Start of the stretch an adopted machine was already in (the uptime cap counts it).
    since_ms: Option<i64>,
    /// The row said stopping: finish that stop.
    resume_stop: bool,
}

impl ComputerActor {
    /// The actor of computer `id`.
    pub fn new(id: String, rt: Arc<Runtime>) -> Self {
        Self {
            id,
            rt,
            machine: None,
            last_error: None,
            restarts: 0,
            checkpoints: None,
            running_since_ms: None,
            agents: SharedArc::default(),
            adopted: false,
            elsewhere: None,
            slots: None,
        }
    }

    /// The computer's screen slots, shared with its screen actors: a new machine has no
    /// screens, so getting one releases every screen of the old one (row, table, event).
    pub fn with_slots(mut self, slots: Arc<crate::slots::Slots>) -> Self {
        self.slots = Some(slots);
        self
    }

    /// Get a machine under `ctx.wait`: nothing else runs on this actor until it is settled.
    fn ensure_machine(&mut self, ctx: &mut Context<Self>, delay: Duration, want: Want) {
        let rt = self.rt.clone();
        let id = self.id.clone();
        let adopting = !self.adopted;
        let slots = self.slots.clone();
        let fut = async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Owner::Elsewhere { address, .. } = Owners::new(rt.db.clone()).claim(&id).await? {
                return Ok(Got::Elsewhere(address));
            }
            let got = match want {
                Want::Any => acquire_machine(&rt, &id, adopting).await.map(Some)?,
                Want::IfRunning => adopt_machine(&rt, &id, adopting).await?,
                Want::Reconnect => reconnect_to_save(&rt, &id, adopting).await?,
            };
            if got.is_some() {
                // Before any call reaches the new machine: its screens start afresh.
                crate::screen::machine_screens_gone(&rt, &id, slots.as_deref()).await;
            }
            Ok(Got::Machine(got))
        };
        ctx.wait(fut.into_actor(self).map(|res, act, ctx| match res {
            Ok(Got::Machine(got)) => {
                act.last_error = None;
                act.elsewhere = None;
                if let Some(got) = got {
                    act.adopted = true;
                    act.hold(got, ctx);
                }
            }
            Ok(Got::Elsewhere(address)) => {
                act.last_error = None;
                act.elsewhere = Some(address);
            }
            Err(err) => act.last_error = Some(err),
        }));
    }

    /// Hold a machine just acquired; finish a stop the row said was under way.
    fn hold(&mut self, got: Acquired, ctx: &mut Context<Self>) {
        self.machine = Some(got.machine);
        self.running_since_ms = Some(got.since_ms.unwrap_or_else(|| self.rt.clock.now_ms()));
        *lock_watch(&self.agents) = AgentWatch::default();
        if got.resume_stop {
            ctx.notify(SuspendNow(EndReason::Stopped));
        }
    }

    /// Lets go of the machine without touching it (it was quarantined).
    fn let_go(&mut self) {
        self.machine = None;
        self.running_since_ms = None;
    }

    fn checkpoints(&mut self) -> Addr<CheckpointActor> {
        self.checkpoints
            .get_or_insert_with(|| CheckpointActor::new(self.id.clone(), self.rt.clone()).start())
            .clone()
    }

    fn check_idle(&mut self, ctx: &mut Context<Self>) {
        if self.machine.is_none() || ctx.waiting() {
            return;
        }
        let addr = ctx.address();
        actix::spawn(async move {
            let _ = addr.send(CheckIdle).await;
        });
    }
}

/// Look now whether an idle suspension or the uptime cap is due and, if so, suspend; answers
/// the reason when the machine stopped (`None`: nothing was due, something held the computer,
/// or a bot or person got there first). The computer's own timer sends it every
/// [`IDLE_CHECK_INTERVAL`]; the reconciler and tests send it to decide now.
#[derive(Message)]
#[rtype(result = "DomainResult<Option<EndReason>>")]
pub struct CheckIdle;

/// Internal: suspend after the idle or uptime check decided so.
#[derive(Message)]
#[rtype(result = "()")]
struct SuspendNow(EndReason);

impl Actor for ComputerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(IDLE_CHECK_INTERVAL, |act, ctx| act.check_idle(ctx));
        if self.restarts > 0 {
            // A restart after a lost machine: replace it now, so the next call finds it ready.
            let backoff = RESTART_BACKOFF_BASE
                .saturating_mul(1 << (self.restarts - 1).min(16))
                .min(RESTART_BACKOFF_MAX);
            tracing::warn!(event = "computer.restarting", computer.id = %self.id, restarts = self.restarts,
                backoff_ms = backoff.as_millis() as u64);
            self.ensure_machine(ctx, backoff, Want::Any);
        }
    }
}

impl Supervised for ComputerActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.machine = None;
        self.running_since_ms = None;
        self.restarts = self.restarts.saturating_add(1);
    }
}

impl Handler<Call> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<OpOutput>>;

    fn handle(&mut self, Call(op): Call, ctx: &mut Context<Self>) -> Self::Result {
        self.call(op, RowCheck::Read, ctx)
    }
}

impl Handler<CallRead> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<OpOutput>>;

    fn handle(&mut self, CallRead(op, row): CallRead, ctx: &mut Context<Self>) -> Self::Result {
        self.call(op, RowCheck::Given(row), ctx)
    }
}

impl Handler<CallBeforeOp> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<OpOutput>>;

    fn handle(&mut self, CallBeforeOp(op): CallBeforeOp, ctx: &mut Context<Self>) -> Self::Result {
        self.call(op, RowCheck::Skip, ctx)
    }
}

impl ComputerActor {
    /// Run `op` on the machine, after the checks `read` says how to make.
    fn call(
        &mut self,
        op: Op,
        read: RowCheck,
        ctx: &mut Context<Self>,
    ) -> ResponseActFuture<Self, DomainResult<OpOutput>> {
        if self.machine.is_none() {
            self.ensure_machine(ctx, Duration::ZERO, Want::Any);
        }
        let fut = actix::fut::ready(()).then(move |_, act: &mut Self, _| {
            let machine = act.machine.clone();
            let last_error = act.last_error.clone();
            let elsewhere = act.elsewhere.clone();
            let rt = act.rt.clone();
            let id = act.id.clone();
            async move {
                if machine.is_none()
                    && let Some(address) = elsewhere
                {
                    return match forward(&rt, address, &id, Remote::Call(op)).await? {
                        RemoteOutput::Call(out) => Ok(out),
                        _ => Err(DomainError::code(ErrorCode::Internal)),
                    };
                }
                let Some(machine) = machine else {
                    return Err(last_error
                        .unwrap_or_else(|| DomainError::code(ErrorCode::ComputerUnavailable)));
                };
                let provider = rt.provider()?;
                let computers = Computers::new(rt.db.clone());
                // A restore the machine has not taken yet (its import failed) comes first.
                let row = match read {
                    RowCheck::Given(row) => Some(*row),
                    RowCheck::Read => Some(computers.get(&id).await?),
                    RowCheck::Skip => None,
                };
                if let Some(row) = row {
                    // The use stamp is written only once it is older than the idle check's
                    // slack, so a stream of calls (most of them read-only) does not write on
                    // every call.
                    let now = rt.clock.now_ms();
                    let used = !matches!(op, Op::Look(_));
                    if used
                        && now.saturating_sub(row.last_active_at_ms) >= touch_slack_ms(&rt.settings)
                    {
                        let _ = computers.touch_at(&id, now).await;
                    }
                    apply_pending_restore(&rt, provider.as_ref(), &row, &machine).await?;
                }
                let mut res =
                    run_op(provider.as_ref(), &machine, op, rt.settings.command_timeout).await;
                // A call given up on (its deadline's grace passed) may leave the provider to
                // find the command's stop unconfirmed on its own.
                if let Err(err) = &res
                    && !is_quarantine(err)
                    && let Some(why) = provider.quarantined(&machine)
                {
                    res = Err(DomainError::new(ErrorCode::ComputerQuarantined, why));
                }
                if res.as_ref().is_err_and(is_quarantine) {
                    // Written before the caller hears of it, so no process resumes it after.
                    quarantine(&rt, &id).await;
                }
                res
            }
            .into_actor(act)
        });
        Box::pin(fut.map(|res, act, ctx| match res {
            Err(err) if is_quarantine(&err) => {
                act.let_go();
                Err(err)
            }
            Err(err) if err.code == ErrorCode::MachineGone => {
                tracing::warn!(event = "computer.machine_gone", computer.id = %act.id);
                let rt = act.rt.clone();
                let id = act.id.clone();
                actix::spawn(async move {
                    let computers = Computers::new(rt.db.clone());
                    let _ = computers.set_state(&id, ComputerState::Replacing).await;
                    let _ = computers.close_runs(&id, EndReason::Gone).await;
                });
                ctx.stop();
                Err(err)
            }
            other => {
                if other.is_ok() {
                    act.restarts = 0;
                }
                other
            }
        }))
    }
}

impl Handler<Ensure> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<ProviderRef>>;

    fn handle(&mut self, _: Ensure, ctx: &mut Context<Self>) -> Self::Result {
        if self.machine.is_none() {
            self.ensure_machine(ctx, Duration::ZERO, Want::Any);
        }
        Box::pin(actix::fut::ready(()).map(|_, act: &mut Self, _| {
            act.machine.clone().ok_or_else(|| {
                act.last_error
                    .clone()
                    .unwrap_or_else(|| DomainError::code(ErrorCode::ComputerUnavailable))
            })
        }))
    }
}

impl Handler<Adopt> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<Adoption>>;

    fn handle(&mut self, _: Adopt, ctx: &mut Context<Self>) -> Self::Result {
        if self.machine.is_some() {
            return Box::pin(actix::fut::ready(Ok(Adoption::Held)));
        }
        self.ensure_machine(ctx, Duration::ZERO, Want::IfRunning);
        Box::pin(actix::fut::ready(()).map(|_, act: &mut Self, _| {
            match (&act.machine, &act.last_error) {
                (Some(_), _) => Ok(Adoption::Adopted),
                (None, Some(err)) => Err(err.clone()),
                (None, None) if act.elsewhere.is_some() => Ok(Adoption::Elsewhere),
                (None, None) => Ok(Adoption::NotRunning),
            }
        }))
    }
}

impl Handler<CurrentMachine> for ComputerActor {
    type Result = Option<ProviderRef>;

    fn handle(&mut self, _: CurrentMachine, _: &mut Context<Self>) -> Self::Result {
        self.machine.clone()
    }
}

impl Handler<ApplyRestore> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<bool>>;

    fn handle(&mut self, _: ApplyRestore, _: &mut Context<Self>) -> Self::Result {
        let machine = self.machine.clone();
        let rt = self.rt.clone();
        let id = self.id.clone();
        Box::pin(
            async move {
                let Some(machine) = machine else {
                    return Ok(false);
                };
                let row = Computers::new(rt.db.clone()).get(&id).await?;
                apply_pending_restore(&rt, rt.provider()?.as_ref(), &row, &machine).await?;
                Ok(true)
            }
            .into_actor(self),
        )
    }
}

impl Handler<SaveWorkspace> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<Option<Outcome>>>;

    fn handle(
        &mut self,
        SaveWorkspace(reason): SaveWorkspace,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        // A machine the row names that no actor here holds yet (its owner was killed, or this
        // process restarted) is reconnected first: its work is saved, never skipped (an
        // update or a recovery tears it down next). Shutdown saves only what is held.
        let reconnecting = self.machine.is_none() && reason != Reason::Shutdown;
        if reconnecting {
            self.ensure_machine(ctx, Duration::ZERO, Want::Reconnect);
        }
        Box::pin(actix::fut::ready(()).then(move |_, act: &mut Self, _| {
            let machine = act.machine.clone();
            let failed = act.last_error.clone().filter(|_| reconnecting);
            let checkpoints = act.checkpoints();
            let (rt, id) = (act.rt.clone(), act.id.clone());
            async move {
                if let (None, Some(err)) = (&machine, failed) {
                    return Err(err);
                }
                let Some(machine) = machine else {
                    if reason == Reason::Shutdown {
                        return Ok(None);
                    }
                    // A quarantined machine's work is not read: that would resume it.
                    if Computers::new(rt.db.clone()).get(&id).await?.quarantined {
                        return Err(DomainError::code(ErrorCode::ComputerQuarantined));
                    }
                    // The owner elsewhere holds the machine: it checkpoints (shutdown drains
                    // only what this process holds).
                    if let Some(Owner::Elsewhere { address, .. }) =
                        Owners::new(rt.db.clone()).holder(&id).await?
                    {
                        return match forward(&rt, address, &id, Remote::Save(reason)).await? {
                            RemoteOutput::Saved(outcome) => Ok(outcome),
                            _ => Err(DomainError::code(ErrorCode::Internal)),
                        };
                    }
                    return Ok(None);
                };
                Ok(Some(
                    checkpoints.send(Checkpoint { reason, machine }).await??,
                ))
            }
            .into_actor(act)
        }))
    }
}

impl Handler<Suspend> for ComputerActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, Suspend(reason): Suspend, _: &mut Context<Self>) -> Self::Result {
        let held = self.machine.clone();
        let checkpoints = self.checkpoints();
        let rt = self.rt.clone();
        let id = self.id.clone();
        let adopting = !self.adopted;
        AtomicResponse::new(Box::pin(
            async move {
                // A stop reaches the machine the row names even when no actor of this
                // process held it yet (after a restart): reconnect, never replace.
                let (machine, reconnected) = match held {
                    Some(machine) => (machine, None),
                    None if reason == EndReason::Stopped => {
                        let owners = Owners::new(rt.db.clone());
                        match owners.claim(&id).await {
                            Ok(Owner::Elsewhere { address, .. }) => {
                                let res = forward(&rt, address, &id, Remote::Stop).await;
                                return (None, res.map(|_| false));
                            }
                            Ok(Owner::Me) => {}
                            Err(err) => return (None, Err(err)),
                        }
                        match reconnect_for_stop(&rt, &id, adopting).await {
                            Ok(Some(got)) => (got.machine.clone(), Some(got)),
                            Ok(None) => return (None, Ok(false)),
                            Err(err) => return (None, Err(err)),
                        }
                    }
                    None => return (None, Ok(false)),
                };
                let res = suspend(&rt, &id, &machine, reason, &checkpoints).await;
                if res.as_ref().is_err_and(is_quarantine) {
                    quarantine(&rt, &id).await;
                }
                (reconnected, res)
            }
            .into_actor(self)
            .map(move |(reconnected, res), act, _| {
                if reason == EndReason::Stopped {
                    act.adopted = true;
                }
                if res.as_ref().is_err_and(is_quarantine) {
                    act.let_go();
                    return res.map(|_| ());
                }
                if matches!(res, Ok(true)) {
                    act.machine = None;
                    act.running_since_ms = None;
                    // No machine here any more: any process may hold the computer next.
                    let owners = Owners::new(act.rt.db.clone());
                    let id = act.id.clone();
                    actix::spawn(async move {
                        let _ = owners.release(&id).await;
                    });
                } else if let Some(got) = reconnected {
                    // Not stopped (a failed checkpoint keeps the machine): hold it.
                    act.machine = Some(got.machine);
                    act.running_since_ms =
                        Some(got.since_ms.unwrap_or_else(|| act.rt.clock.now_ms()));
                }
                res.map(|_| ())
            }),
        ))
    }
}

impl Handler<TearDown> for ComputerActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, _: TearDown, _: &mut Context<Self>) -> Self::Result {
        let held = self.machine.clone();
        let rt = self.rt.clone();
        let id = self.id.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let provider = rt.provider()?;
                let computers = Computers::new(rt.db.clone());
                let row = computers.get(&id).await?;
                let kind = provider.describe().kind;
                let stored = row
                    .provider_ref
                    .clone()
                    .filter(|_| row.provider_kind.as_deref() == Some(kind.as_str()))
                    .map(ProviderRef);
                if let Some(machine) = held.or(stored) {
                    match provider.destroy(&machine).await {
                        Ok(()) | Err(ProviderError::MachineGone) => {}
                        Err(err) => return Err(err.into()),
                    }
                }
                computers.close_runs(&id, EndReason::Replaced).await?;
                computers.forget_machine(&id).await?;
                tracing::info!(event = "computer.torn_down", computer.id = %id);
                Ok(())
            }
            .into_actor(self)
            .map(|res: DomainResult<()>, act, _| {
                if res.is_ok() {
                    act.machine = None;
                    act.running_since_ms = None;
                    act.adopted = true;
                }
                res
            }),
        ))
    }
}

impl Handler<CheckIdle> for ComputerActor {
    type Result = ResponseActFuture<Self, DomainResult<Option<EndReason>>>;

    fn handle(&mut self, _: CheckIdle, ctx: &mut Context<Self>) -> Self::Result {
        let Some(machine) = self.machine.clone() else {
            return Box::pin(actix::fut::ready(Ok(None)));
        };
        let rt = self.rt.clone();
        let id = self.id.clone();
        // The provider quarantined the machine after its caller stopped waiting: let go of it.
        if rt
            .provider()
            .is_ok_and(|p| p.quarantined(&machine).is_some())
        {
            self.let_go();
            return Box::pin(
                async move {
                    quarantine(&rt, &id).await;
                    Ok(None)
                }
                .into_actor(self),
            );
        }
        let since = self.running_since_ms;
        let agents = self.agents.clone();
        let addr = ctx.address();
        Box::pin(
            async move {
                let Some(reason) = idle_decision(&rt, &id, &machine, since, &agents).await? else {
                    return Ok(None);
                };
                addr.send(Suspend(reason)).await??;
                let stopped = addr.send(CurrentMachine).await?.is_none();
                Ok(stopped.then_some(reason))
            }
            .into_actor(self),
        )
    }
}

impl Handler<SuspendNow> for ComputerActor {
    type Result = ();

    fn handle(&mut self, SuspendNow(reason): SuspendNow, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        actix::spawn(async move {
            let _ = addr.send(Suspend(reason)).await;
        });
    }
}

/// Sends a machine call or a stop to the process that owns the computer.
pub(crate) async fn forward(
    rt: &Runtime,
    address: Option<String>,
    id: &str,
    what: Remote,
) -> DomainResult<RemoteOutput> {
    let (Some(forward), Some(address)) = (rt.forward.as_ref(), address) else {
        return Err(DomainError::new(
            ErrorCode::ComputerUnavailable,
            "the computer is held by another process this one cannot reach",
        ));
    };
    forward.send(&address, id, what).await
}

/// Checkpoint, then stop the machine; whether it stopped. An idle suspension first claims the
/// computer (the maintenance reservation), so no bot starts and no person takes control while
/// its workspace is saved; if someone got there first, it does not suspend.
async fn suspend(
    rt: &Runtime,
    id: &str,
    machine: &ProviderRef,
    reason: EndReason,
    checkpoints: &Addr<CheckpointActor>,
) -> DomainResult<bool> {
    let claim = if reason == EndReason::Idle {
        match claim_idle(rt, id).await? {
            Some(fence) => Some(fence),
            None => return Ok(false),
        }
    } else {
        None
    };
    let stopped = stop_machine(rt, id, machine, reason, checkpoints).await;
    if let Some(fence) = claim {
        let released = Leases::new(rt.db.clone())
            .release(&LeaseKey::maintenance(id), fence)
            .await;
        if let Err(e) = released {
            tracing::warn!(event = "computer.idle_claim_release_failed", computer.id = id, error = %e);
        }
    }
    stopped.map(|()| true)
}

/// Takes the maintenance reservation for an idle suspension; `None` when another lease was
/// granted since the idle decision (that bot or person keeps the computer up).
async fn claim_idle(rt: &Runtime, id: &str) -> DomainResult<Option<i64>> {
    let leases = Leases::new(rt.db.clone());
    let key = LeaseKey::maintenance(id);
    let grant = match leases
        .acquire(
            &key,
            &crate::processes::holder(IDLE_CLAIM_HOLDER),
            IDLE_CLAIM_TTL_MS,
        )
        .await
    {
        Ok(g) => g,
        Err(e) if e.code == ErrorCode::ComputerReserved => return Ok(None),
        Err(e) => return Err(e),
    };
    // As in `held_awake`: a run waiting for a person does not hold the computer up by its
    // own execution lease.
    let waiting = Runs::new(rt.db.clone()).waiting_on(id).await?;
    let others = leases.live_on(id).await?.into_iter().any(|g| {
        let waiting_run =
            g.kind == LeaseKind::Execution && waiting.iter().any(|r| r.bot_id == g.subject);
        g.kind != LeaseKind::Maintenance && !waiting_run
    });
    if others {
        leases.release(&key, grant.fence).await?;
        tracing::info!(event = "computer.idle_suspend_skipped", computer.id = id);
        return Ok(None);
    }
    Ok(Some(grant.fence))
}

async fn stop_machine(
    rt: &Runtime,
    id: &str,
    machine: &ProviderRef,
    reason: EndReason,
    checkpoints: &Addr<CheckpointActor>,
) -> DomainResult<()> {
    let computers = Computers::new(rt.db.clone());
    computers.set_state(id, ComputerState::Stopping).await?;
    let why = if reason == EndReason::Idle {
        Reason::Idle
    } else {
        Reason::Stop
    };
    let provider = rt.provider()?;
    let saved = checkpoints
        .send(Checkpoint {
            reason: why,
            machine: machine.clone(),
        })
        .await?;
    if let Err(err) = saved {
        // A failed checkpoint keeps the machine running when its work is saved nowhere
        // else. A machine that works in the latest copy on this host keeps its work there
        // when stopped, so a failing checkpoint never holds it up past its idle time.
        let mounted = provider.describe().capabilities.mounted_home;
        if !(mounted && matches!(reason, EndReason::Idle | EndReason::ActiveLimit)) {
            computers.set_state(id, ComputerState::Running).await?;
            return Err(err);
        }
        tracing::warn!(
            event = "computer.suspended_unsaved",
            computer.id = id,
            code = err.code.as_str()
        );
    }
    provider.stop(machine).await?;
    computers.close_runs(id, reason).await?;
    computers.set_state(id, ComputerState::Stopped).await?;
    tracing::info!(
        event = "computer.suspended",
        computer.id = id,
        reason = reason.as_str()
    );
    let row = computers.get(id).await?;
    rt.events.publish(
        &row.space_id,
        crate::events::Topic::ComputerState,
        serde_json::json!({ "computerId": id, "state": "stopped", "reason": reason.as_str() }),
    );
    Ok(())
}

/// Whether an idle or uptime suspension is due (see [`CheckIdle`]).
///
/// Nothing is due while something holds the computer ([`held_awake`]: a run executing, a
/// person in control, a maintenance job, a fresh takeover request on a provider that does
/// not bill). Then idle suspension after `SANDBOX_IDLE_MS` without use; then, on providers
/// that bill while running only, the uptime cap after `COMPUTER_MAX_ACTIVE_MS` in one
/// stretch, unless a coding agent CLI wrote its session files within `SANDBOX_IDLE_MS`.
async fn idle_decision(
    rt: &Runtime,
    id: &str,
    machine: &ProviderRef,
    since_ms: Option<i64>,
    agents: &SharedArc<Mutex<AgentWatch>>,
) -> DomainResult<Option<EndReason>> {
    let provider = rt.provider()?;
    let bills = provider.describe().capabilities.bills_while_running;
    let now = rt.clock.now_ms();
    let idle_ms = rt.settings.idle.as_millis() as i64;
    let cap_ms = rt.settings.max_active.as_millis() as i64;
    let up_for = since_ms.map(|since| now.saturating_sub(since));
    // Session files are watched through the last idle window before the cap (whatever holds
    // the computer meanwhile), so a write in that window is known when the cap comes due.
    let capped = bills && cap_ms > 0;
    let mut sessions = None;
    if capped && up_for.is_some_and(|up| up >= cap_ms.saturating_sub(idle_ms)) {
        let look = agent_sessions::fingerprint(provider.as_ref(), machine).await;
        let mut watch = lock_watch(agents);
        let first = watch.observe(look, now);
        sessions = Some((first, watch.wrote_within(idle_ms, now)));
    }
    let leases = Leases::new(rt.db.clone()).live_on(id).await?;
    let waiting = Runs::new(rt.db.clone()).waiting_on(id).await?;
    if held_awake(&leases, &waiting, bills, now) {
        return Ok(None);
    }
    let row = Computers::new(rt.db.clone()).get(id).await?;
    let idle_for = now.saturating_sub(row.last_active_at_ms).max(0);
    // The stamp may lag the last use by the touch slack: wait that much longer, never less.
    if idle_ms > 0 && idle_for >= idle_ms + touch_slack_ms(&rt.settings) {
        return Ok(Some(EndReason::Idle));
    }
    if !capped || up_for.is_none_or(|up| up < cap_ms) {
        return Ok(None);
    }
    match sessions {
        // No earlier look to compare with: decide at the next check.
        None | Some((true, _)) => Ok(None),
        Some((false, true)) => {
            tracing::info!(event = "computer.active_limit_deferred", computer.id = id);
            Ok(None)
        }
        Some((false, false)) => Ok(Some(EndReason::ActiveLimit)),
    }
}

/// How stale a computer's use stamp may get before a call writes it again: a twentieth of the
/// idle time, at most 30 s (30 s when idle suspension is off).
pub fn touch_slack_ms(settings: &crate::runtime::Settings) -> i64 {
    const MAX_MS: i64 = 30_000;
    match settings.idle.as_millis() as i64 {
        0 => MAX_MS,
        idle => (idle / 20).min(MAX_MS),
    }
}

fn lock_watch(watch: &Mutex<AgentWatch>) -> std::sync::MutexGuard<'_, AgentWatch> {
    watch.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `err` says the machine was quarantined (a command's stop was not confirmed).
fn is_quarantine(err: &DomainError) -> bool {
    err.code == ErrorCode::ComputerQuarantined
}

/// Quarantines the computer's row ([`Computers::quarantine`]), tells its space and lets any
/// process claim it: a recover or reset replaces its machine, nothing else reaches it.
async fn quarantine(rt: &Runtime, id: &str) {
    let computers = Computers::new(rt.db.clone());
    if let Err(e) = computers.quarantine(id).await {
        tracing::error!(
            event = "computer.quarantine_failed",
            computer.id = id,
            code = e.code.as_str()
        );
        return;
    }
    tracing::warn!(event = "computer.quarantined", computer.id = id);
    if let Ok(row) = computers.get(id).await {
        rt.events.publish(
            &row.space_id,
            crate::events::Topic::ComputerState,
            serde_json::json!({ "computerId": id, "state": "stopped", "quarantined": true }),
        );
    }
    let _ = Owners::new(rt.db.clone()).release(id).await;
}

/// The provider's spec of a computer's machine.
fn spec_of(row: &crate::entity::computer::Model) -> MachineSpec {
    MachineSpec {
        computer_id: row.id.clone(),
        space_id: row.space_id.clone(),
        bot_id: row.bot_id.clone(),
        home_key: row.home_key.clone(),
    }
}

/// The row says a machine runs: adopt it (reconnect, or replace a gone one); it says
/// stopping: reconnect and finish the stop; it says stopped: nothing.
async fn adopt_machine(rt: &Runtime, id: &str, adopting: bool) -> DomainResult<Option<Acquired>> {
    let row = Computers::new(rt.db.clone()).get(id).await?;
    if row.state == ComputerState::Stopped.as_str() || row.quarantined {
        return Ok(None);
    }
    let kind = rt.provider()?.describe().kind;
    if row.provider_kind.as_deref().is_some_and(|k| k != kind) {
        // Started at another provider, which this process cannot reach: nothing to adopt
        // (the next use provisions here); its stretch's end is never seen.
        let computers = Computers::new(rt.db.clone());
        computers.close_runs(id, EndReason::Reconciled).await?;
        computers.set_state(id, ComputerState::Stopped).await?;
        tracing::warn!(event = "computer.adopt_other_provider", computer.id = id);
        return Ok(None);
    }
    if row.state == ComputerState::Stopping.as_str() {
        return Ok(reconnect_for_stop(rt, id, adopting)
            .await?
            .map(|got| Acquired {
                resume_stop: true,
                ..got
            }));
    }
    acquire_machine(rt, id, adopting).await.map(Some)
}

/// After a reconnect: an adopting actor closes the stretches it did not watch as
/// `reconciled` (answering when the oldest began), as does anyone reconnecting a row that
/// said stopped; a stretch is open from here on.
async fn settle_runs(
    computers: &Computers,
    row: &crate::entity::computer::Model,
    kind: &str,
    adopting: bool,
) -> DomainResult<Option<i64>> {
    let mut since = None;
    let was_stopped = row.state == ComputerState::Stopped.as_str();
    if adopting || was_stopped {
        if !was_stopped {
            since = computers.oldest_open_run_start(&row.id).await?;
        }
        let closed = computers.close_runs(&row.id, EndReason::Reconciled).await?;
        if closed > 0 {
            tracing::info!(event = "computer.runs_reconciled", computer.id = %row.id, closed);
        }
    }
    computers.ensure_open_run(row, kind).await?;
    Ok(since)
}

/// For a stop: the machine the row names, reconnected (never replaced); `None` when there is
/// nothing to stop, after marking the row stopped (its stretches closed as `gone` when the
/// provider lost the machine, `reconciled` when no machine of this provider was recorded).
async fn reconnect_for_stop(
    rt: &Runtime,
    id: &str,
    adopting: bool,
) -> DomainResult<Option<Acquired>> {
    let computers = Computers::new(rt.db.clone());
    let row = computers.get(id).await?;
    // A quarantined machine is paused (or pausing) and is never reconnected, not even to stop.
    if row.state == ComputerState::Stopped.as_str() || row.quarantined {
        return Ok(None);
    }
    let provider = rt.provider()?;
    let kind = provider.describe().kind;
    let same_kind = row.provider_kind.as_deref() == Some(kind.as_str());
    let reason = match (row.provider_ref.clone(), same_kind) {
        (Some(stored), true) => {
            let stored = ProviderRef(stored);
            match provider.reconnect(&stored, &spec_of(&row)).await {
                Ok(()) => {
                    let since = settle_runs(&computers, &row, &kind, adopting).await?;
                    tracing::info!(event = "computer.reconnected", computer.id = id);
                    return Ok(Some(Acquired {
                        machine: stored,
                        since_ms: since,
                        resume_stop: false,
                    }));
                }
                Err(ProviderError::MachineGone) => EndReason::Gone,
                Err(err) => return Err(err.into()),
            }
        }
        _ => EndReason::Reconciled,
    };
    computers.close_runs(id, reason).await?;
    computers.set_state(id, ComputerState::Stopped).await?;
    tracing::info!(
        event = "computer.stop_found_nothing",
        computer.id = id,
        reason = reason.as_str()
    );
    rt.events.publish(
        &row.space_id,
        crate::events::Topic::ComputerState,
        serde_json::json!({ "computerId": id, "state": "stopped", "reason": reason.as_str() }),
    );
    Ok(None)
}

/// The machine the row names, reconnected to save its work (never replaced); a stop the row
/// says was under way is finished once it is held, as an adoption finishes it.
async fn reconnect_to_save(
    rt: &Runtime,
    id: &str,
    adopting: bool,
) -> DomainResult<Option<Acquired>> {
    let row = Computers::new(rt.db.clone()).get(id).await?;
    let stopping = row.state == ComputerState::Stopping.as_str();
    Ok(reconnect_for_stop(rt, id, adopting)
        .await?
        .map(|got| Acquired {
            resume_stop: stopping,
            ..got
        }))
}

/// Reconnect through the stored providerRef (same provider kind only) or provision a
/// replacement that imports the latest checkpoint. `adopting`: the first machine of this
/// actor (see the module docs).
async fn acquire_machine(rt: &Runtime, id: &str, adopting: bool) -> DomainResult<Acquired> {
    let provider = rt.provider()?;
    let kind = provider.describe().kind;
    let computers = Computers::new(rt.db.clone());
    let row = computers.get(id).await?;
    if row.quarantined {
        return Err(DomainError::code(ErrorCode::ComputerQuarantined));
    }
    let spec = spec_of(&row);
    let same_kind = row.provider_kind.as_deref() == Some(kind.as_str());
    if let (Some(stored), true) = (row.provider_ref.clone(), same_kind) {
        let stored = ProviderRef(stored);
        match provider.reconnect(&stored, &spec).await {
            Ok(()) => {
                apply_pending_restore(rt, provider.as_ref(), &row, &stored).await?;
                if row.state != ComputerState::Running.as_str() {
                    computers.set_state(id, ComputerState::Running).await?;
                }
                let since = settle_runs(&computers, &row, &kind, adopting).await?;
                tracing::info!(event = "computer.reconnected", computer.id = id);
                return Ok(Acquired {
                    machine: stored,
                    since_ms: since,
                    resume_stop: false,
                });
            }
            Err(ProviderError::MachineGone) => {
                tracing::warn!(event = "computer.reconnect_gone", computer.id = id);
                computers.close_runs(id, EndReason::Gone).await?;
            }
            Err(err) => return Err(err.into()),
        }
    } else if row.provider_ref.is_some() {
        // A provider-kind change: the old reference is never handed to another kind.
        computers.close_runs(id, EndReason::Replaced).await?;
    } else if adopting || row.state == ComputerState::Stopped.as_str() {
        computers.close_runs(id, EndReason::Reconciled).await?;
    }
    computers.set_state(id, ComputerState::Provisioning).await?;
    // Shown while the machine is prepared (on a first docker start, while the supervisor
    // builds the computer image and starts the container).
    rt.events.publish(
        &row.space_id,
        crate::events::Topic::ComputerState,
        serde_json::json!({ "computerId": id, "state": "provisioning", "stage": "preparing" }),
    );
    let preparing = {
        let (events, space, computer) = (rt.events.clone(), row.space_id.clone(), id.to_owned());
        move |stage: crate::provider::Preparation| {
            tracing::info!(event = "computer.preparing", computer.id = %computer, stage = stage.as_str());
            events.publish(
                &space,
                crate::events::Topic::ComputerState,
                serde_json::json!({ "computerId": computer, "state": "provisioning", "stage": stage.as_str() }),
            );
        }
    };
    provider.prepare(&preparing).await?;
    let machine = provider.provision(&spec).await?;
    if row.revision > 0 {
        let home = rt.home_id(&row).await?;
        let restored = crate::workspace_stream::restore(
            provider.as_ref(),
            &machine,
            rt.homes.as_ref(),
            &home,
            row.revision,
        );
        if let Err(err) = restored.await {
            let _ = provider.destroy(&machine).await;
            computers.set_state(id, ComputerState::Stopped).await?;
            return Err(err);
        }
    }
    if let Some(pending) = row.pending_restore_revision {
        // The import above was of the computer's revision, which the restore made current.
        computers.restore_applied(id, pending).await?;
    }
    let row = computers.record_machine(id, &kind, &machine).await?;
    computers.open_run(&row, &kind).await?;
    tracing::info!(
        event = "computer.provisioned",
        computer.id = id,
        restored_revision = row.revision,
        provisioning_fence = row.provisioning_fence
    );
    rt.events.publish(
        &row.space_id,
        crate::events::Topic::ComputerState,
        serde_json::json!({
            "computerId": id, "state": "running", "provisioningFence": row.provisioning_fence,
        }),
    );
    Ok(Acquired {
        machine,
        since_ms: None,
        resume_stop: false,
    })
}

/// Imports the computer's pending restore (if any) into `machine` and records it applied.
pub(crate) async fn apply_pending_restore(
    rt: &Runtime,
    provider: &dyn crate::provider::SandboxProvider,
    row: &crate::entity::computer::Model,
    machine: &ProviderRef,
) -> DomainResult<()> {
    let Some(pending) = row.pending_restore_revision else {
        return Ok(());
    };
    let home = rt.home_id(row).await?;
    crate::workspace_stream::restore(provider, machine, rt.homes.as_ref(), &home, pending).await?;
    Computers::new(rt.db.clone())
        .restore_applied(&row.id, pending)
        .await?;
    tracing::info!(event = "home.restore_applied", computer.id = %row.id, revision = pending);
    Ok(())
}

async fn run_op(
    provider: &dyn crate::provider::SandboxProvider,
    machine: &ProviderRef,
    op: Op,
    max_timeout: Duration,
) -> DomainResult<OpOutput> {
    Ok(match op {
        Op::Look(op) => return Box::pin(run_op(provider, machine, *op, max_timeout)).await,
        Op::Exec(mut req) => {
            req.timeout = req.timeout.min(max_timeout);
            let deadline = req.timeout + EXEC_GRACE;
            match tokio::time::timeout(deadline, provider.exec(machine, &req)).await {
                Ok(out) => OpOutput::Exec(out?),
                Err(_) => return Err(DomainError::code(ErrorCode::CommandTimeout)),
            }
        }
        Op::ListFiles(path) => OpOutput::Files(provider.list_files(machine, &path).await?),
        Op::ListFirst(path, range) => {
            OpOutput::Page(provider.list_files_first(machine, &path, &range).await?)
        }
        Op::ReadFile(path, max) => {
            OpOutput::Bytes(provider.read_file_within(machine, &path, max).await?)
        }
        Op::WriteFile(path, data) => {
            provider.write_file(machine, &path, &data).await?;
            OpOutput::Done
        }
        Op::OpenScreen(bot, slot) => {
            OpOutput::Screen(provider.open_screen(machine, &bot, slot).await?)
        }
        Op::CloseScreen(bot) => {
            provider.close_screen(machine, &bot).await?;
            OpOutput::Done
        }
        Op::Observe(bot, size) => {
            OpOutput::Frame(provider.observe_sized(machine, &bot, size).await?)
        }
        Op::Act(bot, actions, size) => {
            OpOutput::Act(provider.act_sized(machine, &bot, &actions, size).await?)
        }
        Op::Browser(bot, command) => {
            OpOutput::Json(provider.browser(machine, &bot, &command).await?)
        }
        Op::Open(bot, target) => {
            provider.open(machine, &bot, &target).await?;
            OpOutput::Done
        }
        Op::Launch(bot, argv) => {
            provider.launch(machine, &bot, &argv).await?;
            OpOutput::Done
        }
        Op::ImportWorkspace(archive) => {
            provider.import_workspace(machine, &archive).await?;
            OpOutput::Done
        }
    })
}
