//! The desktop groups of a Docker computer ([`DesktopGroups`]): the supervisor owns them
//! (`/v1/computers/{id}/desktops/...`), nested under the container's own control groups.

use async_trait::async_trait;
use rakazo_actors::provider::ProviderError;

use crate::desktop::DesktopError;
use crate::desktop::cgroup::{Phase, Usage, group_name};
use crate::desktop::groups::{DesktopGroups, DesktopLimits};
use crate::supervisor::wire::DesktopEnter;

use super::client::SupervisorClient;

/// The desktop groups of one computer container, through its supervisor.
#[derive(Clone)]
pub struct SupervisorGroups {
    /// The supervisor.
    pub client: SupervisorClient,
    /// The container id.
    pub container: String,
    /// `SANDBOX_DESKTOP_*`.
    pub limits: DesktopLimits,
}

impl std::fmt::Debug for SupervisorGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorGroups")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn err(e: ProviderError) -> DesktopError {
    DesktopError::Stack(format!("desktop control group: {e}"))
}

#[async_trait]
impl DesktopGroups for SupervisorGroups {
    async fn enter(&self, tag: &str, phase: Phase) -> Result<(), DesktopError> {
        let body = DesktopEnter {
            tag: tag.to_owned(),
            cpu_weight: self.limits.cpu_weight,
            memory_mb: self.limits.memory_mb,
            starting: self.limits.hold_starts && phase == Phase::Starting,
        };
        self.client
            .desktop_enter(&self.container, &group_name(tag), &body)
            .await
            .map_err(err)
    }

    async fn set_frozen(&self, tag: &str, frozen: bool) -> Result<(), DesktopError> {
        self.client
            .desktop_freeze(&self.container, &group_name(tag), frozen)
            .await
            .map_err(err)
    }

    async fn usage(&self, tag: &str) -> Result<Usage, DesktopError> {
        let u = self
            .client
            .desktop_usage(&self.container, &group_name(tag))
            .await
            .map_err(err)?;
        Ok(Usage {
            cpu_ns: u.cpu_ns,
            oom_kills: u.oom_kills,
            frozen: u.frozen,
        })
    }

    async fn remove(&self, tag: &str) -> Result<(), DesktopError> {
        self.client
            .desktop_remove(&self.container, &group_name(tag))
            .await
            .map_err(err)
    }

    fn memory_mb(&self) -> u64 {
        self.limits.memory_mb
    }
}
