//! Stopping `rakazo serve`: SIGTERM drains (a last checkpoint, host desktops stopped) and a
//! start after `kill -9` stops what the killed server left, through the real binary with the
//! host `desktop` provider (Xvfb, fluxbox, Chromium, x11vnc, websockify).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");
/// How long a drain may take (two browsers quit and save their profiles; a machine under load).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);

mod gate;

/// Whether the desktop tools are installed; a missing one fails through the gate.
fn tools_present() -> bool {
    for tool in ["Xvfb", "fluxbox", "chromium", "x11vnc", "websockify"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            gate::missing(tool, gate::CHROMIUM);
            return false;
        }
    }
    true
}

/// One `rakazo serve` process on a data directory.
struct Server {
    child: Child,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Server {
    async fn start(data: &Path, port: u16, log: &str) -> Server {
        let log = std::fs::File::create(data.join(log)).unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", data)
            .env("SANDBOX_PROVIDER", "desktop")
            .env("RAKAZO_ENV", "test")
            .env("RAKAZO_LOG", "info")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(format!("{base}/internal/health")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the server did not answer health"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let token = std::fs::read_to_string(data.join("operator-token"))
            .unwrap()
            .trim()
            .to_owned();
        Server {
            child,
            base,
            token,
            http,
        }
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
        assert!(v.get("error").is_none(), "{method}: {v}");
        v["result"].clone()
    }

    /// Starts a run of each bot, opens its screen, runs a command that changes the workspace,
    /// and opens a view of its screen (the gateway and a VNC server).
    async fn use_screens(&self, bots: &[String], mark: &str) {
        for bot in bots {
            // A run outlives a restart (its lease is in the database): end it first.
            self.ok("bot.stop", json!({ "botId": bot })).await;
            let started = self.ok("run.start", json!({ "botId": bot })).await;
            let (run, fence) = (&started["run"]["id"], &started["lease"]["fence"]);
            self.ok(
                "computer.openScreen",
                json!({ "runId": run, "fence": fence }),
            )
            .await;
            self.ok(
                "computer.exec",
                json!({ "runId": run, "fence": fence, "command": format!("echo {mark} > {mark}-$RANDOM.txt") }),
            )
            .await;
            self.ok("computer.screenUrl", json!({ "botId": bot })).await;
        }
    }

    /// Sends `signal` and waits for the process to end; its exit status.
    fn signal_and_wait(&mut self, signal: &str, timeout: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("the server did not stop within {timeout:?} of {signal}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A process of the server's desktops.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    pid: u32,
    /// Start time in clock ticks (tells a reused pid apart).
    start: u64,
    comm: String,
}

fn stat_of(pid: u32) -> Option<(String, char, u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let rest: Vec<&str> = stat[close + 2..].split(' ').collect();
    // Fields after comm: state(3) ppid(4) pgrp(5) session(6) ... starttime(22).
    let state = rest.first()?.chars().next()?;
    let session = rest.get(3)?.parse().ok()?;
    let start = rest.get(19)?.parse().ok()?;
    Some((comm, state, session, start))
}

/// Every live (not zombie) process tagged by the desktops under `data`, and every other
/// process in their sessions (Chromium's helpers).
fn desktop_processes(data: &Path) -> BTreeSet<Proc> {
    let want = format!(
        "RAKAZO_DESKTOP_TAG={}/",
        data.join("run").join("desktop").display()
    );
    let mut sessions = BTreeSet::new();
    let mut found = BTreeSet::new();
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for &pid in &pids {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let tagged = env
            .split(|b| *b == 0)
            .any(|v| v.starts_with(want.as_bytes()));
        if let (true, Some((comm, state, session, start))) = (tagged, stat_of(pid))
            && state != 'Z'
        {
            sessions.insert(session);
            found.insert(Proc { pid, start, comm });
        }
    }
    for &pid in &pids {
        if let Some((comm, state, session, start)) = stat_of(pid)
            && state != 'Z'
            && sessions.contains(&session)
        {
            found.insert(Proc { pid, start, comm });
        }
    }
    found
}

/// Which of `procs` still run (same pid and start time, not a zombie).
fn still_running(procs: &BTreeSet<Proc>) -> Vec<&Proc> {
    procs
        .iter()
        .filter(|p| {
            stat_of(p.pid).is_some_and(|(_, state, _, start)| state != 'Z' && start == p.start)
        })
        .collect()
}

/// The X displays the Xvfb processes among `procs` serve.
fn displays(procs: &BTreeSet<Proc>) -> Vec<u32> {
    procs
        .iter()
        .filter(|p| p.comm == "Xvfb")
        .filter_map(|p| {
            let cmd = std::fs::read(format!("/proc/{}/cmdline", p.pid)).ok()?;
            cmd.split(|b| *b == 0)
                .find_map(|a| std::str::from_utf8(a).ok()?.strip_prefix(':')?.parse().ok())
        })
        .collect()
}

fn kinds(procs: &BTreeSet<Proc>) -> BTreeSet<String> {
    procs.iter().map(|p| p.comm.clone()).collect()
}

fn log_of(data: &Path, name: &str) -> String {
    std::fs::read_to_string(data.join(name)).unwrap_or_default()
}

/// Kills what a failed test left (the server and every desktop process).
struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in desktop_processes(&self.0) {
            let _ = Command::new("kill")
                .args(["-KILL", &p.pid.to_string()])
                .status();
        }
    }
}

#[tokio::test]
async fn sigterm_drains_and_a_start_after_kill_stops_the_leftovers() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_path_buf();
    let _cleanup = Cleanup(data.clone());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // A run and a screen for two bots of a Team Computer.
    let mut server = Server::start(&data, port, "serve-1.log").await;
    let space = server.ok("space.create", json!({ "name": "Acme" })).await["id"].clone();
    let mut bots = Vec::new();
    for name in ["a", "b"] {
        let bot = server
            .ok(
                "bot.create",
                json!({ "spaceId": space, "name": name, "computerMode": "team" }),
            )
            .await;
        bots.push(bot["id"].as_str().unwrap().to_owned());
    }
    server.use_screens(&bots, "first").await;
    let before = desktop_processes(&data);
    let found = kinds(&before);
    for kind in ["Xvfb", "fluxbox", "chromium", "x11vnc"] {
        assert!(found.contains(kind), "{kind} runs: {found:?}");
    }
    assert!(
        before.iter().any(|p| p.comm.starts_with("websockify")
            || std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| c.windows(10).any(|w| w == b"websockify"))),
        "websockify runs: {found:?}"
    );
    assert_eq!(displays(&before).len(), 2, "one display per bot");

    // SIGTERM: the process exits cleanly, after a last checkpoint, and leaves nothing behind.
    let status = server.signal_and_wait("-TERM", DRAIN_TIMEOUT);
    let log = log_of(&data, "serve-1.log");
    assert!(status.success(), "exit status {status:?}; log:\n{log}");
    assert!(log.contains("server.drained"), "log:\n{log}");
    let left = still_running(&before);
    assert!(left.is_empty(), "left after SIGTERM: {left:?}");
    assert!(
        desktop_processes(&data).is_empty(),
        "no process of the server's desktops remains"
    );

    // The last checkpoint was stored: the next start lists it.
    let mut server = Server::start(&data, port, "serve-2.log").await;
    let computer = server
        .ok("computer.forBot", json!({ "botId": bots[0] }))
        .await;
    let revisions = server
        .ok(
            "computer.revisions",
            json!({ "computerId": computer["id"] }),
        )
        .await;
    assert!(
        revisions
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["reason"] == "shutdown" && r["current"] == true),
        "the drain stored a checkpoint: {revisions}"
    );

    // kill -9: the desktops outlive the server...
    server.use_screens(&bots, "second").await;
    let killed = desktop_processes(&data);
    let used = displays(&killed);
    assert_eq!(used.len(), 2, "one display per bot");
    server.signal_and_wait("-KILL", Duration::from_secs(30));
    assert!(
        !still_running(&killed).is_empty(),
        "a killed server's desktops keep running until the next start"
    );

    // ...until the next start stops them, and their displays are free again.
    let mut server = Server::start(&data, port, "serve-3.log").await;
    let left = still_running(&killed);
    assert!(
        left.is_empty(),
        "left after a restart: {left:?}\nlog:\n{}",
        log_of(&data, "serve-3.log")
    );
    for n in &used {
        let held = std::fs::read_to_string(format!("/tmp/.X{n}-lock"))
            .ok()
            .and_then(|l| l.trim().parse::<u32>().ok())
            .is_some_and(|pid| killed.iter().any(|p| p.pid == pid));
        assert!(
            !held,
            "display :{n} is still held by the killed server's Xvfb"
        );
    }
    server.use_screens(&bots, "third").await;
    assert_eq!(displays(&desktop_processes(&data)).len(), 2);
    let status = server.signal_and_wait("-INT", DRAIN_TIMEOUT);
    assert!(status.success(), "exit status {status:?}");
    assert!(desktop_processes(&data).is_empty());
}
