//! The computer tools agents call, through JSON-RPC `tools/*` and the MCP endpoint, with the
//! activity feed they leave behind.

mod common;

use std::time::Duration;

use common::{Backend, TestServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    s.ok(
        "tools/call",
        json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
    )
    .await
}

fn has_image(result: &Value) -> bool {
    result["content"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "image")
}

#[actix_rt::test]
async fn tools_work_and_spare_the_model_context() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let listed = s.ok("tools/list", json!({})).await;
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for want in [
        "computer_observe",
        "computer_act",
        "shell",
        "read_file",
        "write_file",
        "list_files",
        "attach_file",
        "open_path",
        "launch_app",
        "request_takeover",
    ] {
        assert!(names.contains(&want), "{want} missing");
    }
    assert!(
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["inputSchema"]["type"] == "object")
    );

    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    // Files round trip; an oversized read is refused with its code.
    let wrote = tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "notes/a.md", "content": "hello" }),
    )
    .await;
    assert_eq!(wrote["isError"], false);
    let read = tool(
        &s,
        &run,
        fence,
        "read_file",
        json!({ "path": "notes/a.md" }),
    )
    .await;
    assert_eq!(read["structuredContent"]["content"], "hello");
    let big = "x".repeat(9 * 1024 * 1024);
    tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "big.bin", "content": big }),
    )
    .await;
    let refused = tool(&s, &run, fence, "read_file", json!({ "path": "big.bin" })).await;
    assert_eq!(
        (
            refused["isError"].as_bool(),
            refused["structuredContent"]["error"]["code"].as_str()
        ),
        (Some(true), Some("TOO_LARGE"))
    );
    let shell = tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": "cat notes/a.md" }),
    )
    .await;
    assert_eq!(
        (
            shell["structuredContent"]["exitCode"].as_i64(),
            shell["structuredContent"]["stdout"].as_str()
        ),
        (Some(0), Some("hello"))
    );

    // Two identical observes: the second carries no image bytes and says so.
    let first = tool(&s, &run, fence, "computer_observe", json!({})).await;
    assert!(has_image(&first));
    let second = tool(&s, &run, fence, "computer_observe", json!({})).await;
    assert!(!has_image(&second));
    assert_eq!(second["structuredContent"]["unchanged"], true);
    assert!(
        second["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("previous screenshot remains valid")
    );

    // The same no-op click is refused after it left the screen unchanged twice.
    let click = json!({ "actions": [{ "type": "click", "x": 5, "y": 5 }] });
    let moved = tool(&s, &run, fence, "computer_act", click.clone()).await;
    assert_eq!(moved["structuredContent"]["completed"], 1);
    for _ in 0..2 {
        let same = tool(&s, &run, fence, "computer_act", click.clone()).await;
        assert_eq!(same["isError"], false);
    }
    let refused = tool(&s, &run, fence, "computer_act", click).await;
    assert_eq!(
        refused["structuredContent"]["error"]["code"],
        "REPEATED_NO_OP"
    );
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("browser_snapshot")
    );

    // A caller without vision gets no images and is pointed at page tools or takeover.
    let blind = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": "computer_act", "vision": false,
                                  "arguments": { "actions": [{ "type": "type", "text": "hi" }] } }),
        )
        .await;
    assert!(!has_image(&blind));
    assert!(
        blind["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("request_takeover")
    );

    // request_takeover puts the run in waiting_takeover.
    tool(
        &s,
        &run,
        fence,
        "request_takeover",
        json!({ "reason": "2FA" }),
    )
    .await;
    assert_eq!(
        s.ok("run.get", json!({ "runId": run })).await["state"],
        "waiting_takeover"
    );
}

#[actix_rt::test]
async fn activity_lists_exactly_the_mutating_calls_live_and_redacted() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (space, bots) = s.space_with_bots(1, "team").await;
    let url = format!("{}/rpc/ws", s.base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let send = |v: Value| Message::Text(v.to_string().into());
    ws.send(send(json!({ "jsonrpc": "2.0", "id": 1, "method": "auth", "params": { "token": s.operator_token } }))).await.unwrap();
    ws.send(send(
        json!({ "jsonrpc": "2.0", "id": 2, "method": "subscribe", "params": { "spaceId": space } }),
    ))
    .await
    .unwrap();
    for _ in 0..2 {
        ws.next().await.unwrap().unwrap();
    }
    let (run, fence) = s.start_run(&bots[0]).await;
    tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": "GITHUB_TOKEN=ghp_abcdefghijklmnopqrstu echo deploy" }),
    )
    .await;
    tool(
        &s,
        &run,
        fence,
        "write_file",
        json!({ "path": "shared/r.txt", "content": "12345" }),
    )
    .await;
    tool(
        &s,
        &run,
        fence,
        "read_file",
        json!({ "path": "shared/r.txt" }),
    )
    .await;
    tool(&s, &run, fence, "list_files", json!({ "path": "shared" })).await;

    let history = s.ok("activity.list", json!({ "botId": bots[0] })).await;
    let items = history.as_array().unwrap();
    assert_eq!(items.len(), 2, "{history}");
    assert_eq!(
        (items[0]["tool"].as_str(), items[0]["sizeBytes"].as_i64()),
        (Some("write_file"), Some(5))
    );
    assert_eq!(items[1]["tool"], "shell");
    let command = items[1]["command"].as_str().unwrap();
    assert!(
        !command.contains("ghp_") && command.contains("[redacted]"),
        "{command}"
    );
    assert_eq!(items[1]["outputTail"], "deploy\n");

    // A live subscriber got them as they happened.
    let mut live = Vec::new();
    while live.len() < 2 {
        let msg = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(&t).unwrap();
        if v["params"]["topic"] == "computer.command" {
            live.push(v["params"]["data"]["tool"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(live, ["shell", "write_file"]);
}

#[actix_rt::test]
async fn an_ecosystem_mcp_client_drives_the_computer() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let token = s
        .ok("token.createForBot", json!({ "botId": bots[0] }))
        .await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/checks/mcp_client.py");
    let url = format!("{}/mcp", s.base);
    let out = tokio::process::Command::new("python3")
        .args([script, &url, &token])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["tools"].as_array().unwrap().iter().any(|t| t == "shell"));
    assert_eq!(v["shell"]["structured"]["stdout"], "hello from mcp\n");
    assert!(
        v["observe"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "image")
    );
    assert_eq!(v["observe_again"]["structured"]["unchanged"], true);
    // Closing the session ended its run with a checkpoint and released the bot for the next
    // driver.
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    assert!(run_ended_revision(&s, c["id"].as_str().unwrap()).await);
    s.start_run(&bots[0]).await;
    // A token not scoped to a bot cannot use the endpoint.
    let resp = s
        .http
        .post(&url)
        .bearer_auth(&s.operator_token)
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
}

/// A bot's own API token.
async fn bot_token(s: &TestServer, bot: &str) -> String {
    s.ok("token.createForBot", json!({ "botId": bot })).await["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// One MCP request: (HTTP status, the session header, the body or null).
async fn mcp(
    s: &TestServer,
    token: &str,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    common::mcp::request(&s.http, &s.base, Some(token), session, method, params).await
}

/// `DELETE /mcp` of a session; the HTTP status.
async fn mcp_delete(s: &TestServer, token: &str, session: &str) -> u16 {
    s.http
        .delete(format!("{}/mcp", s.base))
        .bearer_auth(token)
        .header("mcp-session-id", session)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `initialize` as a bot: (session id, run id, fence, computer id).
async fn mcp_session(s: &TestServer, token: &str, bot: &str) -> (String, String, i64, String) {
    let (status, session, body) = mcp(
        s,
        token,
        None,
        "initialize",
        json!({ "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": { "name": "test", "version": "1" } }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let st = s.ok("bot.status", json!({ "botId": bot })).await;
    (
        session.expect("a session id"),
        st["run"]["id"].as_str().unwrap().to_owned(),
        st["run"]["leaseFence"].as_i64().unwrap(),
        st["computer"]["id"].as_str().unwrap().to_owned(),
    )
}

/// A shell command through an MCP session; the HTTP status and the tool's result.
async fn mcp_shell(s: &TestServer, token: &str, session: &str, command: &str) -> (u16, Value) {
    let (status, _, body) = mcp(
        s,
        token,
        Some(session),
        "tools/call",
        json!({ "name": "shell", "arguments": { "command": command } }),
    )
    .await;
    (status, body)
}

async fn run_ended_revision(s: &TestServer, computer: &str) -> bool {
    s.ok("computer.revisions", json!({ "computerId": computer }))
        .await
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["reason"] == "run_ended" && r["current"] == true)
}

/// An MCP lifecycle scenario on both databases.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[actix_rt::test] async fn $name() { super::$name(super::Backend::Sqlite).await } )*
        }
        mod postgres {
            $( #[actix_rt::test] async fn $name() { super::$name(super::Backend::Postgres).await } )*
        }
    };
}

on_both!(
    an_mcp_session_outlives_its_lease_while_used_and_delete_checkpoints,
    an_idle_mcp_session_ends_with_a_checkpoint_and_a_stopped_run_ends_its_session,
);

async fn an_mcp_session_outlives_its_lease_while_used_and_delete_checkpoints(backend: Backend) {
    use rakazo_actors::leases::{LeaseKey, Leases};
    let Some(s) = TestServer::start(backend, &[("RUN_LEASE_TTL_MS", "2000")]).await else {
        return;
    };
    let (_, bots) = s.space_with_bots(2, "private").await;
    let (token, other) = (bot_token(&s, &bots[0]).await, bot_token(&s, &bots[1]).await);
    let (session, run, fence, computer) = mcp_session(&s, &token, &bots[0]).await;
    let key = LeaseKey::execution(&computer, &bots[0]);
    let leases = Leases::new(s.app.db.clone());
    let granted = leases.live(&key).await.unwrap().unwrap();
    assert!(granted.expires_at_ms <= rakazo_actors::clock::now_ms() + 2000);

    // Calls spread over two and a half lease lifetimes all work, under the same grant.
    let begun = std::time::Instant::now();
    let mut calls = 0;
    while begun.elapsed() < Duration::from_millis(5000) {
        let (status, body) =
            mcp_shell(&s, &token, &session, &format!("echo {calls} >> calls.txt")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["isError"], false, "call {calls}: {body}");
        calls += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let live = leases.live(&key).await.unwrap().expect("the lease is live");
    assert_eq!(live.fence, fence);
    assert!(live.expires_at_ms > granted.expires_at_ms);

    // Another bot cannot end the session (it does not exist for that bot).
    assert_eq!(mcp_delete(&s, &other, &session).await, 404);
    let (status, body) = mcp_shell(&s, &token, &session, "true").await;
    assert_eq!((status, &body["result"]["isError"]), (200, &json!(false)));

    // DELETE ends the run as completed and stores a checkpoint revision.
    assert_eq!(mcp_delete(&s, &token, &session).await, 204);
    let r = s.ok("run.get", json!({ "runId": run })).await;
    assert_eq!(r["state"], "completed");
    assert!(run_ended_revision(&s, &computer).await);
    assert!(leases.live(&key).await.unwrap().is_none());
    // The session is gone: 404, which tells a client to start a new one.
    let (status, body) = mcp_shell(&s, &token, &session, "true").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["data"]["code"], "NOT_FOUND");
    assert_eq!(mcp_delete(&s, &token, &session).await, 404);
}

async fn an_idle_mcp_session_ends_with_a_checkpoint_and_a_stopped_run_ends_its_session(
    backend: Backend,
) {
    let Some(s) = TestServer::start(backend, &[("MCP_SESSION_IDLE_MS", "1000")]).await else {
        return;
    };
    let (_, bots) = s.space_with_bots(2, "private").await;
    let token = bot_token(&s, &bots[0]).await;
    let (session, run, _, computer) = mcp_session(&s, &token, &bots[0]).await;
    let (status, body) = mcp_shell(&s, &token, &session, "echo work > work.txt").await;
    assert_eq!((status, &body["result"]["isError"]), (200, &json!(false)));
    // A call longer than the idle time is use: the session is not ended under it, and its
    // idle time starts when the call is answered.
    let long_call = rakazo_actors::clock::now_ms();
    let (status, body) = mcp_shell(&s, &token, &session, "sleep 2").await;
    assert_eq!(
        (status, &body["result"]["isError"]),
        (200, &json!(false)),
        "{body}"
    );

    // Without a call for a second, the session ends: its run is canceled and checkpointed.
    let mut state = Value::Null;
    for _ in 0..100 {
        state = s.ok("run.get", json!({ "runId": run })).await["state"].clone();
        if state != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "canceled");
    let r = s.ok("run.get", json!({ "runId": run })).await;
    assert!(r["endedAtMs"].as_i64().unwrap() >= long_call + 3000, "{r}");
    let mut saved = false;
    for _ in 0..100 {
        saved = run_ended_revision(&s, &computer).await;
        if saved {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(saved, "the idle end stored a checkpoint");
    let (status, body) = mcp_shell(&s, &token, &session, "true").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["data"]["code"], "NOT_FOUND");

    // A run stopped by a person ends its session as well.
    let token = bot_token(&s, &bots[1]).await;
    let (session, _, _, _) = mcp_session(&s, &token, &bots[1]).await;
    s.ok("bot.stop", json!({ "botId": bots[1] })).await;
    let mut status = 0;
    for _ in 0..50 {
        status = mcp(&s, &token, Some(&session), "ping", json!({})).await.0;
        if status == 404 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 404);
}

/// The code and message of a failed tool result, checking the text says the same.
fn tool_error(result: &Value) -> (String, String) {
    assert_eq!(result["isError"], true, "{result}");
    let e = &result["structuredContent"]["error"];
    let (code, message) = (
        e["code"].as_str().unwrap().to_owned(),
        e["message"].as_str().unwrap().to_owned(),
    );
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(&format!("{code}: ")) && text.contains(&message),
        "{text}"
    );
    (code, message)
}

#[actix_rt::test]
async fn every_bad_action_says_its_code_and_reason() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let act = |actions: Value| {
        let (s, run) = (&s, run.clone());
        async move {
            tool(
                s,
                &run,
                fence,
                "computer_act",
                json!({ "actions": actions }),
            )
            .await
        }
    };
    // Each kind of step the screen cannot do: the code, the step and why.
    let long = "x".repeat(10_001);
    let cases = [
        (
            json!({ "type": "click", "x": 5000, "y": 10 }),
            "action 1 of 1 (click) was not done: point (5000, 10) is outside the 160x100 screen",
        ),
        (
            json!({ "type": "move", "x": -1, "y": 10 }),
            "action 1 of 1 (move) was not done: point (-1, 10) is outside the 160x100 screen",
        ),
        (
            json!({ "type": "drag", "from_x": 1, "from_y": 1, "to_x": 1, "to_y": 400 }),
            "action 1 of 1 (drag) was not done: point (1, 400) is outside the 160x100 screen",
        ),
        (
            json!({ "type": "key", "keys": "ctrl+foo" }),
            "action 1 of 1 (key) was not done: unknown key \"foo\"",
        ),
        (
            json!({ "type": "key", "keys": " " }),
            "action 1 of 1 (key) was not done: empty key combination",
        ),
        (
            json!({ "type": "scroll", "x": 5, "y": 5, "dx": 0, "dy": 500 }),
            "action 1 of 1 (scroll) was not done: scroll of (0, 500) notches: at most 100 each way",
        ),
        (
            json!({ "type": "wait", "ms": 60000 }),
            "action 1 of 1 (wait) was not done: wait of 60000 ms: at most 10000 ms",
        ),
        (
            json!({ "type": "type", "text": long }),
            "action 1 of 1 (type) was not done: text of 10001 characters: at most 10000 per type action",
        ),
    ];
    for (step, want) in cases {
        let r = act(json!([step])).await;
        assert_eq!(
            tool_error(&r),
            ("INVALID_PARAMS".to_owned(), want.to_owned()),
            "{step}"
        );
        assert_eq!(r["structuredContent"]["completed"], 0);
        assert!(
            r["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("Only 0 of 1 actions completed")
        );
    }
    // A batch stops at its bad step: the steps before it are done and the frame comes back.
    let r =
        act(json!([{ "type": "move", "x": 3, "y": 3 }, { "type": "click", "x": 10, "y": 999 }]))
            .await;
    let (code, message) = tool_error(&r);
    assert_eq!(code, "INVALID_PARAMS");
    assert!(message.starts_with("action 2 of 2 (click)"), "{message}");
    assert_eq!(
        (
            r["structuredContent"]["completed"].as_u64(),
            r["structuredContent"]["error"]["index"].as_u64(),
            r["structuredContent"]["error"]["reason"].as_str(),
        ),
        (
            Some(1),
            Some(1),
            Some("point (10, 999) is outside the 160x100 screen")
        )
    );
    assert!(has_image(&r));

    // Batches and arguments that are wrong as a whole.
    for (args, want) in [
        (
            json!({ "actions": [] }),
            "actions holds 0 steps: give 1 to 50",
        ),
        (
            json!({ "actions": vec![json!({ "type": "wait", "ms": 0 }); 51] }),
            "actions holds 51 steps: give 1 to 50",
        ),
        (
            json!({ "actions": [{ "type": "hover", "x": 1, "y": 1 }] }),
            "unknown variant `hover`",
        ),
        (
            json!({ "actions": [{ "type": "click", "x": 1 }] }),
            "missing field `y`",
        ),
        (json!({}), "missing field `actions`"),
    ] {
        let r = tool(&s, &run, fence, "computer_act", args.clone()).await;
        let (code, message) = tool_error(&r);
        assert_eq!(code, "INVALID_PARAMS", "{args}");
        assert!(message.contains(want), "{args}: {message}");
    }

    // The other tools: the same shape, each with its own code.
    for (name, args, want_code, want) in [
        (
            "no_such_tool",
            json!({}),
            "INVALID_PARAMS",
            "unknown tool `no_such_tool`",
        ),
        (
            "shell",
            json!({ "command": " " }),
            "INVALID_PARAMS",
            "command must be",
        ),
        (
            "shell",
            json!({ "cmd": "ls" }),
            "INVALID_PARAMS",
            "unknown field `cmd`",
        ),
        (
            "read_file",
            json!({ "path": "missing.txt" }),
            "NOT_FOUND",
            "missing.txt",
        ),
        (
            "read_file",
            json!({ "path": "../../../etc/passwd" }),
            "PATH_REJECTED",
            "outside",
        ),
        (
            "write_file",
            json!({ "path": "a.txt" }),
            "INVALID_PARAMS",
            "exactly one of content",
        ),
        (
            "write_file",
            json!({ "path": "a.txt", "content_base64": "%%" }),
            "INVALID_PARAMS",
            "not base64",
        ),
        (
            "list_files",
            json!({ "path": "nowhere" }),
            "NOT_FOUND",
            "nowhere",
        ),
        (
            "open_path",
            json!({ "path": "../x" }),
            "PATH_REJECTED",
            "outside",
        ),
        (
            "launch_app",
            json!({ "command": "" }),
            "INVALID_PARAMS",
            "command is empty",
        ),
    ] {
        let r = tool(&s, &run, fence, name, args.clone()).await;
        let (code, message) = tool_error(&r);
        assert_eq!(code, want_code, "{name} {args}: {message}");
        assert!(message.contains(want), "{name} {args}: {message}");
    }
}

/// `list_files` shows a folder's first 1000 entries by name, says how many it has and where
/// the next page starts, so a huge folder does not fill the model's context and can still be
/// read to its end; a smaller one comes whole.
#[actix_rt::test]
async fn a_large_folder_is_listed_in_part_with_its_total() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let names: Vec<String> = (0..1005).rev().map(|i| format!("f{i:04}")).collect();
    let made = tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": format!("mkdir big && cd big && touch {}", names.join(" ")) }),
    )
    .await;
    assert_eq!(made["structuredContent"]["exitCode"], 0, "{made}");
    let listed = tool(&s, &run, fence, "list_files", json!({ "path": "big" })).await;
    let out = &listed["structuredContent"];
    let entries = out["entries"].as_array().unwrap();
    assert_eq!(entries.len(), rakazo::tools::MAX_LISTED);
    assert_eq!(
        (out["total"].as_u64(), out["truncated"].as_bool()),
        (Some(1005), Some(true))
    );
    assert_eq!(
        (entries[0]["name"].as_str(), entries[999]["name"].as_str()),
        (Some("f0000"), Some("f0999"))
    );
    let shown = listed["content"][0]["text"].as_str().unwrap();
    assert_eq!(out["next"], "f1000");
    assert!(
        shown.contains("(1005 in the folder") && shown.contains("from \"f1000\" for the next"),
        "{shown}"
    );
    assert!(!shown.contains("f1000 0"), "{shown}");
    let rest = tool(
        &s,
        &run,
        fence,
        "list_files",
        json!({ "path": "big", "from": "f1000" }),
    )
    .await;
    let out = &rest["structuredContent"];
    assert_eq!(out["entries"].as_array().unwrap().len(), 5, "{rest}");
    assert_eq!(
        (out["truncated"].as_bool(), &out["next"]),
        (Some(false), &json!(null))
    );
    assert_eq!(
        rest["content"][0]["text"],
        "f1000 0\nf1001 0\nf1002 0\nf1003 0\nf1004 0"
    );

    tool(
        &s,
        &run,
        fence,
        "shell",
        json!({ "command": "mkdir small && touch small/a small/b" }),
    )
    .await;
    let small = tool(&s, &run, fence, "list_files", json!({ "path": "small" })).await;
    let out = &small["structuredContent"];
    assert_eq!(
        (out["total"].as_u64(), out["truncated"].as_bool()),
        (Some(2), Some(false))
    );
    assert_eq!(small["content"][0]["text"], "a 0\nb 0");
}

#[actix_rt::test]
async fn team_paths_mean_the_bots_folder_in_every_tool() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let call = |name: &'static str, arguments: Value| {
        let (s, run) = (&s, run.clone());
        async move {
            let r = tool(s, &run, fence, name, arguments.clone()).await;
            assert_eq!(r["isError"], false, "{name} {arguments}: {r}");
            r["structuredContent"].clone()
        }
    };
    let sh = |command: &'static str| call("shell", json!({ "command": command }));
    let stdout = |v: Value| v["stdout"].as_str().unwrap().to_owned();

    // The bot's folder: an empty listing before anything is in it, and where the shell starts.
    assert_eq!(call("list_files", json!({})).await["entries"], json!([]));
    assert_eq!(
        stdout(sh("pwd").await),
        format!("/workspace/bots/{}\n", bots[0])
    );
    // A folder the bot removed is made again on the way in.
    let gone = call(
        "shell",
        json!({ "command": format!("cd ../.. && rm -r bots/{} && pwd", bots[0]) }),
    )
    .await;
    assert_eq!(stdout(gone), "/workspace\n");
    assert_eq!(
        stdout(sh("pwd").await),
        format!("/workspace/bots/{}\n", bots[0])
    );

    // Written with the file tool, read with the shell.
    let wrote = call(
        "write_file",
        json!({ "path": "notes/hello.txt", "content": "hello" }),
    )
    .await;
    assert_eq!(wrote["path"], "notes/hello.txt");
    assert_eq!(stdout(sh("cat notes/hello.txt").await), "hello");
    let inside = call(
        "shell",
        json!({ "command": "cat hello.txt", "cwd": "notes" }),
    )
    .await;
    assert_eq!(stdout(inside), "hello");
    call(
        "write_file",
        json!({ "path": "../../shared/team.txt", "content": "for all" }),
    )
    .await;
    assert_eq!(stdout(sh("cat ../../shared/team.txt").await), "for all");
    call(
        "write_file",
        json!({ "path": "/shared/root.txt", "content": "from the root" }),
    )
    .await;
    assert_eq!(
        stdout(sh("cat ../../shared/root.txt").await),
        "from the root"
    );

    // Written with the shell, read with every file tool.
    sh("mkdir made && echo from the shell > made/s.txt").await;
    let read = call("read_file", json!({ "path": "made/s.txt" })).await;
    assert_eq!(
        (read["path"].as_str(), read["content"].as_str()),
        (Some("made/s.txt"), Some("from the shell\n"))
    );
    let attached = tool(
        &s,
        &run,
        fence,
        "attach_file",
        json!({ "path": "./made/s.txt" }),
    )
    .await;
    assert_eq!(attached["structuredContent"]["size"], 15, "{attached}");
    let listed = call("list_files", json!({ "path": "made" })).await;
    assert_eq!(listed["entries"][0]["path"], "made/s.txt");
    let mine = call("list_files", json!({})).await;
    let names: Vec<&str> = mine["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["made", "notes"]);
    sh("echo shared by the shell > ../../shared/sh.txt").await;
    let shared = call("read_file", json!({ "path": "../../shared/sh.txt" })).await;
    assert_eq!(shared["content"], "shared by the shell\n");
    assert_eq!(shared["path"], "/shared/sh.txt");
    let root = call("list_files", json!({ "path": "/shared" })).await;
    assert!(
        root["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == "/shared/sh.txt"),
        "{root}"
    );
    call("open_path", json!({ "path": "made/s.txt" })).await;

    // The activity feed names workspace paths, as people browse them.
    let history = s.ok("activity.list", json!({ "botId": bots[0] })).await;
    let lines: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["command"].as_str().unwrap())
        .collect();
    assert!(
        lines.contains(&format!("write bots/{}/notes/hello.txt", bots[0]).as_str()),
        "{lines:?}"
    );
    assert!(lines.contains(&"write shared/team.txt"), "{lines:?}");

    // Another bot's relative paths are its own folder.
    let (run1, fence1) = s.start_run(&bots[1]).await;
    let other = tool(
        &s,
        &run1,
        fence1,
        "read_file",
        json!({ "path": "notes/hello.txt" }),
    )
    .await;
    assert_eq!(other["structuredContent"]["error"]["code"], "NOT_FOUND");

    // Nothing climbs out of the workspace, in any tool.
    for (name, args) in [
        ("read_file", json!({ "path": "../../../etc/passwd" })),
        ("attach_file", json!({ "path": "/../etc/passwd" })),
        (
            "write_file",
            json!({ "path": "../../../x", "content": "x" }),
        ),
        ("list_files", json!({ "path": "../../.." })),
        ("shell", json!({ "command": "pwd", "cwd": "../../.." })),
        ("open_path", json!({ "path": "../../../etc/passwd" })),
    ] {
        let r = tool(&s, &run, fence, name, args.clone()).await;
        assert_eq!(
            r["structuredContent"]["error"]["code"], "PATH_REJECTED",
            "{name} {args}: {r}"
        );
    }
}

#[actix_rt::test]
async fn screenshots_scale_down_on_request_and_say_their_scale() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let full = tool(&s, &run, fence, "computer_observe", json!({})).await;
    let (width, height) = (
        full["structuredContent"]["width"].as_u64().unwrap(),
        full["structuredContent"]["height"].as_u64().unwrap(),
    );
    assert!(full["structuredContent"].get("scale").is_none());

    let half = tool(
        &s,
        &run,
        fence,
        "computer_observe",
        json!({ "max_width": width / 2 }),
    )
    .await;
    assert_eq!(half["isError"], false, "{half}");
    let meta = &half["structuredContent"];
    assert_eq!(meta["width"], width / 2);
    assert_eq!(meta["height"], height / 2);
    assert_eq!(meta["scale"], 0.5);
    assert_eq!(
        (meta["screenWidth"].as_u64(), meta["screenHeight"].as_u64()),
        (Some(width), Some(height))
    );
    assert!(has_image(&half));

    // An action batch's screenshot scales the same way; its coordinates are screen pixels.
    let acted = tool(
        &s,
        &run,
        fence,
        "computer_act",
        json!({ "actions": [{ "type": "move", "x": width - 1, "y": height - 1 }], "max_width": width / 2 }),
    )
    .await;
    assert_eq!(acted["isError"], false, "{acted}");
    assert_eq!(acted["structuredContent"]["height"], height / 2);
    assert_eq!(acted["structuredContent"]["scale"], 0.5);

    let tiny = tool(
        &s,
        &run,
        fence,
        "computer_observe",
        json!({ "max_width": 8 }),
    )
    .await;
    assert_eq!(tiny["isError"], true);
}

/// One `/rpc/ws` socket: the binary messages and the answers (by id) it received until
/// `answers` answers arrived.
async fn ws_calls(s: &TestServer, query: &str, calls: &[Value]) -> (Vec<Vec<u8>>, Vec<Value>) {
    let url = format!("{}/rpc/ws{query}", s.base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let send = |v: &Value| Message::Text(v.to_string().into());
    ws.send(send(&json!({ "jsonrpc": "2.0", "id": 0, "method": "auth", "params": { "token": s.operator_token } })))
        .await
        .unwrap();
    ws.next().await.unwrap().unwrap();
    for call in calls {
        ws.send(send(call)).await.unwrap();
    }
    let (mut binaries, mut answers) = (Vec::new(), Vec::new());
    while answers.len() < calls.len() {
        match tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("an answer")
        {
            Some(Ok(Message::Binary(b))) => binaries.push(b.to_vec()),
            Some(Ok(Message::Text(t))) => answers.push(serde_json::from_str(&t).unwrap()),
            Some(Ok(_)) => {}
            other => panic!("socket ended: {other:?}"),
        }
    }
    (binaries, answers)
}

/// The image items of a tool answer.
fn images(answer: &Value) -> Vec<Value> {
    answer["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"] == "image")
        .cloned()
        .collect()
}

#[actix_rt::test]
async fn screenshots_travel_as_binary_messages_on_a_socket_that_asks_for_them() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let observe = |id: u64, arguments: Value| {
        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": { "runId": run, "fence": fence, "name": "computer_observe", "arguments": arguments } })
    };

    // Two observations at once (different sizes, so neither is an unchanged frame).
    let (binaries, answers) = ws_calls(
        &s,
        "?images=binary",
        &[
            observe(1, json!({})),
            observe(2, json!({ "max_width": 100 })),
        ],
    )
    .await;
    assert_eq!(binaries.len(), 2, "one message per screenshot");
    for answer in &answers {
        let items = images(answer);
        assert_eq!(items.len(), 1, "{answer}");
        assert!(items[0].get("data").is_none(), "no base64 beside it");
        let id = items[0]["attachment"].as_u64().expect("an attachment id");
        let message = binaries
            .iter()
            .find(|b| b[..8] == id.to_be_bytes())
            .expect("the message the answer names");
        let png = png::Decoder::new(std::io::Cursor::new(&message[8..]))
            .read_info()
            .expect("a PNG after the id");
        let meta = &answer["result"]["structuredContent"];
        assert_eq!(
            (png.info().width, png.info().height),
            (
                meta["width"].as_u64().unwrap() as u32,
                meta["height"].as_u64().unwrap() as u32
            )
        );
    }
    let ids: std::collections::HashSet<_> = binaries.iter().map(|b| b[..8].to_vec()).collect();
    assert_eq!(ids.len(), 2, "two calls at once never share an id");

    // A socket that did not ask gets base64 inside the answer, and no binary message.
    let (binaries, answers) = ws_calls(&s, "", &[observe(3, json!({ "max_width": 80 }))]).await;
    assert!(binaries.is_empty());
    let items = images(&answers[0]);
    assert!(items[0]["data"].as_str().is_some_and(|d| !d.is_empty()));
    assert!(items[0].get("attachment").is_none());
}
