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

/// One directory or regular file of a home, as [`visit`] finds it.
struct Found<'a> {
    /// Its path relative to the root, `/`-separated.
    path: &'a str,
    /// Where it is.
    fs_path: PathBuf,
    /// A directory (else a regular file).
    dir: bool,
}

/// Calls `f` for every directory and regular file under `root` that belongs in a workspace
/// archive, parents before children, siblings in name order. Links, sockets, fifos, devices,
/// names that are not UTF-8 and transient browser files are left out.
fn visit(
    root: &Path,
    mut f: impl FnMut(Found<'_>) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
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
            if !kind.is_dir() && !kind.is_file() {
                continue;
            }
            let path = child.join("/");
            f(Found {
                path: &path,
                fs_path: entry.path(),
                dir: kind.is_dir(),
            })?;
            if kind.is_dir() {
                stack.push((entry.path(), child));
            }
        }
    }
    Ok(())
}

/// Pack `root` (which must exist) into a tar archive, in a stable order.
pub fn pack(root: &Path) -> Result<Vec<u8>, ArchiveError> {
    pack_sized(root, 0)
}

/// [`pack`] into a buffer made for `expected` bytes (a [`Fingerprint`]'s estimate), so a large
/// archive is not copied over and over as its buffer grows.
pub fn pack_sized(root: &Path, expected: u64) -> Result<Vec<u8>, ArchiveError> {
    let mut builder = tar::Builder::new(Vec::with_capacity(expected as usize));
    builder.mode(tar::HeaderMode::Deterministic);
    visit(root, |found| {
        let mut h = tar::Header::new_gnu();
        if found.dir {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            builder.append_data(&mut h, format!("{}/", found.path), std::io::empty())?;
        } else {
            let mut file = std::fs::File::open(&found.fs_path)?;
            let len = file.metadata()?.len();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(len);
            builder.append_data(&mut h, found.path, (&mut file).take(len))?;
        }
        Ok(())
    })?;
    Ok(builder.into_inner()?)
}

/// How recent a change may be for a fingerprint to vouch for it: file times come from a coarse
/// clock, so a write right after the walk could leave a just-written file's times unchanged.
const RACY_WINDOW_NS: i128 = 2_000_000_000;

/// What [`fingerprint`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// The digest, or `None` when an entry changed too recently to vouch for.
    pub digest: Option<String>,
    /// About how many bytes [`pack`] would make of the same tree (never fewer).
    pub archive_bytes: u64,
}

/// The tar bytes of one entry: its header, a long-name entry for a long path, its data
/// padded to whole blocks.
fn tar_bytes(path: &str, size: u64) -> u64 {
    let long_name = if path.len() >= 100 {
        512 + (path.len() as u64 + 1).div_ceil(512) * 512
    } else {
        0
    };
    512 + long_name + size.div_ceil(512) * 512
}

/// A fingerprint of what [`pack`] would put in an archive of `root`, from metadata only:
/// every entry's path and, for files, device, inode, size, modification and change times
/// (the change time cannot be set back by the workspace's owner). Equal digests mean equal
/// archives. No digest when an entry changed within the last two seconds, since a write in
/// the same clock tick might not show.
pub fn fingerprint(root: &Path) -> Result<Fingerprint, ArchiveError> {
    fingerprint_within(root, RACY_WINDOW_NS)
}

fn fingerprint_within(root: &Path, racy_window_ns: i128) -> Result<Fingerprint, ArchiveError> {
    use sha2::Digest as _;
    use std::os::unix::fs::MetadataExt as _;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let mut hash = sha2::Sha256::new();
    let mut racy = false;
    // The two zero blocks that end an archive.
    let mut archive_bytes = 1024;
    visit(root, |found| {
        if found.dir {
            hash.update(format!("d {}\n", found.path));
            archive_bytes += tar_bytes(&format!("{}/", found.path), 0);
            return Ok(());
        }
        let m = std::fs::symlink_metadata(&found.fs_path)?;
        let nanos = |s: i64, ns: i64| s as i128 * 1_000_000_000 + ns as i128;
        let (mtime, ctime) = (
            nanos(m.mtime(), m.mtime_nsec()),
            nanos(m.ctime(), m.ctime_nsec()),
        );
        racy |= started - mtime.max(ctime) < racy_window_ns;
        archive_bytes += tar_bytes(found.path, m.len());
        hash.update(format!(
            "f {} {} {} {} {mtime} {ctime}\n",
            found.path,
            m.dev(),
            m.ino(),
            m.len()
        ));
        Ok(())
    })?;
    Ok(Fingerprint {
        digest: (!racy).then(|| hex::encode(hash.finalize())),
        archive_bytes,
    })
}

/// Unpack `archive` into `dest`, which must not exist yet; on any refusal `dest` is removed.
pub fn unpack(archive: &[u8], dest: &Path, limits: Limits) -> Result<(), ArchiveError> {
    std::fs::create_dir(dest)?;
    let outcome = walk(archive, Some(dest), limits, None);
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    outcome
}

/// Like [`unpack`], but a file whose bytes equal the file at the same path under `reuse` (a
/// copy that only its store writes to) is hard-linked from there instead of written.
pub fn unpack_reusing(
    archive: &[u8],
    dest: &Path,
    limits: Limits,
    reuse: &Path,
) -> Result<(), ArchiveError> {
    std::fs::create_dir(dest)?;
    let outcome = walk(archive, Some(dest), limits, Some(reuse));
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    outcome
}

/// Whether the regular file at `path` holds exactly `data`.
fn holds(path: &Path, data: &[u8]) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() || meta.len() != data.len() as u64 {
        return false;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut buf = vec![0u8; (1 << 20).min(data.len().max(1))];
    let mut rest = data;
    while !rest.is_empty() {
        let n = rest.len().min(buf.len());
        if file.read_exact(&mut buf[..n]).is_err() || buf[..n] != rest[..n] {
            return false;
        }
        rest = &rest[n..];
    }
    true
}

/// Check `archive` against every restore rule without writing anything: what [`unpack`]
/// would refuse, this refuses too (for an archive that is sealed but not unpacked here).
pub fn check(archive: &[u8], limits: Limits) -> Result<(), ArchiveError> {
    walk(archive, None, limits, None)
}

/// Reads every entry under the restore rules, writing it below `dest` when given (linking
/// identical files from `reuse` when given).
fn walk(
    archive: &[u8],
    dest: Option<&Path>,
    limits: Limits,
    reuse: Option<&Path>,
) -> Result<(), ArchiveError> {
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
                // The same bytes in the reused copy: linked, not written.
                let start = entry.raw_file_position() as usize;
                let reusable = reuse
                    .map(|r| rel.iter().fold(r.to_path_buf(), |p, s| p.join(s)))
                    .filter(|same| {
                        target.is_some()
                            && archive
                                .get(start..start.saturating_add(size as usize))
                                .is_some_and(|data| holds(same, data))
                    });
                if let Some(parent) = target.as_deref().and_then(Path::parent) {
                    std::fs::create_dir_all(parent)?;
                }
                let copied = match (&target, reusable) {
                    (Some(target), Some(same)) => {
                        std::fs::hard_link(same, target)?;
                        size
                    }
                    (Some(target), None) => {
                        let mut file = std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .open(target)?;
                        let copied = std::io::copy(&mut (&mut entry).take(size), &mut file)?;
                        file.flush()?;
                        copied
                    }
                    (None, _) => std::io::copy(&mut (&mut entry).take(size), &mut std::io::sink())?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_follow_what_a_pack_would_hold() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        std::fs::create_dir_all(root.join(".browser-profiles/b1/Cache")).unwrap();
        std::fs::write(root.join("notes/a.txt"), b"first").unwrap();
        let print = || fingerprint_within(root, 0).unwrap().digest.unwrap();
        let first = print();
        assert_eq!(print(), first, "nothing changed");
        // A transient browser file is not part of a workspace.
        std::fs::write(root.join(".browser-profiles/b1/Cache/x"), b"junk").unwrap();
        assert_eq!(print(), first);
        // Same size, new bytes: the times show it.
        std::fs::write(root.join("notes/a.txt"), b"other").unwrap();
        let second = print();
        assert_ne!(second, first);
        std::fs::create_dir(root.join("empty")).unwrap();
        assert_ne!(print(), second, "a new directory is part of the archive");
        // Just written: too recent to vouch for.
        assert_eq!(fingerprint(root).unwrap().digest, None);
        let size = pack(root).unwrap().len() as u64;
        let estimate = fingerprint(root).unwrap().archive_bytes;
        assert!(
            estimate >= size && estimate < size + 10 * 1024,
            "{estimate} for {size}"
        );
    }

    #[test]
    fn a_reusing_unpack_links_only_identical_files() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/same.txt"), b"same").unwrap();
        std::fs::write(src.join("d/edited.txt"), b"old!").unwrap();
        let old = dir.path().join("old");
        unpack(&pack(&src).unwrap(), &old, Limits::default()).unwrap();
        std::fs::write(src.join("d/edited.txt"), b"new!").unwrap();
        std::fs::write(src.join("d/added.txt"), b"added").unwrap();
        let new = dir.path().join("new");
        unpack_reusing(&pack(&src).unwrap(), &new, Limits::default(), &old).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&new.join("d/same.txt")), ino(&old.join("d/same.txt")));
        assert_ne!(
            ino(&new.join("d/edited.txt")),
            ino(&old.join("d/edited.txt"))
        );
        assert_eq!(std::fs::read(new.join("d/edited.txt")).unwrap(), b"new!");
        assert_eq!(std::fs::read(old.join("d/edited.txt")).unwrap(), b"old!");
        assert_eq!(std::fs::read(new.join("d/added.txt")).unwrap(), b"added");
        // A refused archive still refuses, and leaves nothing staged.
        let mut hostile = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(4);
        h.set_path("d/same.txt").unwrap();
        h.set_cksum();
        hostile.append(&h, &b"same"[..]).unwrap();
        hostile.append(&h, &b"same"[..]).unwrap();
        let refused = dir.path().join("refused");
        assert!(matches!(
            unpack_reusing(
                &hostile.into_inner().unwrap(),
                &refused,
                Limits::default(),
                &old
            ),
            Err(ArchiveError::Refused(_))
        ));
        assert!(!refused.exists());
    }
}
