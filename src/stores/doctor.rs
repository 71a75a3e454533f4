//! `rakazo doctor`: verifies every stored revision of a deployment (manifests, chunks, seals,
//! the references the database makes to them) and reports what is missing, damaged or
//! orphaned, without changing anything.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use rakazo_actors::entity::computer;
use rakazo_actors::home_store::{HomeId, StoreError};
use rakazo_actors::keys::{self, KeyBytes};
use sea_orm::{DatabaseConnection, EntityTrait};

use super::chunks::{Revision, open_chunk};

/// Read-only access to a store's sealed objects.
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Every storage id with stored objects.
    async fn stored_ids(&self) -> Result<Vec<String>, StoreError>;
    /// The revisions (manifests) stored for a storage id, oldest first.
    async fn manifests(&self, storage_id: &str) -> Result<Vec<i64>, StoreError>;
    /// The names of the chunks stored for a storage id.
    async fn chunk_names(&self, storage_id: &str) -> Result<Vec<String>, StoreError>;
    /// A sealed manifest (`NotFound` when absent).
    async fn sealed_manifest(&self, storage_id: &str, revision: i64)
    -> Result<Vec<u8>, StoreError>;
    /// A sealed chunk (`NotFound` when absent).
    async fn sealed_chunk(&self, storage_id: &str, name: &str) -> Result<Vec<u8>, StoreError>;
}

/// One problem found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The storage id it concerns.
    pub storage_id: String,
    /// What is wrong (a stable word: `missing-chunk`, `damaged-chunk`, `missing-revision`, ...).
    pub kind: &'static str,
    /// The object: `revision <n>` or `chunk <name>`, with context.
    pub object: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.kind, self.storage_id, self.object)
    }
}

/// What a check covered and found.
#[derive(Debug, Default)]
pub struct Report {
    /// Computers checked.
    pub computers: usize,
    /// Revisions opened.
    pub revisions: usize,
    /// Chunks opened.
    pub chunks: usize,
    /// Problems, in the order found.
    pub findings: Vec<Finding>,
}

impl Report {
    fn add(&mut self, storage_id: &str, kind: &'static str, object: String) {
        self.findings.push(Finding {
            storage_id: storage_id.into(),
            kind,
            object,
        });
    }
}

/// Checks the deployment `config` describes: its database (not migrated, not written), its
/// content key (never created) and its configured store.
pub async fn run(config: &crate::config::Config) -> Result<Report, String> {
    let db = crate::db::connect(&config.database_url.0)
        .await
        .map_err(|e| e.to_string())?;
    let master =
        crate::keyfile::load(config.content_key.as_ref(), &config.data_dir, "content.key")?;
    let limits = super::archive::Limits::default();
    let keep = config.keep_revisions as usize;
    match &config.object_storage {
        Some(cfg) => {
            let store =
                super::deployment::open_store_read_only(&db, cfg, &config.data_dir, keep).await?;
            check(&db, &master, &store).await
        }
        None => {
            let store = super::local::LocalHomeStore::new(&config.data_dir, keep, limits);
            check(&db, &master, &store).await
        }
    }
}

/// Checks every computer's stored revisions and every stored object's owner.
pub async fn check(
    db: &DatabaseConnection,
    master: &KeyBytes,
    store: &dyn Inspect,
) -> Result<Report, String> {
    let mut report = Report::default();
    let computers: BTreeMap<String, computer::Model> = computer::Entity::find()
        .all(db)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|c| (c.storage_id.clone(), c))
        .collect();
    let stored: HashSet<String> = store
        .stored_ids()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    let mut orphans: Vec<&String> = stored
        .iter()
        .filter(|id| !computers.contains_key(*id))
        .collect();
    orphans.sort();
    for id in orphans {
        report.add(id, "orphaned-storage", "no computer owns it".into());
    }
    for (storage_id, row) in &computers {
        report.computers += 1;
        check_computer(
            db,
            master,
            store,
            row,
            stored.contains(storage_id),
            &mut report,
        )
        .await?;
    }
    Ok(report)
}

async fn check_computer(
    db: &DatabaseConnection,
    master: &KeyBytes,
    store: &dyn Inspect,
    row: &computer::Model,
    has_objects: bool,
    report: &mut Report,
) -> Result<(), String> {
    let sid = row.storage_id.as_str();
    let revisions = if has_objects {
        store.manifests(sid).await.map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    for (what, wanted) in [
        ("current", Some(row.revision).filter(|r| *r > 0)),
        ("pending restore", row.pending_restore_revision),
    ] {
        if let Some(wanted) = wanted.filter(|r| !revisions.contains(r)) {
            report.add(
                sid,
                "missing-revision",
                format!("revision {wanted} ({what})"),
            );
        }
    }
    for rev in revisions.iter().filter(|r| **r > row.revision) {
        report.add(
            sid,
            "uncommitted-revision",
            format!("revision {rev} (newer than the recorded {})", row.revision),
        );
    }
    if !has_objects {
        return Ok(());
    }
    if row.wrapped_data_key.is_none() {
        report.add(sid, "missing-key", "the computer has no data key".into());
        return Ok(());
    }
    let data_key = keys::data_key(db, master, &row.id)
        .await
        .map_err(|e| e.message)?;
    let home = HomeId {
        home_key: row.home_key.clone(),
        storage_id: sid.into(),
        data_key,
    };
    let mut named = HashSet::new();
    let mut checked: BTreeMap<String, bool> = BTreeMap::new();
    let mut complete = true;
    for rev in &revisions {
        report.revisions += 1;
        let opened = match store.sealed_manifest(sid, *rev).await {
            Ok(sealed) => Revision::open(&home, *rev, &sealed),
            Err(e) => Err(e),
        };
        let manifest = match opened {
            Ok(Revision::Whole(_)) => continue,
            Ok(Revision::Chunked(manifest)) => manifest,
            Err(e) => {
                complete = false;
                report.add(sid, "damaged-revision", format!("revision {rev}: {e}"));
                continue;
            }
        };
        for chunk in &manifest.chunks {
            named.insert(chunk.name.clone());
            if checked.contains_key(&chunk.name) {
                continue;
            }
            report.chunks += 1;
            let found = match store.sealed_chunk(sid, &chunk.name).await {
                Err(StoreError::NotFound) => Some(("missing-chunk", "not stored".to_owned())),
                Err(e) => Some(("unreadable-chunk", e.to_string())),
                Ok(sealed) => match open_chunk(&home, &chunk.name, &sealed) {
                    Err(e) => Some(("damaged-chunk", e.to_string())),
                    Ok(plain) if plain.len() as u64 != chunk.len => Some((
                        "damaged-chunk",
                        format!("{} bytes, the manifest says {}", plain.len(), chunk.len),
                    )),
                    Ok(_) => None,
                },
            };
            checked.insert(chunk.name.clone(), found.is_none());
            if let Some((kind, why)) = found {
                report.add(
                    sid,
                    kind,
                    format!("chunk {} (revision {rev}): {why}", chunk.name),
                );
            }
        }
    }
    if complete {
        let mut stored = store.chunk_names(sid).await.map_err(|e| e.to_string())?;
        stored.sort();
        for name in stored.iter().filter(|n| !named.contains(*n)) {
            report.add(
                sid,
                "orphaned-chunk",
                format!("chunk {name}: no revision names it"),
            );
        }
    }
    Ok(())
}
