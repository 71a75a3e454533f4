//! [`Attacher`]: gives a running computer container its desktop runtime (screens through the
//! shared X sockets or the supervisor's exec, desktop control groups where the supervisor
//! gives them), for the provider and for its pool of computers alike.

use std::path::PathBuf;
use std::sync::Arc;

use rakazo_actors::provider::{DesktopFreeze, ProviderRef};

use super::client::SupervisorClient;
use super::groups::SupervisorGroups;
use super::runner::SupervisorRunner;
use super::{DockerProviderConfig, RUN_DIR};
use crate::desktop::groups::{DesktopGroups, forward_freezes};
use crate::desktop::runtime::{DesktopRuntime, DisplayPool, RuntimeConfig, Settle};
use crate::supervisor::engine::{GATEWAY_PORT, WORKSPACE};
use crate::supervisor::wire::ComputerInfo;

/// One running computer container as this process knows it.
pub(super) struct Machine {
    pub(super) info: ComputerInfo,
    pub(super) runtime: Arc<DesktopRuntime>,
}

/// What attaching needs; cheap to clone (the pool's filler holds one).
#[derive(Clone)]
pub(super) struct Attacher {
    pub(super) client: SupervisorClient,
    config: DockerProviderConfig,
    /// Whether the supervisor gives desktops control groups (`Ok(words)`, `Err(why)`), once
    /// it said; `None` before.
    groups: Arc<std::sync::Mutex<Option<Result<String, String>>>>,
    /// Freezes and thaws of every machine's desktops.
    pub(super) freezes: tokio::sync::broadcast::Sender<DesktopFreeze>,
}

impl Attacher {
    pub(super) fn new(client: SupervisorClient, config: DockerProviderConfig) -> Self {
        Self {
            client,
            config,
            groups: Arc::new(std::sync::Mutex::new(None)),
            freezes: tokio::sync::broadcast::channel(256).0,
        }
    }

    /// Whether desktops get control groups: configured, and the supervisor can give them
    /// (asked once; a supervisor that does not answer is asked again next time).
    pub(super) async fn groups_on(&self) -> bool {
        if self.config.limits.is_none() {
            return false;
        }
        if let Some(known) = &*self.groups.lock().unwrap_or_else(|e| e.into_inner()) {
            return known.is_ok();
        }
        self.ask_groups().await.is_some_and(|r| r.is_ok())
    }

    /// [`Self::groups_on`] for a running container this process did not create: desktops an
    /// earlier process left frozen are thawed first, so its leftovers can be stopped.
    pub(super) async fn groups_taking_over(&self, container: &str) -> bool {
        let on = self.groups_on().await;
        if on && let Err(e) = self.client.thaw_desktops(container).await {
            tracing::warn!(error = %e, "docker.desktops.thaw_failed");
        }
        on
    }

    /// Asks the supervisor whether it gives desktops control groups, and remembers it.
    pub(super) async fn ask_groups(&self) -> Option<Result<String, String>> {
        let health = self.client.health().await.ok()?;
        let state = if health.desktop_groups_active {
            Ok(health.desktop_groups)
        } else if health.desktop_groups.is_empty() {
            Err("the supervisor gives desktops no control groups".to_owned())
        } else {
            Err(health.desktop_groups)
        };
        match &state {
            Ok(_) => tracing::info!("docker.desktops.groups_active"),
            Err(why) => tracing::warn!(error = %why, "docker.desktops.groups_unavailable"),
        }
        *self.groups.lock().unwrap_or_else(|e| e.into_inner()) = Some(state.clone());
        Some(state)
    }

    /// Whether the supervisor said it gives desktops control groups (and they are configured).
    pub(super) fn groups_known(&self) -> bool {
        self.config.limits.is_some()
            && matches!(
                &*self.groups.lock().unwrap_or_else(|e| e.into_inner()),
                Some(Ok(_))
            )
    }

    /// The runtime of the running container `info`; its spare desktops start at once.
    pub(super) fn attach(&self, info: ComputerInfo, grouped: bool) -> Arc<Machine> {
        let runner = SupervisorRunner {
            client: self.client.clone(),
            container: info.id.clone(),
        };
        let config = RuntimeConfig {
            workspace: PathBuf::from(WORKSPACE),
            run_dir: PathBuf::from(RUN_DIR),
            screen_limit: self.config.screen_limit,
            // Each container has its own display numbers.
            displays: DisplayPool::new(1),
            gateway_port: GATEWAY_PORT,
            settle: Settle::default(),
            x11_socket_dir: Some(PathBuf::from(&info.x11_dir)),
            commands_only: self.config.commands_only,
            gateway_host: "0.0.0.0".into(),
            groups: self.config.limits.filter(|_| grouped).map(|limits| {
                Arc::new(SupervisorGroups {
                    client: self.client.clone(),
                    container: info.id.clone(),
                    limits,
                }) as Arc<dyn DesktopGroups>
            }),
            freeze_after: self.config.limits.and_then(|l| l.freeze_after),
            warm_stacks: self.config.warm_stacks,
        };
        let runtime = Arc::new(DesktopRuntime::new(Arc::new(runner), config));
        runtime.start_freezer();
        runtime.start_warm_pool();
        forward_freezes(&runtime, self.freezes.clone(), ProviderRef(info.id.clone()));
        Arc::new(Machine { info, runtime })
    }
}
