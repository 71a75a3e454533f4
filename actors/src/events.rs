//! The event bus behind live subscriptions (`/rpc/ws`) and the screen gateway's revocation.
//! Events are published in this process; a relay (Postgres `LISTEN/NOTIFY`, `src/notify.rs`)
//! carries them to every other process of the deployment, which delivers them to its own
//! subscribers as if published there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, watch};

/// How many events a slow subscriber may lag before it misses some.
const CAPACITY: usize = 1024;

/// What an event is about: the stable topic names of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Topic {
    /// A computer's lifecycle state.
    #[serde(rename = "computer.state")]
    ComputerState,
    /// A run's state.
    #[serde(rename = "run.state")]
    RunState,
    /// A lease granted, released, expired or revoked.
    #[serde(rename = "lease.changed")]
    LeaseChanged,
    /// A bot's screen opened, torn down or evicted.
    #[serde(rename = "screen.state")]
    ScreenState,
    /// A command in the activity feed.
    #[serde(rename = "computer.command")]
    ComputerCommand,
    /// A maintenance operation queued, progressing, finished or interrupted.
    #[serde(rename = "maintenance.changed")]
    MaintenanceChanged,
}

impl Topic {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ComputerState => "computer.state",
            Self::RunState => "run.state",
            Self::LeaseChanged => "lease.changed",
            Self::ScreenState => "screen.state",
            Self::ComputerCommand => "computer.command",
            Self::MaintenanceChanged => "maintenance.changed",
        }
    }
}

impl PartialEq<&str> for Topic {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One live update, scoped to a space.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The space the event belongs to; subscribers only see their spaces.
    pub space_id: String,
    /// What it is about.
    pub topic: Topic,
    /// Topic-specific body.
    pub data: serde_json::Value,
}

/// A typed message to the screen gateway of every process: a grant or a slot generation
/// ended, so the sockets opened under it close. Sent by the single writer of that state (the
/// lease rules and the screen actor), never parsed out of a feed event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Revocation {
    /// A control grant ended (released, expired, revoked with its run): its control sockets,
    /// screen and terminal, close, as do the routes issued for it.
    #[serde(rename_all = "camelCase")]
    ControlEnded {
        /// Computer id.
        computer_id: String,
        /// Bot whose screen the grant was on.
        bot_id: String,
        /// The grant's fence (older fences of that bot end too).
        fence: i64,
    },
    /// A slot's generation was retired (teardown, reuse, eviction): every socket of that
    /// generation or older closes.
    #[serde(rename_all = "camelCase")]
    SlotRetired {
        /// Computer id.
        computer_id: String,
        /// Display slot.
        slot: u32,
        /// The newest retired generation.
        generation: i64,
    },
}

/// What the relay carries to other processes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Relayed {
    /// A feed event.
    Event(Event),
    /// A revocation.
    Revocation(Revocation),
}

/// An event published in this process, with who published it (for the timeline).
#[derive(Clone, Debug)]
pub struct Journaled {
    /// The event.
    pub event: Event,
    /// The actor of the task that published it.
    pub actor: crate::timeline::Actor,
}

/// The journal's end of the bus.
struct JournalLink {
    tx: mpsc::UnboundedSender<(u64, Journaled)>,
    /// The number of the last event handed to the journal.
    next: AtomicU64,
    /// The number of the last event the journal finished.
    done: watch::Receiver<u64>,
}

/// Longest wait for the journal in [`EventBus::journaled`].
pub const JOURNAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A cloneable publisher; subscribers get a receiver each.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    revocations: broadcast::Sender<Revocation>,
    /// Where what is published here goes to reach other processes (set once, by the relay).
    relay: Arc<OnceLock<mpsc::UnboundedSender<Relayed>>>,
    /// Where what is published here goes to be journaled in the timeline (set once).
    journal: Arc<OnceLock<JournalLink>>,
    /// Counts gaps: times events may have been lost on their way here (the relay's
    /// connection was made again). Watchers that must not miss one sweep after each.
    gaps: Arc<watch::Sender<u64>>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// A new bus.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(CAPACITY).0,
            revocations: broadcast::channel(CAPACITY).0,
            relay: Arc::default(),
            journal: Arc::default(),
            gaps: Arc::new(watch::channel(0).0),
        }
    }

    /// Publish to this process's subscribers and, through the relay, every other process's;
    /// having no subscriber is fine.
    pub fn publish(&self, space_id: &str, topic: Topic, data: serde_json::Value) {
        let event = Event {
            space_id: space_id.to_owned(),
            topic,
            data,
        };
        if let Some(relay) = self.relay.get() {
            let _ = relay.send(Relayed::Event(event.clone()));
        }
        if let Some(journal) = self.journal.get() {
            let n = journal.next.fetch_add(1, Ordering::SeqCst) + 1;
            let _ = journal.tx.send((
                n,
                Journaled {
                    event: event.clone(),
                    actor: crate::timeline::current(),
                },
            ));
        }
        let _ = self.tx.send(event);
    }

    /// Tell the screen gateway of this and every other process to close what `revocation`
    /// names.
    pub fn revoke(&self, revocation: Revocation) {
        if let Some(relay) = self.relay.get() {
            let _ = relay.send(Relayed::Revocation(revocation.clone()));
        }
        let _ = self.revocations.send(revocation);
    }

    /// Deliver what another process published, to this process's subscribers only.
    pub fn deliver(&self, relayed: Relayed) {
        match relayed {
            Relayed::Event(event) => {
                let _ = self.tx.send(event);
            }
            Relayed::Revocation(revocation) => {
                let _ = self.revocations.send(revocation);
            }
        }
    }

    /// Hands everything published from now on to `relay` as well; answers false when a relay
    /// was already set.
    pub fn set_relay(&self, relay: mpsc::UnboundedSender<Relayed>) -> bool {
        self.relay.set(relay).is_ok()
    }

    /// Hands everything published here from now on to `journal` as well, numbered from 1,
    /// with its actor; the journal reports the last number it finished through `done`.
    /// Answers false when a journal was already set.
    pub fn set_journal(
        &self,
        journal: mpsc::UnboundedSender<(u64, Journaled)>,
        done: watch::Receiver<u64>,
    ) -> bool {
        self.journal
            .set(JournalLink {
                tx: journal,
                next: AtomicU64::new(0),
                done,
            })
            .is_ok()
    }

    /// Waits (at most [`JOURNAL_WAIT`]) until the journal finished everything published so
    /// far, so what a caller appends next comes after the state changes it caused.
    pub async fn journaled(&self) {
        let Some(journal) = self.journal.get() else {
            return;
        };
        let target = journal.next.load(Ordering::SeqCst);
        let mut done = journal.done.clone();
        let _ = tokio::time::timeout(JOURNAL_WAIT, done.wait_for(|d| *d >= target)).await;
    }

    /// A new subscription to revocations (the screen gateway's watcher).
    pub fn revocations(&self) -> broadcast::Receiver<Revocation> {
        self.revocations.subscribe()
    }

    /// Events may have been lost on their way to this process.
    pub fn gap(&self) {
        self.gaps.send_modify(|n| *n += 1);
    }

    /// Watches gaps (see [`EventBus::gap`]).
    pub fn gaps(&self) -> watch::Receiver<u64> {
        self.gaps.subscribe()
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
