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
        s.save(&h, rev, archive.clone(), true).await.unwrap();
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
    s.save(&h, 1, Tar::new().file("keep.txt", b"good").bytes(), true)
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
            let outcome = s.save(&h, 2, archive.clone(), replace_latest).await;
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
        .filter(|n| !n.to_string_lossy().starts_with(".digest-"))
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("team-b")],
        "no staging directory is left behind"
    );
}

#[actix_rt::test]
async fn a_tampered_stored_revision_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), Limits::default());
    let (a, b) = (home("a"), home("b"));
    let big: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let archive = Tar::new().file("data.bin", &big).bytes();
    s.save(&a, 1, archive.clone(), true).await.unwrap();
    s.save(&a, 2, archive.clone(), true).await.unwrap();
    s.save(&b, 1, archive.clone(), true).await.unwrap();
    let path = |h: &str, rev: i64| {
        dir.path()
            .join(format!("home-revisions/storage-{h}/{rev}.sealed"))
    };
    let original = std::fs::read(path("a", 2)).unwrap();
    let mut flipped = original.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 1;
    let truncated = original[..original.len() - 1000].to_vec();
    // Another revision's and another home's objects in this revision's place.
    let other_revision = std::fs::read(path("a", 1)).unwrap();
    let other_home = std::fs::read(path("b", 1)).unwrap();
    for (what, bytes) in [
        ("flip", flipped),
        ("truncated", truncated),
        ("other revision", other_revision),
        ("other home", other_home),
    ] {
        std::fs::write(path("a", 2), &bytes).unwrap();
        let outcome = s.load(&a, 2).await;
        assert!(
            matches!(outcome, Err(StoreError::Rejected(_))),
            "{what}: {outcome:?}"
        );
    }
    std::fs::write(path("a", 2), &original).unwrap();
    assert_eq!(s.load(&a, 2).await.unwrap(), archive);
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
        (".browser-profiles/bot-1/Default/Cookies", "cookies"),
        (".browser-profiles/bot-1/SingletonLock", "lock"),
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
    assert_eq!(
        read(&out.join(".browser-profiles/bot-1/Default/Cookies")),
        "cookies"
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
    let _ = s.save(&home("crash"), 2, archive.clone(), true).await;
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
        s.save(&home("crash"), 1, old.clone(), true).await.unwrap();
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
        s.save(&home("crash"), 2, new.clone(), true).await.unwrap();
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
    s.save(&h, 1, first.clone(), true).await.unwrap();
    let latest = s.latest().path("team-u").unwrap();
    let inode = std::fs::metadata(&latest).unwrap().ino();
    // The same bytes again: a new sealed revision, the same unpacked copy.
    s.save(&h, 2, first.clone(), true).await.unwrap();
    assert_eq!(s.revisions(&h).await.unwrap(), vec![1, 2]);
    assert_eq!(std::fs::metadata(&latest).unwrap().ino(), inode);
    assert_eq!(read(&latest.join("notes/a.txt")), "same");
    // Changed bytes are staged and swapped in as before.
    let second = Tar::new().file("notes/a.txt", b"changed").bytes();
    s.save(&h, 3, second.clone(), true).await.unwrap();
    assert_ne!(std::fs::metadata(&latest).unwrap().ino(), inode);
    assert_eq!(read(&latest.join("notes/a.txt")), "changed");
    // A copy that went missing is restaged even for the same bytes.
    std::fs::remove_dir_all(&latest).unwrap();
    s.save(&h, 4, second.clone(), true).await.unwrap();
    assert_eq!(read(&latest.join("notes/a.txt")), "changed");
}
