//! Files of a host workspace: paths confined to the home, and whole-workspace tar export and
//! import of directories and regular files only.
//!
//! Every path a tool names is relative to the home; absolute paths, `..` and `.` segments,
//! NUL bytes and symlinks that lead outside the home are refused with `PathRejected`. Checks and
//! file operations are not atomic against a process inside the computer racing to swap in a
//! symlink; the host provider is for development only, where that is acceptable.

use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use rakazo_actors::provider::{FileEntry, ProviderError, WorkspaceExport};

use rakazo_actors::home_store::StoreError;

use crate::stores::archive::{self, ArchiveError, Limits};
use crate::stores::local::LatestCopies;

use super::runtime::DesktopRuntime;

/// Largest file `read_file` returns.
pub const MAX_READ_BYTES: u64 = 64 << 20;

fn rejected(path: &str, why: &str) -> ProviderError {
    ProviderError::PathRejected(format!(
        "{}: {why}",
        path.chars().take(200).collect::<String>()
    ))
}

fn io_err(path: &str, e: std::io::Error) -> ProviderError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ProviderError::NotFound(path.chars().take(200).collect())
    } else {
        ProviderError::Failed(format!(
            "{}: {e}",
            path.chars().take(200).collect::<String>()
        ))
    }
}

/// Checks that `rel` is a plain relative path (empty = the root) and joins it to `root`,
/// without touching the file system.
pub fn lexical_join(root: &Path, rel: &str) -> Result<PathBuf, ProviderError> {
    if rel.contains('\0') {
        return Err(rejected(rel, "contains NUL"));
    }
    let mut out = root.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => return Err(rejected(rel, "`.` segments are not allowed")),
            Component::ParentDir => return Err(rejected(rel, "`..` segments are not allowed")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(rejected(rel, "absolute paths are not allowed"));
            }
        }
    }
    Ok(out)
}

/// Joins `rel` to `root` and makes sure its deepest existing ancestor, with symlinks resolved,
/// is inside `root`.
pub fn resolve(root: &Path, rel: &str) -> Result<PathBuf, ProviderError> {
    let joined = lexical_join(root, rel)?;
    let root_real = root.canonicalize().map_err(|e| io_err("", e))?;
    let mut probe = joined.as_path();
    loop {
        match probe.canonicalize() {
            Ok(real) => {
                if !real.starts_with(&root_real) {
                    return Err(rejected(rel, "leads outside the home"));
                }
                return Ok(joined);
            }
            Err(_) => match probe.parent() {
                Some(parent) if parent.starts_with(root) => probe = parent,
                _ => return Err(rejected(rel, "leads outside the home")),
            },
        }
    }
}

/// Lists a directory of the home.
pub fn list(root: &Path, rel: &str) -> Result<Vec<FileEntry>, ProviderError> {
    let dir = resolve(root, rel)?;
    let mut entries = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| io_err(rel, e))? {
        let entry = entry.map_err(|e| io_err(rel, e))?;
        let meta = entry.metadata().map_err(|e| io_err(rel, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{}/{name}", rel.trim_end_matches('/'))
        };
        let is_dir = meta.is_dir();
        entries.push(FileEntry {
            name,
            path,
            kind: if is_dir { "dir" } else { "file" }.into(),
            size: if is_dir { 0 } else { meta.len() },
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Reads a regular file of the home.
pub fn read(root: &Path, rel: &str) -> Result<Vec<u8>, ProviderError> {
    let path = resolve(root, rel)?;
    let meta = fs::metadata(&path).map_err(|e| io_err(rel, e))?;
    if !meta.is_file() {
        return Err(rejected(rel, "not a regular file"));
    }
    if meta.len() > MAX_READ_BYTES {
        return Err(ProviderError::TooLarge(format!(
            "file is larger than {MAX_READ_BYTES} bytes"
        )));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    fs::File::open(&path)
        .map_err(|e| io_err(rel, e))?
        .take(MAX_READ_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| io_err(rel, e))?;
    Ok(data)
}

/// Writes a file of the home, creating parent directories; never writes through a symlink.
pub fn write(root: &Path, rel: &str, data: &[u8]) -> Result<(), ProviderError> {
    if rel.is_empty() {
        return Err(rejected(rel, "names the home itself"));
    }
    let path = resolve(root, rel)?;
    let parent = path
        .parent()
        .ok_or_else(|| rejected(rel, "has no parent"))?;
    fs::create_dir_all(parent).map_err(|e| io_err(rel, e))?;
    // Re-check now that the parents exist: one of them may be a symlink created meanwhile.
    resolve(root, rel)?;
    if let Ok(meta) = fs::symlink_metadata(&path)
        && !meta.is_file()
    {
        return Err(rejected(rel, "not a regular file"));
    }
    fs::write(&path, data).map_err(|e| io_err(rel, e))
}

/// Runs file work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProviderError::Failed(format!("file task: {e}")))?
}

/// [`export_since`] of a machine's home with the runtime's browsers quiesced.
pub(crate) async fn export_quiesced(
    runtime: &DesktopRuntime,
    home: PathBuf,
    since: Option<&str>,
) -> Result<WorkspaceExport, ProviderError> {
    let since = since.map(str::to_owned);
    runtime
        .with_browsers_quiesced(blocking(move || export_since(&home, since.as_deref())))
        .await?
}

/// Packs the home into a tar of its directories and regular files (the workspace archive
/// rules of [`crate::stores::archive`]: links, sockets and transient browser files are left
/// out), unless its digest equals `since`'s (see [`archive::Baseline`]); pieces whose
/// stamps `since` holds are named, not read ([`archive::pack_pieces`]). The returned
/// fingerprint is the pack's [`archive::Baseline`].
pub fn export_since(root: &Path, since: Option<&str>) -> Result<WorkspaceExport, ProviderError> {
    let since = since.map(archive::Baseline::parse);
    match archive::pack_pieces(root, since.as_ref())
        .map_err(|e: ArchiveError| ProviderError::Failed(format!("export: {e}")))?
    {
        archive::Packed::Unchanged => Ok(WorkspaceExport::Unchanged),
        archive::Packed::Pieces(workspace, baseline, skipped) => Ok(WorkspaceExport::Archive {
            workspace,
            fingerprint: Some(baseline.encode()),
            skipped,
        }),
    }
}

/// Replaces the contents of the home `root` (`<homes>/<home key>`) with the archive's, keeping
/// the directory a container may have mounted: staged and checked completely first, so a
/// refused archive leaves the home untouched ([`LatestCopies::replace_in_place`]).
pub fn import(root: &Path, archive: &[u8]) -> Result<(), ProviderError> {
    let (Some(homes), Some(key)) = (root.parent(), root.file_name().and_then(|n| n.to_str()))
    else {
        return Err(ProviderError::Failed("home has no parent".into()));
    };
    let copies = LatestCopies::new(homes, Limits::default());
    let to_provider = |e: StoreError| match e {
        StoreError::Rejected(why) => ProviderError::ArchiveRejected(why),
        other => ProviderError::Failed(other.to_string()),
    };
    copies.replace_in_place(key, archive).map_err(to_provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_outside_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        fs::create_dir_all(root.join("a")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            "./a",
            "escape/passwd",
            "escape",
            "a\0b",
        ] {
            assert!(
                matches!(resolve(&root, bad), Err(ProviderError::PathRejected(_))),
                "{bad:?} accepted"
            );
        }
        assert!(resolve(&root, "a/new/file.txt").is_ok());
        assert!(matches!(
            write(&root, "escape/x", b"1"),
            Err(ProviderError::PathRejected(_))
        ));
        write(&root, "a/b/c.txt", b"hi").unwrap();
        assert_eq!(read(&root, "a/b/c.txt").unwrap(), b"hi");
        let names: Vec<_> = list(&root, "a")
            .unwrap()
            .into_iter()
            .map(|e| (e.path, e.kind))
            .collect();
        assert_eq!(names, vec![("a/b".to_string(), "dir".to_string())]);
    }

    #[test]
    fn export_import_round_trip_keeps_only_dirs_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        fs::create_dir_all(&root).unwrap();
        write(&root, "bots/b1/notes.txt", b"one").unwrap();
        write(&root, ".browser-profiles/b1/Default/Cookies", b"c").unwrap();
        write(&root, ".browser-profiles/b1/Default/Cache/x", b"junk").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let WorkspaceExport::Archive { workspace, .. } = export_since(&root, None).unwrap() else {
            panic!("an export without a fingerprint packs");
        };
        let archive = workspace
            .into_archive()
            .expect("every byte without a baseline");
        let other = dir.path().join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("stale"), b"x").unwrap();
        import(&other, &archive).unwrap();
        assert_eq!(fs::read(other.join("bots/b1/notes.txt")).unwrap(), b"one");
        assert_eq!(
            fs::read(other.join(".browser-profiles/b1/Default/Cookies")).unwrap(),
            b"c"
        );
        assert!(!other.join(".browser-profiles/b1/Default/Cache").exists());
        assert!(!other.join("link").exists());
        assert!(!other.join("stale").exists());
    }

    #[test]
    fn import_refuses_hostile_archives_and_keeps_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        fs::create_dir_all(&root).unwrap();
        write(&root, "keep.txt", b"k").unwrap();
        let mut hostile = Vec::new();
        {
            let mut b = tar::Builder::new(&mut hostile);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "evil", "/etc").unwrap();
            b.finish().unwrap();
        }
        assert!(matches!(
            import(&root, &hostile),
            Err(ProviderError::ArchiveRejected(_))
        ));
        let mut dotdot = Vec::new();
        {
            let mut h = tar::Header::new_gnu();
            h.set_size(1);
            h.set_entry_type(tar::EntryType::Regular);
            // Bypass the builder's own path checks to write a `..` name.
            h.as_old_mut().name[..7].copy_from_slice(b"../evil");
            h.set_cksum();
            dotdot.extend_from_slice(h.as_bytes());
            dotdot.extend_from_slice(&[b'x'; 512]);
            dotdot.extend_from_slice(&[0; 1024]);
        }
        assert!(matches!(
            import(&root, &dotdot),
            Err(ProviderError::ArchiveRejected(_))
        ));
        assert_eq!(fs::read(root.join("keep.txt")).unwrap(), b"k");
        assert!(!dir.path().join("evil").exists());
    }
}
