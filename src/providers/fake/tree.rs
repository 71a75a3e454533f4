//! The fake machine's in-memory file tree, with tar export and a strict tar import.

use std::collections::BTreeMap;
use std::io::Read;

use rakazo_actors::provider::{FileEntry, ProviderError, Skipped};

use crate::providers::workspace_path::normalize;

/// Upper bound of an imported archive's entries.
const MAX_ENTRIES: usize = 100_000;

/// A node of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A regular file.
    File(Vec<u8>),
}

/// Paths (normalized, relative) to nodes; parents always exist as `Dir`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
}

fn parent(path: &str) -> Option<&str> {
    path.rfind('/').map(|i| &path[..i])
}

impl Tree {
    /// Create `path` and its parents as directories.
    pub fn mkdir_all(&mut self, path: &str) -> Result<(), ProviderError> {
        if path.is_empty() {
            return Ok(());
        }
        if let Some(p) = parent(path) {
            self.mkdir_all(p)?;
        }
        match self.nodes.get(path) {
            Some(Node::File(_)) => Err(ProviderError::Failed(format!("{path}: not a directory"))),
            Some(Node::Dir) => Ok(()),
            None => {
                self.nodes.insert(path.to_owned(), Node::Dir);
                Ok(())
            }
        }
    }

    /// Write a file, creating parents.
    pub fn write(&mut self, path: &str, data: Vec<u8>) -> Result<(), ProviderError> {
        if let Some(p) = parent(path) {
            self.mkdir_all(p)?;
        }
        if matches!(self.nodes.get(path), Some(Node::Dir)) {
            return Err(ProviderError::Failed(format!("{path}: is a directory")));
        }
        self.nodes.insert(path.to_owned(), Node::File(data));
        Ok(())
    }

    /// Append to a file, creating it.
    pub fn append(&mut self, path: &str, data: &[u8]) -> Result<(), ProviderError> {
        let mut current = match self.nodes.get(path) {
            Some(Node::File(bytes)) => bytes.clone(),
            _ => Vec::new(),
        };
        current.extend_from_slice(data);
        self.write(path, current)
    }

    /// Read a file.
    pub fn read(&self, path: &str) -> Result<&[u8], ProviderError> {
        match self.nodes.get(path) {
            Some(Node::File(bytes)) => Ok(bytes),
            Some(Node::Dir) => Err(ProviderError::Failed(format!("{path}: is a directory"))),
            None => Err(ProviderError::NotFound(path.to_owned())),
        }
    }

    /// Whether a path exists.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// Remove a path and everything under it.
    pub fn remove(&mut self, path: &str) -> bool {
        let prefix = format!("{path}/");
        let before = self.nodes.len();
        self.nodes
            .retain(|k, _| k != path && !k.starts_with(&prefix));
        self.nodes.len() != before
    }

    /// Direct children of a directory (`""` = root).
    pub fn list(&self, dir: &str) -> Result<Vec<FileEntry>, ProviderError> {
        if !dir.is_empty() && !matches!(self.nodes.get(dir), Some(Node::Dir)) {
            return Err(ProviderError::NotFound(dir.to_owned()));
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        Ok(self
            .nodes
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
            .map(|(k, node)| FileEntry {
                name: k[prefix.len()..].to_owned(),
                path: k.clone(),
                kind: if matches!(node, Node::Dir) {
                    "dir"
                } else {
                    "file"
                }
                .into(),
                size: match node {
                    Node::File(b) => b.len() as u64,
                    Node::Dir => 0,
                },
            })
            .collect())
    }

    /// A tar archive of every directory and file.
    /// Paths past [`MAX_PATH_BYTES`] are left out, the topmost of each reported.
    ///
    /// [`MAX_PATH_BYTES`]: crate::stores::archive::MAX_PATH_BYTES
    pub fn export(&self) -> Result<(Vec<u8>, Vec<Skipped>), ProviderError> {
        use crate::stores::archive::MAX_PATH_BYTES;
        let mut builder = tar::Builder::new(Vec::new());
        let mut skipped = Vec::new();
        let fail = |e: std::io::Error| ProviderError::Failed(format!("export: {e}"));
        for (path, node) in &self.nodes {
            if path.len() > MAX_PATH_BYTES {
                let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                if parent.len() <= MAX_PATH_BYTES {
                    skipped.push(Skipped {
                        path: path.clone(),
                        reason: format!("path longer than {MAX_PATH_BYTES} bytes"),
                    });
                }
                continue;
            }
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            match node {
                Node::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    builder
                        .append_data(&mut header, format!("{path}/"), std::io::empty())
                        .map_err(fail)?;
                }
                Node::File(bytes) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(0o644);
                    header.set_size(bytes.len() as u64);
                    builder
                        .append_data(&mut header, path, bytes.as_slice())
                        .map_err(fail)?;
                }
            }
        }
        Ok((builder.into_inner().map_err(fail)?, skipped))
    }

    /// Parse an archive into a new tree; only relative directories and regular files.
    pub fn import(archive: &[u8]) -> Result<Tree, ProviderError> {
        let reject = |why: String| ProviderError::ArchiveRejected(why);
        let mut tree = Tree::default();
        let mut reader = tar::Archive::new(archive);
        let entries = reader.entries().map_err(|e| reject(e.to_string()))?;
        for (count, entry) in entries.enumerate() {
            if count >= MAX_ENTRIES {
                return Err(reject("too many entries".into()));
            }
            let mut entry = entry.map_err(|e| reject(e.to_string()))?;
            let raw = entry.path_bytes().into_owned();
            let raw = String::from_utf8(raw).map_err(|_| reject("path is not UTF-8".into()))?;
            let path = normalize(&raw, false).map_err(|e| reject(e.to_string()))?;
            match entry.header().entry_type() {
                tar::EntryType::Directory => tree.mkdir_all(&path)?,
                tar::EntryType::Regular => {
                    let mut bytes = Vec::new();
                    entry
                        .read_to_end(&mut bytes)
                        .map_err(|e| reject(e.to_string()))?;
                    tree.write(&path, bytes)?;
                }
                other => {
                    return Err(reject(format!(
                        "{path}: entry type {other:?} is not allowed"
                    )));
                }
            }
        }
        Ok(tree)
    }
}
