//! The `HomeStore` port (the spec's AgentHomeStore): durable workspace revisions per home.

use async_trait::async_trait;

/// Which durable workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeId {
    /// `team-<space id>` or the bot id.
    pub home_key: String,
    /// The computer's random storage id (binds sealed archives to it).
    pub storage_id: String,
}

/// Store failures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The stored revision does not exist.
    #[error("revision not found")]
    NotFound,
    /// A stored archive failed verification.
    #[error("stored archive rejected: {0}")]
    Rejected(String),
    /// I/O or backend failure; the previous revision is intact.
    #[error("store failure: {0}")]
    Failed(String),
}

impl From<StoreError> for crate::DomainError {
    fn from(err: StoreError) -> Self {
        let code = match err {
            StoreError::NotFound => crate::ErrorCode::NotFound,
            _ => crate::ErrorCode::Internal,
        };
        crate::DomainError::new(code, err.to_string())
    }
}

/// Durable workspace revisions. A revision becomes visible only once completely staged;
/// callers serialize saves per computer (the checkpoint actor).
#[async_trait]
pub trait HomeStore: Send + Sync + 'static {
    /// Store `archive` (a workspace tar) as `revision`, then forget revisions older than the
    /// store's retention.
    async fn save(&self, home: &HomeId, revision: i64, archive: &[u8]) -> Result<(), StoreError>;
    /// Load a stored revision.
    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError>;
    /// Kept revisions, oldest first.
    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError>;
    /// Forget every revision of a home.
    async fn delete(&self, home: &HomeId) -> Result<(), StoreError>;
}
