//! The `ScreenActor`: one per bot screen. Opens the display lazily under the computer's
//! screen limit (evicting another bot's screen by the policy in [`crate::slots`]) on the slot
//! number the computer's slot table picks (the lowest free one; the provider only starts the
//! display stack there), tracks the slot generation that capabilities bind, and tears down in
//! the safe order: move the generation, revoke every capability of the slot, announce it,
//! then stop its processes. A failed teardown keeps the slot reserved (out of use) until a
//! retry succeeds; the bot's next open retries it first. Every change of a screen writes its row,
//! revokes its routes and publishes its `screen.state` event together.
//!
//! A computer's screens are decided in one process: the one holding its actor (its
//! `computer_owners` claim). A screen actor of another process forwards its operation there
//! ([`crate::owners::Remote::Screen`]), so one slot table admits, evicts and numbers the
//! generations of every screen of the computer, whichever process the request came to.

use std::sync::Arc;

use actix::prelude::*;
use async_trait::async_trait;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};

use crate::clock::{new_id, now_ms};
use crate::computer::{Call, CallBeforeOp, ComputerActor, CurrentMachine, Op, OpOutput};
use crate::entity::{computer, screen};
use crate::error::{DomainError, DomainResult, ErrorCode};
use crate::leases::{LeaseKind, Leases};
use crate::owners::{Owner, Owners, Remote, RemoteOutput};
use crate::runtime::Runtime;
use crate::slots::{Admission, Candidate, Held, Slots};

/// Closes live sockets of a slot before it is reused (the screen gateway implements it).
#[async_trait]
pub trait ScreenRevoker: Send + Sync + 'static {
    /// Close every socket bound to `(computer, slot)` at a generation below `generation`;
    /// returns once they were told to close.
    async fn revoke_slot(&self, computer_id: &str, slot: u32, generation: i64);
}

/// A revoker for deployments without a screen gateway.
pub struct NoRevoker;

#[async_trait]
impl ScreenRevoker for NoRevoker {
    async fn revoke_slot(&self, _: &str, _: u32, _: i64) {}
}

/// A screen's current assignment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScreenState {
    /// Display slot.
    pub slot: u32,
    /// Generation that capabilities bind.
    pub generation: i64,
}

/// Open (or get) the screen.
#[derive(Message)]
#[rtype(result = "DomainResult<ScreenState>")]
pub struct Open;

/// [`Open`] for a tool call whose next operation on the computer follows at once: a held
/// screen is made sure of without the computer's row, which that operation reads and checks
/// (a pending restore, the use stamp).
#[derive(Message)]
#[rtype(result = "DomainResult<ScreenState>")]
pub struct OpenBeforeOp;

/// Tear the screen down (failed or canceled run, computer deletion).
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct Teardown;

/// Give the screen up for another bot's at the screen limit.
#[derive(Message)]
#[rtype(result = "DomainResult<()>")]
pub struct Evict;

/// An operation on a bot's screen ([`Open`], [`Teardown`], [`Evict`]), as forwarded to the
/// process that holds the computer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ScreenOp {
    /// [`Open`].
    Open,
    /// [`Teardown`].
    Teardown,
    /// [`Evict`].
    Evict,
}

/// The screen actors of one computer in this process, by bot.
pub type Siblings = Arc<dashmap::DashMap<String, Addr<ScreenActor>>>;

/// One bot's screen on one computer.
pub struct ScreenActor {
    computer_id: String,
    space_id: String,
    bot_id: String,
    rt: Arc<Runtime>,
    computer: Addr<ComputerActor>,
    revoker: Arc<dyn ScreenRevoker>,
    slots: Arc<Slots>,
    siblings: Siblings,
}

impl ScreenActor {
    /// The screen actor of `bot_id` on a computer; `slots` and `siblings` are shared by every
    /// screen actor of the computer.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        computer_id: String,
        space_id: String,
        bot_id: String,
        rt: Arc<Runtime>,
        computer: Addr<ComputerActor>,
        revoker: Arc<dyn ScreenRevoker>,
        slots: Arc<Slots>,
        siblings: Siblings,
    ) -> Self {
        Self {
            computer_id,
            space_id,
            bot_id,
            rt,
            computer,
            revoker,
            slots,
            siblings,
        }
    }

    fn ctx(&self) -> ScreenCtx {
        ScreenCtx {
            computer_id: self.computer_id.clone(),
            space_id: self.space_id.clone(),
            bot_id: self.bot_id.clone(),
            rt: self.rt.clone(),
            computer: self.computer.clone(),
            revoker: self.revoker.clone(),
            slots: self.slots.clone(),
            siblings: self.siblings.clone(),
            before_op: false,
        }
    }
}

/// What one screen operation needs, owned, for its future.
#[derive(Clone)]
struct ScreenCtx {
    computer_id: String,
    space_id: String,
    bot_id: String,
    rt: Arc<Runtime>,
    computer: Addr<ComputerActor>,
    revoker: Arc<dyn ScreenRevoker>,
    slots: Arc<Slots>,
    siblings: Siblings,
    /// An open for a tool call's next operation (see [`OpenBeforeOp`]).
    before_op: bool,
}

impl Actor for ScreenActor {
    type Context = Context<Self>;
}

async fn row(rt: &Runtime, computer_id: &str, bot_id: &str) -> DomainResult<screen::Model> {
    if let Some(found) = screen::Entity::find()
        .filter(screen::Column::ComputerId.eq(computer_id))
        .filter(screen::Column::BotId.eq(bot_id))
        .one(&rt.db)
        .await?
    {
        return Ok(found);
    }
    let now = now_ms();
    Ok(screen::ActiveModel {
        id: Set(new_id()),
        computer_id: Set(computer_id.into()),
        bot_id: Set(bot_id.into()),
        slot: Set(None),
        generation: Set(0),
        state: Set("released".into()),
        profile_path: Set(format!(".browser-profiles/{bot_id}")),
        last_used_at_ms: Set(now),
        updated_at_ms: Set(now),
    }
    .insert(&rt.db)
    .await?)
}

/// The next screen generation of a computer: one counter for all its slots (the computer
/// row's epoch, bumped under its row lock), so a generation never repeats on any slot and a
/// revocation watermark of one bot's slot can never cover the next bot's capabilities.
async fn next_generation(rt: &Runtime, computer_id: &str) -> DomainResult<i64> {
    let txn = rt.db.begin().await?;
    computer::Entity::update_many()
        .col_expr(
            computer::Column::LeaseEpoch,
            Expr::col(computer::Column::LeaseEpoch).add(1),
        )
        .filter(computer::Column::Id.eq(computer_id))
        .exec(&txn)
        .await?;
    let row = computer::Entity::find_by_id(computer_id)
        .one(&txn)
        .await?
        .ok_or_else(|| DomainError::not_found("computer"))?;
    txn.commit().await?;
    Ok(row.lease_epoch)
}

/// A computer got a new machine (a start after a stop, a replacement, an adoption): the old
/// machine's screens are gone. Each row still naming a slot lets it go under a new generation
/// (so no capability of the old machine is honoured) and says so in a `screen.state` event
/// (`stopped`); the slot table forgets them. Failures are logged: the authority refuses what
/// the table no longer holds either way.
pub async fn machine_screens_gone(rt: &Runtime, computer_id: &str, slots: Option<&Slots>) {
    if let Some(slots) = slots {
        slots.clear();
    }
    if let Err(e) = release_rows(rt, computer_id).await {
        tracing::warn!(computer.id = %computer_id, error = %e, "screen.release_failed");
    }
}

async fn release_rows(rt: &Runtime, computer_id: &str) -> DomainResult<()> {
    let rows = screen::Entity::find()
        .filter(screen::Column::ComputerId.eq(computer_id))
        .filter(screen::Column::Slot.is_not_null())
        .all(&rt.db)
        .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let generation = next_generation(rt, computer_id).await?;
    let space_id = computer::Entity::find_by_id(computer_id)
        .one(&rt.db)
        .await?
        .map(|c| c.space_id)
        .unwrap_or_default();
    for existing in rows {
        let (bot_id, slot) = (existing.bot_id.clone(), existing.slot);
        let mut active = existing.into_active_model();
        active.slot = Set(None);
        active.generation = Set(generation);
        active.state = Set("released".into());
        active.updated_at_ms = Set(now_ms());
        active.update(&rt.db).await?;
        rt.events.publish(
            &space_id,
            crate::events::Topic::ScreenState,
            serde_json::json!({
                "computerId": computer_id, "botId": bot_id, "slot": slot,
                "generation": generation, "state": "stopped",
            }),
        );
    }
    Ok(())
}

impl ScreenCtx {
    /// Where the computer's screens are decided: `None` in this process, else the internal
    /// address of the live process that holds the computer. This process decides when its
    /// actor holds the machine, or (an open, which needs the machine) it claims the computer
    /// now, or (a teardown) no live process holds it. A process that finds the computer held
    /// elsewhere forgets whatever it held of its screens.
    async fn held_elsewhere(&self, op: ScreenOp) -> DomainResult<Option<Option<String>>> {
        if self.computer.send(CurrentMachine).await?.is_some() {
            return Ok(None);
        }
        let owners = Owners::new(self.rt.db.clone());
        let owner = match op {
            ScreenOp::Open => Some(owners.claim(&self.computer_id).await?),
            ScreenOp::Teardown | ScreenOp::Evict => owners.holder(&self.computer_id).await?,
        };
        match owner {
            Some(Owner::Elsewhere { address, .. }) => {
                self.slots.clear();
                Ok(Some(address))
            }
            Some(Owner::Me) | None => Ok(None),
        }
    }

    /// Runs `op` here, or forwards it to the process that holds the computer.
    async fn run(&self, op: ScreenOp) -> DomainResult<Option<ScreenState>> {
        if let Some(address) = self.held_elsewhere(op).await? {
            let remote = Remote::Screen {
                bot_id: self.bot_id.clone(),
                op,
            };
            tracing::debug!(computer.id = %self.computer_id, bot.id = %self.bot_id, ?op, "screen.forwarded");
            return match crate::computer::forward(&self.rt, address, &self.computer_id, remote)
                .await?
            {
                RemoteOutput::Screen(state) => Ok(state),
                _ => Err(DomainError::new(
                    ErrorCode::Internal,
                    "unexpected answer of the computer's process",
                )),
            };
        }
        match op {
            ScreenOp::Open => self.open().await.map(Some),
            ScreenOp::Teardown => self.retire("torn_down").await.map(|()| None),
            ScreenOp::Evict => self.retire("evicted").await.map(|()| None),
        }
    }

    /// The provider's screen of this bot on `slot` (started there if needed; its browser
    /// kept running). A provider never answers another slot: one whose side holds `slot`
    /// otherwise refuses.
    async fn provider_open(&self, slot: u32, before_op: bool) -> DomainResult<()> {
        let op = Op::OpenScreen(self.bot_id.clone(), slot);
        let opened = if before_op {
            self.computer.send(CallBeforeOp(op)).await??
        } else {
            self.computer.send(Call(op)).await??
        };
        let OpOutput::Screen(info) = opened else {
            return Err(DomainError::new(
                ErrorCode::Internal,
                "unexpected provider reply",
            ));
        };
        if info.slot != slot {
            return Err(DomainError::new(
                ErrorCode::Internal,
                format!(
                    "the provider opened slot {} when asked for {slot}",
                    info.slot
                ),
            ));
        }
        Ok(())
    }

    fn publish(&self, slot: Option<i64>, generation: i64, state: &str) {
        self.rt.events.publish(
            &self.space_id,
            crate::events::Topic::ScreenState,
            serde_json::json!({
                "computerId": self.computer_id, "botId": self.bot_id, "slot": slot,
                "generation": generation, "state": state,
            }),
        );
    }

    /// Opens the screen, or returns the held one. A bot holding a screen needs no database
    /// round trip when the call is [`OpenBeforeOp`] (observe and act call this each time).
    async fn open(&self) -> DomainResult<ScreenState> {
        let now = now_ms();
        if let Some(held) = self.slots.touch(&self.bot_id, now) {
            self.provider_open(held.slot, self.before_op).await?;
            // Still held after the call (a new machine would have let every screen go).
            let still = self.slots.held(&self.bot_id);
            if still.is_some_and(|h| h.slot == held.slot && h.generation == held.generation) {
                return Ok(ScreenState {
                    slot: held.slot,
                    generation: held.generation,
                });
            }
            // The provider's screen on this slot is a new assignment (a replaced machine):
            // a new generation, on the slot the provider now holds for it.
            self.slots.release(&self.bot_id);
            self.slots.reserve(&self.bot_id, None);
            if !self.slots.claim(&self.bot_id, held.slot) {
                self.slots.abandon(&self.bot_id);
                return Err(DomainError::new(
                    ErrorCode::ComputerUnavailable,
                    "the screen's slot changed hands meanwhile; try again",
                ));
            }
            return self.assign_after(Some(held.slot)).await;
        }
        if self.slots.failed_teardown(&self.bot_id) {
            // The old display may still hold the bot's profile: its teardown is retried
            // first, and its failure is the answer.
            self.retire("torn_down").await?;
        }
        let evict = {
            let _admission = self.slots.admission().await;
            match self.admission().await? {
                Admission::Open => {
                    self.slots.reserve(&self.bot_id, None);
                    None
                }
                Admission::Evict(victim) => {
                    self.slots.reserve(&self.bot_id, Some(&victim));
                    Some(victim)
                }
                Admission::Full => {
                    tracing::info!(
                        computer.id = %self.computer_id,
                        bot.id = %self.bot_id,
                        screen.limit = self.rt.settings.team_screen_limit,
                        "screen.refused"
                    );
                    return Err(DomainError::new(
                        ErrorCode::MultiScreenUnavailable,
                        "the screen limit is reached and every screen is controlled or in a run",
                    ));
                }
            }
        };
        if let Some(victim) = evict {
            tracing::info!(
                computer.id = %self.computer_id,
                bot.id = %self.bot_id,
                victim.bot.id = %victim,
                "screen.evicting"
            );
            let gone = match self.siblings.get(&victim).map(|a| a.clone()) {
                Some(addr) => addr
                    .send(Evict)
                    .await
                    .map_err(DomainError::from)
                    .and_then(|r| r),
                None => self.sibling(&victim).retire("evicted").await,
            };
            if let Err(e) = gone {
                self.slots.abandon(&self.bot_id);
                return Err(e);
            }
        }
        self.assign_after(None).await
    }

    /// What the screen limit allows now (called under the admission lock).
    async fn admission(&self) -> DomainResult<Admission> {
        let limit = self.rt.settings.team_screen_limit;
        let occupied = self.slots.occupied();
        if limit == 0 || occupied < limit as usize {
            return Ok(Admission::Open);
        }
        let grants = Leases::new(self.rt.db.clone())
            .live_on(&self.computer_id)
            .await?;
        let granted =
            |kind: LeaseKind, bot: &str| grants.iter().any(|g| g.kind == kind && g.subject == bot);
        let candidates: Vec<Candidate> = self
            .slots
            .all_held()
            .into_iter()
            .map(|(bot_id, held)| Candidate {
                controlled: granted(LeaseKind::Control, &bot_id),
                executing: granted(LeaseKind::Execution, &bot_id),
                last_used_ms: held.last_used_ms,
                bot_id,
            })
            .collect();
        Ok(crate::slots::admit(limit, occupied, &candidates))
    }

    /// Opens the provider's screen on the lowest free slot number (unless `slot` says it
    /// already did) and records the new assignment: row, generation, event, then the slot
    /// table. The bot was reserved.
    async fn assign_after(&self, slot: Option<u32>) -> DomainResult<ScreenState> {
        let mut started = slot.is_some();
        let result = async {
            let slot = match slot {
                Some(s) => s,
                None => {
                    let n = self.slots.number(&self.bot_id);
                    // A new slot is opened with the computer's row checked: its browser reads
                    // the workspace.
                    self.provider_open(n, false).await?;
                    started = true;
                    n
                }
            };
            // A newly held slot always gets a new generation.
            let existing = row(&self.rt, &self.computer_id, &self.bot_id).await?;
            let mut active = existing.into_active_model();
            let generation = next_generation(&self.rt, &self.computer_id).await?;
            active.slot = Set(Some(slot as i64));
            active.generation = Set(generation);
            active.state = Set("active".into());
            active.last_used_at_ms = Set(now_ms());
            active.updated_at_ms = Set(now_ms());
            active.update(&self.rt.db).await?;
            self.publish(Some(slot as i64), generation, "active");
            Ok(ScreenState { slot, generation })
        }
        .await;
        match &result {
            Ok(state) => self.slots.hold(
                &self.bot_id,
                Held {
                    slot: state.slot,
                    generation: state.generation,
                    last_used_ms: now_ms(),
                },
            ),
            // The display runs but is not recorded: its slot stays out of use, like a failed
            // teardown, until the bot's next open stops it.
            Err(_) if started => self.slots.left_running(&self.bot_id),
            Err(_) => self.slots.abandon(&self.bot_id),
        }
        result
    }

    /// The same context for another bot of the computer.
    fn sibling(&self, bot_id: &str) -> ScreenCtx {
        ScreenCtx {
            bot_id: bot_id.to_owned(),
            before_op: false,
            ..self.clone()
        }
    }

    /// Ends the screen: the generation moves first (every capability bound to the old one is
    /// dead), the slot's sockets are revoked, the event says `state` (`torn_down`, `evicted`),
    /// then the display stops and the row lets the slot go. Until the display stopped, the
    /// slot number stays out of use in the slot table; a failed stop leaves the row in
    /// `teardown_failed` and the number out of use until a retry succeeds.
    async fn retire(&self, state: &str) -> DomainResult<()> {
        let known = self.slots.stopping(&self.bot_id, None);
        let result = self.stop_display(state, known).await;
        match &result {
            Ok(()) => self.slots.stopped(&self.bot_id),
            Err(_) => self.slots.stop_failed(&self.bot_id),
        }
        result
    }

    async fn stop_display(&self, state: &str, known: Option<u32>) -> DomainResult<()> {
        let existing = row(&self.rt, &self.computer_id, &self.bot_id).await?;
        let Some(slot) = existing.slot.or(known.map(i64::from)) else {
            return Ok(());
        };
        self.slots.stopping(&self.bot_id, Some(slot as u32));
        let generation = next_generation(&self.rt, &self.computer_id).await?;
        let mut active = existing.into_active_model();
        active.generation = Set(generation);
        active.state = Set("teardown_failed".into());
        active.updated_at_ms = Set(now_ms());
        let existing = active.update(&self.rt.db).await?;
        self.revoker
            .revoke_slot(&self.computer_id, slot as u32, generation)
            .await;
        self.publish(Some(slot), generation, state);
        self.computer
            .send(Call(Op::CloseScreen(self.bot_id.clone())))
            .await??;
        self.slots.stopped(&self.bot_id);
        let mut active = existing.into_active_model();
        active.slot = Set(None);
        active.state = Set(if state == "evicted" {
            "evicted"
        } else {
            "released"
        }
        .into());
        active.updated_at_ms = Set(now_ms());
        active.update(&self.rt.db).await?;
        if state == "evicted" {
            tracing::info!(computer.id = %self.computer_id, bot.id = %self.bot_id, screen.slot = slot, screen.generation = generation, "screen.evicted");
        } else {
            tracing::info!(computer.id = %self.computer_id, bot.id = %self.bot_id, screen.slot = slot, screen.generation = generation, "screen.torn_down");
        }
        Ok(())
    }
}

impl ScreenActor {
    /// [`Open`], or [`OpenBeforeOp`] when `before_op`.
    fn opening(&mut self, before_op: bool) -> AtomicResponse<Self, DomainResult<ScreenState>> {
        let ctx = ScreenCtx {
            before_op,
            ..self.ctx()
        };
        AtomicResponse::new(Box::pin(
            async move {
                ctx.run(ScreenOp::Open).await?.ok_or_else(|| {
                    DomainError::new(ErrorCode::Internal, "the screen was not opened")
                })
            }
            .into_actor(self),
        ))
    }
}

impl Handler<Open> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<ScreenState>>;

    fn handle(&mut self, _: Open, _: &mut Context<Self>) -> Self::Result {
        self.opening(false)
    }
}

impl Handler<OpenBeforeOp> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<ScreenState>>;

    fn handle(&mut self, _: OpenBeforeOp, _: &mut Context<Self>) -> Self::Result {
        self.opening(true)
    }
}

impl Handler<Teardown> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, _: Teardown, _: &mut Context<Self>) -> Self::Result {
        let ctx = self.ctx();
        AtomicResponse::new(Box::pin(
            async move { ctx.run(ScreenOp::Teardown).await.map(|_| ()) }.into_actor(self),
        ))
    }
}

impl Handler<Evict> for ScreenActor {
    type Result = AtomicResponse<Self, DomainResult<()>>;

    fn handle(&mut self, _: Evict, _: &mut Context<Self>) -> Self::Result {
        let ctx = self.ctx();
        AtomicResponse::new(Box::pin(
            async move { ctx.run(ScreenOp::Evict).await.map(|_| ()) }.into_actor(self),
        ))
    }
}
