//! `rakazo doctor` over a real deployment's data: a clean one is reported clean; a deleted
//! chunk, a flipped byte, an unnamed chunk and storage no computer owns are named, with a
//! non-zero exit, and nothing is changed. On the local store and on an S3 bucket (moto).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{Backend, TestServer};
use object_store::ObjectStore;
use object_store::path::Path as Key;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_rakazo");

/// Runs `rakazo doctor` with `env`: (success, stdout).
fn doctor(env: &[(String, String)]) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("doctor")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "doctor failed to run: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), stdout)
}

/// Two computers with two revisions each; answers their storage ids.
async fn deployment(s: &TestServer) -> Vec<String> {
    let (_, bots) = s.space_with_bots(2, "private").await;
    let mut ids = Vec::new();
    for bot in &bots {
        for text in ["first", "second"] {
            let (run, fence) = s.start_run(bot).await;
            s.exec(
                &run,
                fence,
                &format!("mkdir -p d && echo {text}-{bot} > d/{text}.txt"),
            )
            .await
            .unwrap();
            s.ok(
                "run.finish",
                json!({ "runId": run, "fence": fence, "outcome": "completed" }),
            )
            .await;
        }
        let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
        assert_eq!(c["revision"], 2);
        let row = rakazo_actors::computers::Computers::new(s.app.db.clone())
            .get(c["id"].as_str().unwrap())
            .await
            .unwrap();
        ids.push(row.storage_id);
    }
    ids
}

/// Every file under a directory with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.to_string_lossy().contains("rakazo.db") {
                out.insert(p.display().to_string(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn chunk_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("chunks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".sealed").map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[actix_rt::test]
async fn doctor_names_a_deleted_chunk_and_a_flipped_byte_in_the_local_store() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let ids = deployment(&s).await;
    let data = s.app.config.data_dir.clone();
    let env = vec![("DATA_DIR".to_owned(), data.display().to_string())];
    let (ok, out) = doctor(&env);
    assert!(ok, "{out}");
    assert!(out.starts_with("clean: 2 computers, 4 revisions"), "{out}");

    let (a, b) = (
        data.join("home-revisions").join(&ids[0]),
        data.join("home-revisions").join(&ids[1]),
    );
    let deleted = chunk_files(&a)[0].clone();
    std::fs::remove_file(a.join("chunks").join(format!("{deleted}.sealed"))).unwrap();
    let flipped = chunk_files(&b)[0].clone();
    let path = b.join("chunks").join(format!("{flipped}.sealed"));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let unnamed = "ab".repeat(32);
    std::fs::copy(&path, b.join("chunks").join(format!("{unnamed}.sealed"))).unwrap();
    let stray = data.join("home-revisions").join("nobody");
    std::fs::create_dir_all(&stray).unwrap();
    std::fs::write(stray.join("1.sealed"), b"x").unwrap();

    let before = snapshot(&data);
    let (ok, out) = doctor(&env);
    assert!(!ok, "{out}");
    let line = |kind: &str, sid: &str, name: &str| {
        out.lines()
            .any(|l| l.starts_with(&format!("{kind} {sid} ")) && l.contains(name))
    };
    assert!(line("missing-chunk", &ids[0], &deleted), "{out}");
    assert!(line("damaged-chunk", &ids[1], &flipped), "{out}");
    assert!(line("orphaned-chunk", &ids[1], &unnamed), "{out}");
    assert!(line("orphaned-storage", "nobody", ""), "{out}");
    assert_eq!(snapshot(&data), before, "doctor changes nothing");
}

/// The S3 endpoint, or `None` to skip outside CI.
fn s3_endpoint() -> Option<String> {
    match std::env::var("RAKAZO_TEST_S3_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            common::gate::missing("the S3 server (RAKAZO_TEST_S3_ENDPOINT)", common::gate::S3);
            None
        }
    }
}

async fn chunk_keys(bucket: &Arc<dyn ObjectStore>, root: &str, sid: &str) -> Vec<String> {
    use futures_util::TryStreamExt;
    let mut names: Vec<String> = bucket
        .list(Some(&Key::from(format!("{root}/homes/{sid}/chunks"))))
        .map_ok(|m| m.location.filename().unwrap().to_owned())
        .try_collect()
        .await
        .unwrap();
    names.sort();
    names
}

#[actix_rt::test]
async fn doctor_names_a_deleted_chunk_and_a_flipped_byte_in_a_bucket() {
    use object_store::ObjectStoreExt;
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let name = format!("rakazo-{}", uuid::Uuid::new_v4().simple());
    let created = reqwest::Client::new()
        .put(format!("{endpoint}/{name}"))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success());
    let settings = [
        ("OBJECT_STORAGE_BUCKET", name.as_str()),
        ("OBJECT_STORAGE_ENDPOINT", endpoint.as_str()),
        ("OBJECT_STORAGE_REGION", "us-east-1"),
        ("OBJECT_STORAGE_ACCESS_KEY_ID", "test"),
        ("OBJECT_STORAGE_SECRET_ACCESS_KEY", "test"),
    ];
    let s = TestServer::start(Backend::Sqlite, &settings).await.unwrap();
    let ids = deployment(&s).await;
    let mut env: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env.push((
        "DATA_DIR".into(),
        s.app.config.data_dir.display().to_string(),
    ));
    let (ok, out) = doctor(&env);
    assert!(ok, "{out}");
    assert!(out.starts_with("clean: 2 computers, 4 revisions"), "{out}");

    let cfg = rakazo::config::ObjectStorage {
        bucket: name.clone(),
        endpoint: Some(endpoint.clone()),
        region: "us-east-1".into(),
        access_key_id: Some(rakazo::config::Secret("test".into())),
        secret_access_key: Some(rakazo::config::Secret("test".into())),
        prefix: None,
    };
    // Every key of the deployment lives under its root, its deployment id.
    let root = rakazo::stores::deployment::deployment_id(&s.app.db)
        .await
        .unwrap();
    let bucket = rakazo::stores::bucket::open(&cfg).unwrap();
    let deleted = chunk_keys(&bucket, &root, &ids[0]).await[0].clone();
    bucket
        .delete(&Key::from(format!(
            "{root}/homes/{}/chunks/{deleted}",
            ids[0]
        )))
        .await
        .unwrap();
    let flipped = chunk_keys(&bucket, &root, &ids[1]).await[0].clone();
    let key = Key::from(format!("{root}/homes/{}/chunks/{flipped}", ids[1]));
    let mut bytes = bucket
        .get(&key)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    bucket.put(&key, bytes.into()).await.unwrap();

    let (ok, out) = doctor(&env);
    assert!(!ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("missing-chunk {} ", ids[0])) && l.contains(&deleted)),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("damaged-chunk {} ", ids[1])) && l.contains(&flipped)),
        "{out}"
    );
}
