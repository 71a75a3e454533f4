//! The object home store: sealed revisions in an S3-compatible bucket (the source of truth)
//! as `homes/<storage id>/<revision>`, and the latest workspace unpacked under
//! `DATA_DIR/homes/<home key>` as a cache.
//!
//! Saving unpacks the archive into a staging directory (enforcing every restore rule) while
//! another thread seals it and hands the sealed parts to the upload as it goes (multipart
//! above [`PART`]; the upload completes only once the archive passed every rule), swaps the
//! staged copy in, then deletes objects older than the kept revisions. A refused archive or a
//! failed upload leaves the bucket's revisions and the latest copy as they were. Loading
//! verifies the whole object before anything local changes, then brings the cache up to the
//! newest stored revision. Errors carry the operation and the kind of failure only: never
//! keys, endpoints, credentials or object contents.

use std::path::Path as FsPath;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use rakazo_actors::home_store::{HomeId, HomeStore, StoreError};

use super::archive;
use super::archive::Limits;
use super::durable::write_atomic;
use super::local::{LatestCopies, blocking, fail, refused, safe_name};
use super::seal::{self, Binding};

/// Objects above this size upload in parts of this size.
pub const PART: usize = 16 << 20;
/// Parts in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// The prefix every stored revision lives under.
const HOMES: &str = "homes";

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

/// Sealed revisions in a bucket plus the latest unpacked copy (cheap to clone).
#[derive(Clone)]
pub struct ObjectHomeStore {
    bucket: Arc<dyn ObjectStore>,
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

fn key(storage_id: &str, revision: i64) -> Result<Path, StoreError> {
    Ok(Path::from(format!(
        "{HOMES}/{}/{revision}",
        safe_name(storage_id)?
    )))
}

fn prefix(storage_id: &str) -> Result<Path, StoreError> {
    Ok(Path::from(format!("{HOMES}/{}", safe_name(storage_id)?)))
}

impl ObjectHomeStore {
    /// A store over `bucket`, caching latest copies under `data_dir/homes`, keeping `keep`
    /// revisions.
    pub fn new(
        bucket: Arc<dyn ObjectStore>,
        data_dir: &FsPath,
        keep: usize,
        limits: Limits,
    ) -> Self {
        Self {
            bucket,
            latest: LatestCopies::new(data_dir.join("homes"), limits),
            keep: keep.max(1),
        }
    }

    /// The latest unpacked copies.
    pub fn latest(&self) -> &LatestCopies {
        &self.latest
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

    /// Stage `archive` and make it the latest copy of `home`, recording its revision.
    async fn refresh_cache(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Arc<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let (me, home) = (self.clone(), home.clone());
        blocking(move || {
            let staged = me.latest.stage(&home.home_key, &archive)?;
            me.make_current(&home, revision, &staged)
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

    /// Delete every stored revision of `storage_id` (the latest copy stays: it is keyed by
    /// home, which another computer may own now). For the reconciler.
    pub async fn delete_revisions(&self, storage_id: &str) -> Result<usize, StoreError> {
        let keys = self.keys(&prefix(storage_id)?).await?;
        let count = keys.len();
        self.delete_keys(keys).await?;
        Ok(count)
    }

    /// Delete revisions older than the newest `keep`.
    async fn apply_retention(&self, home: &HomeId) -> Result<(), StoreError> {
        let revs = self.revisions(home).await?;
        let stale = revs.len().saturating_sub(self.keep);
        let keys = revs[..stale]
            .iter()
            .map(|rev| key(&home.storage_id, *rev))
            .collect::<Result<_, _>>()?;
        self.delete_keys(keys).await
    }
}

#[async_trait]
impl HomeStore for ObjectHomeStore {
    fn location(&self, storage_id: &str, revision: i64) -> String {
        format!("{HOMES}/{storage_id}/{revision}")
    }

    async fn save(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Vec<u8>,
        replace_latest: bool,
    ) -> Result<(), StoreError> {
        let path = key(&home.storage_id, revision)?;
        // Shared by the staging and the sealing threads.
        let archive = Arc::new(archive);
        let staging = {
            let (latest, archive, home_key) =
                (self.latest.clone(), archive.clone(), home.home_key.clone());
            // A machine that works in the latest copy itself only needs the rules checked.
            tokio::task::spawn_blocking(move || {
                if replace_latest {
                    latest.stage_reusing(&home_key, &archive).map(Some)
                } else {
                    archive::check(&archive, latest.limits())
                        .map(|()| None)
                        .map_err(refused)
                }
            })
        };
        // Sealing streams parts to the uploader as it goes; the upload is completed only
        // once the archive passed every rule and sealing finished.
        let (parts, sealed_parts) = tokio::sync::mpsc::channel(PARTS_IN_FLIGHT);
        let sealing = {
            let (key, storage_id) = (home.data_key, home.storage_id.clone());
            tokio::task::spawn_blocking(move || {
                let binding = Binding {
                    storage_id: &storage_id,
                    revision,
                };
                let mut out = Parts::new(parts);
                seal::seal_to(&key, &binding, &archive, &mut out)?;
                out.finish()
            })
        };
        let (staged, sealed, upload) =
            tokio::join!(staging, sealing, self.upload_parts(&path, sealed_parts));
        let staged = staged.map_err(fail).and_then(|r| r);
        let sealed = sealed.map_err(fail).and_then(|r| r.map_err(fail));
        let uploaded = match (&staged, sealed, upload) {
            (Ok(_), Ok(()), Ok(upload)) => upload.complete(&*self.bucket, &path).await,
            (_, Err(e), Ok(upload)) => {
                upload.abort().await;
                Err(e)
            }
            // Refused: the refusal is returned below.
            (Err(_), Ok(()), Ok(upload)) => {
                upload.abort().await;
                Ok(())
            }
            (_, _, Err(e)) => Err(e),
        };
        // A refused archive is refused whatever the upload did.
        let staged = staged?;
        if let Err(e) = uploaded {
            if let Some(staged) = &staged {
                let _ = std::fs::remove_dir_all(staged);
            }
            return Err(e);
        }
        if let Some(staged) = staged {
            let (me, stamped) = (self.clone(), home.clone());
            blocking(move || me.make_current(&stamped, revision, &staged)).await?;
        }
        if let Err(e) = self.apply_retention(home).await {
            // The new revision is stored and current; the next save retries the retention.
            tracing::warn!(event = "home.retention_deferred", home.storage_id = %home.storage_id, error = %e);
        }
        Ok(())
    }

    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        let path = key(&home.storage_id, revision)?;
        let sealed = self
            .bucket
            .get(&path)
            .await
            .map_err(|e| bucket_error("get", e))?
            .bytes()
            .await
            .map_err(|e| bucket_error("read", e))?;
        let (data_key, storage_id) = (home.data_key, home.storage_id.clone());
        let plain = blocking(move || {
            let binding = Binding {
                storage_id: &storage_id,
                revision,
            };
            seal::open(&data_key, &binding, &sealed)
                .map_err(|e| StoreError::Rejected(e.to_string()))
        })
        .await?;
        let newest = self.revisions(home).await?.last().copied();
        if newest == Some(revision) && !self.cached_is(home, revision)? {
            let plain = Arc::new(plain);
            self.refresh_cache(home, revision, plain.clone()).await?;
            return Ok(Arc::try_unwrap(plain).unwrap_or_else(|shared| (*shared).clone()));
        }
        Ok(plain)
    }

    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError> {
        let mut revs: Vec<i64> = self
            .keys(&prefix(&home.storage_id)?)
            .await?
            .iter()
            .filter_map(|k| k.filename().and_then(|n| n.parse().ok()))
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
        let mut ids: Vec<String> = self
            .keys(&Path::from(HOMES))
            .await?
            .iter()
            .filter_map(|k| k.parts().nth(1).map(|p| p.as_ref().to_owned()))
            .filter(|id| safe_name(id).is_ok())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}
