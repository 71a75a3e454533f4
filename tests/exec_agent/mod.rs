//! The exec agent of Docker computers: scripts run through one held engine exec, and the bot,
//! which can signal the agent (both are uid 1000), can stop it or kill it but never read its
//! pipes or answer for it; a killed or stopped agent is replaced and its script killed
//! ([`checks`], shared with Kubernetes pods); an image without `python3` runs scripts through
//! the engine exec; a script under way when its computer stops is told the machine is gone.

pub mod checks;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::DockerProvider;
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

#[actix_rt::test]
async fn scripts_run_through_one_agent_with_the_engine_execs_outcomes() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    checks::scripts_run_through_one_agent(&*p, &m).await;
}

#[actix_rt::test]
async fn the_bot_can_kill_the_agent_but_never_read_or_answer_through_its_pipes() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    checks::a_lost_agent_is_replaced_and_its_pipes_stay_closed(&*p, &m).await;
}

#[actix_rt::test]
async fn a_script_under_way_when_its_computer_stops_is_told_the_machine_is_gone() {
    if !docker_ready() {
        return;
    }
    let (_sup, p, m, _cleanup) = computer().await;
    agent_pid(&*p, &m).await;
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
