//! Run recordings on the fake computer: steps in order with their frames (an unchanged frame
//! stored once), typed secrets masked, frames sealed (a flipped byte or a frame moved to
//! another run does not open), the size cap, retention, and deletion with the computer.

mod common;

use base64::Engine;
use common::{Backend, TestServer};
use rakazo_actors::entity::recording_frame;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set, Statement,
};
use serde_json::{Value, json};

on_both_databases!(a_run_is_recorded_and_goes_with_its_computer);

async fn tool(s: &TestServer, run: &str, fence: i64, name: &str, arguments: Value) -> Value {
    s.ok(
        "tools/call",
        json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments }),
    )
    .await
}

async fn count(s: &TestServer, sql: &str) -> i64 {
    let row = s
        .app
        .db
        .query_one_raw(Statement::from_string(
            s.app.db.get_database_backend(),
            sql.to_owned(),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

async fn a_run_is_recorded_and_goes_with_its_computer(s: TestServer) {
    let (_, bots) = s.space_with_bots(1, "private").await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (run, fence) = s.start_run(&bots[0]).await;
    let mut digests = Vec::new();
    let first = tool(&s, &run, fence, "computer_observe", json!({})).await;
    digests.push(first["structuredContent"]["frameDigest"].clone());
    let acted = tool(
        &s,
        &run,
        fence,
        "computer_act",
        json!({ "actions": [
            { "type": "click", "x": 10, "y": 20 },
            { "type": "type", "text": "export API_TOKEN=s3cr3t-value-here" },
        ] }),
    )
    .await;
    digests.push(acted["structuredContent"]["frameDigest"].clone());
    let again = tool(&s, &run, fence, "computer_observe", json!({})).await;
    digests.push(again["structuredContent"]["frameDigest"].clone());

    let replay = s.ok("run.replay", json!({ "runId": run })).await;
    let steps = replay["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{replay}");
    let tools: Vec<&str> = steps.iter().map(|s| s["tool"].as_str().unwrap()).collect();
    assert_eq!(
        tools,
        ["computer_observe", "computer_act", "computer_observe"]
    );
    for (step, digest) in steps.iter().zip(&digests) {
        assert_eq!(step["actor"], "bot");
        assert_eq!(&step["frame"]["digest"], digest, "{step}");
    }
    assert!(
        steps
            .windows(2)
            .all(|w| w[0]["position"].as_i64() < w[1]["position"].as_i64())
    );
    // The click's point is kept, the typed secret is not.
    let act = &steps[1];
    assert_eq!(act["actions"][0]["x"], 10);
    assert_eq!(act["actions"][0]["y"], 20);
    assert_eq!(act["result"]["completed"], 2);
    let stored = count(
        &s,
        "SELECT COUNT(*) FROM recording_steps WHERE actions LIKE '%s3cr3t%'",
    )
    .await;
    assert_eq!(stored, 0);
    assert!(
        act["actions"][1]["text"]
            .as_str()
            .unwrap()
            .contains("[redacted]")
    );
    // Frames are stored once per run by digest.
    let distinct: std::collections::HashSet<_> = digests.iter().collect();
    assert_eq!(replay["frames"].as_u64().unwrap() as usize, distinct.len());

    // Each frame opens to the very PNG the bot saw.
    for digest in &distinct {
        let frame = s
            .ok("run.replayFrame", json!({ "runId": run, "digest": digest }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(frame["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(&json!(blake3::hash(&png).to_hex().to_string()), *digest);
        assert!(png.starts_with(b"\x89PNG"));
    }
    // Sealed at rest: no PNG signature in the stored bytes.
    let plain = count(
        &s,
        "SELECT COUNT(*) FROM recording_frames WHERE sealed IS NULL",
    )
    .await;
    assert_eq!(plain, 0);

    // A sealed frame named for another digest does not open; a changed byte does not open.
    let digest = digests[0].as_str().unwrap().to_owned();
    let row = recording_frame::Entity::find_by_id((run.clone(), digest.clone()))
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap();
    let posing = "0".repeat(64);
    recording_frame::ActiveModel {
        digest: Set(posing.clone()),
        ..row.clone().into()
    }
    .insert(&s.app.db)
    .await
    .unwrap();
    let refused = s
        .call("run.replayFrame", json!({ "runId": run, "digest": posing }))
        .await;
    assert_eq!(refused.unwrap_err().1, "INTERNAL");
    let mut sealed = row.sealed.clone();
    let at = sealed.len() - 1;
    sealed[at] ^= 0x01;
    recording_frame::Entity::update_many()
        .col_expr(recording_frame::Column::Sealed, Expr::value(sealed))
        .filter(recording_frame::Column::RunId.eq(&run))
        .filter(recording_frame::Column::Digest.eq(&digest))
        .exec(&s.app.db)
        .await
        .unwrap();
    let refused = s
        .call("run.replayFrame", json!({ "runId": run, "digest": digest }))
        .await;
    assert_eq!(refused.unwrap_err().1, "INTERNAL");
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;

    // Retention: nothing younger than the limit goes; everything older does.
    let now = rakazo_actors::clock::now_ms();
    let (frames, _) = rakazo::recordings::sweep(&s.app.db, 30, now).await.unwrap();
    assert_eq!(frames, 0);
    let later = now + 31 * 24 * 3600 * 1000;
    let (frames, steps) = rakazo::recordings::sweep(&s.app.db, 30, later)
        .await
        .unwrap();
    assert!(frames >= 1 && steps >= 3, "{frames} {steps}");
    let left = s.ok("run.replay", json!({ "runId": run })).await;
    assert_eq!(left["steps"].as_array().unwrap().len(), 0);

    // Deleting the computer deletes what is left of its recordings.
    let (third, third_fence) = {
        s.ok("bot.stop", json!({ "botId": bots[0] })).await;
        s.start_run(&bots[0]).await
    };
    tool(&s, &third, third_fence, "computer_observe", json!({})).await;
    let kept = s.ok("run.replay", json!({ "runId": third })).await;
    assert_eq!(kept["frames"], 1, "{kept}");
    assert!(
        count(
            &s,
            &format!("SELECT COUNT(*) FROM recording_frames WHERE computer_id = '{computer}'")
        )
        .await
            >= 1
    );
    s.ok("bot.stop", json!({ "botId": bots[0] })).await;
    s.ok("computer.delete", json!({ "computerId": computer }))
        .await;
    for table in ["recording_frames", "recording_steps"] {
        let n = count(
            &s,
            &format!("SELECT COUNT(*) FROM {table} WHERE computer_id = '{computer}'"),
        )
        .await;
        assert_eq!(n, 0, "{table}");
    }
}

#[actix_rt::test]
async fn past_the_size_cap_steps_are_kept_without_frames() {
    let s = TestServer::start(Backend::Sqlite, &[("RECORDING_MAX_RUN_BYTES", "16")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let (run, fence) = s.start_run(&bots[0]).await;
    tool(&s, &run, fence, "computer_observe", json!({})).await;
    let replay = s.ok("run.replay", json!({ "runId": run })).await;
    assert_eq!(replay["steps"].as_array().unwrap().len(), 1);
    assert_eq!(replay["steps"][0]["frame"], Value::Null);
    assert_eq!(replay["frames"], 0);
}

#[actix_rt::test]
async fn with_retention_zero_nothing_is_recorded_but_the_timeline() {
    let s = TestServer::start(Backend::Sqlite, &[("RECORDING_RETENTION_DAYS", "0")])
        .await
        .unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (run, fence) = s.start_run(&bots[0]).await;
    tool(&s, &run, fence, "computer_observe", json!({})).await;
    let replay = s.ok("run.replay", json!({ "runId": run })).await;
    assert_eq!(replay["steps"].as_array().unwrap().len(), 0);
    let timeline = s
        .ok("activity.timeline", json!({ "computerId": computer }))
        .await;
    assert!(
        timeline["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["subject"] == "computer_observe")
    );
}
