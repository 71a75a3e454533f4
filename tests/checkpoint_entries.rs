//! Checkpoints a bot cannot block: entries the store cannot hold (a 5,000-byte path, a name
//! that is not UTF-8) are skipped and reported in `run.finish` and the activity feed while the
//! rest is saved; a home past the limits is refused before it is read; a checkpoint that does
//! fail marks the run failed and never keeps a computer from idle suspension. On host
//! (`desktop`) computers, whose homes are real directories.

mod common;

use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use serde_json::json;

async fn finish(s: &TestServer, run: &str, fence: i64) -> serde_json::Value {
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await
}

/// A 5,025-byte path (25 folders of 200 bytes, each made from inside the last) and a file
/// named with the byte 0xff.
const HOSTILE: &str = "echo kept > keep.txt; d=$(printf 'x%.0s' $(seq 200)); \
    (for i in $(seq 25); do mkdir $d && cd $d || exit 1; done; echo deep > f.txt); \
    echo bad > \"$(printf 'bad\\377.txt')\"";

#[actix_rt::test]
async fn a_long_path_and_a_name_that_is_not_utf8_are_skipped_and_reported() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, HOSTILE).await.unwrap();
    let done = finish(&s, &run, fence).await;
    assert_eq!(done["run"]["state"], "completed", "{done}");
    let checkpoint = &done["checkpoint"];
    assert_eq!(checkpoint["saved"], 1, "{checkpoint}");
    assert_eq!(checkpoint["skippedCount"], 2, "{checkpoint}");
    let skipped = checkpoint["skipped"].as_array().unwrap();
    let reason_of = |prefix: &str| {
        skipped
            .iter()
            .find(|e| e["path"].as_str().unwrap().starts_with(prefix))
            .map(|e| e["reason"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        reason_of("bad\u{fffd}.txt").as_deref(),
        Some("name is not UTF-8"),
        "{checkpoint}"
    );
    assert_eq!(
        reason_of(&"x".repeat(200)).as_deref(),
        Some("path longer than 3072 bytes"),
        "{checkpoint}"
    );
    let feed = s.ok("activity.list", json!({ "botId": bot })).await;
    let event = feed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tool"] == "checkpoint")
        .unwrap_or_else(|| panic!("no checkpoint event: {feed}"));
    assert!(
        event["error"]
            .as_str()
            .unwrap()
            .starts_with("2 entries left out: "),
        "{event}"
    );

    // Every later checkpoint works too, and the saved revision restores without them.
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo again > keep.txt").await.unwrap();
    let done = finish(&s, &run, fence).await;
    assert_eq!(done["checkpoint"]["saved"], 2, "{done}");
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    s.ok(
        "computer.restoreRevision",
        json!({ "computerId": c["id"], "revision": 1 }),
    )
    .await;
    let (run, fence) = s.start_run(bot).await;
    // The folders within the limit were kept; the name that is not UTF-8 was not.
    assert_eq!(
        s.exec(&run, fence, "cat keep.txt; ls").await.unwrap()["stdout"],
        format!("kept\nkeep.txt\n{}\n", "x".repeat(200))
    );
}

/// A file of a terabyte that takes no disk (`truncate`), far past the 4 GiB a file may be:
/// the checkpoint is refused from the walk, before a byte is read (reading it would take the
/// API process's memory), and the next checkpoint without it is saved.
#[actix_rt::test]
async fn a_sparse_file_past_the_limit_is_refused_before_it_is_read() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "desktop")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo kept > keep.txt; truncate -s 1T huge.bin")
        .await
        .unwrap();
    let done = finish(&s, &run, fence).await;
    assert_eq!(done["run"]["state"], "failed", "{done}");
    let checkpoint = &done["checkpoint"];
    assert_eq!(checkpoint["code"], "ARCHIVE_REJECTED", "{checkpoint}");
    assert!(
        checkpoint["message"]
            .as_str()
            .unwrap()
            .contains("\"huge.bin\" is larger than 4294967296 bytes"),
        "{checkpoint}"
    );
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "rm huge.bin").await.unwrap();
    let done = finish(&s, &run, fence).await;
    assert_eq!(done["checkpoint"]["saved"], 1, "{done}");
}

#[actix_rt::test]
async fn a_failed_checkpoint_fails_the_run_and_never_holds_off_idle_suspension() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("SANDBOX_IDLE_MS", "1000")],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo one > a.txt").await.unwrap();
    assert_eq!(finish(&s, &run, fence).await["checkpoint"]["saved"], 1);
    // The store cannot take chunks any more: its chunk folder is a file now.
    let revisions = s.app.config.data_dir.join("home-revisions");
    let home = std::fs::read_dir(&revisions)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::remove_dir_all(home.join("chunks")).unwrap();
    std::fs::write(home.join("chunks"), b"in the way").unwrap();

    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo unsaved > b.txt").await.unwrap();
    let done = finish(&s, &run, fence).await;
    assert_eq!(done["run"]["state"], "failed", "{done}");
    assert_eq!(done["checkpoint"]["failed"], true, "{done}");

    // Idle suspension still comes; the host home keeps the unsaved file.
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
        if got["state"] == "stopped" {
            break;
        }
        assert!(Instant::now() < deadline, "never suspended: {got}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let read = s
        .ok("files.read", json!({ "botId": bot, "path": "b.txt" }))
        .await;
    assert_eq!(read["text"], "unsaved\n");
}

#[actix_rt::test]
async fn a_long_path_on_a_fake_computer_is_skipped_and_reported() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    // 3,617 bytes: past what a checkpoint keeps, within what the emulated shell accepts.
    let deep = vec!["x".repeat(200); 18].join("/");
    let (run, fence) = s.start_run(bot).await;
    s.exec(
        &run,
        fence,
        &format!("echo kept > keep.txt; mkdir -p {deep}; echo deep > {deep}/f.txt"),
    )
    .await
    .unwrap();
    let done = finish(&s, &run, fence).await;
    let checkpoint = &done["checkpoint"];
    assert_eq!(
        (
            checkpoint["saved"].as_i64(),
            checkpoint["skippedCount"].as_i64()
        ),
        (Some(1), Some(1)),
        "{checkpoint}"
    );
    assert_eq!(
        checkpoint["skipped"][0]["reason"],
        "path longer than 3072 bytes"
    );
    // The saved revision restores: a replacement machine starts from it.
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    s.ok(
        "computer.restoreRevision",
        json!({ "computerId": c["id"], "revision": 1 }),
    )
    .await;
    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        s.exec(&run, fence, "cat keep.txt").await.unwrap()["stdout"],
        "kept\n"
    );
}
