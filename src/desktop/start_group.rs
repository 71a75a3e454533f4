//! A starting desktop weighed low against everything else on this host (cgroup v1): while its
//! browser starts, the CPU part of its processes sits in one group beside this process's own,
//! of a low weight, so the runtime's captures and the desktops at work keep the CPUs; once the
//! desktop is at work, or its start starves ([`super::start_watch::StartWatch`]), the CPU part
//! goes back to the desktop's own group.
//!
//! A desktop's own group weighs only against the other desktops: the whole tree of desktop
//! groups weighs as one against the runtime's threads, whatever the weights inside it
//! (BENCHMARKS.md, "what CPU priority can do"). The low group is that tree's sibling. With v2
//! a process moves with its memory, freezer and CPU together, and its memory charge would stay
//! behind, so only v1 gets this.

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use super::cgroup::{self, GroupError, Join, Limits, Node, Phase, Version};

/// Name of the low group, followed by this process's id.
const PREFIX: &str = "rakazo-start-";
/// Passes of a move: a process forked during one is moved by the next.
const PASSES: usize = 8;

/// The CPU weight (v2's scale, where 100 is a thread at nice 0) the kernel gives a thread at
/// nice value `nice` (0 to 19): its table of weights by nice value, over 1024.
pub fn weight_of_nice(nice: u8) -> u32 {
    const WEIGHTS: [u32; 20] = [
        1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
    ];
    (WEIGHTS[usize::from(nice.min(19))] * 100 / 1024).max(1)
}

/// The group the starting desktops of this host share, `<this process's group>/rakazo-start-<pid>`,
/// made once (those of ended processes removed first), its weight set to `weight`. `None` with
/// v2 (see the module's doc).
pub fn host_group(weight: u32) -> Result<Option<Node>, GroupError> {
    static GROUP: OnceLock<Result<Option<Node>, String>> = OnceLock::new();
    let group = GROUP
        .get_or_init(|| {
            let root = Path::new(cgroup::CGROUP_ROOT);
            let version = cgroup::detect(root).map_err(|e| e.to_string())?;
            if version != Version::V1 {
                return Ok(None);
            }
            let own = Node::own(root, version).map_err(|e| e.to_string())?;
            own.remove_stale_children(PREFIX);
            let group = own.child(&format!("{PREFIX}{}", std::process::id()));
            group.create().map_err(|e| e.to_string())?;
            Ok(Some(group))
        })
        .clone()
        .map_err(GroupError)?;
    if let Some(group) = &group {
        group.set_limits(Limits {
            cpu_weight: weight,
            memory_bytes: 0,
        })?;
    }
    Ok(group)
}

/// Puts the CPU part of desktop `node`'s processes where `phase` weighs it: in `low` while it
/// starts, in its own group at work. Its other controllers stay in its own group throughout,
/// and a process it forks is born where its parent is. Passes repeat while one moved any.
/// Answers how many processes moved.
pub fn weigh_for_phase(node: &Node, low: &Node, phase: Phase) -> Result<usize, GroupError> {
    let (from, to) = match phase {
        Phase::Starting => (node, low),
        Phase::AtWork => (low, node),
    };
    let mut moved = 0;
    for _ in 0..PASSES {
        let desktop: HashSet<u32> = node.procs()?.into_iter().collect();
        let away: Vec<u32> = from
            .cpu_procs()?
            .into_iter()
            .filter(|pid| desktop.contains(pid))
            .collect();
        if away.is_empty() {
            break;
        }
        for pid in &away {
            to.place_cpu(*pid)?;
        }
        moved += away.len();
    }
    Ok(moved)
}

/// What a process about to start for desktop `node` writes its pid into to be born where
/// `phase` weighs it ([`weigh_for_phase`]): the desktop's own group, then, while it starts,
/// `low` for its CPU part.
pub fn joins_for_phase(node: &Node, low: &Node, phase: Phase) -> Vec<Join> {
    let mut joins = node.joins();
    if phase == Phase::Starting {
        joins.push(low.cpu_join());
    }
    joins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nice_value_weighs_as_the_kernel_weighs_it() {
        assert_eq!(weight_of_nice(0), 100);
        assert_eq!(weight_of_nice(10), 10);
        assert_eq!(weight_of_nice(19), 1);
        assert_eq!(weight_of_nice(40), 1);
    }
}
