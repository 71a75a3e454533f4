//! Per-desktop control groups inside computer containers: one child group per bot's display
//! stack nested under the container's own groups (found from its first process), with the
//! host provider's [`Node`] doing the work: CPU weight, memory ceiling, freezer, usage.
//!
//! Only this process (root on the Docker host) writes them. Inside the container the control
//! group file system is mounted read-only and owned by root, so uid 1000 can neither leave its
//! desktop's group, nor lift its limits or thaw it, nor join another desktop's group. With
//! cgroup v2 a container's group holds processes (every `docker exec` lands there), so it
//! cannot have child groups with controllers: desktops of Docker computers get groups with
//! cgroup v1 only, and health says so otherwise.

use std::collections::HashSet;
use std::path::Path;

use crate::desktop::cgroup::{self, CGROUP_ROOT, Limits, Node, Phase, Usage, Version};

use super::engine::EngineError;
use super::wire::DesktopEnter;

/// Whether this Docker host gives computers' desktops their own control groups.
#[derive(Clone, Debug)]
pub struct Desktops {
    state: Result<Version, String>,
}

impl Desktops {
    /// Looks at the machine's control groups once: v1 with the cpu, cpuacct, memory and
    /// freezer controllers, writable by this process.
    pub fn detect() -> Self {
        let root = Path::new(CGROUP_ROOT);
        let state = match cgroup::detect(root) {
            Ok(Version::V1) if !rustix::process::geteuid().is_root() => {
                Err("the supervisor does not run as root".to_string())
            }
            Ok(Version::V1) => Ok(Version::V1),
            Ok(Version::V2) => Err(
                "cgroup v2: a container's own group holds its processes and cannot delegate child groups with controllers"
                    .to_string(),
            ),
            Err(e) => Err(e.0),
        };
        match &state {
            Ok(v) => tracing::info!(cgroup = v.as_str(), "supervisor.desktops.active"),
            Err(why) => tracing::warn!(error = %why, "supervisor.desktops.unavailable"),
        }
        Self { state }
    }

    /// Never delegates (for tests of the unavailable path).
    pub fn unavailable(why: &str) -> Self {
        Self {
            state: Err(why.to_owned()),
        }
    }

    /// `active (cgroup v1)` or `unavailable: <why>`.
    pub fn describe(&self) -> String {
        match &self.state {
            Ok(v) => format!("active (cgroup {})", v.as_str()),
            Err(why) => format!("unavailable: {why}"),
        }
    }

    /// Whether desktops get groups.
    pub fn active(&self) -> bool {
        self.state.is_ok()
    }

    /// The groups of the container whose first process is `pid`.
    fn container(&self, pid: u32) -> Result<Node, EngineError> {
        let version = self.state.clone().map_err(EngineError::DesktopGroups)?;
        Node::of_process(Path::new(CGROUP_ROOT), version, &pid.to_string()).map_err(group_err)
    }

    /// The group `name` of the container whose first process is `pid`.
    fn desktop(&self, pid: u32, name: &str) -> Result<Node, EngineError> {
        if !cgroup::is_group_name(name) {
            return Err(EngineError::Invalid("bad desktop name".into()));
        }
        Ok(self.container(pid)?.child(name))
    }

    /// Creates the desktop's group with its limits if missing and moves the container's
    /// processes carrying the desktop's tag (and their descendants) into it.
    pub fn enter(&self, pid: u32, name: &str, body: &DesktopEnter) -> Result<usize, EngineError> {
        if cgroup::group_name(&body.tag) != name {
            return Err(EngineError::Invalid(
                "the tag does not name this desktop".into(),
            ));
        }
        if !(1..=10_000).contains(&body.cpu_weight) {
            return Err(EngineError::Invalid("cpuWeight is 1 to 10000".into()));
        }
        let container = self.container(pid)?;
        let node = container.child(name);
        node.create().map_err(group_err)?;
        node.set_limits(Limits {
            cpu_weight: body.cpu_weight,
            memory_bytes: body.memory_mb.saturating_mul(1024 * 1024),
        })
        .map_err(group_err)?;
        cgroup::hold_for_phase(&node, &container, 1, Phase::of(body.starting));
        // Only processes of this container: those in its own group, and this desktop's.
        let candidates: &dyn Fn() -> Vec<u32> = &|| {
            let mut pids: HashSet<u32> =
                container.procs().unwrap_or_default().into_iter().collect();
            pids.extend(node.procs().unwrap_or_default());
            pids.into_iter().collect()
        };
        node.place_tagged(&body.tag, Some(candidates))
            .map_err(group_err)
    }

    /// Freezes or thaws a desktop.
    pub fn set_frozen(&self, pid: u32, name: &str, frozen: bool) -> Result<(), EngineError> {
        let node = self.existing(pid, name)?;
        node.set_frozen(frozen).map_err(group_err)
    }

    /// CPU time, OOM kills and the frozen state of a desktop.
    pub fn usage(&self, pid: u32, name: &str) -> Result<Usage, EngineError> {
        self.existing(pid, name)?.usage().map_err(group_err)
    }

    /// Removes a desktop's group once its processes are gone (a missing one is fine).
    pub fn remove(&self, pid: u32, name: &str) -> Result<(), EngineError> {
        self.desktop(pid, name)?.remove().map_err(group_err)
    }

    /// Thaws every desktop of the container, so stopping it can end their processes.
    pub fn thaw_all(&self, pid: u32) {
        let Ok(container) = self.container(pid) else {
            return;
        };
        for name in container.child_names() {
            if cgroup::is_group_name(&name)
                && let Err(e) = container.child(&name).set_frozen(false)
            {
                tracing::warn!(error = %e, "supervisor.desktops.thaw_failed");
            }
        }
    }

    fn existing(&self, pid: u32, name: &str) -> Result<Node, EngineError> {
        let node = self.desktop(pid, name)?;
        if node.procs().is_err() {
            return Err(EngineError::Invalid("no such desktop group".into()));
        }
        Ok(node)
    }
}

fn group_err(e: cgroup::GroupError) -> EngineError {
    EngineError::Group(e.to_string())
}
