//! Lease round trips through 1, 2 and 4 API processes (`rakazo serve --no-worker`) on one
//! Postgres: eight clients, each a person taking and releasing control of its own bot
//! (`computer.takeControl` + `computer.releaseControl`: a control grant acquired and released
//! through the computer's `LeaseActor`, in whichever process holds the computer), spread over
//! the processes, against the bare insert + update a lease needs at the least, from eight
//! tasks on the same server. Needs `RAKAZO_TEST_POSTGRES_URL`; computers are the in-process
//! `fake` provider. Results are recorded in `BENCHMARKS.md`.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, Database};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");
/// Concurrent clients (one bot each).
const CLIENTS: usize = 8;
/// How long each setting is driven.
const WINDOW: Duration = Duration::from_secs(15);

/// One API process; killed when dropped.
struct Proc(Child, String);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn fresh_db(admin: &str) -> String {
    let name = format!("rakazo_bench_{}", uuid::Uuid::new_v4().simple());
    let conn = Database::connect(admin).await.expect("connect to Postgres");
    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    format!("{base}/{name}")
}

async fn start(dir: &std::path::Path, db: &str) -> Proc {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(BIN)
        .args(["serve", "--no-worker", "--listen", &listen])
        .env("DATA_DIR", dir)
        .env("DATABASE_URL", db)
        .env("RAKAZO_ENV", "test")
        .env("RAKAZO_LOG", "warn")
        .env("SANDBOX_PROVIDER", "fake")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://{listen}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::get(format!("{base}/internal/health"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "the API answers its health");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Proc(child, base)
}

/// A person takes control of `bot` through the API at `base`, then releases it.
async fn control_round_trip(http: &reqwest::Client, base: &str, token: &str, bot: &str) {
    let grant = support::rpc(
        http,
        base,
        token,
        "computer.takeControl",
        json!({ "botId": bot }),
    )
    .await;
    support::rpc(
        http,
        base,
        token,
        "computer.releaseControl",
        json!({ "botId": bot, "fence": grant["fence"] }),
    )
    .await;
}

/// Control round trips per second through `processes` API processes.
async fn through_processes(admin: &str, processes: usize) -> f64 {
    let db = fresh_db(admin).await;
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(BIN)
        .arg("migrate")
        .env("DATA_DIR", dir.path())
        .env("DATABASE_URL", &db)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut procs = Vec::new();
    for _ in 0..processes {
        procs.push(start(dir.path(), &db).await);
    }
    let token = std::fs::read_to_string(dir.path().join("operator-token"))
        .unwrap()
        .trim()
        .to_owned();
    let http = reqwest::Client::new();
    let first = &procs[0].1;
    let space = support::rpc(
        &http,
        first,
        &token,
        "space.create",
        json!({ "name": "bench" }),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let bot = support::rpc(
            &http,
            first,
            &token,
            "bot.create",
            json!({ "spaceId": space, "name": format!("bot-{i}"), "computerMode": "private" }),
        )
        .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let base = procs[i % processes].1.clone();
        // A first grant opens the bot's computer and screen; the rounds then time the lease.
        control_round_trip(&http, &base, &token, &bot).await;
        let (http, token) = (http.clone(), token.clone());
        clients.push(async move {
            let started = Instant::now();
            let mut rounds = 0u64;
            while started.elapsed() < WINDOW {
                control_round_trip(&http, &base, &token, &bot).await;
                rounds += 1;
            }
            rounds as f64 / started.elapsed().as_secs_f64()
        });
    }
    futures_util::future::join_all(clients)
        .await
        .into_iter()
        .sum()
}

/// Bare insert + update round trips per second from `CLIENTS` tasks on the same server.
async fn baseline(admin: &str) -> f64 {
    let db = Database::connect(fresh_db(admin).await).await.unwrap();
    db.execute_unprepared("CREATE TABLE baseline (id TEXT PRIMARY KEY, released BIGINT)")
        .await
        .unwrap();
    let tasks = (0..CLIENTS).map(|_| {
        let db = db.clone();
        async move {
            let started = Instant::now();
            let mut rounds = 0u64;
            while started.elapsed() < WINDOW {
                let id = uuid::Uuid::new_v4().simple().to_string();
                db.execute_unprepared(&format!(
                    "INSERT INTO baseline (id, released) VALUES ('{id}', NULL)"
                ))
                .await
                .unwrap();
                db.execute_unprepared(&format!(
                    "UPDATE baseline SET released = 1 WHERE id = '{id}'"
                ))
                .await
                .unwrap();
                rounds += 1;
            }
            rounds as f64 / started.elapsed().as_secs_f64()
        }
    });
    futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .sum()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Ok(admin) = std::env::var("RAKAZO_TEST_POSTGRES_URL") else {
        eprintln!("RAKAZO_TEST_POSTGRES_URL is not set: nothing measured");
        return;
    };
    println!("| API processes | control round trips/s | bare insert+update/s | ratio |");
    println!("| ---: | ---: | ---: | ---: |");
    for processes in [1, 2, 4] {
        let base = baseline(&admin).await;
        let ours = through_processes(&admin, processes).await;
        println!(
            "| {processes} | {ours:.0} | {base:.0} | {:.2} |",
            ours / base
        );
    }
}
