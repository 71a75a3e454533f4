//! Crash recovery through the real binary: `rakazo serve` is killed (`RAKAZO_CRASH_AT`
//! aborts it) at each step of a restore, started again, and must come back with the old home
//! or the restored one, no reservation stuck and no temporary files left (and between a
//! delete's stored workspace and its row, with the computer left to delete again); on the fake,
//! desktop and Docker providers (Docker needs an engine and the computer image, see `gate`).

mod docker_support;
#[allow(clippy::duplicate_mod)]
#[path = "gate/mod.rs"]
mod gate;

use std::path::{Path, PathBuf};
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

/// Where a provider's computers live for one test: a data directory, and for Docker the
/// supervisor that shares it.
struct Host {
    provider: &'static str,
    data_dir: PathBuf,
    supervisor: Option<docker_support::TestSupervisor>,
    /// More settings of every `rakazo serve` (the object store's).
    env: Vec<(&'static str, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Host {
    fn new(provider: &'static str) -> Host {
        if provider == "docker" {
            let sup = docker_support::TestSupervisor::start(rakazo::config::DockerNetwork::None);
            return Host {
                provider,
                data_dir: sup.data_dir.clone(),
                supervisor: Some(sup),
                env: Vec::new(),
                _dir: None,
            };
        }
        let dir = tempfile::tempdir().unwrap();
        Host {
            provider,
            data_dir: dir.path().to_path_buf(),
            supervisor: None,
            env: Vec::new(),
            _dir: Some(dir),
        }
    }

    /// A fake-provider host whose revisions live in a fresh bucket of the test S3 server;
    /// `None` when the server is missing (see `gate`).
    async fn fake_on_s3() -> Option<Host> {
        let Ok(endpoint) = std::env::var("RAKAZO_TEST_S3_ENDPOINT") else {
            gate::missing("the S3 server (RAKAZO_TEST_S3_ENDPOINT)", gate::S3);
            return None;
        };
        let bucket = format!("rakazo-{}", uuid::Uuid::new_v4().simple());
        let created = reqwest::Client::new()
            .put(format!("{endpoint}/{bucket}"))
            .send()
            .await
            .unwrap();
        assert!(created.status().is_success(), "the bucket is created");
        let mut host = Host::new("fake");
        host.env = vec![
            ("OBJECT_STORAGE_BUCKET", bucket),
            ("OBJECT_STORAGE_ENDPOINT", endpoint),
            ("OBJECT_STORAGE_REGION", "us-east-1".into()),
            ("OBJECT_STORAGE_ACCESS_KEY_ID", "test".into()),
            ("OBJECT_STORAGE_SECRET_ACCESS_KEY", "test".into()),
        ];
        Some(host)
    }

    async fn serve(&self, crash_at: Option<&str>) -> Serve {
        let env: Vec<(&str, String)> = match &self.supervisor {
            Some(sup) => vec![
                ("SANDBOX_SUPERVISOR_URL", sup.url.clone()),
                ("SANDBOX_SUPERVISOR_TOKEN", sup.token.clone()),
            ],
            None => Vec::new(),
        };
        let env: Vec<(&str, String)> = env.into_iter().chain(self.env.clone()).collect();
        Serve::start_with(&self.data_dir, self.provider, crash_at, &env).await
    }

    /// Removes the computer's container (running or stopped), if any.
    fn remove_container(&self, computer: &str) {
        if self.supervisor.is_none() {
            return;
        }
        let out = Command::new("docker")
            .args(["ps", "-aq", "--no-trunc", "--filter"])
            .arg(format!("label=rakazo.computerId={computer}"))
            .output()
            .unwrap();
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            drop(docker_support::RemoveOnDrop(id.to_owned()));
        }
    }
}

impl Serve {
    async fn start(data_dir: &Path, provider: &str, crash_at: Option<&str>) -> Serve {
        Self::start_with(data_dir, provider, crash_at, &[]).await
    }

    async fn start_with(
        data_dir: &Path,
        provider: &str,
        crash_at: Option<&str>,
        env: &[(&str, String)],
    ) -> Serve {
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
        for (name, value) in env {
            cmd.env(name, value);
        }
        if let Some(point) = crash_at {
            cmd.env(rakazo::crash_point::CRASH_AT_ENV, point);
        }
        let child = cmd.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
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

    /// A private bot in a new space whose run ran `command`, its computer stopped since.
    async fn stopped_private_bot(&self, command: &str) -> (String, Value) {
        let space = self.ok("space.create", json!({ "name": "Acme" })).await;
        let bot = self
            .ok(
                "bot.create",
                json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" }),
            )
            .await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        self.run(&bot, command).await;
        let c = self.ok("computer.forBot", json!({ "botId": bot })).await;
        self.ok("computer.stop", json!({ "computerId": c["id"] }))
            .await;
        (bot, c)
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

impl Drop for Serve {
    fn drop(&mut self) {
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

async fn a_crash_at_each_step_of_a_restore_leaves_old_or_restored(provider: &'static str) {
    for &(point, recorded) in POINTS {
        let host = Host::new(provider);
        let data = host.data_dir.as_path();
        let s = host.serve(None).await;
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
        let _container = RemoveContainer(&host, c["id"].as_str().unwrap().to_owned());
        s.ok("computer.stop", json!({ "computerId": c["id"] }))
            .await;
        // The stop's own checkpoint may store one more revision (host homes change as they
        // stop).
        let old = s.ok("computer.get", json!({ "computerId": c["id"] })).await["revision"]
            .as_i64()
            .unwrap();
        s.kill();

        let s = host.serve(Some(point)).await;
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

        let s = host.serve(None).await;
        let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
        let expected = if recorded {
            (Some(old + 1), "one\nstate.txt\n")
        } else {
            (Some(old), "two\nlater.txt\nstate.txt\n")
        };
        assert_eq!(got["revision"].as_i64(), expected.0, "{point}: {got}");
        assert_eq!(got["providerKind"], provider, "{point}: {got}");
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
        // No reservation stuck: a run starts at once, and its shell sees the same home.
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

/// Docker homes are bind-mounted: a restore on a stopped computer replaces the home's
/// contents in place (`home.staged`, `home.mid_replace` crash before and in the middle of
/// that), and the container's shell then sees the same home as the API.
#[actix_rt::test]
async fn a_crash_during_a_restore_on_the_docker_provider_recovers() {
    if !docker_support::docker_ready() {
        return;
    }
    a_crash_at_each_step_of_a_restore_leaves_old_or_restored("docker").await;
}

/// Removes a computer's container when dropped, so a failing test leaves none behind.
struct RemoveContainer<'a>(&'a Host, String);

impl Drop for RemoveContainer<'_> {
    fn drop(&mut self) {
        self.0.remove_container(&self.1);
    }
}

/// A checkpoint that stored its revision and swapped the latest copy, killed before the row
/// records it: after the restart the stopped Files view reads the recorded revision, not the
/// one a row never named.
#[actix_rt::test]
async fn a_crash_between_a_checkpoints_copy_and_its_row_leaves_the_recorded_revision_in_view() {
    a_checkpoint_killed_before_its_row_leaves_the_recorded_revision(Host::new("fake")).await;
}

/// The same with the object store, whose cache is the latest copy.
#[actix_rt::test]
async fn a_crash_between_a_checkpoints_cache_and_its_row_leaves_the_recorded_revision_in_view() {
    let Some(host) = Host::fake_on_s3().await else {
        return;
    };
    a_checkpoint_killed_before_its_row_leaves_the_recorded_revision(host).await;
}

async fn a_checkpoint_killed_before_its_row_leaves_the_recorded_revision(host: Host) {
    let data = host.data_dir.as_path();
    let s = host.serve(None).await;
    let (bot, c) = s.stopped_private_bot("echo one > state.txt").await;
    let recorded = s.ok("computer.get", json!({ "computerId": c["id"] })).await["revision"]
        .as_i64()
        .unwrap();
    s.kill();

    let s = host.serve(Some("checkpoint.stored")).await;
    let started = s.ok("run.start", json!({ "botId": bot })).await;
    let (run, fence) = (
        started["run"]["id"].clone(),
        started["lease"]["fence"].clone(),
    );
    s.ok(
        "computer.exec",
        json!({ "runId": run, "fence": fence,
                "command": "echo two > state.txt && echo later > later.txt" }),
    )
    .await;
    let finished = s
        .call(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert!(finished.is_err(), "the checkpoint must not answer");
    assert!(s.crashed(), "the process aborted");

    let s = host.serve(None).await;
    // Stopped again (a machine the reconciler adopted takes nothing new to save).
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert_eq!(got["state"], "stopped", "{got}");
    assert_eq!(got["revision"].as_i64(), Some(recorded), "{got}");
    let view = s
        .ok("files.read", json!({ "botId": bot, "path": "state.txt" }))
        .await;
    assert_eq!(view["live"], json!(false), "{view}");
    assert_eq!(
        view["text"], "one\n",
        "the stopped view is the recorded revision"
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
    assert_eq!(names, ["state.txt"], "{listed}");
    assert_eq!(leftovers(data), Vec::<String>::new());
    assert_eq!(s.run(&bot, "cat state.txt; ls").await, "one\nstate.txt\n");
    s.kill();
}

/// A crash while a computer is deleted, after its stored workspace went and before its row:
/// the computer is still there to delete again, and the bot's next computer (same home key)
/// finds none of the deleted one's files.
#[actix_rt::test]
async fn a_crash_while_deleting_leaves_a_computer_to_delete_again_never_its_home() {
    a_deleted_home_never_comes_back(Host::new("fake")).await;
}

/// The same with the object store.
#[actix_rt::test]
async fn a_crash_while_deleting_on_the_object_store_never_brings_the_home_back() {
    let Some(host) = Host::fake_on_s3().await else {
        return;
    };
    a_deleted_home_never_comes_back(host).await;
}

async fn a_deleted_home_never_comes_back(host: Host) {
    let s = host.serve(None).await;
    let (bot, c) = s.stopped_private_bot("echo secret > s.txt").await;
    s.kill();

    let s = host.serve(Some("delete.stored_gone")).await;
    let res = s
        .call("computer.delete", json!({ "computerId": c["id"] }))
        .await;
    assert!(res.is_err(), "the delete must not answer: {res:?}");
    assert!(s.crashed(), "the process aborted");

    let s = host.serve(None).await;
    s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    s.ok("computer.delete", json!({ "computerId": c["id"] }))
        .await;
    assert!(
        s.call("computer.get", json!({ "computerId": c["id"] }))
            .await
            .is_err()
    );
    let next = s.ok("computer.forBot", json!({ "botId": bot })).await;
    assert_ne!(next["id"], c["id"]);
    let listed = s
        .ok("files.list", json!({ "botId": bot, "path": "" }))
        .await;
    assert_eq!(listed["entries"], json!([]), "{listed}");
    assert_eq!(s.run(&bot, "ls").await, "");
    s.kill();
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
        address: Set(None),
        host: Set(None),
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
