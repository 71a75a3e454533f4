//! Core benchmarks, each against a baseline run side by side:
//! - lease acquire + release round trips through the `LeaseActor` vs the bare SQL of one
//!   insert + one update, on SQLite and (with `RAKAZO_TEST_POSTGRES_URL`) on Postgres;
//! - starting 10,000 supervised computer actors (with their lease actors) vs 10,000 empty
//!   actix actors: time and resident memory.
//!
//! Run: `scripts/bench.sh core` (or `cargo bench --bench core`).

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use rakazo::stores::archive::Limits;
use rakazo::stores::local::LocalHomeStore;
use rakazo_actors::clock::{new_id, now_ms};
use rakazo_actors::entity::bot;
use rakazo_actors::events::EventBus;
use rakazo_actors::lease_actor::{Acquire, Release};
use rakazo_actors::leases::LeaseKey;
use rakazo_actors::registry::Registry;
use rakazo_actors::runtime::{Runtime, Settings};
use rakazo_actors::screen::NoRevoker;
use sea_orm::{ConnectionTrait, DatabaseConnection};

const LEASE_ROUNDS: usize = 1_000;
const ACTORS: usize = 10_000;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn runtime(db: DatabaseConnection, dir: &std::path::Path) -> Arc<Runtime> {
    Arc::new(Runtime {
        db,
        provider: None,
        homes: Arc::new(LocalHomeStore::new(dir, 3, Limits::default())),
        events: EventBus::new(),
        settings: Settings::default(),
        master_key: rakazo_actors::keys::random_key(),
        forward: None,
        clock: rakazo_actors::clock::Clock::system(),
    })
}

async fn lease_bench(label: &str, url: &str, dir: &std::path::Path) {
    let db = rakazo::db::connect(url).await.expect("connect");
    rakazo::db::migrate(&db).await.expect("migrate");
    let rt = runtime(db.clone(), dir);
    let owner = bot::Model {
        id: new_id(),
        space_id: new_id(),
        name: "bench".into(),
        computer_mode: "team".into(),
        created_at_ms: now_ms(),
    };
    let computer = rakazo_actors::computers::Computers::new(db.clone())
        .for_bot(&owner, "owner")
        .await
        .unwrap();
    let arbiter = Arbiter::new();
    let registry = Registry::new(rt, arbiter.handle(), Arc::new(NoRevoker));
    let handle = registry.computer(&computer.id, &computer.space_id);

    // Baseline: the bare SQL a lease needs at the least (one insert, one update).
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS bench_baseline (id TEXT PRIMARY KEY, released BIGINT)",
    )
    .await
    .unwrap();
    let key = LeaseKey::execution(&computer.id, &owner.id);
    let leases = rakazo_actors::leases::Leases::new(db.clone());
    // The legs take turns in chunks, so a busy neighbour slows them alike.
    let chunks = 5;
    let per = LEASE_ROUNDS / chunks;
    let zero = std::time::Duration::ZERO;
    let (mut t_base, mut t_ours, mut t_direct, mut t_general) = (zero, zero, zero, zero);
    for chunk in 0..chunks {
        let started = Instant::now();
        for i in 0..per {
            let id = format!("{label}-{chunk}-{i}-{}", new_id());
            db.execute_unprepared(&format!(
                "INSERT INTO bench_baseline (id, released) VALUES ('{id}', NULL)"
            ))
            .await
            .unwrap();
            db.execute_unprepared(&format!(
                "UPDATE bench_baseline SET released = 1 WHERE id = '{id}'"
            ))
            .await
            .unwrap();
        }
        t_base += started.elapsed();

        let started = Instant::now();
        for _ in 0..per {
            let grant = handle
                .leases
                .send(Acquire {
                    key: key.clone(),
                    holder: "bench".into(),
                    ttl_ms: 60_000,
                })
                .await
                .unwrap()
                .unwrap();
            handle
                .leases
                .send(Release {
                    key: key.clone(),
                    fence: grant.fence,
                    holder: None,
                })
                .await
                .unwrap()
                .unwrap();
        }
        t_ours += started.elapsed();

        // The same rules without the actor's mailbox hop.
        let started = Instant::now();
        for _ in 0..per {
            let grant = leases.acquire(&key, "bench", 60_000).await.unwrap();
            leases.release(&key, grant.fence).await.unwrap();
        }
        t_direct += started.elapsed();

        // The general path every grant took before the one-statement grant (no actor hop).
        let started = Instant::now();
        for _ in 0..per {
            let grant = leases.acquire_locked(&key, "bench", 60_000).await.unwrap();
            leases.release(&key, grant.fence).await.unwrap();
        }
        t_general += started.elapsed();
    }
    let rate = |t: std::time::Duration| (per * chunks) as f64 / t.as_secs_f64();
    let (baseline, ours, direct, general) =
        (rate(t_base), rate(t_ours), rate(t_direct), rate(t_general));
    println!(
        "leases/{label}: {ours:.0} acquire+release round trips/s through the LeaseActor (baseline insert+update: {baseline:.0}/s, ratio {:.2}); without the actor: {direct:.0}/s, ratio {:.2}; general transaction path, without the actor: {general:.0}/s, ratio {:.2}",
        ours / baseline,
        direct / baseline,
        general / baseline
    );
    arbiter.stop();
}

async fn actor_bench(dir: &std::path::Path) {
    let db = rakazo::db::connect("sqlite::memory:").await.unwrap();
    let rt = runtime(db, dir);

    struct Empty;
    impl Actor for Empty {
        type Context = Context<Self>;
    }
    let before = rss_kib();
    let started = Instant::now();
    let empties: Vec<Addr<Empty>> = (0..ACTORS).map(|_| Empty.start()).collect();
    tokio::task::yield_now().await;
    let base_time = started.elapsed();
    let base_mem = rss_kib().saturating_sub(before);

    let arbiter = Arbiter::new();
    let registry = Registry::new(rt, arbiter.handle(), Arc::new(NoRevoker));
    let before = rss_kib();
    let started = Instant::now();
    for i in 0..ACTORS {
        registry.computer(&format!("computer-{i}"), "space");
    }
    // Wait until the arbiter has started every actor: a round trip through the last one.
    let last = registry.computer(&format!("computer-{}", ACTORS - 1), "space");
    last.computer
        .send(rakazo_actors::computer::CurrentMachine)
        .await
        .unwrap();
    let ours_time = started.elapsed();
    let ours_mem = rss_kib().saturating_sub(before);
    println!(
        "actors: {ACTORS} computers (computer + lease actor each) started in {:.1} ms, {:.1} MiB \
         ({:.2} KiB each); baseline {ACTORS} empty actors: {:.1} ms, {:.1} MiB; time ratio {:.1}, memory ratio {:.1}",
        ours_time.as_secs_f64() * 1e3,
        ours_mem as f64 / 1024.0,
        ours_mem as f64 / ACTORS as f64,
        base_time.as_secs_f64() * 1e3,
        base_mem as f64 / 1024.0,
        ours_time.as_secs_f64() / base_time.as_secs_f64().max(1e-9),
        ours_mem as f64 / (base_mem.max(1)) as f64,
    );
    drop(empties);
    arbiter.stop();
}

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| {
        only.as_deref()
            .is_none_or(|o| name.contains(o) || o.contains(name))
    };
    let dir = tempfile::tempdir().unwrap();
    System::new().block_on(async {
        if wants("leases") {
            let sqlite = format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("bench.db").display()
            );
            lease_bench("sqlite", &sqlite, dir.path()).await;
            match std::env::var("RAKAZO_TEST_POSTGRES_URL") {
                Ok(admin) => {
                    let conn = sea_orm::Database::connect(&admin).await.unwrap();
                    let name = format!("rakazo_bench_{}", uuid::Uuid::new_v4().simple());
                    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                        .await
                        .unwrap();
                    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
                    lease_bench("postgres", &format!("{base}/{name}"), dir.path()).await;
                }
                Err(_) => println!("leases/postgres: skipped (set RAKAZO_TEST_POSTGRES_URL)"),
            }
        }
        if wants("actors") {
            actor_bench(dir.path()).await;
        }
    });
}
