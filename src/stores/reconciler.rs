//! The reconciler: an actor that periodically deletes the stored objects this deployment can
//! prove it orphaned, and nothing else.
//!
//! It lists only the store's own root (`[OBJECT_STORAGE_PREFIX/]<deployment id>`), so keys of
//! another deployment sharing the bucket, of the layout before deployment roots, or of anything
//! else in the bucket are never seen. Under the root, a storage id no computer row owns goes
//! when
//! - it has a tombstone (written in the transaction that deleted its computer row), or
//! - its newest object is older than the grace (a write that outlived its row, say).
//!
//! When none of the stored storage ids is owned or tombstoned by this database (a database
//! pointed at a root it did not write), nothing is deleted. A tombstone is dropped once its
//! objects are gone and the grace has passed (no late write can land any more).
//!
//! A pass lists the stored storage ids first and reads the owners second: a revision can only
//! be stored for an existing computer row, so an id listed before the owners were read and
//! missing from them is truly unowned. Passes never overlap (`AtomicResponse`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use rakazo_actors::entity::{computer, home_tombstone};
use rakazo_actors::home_store::StoreError;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QuerySelect};

use super::local::fail;
use super::object::ObjectHomeStore;

/// How often a pass runs.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(15 * 60);

/// How old an unowned storage id without a tombstone must be before it goes, and how long a
/// tombstone outlives its objects.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(24 * 60 * 60);

/// What a pass did, in counts only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Storage ids deleted because their computer was deleted (tombstoned).
    pub tombstoned: usize,
    /// Unowned storage ids deleted because they were older than the grace.
    pub expired: usize,
    /// Unowned storage ids kept because they are younger than the grace.
    pub young: usize,
    /// Unowned storage ids kept because this database recognises nothing under the root.
    pub unproven: usize,
    /// Tombstones dropped.
    pub tombstones_dropped: usize,
}

impl Reconciled {
    /// Storage ids deleted.
    pub fn removed(&self) -> usize {
        self.tombstoned + self.expired
    }
}

fn ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One pass at time `now`: delete what this deployment provably orphaned under the store's
/// root (see the module documentation).
pub async fn reconcile(
    db: &DatabaseConnection,
    store: &ObjectHomeStore,
    grace: Duration,
    now: SystemTime,
) -> Result<Reconciled, StoreError> {
    let stored = store.stored_homes().await?;
    let tombstones: HashMap<String, i64> = home_tombstone::Entity::find()
        .all(db)
        .await
        .map_err(fail)?
        .into_iter()
        .map(|t| (t.storage_id, t.deleted_at_ms))
        .collect();
    let owned: HashSet<String> = computer::Entity::find()
        .select_only()
        .column(computer::Column::StorageId)
        .into_tuple::<String>()
        .all(db)
        .await
        .map_err(fail)?
        .into_iter()
        .collect();
    let recognised = stored
        .iter()
        .any(|h| owned.contains(&h.storage_id) || tombstones.contains_key(&h.storage_id));
    let mut done = Reconciled::default();
    for home in stored.iter().filter(|h| !owned.contains(&h.storage_id)) {
        if tombstones.contains_key(&home.storage_id) {
            store.delete_revisions(&home.storage_id).await?;
            done.tombstoned += 1;
        } else if !recognised {
            done.unproven += 1;
        } else if now
            .duration_since(home.newest)
            .is_ok_and(|age| age >= grace)
        {
            store.delete_revisions(&home.storage_id).await?;
            done.expired += 1;
        } else {
            done.young += 1;
        }
    }
    // Every tombstoned storage id listed was just emptied; an old tombstone has served.
    let cutoff = ms(now).saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
    let served: Vec<String> = tombstones
        .into_iter()
        .filter(|(_, at)| *at <= cutoff)
        .map(|(id, _)| id)
        .collect();
    if !served.is_empty() {
        done.tombstones_dropped = home_tombstone::Entity::delete_many()
            .filter(home_tombstone::Column::StorageId.is_in(served))
            .exec(db)
            .await
            .map_err(fail)?
            .rows_affected as usize;
    }
    tracing::info!(
        event = "home.reconciled",
        tombstoned = done.tombstoned,
        expired = done.expired,
        young = done.young,
        unproven = done.unproven,
        tombstones_dropped = done.tombstones_dropped,
    );
    Ok(done)
}

/// Run one pass now (the interval sends it too).
#[derive(Message)]
#[rtype(result = "Result<Reconciled, StoreError>")]
pub struct ReconcileNow;

/// Runs [`reconcile`] every `every`.
pub struct Reconciler {
    db: DatabaseConnection,
    store: Arc<ObjectHomeStore>,
    every: Duration,
    grace: Duration,
}

impl Reconciler {
    /// A reconciler of `store` against the computers and tombstones of `db`, deleting unowned
    /// storage ids without a tombstone once older than `grace`.
    pub fn new(
        db: DatabaseConnection,
        store: Arc<ObjectHomeStore>,
        every: Duration,
        grace: Duration,
    ) -> Self {
        Self {
            db,
            store,
            every,
            grace,
        }
    }
}

impl Actor for Reconciler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |_, ctx| ctx.notify(ReconcileNow));
    }
}

impl Handler<ReconcileNow> for Reconciler {
    type Result = AtomicResponse<Self, Result<Reconciled, StoreError>>;

    fn handle(&mut self, _: ReconcileNow, _: &mut Context<Self>) -> Self::Result {
        let (db, store, grace) = (self.db.clone(), self.store.clone(), self.grace);
        AtomicResponse::new(Box::pin(
            async move {
                let outcome = reconcile(&db, &store, grace, SystemTime::now()).await;
                if let Err(e) = &outcome {
                    tracing::warn!(event = "home.reconcile_failed", error = %e);
                }
                outcome
            }
            .into_actor(self),
        ))
    }
}
