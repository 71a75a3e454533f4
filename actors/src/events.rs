//! The in-process event bus behind live subscriptions (`/rpc/ws`).

use serde::Serialize;
use tokio::sync::broadcast;

/// How many events a slow subscriber may lag before it misses some.
const CAPACITY: usize = 1024;

/// One live update, scoped to a space.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The space the event belongs to; subscribers only see their spaces.
    pub space_id: String,
    /// Stable topic: `computer.state`, `run.state`, `lease.changed`, `screen.state`,
    /// `computer.command`.
    pub topic: &'static str,
    /// Topic-specific body.
    pub data: serde_json::Value,
}

/// A cloneable publisher; subscribers get a receiver each.
#[derive(Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
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
        }
    }

    /// Publish; having no subscriber is fine.
    pub fn publish(&self, space_id: &str, topic: &'static str, data: serde_json::Value) {
        let _ = self.tx.send(Event {
            space_id: space_id.to_owned(),
            topic,
            data,
        });
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
