//! Operating computers on the fake provider with the runtime's clock moved forward (no real
//! waiting): idle suspension under the maintenance claim, the takeover hold, the uptime cap
//! and each of its exceptions on a provider declaring that it bills, `computer_runs` end
//! reasons and the two reporting queries on Postgres, durable update / recovery jobs
//! (interrupted, released, never run twice, republished, saving work no actor held yet), and
//! how a checkpoint's revision is recorded.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, TestServer};
use rakazo_actors::checkpoint::NewRevision;
use rakazo_actors::checkpoint::Reason;
use rakazo_actors::computer::{CheckIdle, SaveWorkspace};
use rakazo_actors::computers::Computers;
use rakazo_actors::entity::{computer_run, home_revision, maintenance_operation};
use rakazo_actors::maintenance::{Maintenance, OpKind};
use rakazo_actors::maintenance_job;
use rakazo_actors::provider::{ProviderRef, SandboxProvider};
use rakazo_actors::reconciler::{ReconcileNow, Reconciled};
use rakazo_actors::registry::Registry;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set,
    Statement,
};
use serde_json::{Value, json};

const MIN: Duration = Duration::from_secs(60);

/// A computer whose machine runs, with a run of its bot still going.
struct Up {
    space: String,
    bots: Vec<String>,
    id: String,
    machine: ProviderRef,
    run: String,
    fence: i64,
}

async fn up(s: &TestServer, n: usize, mode: &str) -> Up {
    let (space, bots) = s.space_with_bots(n, mode).await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo up").await.unwrap();
    let id = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let machine = machine_of(s, &id).await.expect("a machine runs");
    Up {
        space,
        bots,
        id,
        machine,
        run,
        fence,
    }
}

async fn machine_of(s: &TestServer, id: &str) -> Option<ProviderRef> {
    s.ok("computer.machine", json!({ "computerId": id })).await["providerRef"]
        .as_str()
        .map(|m| ProviderRef(m.to_owned()))
}

async fn finish(s: &TestServer, u: &Up) {
    s.ok(
        "run.finish",
        json!({ "runId": u.run, "fence": u.fence, "outcome": "completed" }),
    )
    .await;
}

fn advance(s: &TestServer, by: Duration) {
    s.app.runtime().clock.advance(by);
}

/// Ask the computer to look now (its own timer does the same every 15 s).
async fn check(s: &TestServer, u: &Up) {
    s.app
        .registry
        .computer(&u.id, &u.space)
        .computer
        .send(CheckIdle)
        .await
        .unwrap()
        .unwrap();
}

async fn state(s: &TestServer, id: &str) -> String {
    s.ok("computer.get", json!({ "computerId": id })).await["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// End reasons of a computer's stretches, oldest first (`None`: open).
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

fn code(r: Result<Value, (u16, String, String)>) -> String {
    r.expect_err("refused").1
}

// --- idle suspension ------------------------------------------------------------------------

#[actix_rt::test]
async fn idle_suspension_claims_the_computer_before_it_exports() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 2, "team").await;
    finish(&s, &u).await;
    advance(&s, 9 * MIN);
    check(&s, &u).await;
    assert_eq!(
        state(&s, &u.id).await,
        "running",
        "not idle for 10 minutes yet"
    );

    advance(&s, 2 * MIN);
    let gate = fake.hold_exports().await;
    let before = fake.exports_started();
    let handle = s.app.registry.computer(&u.id, &u.space);
    let suspending = actix_rt::spawn(async move { handle.computer.send(CheckIdle).await });
    while fake.exports_started() == before {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The checkpoint is exporting: no bot starts meanwhile.
    let refused = s.call("run.start", json!({ "botId": u.bots[1] })).await;
    assert_eq!(code(refused), "COMPUTER_RESERVED");
    drop(gate);
    suspending.await.unwrap().unwrap().unwrap();
    assert_eq!(state(&s, &u.id).await, "stopped");
    assert!(!fake.is_running(&u.machine));
    assert_eq!(stretches(&s, &u.id).await, [Some("idle".into())]);

    // The claim is gone and the next use resumes the computer.
    let (run, fence) = s.start_run(&u.bots[1]).await;
    s.exec(&run, fence, "true").await.unwrap();
    assert_eq!(state(&s, &u.id).await, "running");
    assert_eq!(stretches(&s, &u.id).await, [Some("idle".into()), None]);
}

/// A person looking at files (the Files window lists and previews every few seconds) does
/// not hold an idle computer awake: once it stops, the window shows the stored copy.
#[actix_rt::test]
async fn a_person_looking_at_files_does_not_hold_an_idle_computer_awake() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let u = up(&s, 1, "private").await;
    s.exec(&u.run, u.fence, "echo kept > kept.txt")
        .await
        .unwrap();
    finish(&s, &u).await;
    let bot = &u.bots[0];
    for minute in 0..11 {
        advance(&s, MIN);
        let listed = s
            .ok("files.list", json!({ "botId": bot, "path": "" }))
            .await;
        assert_eq!(listed["live"], true, "minute {minute}: {listed}");
        s.ok("files.read", json!({ "botId": bot, "path": "kept.txt" }))
            .await;
    }
    check(&s, &u).await;
    assert_eq!(state(&s, &u.id).await, "stopped", "idle for 11 minutes");
    assert_eq!(stretches(&s, &u.id).await, [Some("idle".into())]);
    let stored = s
        .ok("files.read", json!({ "botId": bot, "path": "kept.txt" }))
        .await;
    assert_eq!(stored["text"], "kept\n", "{stored}");
}

#[actix_rt::test]
async fn a_takeover_request_holds_a_non_billing_computer_for_thirty_minutes() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let u = up(&s, 1, "private").await;
    s.ok(
        "run.requestTakeover",
        json!({ "runId": u.run, "fence": u.fence }),
    )
    .await;
    advance(&s, 29 * MIN);
    check(&s, &u).await;
    assert_eq!(state(&s, &u.id).await, "running", "held for the person");
    advance(&s, 2 * MIN);
    check(&s, &u).await;
    assert_eq!(state(&s, &u.id).await, "stopped");
    assert_eq!(stretches(&s, &u.id).await, [Some("idle".into())]);
    let run = s.ok("run.get", json!({ "runId": u.run })).await;
    assert_eq!(run["state"], "waiting_takeover", "the run keeps waiting");
}

#[actix_rt::test]
async fn on_a_billed_provider_a_takeover_request_restarts_the_idle_timer_only() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    s.app.fake.clone().unwrap().set_bills(true);
    let u = up(&s, 1, "private").await;
    advance(&s, 9 * MIN);
    s.ok(
        "run.requestTakeover",
        json!({ "runId": u.run, "fence": u.fence }),
    )
    .await;
    advance(&s, 9 * MIN);
    check(&s, &u).await;
    assert_eq!(
        state(&s, &u.id).await,
        "running",
        "the request restarted the timer"
    );
    advance(&s, 2 * MIN);
    check(&s, &u).await;
    assert_eq!(
        state(&s, &u.id).await,
        "stopped",
        "no 30-minute hold when billed"
    );
    assert_eq!(stretches(&s, &u.id).await, [Some("idle".into())]);
}

// --- the uptime cap -------------------------------------------------------------------------

/// Keep the computer in use (as background work does) in 9-minute steps for `minutes`,
/// calling `each` at every step; whether it was still running at the end.
async fn keep_busy(s: &TestServer, u: &Up, minutes: u32, each: impl AsyncFn(u32)) -> bool {
    let computers = Computers::new(s.app.db.clone());
    let mut at = 0;
    while at < minutes {
        at += 9;
        advance(s, 9 * MIN);
        computers
            .touch_at(&u.id, s.app.runtime().clock.now_ms())
            .await
            .unwrap();
        each(at).await;
        check(s, u).await;
        if state(s, &u.id).await != "running" {
            return false;
        }
    }
    true
}

#[actix_rt::test]
async fn the_uptime_cap_stops_a_busy_computer_only_on_a_billed_provider() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    assert!(
        keep_busy(&s, &u, 180, async |_| {}).await,
        "a provider that does not bill is never capped"
    );

    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    s.app.fake.clone().unwrap().set_bills(true);
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    assert!(keep_busy(&s, &u, 117, async |_| {}).await, "under 2 hours");
    assert!(
        !keep_busy(&s, &u, 9, async |_| {}).await,
        "capped past 2 hours"
    );
    assert_eq!(stretches(&s, &u.id).await, [Some("active_limit".into())]);
}

#[actix_rt::test]
async fn an_executing_run_or_a_person_in_control_lifts_the_cap() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    s.app.fake.clone().unwrap().set_bills(true);
    let u = up(&s, 1, "private").await;
    // The run executes (its lease is live) through three hours.
    assert!(keep_busy(&s, &u, 180, async |_| {}).await);
    finish(&s, &u).await;
    // A person controls the screen.
    s.ok("computer.takeControl", json!({ "botId": u.bots[0] }))
        .await;
    assert!(keep_busy(&s, &u, 60, async |_| {}).await);
    let grant = s.ok("bot.status", json!({ "botId": u.bots[0] })).await;
    let fence = grant["control"]["fence"].as_i64().expect("control fence");
    s.ok(
        "computer.releaseControl",
        json!({ "botId": u.bots[0], "fence": fence }),
    )
    .await;
    assert!(
        !keep_busy(&s, &u, 9, async |_| {}).await,
        "capped once nothing holds it"
    );
    assert_eq!(stretches(&s, &u.id).await, [Some("active_limit".into())]);
}

#[actix_rt::test]
async fn an_agent_writing_its_session_lifts_the_cap_an_agent_at_its_prompt_does_not() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    fake.set_bills(true);
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    let session = ".codex/sessions/2026/12/01/rollout-1.jsonl";
    let lines = std::sync::Mutex::new(String::from("{}\n"));
    let write = async || {
        let now = lines.lock().unwrap().clone();
        fake.write_file(&u.machine, session, now.as_bytes())
            .await
            .unwrap();
    };
    write().await;
    // Codex appends a line at every step: three hours up, never capped.
    let working = keep_busy(&s, &u, 180, async |_| {
        lines.lock().unwrap().push_str("{\"type\":\"turn\"}\n");
        write().await;
    })
    .await;
    assert!(working, "an agent writing its session holds the computer");
    // It waits at its prompt: it writes nothing, so once SANDBOX_IDLE_MS passed since its
    // last write, the cap applies.
    assert!(
        keep_busy(&s, &u, 9, async |_| {}).await,
        "wrote 9 minutes ago"
    );
    assert!(!keep_busy(&s, &u, 9, async |_| {}).await, "capped");
    assert_eq!(stretches(&s, &u.id).await, [Some("active_limit".into())]);
}

// --- computer_runs --------------------------------------------------------------------------

#[actix_rt::test]
async fn every_other_end_reason_is_recorded() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    // stopped
    s.ok("computer.stop", json!({ "computerId": u.id })).await;
    // the next use resumes it
    let (run, fence) = s.start_run(&u.bots[0]).await;
    s.exec(&run, fence, "true").await.unwrap();
    // gone: the provider lost the machine under a command
    let machine = machine_of(&s, &u.id).await.unwrap();
    fake.lose_machine(&machine);
    let lost = s.exec(&run, fence, "true").await;
    assert_eq!(code(lost), "MACHINE_GONE");
    s.exec(&run, fence, "true").await.unwrap();
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    // replaced: a reset
    let op = s.ok("computer.reset", json!({ "computerId": u.id })).await;
    wait_done(&s, op["id"].as_str().unwrap()).await;
    let reasons = stretches(&s, &u.id).await;
    assert_eq!(
        reasons,
        [
            Some("stopped".into()),
            Some("gone".into()),
            Some("replaced".into()),
            None
        ]
    );
    // deleted
    s.ok("computer.delete", json!({ "computerId": u.id })).await;
    assert_eq!(
        stretches(&s, &u.id).await.last().unwrap().as_deref(),
        Some("deleted")
    );
    // reconciled: a stretch left open on a stopped computer
    let v = up(&s, 1, "private").await;
    s.app
        .db
        .execute_unprepared(&format!(
            "UPDATE computers SET state = 'stopped' WHERE id = '{}'",
            v.id
        ))
        .await
        .unwrap();
    let pass: Reconciled = s
        .app
        .computer_reconciler
        .as_ref()
        .expect("this process runs the reconciler")
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pass.runs_closed, 1);
    assert_eq!(stretches(&s, &v.id).await, [Some("reconciled".into())]);
}

#[actix_rt::test]
async fn the_reporting_queries_return_the_hours_of_a_seeded_history_on_postgres() {
    // A bare migrated database, no server: a server's reconciler would rightly close the
    // seeded open stretches, whose computers do not exist, while the queries run.
    let Some(admin) = common::postgres_admin_url() else {
        return;
    };
    let db = &rakazo::db::connect(&common::fresh_postgres_db(&admin).await)
        .await
        .unwrap();
    rakazo::db::migrate(db).await.unwrap();
    let now = rakazo_actors::clock::now_ms();
    let h = 3_600_000i64;
    let exec = |sql: String| async move { db.execute_unprepared(&sql).await.unwrap() };
    exec("INSERT INTO users (id, name, email, is_operator, created_at_ms) VALUES \
          ('ada', 'Ada', 'ada@example.test', false, 0), ('bea', 'Bea', 'bea@example.test', false, 0)"
        .into())
    .await;
    let runs = vec![
        // Ada: a run from 10 to 6 days ago counts its last day (24 h); one open for 3 hours.
        ("a1", Some("ada"), now - 240 * h, Some(now - 144 * h)),
        ("a2", Some("ada"), now - 3 * h, None),
        // Bea: a run that ended 8 days ago does not count; one open for 7 hours does.
        ("b1", Some("bea"), now - 200 * h, Some(now - 192 * h)),
        ("b2", Some("bea"), now - 7 * h, None),
        // A deleted user's 2-hour run yesterday, its user id cleared.
        ("x1", None, now - 26 * h, Some(now - 24 * h)),
    ];
    for (id, user, start, end) in runs {
        let user = user.map_or("NULL".into(), |u| format!("'{u}'"));
        let end = end.map_or("NULL".into(), |e| e.to_string());
        exec(format!(
            "INSERT INTO computer_runs (id, computer_id, user_id, space_id, kind, provider_kind, \
             started_at_ms, ended_at_ms, end_reason) VALUES ('{id}', 'c-{id}', {user}, NULL, \
             'private', 'e2b', {start}, {end}, NULL)"
        ))
        .await;
    }
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT user_id, email, hours::float8 AS hours FROM ({}) q",
                rakazo_actors::run_reports::RUN_HOURS_PER_USER_7D
            ),
        ))
        .await
        .unwrap();
    let hours: Vec<(Option<String>, Option<String>, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.try_get("", "user_id").unwrap(),
                r.try_get("", "email").unwrap(),
                r.try_get("", "hours").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hours,
        [
            (Some("ada".into()), Some("ada@example.test".into()), 27.0),
            (Some("bea".into()), Some("bea@example.test".into()), 7.0),
            (None, None, 2.0),
        ]
    );
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT computer_id, hours_open::float8 AS hours_open FROM ({}) q",
                rakazo_actors::run_reports::RUNS_OPEN_OVER_6H
            ),
        ))
        .await
        .unwrap();
    let open: Vec<(String, f64)> = rows
        .iter()
        .map(|r| {
            (
                r.try_get("", "computer_id").unwrap(),
                r.try_get("", "hours_open").unwrap(),
            )
        })
        .collect();
    assert_eq!(open, [("c-b2".to_owned(), 7.0)]);
    // The README prints exactly these queries.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for query in [
        rakazo_actors::run_reports::RUN_HOURS_PER_USER_7D,
        rakazo_actors::run_reports::RUNS_OPEN_OVER_6H,
    ] {
        assert!(readme.contains(query), "README shows:\n{query}");
    }
}

// --- maintenance jobs -----------------------------------------------------------------------

async fn operation(s: &TestServer, id: &str) -> maintenance_operation::Model {
    maintenance_operation::Entity::find_by_id(id)
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap()
}

/// Wait until an operation ends (completed or failed); answers it.
async fn wait_done(s: &TestServer, id: &str) -> maintenance_operation::Model {
    loop {
        let op = operation(s, id).await;
        if matches!(op.state.as_str(), "completed" | "failed") {
            return op;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn read(s: &TestServer, machine: &ProviderRef, path: &str) -> Option<String> {
    s.app
        .fake
        .clone()
        .unwrap()
        .read_file(machine, path)
        .await
        .ok()
        .map(|b| String::from_utf8(b).unwrap())
}

#[actix_rt::test]
async fn an_update_checkpoints_live_work_and_replaces_the_machine_under_the_reservation() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 1, "private").await;
    let busy = s
        .call("computer.update", json!({ "computerId": u.id }))
        .await;
    assert_eq!(
        code(busy),
        "STOP_BOT_FIRST",
        "a driving bot would act on the old machine"
    );
    finish(&s, &u).await;
    fake.write_file(&u.machine, "live.txt", b"unsaved until the update")
        .await
        .unwrap();
    let gate = fake.hold_exports().await;
    let queued = s.ok("computer.update", json!({ "computerId": u.id })).await;
    let id = queued["id"].as_str().unwrap();
    assert_eq!(queued["kind"], "update");
    // While it works: no run starts, no stop, no second operation.
    let refused = s.call("run.start", json!({ "botId": u.bots[0] })).await;
    assert_eq!(code(refused), "COMPUTER_RESERVED");
    let refused = s.call("computer.stop", json!({ "computerId": u.id })).await;
    assert_eq!(code(refused), "COMPUTER_RESERVED");
    let refused = s
        .call("computer.recover", json!({ "computerId": u.id }))
        .await;
    assert_eq!(code(refused), "COMPUTER_RESERVED");
    let listed = s
        .ok("computer.operations", json!({ "spaceId": u.space }))
        .await;
    assert_eq!(listed["operations"][0]["id"], id);
    drop(gate);
    let done = wait_done(&s, id).await;
    assert_eq!(done.state, "completed", "{done:?}");
    assert_eq!(done.stage.as_deref(), Some("ready"));
    let machine = machine_of(&s, &u.id).await.unwrap();
    assert_ne!(machine, u.machine, "a new machine");
    assert!(!fake.is_running(&u.machine), "the old one is gone");
    assert_eq!(
        read(&s, &machine, "live.txt").await.as_deref(),
        Some("unsaved until the update"),
        "live work was checkpointed before teardown"
    );
    assert_eq!(stretches(&s, &u.id).await, [Some("replaced".into()), None]);
    let (run, fence) = s.start_run(&u.bots[0]).await;
    s.exec(&run, fence, "true")
        .await
        .expect("reservation released");
}

/// An update run by actors that hold no machine yet (their process restarted, or took the
/// computer over from an owner that was killed) reconnects the machine the row names and
/// saves its work before tearing it down: work never checkpointed is in the new machine.
#[actix_rt::test]
async fn an_update_saves_the_work_of_a_machine_no_actor_here_holds_yet() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    fake.write_file(&u.machine, "live.txt", b"never checkpointed")
        .await
        .unwrap();
    let rt = s.app.runtime().clone();
    let fresh = Registry::new(
        rt.clone(),
        actix::Arbiter::current(),
        Arc::new(rakazo_actors::screen::NoRevoker),
    );
    let ops = Maintenance::new(s.app.db.clone(), rt.clock.clone());
    let row = Computers::new(s.app.db.clone()).get(&u.id).await.unwrap();
    let op = ops.enqueue(&row, OpKind::Update, "someone").await.unwrap();
    assert!(
        maintenance_job::run(&fresh, &op.id, "worker-b")
            .await
            .unwrap()
    );
    let done = operation(&s, &op.id).await;
    assert_eq!(done.state, "completed", "{done:?}");
    // (The first registry's actor still holds the old machine: the row names the new one.)
    let row = Computers::new(s.app.db.clone()).get(&u.id).await.unwrap();
    let machine = ProviderRef(row.provider_ref.unwrap());
    assert_ne!(machine, u.machine, "a new machine");
    assert!(!fake.is_running(&u.machine), "the old one is gone");
    assert_eq!(
        read(&s, &machine, "live.txt").await.as_deref(),
        Some("never checkpointed"),
        "the reconnected machine's work was saved before its teardown"
    );
}

/// A revision is recorded with the computer's revision in one transaction, only over the
/// revision it follows: a row an earlier version's crash left ahead of the computer's
/// revision is replaced by the next checkpoint (it blocked every checkpoint before), and a
/// save that another recorded first records nothing.
#[actix_rt::test]
async fn a_revision_is_recorded_only_over_the_one_it_follows() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    let handle = s.app.registry.computer(&u.id, &u.space);
    let save = async || {
        handle
            .computer
            .send(SaveWorkspace(Reason::Explicit))
            .await
            .unwrap()
    };
    fake.write_file(&u.machine, "a.txt", b"one").await.unwrap();
    save().await.unwrap();
    let computers = Computers::new(s.app.db.clone());
    let row = computers.get(&u.id).await.unwrap();
    let left = |revision: i64| NewRevision {
        computer_id: &u.id,
        home_key: &row.home_key,
        revision,
        size_bytes: 1,
        object_key: "left-by-a-crash".into(),
        reason: "explicit".into(),
        fingerprint: None,
    };
    // A save that lost the race: the computer's revision is not the one it follows.
    let lost = left(row.revision + 2).record(&s.app.db, false).await;
    assert_eq!(lost.unwrap_err().code.as_str(), "COMPUTER_RESERVED");
    home_revision::ActiveModel {
        id: Set("left".into()),
        computer_id: Set(u.id.clone()),
        home_key: Set(row.home_key.clone()),
        revision: Set(row.revision + 1),
        size_bytes: Set(1),
        object_key: Set(Some("left".into())),
        reason: Set("explicit".into()),
        created_at_ms: Set(0),
        fingerprint: Set(None),
    }
    .insert(&s.app.db)
    .await
    .unwrap();
    fake.write_file(&u.machine, "a.txt", b"two").await.unwrap();
    save().await.expect("the leftover row is replaced");
    let now = computers.get(&u.id).await.unwrap();
    assert_eq!(now.revision, row.revision + 1);
    let kept = home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(&u.id))
        .all(&s.app.db)
        .await
        .unwrap();
    assert_eq!(kept.len(), now.revision as usize, "{kept:?}");
    assert!(kept.iter().all(|r| r.id != "left"));
}

#[actix_rt::test]
async fn an_interrupted_operation_stays_reserved_until_released_then_recovery_restores_the_checkpoint()
 {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let fake = s.app.fake.clone().unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    let handle = s.app.registry.computer(&u.id, &u.space);
    fake.write_file(&u.machine, "saved.txt", b"checkpointed")
        .await
        .unwrap();
    handle
        .computer
        .send(SaveWorkspace(Reason::Explicit))
        .await
        .unwrap()
        .unwrap();
    fake.write_file(&u.machine, "unsaved.txt", b"never saved")
        .await
        .unwrap();

    // A worker claims an update and dies mid-way (its machine lost with it).
    let rt = s.app.runtime();
    let ops = Maintenance::new(s.app.db.clone(), rt.clock.clone());
    let row = Computers::new(s.app.db.clone()).get(&u.id).await.unwrap();
    let op = ops.enqueue(&row, OpKind::Update, "someone").await.unwrap();
    assert!(ops.claim(&op.id, "worker@dead").await.unwrap().is_some());
    fake.lose_machine(&u.machine);

    let reconcile = async || -> Reconciled {
        s.app
            .computer_reconciler
            .as_ref()
            .expect("this process runs the reconciler")
            .send(ReconcileNow)
            .await
            .unwrap()
            .unwrap()
    };
    advance(&s, 9 * MIN);
    assert_eq!(reconcile().await.interrupted, 0, "heartbeat not yet stale");
    advance(&s, 2 * MIN);
    assert_eq!(reconcile().await.interrupted, 1);
    assert_eq!(operation(&s, &op.id).await.state, "interrupted");

    // Still reserved: a stale heartbeat alone authorizes nothing.
    for (method, params) in [
        ("run.start", json!({ "botId": u.bots[0] })),
        ("computer.stop", json!({ "computerId": u.id })),
        ("computer.recover", json!({ "computerId": u.id })),
        ("computer.takeControl", json!({ "botId": u.bots[0] })),
    ] {
        assert_eq!(
            code(s.call(method, params).await),
            "COMPUTER_RESERVED",
            "{method}"
        );
    }
    advance(&s, 60 * MIN);
    reconcile().await;
    assert_eq!(
        code(s.call("run.start", json!({ "botId": u.bots[0] })).await),
        "COMPUTER_RESERVED"
    );
    // A claimed operation is never run again.
    assert!(
        !rakazo_actors::maintenance_job::run(&s.app.registry, &op.id, "worker@other")
            .await
            .unwrap()
    );

    // Releasing needs the explicit assertion, and the server owner.
    let member = s.member_token(&u.space).await;
    let as_member = s
        .call_as(
            &member,
            "computer.releaseInterrupted",
            json!({ "id": op.id, "workersStopped": true }),
        )
        .await;
    assert_eq!(code(as_member), "FORBIDDEN");
    let unasserted = s
        .call(
            "computer.releaseInterrupted",
            json!({ "id": op.id, "workersStopped": false }),
        )
        .await;
    assert_eq!(code(unasserted), "INVALID_PARAMS");
    let released = s
        .ok(
            "computer.releaseInterrupted",
            json!({ "id": op.id, "workersStopped": true }),
        )
        .await;
    assert_eq!(released["state"], "released");
    let again = s
        .call(
            "computer.releaseInterrupted",
            json!({ "id": op.id, "workersStopped": true }),
        )
        .await;
    assert_eq!(
        code(again),
        "INVALID_PARAMS",
        "only an interrupted operation"
    );

    // Recovery is available and falls back to the last checkpoint.
    let queued = s
        .ok("computer.recover", json!({ "computerId": u.id }))
        .await;
    let done = wait_done(&s, queued["id"].as_str().unwrap()).await;
    assert_eq!(done.state, "completed", "{done:?}");
    assert_eq!(
        done.note.as_deref(),
        Some(rakazo_actors::maintenance_job::UNSAVED_WORK_NOTE)
    );
    let machine = machine_of(&s, &u.id).await.unwrap();
    assert_eq!(
        read(&s, &machine, "saved.txt").await.as_deref(),
        Some("checkpointed")
    );
    assert_eq!(read(&s, &machine, "unsaved.txt").await, None);
}

#[actix_rt::test]
async fn the_reconciler_republishes_a_queued_operation_after_a_missed_enqueue() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let u = up(&s, 1, "private").await;
    finish(&s, &u).await;
    let ops = Maintenance::new(s.app.db.clone(), s.app.runtime().clock.clone());
    let row = Computers::new(s.app.db.clone()).get(&u.id).await.unwrap();
    // Queued, but the hand-off to the workers was lost.
    let op = ops.enqueue(&row, OpKind::Reset, "someone").await.unwrap();
    let reconcile = async || -> Reconciled {
        s.app
            .computer_reconciler
            .as_ref()
            .expect("this process runs the reconciler")
            .send(ReconcileNow)
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(reconcile().await.republished, 0, "just published");
    advance(&s, 2 * MIN);
    assert_eq!(reconcile().await.republished, 1);
    assert_eq!(wait_done(&s, &op.id).await.state, "completed");
    assert_eq!(reconcile().await.republished, 0);
}

// --- a worker killed mid-update -------------------------------------------------------------

/// A `rakazo serve` child on a data directory (fake provider, SQLite).
struct Child {
    child: std::process::Child,
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Child {
    async fn start(data: &std::path::Path, env: &[(&str, &str)]) -> Child {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rakazo"));
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .env("DATA_DIR", data)
            .env("SANDBOX_PROVIDER", "fake")
            .env("RAKAZO_ENV", "test")
            .env_remove(rakazo::crash_point::CRASH_AT_ENV)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        while http
            .get(format!("{base}/internal/health"))
            .send()
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let token = std::fs::read_to_string(data.join("operator-token"))
            .unwrap()
            .trim()
            .to_owned();
        Child {
            child,
            base,
            token,
            http,
        }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let v: Value = self
            .http
            .post(format!("{}/rpc", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        match v.get("error") {
            Some(e) => Err(e["data"]["code"].as_str().unwrap_or_default().to_owned()),
            None => Ok(v["result"].clone()),
        }
    }

    async fn ok(&self, method: &str, params: Value) -> Value {
        self.call(method, params.clone())
            .await
            .unwrap_or_else(|e| panic!("{method} {params}: {e}"))
    }

    /// Run `command` in a new run of `bot` and finish it (a checkpoint); its stdout.
    async fn run(&self, bot: &Value, command: &str) -> String {
        let started = self.ok("run.start", json!({ "botId": bot })).await;
        let (run, fence) = (&started["run"]["id"], &started["lease"]["fence"]);
        let out = self
            .ok(
                "computer.exec",
                json!({ "runId": run, "fence": fence, "command": command }),
            )
            .await;
        self.ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
        out["stdout"].as_str().unwrap_or_default().to_owned()
    }

    /// The operation `id` once `done` says so.
    async fn operation_when(
        &self,
        space: &Value,
        id: &Value,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        loop {
            let listed = self
                .ok("computer.operations", json!({ "spaceId": space }))
                .await;
            let found = listed["operations"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["id"] == *id)
                .cloned();
            if let Some(op) = found.filter(|o| done(o)) {
                return op;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[actix_rt::test]
async fn a_worker_killed_mid_update_leaves_an_interrupted_reserved_job_that_release_and_recovery_settle()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    // The worker dies right after tearing the old machine down.
    let a = Child::start(
        data,
        &[(rakazo::crash_point::CRASH_AT_ENV, "maintenance.torn_down")],
    )
    .await;
    let space = a.ok("space.create", json!({ "name": "Ops" })).await["id"].clone();
    let bot = a
        .ok(
            "bot.create",
            json!({ "spaceId": space, "name": "b", "computerMode": "private" }),
        )
        .await["id"]
        .clone();
    a.run(&bot, "echo checkpointed > saved.txt").await;
    let computer = a.ok("computer.forBot", json!({ "botId": bot })).await["id"].clone();
    let op = a
        .ok("computer.update", json!({ "computerId": computer }))
        .await;
    let mut a = a;
    let status = a.child.wait().unwrap();
    assert!(!status.success(), "the worker died mid-update");

    // Another process, with a short heartbeat timeout so the test does not wait ten minutes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = Child::start(
        data,
        &[("COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS", "1000")],
    )
    .await;
    let interrupted = b
        .operation_when(&space, &op["id"], |o| o["state"] == "interrupted")
        .await;
    assert_eq!(
        interrupted["stage"], "tearing_down",
        "it never went further"
    );
    // Still reserved: nothing starts, stops or recovers the computer.
    assert_eq!(
        b.call("run.start", json!({ "botId": bot }))
            .await
            .unwrap_err(),
        "COMPUTER_RESERVED"
    );
    assert_eq!(
        b.call("computer.recover", json!({ "computerId": computer }))
            .await
            .unwrap_err(),
        "COMPUTER_RESERVED"
    );
    assert_eq!(
        b.call(
            "computer.releaseInterrupted",
            json!({ "id": op["id"], "workersStopped": false })
        )
        .await
        .unwrap_err(),
        "INVALID_PARAMS"
    );
    let released = b
        .ok(
            "computer.releaseInterrupted",
            json!({ "id": op["id"], "workersStopped": true }),
        )
        .await;
    assert_eq!(released["state"], "released");
    let recovery = b
        .ok("computer.recover", json!({ "computerId": computer }))
        .await;
    // A completed operation leaves the list (a failed one would stay in it).
    loop {
        let listed = b
            .ok("computer.operations", json!({ "spaceId": space }))
            .await;
        let ops = listed["operations"].as_array().unwrap().clone();
        if let Some(o) = ops.iter().find(|o| o["id"] == recovery["id"]) {
            assert_ne!(o["state"], "failed", "{o}");
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Recovery restored the last checkpoint; the interrupted update was never run again.
    assert_eq!(b.run(&bot, "cat saved.txt").await, "checkpointed\n");
    let listed = b
        .ok("computer.operations", json!({ "spaceId": space }))
        .await;
    assert_eq!(listed["operations"], json!([]));
}

// --- computer-mode changes ------------------------------------------------------------------

#[actix_rt::test]
async fn a_computer_mode_change_runs_under_the_maintenance_reservation() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let u = up(&s, 2, "team").await;
    let mode = async |bot: &str, to: &str| {
        s.call(
            "bot.setComputerMode",
            json!({ "botId": bot, "computerMode": to }),
        )
        .await
    };
    // A bot that drives its computer is refused; an unknown mode is bad input.
    assert_eq!(code(mode(&u.bots[0], "private").await), "STOP_BOT_FIRST");
    assert_eq!(code(mode(&u.bots[1], "shared").await), "INVALID_PARAMS");
    finish(&s, &u).await;

    // During a maintenance job on the Team Computer: refused with the reservation's code.
    let ops = Maintenance::new(s.app.db.clone(), s.app.runtime().clock.clone());
    let row = Computers::new(s.app.db.clone()).get(&u.id).await.unwrap();
    let op = ops.enqueue(&row, OpKind::Update, "someone").await.unwrap();
    assert_eq!(code(mode(&u.bots[1], "private").await), "COMPUTER_RESERVED");
    assert!(ops.claim(&op.id, "worker@test").await.unwrap().is_some());
    assert_eq!(code(mode(&u.bots[1], "private").await), "COMPUTER_RESERVED");
    assert!(ops.finish(&op.id, "worker@test", None).await.unwrap());

    // The change itself reserves: while it holds the Team Computer, no run starts, no person
    // takes control, no operation and no other mode change begins.
    let bot = rakazo_actors::entity::bot::Entity::find_by_id(&u.bots[1])
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap();
    let changed =
        rakazo_actors::computer_mode::change_with(&s.app.db, &bot, "private", async || {
            for (method, params) in [
                ("run.start", json!({ "botId": u.bots[0] })),
                ("computer.takeControl", json!({ "botId": u.bots[0] })),
                ("computer.update", json!({ "computerId": u.id })),
                ("computer.stop", json!({ "computerId": u.id })),
                (
                    "bot.setComputerMode",
                    json!({ "botId": u.bots[0], "computerMode": "private" }),
                ),
            ] {
                assert_eq!(
                    code(s.call(method, params).await),
                    "COMPUTER_RESERVED",
                    "{method}"
                );
            }
        })
        .await
        .unwrap();
    assert_eq!(changed.computer_mode, "private");

    // Released after: the bot has a computer of its own, the Team Computer takes runs again.
    let own = s.ok("computer.forBot", json!({ "botId": u.bots[1] })).await;
    assert_eq!(own["kind"], "private");
    assert_ne!(own["id"], json!(u.id));
    let (run, fence) = s.start_run(&u.bots[0]).await;
    // Moving back reserves both computers: the Team Computer, where bot 0 now runs, is no
    // obstacle (a lease of another bot), its own computer is free.
    let back = mode(&u.bots[1], "team").await.unwrap();
    assert_eq!(back["computerMode"], "team");
    // A job on its own computer refuses the move (the target is reserved too).
    let own_row = Computers::new(s.app.db.clone())
        .get(own["id"].as_str().unwrap())
        .await
        .unwrap();
    let held = ops
        .enqueue(&own_row, OpKind::Reset, "someone")
        .await
        .unwrap();
    assert_eq!(code(mode(&u.bots[1], "private").await), "COMPUTER_RESERVED");
    assert!(ops.claim(&held.id, "worker@test").await.unwrap().is_some());
    assert!(ops.finish(&held.id, "worker@test", None).await.unwrap());
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
}

// --- deleting a space or a user -------------------------------------------------------------

async fn deleting_keeps_computer_runs(backend: Backend) {
    let Some(s) = TestServer::start(backend, &[]).await else {
        return;
    };
    let user = s.ok("user.create", json!({ "name": "Owner" })).await;
    let (uid, token) = (
        user["id"].as_str().unwrap().to_owned(),
        user["token"].as_str().unwrap().to_owned(),
    );
    let as_user = async |method: &str, params: Value| {
        s.call_as(&token, method, params.clone())
            .await
            .unwrap_or_else(|e| panic!("{method} {params}: {e:?}"))
    };
    // Two spaces of the user, each with a computer that ran and stopped.
    let mut spaces = Vec::new();
    for name in ["First", "Second"] {
        let space = as_user("space.create", json!({ "name": name })).await["id"].clone();
        let bot = as_user(
            "bot.create",
            json!({ "spaceId": space, "name": "b", "computerMode": "private" }),
        )
        .await["id"]
            .clone();
        let started = as_user("run.start", json!({ "botId": bot })).await;
        let (run, fence) = (
            started["run"]["id"].clone(),
            started["lease"]["fence"].clone(),
        );
        as_user(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": "true" }),
        )
        .await;
        as_user(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
        let computer = as_user("computer.forBot", json!({ "botId": bot })).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        as_user("computer.stop", json!({ "computerId": computer })).await;
        spaces.push((space.as_str().unwrap().to_owned(), bot, computer));
    }
    let runs_of = async |computer: &str| -> Vec<computer_run::Model> {
        computer_run::Entity::find()
            .filter(computer_run::Column::ComputerId.eq(computer))
            .all(&s.app.db)
            .await
            .unwrap()
    };
    for (space, _, computer) in &spaces {
        let rows = runs_of(computer).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].space_id.as_deref(), Some(space.as_str()));
        assert_eq!(rows[0].user_id.as_deref(), Some(uid.as_str()));
    }

    // Who may: the owner or the operator; a member is refused, a stranger does not see it.
    let (first, first_bot, first_computer) = spaces[0].clone();
    let member = s.member_token(&first).await;
    let stranger = s.ok("user.create", json!({ "name": "Stranger" })).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let del = json!({ "spaceId": first });
    assert_eq!(
        code(s.call_as(&member, "space.delete", del.clone()).await),
        "FORBIDDEN"
    );
    assert_eq!(
        code(s.call_as(&stranger, "space.delete", del.clone()).await),
        "NOT_FOUND"
    );
    assert_eq!(
        code(
            s.call_as(&token, "user.delete", json!({ "userId": uid }))
                .await
        ),
        "FORBIDDEN"
    );
    // A bot that drives refuses it, and nothing is deleted.
    let started = as_user("run.start", json!({ "botId": first_bot })).await;
    assert_eq!(
        code(s.call_as(&token, "space.delete", del.clone()).await),
        "LEASE_HELD"
    );
    as_user(
        "run.finish",
        json!({ "runId": started["run"]["id"], "fence": started["lease"]["fence"], "outcome": "completed" }),
    )
    .await;
    as_user("computer.stop", json!({ "computerId": first_computer })).await;

    // The owner deletes the first space: its runs stay, with the space cleared.
    as_user("space.delete", del.clone()).await;
    assert_eq!(
        code(
            s.call_as(&token, "bot.list", json!({ "spaceId": first }))
                .await
        ),
        "NOT_FOUND"
    );
    assert_eq!(
        code(
            s.call("computer.get", json!({ "computerId": first_computer }))
                .await
        ),
        "NOT_FOUND"
    );
    let kept = runs_of(&first_computer).await;
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|r| r.space_id.is_none()
        && r.user_id.as_deref() == Some(uid.as_str())
        && r.ended_at_ms.is_some()));

    // The operator deletes the user, and with them their other space.
    assert_eq!(
        code(
            s.call("user.delete", json!({ "userId": "no-such-user" }))
                .await
        ),
        "NOT_FOUND"
    );
    s.ok("user.delete", json!({ "userId": uid })).await;
    assert_eq!(
        code(s.call_as(&token, "space.list", json!({})).await),
        "UNAUTHORIZED"
    );
    let (second, _, second_computer) = &spaces[1];
    assert_eq!(
        code(s.call("bot.list", json!({ "spaceId": second })).await),
        "NOT_FOUND"
    );
    for computer in [&first_computer, second_computer] {
        let rows = runs_of(computer).await;
        assert!(!rows.is_empty());
        assert!(
            rows.iter()
                .all(|r| r.space_id.is_none() && r.user_id.is_none()),
            "{rows:?}"
        );
    }
    // The operator is not deleted.
    let me = s.ok("space.create", json!({ "name": "Mine" })).await;
    let operator = rakazo_actors::entity::space::Entity::find_by_id(me["id"].as_str().unwrap())
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap()
        .owner_id;
    assert_eq!(
        code(s.call("user.delete", json!({ "userId": operator })).await),
        "INVALID_PARAMS"
    );
}

#[actix_rt::test]
async fn deleting_a_space_or_a_user_keeps_their_computer_runs_on_sqlite() {
    deleting_keeps_computer_runs(Backend::Sqlite).await;
}

#[actix_rt::test]
async fn deleting_a_space_or_a_user_keeps_their_computer_runs_on_postgres() {
    deleting_keeps_computer_runs(Backend::Postgres).await;
}
