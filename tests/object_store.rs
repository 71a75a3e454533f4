//! The object home store against a real S3-compatible server (moto, started by
//! `scripts/test.sh`): round trips, retention, restores, every hostile archive and stored
//! object refused with the previous latest copy intact, and the reconciler.

mod gate;

use std::path::Path;
use std::sync::Arc;

use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rakazo::config::{ObjectStorage, Secret};
use rakazo::stores::archive::{self, Limits};
use rakazo::stores::object::ObjectHomeStore;
use rakazo::stores::reconciler::{self, ReconcileNow, Reconciler};
use rakazo::stores::{bucket, deployment, seal};
use rakazo_actors::computers::Computers;
use rakazo_actors::home_store::{HomeId, HomeStore, StoreError};
use std::time::{Duration, SystemTime};

/// The root of the fixture's store (a deployment id, as the app makes them).
const ROOT: &str = "deployment-a";

/// GCM tag bytes after each sealed segment.
const TAG: usize = 16;

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

/// A fresh bucket on the test server and a client for it.
async fn fresh_bucket() -> Option<Arc<dyn ObjectStore>> {
    let endpoint = endpoint()?;
    let name = format!("rakazo-{}", uuid::Uuid::new_v4().simple());
    let created = reqwest::Client::new()
        .put(format!("{endpoint}/{name}"))
        .send()
        .await
        .expect("create bucket");
    assert!(
        created.status().is_success(),
        "create bucket: {}",
        created.status()
    );
    let cfg = ObjectStorage {
        bucket: name,
        endpoint: Some(endpoint),
        region: "us-east-1".into(),
        access_key_id: Some(Secret("test".into())),
        secret_access_key: Some(Secret("test".into())),
        prefix: None,
    };
    Some(bucket::open(&cfg).expect("bucket client"))
}

struct Fixture {
    bucket: Arc<dyn ObjectStore>,
    store: ObjectHomeStore,
    dir: tempfile::TempDir,
}

async fn fixture(keep: usize, limits: Limits) -> Option<Fixture> {
    let bucket = fresh_bucket().await?;
    let dir = tempfile::tempdir().unwrap();
    let store = ObjectHomeStore::new(bucket.clone(), Key::from(ROOT), dir.path(), keep, limits);
    Some(Fixture { bucket, store, dir })
}

fn home(storage_id: &str) -> HomeId {
    HomeId {
        home_key: format!("bot-{storage_id}"),
        storage_id: storage_id.into(),
        data_key: [42; 32],
    }
}

/// A workspace archive with `notes.txt` = `text` and a multi-segment `big.bin`.
fn workspace(text: &str) -> Vec<u8> {
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("notes.txt"), text).unwrap();
    std::fs::create_dir(src.path().join("sub")).unwrap();
    let big: Vec<u8> = (0..(3 * seal::SEGMENT + 999))
        .map(|i| (i * 7 % 253) as u8)
        .collect();
    std::fs::write(src.path().join("sub/big.bin"), big).unwrap();
    archive::pack(src.path()).unwrap()
}

fn notes(fx: &Fixture, home: &HomeId) -> String {
    let path = fx.store.latest().path(&home.home_key).unwrap();
    std::fs::read_to_string(path.join("notes.txt")).unwrap()
}

/// Only the current copy and its revision stamp: no staging or old directories left.
fn assert_clean(fx: &Fixture) {
    let names: Vec<String> = std::fs::read_dir(fx.dir.path().join("homes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging-") || n.starts_with(".old-"))
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}

/// The keys under the fixture's root, relative to it, sorted.
async fn object_keys(bucket: &Arc<dyn ObjectStore>) -> Vec<String> {
    let root = format!("{ROOT}/");
    all_keys(bucket)
        .await
        .into_iter()
        .filter_map(|k| k.strip_prefix(&root).map(str::to_owned))
        .collect()
}

/// Every key in the bucket, sorted.
async fn all_keys(bucket: &Arc<dyn ObjectStore>) -> Vec<String> {
    use futures_util::TryStreamExt;
    let mut keys: Vec<String> = bucket
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

/// The bucket key of `key` under the fixture's root.
fn at(key: &str) -> Key {
    Key::from(format!("{ROOT}/{key}"))
}

/// Every key but the chunks': the revisions.
async fn revision_keys(bucket: &Arc<dyn ObjectStore>) -> Vec<String> {
    let mut keys = object_keys(bucket).await;
    keys.retain(|k| !k.contains("/chunks/"));
    keys
}

fn unpacked(tar: &[u8]) -> String {
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("x");
    archive::unpack(tar, &out, Limits::default()).unwrap();
    std::fs::read_to_string(out.join("notes.txt")).unwrap()
}

#[tokio::test]
async fn save_then_load_round_trips_and_caches_the_latest_copy() {
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    let h = home("round-trip");
    let tar = workspace("hello");
    fx.store
        .save(&h, 1, tar.clone().into(), true)
        .await
        .unwrap();
    assert_eq!(fx.store.load(&h, 1).await.unwrap(), tar);
    assert_eq!(fx.store.revisions(&h).await.unwrap(), vec![1]);
    assert_eq!(notes(&fx, &h), "hello");
    assert_eq!(revision_keys(&fx.bucket).await, vec!["homes/round-trip/1"]);
    assert_eq!(chunk_keys(&fx.bucket, "round-trip").await.len(), 1);
    assert_eq!(fx.store.storage_ids().await.unwrap(), vec!["round-trip"]);
    assert_eq!(fx.store.load(&h, 9).await, Err(StoreError::NotFound));

    // A lost cache is brought back from the bucket by the next load of the newest revision.
    std::fs::remove_dir_all(fx.store.latest().path(&h.home_key).unwrap()).unwrap();
    fx.store.load(&h, 1).await.unwrap();
    assert_eq!(notes(&fx, &h), "hello");

    fx.store.delete(&h.home_key, &h.storage_id).await.unwrap();
    assert!(object_keys(&fx.bucket).await.is_empty());
    assert!(!fx.store.latest().path(&h.home_key).unwrap().exists());
}

#[tokio::test]
async fn large_archives_upload_in_parts() {
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    let h = home("multipart");
    let src = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..(rakazo::stores::object::PART + 12345))
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(src.path().join("big.bin"), &big).unwrap();
    let tar = archive::pack(src.path()).unwrap();
    fx.store
        .save(&h, 1, tar.clone().into(), true)
        .await
        .unwrap();
    assert_eq!(fx.store.load(&h, 1).await.unwrap(), tar);

    // A large archive refused at its last entry leaves no object behind (every chunk is
    // checked before anything goes up), and the stored revision stays.
    let before = object_keys(&fx.bucket).await;
    let mut hostile = archive::pack(src.path()).unwrap();
    hostile.truncate(hostile.len() - 1024);
    raw_entry(&mut hostile, "escape", tar::EntryType::Symlink, "/etc", b"");
    hostile.extend_from_slice(&[0u8; 1024]);
    assert!(matches!(
        fx.store.save(&h, 2, hostile.clone().into(), true).await,
        Err(StoreError::Rejected(_))
    ));
    assert_eq!(object_keys(&fx.bucket).await, before);
    assert_eq!(fx.store.revisions(&h).await.unwrap(), vec![1]);
    assert_clean(&fx);
}

#[tokio::test]
async fn retention_deletes_objects_past_keep_and_older_kept_revisions_restore() {
    let Some(fx) = fixture(2, Limits::default()).await else {
        return;
    };
    let h = home("retention");
    for rev in 1..=4 {
        fx.store
            .save(&h, rev, workspace(&format!("rev {rev}")).into(), true)
            .await
            .unwrap();
    }
    assert_eq!(fx.store.revisions(&h).await.unwrap(), vec![3, 4]);
    assert_eq!(
        revision_keys(&fx.bucket).await,
        vec!["homes/retention/3", "homes/retention/4"]
    );
    // Only the chunks the kept revisions name remain.
    assert_eq!(chunk_keys(&fx.bucket, "retention").await.len(), 2);
    assert_eq!(fx.store.load(&h, 2).await, Err(StoreError::NotFound));
    // The older kept revision opens; the latest copy stays at the newest.
    assert_eq!(unpacked(&fx.store.load(&h, 3).await.unwrap()), "rev 3");
    assert_eq!(notes(&fx, &h), "rev 4");
    assert_clean(&fx);
}

/// A tar entry written byte by byte, so hostile names and kinds get through.
fn raw_entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) {
    let mut header = tar::Header::new_gnu();
    let gnu = header.as_gnu_mut().unwrap();
    gnu.name[..name.len()].copy_from_slice(name.as_bytes());
    gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn raw_tar(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in entries {
        raw_entry(&mut out, name, *kind, link, data);
    }
    out.extend_from_slice(&[0; 1024]);
    out
}

#[tokio::test]
async fn hostile_archives_are_refused_and_the_previous_copy_stays() {
    let limits = Limits {
        max_total_bytes: 300_000,
        max_file_bytes: 250_000,
        max_entries: 8,
    };
    let Some(fx) = fixture(3, limits).await else {
        return;
    };
    let h = home("hostile");
    fx.store
        .save(&h, 1, workspace("good").into(), true)
        .await
        .unwrap();
    let file = tar::EntryType::Regular;
    let many: Vec<String> = (0..9).map(|i| format!("f{i}")).collect();
    let many_entries: Vec<(&str, tar::EntryType, &str, &[u8])> = many
        .iter()
        .map(|n| (n.as_str(), file, "", b"x".as_slice()))
        .collect();
    let half = vec![1u8; 200_000];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("dot-dot", raw_tar(&[("../escape.txt", file, "", b"x")])),
        (
            "nested dot-dot",
            raw_tar(&[("a/../../escape.txt", file, "", b"x")]),
        ),
        ("absolute", raw_tar(&[("/etc/evil", file, "", b"x")])),
        (
            "symlink",
            raw_tar(&[("link", tar::EntryType::Symlink, "/etc/passwd", b"")]),
        ),
        (
            "hard link",
            raw_tar(&[("link", tar::EntryType::Link, "/etc/passwd", b"")]),
        ),
        (
            "char device",
            raw_tar(&[("dev", tar::EntryType::Char, "", b"")]),
        ),
        (
            "block device",
            raw_tar(&[("dev", tar::EntryType::Block, "", b"")]),
        ),
        ("fifo", raw_tar(&[("fifo", tar::EntryType::Fifo, "", b"")])),
        (
            "oversize total",
            raw_tar(&[("a", file, "", &half), ("b", file, "", &half)]),
        ),
        ("too many entries", raw_tar(&many_entries)),
    ];
    for (case, tar) in cases {
        let err = fx.store.save(&h, 2, tar.clone().into(), true).await;
        assert!(
            matches!(err, Err(StoreError::Rejected(_))),
            "{case}: {err:?}"
        );
        assert_eq!(notes(&fx, &h), "good", "{case}");
        assert_eq!(fx.store.revisions(&h).await.unwrap(), vec![1], "{case}");
        assert_clean(&fx);
    }
    assert!(!fx.dir.path().join("escape.txt").exists());
}

/// Sealed-chunk layout: header (with the 64-character chunk name), then segments of
/// `SEGMENT + TAG` bytes.
fn header_len(storage_id: &str) -> usize {
    4 + 1 + 4 + 2 + storage_id.len() + 2 + 64 + 16
}

/// The keys of a home's chunks.
async fn chunk_keys(bucket: &Arc<dyn ObjectStore>, storage_id: &str) -> Vec<String> {
    let prefix = format!("homes/{storage_id}/chunks/");
    object_keys(bucket)
        .await
        .into_iter()
        .filter(|k| k.starts_with(&prefix))
        .collect()
}

#[tokio::test]
async fn tampered_stored_objects_are_refused_and_nothing_local_changes() {
    let Some(fx) = fixture(5, Limits::default()).await else {
        return;
    };
    let (a, b) = (home("home-a"), home("home-bb"));
    fx.store
        .save(&a, 1, workspace("a1").into(), true)
        .await
        .unwrap();
    let a1_chunk = chunk_keys(&fx.bucket, "home-a").await;
    assert_eq!(a1_chunk.len(), 1, "a small workspace is one chunk");
    fx.store
        .save(&b, 1, workspace("b1").into(), true)
        .await
        .unwrap();
    fx.store
        .save(&a, 2, workspace("a2").into(), true)
        .await
        .unwrap();
    let a2_chunk = chunk_keys(&fx.bucket, "home-a")
        .await
        .into_iter()
        .find(|k| *k != a1_chunk[0])
        .expect("revision 2 stored a chunk of its own");
    let get = |k: String| {
        let bucket = fx.bucket.clone();
        async move {
            bucket
                .get(&at(&k))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
                .to_vec()
        }
    };
    let b1_chunk = chunk_keys(&fx.bucket, "home-bb").await.remove(0);
    let (m2, m1, mb) = (
        get("homes/home-a/2".into()).await,
        get("homes/home-a/1".into()).await,
        get("homes/home-bb/1".into()).await,
    );
    let (c2, c1, cb) = (
        get(a2_chunk.clone()).await,
        get(a1_chunk[0].clone()).await,
        get(b1_chunk).await,
    );
    let (ha, hb, seg) = (
        header_len("home-a"),
        header_len("home-bb"),
        seal::SEGMENT + TAG,
    );
    assert!(
        c2.len() > ha + 3 * seg,
        "the fixture spans several segments"
    );
    let splice = |base: &[u8], base_h: usize, other: &[u8], other_h: usize| {
        let mut out = base.to_vec();
        out[base_h + seg..base_h + 2 * seg]
            .copy_from_slice(&other[other_h + seg..other_h + 2 * seg]);
        out
    };
    let mut reordered = c2[..ha].to_vec();
    reordered.extend_from_slice(&c2[ha + seg..ha + 2 * seg]);
    reordered.extend_from_slice(&c2[ha..ha + seg]);
    reordered.extend_from_slice(&c2[ha + 2 * seg..]);
    let flip = |bytes: &[u8], at: usize| {
        let mut out = bytes.to_vec();
        out[at] ^= 0x01;
        out
    };
    let manifest = "homes/home-a/2".to_string();
    let cases: Vec<(&str, &String, Option<Vec<u8>>)> = vec![
        (
            "manifest: one flipped byte",
            &manifest,
            Some(flip(&m2, m2.len() - 3)),
        ),
        (
            "manifest: one flipped header byte",
            &manifest,
            Some(flip(&m2, 12)),
        ),
        (
            "manifest: truncated",
            &manifest,
            Some(m2[..m2.len() - 20].to_vec()),
        ),
        ("manifest: another revision's", &manifest, Some(m1.clone())),
        ("manifest: another home's", &manifest, Some(mb.clone())),
        (
            "chunk: truncated at a segment boundary",
            &a2_chunk,
            Some(c2[..ha + 2 * seg].to_vec()),
        ),
        (
            "chunk: truncated mid-segment",
            &a2_chunk,
            Some(c2[..ha + seg + 77].to_vec()),
        ),
        ("chunk: header only", &a2_chunk, Some(c2[..ha].to_vec())),
        ("chunk: reordered segments", &a2_chunk, Some(reordered)),
        (
            "chunk: segment from another revision",
            &a2_chunk,
            Some(splice(&c2, ha, &c1, ha)),
        ),
        (
            "chunk: segment from another home",
            &a2_chunk,
            Some(splice(&c2, ha, &cb, hb)),
        ),
        (
            "chunk: whole object of another revision",
            &a2_chunk,
            Some(c1.clone()),
        ),
        (
            "chunk: one flipped byte",
            &a2_chunk,
            Some(flip(&c2, ha + seg + 100)),
        ),
        (
            "chunk: one flipped header byte",
            &a2_chunk,
            Some(flip(&c2, ha - 5)),
        ),
        ("chunk: missing", &a2_chunk, None),
    ];
    // The cache is at revision 2 and must stay "a2".
    for (case, key, bytes) in cases {
        let key = at(key);
        match bytes {
            Some(bytes) => {
                fx.bucket.put(&key, PutPayload::from(bytes)).await.unwrap();
            }
            None => fx.bucket.delete(&key).await.unwrap(),
        }
        let err = fx.store.load(&a, 2).await;
        assert!(
            matches!(err, Err(StoreError::Rejected(_))),
            "{case}: {err:?}"
        );
        assert_eq!(notes(&fx, &a), "a2", "{case}");
        assert_clean(&fx);
        // With the cache gone, a refused object still leaves nothing behind.
        let cached = fx.store.latest().path(&a.home_key).unwrap();
        let moved = fx.dir.path().join("moved-away");
        std::fs::rename(&cached, &moved).unwrap();
        assert!(matches!(
            fx.store.load(&a, 2).await,
            Err(StoreError::Rejected(_))
        ));
        assert!(!cached.exists(), "{case}");
        std::fs::rename(&moved, &cached).unwrap();
        for (key, original) in [(manifest.as_str(), &m2), (a2_chunk.as_str(), &c2)] {
            fx.bucket
                .put(&at(key), PutPayload::from(original.clone()))
                .await
                .unwrap();
        }
    }
    // Both revisions still open.
    assert_eq!(unpacked(&fx.store.load(&a, 2).await.unwrap()), "a2");
    assert_eq!(unpacked(&fx.store.load(&a, 1).await.unwrap()), "a1");
}

async fn sqlite(dir: &Path) -> sea_orm::DatabaseConnection {
    let url = format!("sqlite://{}?mode=rwc", dir.join("test.db").display());
    let db = rakazo::db::connect(&url).await.unwrap();
    rakazo::db::migrate(&db).await.unwrap();
    db
}

async fn insert_computer(db: &sea_orm::DatabaseConnection, storage_id: &str) {
    use rakazo_actors::entity::computer;
    use sea_orm::{ActiveModelTrait, Set};
    computer::ActiveModel {
        id: Set(format!("c-{storage_id}")),
        space_id: Set("space".into()),
        owner_id: Set("owner".into()),
        bot_id: Set(None),
        kind: Set("team".into()),
        home_key: Set(format!("bot-{storage_id}")),
        provider_kind: Set(None),
        provider_ref: Set(None),
        state: Set("stopped".into()),
        revision: Set(1),
        pending_restore_revision: Set(None),
        storage_id: Set(storage_id.into()),
        wrapped_data_key: Set(None),
        provisioning_fence: Set(0),
        lease_epoch: Set(0),
        quarantined: Set(false),
        last_active_at_ms: Set(0),
        created_at_ms: Set(0),
        updated_at_ms: Set(0),
    }
    .insert(db)
    .await
    .unwrap();
}

/// A store over `bucket` for the deployment of `db`, rooted as the app roots it.
async fn deployment_store(
    bucket: &Arc<dyn ObjectStore>,
    db: &sea_orm::DatabaseConnection,
    dir: &Path,
) -> ObjectHomeStore {
    let id = deployment::deployment_id(db).await.unwrap();
    assert_eq!(
        deployment::deployment_id(db).await.unwrap(),
        id,
        "made once"
    );
    ObjectHomeStore::new(
        bucket.clone(),
        deployment::root(None, &id),
        dir,
        3,
        Limits::default(),
    )
}

async fn computer_row(
    db: &sea_orm::DatabaseConnection,
    storage_id: &str,
) -> rakazo_actors::entity::computer::Model {
    use rakazo_actors::entity::computer;
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    computer::Entity::find()
        .filter(computer::Column::StorageId.eq(storage_id))
        .one(db)
        .await
        .unwrap()
        .unwrap()
}

/// Keys the reconciler must never touch: another application's, the layout before deployment
/// roots, another deployment's.
const OUTSIDE: [&str; 3] = [
    "other-app/notes.txt",
    "homes/legacy-home/1",
    "another-deployment/homes/someone/1",
];

async fn put_outside(bucket: &Arc<dyn ObjectStore>) {
    for key in OUTSIDE {
        bucket
            .put(&Key::from(key), PutPayload::from_static(b"not ours"))
            .await
            .unwrap();
    }
}

async fn assert_outside_intact(bucket: &Arc<dyn ObjectStore>) {
    let keys = all_keys(bucket).await;
    for key in OUTSIDE {
        assert!(keys.iter().any(|k| k == key), "{key} was touched: {keys:?}");
    }
}

fn ids(homes: &[rakazo::stores::object::StoredHome]) -> Vec<&str> {
    homes.iter().map(|h| h.storage_id.as_str()).collect()
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

#[actix_rt::test]
async fn the_reconciler_deletes_tombstoned_and_expired_orphans_of_its_own_root_only() {
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    let db = sqlite(fx.dir.path()).await;
    let store = deployment_store(&fx.bucket, &db, fx.dir.path()).await;
    for id in ["owned", "deleted"] {
        insert_computer(&db, id).await;
    }
    for id in ["owned", "deleted", "stray"] {
        store
            .save(&home(id), 1, workspace(id).into(), true)
            .await
            .unwrap();
    }
    put_outside(&fx.bucket).await;
    // `computer.delete` tombstones the storage id with the row's deletion.
    let computers = Computers::new(db.clone());
    computers
        .delete(&computer_row(&db, "deleted").await)
        .await
        .unwrap();

    // The tombstoned id goes at once; the stray one (no owner, no tombstone) is young.
    let now = SystemTime::now();
    let pass = reconciler::reconcile(&db, &store, DAY, now).await.unwrap();
    assert_eq!((pass.tombstoned, pass.expired, pass.young), (1, 0, 1));
    assert_eq!(
        pass.tombstones_dropped, 0,
        "a tombstone outlives late writes"
    );
    assert_eq!(
        ids(&store.stored_homes().await.unwrap()),
        ["owned", "stray"]
    );
    assert_outside_intact(&fx.bucket).await;

    // Past the grace the stray id goes, and the served tombstone with it.
    let later = now + DAY + Duration::from_secs(60);
    let pass = reconciler::reconcile(&db, &store, DAY, later)
        .await
        .unwrap();
    assert_eq!((pass.tombstoned, pass.expired, pass.young), (0, 1, 0));
    assert_eq!(pass.tombstones_dropped, 1);
    assert_eq!(ids(&store.stored_homes().await.unwrap()), ["owned"]);
    assert_outside_intact(&fx.bucket).await;
    assert_eq!(
        unpacked(&store.load(&home("owned"), 1).await.unwrap()),
        "owned"
    );

    // Through the actor, as the app runs it (a zero grace: the orphan is old enough at once).
    store
        .save(&home("orphan-3"), 1, workspace("o").into(), true)
        .await
        .unwrap();
    let addr = actix::Actor::start(Reconciler::new(
        db.clone(),
        Arc::new(store.clone()),
        Duration::from_secs(3600),
        Duration::ZERO,
    ));
    assert_eq!(addr.send(ReconcileNow).await.unwrap().unwrap().removed(), 1);
    assert_eq!(ids(&store.stored_homes().await.unwrap()), ["owned"]);
    assert_outside_intact(&fx.bucket).await;
}

#[actix_rt::test]
async fn a_second_database_sharing_the_bucket_deletes_nothing_of_the_first() {
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    // The first deployment: two computers with several revisions (retention ran, chunks are
    // shared between revisions), one deleted computer whose objects wait for the reconciler.
    let first = sqlite(fx.dir.path()).await;
    let store = deployment_store(&fx.bucket, &first, fx.dir.path()).await;
    for id in ["first-a", "first-b", "first-gone"] {
        insert_computer(&first, id).await;
        for rev in 1..=4 {
            store
                .save(
                    &home(id),
                    rev,
                    workspace(&format!("{id} {rev}")).into(),
                    true,
                )
                .await
                .unwrap();
        }
    }
    Computers::new(first.clone())
        .delete(&computer_row(&first, "first-gone").await)
        .await
        .unwrap();
    put_outside(&fx.bucket).await;
    let before = all_keys(&fx.bucket).await;

    // The second: a fresh database over the same bucket, with a computer and an orphan of its
    // own, reconciled past every grace.
    let second_dir = tempfile::tempdir().unwrap();
    let second = sqlite(second_dir.path()).await;
    let second_store = deployment_store(&fx.bucket, &second, second_dir.path()).await;
    assert_ne!(
        second_store.root(),
        store.root(),
        "each database is its own deployment"
    );
    insert_computer(&second, "second-a").await;
    for id in ["second-a", "second-stray"] {
        second_store
            .save(&home(id), 1, workspace(id).into(), true)
            .await
            .unwrap();
    }
    let far = SystemTime::now() + 30 * DAY;
    let pass = reconciler::reconcile(&second, &second_store, Duration::ZERO, far)
        .await
        .unwrap();
    assert_eq!(
        (pass.tombstoned, pass.expired),
        (0, 1),
        "its own stray goes"
    );
    let first_root = format!("{}/", store.root());
    let after: Vec<String> = all_keys(&fx.bucket)
        .await
        .into_iter()
        .filter(|k| !k.starts_with(&format!("{}/", second_store.root())))
        .collect();
    assert_eq!(after, before, "nothing of the first deployment was touched");
    assert!(after.iter().any(|k| k.starts_with(&first_root)));

    // The second database pointed at the first's root (a copied setting, say) recognises no
    // storage id there: it deletes nothing, not even what is old and unowned.
    let misrooted = ObjectHomeStore::new(
        fx.bucket.clone(),
        store.root().clone(),
        second_dir.path(),
        2,
        Limits::default(),
    );
    let pass = reconciler::reconcile(&second, &misrooted, Duration::ZERO, far)
        .await
        .unwrap();
    assert_eq!((pass.removed(), pass.unproven), (0, 3));
    assert_eq!(
        all_keys(&fx.bucket)
            .await
            .into_iter()
            .filter(|k| k.starts_with(&first_root))
            .count(),
        before.iter().filter(|k| k.starts_with(&first_root)).count()
    );

    // Every kept manifest and chunk of the first deployment still loads through it.
    for id in ["first-a", "first-b"] {
        let h = home(id);
        assert_eq!(store.revisions(&h).await.unwrap(), vec![2, 3, 4]);
        for rev in [2, 3, 4] {
            let tar = store.load(&h, rev).await.unwrap();
            assert_eq!(unpacked(&tar), format!("{id} {rev}"));
        }
    }
    // Its own reconciler then removes only its tombstoned computer.
    let pass = reconciler::reconcile(&first, &store, DAY, SystemTime::now())
        .await
        .unwrap();
    assert_eq!((pass.tombstoned, pass.expired, pass.young), (1, 0, 0));
    assert_eq!(
        ids(&store.stored_homes().await.unwrap()),
        ["first-a", "first-b"]
    );
    assert_eq!(
        ids(&second_store.stored_homes().await.unwrap()),
        ["second-a"]
    );
    assert_outside_intact(&fx.bucket).await;
}

#[actix_rt::test]
async fn homes_stored_before_deployment_roots_move_under_the_root_and_still_load() {
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    // The layout before deployment roots: `homes/<storage id>/...` at the top of the bucket.
    let old = ObjectHomeStore::new(
        fx.bucket.clone(),
        Key::default(),
        fx.dir.path(),
        3,
        Limits::default(),
    );
    for id in ["old-owned", "old-foreign"] {
        for rev in 1..=2 {
            old.save(
                &home(id),
                rev,
                workspace(&format!("{id} {rev}")).into(),
                true,
            )
            .await
            .unwrap();
        }
    }
    let db = sqlite(fx.dir.path()).await;
    insert_computer(&db, "old-owned").await;
    let store = deployment_store(&fx.bucket, &db, fx.dir.path()).await;
    let owned = ["old-owned".to_string()].into_iter().collect();
    assert_eq!(store.adopt_legacy(&owned).await.unwrap(), 1);
    assert_eq!(store.adopt_legacy(&owned).await.unwrap(), 0, "idempotent");

    let h = home("old-owned");
    assert_eq!(store.revisions(&h).await.unwrap(), vec![1, 2]);
    for rev in 1..=2 {
        assert_eq!(
            unpacked(&store.load(&h, rev).await.unwrap()),
            format!("old-owned {rev}")
        );
    }
    let keys = all_keys(&fx.bucket).await;
    assert!(
        !keys.iter().any(|k| k.starts_with("homes/old-owned/")),
        "{keys:?}"
    );
    // A storage id this database does not own stays where it was, and the reconciler never
    // reaches it.
    let foreign: Vec<_> = keys
        .iter()
        .filter(|k| k.starts_with("homes/old-foreign/"))
        .collect();
    assert!(foreign.len() >= 3, "{keys:?}");
    reconciler::reconcile(&db, &store, Duration::ZERO, SystemTime::now() + DAY)
        .await
        .unwrap();
    let after = all_keys(&fx.bucket).await;
    assert!(foreign.iter().all(|k| after.contains(k)));
    // Saving goes on from the moved revisions, under the root.
    store
        .save(&h, 3, workspace("old-owned 3").into(), true)
        .await
        .unwrap();
    assert_eq!(store.revisions(&h).await.unwrap(), vec![1, 2, 3]);
    assert_eq!(notes(&fx, &h), "old-owned 3");
}

/// Gives its bytes, then fails (a machine that went away mid-export).
struct BreaksOff(Vec<u8>);

impl tokio::io::AsyncRead for BreaksOff {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.0.is_empty() {
            return std::task::Poll::Ready(Err(std::io::Error::other("the machine went away")));
        }
        let n = buf.remaining().min(self.0.len());
        buf.put_slice(&self.0[..n]);
        self.0.drain(..n);
        std::task::Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn a_streamed_archive_goes_up_in_chunks_and_streams_back() {
    use rakazo_actors::home_store::StreamSaved;
    use sha2::Digest as _;
    let Some(fx) = fixture(3, Limits::default()).await else {
        return;
    };
    let h = home("streamed");
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("notes.txt"), "streamed").unwrap();
    // Larger than an upload part, and cut inside its data into chunks of 8 MiB.
    let big: Vec<u8> = (0..(rakazo::stores::object::PART + 4_000_000))
        .map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(src.path().join("big.bin"), &big).unwrap();
    let tar = archive::pack(src.path()).unwrap();
    let saved = fx
        .store
        .save_stream(&h, 1, &mut tar.as_slice(), None, true)
        .await
        .unwrap();
    let StreamSaved::Saved { saved, fingerprint } = saved else {
        panic!("a first save stores");
    };
    assert_eq!(fingerprint, hex::encode(sha2::Sha256::digest(&tar)));
    assert_eq!(saved.archive_bytes, tar.len() as u64);
    assert_eq!(notes(&fx, &h), "streamed");
    assert!(chunk_keys(&fx.bucket, "streamed").await.len() >= 3);
    let mut back = Vec::new();
    fx.store.load_to(&h, 1, &mut back).await.unwrap();
    assert_eq!(back, tar);
    assert_eq!(fx.store.load(&h, 1).await.unwrap(), tar);

    // The same archive again: nothing new in the bucket, no revision.
    let before = object_keys(&fx.bucket).await;
    let again = fx
        .store
        .save_stream(&h, 2, &mut tar.as_slice(), Some(&fingerprint), true)
        .await
        .unwrap();
    assert_eq!(again, StreamSaved::Unchanged);
    assert_eq!(object_keys(&fx.bucket).await, before);

    // Refused at its last entry, or broken off by its machine: nothing stays.
    let mut hostile = tar.clone();
    hostile.truncate(hostile.len() - 1024);
    raw_entry(&mut hostile, "escape", tar::EntryType::Symlink, "/etc", b"");
    hostile.extend_from_slice(&[0u8; 1024]);
    let refused = fx
        .store
        .save_stream(&h, 2, &mut hostile.as_slice(), None, true)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Rejected(_))),
        "{refused:?}"
    );
    let mut changed = tar.clone();
    changed.truncate(tar.len() - 1024);
    raw_entry(
        &mut changed,
        "more.txt",
        tar::EntryType::Regular,
        "",
        b"more",
    );
    let broken = fx
        .store
        .save_stream(&h, 2, &mut BreaksOff(changed), None, true)
        .await;
    assert!(
        matches!(&broken, Err(StoreError::Failed(why)) if why.contains("went away")),
        "{broken:?}"
    );
    assert_eq!(object_keys(&fx.bucket).await, before);
    assert_eq!(fx.store.revisions(&h).await.unwrap(), vec![1]);
    assert_eq!(notes(&fx, &h), "streamed");
    assert_clean(&fx);
}
