//! The local home store: workspace archives under `DATA_DIR/home-revisions/<home key>/`.
//!
//! A revision is written to a temporary file, flushed, and renamed into place, so a crash
//! leaves either the previous revisions or the new one, never a partial file. Only the last
//! `keep` revisions are kept.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use rakazo_actors::home_store::{HomeId, HomeStore, StoreError};

/// Archives under a root directory.
pub struct LocalHomeStore {
    root: PathBuf,
    keep: usize,
}

fn fail(e: std::io::Error) -> StoreError {
    StoreError::Failed(e.to_string())
}

impl LocalHomeStore {
    /// A store rooted at `root` keeping `keep` revisions per home.
    pub fn new(root: impl Into<PathBuf>, keep: usize) -> Self {
        Self {
            root: root.into(),
            keep: keep.max(1),
        }
    }

    fn dir(&self, home: &HomeId) -> Result<PathBuf, StoreError> {
        let key = &home.home_key;
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(StoreError::Failed("invalid home key".into()));
        }
        Ok(self.root.join(key))
    }

    fn list(dir: &Path) -> Result<Vec<i64>, StoreError> {
        let mut revs = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for entry in entries {
                    let name = entry.map_err(fail)?.file_name();
                    if let Some(rev) = name
                        .to_str()
                        .and_then(|n| n.strip_suffix(".tar"))
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
}

#[async_trait]
impl HomeStore for LocalHomeStore {
    async fn save(&self, home: &HomeId, revision: i64, archive: &[u8]) -> Result<(), StoreError> {
        let dir = self.dir(home)?;
        let keep = self.keep;
        let archive = archive.to_vec();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            std::fs::create_dir_all(&dir).map_err(fail)?;
            let staged = dir.join(format!(".staging-{revision}-{}", std::process::id()));
            let mut file = std::fs::File::create(&staged).map_err(fail)?;
            file.write_all(&archive).map_err(fail)?;
            file.sync_all().map_err(fail)?;
            std::fs::rename(&staged, dir.join(format!("{revision}.tar"))).map_err(fail)?;
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(fail)?;
            let revs = Self::list(&dir)?;
            for old in revs.iter().take(revs.len().saturating_sub(keep)) {
                let _ = std::fs::remove_file(dir.join(format!("{old}.tar")));
            }
            Ok(())
        })
        .await
        .map_err(|e| StoreError::Failed(e.to_string()))?
    }

    async fn load(&self, home: &HomeId, revision: i64) -> Result<Vec<u8>, StoreError> {
        let path = self.dir(home)?.join(format!("{revision}.tar"));
        match tokio::fs::read(&path).await {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::NotFound),
            Err(e) => Err(fail(e)),
        }
    }

    async fn revisions(&self, home: &HomeId) -> Result<Vec<i64>, StoreError> {
        Self::list(&self.dir(home)?)
    }

    async fn delete(&self, home: &HomeId) -> Result<(), StoreError> {
        match tokio::fs::remove_dir_all(self.dir(home)?).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(fail(e)),
            _ => Ok(()),
        }
    }
}
