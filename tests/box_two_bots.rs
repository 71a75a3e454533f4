//! Two Team bots at once on a `box-emulator` computer (real containers through an
//! in-process supervisor): Box machines have one desktop, so the first bot gets its screen
//! and the second bot's `computer_observe` answers `MULTI_SCREEN_UNAVAILABLE`, while its
//! `shell` and `write_file` keep working. The first bot's screen is live for people: its view
//! and control URLs through the capability proxy give the machine's RFB stream, reached
//! through Box's protected host URL, and its terminal runs on the machine; nothing the browser
//! gets names the sandbox, the host URL or its token. The second bot's screen URL answers
//! `MULTI_SCREEN_UNAVAILABLE`.

mod box_support;
mod common;
mod docker_support;

use std::time::Duration;

use futures_util::StreamExt as _;
use rakazo::config::DockerNetwork;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest as _};

use common::terminal::TerminalClient;
use common::{Backend, TestServer};
use docker_support::{TestSupervisor, docker_ready};

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    s.ok(
        "tools/call",
        json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
    )
    .await
}

#[actix_rt::test]
async fn the_second_team_bot_gets_no_screen_but_keeps_shell_and_files() {
    if !docker_ready() {
        return;
    }
    let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "box-emulator"),
            ("SANDBOX_SUPERVISOR_URL", &supervisor.url),
            ("SANDBOX_SUPERVISOR_TOKEN", &supervisor.token),
        ],
    )
    .await
    .expect("the app starts");
    assert_eq!(s.health().await["sandbox"], "box-emulator");
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run_a, fence_a) = s.start_run(&bots[0]).await;
    let (run_b, fence_b) = s.start_run(&bots[1]).await;

    let first = tool(&s, &run_a, fence_a, "computer_observe", json!({})).await;
    assert_eq!(first["isError"], false, "{first}");
    assert!(
        first["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "image"),
        "the first bot sees its screen"
    );

    let second = tool(&s, &run_b, fence_b, "computer_observe", json!({})).await;
    assert_eq!(
        (
            second["isError"].as_bool(),
            second["structuredContent"]["error"]["code"].as_str()
        ),
        (Some(true), Some("MULTI_SCREEN_UNAVAILABLE")),
        "{second}"
    );

    let wrote = tool(
        &s,
        &run_b,
        fence_b,
        "write_file",
        json!({ "path": "note.txt", "content": "from b" }),
    )
    .await;
    assert_eq!(wrote["isError"], false, "{wrote}");
    let shell = tool(
        &s,
        &run_b,
        fence_b,
        "shell",
        json!({ "command": "cat note.txt" }),
    )
    .await;
    assert_eq!(shell["structuredContent"]["stdout"], "from b", "{shell}");

    // The first bot's screen is still its own.
    let again = tool(&s, &run_a, fence_a, "computer_observe", json!({})).await;
    assert_eq!(again["isError"], false, "{again}");

    // What the browser must never see: the sandbox, its protected host URL and its token.
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sandbox = s
        .ok("computer.machine", json!({ "computerId": computer }))
        .await["providerRef"]
        .as_str()
        .unwrap()
        .to_owned();
    let api = s
        .app
        .emulator_api
        .clone()
        .expect("the emulator runs in-process");
    let (host, token) = box_support::host_url(&api.url, &api.key, &sandbox).await;
    let api = api.url;
    let secrets = [
        sandbox.as_str(),
        token.as_str(),
        host.trim_end_matches('/'),
        api.as_str(),
        "_token",
    ];
    let hides = |what: &str, text: &str| {
        for secret in secrets {
            assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
        }
    };

    // A person watches the first bot's screen through the capability proxy: a live RFB
    // stream from the machine's gateway, reached through the protected host URL.
    let view = s
        .ok("computer.screenUrl", json!({ "botId": bots[0] }))
        .await;
    hides("computer.screenUrl", &view.to_string());
    let view_url = view["url"].as_str().unwrap().to_owned();
    assert!(view_url.starts_with("/screen/"), "{view_url}");
    let page = s
        .http
        .get(format!("{}{view_url}", s.base))
        .send()
        .await
        .unwrap();
    assert!(page.status().is_success());
    hides("the viewer page", &page.text().await.unwrap());
    assert_eq!(rfb_greeting(&s, &view_url).await, b"RFB 003.008\n");

    // The second bot still gets no screen, for tools or for people.
    let refused = s
        .call("computer.screenUrl", json!({ "botId": bots[1] }))
        .await
        .unwrap_err();
    assert_eq!(refused.1, "MULTI_SCREEN_UNAVAILABLE", "{refused:?}");

    // The first bot's run completes (its screen stays); a person takes control and opens the
    // terminal, both through the same protected host URL.
    s.ok(
        "run.finish",
        json!({ "runId": run_a, "fence": fence_a, "outcome": "completed" }),
    )
    .await;
    let control = s
        .ok("computer.takeControl", json!({ "botId": bots[0] }))
        .await;
    hides("computer.takeControl", &control.to_string());
    let control_url = control["controlUrl"]["url"].as_str().unwrap().to_owned();
    assert_eq!(rfb_greeting(&s, &control_url).await, b"RFB 003.008\n");
    let terminal = s
        .ok("computer.terminalUrl", json!({ "botId": bots[0] }))
        .await;
    hides("computer.terminalUrl", &terminal.to_string());
    let mut shell = TerminalClient::connect(&s.base, terminal["url"].as_str().unwrap())
        .await
        .unwrap();
    shell.send("echo \"box-$((40+2)) $(pwd)\"\r").await;
    shell
        .expect("box-42 /home/user/rakazo-home", Duration::from_secs(20))
        .await;
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bots[0], "fence": control["fence"] }),
    )
    .await;
    s.ok(
        "run.finish",
        json!({ "runId": run_b, "fence": fence_b, "outcome": "failed" }),
    )
    .await;
}

/// The first 12 bytes of the RFB stream behind a screen URL of the capability proxy.
async fn rfb_greeting(s: &TestServer, url: &str) -> Vec<u8> {
    let path = url
        .split('?')
        .next()
        .unwrap()
        .replace("/vnc.html", "/websockify");
    let mut request = format!("{}{path}", s.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 12 {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("RFB data")
        {
            Some(Ok(Message::Binary(b))) => got.extend_from_slice(&b),
            Some(Ok(_)) => {}
            other => panic!("socket ended: {other:?}"),
        }
    }
    got.truncate(12);
    got
}
