//! Several processes on one Postgres: two `rakazo serve --no-worker` and one `rakazo worker`
//! (real processes of the built binary, the `fake` provider) share a database and a data
//! directory. One bot is driven through both API processes: exactly one run holds its lease,
//! and a tool call through the process that does not hold the computer's actor is forwarded
//! to the one that does; a takeover through one is refused while the bot runs through the
//! other; releasing control through one closes the terminal socket held through the other;
//! after `kill -9` of the process that owns the computer's actor, another adopts it, the run
//! keeps its one lease, and the idle timer suspends the computer. Two API processes opening
//! the screens of one computer at once share its one slot table, in the process holding it.
//! An MCP session is answered by every API process and outlives the one that opened it.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::terminal::{Ended, TerminalClient};
use futures_util::{SinkExt, StreamExt};
use rakazo_actors::entity::{computer, computer_owner, lease, process, run};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");
/// A silent process is gone after this long (every process of the test uses it).
const GONE_MS: &str = "2000";

/// One child process of the binary.
struct Proc {
    child: Child,
    base: String,
}

impl Proc {
    /// Starts `rakazo <args>` on `data_dir` and `db`, waiting for its health.
    async fn start(args: &[&str], data_dir: &std::path::Path, db: &str) -> Proc {
        Self::start_with(args, data_dir, db, &[]).await
    }

    /// [`Proc::start`], with its own `RAKAZO_PROCESS_GONE_MS`.
    async fn start_gone_after(
        args: &[&str],
        data_dir: &std::path::Path,
        db: &str,
        gone_ms: &str,
    ) -> Proc {
        Self::start_with(args, data_dir, db, &[("RAKAZO_PROCESS_GONE_MS", gone_ms)]).await
    }

    /// [`Proc::start`] with more environment (it wins over the defaults).
    async fn start_with(
        args: &[&str],
        data_dir: &std::path::Path,
        db: &str,
        env: &[(&str, &str)],
    ) -> Proc {
        Self::start_logged(args, data_dir, db, env, None).await
    }

    /// [`Proc::start_with`], its log (standard output) written to `log`.
    async fn start_logged(
        args: &[&str],
        data_dir: &std::path::Path,
        db: &str,
        env: &[(&str, &str)],
        log: Option<&std::path::Path>,
    ) -> Proc {
        let stdout = log.map_or_else(Stdio::null, |path| {
            Stdio::from(std::fs::File::create(path).unwrap())
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(BIN)
            .args(args)
            .args(["--listen", &listen])
            .env("DATA_DIR", data_dir)
            .env("DATABASE_URL", db)
            .env("RAKAZO_ENV", "test")
            .env("SANDBOX_PROVIDER", "fake")
            .env("SANDBOX_IDLE_MS", "3000")
            .env("RAKAZO_PROCESS_GONE_MS", GONE_MS)
            .env("RAKAZO_RECONCILE_INTERVAL_MS", "1000")
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = http.get(format!("{base}/internal/health")).send().await;
            if up.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "rakazo {args:?} answers its health"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Proc { child, base }
    }

    /// SIGTERM: the process stops cleanly; waits for its exit.
    fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap();
    }

    /// `kill -9`: nothing of this process gets to run.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh, migrated database on the test Postgres server and a data directory for the
/// processes sharing it; `None` without a server.
async fn migrated_postgres() -> Option<(String, tempfile::TempDir)> {
    let admin = common::postgres_admin_url()?;
    let url = common::fresh_postgres_db(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(BIN)
        .arg("migrate")
        .env("DATA_DIR", dir.path())
        .env("DATABASE_URL", &url)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    Some((url, dir))
}

/// A JSON-RPC client of one API process.
struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    fn new(p: &Proc, token: &str) -> Api {
        Api {
            base: p.base.clone(),
            token: token.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
        }
    }

    /// The result, or the error's code.
    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let v: Value = self
            .http
            .post(format!("{}/rpc", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match v.get("error") {
            Some(e) => Err(e["data"]["code"]
                .as_str()
                .or(e["message"].as_str())
                .unwrap_or_default()
                .to_owned()),
            None => Ok(v["result"].clone()),
        }
    }

    async fn ok(&self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(code) => panic!("{method} {params}: {code}"),
        }
    }

    /// The `id` of what a call created.
    async fn id(&self, method: &str, params: Value) -> String {
        self.ok(method, params).await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// Every terminal socket is closed as revoked, within a second of `released`.
async fn all_revoked<const N: usize>(shells: [&mut TerminalClient; N], released: Instant) {
    for shell in shells {
        assert_eq!(
            shell.ended(Duration::from_secs(10)).await,
            Ended::Closed("revoked".into())
        );
    }
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "closed after {:?}",
        released.elapsed()
    );
}

/// A space made through `api` and one bot in it: (space, bot).
async fn space_and_bot(api: &Api, bot: &str, mode: &str) -> (String, String) {
    let space = api.id("space.create", json!({ "name": "Acme" })).await;
    let bot = api
        .id(
            "bot.create",
            json!({ "spaceId": space, "name": bot, "computerMode": mode }),
        )
        .await;
    (space, bot)
}

/// The operator token that the processes sharing `data_dir` use.
fn operator_token(data_dir: &std::path::Path) -> String {
    std::fs::read_to_string(data_dir.join("operator-token"))
        .unwrap()
        .trim()
        .to_owned()
}

/// The process owning a computer's actor, if any.
async fn owner(db: &DatabaseConnection, computer_id: &str) -> Option<String> {
    computer_owner::Entity::find_by_id(computer_id)
        .one(db)
        .await
        .unwrap()
        .map(|o| o.process_id)
}

/// The internal address of a process.
async fn address(db: &DatabaseConnection, process_id: &str) -> Option<String> {
    process::Entity::find_by_id(process_id)
        .one(db)
        .await
        .unwrap()
        .and_then(|p| p.address)
}

/// Live execution leases of a bot.
async fn live_execution(db: &DatabaseConnection, computer_id: &str, bot: &str) -> Vec<i64> {
    lease::Entity::find()
        .filter(lease::Column::ComputerId.eq(computer_id))
        .filter(lease::Column::Kind.eq("execution"))
        .filter(lease::Column::Subject.eq(bot))
        .filter(lease::Column::ReleasedAtMs.is_null())
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.fence)
        .collect()
}

type Feed =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A dashboard's live subscription to a space through the process at `base`.
async fn ws_subscribe(base: &str, token: &str, space: &str) -> Feed {
    let url = format!("{}/rpc/ws", base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    for (id, method, params) in [
        (1, "auth", json!({ "token": token })),
        (2, "subscribe", json!({ "spaceId": space })),
    ] {
        let call = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        ws.send(Message::Text(call.to_string().into()))
            .await
            .unwrap();
        ws_expect(&mut ws, |v| v["id"] == id).await;
    }
    ws
}

/// Reads the feed until a message matches (events are matched on their `params`).
async fn ws_expect(ws: &mut Feed, wanted: impl Fn(&Value) -> bool) {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("the awaited message")
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v.get("id").is_some_and(|id| !id.is_null()) {
                assert!(v.get("error").is_none(), "{v}");
            }
            if wanted(&v) || (v["method"] == "event" && wanted(&v["params"])) {
                return;
            }
        }
    }
}

async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn two_api_processes_and_a_worker_share_one_postgres() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let mut a = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let mut b = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let mut worker = Proc::start(&["worker"], dir.path(), &url).await;
    let token = operator_token(dir.path());
    let (api_a, api_b) = (Api::new(&a, &token), Api::new(&b, &token));
    let db = sea_orm::Database::connect(&url).await.unwrap();

    // The worker serves no API.
    let rpc = reqwest::Client::new()
        .post(format!("{}/rpc", worker.base))
        .bearer_auth(&token)
        .json(&json!({ "jsonrpc": "2.0", "id": 1, "method": "space.list" }))
        .send()
        .await
        .unwrap();
    assert_eq!(rpc.status(), 404);

    // A dashboard connected to B sees a run started through A.
    let (space, bot) = space_and_bot(&api_a, "driver", "team").await;
    let watched = api_b
        .id(
            "bot.create",
            json!({ "spaceId": space, "name": "watched", "computerMode": "private" }),
        )
        .await;
    let mut feed = ws_subscribe(&b.base, &token, &space).await;

    // The same bot through both API processes at once: exactly one run holds the lease.
    let (ra, rb) = tokio::join!(
        api_a.call("run.start", json!({ "botId": bot })),
        api_b.call("run.start", json!({ "botId": bot }))
    );
    let (started, refused, driver, other) = match (ra, rb) {
        (Ok(s), Err(e)) => (s, e, &api_a, &api_b),
        (Err(e), Ok(s)) => (s, e, &api_b, &api_a),
        both => panic!("exactly one run.start wins: {both:?}"),
    };
    assert_eq!(refused, "LEASE_HELD");
    let run = started["run"]["id"].as_str().unwrap().to_owned();
    let fence = started["lease"]["fence"].as_i64().unwrap();
    ws_expect(&mut feed, |e| {
        e["topic"] == "run.state" && e["data"]["id"] == run.as_str()
    })
    .await;

    // Driven through both: the computer's actor lives in one process; the other forwards.
    let exec = |api: &'static str| json!({ "runId": run, "fence": fence, "command": format!("echo via-{api} >> log.txt; cat log.txt") });
    let out = driver.ok("computer.exec", exec("driver")).await;
    assert!(out["stdout"].as_str().unwrap().contains("via-driver"));
    let out = other.ok("computer.exec", exec("other")).await;
    assert_eq!(out["stdout"], "via-driver\nvia-other\n", "{out}");
    let team = api_a.id("computer.forBot", json!({ "botId": bot })).await;
    let first_owner = owner(&db, &team).await.expect("an owner");

    // Tool calls through both append to the computer's one timeline: each process chains to
    // the head it last wrote, finds it moved by the other, and the chain stays whole.
    for (i, api) in [driver, other, driver, other, other, driver]
        .into_iter()
        .enumerate()
    {
        let call = json!({ "runId": run, "fence": fence, "name": "shell",
                           "arguments": { "command": format!("echo call-{i}") } });
        let out = api.ok("tools/call", call).await;
        assert_eq!(out["isError"], false, "{out}");
    }
    let verified = rakazo_actors::timeline::verify(&db, &team).await.unwrap();
    assert!(verified.intact, "{verified:?}");

    // A person may not take over through the other process while the bot runs.
    assert_eq!(
        other
            .call("computer.takeControl", json!({ "botId": bot }))
            .await
            .unwrap_err(),
        "STOP_BOT_FIRST"
    );

    // Control of another bot through B, its terminal socket through B; released through A.
    let control = api_b
        .ok("computer.takeControl", json!({ "botId": watched }))
        .await;
    let terminal = api_b
        .ok("computer.terminalUrl", json!({ "botId": watched }))
        .await;
    let mut shell = TerminalClient::connect(&b.base, terminal["url"].as_str().unwrap())
        .await
        .unwrap();
    shell.send("echo alive\r").await;
    shell.expect("alive\r\n", Duration::from_secs(10)).await;
    let released = Instant::now();
    api_a
        .ok(
            "computer.releaseControl",
            json!({ "botId": watched, "fence": control["fence"] }),
        )
        .await;
    all_revoked([&mut shell], released).await;

    // kill -9 of the process owning the team computer's actor: another adopts it.
    let owner_address = address(&db, &first_owner).await.unwrap();
    let survivor = if owner_address == a.base {
        a.kill();
        &api_b
    } else if owner_address == b.base {
        b.kill();
        &api_a
    } else {
        assert_eq!(owner_address, worker.base);
        worker.kill();
        // No reconciler runs in the API processes: the next call takes it over.
        &api_a
    };
    // Calls through the surviving API process go on (a forward to the dead owner is
    // COMPUTER_UNAVAILABLE until its heartbeat is silent; then the computer is taken over).
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        match survivor.call("computer.exec", exec("after")).await {
            Ok(out) => break out,
            Err(code) => {
                assert_eq!(code, "COMPUTER_UNAVAILABLE");
                assert!(
                    Instant::now() < deadline,
                    "the computer is never taken over"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(out["exitCode"], 0, "{out}");
    wait_for(
        "another process adopts the computer",
        Duration::from_secs(30),
        || async { owner(&db, &team).await.is_some_and(|o| o != first_owner) },
    )
    .await;
    let state = computer::Entity::find_by_id(&team)
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_ne!(state, "stopped");

    // The run kept its one lease: same fence, usable through the surviving process.
    assert_eq!(live_execution(&db, &team, &bot).await, vec![fence]);
    survivor
        .ok("run.renew", json!({ "runId": run, "fence": fence }))
        .await;
    assert_eq!(live_execution(&db, &team, &bot).await, vec![fence]);

    // The idle timer of its new owner suspends it once the run ended.
    // Its end checkpoints through the owner, wherever the call came in.
    let finished = survivor
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert!(
        finished["checkpoint"]["saved"].is_i64(),
        "{}",
        finished["checkpoint"]
    );
    wait_for(
        "the adopted computer is suspended when idle",
        Duration::from_secs(60),
        || async {
            computer::Entity::find_by_id(&team)
                .one(&db)
                .await
                .unwrap()
                .is_some_and(|c| c.state == "stopped")
        },
    )
    .await;
    drop(worker);
}

/// Operations are handed over by announcement, whichever process queued them: one on a
/// computer the API process holds runs there (it tears down and provisions that machine);
/// one on a computer no process holds is run by the worker process at once, the queued
/// announcement reaching it through the event relay (its reconciler, which would announce a
/// missed one again, passes only at start-up here).
#[actix_rt::test]
async fn a_queued_operation_runs_where_its_computer_is_held_or_on_the_worker() {
    use rakazo_actors::entity::maintenance_operation;
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let mut api = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let worker = Proc::start_with(
        &["worker"],
        dir.path(),
        &url,
        &[("RAKAZO_RECONCILE_INTERVAL_MS", "3600000")],
    )
    .await;
    let token = operator_token(dir.path());
    let api_a = Api::new(&api, &token);
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let space = api_a.ok("space.create", json!({ "name": "Ops" })).await["id"].clone();
    let bot = api_a
        .ok(
            "bot.create",
            json!({ "spaceId": space, "name": "b", "computerMode": "private" }),
        )
        .await["id"]
        .clone();
    let started = api_a.ok("run.start", json!({ "botId": bot })).await;
    let (run, fence) = (
        started["run"]["id"].clone(),
        started["lease"]["fence"].clone(),
    );
    api_a
        .ok(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "echo kept > kept.txt" }),
        )
        .await;
    api_a
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    let computer = api_a.ok("computer.forBot", json!({ "botId": bot })).await["id"].clone();
    let api_address = address(&db, &owner(&db, computer.as_str().unwrap()).await.unwrap())
        .await
        .unwrap();
    assert_eq!(api_address, api.base, "the API process holds the computer");
    let ran_by = async |method: &str| -> String {
        let op = api_a.ok(method, json!({ "computerId": computer })).await;
        let id = op["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        let done = loop {
            let row = maintenance_operation::Entity::find_by_id(&id)
                .one(&db)
                .await
                .unwrap()
                .unwrap();
            if matches!(row.state.as_str(), "completed" | "failed") {
                break row;
            }
            assert!(
                Instant::now() < deadline,
                "the queued operation runs: {row:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(done.state, "completed", "{done:?}");
        let process = done
            .worker_id
            .unwrap()
            .rsplit_once('@')
            .unwrap()
            .1
            .to_owned();
        address(&db, &process).await.unwrap()
    };
    assert_eq!(ran_by("computer.update").await, api.base);
    // The API process dies: once it is gone nothing holds the computer, and an operation
    // queued through another API process is run by the worker.
    api_a
        .ok("computer.stop", json!({ "computerId": computer }))
        .await;
    api.kill();
    wait_for(
        "the dead process's claim is dropped",
        Duration::from_secs(60),
        || {
            let (db, id) = (db.clone(), computer.as_str().unwrap().to_owned());
            async move { owner(&db, &id).await.is_none() }
        },
    )
    .await;
    let api2 = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let api_a = Api::new(&api2, &token);
    let op = api_a
        .ok("computer.reset", json!({ "computerId": computer }))
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let row = maintenance_operation::Entity::find_by_id(&id)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        if matches!(row.state.as_str(), "completed" | "failed") {
            break row;
        }
        assert!(Instant::now() < deadline, "the worker runs it: {row:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done.state, "completed", "{done:?}");
    let process = done
        .worker_id
        .unwrap()
        .rsplit_once('@')
        .unwrap()
        .1
        .to_owned();
    assert_eq!(address(&db, &process).await.unwrap(), worker.base);
    // The reset restored the last saved workspace.
    let started = api_a.ok("run.start", json!({ "botId": bot })).await;
    let read = api_a
        .ok(
            "computer.exec",
            json!({ "runId": started["run"]["id"], "fence": started["lease"]["fence"], "command": "cat kept.txt" }),
        )
        .await;
    assert_eq!(read["stdout"], "kept\n");
    drop(worker);
    drop(api2);
}

/// Claims decided at the database: a live owner elsewhere keeps the computer, a silent one
/// loses it to exactly one claimant, a released claim is free again.
#[actix_rt::test]
async fn a_claim_stays_with_a_live_owner_and_moves_from_a_silent_one() {
    use rakazo_actors::clock::now_ms;
    use rakazo_actors::owners::{Owner, Owners};
    use sea_orm::{ActiveModelTrait, Set};
    let db = rakazo::db::connect("sqlite::memory:").await.unwrap();
    rakazo::db::migrate(&db).await.unwrap();
    let owners = Owners::new(db.clone());
    let other = |id: &str, beat: i64| process::ActiveModel {
        id: Set(id.into()),
        started_at_ms: Set(beat),
        heartbeat_at_ms: Set(beat),
        address: Set(Some(format!("http://{id}"))),
        host: Set(None),
    };
    other("live", now_ms()).insert(&db).await.unwrap();
    other("silent", now_ms() - 600_000)
        .insert(&db)
        .await
        .unwrap();
    for (computer, by) in [("c-live", "live"), ("c-silent", "silent")] {
        computer_owner::ActiveModel {
            computer_id: Set(computer.into()),
            process_id: Set(by.into()),
            claimed_at_ms: Set(now_ms()),
        }
        .insert(&db)
        .await
        .unwrap();
    }
    assert_eq!(
        owners.claim("c-live").await.unwrap(),
        Owner::Elsewhere {
            process_id: "live".into(),
            address: Some("http://live".into()),
            host: None,
        }
    );
    assert_eq!(owners.claim("c-silent").await.unwrap(), Owner::Me);
    assert_eq!(owners.claim("c-new").await.unwrap(), Owner::Me);
    assert_eq!(owners.holder("c-silent").await.unwrap(), Some(Owner::Me));
    owners.release("c-new").await.unwrap();
    assert_eq!(owners.holder("c-new").await.unwrap(), None);
    // Another process's release does not free this one's claim.
    owners.release("c-live").await.unwrap();
    assert!(matches!(
        owners.holder("c-live").await.unwrap(),
        Some(Owner::Elsewhere { .. })
    ));
}

/// A cleanly stopped process lets its computers go at once: every process here would wait ten
/// minutes for a silent one, yet once the process owning a computer stopped on SIGTERM no
/// claim names it and the other API process runs the bot's next command (taking it over).
#[actix_rt::test]
async fn a_cleanly_stopped_process_lets_its_computers_go_at_once() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let never = "600000";
    let mut a = Proc::start_gone_after(&["serve", "--no-worker"], dir.path(), &url, never).await;
    let b = Proc::start_gone_after(&["serve", "--no-worker"], dir.path(), &url, never).await;
    let token = operator_token(dir.path());
    let (api_a, api_b) = (Api::new(&a, &token), Api::new(&b, &token));
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let (_, bot) = space_and_bot(&api_a, "driver", "team").await;
    let started = api_a.ok("run.start", json!({ "botId": bot })).await;
    let run = started["run"]["id"].as_str().unwrap().to_owned();
    let fence = started["lease"]["fence"].as_i64().unwrap();
    let exec =
        |word: &str| json!({ "runId": run, "fence": fence, "command": format!("echo {word}") });
    api_a.ok("computer.exec", exec("first")).await;
    let computer_id = computer::Entity::find()
        .one(&db)
        .await
        .unwrap()
        .expect("the team computer")
        .id;
    let first = owner(&db, &computer_id).await.expect("a claim");
    assert_eq!(address(&db, &first).await.as_deref(), Some(a.base.as_str()));

    a.terminate();
    assert_eq!(
        owner(&db, &computer_id).await,
        None,
        "the stopped process still claims it"
    );
    let out = api_b.ok("computer.exec", exec("second")).await;
    assert!(out["stdout"].as_str().unwrap().contains("second"), "{out}");
    let next = owner(&db, &computer_id).await.expect("a claim");
    assert_ne!(next, first);
    assert_eq!(address(&db, &next).await.as_deref(), Some(b.base.as_str()));
}

/// `computer.openScreen` of a run through one API process.
async fn open_screen(api: &Api, run: &(String, String, i64)) -> Result<Value, String> {
    let (_, run, fence) = run;
    api.call(
        "computer.openScreen",
        json!({ "runId": run, "fence": fence }),
    )
    .await
}

/// The active screens of a computer as their rows say: (bot, slot, generation).
async fn active_screens(db: &DatabaseConnection, computer_id: &str) -> Vec<(String, i64, i64)> {
    use rakazo_actors::entity::screen;
    let mut rows: Vec<_> = screen::Entity::find()
        .filter(screen::Column::ComputerId.eq(computer_id))
        .filter(screen::Column::State.eq("active"))
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.bot_id,
                r.slot.expect("an active screen names its slot"),
                r.generation,
            )
        })
        .collect();
    rows.sort();
    rows
}

/// The screens of one computer are decided in one process, whichever process is asked: two
/// API processes race to open the screens of three bots of one team computer (screen limit
/// two), each bot through both processes at once, before either holds the computer. Each bot
/// gets one answer from both (one slot, one generation: one driver per display), no two bots
/// share a slot, the limit holds across the processes, and the rows say the same. An eviction
/// asked through both at once takes the idle screen, once, and never a running bot's.
#[actix_rt::test]
async fn two_processes_opening_one_computers_screens_share_one_slot_table() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let limit = [
        ("SANDBOX_TEAM_SCREEN_LIMIT", "2"),
        ("SANDBOX_IDLE_MS", "600000"),
    ];
    let a = Proc::start_with(&["serve", "--no-worker"], dir.path(), &url, &limit).await;
    let b = Proc::start_with(&["serve", "--no-worker"], dir.path(), &url, &limit).await;
    let token = operator_token(dir.path());
    let (api_a, api_b) = (Api::new(&a, &token), Api::new(&b, &token));
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let space = api_a.id("space.create", json!({ "name": "Acme" })).await;
    // Three bots of the team computer, each running (a running bot's screen never gives way).
    let mut runs = Vec::new();
    for (i, name) in ["one", "two", "three"].into_iter().enumerate() {
        let api = if i % 2 == 0 { &api_a } else { &api_b };
        let bot = api
            .id(
                "bot.create",
                json!({ "spaceId": space, "name": name, "computerMode": "team" }),
            )
            .await;
        let started = api.ok("run.start", json!({ "botId": bot })).await;
        runs.push((
            bot,
            started["run"]["id"].as_str().unwrap().to_owned(),
            started["lease"]["fence"].as_i64().unwrap(),
        ));
    }
    let team = api_a
        .id("computer.forBot", json!({ "botId": runs[0].0 }))
        .await;
    assert_eq!(owner(&db, &team).await, None, "no process holds it yet");

    // Six opens at once: every bot through both processes.
    let answers = futures_util::future::join_all(
        runs.iter()
            .flat_map(|r| [open_screen(&api_a, r), open_screen(&api_b, r)]),
    )
    .await;
    let mut opened = Vec::new();
    let mut refused = Vec::new();
    for (r, pair) in runs.iter().zip(answers.chunks(2)) {
        match (&pair[0], &pair[1]) {
            (Ok(x), Ok(y)) => {
                assert_eq!(x, y, "{}: one screen whichever process is asked", r.0);
                opened.push((
                    r.0.clone(),
                    x["slot"].as_i64().unwrap(),
                    x["generation"].as_i64().unwrap(),
                ));
            }
            (Err(x), Err(y)) => {
                assert_eq!(
                    (x.as_str(), y.as_str()),
                    ("MULTI_SCREEN_UNAVAILABLE", "MULTI_SCREEN_UNAVAILABLE")
                );
                refused.push(r.clone());
            }
            other => panic!("{}: two answers for one screen: {other:?}", r.0),
        }
    }
    assert_eq!(
        opened.len(),
        2,
        "the limit holds across processes: {opened:?}"
    );
    assert_ne!(opened[0].1, opened[1].1, "two bots on one slot: {opened:?}");
    let mut numbers: Vec<i64> = opened.iter().map(|o| o.1).collect();
    numbers.sort();
    assert_eq!(
        numbers,
        [0, 1],
        "the holder's one table numbers the slots, lowest free first: {opened:?}"
    );
    opened.sort();
    assert_eq!(active_screens(&db, &team).await, opened);
    let holder = owner(&db, &team)
        .await
        .expect("one process holds the computer");

    // The first opened bot's run completes: its screen stays, idle. The refused bot asks
    // again through both processes: the idle screen gives way, once; the running one stays.
    let idle = runs.iter().find(|r| r.0 == opened[0].0).unwrap().clone();
    let running = opened[1].clone();
    api_b
        .ok(
            "run.finish",
            json!({ "runId": idle.1, "fence": idle.2, "outcome": "completed" }),
        )
        .await;
    assert_eq!(
        active_screens(&db, &team).await,
        opened,
        "a completed run keeps its screen"
    );
    let newcomer = refused.pop().expect("a refused bot");
    let (x, y) = futures_util::future::join(
        open_screen(&api_a, &newcomer),
        open_screen(&api_b, &newcomer),
    )
    .await;
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x, y, "one screen whichever process is asked");
    let idle_slot = opened.iter().find(|o| o.0 == idle.0).unwrap().1;
    assert_eq!(
        x["slot"].as_i64(),
        Some(idle_slot),
        "the evicted screen's slot is the lowest free one again"
    );
    let mut now = vec![
        running.clone(),
        (
            newcomer.0.clone(),
            x["slot"].as_i64().unwrap(),
            x["generation"].as_i64().unwrap(),
        ),
    ];
    now.sort();
    assert_ne!(now[0].1, now[1].1, "two bots on one slot: {now:?}");
    assert_eq!(active_screens(&db, &team).await, now);
    let evicted = {
        use rakazo_actors::entity::screen;
        screen::Entity::find()
            .filter(screen::Column::ComputerId.eq(team.as_str()))
            .filter(screen::Column::BotId.eq(idle.0.as_str()))
            .one(&db)
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(evicted.state, "evicted");
    assert_eq!(evicted.slot, None);
    assert_eq!(
        owner(&db, &team).await,
        Some(holder),
        "the computer stayed where it was"
    );
}

/// A person reaches a bot's terminal through the API process they are connected to, whichever
/// process holds the computer: control is taken through A (which then holds the computer), the
/// terminal URL is asked of B, which has A issue it, and B's proxy relays to the route A holds.
/// Releasing control through B closes the socket. The internal issuing endpoint takes only
/// the internal credential, never an API token.
#[actix_rt::test]
async fn a_terminal_is_reached_through_a_process_that_does_not_hold_the_computer() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let a = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let b = Proc::start(&["serve", "--no-worker"], dir.path(), &url).await;
    let token = operator_token(dir.path());
    let (api_a, api_b) = (Api::new(&a, &token), Api::new(&b, &token));
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let (_, bot) = space_and_bot(&api_a, "watched", "private").await;

    let control = api_a
        .ok("computer.takeControl", json!({ "botId": bot }))
        .await;
    let computer_id = computer::Entity::find()
        .one(&db)
        .await
        .unwrap()
        .expect("the bot's computer")
        .id;
    let holder = owner(&db, &computer_id).await.expect("a claim");
    assert_eq!(
        address(&db, &holder).await.as_deref(),
        Some(a.base.as_str())
    );

    let terminal = api_b
        .ok("computer.terminalUrl", json!({ "botId": bot }))
        .await;
    let path = terminal["url"].as_str().unwrap();
    let mut through_b = TerminalClient::connect(&b.base, path).await.unwrap();
    through_b.send("echo via-b\r").await;
    through_b.expect("via-b\r\n", Duration::from_secs(10)).await;
    // The same URL through the holder itself reaches the same terminal.
    let mut through_a = TerminalClient::connect(&a.base, path).await.unwrap();
    through_a.send("echo via-a\r").await;
    through_a.expect("via-a\r\n", Duration::from_secs(10)).await;
    assert_eq!(
        owner(&db, &computer_id).await.as_deref(),
        Some(holder.as_str()),
        "the computer stayed where it was"
    );

    // An API token, even the operator's, cannot ask for URLs on the internal endpoint.
    let refused = reqwest::Client::new()
        .post(format!("{}/internal/screen-url", a.base))
        .bearer_auth(&token)
        .json(&json!({
            "computerId": computer_id, "botId": bot, "policy": "control",
            "fence": control["fence"], "expiresAtMs": i64::MAX, "channel": "terminal"
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    let released = Instant::now();
    api_b
        .ok(
            "computer.releaseControl",
            json!({ "botId": bot, "fence": control["fence"] }),
        )
        .await;
    all_revoked([&mut through_b, &mut through_a], released).await;
    // The old URL reaches nothing through either process.
    for base in [&a.base, &b.base] {
        assert!(TerminalClient::connect(base, path).await.is_err());
    }
}

/// One MCP request to the process at `base`: (HTTP status, session header, body or null).
async fn mcp(
    base: &str,
    token: &str,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    let http = reqwest::Client::new();
    common::mcp::request(&http, base, Some(token), session, method, params).await
}

/// `initialize` through the process at `base`: the session id.
async fn mcp_session(base: &str, token: &str) -> String {
    let params = json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": { "name": "test", "version": "1" } });
    let (status, session, body) = mcp(base, token, None, "initialize", params).await;
    assert_eq!(status, 200, "{body}");
    session.expect("a session id")
}

/// A `shell` tool call on a session through the process at `base`: (status, body).
async fn mcp_shell(base: &str, token: &str, session: &str, command: &str) -> (u16, Value) {
    let params = json!({ "name": "shell", "arguments": { "command": command } });
    let (status, _, body) = mcp(base, token, Some(session), "tools/call", params).await;
    (status, body)
}

/// The state of a bot's latest run.
async fn run_state(db: &DatabaseConnection, bot: &str) -> String {
    run::Entity::find()
        .filter(run::Column::BotId.eq(bot))
        .order_by_desc(run::Column::CreatedAtMs)
        .one(db)
        .await
        .unwrap()
        .expect("the bot's run")
        .state
}

/// An MCP session is answered by every API process, whichever opened it: used through both,
/// kept alive by calls through one while the other's sweeper looks on, outliving the process
/// that opened it, ended with its checkpoint through the other; one nobody uses ends after
/// its idle time.
#[actix_rt::test]
async fn an_mcp_session_is_answered_by_every_api_process() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let env = [
        ("MCP_SESSION_IDLE_MS", "2000"),
        ("RUN_LEASE_TTL_MS", "2000"),
    ];
    let serve = ["serve", "--no-worker"];
    let mut a = Proc::start_with(&serve, dir.path(), &url, &env).await;
    let b = Proc::start_with(&serve, dir.path(), &url, &env).await;
    let token = operator_token(dir.path());
    let api_b = Api::new(&b, &token);
    let db = sea_orm::Database::connect(&url).await.unwrap();
    let (_, bot) = space_and_bot(&api_b, "remote", "private").await;
    let bot_token = api_b
        .ok("token.createForBot", json!({ "botId": bot }))
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();

    let session = mcp_session(&a.base, &bot_token).await;
    let computer_id = computer::Entity::find()
        .one(&db)
        .await
        .unwrap()
        .expect("the bot's computer")
        .id;
    let fences = live_execution(&db, &computer_id, &bot).await;
    assert_eq!(fences.len(), 1);
    // Calls through either process, then through B alone, over three idle times and three
    // lease lifetimes: all work under the one grant, and A (which opened the session and sees
    // no call for most of it) never ends it.
    let begun = Instant::now();
    let mut calls = 0;
    while begun.elapsed() < Duration::from_secs(6) {
        let base = if calls % 2 == 0 || begun.elapsed() > Duration::from_secs(2) {
            &b.base
        } else {
            &a.base
        };
        let (status, body) = mcp_shell(base, &bot_token, &session, &format!("echo {calls}")).await;
        assert_eq!(status, 200, "call {calls}: {body}");
        assert_eq!(body["result"]["isError"], false, "call {calls}: {body}");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(live_execution(&db, &computer_id, &bot).await, fences);
    assert_eq!(run_state(&db, &bot).await, "running");

    // The process that opened the session goes without a word; the session goes on.
    a.kill();
    let (status, body) = mcp_shell(&b.base, &bot_token, &session, "echo after").await;
    assert_eq!(
        (status, &body["result"]["isError"]),
        (200, &json!(false)),
        "{body}"
    );

    // DELETE through B ends the run as completed, with its checkpoint; then the session is
    // gone everywhere.
    let deleted = reqwest::Client::new()
        .delete(format!("{}/mcp", b.base))
        .bearer_auth(&bot_token)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_eq!(run_state(&db, &bot).await, "completed");
    assert!(live_execution(&db, &computer_id, &bot).await.is_empty());
    let revisions = api_b
        .ok("computer.revisions", json!({ "computerId": computer_id }))
        .await;
    assert!(
        revisions
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["reason"] == "run_ended"),
        "{revisions}"
    );
    let (status, body) = mcp_shell(&b.base, &bot_token, &session, "true").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["data"]["code"], "NOT_FOUND");

    // A session nobody calls ends after its idle time (2 s), through whichever process
    // sweeps first; its run is canceled.
    let idle = mcp_session(&b.base, &bot_token).await;
    assert_eq!(run_state(&db, &bot).await, "running");
    wait_for(
        "the idle session's run ends",
        Duration::from_secs(10),
        || async { run_state(&db, &bot).await == "canceled" },
    )
    .await;
    let (status, body) = mcp_shell(&b.base, &bot_token, &idle, "true").await;
    assert_eq!(status, 404, "{body}");
}

/// Processes on two hosts (`RAKAZO_HOST`): the one not holding the computer cannot reach the
/// holder's gateways on its loopback, so it relays a terminal socket through the holder's own
/// proxy, which opens and checks the capability again; a release through either closes the
/// socket, and the old URL then reaches nothing.
#[actix_rt::test]
async fn a_terminal_is_relayed_through_the_holders_proxy_from_another_host() {
    let Some((url, dir)) = migrated_postgres().await else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let a_log = logs.path().join("a.log");
    let serve = ["serve", "--no-worker"];
    let a_env = [("RAKAZO_HOST", "host-a"), ("RAKAZO_LOG", "info")];
    let a = Proc::start_logged(&serve, dir.path(), &url, &a_env, Some(&a_log)).await;
    let b = Proc::start_with(&serve, dir.path(), &url, &[("RAKAZO_HOST", "host-b")]).await;
    let token = operator_token(dir.path());
    let (api_a, api_b) = (Api::new(&a, &token), Api::new(&b, &token));
    let (_, bot) = space_and_bot(&api_a, "far", "private").await;
    let upgraded = || {
        std::fs::read_to_string(&a_log)
            .unwrap()
            .matches("screen.proxy.websocket_upgraded")
            .count()
    };

    let control = api_a
        .ok("computer.takeControl", json!({ "botId": bot }))
        .await;
    let terminal = api_b
        .ok("computer.terminalUrl", json!({ "botId": bot }))
        .await;
    let path = terminal["url"].as_str().unwrap();
    assert_eq!(upgraded(), 0);
    let mut through_b = TerminalClient::connect(&b.base, path).await.unwrap();
    through_b.send("echo far-away\r").await;
    through_b
        .expect("far-away\r\n", Duration::from_secs(10))
        .await;
    assert_eq!(upgraded(), 1, "A's own proxy relayed the socket B took");

    let released = Instant::now();
    api_b
        .ok(
            "computer.releaseControl",
            json!({ "botId": bot, "fence": control["fence"] }),
        )
        .await;
    all_revoked([&mut through_b], released).await;
    assert!(TerminalClient::connect(&b.base, path).await.is_err());
    assert!(TerminalClient::connect(&a.base, path).await.is_err());
}
