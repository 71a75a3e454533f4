//! Cross-process events on Postgres: every event and revocation published in this process is
//! sent with
//! `pg_notify` on one channel, and every process `LISTEN`s on it (one dedicated connection,
//! `sqlx`'s `PgListener`) and delivers the events of other processes to its own bus. A
//! dashboard connected to one process so sees a run started through another, and a control
//! release through one closes the sockets another holds. SQLite serves one process: no relay.

use rakazo_actors::events::{EventBus, Relayed};
use rakazo_actors::processes;
use sea_orm::sqlx::postgres::PgListener;
use sea_orm::{ConnectionTrait, DatabaseBackend, DatabaseConnection, Statement};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The channel every process listens on.
pub const CHANNEL: &str = "rakazo_events";
/// Postgres refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7900;

/// One notification: the event and the process that published it.
#[derive(Serialize, Deserialize)]
struct Envelope {
    origin: String,
    relayed: Relayed,
}

/// The listening connection. Its own drop hands the connection back through a task, which
/// cannot start once the runtime is going away (an app dropped at the end of its system):
/// then the connection is left to close with the process.
struct Held(Option<PgListener>);

impl Held {
    fn get(&mut self) -> &mut PgListener {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(listener) = self.0.take()
            && tokio::runtime::Handle::try_current().is_err()
        {
            std::mem::forget(listener);
        }
    }
}

/// Starts the relay when the database is Postgres; answers whether it runs. Listening starts
/// before this returns, so nothing published elsewhere after it is missed.
pub async fn start(db: &DatabaseConnection, bus: &EventBus) -> Result<bool, String> {
    if db.get_database_backend() != DatabaseBackend::Postgres {
        return Ok(false);
    }
    let mut listener = Held(Some(
        PgListener::connect_with(db.get_postgres_connection_pool())
            .await
            .map_err(|e| format!("event relay: {e}"))?,
    ));
    listener
        .get()
        .listen(CHANNEL)
        .await
        .map_err(|e| format!("event relay: {e}"))?;
    let inbound = bus.clone();
    actix_rt::spawn(async move {
        loop {
            match listener.get().try_recv().await {
                Ok(Some(note)) => {
                    let Ok(envelope) = serde_json::from_str::<Envelope>(note.payload()) else {
                        tracing::warn!(event = "events.relay_unreadable");
                        continue;
                    };
                    if envelope.origin != processes::id() {
                        inbound.deliver(envelope.relayed);
                    }
                }
                // The connection was lost and is being made again: whatever was sent
                // meanwhile is gone, so the sweeps that follow a gap must run.
                Ok(None) => {
                    tracing::warn!(event = "events.relay_reconnected");
                    inbound.gap();
                }
                Err(e) => {
                    tracing::warn!(event = "events.relay_failed", error = %e);
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Relayed>();
    bus.set_relay(tx);
    let db = db.clone();
    actix_rt::spawn(async move {
        while let Some(relayed) = rx.recv().await {
            let topic = match &relayed {
                Relayed::Event(e) => e.topic.as_str(),
                Relayed::Revocation(_) => "revocation",
            };
            let payload = match serde_json::to_string(&Envelope {
                origin: processes::id().to_owned(),
                relayed,
            }) {
                Ok(p) if p.len() <= MAX_PAYLOAD => p,
                _ => {
                    tracing::warn!(event = "events.relay_too_large", topic);
                    continue;
                }
            };
            let sent = db
                .execute_raw(Statement::from_sql_and_values(
                    DatabaseBackend::Postgres,
                    "SELECT pg_notify($1, $2)",
                    [CHANNEL.into(), payload.into()],
                ))
                .await;
            if let Err(e) = sent {
                tracing::warn!(event = "events.relay_send_failed", topic, error = %e);
            }
        }
    });
    Ok(true)
}
