//! What a desktop runtime asks of whoever owns its desktops' control groups ([`DesktopGroups`]),
//! and the owner for desktops on this host ([`HostGroups`]: child groups of a `rakazo-<pid>`
//! group this process creates under its own).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use rakazo_actors::provider::{DesktopFreeze, ProviderRef};

use super::DesktopError;
use super::cgroup::{self, GroupError, Join, Limits, Node, Phase, Usage, Version};
use super::runtime::DesktopRuntime;
use super::start_group;

/// Per-desktop control group settings (`SANDBOX_DESKTOP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DesktopLimits {
    /// CPU weight of each desktop's group (1 to 10000; 100 is an equal share).
    pub cpu_weight: u32,
    /// Memory ceiling of each desktop's group in MiB; 0 = none.
    pub memory_mb: u64,
    /// Freeze a desktop with no tool call, viewer or control for this long; `None` = never.
    pub freeze_after: Option<Duration>,
    /// Hold a starting desktop off the first CPU while another is at work
    /// ([`cgroup::hold_for_phase`]); the runtime always does, benches compare without.
    pub hold_starts: bool,
}

impl DesktopLimits {
    /// The group limits.
    pub fn limits(&self) -> Limits {
        Limits {
            cpu_weight: self.cpu_weight,
            memory_bytes: self.memory_mb * 1024 * 1024,
        }
    }
}

/// The owner of a machine's desktop groups. A desktop is named by its processes' tag.
#[async_trait]
pub trait DesktopGroups: Send + Sync + std::fmt::Debug {
    /// Creates the desktop's group with its limits if missing, gives it the CPUs of its
    /// `phase` ([`cgroup::hold_for_phase`]), and moves every process carrying `tag` into it.
    async fn enter(&self, tag: &str, phase: Phase) -> Result<(), DesktopError>;
    /// [`Self::enter`] for a desktop whose every process was born in its group: the group is
    /// made ready for `phase` (created with its limits, its CPUs, what is in it weighed for
    /// the phase) without looking for processes outside it. Answers the files a process
    /// about to start for the desktop on this host joins the group by ([`Join`]); `None` where
    /// this owner cannot place a process at birth, whose processes [`Self::enter`] finds by
    /// their tag.
    async fn prepare(&self, _tag: &str, _phase: Phase) -> Result<Option<Vec<Join>>, DesktopError> {
        Ok(None)
    }
    /// Freezes or thaws the desktop's processes.
    async fn set_frozen(&self, tag: &str, frozen: bool) -> Result<(), DesktopError>;
    /// CPU time, OOM kills and frozen state of the desktop's group.
    async fn usage(&self, tag: &str) -> Result<Usage, DesktopError>;
    /// Removes the desktop's group (its processes were stopped).
    async fn remove(&self, tag: &str) -> Result<(), DesktopError>;
    /// The memory ceiling in MiB (0 = none), for what a bot is told.
    fn memory_mb(&self) -> u64;
    /// Whether a starting desktop is weighed low until it is at work ([`super::start_group`]).
    fn lowers_starts(&self) -> bool {
        false
    }
}

/// Passes `runtime`'s freezes and thaws on to a provider's channel as `machine`'s, for as long
/// as the runtime lives.
pub fn forward_freezes(
    runtime: &DesktopRuntime,
    to: tokio::sync::broadcast::Sender<DesktopFreeze>,
    machine: ProviderRef,
) {
    let mut changes = runtime.subscribe_freezes();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match changes.recv().await {
                Ok(c) => {
                    let _ = to.send(DesktopFreeze {
                        machine: machine.clone(),
                        bot_id: c.bot_id,
                        frozen: c.frozen,
                    });
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => break,
            }
        }
    });
}

fn err(e: GroupError) -> DesktopError {
    DesktopError::Stack(e.to_string())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GroupError> + Send + 'static,
) -> Result<T, DesktopError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DesktopError::Stack(format!("control group task: {e}")))?
        .map_err(err)
}

/// The group of this process under which every host desktop group lives, created once:
/// `<own group>/rakazo-<pid>` with v1; `rakazo/server-<pid>` at the root with v2 (a group with
/// processes, as this process's own is, cannot have child groups with controllers there).
pub fn host_parent() -> Result<Node, GroupError> {
    static PARENT: std::sync::OnceLock<Result<Node, String>> = std::sync::OnceLock::new();
    PARENT
        .get_or_init(|| {
            let root = std::path::Path::new(cgroup::CGROUP_ROOT);
            let version = cgroup::detect(root).map_err(|e| e.to_string())?;
            let base = match version {
                Version::V1 => Node::own(root, version).map_err(|e| e.to_string())?,
                Version::V2 => {
                    let base = Node::at(root, version, "rakazo");
                    base.create().map_err(|e| e.to_string())?;
                    base
                }
            };
            let prefix = if version == Version::V1 {
                "rakazo-"
            } else {
                "server-"
            };
            base.remove_stale_children(prefix);
            let parent = base.child(&format!("{prefix}{}", std::process::id()));
            parent.create().map_err(|e| e.to_string())?;
            Ok(parent)
        })
        .clone()
        .map_err(GroupError)
}

/// Desktop groups of one host machine: `<host parent>/<machine>/<desktop>`.
#[derive(Debug)]
pub struct HostGroups {
    /// Every machine's group on this host: the desktops a starting one makes room for.
    host: Node,
    machine: Node,
    limits: DesktopLimits,
    /// Where a starting desktop's CPU part is weighed ([`super::start_group`]), if anywhere.
    starting: Option<Node>,
}

impl HostGroups {
    /// The groups of machine `name` (a short plain name), creating its group. With
    /// `start_nice` above 0, a starting desktop weighs as a thread that many steps below this
    /// process's priority until it is at work, where the host allows it ([`super::start_group`]).
    pub fn new(name: &str, limits: DesktopLimits, start_nice: u8) -> Result<Arc<Self>, GroupError> {
        let host = host_parent()?;
        let machine = host.child(name);
        machine.create()?;
        let starting = match start_nice {
            0 => None,
            nice => start_group::host_group(start_group::weight_of_nice(nice))?,
        };
        Ok(Arc::new(Self {
            host,
            machine,
            limits,
            starting,
        }))
    }

    /// The group of the desktop tagged `tag`.
    pub fn node(&self, tag: &str) -> Node {
        self.machine.child(&cgroup::group_name(tag))
    }

    /// Removes the machine's group (its desktops' groups were removed).
    pub fn remove_machine(&self) {
        let _ = self.machine.remove();
    }

    /// Makes the group of the desktop tagged `tag` ready for `phase`, first moving in every
    /// process carrying the tag when `search`; answers how a process about to start joins it.
    async fn ready(
        &self,
        tag: &str,
        phase: Phase,
        search: bool,
    ) -> Result<Vec<Join>, DesktopError> {
        let (node, limits, tag) = (self.node(tag), self.limits.limits(), tag.to_owned());
        let (host, hold) = (self.host.clone(), self.limits.hold_starts);
        let starting = self.starting.clone();
        blocking(move || {
            node.create()?;
            node.set_limits(limits)?;
            if hold {
                // Host parent, machine, desktop.
                cgroup::hold_for_phase(&node, &host, 2, phase);
            }
            if search {
                node.place_tagged(&tag, None)?;
            }
            match &starting {
                Some(low) => {
                    start_group::weigh_for_phase(&node, low, phase)?;
                    Ok(start_group::joins_for_phase(&node, low, phase))
                }
                None => Ok(node.joins()),
            }
        })
        .await
    }
}

#[async_trait]
impl DesktopGroups for HostGroups {
    async fn enter(&self, tag: &str, phase: Phase) -> Result<(), DesktopError> {
        self.ready(tag, phase, true).await.map(drop)
    }

    async fn prepare(&self, tag: &str, phase: Phase) -> Result<Option<Vec<Join>>, DesktopError> {
        self.ready(tag, phase, false).await.map(Some)
    }

    async fn set_frozen(&self, tag: &str, frozen: bool) -> Result<(), DesktopError> {
        let node = self.node(tag);
        blocking(move || node.set_frozen(frozen)).await
    }

    async fn usage(&self, tag: &str) -> Result<Usage, DesktopError> {
        let node = self.node(tag);
        blocking(move || node.usage()).await
    }

    async fn remove(&self, tag: &str) -> Result<(), DesktopError> {
        let node = self.node(tag);
        blocking(move || node.remove()).await
    }

    fn memory_mb(&self) -> u64 {
        self.limits.memory_mb
    }

    fn lowers_starts(&self) -> bool {
        self.starting.is_some()
    }
}
