//! Workspace I/O beneath a root directory, with no way out: every path is opened relative to
//! a held handle of the root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, so no component may be a link and nothing
//! resolves outside the root, however the tree changes meanwhile (nothing is checked before
//! it is used; the kernel decides at the open).
//!
//! Files are opened `O_NOFOLLOW | O_NONBLOCK` and judged by `fstat` of the open handle: only
//! regular files are read or written; fifos, sockets and devices are refused without blocking.
//! A regular file with more than one hard link is refused too: the workspace's owner can link
//! a file of someone else's (on the host, a file of this process), and the other name may be
//! outside. Symlinks are listed as `link` and never followed.
//!
//! Kernels without `openat2` (before 5.6) get the same rule from a walk that opens each
//! component with `O_NOFOLLOW` relative to its parent's handle.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rakazo_actors::provider::{FileEntry, ListingPage, ListingRange, ProviderError};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use super::workspace_path::segments;

/// How every path is resolved.
fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);
const WRITE_FLAGS: OFlags = OFlags::WRONLY
    .union(OFlags::CREATE)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);
const PATH_FLAGS: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

fn shown(path: &str) -> String {
    path.chars().take(200).collect()
}

fn rejected(path: &str, why: &str) -> ProviderError {
    ProviderError::PathRejected(format!("{}: {why}", shown(path)))
}

/// A folder's listing past [`MAX_LISTED_ENTRIES`].
fn listing_too_large() -> ProviderError {
    ProviderError::TooLarge(crate::providers::LISTING_TOO_LARGE.into())
}

/// The entry `name` of the folder `prefix` as a listing shows it, by its `stat` (not
/// followed).
fn listed(prefix: &str, name: String, stat: &Stat) -> FileEntry {
    let kind = Kind::of(stat);
    let path = if prefix.is_empty() {
        name.clone()
    } else {
        format!("{prefix}/{name}")
    };
    FileEntry {
        name,
        path,
        kind: kind.listed().into(),
        size: match kind {
            Kind::File | Kind::Linked => Meta::of(stat).size,
            _ => 0,
        },
    }
}

/// The error a path's open gave, as the port says it.
fn from_errno(path: &str, e: Errno) -> ProviderError {
    match e {
        Errno::LOOP => rejected(path, "a link is on the way"),
        Errno::XDEV => rejected(path, "leads outside the workspace"),
        Errno::NXIO | Errno::OPNOTSUPP => rejected(path, "not a regular file"),
        Errno::ACCESS | Errno::PERM => rejected(path, "permission denied"),
        Errno::NOENT | Errno::NOTDIR => ProviderError::NotFound(shown(path)),
        e => ProviderError::Failed(format!("{}: {}", shown(path), std::io::Error::from(e))),
    }
}

/// What this code reads of a `stat`, in the same types on every architecture (the fields of
/// [`Stat`] have different integer types on different ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Hard links.
    pub nlink: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl Meta {
    /// The fields of `stat`.
    #[allow(clippy::unnecessary_cast)]
    pub fn of(stat: &Stat) -> Self {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Self {
            dev: stat.st_dev as u64,
            ino: stat.st_ino as u64,
            size: stat.st_size as u64,
            nlink: stat.st_nlink as u64,
            mtime_ns: ns(stat.st_mtime as i64, stat.st_mtime_nsec as i64),
            ctime_ns: ns(stat.st_ctime as i64, stat.st_ctime_nsec as i64),
        }
    }
}

/// What a directory entry is, without following it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file with one link.
    File,
    /// A regular file with more than one hard link: never read by the file tools; an export
    /// reads it only when it found every name of it inside the workspace.
    Linked,
    /// A symbolic link: never followed.
    Symlink,
    /// A fifo, socket or device: never opened.
    Other,
}

impl Kind {
    /// The kind of a `stat` taken without following links.
    pub fn of(stat: &Stat) -> Self {
        match FileType::from_raw_mode(stat.st_mode as _) {
            FileType::Directory => Self::Dir,
            FileType::RegularFile if Meta::of(stat).nlink > 1 => Self::Linked,
            FileType::RegularFile => Self::File,
            FileType::Symlink => Self::Symlink,
            _ => Self::Other,
        }
    }

    /// The name a listing gives it.
    pub fn listed(self) -> &'static str {
        match self {
            Self::Dir => "dir",
            Self::File | Self::Linked => "file",
            Self::Symlink => "link",
            Self::Other => "other",
        }
    }
}

/// A regular file of the workspace, open for reading, and its `fstat`.
pub struct OpenFile {
    /// The open file.
    pub file: std::fs::File,
    /// Its metadata, from the open handle.
    pub stat: Stat,
}

/// A workspace root, held open; every path below it is opened through it.
pub struct Beneath {
    root: OwnedFd,
}

impl Beneath {
    /// Holds the directory `root` (itself not a link: it is named by this process, never
    /// by the workspace).
    pub fn open(root: &Path) -> Result<Self, ProviderError> {
        let root = rustix::fs::open(root, DIR_FLAGS, Mode::empty())
            .map_err(|e| from_errno("the workspace root", e))?;
        Ok(Self { root })
    }

    /// The root's handle.
    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Opens `rel` (normalized, `/`-separated, `""` = the root) beneath the root.
    pub fn open_at(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, ProviderError> {
        open_beneath(self.root.as_fd(), rel, flags, mode).map_err(|e| from_errno(rel, e))
    }

    /// Opens the directory at `path` (a workspace path; `""` = the root).
    pub fn dir(&self, path: &str) -> Result<OwnedFd, ProviderError> {
        let rel = segments(path, true)?.join("/");
        self.open_at(&rel, DIR_FLAGS, Mode::empty())
    }

    /// What is at `path` (`""` = the root), when no link is on the way; a link at the end
    /// is [`Kind::Symlink`].
    pub fn kind(&self, path: &str) -> Result<Kind, ProviderError> {
        let rel = segments(path, true)?.join("/");
        let fd = self.open_at(&rel, PATH_FLAGS, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| from_errno(&rel, e))?;
        Ok(Kind::of(&stat))
    }

    /// Opens the regular file at `path` for reading: a link anywhere, a fifo, socket or
    /// device, or a file with more than one hard link is refused.
    pub fn open_file(&self, path: &str) -> Result<OpenFile, ProviderError> {
        let rel = segments(path, false)?.join("/");
        let fd = self.open_at(&rel, READ_FLAGS, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| from_errno(&rel, e))?;
        match Kind::of(&stat) {
            Kind::File => Ok(OpenFile {
                file: std::fs::File::from(fd),
                stat,
            }),
            Kind::Linked => Err(rejected(&rel, "has more than one hard link")),
            _ => Err(rejected(&rel, "not a regular file")),
        }
    }

    /// Opens the regular file at `path` that a walk of this whole workspace found as the inode
    /// `id` (device, inode) with every one of its names inside the workspace: unlike
    /// [`Beneath::open_file`], a second hard link is accepted, but only for that very inode.
    pub fn open_surveyed(&self, path: &str, id: (u64, u64)) -> Result<OpenFile, ProviderError> {
        let rel = segments(path, false)?.join("/");
        let fd = self.open_at(&rel, READ_FLAGS, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| from_errno(&rel, e))?;
        let meta = Meta::of(&stat);
        match Kind::of(&stat) {
            Kind::File | Kind::Linked if (meta.dev, meta.ino) == id => Ok(OpenFile {
                file: std::fs::File::from(fd),
                stat,
            }),
            _ => Err(rejected(&rel, "not the file the walk found")),
        }
    }

    /// Reads the regular file at `path` ([`Beneath::open_file`]), at most `cap` bytes (a
    /// larger file is `TooLarge`).
    pub fn read(&self, path: &str, cap: u64) -> Result<Vec<u8>, ProviderError> {
        let OpenFile { file, stat } = self.open_file(path)?;
        let too_large = || ProviderError::file_too_large(path, cap);
        let size = Meta::of(&stat).size;
        if size > cap {
            return Err(too_large());
        }
        let mut data = Vec::with_capacity(size as usize);
        file.take(cap + 1)
            .read_to_end(&mut data)
            .map_err(|e| ProviderError::Failed(format!("{}: {e}", shown(path))))?;
        if data.len() as u64 > cap {
            return Err(too_large());
        }
        Ok(data)
    }

    /// Lists the directory at `path`, in name order; entries are never followed (links are
    /// `link`, fifos, sockets and devices `other`).
    /// A folder of more than [`MAX_LISTED_ENTRIES`] is refused, read no further.
    pub fn list(&self, path: &str) -> Result<Vec<FileEntry>, ProviderError> {
        let prefix = segments(path, true)?.join("/");
        let fd = self.open_at(&prefix, DIR_FLAGS, Mode::empty())?;
        let listing = listing_within(&fd, MAX_LISTED_ENTRIES)
            .map_err(|e| from_errno(&prefix, e))?
            .ok_or_else(listing_too_large)?;
        Ok(listing
            .entries
            .into_iter()
            .map(|(name, stat)| listed(&prefix, name, &stat))
            .collect())
    }

    /// The page `range` names of the directory at `path` by name ([`Self::list`]), and how
    /// many it holds: every name is read, only the entries kept are looked at.
    pub fn list_first(
        &self,
        path: &str,
        range: &ListingRange,
    ) -> Result<ListingPage, ProviderError> {
        let prefix = segments(path, true)?.join("/");
        let fd = self.open_at(&prefix, DIR_FLAGS, Mode::empty())?;
        let (mut names, _) = names_within(&fd, MAX_LISTED_ENTRIES)
            .map_err(|e| from_errno(&prefix, e))?
            .ok_or_else(listing_too_large)?;
        let total = names.len();
        let next = range.keep(&mut names, String::as_str);
        let mut entries = Vec::with_capacity(names.len());
        for name in names {
            match rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => entries.push(listed(&prefix, name, &stat)),
                // Removed since its name was read.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(from_errno(&prefix, e)),
            }
        }
        Ok(ListingPage {
            entries,
            total,
            next,
        })
    }

    /// Writes the regular file at `path`, creating it and its missing parent directories;
    /// never through a link, into a fifo or device, or into a file with another hard link.
    /// With `owner`, what this call creates or writes is given to that uid/gid (best effort).
    pub fn write(&self, path: &str, data: &[u8], owner: Option<u32>) -> Result<(), ProviderError> {
        let segs = segments(path, false)?;
        let rel = segs.join("/");
        let (name, parents) = segs.split_last().expect("a path has a segment");
        let give = |fd: BorrowedFd<'_>| {
            if let Some(id) = owner {
                let (uid, gid) = (rustix::fs::Uid::from_raw(id), rustix::fs::Gid::from_raw(id));
                if rustix::fs::fchown(fd, Some(uid), Some(gid)).is_err() {
                    tracing::debug!("workspace.files.chown_skipped");
                }
            }
        };
        let mut dir = self.open_at("", DIR_FLAGS, Mode::empty())?;
        for seg in parents {
            dir = match open_beneath(dir.as_fd(), seg, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, seg.as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(from_errno(&rel, e)),
                    }
                    let fd = open_beneath(dir.as_fd(), seg, DIR_FLAGS, Mode::empty())
                        .map_err(|e| from_errno(&rel, e))?;
                    give(fd.as_fd());
                    fd
                }
                Err(e) => return Err(from_errno(&rel, e)),
            };
        }
        let fd = open_beneath(dir.as_fd(), name, WRITE_FLAGS, Mode::from_raw_mode(0o644))
            .map_err(|e| from_errno(&rel, e))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| from_errno(&rel, e))?;
        match Kind::of(&stat) {
            Kind::File => {}
            Kind::Linked => return Err(rejected(&rel, "has more than one hard link")),
            _ => return Err(rejected(&rel, "not a regular file")),
        }
        rustix::fs::ftruncate(&fd, 0).map_err(|e| from_errno(&rel, e))?;
        give(fd.as_fd());
        let mut file = std::fs::File::from(fd);
        file.write_all(data)
            .map_err(|e| ProviderError::Failed(format!("{}: {e}", shown(&rel))))
    }
}

/// Opens `rel` (no `.`/`..` segments) beneath `dir`: `openat2` with [`resolve_flags`], or
/// where the kernel has none, a walk that opens each component `O_NOFOLLOW` under its parent.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let rel = if rel.is_empty() { "." } else { rel };
    let open = |flags: OFlags, mode: Mode| {
        for _ in 0..8 {
            match rustix::fs::openat2(dir, rel, flags, mode, resolve_flags()) {
                // A rename elsewhere raced the lookup: the kernel asks to try again.
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOSYS) => return open_walking(dir, rel, flags, mode),
                other => return other,
            }
        }
        Err(Errno::AGAIN)
    };
    match open(flags, mode) {
        // A directory was asked for and a link is there (`O_DIRECTORY` says "not a
        // directory" before `O_NOFOLLOW` says "a link"): say it is a link. This only names
        // the refusal; nothing is opened through it.
        Err(Errno::NOTDIR) if flags.contains(OFlags::DIRECTORY) => {
            match open(PATH_FLAGS, Mode::empty()).and_then(|fd| rustix::fs::fstat(&fd)) {
                Ok(stat) if Kind::of(&stat) == Kind::Symlink => Err(Errno::LOOP),
                _ => Err(Errno::NOTDIR),
            }
        }
        other => other,
    }
}

/// [`open_beneath`] without `openat2`: every component is opened `O_NOFOLLOW` relative to
/// the handle of its parent, so a link anywhere fails with `ELOOP`.
fn open_walking(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let parts: Vec<&str> = rel.split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "..") {
        return Err(Errno::XDEV);
    }
    let (last, parents) = parts.split_last().expect("split gives one part");
    let mut held = rustix::fs::openat(dir, ".", DIR_FLAGS, Mode::empty())?;
    for part in parents {
        held = match rustix::fs::openat(&held, *part, DIR_FLAGS, Mode::empty()) {
            Err(Errno::NOTDIR) => match rustix::fs::statat(&held, *part, AtFlags::SYMLINK_NOFOLLOW)
            {
                Ok(stat) if Kind::of(&stat) == Kind::Symlink => return Err(Errno::LOOP),
                _ => return Err(Errno::NOTDIR),
            },
            other => other?,
        };
    }
    rustix::fs::openat(&held, *last, flags | OFlags::NOFOLLOW, mode)
}

/// What [`listing_of`] finds in a directory.
pub struct Listing {
    /// Entries with UTF-8 names, in name order, each with its `stat` (not followed).
    pub entries: Vec<(String, Stat)>,
    /// Names that are not UTF-8 (shown lossily), which no workspace path can name.
    pub unnamed: Vec<String>,
}

/// The entries of an open directory, by name (UTF-8 names only; others cannot be named by a
/// workspace path), each with its `stat` taken without following it, and the names it cannot
/// give.
pub fn listing_of(dir: &OwnedFd) -> Result<Listing, Errno> {
    Ok(listing_within(dir, usize::MAX)?.expect("no limit"))
}

/// Entries of one folder a listing for a tool or a person reads at most ([`Beneath::list`]):
/// the bot makes the folders, and a folder of millions would be held here whole.
pub const MAX_LISTED_ENTRIES: usize = 100_000;

/// [`listing_of`], or `None` as soon as the directory shows more than `max` names.
pub fn listing_within(dir: &OwnedFd, max: usize) -> Result<Option<Listing>, Errno> {
    let Some((names, mut unnamed)) = names_within(dir, max)? else {
        return Ok(None);
    };
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => entries.push((name, stat)),
            // Removed since the listing.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    unnamed.sort();
    Ok(Some(Listing { entries, unnamed }))
}

/// A directory's names: the UTF-8 ones, and the others shown lossily.
type Names = (Vec<String>, Vec<String>);

/// The names of an open directory, in no order; `None` as soon as it shows more than `max`
/// (`.` and `..` are not counted).
fn names_within(dir: &OwnedFd, max: usize) -> Result<Option<Names>, Errno> {
    let (mut named, mut unnamed) = (Vec::new(), Vec::new());
    let mut read = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = read.read() {
        let entry = entry?;
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        if named.len() + unnamed.len() == max {
            return Ok(None);
        }
        match name.to_str() {
            Ok(name) => named.push(name.to_owned()),
            Err(_) => unnamed.push(name.to_string_lossy().into_owned()),
        }
    }
    Ok(Some((named, unnamed)))
}

/// Connects to the unix socket `name` in `dir`, a directory the computer can write to (its
/// shared X socket directory): the socket is found beneath `dir` without following a link
/// (an `O_PATH` handle, checked to be a socket by `fstat`), and the connection goes to that
/// very handle through `/proc/self/fd`, so a link planted in its place cannot turn the
/// connection to another socket of this host.
pub fn connect_socket(dir: &Path, name: &str) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::AsRawFd as _;
    let dir = Beneath::open(dir).map_err(std::io::Error::other)?;
    let rel = segments(name, false)
        .map_err(std::io::Error::other)?
        .join("/");
    let fd = open_beneath(dir.root(), &rel, PATH_FLAGS, Mode::empty())?;
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode as _) != FileType::Socket {
        return Err(std::io::Error::other(format!(
            "{}: not a socket",
            shown(name)
        )));
    }
    std::os::unix::net::UnixStream::connect(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Gives `root` and everything under it to `id` (uid and gid), through handles: links are
/// changed themselves, never followed, and a regular file with more than one hard link is
/// left alone (its other name may be outside).
pub fn chown_tree(root: &Path, id: u32) -> std::io::Result<()> {
    let (uid, gid) = (rustix::fs::Uid::from_raw(id), rustix::fs::Gid::from_raw(id));
    let owned = |stat: &Stat| stat.st_uid == id && stat.st_gid == id;
    let beneath = Beneath::open(root).map_err(std::io::Error::other)?;
    let top = rustix::fs::fstat(beneath.root())?;
    if !owned(&top) {
        rustix::fs::fchown(beneath.root(), Some(uid), Some(gid))?;
    }
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = match open_beneath(beneath.root(), &rel, DIR_FLAGS, Mode::empty()) {
            Ok(dir) => dir,
            // Replaced by something else since it was seen: not a directory of the tree now.
            Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        // Entry by entry as the directory gives them: the bot makes the tree, and a folder of
        // millions of names is never held here whole.
        let mut read = rustix::fs::Dir::read_from(&dir)?;
        while let Some(entry) = read.read() {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if matches!(name, "." | "..") {
                continue;
            }
            let name = name.to_owned();
            let stat = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                // Removed since the listing.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let kind = Kind::of(&stat);
            if kind == Kind::Dir {
                stack.push(if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                });
            }
            if owned(&stat) || kind == Kind::Linked {
                continue;
            }
            match rustix::fs::chownat(
                &dir,
                name.as_str(),
                Some(uid),
                Some(gid),
                AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn home() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();
        (dir, root)
    }

    /// A listing within a limit reads every name up to it, and gives up at one more.
    #[test]
    fn a_listing_past_its_limit_is_given_up() {
        let (_dir, root) = home();
        for name in ["b", "c", "d"] {
            std::fs::write(root.join(name), b"").unwrap();
        }
        let fd = rustix::fs::open(&root, DIR_FLAGS, Mode::empty()).unwrap();
        let names = |l: Listing| l.entries.into_iter().map(|e| e.0).collect::<Vec<_>>();
        let whole = listing_within(&fd, 4)
            .unwrap()
            .expect("four names fit four");
        assert_eq!(names(whole), ["a", "b", "c", "d"]);
        let fd = rustix::fs::open(&root, DIR_FLAGS, Mode::empty()).unwrap();
        assert!(listing_within(&fd, 3).unwrap().is_none());
        let fd = rustix::fs::open(&root, DIR_FLAGS, Mode::empty()).unwrap();
        assert_eq!(names(listing_of(&fd).unwrap()).len(), 4);
    }

    #[test]
    fn a_folders_first_entries_are_looked_at_and_the_rest_counted() {
        let (_dir, root) = home();
        std::fs::create_dir(root.join("many")).unwrap();
        for name in ["e", "c", "a", "d", "b"] {
            std::fs::write(root.join("many").join(name), name.repeat(3)).unwrap();
        }
        std::fs::create_dir(root.join("many/aa")).unwrap();
        symlink("/", root.join("many/ab")).unwrap();
        let beneath = Beneath::open(&root).unwrap();
        let page = beneath.list_first("many", &ListingRange::first(4)).unwrap();
        assert_eq!(page.total, 7);
        let shown: Vec<(&str, &str, u64)> = page
            .entries
            .iter()
            .map(|e| (e.path.as_str(), e.kind.as_str(), e.size))
            .collect();
        assert_eq!(
            shown,
            [
                ("many/a", "file", 3),
                ("many/aa", "dir", 0),
                ("many/ab", "link", 0),
                ("many/b", "file", 3)
            ]
        );
        assert_eq!(page.next.as_deref(), Some("c"));
        let whole = beneath
            .list_first("many", &ListingRange::first(100))
            .unwrap();
        assert_eq!(whole.entries, beneath.list("many").unwrap());
        assert!(
            beneath
                .list_first("many", &ListingRange::first(0))
                .unwrap()
                .entries
                .is_empty()
        );
        // A page from a link's name holds the link, not followed.
        let link = beneath
            .list_first("many", &ListingRange::from("ab", 1))
            .unwrap();
        let shown = (link.entries[0].path.as_str(), link.entries[0].kind.as_str());
        assert_eq!(
            (shown, link.next.as_deref()),
            (("many/ab", "link"), Some("b"))
        );
    }

    #[test]
    fn links_fifos_and_hard_links_are_refused() {
        let (dir, root) = home();
        symlink("/", root.join("slash")).unwrap();
        symlink("..", root.join("up")).unwrap();
        symlink("/proc/self", root.join("self")).unwrap();
        symlink("/dev/zero", root.join("zero")).unwrap();
        symlink("a", root.join("inside")).unwrap();
        std::fs::hard_link(dir.path().join("secret"), root.join("hard")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("pipe"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        std::fs::write(root.join("a/ok.txt"), b"ok").unwrap();
        let b = Beneath::open(&root).unwrap();
        assert_eq!(b.read("a/ok.txt", 10).unwrap(), b"ok");
        for bad in [
            "slash/etc/passwd",
            "up/secret",
            "self/environ",
            "zero",
            "inside/ok.txt",
            "hard",
            "pipe",
        ] {
            let read = b.read(bad, 1 << 20);
            assert!(
                matches!(read, Err(ProviderError::PathRejected(_))),
                "read {bad}: {read:?}"
            );
        }
        // Writes are tried only where a broken rule would harm this test's files.
        for bad in ["up/secret", "up/new", "inside/new.txt", "hard", "pipe"] {
            let write = b.write(bad, b"x", None);
            assert!(
                matches!(write, Err(ProviderError::PathRejected(_))),
                "write {bad}: {write:?}"
            );
        }
        for bad in ["slash", "up", "self", "inside"] {
            assert!(
                matches!(b.list(bad), Err(ProviderError::PathRejected(_))),
                "list {bad}"
            );
        }
        assert_eq!(
            std::fs::read(dir.path().join("secret")).unwrap(),
            b"outside"
        );
        let kinds: Vec<_> = b
            .list("")
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
        let kind = |n: &str| kinds.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(kind("up"), "link");
        assert_eq!(kind("pipe"), "other");
        assert_eq!(kind("a"), "dir");
        // The walk without openat2 refuses the same.
        for bad in ["up/secret", "slash/etc", "inside/ok.txt"] {
            assert_eq!(
                open_walking(b.root(), bad, READ_FLAGS, Mode::empty()).err(),
                Some(Errno::LOOP),
                "{bad}"
            );
        }
        // Creating parents never goes through a link.
        b.write("a/new/deep.txt", b"d", None).unwrap();
        assert_eq!(std::fs::read(root.join("a/new/deep.txt")).unwrap(), b"d");
        assert!(matches!(
            b.write("up/planted.txt", b"x", None),
            Err(ProviderError::PathRejected(_))
        ));
        assert!(!dir.path().join("planted.txt").exists());
    }

    #[test]
    fn reads_are_capped() {
        let (_dir, root) = home();
        std::fs::write(root.join("big"), vec![1u8; 100]).unwrap();
        let b = Beneath::open(&root).unwrap();
        assert!(matches!(b.read("big", 99), Err(ProviderError::TooLarge(_))));
        assert_eq!(b.read("big", 100).unwrap().len(), 100);
    }

    /// A process swapping a directory for a symlink to outside as fast as it can never makes
    /// a read or write land outside: the open itself refuses links.
    #[test]
    fn a_racing_symlink_swap_never_escapes() {
        let (dir, root) = home();
        std::fs::write(root.join("a/secret"), b"inside").unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"OUTSIDE").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (root, outside, stop) = (root.clone(), outside.clone(), stop.clone());
            std::thread::spawn(move || {
                let (real, link) = (root.join("a"), root.join("a.link"));
                symlink(&outside, &link).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // `a` is the directory, then (atomically) a symlink to outside, and back.
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &real,
                        rustix::fs::CWD,
                        &link,
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap();
                }
            })
        };
        let b = Beneath::open(&root).unwrap();
        let (mut inside, mut refused) = (0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut i = 0;
        while i < 20_000 || ((inside == 0 || refused == 0) && std::time::Instant::now() < deadline)
        {
            i += 1;
            match b.read("a/secret", 100) {
                Ok(data) => {
                    assert_eq!(data, b"inside", "read escaped the workspace");
                    inside += 1;
                }
                Err(_) => refused += 1,
            }
            let _ = b.write(&format!("a/w{}", i % 4), b"w", None);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            1,
            "a write landed outside"
        );
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"OUTSIDE");
        assert!(
            inside > 0 && refused > 0,
            "{inside} inside, {refused} refused"
        );
    }

    #[test]
    fn sockets_are_connected_only_where_they_are() {
        let (dir, root) = home();
        let real = dir.path().join("elsewhere.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&real).unwrap();
        let _here = std::os::unix::net::UnixListener::bind(root.join("X1")).unwrap();
        symlink(&real, root.join("X2")).unwrap();
        std::fs::write(root.join("X3"), b"").unwrap();
        assert!(connect_socket(&root, "X1").is_ok());
        assert!(connect_socket(&root, "X2").is_err(), "a link was followed");
        assert!(
            connect_socket(&root, "X3").is_err(),
            "a file is not a socket"
        );
        assert!(connect_socket(&root, "../elsewhere.sock").is_err());
    }

    #[test]
    fn chown_tree_leaves_links_and_hard_links_alone() {
        let (dir, root) = home();
        std::fs::write(root.join("a/f"), b"f").unwrap();
        symlink(dir.path().join("secret"), root.join("link")).unwrap();
        std::fs::hard_link(dir.path().join("secret"), root.join("hard")).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        let before = uid(&dir.path().join("secret"));
        // Run as root this gives the tree away; unprivileged, only to oneself.
        let to = if before == 0 { 54321 } else { before };
        chown_tree(&root, to).unwrap();
        assert_eq!(uid(&root.join("a/f")), to);
        assert_eq!(uid(&root), to);
        assert_eq!(
            uid(&dir.path().join("secret")),
            before,
            "a hard link was followed"
        );
    }
}
