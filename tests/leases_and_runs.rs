//! Fenced leases, runs and takeover through the RPC API, on SQLite and on Postgres.

mod common;

use common::TestServer;
use serde_json::json;

on_both_databases!(
    two_team_bots_drive_at_once,
    a_second_driver_is_refused,
    a_stale_fence_is_refused_after_the_lease_is_granted_again,
    takeover_waits_for_the_bot,
    racing_drivers_get_exactly_one_lease,
    maintenance_reservation_excludes_new_leases,
    refused_fences_say_what_happened,
    run_finish_always_answers_a_checkpoint_object,
    a_person_controls_a_private_screen_while_the_run_goes_on,
    a_control_grant_is_released_or_renewed_only_by_its_holder,
);

async fn two_team_bots_drive_at_once(s: TestServer) {
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run_a, fence_a) = s.start_run(&bots[0]).await;
    let (run_b, fence_b) = s.start_run(&bots[1]).await;
    let a = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let b = s.ok("computer.forBot", json!({ "botId": bots[1] })).await;
    assert_eq!(a["id"], b["id"], "Team bots share one Team Computer");
    assert!(a["homeKey"].as_str().unwrap().starts_with("team-"));
    // Both drive at the same time: two slow commands overlap.
    let started = std::time::Instant::now();
    let (x, y) = tokio::join!(
        s.exec(&run_a, fence_a, "sleep 1 && echo a"),
        s.exec(&run_b, fence_b, "sleep 1 && echo b")
    );
    assert_eq!(x.unwrap()["stdout"], "a\n");
    assert_eq!(y.unwrap()["stdout"], "b\n");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1900),
        "commands of two bots run concurrently"
    );
    // Each Team bot starts in its own folder.
    let pwd = s.exec(&run_a, fence_a, "pwd").await.unwrap();
    assert_eq!(pwd["stdout"], format!("/workspace/bots/{}\n", bots[0]));
}

async fn a_second_driver_is_refused(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    s.start_run(&bots[0]).await;
    let err = s
        .call("run.start", json!({ "botId": bots[0] }))
        .await
        .unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (409, "LEASE_HELD"));
}

async fn a_stale_fence_is_refused_after_the_lease_is_granted_again(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "team").await;
    let (old_run, old_fence) = s.start_run(&bots[0]).await;
    s.exec(&old_run, old_fence, "echo first").await.unwrap();
    s.ok("bot.stop", json!({ "botId": bots[0] })).await;
    let (new_run, new_fence) = s.start_run(&bots[0]).await;
    assert!(new_fence > old_fence, "fences only grow");
    let err = s.exec(&old_run, old_fence, "echo stale").await.unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (409, "LEASE_FENCED"));
    // The old run id with the new fence is no better.
    let err = s.exec(&old_run, new_fence, "echo stale").await.unwrap_err();
    assert_eq!(err.1, "LEASE_FENCED");
    let err = s
        .call(
            "run.finish",
            json!({ "runId": old_run, "fence": old_fence, "outcome": "completed" }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "LEASE_FENCED");
    assert_eq!(
        s.exec(&new_run, new_fence, "echo fresh").await.unwrap()["stdout"],
        "fresh\n"
    );
    let old = s.ok("run.get", json!({ "runId": old_run })).await;
    assert_eq!(old["state"], "canceled");
}

async fn takeover_waits_for_the_bot(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let (run, fence) = s.start_run(bot).await;
    let err = s
        .call("computer.takeControl", json!({ "botId": bot }))
        .await
        .unwrap_err();
    assert_eq!(
        (err.0, err.1.as_str(), err.2.as_str()),
        (409, "STOP_BOT_FIRST", "Stop the bot first")
    );

    let waiting = s
        .ok(
            "run.requestTakeover",
            json!({ "runId": run, "fence": fence }),
        )
        .await;
    assert_eq!(waiting["state"], "waiting_takeover");
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let control_fence = control["fence"].as_i64().unwrap();

    // Another person cannot take the same screen.
    let space = s.ok("computer.forBot", json!({ "botId": bot })).await["spaceId"].clone();
    let other = s.member_token(space.as_str().unwrap()).await;
    let err = s
        .call_as(&other, "computer.takeControl", json!({ "botId": bot }))
        .await
        .unwrap_err();
    assert_eq!(err.1, "CONTROL_HELD");

    // The bot keeps its lease and can run commands while a person controls its screen.
    assert_eq!(
        s.exec(&run, fence, "echo busy").await.unwrap()["stdout"],
        "busy\n"
    );

    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control_fence }),
    )
    .await;
    let err = s
        .call(
            "computer.releaseControl",
            json!({ "botId": bot, "fence": control_fence }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "LEASE_FENCED", "a released control fence is stale");
    let resumed = s
        .ok("run.resume", json!({ "runId": run, "fence": fence }))
        .await;
    assert_eq!(resumed["state"], "running");
    let err = s
        .call("computer.takeControl", json!({ "botId": bot }))
        .await
        .unwrap_err();
    assert_eq!(err.1, "STOP_BOT_FIRST");

    // After stopping the bot, control is granted.
    s.ok("bot.stop", json!({ "botId": bot })).await;
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    assert!(control["fence"].as_i64().unwrap() > control_fence);
}

async fn racing_drivers_get_exactly_one_lease(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "team").await;
    s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let calls = (0..8).map(|_| s.call("run.start", json!({ "botId": bots[0] })));
    let outcomes = futures_util::future::join_all(calls).await;
    let won = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(won, 1, "{outcomes:?}");
    for lost in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        assert_eq!(lost.1, "LEASE_HELD");
    }
}

async fn maintenance_reservation_excludes_new_leases(s: TestServer) {
    use rakazo_actors::leases::{LeaseKey, Leases};
    let (_, bots) = s.space_with_bots(2, "team").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let leases = Leases::new(s.app.db.clone());
    let key = LeaseKey::maintenance(computer["id"].as_str().unwrap());
    let reservation = leases.acquire(&key, "op-1", 60_000).await.unwrap();
    let err = s
        .call("run.start", json!({ "botId": bots[1] }))
        .await
        .unwrap_err();
    assert_eq!(err.1, "COMPUTER_RESERVED");
    let err = s
        .call("computer.stop", json!({ "computerId": computer["id"] }))
        .await
        .unwrap_err();
    assert_eq!(err.1, "COMPUTER_RESERVED");
    // A lease granted before the reservation keeps working until it ends.
    assert!(s.exec(&run, fence, "true").await.is_ok());
    leases.release(&key, reservation.fence).await.unwrap();
    s.start_run(&bots[1]).await;
}

/// A person who looked at a key's grant before someone else took it never releases or
/// extends the new one: its holder is in the statement, not only in the look before it.
async fn a_control_grant_is_released_or_renewed_only_by_its_holder(s: TestServer) {
    use rakazo_actors::leases::{LeaseKey, Leases};
    let (_, bots) = s.space_with_bots(1, "private").await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let leases = Leases::new(s.app.db.clone());
    let key = LeaseKey::control(computer["id"].as_str().unwrap(), &bots[0]);
    let grant = leases.acquire(&key, "bob", 60_000).await.unwrap();
    for refused in [
        leases.release_held(&key, grant.fence, Some("alice")).await,
        leases
            .renew_held(&key, grant.fence, Some("alice"), 600_000)
            .await
            .map(drop),
    ] {
        assert_eq!(refused.unwrap_err().code.as_str(), "LEASE_FENCED");
    }
    let live = leases.live(&key).await.unwrap().expect("still bob's");
    assert_eq!(
        (live.holder.as_str(), live.expires_at_ms),
        ("bob", grant.expires_at_ms)
    );
    let renewed = leases
        .renew_held(&key, grant.fence, Some("bob"), 600_000)
        .await
        .unwrap();
    assert!(renewed.expires_at_ms > grant.expires_at_ms);
    leases
        .release_held(&key, grant.fence, Some("bob"))
        .await
        .unwrap();
    assert!(leases.live(&key).await.unwrap().is_none());
}

async fn refused_fences_say_what_happened(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    // A made-up fence: unknown, not the run's.
    let made_up = fence + 1000;
    let err = s.exec(&run, made_up, "echo x").await.unwrap_err();
    assert_eq!((err.0, err.1.as_str()), (409, "LEASE_FENCED"));
    assert_eq!(
        err.2,
        format!(
            "fence {made_up} is unknown: it is not the current fence of run {run} (use the lease.fence that run.start returned)"
        )
    );
    let tool = s
        .call(
            "tools/call",
            json!({ "runId": run, "fence": made_up, "name": "shell", "arguments": { "command": "ls" } }),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (tool.1.as_str(), tool.2.contains("is unknown")),
        ("LEASE_FENCED", true)
    );

    // A finished run: it says the run finished, with its fence or any other.
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    let finished = format!(
        "run {run} has finished (completed) and its lease is released: start a new run with run.start"
    );
    for f in [fence, made_up] {
        let err = s.exec(&run, f, "echo x").await.unwrap_err();
        assert_eq!(
            (err.1.as_str(), err.2.as_str()),
            ("LEASE_FENCED", finished.as_str())
        );
    }
    let again = s
        .call(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (again.1.as_str(), again.2.as_str()),
        ("LEASE_FENCED", finished.as_str())
    );
    let renew = s
        .call("run.renew", json!({ "runId": run, "fence": fence }))
        .await
        .unwrap_err();
    assert_eq!(renew.2, finished);
}

async fn run_finish_always_answers_a_checkpoint_object(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    // A run that never used its computer: no machine runs, so nothing is saved, and the
    // answer says so rather than `null`.
    let (run, fence) = s.start_run(&bots[0]).await;
    let done = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert_eq!(done["checkpoint"], json!({ "noMachine": true }), "{done}");
    // A run that used it saves a revision.
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo hi > a.txt").await.unwrap();
    let done = s
        .ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
    assert!(done["checkpoint"]["saved"].is_i64(), "{done}");
}

async fn a_person_controls_a_private_screen_while_the_run_goes_on(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    s.exec(&run, fence, "echo before").await.unwrap();
    let control = s
        .ok("computer.takeControl", json!({ "botId": bots[0] }))
        .await;
    assert!(control["fence"].is_i64(), "{control}");
    // The run is still running, and its tools still work.
    assert_eq!(
        s.ok("run.get", json!({ "runId": run })).await["state"],
        "running"
    );
    assert_eq!(
        s.exec(&run, fence, "echo during").await.unwrap()["stdout"],
        "during\n"
    );
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bots[0], "fence": control["fence"] }),
    )
    .await;
}

/// A migrated SQLite database in a temporary directory.
async fn migrated_sqlite() -> (tempfile::TempDir, sea_orm::DatabaseConnection) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("db.sqlite").display()
    );
    let db = rakazo::db::connect(&url).await.unwrap();
    rakazo::db::migrate(&db).await.unwrap();
    (dir, db)
}

/// The steps of SQLite's query plan for `sql` with `values`.
async fn query_plan(
    db: &sea_orm::DatabaseConnection,
    sql: &str,
    values: Vec<sea_orm::Value>,
) -> Vec<String> {
    use sea_orm::{ConnectionTrait, DbBackend, Statement};
    db.query_all_raw(Statement::from_sql_and_values(
        DbBackend::Sqlite,
        format!("EXPLAIN QUERY PLAN {sql}"),
        values,
    ))
    .await
    .unwrap()
    .iter()
    .map(|row| row.try_get::<String>("", "detail").unwrap())
    .collect()
}

/// A grant on SQLite reads one row of the key and one of the maintenance reservation through
/// `ux_leases_fence`: a check over every lease made each grant slower with the history of
/// leases (it scanned the whole table).
#[actix_rt::test]
async fn a_fresh_grant_reads_the_latest_rows_not_the_history() {
    let (_dir, db) = migrated_sqlite().await;
    let values: Vec<sea_orm::Value> = ["l", "c", "execution", "b", "h"]
        .into_iter()
        .map(sea_orm::Value::from)
        .chain([1i64.into(), 2i64.into()])
        .collect();
    let steps = query_plan(&db, rakazo_actors::leases::SQLITE_FRESH_GRANT, values).await;
    assert!(
        steps.iter().all(|s| !s.starts_with("SCAN leases")),
        "{steps:?}"
    );
    assert!(
        steps
            .iter()
            .filter(|s| s.starts_with("SEARCH leases USING") && s.contains("ux_leases_fence"))
            .count()
            >= 3,
        "{steps:?}"
    );
}

/// What a tool call checks (run, bot, space membership, computer, the lease's latest grant) is
/// one statement, and it finds every row through an index.
#[tokio::test]
async fn a_tool_calls_checks_are_one_statement_through_indexes() {
    use sea_orm::DbBackend;
    let (_dir, db) = migrated_sqlite().await;
    for member_of in [Some("user"), None] {
        let built =
            DbBackend::Sqlite.build(&rakazo_actors::run_checks::statement("run", member_of));
        let values = built.values.map(|v| v.0).unwrap_or_default();
        let steps = query_plan(&db, &built.sql, values).await;
        assert!(steps.iter().all(|s| !s.starts_with("SCAN")), "{steps:?}");
        assert!(
            steps.iter().any(|s| s.contains("ux_leases_fence")),
            "{steps:?}"
        );
    }
    // Nothing is found for a run that does not exist.
    assert!(
        rakazo_actors::run_checks::read(&db, "no-such-run", None)
            .await
            .unwrap()
            .is_none()
    );
}
