//! Two Team bots at once on a `box-emulator` computer (real containers through an
//! in-process supervisor): Box machines have one desktop, so the first bot gets its screen
//! and the second bot's `computer_observe` answers `MULTI_SCREEN_UNAVAILABLE`, while its
//! `shell` and `write_file` keep working.

mod common;
mod docker_support;

use rakazo::config::DockerNetwork;
use serde_json::{Value, json};

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
    s.ok(
        "run.finish",
        json!({ "runId": run_a, "fence": fence_a, "outcome": "failed" }),
    )
    .await;
    s.ok(
        "run.finish",
        json!({ "runId": run_b, "fence": fence_b, "outcome": "failed" }),
    )
    .await;
}
