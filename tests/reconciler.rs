//! The computer reconciler on the fake provider, on SQLite and on Postgres: computers no actor
//! of this process holds are adopted (reconnected, or replaced when gone) and stop for real,
//! stretches nobody saw end are closed as `reconciled`, a running computer without a stretch
//! gets one, and grants past their expiry are released with the event that closes sockets.

mod common;

use std::time::Duration;

use common::TestServer;
use rakazo_actors::computer::CurrentMachine;
use rakazo_actors::entity::{computer, computer_run, lease};
use rakazo_actors::leases::{LeaseKey, Leases};
use rakazo_actors::provider::ProviderRef;
use rakazo_actors::reconciler::{ReconcileNow, Reconciled};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde_json::json;

on_both_databases!(
    stop_reaches_a_machine_no_actor_of_this_process_held,
    adoption_reconnects_closes_the_unseen_stretch_and_opens_a_missing_one,
    a_gone_machine_is_replaced_on_adoption,
    a_computer_left_stopping_is_stopped_on_adoption,
    a_stretch_left_open_on_a_stopped_computer_is_closed_reconciled,
    expired_grants_are_released_with_the_event_that_closes_sockets,
    a_computer_of_another_provider_kind_is_not_adopted,
    a_control_grant_the_lease_actor_watched_ends_once,
);

/// A private bot whose computer runs: (bot, computer id, machine).
async fn running_computer(s: &TestServer) -> (String, String, ProviderRef) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo up").await.unwrap();
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let id = c["id"].as_str().unwrap().to_owned();
    let machine = s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"]
        .as_str()
        .unwrap()
        .to_owned();
    (bots[0].clone(), id, ProviderRef(machine))
}

/// End reasons of a computer's stretches, oldest first (`None` for an open one).
async fn stretches(s: &TestServer, id: &str) -> Vec<Option<String>> {
    computer_run::Entity::find()
        .filter(computer_run::Column::ComputerId.eq(id))
        .order_by_asc(computer_run::Column::StartedAtMs)
        .order_by_asc(computer_run::Column::EndedAtMs)
        .all(&s.app.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.end_reason)
        .collect()
}

async fn reconcile(s: &TestServer) -> Reconciled {
    s.app
        .computer_reconciler
        .as_ref()
        .expect("serve runs the reconciler")
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap()
}

async fn state(s: &TestServer, id: &str) -> String {
    computer::Entity::find_by_id(id)
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap()
        .state
}

/// The machine the actor of this process holds now.
async fn held(s: &TestServer, id: &str, space: &str) -> Option<ProviderRef> {
    s.app
        .registry
        .computer(id, space)
        .computer
        .send(CurrentMachine)
        .await
        .unwrap()
}

async fn stop_reaches_a_machine_no_actor_of_this_process_held(s: TestServer) {
    let (_, id, machine) = running_computer(&s).await;
    let fake = s.app.fake.clone().unwrap();
    // As after a restart: no actor of this process holds the computer.
    s.app.registry.forget(&id);
    let stopped = s.ok("computer.stop", json!({ "computerId": id })).await;
    assert_eq!(stopped["state"], "stopped");
    assert!(!fake.is_running(&machine), "the machine itself stopped");
    assert_eq!(
        stretches(&s, &id).await,
        [Some("reconciled".into()), Some("stopped".into())],
        "the stretch nobody saw end is reconciled; the adopted one ends by the stop"
    );
    // Stopping again is a no-op that still answers the row.
    let again = s.ok("computer.stop", json!({ "computerId": id })).await;
    assert_eq!(again["state"], "stopped");
}

async fn adoption_reconnects_closes_the_unseen_stretch_and_opens_a_missing_one(s: TestServer) {
    let (_, a, machine_a) = running_computer(&s).await;
    let (bot_b, b, machine_b) = running_computer(&s).await;
    // `b`'s start was never recorded.
    computer_run::Entity::delete_many()
        .filter(computer_run::Column::ComputerId.eq(&b))
        .exec(&s.app.db)
        .await
        .unwrap();
    s.app.registry.forget(&a);
    s.app.registry.forget(&b);
    let pass = reconcile(&s).await;
    assert_eq!((pass.adopted, pass.failed), (2, 0), "{pass:?}");
    let space_a = s.ok("computer.get", json!({ "computerId": a })).await["spaceId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        held(&s, &a, &space_a).await,
        Some(machine_a),
        "reconnected, not replaced"
    );
    assert_eq!(stretches(&s, &a).await, [Some("reconciled".into()), None]);
    assert_eq!(stretches(&s, &b).await, [None], "a stretch opened for b");
    // Held now: the next pass adopts nothing and the machine serves calls.
    assert_eq!(reconcile(&s).await.adopted, 0);
    let (run, fence) = {
        s.ok("bot.stop", json!({ "botId": bot_b })).await;
        s.start_run(&bot_b).await
    };
    assert_eq!(
        s.exec(&run, fence, "echo again").await.unwrap()["stdout"],
        "again\n"
    );
    assert_eq!(
        s.ok("computer.machine", json!({ "computerId": b })).await["providerRef"],
        machine_b.0
    );
}

async fn a_gone_machine_is_replaced_on_adoption(s: TestServer) {
    let (_, id, machine) = running_computer(&s).await;
    s.app.fake.clone().unwrap().lose_machine(&machine);
    s.app.registry.forget(&id);
    let pass = reconcile(&s).await;
    assert_eq!(pass.adopted, 1, "{pass:?}");
    let now = s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"].clone();
    assert!(now.is_string() && now != machine.0, "a replacement: {now}");
    assert_eq!(state(&s, &id).await, "running");
    assert_eq!(stretches(&s, &id).await, [Some("gone".into()), None]);
}

async fn a_computer_left_stopping_is_stopped_on_adoption(s: TestServer) {
    let (_, id, machine) = running_computer(&s).await;
    computer::Entity::update_many()
        .col_expr(computer::Column::State, Expr::value("stopping"))
        .filter(computer::Column::Id.eq(&id))
        .exec(&s.app.db)
        .await
        .unwrap();
    s.app.registry.forget(&id);
    assert_eq!(reconcile(&s).await.adopted, 1);
    let fake = s.app.fake.clone().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state(&s, &id).await != "stopped" || fake.is_running(&machine) {
        assert!(
            std::time::Instant::now() < deadline,
            "the interrupted stop finishes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        stretches(&s, &id).await,
        [Some("reconciled".into()), Some("stopped".into())]
    );
}

async fn a_stretch_left_open_on_a_stopped_computer_is_closed_reconciled(s: TestServer) {
    let (_, stopped, _) = running_computer(&s).await;
    let (_, running, _) = running_computer(&s).await;
    s.ok("computer.stop", json!({ "computerId": stopped }))
        .await;
    // The end of this stretch was never seen (say, a crash between the stop and its record).
    let mut leftover: computer_run::ActiveModel = computer_run::Entity::find()
        .filter(computer_run::Column::ComputerId.eq(&stopped))
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap()
        .into();
    leftover.id = sea_orm::Set("leftover".into());
    leftover.ended_at_ms = sea_orm::Set(None);
    leftover.end_reason = sea_orm::Set(None);
    sea_orm::ActiveModelTrait::insert(leftover, &s.app.db)
        .await
        .unwrap();
    let pass = reconcile(&s).await;
    assert_eq!(pass.runs_closed, 1, "{pass:?}");
    let closed = computer_run::Entity::find_by_id("leftover")
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed.end_reason.as_deref(), Some("reconciled"));
    assert!(closed.ended_at_ms.is_some());
    assert_eq!(
        stretches(&s, &running).await,
        [None],
        "a running computer's stretch stays open"
    );
}

async fn expired_grants_are_released_with_the_event_that_closes_sockets(s: TestServer) {
    let (bot, id, _) = running_computer(&s).await;
    s.ok("bot.stop", json!({ "botId": bot })).await;
    // Granted by a process that is gone: no lease actor here watches them.
    let leases = Leases::new(s.app.db.clone());
    let control = leases
        .acquire(&LeaseKey::control(&id, &bot), "someone", 1)
        .await
        .unwrap();
    let (other_bot, other, _) = running_computer(&s).await;
    let live = leases
        .acquire(&LeaseKey::control(&other, &other_bot), "someone", 600_000)
        .await;
    // The other bot runs (Team rules do not apply to private bots): its grant is live.
    let live = live.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut events = s.app.runtime().events.subscribe();
    let pass = reconcile(&s).await;
    assert!(pass.leases_expired >= 1, "{pass:?}");
    let released = lease::Entity::find()
        .filter(lease::Column::ComputerId.eq(&id))
        .filter(lease::Column::Kind.eq("control"))
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap();
    assert!(
        released.released_at_ms.is_some(),
        "the stale grant is released"
    );
    let event = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let e = events.recv().await.unwrap();
            if e.topic == "lease.changed" && e.data["computerId"] == id.as_str() {
                return e;
            }
        }
    })
    .await
    .expect("the control end is published");
    assert_eq!(event.data["state"], "expired");
    assert_eq!(event.data["kind"], "control");
    assert_eq!(event.data["fence"], control.fence);
    assert_eq!(event.data["botId"], bot.as_str());
    // A grant not yet expired is never touched.
    assert_eq!(
        leases
            .verify(&LeaseKey::control(&other, &other_bot), live.fence)
            .await
            .unwrap()
            .fence,
        live.fence
    );
    assert_eq!(reconcile(&s).await.leases_expired, 0, "released once");
}

async fn a_computer_of_another_provider_kind_is_not_adopted(s: TestServer) {
    let (bot, id, machine) = running_computer(&s).await;
    // As if it had been started by a process configured with another provider.
    computer::Entity::update_many()
        .col_expr(computer::Column::ProviderKind, Expr::value("docker"))
        .filter(computer::Column::Id.eq(&id))
        .exec(&s.app.db)
        .await
        .unwrap();
    s.app.registry.forget(&id);
    let pass = reconcile(&s).await;
    assert_eq!((pass.adopted, pass.not_running), (0, 1), "{pass:?}");
    assert_eq!(state(&s, &id).await, "stopped");
    assert_eq!(stretches(&s, &id).await, [Some("reconciled".into())]);
    // The next use provisions at this process's provider; the other one's reference is
    // never handed to it.
    s.ok("bot.stop", json!({ "botId": bot })).await;
    let (run, fence) = s.start_run(&bot).await;
    s.exec(&run, fence, "echo here").await.unwrap();
    let now = s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"].clone();
    assert!(now.is_string() && now != machine.0, "{now}");
    assert_eq!(stretches(&s, &id).await, [Some("reconciled".into()), None]);
}

async fn a_control_grant_the_lease_actor_watched_ends_once(s: TestServer) {
    let (bot, id, _) = running_computer(&s).await;
    s.ok("bot.stop", json!({ "botId": bot })).await;
    let space = s.ok("computer.get", json!({ "computerId": id })).await["spaceId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut events = s.app.runtime().events.subscribe();
    let grant = s
        .app
        .registry
        .computer(&id, &space)
        .leases
        .send(rakazo_actors::lease_actor::Acquire {
            key: LeaseKey::control(&id, &bot),
            holder: "someone".into(),
            ttl_ms: 200,
        })
        .await
        .unwrap()
        .unwrap();
    let ended = |e: &rakazo_actors::events::Event| {
        e.topic == "lease.changed" && e.data["computerId"] == id.as_str()
    };
    let first = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let e = events.recv().await.unwrap();
            if ended(&e) {
                return e;
            }
        }
    })
    .await
    .expect("the lease actor publishes the expiry");
    assert_eq!(
        (first.data["state"].clone(), first.data["fence"].clone()),
        (json!("expired"), json!(grant.fence))
    );
    // The lease actor marked it released: the reconciler has nothing left to publish.
    assert_eq!(reconcile(&s).await.leases_expired, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(e) = events.try_recv() {
        assert!(!ended(&e), "a second end was published: {:?}", e.data);
    }
}
