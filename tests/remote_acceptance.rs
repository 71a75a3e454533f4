//! The offline acceptance scenario on each remote emulator (`e2b-emulator`,
//! `daytona-emulator`, `box-emulator`), without a model: the whole API on real HTTP with the
//! emulator in-process and its sandboxes real Docker computers; a deterministic page served
//! inside the sandbox is observed and its button clicked by scripted tool calls, the page's
//! server leaves a marker, the recorded tool calls are checked, the shell and file tools run;
//! then the sandbox is deleted through the emulator's own API behind the API's back, and the
//! next use boots a replacement through the stale providerRef with the checkpoint restored.

mod common;
mod docker_support;

use std::time::Duration;

use base64::Engine as _;
use rakazo::config::DockerNetwork;
use serde_json::{Value, json};

use common::{Backend, TestServer};
use docker_support::{TestSupervisor, docker_ready};

/// The page's server, run inside the sandbox as the workspace user on its loopback port 8765:
/// one button over the whole page; a click posts `/clicked`, which appends to `clicked.txt`
/// beside the script (the server-side marker).
const SITE: &str = r#"import http.server, os
HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = b"""<!doctype html><html><head><title>Acceptance</title></head><body style="margin:0">
<button id="go" style="position:fixed;left:0;top:0;width:100vw;height:100vh;border:0;background:#cc00ff;font-size:48px"
 onclick="fetch('/clicked',{method:'POST'}).then(()=>{this.style.background='#00a000';this.textContent='Done'})">Press me</button>
</body></html>"""
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
    def do_POST(self):
        if self.path == "/clicked":
            with open(os.path.join(HERE, "clicked.txt"), "a") as f:
                f.write("clicked\n")
        self.send_response(204)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), H).serve_forever()
"#;

/// Starts the site in the background and waits until it listens.
const START_SITE: &str = "setsid python3 site/server.py >/dev/null 2>&1 </dev/null &
python3 -c 'import socket, time
for _ in range(100):
    try:
        socket.create_connection((\"127.0.0.1\", 8765), 1).close()
        break
    except OSError:
        time.sleep(0.1)
else:
    raise SystemExit(1)'";

/// The page's button color, and how far a captured pixel may be from it.
const BUTTON: [u8; 3] = [0xcc, 0x00, 0xff];

#[actix_rt::test]
async fn the_acceptance_scenario_on_the_e2b_emulator() {
    scenario("e2b").await;
}

#[actix_rt::test]
async fn the_acceptance_scenario_on_the_daytona_emulator() {
    scenario("daytona").await;
}

#[actix_rt::test]
async fn the_acceptance_scenario_on_the_box_emulator() {
    scenario("box").await;
}

/// One tool call; `Ok(result)` for a successful tool, `Err(code)` for a tool error or an RPC
/// error.
async fn tool(
    s: &TestServer,
    run: &str,
    fence: i64,
    name: &str,
    arguments: Value,
) -> Result<Value, String> {
    let r = s
        .call(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await
        .map_err(|(_, code, message)| format!("{code}: {message}"))?;
    if r["isError"] == true {
        let code = r["structuredContent"]["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        return Err(format!(
            "{code}: {}",
            r["content"][0]["text"].as_str().unwrap_or("")
        ));
    }
    Ok(r)
}

/// A tool call expected to succeed.
async fn ok_tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    match tool(s, run, fence, name, arguments).await {
        Ok(r) => r,
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The RGB pixel at the middle of a tool result's screenshot, and the screenshot's bytes.
fn middle_pixel(result: &Value) -> ([u8; 3], Vec<u8>) {
    let image = result["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .expect("the observation carries a screenshot");
    assert_eq!(image["mimeType"], "image/png");
    let png_bytes = base64::engine::general_purpose::STANDARD
        .decode(image["data"].as_str().unwrap())
        .unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes.clone()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let samples = info.color_type.samples();
    let (x, y) = (info.width as usize / 2, info.height as usize / 2);
    let px = &buf[info.line_size * y + x * samples..][..3];
    ([px[0], px[1], px[2]], png_bytes)
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 24)
}

/// The current providerRef of a computer.
async fn provider_ref(s: &TestServer, computer: &str) -> Option<String> {
    let m = s
        .ok("computer.machine", json!({ "computerId": computer }))
        .await;
    m["providerRef"].as_str().map(str::to_owned)
}

/// Deletes sandbox `id` through the emulator's own API, as the vendor's console would.
async fn delete_behind_the_apis_back(s: &TestServer, vendor: &str, id: &str) {
    let api = s
        .app
        .emulator_api
        .clone()
        .expect("the emulator runs in-process");
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let req = match vendor {
        "e2b" => http
            .delete(format!("{}/sandboxes/{id}", api.url))
            .header("X-API-KEY", &api.key),
        "daytona" => http
            .delete(format!("{}/api/sandbox/{id}", api.url))
            .bearer_auth(&api.key),
        "box" => http
            .delete(format!("{}/api/v1/sandboxes/{id}", api.url))
            .bearer_auth(&api.key)
            .header("X-Ascii-Confirm-Delete", id),
        other => unreachable!("{other}"),
    };
    let resp = req.send().await.unwrap();
    assert!(
        resp.status().is_success(),
        "{vendor}: delete answered {}",
        resp.status()
    );
}

async fn scenario(vendor: &str) {
    if !docker_ready() {
        return;
    }
    // Dropped last: the supervisor removes every container of the test, passed or failed.
    let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
    let kind = format!("{vendor}-emulator");
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", &kind),
            ("SANDBOX_SUPERVISOR_URL", &supervisor.url),
            ("SANDBOX_SUPERVISOR_TOKEN", &supervisor.token),
        ],
    )
    .await
    .expect("the app starts");
    let health = s.health().await;
    assert_eq!(health["sandbox"], kind, "{health}");
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;

    // A deterministic page served inside the sandbox.
    ok_tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "site/server.py", "content": SITE }),
    )
    .await;
    let started = ok_tool(&s, &run, fence, "shell", json!({ "command": START_SITE })).await;
    assert_eq!(started["structuredContent"]["exitCode"], 0, "{started}");
    ok_tool(
        &s,
        &run,
        fence,
        "open_path",
        json!({ "path": "http://127.0.0.1:8765/" }),
    )
    .await;

    // Observe until the page shows, then click its button; the page's server sees the click.
    let mut shown = None;
    for _ in 0..40 {
        let seen = ok_tool(&s, &run, fence, "computer_observe", json!({})).await;
        // A screen unchanged since the last look comes without its image (the model keeps
        // the last one): still not the page.
        if seen["structuredContent"]["unchanged"] == true {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let (px, png) = middle_pixel(&seen);
        if near(px, BUTTON) {
            shown = Some(seen);
            break;
        }
        let _ = std::fs::write(
            std::env::temp_dir().join(format!("remote-acceptance-{vendor}.png")),
            png,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let shown = shown.unwrap_or_else(|| {
        panic!(
            "{vendor}: the page never showed; last screen in {}",
            std::env::temp_dir().display()
        )
    });
    let (w, h) = (
        shown["structuredContent"]["width"].as_u64().unwrap(),
        shown["structuredContent"]["height"].as_u64().unwrap(),
    );
    let mut marker = None;
    'click: for _ in 0..3 {
        let acted = ok_tool(
            &s,
            &run,
            fence,
            "computer_act",
            json!({ "actions": [{ "type": "click", "x": w / 2, "y": h / 2 }] }),
        )
        .await;
        assert_eq!(acted["structuredContent"]["completed"], 1, "{acted}");
        for _ in 0..20 {
            if let Ok(read) = tool(
                &s,
                &run,
                fence,
                "read_file",
                json!({ "path": "site/clicked.txt" }),
            )
            .await
            {
                marker = read["structuredContent"]["content"]
                    .as_str()
                    .map(str::to_owned);
                break 'click;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let marker =
        marker.unwrap_or_else(|| panic!("{vendor}: the click never reached the page's server"));
    assert!(marker.starts_with("clicked\n"), "{marker:?}");

    // The shell and file tools on the same computer.
    ok_tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "notes/made-by-bot.txt", "content": "made by the bot\n" }),
    )
    .await;
    let shell = ok_tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": "cat notes/made-by-bot.txt && whoami" }),
    )
    .await;
    assert_eq!(shell["structuredContent"]["exitCode"], 0, "{shell}");
    assert!(
        shell["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .starts_with("made by the bot\n"),
        "{shell}"
    );
    let read = ok_tool(
        &s,
        &run,
        fence,
        "read_file",
        json!({ "path": "notes/made-by-bot.txt" }),
    )
    .await;
    assert_eq!(read["structuredContent"]["content"], "made by the bot\n");

    // The recorded tool calls, newest first.
    let history = s.ok("activity.list", json!({ "botId": bot })).await;
    let recorded: Vec<(&str, &str)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["tool"].as_str().unwrap(),
                e["command"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let tools: Vec<&str> = recorded.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        tools,
        ["shell", "write_file", "open_path", "shell", "write_file"],
        "{history}"
    );
    assert!(
        recorded[0].1.contains("cat notes/made-by-bot.txt"),
        "{history}"
    );
    assert!(
        recorded[2].1.contains("http://127.0.0.1:8765/"),
        "{history}"
    );

    // The run's end checkpoints the workspace.
    let finished = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert_eq!(finished["checkpoint"]["saved"], 1, "{finished}");

    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo unsaved > later.txt")
        .await
        .unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await;
    let computer = computer["id"].as_str().unwrap().to_owned();
    let before = provider_ref(&s, &computer).await.expect("a sandbox runs");

    // The sandbox is deleted behind the API's back.
    delete_behind_the_apis_back(&s, vendor, &before).await;

    // The next use finds it gone or already on its replacement, which holds the checkpoint.
    let mut restored = None;
    for _ in 0..120 {
        match tool(
            &s,
            &run,
            fence,
            "read_file",
            json!({ "path": "notes/made-by-bot.txt" }),
        )
        .await
        {
            Ok(read) => {
                restored = Some(read);
                break;
            }
            Err(e) => {
                assert!(
                    e.starts_with("MACHINE_GONE") || e.starts_with("COMPUTER_UNAVAILABLE"),
                    "{vendor}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let restored = restored.unwrap_or_else(|| panic!("{vendor}: the computer never came back"));
    assert_eq!(
        restored["structuredContent"]["content"],
        "made by the bot\n"
    );
    let after = provider_ref(&s, &computer)
        .await
        .expect("a replacement runs");
    assert_ne!(after, before, "a new sandbox");
    // Work after the checkpoint went with the deleted sandbox.
    assert_eq!(
        s.exec(&run, fence, "cat later.txt").await.unwrap()["exitCode"],
        1
    );
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    s.ok("computer.stop", json!({ "computerId": computer }))
        .await;
}
