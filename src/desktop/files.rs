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

use rakazo_actors::provider::{FileEntry, ProviderError};

use super::browser::PROFILES_DIR;

/// Largest file `read_file` returns.
pub const MAX_READ_BYTES: u64 = 64 << 20;
/// Largest total of file bytes an imported archive may unpack to.
pub const MAX_IMPORT_BYTES: u64 = 16 << 30;
/// Most entries an imported archive may hold.
pub const MAX_IMPORT_ENTRIES: u64 = 1_000_000;
/// Transient browser files and folders left out of exports (only inside `.browser-profiles`).
pub const TRANSIENT_PROFILE_NAMES: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "ShaderCache",
    "GraphiteDawnCache",
    "Crashpad",
    "component_crx_cache",
];

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

fn is_transient(rel: &Path) -> bool {
    let mut parts = rel.components();
    matches!(parts.next(), Some(Component::Normal(p)) if p == PROFILES_DIR)
        && rel
            .file_name()
            .is_some_and(|n| TRANSIENT_PROFILE_NAMES.iter().any(|t| n == *t))
}

/// Packs the home into a tar of its directories and regular files (symlinks, sockets and
/// transient browser caches are left out).
pub fn export(root: &Path) -> Result<Vec<u8>, ProviderError> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| io_err("", e))?
            .collect::<Result<_, _>>()
            .map_err(|e| io_err("", e))?;
        names.sort_by_key(|e| e.file_name());
        for entry in names {
            let child = rel.join(entry.file_name());
            if is_transient(&child) {
                continue;
            }
            let meta = fs::symlink_metadata(entry.path()).map_err(|e| io_err("", e))?;
            if meta.is_dir() {
                builder
                    .append_dir(&child, entry.path())
                    .map_err(|e| ProviderError::Failed(format!("export: {e}")))?;
                stack.push(child);
            } else if meta.is_file() {
                let mut file = fs::File::open(entry.path()).map_err(|e| io_err("", e))?;
                builder
                    .append_file(&child, &mut file)
                    .map_err(|e| ProviderError::Failed(format!("export: {e}")))?;
            }
        }
    }
    builder
        .into_inner()
        .map_err(|e| ProviderError::Failed(format!("export: {e}")))
}

/// Unpacks `archive` into the empty directory `dest`, accepting only relative paths without
/// `.` or `..` segments, directories and regular files, within the size and entry caps.
pub fn unpack(archive: &[u8], dest: &Path) -> Result<(), ProviderError> {
    let bad = |why: String| ProviderError::ArchiveRejected(why);
    let mut tar = tar::Archive::new(archive);
    let (mut bytes, mut count) = (0u64, 0u64);
    for entry in tar.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        count += 1;
        if count > MAX_IMPORT_ENTRIES {
            return Err(bad(format!("more than {MAX_IMPORT_ENTRIES} entries")));
        }
        let raw = entry.path_bytes().into_owned();
        let rel = std::str::from_utf8(&raw)
            .map_err(|_| bad("path is not UTF-8".into()))?
            .trim_end_matches('/')
            .to_string();
        let target = lexical_join(dest, &rel).map_err(|e| bad(e.to_string()))?;
        if rel.is_empty() {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            fs::create_dir_all(&target).map_err(|e| bad(e.to_string()))?;
        } else if kind.is_file() {
            bytes += entry.size();
            if bytes > MAX_IMPORT_BYTES {
                return Err(bad(format!(
                    "unpacks to more than {MAX_IMPORT_BYTES} bytes"
                )));
            }
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(|e| bad(e.to_string()))?;
            }
            let mut file = fs::File::create(&target).map_err(|e| bad(e.to_string()))?;
            let size = entry.size();
            std::io::copy(&mut (&mut entry).take(size), &mut file)
                .map_err(|e| bad(e.to_string()))?;
        } else {
            return Err(bad(format!(
                "entry {:?} is neither a directory nor a regular file",
                rel.chars().take(200).collect::<String>()
            )));
        }
    }
    Ok(())
}

/// Replaces the home `root` with the archive's contents: unpack into a sibling staging
/// directory, then swap, so a refused archive leaves the home untouched.
pub fn import(root: &Path, archive: &[u8]) -> Result<(), ProviderError> {
    let parent = root
        .parent()
        .ok_or_else(|| ProviderError::Failed("home has no parent".into()))?;
    let name = root
        .file_name()
        .ok_or_else(|| ProviderError::Failed("home has no name".into()))?
        .to_string_lossy()
        .into_owned();
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let staging = parent.join(format!(".staging-{name}-{nonce}"));
    let old = parent.join(format!(".replaced-{name}-{nonce}"));
    fs::create_dir_all(&staging).map_err(|e| io_err("", e))?;
    if let Err(e) = unpack(archive, &staging) {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    let had_old = root.exists();
    if had_old {
        fs::rename(root, &old).map_err(|e| io_err("", e))?;
    }
    if let Err(e) = fs::rename(&staging, root) {
        if had_old {
            let _ = fs::rename(&old, root);
        }
        let _ = fs::remove_dir_all(&staging);
        return Err(io_err("", e));
    }
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
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
        let archive = export(&root).unwrap();
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
