//! Files of a host workspace: paths confined to the home, and whole-workspace tar export and
//! import of directories and regular files only.
//!
//! Every path a tool names is relative to the home; absolute paths, `..` and `.` segments and
//! NUL bytes are refused with `PathRejected`, and every open goes through
//! [`crate::providers::beneath`]: no link is followed anywhere on the way, fifos, sockets,
//! devices and files with another hard link are refused, with no check before the use.

use std::path::{Path, PathBuf};

use rakazo_actors::provider::{
    FileEntry, ListingPage, ListingRange, ProviderError, WorkspaceExport,
};

use rakazo_actors::home_store::StoreError;

use crate::providers::beneath::{Beneath, Kind};
use crate::providers::workspace_path::segments;
use crate::stores::archive::{self, ArchiveError, Limits};
use crate::stores::local::LatestCopies;

use super::runtime::DesktopRuntime;

/// Largest file `read_file` returns.
pub const MAX_READ_BYTES: u64 = 64 << 20;

/// The host path of `rel` under `root`, once it is known to be a directory or regular file
/// reached with no link on the way (for a process of the computer to use: a shell's working
/// directory, a file opened in the browser).
pub fn resolve(root: &Path, rel: &str) -> Result<PathBuf, ProviderError> {
    let segs = segments(rel, true)?;
    match Beneath::open(root)?.kind(rel)? {
        Kind::Dir | Kind::File => Ok(segs.iter().fold(root.to_path_buf(), |p, s| p.join(s))),
        _ => Err(ProviderError::PathRejected(format!(
            "{}: not a directory or regular file",
            rel.chars().take(200).collect::<String>()
        ))),
    }
}

/// Lists a directory of the home; links are listed, never followed.
pub fn list(root: &Path, rel: &str) -> Result<Vec<FileEntry>, ProviderError> {
    Beneath::open(root)?.list(rel)
}

/// A page of a directory of the home by name (`range`), and how many entries it holds.
pub fn list_first(
    root: &Path,
    rel: &str,
    range: &ListingRange,
) -> Result<ListingPage, ProviderError> {
    Beneath::open(root)?.list_first(rel, range)
}

/// Reads a regular file of the home.
pub fn read(root: &Path, rel: &str) -> Result<Vec<u8>, ProviderError> {
    read_within(root, rel, MAX_READ_BYTES)
}

/// Reads a regular file of the home of at most `max` bytes (and [`MAX_READ_BYTES`]): a
/// larger one is refused by its size, unread.
pub fn read_within(root: &Path, rel: &str, max: u64) -> Result<Vec<u8>, ProviderError> {
    Beneath::open(root)?.read(rel, max.min(MAX_READ_BYTES))
}

/// Writes a file of the home, creating parent directories; never through a link. With
/// `owner`, what it creates or writes is given to that uid/gid.
pub fn write(root: &Path, rel: &str, data: &[u8], owner: Option<u32>) -> Result<(), ProviderError> {
    Beneath::open(root)?.write(rel, data, owner)
}

/// Runs file work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProviderError::Failed(format!("file task: {e}")))?
}

/// [`export_since`] of a machine's home once the runtime's running browsers saved their state
/// ([`DesktopRuntime::with_browser_state_saved`]); no browser is closed.
pub(crate) async fn export_consistent(
    runtime: &DesktopRuntime,
    home: PathBuf,
    since: Option<&str>,
) -> Result<WorkspaceExport, ProviderError> {
    let since = since.map(str::to_owned);
    runtime
        .with_browser_state_saved(blocking(move || export_since(&home, since.as_deref())))
        .await?
}

/// Packs the home into a tar of its directories and regular files (the workspace archive
/// rules of [`crate::stores::archive`]: links, fifos, sockets, devices, files with another
/// hard link and transient browser files are left out, and nothing is followed), unless its digest equals `since`'s (see [`archive::Baseline`]); pieces whose
/// stamps `since` holds are named, not read ([`archive::pack_pieces`]). The returned
/// fingerprint is the pack's [`archive::Baseline`].
pub fn export_since(root: &Path, since: Option<&str>) -> Result<WorkspaceExport, ProviderError> {
    let since = since.map(archive::Baseline::parse);
    let packed = archive::pack_pieces(root, since.as_ref(), Limits::default());
    match packed.map_err(|e| match e {
        ArchiveError::Refused(why) => ProviderError::ArchiveRejected(why),
        ArchiveError::Io(e) => ProviderError::Failed(format!("export: {e}")),
    })? {
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
    use std::fs;

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
            let resolved = resolve(&root, bad);
            assert!(
                matches!(resolved, Err(ProviderError::PathRejected(_))),
                "{bad:?}: {resolved:?}"
            );
        }
        assert!(resolve(&root, "a").is_ok());
        assert!(matches!(
            write(&root, "escape/x", b"1", None),
            Err(ProviderError::PathRejected(_))
        ));
        write(&root, "a/b/c.txt", b"hi", None).unwrap();
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
        write(&root, "bots/b1/notes.txt", b"one", None).unwrap();
        write(&root, ".browser-profiles/b1/Default/Bookmarks", b"c", None).unwrap();
        // Chromium's live cookie database: its DevTools snapshot stands in for it.
        write(&root, ".browser-profiles/b1/Default/Cookies", b"live", None).unwrap();
        write(&root, ".browser-profiles/b1/Default/Cache/x", b"junk", None).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        // Planted by the workspace's owner: none of it is followed, read or waited on.
        fs::write(dir.path().join("secret"), b"outside-secret").unwrap();
        std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
        fs::hard_link(dir.path().join("secret"), root.join("hard")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("pipe"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let WorkspaceExport::Archive { workspace, .. } = export_since(&root, None).unwrap() else {
            panic!("an export without a fingerprint packs");
        };
        let archive = workspace
            .into_archive()
            .expect("every byte without a baseline");
        assert!(!archive.windows(14).any(|w| w == b"outside-secret"));
        let other = dir.path().join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("stale"), b"x").unwrap();
        import(&other, &archive).unwrap();
        assert_eq!(fs::read(other.join("bots/b1/notes.txt")).unwrap(), b"one");
        assert_eq!(
            fs::read(other.join(".browser-profiles/b1/Default/Bookmarks")).unwrap(),
            b"c"
        );
        assert!(!other.join(".browser-profiles/b1/Default/Cookies").exists());
        assert!(!other.join(".browser-profiles/b1/Default/Cache").exists());
        assert!(!other.join("link").exists());
        for planted in ["up", "hard", "pipe"] {
            assert!(
                fs::symlink_metadata(other.join(planted)).is_err(),
                "{planted}"
            );
        }
        assert!(!other.join("stale").exists());
    }

    #[test]
    fn import_refuses_hostile_archives_and_keeps_the_home() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        fs::create_dir_all(&root).unwrap();
        write(&root, "keep.txt", b"k", None).unwrap();
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
