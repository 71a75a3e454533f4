//! The exec agent of Docker computers: scripts run through one held engine exec, and the bot,
//! which can signal the agent (both are uid 1000), can stop it or kill it but never read its
//! pipes or answer for it; a killed or stopped agent is replaced and its script killed
//! ([`checks`], shared with Kubernetes pods); an image without `python3` runs scripts through
//! the engine exec; a script under way when its computer stops is told the machine is gone. On
//! the plain command path the agent keeps the capture helper (frames and pointer input). The
//! agent of a container removed behind the supervisor's back is forgotten.

pub mod checks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::DockerProvider;
use rakazo::supervisor::engine::EngineError;
use rakazo::supervisor::wire::AskBody;
use rakazo_actors::provider::{ProviderError, ProviderRef, SandboxProvider};

use super::docker_support::{RemoveOnDrop, TestSupervisor, docker_ready};
use super::team_screens::{cmd, team_spec};
use checks::agent_pid;

/// A Team Computer on a supervisor of its own, removed at the end.
async fn computer() -> (
    TestSupervisor,
    Arc<DockerProvider>,
    ProviderRef,
    RemoveOnDrop,
) {
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let m = p.provision(&team_spec()).await.unwrap();
    let cleanup = RemoveOnDrop(m.0.clone());
    (sup, p, m, cleanup)
}

/// A Team Computer on the plain command path with `bot`'s screen open, on a supervisor of its
/// own, removed at the end.
async fn command_path_screen(
    bot: &str,
) -> (
    TestSupervisor,
    Arc<DockerProvider>,
    ProviderRef,
    RemoveOnDrop,
) {
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.command_provider();
    let m = p.provision(&team_spec()).await.unwrap();
    let cleanup = RemoveOnDrop(m.0.clone());
    p.open_screen(&m, bot, 0).await.unwrap();
    (sup, p, m, cleanup)
}

#[actix_rt::test]
async fn on_the_command_path_frames_come_from_one_capture_helper_the_agent_keeps() {
    if !docker_ready() {
        return;
    }
    let (sup, p, m, _cleanup) = command_path_screen("bot-capture").await;
    checks::frames_come_from_one_kept_helper(&*p, &m, "bot-capture").await;
    // A line with a line end would be two requests to the helper: the supervisor refuses it.
    let two_lines = AskBody {
        helper: "capture:0".into(),
        argv: vec!["cat".into()],
        env: Vec::new(),
        line: "grab\nreads".into(),
        timeout_ms: 1_000,
    };
    let asked = sup.engine().await.ask(&m.0, &two_lines).await;
    assert!(matches!(asked, Err(EngineError::Invalid(_))));
}

#[actix_rt::test]
async fn on_the_command_path_pointer_input_is_played_through_xtest_in_the_kept_helper() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = command_path_screen("bot-xtest").await;
    checks::pointer_input_goes_through_xtest(&*p, &m, "bot-xtest").await;
}

#[actix_rt::test]
async fn scripts_run_through_one_agent_with_the_engine_execs_outcomes() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    checks::scripts_run_through_one_agent(&*p, &m, checks::AGENT).await;
}

#[actix_rt::test]
async fn the_bot_can_kill_the_agent_but_never_read_or_answer_through_its_pipes() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    checks::a_lost_agent_is_replaced_and_its_pipes_stay_closed(&*p, &m, checks::AGENT).await;
}

#[actix_rt::test]
async fn a_script_under_way_when_its_computer_stops_is_told_the_machine_is_gone() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    agent_pid(&*p, &m, checks::AGENT).await;
    let running = {
        let (p, m) = (p.clone(), m.clone());
        tokio::spawn(async move { p.exec(&m, &cmd("sleep 30")).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    p.stop(&m).await.unwrap();
    let out = running.await.unwrap();
    assert_eq!(out.unwrap_err(), ProviderError::MachineGone);
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[actix_rt::test]
async fn an_image_without_python_runs_scripts_through_the_engine_exec() {
    if !docker_ready() {
        return;
    }
    let image = checks::ImageWithoutPython::make();
    let sup = TestSupervisor::start_with_image(&image.0);
    let p = sup.provider();
    let m = p.provision(&team_spec()).await.unwrap();
    let _cleanup = RemoveOnDrop(m.0.clone());
    checks::scripts_run_without_python(&*p, &m).await;
    p.destroy(&m).await.unwrap();
}

/// The bot holds every process its computer may have (its threads count): a script sent then
/// is refused with a clear error, nothing of it runs, and the agent goes on.
#[actix_rt::test]
async fn a_script_with_no_process_left_to_start_is_refused_and_the_agent_goes_on() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    let pid = agent_pid(&*p, &m, checks::AGENT).await;
    // Threads (light, and counted by the pids limit) until none more can start, taking back
    // every slot freed for 8 s; the script waits for the fill with builtins only.
    let filler = r#"
import threading, time
threading.stack_size(65536)
stop = threading.Event()
deadline = time.monotonic() + 8
n, full = 0, False
while time.monotonic() < deadline and n < 5000:
    try:
        threading.Thread(target=stop.wait, daemon=True).start()
        n += 1
    except RuntimeError:
        if not full:
            open("/tmp/filled", "w").write("%d\n" % n)
            full = True
        time.sleep(0.01)
if not full:
    open("/tmp/filled", "w").write("unlimited\n")
stop.set()
"#;
    let mut fill = cmd(&format!(
        "rm -f /tmp/filled; setsid python3 -c {} </dev/null >/dev/null 2>&1 & \
         while [ ! -e /tmp/filled ]; do :; done; read -r n < /tmp/filled; echo \"$n\"",
        rakazo::desktop::shell_quote(filler)
    ));
    fill.timeout = Duration::from_secs(30);
    let filled = p.exec(&m, &fill).await.unwrap().stdout;
    if filled.trim() == "unlimited" {
        eprintln!("skipped: the computer's pids limit is not enforced here");
        return;
    }
    // The script's own shell has ended: the filler takes its slot back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = p.exec(&m, &cmd("touch /tmp/ran")).await;
    assert!(
        matches!(&refused, Err(ProviderError::Failed(e)) if e.contains("cannot start the script")),
        "{refused:?}"
    );
    // The filler lets go after 8 s (later on a loaded machine): until then scripts are refused.
    let until = Instant::now() + Duration::from_secs(60);
    let checked = loop {
        match p
            .exec(&m, &cmd("test -e /tmp/ran && echo ran; echo checked"))
            .await
        {
            Ok(out) => break out.stdout,
            Err(ProviderError::Failed(e))
                if e.contains("cannot start the script") && Instant::now() < until =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the limit was never let go: {e:?}"),
        }
    };
    assert_eq!(checked, "checked\n", "nothing of the refused script ran");
    assert_eq!(
        agent_pid(&*p, &m, checks::AGENT).await,
        pid,
        "the same agent goes on"
    );
}

/// A container removed behind the supervisor's back leaves no agent behind: the next script
/// there finds it gone, and a removal sweeps the agents of any others gone meanwhile.
#[actix_rt::test]
async fn the_agent_of_a_container_removed_behind_the_supervisors_back_is_forgotten() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    let engine = sup.engine().await;
    let script = |s: &str| rakazo::supervisor::wire::ExecBody {
        script: s.into(),
        cwd: "/".into(),
        env: Vec::new(),
        timeout_ms: 10_000,
        run_id: None,
    };
    let mut machines = Vec::new();
    for _ in 0..3 {
        let m = p.provision(&team_spec()).await.unwrap();
        let out = engine.exec(&m.0, &script("echo up")).await.unwrap();
        assert_eq!(out.stdout, "up\n");
        machines.push((RemoveOnDrop(m.0.clone()), m));
    }
    assert_eq!(engine.agents_held(), 3);
    let behind_the_back = |name: &str| {
        let status = std::process::Command::new("docker")
            .args(["rm", "-f", name])
            .output()
            .unwrap()
            .status;
        assert!(status.success());
    };
    // The next script finds its container gone.
    behind_the_back(&machines[0].1.0);
    assert!(matches!(
        engine.exec(&machines[0].1.0, &script("true")).await,
        Err(EngineError::Gone)
    ));
    assert_eq!(engine.agents_held(), 2);
    // Never asked again: the next removal sweeps it.
    behind_the_back(&machines[1].1.0);
    engine.remove(&machines[2].1.0).await.unwrap();
    assert_eq!(engine.agents_held(), 0);
}
