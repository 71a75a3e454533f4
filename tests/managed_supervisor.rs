//! The first command gives working computers: `rakazo serve` with the default docker provider
//! and no supervisor configured starts its own (`rakazo supervisor`, a child process on
//! loopback with a fresh owner-only token in `DATA_DIR`), health says `sandbox: docker` and
//! `supervisor: managed`, a bot's first `computer_observe` returns a screenshot, and killing
//! serve stops the child. With a pool of computers, the first computer is a pooled one and
//! the pool goes with a graceful stop.

mod docker_support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use docker_support::{RemoveOnDrop, RemoveUnder, docker_ready, space_container};

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
    let (serve, base, http, health) = start_serve(&data_dir, &[]).await;
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

    let (space_id, observed) = first_observe(&http, &base, &data_dir).await;
    let _cleanup = RemoveOnDrop(space_container(&space_id));
    assert_eq!(observed["isError"], false, "{observed}");

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

#[actix_rt::test]
async fn a_new_computer_is_a_pooled_one_and_the_pool_goes_with_serve() {
    if !docker_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().canonicalize().unwrap();
    let warm = [
        ("SANDBOX_DOCKER_WARM_COMPUTERS", "1"),
        ("SANDBOX_DESKTOP_WARM_STACKS", "1"),
    ];
    // Declared before serve: dropped after it is killed, whatever failed.
    let _computers = RemoveUnder(data_dir.clone());
    let (serve, base, http, _) = start_serve(&data_dir, &warm).await;
    let pool_full = || async {
        let started = Instant::now();
        loop {
            let health: Value = http
                .get(format!("{base}/internal/health"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let w = &health["warmDesktops"];
            if w["pooledReady"] == 1 && w["ready"].as_u64() >= Some(1) {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "{health}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    pool_full().await;

    let (space_id, observed) = first_observe(&http, &base, &data_dir).await;
    // Found by its name: a claimed container's labels are the pool's.
    let name = format!("rakazo-team-{space_id}");
    let _cleanup = RemoveOnDrop(name.clone());
    assert_eq!(observed["isError"], false, "{observed}");
    // The Team Computer is the container that was pooled: renamed, its pool label kept.
    let out = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{index .Config.Labels \"rakazo.poolOwner\"}}",
        ])
        .arg(&name)
        .output()
        .unwrap();
    let owner = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        owner.starts_with("api-"),
        "not a pooled container: {owner:?}"
    );
    let log = std::fs::read_to_string(data_dir.join("serve.log")).unwrap();
    assert!(log.contains("docker.computer.claimed"), "{log}");

    // The pool refills; a graceful stop removes the pooled computer, not the one in use.
    pool_full().await;
    let pooled = || {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=rakazo.poolOwner={owner}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .count()
    };
    assert_eq!(pooled(), 2, "the claimed computer and the refill");
    let status = Command::new("kill")
        .args(["-TERM", &serve.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut serve = serve;
    let _ = serve.0.wait();
    assert_eq!(pooled(), 1, "only the computer in use is left");
}

/// Starts `rakazo serve` on `data_dir` with `env` (no supervisor configured: it starts its
/// own) and waits until it is healthy: the process, its base URL, a client and its health.
async fn start_serve(
    data_dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (Serve, String, reqwest::Client, Value) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(data_dir.join("serve.log")).unwrap();
    let serve = Serve(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", data_dir)
            .env_remove("SANDBOX_PROVIDER")
            .env_remove("SANDBOX_SUPERVISOR_URL")
            .env_remove("SANDBOX_SUPERVISOR_TOKEN")
            .env_remove("DATABASE_URL")
            .envs(env.iter().copied())
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
    (serve, base, http, health)
}

/// A space, a team bot and a run, and the bot's first `computer_observe` (which provisions
/// the space's Team Computer): the space id and the call's result, which holds an image.
async fn first_observe(
    http: &reqwest::Client,
    base: &str,
    data_dir: &std::path::Path,
) -> (String, Value) {
    let operator = std::fs::read_to_string(data_dir.join("operator-token")).unwrap();
    let operator = operator.trim();
    let space = rpc(
        http,
        base,
        operator,
        "space.create",
        json!({ "name": "Acme" }),
    )
    .await;
    let bot = rpc(
        http,
        base,
        operator,
        "bot.create",
        json!({ "spaceId": space["id"], "name": "first", "computerMode": "team" }),
    )
    .await;
    let run = rpc(
        http,
        base,
        operator,
        "run.start",
        json!({ "botId": bot["id"] }),
    )
    .await;
    let space_id = space["id"].as_str().unwrap().to_owned();
    let observed = rpc(
        http,
        base,
        operator,
        "tools/call",
        json!({ "runId": run["run"]["id"], "fence": run["lease"]["fence"],
                "name": "computer_observe", "arguments": {} }),
    )
    .await;
    assert!(
        observed["content"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "image")),
        "{observed}"
    );
    (space_id, observed)
}

/// SIGKILL, as `kill -9` would.
fn sigkill(pid: u32) {
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
