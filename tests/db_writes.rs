//! What the database sees of a tool call: every pooled SQLite connection carries the pragmas,
//! and read-only tool calls (`computer_observe`, `read_file`, `list_files`) write nothing but
//! their own record (the computer's timeline and the run's recording): no lease renewal, no
//! use stamp, no other row.

mod common;

use std::collections::BTreeMap;

use common::{Backend, TestServer};
use sea_orm::sqlx::{self, Row};
use sea_orm::{DatabaseConnection, DbBackend, FromQueryResult, JsonValue, Statement};
use serde_json::{Value, json};

/// Quiet background writers (process heartbeat, reconciler) for the length of a test.
const QUIET: &[(&str, &str)] = &[
    ("RAKAZO_PROCESS_GONE_MS", "3600000"),
    ("RAKAZO_RECONCILE_INTERVAL_MS", "3600000"),
];

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    let out = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await;
    assert_eq!(out["isError"], false, "{name}: {out}");
    out
}

/// The tables that record the calls themselves: every tool call is on the computer's
/// timeline, and observations are in the run's recording.
const RECORDS: &[&str] = &[
    "timeline_entries",
    "timeline_heads",
    "recording_steps",
    "recording_frames",
];

/// Every row of every table but [`RECORDS`], as JSON, by table.
async fn rows(db: &DatabaseConnection) -> BTreeMap<String, Vec<JsonValue>> {
    let backend = db.get_database_backend();
    let list = match backend {
        DbBackend::Sqlite => {
            "SELECT name AS t FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        }
        _ => "SELECT tablename::text AS t FROM pg_tables WHERE schemaname = 'public'",
    };
    let tables = JsonValue::find_by_statement(Statement::from_string(backend, list))
        .all(db)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for t in tables {
        let name = t["t"].as_str().unwrap().to_owned();
        if RECORDS.contains(&name.as_str()) {
            continue;
        }
        let all = JsonValue::find_by_statement(Statement::from_string(
            backend,
            format!("SELECT * FROM \"{name}\""),
        ))
        .all(db)
        .await
        .unwrap();
        let mut all: Vec<JsonValue> = all;
        all.sort_by_key(|v| v.to_string());
        out.insert(name, all);
    }
    out
}

async fn read_only_calls_write_nothing(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    // First use provisions the machine and opens the screen: those are writes.
    tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "a.txt", "content": "hi" }),
    )
    .await;
    tool(&s, &run, fence, "computer_observe", json!({})).await;

    let db = &s.app.db;
    // Recordings of the calls so far are stored in the background: let them land.
    s.app.recorder.settled().await;
    let before = rows(db).await;

    for _ in 0..3 {
        tool(&s, &run, fence, "computer_observe", json!({})).await;
        let read = tool(&s, &run, fence, "read_file", json!({ "path": "a.txt" })).await;
        assert!(read.to_string().contains("hi"), "{read}");
        tool(&s, &run, fence, "list_files", json!({ "path": "" })).await;
    }

    s.app.recorder.settled().await;
    let after = rows(db).await;
    for (table, was) in &before {
        assert_eq!(&after[table], was, "table {table} changed");
    }

    // A mutating call still records use and activity.
    tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "b.txt", "content": "x" }),
    )
    .await;
    assert_ne!(rows(db).await, after, "a write is recorded");
}

#[actix_rt::test]
async fn read_only_tool_calls_write_nothing_sqlite() {
    let s = TestServer::start(Backend::Sqlite, QUIET).await.unwrap();
    read_only_calls_write_nothing(s).await;
}

#[actix_rt::test]
async fn read_only_tool_calls_write_nothing_postgres() {
    let Some(s) = TestServer::start(Backend::Postgres, QUIET).await else {
        return;
    };
    read_only_calls_write_nothing(s).await;
}

#[actix_rt::test]
async fn every_pooled_sqlite_connection_has_the_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/p.db?mode=rwc", dir.path().display());
    let db = rakazo::db::connect(&url).await.unwrap();
    let pool = db.get_sqlite_connection_pool();
    // Hold as many connections as the pool opens at most, so each is a distinct one.
    let mut held = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        held.push(pool.acquire().await.unwrap());
    }
    assert_eq!(pool.size() as usize, held.len());
    for c in &mut held {
        let mode: String = sqlx::query("PRAGMA journal_mode")
            .fetch_one(&mut **c)
            .await
            .unwrap()
            .get(0);
        let sync: i64 = sqlx::query("PRAGMA synchronous")
            .fetch_one(&mut **c)
            .await
            .unwrap()
            .get(0);
        let busy: i64 = sqlx::query("PRAGMA busy_timeout")
            .fetch_one(&mut **c)
            .await
            .unwrap()
            .get(0);
        assert_eq!(mode, "wal");
        assert_eq!(sync, 1, "synchronous=NORMAL");
        assert_eq!(
            busy,
            rakazo::db::SQLITE_BUSY_TIMEOUT.as_millis() as i64,
            "busy_timeout"
        );
    }
}
