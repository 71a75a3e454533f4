//! The attributed timeline of a computer: who did what (bot, user, system) in order, its hash
//! chain (`activity.verify` names the first stored row that was edited or lost), appends
//! racing from two connection pools (two processes' worth), and secrets masked before
//! anything is stored.

mod common;

use common::TestServer;
use rakazo_actors::timeline::{self, Actor, NewEntry};
use sea_orm::{ConnectionTrait, Statement};
use serde_json::{Value, json};

on_both_databases!(
    the_timeline_names_every_actor_in_order,
    an_edited_row_is_named_by_verify,
    appends_from_two_pools_form_one_chain,
    a_deleted_computer_s_timeline_stays_for_its_people_and_the_operator,
    a_command_through_computer_exec_is_in_the_timeline_as_the_shell_tool,
);

/// `computer.exec` runs the `shell` tool's command: it is in the chained timeline as the
/// bot's `shell` call, as the tool's is.
async fn a_command_through_computer_exec_is_in_the_timeline_as_the_shell_tool(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (run, fence) = s.start_run(&bots[0]).await;
    let out = s
        .ok(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "echo via-exec" }),
        )
        .await;
    assert_eq!(out["stdout"], "via-exec\n", "{out}");
    let entries = entries_at_least(&s, &computer, 2).await;
    let shell = find(&entries, "tool.call", "shell");
    assert_eq!(
        (shell["actor"].as_str(), shell["actorId"].as_str()),
        (Some("bot"), Some(bots[0].as_str()))
    );
    assert!(
        shell["detail"].to_string().contains("echo via-exec"),
        "{shell}"
    );
    let verified = s
        .ok("activity.verify", json!({ "computerId": computer }))
        .await;
    assert_eq!(verified["intact"], true, "{verified}");
}

/// A space with a private bot, its computer, and a run with a shell command, a file write
/// and an observation; the bot is then stopped by the person.
async fn scenario(s: &TestServer) -> (String, String, String) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("error")
        .try_init();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = bots[0].clone();
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (run, fence) = s.start_run(&bot).await;
    let tool = async |name: &str, arguments: Value| {
        s.ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
        )
        .await
    };
    tool(
        "shell",
        json!({ "command": "GITHUB_TOKEN=ghp_0123456789abcdefABCDEF echo hi" }),
    )
    .await;
    tool(
        "write_file",
        json!({ "path": "notes.txt", "content": "password=hunter2hunter2" }),
    )
    .await;
    tool("computer_observe", json!({})).await;
    s.ok("bot.stop", json!({ "botId": bot })).await;
    (bot, computer, run)
}

/// The timeline once it holds at least `n` entries (journaled state changes land a moment
/// after the call that made them).
async fn entries_at_least(s: &TestServer, computer: &str, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let page = s
            .ok(
                "activity.timeline",
                json!({ "computerId": computer, "limit": 1000 }),
            )
            .await;
        let entries = page["entries"].as_array().unwrap().clone();
        if entries.len() >= n {
            return entries;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the timeline never reached {n} entries");
}

fn find<'a>(entries: &'a [Value], kind: &str, subject: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["kind"] == kind && e["subject"] == subject)
        .unwrap_or_else(|| panic!("no {kind} {subject} in {entries:#?}"))
}

async fn the_timeline_names_every_actor_in_order(s: TestServer) {
    let (bot, computer, run) = scenario(&s).await;
    // run started, 3 tool calls, run canceled: at least five.
    let entries = entries_at_least(&s, &computer, 5).await;
    let positions: Vec<i64> = entries
        .iter()
        .map(|e| e["position"].as_i64().unwrap())
        .collect();
    assert_eq!(positions, (1..=entries.len() as i64).collect::<Vec<_>>());

    let started = find(&entries, "run.state", "running");
    assert_eq!(started["actor"], "user", "the operator started the run");
    let shell = find(&entries, "tool.call", "shell");
    assert_eq!(shell["actor"], "bot");
    assert_eq!(shell["actorId"], bot.as_str());
    assert_eq!(shell["runId"], run.as_str());
    let observed = find(&entries, "tool.call", "computer_observe");
    assert!(observed["detail"]["frameDigest"].is_string());
    let stopped = entries
        .iter()
        .find(|e| e["kind"] == "run.state" && e["subject"] != "running")
        .expect("the run's end");
    assert_eq!(stopped["actor"], "user");
    let pos = |e: &Value| e["position"].as_i64().unwrap();
    assert!(
        pos(started) < pos(shell) && pos(shell) < pos(observed) && pos(observed) < pos(stopped)
    );

    // Chained: each entry names the hash of the one before.
    for pair in entries.windows(2) {
        assert_eq!(pair[1]["prevHash"], pair[0]["hash"]);
    }
    let verified = s
        .ok("activity.verify", json!({ "computerId": computer }))
        .await;
    assert_eq!(verified["intact"], true, "{verified}");
    assert_eq!(verified["firstMismatch"], Value::Null);

    // Secrets were masked before they were stored, and file contents never are.
    let stored = s
        .app
        .db
        .query_all_raw(Statement::from_string(
            s.app.db.get_database_backend(),
            "SELECT detail FROM timeline_entries",
        ))
        .await
        .unwrap();
    let all: String = stored
        .iter()
        .map(|r| r.try_get::<String>("", "detail").unwrap())
        .collect();
    assert!(!all.contains("ghp_0123456789abcdefABCDEF"), "{all}");
    assert!(!all.contains("hunter2"), "{all}");
    assert!(all.contains("[redacted]"), "{all}");
}

async fn an_edited_row_is_named_by_verify(s: TestServer) {
    let (_, computer, _) = scenario(&s).await;
    let entries = entries_at_least(&s, &computer, 5).await;
    let db = &s.app.db;
    let backend = db.get_database_backend();
    let target = &entries[2];
    let id = target["id"].as_str().unwrap();

    // One field of one stored row changed behind the runtime's back.
    let edit = format!("UPDATE timeline_entries SET subject = 'read_file' WHERE id = '{id}'");
    db.execute_raw(Statement::from_string(backend, edit))
        .await
        .unwrap();
    let verified = s
        .ok("activity.verify", json!({ "computerId": computer }))
        .await;
    assert_eq!(verified["intact"], false);
    assert_eq!(verified["firstMismatch"]["id"], id, "{verified}");
    assert_eq!(verified["firstMismatch"]["reason"], "hash");

    // Even with its own hash made again, the next row's link names the break.
    let original = serde_json::to_string(&target["subject"]).unwrap();
    let restore = format!(
        "UPDATE timeline_entries SET subject = {} WHERE id = '{id}'",
        original.replace('"', "'")
    );
    db.execute_raw(Statement::from_string(backend, restore))
        .await
        .unwrap();
    let verified = s
        .ok("activity.verify", json!({ "computerId": computer }))
        .await;
    assert_eq!(verified["intact"], true, "{verified}");

    // A row taken out of the middle: the one after it is named.
    let gone = entries[1]["id"].as_str().unwrap();
    db.execute_raw(Statement::from_string(
        backend,
        format!("DELETE FROM timeline_entries WHERE id = '{gone}'"),
    ))
    .await
    .unwrap();
    let verified = s
        .ok("activity.verify", json!({ "computerId": computer }))
        .await;
    assert_eq!(
        verified["firstMismatch"]["id"], entries[2]["id"],
        "{verified}"
    );
    assert_eq!(verified["firstMismatch"]["reason"], "position");
}

async fn appends_from_two_pools_form_one_chain(s: TestServer) {
    let (_, computer, _) = scenario(&s).await;
    let before = entries_at_least(&s, &computer, 5).await.len();
    let url = s.app.config.database_url.0.clone();
    let other = rakazo::db::connect(&url).await.unwrap();
    let space = s
        .ok("computer.get", json!({ "computerId": computer }))
        .await["spaceId"]
        .as_str()
        .unwrap()
        .to_owned();
    let entry = |i: usize| NewEntry {
        computer_id: computer.clone(),
        space_id: space.clone(),
        actor: Actor::system(),
        bot_id: None,
        run_id: None,
        kind: "maintenance".into(),
        subject: format!("step {i}"),
        detail: json!({ "i": i }),
    };
    const EACH: usize = 15;
    let mut tasks = Vec::new();
    for i in 0..EACH * 2 {
        let db = if i % 2 == 0 {
            s.app.db.clone()
        } else {
            other.clone()
        };
        let e = entry(i);
        tasks.push(tokio::spawn(async move {
            timeline::append(&db, e).await.unwrap()
        }));
    }
    let mut positions = Vec::new();
    for t in tasks {
        positions.push(t.await.unwrap().position);
    }
    positions.sort();
    positions.dedup();
    assert_eq!(
        positions.len(),
        EACH * 2,
        "every append got its own position"
    );
    let verified = timeline::verify(&other, &computer).await.unwrap();
    assert!(verified.intact, "{verified:?}");
    assert!(verified.entries as usize >= before + EACH * 2);
}

/// `computer.delete` removes the computer and its recordings, not its timeline: the operator
/// and the people of its space still read and verify it (it ends with the deletion); a user
/// of another space finds nothing, as before.
async fn a_deleted_computer_s_timeline_stays_for_its_people_and_the_operator(s: TestServer) {
    let (_, computer, run) = scenario(&s).await;
    let before = entries_at_least(&s, &computer, 4).await;
    let space = s
        .ok("computer.get", json!({ "computerId": computer }))
        .await["spaceId"]
        .as_str()
        .unwrap()
        .to_owned();
    let member = s.member_token(&space).await;
    let stranger = s.ok("user.create", json!({ "name": "far" })).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let digest = s.ok("run.replay", json!({ "runId": run })).await["steps"][0]["frame"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    s.ok("computer.delete", json!({ "computerId": computer }))
        .await;
    let gone = s
        .call("computer.get", json!({ "computerId": computer }))
        .await;
    assert_eq!(gone.unwrap_err().1, "NOT_FOUND");

    let after = entries_at_least(&s, &computer, before.len()).await;
    assert_eq!(
        after[..before.len()],
        before[..],
        "the kept entries are unchanged"
    );
    for token in [&s.operator_token, &member] {
        let page = s
            .call_as(
                token,
                "activity.timeline",
                json!({ "computerId": computer }),
            )
            .await
            .unwrap();
        assert!(page["entries"].as_array().unwrap().len() >= before.len());
        let verdict = s
            .call_as(token, "activity.verify", json!({ "computerId": computer }))
            .await
            .unwrap();
        assert_eq!(verdict["intact"], true, "{verdict}");
    }
    for method in ["activity.timeline", "activity.verify"] {
        let got = s
            .call_as(&stranger, method, json!({ "computerId": computer }))
            .await;
        assert_eq!(got.unwrap_err().1, "NOT_FOUND", "{method} as a stranger");
    }
    let never = s
        .call("activity.timeline", json!({ "computerId": "cmp_never" }))
        .await;
    assert_eq!(never.unwrap_err().1, "NOT_FOUND");
    // Its recordings went with it.
    let frame = s
        .call("run.replayFrame", json!({ "runId": run, "digest": digest }))
        .await;
    assert_eq!(frame.unwrap_err().1, "NOT_FOUND");
}
