//! The `rakazo` binary as an operator runs it.

use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");

#[test]
fn an_unknown_provider_stops_startup_naming_every_accepted_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("serve")
        .env("SANDBOX_PROVIDER", "bogus")
        .env("DATA_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SANDBOX_PROVIDER") && stderr.contains("bogus"));
    for name in rakazo::config::PROVIDERS {
        assert!(stderr.contains(name), "{stderr}");
    }
}

#[test]
fn serve_answers_health_and_migrate_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let status = Command::new(BIN)
            .arg("migrate")
            .env("DATA_DIR", dir.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATA_DIR", dir.path())
        .env("SANDBOX_PROVIDER", "none")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut body = String::new();
    for _ in 0..100 {
        if let Ok(text) = health(port) {
            body = text;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).expect("health answered");
    assert_eq!(
        (v["sandbox"].as_str(), v["database"].as_str()),
        (Some("none"), Some("sqlite"))
    );
    assert!(
        dir.path().join("operator-token").exists(),
        "the operator token is stored under DATA_DIR"
    );
}

fn health(port: u16) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(b"GET /internal/health HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    out.split("\r\n\r\n")
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| std::io::Error::other("no body"))
}

#[test]
fn logs_into_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The default provider with a supervisor named but no token logs a setup error at startup.
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATA_DIR", dir.path())
        .env("SANDBOX_PROVIDER", "docker")
        .env("SANDBOX_SUPERVISOR_URL", "http://127.0.0.1:9")
        .env_remove("SANDBOX_SUPERVISOR_TOKEN")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if health(port).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(logs.contains("sandbox.setup_failed"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs:?}");
}
