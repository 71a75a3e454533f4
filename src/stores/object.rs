//! The object home store: sealed revisions in an S3-compatible bucket (the source of truth),
//! every key under the deployment's root (`[OBJECT_STORAGE_PREFIX/]<deployment id>`): a
//! manifest per revision as `<root>/homes/<storage id>/<revision>` and the chunks it names as
//! `<root>/homes/<storage id>/chunks/<name>`, and the latest workspace unpacked under
//! `DATA_DIR/homes/<home key>` as a cache.
//!
//! Saving plans the revision (every chunk checked against the restore rules before anything
//! goes up), uploads the new chunks a few at a time, each sealed on a blocking thread that
//! hands its sealed parts to the upload as it goes (multipart above [`PART`]; an object is
//! completed only once sealed whole), then the manifest; then it swaps a staged copy in (when
//! the machine does not work in the cache itself) and deletes revisions past the kept ones
//! and the chunks no kept revision names. A refused archive or a failed upload leaves the
//! bucket's revisions and the latest copy as they were. Loading verifies every object before
//! anything local changes, then brings the cache up to the newest stored revision. Errors
//! carry the operation and the kind of failure only: never keys, endpoints, credentials or
//! object contents.

use std::collections::{HashMap, HashSet};
use std::path::Path as FsPath;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use rakazo_actors::home_store::{
    ArchiveReader, ArchiveWriter, HomeId, HomeStore, Saved, StoreError, StreamSaved,
};
use rakazo_actors::provider::{FileEntry, ProviderError};
use rakazo_actors::workspace::Workspace;

use super::archive::Limits;
use super::chunks::{self, Kept, Manifest, Plan, Revision, open_chunk};
use super::durable::write_atomic;
use super::local::{LatestCopies, blocking, fail, safe_name};
use super::seal::{self, Binding};

/// Objects above this size upload in parts of this size.
pub const PART: usize = 16 << 20;
/// Parts in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// The folder of stored revisions under the root.
const HOMES: &str = "homes";
/// The folder of a home's chunks, beside its revisions.
const CHUNKS: &str = "chunks";
/// Chunks moving to or from the bucket at once.
const CHUNKS_IN_FLIGHT: usize = 8;
/// Chunks a streamed load fetches ahead of the one it writes.
const CHUNKS_READ_AHEAD: usize = 3;

/// A sealed object on its way to the bucket, not yet visible there.
enum Upload {
    /// The sealing thread sent nothing (it failed first).
    Nothing,
    /// A small object, put whole on completion.
    Single(Bytes),
    /// A multipart upload with every part sent.
    Multipart(WriteMultipart),
}

impl Upload {
    /// Makes the object visible.
    async fn complete(self, bucket: &dyn ObjectStore, path: &Path) -> Result<(), StoreError> {
        match self {
            Self::Nothing => Err(fail("nothing was sealed")),
            Self::Single(bytes) => bucket
                .put(path, PutPayload::from(bytes))
                .await
                .map(drop)
                .map_err(|e| bucket_error("put", e)),
            Self::Multipart(writer) => writer
                .finish()
                .await
                .map(drop)
                .map_err(|e| bucket_error("finish upload", e)),
        }
    }

    /// Drops what was uploaded.
    async fn abort(self) {
        if let Self::Multipart(writer) = self {
            let _ = writer.abort().await;
        }
    }
}

/// The sealing thread's writer: sealed bytes in parts of [`PART`], sent to the uploader.
struct Parts {
    to_upload: tokio::sync::mpsc::Sender<Bytes>,
    part: Vec<u8>,
}

impl Parts {
    fn new(to_upload: tokio::sync::mpsc::Sender<Bytes>) -> Self {
        Self {
            to_upload,
            part: Vec::with_capacity(PART),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        let part = std::mem::replace(&mut self.part, Vec::with_capacity(PART));
        self.to_upload
            .blocking_send(Bytes::from(part))
            .map_err(|_| std::io::Error::other("the upload stopped"))
    }

    /// Sends the last part.
    fn finish(mut self) -> std::io::Result<()> {
        if self.part.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

impl std::io::Write for Parts {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = (PART - self.part.len()).min(data.len());
        self.part.extend_from_slice(&data[..n]);
        if self.part.len() == PART {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Chunk uploads of a streamed save in flight at once (each holds one chunk, plain and
/// sealed).
const UPLOADS_IN_FLIGHT: usize = 4;

/// New chunks of a streamed save, uploaded a few at a time as they are cut (from the blocking
/// thread that cuts them).
struct UploadChunks {
    store: ObjectHomeStore,
    home: HomeId,
    runtime: tokio::runtime::Handle,
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<Result<(), StoreError>>>,
    written: Vec<String>,
}

impl UploadChunks {
    /// Waits for the oldest upload.
    fn wait_one(&mut self) -> Result<(), StoreError> {
        match self.in_flight.pop_front() {
            Some(upload) => self.runtime.block_on(upload).map_err(fail)?,
            None => Ok(()),
        }
    }

    /// Waits for every upload, whatever it ends with (after a failure, so nothing lands
    /// after the cleanup).
    fn settle(&mut self) {
        while !self.in_flight.is_empty() {
            let _ = self.wait_one();
        }
    }
}

impl super::stream::ChunkSink for UploadChunks {
    fn put(&mut self, name: &str, plain: Vec<u8>) -> Result<(), StoreError> {
        while self.in_flight.len() >= UPLOADS_IN_FLIGHT {
            self.wait_one()?;
        }
        self.written.push(name.to_owned());
        let path = self.store.chunk_key(&self.home.storage_id, name)?;
        let (store, home, name) = (self.store.clone(), self.home.clone(), name.to_owned());
        self.in_flight.push_back(self.runtime.spawn(async move {
            store
                .put_sealed(&path, move |out| {
                    let binding = Binding::chunk(&home.storage_id, &name);
                    seal::seal_to(&home.data_key, &binding, &plain, out)
                })
                .await
        }));
        Ok(())
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        while !self.in_flight.is_empty() {
            self.wait_one()?;
        }
        Ok(())
    }
}

/// Sealed revisions in a bucket plus the latest unpacked copy (cheap to clone).
#[derive(Clone)]
pub struct ObjectHomeStore {
    bucket: Arc<dyn ObjectStore>,
    /// Every key of this store lives under it (the deployment's prefix).
    root: Path,
    latest: LatestCopies,
    keep: usize,
}

/// Translate a bucket failure into ours, naming only the operation and the kind of failure.
fn bucket_error(op: &str, err: object_store::Error) -> StoreError {
    let kind = match &err {
        object_store::Error::NotFound { .. } => return StoreError::NotFound,
        object_store::Error::Generic { .. } => "request failed",
        object_store::Error::Precondition { .. } => "precondition failed",
        object_store::Error::AlreadyExists { .. } => "already exists",
        object_store::Error::PermissionDenied { .. } => "permission denied",
        object_store::Error::Unauthenticated { .. } => "unauthenticated",
        object_store::Error::NotSupported { .. } => "not supported",
        _ => "failed",
    };
    tracing::warn!(event = "home.bucket_failed", op, kind);
    StoreError::Failed(format!("object storage {op}: {kind}"))
}

/// Where a storage id's revisions sit: `<root>/homes/<storage id>`.
fn home_prefix(root: &Path, storage_id: &str) -> Result<Path, StoreError> {
    Ok(root.clone().join(HOMES).join(safe_name(storage_id)?))
}

/// A stored storage id under this store's root, with when its newest object was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredHome {
    /// The storage id.
    pub storage_id: String,
    /// The newest object's modification time (the bucket's clock).
    pub newest: std::time::SystemTime,
}

impl ObjectHomeStore {
    /// A store over the keys of `bucket` under `root`, caching latest copies under
    /// `data_dir/homes`, keeping `keep` revisions.
    pub fn new(
        bucket: Arc<dyn ObjectStore>,
        root: Path,
        data_dir: &FsPath,
        keep: usize,
        limits: Limits,
    ) -> Self {
        Self {
            bucket,
            root,
            latest: LatestCopies::new(data_dir.join("homes"), limits),
            keep: keep.max(1),
        }
    }

    /// The latest unpacked copies.
    pub fn latest(&self) -> &LatestCopies {
        &self.latest
    }

    /// The prefix every key of this store lives under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn prefix(&self, storage_id: &str) -> Result<Path, StoreError> {
        home_prefix(&self.root, storage_id)
    }

    fn key(&self, storage_id: &str, revision: i64) -> Result<Path, StoreError> {
        Ok(self.prefix(storage_id)?.join(revision.to_string()))
    }

    fn chunk_key(&self, storage_id: &str, name: &str) -> Result<Path, StoreError> {
        Ok(self.prefix(storage_id)?.join(CHUNKS).join(name))
    }

    /// Which stored revision the cached copy of `home_key` is (`<storage id>:<revision>`).
    fn marker(&self, home_key: &str) -> Result<std::path::PathBuf, StoreError> {
        let current = self.latest.path(home_key)?;
        let dir = current.parent().ok_or_else(|| fail("no homes directory"))?;
        Ok(dir.join(format!(".revision-{home_key}")))
    }

    fn cached_is(&self, home: &HomeId, revision: i64) -> Result<bool, StoreError> {
        let stamp = std::fs::read_to_string(self.marker(&home.home_key)?).unwrap_or_default();
        Ok(stamp == format!("{}:{revision}", home.storage_id)
            && self.latest.path(&home.home_key)?.is_dir())
    }

    /// Make `archive` the latest copy of `home`, recording its revision. The copy's contents
    /// are replaced in place (a container may have the directory mounted); it is unstamped
    /// first, so a crash midway fetches it again.
    async fn refresh_cache(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Arc<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || {
            let marker = me.marker(&home.home_key)?;
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
                _ => {}
            }
            me.latest.replace_in_place(&home.home_key, &archive)?;
            write_atomic(
                &marker,
                format!("{}:{revision}", home.storage_id).as_bytes(),
            )
        })
        .await
    }

    /// Swap a staged copy in and stamp it; on failure the staged copy is removed.
    fn make_current(
        &self,
        home: &HomeId,
        revision: i64,
        staged: &FsPath,
    ) -> Result<(), StoreError> {
        let marker = self.marker(&home.home_key)?;
        let outcome = (|| {
            // Unstamp first: a crash mid-swap then re-fetches instead of trusting the cache.
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(e)),
                _ => {}
            }
            self.latest.swap_in(&home.home_key, staged)?;
            write_atomic(
                &marker,
                format!("{}:{revision}", home.storage_id).as_bytes(),
            )
        })();
        if outcome.is_err() {
            let _ = std::fs::remove_dir_all(staged);
        }
        outcome
    }

    /// Uploads the parts the sealing thread sends, until it stops sending: one part is kept
    /// for a single put, more start a multipart upload. Nothing is completed here.
    async fn upload_parts(
        &self,
        path: &Path,
        mut parts: tokio::sync::mpsc::Receiver<Bytes>,
    ) -> Result<Upload, StoreError> {
        let Some(first) = parts.recv().await else {
            return Ok(Upload::Nothing);
        };
        let Some(second) = parts.recv().await else {
            return Ok(Upload::Single(first));
        };
        let upload = self
            .bucket
            .put_multipart(path)
            .await
            .map_err(|e| bucket_error("start upload", e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
        let sent = async {
            let mut received = [first, second].into_iter();
            while let Some(part) = match received.next() {
                Some(part) => Some(part),
                None => parts.recv().await,
            } {
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(part);
            }
            Ok(())
        }
        .await;
        match sent {
            Ok(()) => Ok(Upload::Multipart(writer)),
            Err(e) => {
                let _ = writer.abort().await;
                Err(bucket_error("upload part", e))
            }
        }
    }

    /// Seals what `seal` writes and puts it at `path` (in parts above [`PART`]). Nothing is
    /// visible at `path` unless sealing finished.
    async fn put_sealed(
        &self,
        path: &Path,
        seal: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send + 'static,
    ) -> Result<(), StoreError> {
        let (parts, sealed_parts) = tokio::sync::mpsc::channel(PARTS_IN_FLIGHT);
        let sealing = tokio::task::spawn_blocking(move || {
            let mut out = Parts::new(parts);
            seal(&mut out)?;
            out.finish()
        });
        let (sealed, upload) = tokio::join!(sealing, self.upload_parts(path, sealed_parts));
        let sealed = sealed.map_err(fail).and_then(|r| r.map_err(fail));
        match (sealed, upload) {
            (Ok(()), Ok(upload)) => upload.complete(&*self.bucket, path).await,
            (Err(e), Ok(upload)) => {
                upload.abort().await;
                Err(e)
            }
            (_, Err(e)) => Err(e),
        }
    }

    /// Every object key under `prefix`.
    async fn keys(&self, prefix: &Path) -> Result<Vec<Path>, StoreError> {
        self.bucket
            .list(Some(prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .map_err(|e| bucket_error("list", e))
    }

    async fn delete_keys(&self, keys: Vec<Path>) -> Result<(), StoreError> {
        let stream = futures_util::stream::iter(keys.into_iter().map(Ok)).boxed();
        self.bucket
            .delete_stream(stream)
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| bucket_error("delete", e))?;
        Ok(())
    }

    /// Delete every stored revision and chunk of `storage_id` (the latest copy stays: it is
    /// keyed by home, which another computer may own now). For the reconciler.
    pub async fn delete_revisions(&self, storage_id: &str) -> Result<usize, StoreError> {
        let keys = self.keys(&self.prefix(storage_id)?).await?;
        let count = keys.len();
        self.delete_keys(keys).await?;
        Ok(count)
    }

    /// Every storage id with objects under this store's root, with its newest object's time,
    /// ordered by storage id. Keys outside the root are never listed.
    pub async fn stored_homes(&self) -> Result<Vec<StoredHome>, StoreError> {
        let homes = self.root.clone().join(HOMES);
        let listed: Vec<_> = self
            .bucket
            .list(Some(&homes))
            .try_collect()
            .await
            .map_err(|e| bucket_error("list", e))?;
        let mut newest: std::collections::BTreeMap<String, std::time::SystemTime> =
            Default::default();
        for meta in listed {
            let Some(id) = meta
                .location
                .prefix_match(&homes)
                .and_then(|mut rest| rest.next())
                .map(|p| p.as_ref().to_owned())
                .filter(|id| safe_name(id).is_ok())
            else {
                continue;
            };
            let at = std::time::SystemTime::from(meta.last_modified);
            let slot = newest.entry(id).or_insert(at);
            *slot = (*slot).max(at);
        }
        Ok(newest
            .into_iter()
            .map(|(storage_id, newest)| StoredHome { storage_id, newest })
            .collect())
    }

    /// Moves the objects of `owned` storage ids from the layout before deployment prefixes
    /// (`homes/<storage id>/...` at the top of the bucket) under this store's root: each
    /// object is copied first (chunks before revisions, so a moved revision always finds its
    /// chunks), and the old keys are deleted only once every copy of that storage id is done.
    /// Idempotent; storage ids this database does not own are left where they are. Returns
    /// how many storage ids were moved.
    pub async fn adopt_legacy(&self, owned: &HashSet<String>) -> Result<usize, StoreError> {
        if self.root.parts_count() == 0 {
            return Ok(0);
        }
        let legacy = Path::from(HOMES);
        let mut by_home: std::collections::BTreeMap<String, Vec<Path>> = Default::default();
        for key in self.keys(&legacy).await? {
            let id = key
                .prefix_match(&legacy)
                .and_then(|mut rest| rest.next())
                .map(|p| p.as_ref().to_owned());
            if let Some(id) = id.filter(|id| owned.contains(id)) {
                by_home.entry(id).or_default().push(key);
            }
        }
        for keys in by_home.values_mut() {
            // Chunks (one folder deeper) first.
            keys.sort_by_key(|k| std::cmp::Reverse(k.parts_count()));
            for key in keys.iter() {
                let to = Path::from_iter(self.root.parts().chain(key.parts()));
                self.bucket
                    .copy(key, &to)
                    .await
                    .map_err(|e| bucket_error("copy", e))?;
            }
            // Revisions go first, so an interrupted move never leaves a revision without its
            // chunks under the old keys either.
            keys.reverse();
            self.delete_keys(std::mem::take(keys)).await?;
        }
        let moved = by_home.len();
        if moved > 0 {
            tracing::info!(event = "home.layout_moved", homes = moved);
        }
        Ok(moved)
    }

    async fn get(&self, path: &Path) -> Result<Bytes, StoreError> {
        self.bucket
            .get(path)
            .await
            .map_err(|e| bucket_error("get", e))?
            .bytes()
            .await
            .map_err(|e| bucket_error("read", e))
    }

    /// A stored revision, opened.
    async fn open_revision(&self, home: &HomeId, revision: i64) -> Result<Revision, StoreError> {
        let sealed = self.get(&self.key(&home.storage_id, revision)?).await?;
        let home = home.clone();
        blocking(move || Revision::open(&home, revision, &sealed)).await
    }

    /// Chunks of a home, fetched and opened a few at a time, in order.
    async fn open_chunks(
        &self,
        home: &HomeId,
        names: Vec<String>,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        futures_util::stream::iter(names)
            .map(|name| async move {
                let sealed = self
                    .get(&self.chunk_key(&home.storage_id, &name)?)
                    .await
                    .map_err(|e| match e {
                        StoreError::NotFound => StoreError::Rejected("a chunk is missing".into()),
                        other => other,
                    })?;
                let home = home.clone();
                blocking(move || open_chunk(&home, &name, &sealed)).await
            })
            .buffered(CHUNKS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// The kept revisions, opened.
    async fn kept(&self, home: &HomeId) -> Result<Kept, StoreError> {
        let mut kept = Kept::default();
        for rev in self.revisions(home).await? {
            kept.add(rev, self.open_revision(home, rev).await);
        }
        Ok(kept)
    }

    /// Seals and uploads the plan's new chunks, a few at a time.
    async fn put_chunks(&self, home: &HomeId, plan: &Arc<Plan>) -> Result<(), StoreError> {
        futures_util::stream::iter(0..plan.new.len())
            .map(|i| {
                let (plan, home) = (plan.clone(), home.clone());
                async move {
                    let path = self.chunk_key(&home.storage_id, &plan.new[i].name)?;
                    self.put_sealed(&path, move |out| {
                        let chunk = &plan.new[i];
                        let binding = Binding::chunk(&home.storage_id, &chunk.name);
                        seal::seal_to(&home.data_key, &binding, plan.chunk(chunk), out)
                    })
                    .await
                }
            })
            .buffer_unordered(CHUNKS_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// The whole archive of a plan, fetching the chunks the workspace did not bring.
    async fn plan_archive(&self, home: &HomeId, plan: &Plan) -> Result<Vec<u8>, StoreError> {
        let brought: HashSet<&str> = plan.brought.iter().map(|c| c.name.as_str()).collect();
        // Each missing chunk fetched once, however often the manifest names it.
        let missing: HashSet<&str> = plan
            .manifest
            .names()
            .filter(|n| !brought.contains(n))
            .collect();
        let missing: Vec<String> = missing.into_iter().map(str::to_owned).collect();
        let opened = self.open_chunks(home, missing.clone()).await?;
        let fetched: HashMap<String, Vec<u8>> = missing.into_iter().zip(opened).collect();
        plan.archive(|name| {
            fetched
                .get(name)
                .cloned()
                .ok_or_else(|| StoreError::Rejected("a chunk is missing".into()))
        })
    }

    /// Takes back what a streamed save that is not kept left: its staged copy, and the
    /// chunks it put when no kept revision can name them.
    async fn take_back(
        &self,
        home: &HomeId,
        staging: &Option<(std::path::PathBuf, Option<std::path::PathBuf>)>,
        written: &[String],
        owns_new_chunks: bool,
    ) {
        if let Some((staged, _)) = staging {
            let _ = std::fs::remove_dir_all(staged);
        }
        let keys = written
            .iter()
            .map(|name| self.chunk_key(&home.storage_id, name))
            .collect::<Result<Vec<_>, _>>();
        if let (true, Ok(keys)) = (owns_new_chunks, keys)
            && !keys.is_empty()
        {
            let _ = self.delete_keys(keys).await;
        }
    }

    /// After `revision` was saved: deletes revisions past the newest `keep`, then chunks no
    /// remaining revision names.
    async fn apply_retention(
        &self,
        home: &HomeId,
        kept: &Kept,
        revision: i64,
        manifest: &Manifest,
    ) -> Result<(), StoreError> {
        let (expired, named) = kept.retention(self.keep, revision, manifest);
        let keys = expired
            .iter()
            .map(|rev| self.key(&home.storage_id, *rev))
            .collect::<Result<_, _>>()?;
        self.delete_keys(keys).await?;
        // A kept revision that cannot be read now keeps every chunk until one can.
        let Some(named) = named else {
            tracing::warn!(event = "home.chunks_kept", home.storage_id = %home.storage_id);
            return Ok(());
        };
        let chunks = self.prefix(&home.storage_id)?.join(CHUNKS);
        let unnamed = self
            .keys(&chunks)
            .await?
            .into_iter()
            .filter(|k| k.filename().is_none_or(|n| !named.contains(n)))
            .collect();
        self.delete_keys(unnamed).await
    }
}

#[async_trait]
impl HomeStore for ObjectHomeStore {
    fn location(&self, storage_id: &str, revision: i64) -> String {
        self.root
            .clone()
            .join(HOMES)
            .join(storage_id)
            .join(revision.to_string())
            .to_string()
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

    async fn save(
        &self,
        home: &HomeId,
        revision: i64,
        workspace: Workspace,
        replace_latest: bool,
    ) -> Result<Saved, StoreError> {
        let kept = Arc::new(self.kept(home).await?);
        // A chunk this save puts is its own to take back on failure only when no kept
        // revision could have named it.
        let owns_new_chunks = kept.complete();
        // Every chunk is checked against the restore rules before anything is uploaded.
        let limits = self.latest.limits();
        let (data_key, held) = (home.data_key, kept.clone());
        let plan =
            Arc::new(blocking(move || chunks::plan(&data_key, workspace, &held, limits)).await?);
        // The latest copy, when the machine does not work in it, is staged beside the uploads.
        let staging = async {
            if !replace_latest {
                return Ok(None);
            }
            let archive = self.plan_archive(home, &plan).await?;
            let (latest, home_key) = (self.latest.clone(), home.home_key.clone());
            blocking(move || latest.stage_reusing(&home_key, &archive))
                .await
                .map(Some)
        };
        let (staged, uploaded) = tokio::join!(staging, self.put_chunks(home, &plan));
        let manifest = plan.manifest.encode();
        let manifest_len = manifest.len();
        let manifest_put = match (&staged, uploaded) {
            (Ok(_), Ok(())) => {
                let (data_key, storage_id) = (home.data_key, home.storage_id.clone());
                self.put_sealed(&self.key(&home.storage_id, revision)?, move |out| {
                    let binding = Binding::revision(&storage_id, revision);
                    seal::seal_to(&data_key, &binding, &manifest, out)
                })
                .await
            }
            (_, Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e.clone()),
        };
        match (staged, manifest_put) {
            (Ok(staged), Ok(())) => {
                if let Some(staged) = staged {
                    let (me, stamped) = (self.clone(), home.clone());
                    blocking(move || me.make_current(&stamped, revision, &staged)).await?;
                }
            }
            (staged, outcome) => {
                if let Ok(Some(staged)) = &staged {
                    let _ = std::fs::remove_dir_all(staged);
                }
                // Chunks only this revision named go with it.
                let names = plan
                    .new
                    .iter()
                    .map(|c| self.chunk_key(&home.storage_id, &c.name));
                if let (true, Ok(keys)) = (owns_new_chunks, names.collect::<Result<Vec<_>, _>>()) {
                    let _ = self.delete_keys(keys).await;
                }
                return Err(staged
                    .err()
                    .or(outcome.err())
                    .unwrap_or_else(|| fail("save failed")));
            }
        }
        if let Err(e) = self
            .apply_retention(home, &kept, revision, &plan.manifest)
            .await
        {
            // The new revision is stored and current; the next save retries the retention.
            tracing::warn!(event = "home.retention_deferred", home.storage_id = %home.storage_id, error = %e);
        }
        Ok(Saved {
            archive_bytes: plan.manifest.archive_bytes(),
            stored_bytes: plan.sealed_bytes(&home.storage_id, revision, manifest_len),
        })
    }

    async fn save_stream(
        &self,
        home: &HomeId,
        revision: i64,
        archive: ArchiveReader<'_>,
        unless: Option<&str>,
        replace_latest: bool,
    ) -> Result<StreamSaved, StoreError> {
        let kept = Arc::new(self.kept(home).await?);
        // A chunk this save puts is its own to take back only when no kept revision could
        // have named it.
        let owns_new_chunks = kept.complete();
        let staging = if replace_latest {
            let (latest, key) = (self.latest.clone(), home.home_key.clone());
            Some(blocking(move || latest.staging(&key)).await?)
        } else {
            None
        };
        let (to_save, blocks) = super::stream::channel();
        let mut sink = UploadChunks {
            store: self.clone(),
            home: home.clone(),
            runtime: tokio::runtime::Handle::current(),
            in_flight: Default::default(),
            written: Vec::new(),
        };
        let (limits, held, into) = (self.latest.limits(), kept.clone(), staging.clone());
        let data_key = home.data_key;
        let saving = tokio::task::spawn_blocking(move || {
            let unpack = match &into {
                Some((into, reuse)) => super::stream::Unpack::Into {
                    into,
                    reuse: reuse.as_deref(),
                },
                None => super::stream::Unpack::Check,
            };
            let streamed = super::stream::save(&data_key, &held, limits, blocks, unpack, &mut sink);
            if streamed.is_err() {
                sink.settle();
            }
            (streamed, sink.written)
        });
        let (fed, saving) = tokio::join!(super::stream::feed(archive, to_save), saving);
        let (streamed, written) = saving.map_err(fail)?;
        let streamed = streamed.and_then(|s| fed.map(|()| s));
        let manifest_put = match &streamed {
            Ok(streamed) if unless == Some(streamed.fingerprint.as_str()) => None,
            Ok(streamed) => {
                let manifest = streamed.manifest.encode();
                let (data_key, storage_id) = (home.data_key, home.storage_id.clone());
                let len = manifest.len();
                let put = self
                    .put_sealed(&self.key(&home.storage_id, revision)?, move |out| {
                        let binding = Binding::revision(&storage_id, revision);
                        seal::seal_to(&data_key, &binding, &manifest, out)
                    })
                    .await;
                Some(put.map(|()| len))
            }
            Err(_) => None,
        };
        let kept_revision = match (streamed, manifest_put) {
            (Ok(streamed), Some(Ok(len))) => Some((streamed, len)),
            (Ok(_), None) => None,
            (Ok(_), Some(Err(e))) | (Err(e), _) => {
                self.take_back(home, &staging, &written, owns_new_chunks)
                    .await;
                return Err(e);
            }
        };
        let Some((streamed, manifest_len)) = kept_revision else {
            // Unchanged: nothing of it is kept.
            self.take_back(home, &staging, &written, owns_new_chunks)
                .await;
            return Ok(StreamSaved::Unchanged);
        };
        if let Some((staged, _)) = staging {
            let (me, stamped) = (self.clone(), home.clone());
            blocking(move || me.make_current(&stamped, revision, &staged)).await?;
        }
        if let Err(e) = self
            .apply_retention(home, &kept, revision, &streamed.manifest)
            .await
        {
            tracing::warn!(event = "home.retention_deferred", home.storage_id = %home.storage_id, error = %e);
        }
        Ok(StreamSaved::Saved {
            saved: Saved {
                archive_bytes: streamed.manifest.archive_bytes(),
                stored_bytes: streamed.stored_bytes(&home.storage_id, revision, manifest_len),
            },
            fingerprint: streamed.fingerprint,
        })
    }

    async fn load_to(
        &self,
        home: &HomeId,
        revision: i64,
        out: ArchiveWriter<'_>,
    ) -> Result<(), StoreError> {
        use tokio::io::AsyncWriteExt as _;
        let write = |e: std::io::Error| fail(format!("writing the archive: {e}"));
        let opened = self.open_revision(home, revision).await?;
        let newest = self.revisions(home).await?.last().copied() == Some(revision);
        let manifest = match opened {
            Revision::Chunked(manifest) if !newest || self.cached_is(home, revision)? => manifest,
            // A whole archive, or the newest revision the cache does not hold yet (loading
            // it refreshes the cache).
            _ => {
                let archive = self.load(home, revision).await?;
                out.write_all(&archive).await.map_err(write)?;
                return out.flush().await.map_err(write);
            }
        };
        let mut chunks = std::pin::pin!(
            futures_util::stream::iter(manifest.chunks.iter().cloned())
                .map(|chunk| async move {
                    let sealed = self
                        .get(&self.chunk_key(&home.storage_id, &chunk.name)?)
                        .await
                        .map_err(|e| match e {
                            StoreError::NotFound => {
                                StoreError::Rejected("a chunk is missing".into())
                            }
                            other => other,
                        })?;
                    let home = home.clone();
                    let plain = blocking(move || open_chunk(&home, &chunk.name, &sealed)).await?;
                    if plain.len() as u64 != chunk.len {
                        return Err(StoreError::Rejected("a chunk has the wrong length".into()));
                    }
                    Ok(plain)
                })
                .buffered(CHUNKS_READ_AHEAD)
        );
        while let Some(plain) = chunks.next().await {
            out.write_all(&plain?).await.map_err(write)?;
        }
        out.write_all(&rakazo_actors::workspace::ARCHIVE_END)
            .await
            .map_err(write)?;
        out.flush().await.map_err(write)
    }

    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        let plain = match self.open_revision(home, revision).await? {
            Revision::Whole(archive) => archive,
            Revision::Chunked(manifest) => {
                let names = manifest.names().map(str::to_owned).collect();
                let chunks = self.open_chunks(home, names).await?;
                manifest.assemble(chunks.into_iter().map(Ok))?
            }
        };
        let newest = self.revisions(home).await?.last().copied();
        if newest == Some(revision) && !self.cached_is(home, revision)? {
            let plain = Arc::new(plain);
            self.refresh_cache(home, revision, plain.clone()).await?;
            return Ok(Arc::try_unwrap(plain).unwrap_or_else(|shared| (*shared).clone()));
        }
        Ok(plain)
    }

    async fn replace_latest(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Vec<u8>,
    ) -> Result<(), StoreError> {
        self.refresh_cache(home, revision, Arc::new(archive)).await
    }

    async fn settle_latest(&self, home: &HomeId, revision: i64) -> Result<bool, StoreError> {
        let (latest, key) = (self.latest.clone(), home.home_key.clone());
        blocking(move || latest.recover(&key)).await?;
        if self.cached_is(home, revision)? {
            return Ok(false);
        }
        if revision == 0 {
            let (latest, key) = (self.latest.clone(), home.home_key.clone());
            return blocking(move || {
                let had = latest.path(&key)?.exists() || latest.revision_stamp(&key)?.exists();
                latest.remove(&key)?;
                Ok(had)
            })
            .await;
        }
        // Loading the newest stored revision refreshes the cache itself.
        let archive = self.load(home, revision).await?;
        if !self.cached_is(home, revision)? {
            self.refresh_cache(home, revision, Arc::new(archive))
                .await?;
        }
        Ok(true)
    }

    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError> {
        // Revisions sit right under the home's prefix; its chunks one folder down.
        let mut revs: Vec<i64> = self
            .bucket
            .list_with_delimiter(Some(&self.prefix(&home.storage_id)?))
            .await
            .map_err(|e| bucket_error("list", e))?
            .objects
            .iter()
            .filter_map(|o| o.location.filename().and_then(|n| n.parse().ok()))
            .collect();
        revs.sort_unstable();
        Ok(revs)
    }

    async fn delete(&self, home_key: &str, storage_id: &str) -> Result<(), StoreError> {
        self.delete_revisions(storage_id).await?;
        let marker = self.marker(home_key)?;
        let _ = std::fs::remove_file(marker);
        self.latest.remove(home_key)
    }

    async fn storage_ids(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .stored_homes()
            .await?
            .into_iter()
            .map(|h| h.storage_id)
            .collect())
    }
}

#[async_trait]
impl super::doctor::Inspect for ObjectHomeStore {
    async fn stored_ids(&self) -> Result<Vec<String>, StoreError> {
        self.storage_ids().await
    }

    async fn manifests(&self, storage_id: &str) -> Result<Vec<i64>, StoreError> {
        let mut revs: Vec<i64> = self
            .bucket
            .list_with_delimiter(Some(&self.prefix(storage_id)?))
            .await
            .map_err(|e| bucket_error("list", e))?
            .objects
            .iter()
            .filter_map(|o| o.location.filename().and_then(|n| n.parse().ok()))
            .collect();
        revs.sort_unstable();
        Ok(revs)
    }

    async fn chunk_names(&self, storage_id: &str) -> Result<Vec<String>, StoreError> {
        let chunks = self.prefix(storage_id)?.join(CHUNKS);
        Ok(self
            .keys(&chunks)
            .await?
            .iter()
            .filter_map(|k| k.filename().map(str::to_owned))
            .collect())
    }

    async fn sealed_manifest(
        &self,
        storage_id: &str,
        revision: i64,
    ) -> Result<Vec<u8>, StoreError> {
        Ok(self.get(&self.key(storage_id, revision)?).await?.to_vec())
    }

    async fn sealed_chunk(&self, storage_id: &str, name: &str) -> Result<Vec<u8>, StoreError> {
        Ok(self.get(&self.chunk_key(storage_id, name)?).await?.to_vec())
    }
}
