//! The fake machine's in-memory file tree, with tar export and a strict tar import.
//!
//! It holds what a bot can plant in a real workspace (symlinks, fifos, files with a second
//! hard link) and applies the real providers' file rules to them
//! ([`crate::providers::beneath`]): reads, writes and listings never go through a link, never
//! open a fifo and refuse a file with another hard link; the export leaves links and fifos out
//! and keeps hard-linked files, whose names the fake keeps inside the machine.

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
    /// A regular file with another hard link (`ln`): its bytes, never read by the file rules.
    HardLinked(Vec<u8>),
    /// A symbolic link and its target, never followed.
    Symlink(String),
    /// A fifo.
    Fifo,
}

fn rejected(path: &str, why: &str) -> ProviderError {
    ProviderError::PathRejected(format!("{path}: {why}"))
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
    /// The parents of `path` (its proper prefixes) up to the first that does not exist: a
    /// link on the way is refused, a parent that is not a directory is not found.
    fn parents_ok(&self, path: &str) -> Result<(), ProviderError> {
        for (i, _) in path.match_indices('/') {
            match self.nodes.get(&path[..i]) {
                Some(Node::Dir) => {}
                None => return Ok(()),
                Some(Node::Symlink(_)) => return Err(rejected(path, "a link is on the way")),
                Some(_) => return Err(ProviderError::NotFound(path.to_owned())),
            }
        }
        Ok(())
    }

    /// Refuses what the file rules never open as a regular file.
    fn refuse_special(path: &str, node: &Node) -> Result<(), ProviderError> {
        match node {
            Node::Symlink(_) => Err(rejected(path, "a link is on the way")),
            Node::HardLinked(_) => Err(rejected(path, "has more than one hard link")),
            Node::Fifo => Err(rejected(path, "not a regular file")),
            Node::Dir | Node::File(_) => Ok(()),
        }
    }

    /// Plant a node that is not a directory or regular file (`ln -s`, `mkfifo`); its parent
    /// must be a directory and the name free.
    pub fn plant(&mut self, path: &str, node: Node) -> Result<(), String> {
        if path.is_empty() || self.nodes.contains_key(path) {
            return Err("File exists".into());
        }
        if parent(path).is_some_and(|p| !matches!(self.nodes.get(p), Some(Node::Dir))) {
            return Err("No such file or directory".into());
        }
        self.nodes.insert(path.to_owned(), node);
        Ok(())
    }

    /// `ln source name`: both names now hold a file with another hard link.
    pub fn hard_link(&mut self, source: &str, name: &str) -> Result<(), String> {
        let data = match self.nodes.get(source) {
            Some(Node::File(d) | Node::HardLinked(d)) => d.clone(),
            Some(_) => return Err("hard link not allowed for directory".into()),
            None => return Err("No such file or directory".into()),
        };
        self.plant(name, Node::HardLinked(data.clone()))?;
        self.nodes.insert(source.to_owned(), Node::HardLinked(data));
        Ok(())
    }

    /// Create `path` and its parents as directories.
    pub fn mkdir_all(&mut self, path: &str) -> Result<(), ProviderError> {
        if path.is_empty() {
            return Ok(());
        }
        if let Some(p) = parent(path) {
            self.mkdir_all(p)?;
        }
        match self.nodes.get(path) {
            Some(Node::Dir) => Ok(()),
            Some(Node::Symlink(_)) => Err(rejected(path, "a link is on the way")),
            Some(_) => Err(ProviderError::Failed(format!("{path}: not a directory"))),
            None => {
                self.nodes.insert(path.to_owned(), Node::Dir);
                Ok(())
            }
        }
    }

    /// Write a file, creating parents; never through a link, into a fifo or into a file with
    /// another hard link.
    pub fn write(&mut self, path: &str, data: Vec<u8>) -> Result<(), ProviderError> {
        self.parents_ok(path)?;
        if let Some(node) = self.nodes.get(path) {
            Self::refuse_special(path, node)?;
        }
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

    /// Read a regular file: never through a link, from a fifo or from a file with another
    /// hard link.
    pub fn read(&self, path: &str) -> Result<&[u8], ProviderError> {
        self.parents_ok(path)?;
        match self.nodes.get(path) {
            Some(Node::File(bytes)) => Ok(bytes),
            Some(Node::Dir) => Err(ProviderError::Failed(format!("{path}: is a directory"))),
            Some(node) => Err(Self::refuse_special(path, node).expect_err("not a file")),
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

    /// Direct children of a directory (`""` = root); links are listed, never followed.
    pub fn list(&self, dir: &str) -> Result<Vec<FileEntry>, ProviderError> {
        self.parents_ok(dir)?;
        match self.nodes.get(dir) {
            _ if dir.is_empty() => {}
            Some(Node::Dir) => {}
            Some(Node::Symlink(_)) => return Err(rejected(dir, "a link is on the way")),
            _ => return Err(ProviderError::NotFound(dir.to_owned())),
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
                kind: match node {
                    Node::Dir => "dir",
                    Node::File(_) | Node::HardLinked(_) => "file",
                    Node::Symlink(_) => "link",
                    Node::Fifo => "other",
                }
                .into(),
                size: match node {
                    Node::File(b) | Node::HardLinked(b) => b.len() as u64,
                    _ => 0,
                },
            })
            .collect())
    }

    /// A tar archive of every directory and regular file (links and fifos are left out; a
    /// file with another hard link is kept, since its names are all inside). Paths past [`MAX_PATH_BYTES`] are left out, the topmost of
    /// each reported.
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
                // Every hard link the fake allows is inside the machine: both names are kept.
                Node::File(bytes) | Node::HardLinked(bytes) => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(0o644);
                    header.set_size(bytes.len() as u64);
                    builder
                        .append_data(&mut header, path, bytes.as_slice())
                        .map_err(fail)?;
                }
                Node::Symlink(_) | Node::Fifo => {}
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
