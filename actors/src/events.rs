//! The event bus behind live subscriptions (`/rpc/ws`) and the screen gateway's revocation.
//! Events are published in this process; a relay (Postgres `LISTEN/NOTIFY`, `src/notify.rs`)
//! carries them to every other process of the deployment, which delivers them to its own
//! subscribers as if published there.

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

/// A cloneable publisher; subscribers get a receiver each.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    /// Where events published here go to reach other processes (set once, by the relay).
    relay: Arc<OnceLock<mpsc::UnboundedSender<Event>>>,
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
            relay: Arc::default(),
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
            let _ = relay.send(event.clone());
        }
        let _ = self.tx.send(event);
    }

    /// Deliver an event another process published, to this process's subscribers only.
    pub fn deliver(&self, event: Event) {
        let _ = self.tx.send(event);
    }

    /// Hands every event published from now on to `relay` as well; answers false when a
    /// relay was already set.
    pub fn set_relay(&self, relay: mpsc::UnboundedSender<Event>) -> bool {
        self.relay.set(relay).is_ok()
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
