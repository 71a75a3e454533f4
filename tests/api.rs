//! The HTTP surface: health, authentication, scoping, errors, screens and live events.

mod common;

use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

#[actix_rt::test]
async fn health_reports_provider_and_database() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let v: Value = s.health().await;
    assert_eq!(
        (
            v["status"].as_str(),
            v["sandbox"].as_str(),
            v["database"].as_str()
        ),
        (Some("ok"), Some("fake"), Some("sqlite"))
    );
    assert!(v["version"].is_string());
}

#[actix_rt::test]
async fn docker_without_its_token_is_a_plain_setup_failure() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_PROVIDER", "docker")])
        .await
        .unwrap();
    let v: Value = s.health().await;
    assert_eq!(v["status"], "degraded");
    let setup = v["setupError"].as_str().unwrap().to_owned();
    assert!(setup.contains("SANDBOX_SUPERVISOR_TOKEN"));
    // Computer calls name that setup error, not `SANDBOX_PROVIDER=none`.
    let (_, bots) = s.space_with_bots(1, "private").await;
    let err = match s.call("run.start", json!({ "botId": bots[0] })).await {
        Err(e) => e,
        Ok(started) => {
            let fence = started["lease"]["fence"].as_i64().unwrap();
            let run = started["run"]["id"].as_str().unwrap();
            s.exec(run, fence, "ls").await.unwrap_err()
        }
    };
    assert_eq!(err.1, "NO_PROVIDER");
    assert_eq!(
        err.2,
        format!("the sandbox provider could not start: {setup}")
    );
    assert!(!err.2.contains("SANDBOX_PROVIDER=none"), "{}", err.2);
}

/// A raw JSON-RPC exchange: the HTTP status and the response body.
async fn raw_rpc(s: &TestServer, body: Value) -> (u16, Value) {
    let resp = s
        .http
        .post(format!("{}/rpc", s.base))
        .bearer_auth(&s.operator_token)
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[actix_rt::test]
async fn unknown_methods_and_positional_params_get_json_rpc_codes() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (status, v) = raw_rpc(
        &s,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "space.explode", "params": {} }),
    )
    .await;
    assert_eq!(
        (
            status,
            v["error"]["code"].as_i64(),
            v["error"]["data"]["code"].as_str()
        ),
        (404, Some(-32601), Some("METHOD_NOT_FOUND"))
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown method `space.explode`")
    );
    // Named parameters only, where the README documents them and where a method takes none.
    for (method, params) in [
        ("space.create", json!(["Acme"])),
        ("space.list", json!([])),
        ("tools/list", json!([{}])),
    ] {
        let (status, v) = raw_rpc(
            &s,
            json!({ "jsonrpc": "2.0", "id": 2, "method": method, "params": params }),
        )
        .await;
        assert_eq!(
            (
                status,
                v["error"]["code"].as_i64(),
                v["error"]["data"]["code"].as_str()
            ),
            (400, Some(-32602), Some("INVALID_PARAMS")),
            "{method}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("named parameters"),
            "{v}"
        );
    }
    assert_eq!(
        s.ok("space.list", json!({})).await,
        json!([]),
        "named (or absent) params still work"
    );
}

#[actix_rt::test]
async fn docker_with_its_token_reports_the_docker_sandbox_and_an_unreachable_supervisor() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_SUPERVISOR_TOKEN", "a-test-supervisor-token"),
            ("SANDBOX_SUPERVISOR_URL", "http://127.0.0.1:9"),
        ],
    )
    .await
    .unwrap();
    let v: Value = s.health().await;
    // The provider in use is docker; with no supervisor answering, health says so plainly.
    assert_eq!(
        (v["status"].as_str(), v["sandbox"].as_str()),
        (Some("degraded"), Some("docker"))
    );
    assert!(v.get("setupError").is_none());
    assert!(v["sandboxError"].as_str().unwrap().contains("supervisor"));
}

/// A database that fails while a token is looked up is the server's failure (500 on `/rpc`
/// and `/mcp`, 503 on `/rpc/ws`), never a 401 that has clients drop a good token.
#[actix_rt::test]
async fn a_database_failure_during_login_is_not_an_unauthorized_token() {
    use sea_orm::ConnectionTrait;
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    s.ok("space.list", json!({})).await;
    s.app
        .db
        .execute_unprepared("ALTER TABLE api_tokens RENAME TO api_tokens_away")
        .await
        .unwrap();
    let err = s.call("space.list", json!({})).await.unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (500, "INTERNAL"));
    let mcp = s
        .http
        .post(format!("{}/mcp", s.base))
        .bearer_auth(&s.operator_token)
        .json(&json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }))
        .send()
        .await
        .unwrap();
    assert_eq!(mcp.status(), 500);
    let mut ws = format!("{}/rpc/ws", s.base.replacen("http", "ws", 1))
        .into_client_request()
        .unwrap();
    ws.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.operator_token).parse().unwrap(),
    );
    match tokio_tungstenite::connect_async(ws).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503)
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[actix_rt::test]
async fn calls_need_a_valid_token_and_see_only_their_spaces() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let err = s
        .call_as("rkz_nope", "space.list", json!({}))
        .await
        .unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (401, "UNAUTHORIZED"));
    let (space, bots) = s.space_with_bots(1, "team").await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let bea = s.ok("user.create", json!({ "name": "Bea" })).await;
    let bea = bea["token"].as_str().unwrap();
    assert_eq!(
        s.call_as(bea, "space.list", json!({})).await.unwrap(),
        json!([])
    );
    for (method, params) in [
        ("bot.list", json!({ "spaceId": space })),
        ("computer.get", json!({ "computerId": computer["id"] })),
        ("run.start", json!({ "botId": bots[0] })),
        ("computer.takeControl", json!({ "botId": bots[0] })),
    ] {
        let err = s.call_as(bea, method, params).await.unwrap_err();
        assert_eq!((err.0, err.1.as_str()), (404, "NOT_FOUND"), "{method}");
    }
    // A bot-scoped token drives its bot and nothing else.
    let (_, more) = s.space_with_bots(1, "team").await;
    let scoped = s
        .ok("token.createForBot", json!({ "botId": bots[0] }))
        .await;
    let scoped = scoped["token"].as_str().unwrap();
    assert!(
        s.call_as(scoped, "run.start", json!({ "botId": bots[0] }))
            .await
            .is_ok()
    );
    let err = s
        .call_as(scoped, "run.start", json!({ "botId": more[0] }))
        .await
        .unwrap_err();
    assert_eq!(err.1, "FORBIDDEN");
    assert_eq!(
        s.call_as(scoped, "space.create", json!({ "name": "x" }))
            .await
            .unwrap_err()
            .1,
        "FORBIDDEN"
    );
}

#[actix_rt::test]
async fn bad_input_gets_stable_codes() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    assert_eq!(
        s.call("no.such", json!({})).await.unwrap_err().1,
        "METHOD_NOT_FOUND"
    );
    assert_eq!(
        s.call("space.create", json!({ "name": "" }))
            .await
            .unwrap_err()
            .1,
        "INVALID_PARAMS"
    );
    assert_eq!(
        s.call("space.create", json!({ "name": "x", "extra": 1 }))
            .await
            .unwrap_err()
            .1,
        "INVALID_PARAMS"
    );
    let (_, bots) = s.space_with_bots(1, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    assert_eq!(
        s.exec(&run, fence, "").await.unwrap_err().1,
        "INVALID_PARAMS"
    );
    let err = s
        .call(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "x", "cwd": "../../.." }),
        )
        .await
        .unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (400, "PATH_REJECTED"));
    // Oversized request bodies are refused before parsing.
    let huge = "x".repeat(13 * 1024 * 1024);
    let resp = s
        .http
        .post(format!("{}/rpc", s.base))
        .bearer_auth(&s.operator_token)
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["data"]["code"], "TOO_LARGE");
    // Batches answer each call.
    let batch = json!([
        { "jsonrpc": "2.0", "id": 1, "method": "space.list" },
        { "jsonrpc": "2.0", "id": 2, "method": "bogus" }
    ]);
    let v: Value = s
        .http
        .post(format!("{}/rpc", s.base))
        .bearer_auth(&s.operator_token)
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v[0]["result"].is_array());
    assert_eq!(v[1]["error"]["data"]["code"], "METHOD_NOT_FOUND");
    assert_eq!(v[1]["error"]["code"], -32601);
}

#[actix_rt::test]
async fn a_single_screen_provider_refuses_a_second_desktop_but_keeps_shell_and_files() {
    let s = TestServer::start(Backend::Sqlite, &[("SANDBOX_FAKE_SINGLE_SCREEN", "true")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run_a, fence_a) = s.start_run(&bots[0]).await;
    let (run_b, fence_b) = s.start_run(&bots[1]).await;
    let screen = s
        .ok(
            "computer.openScreen",
            json!({ "runId": run_a, "fence": fence_a }),
        )
        .await;
    assert!(screen["generation"].as_i64().unwrap() > 0);
    let err = s
        .call(
            "computer.openScreen",
            json!({ "runId": run_b, "fence": fence_b }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "MULTI_SCREEN_UNAVAILABLE");
    assert_eq!(
        s.exec(&run_b, fence_b, "echo ok > f && cat f")
            .await
            .unwrap()["stdout"],
        "ok\n"
    );
    // A failed run tears its screen down; the slot then serves the other bot.
    s.ok(
        "run.finish",
        json!({ "runId": run_a, "fence": fence_a, "outcome": "failed" }),
    )
    .await;
    let screen_b = s
        .ok(
            "computer.openScreen",
            json!({ "runId": run_b, "fence": fence_b }),
        )
        .await;
    assert_eq!(screen_b["slot"], screen["slot"]);
}

#[actix_rt::test]
async fn checkpoints_defer_while_another_bot_works() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run_a, fence_a) = s.start_run(&bots[0]).await;
    let (run_b, fence_b) = s.start_run(&bots[1]).await;
    s.exec(&run_a, fence_a, "echo a > a.txt").await.unwrap();
    let a = s
        .ok(
            "run.finish",
            json!({ "runId": run_a, "fence": fence_a, "outcome": "completed" }),
        )
        .await;
    assert_eq!(a["checkpoint"]["deferred"], true);
    let b = s
        .ok(
            "run.finish",
            json!({ "runId": run_b, "fence": fence_b, "outcome": "completed" }),
        )
        .await;
    assert_eq!(
        b["checkpoint"]["saved"], 1,
        "the last finishing run saves the shared workspace"
    );
}

/// A socket outlives no token: once its user is deleted, the socket it opened closes at the
/// next look (`RPC_WS_RECHECK_MS`), where it kept calling and streaming before.
#[actix_rt::test]
async fn a_websocket_closes_once_its_token_no_longer_authenticates() {
    let s = TestServer::start(Backend::Sqlite, &[("RPC_WS_RECHECK_MS", "1000")])
        .await
        .unwrap();
    let bea = s.ok("user.create", json!({ "name": "Bea" })).await;
    let token = bea["token"].as_str().unwrap();
    let url = format!("{}/rpc/ws", s.base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "space.list" });
    ws.send(Message::Text(call.to_string().into()))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(answer.to_text().unwrap().contains("\"result\""), "{answer}");
    s.ok("user.delete", json!({ "userId": bea["id"] })).await;
    let deleted = Instant::now();
    let reason = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("the socket stayed open")
        {
            Some(Ok(Message::Close(frame))) => break frame.map(|f| f.reason.to_string()),
            Some(Ok(_)) => {}
            other => panic!("ended without a close frame: {other:?}"),
        }
    };
    assert_eq!(reason.as_deref(), Some("the token no longer authenticates"));
    assert!(
        deleted.elapsed() < Duration::from_secs(5),
        "{:?}",
        deleted.elapsed()
    );
}

#[actix_rt::test]
async fn websocket_rpc_streams_live_events() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (space, bots) = s.space_with_bots(1, "team").await;
    let url = format!("{}/rpc/ws", s.base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url.clone().into_client_request().unwrap())
        .await
        .unwrap();
    let next = async |ws: &mut tokio_tungstenite::WebSocketStream<_>| -> Value {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .expect("a message")
                .unwrap()
                .unwrap();
            if let Message::Text(t) = msg {
                return serde_json::from_str(&t).unwrap();
            }
        }
    };
    let send = |v: Value| Message::Text(v.to_string().into());
    ws.send(send(
        json!({ "jsonrpc": "2.0", "id": 1, "method": "space.list" }),
    ))
    .await
    .unwrap();
    assert_eq!(next(&mut ws).await["error"]["data"]["code"], "UNAUTHORIZED");
    ws.send(send(json!({ "jsonrpc": "2.0", "id": 2, "method": "auth", "params": { "token": s.operator_token } }))).await.unwrap();
    assert!(next(&mut ws).await["result"]["userId"].is_string());
    ws.send(send(
        json!({ "jsonrpc": "2.0", "id": 3, "method": "subscribe", "params": { "spaceId": space } }),
    ))
    .await
    .unwrap();
    assert_eq!(next(&mut ws).await["id"], 3);
    // A run started over HTTP shows up live.
    let (run, _) = s.start_run(&bots[0]).await;
    let event = next(&mut ws).await;
    assert_eq!(
        (event["method"].as_str(), event["params"]["topic"].as_str()),
        (Some("event"), Some("run.state"))
    );
    assert_eq!(event["params"]["data"]["id"], run.as_str());
    // Calls work over the socket too.
    ws.send(send(
        json!({ "jsonrpc": "2.0", "id": 4, "method": "bot.list", "params": { "spaceId": space } }),
    ))
    .await
    .unwrap();
    let listed = next(&mut ws).await;
    assert_eq!(listed["id"], 4);
    assert_eq!(listed["result"][0]["id"], bots[0].as_str());
}

#[actix_rt::test]
async fn bot_status_tells_a_reloaded_client_the_run_and_the_control_holder() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let idle = s.ok("bot.status", json!({ "botId": bot })).await;
    assert!(idle["run"].is_null() && idle["control"].is_null());
    assert!(idle["computer"]["id"].is_string());

    let (run, fence) = s.start_run(bot).await;
    s.ok(
        "run.requestTakeover",
        json!({ "runId": run, "fence": fence }),
    )
    .await;
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let status = s.ok("bot.status", json!({ "botId": bot })).await;
    assert_eq!(status["run"]["id"], run.as_str());
    assert_eq!(status["run"]["state"], "waiting_takeover");
    assert_eq!(status["control"]["fence"], control["fence"]);
    assert_eq!(status["control"]["mine"], true);

    // The bot resumes; the reloaded page asks for the control it still holds and gets the
    // same grant back instead of "Stop the bot first".
    s.ok("run.resume", json!({ "runId": run, "fence": fence }))
        .await;
    let again = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    assert_eq!(again["fence"], control["fence"]);

    // Someone else sees who holds it, and that it is not theirs.
    let space = s.ok("computer.forBot", json!({ "botId": bot })).await["spaceId"].clone();
    let viewer = s.member_token(space.as_str().unwrap()).await;
    let theirs = s
        .call_as(&viewer, "bot.status", json!({ "botId": bot }))
        .await
        .unwrap();
    assert_eq!(theirs["control"]["mine"], false);
}

#[actix_rt::test]
async fn a_stopped_computer_is_announced_live() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (space, bots) = s.space_with_bots(1, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "true").await.unwrap();
    let mut events = s.app.runtime().events.subscribe();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    s.ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("a computer.state stopped event")
            .unwrap();
        if e.topic == "computer.state" && e.data["state"] == "stopped" {
            assert_eq!(e.space_id, space);
            assert_eq!(e.data["computerId"], computer["id"]);
            assert_eq!(e.data["reason"], "stopped");
            break;
        }
    }
}
