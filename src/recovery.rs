//! Crash recovery at start-up: what a process killed mid-work left behind is rolled back or
//! forward before anything uses it. Interrupted swaps of latest copies are settled (back to
//! the copy before the swap, or forward when the new copy was already in place), temporary
//! and trashed files of the stores are swept, a pending restore's latest copy is made again,
//! a latest copy a checkpoint swapped in before its revision was recorded is brought back to
//! the recorded revision, and reservations of processes that are gone are released.
//!
//! A process holds an exclusive lock on `DATA_DIR/run/processes/<id>.lock` for its whole life:
//! a lock that can be taken belongs to a process that stopped, so its reservations are released
//! at once; a process elsewhere is gone once its heartbeat is silent
//! ([`processes::gone_after_ms`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rakazo_actors::computers::ComputerState;
use rakazo_actors::entity::computer;
use rakazo_actors::processes::{self, Processes};
use rakazo_actors::runtime::Runtime;
use rakazo_actors::{DomainError, DomainResult};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use crate::stores::local::{LatestCopies, safe_name};

/// This process's lock; released when the last app of this process that holds it is dropped.
#[derive(Clone)]
pub struct ProcessLock(Arc<HeldLock>);

/// An open, locked lock file. Dropping it releases the lock and leaves the file: the next
/// start finds it free and settles the process as gone (its reservations and computer
/// claims), then removes it. A file removed at exit would make a cleanly stopped process look
/// like one on another host, whose claims wait for its heartbeat to fall silent.
struct HeldLock {
    _file: File,
    path: PathBuf,
}

impl ProcessLock {
    fn path(&self) -> &Path {
        &self.0.path
    }
}

fn locks_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("run").join("processes")
}

fn io(e: std::io::Error) -> DomainError {
    DomainError::new(rakazo_actors::ErrorCode::Internal, e.to_string())
}

/// Takes this process's lock, or shares it with another app of this process on the same data
/// directory (one process, one lock: a second lock of the same file would block).
fn lock_self(data_dir: &Path) -> DomainResult<ProcessLock> {
    static HELD: std::sync::Mutex<Vec<std::sync::Weak<HeldLock>>> =
        std::sync::Mutex::new(Vec::new());
    let dir = locks_dir(data_dir);
    std::fs::create_dir_all(&dir).map_err(io)?;
    let path = dir.join(format!("{}.lock", processes::id()));
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    held.retain(|w| w.strong_count() > 0);
    if let Some(lock) = held
        .iter()
        .filter_map(|w| w.upgrade())
        .find(|l| l.path == path)
    {
        return Ok(ProcessLock(lock));
    }
    let file = File::create(&path).map_err(io)?;
    file.try_lock()
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let lock = Arc::new(HeldLock { _file: file, path });
    held.push(Arc::downgrade(&lock));
    Ok(ProcessLock(lock))
}

/// Whether the process that made lock file `path` stopped (its lock can be taken).
fn stopped(path: &Path) -> bool {
    File::open(path).is_ok_and(|f| f.try_lock().is_ok())
}

/// Releases the reservations of every process that is gone: those on this data directory
/// whose lock is free, and those anywhere whose heartbeat is silent. Then registers this one.
async fn settle_processes(rt: &Runtime, data_dir: &Path) -> DomainResult<ProcessLock> {
    let me = lock_self(data_dir)?;
    let rows = Processes::new(rt.db.clone());
    for row in rows.others().await? {
        let lock = locks_dir(data_dir).join(format!("{}.lock", row.id));
        if lock.is_file() && stopped(&lock) {
            rows.gone(&row.id).await?;
            let _ = std::fs::remove_file(&lock);
        }
    }
    // Lock files of stopped processes whose rows are already gone.
    if let Ok(entries) = std::fs::read_dir(locks_dir(data_dir)) {
        for entry in entries.flatten() {
            if entry.path() != me.path() && stopped(&entry.path()) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    rows.sweep_silent().await?;
    rows.register().await?;
    Ok(me)
}

/// Beats this process's heartbeat and releases the reservations of silent processes, forever.
pub async fn heartbeat(db: sea_orm::DatabaseConnection) {
    let rows = Processes::new(db);
    let mut every = tokio::time::interval(processes::heartbeat_every());
    loop {
        every.tick().await;
        if let Err(e) = rows.register().await {
            tracing::warn!(event = "process.heartbeat_failed", error = %e);
        }
        if let Err(e) = rows.sweep_silent().await {
            tracing::warn!(event = "process.sweep_failed", error = %e);
        }
    }
}

/// Whether a temporary file (`.tmp-<pid>-<id>`) was left by a process that is not running:
/// not this one (nothing was written yet at start-up) or one with no `/proc` entry.
fn abandoned_tmp(name: &str) -> bool {
    let Some(pid) = name
        .strip_prefix(".tmp-")
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
    else {
        return name.starts_with(".tmp-");
    };
    pid == std::process::id() || !Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes temporary and trashed files from every revision folder and its chunk folder, and
/// abandoned temporary files (stamps being written) beside the latest copies.
fn sweep_revisions(data_dir: &Path) -> usize {
    let mut swept = 0;
    if let Ok(entries) = std::fs::read_dir(data_dir.join("homes")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if abandoned_tmp(&name) && std::fs::remove_file(entry.path()).is_ok() {
                swept += 1;
            }
        }
    }
    let Ok(homes) = std::fs::read_dir(data_dir.join("home-revisions")) else {
        return 0;
    };
    for home in homes.flatten() {
        for dir in [home.path(), home.path().join("chunks")] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let leftover = name.starts_with(".trash-") || abandoned_tmp(&name);
                if leftover && std::fs::remove_file(entry.path()).is_ok() {
                    swept += 1;
                }
            }
        }
    }
    swept
}

/// Settles every interrupted swap of a latest copy under `DATA_DIR/homes`.
fn settle_copies(data_dir: &Path) -> DomainResult<()> {
    let homes = data_dir.join("homes");
    let copies = LatestCopies::new(&homes, Default::default());
    let Ok(entries) = std::fs::read_dir(&homes) else {
        return Ok(());
    };
    let mut keys = std::collections::BTreeSet::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        for prefix in [".old-", ".staging-", ".trash-"] {
            if let Some((key, _)) = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.rsplit_once('.'))
                && safe_name(key).is_ok()
            {
                keys.insert(key.to_owned());
            }
        }
    }
    for key in keys {
        copies.recover(&key)?;
    }
    Ok(())
}

/// Makes the latest copy of every computer with a pending restore the restored revision again
/// (a crash may have come between recording the restore and swapping the copy), unless a
/// machine of a mounted provider may still work in it: that machine imports the restore before
/// its next use.
async fn settle_pending_restores(rt: &Runtime) -> DomainResult<()> {
    let mounted = rt
        .provider()
        .is_ok_and(|p| p.describe().capabilities.mounted_home);
    let pending = computer::Entity::find()
        .filter(computer::Column::PendingRestoreRevision.is_not_null())
        .all(&rt.db)
        .await?;
    for row in pending {
        let Some(revision) = row.pending_restore_revision else {
            continue;
        };
        if mounted && row.state != ComputerState::Stopped.as_str() {
            continue;
        }
        let home = rt.home_id(&row).await?;
        let copied = async {
            let archive = rt.homes.load(&home, revision).await?;
            rt.homes.replace_latest(&home, revision, archive).await
        };
        match copied.await {
            Ok(()) => {
                tracing::info!(event = "recovery.restore_copied", computer.id = %row.id, revision)
            }
            Err(e) => {
                tracing::warn!(event = "recovery.restore_copy_failed", computer.id = %row.id, error = %e)
            }
        }
    }
    Ok(())
}

/// Makes the latest copy of every computer whose machine does not work in it hold the
/// revision the database names: a crash between a checkpoint's swap of the copy and the row
/// that records it leaves the copy a revision ahead (its stamp says so). Computers with a
/// pending restore were settled just before. A copy that may be a mounted machine's home (this
/// provider mounts homes, there is none, or the computer last ran at another provider kind) is
/// the machine's own and is left as it is.
async fn settle_latest_copies(rt: &Runtime) -> DomainResult<()> {
    let Ok(provider) = rt.provider() else {
        return Ok(());
    };
    let described = provider.describe();
    if described.capabilities.mounted_home {
        return Ok(());
    }
    let rows = computer::Entity::find()
        .filter(computer::Column::PendingRestoreRevision.is_null())
        .all(&rt.db)
        .await?;
    let ours = |row: &computer::Model| {
        row.provider_kind
            .as_deref()
            .is_none_or(|kind| kind == described.kind)
    };
    for row in rows.into_iter().filter(ours) {
        let settled = async {
            let home = rt.home_id(&row).await?;
            DomainResult::Ok(rt.homes.settle_latest(&home, row.revision).await?)
        };
        match settled.await {
            Ok(true) => {
                tracing::info!(event = "recovery.copy_settled", computer.id = %row.id, revision = row.revision)
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(event = "recovery.copy_settle_failed", computer.id = %row.id, error = %e)
            }
        }
    }
    Ok(())
}

/// Everything start-up recovery does, before the app serves anything. Answers this
/// process's lock, to be held for the process's life.
pub async fn at_start(rt: &Arc<Runtime>, data_dir: &Path) -> DomainResult<ProcessLock> {
    settle_copies(data_dir)?;
    let swept = sweep_revisions(data_dir);
    if swept > 0 {
        tracing::info!(event = "recovery.swept", files = swept);
    }
    settle_pending_restores(rt).await?;
    settle_latest_copies(rt).await?;
    settle_processes(rt, data_dir).await
}
