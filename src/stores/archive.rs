//! Workspace archives: pack a home directory into a tar of directories and regular files, and
//! unpack an archive into a fresh staging directory under hard limits.
//!
//! Unpacking accepts only relative paths without `.` or `..` segments and only directories and
//! regular files (no links, devices or fifos), and enforces total-size, per-file and
//! entry-count limits; any violation refuses the whole archive.
//!
//! Packing opens everything through [`Beneath`]: it never follows or descends through a
//! symlink, never opens a fifo, socket or device, and keeps a regular file with more than one
//! hard link only when the walk found every one of its names inside the workspace (else
//! another name may be a host file); it leaves out the transient cache and lock files inside
//! `.browser-profiles` (files with the same names elsewhere are kept) and the profiles of spare
//! desktops there, and reports names it cannot store.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;

use rakazo_actors::provider::{ProviderError, Skipped};
use rakazo_actors::workspace::{ARCHIVE_END, Piece, Workspace};
use rustix::fs::Stat;

use crate::providers::beneath::{Beneath, Kind, Meta, OpenFile, listing_within};
use crate::providers::workspace_path::segments;

/// The folder holding per-bot browser profiles.
pub const PROFILES_DIR: &str = ".browser-profiles";
/// Chromium's transient files and caches, skipped only inside [`PROFILES_DIR`].
pub const TRANSIENT: &[&str] = &[
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
    // Written by Chromium on its own schedule; the DevTools snapshot `Saved Cookies.json`
    // stands for them (see `desktop::browser::SAVED_COOKIES`).
    "Cookies",
    "Cookies-journal",
    // Rewritten by an idle browser or at every start, with nothing of the bot's in them.
    "shared_proto_db",
    "segmentation_platform",
    "GPUPersistentCache",
    "QuotaManager",
    "QuotaManager-journal",
    "Network Persistent State",
    "BrowserMetrics",
    "component_crx_cache",
    "extensions_crx_cache",
    "Last Version",
    "Last Browser",
    "Variations",
    "chrome_debug.log",
];

/// The longest workspace path packing keeps: a restore must create it under a staging
/// directory within the system's 4,096-byte path limit. Deeper entries are skipped and reported.
pub const MAX_PATH_BYTES: usize = 3072;

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

impl Limits {
    /// The most bytes an archive within these limits takes: its files' bytes, and for each
    /// entry a header, a long name or extended header (a path is at most
    /// [`MAX_PATH_BYTES`]) and padding; then the end, padded to a whole record.
    pub fn max_archive_bytes(&self) -> u64 {
        let per_entry = 512 + (512 + MAX_PATH_BYTES as u64 + 512) + 512;
        self.max_total_bytes + self.max_entries as u64 * per_entry + 20 * 512
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

/// The name start of a spare desktop's browser profile inside [`PROFILES_DIR`]: a profile
/// no bot owns yet (or the link left where one was handed over), never archived. Bot ids
/// cannot start with a dot.
pub const SPARE_PROFILE_PREFIX: &str = ".spare-";

fn transient(rel: &[String]) -> bool {
    rel.first().is_some_and(|f| f == PROFILES_DIR)
        && (rel
            .get(1)
            .is_some_and(|p| p.starts_with(SPARE_PROFILE_PREFIX))
            || rel.iter().skip(1).any(|s| TRANSIENT.contains(&s.as_str())))
}

impl From<ProviderError> for ArchiveError {
    fn from(e: ProviderError) -> Self {
        Self::Io(std::io::Error::other(e.to_string()))
    }
}

/// One directory or regular file of a home, as [`visit`] finds it.
struct Found<'a> {
    /// Its path relative to the root, `/`-separated.
    path: &'a str,
    /// A directory (else a regular file).
    dir: bool,
    /// Its metadata, taken without following it.
    stat: &'a Stat,
}

/// What [`visit`] left out of the archive, besides transient browser files and what it
/// reports as skipped.
#[derive(Debug, Default)]
struct Left {
    /// Symbolic links.
    links: u64,
    /// Names of regular files with another hard link outside the workspace.
    hard_links: u64,
    /// Fifos, sockets and devices.
    special: u64,
}

/// A file with more than one hard link, as a walk finds it: its link count, the names found
/// (with their `stat`), and each name's folder (device and inode) and last segment: a folder
/// renamed during the walk shows the same name twice, under two paths.
type Linked = (u64, Vec<(String, Stat)>, BTreeSet<(u64, u64, String)>);

/// Calls `f` for every directory and regular file under `root` that belongs in a workspace
/// archive: parents before children, siblings in name order, then the files with more than one
/// hard link whose every name is in the workspace (in path order). Nothing is followed: links,
/// sockets, fifos, devices, files with a name outside the workspace (its other name may be a
/// host file) and transient browser files are left out, and a directory replaced by anything
/// else since it was seen is skipped; names the store cannot hold (not UTF-8, a path past
/// [`MAX_PATH_BYTES`]) and folders that cannot be read are left out and added to `skipped`.
///
/// The bot makes the tree: a walk that has listed more than twice `max_entries` names (links
/// and special files included) is refused before it holds more.
fn visit(
    root: &Beneath,
    max_entries: usize,
    skipped: &mut Vec<Skipped>,
    mut f: impl FnMut(Found<'_>) -> Result<(), ArchiveError>,
) -> Result<Left, ArchiveError> {
    let mut left = Left::default();
    let mut names_left = max_entries.saturating_mul(2);
    // Files with another hard link, by device and inode: their link count and the names the
    // walk found. All names found means no name is outside the workspace.
    let mut linked: BTreeMap<(u64, u64), Linked> = Default::default();
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let dir = match root.dir(&rel.join("/")) {
            Ok(dir) => dir,
            Err(ProviderError::NotFound(_)) if !rel.is_empty() => continue,
            // No longer a folder, or one this process may not open: left out and reported.
            Err(ProviderError::PathRejected(why)) if !rel.is_empty() => {
                let why = why.rsplit(": ").next().unwrap_or_default();
                skip(
                    skipped,
                    rel.join("/"),
                    format!("folder cannot be read: {why}"),
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let listing = match listing_within(&dir, names_left) {
            Ok(Some(listing)) => listing,
            Ok(None) => return Err(too_many(max_entries)),
            Err(e) if !rel.is_empty() => {
                let kind = std::io::Error::from(e).kind();
                skip(
                    skipped,
                    rel.join("/"),
                    format!("folder cannot be read: {kind}"),
                );
                continue;
            }
            Err(e) => return Err(std::io::Error::from(e).into()),
        };
        names_left -= listing.entries.len() + listing.unnamed.len();
        // The folder's device and inode, once a file with another hard link needs it.
        let mut folder: Option<(u64, u64)> = None;
        for raw in listing.unnamed {
            let mut path = rel.clone();
            path.push(raw);
            skip(skipped, path.join("/"), "name is not UTF-8".into());
        }
        for (name, stat) in listing.entries.into_iter().rev() {
            let mut child = rel.clone();
            child.push(name);
            if transient(&child) {
                continue;
            }
            let kind = Kind::of(&stat);
            match kind {
                Kind::Dir | Kind::File | Kind::Linked => {}
                Kind::Symlink => {
                    left.links += 1;
                    continue;
                }
                Kind::Other => {
                    left.special += 1;
                    continue;
                }
            }
            let path = child.join("/");
            if path.len() > MAX_PATH_BYTES {
                skip(
                    skipped,
                    path,
                    format!("path longer than {MAX_PATH_BYTES} bytes"),
                );
                continue;
            }
            if kind == Kind::Linked {
                let m = Meta::of(&stat);
                let folder = match folder {
                    Some(folder) => folder,
                    None => {
                        let at = Meta::of(&rustix::fs::fstat(&dir).map_err(std::io::Error::from)?);
                        *folder.insert((at.dev, at.ino))
                    }
                };
                let (_, names, places) =
                    linked
                        .entry((m.dev, m.ino))
                        .or_insert((m.nlink, Vec::new(), BTreeSet::new()));
                places.insert((
                    folder.0,
                    folder.1,
                    child.last().cloned().unwrap_or_default(),
                ));
                names.push((path, stat));
                continue;
            }
            f(Found {
                path: &path,
                dir: kind == Kind::Dir,
                stat: &stat,
            })?;
            if kind == Kind::Dir {
                stack.push(child);
            }
        }
    }
    let mut kept = Vec::new();
    for (nlink, names, places) in linked.into_values() {
        if places.len() as u64 == nlink {
            kept.extend(names);
        } else {
            left.hard_links += names.len() as u64;
        }
    }
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, stat) in &kept {
        f(Found {
            path,
            dir: false,
            stat,
        })?;
    }
    if left.hard_links > 0 || left.links > 0 || left.special > 0 {
        tracing::info!(
            left.links = left.links,
            left.hard_links = left.hard_links,
            left.special = left.special,
            "workspace.export.left_out"
        );
    }
    Ok(left)
}

/// Records a skipped entry (its path cut to [`MAX_PATH_BYTES`] for the report).
fn skip(skipped: &mut Vec<Skipped>, mut path: String, reason: String) {
    if path.len() > MAX_PATH_BYTES {
        let mut end = MAX_PATH_BYTES;
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        path.truncate(end);
        path.push('…');
    }
    skipped.push(Skipped { path, reason });
}

/// Pack `root` (which must exist) into a tar archive, in a stable order.
pub fn pack(root: &Path) -> Result<Vec<u8>, ArchiveError> {
    let beneath = Beneath::open(root)?;
    let mut builder = tar::Builder::new(Vec::new());
    let mut found = Vec::new();
    let limits = Limits::default();
    visit(&beneath, limits.max_entries, &mut Vec::new(), |f| {
        let m = Meta::of(f.stat);
        let file = (!f.dir).then_some(Seen {
            id: (m.dev, m.ino),
            size: m.size,
        });
        found.push((f.path.to_owned(), file));
        Ok(())
    })?;
    for (path, file) in found {
        append(&mut builder, &beneath, &path, file, &mut Vec::new())?;
    }
    Ok(builder.into_inner()?)
}

/// A regular file as the walk found it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// Device and inode.
    id: (u64, u64),
    /// Its size then.
    size: u64,
}

/// The refusal of a tree or archive of more than `max` entries.
fn too_many(max: usize) -> ArchiveError {
    ArchiveError::Refused(format!("more than {max} entries"))
}

/// What a walk or archive has held so far, against its [`Limits`].
#[derive(Debug)]
struct Tally {
    limits: Limits,
    entries: u64,
    file_bytes: u64,
}

impl Tally {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            entries: 0,
            file_bytes: 0,
        }
    }

    /// One more entry; a file of `size` bytes (`None` for a directory) named `path`.
    fn add(&mut self, path: &str, size: Option<u64>) -> Result<(), ArchiveError> {
        let refuse = |why: String| ArchiveError::Refused(why);
        self.entries += 1;
        if self.entries > self.limits.max_entries as u64 {
            return Err(too_many(self.limits.max_entries));
        }
        let Some(size) = size else {
            return Ok(());
        };
        if size > self.limits.max_file_bytes {
            return Err(refuse(format!(
                "{path:?} is larger than {} bytes",
                self.limits.max_file_bytes
            )));
        }
        self.file_bytes += size;
        if self.file_bytes > self.limits.max_total_bytes {
            return Err(refuse(format!(
                "more than {} bytes in total",
                self.limits.max_total_bytes
            )));
        }
        Ok(())
    }
}

/// Appends one directory (`file` is `None`) or regular file to an archive, the same way every
/// time. A file is opened beneath the root again, never through a link; one that is gone is
/// left out, and one that is no longer the file the walk found or that this process may not
/// read is left out and added to `skipped`. At most the size the walk saw is read: a file
/// grown since keeps that size here. Answers whether the entry is what the survey saw.
fn append(
    builder: &mut tar::Builder<Vec<u8>>,
    root: &Beneath,
    path: &str,
    file: Option<Seen>,
    skipped: &mut Vec<Skipped>,
) -> Result<bool, ArchiveError> {
    builder.mode(tar::HeaderMode::Deterministic);
    let mut h = tar::Header::new_gnu();
    let Some(seen) = file else {
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        builder.append_data(&mut h, format!("{path}/"), std::io::empty())?;
        return Ok(true);
    };
    let OpenFile { file, stat } = match root.open_surveyed(path, seen.id) {
        Ok(open) => open,
        Err(ProviderError::NotFound(_)) => return Ok(false),
        Err(ProviderError::PathRejected(why)) => {
            let why = why.rsplit(": ").next().unwrap_or_default();
            skip(skipped, path.to_owned(), format!("cannot be read: {why}"));
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let len = Meta::of(&stat).size.min(seen.size);
    let mut data = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut data)?;
    // Shortened while read: the entry keeps the size its header says.
    let whole = data.len() as u64 == seen.size;
    data.resize(len as usize, 0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(len);
    builder.append_data(&mut h, path, data.as_slice())?;
    Ok(whole)
}

/// How recent a change may be for a fingerprint to vouch for it: file times come from a coarse
/// clock, so a write right after the walk could leave a just-written file's times unchanged.
pub const RACY_WINDOW_NS: i128 = 2_000_000_000;

/// The largest piece a packed workspace is cut into, unless one entry alone is larger.
pub const PIECE_MAX: u64 = 8 << 20;
/// A directory starts a new piece once the current piece holds this much.
pub const PIECE_MIN: u64 = 1 << 20;

/// Where a workspace archive is cut into pieces, entry by entry: where the entries of
/// another folder begin once the piece holds [`PIECE_MIN`], and before any entry that would
/// take it past [`PIECE_MAX`] (so a larger file is a piece of its own). Cuts follow the
/// tree, so an edit moves only the cuts near it, and the same rule cuts a packed tree and a
/// received archive.
#[derive(Debug, Default)]
pub struct Cutter {
    current: u64,
    folder: Option<String>,
}

impl Cutter {
    /// Whether the entry at `path` (`/`-separated, a trailing `/` for a directory) of `len`
    /// archive bytes starts a new piece.
    pub fn starts_piece(&mut self, path: &str, len: u64) -> bool {
        let folder = path
            .trim_end_matches('/')
            .rsplit_once('/')
            .map_or("", |(folder, _)| folder);
        let other_folder = self.folder.as_deref() != Some(folder);
        if other_folder {
            self.folder = Some(folder.to_owned());
        }
        let cut = self.current > 0
            && ((other_folder && self.current >= PIECE_MIN) || self.current + len > PIECE_MAX);
        if cut {
            self.current = 0;
        }
        self.current += len;
        cut
    }
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

/// One entry of a [`Survey`].
struct Surveyed {
    path: String,
    /// How the walk found it, for files.
    file: Option<Seen>,
    /// What identifies its bytes: path and, for files, device, inode, size and times.
    line: String,
    /// Changed too recently to vouch for.
    racy: bool,
    /// About how many archive bytes it takes.
    archive_bytes: u64,
}

/// A metadata walk of what [`pack`] would put in an archive.
struct Survey {
    entries: Vec<Surveyed>,
    /// What the walk left out and reports.
    skipped: Vec<Skipped>,
}

impl Survey {
    /// The walk of `root`, refused as soon as it breaks `limits`: nothing is read then.
    fn take(root: &Beneath, racy_window_ns: i128, limits: Limits) -> Result<Self, ArchiveError> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let mut entries = Vec::new();
        let mut skipped = Vec::new();
        let mut tally = Tally::new(limits);
        visit(root, limits.max_entries, &mut skipped, |found| {
            if found.dir {
                tally.add(found.path, None)?;
                entries.push(Surveyed {
                    line: format!("d {}\n", found.path),
                    archive_bytes: tar_bytes(&format!("{}/", found.path), 0),
                    path: found.path.to_owned(),
                    file: None,
                    racy: false,
                });
                return Ok(());
            }
            let m = Meta::of(found.stat);
            let (mtime, ctime) = (m.mtime_ns, m.ctime_ns);
            let (dev, ino, len) = (m.dev, m.ino, m.size);
            tally.add(found.path, Some(len))?;
            entries.push(Surveyed {
                line: format!("f {} {dev} {ino} {len} {mtime} {ctime}\n", found.path),
                archive_bytes: tar_bytes(found.path, len),
                racy: started - mtime.max(ctime) < racy_window_ns,
                path: found.path.to_owned(),
                file: Some(Seen {
                    id: (dev, ino),
                    size: len,
                }),
            });
            Ok(())
        })?;
        Ok(Self { entries, skipped })
    }

    /// The digest of every entry, unless one is too recent to vouch for.
    fn digest(&self) -> Option<String> {
        hash_lines(b"", &self.entries).map(hex::encode)
    }

    /// The entries cut into pieces ([`Cutter`]), as index ranges.
    fn pieces(&self) -> Vec<std::ops::Range<usize>> {
        let mut cutter = Cutter::default();
        let mut ranges = Vec::new();
        let mut start = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if cutter.starts_piece(&e.path, e.archive_bytes) {
                ranges.push(start..i);
                start = i;
            }
        }
        if start < self.entries.len() {
            ranges.push(start..self.entries.len());
        }
        ranges
    }

    /// The stamp of a piece's entries, unless one is too recent to vouch for.
    fn stamp(entries: &[Surveyed]) -> Option<String> {
        hash_lines(b"piece 1\n", entries).map(|h| hex::encode(&h[..16]))
    }
}

/// The SHA-256 of `prefix` and the entries' lines, unless one is too recent to vouch for.
fn hash_lines(prefix: &[u8], entries: &[Surveyed]) -> Option<[u8; 32]> {
    use sha2::Digest as _;
    if entries.iter().any(|e| e.racy) {
        return None;
    }
    let mut hash = sha2::Sha256::new();
    hash.update(prefix);
    for e in entries {
        hash.update(&e.line);
    }
    Some(hash.finalize().into())
}

/// What a packed workspace was: the fingerprint to skip an unchanged export, and the stamps
/// of its pieces to name them again without reading them. Kept with the revision row as
/// JSON; a bare digest (as kept before pieces) reads as a baseline without stamps.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Baseline {
    /// The whole tree's digest, from metadata only: every entry's path and, for files,
    /// device, inode, size, modification and change times (the change time cannot be set
    /// back by the workspace's owner). Equal digests mean equal archives. None when an entry
    /// changed within the last two seconds, since a write in the same clock tick might not
    /// show.
    pub digest: Option<String>,
    /// The stamps of its pieces.
    pub stamps: Vec<String>,
}

impl Baseline {
    /// Reads a kept baseline.
    pub fn parse(kept: &str) -> Self {
        serde_json::from_str(kept).unwrap_or_else(|_| Self {
            digest: Some(kept.to_owned()),
            stamps: Vec::new(),
        })
    }

    /// What is kept.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a baseline serializes")
    }
}

/// A packed workspace.
#[derive(Debug)]
pub enum Packed {
    /// The tree still has the digest of the baseline: nothing was read.
    Unchanged,
    /// The pieces, the baseline of this pack, and the entries left out.
    Pieces(Workspace, Baseline, Vec<Skipped>),
}

/// Packs `root` into pieces ([`Cutter`]). A piece whose stamp the `since` baseline holds is
/// named by stamp, not read; a piece with an entry too recent to vouch for has no stamp.
/// The tree is surveyed before it is read, so a change made during the pack shows next time;
/// a tree that breaks `limits` is refused then, before any of it is read.
pub fn pack_pieces(
    root: &Path,
    since: Option<&Baseline>,
    limits: Limits,
) -> Result<Packed, ArchiveError> {
    pack_pieces_within(root, since, RACY_WINDOW_NS, limits)
}

fn pack_pieces_within(
    root: &Path,
    since: Option<&Baseline>,
    racy_window_ns: i128,
    limits: Limits,
) -> Result<Packed, ArchiveError> {
    let root = Beneath::open(root)?;
    let survey = Survey::take(&root, racy_window_ns, limits)?;
    let mut digest = survey.digest();
    if digest.is_some() && since.is_some_and(|s| s.digest == digest) {
        return Ok(Packed::Unchanged);
    }
    let known: std::collections::HashSet<&str> = since
        .map(|s| s.stamps.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let mut pieces = Vec::new();
    let mut stamps = Vec::new();
    // What could not be read after the survey found it.
    let mut unread = Vec::new();
    for range in survey.pieces() {
        let entries = &survey.entries[range];
        let mut stamp = Survey::stamp(entries);
        if let Some(stamp) = &stamp
            && known.contains(stamp.as_str())
        {
            stamps.push(stamp.clone());
            pieces.push(Piece::Same {
                stamp: stamp.clone(),
            });
            continue;
        }
        let expected = entries.iter().map(|e| e.archive_bytes).sum::<u64>();
        let mut builder = tar::Builder::new(Vec::with_capacity(expected as usize + 1024));
        let mut as_surveyed = true;
        for e in entries {
            as_surveyed &= append(&mut builder, &root, &e.path, e.file, &mut unread)?;
        }
        // Changed since the survey: neither this piece nor the tree is vouched for.
        if !as_surveyed {
            stamp = None;
            digest = None;
        }
        if let Some(stamp) = &stamp {
            stamps.push(stamp.clone());
        }
        let mut bytes = builder.into_inner()?;
        // Pieces hold entries only; the end blocks close the whole archive.
        bytes.truncate(bytes.len() - ARCHIVE_END.len());
        pieces.push(Piece::Bytes { bytes, stamp });
    }
    Ok(Packed::Pieces(
        Workspace { pieces },
        Baseline { digest, stamps },
        survey.skipped.into_iter().chain(unread).collect(),
    ))
}

/// Unpack `archive` into `dest`, which must not exist yet; on any refusal `dest` is removed.
pub fn unpack(archive: &[u8], dest: &Path, limits: Limits) -> Result<(), ArchiveError> {
    std::fs::create_dir(dest)?;
    let outcome = walk(archive, Some(dest), limits, None).map(drop);
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
    let outcome = walk(archive, Some(dest), limits, Some(reuse)).map(drop);
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    outcome
}

/// Reads into `buf` until it is full or `r` ends; how many bytes were read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

/// Bytes compared or copied at once while placing a file.
const PLACE_BUFFER: usize = 256 << 10;

/// Writes the `size` bytes `data` yields as a new file at `target`; when the regular file
/// `same` holds exactly those bytes, it is hard-linked instead. The bytes are compared as they
/// arrive (never held whole): at the first difference, what matched is copied from `same` and
/// the rest written. Answers how many bytes `data` gave.
fn place(
    data: &mut impl Read,
    size: u64,
    target: &Path,
    same: Option<&Path>,
) -> std::io::Result<u64> {
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
    };
    let existing = same
        .filter(|same| {
            std::fs::symlink_metadata(same).is_ok_and(|m| m.is_file() && m.len() == size)
        })
        .and_then(|same| std::fs::File::open(same).ok().map(|f| (same, f)));
    let Some((same, mut existing)) = existing else {
        let mut file = create()?;
        let copied = std::io::copy(&mut data.take(size), &mut file)?;
        file.flush()?;
        return Ok(copied);
    };
    let mut data = data.take(size);
    let (mut incoming, mut held) = (vec![0u8; PLACE_BUFFER], vec![0u8; PLACE_BUFFER]);
    let mut matched = 0u64;
    loop {
        let n = fill(&mut data, &mut incoming)?;
        if n == 0 {
            if matched != size {
                return Ok(matched);
            }
            std::fs::hard_link(same, target)?;
            return Ok(size);
        }
        let m = fill(&mut existing, &mut held[..n])?;
        if m == n && incoming[..n] == held[..n] {
            matched += n as u64;
            continue;
        }
        // Different from here on: what matched comes from the copy, the rest from `data`.
        let mut file = create()?;
        let mut prefix = std::fs::File::open(same)?.take(matched);
        let copied = std::io::copy(&mut prefix, &mut file)?;
        if copied != matched {
            return Err(std::io::Error::other("the reused copy changed"));
        }
        file.write_all(&incoming[..n])?;
        let rest = std::io::copy(&mut data, &mut file)?;
        file.flush()?;
        return Ok(matched + n as u64 + rest);
    }
}

/// What an archive (or a piece of one) holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Entries (files and directories).
    pub entries: u64,
    /// Sum of file sizes.
    pub file_bytes: u64,
}

/// Check `archive` against every restore rule without writing anything: what [`unpack`]
/// would refuse, this refuses too (for an archive that is sealed but not unpacked here).
/// Also for a piece of an archive (whole entries, no end blocks): then the totals of the
/// pieces are checked against the limits by the caller.
pub fn check(archive: &[u8], limits: Limits) -> Result<Counts, ArchiveError> {
    walk(archive, None, limits, None)
}

/// Like [`check`], for an archive read as it arrives; reads `archive` to its end.
pub fn check_stream(mut archive: impl Read, limits: Limits) -> Result<Counts, ArchiveError> {
    let counts = walk(&mut archive, None, limits, None)?;
    std::io::copy(&mut archive, &mut std::io::sink())?;
    Ok(counts)
}

/// Like [`unpack_reusing`] (or [`unpack`] without `reuse`), for an archive read as it
/// arrives; reads `archive` to its end. On any refusal `dest` is removed.
pub fn unpack_stream(
    mut archive: impl Read,
    dest: &Path,
    limits: Limits,
    reuse: Option<&Path>,
) -> Result<Counts, ArchiveError> {
    std::fs::create_dir(dest)?;
    let outcome = walk(&mut archive, Some(dest), limits, reuse).and_then(|counts| {
        std::io::copy(&mut archive, &mut std::io::sink())?;
        Ok(counts)
    });
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    outcome
}

/// Reads every entry under the restore rules, writing it below `dest` when given (linking
/// identical files from `reuse` when given).
fn walk(
    archive: impl Read,
    dest: Option<&Path>,
    limits: Limits,
    reuse: Option<&Path>,
) -> Result<Counts, ArchiveError> {
    let refuse = |why: String| ArchiveError::Refused(why);
    let mut tree = Tree::default();
    let mut tally = Tally::new(limits);
    let mut reader = tar::Archive::new(archive);
    for entry in reader.entries().map_err(|e| refuse(e.to_string()))? {
        let mut entry = entry.map_err(|e| refuse(format!("unreadable entry: {e}")))?;
        let raw = String::from_utf8(entry.path_bytes().into_owned())
            .map_err(|_| refuse("path is not UTF-8".into()))?;
        let rel = segments(&raw, false).map_err(|e| refuse(format!("{raw:?}: {e}")))?;
        // The size the reader goes by: an extended header's, where there is one. Packing
        // never writes one, and a size of at most `max_file_bytes` always fits the header,
        // so one that differs is an archive meant to read one way and be counted another.
        let size = entry.size();
        if entry.header().entry_size().ok() != Some(size) {
            return Err(refuse(format!("{raw:?}: its sizes disagree")));
        }
        let target = dest.map(|d| rel.iter().fold(d.to_path_buf(), |p, s| p.join(s)));
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                tally.add(&raw, None)?;
                if size != 0 {
                    return Err(refuse(format!("{raw:?}: a folder with data")));
                }
                tree.folder(&rel)
                    .map_err(|why| refuse(format!("{raw:?}: {why}")))?;
                if let Some(target) = &target {
                    std::fs::create_dir_all(target)?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                tally.add(&raw, Some(size))?;
                tree.file(&rel)
                    .map_err(|why| refuse(format!("{raw:?}: {why}")))?;
                if let Some(parent) = target.as_deref().and_then(Path::parent) {
                    std::fs::create_dir_all(parent)?;
                }
                let copied = match &target {
                    // The same bytes in the reused copy: linked, not written.
                    Some(target) => {
                        let same =
                            reuse.map(|r| rel.iter().fold(r.to_path_buf(), |p, s| p.join(s)));
                        place(&mut entry, size, target, same.as_deref())?
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
    Ok(Counts {
        entries: tally.entries,
        file_bytes: tally.file_bytes,
    })
}

/// The paths an archive has named so far: one path is a folder or a file, never both, and a
/// file is named once.
#[derive(Default)]
struct Tree {
    folders: std::collections::HashSet<String>,
    files: std::collections::HashSet<String>,
}

impl Tree {
    /// `rel`'s parents are folders (as unpacking makes them): none of them may be a file.
    fn parents(&mut self, rel: &[String]) -> Result<(), &'static str> {
        let mut path = String::new();
        for segment in &rel[..rel.len().saturating_sub(1)] {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(segment);
            if self.files.contains(&path) {
                return Err("inside a file");
            }
            if !self.folders.contains(&path) {
                self.folders.insert(path.clone());
            }
        }
        Ok(())
    }

    fn folder(&mut self, rel: &[String]) -> Result<(), &'static str> {
        self.parents(rel)?;
        let path = rel.join("/");
        if self.files.contains(&path) {
            return Err("a file and a folder");
        }
        self.folders.insert(path);
        Ok(())
    }

    fn file(&mut self, rel: &[String]) -> Result<(), &'static str> {
        self.parents(rel)?;
        let path = rel.join("/");
        if self.folders.contains(&path) {
            return Err("a folder and a file");
        }
        if !self.files.insert(path) {
            return Err("appears twice");
        }
        Ok(())
    }
}

/// Cuts archive bytes (whole entries, perhaps followed by the end blocks) into pieces by the
/// [`Cutter`] rule, as byte ranges; the end blocks and anything after them are left out, as
/// every reader of the archive leaves them out. A header that does not parse ends the last
/// piece at the end of the bytes, for the restore rules to refuse.
pub fn cut(bytes: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut cutter = Cutter::default();
    let mut starts = vec![0];
    let mut end = 0;
    // Where a long-name or extended header that belongs to the next entry began.
    let mut lead: Option<usize> = None;
    let mut long_name: Option<&[u8]> = None;
    let mut at = 0;
    while let Some(block) = bytes.get(at..at + 512) {
        if block.iter().all(|b| *b == 0) {
            break;
        }
        let header = tar::Header::from_byte_slice(block);
        let Some(stop) = header
            .entry_size()
            .ok()
            .and_then(|size| usize::try_from(size.div_ceil(512) * 512).ok())
            .and_then(|data| (at + 512).checked_add(data))
            .filter(|stop| *stop <= bytes.len())
        else {
            end = bytes.len();
            break;
        };
        let kind = header.entry_type();
        let start = lead.take().unwrap_or(at);
        if kind.is_gnu_longname() {
            let name = &bytes[at + 512..stop];
            long_name = Some(name.split(|b| *b == 0).next().unwrap_or(name));
            lead = Some(start);
        } else if kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions()
        {
            lead = Some(start);
        } else {
            let name = long_name
                .take()
                .map_or_else(|| header.path_bytes(), Into::into);
            if cutter.starts_piece(&String::from_utf8_lossy(&name), (stop - start) as u64) {
                starts.push(start);
            }
            end = stop;
        }
        at = stop;
    }
    if lead.is_some() {
        end = bytes.len();
    }
    let mut ranges: Vec<_> = starts
        .windows(2)
        .map(|w| w[0]..w[1])
        .chain(starts.last().map(|s| *s..end))
        .collect();
    ranges.retain(|r| !r.is_empty());
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive a first pack's pieces (no baseline, so all bytes) make, end blocks included.
    fn joined(packed: Packed) -> (Vec<u8>, Vec<Skipped>) {
        let Packed::Pieces(workspace, _, skipped) = packed else {
            panic!("a first pack is never unchanged");
        };
        let mut archive: Vec<u8> = workspace
            .pieces
            .into_iter()
            .flat_map(|p| match p {
                Piece::Bytes { bytes, .. } => bytes,
                Piece::Same { .. } => unreachable!("no baseline"),
            })
            .collect();
        archive.extend_from_slice(&ARCHIVE_END);
        (archive, skipped)
    }

    /// The entries of an archive, by name, with their bytes.
    fn packed_entries(archive: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
        let mut out = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(archive).entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.insert(name, data);
        }
        out
    }

    fn small() -> Limits {
        Limits {
            max_total_bytes: 10 << 20,
            max_file_bytes: 4 << 20,
            max_entries: 8,
        }
    }

    fn refusal(packed: Result<Packed, ArchiveError>) -> String {
        match packed {
            Err(ArchiveError::Refused(why)) => why,
            Err(e) => panic!("not refused: {e}"),
            Ok(_) => panic!("packed"),
        }
    }

    /// What the bot can make with a few commands is judged by the walk: nothing is read (a
    /// terabyte that takes no disk would be a terabyte in memory) and the refusal says why.
    #[test]
    fn a_home_past_the_limits_is_refused_from_the_walk_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let huge = std::fs::File::create(root.join("huge.bin")).unwrap();
        huge.set_len(1 << 40).unwrap();
        let why = refusal(pack_pieces(root, None, small()));
        assert_eq!(why, "\"huge.bin\" is larger than 4194304 bytes");
        huge.set_len(4 << 20).unwrap();
        std::fs::write(root.join("more.bin"), vec![1u8; 3 << 20]).unwrap();
        std::fs::File::create(root.join("most.bin"))
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let why = refusal(pack_pieces(root, None, small()));
        assert_eq!(why, "more than 10485760 bytes in total");
        std::fs::remove_file(root.join("most.bin")).unwrap();
        assert!(pack_pieces(root, None, small()).is_ok());
        for i in 0..7 {
            std::fs::write(root.join(format!("f{i}")), b"").unwrap();
        }
        assert_eq!(
            refusal(pack_pieces(root, None, small())),
            "more than 8 entries"
        );
        std::fs::remove_file(root.join("f6")).unwrap();
        // A folder of more names than twice the limit is refused while it is listed.
        std::fs::create_dir(root.join("many")).unwrap();
        for i in 0..20 {
            std::os::unix::fs::symlink("/", root.join(format!("many/l{i}"))).unwrap();
        }
        assert_eq!(
            refusal(pack_pieces(root, None, small())),
            "more than 8 entries"
        );
    }

    /// A file that grew after the walk saw it is read only to the size the walk saw.
    #[test]
    fn a_file_grown_after_the_walk_keeps_the_size_the_walk_saw() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("grows.txt"), b"0123456789").unwrap();
        let root = Beneath::open(dir.path()).unwrap();
        let stat = rustix::fs::stat(dir.path().join("grows.txt")).unwrap();
        let m = Meta::of(&stat);
        let seen = Seen {
            id: (m.dev, m.ino),
            size: 4,
        };
        let mut builder = tar::Builder::new(Vec::new());
        let whole = append(
            &mut builder,
            &root,
            "grows.txt",
            Some(seen),
            &mut Vec::new(),
        );
        assert!(whole.unwrap(), "as long as the walk saw it");
        let archive = builder.into_inner().unwrap();
        assert_eq!(packed_entries(&archive)["grows.txt"], b"0123");
    }

    fn archive_of(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().unwrap()
    }

    fn entry(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }

    /// Archives the machine sends (a pod's, a vendor's) are read one way by every rule: a
    /// size in an extended header, a folder with data, one path as a file and a folder are
    /// refused by the check, as an unpack would refuse them.
    #[test]
    fn an_archive_meant_to_read_two_ways_is_refused() {
        use tar::EntryType::{Directory, Regular};
        let refused = |archive: Vec<u8>| match check(&archive, Limits::default()) {
            Err(ArchiveError::Refused(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        let pax_size = archive_of(|b| {
            entry(b, tar::EntryType::XHeader, "pax", b"13 size=4096\n");
            entry(b, Regular, "a.txt", b"");
            entry(b, Regular, "b.txt", &[0u8; 4096]);
        });
        assert_eq!(refused(pax_size), "\"a.txt\": its sizes disagree");
        let folder_with_data = archive_of(|b| entry(b, Directory, "d/", &[1u8; 1024]));
        assert_eq!(refused(folder_with_data), "\"d/\": a folder with data");
        let both = archive_of(|b| {
            entry(b, Directory, "a/", b"");
            entry(b, Regular, "a", b"x");
        });
        assert_eq!(refused(both), "\"a\": a folder and a file");
        let under_a_file = archive_of(|b| {
            entry(b, Regular, "a", b"x");
            entry(b, Regular, "a/b", b"y");
        });
        assert_eq!(refused(under_a_file), "\"a/b\": inside a file");
        let file_then_folder = archive_of(|b| {
            entry(b, Regular, "a", b"x");
            entry(b, Directory, "a/", b"");
        });
        assert_eq!(refused(file_then_folder), "\"a/\": a file and a folder");
        let twice = archive_of(|b| {
            entry(b, Regular, "a", b"x");
            entry(b, Regular, "a", b"y");
        });
        assert_eq!(refused(twice), "\"a\": appears twice");
        // Folders named again, and files in folders named or not, are fine.
        let fine = archive_of(|b| {
            entry(b, Directory, "a/", b"");
            entry(b, Directory, "a/", b"");
            entry(b, Regular, "a/b", b"x");
            entry(b, Regular, "c/d/e", b"y");
            entry(b, Directory, "c/d/", b"");
        });
        let counts = check(&fine, Limits::default()).unwrap();
        assert_eq!((counts.entries, counts.file_bytes), (5, 2));
    }

    /// A folder moved during the walk into one not walked yet shows a linked file's name
    /// twice: still one name, so a file whose other name is a host file is left out.
    #[test]
    fn a_name_found_twice_by_a_moved_folder_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir_all(root.join("a/sub")).unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::fs::write(dir.path().join("host.key"), b"host secret").unwrap();
        std::fs::hard_link(dir.path().join("host.key"), root.join("a/stolen")).unwrap();
        let beneath = Beneath::open(&root).unwrap();
        let mut files = Vec::new();
        let left = visit(&beneath, 100, &mut Vec::new(), |found| {
            if found.path == "a/sub" {
                std::fs::rename(root.join("a"), root.join("b/a")).unwrap();
            }
            if !found.dir {
                files.push(found.path.to_owned());
            }
            Ok(())
        })
        .unwrap();
        assert!(files.is_empty(), "{files:?}");
        assert_eq!(left.hard_links, 2);
    }

    #[test]
    fn a_file_linked_twice_inside_is_kept_and_one_linked_from_outside_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir_all(root.join("venv")).unwrap();
        std::fs::write(dir.path().join("host.key"), b"host secret").unwrap();
        std::fs::write(root.join("cache.bin"), b"shared bytes").unwrap();
        // Both names inside (a package manager's cache and an environment): kept, twice.
        std::fs::hard_link(root.join("cache.bin"), root.join("venv/lib.bin")).unwrap();
        // One name outside: its other name may be a host file, so it is left out.
        std::fs::hard_link(dir.path().join("host.key"), root.join("stolen")).unwrap();
        let entries = packed_entries(&pack(&root).unwrap());
        assert_eq!(entries["cache.bin"], b"shared bytes");
        assert_eq!(entries["venv/lib.bin"], b"shared bytes");
        assert!(!entries.contains_key("stolen"), "{:?}", entries.keys());
        // The pieces hold the same entries.
        let (pieces, _) = joined(pack_pieces_within(&root, None, 0, Limits::default()).unwrap());
        assert_eq!(packed_entries(&pieces), entries);
    }

    #[test]
    fn files_and_folders_this_process_may_not_read_are_skipped_and_reported() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        std::fs::create_dir_all(root.join("locked")).unwrap();
        std::fs::write(root.join("kept.txt"), b"kept").unwrap();
        std::fs::write(root.join("secret.txt"), b"x").unwrap();
        std::fs::write(root.join("locked/inner.txt"), b"y").unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        };
        mode(dir.path(), 0o755);
        mode(&root, 0o755);
        mode(&root.join("kept.txt"), 0o644);
        mode(&root.join("secret.txt"), 0o000);
        mode(&root.join("locked"), 0o000);
        let pack = move || pack_pieces_within(&root, None, 0, Limits::default()).unwrap();
        // As root, modes bind nobody: pack from a thread that is another user.
        let packed = if rustix::process::geteuid().is_root() {
            std::thread::spawn(move || {
                rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(65534)).unwrap();
                pack()
            })
            .join()
            .unwrap()
        } else {
            pack()
        };
        let (archive, skipped) = joined(packed);
        let reported: Vec<(&str, &str)> = skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert!(
            reported.contains(&("secret.txt", "cannot be read: permission denied")),
            "{reported:?}"
        );
        assert!(
            reported.contains(&("locked", "folder cannot be read: permission denied")),
            "{reported:?}"
        );
        let entries = packed_entries(&archive);
        assert_eq!(entries["kept.txt"], b"kept");
        assert!(!entries.contains_key("secret.txt"), "{:?}", entries.keys());
    }

    #[test]
    fn names_the_store_cannot_hold_are_skipped_and_reported() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("kept.txt"), b"kept").unwrap();
        std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"bad-\xff")), b"x").unwrap();
        let mut deep = root.to_path_buf();
        while deep.as_os_str().len() < root.as_os_str().len() + MAX_PATH_BYTES + 10 {
            deep.push("d".repeat(200));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let (archive, skipped) =
            joined(pack_pieces_within(root, None, 0, Limits::default()).unwrap());
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert!(reasons.contains(&"name is not UTF-8"), "{reasons:?}");
        assert!(
            reasons.iter().any(|r| r.starts_with("path longer than")),
            "{reasons:?}"
        );
        assert_eq!(packed_entries(&archive)["kept.txt"], b"kept");
    }

    #[test]
    fn fingerprints_follow_what_a_pack_would_hold() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        std::fs::create_dir_all(root.join(".browser-profiles/b1/Cache")).unwrap();
        std::fs::write(root.join("notes/a.txt"), b"first").unwrap();
        let beneath = Beneath::open(root).unwrap();
        let print = || {
            Survey::take(&beneath, 0, Limits::default())
                .unwrap()
                .digest()
                .unwrap()
        };
        let first = print();
        assert_eq!(print(), first, "nothing changed");
        // A transient browser file is not part of a workspace.
        std::fs::write(root.join(".browser-profiles/b1/Cache/x"), b"junk").unwrap();
        assert_eq!(print(), first);
        // Nor is a spare desktop's profile, which no bot owns.
        std::fs::create_dir_all(root.join(".browser-profiles/.spare-1/Default")).unwrap();
        std::fs::write(root.join(".browser-profiles/.spare-1/Default/x"), b"spare").unwrap();
        assert_eq!(print(), first);
        // Same size, new bytes: the times show it.
        std::fs::write(root.join("notes/a.txt"), b"other").unwrap();
        let second = print();
        assert_ne!(second, first);
        std::fs::create_dir(root.join("empty")).unwrap();
        assert_ne!(print(), second, "a new directory is part of the archive");
        // Just written: too recent to vouch for.
        let survey = Survey::take(&beneath, RACY_WINDOW_NS, Limits::default()).unwrap();
        assert_eq!(survey.digest(), None);
        let size = pack(root).unwrap().len() as u64;
        let estimate = 1024 + survey.entries.iter().map(|e| e.archive_bytes).sum::<u64>();
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

    /// A tree of `dirs` directories of `files` files of `size` bytes each, plus `large`.
    fn tree(root: &Path, dirs: usize, files: usize, size: usize, large: usize) {
        for d in 0..dirs {
            let dir = root.join(format!("dir-{d:03}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..files {
                std::fs::write(dir.join(format!("f-{f:03}")), vec![(d + f) as u8; size]).unwrap();
            }
        }
        std::fs::write(root.join("large.bin"), vec![7u8; large]).unwrap();
    }

    fn pieces(root: &Path, since: Option<&Baseline>) -> (Workspace, Baseline) {
        match pack_pieces_within(root, since, 0, Limits::default()).unwrap() {
            Packed::Pieces(workspace, baseline, _) => (workspace, baseline),
            Packed::Unchanged => panic!("unexpectedly unchanged"),
        }
    }

    #[test]
    fn pieces_make_the_same_archive_and_only_changed_ones_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // 12 directories of 160 KiB (cut together up to 1 MiB), one file above the maximum.
        tree(root, 12, 10, 16 << 10, (PIECE_MAX + 1000) as usize);
        let (first, baseline) = pieces(root, None);
        assert!(first.pieces.len() >= 3, "{} pieces", first.pieces.len());
        assert_eq!(baseline.stamps.len(), first.pieces.len());
        assert_eq!(first.clone().into_archive().unwrap(), pack(root).unwrap());
        // A received archive is cut where the tree was.
        let archive = pack(root).unwrap();
        let cuts: Vec<usize> = cut(&archive).iter().map(|r| r.len()).collect();
        let lens: Vec<usize> = first
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Bytes { bytes, .. } => bytes.len(),
                Piece::Same { .. } => unreachable!(),
            })
            .collect();
        assert_eq!(cuts, lens);
        // Nothing changed: nothing read.
        assert!(matches!(
            pack_pieces_within(root, Some(&baseline), 0, Limits::default()).unwrap(),
            Packed::Unchanged
        ));
        // One file changed: its piece alone is read again.
        std::fs::write(root.join("dir-005/f-003"), b"changed").unwrap();
        let (second, _) = pieces(root, Some(&baseline));
        let read: Vec<&Vec<u8>> = second
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Bytes { bytes, .. } => Some(bytes),
                Piece::Same { .. } => None,
            })
            .collect();
        assert_eq!(read.len(), 1, "one piece read again");
        assert!(read[0].windows(7).any(|w| w == b"changed"));
        assert_eq!(second.pieces.len(), first.pieces.len());
        // A change too recent to vouch for leaves its piece unstamped.
        match pack_pieces(root, Some(&baseline), Limits::default()).unwrap() {
            Packed::Pieces(w, b, _) => {
                assert!(
                    w.pieces
                        .iter()
                        .any(|p| matches!(p, Piece::Bytes { stamp: None, .. }))
                );
                assert_eq!(b.digest, None);
            }
            Packed::Unchanged => panic!("a fresh change went unseen"),
        }
    }

    #[test]
    fn baselines_read_back_and_a_bare_digest_is_a_baseline_without_stamps() {
        let b = Baseline {
            digest: Some("abc".into()),
            stamps: vec!["s1".into()],
        };
        assert_eq!(Baseline::parse(&b.encode()), b);
        assert_eq!(
            Baseline::parse("deadbeef"),
            Baseline {
                digest: Some("deadbeef".into()),
                stamps: Vec::new()
            }
        );
    }

    #[test]
    fn a_cut_keeps_long_names_with_their_entry_and_ends_at_the_end_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let long = "n".repeat(150);
        for d in 0..3 {
            let sub = root.join(format!("d{d}"));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(&long), vec![1u8; (PIECE_MIN as usize) / 2 + 10]).unwrap();
            std::fs::write(sub.join("short"), vec![2u8; (PIECE_MIN as usize) / 2]).unwrap();
        }
        let mut archive = pack(root).unwrap();
        archive.extend_from_slice(b"trailing bytes after the end blocks are not read");
        let ranges = cut(&archive);
        assert!(ranges.len() >= 2);
        for range in &ranges {
            // Every piece reads on its own: whole entries, long names with their entry.
            let counts = check(&archive[range.clone()], Limits::default()).unwrap();
            assert!(counts.entries >= 1);
        }
        let total: u64 = ranges
            .iter()
            .map(|r| {
                check(&archive[r.clone()], Limits::default())
                    .unwrap()
                    .entries
            })
            .sum();
        assert_eq!(total, 9);
        let end = ranges.last().unwrap().end;
        assert!(archive[end..end + 1024].iter().all(|b| *b == 0));
    }
}
