//! The e2b-emulator with real Docker computers through an in-process supervisor: E2B's
//! official Python SDK drives it (tests/e2b_sdk/sdk_check.py), the provider conformance suite
//! runs on the real `e2b` adapter pointed at it, and the adapter's lifecycle holds when a
//! sandbox is killed behind its back; the team-screens regression runs on it, the page tools
//! reach a sandbox's browser through its screen gateway, and Novita's differences hold against
//! its Novita mode, its quarantine of a sandbox whose command's kill was not confirmed included.
//! A sandbox's exec agent runs attached (`stdin: true`, `SendInput`) and keeps the capture
//! helper: frames and pointer moves start no command at the vendor.

mod docker_support;
mod gateway_pages;
mod team_screens;

use std::sync::{Arc, OnceLock};

use rakazo::config::DockerNetwork;
use rakazo::emulators::e2b::{DOMAIN, Emulator, Settings};
use rakazo::providers::e2b::{E2b, E2bConfig, Vendor};
use rakazo::providers::remote::RemoteSandboxes as _;
use rakazo::providers::remote::provider::RemoteProvider;
use rakazo_actors::provider::SandboxProvider;

use docker_support::{TestSupervisor, docker_ready};

#[allow(clippy::duplicate_mod)]
#[path = "gate/mod.rs"]
mod gate;
// The checks of an exec agent's scripts and kept helper; those of an image without `python3`
// do not apply here.
#[allow(dead_code)]
#[path = "exec_agent/checks.rs"]
mod exec_agent_checks;
#[path = "exec_agent/listening.rs"]
mod listening;

struct TestEmulator {
    url: String,
    emulator: Arc<Emulator>,
    supervisor: TestSupervisor,
}

fn emulator() -> &'static TestEmulator {
    static SHARED: OnceLock<TestEmulator> = OnceLock::new();
    SHARED.get_or_init(|| {
        let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
        supervisor.remove_containers_at_exit();
        let settings = Settings {
            supervisor_url: supervisor.url.clone(),
            supervisor_token: supervisor.token.clone(),
            domain: DOMAIN.into(),
            novita: false,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let running = rakazo::emulators::e2b::start(listener, settings)
                    .await
                    .unwrap();
                tx.send((format!("http://{}", running.addr), running.emulator.clone()))
                    .unwrap();
                std::future::pending::<()>().await;
            })
        });
        let (url, emulator) = rx.recv().unwrap();
        TestEmulator {
            url,
            emulator,
            supervisor,
        }
    })
}

fn adapter() -> E2b {
    let e = emulator();
    E2b::new(E2bConfig {
        kind: "e2b-emulator",
        vendor: Vendor::E2b,
        api_key: "e2b_test_key".into(),
        domain: DOMAIN.into(),
        api_url: e.url.clone(),
        sandbox_url: Some(e.url.clone()),
        template: "rakazo-computer".into(),
    })
    .unwrap()
}

/// A fresh provider per test, one emulator (and supervisor) for all.
fn provider() -> Arc<dyn SandboxProvider> {
    Arc::new(RemoteProvider::new(Arc::new(adapter()), 0))
}

fn sdk_ready() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import e2b"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        gate::missing(
            "E2B's Python SDK (the e2b package)",
            "scripts/test.sh installs it (pip install 'e2b>=2.6,<3')",
        );
    }
    ok
}

#[test]
fn the_official_sdk_drives_the_emulator() {
    if !docker_ready() || !sdk_ready() {
        return;
    }
    let e = emulator();
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/e2b_sdk/sdk_check.py"
        ))
        .env("E2B_API_URL", &e.url)
        .env("E2B_SANDBOX_URL", &e.url)
        .env("E2B_DOMAIN", DOMAIN)
        .env("E2B_API_KEY", "e2b_any_key")
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "SDK check failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(e.emulator.lock().is_empty() || !stdout.is_empty());
}

/// A `GET /` with the given `Host` over a raw connection; the answer's head.
async fn raw_get(url: &str, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        conn.read_to_end(&mut buf),
    )
    .await;
    String::from_utf8_lossy(&buf).chars().take(300).collect()
}

#[actix_rt::test]
async fn a_request_without_an_api_key_or_with_a_wrong_access_token_is_refused() {
    if !docker_ready() {
        return;
    }
    let e = emulator();
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/v2/sandboxes", e.url))
        .json(&serde_json::json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], 401);
    assert!(body["message"].is_string());
    // A sandbox's envd refuses another token.
    let resp = http
        .post(format!("{}/v2/sandboxes", e.url))
        .header("X-API-KEY", "k")
        .json(&serde_json::json!({"templateID": "base", "timeout": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let sandbox: serde_json::Value = resp.json().await.unwrap();
    let id = sandbox["sandboxID"].as_str().unwrap().to_string();
    for token in ["", "wrong"] {
        let resp = http
            .get(format!("{}/files?path=/etc/hostname", e.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401, "token {token:?}");
    }
    let resp = http
        .get(format!("{}/files?path=/etc/hostname", e.url))
        .header("E2b-Sandbox-Id", &id)
        .header(
            "X-Access-Token",
            sandbox["envdAccessToken"].as_str().unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // A port host of another sandbox id is not routed anywhere.
    let head = raw_get(&e.url, &format!("6080-{}.{DOMAIN}", "a".repeat(20))).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    // The sandbox's own port host reaches its machine, not the emulator's API.
    let head = raw_get(&e.url, &format!("6080-{id}.{DOMAIN}")).await;
    assert!(
        !head.contains("\"code\": 401")
            && !head.starts_with("HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json"),
        "{head}"
    );
    assert!(e.emulator.kill(&id).await);
    let resp = http
        .get(format!("{}/sandboxes/{id}", e.url))
        .header("X-API-KEY", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
}

#[actix_rt::test]
async fn a_sandbox_killed_behind_the_adapters_back_is_gone_and_ttl_expiry_kills() {
    if !docker_ready() {
        return;
    }
    use rakazo::providers::remote::RemoteSandboxes;
    use rakazo_actors::provider::{MachineSpec, ProviderError};
    let e = emulator();
    let p = provider();
    let spec = MachineSpec {
        computer_id: "c-gone".into(),
        space_id: "s1".into(),
        bot_id: None,
        home_key: "h-gone".into(),
    };
    let machine = p.provision(&spec).await.unwrap();
    p.write_file(&machine, "made.txt", b"by the bot")
        .await
        .unwrap();
    assert!(e.emulator.kill(&machine.0).await);
    assert!(matches!(
        p.read_file(&machine, "made.txt").await,
        Err(ProviderError::MachineGone)
    ));
    assert!(matches!(
        p.reconnect(&machine, &spec).await,
        Err(ProviderError::MachineGone)
    ));
    p.destroy(&machine).await.unwrap();

    // A paused sandbox resumes through connect, keeping its files.
    let machine = p.provision(&spec).await.unwrap();
    p.write_file(&machine, "kept.txt", b"kept").await.unwrap();
    p.stop(&machine).await.unwrap();
    let fresh = provider();
    fresh.reconnect(&machine, &spec).await.unwrap();
    assert_eq!(
        fresh.read_file(&machine, "kept.txt").await.unwrap(),
        b"kept"
    );
    fresh.destroy(&machine).await.unwrap();

    // TTL expiry kills.
    let a = adapter();
    let session = a.create(&spec).await.unwrap();
    let id = E2b::id(&session).to_string();
    reqwest::Client::new()
        .post(format!("{}/sandboxes/{id}/timeout", e.url))
        .header("X-API-KEY", "k")
        .json(&serde_json::json!({"timeout": 0}))
        .send()
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..100 {
        if e.emulator.get(&id).is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "the expired sandbox was not killed");
    assert!(matches!(
        a.connect(&id).await,
        Err(ProviderError::MachineGone)
    ));
}

rakazo_actors::conformance_suite!(provider(), gate = docker_ready());

/// The team-screens regression: two bots on one sandbox at once, separate displays and
/// cookies, routes through the emulator's port host that name only a loopback forwarder, and
/// old tokens refused after slot reuse.
#[actix_rt::test]
async fn the_team_screens_regression() {
    if !docker_ready() {
        return;
    }
    team_screens::over_routes(&*provider(), DOMAIN, "http://127.0.0.1:").await;
}

/// An emulator of its own in Novita mode (on the shared supervisor), and a maker of Novita
/// providers pointed at it for a template, each a process of its own.
async fn novita_emulator() -> (
    rakazo::emulators::e2b::Running,
    impl Fn(&str) -> Arc<dyn SandboxProvider>,
) {
    let shared = emulator();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let running = rakazo::emulators::e2b::start(
        listener,
        Settings {
            supervisor_url: shared.supervisor.url.clone(),
            supervisor_token: shared.supervisor.token.clone(),
            domain: DOMAIN.into(),
            novita: true,
        },
    )
    .await
    .unwrap();
    let url = format!("http://{}", running.addr);
    let novita = move |template: &str| -> Arc<dyn SandboxProvider> {
        let adapter = E2b::new(E2bConfig {
            kind: "novita",
            vendor: Vendor::Novita,
            api_key: "sk_novita_test".into(),
            domain: DOMAIN.into(),
            api_url: url.clone(),
            sandbox_url: Some(url.clone()),
            template: template.into(),
        })
        .unwrap();
        Arc::new(RemoteProvider::new(Arc::new(adapter), 0))
    };
    (running, novita)
}

fn novita_spec(name: &str) -> rakazo_actors::provider::MachineSpec {
    rakazo_actors::provider::MachineSpec {
        computer_id: format!("c-{name}"),
        space_id: format!("s-{name}"),
        bot_id: None,
        home_key: format!("h-{name}"),
    }
}

/// A Novita emulator of its own, a Novita provider pointed at it and one sandbox it made.
async fn novita_machine(
    name: &str,
) -> (
    rakazo::emulators::e2b::Running,
    Arc<dyn SandboxProvider>,
    rakazo_actors::provider::MachineSpec,
    rakazo_actors::provider::ProviderRef,
) {
    let (running, novita) = novita_emulator().await;
    let spec = novita_spec(name);
    let p = novita("rakazo-computer");
    let m = p.provision(&spec).await.unwrap();
    (running, p, spec, m)
}

/// Novita's envd keeps no process's input open: its sandbox's exec agent listens behind the
/// screen gateway instead (as on Daytona and Box), keeps the capture helper there, and runs
/// the sandbox's scripts once it runs.
#[actix_rt::test]
async fn a_novita_sandboxs_frames_come_through_an_agent_behind_its_gateway() {
    if !docker_ready() {
        return;
    }
    let (_running, p, _, m) = novita_machine("kept").await;
    p.open_screen(&m, "bot-kept", 0).await.unwrap();
    exec_agent_checks::frames_come_from_one_kept_helper(&*p, &m, "bot-kept").await;
    let parent = exec_agent_checks::run(&*p, &m, listening::PARENT).await;
    assert!(
        parent.1.contains(listening::LISTENING),
        "scripts through the listening agent"
    );
    p.destroy(&m).await.unwrap();
}

/// A command for `secs` at most.
fn command(command: &str, secs: u64) -> rakazo_actors::provider::ExecRequest {
    rakazo_actors::provider::ExecRequest {
        command: command.into(),
        cwd: String::new(),
        env: Vec::new(),
        timeout: std::time::Duration::from_secs(secs),
    }
}

/// Novita shares the adapter: against the emulator's Novita mode, a template the account
/// lacks is a plain error with nothing else tried, ids carry a hyphen, stop pauses (confirmed
/// by the state read back), reconnect resumes with the files kept, and destroy deletes a
/// paused sandbox without resuming it.
#[actix_rt::test]
async fn novita_shares_the_adapter_with_its_differences() {
    if !docker_ready() {
        return;
    }
    use rakazo::emulators::e2b::State;
    use std::sync::atomic::Ordering;
    let (running, novita) = novita_emulator().await;
    let spec = novita_spec("novita");
    let em = running.emulator.clone();

    // No template in the account: a plain error, no sandbox made from another one.
    let err = novita("stock-desktop").provision(&spec).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("Novita has no template `stock-desktop`"),
        "{err}"
    );
    assert!(em.lock().is_empty());

    // Novita's envd is not known to keep a process's input open: no exec agent is attached
    // there (E2B's is).
    let config = |vendor| E2bConfig {
        kind: "novita",
        vendor,
        api_key: "sk_novita_test".into(),
        domain: DOMAIN.into(),
        api_url: "http://127.0.0.1:9".into(),
        sandbox_url: None,
        template: "rakazo-computer".into(),
    };
    assert!(!E2b::new(config(Vendor::Novita)).unwrap().attaches());
    assert!(E2b::new(config(Vendor::E2b)).unwrap().attaches());

    let p = novita("rakazo-computer");
    let m = p.provision(&spec).await.unwrap();
    assert!(m.0.contains('-'), "{}", m.0);
    p.write_file(&m, "kept.txt", b"kept").await.unwrap();
    p.stop(&m).await.unwrap();
    assert_eq!(em.get(&m.0).unwrap().state, State::Paused);
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);

    // Reconnect resumes the same sandbox, files kept.
    let fresh = novita("rakazo-computer");
    fresh.reconnect(&m, &spec).await.unwrap();
    assert_eq!(em.resumes.load(Ordering::SeqCst), 1);
    assert_eq!(fresh.read_file(&m, "kept.txt").await.unwrap(), b"kept");

    // Destroy of a paused sandbox deletes it without resuming it.
    fresh.stop(&m).await.unwrap();
    let other = novita("rakazo-computer");
    other.destroy(&m).await.unwrap();
    assert!(em.get(&m.0).is_none());
    assert_eq!(em.resumes.load(Ordering::SeqCst), 1);
    assert_eq!(
        other.reconnect(&m, &spec).await,
        Err(rakazo_actors::provider::ProviderError::MachineGone)
    );
    running.stop().await;
}

/// A Novita command past its deadline whose kill envd never confirms (its process service
/// unreachable): the kill is asked for again, then the sandbox is paused and quarantined. The
/// call says the command may remain suspended; every later call on the machine, a reconnect
/// included, is refused without resuming it; destroy deletes it, still without a resume.
/// Scripts go through envd while no exec agent runs: before the one the first script started
/// in the background runs, and after the bot killed it.
#[actix_rt::test]
async fn a_novita_command_whose_kill_is_not_confirmed_quarantines_its_sandbox() {
    if !docker_ready() {
        return;
    }
    use rakazo::emulators::e2b::State;
    use rakazo_actors::provider::ProviderError;
    use std::sync::atomic::Ordering;
    let (running, p, spec, m) = novita_machine("quarantine").await;
    let em = running.emulator.clone();
    let exec = |c: &str| command(c, 1);
    // A kill envd confirms: the command times out, the machine stays in use.
    let out = p.exec(&m, &exec("sleep 30")).await.unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(p.exec(&m, &exec("echo up")).await.unwrap().stdout, "up\n");
    assert!(listening::scripts_reach_it(&*p, &m).await);
    let kill = exec(&format!("pkill -KILL -f '{}'", listening::AGENT));
    assert!(p.exec(&m, &kill).await.is_err(), "the script's agent ended");

    em.signals_unavailable.store(true, Ordering::SeqCst);
    let err = p.exec(&m, &exec("sleep 30")).await.unwrap_err();
    let ProviderError::Quarantined(told) = &err else {
        panic!("not quarantined: {err}");
    };
    assert!(told.contains("may remain suspended"), "{told}");
    assert!(told.contains("was paused"), "{told}");
    assert_eq!(em.get(&m.0).unwrap().state, State::Paused);
    em.signals_unavailable.store(false, Ordering::SeqCst);

    // Nothing reaches the machine again through this process, and nothing resumes it.
    for refused in [
        p.exec(&m, &exec("true")).await.map(|_| ()),
        p.read_file(&m, "anything.txt").await.map(|_| ()),
        p.reconnect(&m, &spec).await,
    ] {
        assert!(
            matches!(refused, Err(ProviderError::Quarantined(_))),
            "{refused:?}"
        );
    }
    assert_eq!(em.get(&m.0).unwrap().state, State::Paused);
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);

    // The replacement's teardown deletes it without a resume.
    p.destroy(&m).await.unwrap();
    assert!(em.get(&m.0).is_none());
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);
    running.stop().await;
}

/// A Novita command whose caller stops waiting (its future dropped) and whose kill envd never
/// confirms: the adapter asks again in the background, then pauses and quarantines the sandbox,
/// and tells the provider's owner so when asked ([`SandboxProvider::quarantined`]).
#[actix_rt::test]
async fn a_cancelled_novita_command_whose_kill_is_not_confirmed_quarantines_its_sandbox() {
    if !docker_ready() {
        return;
    }
    use rakazo::emulators::e2b::State;
    use rakazo_actors::provider::ProviderError;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let (running, p, _, m) = novita_machine("cancelled").await;
    let em = running.emulator.clone();
    let long = command("sleep 60", 60);
    em.signals_unavailable.store(true, Ordering::SeqCst);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), p.exec(&m, &long))
            .await
            .is_err(),
        "the command ended on its own"
    );
    assert_eq!(
        p.quarantined(&m),
        None,
        "not before the kills were asked for"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let told = loop {
        if let Some(told) = p.quarantined(&m) {
            break told;
        }
        assert!(tokio::time::Instant::now() < deadline, "never quarantined");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(told.contains("cancelled command"), "{told}");
    assert!(told.contains("may remain suspended"), "{told}");
    assert_eq!(em.get(&m.0).unwrap().state, State::Paused);
    em.signals_unavailable.store(false, Ordering::SeqCst);
    let refused = p.read_file(&m, "anything.txt").await;
    assert!(
        matches!(refused, Err(ProviderError::Quarantined(_))),
        "{refused:?}"
    );
    assert_eq!(em.resumes.load(Ordering::SeqCst), 0);
    p.destroy(&m).await.unwrap();
    assert_eq!(p.quarantined(&m), None);
    running.stop().await;
}

/// The page tools on a remote computer, through the sandbox's screen gateway.
#[actix_rt::test]
async fn page_tools_reach_the_sandbox_browser_through_its_gateway() {
    if !docker_ready() {
        return;
    }
    gateway_pages::through_the_gateway(&*provider(), "e2b").await;
}

/// The attached agent's command line (`--idle-exit`): the emulator's own machine runs the
/// supervisor's agent beside it.
const ATTACHED_AGENT: &str = "^python3 .*rakazo-exec-[a]gent --idle-exit";

/// What the emulator was asked for sandbox `m` so far.
fn envd_calls(m: &rakazo_actors::provider::ProviderRef) -> rakazo::emulators::e2b::EnvdCalls {
    emulator()
        .emulator
        .lock()
        .get(&m.0)
        .map(|s| s.calls)
        .unwrap()
}

/// A sandbox's scripts, the runtime's and the bot's shell commands alike, go through its exec
/// agent attached to this host: a line each (a `SendInput`), no command started at the vendor,
/// with the outcomes of every exec agent. The agent's pipes are closed to the bot; an agent the
/// bot kills or stops is replaced, and the script it had under way is killed by its pid file.
#[actix_rt::test]
async fn a_sandboxs_scripts_go_through_its_attached_agent() {
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&team_screens::team_spec()).await.unwrap();
    exec_agent_checks::agent_pid(&*p, &m, ATTACHED_AGENT).await;
    let before = envd_calls(&m);
    for _ in 0..3 {
        assert_eq!(exec_agent_checks::run(&*p, &m, "true").await.0, 0);
    }
    let after = envd_calls(&m);
    assert_eq!(
        after.starts, before.starts,
        "no command started at the vendor"
    );
    assert_eq!(after.inputs - before.inputs, 3, "a line per script");
    exec_agent_checks::scripts_run_through_one_agent(&*p, &m, ATTACHED_AGENT).await;
    exec_agent_checks::a_lost_agent_is_replaced_and_its_pipes_stay_closed(&*p, &m, ATTACHED_AGENT)
        .await;
    p.destroy(&m).await.unwrap();
}

/// A sandbox's frames come from one capture helper kept by its exec agent, attached to this
/// host through envd (`Start` with `stdin: true`, a `SendInput` per line): ten pointer moves
/// and their settled frame are one line to it and start no command at the vendor, and the
/// pointer lands where the last move put it; a batch with a key is one line too. The agent's
/// pipes are closed to the bot, and an agent the bot kills is replaced.
#[actix_rt::test]
async fn a_sandboxs_frames_and_pointer_moves_go_through_its_attached_agent() {
    use rakazo_actors::provider::Action;
    if !docker_ready() {
        return;
    }
    let p = provider();
    let m = p.provision(&team_screens::team_spec()).await.unwrap();
    p.open_screen(&m, "bot-kept", 0).await.unwrap();
    exec_agent_checks::frames_come_from_one_kept_helper(&*p, &m, "bot-kept").await;

    // The agent killed by the bot: frames still come, and a new agent is attached.
    const AGENT: &str = "pgrep -f '^python3 .*rakazo-exec-[a]gent --idle-exit'";
    let (_, agent, _) = exec_agent_checks::run(&*p, &m, AGENT).await;
    let agent = agent.trim().to_owned();
    assert!(
        !agent.is_empty() && !agent.contains('\n'),
        "one agent: {agent:?}"
    );
    let (_, out, _) = exec_agent_checks::run(
        &*p,
        &m,
        &format!(
            "echo '{{\"id\":1}}' 2>/dev/null > /proc/{agent}/fd/1 && echo WROTE; \
             ls /proc/{agent}/fd >/dev/null 2>&1 && echo FDS; echo checked"
        ),
    )
    .await;
    assert_eq!(out, "checked\n", "the agent's pipes are closed to the bot");
    // The script that kills it runs through it: it fails, the agent gone with it.
    let kill = rakazo_actors::conformance::cmd(&format!("kill -KILL {agent}"));
    assert!(
        p.exec(&m, &kill).await.is_err(),
        "the script's agent ended under it"
    );
    for _ in 0..2 {
        let frame = p.observe(&m, "bot-kept").await.unwrap();
        assert!(frame.png.starts_with(b"\x89PNG"));
    }
    let (_, next, _) = exec_agent_checks::run(&*p, &m, AGENT).await;
    assert!(
        !next.trim().is_empty() && next.trim() != agent,
        "a new agent: {next:?}"
    );

    let calls = || envd_calls(&m);
    p.observe(&m, "bot-kept").await.unwrap();
    // A batch and its settled frame: no command started at the vendor, one line to the agent.
    let one_line = |batch: Vec<Action>| {
        let p = p.clone();
        let m = m.clone();
        async move {
            let before = calls();
            let done = p.act(&m, "bot-kept", &batch).await.unwrap();
            assert_eq!((done.completed, done.stopped), (batch.len(), None));
            assert!(done.frame.png.starts_with(b"\x89PNG"));
            let after = calls();
            assert_eq!(
                after.starts, before.starts,
                "no command started at the vendor"
            );
            assert_eq!(
                after.inputs - before.inputs,
                1,
                "one line for the batch and its frame"
            );
        }
    };
    let ten = (0..10).map(|i| Action::Move {
        x: 200 + 30 * i,
        y: 300,
    });
    one_line(ten.collect()).await;
    let (_, pointer, _) = exec_agent_checks::run(
        &*p,
        &m,
        "export DISPLAY=:$(ls /tmp/.X11-unix | head -1 | tr -d X); xdotool getmouselocation | cut -d' ' -f1,2",
    )
    .await;
    assert_eq!(pointer, "x:470 y:300\n");
    // A batch with a key: played through XTEST by the helper too.
    let key = Action::Key {
        keys: "Escape".into(),
    };
    one_line(vec![Action::Move { x: 50, y: 60 }, key]).await;
    p.destroy(&m).await.unwrap();
}
