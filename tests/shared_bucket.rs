//! Bucket safety through the whole app, on SQLite and on Postgres, against the S3 server
//! `scripts/test.sh` starts: a second deployment (a fresh database) sharing the bucket deletes
//! nothing of the first, and `computer.delete` tombstones what the reconciler may remove.

mod common;

use common::gate;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{Backend, TestServer};
use futures_util::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rakazo::config::{ObjectStorage, Secret};
use rakazo::stores::archive::{self, Limits};
use rakazo::stores::object::ObjectHomeStore;
use rakazo::stores::reconciler::{self, ReconcileNow};
use rakazo::stores::{bucket, deployment};
use rakazo_actors::entity::{computer, home_revision, home_tombstone};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, Set};
use serde_json::json;

/// The S3 endpoint; a missing one fails the test (see `gate`).
fn endpoint() -> Option<String> {
    match std::env::var("RAKAZO_TEST_S3_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            gate::missing("the S3 server (RAKAZO_TEST_S3_ENDPOINT)", gate::S3);
            None
        }
    }
}

/// A fresh bucket; its settings and a client for it.
async fn fresh_bucket(endpoint: String) -> (ObjectStorage, Arc<dyn ObjectStore>) {
    let name = format!("rakazo-{}", uuid::Uuid::new_v4().simple());
    let created = reqwest::Client::new()
        .put(format!("{endpoint}/{name}"))
        .send()
        .await
        .expect("create bucket");
    assert!(created.status().is_success(), "{}", created.status());
    let cfg = ObjectStorage {
        bucket: name,
        endpoint: Some(endpoint),
        region: "us-east-1".into(),
        access_key_id: Some(Secret("test".into())),
        secret_access_key: Some(Secret("test".into())),
        prefix: Some("rakazo".into()),
    };
    let client = bucket::open(&cfg).expect("bucket client");
    (cfg, client)
}

async fn all_keys(bucket: &Arc<dyn ObjectStore>) -> Vec<String> {
    let mut keys: Vec<String> = bucket
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

/// The root an app's deployment keeps its objects under.
async fn root(s: &TestServer) -> String {
    let id = deployment::deployment_id(&s.app.db).await.unwrap();
    deployment::root(Some("rakazo"), &id).to_string()
}

async fn computer_row(s: &TestServer, bot: &str) -> computer::Model {
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    computer::Entity::find_by_id(c["id"].as_str().unwrap())
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap()
}

/// A private bot whose computer checkpointed `file` = `text`; its row.
async fn checkpointed(s: &TestServer, bot: &str, file: &str, text: &str) -> computer::Model {
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, &format!("echo {text} > {file}"))
        .await
        .unwrap();
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    let row = computer_row(s, bot).await;
    assert!(row.revision > 0, "the run's end checkpointed");
    row
}

/// The app's environment for `cfg`'s bucket, under the prefix `rakazo`.
fn storage_env(cfg: &ObjectStorage) -> [(&str, &str); 5] {
    [
        ("OBJECT_STORAGE_BUCKET", cfg.bucket.as_str()),
        ("OBJECT_STORAGE_ENDPOINT", cfg.endpoint.as_deref().unwrap()),
        ("OBJECT_STORAGE_ACCESS_KEY_ID", "test"),
        ("OBJECT_STORAGE_SECRET_ACCESS_KEY", "test"),
        ("OBJECT_STORAGE_PREFIX", "rakazo"),
    ]
}

/// The files of a stored revision, unpacked: `file`'s text.
async fn stored_text(s: &rakazo::app::App, row: &computer::Model, rev: i64, file: &str) -> String {
    let rt = s.runtime();
    let h = rt.home_id(row).await.unwrap();
    let tar = rt.homes.load(&h, rev).await.unwrap();
    let out = tempfile::tempdir().unwrap();
    archive::unpack(&tar, &out.path().join("x"), Limits::default()).unwrap();
    std::fs::read_to_string(out.path().join("x").join(file)).unwrap()
}

async fn second_database_shares_the_bucket(backend: Backend) {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let (cfg, client) = fresh_bucket(endpoint).await;
    let env = storage_env(&cfg);
    let Some(first) = TestServer::start(backend, &env).await else {
        return;
    };
    let (_, bots) = first.space_with_bots(2, "private").await;
    let kept = checkpointed(&first, &bots[0], "k.txt", "kept").await;
    let gone = checkpointed(&first, &bots[1], "g.txt", "gone").await;
    let first_root = root(&first).await;
    let home = |id: &str| format!("{first_root}/homes/{id}/");
    let keys = all_keys(&client).await;
    assert!(keys.iter().any(|k| k.starts_with(&home(&kept.storage_id))));
    assert!(keys.iter().any(|k| k.starts_with(&home(&gone.storage_id))));

    // `computer.delete` tombstones the storage id and empties it.
    first
        .ok("computer.delete", json!({ "computerId": gone.id }))
        .await;
    let tombstone = home_tombstone::Entity::find_by_id(gone.storage_id.clone())
        .one(&first.app.db)
        .await
        .unwrap();
    assert!(tombstone.is_some(), "the delete left a tombstone");
    assert!(
        !all_keys(&client)
            .await
            .iter()
            .any(|k| k.starts_with(&home(&gone.storage_id)))
    );
    let before = all_keys(&client).await;

    // A second deployment: a fresh database over the same bucket and prefix.
    let second = TestServer::start(Backend::Sqlite, &env).await.unwrap();
    let second_root = root(&second).await;
    assert_ne!(second_root, first_root);
    let reconciled = second
        .app
        .reconciler
        .as_ref()
        .expect("object storage runs a reconciler")
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reconciled.removed(), 0);
    // Even past every grace, its reconciler reaches nothing of the first.
    let second_store = ObjectHomeStore::new(
        client.clone(),
        Key::from(second_root.as_str()),
        second.app.config.data_dir.as_path(),
        3,
        Limits::default(),
    );
    let far = SystemTime::now() + Duration::from_secs(365 * 24 * 3600);
    reconciler::reconcile(&second.app.db, &second_store, Duration::ZERO, far)
        .await
        .unwrap();
    assert_eq!(all_keys(&client).await, before, "nothing was deleted");

    // Every stored revision of the first deployment still loads through it.
    let rt = first.app.runtime();
    let h = rt.home_id(&kept).await.unwrap();
    let revisions = rt.homes.revisions(&h).await.unwrap();
    assert!(!revisions.is_empty());
    for rev in revisions {
        assert_eq!(stored_text(&first.app, &kept, rev, "k.txt").await, "kept\n");
    }

    // A write that lands after the delete is removed by the first's reconciler (tombstone).
    let late = Key::from(format!("{}9", home(&gone.storage_id)));
    client
        .put(&late, PutPayload::from_static(b"late"))
        .await
        .unwrap();
    let reconciled = first
        .app
        .reconciler
        .as_ref()
        .unwrap()
        .send(ReconcileNow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((reconciled.tombstoned, reconciled.expired), (1, 0));
    let after = all_keys(&client).await;
    assert!(!after.contains(&late.to_string()));
    assert!(after.iter().any(|k| k.starts_with(&home(&kept.storage_id))));
}

#[actix_rt::test]
async fn a_second_database_sharing_the_bucket_deletes_nothing_on_sqlite() {
    second_database_shares_the_bucket(Backend::Sqlite).await;
}

#[actix_rt::test]
async fn a_second_database_sharing_the_bucket_deletes_nothing_on_postgres() {
    second_database_shares_the_bucket(Backend::Postgres).await;
}

/// A deployment upgraded from the layout before deployment roots: its stored homes move under
/// its root at start, their revision rows follow, and every revision still loads.
async fn the_old_layout_moves_under_the_root_at_start(backend: Backend) {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let (cfg, client) = fresh_bucket(endpoint).await;
    let env = storage_env(&cfg);
    let Some(s) = TestServer::start(backend, &env).await else {
        return;
    };
    let (_, bots) = s.space_with_bots(1, "private").await;
    let row = checkpointed(&s, &bots[0], "o.txt", "old").await;
    // Put everything back where the old layout kept it, as an older version left it.
    let root = format!("{}/", root(&s).await);
    for key in all_keys(&client).await {
        let old = Key::from(key.strip_prefix(&root).expect("under the root"));
        client.copy(&Key::from(key.as_str()), &old).await.unwrap();
        client.delete(&Key::from(key.as_str())).await.unwrap();
    }
    let rows = home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(&row.id))
        .all(&s.app.db)
        .await
        .unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let old = format!("homes/{}/{}", row.storage_id, r.revision);
        let mut r = r.into_active_model();
        r.object_key = Set(Some(old));
        r.update(&s.app.db).await.unwrap();
    }
    assert!(
        all_keys(&client)
            .await
            .iter()
            .all(|k| k.starts_with("homes/"))
    );

    // The upgraded app starts on the same database.
    let (upgraded, _) = rakazo::app::App::start(s.app.config.clone())
        .await
        .expect("the app starts");
    let keys = all_keys(&client).await;
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with(&root)), "{keys:?}");
    let rows = home_revision::Entity::find()
        .filter(home_revision::Column::ComputerId.eq(&row.id))
        .all(&upgraded.db)
        .await
        .unwrap();
    for r in &rows {
        let at = r.object_key.as_deref().unwrap();
        assert_eq!(at, format!("{root}homes/{}/{}", row.storage_id, r.revision));
        assert_eq!(
            stored_text(&upgraded, &row, r.revision, "o.txt").await,
            "old\n"
        );
    }
}

#[actix_rt::test]
async fn the_old_layout_moves_under_the_root_at_start_on_sqlite() {
    the_old_layout_moves_under_the_root_at_start(Backend::Sqlite).await;
}

#[actix_rt::test]
async fn the_old_layout_moves_under_the_root_at_start_on_postgres() {
    the_old_layout_moves_under_the_root_at_start(Backend::Postgres).await;
}
