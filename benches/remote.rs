//! Remote computers benchmark on the e2b-emulator, whose sandboxes are real containers of the
//! computer image through a supervisor on 127.0.0.1:0: the time from a provision request to
//! the first screenshot of a bot's desktop through the `e2b` adapter and the remote provider
//! (envd commands, the shared desktop runtime over them), beside Docker direct on the same
//! supervisor, rounds alternating; and tool-call overhead on an e2b-emulator computer: `shell`
//! running `true` and `computer_observe` through the JSON-RPC API against the same calls made
//! straight on the provider; and `browser_snapshot` on an e2b-emulator computer (DevTools through
//! the sandbox's screen gateway) beside the same on a Docker computer of the same supervisor
//! (DevTools through a socket this process dials). Needs a Docker engine and the computer
//! image. Results are recorded in `BENCHMARKS.md`.
//!
//! Run: `cargo bench --bench remote` (`BENCH_ONLY=acts`: only ten pointer moves with their
//! settled frame on a live desktop of each provider, the daytona-emulator's and the
//! box-emulator's too; `BENCH_ONLY=exec`: only `shell`'s script through the provider in turns
//! with envd's own `Start` of it, and on Daytona and Box computers with no screen with the
//! vendor's own run call; `BENCH_ONLY=listing`: a large folder's first 1000 entries by name,
//! a read in it and one entry looked up by name, each against its whole listing, on Docker
//! and each vendor's emulator).

mod support;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::app::App;
use rakazo::config::{Config, DockerNetwork};
use rakazo::providers::boat::adapter::Boat;
use rakazo::providers::daytona::adapter::Daytona;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo::providers::remote::provider::RemoteProvider;
use rakazo_actors::provider::{BrowserCommand, ExecRequest, ProviderRef, SandboxProvider};
use serde_json::{Value, json};

/// Provision-to-first-screenshot rounds per provider.
const ROUNDS: usize = 3;
/// Acts timed per provider on a live desktop (`BENCH_ONLY=acts`).
const ACTS: usize = 20;
/// Tool-call rounds (`computer_observe`: a quarter of them).
const CALLS: usize = 40;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(mut v: Vec<Duration>, p: f64) -> f64 {
    v.sort();
    ms(v[((v.len() as f64 - 1.0) * p) as usize])
}

/// Scripts timed per leg (`BENCH_ONLY=exec`).
const SCRIPTS: usize = 100;

/// `BENCH_ONLY=exec`: `shell`'s script on an E2B sandbox through the provider (the sandbox's
/// exec agent, attached through envd) in turns with envd's own `Start` of the same script, what
/// E2B's SDK sends for `commands.run` (the adapter's run call: a login `bash` per script).
async fn scripts_against_start(supervisor_url: &str, supervisor_token: &str) {
    use rakazo::emulators::e2b::{DOMAIN, Settings};
    use rakazo::providers::e2b::{E2b, E2bConfig, Vendor};
    let settings = Settings {
        supervisor_url: supervisor_url.into(),
        supervisor_token: supervisor_token.into(),
        domain: DOMAIN.into(),
        novita: false,
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let running = rakazo::emulators::e2b::start(listener, settings)
        .await
        .unwrap();
    let base = format!("http://{}", running.addr);
    let vendor = Arc::new(
        E2b::new(E2bConfig {
            kind: "e2b-emulator",
            vendor: Vendor::E2b,
            api_key: "e2b_bench_key".into(),
            domain: DOMAIN.into(),
            api_url: base.clone(),
            sandbox_url: Some(base),
            template: "rakazo-computer".into(),
        })
        .unwrap(),
    );
    let p = RemoteProvider::new(vendor.clone(), 0);
    let m = p.provision(&support::machine_spec("exec")).await.unwrap();
    let labels = (
        "the provider's exec (the sandbox's exec agent)",
        "the same script as envd's own `Start`",
    );
    against_the_vendors_run(&p, &m, &*vendor, labels).await;
    p.destroy(&m).await.unwrap();
    running.emulator.kill_all().await;
}

/// `shell`'s script through `p` on `m`, in turns with the same script as `vendor`'s own run
/// call.
async fn against_the_vendors_run<V: rakazo::providers::remote::RemoteSandboxes>(
    p: &RemoteProvider<V>,
    m: &ProviderRef,
    vendor: &V,
    labels: (&str, &str),
) {
    let session = vendor.connect(&m.0).await.unwrap();
    let command = rakazo::providers::remote::RemoteCommand {
        script: "exec bash -lc true".into(),
        cwd: "/".into(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    support::scripts_in_turns(p, m, SCRIPTS, labels, || async {
        let out = vendor.run(&session, &command).await.unwrap();
        assert_eq!(out.exit_code, 0);
    })
    .await;
}

/// The `daytona` adapter on a daytona-emulator and the `box` adapter on a box-emulator, both
/// in this process on the bench's supervisor.
fn daytona_and_box(supervisor_url: &str, supervisor_token: &str) -> (Arc<Daytona>, Arc<Boat>) {
    use rakazo::emulators::machines::Machines;
    use rakazo::emulators::{boat as boat_emu, daytona as daytona_emu};
    use rakazo::providers::boat::adapter::BoatConfig;
    use rakazo::providers::daytona::adapter::DaytonaConfig;
    const KEY: &str = "bench-key";
    let d = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let daytona = format!("http://{}", d.local_addr().unwrap());
    let boat = format!("http://{}", b.local_addr().unwrap());
    let dm = Machines::new(supervisor_url, supervisor_token, "daytona").unwrap();
    let bm = Machines::new(supervisor_url, supervisor_token, "user").unwrap();
    let de = daytona_emu::DaytonaEmulator::new(
        dm,
        daytona_emu::Settings {
            base_url: daytona.clone(),
            key: Some(KEY.into()),
            minute: Duration::from_secs(60),
        },
    );
    let be = boat_emu::BoatEmulator::new(
        bm,
        boat_emu::Settings {
            base_url: boat.clone(),
            key: Some(KEY.into()),
            snapshot_retention: Duration::from_secs(3600),
        },
    );
    actix_rt::spawn(daytona_emu::serve(d, de).unwrap());
    actix_rt::spawn(boat_emu::serve(b, be).unwrap());
    let daytona = Daytona::new(DaytonaConfig {
        kind: "daytona-emulator",
        api_url: format!("{daytona}/api"),
        api_key: KEY.into(),
        target: "us".into(),
        snapshot: String::new(),
        idle: Duration::from_secs(600),
    })
    .unwrap();
    let boat = Boat::new(BoatConfig {
        kind: "box-emulator",
        api_url: format!("{boat}/api/v1"),
        api_key: KEY.into(),
    })
    .unwrap();
    (Arc::new(daytona), Arc::new(boat))
}

/// `BENCH_ONLY=exec` on a computer of a vendor that keeps no input open (Daytona, Box) with
/// no screen: `shell`'s script through the provider, once the bot's first one started the
/// agent behind the gateway in the background, in turns with the same script as the vendor's
/// own run call (the toolbox's `process/execute`, Box's exec).
async fn scripts_only_against_the_vendors_run<V: rakazo::providers::remote::RemoteSandboxes>(
    vendor: Arc<V>,
    name: &str,
) {
    let p = RemoteProvider::new(vendor.clone(), 0);
    let m = p
        .provision(&support::machine_spec(&format!("exec-{name}")))
        .await
        .unwrap();
    let parent = ExecRequest {
        command: "tr '\\0' ' ' < /proc/$PPID/cmdline".into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(30),
    };
    let until = Instant::now() + Duration::from_secs(60);
    while !p
        .exec(&m, &parent)
        .await
        .unwrap()
        .stdout
        .contains("--listen")
    {
        assert!(
            Instant::now() < until,
            "no agent behind the gateway on {name}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let labels = (
        format!("{name}: the provider's exec, no screen (the agent behind the gateway)"),
        format!("{name}: the same script as the vendor's own run call"),
    );
    against_the_vendors_run(&p, &m, &*vendor, (&labels.0, &labels.1)).await;
    p.destroy(&m).await.unwrap();
}

/// Entries of the folder listed by `BENCH_ONLY=listing`.
const LISTED: usize = 50_000;
/// Listings timed per leg (`BENCH_ONLY=listing`).
const LISTINGS: usize = 10;

/// `BENCH_ONLY=listing`: what `list_files` asks of a provider for a folder of [`LISTED`]
/// entries with 90-byte names, its first 1000 by name (`list_files_first`), in turns with the
/// whole listing the tool read before and kept the first 1000 of.
async fn first_entries_against_the_whole_listing(p: &dyn SandboxProvider, name: &str) {
    use rakazo_actors::provider::{ListingPage, ListingRange};
    let m = p
        .provision(&support::machine_spec(&format!("listing-{name}")))
        .await
        .unwrap();
    let make = format!(
        "python3 -c \"import os; os.makedirs('big'); [open('big/entry-%084d' % i, 'w').close() for i in range({LISTED})]\""
    );
    let made = p
        .exec(
            &m,
            &ExecRequest {
                command: make,
                cwd: String::new(),
                env: Vec::new(),
                timeout: Duration::from_secs(120),
            },
        )
        .await
        .unwrap();
    assert_eq!(made.exit_code, 0, "{}", made.stderr);
    let (mut first, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..LISTINGS {
        let t = Instant::now();
        let page = p
            .list_files_first(&m, "big", &ListingRange::first(1000))
            .await
            .unwrap();
        first.push(t.elapsed());
        assert_eq!((page.entries.len(), page.total), (1000, LISTED));
        let t = Instant::now();
        let page = ListingPage::of(
            p.list_files(&m, "big").await.unwrap(),
            &ListingRange::first(1000),
        );
        whole.push(t.elapsed());
        assert_eq!((page.entries.len(), page.total), (1000, LISTED));
    }
    // `read_file` of one of them: the read alone, against the folder's listing (for the
    // file's size) and the read, as the tool did before.
    let file = format!("big/entry-{:084}", LISTED / 2);
    let (mut read, mut listed_then_read) = (Vec::new(), Vec::new());
    for _ in 0..LISTINGS {
        let t = Instant::now();
        p.read_file_within(&m, &file, 8 << 20).await.unwrap();
        read.push(t.elapsed());
        let t = Instant::now();
        p.list_files(&m, "big").await.unwrap();
        p.read_file(&m, &file).await.unwrap();
        listed_then_read.push(t.elapsed());
    }
    // `browser_act`'s upload check of one of them: its own entry (a page of one from its
    // name), against the whole listing searched for it, as the check did before.
    let entry = &file["big/".len()..];
    let (mut own, mut searched) = (Vec::new(), Vec::new());
    for _ in 0..LISTINGS {
        let t = Instant::now();
        let page = p
            .list_files_first(&m, "big", &ListingRange::from(entry, 1))
            .await
            .unwrap();
        own.push(t.elapsed());
        assert_eq!(page.entries[0].path, file);
        let t = Instant::now();
        let listed = p.list_files(&m, "big").await.unwrap();
        assert!(listed.iter().any(|e| e.path == file));
        searched.push(t.elapsed());
    }
    let (f50, w50) = (percentile(first, 0.5), percentile(whole, 0.5));
    let (r50, l50) = (percentile(read, 0.5), percentile(listed_then_read, 0.5));
    let (o50, s50) = (percentile(own, 0.5), percentile(searched, 0.5));
    println!(
        "| {name} | {f50:.1} ms | {w50:.1} ms | {:.2}x | {r50:.1} ms | {l50:.1} ms | {:.2}x | {o50:.1} ms | {s50:.1} ms | {:.2}x |",
        f50 / w50.max(1e-9),
        r50 / l50.max(1e-9),
        o50 / s50.max(1e-9)
    );
    p.destroy(&m).await.unwrap();
}

/// Provision → open desktop → first screenshot; the three stretches.
async fn first_screenshot(p: &dyn SandboxProvider) -> [Duration; 3] {
    let s = support::machine_spec("first");
    let bot = s.bot_id.clone().unwrap();
    let t0 = Instant::now();
    let m = p.provision(&s).await.expect("provision");
    let t1 = Instant::now();
    p.open_screen(&m, &bot, 0).await.expect("open screen");
    let t2 = Instant::now();
    let frame = p.observe(&m, &bot).await.expect("observe");
    let t3 = Instant::now();
    assert!(frame.png.starts_with(b"\x89PNG"));
    p.destroy(&m).await.unwrap();
    [t1 - t0, t2 - t1, t3 - t2]
}

fn report(label: &str, raw: Vec<Duration>, rpc: Vec<Duration>) {
    let (r50, r95, a50, a95) = (
        percentile(raw.clone(), 0.5),
        percentile(raw, 0.95),
        percentile(rpc.clone(), 0.5),
        percentile(rpc, 0.95),
    );
    println!(
        "| {label} | {r50:.2} / {r95:.2} ms | {a50:.2} / {a95:.2} ms | +{:.2} ms | {:.2} |",
        a50 - r50,
        a50 / r50.max(1e-9)
    );
}

fn main() {
    let image = support::require_image("remote");
    let sup_dir = tempfile::tempdir().unwrap();
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let url = support::start_supervisor(
        sup_dir.path().canonicalize().unwrap(),
        token.clone(),
        DockerNetwork::Bridge,
    );
    actix_rt::System::new().block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let env: std::collections::HashMap<String, String> = [
            ("DATA_DIR", dir.path().display().to_string()),
            ("SANDBOX_PROVIDER", "e2b-emulator".into()),
            ("SANDBOX_SUPERVISOR_URL", url.clone()),
            ("SANDBOX_SUPERVISOR_TOKEN", token.clone()),
            ("RAKAZO_ENV", "test".into()),
            ("RAKAZO_LOG", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let (app, op_token) = App::start(Config::load(&env, None).unwrap()).await.unwrap();
        let op_token = op_token.unwrap();
        let remote: Arc<dyn SandboxProvider> = app.runtime().provider().unwrap();
        let docker: Arc<dyn SandboxProvider> = Arc::new(
            DockerProvider::new(DockerProviderConfig {
                supervisor_url: url.clone(),
                supervisor_token: token.clone(),
                screen_limit: 0,
                commands_only: false,
                warm_stacks: 0,
                limits: None,
            })
            .unwrap(),
        );
        println!("remote bench ({image}, Xvfb 1280x800x24 + fluxbox + Chromium per desktop)\n");
        if std::env::var("BENCH_ONLY").as_deref() == Ok("exec") {
            scripts_against_start(&url, &token).await;
            let (daytona, boat) = daytona_and_box(&url, &token);
            scripts_only_against_the_vendors_run(daytona, "daytona").await;
            scripts_only_against_the_vendors_run(boat, "box").await;
            return;
        }
        if std::env::var("BENCH_ONLY").as_deref() == Ok("listing") {
            println!(
                "| provider | first 1000 of {LISTED}, p50 | whole listing, first 1000 kept, p50 | ratio | read_file in it, p50 | listing + read, p50 | ratio | upload's check: own entry, p50 | whole listing searched, p50 | ratio |"
            );
            println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            first_entries_against_the_whole_listing(docker.as_ref(), "docker").await;
            first_entries_against_the_whole_listing(remote.as_ref(), "e2b-emulator").await;
            let (daytona, boat) = daytona_and_box(&url, &token);
            let daytona = RemoteProvider::new(daytona, 0);
            first_entries_against_the_whole_listing(&daytona, "daytona-emulator").await;
            first_entries_against_the_whole_listing(&RemoteProvider::new(boat, 0), "box-emulator")
                .await;
            return;
        }
        // `BENCH_ONLY=acts`: only ten pointer moves with their settled frame on a live desktop.
        if std::env::var("BENCH_ONLY").as_deref() == Ok("acts") {
            support::acts(docker.as_ref(), "docker direct", ACTS).await;
            support::acts(remote.as_ref(), "e2b-emulator", ACTS).await;
            let (daytona, boat) = daytona_and_box(&url, &token);
            let daytona = RemoteProvider::new(daytona, 0);
            support::acts(&daytona, "daytona-emulator", ACTS).await;
            support::acts(&RemoteProvider::new(boat, 0), "box-emulator", ACTS).await;
            return;
        }

        // Provision to first screenshot, rounds alternating between the two providers.
        println!("| provider | round | provision ms | open desktop ms | first observe ms | total ms |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        let mut totals: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
        for round in 1..=ROUNDS {
            for (i, (name, p)) in [("docker direct", &docker), ("e2b-emulator", &remote)]
                .into_iter()
                .enumerate()
            {
                let [a, b, c] = first_screenshot(p.as_ref()).await;
                totals[i].push(a + b + c);
                println!(
                    "| {name} | {round} | {:.0} | {:.0} | {:.1} | **{:.0}** |",
                    ms(a),
                    ms(b),
                    ms(c),
                    ms(a + b + c)
                );
            }
        }
        let median = |v: &Vec<Duration>| {
            let mut v = v.clone();
            v.sort();
            v[v.len() / 2]
        };
        let (d, r) = (median(&totals[0]), median(&totals[1]));
        println!(
            "\nprovision → first screenshot: docker direct median {:.0} ms, e2b-emulator median {:.0} ms, ratio {:.2}\n",
            ms(d),
            ms(r),
            ms(r) / ms(d)
        );

        // Tool-call overhead on an e2b-emulator computer.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        actix_rt::spawn(rakazo::server::build(app.clone(), listener, 1).unwrap());
        let http = reqwest::Client::new();
        let t = &op_token;
        let space = support::rpc(&http, &base, t, "space.create", json!({ "name": "bench" })).await;
        let bot = support::rpc(&http, &base, t, "bot.create", json!({ "spaceId": space["id"], "name": "b", "computerMode": "private" })).await;
        let started = support::rpc(&http, &base, t, "run.start", json!({ "botId": bot["id"] })).await;
        let (run, fence) = (started["run"]["id"].clone(), started["lease"]["fence"].clone());
        let call = |name: &str, arguments: Value| json!({ "runId": run, "fence": fence, "name": name, "arguments": arguments });
        // The run's lease is renewed between timed calls (a slow round must not outlive it).
        let renew = json!({ "runId": run, "fence": fence });
        // Warm up: the machine, the screen and the browser exist before timing.
        support::rpc(&http, &base, t, "tools/call", call("computer_observe", json!({}))).await;
        // Raw: the same provider, a separate sandbox with its own screen.
        let raw_spec = support::machine_spec("raw");
        let machine = remote.provision(&raw_spec).await.unwrap();
        remote.open_screen(&machine, "raw-bot", 0).await.unwrap();
        let req = ExecRequest { command: "true".into(), cwd: String::new(), env: Vec::new(), timeout: Duration::from_secs(30) };
        println!("| call | raw p50 / p95 | through RPC p50 / p95 | added p50 | ratio |");
        println!("| --- | --- | --- | --- | --- |");
        let (mut raw, mut api) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            support::rpc(&http, &base, t, "run.renew", renew.clone()).await;
            let s = Instant::now();
            remote.exec(&machine, &req).await.unwrap();
            raw.push(s.elapsed());
            let s = Instant::now();
            support::rpc(&http, &base, t, "tools/call", call("shell", json!({ "command": "true" }))).await;
            api.push(s.elapsed());
        }
        report("`shell` running `true`", raw, api);
        let (mut raw, mut api) = (Vec::new(), Vec::new());
        for _ in 0..CALLS / 4 {
            support::rpc(&http, &base, t, "run.renew", renew.clone()).await;
            let s = Instant::now();
            remote.observe(&machine, "raw-bot").await.unwrap();
            raw.push(s.elapsed());
            let s = Instant::now();
            support::rpc(&http, &base, t, "tools/call", call("computer_observe", json!({}))).await;
            api.push(s.elapsed());
        }
        report("`computer_observe`", raw, api);

        // Page commands: through the sandbox's gateway against a socket dialed directly.
        let direct = docker.provision(&support::machine_spec("page")).await.unwrap();
        docker.open_screen(&direct, "raw-bot", 0).await.unwrap();
        let snapshot = BrowserCommand::Snapshot;
        docker.browser(&direct, "raw-bot", &snapshot).await.unwrap();
        remote.browser(&machine, "raw-bot", &snapshot).await.unwrap();
        let (mut socket, mut gateway) = (Vec::new(), Vec::new());
        for _ in 0..CALLS {
            let s = Instant::now();
            docker.browser(&direct, "raw-bot", &snapshot).await.unwrap();
            socket.push(s.elapsed());
            let s = Instant::now();
            remote.browser(&machine, "raw-bot", &snapshot).await.unwrap();
            gateway.push(s.elapsed());
        }
        println!("\n| call | Docker, DevTools socket dialed p50 / p95 | e2b-emulator, DevTools through the gateway p50 / p95 | added p50 | ratio |");
        println!("| --- | --- | --- | --- | --- |");
        report("`browser_snapshot` on the provider", socket, gateway);
        docker.destroy(&direct).await.unwrap();
        remote.destroy(&machine).await.unwrap();
        if let Some(emulator) = &app.e2b_emulator {
            emulator.kill_all().await;
        }
    });
}
