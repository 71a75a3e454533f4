//! The registry of live actors in this process, by computer id (dashmap).
//!
//! Computer actors run under an `actix::Supervisor` on one dedicated arbiter; the registry
//! keeps their addresses, which keeps them alive (and restartable) until the computer is
//! forgotten.

use std::sync::Arc;

use actix::prelude::*;
use dashmap::DashMap;

use crate::computer::ComputerActor;
use crate::lease_actor::LeaseActor;
use crate::runtime::Runtime;
use crate::screen::{ScreenActor, ScreenRevoker, Siblings};
use crate::slots::Slots;

/// The actors of one computer.
#[derive(Clone)]
pub struct ComputerHandle {
    /// Lifecycle and tool calls.
    pub computer: Addr<ComputerActor>,
    /// Lease decisions.
    pub leases: Addr<LeaseActor>,
    screens: Siblings,
    slots: Arc<Slots>,
    computer_id: String,
    space_id: String,
}

/// Live actors by computer id.
pub struct Registry {
    rt: Arc<Runtime>,
    arbiter: ArbiterHandle,
    revoker: Arc<dyn ScreenRevoker>,
    computers: DashMap<String, ComputerHandle>,
}

impl Registry {
    /// A registry whose actors run on `arbiter`.
    pub fn new(rt: Arc<Runtime>, arbiter: ArbiterHandle, revoker: Arc<dyn ScreenRevoker>) -> Self {
        Self {
            rt,
            arbiter,
            revoker,
            computers: DashMap::new(),
        }
    }

    /// Shared dependencies.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.rt
    }

    /// The actors of a computer, started on first use.
    pub fn computer(&self, computer_id: &str, space_id: &str) -> ComputerHandle {
        if let Some(found) = self.computers.get(computer_id) {
            return found.clone();
        }
        self.computers
            .entry(computer_id.to_owned())
            .or_insert_with(|| {
                let (rt, id) = (self.rt.clone(), computer_id.to_owned());
                let slots = Arc::new(Slots::default());
                let held = slots.clone();
                let computer = Supervisor::start_in_arbiter(&self.arbiter, move |_| {
                    ComputerActor::new(id, rt).with_slots(held)
                });
                let (rt, id, space) =
                    (self.rt.clone(), computer_id.to_owned(), space_id.to_owned());
                let leases = LeaseActor::start_in_arbiter(&self.arbiter, move |_| {
                    LeaseActor::new(id, space, rt)
                });
                ComputerHandle {
                    computer,
                    leases,
                    screens: Arc::new(DashMap::new()),
                    slots,
                    computer_id: computer_id.to_owned(),
                    space_id: space_id.to_owned(),
                }
            })
            .clone()
    }

    /// The screen actor of a bot on a computer, started on first use.
    pub fn screen(&self, handle: &ComputerHandle, bot_id: &str) -> Addr<ScreenActor> {
        handle
            .screens
            .entry(bot_id.to_owned())
            .or_insert_with(|| {
                let (rt, computer, revoker, slots, siblings) = (
                    self.rt.clone(),
                    handle.computer.clone(),
                    self.revoker.clone(),
                    handle.slots.clone(),
                    handle.screens.clone(),
                );
                let (cid, sid, bid) = (
                    handle.computer_id.clone(),
                    handle.space_id.clone(),
                    bot_id.to_owned(),
                );
                ScreenActor::start_in_arbiter(&self.arbiter, move |_| {
                    ScreenActor::new(cid, sid, bid, rt, computer, revoker, slots, siblings)
                })
            })
            .clone()
    }

    /// The screens this process holds on a computer, by bot.
    pub fn held_screens(
        &self,
        handle: &ComputerHandle,
    ) -> std::collections::HashMap<String, crate::slots::Held> {
        handle.slots.all_held()
    }

    /// The actors of every computer that has them.
    pub fn handles(&self) -> Vec<ComputerHandle> {
        self.computers.iter().map(|e| e.value().clone()).collect()
    }

    /// How many computers have live actors.
    pub fn len(&self) -> usize {
        self.computers.len()
    }

    /// Whether no computer has live actors.
    pub fn is_empty(&self) -> bool {
        self.computers.is_empty()
    }

    /// Forget a computer's actors (deletion); they stop once their mailboxes close.
    pub fn forget(&self, computer_id: &str) {
        self.computers.remove(computer_id);
    }
}
