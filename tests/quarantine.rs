//! Quarantined computers (a command's stop was not confirmed, so the machine must not be
//! resumed). Through the whole API on Novita (`SANDBOX_PROVIDER=novita-emulator`: the real
//! Novita adapter against the e2b-emulator's Novita mode, its sandboxes real Docker computers):
//! a command whose kill is never confirmed leaves the computer paused and quarantined in the
//! database; tool calls, the reconciler, a stop and a run's end checkpoint never resume it; a
//! recover replaces it from the last checkpoint and lifts the quarantine. And on both databases
//! with the `fake` provider, whose machines any call would resume: the row alone (as a process
//! that quarantined the computer and then died left it) keeps every acquisition away, until a
//! reset replaces the machine.

mod common;
mod docker_support;
// What a listening agent's script shows; its provider-level wait does not apply here.
#[allow(dead_code)]
#[path = "exec_agent/listening.rs"]
mod listening;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rakazo::config::DockerNetwork;
use rakazo::emulators::e2b::{Emulator, State};
use rakazo_actors::computers::Computers;
use rakazo_actors::entity::{computer_run, maintenance_operation};
use rakazo_actors::provider::ProviderRef;
use rakazo_actors::reconciler::ReconcileNow;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::json;

use common::{Backend, TestServer};
use docker_support::{TestSupervisor, docker_ready};

/// The code of a failed call.
fn code(r: common::CallResult) -> String {
    match r {
        Ok(v) => panic!("succeeded: {v}"),
        Err((_, code, _)) => code,
    }
}

/// Waits until an operation ends (completed or failed); answers it.
async fn wait_done(s: &TestServer, id: &str) -> maintenance_operation::Model {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let op = maintenance_operation::Entity::find_by_id(id)
            .one(&s.app.db)
            .await
            .unwrap()
            .unwrap();
        if matches!(op.state.as_str(), "completed" | "failed") {
            return op;
        }
        assert!(tokio::time::Instant::now() < deadline, "{op:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The app on SQLite with `SANDBOX_PROVIDER=novita-emulator` on `supervisor`, and its
/// emulator.
async fn novita_server(supervisor: &TestSupervisor) -> (TestServer, Arc<Emulator>) {
    let s = TestServer::start(
        Backend::Sqlite,
        &[
            ("SANDBOX_PROVIDER", "novita-emulator"),
            ("SANDBOX_SUPERVISOR_URL", &supervisor.url),
            ("SANDBOX_SUPERVISOR_TOKEN", &supervisor.token),
        ],
    )
    .await
    .expect("the app starts");
    let em = s.app.e2b_emulator.clone().expect("the emulator runs here");
    (s, em)
}

/// One reconciler pass, now.
async fn reconcile(s: &TestServer) {
    s.app
        .computer_reconciler
        .as_ref()
        .expect("this process runs the reconciler")
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap();
}

/// Waits (up to a minute) until computer `id`'s row is quarantined by a stop settled in the
/// background, its actor looking at its machine as its idle timer does meanwhile.
async fn wait_quarantined(s: &TestServer, id: &str, space: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while s.ok("computer.get", json!({ "computerId": id })).await["quarantined"] != true {
        assert!(tokio::time::Instant::now() < deadline, "never quarantined");
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.app
            .registry
            .computer(id, space)
            .computer
            .send(rakazo_actors::computer::CheckIdle)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Waits for `run`'s scripts to go through the exec agent listening behind the screen gateway,
/// then kills it by a script (which fails with it).
async fn agent_killed(s: &TestServer, run: &str, fence: i64) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = s.exec(run, fence, listening::PARENT).await.unwrap();
        if out["stdout"]
            .as_str()
            .unwrap()
            .contains(listening::LISTENING)
        {
            break;
        }
        assert!(std::time::Instant::now() < until, "no agent: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kill = format!("pkill -KILL -f '{}'", listening::AGENT);
    assert!(
        s.exec(run, fence, &kill).await.is_err(),
        "the script's agent ended"
    );
}

#[actix_rt::test]
async fn a_novita_computer_whose_command_kill_is_unconfirmed_stays_quarantined_until_recovered() {
    if !docker_ready() {
        return;
    }
    // Dropped last: the supervisor removes every container of the test, passed or failed.
    let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
    let (s, em) = novita_server(&supervisor).await;
    assert_eq!(s.health().await["sandbox"], "novita-emulator");
    let (space, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];

    // Saved work: a run writes a file and ends with a checkpoint.
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo saved > kept.txt").await.unwrap();
    let finished = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert!(finished["checkpoint"]["saved"].is_i64(), "{finished}");
    let computer = s.ok("computer.forBot", json!({ "botId": bot })).await;
    let id = computer["id"].as_str().unwrap().to_owned();
    let machine = || async {
        s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"]
            .as_str()
            .map(str::to_owned)
    };

    // A command past its deadline whose kill envd never confirms. Scripts go through the
    // exec agent once the first one started it; after the bot killed it, through envd.
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo unsaved > lost.txt")
        .await
        .unwrap();
    agent_killed(&s, &run, fence).await;
    let old = machine().await.expect("a machine runs");
    em.signals_unavailable.store(true, Ordering::SeqCst);
    let refused = s
        .call(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "sleep 60", "timeoutMs": 1000 }),
        )
        .await;
    let Err((status, code_seen, message)) = refused else {
        panic!("the command's stop was confirmed: {refused:?}");
    };
    match (status, code_seen.as_str()) {
        (409, "COMPUTER_QUARANTINED") => {
            assert!(message.contains("may remain suspended"), "{message}")
        }
        // On a busy machine the kills and the pause can outlast the actor's grace past the
        // command's deadline: the caller is told of the timeout, the quarantine comes after.
        (504, "COMMAND_TIMEOUT") => wait_quarantined(&s, &id, &space).await,
        other => panic!("{other:?}: {message}"),
    }
    em.signals_unavailable.store(false, Ordering::SeqCst);
    assert_eq!(em.get(&old).unwrap().state, State::Paused);

    // The row says so, for every process: stopped, quarantined, its stretch closed.
    let row = s.ok("computer.get", json!({ "computerId": id })).await;
    assert_eq!(
        (row["state"].as_str(), row["quarantined"].as_bool()),
        (Some("stopped"), Some(true)),
        "{row}"
    );
    let open = computer_run::Entity::find()
        .filter(computer_run::Column::ComputerId.eq(&id))
        .filter(computer_run::Column::EndedAtMs.is_null())
        .all(&s.app.db)
        .await
        .unwrap();
    assert!(open.is_empty(), "{open:?}");

    // Nothing resumes it: another tool call, a reconciler pass, a stop, the run's end. The bot
    // is told what it can do.
    assert_eq!(
        code(s.exec(&run, fence, "true").await),
        "COMPUTER_QUARANTINED"
    );
    let told = s
        .ok(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": "list_files", "arguments": {} }),
        )
        .await;
    assert_eq!(
        told["structuredContent"]["error"]["code"], "COMPUTER_QUARANTINED",
        "{told}"
    );
    assert_eq!(
        told["content"][1]["text"],
        rakazo::tools::QUARANTINED_HINT,
        "{told}"
    );
    reconcile(&s).await;
    s.ok("computer.stop", json!({ "computerId": id })).await;
    let finished = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "failed" }),
        )
        .await;
    assert_eq!(
        finished["checkpoint"]["code"], "COMPUTER_QUARANTINED",
        "{finished}"
    );
    assert_eq!(em.get(&old).unwrap().state, State::Paused);
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);

    // A recover replaces it from the last checkpoint: the paused sandbox is deleted without a
    // resume, the quarantine lifted, the saved file back and the unsaved one lost.
    let queued = s.ok("computer.recover", json!({ "computerId": id })).await;
    let done = wait_done(&s, queued["id"].as_str().unwrap()).await;
    assert_eq!(done.state, "completed", "{done:?}");
    assert_eq!(
        done.note.as_deref(),
        Some(rakazo_actors::maintenance_job::UNSAVED_WORK_NOTE)
    );
    assert!(em.get(&old).is_none());
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);
    let row = s.ok("computer.get", json!({ "computerId": id })).await;
    assert_eq!(row["quarantined"], false, "{row}");
    let (run, fence) = s.start_run(bot).await;
    let out = s
        .exec(&run, fence, "cat kept.txt; ls lost.txt")
        .await
        .unwrap();
    assert_eq!(out["stdout"], "saved\n", "{out}");
    assert_ne!(machine().await.as_deref(), Some(old.as_str()));
}

/// A command whose caller gave up waiting (the actor's grace past its deadline ran out while
/// envd was slow to answer the kills) is quarantined by the adapter in the background; the
/// computer's actor finds it at its next look and quarantines the row.
#[actix_rt::test]
async fn a_novita_kill_unconfirmed_after_its_caller_gave_up_quarantines_the_computer() {
    if !docker_ready() {
        return;
    }
    let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
    let (s, em) = novita_server(&supervisor).await;
    let (space, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "true").await.unwrap();
    let id = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Each kill answered late, and then not confirmed.
    em.signal_delay_ms.store(4_000, Ordering::SeqCst);
    em.signals_unavailable.store(true, Ordering::SeqCst);
    let gave_up = s
        .call(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "sleep 60", "timeoutMs": 1000 }),
        )
        .await;
    assert_eq!(code(gave_up), "COMMAND_TIMEOUT");
    wait_quarantined(&s, &id, &space).await;
    let old = em.lock().keys().next().cloned().expect("one sandbox");
    assert_eq!(em.get(&old).unwrap().state, State::Paused);
    assert_eq!(
        code(s.exec(&run, fence, "true").await),
        "COMPUTER_QUARANTINED"
    );
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);
}

/// The row is the truth: a computer quarantined in the database (by a process that died since)
/// is never reconnected by another, though its provider would resume the machine at once.
async fn a_quarantined_row_keeps_every_process_from_resuming_the_machine(s: TestServer) {
    let fake = s.app.fake.clone().unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo saved > kept.txt").await.unwrap();
    let id = s.ok("computer.forBot", json!({ "botId": bot })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let machine = s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"]
        .as_str()
        .map(|r| ProviderRef(r.to_owned()))
        .expect("a machine runs");
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    // Stopped (this process lets go of it), then quarantined as its owner would have.
    s.ok("computer.stop", json!({ "computerId": id })).await;
    assert!(!fake.is_running(&machine));
    Computers::new(s.app.db.clone())
        .quarantine(&id)
        .await
        .unwrap();

    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        code(s.exec(&run, fence, "true").await),
        "COMPUTER_QUARANTINED"
    );
    reconcile(&s).await;
    s.ok("computer.stop", json!({ "computerId": id })).await;
    assert!(!fake.is_running(&machine), "resumed");
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "failed" }),
    )
    .await;

    // An update saves live work first: refused, the machine untouched.
    let queued = s.ok("computer.update", json!({ "computerId": id })).await;
    let done = wait_done(&s, queued["id"].as_str().unwrap()).await;
    assert_eq!(done.state, "failed", "{done:?}");
    assert!(!fake.is_running(&machine), "resumed");

    // A reset replaces it from the checkpoint without reading it.
    let queued = s.ok("computer.reset", json!({ "computerId": id })).await;
    let done = wait_done(&s, queued["id"].as_str().unwrap()).await;
    assert_eq!(done.state, "completed", "{done:?}");
    assert_eq!(
        s.ok("computer.get", json!({ "computerId": id })).await["quarantined"],
        false
    );
    let (run, fence) = s.start_run(bot).await;
    let out = s.exec(&run, fence, "cat kept.txt").await.unwrap();
    assert_eq!(out["stdout"], "saved\n", "{out}");
    assert!(!fake.is_running(&machine), "the old machine is gone");
}

on_both_databases!(a_quarantined_row_keeps_every_process_from_resuming_the_machine);
