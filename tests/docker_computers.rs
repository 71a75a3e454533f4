//! Docker computers end to end: what `docker inspect` shows of a computer container, their exec
//! agent, and the spec's Docker team-screens regression (parallel Chromium desktops in one
//! container with networking disabled, a fixture site inside it, independent cookies per bot,
//! profiles that persist after release, old gateway tokens refused after slot reuse). Skipped
//! without a Docker engine or the computer image, except in CI.

mod common;
mod docker_support;
mod exec_agent;
mod pooled_computers;
mod team_screens;
mod windows;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rakazo::config::DockerNetwork;
use rakazo::desktop::gateway::Policy;
use rakazo::providers::docker::DockerProvider;
use rakazo_actors::provider::{
    BrowserCommand, MachineSpec, ProviderError, ProviderRef, SandboxProvider,
};
use serde_json::Value;

use common::terminal::{Ended, TerminalClient};
use docker_support::{RemoveOnDrop, TestSupervisor, docker_ready};
use team_screens::{cmd, go, start_site, team_spec, unique};

fn docker_inspect(id: &str) -> Option<Value> {
    let out = std::process::Command::new("docker")
        .args(["inspect", id])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    all.get(0).cloned()
}

/// Reads the first websocket message from the gateway at `port` for `token`, if any comes.
async fn gateway_greeting(port: u16, token: &str) -> Option<Vec<u8>> {
    let url = format!("ws://127.0.0.1:{port}/websockify?token={token}");
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.ok()?;
    match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
        Ok(Some(Ok(msg))) if msg.is_binary() || msg.is_text() => Some(msg.into_data().to_vec()),
        _ => None,
    }
}

/// The stages a provider reports while it readies a machine.
async fn preparation(p: &DockerProvider) -> (Vec<&'static str>, bool) {
    let seen = std::sync::Mutex::new(Vec::new());
    let ok = p
        .prepare(&|stage| seen.lock().unwrap().push(stage.as_str()))
        .await
        .is_ok();
    (seen.into_inner().unwrap(), ok)
}

/// With the image present a new machine's preparation is the container start only; with it
/// missing the image build comes first (a supervisor that builds no image refuses it).
#[actix_rt::test]
async fn preparation_reports_the_image_build_then_the_container_start() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    assert_eq!(
        preparation(&sup.provider()).await,
        (vec!["container_start"], true)
    );
    let missing =
        TestSupervisor::start_with_image(&format!("rakazo-computer:{}", unique("missing")));
    assert_eq!(
        preparation(&missing.provider()).await,
        (vec!["image_build"], false)
    );
}

#[actix_rt::test]
async fn inspect_shows_labels_mount_uid_1000_and_a_loopback_only_port() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::Bridge);
    let p = sup.provider();
    let bot = unique("bot");
    let space = unique("space");
    let spec = MachineSpec {
        computer_id: unique("computer"),
        space_id: space.clone(),
        bot_id: Some(bot.clone()),
        home_key: bot.clone(),
    };
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    let c = docker_inspect(&m.0).expect("container exists");

    assert_eq!(c["Name"], format!("/rakazo-bot-{bot}"));
    let labels = &c["Config"]["Labels"];
    assert_eq!(labels["rakazo.managed"], "true");
    assert_eq!(labels["rakazo.botId"], bot.as_str());
    assert_eq!(labels["rakazo.workspaceId"], space.as_str());
    assert_eq!(c["Config"]["User"], "1000:1000");
    let home = sup.data_dir.join("homes").join(&bot);
    let binds: Vec<&str> = c["HostConfig"]["Binds"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        binds.contains(&format!("{}:/home/rakazo:rw", home.display()).as_str()),
        "{binds:?}"
    );
    assert_eq!(c["HostConfig"]["ShmSize"], 256 << 20);
    assert_eq!(c["HostConfig"]["CapDrop"][0], "ALL");
    assert_eq!(c["HostConfig"]["NanoCpus"], 2_000_000_000i64);
    assert_eq!(c["HostConfig"]["PidsLimit"], 2048);
    let ports = c["NetworkSettings"]["Ports"]["6080/tcp"]
        .as_array()
        .unwrap();
    assert!(!ports.is_empty());
    for binding in ports {
        assert_eq!(binding["HostIp"], "127.0.0.1", "published beyond loopback");
    }
    assert_eq!(
        c["NetworkSettings"]["Ports"].as_object().unwrap().len(),
        1,
        "one gateway port for every desktop"
    );

    // Every process, the desktop included, runs as uid 1000; Chromium keeps its sandbox.
    p.open_screen(&m, "bot-a", 0).await.unwrap();
    let out = p
        .exec(&m, &cmd("ps -eo uid= | sort -u | tr -d ' '"))
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "1000", "{out:?}");
    let out = p
        .exec(&m, &cmd("ps -eo args | grep '^/usr/lib/chromium/chromium' | grep -c -- --no-sandbox || true"))
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "0");
    let out = p
        .exec(
            &m,
            &cmd("ps -eo args | grep -c '^/usr/lib/chromium/chromium'"),
        )
        .await
        .unwrap();
    assert_ne!(out.stdout.trim(), "0");

    // The gateway is reached through the loopback-published port; an old token is refused
    // once its slot has been torn down and reused.
    let addr = p
        .gateway_addr(&m)
        .await
        .unwrap()
        .expect("published gateway");
    assert!(addr.ip().is_loopback());
    let runtime = p.runtime(&m).await.unwrap();
    let cap = runtime.grant("bot-a", Policy::View).await.unwrap();
    let greeting = gateway_greeting(addr.port(), cap.token.expose())
        .await
        .expect("no greeting through the published gateway");
    assert!(greeting.starts_with(b"RFB 003.008"));
    // The live-screen route the screen proxy uses points at the same loopback port.
    let route = p
        .open_route(&m, "bot-a", rakazo_actors::provider::ScreenPolicy::Control)
        .await
        .unwrap();
    assert_eq!(route.upstream, format!("http://127.0.0.1:{}", addr.port()));
    let greeting = gateway_greeting(addr.port(), &route.token).await.unwrap();
    assert!(greeting.starts_with(b"RFB 003.008"));
    p.close_route(&m, &route.token).await.unwrap();
    assert_eq!(gateway_greeting(addr.port(), &route.token).await, None);
    p.close_screen(&m, "bot-a").await.unwrap();
    p.open_screen(&m, "bot-b", 0).await.unwrap();
    let _b = runtime.grant("bot-b", Policy::View).await.unwrap();
    assert_eq!(
        gateway_greeting(addr.port(), cap.token.expose()).await,
        None
    );

    // A command whose caller gives up is killed, not left running until its deadline.
    let mut long = cmd("sleep 47; echo late > late.txt");
    long.timeout = Duration::from_secs(120);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), p.exec(&m, &long))
            .await
            .is_err()
    );
    let started = Instant::now();
    loop {
        let out = p
            .exec(&m, &cmd("ps -eo args | grep -c '^sleep 47' || true"))
            .await
            .unwrap();
        if out.stdout.trim() == "0" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a dropped command kept running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Destroy removes the container, keeps the home, and the reference is gone for good.
    p.write_file(&m, "kept.txt", b"kept").await.unwrap();
    p.destroy(&m).await.unwrap();
    assert!(docker_inspect(&m.0).is_none());
    assert_eq!(std::fs::read(home.join("kept.txt")).unwrap(), b"kept");
    assert_eq!(
        p.reconnect(&m, &spec).await,
        Err(ProviderError::MachineGone)
    );
}

/// Whether a gateway token's unix socket answers with an RFB greeting inside the computer.
async fn token_answers(p: &DockerProvider, m: &ProviderRef, token: &str) -> bool {
    let script = format!(
        "python3 -c 'import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(5)\ns.connect(\"/tmp/rakazo-run/gateway/{token}\")\nsys.stdout.write(s.recv(12).decode())' 2>/dev/null"
    );
    let out = p.exec(m, &cmd(&script)).await.unwrap();
    out.stdout.starts_with("RFB 003.008")
}

#[actix_rt::test]
async fn team_screens_without_network_keep_cookies_apart_and_profiles_across_release() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    team_screens_regression(&sup, sup.provider()).await;
}

/// The same regression with screens reached through commands only (the capture helper and
/// xdotool through exec), the path the remote providers take.
#[actix_rt::test]
async fn team_screens_through_the_plain_command_path() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.command_provider();
    team_screens_regression(&sup, p.clone()).await;
}

/// The spec's Docker team-screens regression on one provider.
async fn team_screens_regression(sup: &TestSupervisor, p: Arc<DockerProvider>) {
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    let c = docker_inspect(&m.0).unwrap();
    assert_eq!(c["Name"], format!("/rakazo-team-{}", spec.space_id));
    assert_eq!(c["HostConfig"]["NetworkMode"], "none");
    assert_eq!(p.gateway_addr(&m).await.unwrap(), None);
    // No network but loopback: the outside is unreachable.
    let out = p
        .exec(&m, &cmd("ls /sys/class/net | sort | tr '\\n' ' '"))
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "lo");

    // The fixture site runs inside the computer, as uid 1000.
    start_site(&*p, &m).await;

    // Two bots, two desktops in parallel, two browsers; cookies stay independent per bot.
    let (a_slot, _) = team_screens::cookies_stay_apart(&*p, &m).await;

    // A view token of bot-a's slot answers; after release and reuse of that slot it does not.
    let runtime = p.runtime(&m).await.unwrap();
    let cap = runtime.grant("bot-a", Policy::View).await.unwrap();
    assert!(token_answers(&p, &m, cap.token.expose()).await);
    p.close_screen(&m, "bot-a").await.unwrap();
    let c_screen = p.open_screen(&m, "bot-c", a_slot).await.unwrap();
    assert_eq!(c_screen.slot, a_slot, "the freed slot is reused");
    let _c_view = runtime.grant("bot-c", Policy::View).await.unwrap();
    assert!(!token_answers(&p, &m, cap.token.expose()).await);
    assert_eq!(runtime.gateway().live_count(a_slot).await, 1);

    // bot-a's profile persisted in the mounted home; reopened in another slot it still has
    // its cookie.
    let profile = sup
        .data_dir
        .join("homes")
        .join(&spec.home_key)
        .join(".browser-profiles/bot-a/Default");
    assert!(profile.is_dir(), "profile kept in the workspace");
    let a2 = p.open_screen(&m, "bot-a", 2).await.unwrap();
    assert_ne!(a2.slot, a_slot);
    assert_eq!(
        go(&*p, &m, "bot-a", "/check/a2").await.as_deref(),
        Some("session=alpha")
    );
    assert_eq!(
        go(&*p, &m, "bot-c", "/check/c1").await.as_deref(),
        Some("-")
    );

    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn supervisor_refuses_a_wrong_token() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::Bridge);
    let bad = Arc::new(
        DockerProvider::new(rakazo::providers::docker::DockerProviderConfig {
            supervisor_url: sup.url.clone(),
            supervisor_token: "wrong".into(),
            screen_limit: 0,
            commands_only: false,
            warm_stacks: 0,
            limits: None,
        })
        .unwrap(),
    );
    let err = bad
        .provision(&MachineSpec {
            computer_id: unique("c"),
            space_id: unique("s"),
            bot_id: None,
            home_key: unique("h"),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Failed(m) if m.contains("Unauthorized")),
        "{err:?}"
    );
}

#[actix_rt::test]
async fn supervisor_reaches_only_managed_containers() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::Bridge);
    // A container the supervisor did not make (no `rakazo.managed` label).
    let name = unique("unmanaged");
    let out = std::process::Command::new("docker")
        .args(["run", "-d", "--name", &name, "--network", "none"])
        .arg(rakazo::image::default_image())
        .args(["sleep", "300"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let _cleanup = RemoveOnDrop(id.clone());
    let p = sup.provider();
    let m = ProviderRef(id.clone());
    assert_eq!(p.info(&m).await.unwrap_err(), ProviderError::MachineGone);
    assert!(matches!(
        p.exec(&m, &cmd("true")).await,
        Err(ProviderError::MachineGone)
    ));
    p.destroy(&m).await.unwrap();
    assert!(
        docker_inspect(&id).is_some(),
        "an unmanaged container was removed"
    );
}

#[actix_rt::test]
async fn a_container_removed_behind_our_back_is_machine_gone() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    p.open_screen(&m, "bot-a", 0).await.unwrap();
    let gone = std::process::Command::new("docker")
        .args(["rm", "-f", &m.0])
        .output()
        .unwrap();
    assert!(gone.status.success());
    assert_eq!(
        p.observe(&m, "bot-a").await.unwrap_err(),
        ProviderError::MachineGone
    );
    assert_eq!(
        p.exec(&m, &cmd("true")).await.unwrap_err(),
        ProviderError::MachineGone
    );
    assert_eq!(
        p.open_screen(&m, "bot-b", 1).await.unwrap_err(),
        ProviderError::MachineGone
    );
    assert_eq!(
        p.reconnect(&m, &spec).await,
        Err(ProviderError::MachineGone)
    );
}

#[actix_rt::test]
async fn health_shows_docker_with_the_supervisor_running() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let s = common::TestServer::docker(&sup.url, &sup.token).await;
    let mut v = Value::Null;
    for _ in 0..50 {
        v = s.health().await;
        if v["status"] == "ok" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (v["status"].as_str(), v["sandbox"].as_str()),
        (Some("ok"), Some("docker")),
        "{v}"
    );
}

#[actix_rt::test]
async fn the_browser_terminal_is_a_real_shell_of_the_workspace_user() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::Bridge);
    let s = common::TestServer::docker(&sup.url, &sup.token).await;
    let (space, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let control = s
        .ok("computer.takeControl", serde_json::json!({ "botId": bot }))
        .await;
    let container = docker_support::space_container(&space);
    let _cleanup = RemoveOnDrop(container.clone());
    let in_container = |script: &str| {
        let out = std::process::Command::new("docker")
            .args(["exec", &container, "sh", "-c", script])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };

    let issued = s
        .ok("computer.terminalUrl", serde_json::json!({ "botId": bot }))
        .await;
    let url = issued["url"].as_str().unwrap();
    let wait = Duration::from_secs(20);
    let mut first = TerminalClient::connect(&s.base, url).await.unwrap();
    first.resize(120, 40).await;
    first
        .send("echo \"who=$(id -u):$(pwd):$TERM\"; stty size\r")
        .await;
    first
        .expect("who=1000:/home/rakazo:xterm-256color", wait)
        .await;
    first.expect("40 120", wait).await;

    // Another session joins the same server with its own shell.
    let mut second = TerminalClient::connect(&s.base, url).await.unwrap();
    second.send("echo second-$((20+22))\r").await;
    second.expect("second-42", wait).await;
    assert_eq!(
        in_container("ls /tmp/rakazo-run/terminals | grep -c '^session-'"),
        "1"
    );
    assert_eq!(in_container("ps -eo args | grep -c '[b]ash -i'"), "2");

    // Release ends both shells, the server and its files.
    s.ok(
        "computer.releaseControl",
        serde_json::json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    assert_eq!(first.ended(wait).await, Ended::Closed("revoked".into()));
    assert_eq!(second.ended(wait).await, Ended::Closed("revoked".into()));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = in_container(
            "ls /tmp/rakazo-run/terminals | grep -c '^session-'; ps -eo args | grep -c -e '[b]ash -i' -e '[t]erminal-server-'",
        );
        if left.split_whitespace().all(|n| n == "0") {
            break;
        }
        assert!(Instant::now() < deadline, "terminal leftovers: {left}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(TerminalClient::connect(&s.base, url).await.is_err());
}

#[actix_rt::test]
async fn a_container_that_outlived_its_reference_is_found_by_its_labels() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let bot = unique("bot");
    let spec = MachineSpec {
        computer_id: unique("computer"),
        space_id: unique("space"),
        bot_id: Some(bot.clone()),
        home_key: bot,
    };
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    let started = p
        .exec(&m, &cmd("nohup sleep 600 >/dev/null 2>&1 & echo $!"))
        .await
        .unwrap();
    let pid = started.stdout.trim().to_owned();
    // The reference is lost (a fresh process, a restored database): provisioning the same
    // computer reconnects through the labels, and what ran there still runs.
    let again = sup.provider().provision(&spec).await.unwrap();
    assert_eq!(again, m);
    let alive = sup
        .provider()
        .exec(&again, &cmd(&format!("kill -0 {pid} && echo alive")))
        .await
        .unwrap();
    assert_eq!(alive.stdout.trim(), "alive");
    // Another computer's spec never adopts it.
    let other = MachineSpec {
        computer_id: unique("computer"),
        ..spec.clone()
    };
    let fresh = sup.provider().provision(&other).await.unwrap();
    let _cleanup2 = RemoveOnDrop(fresh.0.clone());
    assert_ne!(fresh, m);
}

#[actix_rt::test]
async fn page_tools_reach_the_bots_browser_inside_the_container() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    start_site(&*p, &m).await;
    p.open_screen(&m, "bot-a", 0).await.unwrap();
    let loaded = p
        .browser(
            &m,
            "bot-a",
            &BrowserCommand::Navigate {
                url: "http://127.0.0.1:8765/check/page-tools".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(loaded["loaded"], true, "{loaded}");
    let snap = p
        .browser(&m, "bot-a", &BrowserCommand::Snapshot)
        .await
        .unwrap();
    assert_eq!(snap["title"], "/check/page-tools", "{snap}");
    assert!(snap["text"].as_str().unwrap().contains("/check/page-tools"));
    // The DevTools bridge is one of the screen's processes: teardown removes it.
    p.close_screen(&m, "bot-a").await.unwrap();
    let left = p
        .exec(&m, &cmd("ls /tmp/.X11-unix | grep -c '^cdp-'"))
        .await
        .unwrap();
    assert_eq!(left.stdout.trim(), "0");
    // Through the plain command path there is no DevTools: the tools say so.
    let plain = sup.command_provider();
    assert!(matches!(
        plain.browser(&m, "bot-a", &BrowserCommand::Snapshot).await,
        Err(ProviderError::Unsupported(_))
    ));
}

/// A restore on a stopped Docker computer is pending until its container imports it, shown by
/// the stopped Files view and seen by the next run; a bot's 5,000-byte path and a name that is
/// not UTF-8 do not stop its checkpoints.
#[actix_rt::test]
async fn a_restore_on_a_stopped_docker_computer_and_names_a_store_cannot_hold() {
    use serde_json::json;
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let s = common::TestServer::docker(&sup.url, &sup.token).await;
    let (space, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let finish = |run: String, fence: i64| {
        let s = &s;
        async move {
            s.ok(
                "run.finish",
                json!({ "runId": run, "fence": fence, "outcome": "completed" }),
            )
            .await
        }
    };
    let (run, fence) = s.start_run(bot).await;
    s.exec(&run, fence, "echo one > state.txt").await.unwrap();
    let _cleanup = RemoveOnDrop(docker_support::space_container(&space));
    assert_eq!(finish(run, fence).await["checkpoint"]["saved"], 1);
    let (run, fence) = s.start_run(bot).await;
    s.exec(
        &run,
        fence,
        "echo two > state.txt; echo later > later.txt; d=$(printf 'x%.0s' $(seq 200)); \
         (for i in $(seq 25); do mkdir $d && cd $d || exit 1; done; echo deep > f.txt); \
         echo bad > \"$(printf 'bad\\377.txt')\"",
    )
    .await
    .unwrap();
    let done = finish(run, fence).await;
    assert_eq!(
        (
            done["checkpoint"]["saved"].as_i64(),
            done["checkpoint"]["skippedCount"].as_i64()
        ),
        (Some(2), Some(2)),
        "{done}"
    );
    let c = s.ok("computer.forBot", json!({ "botId": bot })).await;
    s.ok("computer.stop", json!({ "computerId": c["id"] }))
        .await;
    let stopped = s.ok("computer.get", json!({ "computerId": c["id"] })).await["revision"]
        .as_i64()
        .unwrap();
    let restored = s
        .ok(
            "computer.restoreRevision",
            json!({ "computerId": c["id"], "revision": 1 }),
        )
        .await;
    assert_eq!(
        (restored["revision"].as_i64(), restored["pending"].as_bool()),
        (Some(stopped + 1), Some(true)),
        "{restored}"
    );
    let read = s
        .ok("files.read", json!({ "botId": bot, "path": "state.txt" }))
        .await;
    assert_eq!(read["text"], "one\n");
    let (run, fence) = s.start_run(bot).await;
    assert_eq!(
        s.exec(
            &run,
            fence,
            "cat state.txt; test -e later.txt && echo later || echo gone; id -u -n"
        )
        .await
        .unwrap()["stdout"],
        "one\ngone\nrakazo\n"
    );
    let got = s.ok("computer.get", json!({ "computerId": c["id"] })).await;
    assert!(got["pendingRestore"].is_null(), "{got}");
    s.exec(&run, fence, "echo three >> state.txt")
        .await
        .unwrap();
    assert_eq!(finish(run, fence).await["checkpoint"]["saved"], stopped + 2);
}

#[actix_rt::test]
async fn a_fresh_desktop_shows_its_browser_and_nothing_else() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let spec = team_spec();
    let m = p.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    let screen = p.open_screen(&m, "bot-a", 0).await.unwrap();
    // The first frame a bot gets.
    let first = p.observe(&m, "bot-a").await.unwrap();
    let runtime = p.runtime(&m).await.unwrap();
    let display = runtime.screen("bot-a").await.unwrap().display;
    assert_eq!(runtime.screen("bot-a").await.unwrap().slot, screen.slot);
    let x11_dir = std::path::PathBuf::from(p.info(&m).await.unwrap().x11_dir);
    let conn = windows::connect_in(&x11_dir, display);
    windows::assert_only_the_browser(&conn);
    let out = p
        .exec(
            &m,
            &cmd("ps -eo args= | grep -E '^(xmessage|/bin/sh /usr/bin/fbsetbg)' || true"),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "", "a wallpaper setter ran");
    // The browser found the image's font cache valid: it built none of its own.
    let own = p
        .exec(
            &m,
            &cmd(&format!(
                "ls {}/xdg-cache/fontconfig 2>/dev/null | wc -l",
                rakazo::providers::docker::RUN_DIR
            )),
        )
        .await
        .unwrap();
    assert_eq!(
        own.stdout.trim(),
        "0",
        "the browser built its own font cache"
    );
    let painted = windows::painted_in_row(&first.png, 20);
    assert!(
        painted > first.width as usize / 2,
        "the first frame's title area is the browser's ({painted} pixels painted)"
    );
    p.destroy(&m).await.unwrap();
}

#[actix_rt::test]
async fn a_new_process_stops_the_desktops_an_old_one_left_in_its_container() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let spec = team_spec();
    let old = sup.provider();
    let m = old.provision(&spec).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    old.open_screen(&m, "bot-a", 0).await.unwrap();
    let count = "ps -eo comm= | grep -cE '^(Xvfb|fluxbox|chromium)$' || true";
    let before = old.exec(&m, &cmd(count)).await.unwrap();
    assert!(before.stdout.trim().parse::<u32>().unwrap() >= 3);
    // The old process is gone without stopping its desktops (killed); the container stays
    // and a new process adopts it.
    let new = sup.provider();
    let again = new.provision(&spec).await.unwrap();
    assert_eq!(again, m, "the container is adopted");
    let screen = new.open_screen(&again, "bot-a", 0).await.unwrap();
    // The old stack was stopped first: one Xvfb and one window manager, on the first display.
    let xvfb = new
        .exec(
            &again,
            &cmd("ps -eo comm= | grep -c '^Xvfb$'; ps -eo comm= | grep -c '^fluxbox$'"),
        )
        .await
        .unwrap();
    assert_eq!(
        xvfb.stdout.split_whitespace().collect::<Vec<_>>(),
        ["1", "1"]
    );
    let runtime = new.runtime(&again).await.unwrap();
    assert_eq!(runtime.screen("bot-a").await.unwrap().display, 1);
    assert_eq!(screen.slot, 0);
    let first = new.observe(&again, "bot-a").await.unwrap();
    assert!(windows::painted_in_row(&first.png, 20) > first.width as usize / 2);
    new.destroy(&again).await.unwrap();
}
