//! Durable workspaces through the API: revision history and restore, provider-kind changes,
//! deletion.

mod common;

use common::{Backend, TestServer};
use rakazo_actors::entity::computer;
use rakazo_actors::provider::{ProviderRef, SandboxProvider};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;

async fn finish(s: &TestServer, run: &str, fence: i64) -> serde_json::Value {
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await
}

#[actix_rt::test]
async fn an_older_kept_revision_can_be_restored() {
    let s = TestServer::start(Backend::Sqlite, &[("HOME_REVISIONS_KEEP", "3")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    for version in ["one", "two", "three", "four"] {
        let (run, fence) = s.start_run(&bots[0]).await;
        s.exec(&run, fence, &format!("echo {version} > state.txt"))
            .await
            .unwrap();
        finish(&s, &run, fence).await;
    }
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let revs = s
        .ok("computer.revisions", json!({ "computerId": c["id"] }))
        .await;
    let numbers: Vec<i64> = revs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["revision"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, vec![4, 3, 2], "only the last three are kept");
    assert_eq!(revs[0]["current"], true);
    let storage = revs[0]["location"].as_str().unwrap();
    assert!(
        storage.starts_with("home-revisions/") && storage.ends_with("/4.sealed"),
        "{storage}"
    );
    let sealed = s.app.config.data_dir.join(storage);
    assert!(sealed.is_file(), "the location names the stored revision");

    let err = s
        .call(
            "computer.restoreRevision",
            json!({ "computerId": c["id"], "revision": 1 }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "NOT_FOUND", "a revision past the retention is gone");

    let (run, fence) = s.start_run(&bots[0]).await;
    let err = s
        .call(
            "computer.restoreRevision",
            json!({ "computerId": c["id"], "revision": 3 }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "LEASE_HELD", "no restore under a working bot");
    let unchanged = finish(&s, &run, fence).await;
    assert_eq!(
        (
            unchanged["checkpoint"]["saved"].as_i64(),
            unchanged["checkpoint"]["unchanged"].as_bool()
        ),
        (Some(4), Some(true)),
        "a run that changed nothing stores no new revision"
    );

    // Work never checkpointed is saved as a revision before the restore replaces it, and the
    // oldest kept revision is still restored (read before that save's retention forgets it).
    let machine = s
        .ok("computer.machine", json!({ "computerId": c["id"] }))
        .await;
    let machine = ProviderRef(machine["providerRef"].as_str().unwrap().to_owned());
    s.app
        .fake
        .as_ref()
        .unwrap()
        .write_file(&machine, "late.txt", b"unsaved")
        .await
        .unwrap();
    let restored = s
        .ok(
            "computer.restoreRevision",
            json!({ "computerId": c["id"], "revision": 2 }),
        )
        .await;
    assert_eq!(
        (
            restored["revision"].as_i64(),
            restored["restoredFrom"].as_i64()
        ),
        (Some(6), Some(2))
    );
    let (run, fence) = s.start_run(&bots[0]).await;
    assert_eq!(
        s.exec(&run, fence, "cat state.txt; cat late.txt || true")
            .await
            .unwrap()["stdout"],
        "two\n"
    );
    finish(&s, &run, fence).await;
    s.ok(
        "computer.restoreRevision",
        json!({ "computerId": c["id"], "revision": 5 }),
    )
    .await;
    let (run, fence) = s.start_run(&bots[0]).await;
    assert_eq!(
        s.exec(&run, fence, "cat late.txt").await.unwrap()["stdout"],
        "unsaved",
        "the work the restore replaced is a revision of its own"
    );
}

#[actix_rt::test]
async fn a_provider_kind_change_boots_a_replacement_from_the_checkpoint() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo portable > p.txt").await.unwrap();
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    let before = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    // The machine was made by another provider kind: its reference is never handed to ours.
    computer::Entity::update_many()
        .col_expr(computer::Column::ProviderKind, Expr::value("desktop"))
        .filter(computer::Column::Id.eq(c["id"].as_str().unwrap()))
        .exec(&s.app.db)
        .await
        .unwrap();
    assert_eq!(
        s.exec(&run, fence, "cat p.txt").await.unwrap()["stdout"],
        "portable\n"
    );
    let after = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert_ne!(after["providerRef"], before["providerRef"]);
    assert_eq!(after["providerKind"], "fake");
    assert_eq!(
        s.app.fake.as_ref().unwrap().live_machines(),
        2,
        "the stopped machine was not resumed"
    );
}

#[actix_rt::test]
async fn deleting_a_computer_leaves_nothing_readable_behind() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo secret > s.txt").await.unwrap();
    finish(&s, &run, fence).await;
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let data_dir = s.app.config.data_dir.clone();
    let storage_dir = std::fs::read_dir(data_dir.join("home-revisions"))
        .unwrap()
        .count();
    assert_eq!(storage_dir, 1);
    assert!(
        data_dir
            .join("homes")
            .join(c["homeKey"].as_str().unwrap())
            .join("s.txt")
            .exists()
    );
    s.ok("computer.delete", json!({ "computerId": c["id"] }))
        .await;
    assert_eq!(
        s.call("computer.get", json!({ "computerId": c["id"] }))
            .await
            .unwrap_err()
            .1,
        "NOT_FOUND"
    );
    assert_eq!(
        std::fs::read_dir(data_dir.join("home-revisions"))
            .unwrap()
            .count(),
        0
    );
    assert!(
        !data_dir
            .join("homes")
            .join(c["homeKey"].as_str().unwrap())
            .exists()
    );
    assert_eq!(s.app.fake.as_ref().unwrap().live_machines(), 0);
}

/// The sealed chunks a computer's store holds, and their total size.
fn stored_chunks(s: &TestServer) -> (usize, u64) {
    let revisions = s.app.config.data_dir.join("home-revisions");
    let Some(home) = std::fs::read_dir(&revisions)
        .ok()
        .and_then(|mut d| d.next())
    else {
        return (0, 0);
    };
    let chunks = home.unwrap().path().join("chunks");
    std::fs::read_dir(chunks).map_or((0, 0), |entries| {
        entries.fold((0, 0), |(n, bytes), e| {
            (n + 1, bytes + e.unwrap().metadata().unwrap().len())
        })
    })
}

#[actix_rt::test]
async fn desktop_checkpoints_store_what_changed_and_survive_a_lost_store() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    // Files older than the two seconds a stamp withholds, as between runs.
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(2100));
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(
        &run,
        fence,
        "for d in a b c; do mkdir -p $d && head -c 2097152 /dev/urandom > $d/data.bin; done",
    )
    .await
    .unwrap();
    settle().await;
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 1);
    let (first_chunks, first_bytes) = stored_chunks(&s);
    assert!(first_bytes > 6 << 20, "{first_bytes} bytes stored first");

    // One folder changed: only its piece is stored again.
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo changed > a/note.txt")
        .await
        .unwrap();
    settle().await;
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 2);
    let (chunks, bytes) = stored_chunks(&s);
    assert!(chunks > first_chunks, "a changed piece is a new chunk");
    assert!(
        bytes - first_bytes < 3 << 20,
        "{} more bytes for one changed folder",
        bytes - first_bytes
    );

    // The store lost what the last revision named: the checkpoint exports every byte again.
    let revisions = s.app.config.data_dir.join("home-revisions");
    std::fs::remove_dir_all(&revisions).unwrap();
    std::fs::create_dir_all(&revisions).unwrap();
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo again > b/note.txt")
        .await
        .unwrap();
    settle().await;
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 3);
    assert!(stored_chunks(&s).1 > 6 << 20, "every byte stored again");
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    s.ok(
        "computer.restoreRevision",
        json!({ "computerId": c["id"], "revision": 3 }),
    )
    .await;
    let (run, fence) = s.start_run(&bots[0]).await;
    assert_eq!(
        s.exec(&run, fence, "cat a/note.txt b/note.txt")
            .await
            .unwrap()["stdout"],
        "changed\nagain\n"
    );
}

/// A restore on a stopped computer is its state: pending until a machine imports it, shown by
/// the stopped Files view, seen by the next run and saved by the next checkpoint.
async fn a_restore_on_a_stopped_computer_is_what_the_next_run_sees(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo one > state.txt").await.unwrap();
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 1);
    let (run, fence) = s.start_run(bot).await;
    s.exec(
        &run,
        fence,
        "echo two > state.txt && echo later > later.txt",
    )
    .await
    .unwrap();
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 2);
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    // The stop's own checkpoint may store one more revision (host homes change as they stop).
    let stopped = s.ok("computer.get", json!({ "computerId": c["id"] })).await["revision"]
        .as_i64()
        .unwrap();
    let (restored_rev, next) = (stopped + 1, stopped + 2);

    let restored = s
        .ok(
            "computer.restoreRevision",
            json!({ "computerId": c["id"], "revision": 1 }),
        )
        .await;
    assert_eq!(
        (restored["revision"].as_i64(), restored["pending"].as_bool()),
        (Some(restored_rev), Some(true)),
        "{restored}"
    );
    let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert_eq!(
        (got["revision"].as_i64(), got["pendingRestore"].as_i64()),
        (Some(restored_rev), Some(restored_rev))
    );
    let revs = s
        .ok("computer.revisions", json!({ "computerId": c["id"] }))
        .await;
    assert_eq!(
        (revs[0]["revision"].as_i64(), revs[0]["pending"].as_bool()),
        (Some(restored_rev), Some(true))
    );
    assert_eq!(revs[1]["pending"], false);

    // The stopped Files view is what the next run will see.
    let read = s
        .ok("files.read", json!({ "botId": bot, "path": "state.txt" }))
        .await;
    assert_eq!(
        (read["live"].as_bool(), read["text"].as_str()),
        (Some(false), Some("one\n"))
    );
    let listed = s
        .ok("files.list", json!({ "botId": bot, "path": "" }))
        .await;
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(!names.contains(&"later.txt"), "{names:?}");

    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        s.exec(&run, fence, "cat state.txt; test -e later.txt || echo gone")
            .await
            .unwrap()["stdout"],
        "one\ngone\n"
    );
    let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert!(got["pendingRestore"].is_null(), "applied: {got}");
    s.exec(&run, fence, "echo three >> state.txt")
        .await
        .unwrap();
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], next);
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    let read = s
        .ok("files.read", json!({ "botId": bot, "path": "state.txt" }))
        .await;
    assert_eq!(
        read["text"], "one\nthree\n",
        "the next checkpoint saved the restored files"
    );
    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        s.exec(&run, fence, "cat state.txt; ls").await.unwrap()["stdout"],
        "one\nthree\nstate.txt\n"
    );
}

#[actix_rt::test]
async fn a_restore_on_a_stopped_fake_computer_applies_on_sqlite() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    a_restore_on_a_stopped_computer_is_what_the_next_run_sees(s).await;
}

#[actix_rt::test]
async fn a_restore_on_a_stopped_fake_computer_applies_on_postgres() {
    let Some(s) = TestServer::start(Backend::Postgres, &[]).await else {
        eprintln!("skipped: no RAKAZO_TEST_POSTGRES_URL");
        return;
    };
    a_restore_on_a_stopped_computer_is_what_the_next_run_sees(s).await;
}

#[actix_rt::test]
async fn a_restore_on_a_stopped_desktop_computer_applies() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    a_restore_on_a_stopped_computer_is_what_the_next_run_sees(s).await;
}

/// A restore left pending (its import failed) is applied by the next tool call on the running
/// computer, before it acts, also when the bot's screen is held: `computer_observe` makes sure
/// of the held screen without the computer's row and leaves the row's checks to its
/// observation.
#[actix_rt::test]
async fn a_pending_restore_is_applied_before_an_observe_on_a_held_screen() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo one > state.txt").await.unwrap();
    let saved = finish(&s, &run, fence).await["checkpoint"]["saved"]
        .as_i64()
        .unwrap();
    let (run, fence) = s.start_run(bot).await;
    let observe =
        json!({ "runId": run, "fence": fence, "name": "computer_observe", "arguments": {} });
    let first = s.ok("tools/call", observe.clone()).await;
    assert_eq!(first["isError"], false, "{first}");
    s.exec(&run, fence, "echo two > state.txt").await.unwrap();
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    // As a restore whose import failed leaves it: the row names the revision to import.
    computer::Entity::update_many()
        .col_expr(computer::Column::PendingRestoreRevision, Expr::value(saved))
        .filter(computer::Column::Id.eq(c["id"].as_str().unwrap()))
        .exec(&s.app.db)
        .await
        .unwrap();

    let again = s.ok("tools/call", observe).await;
    assert_eq!(again["isError"], false, "{again}");
    let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert!(got["pendingRestore"].is_null(), "applied: {got}");
    assert_eq!(
        s.exec(&run, fence, "cat state.txt").await.unwrap()["stdout"],
        "one\n"
    );
}

/// The Files window lists a folder's first entries by name and says how many it holds, on a
/// running computer and from the stored copy of a stopped one; a number out of range is
/// refused.
#[actix_rt::test]
async fn the_files_window_lists_a_folder_page_by_page_with_its_total() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    for name in ["c", "a", "b"] {
        s.exec(&run, fence, &format!("echo {name} > {name}.txt"))
            .await
            .unwrap();
    }
    let names = |listed: &serde_json::Value| -> Vec<String> {
        listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let listed = s
        .ok(
            "files.list",
            json!({ "botId": bot, "path": "", "first": 2 }),
        )
        .await;
    assert_eq!(names(&listed), ["a.txt", "b.txt"], "{listed}");
    assert_eq!(
        (listed["total"].as_u64(), listed["truncated"].as_bool()),
        (Some(3), Some(true))
    );
    assert_eq!(listed["next"], "c.txt");
    // The next page starts where the last one said.
    let rest = s
        .ok(
            "files.list",
            json!({ "botId": bot, "path": "", "first": 2, "from": listed["next"] }),
        )
        .await;
    assert_eq!(names(&rest), ["c.txt"], "{rest}");
    assert_eq!(
        (rest["truncated"].as_bool(), &rest["next"]),
        (Some(false), &json!(null))
    );
    // `from` is a name, never a path.
    for from in ["../a.txt", "x/y", &"n".repeat(256)] {
        let err = s
            .call(
                "files.list",
                json!({ "botId": bot, "path": "", "from": from }),
            )
            .await
            .unwrap_err();
        assert_eq!(err.1, "INVALID_PARAMS", "from {from}");
    }
    let whole = s
        .ok("files.list", json!({ "botId": bot, "path": "" }))
        .await;
    assert_eq!(names(&whole), ["a.txt", "b.txt", "c.txt"], "{whole}");
    assert_eq!(whole["truncated"], false);
    for first in [0, 100_001] {
        let err = s
            .call(
                "files.list",
                json!({ "botId": bot, "path": "", "first": first }),
            )
            .await
            .unwrap_err();
        assert_eq!(err.1, "INVALID_PARAMS", "first {first}");
    }
    finish(&s, &run, fence).await;
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    let stored = s
        .ok(
            "files.list",
            json!({ "botId": bot, "path": "", "first": 1 }),
        )
        .await;
    assert_eq!(stored["live"], false, "{stored}");
    assert_eq!(names(&stored), ["a.txt"]);
    assert_eq!(
        (stored["total"].as_u64(), stored["truncated"].as_bool()),
        (Some(3), Some(true))
    );
    let stored = s
        .ok(
            "files.list",
            json!({ "botId": bot, "path": "", "first": 1, "from": "b" }),
        )
        .await;
    assert_eq!(
        (names(&stored), &stored["next"]),
        (vec!["b.txt".to_string()], &json!("c.txt"))
    );
}
