//! Daytona's official Python SDK (`daytona` on PyPI) against the daytona-emulator, whose
//! sandboxes are real containers of the computer image through an in-process supervisor:
//! create, exec with exit codes, a timeout that really kills, upload/download/list, a
//! preview link, stop, start and delete (`tests/daytona_sdk.py`).

mod docker_support;

use std::net::TcpListener;
use std::time::Duration;

use rakazo::config::DockerNetwork;
use rakazo::emulators::daytona::{DaytonaEmulator, Settings};
use rakazo::emulators::machines::Machines;

use docker_support::{TestSupervisor, docker_ready};

#[allow(clippy::duplicate_mod)]
#[path = "gate/mod.rs"]
mod gate;

fn sdk_installed() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import daytona"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        gate::missing(
            "Daytona's Python SDK (the daytona package)",
            "scripts/test.sh installs it with pip",
        );
    }
    ok
}

/// Starts the emulator on its own thread; returns its base URL.
fn start_emulator(supervisor_url: &str, supervisor_token: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let machines = Machines::new(supervisor_url, supervisor_token, "daytona").unwrap();
    let settings = Settings {
        base_url: base.clone(),
        key: None,
        minute: Duration::from_secs(60),
    };
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let emulator = DaytonaEmulator::new(machines, settings);
            rakazo::emulators::daytona::serve(listener, emulator)
                .unwrap()
                .await
                .unwrap();
        })
    });
    base
}

#[test]
fn the_official_sdk_drives_the_emulator() {
    if !docker_ready() || !sdk_installed() {
        return;
    }
    let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
    let base = start_emulator(&supervisor.url, &supervisor.token);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/daytona_sdk.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .env("DAYTONA_API_URL", format!("{base}/api"))
        .env("DAYTONA_API_KEY", "any-key")
        .env("DAYTONA_TARGET", "us")
        .env_remove("DAYTONA_JWT_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK script failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for step in [
        "create",
        "exec",
        "timeout kills",
        "files",
        "preview link",
        "stop",
        "start",
        "delete",
    ] {
        assert!(
            stdout.contains(&format!("ok {step}\n")),
            "{step} missing:\n{stdout}"
        );
    }
}

#[test]
fn calls_without_a_key_get_the_vendor_error_body() {
    // No machine is reached: no supervisor needed.
    let base = start_emulator("http://127.0.0.1:9", "unused");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let resp = http
            .get(format!("{base}/api/sandbox/nope"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["statusCode"], 401);
        let resp = http
            .get(format!("{base}/api/sandbox/nope"))
            .bearer_auth("k")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["statusCode"], 404);
        assert_eq!(v["source"], "DAYTONA_API");
    });
}
