//! The provider conformance suite for the `docker` provider: real containers from the
//! computer image, through an in-process supervisor. Skipped without a Docker engine or the
//! image, except in CI. Through commands only, the page tools reach the browser through the
//! published gateway.

mod docker_support;
mod gateway_pages;

use std::sync::{Arc, OnceLock};

use rakazo::config::DockerNetwork;
use rakazo_actors::provider::SandboxProvider;

use docker_support::{TestSupervisor, docker_ready};

fn supervisor() -> &'static TestSupervisor {
    static SHARED: OnceLock<TestSupervisor> = OnceLock::new();
    SHARED.get_or_init(|| TestSupervisor::start(DockerNetwork::Bridge))
}

/// A fresh provider per test (each test has its own runtime), one supervisor for all.
fn provider() -> Arc<dyn SandboxProvider> {
    supervisor().provider()
}

rakazo_actors::conformance_suite!(provider(), gate = docker_ready());

/// The same suite with screens reached through commands only (the capture helper and xdotool
/// through the supervisor's exec), the path the remote providers take.
mod through_commands {
    use super::*;

    fn provider() -> Arc<dyn SandboxProvider> {
        supervisor().command_provider()
    }

    rakazo_actors::conformance_suite!(provider(), gate = docker_ready());

    /// The page tools with no shared X sockets: DevTools through the published gateway.
    #[actix_rt::test]
    async fn page_tools_reach_the_browser_through_the_gateway() {
        if !docker_ready() {
            return;
        }
        gateway_pages::through_the_gateway(&*provider(), "docker-commands").await;
    }
}

#[test]
fn describes_docker_with_a_mounted_home() {
    let p = rakazo::providers::docker::DockerProvider::new(
        rakazo::providers::docker::DockerProviderConfig {
            supervisor_url: "http://127.0.0.1:9".into(),
            supervisor_token: "t".into(),
            screen_limit: 0,
            commands_only: false,
            warm_stacks: 0,
            limits: None,
        },
    )
    .unwrap();
    let d = p.describe();
    assert_eq!(d.kind, "docker");
    assert!(d.capabilities.multi_screen && d.capabilities.mounted_home);
}
