//! The first command gives working computers: `rakazo serve` with the default docker provider
//! and no supervisor configured starts its own (`rakazo supervisor`, a child process on
//! loopback with a fresh owner-only token in `DATA_DIR`), health says `sandbox: docker` and
//! `supervisor: managed`, a bot's first `computer_observe` returns a screenshot, and killing
//! serve stops the child.

mod docker_support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use docker_support::{RemoveOnDrop, docker_ready, space_container};

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");

/// Kills serve when the test ends early.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pids of the supervisors whose `--parent` is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let parent_arg = parent.to_string();
        if args.first().is_some_and(|a| a.ends_with(b"rakazo"))
            && args.iter().any(|a| *a == b"supervisor")
            && args
                .windows(2)
                .any(|w| w[0] == b"--parent" && w[1] == parent_arg.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

async fn rpc(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    params: Value,
) -> Value {
    let v: Value = http
        .post(format!("{base}/rpc"))
        .bearer_auth(token)
        .json(&json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}

#[actix_rt::test]
async fn serve_starts_its_own_supervisor_and_computers_work() {
    if !docker_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().canonicalize().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(data_dir.join("serve.log")).unwrap();
    let serve = Serve(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", &data_dir)
            .env_remove("SANDBOX_PROVIDER")
            .env_remove("SANDBOX_SUPERVISOR_URL")
            .env_remove("SANDBOX_SUPERVISOR_TOKEN")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let started = Instant::now();
    let health = loop {
        if let Ok(r) = http.get(format!("{base}/internal/health")).send().await
            && let Ok(v) = r.json::<Value>().await
            && v["status"] == "ok"
        {
            break v;
        }
        let text = std::fs::read_to_string(data_dir.join("serve.log")).unwrap_or_default();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "serve never became healthy: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (health["sandbox"].as_str(), health["supervisor"].as_str()),
        (Some("docker"), Some("managed")),
        "{health}"
    );
    // The child is this serve's, and its token is the owner's only.
    let children = children_of(serve.0.id());
    assert_eq!(children.len(), 1, "{children:?}");
    let token_file = data_dir.join("supervisor-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let log = std::fs::read_to_string(data_dir.join("serve.log")).unwrap();
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(!log.contains(token.trim()), "the token is in the log");
    assert!(log.contains("supervisor.managed.started"), "{log}");

    let operator = std::fs::read_to_string(data_dir.join("operator-token")).unwrap();
    let operator = operator.trim();
    let space = rpc(
        &http,
        &base,
        operator,
        "space.create",
        json!({ "name": "Acme" }),
    )
    .await;
    let bot = rpc(
        &http,
        &base,
        operator,
        "bot.create",
        json!({ "spaceId": space["id"], "name": "first", "computerMode": "team" }),
    )
    .await;
    let run = rpc(
        &http,
        &base,
        operator,
        "run.start",
        json!({ "botId": bot["id"] }),
    )
    .await;
    let space_id = space["id"].as_str().unwrap().to_owned();
    let observed = rpc(
        &http,
        &base,
        operator,
        "tools/call",
        json!({ "runId": run["run"]["id"], "fence": run["lease"]["fence"],
                "name": "computer_observe", "arguments": {} }),
    )
    .await;
    let _cleanup = RemoveOnDrop(space_container(&space_id));
    assert_eq!(observed["isError"], false, "{observed}");
    assert!(
        observed["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "image"),
        "{observed}"
    );

    // Killing serve (no chance to clean up) stops its supervisor.
    let child = children[0];
    let mut serve = serve;
    sigkill(serve.0.id());
    let _ = serve.0.wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(child) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(child), "the supervisor outlived serve");
}

/// SIGKILL, as `kill -9` would.
fn sigkill(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
