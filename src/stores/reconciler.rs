//! The reconciler: an actor that periodically deletes stored revisions whose storage id no
//! computer row owns (a deleted computer's objects, already unreadable without its wrapped
//! data key, then disappear from the bucket too).
//!
//! A pass lists the stored storage ids first and reads the owners second: a revision can only
//! be stored for an existing computer row, so an id listed before the owners were read and
//! missing from them is truly unowned. Passes never overlap (`AtomicResponse`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rakazo_actors::entity::computer;
use rakazo_actors::home_store::StoreError;
use sea_orm::{DatabaseConnection, EntityTrait, QuerySelect};

use super::local::fail;
use super::object::ObjectHomeStore;

/// How often a pass runs.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15 * 60);

/// Delete every stored revision whose storage id no computer owns; returns how many storage
/// ids were removed.
pub async fn reconcile(
    db: &DatabaseConnection,
    store: &ObjectHomeStore,
) -> Result<usize, StoreError> {
    use rakazo_actors::home_store::HomeStore;
    let stored = store.storage_ids().await?;
    if stored.is_empty() {
        return Ok(0);
    }
    let owned: HashSet<String> = computer::Entity::find()
        .select_only()
        .column(computer::Column::StorageId)
        .into_tuple::<String>()
        .all(db)
        .await
        .map_err(fail)?
        .into_iter()
        .collect();
    let mut removed = 0;
    for id in stored.iter().filter(|id| !owned.contains(*id)) {
        store.delete_revisions(id).await?;
        removed += 1;
    }
    tracing::info!(event = "home.reconciled", count = removed);
    Ok(removed)
}

/// Run one pass now (the interval sends it too).
#[derive(Message)]
#[rtype(result = "Result<usize, StoreError>")]
pub struct ReconcileNow;

/// Runs [`reconcile`] every `every`.
pub struct Reconciler {
    db: DatabaseConnection,
    store: Arc<ObjectHomeStore>,
    every: Duration,
}

impl Reconciler {
    /// A reconciler of `store` against the computers of `db`.
    pub fn new(db: DatabaseConnection, store: Arc<ObjectHomeStore>, every: Duration) -> Self {
        Self { db, store, every }
    }
}

impl Actor for Reconciler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |_, ctx| ctx.notify(ReconcileNow));
    }
}

impl Handler<ReconcileNow> for Reconciler {
    type Result = AtomicResponse<Self, Result<usize, StoreError>>;

    fn handle(&mut self, _: ReconcileNow, _: &mut Context<Self>) -> Self::Result {
        let (db, store) = (self.db.clone(), self.store.clone());
        AtomicResponse::new(Box::pin(
            async move {
                let outcome = reconcile(&db, &store).await;
                if let Err(e) = &outcome {
                    tracing::warn!(event = "home.reconcile_failed", error = %e);
                }
                outcome
            }
            .into_actor(self),
        ))
    }
}
