//! The local home store: sealed revisions under `DATA_DIR/home-revisions/<storage id>/` (a
//! manifest per revision, the chunks it names under `chunks/`) and the latest workspace
//! unpacked under `DATA_DIR/homes/<home key>`.
//!
//! Saving plans the revision (every chunk checked against the restore rules), writes the new
//! chunks and makes them durable at once, then writes the manifest (temporary file, fsync,
//! rename). When the store keeps the latest copy, it stages it beside the writes and swaps it
//! in afterwards (current → `.old-*`, staged → current, drop old), stamped first with the
//! revision it holds (`.revision-<home key>`, `<storage id>:<revision>`). A crash at any point
//! leaves the old or the new workspace, never a mix: an interrupted swap is settled at
//! start-up (`crate::recovery`) and whenever the home is next touched, and a copy whose stamp
//! is not the revision the database recorded is made that revision again
//! ([`HomeStore::settle_latest`]). The last `keep` revisions, and the chunks they name, are
//! kept.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use rakazo_actors::home_store::{
    ArchiveReader, ArchiveWriter, HomeId, HomeStore, Saved, StoreError, StreamSaved,
};
use rakazo_actors::provider::{FileEntry, ProviderError};
use rakazo_actors::workspace::Workspace;

use super::archive::{self, ArchiveError, Limits};
use super::chunks::{self, Kept, Manifest, Plan, Revision, open_chunk};
use super::durable::{sync_dir, sync_filesystem, write_atomic, write_unsynced_with};
use super::seal::{self, Binding};
use super::stream;
use crate::providers::beneath::Beneath;
use crate::providers::workspace_path::normalize;

pub use crate::crash_point::CRASH_AT_ENV;
use crate::crash_point::crash_point;

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

    /// Lists a folder of a latest copy, beneath it and never through a link (off the async
    /// executor); a home without a copy lists nothing.
    pub async fn list(&self, home_key: &str, path: &str) -> Result<Vec<FileEntry>, ProviderError> {
        let root = self
            .path(home_key)
            .map_err(|_| ProviderError::NotFound(String::new()))?;
        let path = path.to_owned();
        files_blocking(move || {
            if !root.exists() && normalize(&path, true)?.is_empty() {
                return Ok(Vec::new());
            }
            Beneath::open(&root)?.list(&path)
        })
        .await
    }

    /// Reads a regular file of a latest copy, beneath it and never through a link, at most
    /// `cap` bytes (off the async executor).
    pub async fn read(
        &self,
        home_key: &str,
        path: &str,
        cap: u64,
    ) -> Result<Vec<u8>, ProviderError> {
        let root = self
            .path(home_key)
            .map_err(|_| ProviderError::NotFound(String::new()))?;
        let path = path.to_owned();
        files_blocking(move || Beneath::open(&root)?.read(&path, cap)).await
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

    /// Where the stamp naming the revision the latest copy holds is kept
    /// (`<storage id>:<revision>`).
    pub fn revision_stamp(&self, home_key: &str) -> Result<PathBuf, StoreError> {
        Ok(self
            .homes
            .join(format!(".revision-{}", safe_name(home_key)?)))
    }

    /// The revision of `storage_id` the latest copy's stamp names, if any.
    pub fn stamped(&self, home_key: &str, storage_id: &str) -> Result<Option<i64>, StoreError> {
        let stamp = std::fs::read_to_string(self.revision_stamp(home_key)?).unwrap_or_default();
        Ok(stamp
            .strip_prefix(storage_id)
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rev| rev.parse().ok()))
    }

    /// Stamps the latest copy as holding `revision` of `storage_id`.
    pub fn stamp(&self, home_key: &str, storage_id: &str, revision: i64) -> Result<(), StoreError> {
        write_atomic(
            &self.revision_stamp(home_key)?,
            format!("{storage_id}:{revision}").as_bytes(),
        )
    }

    /// Removes the latest copy's revision stamp: nothing then says what it holds.
    pub fn unstamp(&self, home_key: &str) -> Result<(), StoreError> {
        match std::fs::remove_file(self.revision_stamp(home_key)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(fail(e)),
            _ => Ok(()),
        }
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

    /// Replace the latest copy's contents with `archive`'s, keeping the directory itself (a
    /// machine may have it mounted: a container's bind mount holds the directory, not its
    /// path). Staged and checked completely first, so a refused archive changes nothing; the
    /// move itself is not atomic, so callers record what the copy must hold first and do it
    /// again after a crash (a pending restore, an import before a machine's use). What a crash
    /// leaves beside it (`.staging-*`, `.trash-*`) `recover` removes.
    pub fn replace_in_place(&self, home_key: &str, archive: &[u8]) -> Result<(), StoreError> {
        let staged = self.stage(home_key, archive)?;
        crash_point("home.staged");
        let outcome = self.move_contents_in(home_key, &staged);
        let _ = std::fs::remove_dir_all(&staged);
        outcome
    }

    fn move_contents_in(&self, home_key: &str, staged: &Path) -> Result<(), StoreError> {
        let current = self.path(home_key)?;
        match std::fs::remove_file(self.digest_stamp(home_key)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
            _ => {}
        }
        std::fs::create_dir_all(&current).map_err(fail)?;
        let trash = self.homes.join(format!(
            ".trash-{home_key}.{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&trash).map_err(fail)?;
        for entry in std::fs::read_dir(&current).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            std::fs::rename(entry.path(), trash.join(entry.file_name())).map_err(fail)?;
        }
        crash_point("home.mid_replace");
        for entry in std::fs::read_dir(staged).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            std::fs::rename(entry.path(), current.join(entry.file_name())).map_err(fail)?;
        }
        sync_dir(&current)?;
        std::thread::spawn(move || {
            if std::fs::remove_dir_all(&trash).is_err() {
                tracing::debug!(event = "home.trash_left");
            }
        });
        Ok(())
    }

    /// Remove the latest copy.
    pub fn remove(&self, home_key: &str) -> Result<(), StoreError> {
        let _ = std::fs::remove_file(self.digest_stamp(home_key)?);
        self.unstamp(home_key)?;
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

impl LatestCopies {
    /// A fresh staging directory's path (not created) for a streamed unpack, and the current
    /// copy to link unchanged files from, if there is one.
    pub fn staging(&self, home_key: &str) -> Result<(PathBuf, Option<PathBuf>), StoreError> {
        std::fs::create_dir_all(&self.homes).map_err(fail)?;
        self.recover(home_key)?;
        let staged = self.homes.join(format!(
            ".staging-{}.{}",
            safe_name(home_key)?,
            uuid::Uuid::new_v4().simple()
        ));
        let current = self.path(home_key)?;
        Ok((staged, current.is_dir().then_some(current)))
    }
}

impl Staged {
    /// A staged directory unpacked from the archive with this digest.
    pub fn unpacked(dir: PathBuf, digest: String) -> Self {
        Self {
            dir: Some(dir),
            digest,
        }
    }

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

/// The folder of a home's sealed chunks, inside its revision folder.
const CHUNKS: &str = "chunks";

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

    fn read(path: &Path) -> Result<Vec<u8>, StoreError> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::NotFound),
            Err(e) => Err(fail(e)),
        }
    }

    fn chunk_path(dir: &Path, name: &str) -> PathBuf {
        dir.join(CHUNKS).join(format!("{name}.sealed"))
    }

    /// A stored revision, opened.
    fn open_revision(&self, home: &HomeId, revision: i64) -> Result<Revision, StoreError> {
        let sealed = Self::read(
            &self
                .dir(&home.storage_id)?
                .join(format!("{revision}.sealed")),
        )?;
        Revision::open(home, revision, &sealed)
    }

    /// A chunk of a home, opened.
    fn open_chunk(&self, home: &HomeId, name: &str) -> Result<Vec<u8>, StoreError> {
        let sealed = Self::read(&Self::chunk_path(&self.dir(&home.storage_id)?, name)).map_err(
            |e| match e {
                StoreError::NotFound => StoreError::Rejected("a chunk is missing".into()),
                other => other,
            },
        )?;
        open_chunk(home, name, &sealed)
    }

    /// The kept revisions, opened.
    fn kept(&self, home: &HomeId, dir: &Path) -> Result<Kept, StoreError> {
        let mut kept = Kept::default();
        for rev in Self::list(dir)? {
            kept.add(rev, self.open_revision(home, rev));
        }
        Ok(kept)
    }

    fn save_blocking(
        &self,
        home: &HomeId,
        revision: i64,
        workspace: Workspace,
        replace_latest: bool,
    ) -> Result<Saved, StoreError> {
        let dir = self.dir(&home.storage_id)?;
        let kept = self.kept(home, &dir)?;
        // A chunk this save writes is its own to take back on failure only when no kept
        // revision could have named it.
        let owns_new_chunks = kept.complete();
        // Every chunk is checked against the restore rules before anything is written.
        let plan = chunks::plan(&home.data_key, workspace, &kept, self.latest.limits())?;
        // The latest copy, when this store keeps it, is staged side by side with the writes.
        let (staged, written) = std::thread::scope(|scope| {
            let writing = scope.spawn(|| self.write_chunks(home, &dir, &plan));
            let staged = if replace_latest {
                plan.archive(|name| self.open_chunk(home, name))
                    .and_then(|archive| self.latest.stage_changed(&home.home_key, &archive))
                    .map(Some)
            } else {
                Ok(None)
            };
            let written = writing
                .join()
                .unwrap_or_else(|_| Err(StoreError::Failed("sealing panicked".into())));
            (staged, written)
        });
        let manifest_path = dir.join(format!("{revision}.sealed"));
        let manifest = plan.manifest.encode();
        let outcome = (|| {
            let staged = staged?;
            let stored = written.and_then(|()| {
                let binding = Binding::revision(&home.storage_id, revision);
                let sealed = seal::seal(&home.data_key, &binding, &manifest);
                write_atomic(&manifest_path, &sealed)
            });
            match (staged, stored) {
                (Some(staged), Ok(())) => {
                    // Stamped before the swap: until the database records this revision, a
                    // crash leaves a stamp that is not the recorded revision, and start-up
                    // recovery makes the copy the recorded one again.
                    let swapped = self
                        .latest
                        .stamp(&home.home_key, &home.storage_id, revision)
                        .and_then(|()| self.latest.commit(&home.home_key, &staged));
                    if swapped.is_err() {
                        staged.discard();
                    }
                    swapped
                }
                (None, stored) => stored,
                (Some(staged), Err(e)) => {
                    staged.discard();
                    Err(e)
                }
            }
        })();
        if let Err(e) = outcome {
            // A revision whose copy was refused or not swapped in is not kept, nor are the
            // chunks only it named.
            let _ = std::fs::remove_file(&manifest_path);
            for chunk in plan.new.iter().filter(|_| owns_new_chunks) {
                let _ = std::fs::remove_file(Self::chunk_path(&dir, &chunk.name));
            }
            return Err(e);
        }
        self.apply_retention(home, &dir, &kept, revision, &plan.manifest)?;
        Ok(Saved {
            archive_bytes: plan.manifest.archive_bytes(),
            stored_bytes: plan.sealed_bytes(&home.storage_id, revision, manifest.len()),
        })
    }

    /// Seals and writes the plan's new chunks on every core, then makes them durable at
    /// once.
    fn write_chunks(&self, home: &HomeId, dir: &Path, plan: &Plan) -> Result<(), StoreError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if plan.new.is_empty() {
            return Ok(());
        }
        let chunks = dir.join(CHUNKS);
        std::fs::create_dir_all(&chunks).map_err(fail)?;
        let next = AtomicUsize::new(0);
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(plan.new.len());
        let work = || -> Result<(), StoreError> {
            while let Some(chunk) = plan.new.get(next.fetch_add(1, Ordering::Relaxed)) {
                let binding = Binding::chunk(&home.storage_id, &chunk.name);
                write_unsynced_with(&Self::chunk_path(dir, &chunk.name), |file| {
                    seal::seal_to(&home.data_key, &binding, plan.chunk(chunk), file)
                })?;
            }
            Ok(())
        };
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(work)).collect();
            let mine = work();
            helpers.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(StoreError::Failed("sealing panicked".into())))
            })?;
            mine
        })?;
        sync_filesystem(&chunks)
    }

    /// After `revision` was saved: forgets revisions past the newest `keep`, then the
    /// chunks no remaining revision names.
    fn apply_retention(
        &self,
        home: &HomeId,
        dir: &Path,
        kept: &Kept,
        revision: i64,
        manifest: &Manifest,
    ) -> Result<(), StoreError> {
        let (expired, named) = kept.retention(self.keep, revision, manifest);
        for old in &expired {
            // Out of the revision list at once; its blocks are freed off the caller's path.
            std::fs::rename(
                dir.join(format!("{old}.sealed")),
                dir.join(format!(".trash-{old}.{}", uuid::Uuid::new_v4().simple())),
            )
            .map_err(fail)?;
        }
        // A kept revision that cannot be read now keeps every chunk until one can.
        let Some(named) = named else {
            tracing::warn!(event = "home.chunks_kept", home.storage_id = %home.storage_id);
            return Ok(());
        };
        let Ok(entries) = std::fs::read_dir(dir.join(CHUNKS)) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|n| n.strip_suffix(".sealed")) else {
                continue;
            };
            if !named.contains(name) {
                std::fs::rename(
                    entry.path(),
                    dir.join(format!(".trash-{name}.{}", uuid::Uuid::new_v4().simple())),
                )
                .map_err(fail)?;
            }
        }
        let dir = dir.to_path_buf();
        std::thread::spawn(move || empty_trash(&dir));
        Ok(())
    }

    /// See [`HomeStore::settle_latest`].
    fn settle_latest_blocking(&self, home: &HomeId, revision: i64) -> Result<bool, StoreError> {
        let key = &home.home_key;
        self.latest.recover(key)?;
        if self.latest.stamped(key, &home.storage_id)? == Some(revision) {
            return Ok(false);
        }
        if revision == 0 {
            let had = self.latest.path(key)?.exists() || self.latest.revision_stamp(key)?.exists();
            self.latest.remove(key)?;
            return Ok(had);
        }
        let archive = self.load_blocking(home, revision)?;
        self.replace_latest_blocking(home, revision, &archive)?;
        Ok(true)
    }

    /// Replaces the latest copy's contents in place, unstamped while it changes.
    fn replace_latest_blocking(
        &self,
        home: &HomeId,
        revision: i64,
        archive: &[u8],
    ) -> Result<(), StoreError> {
        self.latest.unstamp(&home.home_key)?;
        self.latest.replace_in_place(&home.home_key, archive)?;
        self.latest
            .stamp(&home.home_key, &home.storage_id, revision)
    }

    fn load_blocking(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        self.latest.recover(&home.home_key)?;
        match self.open_revision(home, revision)? {
            Revision::Whole(archive) => Ok(archive),
            Revision::Chunked(manifest) => manifest.assemble(
                manifest
                    .chunks
                    .iter()
                    .map(|chunk| self.open_chunk(home, &chunk.name)),
            ),
        }
    }
}

/// New chunks of a streamed save, sealed into their files as they are cut.
struct LocalChunks<'a> {
    home: &'a HomeId,
    dir: &'a Path,
    written: Vec<String>,
}

impl stream::ChunkSink for LocalChunks<'_> {
    fn put(&mut self, name: &str, plain: Vec<u8>) -> Result<(), StoreError> {
        if self.written.is_empty() {
            std::fs::create_dir_all(self.dir.join(CHUNKS)).map_err(fail)?;
        }
        self.written.push(name.to_owned());
        let binding = Binding::chunk(&self.home.storage_id, name);
        write_unsynced_with(&LocalHomeStore::chunk_path(self.dir, name), |file| {
            seal::seal_to(&self.home.data_key, &binding, &plain, file)
        })
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        if self.written.is_empty() {
            return Ok(());
        }
        sync_filesystem(&self.dir.join(CHUNKS))
    }
}

impl LocalHomeStore {
    /// See [`HomeStore::save_stream`]: the archive arrives on `blocks`.
    fn save_stream_blocking(
        &self,
        home: &HomeId,
        revision: i64,
        blocks: tokio::sync::mpsc::Receiver<stream::Block>,
        unless: Option<&str>,
        replace_latest: bool,
    ) -> Result<StreamSaved, StoreError> {
        let dir = self.dir(&home.storage_id)?;
        let kept = self.kept(home, &dir)?;
        // A chunk this save writes is its own to take back only when no kept revision could
        // have named it.
        let owns_new_chunks = kept.complete();
        let staging = if replace_latest {
            Some(self.latest.staging(&home.home_key)?)
        } else {
            None
        };
        let unpack = match &staging {
            Some((into, reuse)) => stream::Unpack::Into {
                into,
                reuse: reuse.as_deref(),
            },
            None => stream::Unpack::Check,
        };
        let mut sink = LocalChunks {
            home,
            dir: &dir,
            written: Vec::new(),
        };
        let streamed = stream::save(
            &home.data_key,
            &kept,
            self.latest.limits(),
            blocks,
            unpack,
            &mut sink,
        );
        let written = std::mem::take(&mut sink.written);
        let take_back = |written: &[String]| {
            for name in written.iter().filter(|_| owns_new_chunks) {
                let _ = std::fs::remove_file(Self::chunk_path(&dir, name));
            }
        };
        let discard = || {
            if let Some((staged, _)) = &staging {
                let _ = std::fs::remove_dir_all(staged);
            }
        };
        let streamed = match streamed {
            Ok(streamed) if unless != Some(streamed.fingerprint.as_str()) => streamed,
            unchanged_or_failed => {
                take_back(&written);
                discard();
                return unchanged_or_failed.map(|_| StreamSaved::Unchanged);
            }
        };
        let manifest_path = dir.join(format!("{revision}.sealed"));
        let manifest = streamed.manifest.encode();
        let outcome = (|| {
            let binding = Binding::revision(&home.storage_id, revision);
            write_atomic(
                &manifest_path,
                &seal::seal(&home.data_key, &binding, &manifest),
            )?;
            if let Some((staged, _)) = &staging {
                // Stamped before the swap, as a save of pieces does.
                self.latest
                    .stamp(&home.home_key, &home.storage_id, revision)?;
                let staged = Staged::unpacked(staged.clone(), streamed.fingerprint.clone());
                self.latest.commit(&home.home_key, &staged)?;
            }
            Ok(())
        })();
        if let Err(e) = outcome {
            let _ = std::fs::remove_file(&manifest_path);
            take_back(&written);
            discard();
            return Err(e);
        }
        self.apply_retention(home, &dir, &kept, revision, &streamed.manifest)?;
        Ok(StreamSaved::Saved {
            saved: Saved {
                archive_bytes: streamed.manifest.archive_bytes(),
                stored_bytes: streamed.stored_bytes(&home.storage_id, revision, manifest.len()),
            },
            fingerprint: streamed.fingerprint,
        })
    }

    /// Opens a stored revision's pieces in order, handing each plaintext to `send` (which
    /// answers whether to go on); the end blocks last.
    fn read_pieces(
        &self,
        home: &HomeId,
        revision: i64,
        send: &mut dyn FnMut(Vec<u8>) -> bool,
    ) -> Result<(), StoreError> {
        self.latest.recover(&home.home_key)?;
        match self.open_revision(home, revision)? {
            Revision::Whole(archive) => {
                send(archive);
            }
            Revision::Chunked(manifest) => {
                for chunk in &manifest.chunks {
                    let plain = self.open_chunk(home, &chunk.name)?;
                    if plain.len() as u64 != chunk.len {
                        return Err(StoreError::Rejected("a chunk has the wrong length".into()));
                    }
                    if !send(plain) {
                        return Ok(());
                    }
                }
                send(rakazo_actors::workspace::ARCHIVE_END.to_vec());
            }
        }
        Ok(())
    }
}

/// Writes what `pieces` sends to `out` as it comes; `pieces`' own failure first.
pub(crate) async fn write_pieces(
    mut pieces: tokio::sync::mpsc::Receiver<Vec<u8>>,
    reading: tokio::task::JoinHandle<Result<(), StoreError>>,
    out: ArchiveWriter<'_>,
) -> Result<(), StoreError> {
    use tokio::io::AsyncWriteExt as _;
    let mut written = Ok(());
    while let Some(piece) = pieces.recv().await {
        if let Err(e) = out.write_all(&piece).await {
            written = Err(fail(format!("writing the archive: {e}")));
            break;
        }
    }
    drop(pieces);
    reading.await.map_err(fail)??;
    written?;
    out.flush()
        .await
        .map_err(|e| fail(format!("writing the archive: {e}")))
}

/// Run blocking file work of a latest copy off the async executor.
async fn files_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProviderError::Failed(format!("file task: {e}")))?
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
        workspace: Workspace,
        replace_latest: bool,
    ) -> Result<Saved, StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.save_blocking(&home, revision, workspace, replace_latest)).await
    }

    async fn save_stream(
        &self,
        home: &HomeId,
        revision: i64,
        archive: ArchiveReader<'_>,
        unless: Option<&str>,
        replace_latest: bool,
    ) -> Result<StreamSaved, StoreError> {
        let (to_save, blocks) = stream::channel();
        let (me, home, unless) = (self.clone(), home.clone(), unless.map(str::to_owned));
        let saving = blocking(move || {
            me.save_stream_blocking(&home, revision, blocks, unless.as_deref(), replace_latest)
        });
        let (fed, saved) = tokio::join!(stream::feed(archive, to_save), saving);
        // A failed read failed the save too; the save's error says more.
        let saved = saved?;
        fed?;
        Ok(saved)
    }

    async fn load_to(
        &self,
        home: &HomeId,
        revision: i64,
        out: ArchiveWriter<'_>,
    ) -> Result<(), StoreError> {
        let (to_write, pieces) = tokio::sync::mpsc::channel(2);
        let (me, home) = (self.clone(), home.clone());
        let reading = tokio::task::spawn_blocking(move || {
            me.read_pieces(&home, revision, &mut |piece| {
                to_write.blocking_send(piece).is_ok()
            })
        });
        write_pieces(pieces, reading, out).await
    }

    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.load_blocking(&home, revision)).await
    }

    async fn replace_latest(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Vec<u8>,
    ) -> Result<(), StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.replace_latest_blocking(&home, revision, &archive)).await
    }

    async fn settle_latest(&self, home: &HomeId, revision: i64) -> Result<bool, StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || me.settle_latest_blocking(&home, revision)).await
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

    async fn list_latest(
        &self,
        home_key: &str,
        path: &str,
    ) -> Result<Vec<FileEntry>, ProviderError> {
        self.latest.list(home_key, path).await
    }

    async fn read_latest(
        &self,
        home_key: &str,
        path: &str,
        cap: u64,
    ) -> Result<Vec<u8>, ProviderError> {
        self.latest.read(home_key, path, cap).await
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

#[async_trait]
impl super::doctor::Inspect for LocalHomeStore {
    async fn stored_ids(&self) -> Result<Vec<String>, StoreError> {
        self.storage_ids().await
    }

    async fn manifests(&self, storage_id: &str) -> Result<Vec<i64>, StoreError> {
        Self::list(&self.dir(storage_id)?)
    }

    async fn chunk_names(&self, storage_id: &str) -> Result<Vec<String>, StoreError> {
        let mut names = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.dir(storage_id)?.join(CHUNKS)) {
            for entry in entries.flatten() {
                if let Some(name) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".sealed"))
                {
                    names.push(name.to_owned());
                }
            }
        }
        Ok(names)
    }

    async fn sealed_manifest(
        &self,
        storage_id: &str,
        revision: i64,
    ) -> Result<Vec<u8>, StoreError> {
        Self::read(&self.dir(storage_id)?.join(format!("{revision}.sealed")))
    }

    async fn sealed_chunk(&self, storage_id: &str, name: &str) -> Result<Vec<u8>, StoreError> {
        Self::read(&Self::chunk_path(&self.dir(storage_id)?, name))
    }
}
