//! The local home store: sealed revisions, staged swaps that survive a crash, retention, and
//! refusal of every hostile archive with the previous workspace intact.

use std::path::Path;
use std::process::Command;

use rakazo::stores::archive::{Limits, pack};
use rakazo::stores::local::{CRASH_AT_ENV, LocalHomeStore};
use rakazo_actors::home_store::{HomeId, HomeStore, StoreError};

fn home(key: &str) -> HomeId {
    HomeId {
        home_key: key.into(),
        storage_id: format!("storage-{key}"),
        data_key: [9; 32],
    }
}

/// A tar archive built entry by entry, so hostile shapes can be made.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Tar(tar::Builder::new(Vec::new()))
    }
    fn file(mut self, path: &str, data: &[u8]) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        // Write the raw name so `..` and absolute paths reach the store unchanged.
        let name = h.as_old_mut().name.as_mut();
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }
    fn special(mut self, path: &str, kind: tar::EntryType, target: &str) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_path(path).unwrap();
        if !target.is_empty() {
            h.set_link_name(target).unwrap();
        }
        h.set_cksum();
        self.0.append(&h, std::io::empty()).unwrap();
        self
    }
    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn store(dir: &Path, limits: Limits) -> LocalHomeStore {
    LocalHomeStore::new(dir, 3, limits)
}

#[actix_rt::test]
async fn revisions_round_trip_and_only_the_last_ones_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let h = home("team-a");
    for rev in 1..=5 {
        let archive = Tar::new()
            .file("notes.txt", format!("rev {rev}").as_bytes())
            .bytes();
        s.save(&h, rev, archive.clone().into(), true).await.unwrap();
    }
    assert_eq!(s.revisions(&h).await.unwrap(), vec![3, 4, 5]);
    assert_eq!(s.load(&h, 2).await, Err(StoreError::NotFound));
    let latest = s.latest().path("team-a").unwrap();
    assert_eq!(read(&latest.join("notes.txt")), "rev 5");
    // An older kept revision still opens.
    let old = s.load(&h, 3).await.unwrap();
    let unpacked = dir.path().join("check");
    rakazo::stores::archive::unpack(&old, &unpacked, Limits::default()).unwrap();
    assert_eq!(read(&unpacked.join("notes.txt")), "rev 3");
    // Sealed at rest: the plaintext is not in the stored file.
    let sealed = std::fs::read(dir.path().join("home-revisions/storage-team-a/5.sealed")).unwrap();
    assert!(!sealed.windows(5).any(|w| w == b"rev 5"));
}

/// The latest copy is stamped with the revision it holds: settling it on the revision the
/// database recorded makes it that revision again when the stamp names another (a save the
/// database never recorded) or none, and leaves it alone when it already holds it.
#[actix_rt::test]
async fn the_latest_copy_is_settled_on_the_recorded_revision() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let h = home("team-s");
    for rev in 1..=2 {
        let archive = Tar::new()
            .file("notes.txt", format!("rev {rev}").as_bytes())
            .bytes();
        s.save(&h, rev, archive.into(), true).await.unwrap();
    }
    let latest = s.latest().path("team-s").unwrap();
    let stamp = s.latest().revision_stamp("team-s").unwrap();
    assert_eq!(read(&stamp), "storage-team-s:2");
    assert!(
        !s.settle_latest(&h, 2).await.unwrap(),
        "already the recorded one"
    );
    // Revision 2 was stored and swapped in, but the database still names 1.
    assert!(s.settle_latest(&h, 1).await.unwrap());
    assert_eq!(read(&latest.join("notes.txt")), "rev 1");
    assert_eq!(read(&stamp), "storage-team-s:1");
    assert!(!s.settle_latest(&h, 1).await.unwrap());
    // A copy nothing stamped is made again; another computer's stamp is not this one's.
    std::fs::write(latest.join("notes.txt"), "unknown").unwrap();
    std::fs::remove_file(&stamp).unwrap();
    assert!(s.settle_latest(&h, 1).await.unwrap());
    assert_eq!(read(&latest.join("notes.txt")), "rev 1");
    std::fs::write(&stamp, "storage-other:1").unwrap();
    assert!(s.settle_latest(&h, 1).await.unwrap());
    // Nothing recorded: no copy.
    assert!(s.settle_latest(&h, 0).await.unwrap());
    assert!(!latest.exists() && !stamp.exists());
    assert!(!s.settle_latest(&h, 0).await.unwrap());
}

#[actix_rt::test]
async fn hostile_archives_are_refused_and_the_previous_workspace_stays() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_total_bytes: 1000,
        max_file_bytes: 600,
        max_entries: 10,
    };
    let s = store(dir.path(), limits);
    let h = home("team-b");
    s.save(
        &h,
        1,
        Tar::new().file("keep.txt", b"good").bytes().into(),
        true,
    )
    .await
    .unwrap();
    let many = (0..11).fold(Tar::new(), |t, i| t.file(&format!("f{i}"), b"x"));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "parent path",
            Tar::new().file("../escape.txt", b"x").bytes(),
        ),
        (
            "nested parent path",
            Tar::new().file("a/../../escape.txt", b"x").bytes(),
        ),
        (
            "absolute path",
            Tar::new().file("/etc/cron.d/x", b"x").bytes(),
        ),
        (
            "symlink",
            Tar::new()
                .special("link", tar::EntryType::Symlink, "/etc/passwd")
                .bytes(),
        ),
        (
            "hard link",
            Tar::new()
                .file("a", b"x")
                .special("b", tar::EntryType::Link, "a")
                .bytes(),
        ),
        (
            "char device",
            Tar::new().special("dev", tar::EntryType::Char, "").bytes(),
        ),
        (
            "fifo",
            Tar::new().special("fifo", tar::EntryType::Fifo, "").bytes(),
        ),
        ("oversize file", Tar::new().file("big", &[0u8; 700]).bytes()),
        (
            "oversize total",
            Tar::new()
                .file("a", &[0u8; 500])
                .file("b", &[0u8; 501])
                .bytes(),
        ),
        ("too many entries", many.bytes()),
        (
            "garbage",
            b"not a tar archive at all, but long enough to look like a header".repeat(20),
        ),
    ];
    for (what, archive) in cases {
        // Refused whether the copy is to be swapped in or only sealed (a mounted home).
        for replace_latest in [true, false] {
            let outcome = s.save(&h, 2, archive.clone().into(), replace_latest).await;
            assert!(
                matches!(outcome, Err(StoreError::Rejected(_))),
                "{what} (replace_latest {replace_latest}): {outcome:?}"
            );
        }
        let latest = s.latest().path("team-b").unwrap();
        assert_eq!(read(&latest.join("keep.txt")), "good", "{what}");
        assert_eq!(std::fs::read_dir(&latest).unwrap().count(), 1, "{what}");
        assert_eq!(s.revisions(&h).await.unwrap(), vec![1], "{what}");
        assert!(
            !dir.path().join("escape.txt").exists()
                && !dir.path().join("homes/escape.txt").exists()
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("homes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| {
            let n = n.to_string_lossy();
            !n.starts_with(".digest-") && !n.starts_with(".revision-")
        })
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("team-b")],
        "no staging directory is left behind"
    );
}

/// The names of a home's stored chunks.
fn chunk_files(dir: &Path, storage_id: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> =
        std::fs::read_dir(dir.join(format!("home-revisions/{storage_id}/chunks")))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
    files.sort();
    files
}

#[actix_rt::test]
async fn a_tampered_stored_revision_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let (a, b) = (home("a"), home("b"));
    let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let archive = |text: &str| {
        Tar::new()
            .file("note.txt", text.as_bytes())
            .file("data.bin", &big)
            .bytes()
    };
    s.save(&a, 1, archive("one").into(), true).await.unwrap();
    let a1_chunks = chunk_files(dir.path(), "storage-a");
    s.save(&a, 2, archive("two").into(), true).await.unwrap();
    s.save(&b, 1, archive("two").into(), true).await.unwrap();
    let a2_chunk = chunk_files(dir.path(), "storage-a")
        .into_iter()
        .find(|f| !a1_chunks.contains(f))
        .expect("revision 2 stored a chunk of its own");
    let (a1_chunk, b1_chunk) = (
        a1_chunks[0].clone(),
        chunk_files(dir.path(), "storage-b")[0].clone(),
    );
    let manifest = |h: &str, rev: i64| {
        dir.path()
            .join(format!("home-revisions/storage-{h}/{rev}.sealed"))
    };
    let read = |p: &Path| std::fs::read(p).unwrap();
    let (original_manifest, original_chunk) = (read(&manifest("a", 2)), read(&a2_chunk));
    let flip = |bytes: &[u8], at: usize| {
        let mut out = bytes.to_vec();
        out[at] ^= 1;
        out
    };
    // Chunk layout: header, then segments of 64 KiB + 16-byte tags.
    let (header, seg) = (4 + 1 + 4 + 2 + "storage-a".len() + 2 + 64 + 16, 65536 + 16);
    assert!(
        original_chunk.len() > header + 3 * seg,
        "the chunk spans several segments"
    );
    let mut reordered = original_chunk[..header].to_vec();
    reordered.extend_from_slice(&original_chunk[header + seg..header + 2 * seg]);
    reordered.extend_from_slice(&original_chunk[header..header + seg]);
    reordered.extend_from_slice(&original_chunk[header + 2 * seg..]);
    let mut spliced = original_chunk.clone();
    spliced[header + seg..header + 2 * seg]
        .copy_from_slice(&read(&a1_chunk)[header + seg..header + 2 * seg]);
    let m2 = manifest("a", 2);
    let cases: Vec<(&str, &Path, Option<Vec<u8>>)> = vec![
        (
            "manifest: flipped byte",
            &m2,
            Some(flip(&original_manifest, original_manifest.len() / 2)),
        ),
        (
            "manifest: truncated",
            &m2,
            Some(original_manifest[..original_manifest.len() - 20].to_vec()),
        ),
        (
            "manifest: another revision's",
            &m2,
            Some(read(&manifest("a", 1))),
        ),
        (
            "manifest: another home's",
            &m2,
            Some(read(&manifest("b", 1))),
        ),
        (
            "chunk: flipped byte",
            &a2_chunk,
            Some(flip(&original_chunk, original_chunk.len() / 2)),
        ),
        (
            "chunk: truncated at a segment boundary",
            &a2_chunk,
            Some(original_chunk[..header + 2 * seg].to_vec()),
        ),
        ("chunk: reordered segments", &a2_chunk, Some(reordered)),
        (
            "chunk: a segment of another chunk",
            &a2_chunk,
            Some(spliced),
        ),
        (
            "chunk: another revision's chunk",
            &a2_chunk,
            Some(read(&a1_chunk)),
        ),
        (
            "chunk: the same bytes of another home",
            &a2_chunk,
            Some(read(&b1_chunk)),
        ),
        ("chunk: missing", &a2_chunk, None),
    ];
    for (what, path, bytes) in cases {
        match bytes {
            Some(bytes) => std::fs::write(path, &bytes).unwrap(),
            None => std::fs::remove_file(path).unwrap(),
        }
        let outcome = s.load(&a, 2).await;
        assert!(
            matches!(outcome, Err(StoreError::Rejected(_))),
            "{what}: {outcome:?}"
        );
        std::fs::write(manifest("a", 2), &original_manifest).unwrap();
        std::fs::write(&a2_chunk, &original_chunk).unwrap();
    }
    assert_eq!(s.load(&a, 2).await.unwrap(), archive("two"));
    assert_eq!(s.load(&a, 1).await.unwrap(), archive("one"));
    // The wrong key never opens it.
    let stranger = HomeId {
        data_key: [1; 32],
        ..home("a")
    };
    assert!(matches!(
        s.load(&stranger, 2).await,
        Err(StoreError::Rejected(_))
    ));
}

#[actix_rt::test]
async fn packing_skips_only_transient_browser_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    for (path, data) in [
        (
            ".browser-profiles/bot-1/Default/Cookies",
            "live cookie database",
        ),
        (
            ".browser-profiles/bot-1/Default/Saved Cookies.json",
            "cookies",
        ),
        (".browser-profiles/bot-1/SingletonLock", "lock"),
        ("projects/Cookies", "a project file named like the database"),
        (".browser-profiles/bot-1/Default/Cache/data_0", "cache"),
        ("projects/SingletonLock", "a project file with that name"),
        ("projects/Cache/notes.md", "kept"),
    ] {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    let archive = pack(&root).unwrap();
    let out = dir.path().join("out");
    rakazo::stores::archive::unpack(&archive, &out, Limits::default()).unwrap();
    // Chromium's live cookie database is left out: the DevTools snapshot stands in for it.
    assert!(!out.join(".browser-profiles/bot-1/Default/Cookies").exists());
    assert_eq!(
        read(&out.join(".browser-profiles/bot-1/Default/Saved Cookies.json")),
        "cookies"
    );
    assert_eq!(
        read(&out.join("projects/Cookies")),
        "a project file named like the database"
    );
    assert!(!out.join(".browser-profiles/bot-1/SingletonLock").exists());
    assert!(!out.join(".browser-profiles/bot-1/Default/Cache").exists());
    assert_eq!(
        read(&out.join("projects/SingletonLock")),
        "a project file with that name"
    );
    assert_eq!(read(&out.join("projects/Cache/notes.md")), "kept");
    assert!(
        !out.join("link").exists(),
        "links are not part of a workspace"
    );
}

/// The child side of the crash tests: saves revision 2 with a crash point armed.
#[actix_rt::test]
async fn crash_child() {
    let Ok(dir) = std::env::var("RAKAZO_CRASH_CHILD_DIR") else {
        return;
    };
    let s = store(Path::new(&dir), Limits::default());
    let archive = Tar::new()
        .file("a.txt", b"new a")
        .file("b.txt", b"new b")
        .bytes();
    let _ = s
        .save(&home("crash"), 2, archive.clone().into(), true)
        .await;
}

#[actix_rt::test]
async fn a_crash_between_staging_and_swap_leaves_old_or_new_never_a_mix() {
    for point in ["home.before_swap", "home.mid_swap"] {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), Limits::default());
        let old = Tar::new()
            .file("a.txt", b"old a")
            .file("only-old.txt", b"old")
            .bytes();
        s.save(&home("crash"), 1, old.clone().into(), true)
            .await
            .unwrap();
        let status = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env("RAKAZO_CRASH_CHILD_DIR", dir.path())
            .env(CRASH_AT_ENV, point)
            .status()
            .unwrap();
        assert!(!status.success(), "{point}: the child must have crashed");
        // The next use of the home rolls an interrupted swap back.
        s.load(&home("crash"), 1).await.unwrap();
        let latest = s.latest().path("crash").unwrap();
        assert_eq!(read(&latest.join("a.txt")), "old a", "{point}");
        assert!(
            latest.join("only-old.txt").exists() && !latest.join("b.txt").exists(),
            "{point}"
        );
        // And the next save succeeds normally.
        let new = Tar::new().file("a.txt", b"new a").bytes();
        s.save(&home("crash"), 2, new.clone().into(), true)
            .await
            .unwrap();
        assert_eq!(read(&latest.join("a.txt")), "new a");
    }
}

#[actix_rt::test]
async fn an_unchanged_workspace_is_sealed_again_but_not_restaged() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let h = home("team-u");
    let first = Tar::new().file("notes/a.txt", b"same").bytes();
    s.save(&h, 1, first.clone().into(), true).await.unwrap();
    let latest = s.latest().path("team-u").unwrap();
    let inode = std::fs::metadata(&latest).unwrap().ino();
    // The same bytes again: a new sealed revision, the same unpacked copy.
    s.save(&h, 2, first.clone().into(), true).await.unwrap();
    assert_eq!(s.revisions(&h).await.unwrap(), vec![1, 2]);
    assert_eq!(std::fs::metadata(&latest).unwrap().ino(), inode);
    assert_eq!(read(&latest.join("notes/a.txt")), "same");
    // Changed bytes are staged and swapped in as before.
    let second = Tar::new().file("notes/a.txt", b"changed").bytes();
    s.save(&h, 3, second.clone().into(), true).await.unwrap();
    assert_ne!(std::fs::metadata(&latest).unwrap().ino(), inode);
    assert_eq!(read(&latest.join("notes/a.txt")), "changed");
    // A copy that went missing is restaged even for the same bytes.
    std::fs::remove_dir_all(&latest).unwrap();
    s.save(&h, 4, second.clone().into(), true).await.unwrap();
    assert_eq!(read(&latest.join("notes/a.txt")), "changed");
}

#[actix_rt::test]
async fn pieces_the_last_revision_holds_are_named_not_stored_again() {
    use rakazo::stores::archive::{Packed, pack_pieces};
    use rakazo_actors::workspace::Piece;
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let h = home("pieces");
    let root = dir.path().join("work");
    for d in 0..3 {
        let sub = root.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("data.bin"), vec![d as u8; 3 << 20]).unwrap();
    }
    // Files older than the window a stamp withholds, as a workspace between runs is.
    let settle = || std::thread::sleep(std::time::Duration::from_millis(2100));
    settle();
    let pack = |since| match pack_pieces(&root, since, Limits::default()).unwrap() {
        Packed::Pieces(workspace, baseline, _) => (workspace, baseline),
        Packed::Unchanged => panic!("unchanged"),
    };
    let (first, baseline) = pack(None);
    let first_saved = s.save(&h, 1, first.clone(), false).await.unwrap();
    assert!(first_saved.stored_bytes > 9 << 20);
    // One file changed: only its piece is read and stored; the rest is named.
    std::fs::write(root.join("d1/data.bin"), vec![9u8; 3 << 20]).unwrap();
    settle();
    let (second, _) = pack(Some(&baseline));
    let named = second
        .pieces
        .iter()
        .filter(|p| matches!(p, Piece::Same { .. }))
        .count();
    assert!(named >= 2, "{named} pieces named");
    let saved = s.save(&h, 2, second, false).await.unwrap();
    assert!(
        saved.stored_bytes < 4 << 20,
        "stored {} bytes",
        saved.stored_bytes
    );
    assert_eq!(saved.archive_bytes, first_saved.archive_bytes);
    let loaded = s.load(&h, 2).await.unwrap();
    assert_eq!(loaded, rakazo::stores::archive::pack(&root).unwrap());
    assert_eq!(s.load(&h, 1).await.unwrap(), first.into_archive().unwrap());
    // A piece no kept revision holds is stale: the caller exports every byte instead.
    let stale = rakazo_actors::workspace::Workspace {
        pieces: vec![Piece::Same {
            stamp: "never-stored".into(),
        }],
    };
    assert!(matches!(
        s.save(&h, 3, stale, false).await,
        Err(StoreError::Stale(_))
    ));
    assert_eq!(s.revisions(&h).await.unwrap(), vec![1, 2]);
}

#[actix_rt::test]
async fn chunks_stay_while_a_kept_revision_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalHomeStore::new(dir.path(), 2, Limits::default());
    let h = home("gc");
    let archive = |text: &str| Tar::new().file("note.txt", text.as_bytes()).bytes();
    s.save(&h, 1, archive("one").into(), false).await.unwrap();
    s.save(&h, 2, archive("two").into(), false).await.unwrap();
    let manifest = dir.path().join("home-revisions/storage-gc/2.sealed");
    let original = std::fs::read(&manifest).unwrap();
    std::fs::write(&manifest, b"unreadable for now").unwrap();
    // Revision 1 expires; revision 2's chunk is named only by the manifest that cannot be
    // read, so no chunk is deleted.
    s.save(&h, 3, archive("three").into(), false).await.unwrap();
    std::fs::write(&manifest, &original).unwrap();
    assert_eq!(s.revisions(&h).await.unwrap(), vec![2, 3]);
    assert_eq!(s.load(&h, 2).await.unwrap(), archive("two"));
    // Once every kept revision reads again, unnamed chunks go.
    s.save(&h, 4, archive("four").into(), false).await.unwrap();
    assert_eq!(chunk_files(dir.path(), "storage-gc").len(), 2);
    assert_eq!(s.load(&h, 3).await.unwrap(), archive("three"));
}
