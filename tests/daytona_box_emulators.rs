//! The `daytona` and `box` adapters against their emulators, whose sandboxes are real Docker
//! computers through an in-process supervisor: the provider conformance suite on each and the
//! team-screens regression on Daytona, the page tools on each (Box with one desktop per
//! machine: a second bot gets
//! `MultiScreenUnavailable` while shell and files keep working, and the first bot's screen is
//! live through the protected host URL), a machine destroyed behind the API's back is gone,
//! the box-emulator's wire rules (idempotent create, `noEnv`, delete confirmation, file roots,
//! error envelope, host URLs that refuse a missing or foreign token), and the plain setup
//! errors of a missing key; on each, frames and pointer input come from one capture helper kept
//! by an exec agent reached through the screen gateway.

mod box_support;
mod docker_support;
// The kept helper's checks; the scripts' checks run on E2B's attached agent.
#[allow(dead_code)]
#[path = "exec_agent/checks.rs"]
mod exec_agent_checks;
mod gateway_pages;
#[path = "exec_agent/listening.rs"]
mod listening;
mod team_screens;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rakazo::config::DockerNetwork;
use rakazo::emulators::machines::Machines;
use rakazo::emulators::{boat as boat_emu, daytona as daytona_emu};
use rakazo::providers::boat::adapter::{Boat, BoatConfig};
use rakazo::providers::daytona::adapter::{Daytona, DaytonaConfig};
use rakazo::providers::remote::provider::RemoteProvider;
use rakazo_actors::provider::{MachineSpec, ProviderError, SandboxProvider};

use docker_support::{TestSupervisor, docker_ready};

const KEY: &str = "emulator-test-key";

struct Emulators {
    daytona: String,
    boat: String,
    _supervisor: TestSupervisor,
}

fn emulators() -> &'static Emulators {
    static SHARED: OnceLock<Emulators> = OnceLock::new();
    SHARED.get_or_init(|| {
        let supervisor = TestSupervisor::start(DockerNetwork::Bridge);
        supervisor.remove_containers_at_exit();
        let d = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let daytona = format!("http://{}", d.local_addr().unwrap());
        let boat = format!("http://{}", b.local_addr().unwrap());
        let dm = Machines::new(&supervisor.url, &supervisor.token, "daytona").unwrap();
        let bm = Machines::new(&supervisor.url, &supervisor.token, "user").unwrap();
        let (du, bu) = (daytona.clone(), boat.clone());
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let de = daytona_emu::DaytonaEmulator::new(
                    dm,
                    daytona_emu::Settings {
                        base_url: du,
                        key: Some(KEY.into()),
                        minute: Duration::from_secs(60),
                    },
                );
                let be = boat_emu::BoatEmulator::new(
                    bm,
                    boat_emu::Settings {
                        base_url: bu,
                        key: Some(KEY.into()),
                        snapshot_retention: Duration::from_secs(3600),
                    },
                );
                actix_rt::spawn(daytona_emu::serve(d, de).unwrap());
                boat_emu::serve(b, be).unwrap().await.unwrap();
            })
        });
        Emulators {
            daytona,
            boat,
            _supervisor: supervisor,
        }
    })
}

fn daytona_adapter() -> Daytona {
    Daytona::new(DaytonaConfig {
        kind: "daytona-emulator",
        api_url: format!("{}/api", emulators().daytona),
        api_key: KEY.into(),
        target: "us".into(),
        snapshot: String::new(),
        idle: Duration::from_secs(600),
    })
    .unwrap()
}

fn boat_adapter() -> Boat {
    Boat::new(BoatConfig {
        kind: "box-emulator",
        api_url: format!("{}/api/v1", emulators().boat),
        api_key: KEY.into(),
    })
    .unwrap()
}

fn spec(name: &str) -> MachineSpec {
    MachineSpec {
        computer_id: format!("c-{name}"),
        space_id: "s-1".into(),
        bot_id: None,
        home_key: format!("team-{name}"),
    }
}

/// `bot`'s frames and pointer input on a machine of a vendor that keeps no process's input
/// open come from one capture helper kept by an exec agent listening on a socket of the
/// screen gateway's directory, reached through the gateway with every line sealed: no process
/// starts for ten moves and their frame. The bot's first shell command (through the vendor's
/// run call) starts that agent in the background, and scripts go through it once it runs,
/// before any screen; the first screen's helper is kept by the same agent. An agent the bot
/// kills is replaced, frames coming meanwhile through scripts.
async fn frames_come_through_an_agent_behind_the_gateway(p: &dyn SandboxProvider, bot: &str) {
    let m = p.provision(&team_screens::team_spec()).await.unwrap();
    let parent = exec_agent_checks::run(p, &m, listening::PARENT).await.1;
    assert!(!parent.contains(listening::LISTENING), "no agent yet");
    assert!(
        listening::scripts_reach_it(p, &m).await,
        "scripts through the agent started by the first"
    );
    let (code, _, _) = exec_agent_checks::run(p, &m, "pgrep -x Xvfb").await;
    assert_ne!(code, 0, "no display started for scripts");
    let (_, first, _) =
        exec_agent_checks::run(p, &m, &format!("pgrep -f '{}'", listening::AGENT)).await;
    p.open_screen(&m, bot, 0).await.unwrap();
    exec_agent_checks::frames_come_from_one_kept_helper(p, &m, bot).await;
    exec_agent_checks::pointer_input_goes_through_xtest(p, &m, bot).await;
    let parent = exec_agent_checks::run(p, &m, listening::PARENT).await.1;
    assert!(
        parent.contains("--listen"),
        "scripts through the agent: {parent:?}"
    );
    let (code, agent, _) =
        exec_agent_checks::run(p, &m, &format!("pgrep -f '{}'", listening::AGENT)).await;
    let agent = agent.trim().to_owned();
    assert!(code == 0 && !agent.contains('\n'), "one agent: {agent:?}");
    assert_eq!(
        agent,
        first.trim(),
        "the screen's helper kept by the same agent"
    );
    // The script that kills it runs through it: it fails, the agent gone with it.
    let kill = rakazo_actors::conformance::cmd(&format!("kill -KILL {agent}"));
    assert!(
        p.exec(&m, &kill).await.is_err(),
        "the script's agent ended under it"
    );
    for _ in 0..2 {
        assert!(
            p.observe(&m, bot)
                .await
                .unwrap()
                .png
                .starts_with(b"\x89PNG")
        );
    }
    let (_, next, _) =
        exec_agent_checks::run(p, &m, &format!("pgrep -f '{}'", listening::AGENT)).await;
    assert!(
        !next.trim().is_empty() && next.trim() != agent,
        "a new agent: {next:?}"
    );
    p.destroy(&m).await.unwrap();
}

/// A workspace replaced while the agent behind the gateway runs: the runtime's stop of the
/// gateway goes around that agent (through it, the script that stops websockify would cut its
/// own answer's way), the old agent exits with its connection, and scripts reach a new one.
async fn a_workspace_is_replaced_under_a_listening_agent(p: &dyn SandboxProvider) {
    let m = p.provision(&spec("replaced")).await.unwrap();
    assert!(listening::scripts_reach_it(p, &m).await, "the first agent");
    let find = format!("pgrep -f '{}'", listening::AGENT);
    let first = exec_agent_checks::run(p, &m, &find).await.1;
    p.write_file(&m, "notes/a.txt", b"kept").await.unwrap();
    let archive = p.export_workspace(&m).await.unwrap();
    p.import_workspace(&m, &archive).await.unwrap();
    assert_eq!(p.read_file(&m, "notes/a.txt").await.unwrap(), b"kept");
    assert!(listening::scripts_reach_it(p, &m).await, "a new agent");
    let next = exec_agent_checks::run(p, &m, &find).await.1;
    assert!(
        !next.trim().is_empty() && !next.contains(first.trim()),
        "the old agent {first:?} gone, a new one {next:?}"
    );
    p.destroy(&m).await.unwrap();
}

mod daytona {
    use super::*;

    fn provider() -> Arc<dyn SandboxProvider> {
        Arc::new(RemoteProvider::new(Arc::new(daytona_adapter()), 0))
    }

    rakazo_actors::conformance_suite!(provider(), gate = docker_ready());

    /// Two bots on one sandbox at once: separate displays and cookies, routes through the
    /// sandbox's preview port that name only a loopback forwarder, old tokens refused after
    /// slot reuse.
    #[actix_rt::test]
    async fn the_team_screens_regression() {
        if !docker_ready() {
            return;
        }
        team_screens::over_routes(&*provider(), "daytona", "http://127.0.0.1:").await;
    }

    /// The page tools, through the sandbox's preview port.
    #[actix_rt::test]
    async fn page_tools_reach_the_sandbox_browser_through_its_gateway() {
        if !docker_ready() {
            return;
        }
        gateway_pages::through_the_gateway(&*provider(), "daytona").await;
    }

    #[actix_rt::test]
    async fn frames_and_pointer_input_go_through_an_agent_behind_the_gateway() {
        if !docker_ready() {
            return;
        }
        frames_come_through_an_agent_behind_the_gateway(&*provider(), "bot-kept").await;
    }

    #[actix_rt::test]
    async fn a_workspace_is_replaced_under_its_listening_agent() {
        if !docker_ready() {
            return;
        }
        a_workspace_is_replaced_under_a_listening_agent(&*provider()).await;
    }
}

mod boat {
    use super::*;
    use rakazo_actors::provider::ScreenPolicy;

    fn provider() -> Arc<dyn SandboxProvider> {
        Arc::new(RemoteProvider::new(Arc::new(boat_adapter()), 0))
    }

    rakazo_actors::conformance_suite!(provider(), gate = docker_ready());

    /// The page tools, through the protected host URL.
    #[actix_rt::test]
    async fn page_tools_reach_the_sandbox_browser_through_its_gateway() {
        if !docker_ready() {
            return;
        }
        gateway_pages::through_the_gateway(&*provider(), "box").await;
    }

    #[actix_rt::test]
    async fn frames_and_pointer_input_go_through_an_agent_behind_the_gateway() {
        if !docker_ready() {
            return;
        }
        frames_come_through_an_agent_behind_the_gateway(&*provider(), "bot-kept").await;
    }

    /// Box's one desktop is live: the first bot's view and control routes give an RFB
    /// greeting through the sandbox's protected host URL, reached by a loopback forwarder
    /// whose address names neither the host URL, its token nor the sandbox; a second bot gets
    /// `MultiScreenUnavailable`.
    #[actix_rt::test]
    async fn the_one_screen_is_live_through_the_protected_host_url() {
        if !docker_ready() {
            return;
        }
        let p = provider();
        let m = p.provision(&team_screens::team_spec()).await.unwrap();
        p.open_screen(&m, "bot-a", 0).await.unwrap();
        assert_eq!(
            p.open_screen(&m, "bot-b", 1).await.map(|_| ()),
            Err(ProviderError::MultiScreenUnavailable)
        );
        let (host, token) = host_url(&m.0).await;
        for policy in [ScreenPolicy::View, ScreenPolicy::Control] {
            let r = p.open_route(&m, "bot-a", policy).await.unwrap();
            assert!(r.upstream.starts_with("http://127.0.0.1:"));
            for vendor in [host.trim_end_matches('/'), &emulators().boat] {
                assert_ne!(r.upstream.trim_end_matches('/'), vendor, "{policy:?}");
            }
            for secret in [&token, &m.0] {
                assert!(!r.upstream.contains(secret), "{policy:?}");
                assert!(!r.token.contains(secret), "{policy:?}");
            }
            let greeting = team_screens::gateway_greeting(&r.upstream, &r.token).await;
            assert!(
                greeting.is_some_and(|g| g.starts_with(b"RFB 003.008")),
                "{policy:?}"
            );
        }
        p.destroy(&m).await.unwrap();
    }
}

/// The protected host URL of a sandbox's screen gateway port: the URL without its query, and
/// the token.
async fn host_url(id: &str) -> (String, String) {
    box_support::host_url(&emulators().boat, KEY, id).await
}

/// A server for the screen gateway's port that answers each GET with `<name> <target>`.
fn echo_server(name: &str) -> String {
    format!(
        "import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = ('{name} ' + self.path).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('0.0.0.0', {}), H).serve_forever()
",
        rakazo::supervisor::engine::GATEWAY_PORT
    )
}

/// Waits until something listens on the gateway port.
const WAIT_FOR_GATEWAY: &str = "python3 -c 'import socket, time
for _ in range(100):
    try:
        socket.create_connection((\"127.0.0.1\", 6080), 1).close()
        break
    except OSError:
        time.sleep(0.1)
else:
    raise SystemExit(1)'";

/// The attacker's side of Box's host URLs: a request without the token, or with another
/// sandbox's, is refused with the vendor's error envelope before it reaches the machine
/// (plain HTTP and websocket upgrades alike), and the refusal names no token; the sandbox's
/// own token gets through to its own machine, which never sees the token.
#[actix_rt::test]
async fn a_host_url_refuses_requests_without_its_own_token() {
    use rakazo::providers::remote::RemoteSandboxes as _;
    if !docker_ready() {
        return;
    }
    let adapter = boat_adapter();
    let (spec_a, spec_b) = (spec("host-a"), spec("host-b"));
    let (a, b) = tokio::join!(adapter.create(&spec_a), adapter.create(&spec_b));
    let (sa, sb) = (a.unwrap(), b.unwrap());
    let (a, b) = (Boat::id(&sa).to_string(), Boat::id(&sb).to_string());
    // Each machine's gateway port answers with the request target it was sent and its name.
    for (session, name) in [(&sa, "machine-a"), (&sb, "machine-b")] {
        adapter
            .upload(session, "/tmp/echo.py", echo_server(name).into_bytes())
            .await
            .unwrap();
        let started = adapter
            .run(
                session,
                &rakazo::providers::remote::RemoteCommand {
                    script: format!("setsid python3 /tmp/echo.py >/dev/null 2>&1 </dev/null &\n{WAIT_FOR_GATEWAY}"),
                    cwd: "/tmp".into(),
                    env: Vec::new(),
                    timeout: Duration::from_secs(30),
                },
            )
            .await
            .unwrap();
        assert_eq!(started.exit_code, 0, "{started:?}");
    }
    let ((a_host, a_token), (b_host, b_token)) = (host_url(&a).await, host_url(&b).await);
    assert_ne!(a_host, b_host, "each sandbox port has its own origin");
    assert_ne!(a_token, b_token);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (what, url) in [
        ("no token", format!("{a_host}websockify")),
        ("an empty token", format!("{a_host}websockify?_token=")),
        (
            "another sandbox's token",
            format!("{a_host}websockify?_token={b_token}"),
        ),
        (
            "the token in the wrong place",
            format!("{a_host}websockify?token={a_token}"),
        ),
    ] {
        let r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 401, "{what}");
        let body = r.text().await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (v["ok"].as_bool(), v["status"].as_u64(), v["code"].as_str()),
            (Some(false), Some(401), Some("unauthorized")),
            "{what}: {v}"
        );
        assert!(v["requestId"].as_str().is_some(), "{what}");
        assert!(
            !body.contains(&a_token) && !body.contains(&b_token),
            "{what}: {body}"
        );
        // A websocket upgrade is refused the same way.
        let ws = url.replacen("http://", "ws://", 1);
        match tokio_tungstenite::connect_async(ws).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 401, "{what}")
            }
            other => panic!(
                "{what}: the upgrade was not refused: {:?}",
                other.map(|_| ())
            ),
        }
    }
    // Its own token reaches its own machine, which sees the request without the token.
    for (host, token, name) in [
        (&a_host, &a_token, "machine-a"),
        (&b_host, &b_token, "machine-b"),
    ] {
        let r = http
            .get(format!("{host}websockify?token=gw&_token={token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.text().await.unwrap(),
            format!("{name} /websockify?token=gw")
        );
    }
    for id in [a, b] {
        adapter.kill(&id).await.unwrap();
    }
}

/// A sandbox whose machine is removed behind the API's back is gone for both adapters.
#[actix_rt::test]
async fn a_machine_destroyed_behind_the_api_is_gone() {
    if !docker_ready() {
        return;
    }
    let providers: [Arc<dyn SandboxProvider>; 2] = [
        Arc::new(RemoteProvider::new(Arc::new(daytona_adapter()), 0)),
        Arc::new(RemoteProvider::new(Arc::new(boat_adapter()), 0)),
    ];
    for (i, p) in providers.into_iter().enumerate() {
        let s = spec(&format!("lost-{i}"));
        let m = p.provision(&s).await.unwrap();
        p.write_file(&m, "a.txt", b"x").await.unwrap();
        // The emulators' machines carry the sandbox id as their computer label.
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--no-trunc", "--filter"])
            .arg(format!("label=rakazo.computerId={}", m.0))
            .output()
            .unwrap();
        let container = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(
            !container.is_empty(),
            "the sandbox's machine is a container"
        );
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &container])
            .output();
        let fresh: Arc<dyn SandboxProvider> = if i == 0 {
            Arc::new(RemoteProvider::new(Arc::new(daytona_adapter()), 0))
        } else {
            Arc::new(RemoteProvider::new(Arc::new(boat_adapter()), 0))
        };
        assert_eq!(
            fresh.reconnect(&m, &s).await,
            Err(ProviderError::MachineGone),
            "{i}"
        );
        p.destroy(&m).await.unwrap();
    }
}

/// Box's wire rules the adapter relies on, straight over HTTP.
#[actix_rt::test]
async fn the_box_emulator_keeps_the_vendor_rules() {
    if !docker_ready() {
        return;
    }
    let base = format!("{}/api/v1", emulators().boat);
    let http = reqwest::Client::new();
    // No key: the error envelope.
    let r = http
        .get(format!("{base}/sandboxes/bx_nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (v["ok"].as_bool(), v["code"].as_str()),
        (Some(false), Some("unauthorized"))
    );
    assert!(v["requestId"].as_str().is_some());
    // Create needs an Idempotency-Key; a replay answers the same sandbox.
    let body = serde_json::json!({"ttlSeconds": 7200, "noEnv": false});
    let r = http
        .post(format!("{base}/sandboxes"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let create = || {
        http.post(format!("{base}/sandboxes"))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "k-1")
            .json(&body)
            .send()
    };
    let a: serde_json::Value = create().await.unwrap().json().await.unwrap();
    let b: serde_json::Value = create().await.unwrap().json().await.unwrap();
    let id = a["sandbox"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("bx_") && id.len() == 11, "{id}");
    assert_eq!(b["sandbox"]["id"], a["sandbox"]["id"]);
    // Wait until usable.
    loop {
        let v: serde_json::Value = http
            .get(format!("{base}/sandboxes/{id}"))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match v["sandbox"]["state"].as_str().unwrap() {
            "ready" | "running" | "idle" => break,
            "provisioning" | "provisioned" => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("{other}"),
        }
    }
    // Without noEnv the account's environment reaches commands: the adapter always sends it.
    let cmd =
        serde_json::json!({"command": "echo ${BOAT_ACCOUNT_TOKEN:-none}", "timeoutSeconds": 10});
    let v: serde_json::Value = http
        .post(format!("{base}/sandboxes/{id}/commands"))
        .bearer_auth(KEY)
        .json(&cmd)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(v["stdout"].as_str().unwrap().trim(), "none");
    // A deadline kills the command.
    let cmd = serde_json::json!({"command": "sleep 5; echo late", "timeoutSeconds": 1});
    let v: serde_json::Value = http
        .post(format!("{base}/sandboxes/{id}/commands"))
        .bearer_auth(KEY)
        .json(&cmd)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["timedOut"], true);
    assert!(v["exitCode"].is_null());
    // Files only under the home and /tmp.
    let put = serde_json::json!({"path": "/etc/x", "content": "eA==", "encoding": "base64"});
    let r = http
        .put(format!("{base}/sandboxes/{id}/files"))
        .bearer_auth(KEY)
        .json(&put)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "path_not_allowed");
    // Delete needs its confirmation header.
    let r = http
        .delete(format!("{base}/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 428);
    let r = http
        .delete(format!("{base}/sandboxes/{id}"))
        .bearer_auth(KEY)
        .header("X-Ascii-Confirm-Delete", &id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = http
        .get(format!("{base}/sandboxes/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// A missing key is a plain setup error, for both vendors.
#[actix_rt::test]
async fn a_missing_key_is_a_plain_setup_error() {
    for (provider, var) in [("daytona", "DAYTONA_API_KEY"), ("box", "BOAT_API_KEY")] {
        let env: std::collections::HashMap<String, String> =
            [("SANDBOX_PROVIDER".to_string(), provider.to_string())].into();
        let config = rakazo::config::Config::load(&env, None).unwrap();
        let built = rakazo::providers::build(&config).await.unwrap();
        assert!(built.provider.is_none());
        assert_eq!(built.status.sandbox, "none");
        let err = built.status.setup_error.unwrap();
        assert!(err.contains(var), "{err}");
    }
}
