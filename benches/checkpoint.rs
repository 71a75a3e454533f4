//! Checkpoint benchmark: pack + seal + store of a ~1 GiB workspace (~20,000 small files and a
//! few large ones) through the local and the S3 home stores, side by side with
//! `tar -cf - DIR | openssl enc -aes-256-ctr` in the same run: a first checkpoint (every
//! piece stored), a checkpoint after one file changed (from a mounted home, as docker's, and
//! as one whole archive, as a remote machine sends it, with the store's copy restaged), one
//! when nothing changed, and the time of each phase. The S3 leg needs `RAKAZO_TEST_S3_ENDPOINT`
//! (`scripts/bench.sh checkpoint` starts moto); `RAKAZO_BENCH_S3_BUCKET` names an existing bucket
//! for servers that refuse unsigned bucket creation, `RAKAZO_BENCH_S3_SERVER` its name in the
//! table; the S3 floor (the same size put through the same client) runs beside our S3 leg.
//! Run: `cargo bench --bench checkpoint`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

use rakazo::config::{ObjectStorage, Secret};
use rakazo::desktop::files;
use rakazo::stores::archive::{self, Limits};
use rakazo::stores::local::{LatestCopies, LocalHomeStore};
use rakazo::stores::object::{self, ObjectHomeStore};
use rakazo::stores::{bucket, seal};
use rakazo_actors::home_store::{HomeId, HomeStore};
use rakazo_actors::provider::WorkspaceExport;

/// The generated workspace, reused across runs.
const WORKSPACE: &str = "/tmp/rakazo-bench-workspace-v1";
const SMALL_FILES: usize = 20_000;
const FILES_PER_DIR: usize = 100;
const LARGE_FILES: usize = 4;
const LARGE_BYTES: usize = 176 << 20;
/// Runs per leg; the best is reported (page cache warm, least noise).
const RUNS: usize = 3;

/// Deterministic, incompressible bytes.
fn fill(seed: u64, buf: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn workspace() -> PathBuf {
    let root = PathBuf::from(WORKSPACE);
    if root.join(".complete").exists() {
        return root.join("home");
    }
    let _ = std::fs::remove_dir_all(&root);
    let home = root.join("home");
    let mut buf = vec![0u8; LARGE_BYTES];
    for i in 0..SMALL_FILES {
        let dir = home.join(format!("src/d{:03}", i / FILES_PER_DIR));
        if i % FILES_PER_DIR == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        // 1 KiB .. 31 KiB, about 16 KiB on average.
        let len = 1024 + (i * 7919 % 30) * 1024;
        fill(i as u64, &mut buf[..len]);
        std::fs::write(dir.join(format!("f{i:05}.txt")), &buf[..len]).unwrap();
    }
    std::fs::create_dir_all(home.join("data")).unwrap();
    for i in 0..LARGE_FILES {
        fill(1_000_000 + i as u64, &mut buf);
        std::fs::write(home.join(format!("data/large{i}.bin")), &buf).unwrap();
    }
    std::fs::write(root.join(".complete"), b"").unwrap();
    home
}

fn best(mut f: impl FnMut() -> Duration) -> Duration {
    (0..RUNS).map(|_| f()).min().unwrap()
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// `tar | openssl enc` into `out`: `/dev/null` (the baseline), or a file that is then
/// fsynced (the same work made durable, as a checkpoint must be).
fn baseline(dir: &Path, out: &Path) -> Duration {
    let sync = if out == Path::new("/dev/null") {
        String::new()
    } else {
        format!(" && sync '{}'", out.display())
    };
    let script = format!(
        "tar -cf - -C '{}' . | openssl enc -aes-256-ctr -pass pass:x -pbkdf2 > '{}'{sync}",
        dir.display(),
        out.display()
    );
    timed(|| {
        let status = std::process::Command::new("sh")
            .args(["-c", &script])
            .status()
            .unwrap();
        assert!(status.success());
    })
    .1
}

fn home() -> HomeId {
    HomeId {
        home_key: "bench-home".into(),
        storage_id: "bench-storage".into(),
        data_key: [9; 32],
    }
}

async fn s3_store(data_dir: &Path) -> Option<(ObjectHomeStore, Arc<dyn ObjectStore>)> {
    let endpoint = std::env::var("RAKAZO_TEST_S3_ENDPOINT").ok()?;
    // A server that wants signed bucket requests gets its bucket made beforehand.
    let name = match std::env::var("RAKAZO_BENCH_S3_BUCKET") {
        Ok(existing) => existing,
        Err(_) => {
            let name = format!("rakazo-bench-{}", uuid::Uuid::new_v4().simple());
            reqwest::Client::new()
                .put(format!("{endpoint}/{name}"))
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
            name
        }
    };
    let cfg = ObjectStorage {
        bucket: name,
        endpoint: Some(endpoint),
        region: "us-east-1".into(),
        access_key_id: Some(Secret("bench".into())),
        secret_access_key: Some(Secret("bench".into())),
        prefix: None,
    };
    let bucket = bucket::open(&cfg).unwrap();
    Some((
        ObjectHomeStore::new(
            bucket.clone(),
            object_store::path::Path::from("bench"),
            data_dir,
            1,
            Limits::default(),
        ),
        bucket,
    ))
}

/// The S3 floor: `bytes` random-free bytes put through the same client, in the store's part
/// size with four parts in flight, with nothing packed or sealed.
async fn upload_floor(bucket: &Arc<dyn ObjectStore>, bytes: usize) -> Duration {
    let data = Bytes::from(vec![7u8; bytes]);
    let mut times = Vec::new();
    for run in 0..RUNS {
        let start = Instant::now();
        let path = object_store::path::Path::from(format!("floor/{run}"));
        let upload = bucket.put_multipart(&path).await.unwrap();
        let mut writer = WriteMultipart::new_with_chunk_size(upload, object::PART);
        for part in data.chunks(object::PART) {
            writer.wait_for_capacity(4).await.unwrap();
            writer.put(data.slice_ref(part));
        }
        writer.finish().await.unwrap();
        times.push(start.elapsed());
        bucket.delete(&path).await.unwrap();
    }
    times.into_iter().min().unwrap()
}

/// What a leg's checkpoints save.
#[derive(Clone, Copy, PartialEq)]
enum Leg {
    /// The first checkpoint of the workspace (a store that holds nothing of it yet, as for
    /// a new computer): every piece is packed, sealed and written; the machine works in the
    /// copy itself (docker's mounted home).
    First,
    /// A file changed since the last checkpoint, and the machine sends its whole workspace
    /// as one archive (as a remote machine does): the store cuts and names it, stores the
    /// changed chunks and restages its copy.
    Remote,
    /// Nothing changed and the last checkpoint's fingerprint still holds: nothing is stored.
    Unchanged,
    /// A file changed, and the machine works in the copy itself (docker's mounted home, the
    /// default): only the changed piece is packed, checked, sealed and written.
    Mounted,
}

/// The checkpoint path of a host or docker computer (fingerprint, export unless unchanged,
/// save), `RUNS` times; the best wall time. `since` carries the fingerprint between runs.
async fn checkpoint(
    store: &dyn HomeStore,
    dir: &Path,
    rev: &mut i64,
    leg: Leg,
    since: &mut Option<String>,
) -> Result<Duration, String> {
    let mut times = Vec::new();
    for run in 0..RUNS {
        if matches!(leg, Leg::Remote | Leg::Mounted) {
            std::fs::write(dir.join("changed.txt"), rev.to_string()).unwrap();
        }
        let home = if leg == Leg::First {
            *since = None;
            HomeId {
                storage_id: format!("bench-first-{run}"),
                ..home()
            }
        } else {
            home()
        };
        let start = Instant::now();
        let since_here = if leg == Leg::Remote {
            None
        } else {
            since.as_deref()
        };
        match files::export_since(dir, since_here).map_err(|e| e.to_string())? {
            WorkspaceExport::Unchanged => {}
            WorkspaceExport::Archive {
                workspace,
                fingerprint,
                ..
            } => {
                *rev += 1;
                let workspace = match leg {
                    Leg::Remote => workspace.into_archive().expect("every byte").into(),
                    _ => workspace,
                };
                store
                    .save(&home, *rev, workspace, leg == Leg::Remote)
                    .await
                    .map_err(|e| e.to_string())?;
                // A first checkpoint's home is deleted below, and a whole archive is stored
                // by content: no stamps to follow.
                *since = fingerprint.filter(|_| leg == Leg::Mounted || leg == Leg::Unchanged);
            }
        }
        times.push(start.elapsed());
        if leg == Leg::First {
            store
                .delete(&home.home_key, &home.storage_id)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(times.into_iter().min().unwrap())
}

/// Lets the workspace's last change age past the window a fingerprint withholds.
fn quiet() {
    std::thread::sleep(Duration::from_millis(2100));
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn main() {
    let dir = workspace();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let scratch = tempfile::tempdir_in("/tmp").unwrap();
        // Warm the page cache, then phases on their own.
        let base = best(|| baseline(&dir, Path::new("/dev/null")));
        let durable = best(|| baseline(&dir, &scratch.path().join("baseline.enc")));
        let _ = std::fs::remove_file(scratch.path().join("baseline.enc"));
        let (tar, pack) = timed(|| archive::pack(&dir).unwrap());
        let size = tar.len();
        let binding = seal::Binding::revision("bench-storage", 1);
        let (sealed, seal_time) = timed(|| seal::seal(&[9; 32], &binding, &tar));
        let (_, open_time) = timed(|| seal::open(&[9; 32], &binding, &sealed).unwrap());
        drop(sealed);
        let copies = LatestCopies::new(scratch.path().join("phase-homes"), Limits::default());
        let (staged, stage_time) = timed(|| copies.stage("phase", &tar).unwrap());
        let (_, swap_time) = timed(|| copies.swap_in("phase", &staged).unwrap());
        copies.remove("phase").unwrap();
        drop(tar);

        let local = LocalHomeStore::new(&scratch.path().join("local"), 1, Limits::default());
        let (mut rev, mut since) = (0, None);
        let mut run_leg = async |store: &dyn HomeStore, leg: Leg| {
            if leg == Leg::Unchanged {
                quiet();
            }
            checkpoint(store, &dir, &mut rev, leg, &mut since).await
        };
        let local_first = run_leg(&local, Leg::First).await.unwrap();
        quiet();
        // One checkpoint to start from, then the legs that follow a checkpoint.
        run_leg(&local, Leg::Mounted).await.unwrap();
        quiet();
        let local_mounted = run_leg(&local, Leg::Mounted).await.unwrap();
        let local_unchanged = run_leg(&local, Leg::Unchanged).await.unwrap();
        let local_remote = run_leg(&local, Leg::Remote).await.unwrap();
        let s3 = match s3_store(&scratch.path().join("s3")).await {
            Some((store, bucket)) => {
                let floor = upload_floor(&bucket, size).await;
                let first = run_leg(&store, Leg::First).await;
                let _ = run_leg(&store, Leg::Mounted).await;
                quiet();
                let mounted = run_leg(&store, Leg::Mounted).await;
                Some(first.and_then(|f| mounted.map(|m| (floor, f, m))))
            }
            None => None,
        };
        let server = std::env::var("RAKAZO_BENCH_S3_SERVER").unwrap_or("moto".into());

        let gib = size as f64 / f64::from(1 << 30);
        println!("workspace: {WORKSPACE} ({SMALL_FILES} small files + {LARGE_FILES} large, archive {gib:.2} GiB)");
        println!("best of {RUNS} runs each, same process, page cache warm\n");
        println!("| leg | wall time | ratio to baseline |");
        println!("| --- | --- | --- |");
        let row = |name: &str, d: Duration| {
            println!(
                "| {name} | {} | {:.2} |",
                secs(d),
                d.as_secs_f64() / base.as_secs_f64()
            )
        };
        row("baseline: tar -cf - | openssl enc -aes-256-ctr", base);
        row(
            "durable baseline: the same into a file, then fsync (sync FILE)",
            durable,
        );
        row(
            "ours, local store, first checkpoint (every piece packed, sealed, written)",
            local_first,
        );
        row(
            "ours, local store, mounted home (docker, the default), a file changed",
            local_mounted,
        );
        row(
            "ours, local store, a file changed, whole archive received (remote machine), copy restaged",
            local_remote,
        );
        row(
            "ours, nothing changed (fingerprint holds: nothing stored)",
            local_unchanged,
        );
        match s3 {
            Some(Err(e)) => println!("| ours, S3 store | failed: {e} | |"),
            Some(Ok((floor, first, mounted))) => {
                row(
                    &format!("S3 floor ({server} on loopback): the same size put, nothing else"),
                    floor,
                );
                row(&format!("ours, S3 store ({server}), first checkpoint"), first);
                row(
                    &format!("ours, S3 store ({server}), mounted home, a file changed"),
                    mounted,
                );
            }
            None => println!("| ours, S3 store | skipped: RAKAZO_TEST_S3_ENDPOINT unset | |"),
        }
        println!("\nphases (one run each):\n");
        println!("| phase | time | throughput |");
        println!("| --- | --- | --- |");
        for (name, d) in [
            ("pack (tar of the workspace)", pack),
            ("seal (AES-256-GCM, 64 KiB segments)", seal_time),
            ("open (verify + decrypt)", open_time),
            ("stage (safe unpack to disk)", stage_time),
            ("swap in", swap_time),
        ] {
            println!(
                "| {name} | {} | {:.0} MiB/s |",
                secs(d),
                size as f64 / f64::from(1 << 20) / d.as_secs_f64()
            );
        }
    });
}
