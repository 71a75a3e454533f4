//! Workspace archives: pack a home directory into a tar of directories and regular files, and
//! unpack an archive into a fresh staging directory under hard limits.
//!
//! Unpacking accepts only relative paths without `.` or `..` segments and only directories and
//! regular files (no links, devices or fifos), and enforces total-size, per-file and
//! entry-count limits; any violation refuses the whole archive. Packing skips only transient
//! cache and lock files inside `.browser-profiles`; files with the same names elsewhere are
//! kept.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::providers::workspace_path::segments;

/// The folder holding per-bot browser profiles.
pub const PROFILES_DIR: &str = ".browser-profiles";
/// Chromium's transient files and caches, skipped only inside [`PROFILES_DIR`].
const TRANSIENT: &[&str] = &[
    "SingletonLock",
    "SingletonSocket",
    "SingletonCookie",
    "DevToolsActivePort",
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "ShaderCache",
    "DawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "Crashpad",
];

/// Hard limits of an unpack.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Sum of file sizes.
    pub max_total_bytes: u64,
    /// One file.
    pub max_file_bytes: u64,
    /// Entries (files and directories).
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_total_bytes: 20 << 30,
            max_file_bytes: 4 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// Why an archive was refused or could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive breaks a rule; nothing of it was kept.
    #[error("archive refused: {0}")]
    Refused(String),
    /// I/O failure.
    #[error("archive I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn transient(rel: &[String]) -> bool {
    rel.first().is_some_and(|f| f == PROFILES_DIR)
        && rel.iter().skip(1).any(|s| TRANSIENT.contains(&s.as_str()))
}

/// Pack `root` (which must exist) into a tar archive, in a stable order.
pub fn pack(root: &Path) -> Result<Vec<u8>, ArchiveError> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.mode(tar::HeaderMode::Deterministic);
    let mut stack: Vec<(PathBuf, Vec<String>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, rel)) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries.into_iter().rev() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let mut child = rel.clone();
            child.push(name);
            if transient(&child) {
                continue;
            }
            let kind = entry.file_type()?;
            let path = child.join("/");
            if kind.is_dir() {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                builder.append_data(&mut h, format!("{path}/"), std::io::empty())?;
                stack.push((entry.path(), child));
            } else if kind.is_file() {
                let mut file = std::fs::File::open(entry.path())?;
                let len = file.metadata()?.len();
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(len);
                builder.append_data(&mut h, &path, (&mut file).take(len))?;
            }
            // Links, sockets, fifos and devices are not part of a workspace.
        }
    }
    Ok(builder.into_inner()?)
}

/// Unpack `archive` into `dest`, which must not exist yet; on any refusal `dest` is removed.
pub fn unpack(archive: &[u8], dest: &Path, limits: Limits) -> Result<(), ArchiveError> {
    std::fs::create_dir(dest)?;
    let outcome = unpack_into(archive, dest, limits);
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    outcome
}

/// Check `archive` against every restore rule without writing anything: what [`unpack`]
/// would refuse, this refuses too (for an archive that is sealed but not unpacked here).
pub fn check(archive: &[u8], limits: Limits) -> Result<(), ArchiveError> {
    walk(archive, None, limits)
}

fn unpack_into(archive: &[u8], dest: &Path, limits: Limits) -> Result<(), ArchiveError> {
    walk(archive, Some(dest), limits)
}

/// Reads every entry under the restore rules, writing it below `dest` when given.
fn walk(archive: &[u8], dest: Option<&Path>, limits: Limits) -> Result<(), ArchiveError> {
    let refuse = |why: String| ArchiveError::Refused(why);
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut reader = tar::Archive::new(archive);
    for (count, entry) in reader
        .entries()
        .map_err(|e| refuse(e.to_string()))?
        .enumerate()
    {
        if count >= limits.max_entries {
            return Err(refuse(format!("more than {} entries", limits.max_entries)));
        }
        let mut entry = entry.map_err(|e| refuse(format!("unreadable entry: {e}")))?;
        let raw = String::from_utf8(entry.path_bytes().into_owned())
            .map_err(|_| refuse("path is not UTF-8".into()))?;
        let rel = segments(&raw, false).map_err(|e| refuse(format!("{raw:?}: {e}")))?;
        let target = dest.map(|d| rel.iter().fold(d.to_path_buf(), |p, s| p.join(s)));
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                if let Some(target) = &target {
                    std::fs::create_dir_all(target)?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(|e| refuse(e.to_string()))?;
                if size > limits.max_file_bytes {
                    return Err(refuse(format!(
                        "{raw:?} is larger than {} bytes",
                        limits.max_file_bytes
                    )));
                }
                total += size;
                if total > limits.max_total_bytes {
                    return Err(refuse(format!(
                        "more than {} bytes in total",
                        limits.max_total_bytes
                    )));
                }
                if !seen.insert(rel.join("/")) {
                    return Err(refuse(format!("{raw:?} appears twice")));
                }
                let copied = match &target {
                    Some(target) => {
                        if let Some(parent) = target.parent() {
                            std::fs::create_dir_all(parent)?;
                        }
                        let mut file = std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(target)?;
                        let copied = std::io::copy(&mut (&mut entry).take(size), &mut file)?;
                        file.flush()?;
                        copied
                    }
                    None => std::io::copy(&mut (&mut entry).take(size), &mut std::io::sink())?,
                };
                if copied != size {
                    return Err(refuse(format!("{raw:?} is truncated")));
                }
            }
            other => {
                return Err(refuse(format!(
                    "{raw:?}: {other:?} entries are not allowed"
                )));
            }
        }
    }
    Ok(())
}
