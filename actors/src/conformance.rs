//! The provider conformance suite: one generic set of checks every `SandboxProvider` must
//! pass. A backend's test file instantiates it with [`conformance_suite!`], which turns each
//! check into its own test.
//!
//! Commands stay within a small POSIX subset (`echo`, `cat`, `exit`, `sleep`, `ln [-s]`,
//! `mkfifo`, redirections) so that emulated shells and real ones answer alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::provider::{
    Action, Button, ExecRequest, ListingRange, MachineSpec, ProviderError, ProviderRef,
    SandboxProvider, WorkspaceExport,
};
use crate::workspace::Piece;

/// PNG file signature.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// A machine spec unique to one check.
pub fn spec(tag: &str) -> MachineSpec {
    let id = format!("conf-{tag}-{}", uuid::Uuid::new_v4().simple());
    MachineSpec {
        computer_id: id.clone(),
        space_id: "conformance".into(),
        bot_id: None,
        home_key: id,
    }
}

/// A command with a generous timeout.
pub fn cmd(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    }
}

async fn machine(p: &dyn SandboxProvider, tag: &str) -> ProviderRef {
    p.provision(&spec(tag)).await.expect("provision")
}

/// `describe()` names the provider kind.
pub async fn describes_itself(p: Arc<dyn SandboxProvider>) {
    assert!(!p.describe().kind.is_empty());
}

/// Commands run with output, errors and exit codes.
pub async fn exec_runs_commands(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "exec").await;
    let out = p.exec(&m, &cmd("echo hello")).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.timed_out),
        (0, "hello\n", false)
    );
    let out = p.exec(&m, &cmd("echo oops >&2")).await.unwrap();
    assert_eq!(out.stderr, "oops\n");
    let out = p.exec(&m, &cmd("exit 3")).await.unwrap();
    assert_eq!(out.exit_code, 3);
    let mut env = cmd("echo $RAKAZO_CONFORMANCE");
    env.env.push(("RAKAZO_CONFORMANCE".into(), "yes".into()));
    assert_eq!(p.exec(&m, &env).await.unwrap().stdout, "yes\n");
    p.destroy(&m).await.unwrap();
}

/// A command past its deadline is stopped and reported as timed out.
pub async fn exec_times_out(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "timeout").await;
    let mut req = cmd("sleep 30");
    req.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let out = p.exec(&m, &req).await.unwrap();
    assert!(out.timed_out, "the deadline must stop the command");
    assert!(started.elapsed() < Duration::from_secs(10));
    p.destroy(&m).await.unwrap();
}

/// Files written are read back and listed; shell and file tools see the same workspace.
pub async fn files_round_trip(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "files").await;
    p.write_file(&m, "notes/a.txt", b"alpha\n").await.unwrap();
    assert_eq!(p.read_file(&m, "notes/a.txt").await.unwrap(), b"alpha\n");
    let listed = p.list_files(&m, "notes").await.unwrap();
    let entry = listed.iter().find(|e| e.name == "a.txt").expect("listed");
    assert_eq!((entry.kind.as_str(), entry.size), ("file", 6));
    assert_eq!(
        p.exec(&m, &cmd("cat notes/a.txt")).await.unwrap().stdout,
        "alpha\n"
    );
    p.exec(&m, &cmd("echo beta > b.txt")).await.unwrap();
    assert_eq!(p.read_file(&m, "b.txt").await.unwrap(), b"beta\n");
    assert!(matches!(
        p.read_file(&m, "missing.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    p.destroy(&m).await.unwrap();
}

/// Entries of the folder [`a_large_folder_lists_whole`] fills: with their 90-byte names,
/// a listing of more than a megabyte, past what a provider keeps of one command's output.
pub const LARGE_FOLDER: usize = 12_000;

/// A folder whose listing is larger than one command's output lists whole.
pub async fn a_large_folder_lists_whole(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "large-folder").await;
    let mut archive = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_ustar();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    archive
        .append_data(&mut dir, "big/", std::io::empty())
        .unwrap();
    for i in 0..LARGE_FOLDER {
        let mut file = tar::Header::new_ustar();
        file.set_entry_type(tar::EntryType::Regular);
        file.set_mode(0o644);
        file.set_size(0);
        let name = format!("big/entry-{i:084}");
        archive
            .append_data(&mut file, name, std::io::empty())
            .unwrap();
    }
    p.import_workspace(&m, &archive.into_inner().unwrap())
        .await
        .unwrap();
    let listed = p.list_files(&m, "big").await.unwrap();
    assert_eq!(listed.len(), LARGE_FOLDER);
    let last = format!("entry-{:084}", LARGE_FOLDER - 1);
    assert!(listed.iter().all(|e| e.kind == "file" && e.size == 0));
    assert!(
        listed
            .iter()
            .any(|e| e.name == last && e.path == format!("big/{last}"))
    );
    // Its first entries by name, and how many it holds.
    let page = p
        .list_files_first(&m, "big", &ListingRange::first(1000))
        .await
        .unwrap();
    assert_eq!(page.total, LARGE_FOLDER);
    let names: Vec<String> = (0..1000).map(|i| format!("entry-{i:084}")).collect();
    let shown: Vec<&String> = page.entries.iter().map(|e| &e.name).collect();
    assert_eq!(shown, names.iter().collect::<Vec<_>>());
    assert!(
        page.entries
            .iter()
            .all(|e| e.kind == "file" && e.size == 0 && e.path == format!("big/{}", e.name))
    );
    assert_eq!(page.next.as_deref(), Some(&*format!("entry-{:084}", 1000)));
    // The next page starts where this one ended; a page from a name holds that entry first.
    let next = p
        .list_files_first(&m, "big", &ListingRange::from(page.next.unwrap(), 1000))
        .await
        .unwrap();
    let names: Vec<String> = (1000..2000).map(|i| format!("entry-{i:084}")).collect();
    let shown: Vec<&String> = next.entries.iter().map(|e| &e.name).collect();
    assert_eq!(shown, names.iter().collect::<Vec<_>>());
    assert_eq!(next.next.as_deref(), Some(&*format!("entry-{:084}", 2000)));
    let one = p
        .list_files_first(&m, "big", &ListingRange::from(last.clone(), 1))
        .await
        .unwrap();
    assert_eq!(
        (one.entries.len(), one.total, one.next),
        (1, LARGE_FOLDER, None)
    );
    assert_eq!(
        (one.entries[0].name.as_str(), one.entries[0].kind.as_str()),
        (last.as_str(), "file")
    );
    let past = p
        .list_files_first(&m, "big", &ListingRange::from(format!("{last}-"), 1))
        .await
        .unwrap();
    assert_eq!((past.entries.len(), past.next), (0, None));
    let whole = p
        .list_files_first(&m, "big", &ListingRange::first(LARGE_FOLDER + 1))
        .await
        .unwrap();
    assert_eq!(
        (whole.entries.len(), whole.total, whole.next),
        (LARGE_FOLDER, LARGE_FOLDER, None)
    );
    p.destroy(&m).await.unwrap();
}

/// A read given a size is refused with `TooLarge` for a larger file, and gives a file of that
/// size whole.
pub async fn a_read_past_its_size_is_refused(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "read-within").await;
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    p.write_file(&m, "sized/data.bin", &data).await.unwrap();
    assert!(
        matches!(
            p.read_file_within(&m, "sized/data.bin", 2999).await,
            Err(ProviderError::TooLarge(_))
        ),
        "a file one byte past the size is refused"
    );
    let read = p
        .read_file_within(&m, "sized/data.bin", 3000)
        .await
        .unwrap();
    assert_eq!(read, data);
    // A sparse file of 1 GiB the bot made (where its shell has `truncate`): refused by its
    // size, never read into this process.
    let made = p.exec(&m, &cmd("truncate -s 1G sized/huge")).await;
    if made.is_ok_and(|o| o.exit_code == 0) {
        assert!(matches!(
            p.read_file(&m, "sized/huge").await,
            Err(ProviderError::TooLarge(_))
        ));
    }
    p.destroy(&m).await.unwrap();
}

/// A name that is not UTF-8, which no workspace path can name, is left out of the listing of
/// its folder, and the folder's other entries are listed (where the computer has `python3` to
/// make such a name; the bot can make it anyway).
pub async fn a_name_no_path_can_hold_is_left_out_of_its_listing(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "unnamed").await;
    p.write_file(&m, "odd/kept.txt", b"kept\n").await.unwrap();
    let _ = p
        .exec(
            &m,
            &cmd("python3 -c 'open(b\"odd/bad\\xffname\", \"w\").close()'"),
        )
        .await;
    let count = "python3 -c 'import os; print(len(os.listdir(b\"odd\")))'";
    if let Ok(counted) = p.exec(&m, &cmd(count)).await
        && counted.exit_code == 0
    {
        assert_eq!(counted.stdout, "2\n", "the name was made beside kept.txt");
    }
    let listed = p.list_files(&m, "odd").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["kept.txt"]);
    let page = p
        .list_files_first(&m, "odd", &ListingRange::first(10))
        .await
        .unwrap();
    assert_eq!(page.entries, listed);
    assert_eq!(page.total, 1);
    p.destroy(&m).await.unwrap();
}

/// Paths outside the workspace are refused.
pub async fn files_refuse_escapes(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "paths").await;
    for bad in ["../escape.txt", "/etc/passwd", "a/../../b", ""] {
        assert!(
            matches!(
                p.read_file(&m, bad).await,
                Err(ProviderError::PathRejected(_))
            ),
            "read of {bad:?} must be refused"
        );
        assert!(
            matches!(
                p.write_file(&m, bad, b"x").await,
                Err(ProviderError::PathRejected(_))
            ),
            "write of {bad:?} must be refused"
        );
    }
    p.destroy(&m).await.unwrap();
}

/// The whole workspace moves between machines through export and import.
pub async fn workspace_moves_between_machines(p: Arc<dyn SandboxProvider>) {
    let a = machine(p.as_ref(), "export").await;
    p.write_file(&a, "shared/report.md", b"# report\n")
        .await
        .unwrap();
    // A browser's cookies move as the snapshot the runtime keeps in its profile (Chromium's
    // own cookie database is left out of exports).
    p.write_file(&a, ".browser-profiles/bot-1/Saved Cookies.json", b"[]\n")
        .await
        .unwrap();
    let archive = p.export_workspace(&a).await.unwrap();
    let b = machine(p.as_ref(), "import").await;
    p.write_file(&b, "stale.txt", b"old").await.unwrap();
    p.import_workspace(&b, &archive).await.unwrap();
    assert_eq!(
        p.read_file(&b, "shared/report.md").await.unwrap(),
        b"# report\n"
    );
    assert_eq!(
        p.read_file(&b, ".browser-profiles/bot-1/Saved Cookies.json")
            .await
            .unwrap(),
        b"[]\n"
    );
    assert!(matches!(
        p.read_file(&b, "stale.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    p.destroy(&a).await.unwrap();
    p.destroy(&b).await.unwrap();
}

/// An export since a fingerprint the provider gave is skipped while nothing changes, and
/// never after a change, even one that keeps the file's size. A provider that gives no
/// fingerprint always exports.
pub async fn unchanged_workspace_is_not_exported_again(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "since").await;
    p.write_file(&m, "notes/a.txt", b"first").await.unwrap();
    let export = |since: Option<String>| {
        let (p, m) = (p.clone(), m.clone());
        async move {
            p.export_workspace_since(&m, since.as_deref())
                .await
                .unwrap()
        }
    };
    let fingerprint_of = |export: WorkspaceExport| match export {
        WorkspaceExport::Archive { fingerprint, .. } => fingerprint,
        WorkspaceExport::Unchanged => panic!("an export without a fingerprint must pack"),
    };
    let mut fingerprint = fingerprint_of(export(None).await);
    // A fingerprint does not vouch for a change too recent to be sure of: wait that out once.
    if fingerprint.is_some()
        && !matches!(
            export(fingerprint.clone()).await,
            WorkspaceExport::Unchanged
        )
    {
        tokio::time::sleep(Duration::from_millis(2100)).await;
        fingerprint = fingerprint_of(export(None).await);
    }
    let Some(fingerprint) = fingerprint else {
        p.destroy(&m).await.unwrap();
        return;
    };
    assert!(matches!(
        export(Some(fingerprint.clone())).await,
        WorkspaceExport::Unchanged
    ));
    p.write_file(&m, "notes/a.txt", b"other").await.unwrap();
    match export(Some(fingerprint.clone())).await {
        WorkspaceExport::Archive {
            workspace,
            fingerprint: after,
            ..
        } => {
            assert_ne!(after.as_deref(), Some(fingerprint.as_str()));
            // Unchanged pieces may be named by stamp only; the changed bytes travel.
            let carries_change = workspace.pieces.iter().any(|piece| match piece {
                Piece::Bytes { bytes, .. } => bytes.windows(5).any(|w| w == b"other"),
                Piece::Same { .. } => false,
            });
            assert!(carries_change, "the changed file is not in the export");
            let archive = p.export_workspace(&m).await.unwrap();
            let b = machine(p.as_ref(), "since-import").await;
            p.import_workspace(&b, &archive).await.unwrap();
            assert_eq!(p.read_file(&b, "notes/a.txt").await.unwrap(), b"other");
            p.destroy(&b).await.unwrap();
        }
        WorkspaceExport::Unchanged => panic!("a changed workspace was not exported"),
    }
    p.destroy(&m).await.unwrap();
}

/// What another workspace holds, which no planted link may reveal.
const OTHER_SECRET: &[u8] = b"conformance-secret-of-another-workspace";

/// The names of a tar archive's entries (GNU long names included).
fn entry_names(archive: &[u8]) -> Vec<String> {
    tar_entries(archive)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The data of the archive's entry `name`, if it has one.
fn entry(archive: &[u8], name: &str) -> Option<Vec<u8>> {
    tar_entries(archive)
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, data)| data)
}

/// Each entry of a tar archive with its data (GNU long names included).
fn tar_entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut entries = Vec::new();
    let (mut at, mut long) = (0, None::<String>);
    while let Some(h) = archive.get(at..at + 512) {
        if h.iter().all(|b| *b == 0) {
            break;
        }
        let field = |r: std::ops::Range<usize>| {
            let f = &h[r];
            String::from_utf8_lossy(&f[..f.iter().position(|b| *b == 0).unwrap_or(f.len())])
                .into_owned()
        };
        let size = usize::from_str_radix(field(124..136).trim(), 8).unwrap_or(0);
        let data = archive.get(at + 512..at + 512 + size).unwrap_or_default();
        match h[156] {
            b'L' => {
                let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
                long = Some(String::from_utf8_lossy(&data[..end]).into_owned());
            }
            b'x' | b'g' => {}
            _ => entries.push((long.take().unwrap_or_else(|| field(0..100)), data.to_vec())),
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    entries
}

/// Links, hard links and fifos planted through the shell (to `/`, to a parent, to another
/// workspace, to `/proc/self`, to a file inside; a hard link to a file outside where the
/// provider lets one be made, and one to a file inside) are refused by every file operation:
/// reads, listings and writes never go through them or into them, and an export neither
/// follows them nor hangs on the fifo; it keeps a file whose every name is in the workspace.
pub async fn planted_links_are_refused(p: Arc<dyn SandboxProvider>) {
    let other_spec = spec("links-other");
    let other = p.provision(&other_spec).await.expect("provision");
    p.write_file(&other, "secret.txt", OTHER_SECRET)
        .await
        .unwrap();
    let m = machine(p.as_ref(), "links").await;
    p.write_file(&m, "mine.txt", b"mine\n").await.unwrap();
    p.write_file(&m, "dir/inner.txt", b"inner\n").await.unwrap();
    p.write_file(&m, "twin-src.txt", b"twin\n").await.unwrap();
    let key = &other_spec.home_key;
    let plants = [
        "ln -s / root".to_owned(),
        "ln -s ../.. up".to_owned(),
        "ln -s /proc/self self".to_owned(),
        format!("ln -s ../{key} other"),
        "ln -s mine.txt alias".to_owned(),
        "ln -s dir dirlink".to_owned(),
        "ln -s /dev/zero zero".to_owned(),
        // Where the provider allows it (the same file system, the right to link).
        "ln /etc/passwd passwd".to_owned(),
        format!("ln ../{key}/secret.txt stolen"),
        "ln twin-src.txt twin".to_owned(),
        "mkfifo pipe".to_owned(),
    ];
    for plant in &plants {
        p.exec(&m, &cmd(plant)).await.unwrap();
    }
    let planted = [
        "root",
        "up",
        "self",
        "other",
        "alias",
        "dirlink",
        "zero",
        "passwd",
        "stolen",
        "twin",
        "twin-src.txt",
        "pipe",
    ];
    let listed = p.list_files(&m, "").await.unwrap();
    let present = |name: &str| listed.iter().any(|e| e.name == name);
    for name in [
        "root", "up", "self", "other", "alias", "dirlink", "zero", "pipe",
    ] {
        let entry = listed
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name} was planted"));
        assert_ne!(entry.kind, "dir", "{name} listed as what it points to");
        assert_ne!(entry.kind, "file", "{name} listed as what it points to");
    }
    // A path through or to a plant is refused; one whose plant could not be made is not found.
    let refused = |path: &str, result: Result<(), ProviderError>| {
        let first = path.split('/').next().unwrap();
        match result {
            Err(ProviderError::PathRejected(_)) => {}
            Err(ProviderError::NotFound(_)) if !present(first) => {}
            other => panic!("{path}: {other:?}"),
        }
    };
    let through = [
        "root".to_owned(),
        "root/etc/passwd".to_owned(),
        "up".to_owned(),
        "up/etc/passwd".to_owned(),
        format!("up/homes/{key}/secret.txt"),
        "self".to_owned(),
        "self/environ".to_owned(),
        "other".to_owned(),
        "other/secret.txt".to_owned(),
        "alias".to_owned(),
        "dirlink/inner.txt".to_owned(),
        "zero".to_owned(),
        "passwd".to_owned(),
        "stolen".to_owned(),
        "twin".to_owned(),
        "twin-src.txt".to_owned(),
        "pipe".to_owned(),
    ];
    for path in &through {
        let read = tokio::time::timeout(Duration::from_secs(20), p.read_file(&m, path))
            .await
            .expect("a read through a plant hung");
        refused(path, read.map(drop));
    }
    for dir in ["root", "up", "self", "other", "dirlink"] {
        refused(dir, p.list_files(&m, dir).await.map(drop));
    }
    // Writes: into the other workspace through every way there, into the fifo, the links and
    // the hard-linked files. (Never tried on host files: a broken provider must not harm them.)
    for path in [
        format!("up/homes/{key}/secret.txt"),
        "other/secret.txt".to_owned(),
        "other/planted.txt".to_owned(),
        "stolen".to_owned(),
        "twin".to_owned(),
        "alias".to_owned(),
        "dirlink/new.txt".to_owned(),
        "pipe".to_owned(),
        "self/new.txt".to_owned(),
    ] {
        // Where a plant could not be made, a write would just make a file of that name.
        if !present(path.split('/').next().unwrap()) {
            continue;
        }
        let write = tokio::time::timeout(
            Duration::from_secs(20),
            p.write_file(&m, &path, b"overwritten"),
        )
        .await
        .expect("a write through a plant hung");
        refused(&path, write);
    }
    // (Its own file tools may refuse it now: a hard link made it a file of two names.)
    assert_eq!(
        p.exec(&other, &cmd("cat secret.txt"))
            .await
            .unwrap()
            .stdout
            .as_bytes(),
        OTHER_SECRET
    );
    assert!(matches!(
        p.read_file(&other, "planted.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    assert_eq!(p.read_file(&m, "mine.txt").await.unwrap(), b"mine\n");
    assert_eq!(p.read_file(&m, "dir/inner.txt").await.unwrap(), b"inner\n");
    assert!(matches!(
        p.read_file(&m, "dir/new.txt").await,
        Err(ProviderError::NotFound(_))
    ));
    // The export leaves every plant out, follows none and does not wait on the fifo.
    let archive = tokio::time::timeout(Duration::from_secs(120), p.export_workspace(&m))
        .await
        .expect("the export hung on a plant")
        .unwrap();
    let names = entry_names(&archive);
    assert!(names.iter().any(|n| n == "mine.txt"), "{names:?}");
    assert!(names.iter().any(|n| n == "dir/inner.txt"), "{names:?}");
    // Both names of a file linked twice inside the workspace are kept: nothing of the
    // workspace is lost, and no name of it is outside.
    let twins = ["twin", "twin-src.txt"];
    for twin in twins {
        assert_eq!(
            entry(&archive, twin).as_deref(),
            Some(b"twin\n".as_slice()),
            "{twin} was not exported"
        );
    }
    for name in &names {
        let first = name.trim_end_matches('/').split('/').next().unwrap();
        assert!(
            !planted.contains(&first) || twins.contains(&first),
            "{name} exported"
        );
    }
    for leak in [OTHER_SECRET, b"root:x:0:0".as_slice()] {
        assert!(
            !archive.windows(leak.len()).any(|w| w == leak),
            "the export holds {}",
            String::from_utf8_lossy(leak)
        );
    }
    p.destroy(&m).await.unwrap();
    p.destroy(&other).await.unwrap();
}

/// Stop keeps the machine resumable; destroy makes it gone; destroying twice is fine.
pub async fn lifecycle(p: Arc<dyn SandboxProvider>) {
    let s = spec("lifecycle");
    let m = p.provision(&s).await.unwrap();
    p.write_file(&m, "keep.txt", b"kept").await.unwrap();
    p.stop(&m).await.unwrap();
    p.reconnect(&m, &s).await.unwrap();
    assert_eq!(p.read_file(&m, "keep.txt").await.unwrap(), b"kept");
    p.destroy(&m).await.unwrap();
    assert_eq!(p.reconnect(&m, &s).await, Err(ProviderError::MachineGone));
    assert!(matches!(
        p.exec(&m, &cmd("true")).await,
        Err(ProviderError::MachineGone)
    ));
    p.destroy(&m).await.unwrap();
}

/// Screens: one per bot, on the slot the caller asks for, stable while open. A slot holding
/// another bot's screen, or a bot asked on a slot other than its screen's, is refused with
/// `SlotBusy` and nothing is started elsewhere. A second bot gets its own slot when the
/// provider reports `multiScreen`, otherwise `MultiScreenUnavailable` while shell and files
/// keep working.
pub async fn screens(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "screens").await;
    let a = p.open_screen(&m, "bot-a", 0).await.unwrap();
    assert_eq!(a.slot, 0, "the screen opens on the slot asked for");
    assert_eq!(
        p.open_screen(&m, "bot-a", 0).await.unwrap(),
        a,
        "reopening keeps the slot"
    );
    assert!(
        matches!(
            p.open_screen(&m, "bot-a", 1).await,
            Err(ProviderError::SlotBusy { slot: 1, .. })
        ),
        "a bot's screen never moves to another slot"
    );
    if p.describe().capabilities.multi_screen {
        assert!(
            matches!(
                p.open_screen(&m, "bot-b", 0).await,
                Err(ProviderError::SlotBusy { slot: 0, .. })
            ),
            "another bot's slot is refused, never swapped"
        );
        let b = p.open_screen(&m, "bot-b", 2).await.unwrap();
        assert_eq!(b.slot, 2, "any free slot the caller numbers");
        p.close_screen(&m, "bot-b").await.unwrap();
        assert_eq!(
            p.open_screen(&m, "bot-c", 2).await.unwrap().slot,
            2,
            "a freed slot is reused"
        );
    } else {
        assert_eq!(
            p.open_screen(&m, "bot-b", 1).await,
            Err(ProviderError::MultiScreenUnavailable)
        );
        assert_eq!(
            p.exec(&m, &cmd("echo still")).await.unwrap().stdout,
            "still\n"
        );
        p.write_file(&m, "still.txt", b"ok").await.unwrap();
        p.close_screen(&m, "bot-a").await.unwrap();
        assert_eq!(
            p.open_screen(&m, "bot-b", 0)
                .await
                .expect("the slot is free again")
                .slot,
            0
        );
    }
    p.destroy(&m).await.unwrap();
}

/// Observe returns a PNG; an action batch reports every action completed and a frame; a step
/// the screen cannot do stops the batch with its reason.
pub async fn observe_and_act(p: Arc<dyn SandboxProvider>) {
    let m = machine(p.as_ref(), "observe").await;
    p.open_screen(&m, "bot-a", 0).await.unwrap();
    let frame = p.observe(&m, "bot-a").await.unwrap();
    assert!(frame.png.starts_with(PNG_SIGNATURE));
    assert!(frame.width > 0 && frame.height > 0);
    let actions = vec![
        Action::Move { x: 10, y: 10 },
        Action::Click {
            x: 20,
            y: 20,
            button: Button::Left,
            double: false,
        },
        Action::Type { text: "hi".into() },
        Action::Key {
            keys: "Return".into(),
        },
    ];
    let outcome = p.act(&m, "bot-a", &actions).await.unwrap();
    assert_eq!(outcome.completed, actions.len());
    assert_eq!(outcome.stopped, None);
    assert!(outcome.frame.png.starts_with(PNG_SIGNATURE));

    // A step the screen cannot do stops the batch there, saying why (`INVALID_PARAMS`).
    let (w, h) = (frame.width as i32, frame.height as i32);
    let bad = [
        (
            Action::Click {
                x: w + 4000,
                y: 10,
                button: Button::Left,
                double: false,
            },
            format!("point ({}, 10) is outside the {w}x{h} screen", w + 4000),
        ),
        (
            Action::Key {
                keys: "ctrl+foo".into(),
            },
            "unknown key \"foo\"".to_owned(),
        ),
        (
            Action::Scroll {
                x: 1,
                y: 1,
                dx: 0,
                dy: 500,
            },
            "scroll of (0, 500) notches: at most 100 each way".to_owned(),
        ),
        (
            Action::Wait { ms: 60_000 },
            "wait of 60000 ms: at most 10000 ms".to_owned(),
        ),
    ];
    for (step, reason) in bad {
        let batch = [Action::Move { x: 1, y: 1 }, step];
        let outcome = p.act(&m, "bot-a", &batch).await.unwrap();
        assert_eq!(outcome.completed, 1, "{batch:?}");
        assert_eq!(
            outcome.stopped,
            Some(crate::provider::ActStop::invalid(reason)),
            "{batch:?}"
        );
    }
    p.destroy(&m).await.unwrap();
}

/// Instantiate every conformance check as a test. `$make` is an expression producing an
/// `Arc<dyn SandboxProvider>`; it is evaluated once per test. With `gate = <bool expr>`, each
/// test first evaluates the gate and returns early when it is false (a backend that needs an
/// engine decides there whether its absence skips or fails).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!($make, gate = true);
    };
    ($make:expr, gate = $gate:expr) => {
        $crate::conformance_suite!(@tests $make; $gate;
            describes_itself, exec_runs_commands, exec_times_out, files_round_trip,
            a_large_folder_lists_whole, a_name_no_path_can_hold_is_left_out_of_its_listing,
            a_read_past_its_size_is_refused,
            files_refuse_escapes, planted_links_are_refused, workspace_moves_between_machines,
            unchanged_workspace_is_not_exported_again, lifecycle, screens,
            observe_and_act);
    };
    (@tests $make:expr; $gate:expr; $($check:ident),*) => {
        $(
            #[actix_rt::test]
            async fn $check() {
                if !$gate {
                    return;
                }
                $crate::conformance::$check($make).await;
            }
        )*
    };
}
