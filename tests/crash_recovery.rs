//! Crash recovery through the real binary: `rakazo serve` is killed (`RAKAZO_CRASH_AT`
//! aborts it) at each step of a restore, started again, and must come back with the old home
//! or the restored one, no reservation stuck and no temporary files left.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");

/// One `rakazo serve` child on a data directory.
struct Serve {
    child: Child,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Serve {
    async fn start(data_dir: &Path, provider: &str, crash_at: Option<&str>) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", data_dir)
            .env("SANDBOX_PROVIDER", provider)
            .env("RAKAZO_ENV", "test")
            .env_remove(rakazo::crash_point::CRASH_AT_ENV)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(point) = crash_at {
            cmd.env(rakazo::crash_point::CRASH_AT_ENV, point);
        }
        let child = cmd.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = http
                .get(format!("{base}/internal/health"))
                .send()
                .await
                .is_ok();
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "serve did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let token = std::fs::read_to_string(data_dir.join("operator-token"))
            .unwrap()
            .trim()
            .to_owned();
        Serve {
            child,
            base,
            token,
            http,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let resp = self
            .http
            .post(format!("{}/rpc", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("transport: {e}"))?;
        let v: Value = resp.json().await.map_err(|e| format!("body: {e}"))?;
        match v.get("error") {
            Some(e) => Err(e["data"]["code"].as_str().unwrap_or_default().to_owned()),
            None => Ok(v["result"].clone()),
        }
    }

    async fn ok(&self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e}"),
        }
    }

    async fn run(&self, bot: &str, command: &str) -> String {
        let started = self.ok("run.start", json!({ "botId": bot })).await;
        let (run, fence) = (
            started["run"]["id"].clone(),
            started["lease"]["fence"].clone(),
        );
        let out = self
            .ok(
                "computer.exec",
                json!({ "runId": run, "fence": fence, "command": command }),
            )
            .await;
        self.ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
        out["stdout"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits for the child to end (it crashed); whether it aborted.
    fn crashed(mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return !status.success();
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Live maintenance reservations in the data directory's database.
async fn live_reservations(data_dir: &Path) -> usize {
    use rakazo_actors::entity::lease;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let url = format!("sqlite://{}?mode=rw", data_dir.join("rakazo.db").display());
    let db = rakazo::db::connect(&url).await.unwrap();
    lease::Entity::find()
        .filter(lease::Column::Kind.eq("maintenance"))
        .filter(lease::Column::ReleasedAtMs.is_null())
        .all(&db)
        .await
        .unwrap()
        .len()
}

/// Files a crash may leave that recovery must remove.
fn leftovers(data_dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if [".tmp-", ".old-", ".staging-", ".trash-"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                out.push(entry.path().display().to_string());
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) && name == "chunks"
                || dir.file_name().is_some_and(|n| n == "home-revisions")
            {
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&data_dir.join("homes"), &mut out);
    walk(&data_dir.join("home-revisions"), &mut out);
    out
}

/// Kills every host desktop process a data directory's computers started.
fn sweep_desktops(data_dir: &Path) {
    let prefix = format!("{}/", data_dir.join("run").display());
    let _ = Command::new("bash")
        .arg("-c")
        .arg(rakazo::desktop::command::sweep_script(&prefix))
        .status();
}

/// Where a restore crashed, and whether the restore was recorded by then.
const POINTS: &[(&str, bool)] = &[
    ("home.file_written", false),
    ("restore.saved", false),
    ("restore.recorded", true),
    ("home.staged", true),
    ("home.mid_replace", true),
    ("restore.applied", true),
];

async fn a_crash_at_each_step_of_a_restore_leaves_old_or_restored(provider: &str) {
    for &(point, recorded) in POINTS {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path();
        let s = Serve::start(data, provider, None).await;
        let space = s.ok("space.create", json!({ "name": "Acme" })).await;
        let bot = s
            .ok(
                "bot.create",
                json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" }),
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        s.run(&bot, "echo one > state.txt").await;
        s.run(&bot, "echo two > state.txt && echo later > later.txt")
            .await;
        let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
        s.ok("computer.stop", json!({ "computerId": c["id"] }))
            .await;
        // The stop's own checkpoint may store one more revision (host homes change as they
        // stop).
        let old = s.ok("computer.get", json!({ "computerId": c["id"] })).await["revision"]
            .as_i64()
            .unwrap();
        s.kill();

        let s = Serve::start(data, provider, Some(point)).await;
        let res = s
            .call(
                "computer.restoreRevision",
                json!({ "computerId": c["id"], "revision": 1 }),
            )
            .await;
        assert!(
            res.is_err(),
            "{point}: the restore must not answer: {res:?}"
        );
        assert!(s.crashed(), "{point}: the process aborted");
        assert_eq!(
            live_reservations(data).await,
            1,
            "{point}: the dead process still holds the computer"
        );
        if ["home.file_written", "home.staged", "home.mid_replace"].contains(&point) {
            assert!(!leftovers(data).is_empty(), "{point}: the crash left files");
        }

        let s = Serve::start(data, provider, None).await;
        let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
        let expected = if recorded {
            (Some(old + 1), "one\nstate.txt\n")
        } else {
            (Some(old), "two\nlater.txt\nstate.txt\n")
        };
        assert_eq!(got["revision"].as_i64(), expected.0, "{point}: {got}");
        // The stopped Files view is what the next run sees.
        let view = s
            .ok("files.read", json!({ "botId": bot, "path": "state.txt" }))
            .await;
        assert_eq!(
            view["text"].as_str(),
            expected
                .1
                .lines()
                .next()
                .map(|l| format!("{l}\n"))
                .as_deref(),
            "{point}: the stopped view"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while !leftovers(data).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(leftovers(data), Vec::<String>::new(), "{point}");
        // No reservation stuck: a run starts at once.
        let seen = s.run(&bot, "cat state.txt; ls").await;
        assert_eq!(seen, expected.1, "{point}");
        let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
        assert!(got["pendingRestore"].is_null(), "{point}: {got}");
        s.kill();
        sweep_desktops(data);
    }
}

#[actix_rt::test]
async fn a_crash_during_a_restore_on_the_fake_provider_recovers() {
    a_crash_at_each_step_of_a_restore_leaves_old_or_restored("fake").await;
}

#[actix_rt::test]
async fn a_crash_during_a_restore_on_the_desktop_provider_recovers() {
    a_crash_at_each_step_of_a_restore_leaves_old_or_restored("desktop").await;
}

/// Holds `computer_id` for process `process` whose last heartbeat was `beat_ms` ago.
async fn reserve_for(data_dir: &Path, computer_id: &str, process: &str, beat_ms: i64) {
    use rakazo_actors::entity::{lease, process};
    use rakazo_actors::leases::LeaseKey;
    use sea_orm::{ActiveModelTrait, Set};
    let url = format!("sqlite://{}?mode=rw", data_dir.join("rakazo.db").display());
    let db = rakazo::db::connect(&url).await.unwrap();
    let now = rakazo_actors::clock::now_ms();
    process::ActiveModel {
        id: Set(process.into()),
        started_at_ms: Set(now - beat_ms),
        heartbeat_at_ms: Set(now - beat_ms),
    }
    .insert(&db)
    .await
    .unwrap();
    let key = LeaseKey::maintenance(computer_id);
    lease::ActiveModel {
        id: Set(format!("lease-{process}")),
        computer_id: Set(computer_id.into()),
        kind: Set("maintenance".into()),
        subject: Set(key.subject),
        holder: Set(format!("restore-1@{process}")),
        fence: Set(1),
        expires_at_ms: Set(now + 10 * 60 * 1000),
        released_at_ms: Set(None),
        created_at_ms: Set(now),
    }
    .insert(&db)
    .await
    .unwrap();
}

#[actix_rt::test]
async fn a_reservation_is_released_only_once_its_process_is_provably_gone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let s = Serve::start(data, "fake", None).await;
    let space = s.ok("space.create", json!({ "name": "Acme" })).await;
    let mut computers = Vec::new();
    let mut bots = Vec::new();
    for name in ["silent", "beating"] {
        let bot = s
            .ok(
                "bot.create",
                json!({ "spaceId": space["id"], "name": name, "computerMode": "private" }),
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
        computers.push(c["id"].as_str().unwrap().to_owned());
        bots.push(bot);
    }
    s.kill();
    // Processes on another host (no lock file here): one silent for two minutes, one that
    // beat a second ago and may still be working.
    reserve_for(data, &computers[0], "elsewhere-silent", 120_000).await;
    reserve_for(data, &computers[1], "elsewhere-beating", 1_000).await;

    let s = Serve::start(data, "fake", None).await;
    s.ok("run.start", json!({ "botId": bots[0] })).await;
    assert_eq!(
        s.call("run.start", json!({ "botId": bots[1] }))
            .await
            .unwrap_err(),
        "COMPUTER_RESERVED",
        "a process with a fresh heartbeat keeps its reservation"
    );
    s.kill();
}
