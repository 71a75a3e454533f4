//! The real `rakazo serve` killed (`kill -9`) while a Docker computer runs, then started again
//! on the same DATA_DIR and database: `computer.stop` stops the container and the row, the
//! idle timer suspends an adopted computer, and every stretch the killed process left open is
//! closed as `reconciled`. Needs a Docker engine and the computer image (see `gate`).

mod docker_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo_actors::entity::computer_run;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::{Value, json};

use docker_support::{RemoveOnDrop, TestSupervisor, docker_ready};

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");

/// One `rakazo serve` child process.
struct Serve {
    child: Child,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Serve {
    /// Starts `rakazo serve` on `data_dir` against the supervisor, waiting for its health.
    async fn start(sup: &TestSupervisor, idle_ms: u64) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", &sup.data_dir)
            .env("RAKAZO_ENV", "test")
            .env("SANDBOX_PROVIDER", "docker")
            .env("SANDBOX_SUPERVISOR_URL", &sup.url)
            .env("SANDBOX_SUPERVISOR_TOKEN", &sup.token)
            .env("SANDBOX_IDLE_MS", idle_ms.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = http.get(format!("{base}/internal/health")).send().await;
            if up.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "rakazo serve answers its health");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let token = std::fs::read_to_string(sup.data_dir.join("operator-token"))
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

    /// `kill -9`: nothing of this process gets to run.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    async fn ok(&self, method: &str, params: Value) -> Value {
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
        assert!(v.get("error").is_none(), "{method} {params}: {v}");
        v["result"].clone()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the container runs, by `docker inspect`.
fn container_running(id: &str) -> bool {
    let out = Command::new("docker")
        .args(["inspect", "--format", "{{.State.Running}}", id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// The running container of a computer, found by its label.
fn computer_container(computer: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=rakazo.computerId={computer}"))
        .output()
        .unwrap();
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(!id.is_empty(), "the computer's container runs");
    id
}

/// End reasons of a computer's stretches, oldest first (`None` while open), read from the
/// database the server uses.
async fn stretches(data_dir: &Path, computer: &str) -> Vec<Option<String>> {
    let url = format!("sqlite://{}?mode=rw", data_dir.join("rakazo.db").display());
    let db = sea_orm::Database::connect(url).await.unwrap();
    let rows = computer_run::Entity::find()
        .filter(computer_run::Column::ComputerId.eq(computer))
        .order_by_asc(computer_run::Column::StartedAtMs)
        .all(&db)
        .await
        .unwrap();
    db.close().await.unwrap();
    rows.into_iter().map(|r| r.end_reason).collect()
}

/// A run of `bot` that used the computer and finished: the computer runs, nothing holds it.
async fn use_computer(s: &Serve, bot: &str) {
    let started = s.ok("run.start", json!({ "botId": bot })).await;
    let run = started["run"]["id"].as_str().unwrap().to_owned();
    let fence = started["lease"]["fence"].as_i64().unwrap();
    let out = s
        .ok(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "echo up" }),
        )
        .await;
    assert_eq!(out["stdout"], "up\n");
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
}

#[actix_rt::test]
async fn after_kill_9_the_restarted_api_stops_and_idle_suspends_the_running_computer() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let idle_off = 0;
    let s = Serve::start(&sup, idle_off).await;
    let space = s.ok("space.create", json!({ "name": "Acme" })).await["id"].clone();
    let bot = s
        .ok(
            "bot.create",
            json!({ "spaceId": space, "name": "b", "computerMode": "private" }),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    use_computer(&s, &bot).await;
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let container = computer_container(&computer);
    let _cleanup = RemoveOnDrop(container.clone());
    s.kill();
    assert!(
        container_running(&container),
        "kill -9 leaves the computer up"
    );

    // Restarted: a stop reaches the container the killed process started.
    let s = Serve::start(&sup, idle_off).await;
    let stopped = s
        .ok("computer.stop", json!({ "computerId": computer }))
        .await;
    assert_eq!(stopped["state"], "stopped");
    assert!(!container_running(&container), "the container stopped");
    assert_eq!(
        stretches(&sup.data_dir, &computer).await,
        [Some("reconciled".into()), Some("stopped".into())]
    );

    // Up again, killed again; restarted with a short idle timeout, nobody calls it.
    use_computer(&s, &bot).await;
    assert!(container_running(&container), "the same container resumed");
    s.kill();
    let s = Serve::start(&sup, 1_000).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let row = s
            .ok("computer.get", json!({ "computerId": computer }))
            .await;
        if row["state"] == "stopped" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the adopted computer's idle timer suspends it: {row}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!container_running(&container), "the container stopped");
    assert_eq!(
        stretches(&sup.data_dir, &computer).await,
        [
            Some("reconciled".into()),
            Some("stopped".into()),
            Some("reconciled".into()),
            Some("idle".into()),
        ]
    );
    s.kill();
}
