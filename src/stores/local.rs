//! The local home store: sealed revisions under `DATA_DIR/home-revisions/<storage id>/` and
//! the latest workspace unpacked under `DATA_DIR/homes/<home key>`.
//!
//! Saving first unpacks the archive into a staging directory (which also enforces every
//! restore rule), then writes the sealed revision (temporary file, fsync, rename), then swaps
//! the staged copy in (current → `.old-*`, staged → current, drop old). A crash at any point
//! leaves the old or the new workspace, never a mix: an interrupted swap is rolled back the
//! next time the home is touched. The last `keep` revisions are kept.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use rakazo_actors::home_store::{HomeId, HomeStore, StoreError};

use super::archive::{self, ArchiveError, Limits};
use super::durable::{sync_dir, write_atomic, write_atomic_with};
use super::seal::{self, Binding};

/// Test hook: the environment variable naming a point where the process aborts, to prove
/// crash safety (`home.before_swap`, `home.mid_swap`).
pub const CRASH_AT_ENV: &str = "RAKAZO_CRASH_AT";

fn crash_point(name: &str) {
    if std::env::var(CRASH_AT_ENV).is_ok_and(|v| v == name) {
        std::process::abort();
    }
}

pub(crate) fn fail(e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(e.to_string())
}

pub(crate) fn safe_name(s: &str) -> Result<&str, StoreError> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    ok.then_some(s)
        .ok_or_else(|| StoreError::Failed("invalid home key or storage id".into()))
}

/// A refused archive is `Rejected`; an I/O failure is `Failed`.
pub fn refused(e: ArchiveError) -> StoreError {
    match e {
        ArchiveError::Refused(why) => StoreError::Rejected(why),
        ArchiveError::Io(e) => fail(e),
    }
}

/// The latest unpacked copies, with staged replacement.
#[derive(Clone)]
pub struct LatestCopies {
    homes: PathBuf,
    limits: Limits,
}

impl LatestCopies {
    /// Copies under `homes` (usually `DATA_DIR/homes`).
    pub fn new(homes: impl Into<PathBuf>, limits: Limits) -> Self {
        Self {
            homes: homes.into(),
            limits,
        }
    }

    /// The restore limits every copy is checked against.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Where the latest copy of a home lives.
    pub fn path(&self, home_key: &str) -> Result<PathBuf, StoreError> {
        Ok(self.homes.join(safe_name(home_key)?))
    }

    /// Roll back an interrupted swap and drop stale staging directories.
    pub fn recover(&self, home_key: &str) -> Result<(), StoreError> {
        let current = self.path(home_key)?;
        let Ok(entries) = std::fs::read_dir(&self.homes) else {
            return Ok(());
        };
        let (old_prefix, staging_prefix, trash_prefix) = (
            format!(".old-{home_key}."),
            format!(".staging-{home_key}."),
            format!(".trash-{home_key}."),
        );
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&old_prefix) {
                if current.exists() {
                    std::fs::remove_dir_all(entry.path()).map_err(fail)?;
                } else {
                    std::fs::rename(entry.path(), &current).map_err(fail)?;
                    tracing::warn!(event = "home.swap_rolled_back", home.key = home_key);
                }
            } else if name.starts_with(&staging_prefix) {
                std::fs::remove_dir_all(entry.path()).map_err(fail)?;
            } else if name.starts_with(&trash_prefix) {
                // Possibly still being removed by the swap that made it: best effort.
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(())
    }

    /// Unpack `archive` into a staging directory (enforcing every restore rule).
    pub fn stage(&self, home_key: &str, archive: &[u8]) -> Result<PathBuf, StoreError> {
        self.stage_with(home_key, archive, false)
    }

    /// Like [`Self::stage`], but files whose bytes the latest copy already holds are
    /// hard-linked from it. Only for copies no machine writes to (the store is their only
    /// writer, and it never writes into a file in place).
    pub fn stage_reusing(&self, home_key: &str, archive: &[u8]) -> Result<PathBuf, StoreError> {
        self.stage_with(home_key, archive, true)
    }

    fn stage_with(
        &self,
        home_key: &str,
        archive: &[u8],
        reuse: bool,
    ) -> Result<PathBuf, StoreError> {
        std::fs::create_dir_all(&self.homes).map_err(fail)?;
        self.recover(home_key)?;
        let staged = self.homes.join(format!(
            ".staging-{}.{}",
            safe_name(home_key)?,
            uuid::Uuid::new_v4().simple()
        ));
        let current = self.path(home_key)?;
        if reuse && current.is_dir() {
            archive::unpack_reusing(archive, &staged, self.limits, &current)
        } else {
            archive::unpack(archive, &staged, self.limits)
        }
        .map_err(refused)?;
        Ok(staged)
    }

    /// Where the digest of the archive the latest copy was unpacked from is kept.
    fn digest_stamp(&self, home_key: &str) -> Result<PathBuf, StoreError> {
        Ok(self.homes.join(format!(".digest-{}", safe_name(home_key)?)))
    }

    /// Stage `archive` (every restore rule) unless the latest copy was unpacked from exactly
    /// these bytes, which the digest stamp written at its swap says: then nothing is written.
    /// Only for copies no machine writes to (the store is their only writer).
    pub fn stage_changed(&self, home_key: &str, archive: &[u8]) -> Result<Staged, StoreError> {
        use sha2::Digest as _;
        let digest = hex::encode(sha2::Sha256::digest(archive));
        let stamp = std::fs::read_to_string(self.digest_stamp(home_key)?).unwrap_or_default();
        if stamp == digest && self.path(home_key)?.is_dir() {
            return Ok(Staged { dir: None, digest });
        }
        Ok(Staged {
            dir: Some(self.stage_reusing(home_key, archive)?),
            digest,
        })
    }

    /// Make a staged copy current and stamp its digest (nothing to do when unchanged).
    pub fn commit(&self, home_key: &str, staged: &Staged) -> Result<(), StoreError> {
        let Some(dir) = &staged.dir else {
            return Ok(());
        };
        self.swap_in(home_key, dir)?;
        write_atomic(&self.digest_stamp(home_key)?, staged.digest.as_bytes())
    }

    /// Make a staged directory the latest copy.
    pub fn swap_in(&self, home_key: &str, staged: &Path) -> Result<(), StoreError> {
        let current = self.path(home_key)?;
        // Unstamp first: a crash from here on restages instead of trusting the copy.
        match std::fs::remove_file(self.digest_stamp(home_key)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
        crash_point("home.before_swap");
        let old = self
            .homes
            .join(format!(".old-{home_key}.{}", uuid::Uuid::new_v4().simple()));
        let had_current = current.exists();
        if had_current {
            std::fs::rename(&current, &old).map_err(fail)?;
        }
        crash_point("home.mid_swap");
        std::fs::rename(staged, &current).map_err(fail)?;
        sync_dir(&self.homes)?;
        if had_current {
            // The replaced copy is garbage now: out of the way at once (a crash leaves a
            // `.trash-*` that `recover` removes), unlinked off the caller's path.
            let trash = self.homes.join(format!(
                ".trash-{home_key}.{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::rename(&old, &trash).map_err(fail)?;
            std::thread::spawn(move || {
                if std::fs::remove_dir_all(&trash).is_err() {
                    tracing::debug!(event = "home.trash_left");
                }
            });
        }
        Ok(())
    }

    /// Remove the latest copy.
    pub fn remove(&self, home_key: &str) -> Result<(), StoreError> {
        let _ = std::fs::remove_file(self.digest_stamp(home_key)?);
        match std::fs::remove_dir_all(self.path(home_key)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(fail(e)),
            _ => Ok(()),
        }
    }
}

/// A staged copy, or `dir: None` when the latest copy already holds the same archive.
#[derive(Debug)]
pub struct Staged {
    dir: Option<PathBuf>,
    digest: String,
}

impl Staged {
    /// Removes the staged directory (after a failure).
    fn discard(&self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Removes expired revisions (`.trash-*`) from a revision directory, those a crash left too.
fn empty_trash(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".trash-")
            && std::fs::remove_file(entry.path()).is_err()
        {
            tracing::debug!(event = "home.trash_left");
        }
    }
}

/// Sealed revisions on local disk plus the latest unpacked copy (cheap to clone).
#[derive(Clone)]
pub struct LocalHomeStore {
    revisions: PathBuf,
    latest: LatestCopies,
    keep: usize,
}

impl LocalHomeStore {
    /// A store under `data_dir` (`homes/` and `home-revisions/`) keeping `keep` revisions.
    pub fn new(data_dir: &Path, keep: usize, limits: Limits) -> Self {
        Self {
            revisions: data_dir.join("home-revisions"),
            latest: LatestCopies::new(data_dir.join("homes"), limits),
            keep: keep.max(1),
        }
    }

    /// The latest unpacked copies.
    pub fn latest(&self) -> &LatestCopies {
        &self.latest
    }

    fn dir(&self, storage_id: &str) -> Result<PathBuf, StoreError> {
        Ok(self.revisions.join(safe_name(storage_id)?))
    }

    fn list(dir: &Path) -> Result<Vec<i64>, StoreError> {
        let mut revs = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for entry in entries {
                    let name = entry.map_err(fail)?.file_name();
                    if let Some(rev) = name
                        .to_str()
                        .and_then(|n| n.strip_suffix(".sealed"))
                        .and_then(|n| n.parse().ok())
                    {
                        revs.push(rev);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e)),
        }
        revs.sort_unstable();
        Ok(revs)
    }

    fn save_blocking(
        &self,
        home: &HomeId,
        revision: i64,
        archive: &[u8],
        replace_latest: bool,
    ) -> Result<(), StoreError> {
        // Every revision must be restorable: staging checks every restore rule; when the copy
        // is not swapped in (the machine works in it directly) the rules are checked without
        // writing anything. Either runs side by side with sealing.
        let dir = self.dir(&home.storage_id)?;
        let sealed_path = dir.join(format!("{revision}.sealed"));
        let (staged, written) = std::thread::scope(|scope| {
            let sealing = scope.spawn(|| {
                let binding = Binding {
                    storage_id: &home.storage_id,
                    revision,
                };
                write_atomic_with(&sealed_path, |file| {
                    seal::seal_to(&home.data_key, &binding, archive, file)
                })
            });
            let staged = if replace_latest {
                self.latest.stage_changed(&home.home_key, archive).map(Some)
            } else {
                archive::check(archive, self.latest.limits())
                    .map(|()| None)
                    .map_err(refused)
            };
            let written = sealing
                .join()
                .unwrap_or_else(|_| Err(StoreError::Failed("sealing panicked".into())));
            (staged, written)
        });
        let outcome = (|| match (staged?, written) {
            (Some(staged), Ok(())) => {
                let swapped = self.latest.commit(&home.home_key, &staged);
                if swapped.is_err() {
                    staged.discard();
                }
                swapped
            }
            (None, written) => written,
            (Some(staged), Err(e)) => {
                staged.discard();
                Err(e)
            }
        })();
        if outcome.is_err() {
            // A revision whose copy was refused or not swapped in is not kept.
            let _ = std::fs::remove_file(&sealed_path);
            return outcome;
        }
        let revs = Self::list(&dir)?;
        let expired = revs.len().saturating_sub(self.keep);
        for old in &revs[..expired] {
            // Out of the revision list at once; its blocks are freed off the caller's path.
            std::fs::rename(
                dir.join(format!("{old}.sealed")),
                dir.join(format!(".trash-{old}.{}", uuid::Uuid::new_v4().simple())),
            )
            .map_err(fail)?;
        }
        if expired > 0 {
            std::thread::spawn(move || empty_trash(&dir));
        }
        Ok(())
    }

    fn load_blocking(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        self.latest.recover(&home.home_key)?;
        let path = self
            .dir(&home.storage_id)?
            .join(format!("{revision}.sealed"));
        let sealed = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::NotFound),
            Err(e) => return Err(fail(e)),
        };
        seal::open(
            &home.data_key,
            &Binding {
                storage_id: &home.storage_id,
                revision,
            },
            &sealed,
        )
        .map_err(|e| StoreError::Rejected(e.to_string()))
    }
}

/// Run blocking store work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await.map_err(fail)?
}

#[async_trait]
impl HomeStore for LocalHomeStore {
    async fn save(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Vec<u8>,
        replace_latest: bool,
    ) -> Result<(), StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.save_blocking(&home, revision, &archive, replace_latest)).await
    }

    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.load_blocking(&home, revision)).await
    }

    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError> {
        Self::list(&self.dir(&home.storage_id)?)
    }

    async fn delete(&self, home_key: &str, storage_id: &str) -> Result<(), StoreError> {
        match std::fs::remove_dir_all(self.dir(storage_id)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
        self.latest.remove(home_key)
    }

    fn location(&self, storage_id: &str, revision: i64) -> String {
        format!("home-revisions/{storage_id}/{revision}.sealed")
    }

    async fn storage_ids(&self) -> Result<Vec<String>, StoreError> {
        let mut ids = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.revisions) {
            for entry in entries.flatten() {
                if let Some(name) = entry.file_name().to_str().filter(|n| safe_name(n).is_ok()) {
                    ids.push(name.to_owned());
                }
            }
        }
        Ok(ids)
    }
}
