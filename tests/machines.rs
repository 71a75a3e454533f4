//! Supervised restarts: a lost machine is replaced (a new providerRef) and restored from the
//! last checkpoint; calls in flight get an error code, never a hang. Idle suspension claims the
//! computer first and yields to a bot that got there before it.

mod common;

use std::time::Duration;

use common::{Backend, TestServer};
use rakazo_actors::computer::Suspend;
use rakazo_actors::computers::EndReason;
use serde_json::{Value, json};

async fn provider_ref(s: &TestServer, computer: &Value) -> Option<String> {
    let m = s
        .ok("computer.machine", json!({ "computerId": computer["id"] }))
        .await;
    m["providerRef"].as_str().map(str::to_owned)
}

async fn wait_for_new_machine(s: &TestServer, computer: &Value, old: &str) -> String {
    for _ in 0..200 {
        if let Some(r) = provider_ref(s, computer).await.filter(|r| r != old) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no replacement machine");
}

#[actix_rt::test]
async fn a_machine_lost_mid_command_is_replaced_and_restored() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo saved > notes.txt").await.unwrap();
    let finished = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert_eq!(finished["checkpoint"]["saved"], 1);

    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo unsaved > later.txt")
        .await
        .unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let before = provider_ref(&s, &computer).await.expect("a machine runs");

    // The machine vanishes while a command runs: the caller gets an error code quickly.
    let fake = s.app.fake.clone().unwrap();
    let lose = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fake.lose_machine(&rakazo_actors::provider::ProviderRef(before.clone()));
    };
    let (outcome, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(s.exec(&run, fence, "sleep 30"), lose)
    })
    .await
    .expect("the call does not hang");
    let err = outcome.unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (503, "MACHINE_GONE"));

    let after = wait_for_new_machine(&s, &computer, &before).await;
    assert_ne!(after, before);
    let row = s
        .ok("computer.get", json!({ "computerId": computer["id"] }))
        .await;
    assert_eq!(row["providerRef"], after.as_str());
    assert_eq!(row["provisioningFence"], 2);
    assert_eq!(row["state"], "running");

    // The replacement imported the last checkpoint; work after it is gone with the machine.
    assert_eq!(
        s.exec(&run, fence, "cat notes.txt").await.unwrap()["stdout"],
        "saved\n"
    );
    assert_eq!(
        s.exec(&run, fence, "cat later.txt").await.unwrap()["exitCode"],
        1
    );
}

#[actix_rt::test]
async fn every_call_in_flight_gets_an_error_code() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run_a, fence_a) = s.start_run(&bots[0]).await;
    let (run_b, fence_b) = s.start_run(&bots[1]).await;
    s.exec(&run_a, fence_a, "true").await.unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let before = provider_ref(&s, &computer).await.unwrap();
    // One bot's command takes the machine down (the emulator's hook); the other bot's
    // command, in flight at that moment, must come back too.
    let (a, b) = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::join!(
            async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                s.exec(&run_a, fence_a, "rakazo-fake-lose-machine").await
            },
            s.exec(&run_b, fence_b, "sleep 30")
        )
    })
    .await
    .expect("no call hangs");
    assert_eq!(a.unwrap_err().1, "MACHINE_GONE");
    let b = b.unwrap_err().1;
    assert!(b == "MACHINE_GONE" || b == "COMPUTER_UNAVAILABLE", "{b}");
    let after = wait_for_new_machine(&s, &computer, &before).await;
    assert_ne!(after, before);
    assert_eq!(
        s.exec(&run_b, fence_b, "echo back").await.unwrap()["stdout"],
        "back\n"
    );
}

#[actix_rt::test]
async fn a_stopped_computer_reconnects_through_its_provider_ref() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo kept > k.txt").await.unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let before = provider_ref(&s, &computer).await.unwrap();
    let stopped = s
        .ok("computer.stop", json!({ "computerId": computer["id"] }))
        .await;
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["revision"], 1, "stop checkpoints first");
    assert_eq!(provider_ref(&s, &computer).await, None);
    assert_eq!(
        s.exec(&run, fence, "cat k.txt").await.unwrap()["stdout"],
        "kept\n"
    );
    assert_eq!(
        provider_ref(&s, &computer).await.as_deref(),
        Some(before.as_str()),
        "same machine resumed"
    );
}

#[actix_rt::test]
async fn an_idle_suspension_claims_the_computer_and_yields_to_a_driving_bot() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (space, bots) = s.space_with_bots(2, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "true").await.unwrap();
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let id = computer["id"].as_str().unwrap();
    let handle = s.app.registry.computer(id, &space);
    let state = async || {
        s.ok("computer.get", json!({ "computerId": id })).await["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // A bot got its lease after the idle decision: the suspension yields.
    handle
        .computer
        .send(Suspend(EndReason::Idle))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state().await, "running");
    s.exec(&run, fence, "true")
        .await
        .expect("the bot keeps working");

    // Once the run ends, it suspends, and the claim is gone again afterwards.
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    handle
        .computer
        .send(Suspend(EndReason::Idle))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state().await, "stopped");
    let (run, fence) = s.start_run(&bots[1]).await;
    s.exec(&run, fence, "true").await.expect("a new run starts");
}
