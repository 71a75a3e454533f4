//! The `HomeStore` port (the spec's AgentHomeStore): durable, sealed workspace revisions per
//! home, with a bounded history.

use async_trait::async_trait;

use crate::keys::KeyBytes;
use crate::provider::{FileEntry, ProviderError};
use crate::workspace::Workspace;

/// Which durable workspace, and the key that seals it.
#[derive(Clone, PartialEq, Eq)]
pub struct HomeId {
    /// `team-<space id>` or the bot id; names the unpacked latest copy.
    pub home_key: String,
    /// The computer's random storage id; names and binds its sealed archives.
    pub storage_id: String,
    /// The workspace data key (unwrapped; never logged).
    pub data_key: KeyBytes,
}

impl std::fmt::Debug for HomeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HomeId")
            .field("home_key", &self.home_key)
            .field("storage_id", &self.storage_id)
            .finish()
    }
}

/// Store failures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The stored revision does not exist (or is past the retention).
    #[error("revision not found")]
    NotFound,
    /// A stored or offered archive failed verification or broke a restore rule; the previous
    /// workspace is untouched.
    #[error("archive rejected: {0}")]
    Rejected(String),
    /// I/O or backend failure; the previous revision is intact.
    #[error("store failure: {0}")]
    Failed(String),
    /// The workspace names a piece of the previous revision that the store does not hold
    /// (the revision was restored over or expired): export it whole and save again.
    #[error("stale piece: {0}")]
    Stale(String),
}

/// What a save stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// The size of the revision's whole archive.
    pub archive_bytes: u64,
    /// Sealed bytes written for it (pieces the store already held are not written again).
    pub stored_bytes: u64,
}

/// What a streamed save did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSaved {
    /// Stored as the revision.
    Saved {
        /// What it stored.
        saved: Saved,
        /// The SHA-256 of the archive as received (hex).
        fingerprint: String,
    },
    /// The archive's fingerprint is the one it was to be compared with: nothing was kept.
    Unchanged,
}

/// A workspace archive arriving as one stream (a tar).
pub type ArchiveReader<'a> = &'a mut (dyn tokio::io::AsyncRead + Unpin + Send);
/// Where a stored archive is streamed to.
pub type ArchiveWriter<'a> = &'a mut (dyn tokio::io::AsyncWrite + Unpin + Send);

impl From<StoreError> for crate::DomainError {
    fn from(err: StoreError) -> Self {
        let code = match err {
            StoreError::NotFound => crate::ErrorCode::NotFound,
            StoreError::Rejected(_) => crate::ErrorCode::ArchiveRejected,
            StoreError::Failed(_) | StoreError::Stale(_) => crate::ErrorCode::Internal,
        };
        crate::DomainError::new(code, err.to_string())
    }
}

/// Durable workspace revisions. A revision becomes current only once completely staged and
/// verified; callers serialize saves per computer (the checkpoint actor).
#[async_trait]
pub trait HomeStore: Send + Sync + 'static {
    /// Seal and store `workspace` as `revision`, make it the latest unpacked copy when
    /// `replace_latest` (not when a machine works in that copy directly), then forget
    /// revisions older than the store's retention. A refused archive changes nothing. Pieces
    /// the previous revision holds are referred to, not written again; a [`Piece::Same`]
    /// the previous revision does not hold is [`StoreError::Stale`].
    ///
    /// [`Piece::Same`]: crate::workspace::Piece::Same
    async fn save(
        &self,
        home: &HomeId,
        revision: i64,
        workspace: Workspace,
        replace_latest: bool,
    ) -> Result<Saved, StoreError>;
    /// Like [`Self::save`] for a whole archive read from `archive` as it arrives, in bounded
    /// buffers: hashed (SHA-256), checked and sealed as it streams. When its fingerprint is
    /// `unless`, nothing is kept ([`StreamSaved::Unchanged`]). A read error fails the save
    /// (nothing is kept), so a reader that fails when its producer did never stores a cut
    /// archive.
    async fn save_stream(
        &self,
        home: &HomeId,
        revision: i64,
        archive: ArchiveReader<'_>,
        unless: Option<&str>,
        replace_latest: bool,
    ) -> Result<StreamSaved, StoreError>;
    /// Writes a stored revision (the plaintext tar, verified piece by piece before any of its
    /// bytes are written) to `out`, in bounded buffers where the store can.
    async fn load_to(
        &self,
        home: &HomeId,
        revision: i64,
        out: ArchiveWriter<'_>,
    ) -> Result<(), StoreError>;
    /// Load and verify a stored revision (the plaintext tar).
    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError>;
    /// Make `archive` (stored as `revision`) the latest unpacked copy of a home whose machine
    /// is stopped, so a provider that works in that copy starts from it; the copy is then no
    /// longer the store's alone (no stamp says which bytes it holds).
    async fn replace_latest(
        &self,
        home: &HomeId,
        revision: i64,
        archive: Vec<u8>,
    ) -> Result<(), StoreError>;
    /// Make the latest copy of a home whose machine does not work in it hold `revision` (no
    /// copy for 0), unless the stamp the store keeps beside it says it does; answers whether it
    /// changed. A save stamps the copy before swapping it in, so a crash between the swap and
    /// the database recording the revision leaves a copy whose stamp is not the recorded one.
    async fn settle_latest(&self, home: &HomeId, revision: i64) -> Result<bool, StoreError>;
    /// Kept revisions, oldest first.
    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError>;
    /// Forget every revision of a storage id and its latest copy.
    async fn delete(&self, home_key: &str, storage_id: &str) -> Result<(), StoreError>;
    /// Every storage id with stored revisions (for the reconciler).
    async fn storage_ids(&self) -> Result<Vec<String>, StoreError>;
    /// Where a revision is kept in this store (an object key, or a path under `DATA_DIR`),
    /// recorded with the revision's row.
    fn location(&self, storage_id: &str, revision: i64) -> String;
    /// Lists a folder of a home's latest copy (browsing a stopped computer) under the
    /// providers' file rules: beneath the copy, never through a link; links are listed as
    /// `link`. A home without a copy lists nothing.
    async fn list_latest(
        &self,
        home_key: &str,
        path: &str,
    ) -> Result<Vec<FileEntry>, ProviderError>;
    /// Reads a regular file of a home's latest copy under the same rules (no link on the way,
    /// no fifo or device, no file with another hard link), at most `cap` bytes.
    async fn read_latest(
        &self,
        home_key: &str,
        path: &str,
        cap: u64,
    ) -> Result<Vec<u8>, ProviderError>;
}
