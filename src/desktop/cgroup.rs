//! Control groups of desktops: one group per bot's display stack with a CPU weight, a memory
//! ceiling and a freezer, owned by the root process outside the computer. Two backends behind
//! one [`Node`]: v1 (a hierarchy per controller: `cpu.shares`, `memory.limit_in_bytes`,
//! `freezer.state`, `cpuacct.usage`) and v2 (one unified hierarchy: `cpu.weight`,
//! `memory.max`, `cgroup.freeze`, `cpu.stat`), detected from `/sys/fs/cgroup`.
//!
//! Processes are moved in by their [`TAG_VAR`] (every process of a desktop carries its
//! screen's tag, and its children inherit both the tag and the group). Only the owner of the
//! group files (root) can move a process or change a limit; a process inside never can.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::command::TAG_VAR;

/// Where the control group file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The v1 controllers a desktop group needs, each its own hierarchy (or co-mounted).
const V1_CONTROLLERS: [&str; 4] = ["cpu", "cpuacct", "memory", "freezer"];
/// How long a freeze or thaw may take to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long removing a group waits for its last processes to be gone.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Passes of the tag scan: a process forked during a pass is found by the next.
const PLACE_PASSES: usize = 8;

/// Why control groups cannot be used, or what failed.
#[derive(Debug, thiserror::Error)]
#[error("control groups: {0}")]
pub struct GroupError(pub String);

type GroupResult<T> = Result<T, GroupError>;

fn io_err(what: &str, path: &Path, e: std::io::Error) -> GroupError {
    GroupError(format!("{what} {}: {e}", path.display()))
}

/// Which control group interface the machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller.
    V1,
    /// The unified hierarchy.
    V2,
}

impl Version {
    /// `v1` or `v2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

/// The limits of one desktop's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// CPU weight, 1 to 10000 (v2's scale; 100 is an equal share). v1 gets `weight * 1024 / 100`
    /// shares.
    pub cpu_weight: u32,
    /// Memory ceiling in bytes; 0 = none.
    pub memory_bytes: u64,
}

/// Usage read from a desktop's group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time used by its processes so far, in nanoseconds.
    pub cpu_ns: u64,
    /// How many of its processes the OOM killer took so far.
    pub oom_kills: u64,
    /// Whether it is frozen.
    pub frozen: bool,
}

/// Detects the interface at `root`: v2 when the unified hierarchy is mounted there, v1 when
/// every needed controller has its own mount.
pub fn detect(root: &Path) -> GroupResult<Version> {
    if root.join("cgroup.controllers").is_file() {
        return Ok(Version::V2);
    }
    let missing: Vec<&str> = V1_CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !root.join(c).join("cgroup.procs").is_file())
        .collect();
    if missing.is_empty() {
        Ok(Version::V1)
    } else {
        Err(GroupError(format!(
            "neither a v2 hierarchy nor the v1 controllers {} are mounted at {}",
            missing.join(", "),
            root.display()
        )))
    }
}

/// One group: a directory in each v1 controller's hierarchy (in [`V1_CONTROLLERS`] order), or
/// one v2 directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    version: Version,
    dirs: Vec<PathBuf>,
}

impl Node {
    /// The group at `rel` (the same path relative to each hierarchy's root).
    pub fn at(root: &Path, version: Version, rel: &str) -> Self {
        let rel = rel.trim_start_matches('/');
        let dirs = match version {
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| root.join(c).join(rel))
                .collect(),
            Version::V2 => vec![root.join(rel)],
        };
        Self { version, dirs }
    }

    /// The group this process runs in (with v1, its group in each controller's hierarchy).
    pub fn own(root: &Path, version: Version) -> GroupResult<Self> {
        Self::of_process(root, version, "self")
    }

    /// The group process `pid` (`self` for this one) runs in, as this process's cgroup
    /// namespace sees it (with v1, its group in each controller's hierarchy).
    pub fn of_process(root: &Path, version: Version, pid: &str) -> GroupResult<Self> {
        let file = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = std::fs::read_to_string(&file).map_err(|e| io_err("read", &file, e))?;
        let path_of = |wanted: &dyn Fn(&str) -> bool| {
            text.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                wanted(controllers).then(|| path.trim_start_matches('/').to_string())
            })
        };
        let missing = || GroupError(format!("the group of process {pid} is not listed"));
        let dirs = match version {
            Version::V2 => vec![root.join(path_of(&|c: &str| c.is_empty()).ok_or_else(missing)?)],
            Version::V1 => V1_CONTROLLERS
                .iter()
                .map(|name| {
                    let rel =
                        path_of(&|c: &str| c.split(',').any(|c| c == *name)).ok_or_else(missing)?;
                    Ok(root.join(name).join(rel))
                })
                .collect::<GroupResult<Vec<_>>>()?,
        };
        Ok(Self { version, dirs })
    }

    /// The interface of this group.
    pub fn version(&self) -> Version {
        self.version
    }

    /// A child group (not created yet).
    pub fn child(&self, name: &str) -> Self {
        Self {
            version: self.version,
            dirs: self.dirs.iter().map(|d| d.join(name)).collect(),
        }
    }

    /// The names of this group's child groups.
    pub fn child_names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir("freezer")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// The directory holding `controller`'s files (v2: the one directory).
    fn dir(&self, controller: &str) -> PathBuf {
        let i = match self.version {
            Version::V1 => V1_CONTROLLERS
                .iter()
                .position(|c| *c == controller)
                .unwrap_or(0),
            Version::V2 => 0,
        };
        self.dirs[i].clone()
    }

    /// Every directory of the group (one per v1 controller, one for v2).
    fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.clone()
    }

    fn write(&self, controller: &str, file: &str, value: &str) -> GroupResult<()> {
        let path = self.dir(controller).join(file);
        std::fs::write(&path, value).map_err(|e| io_err("write", &path, e))
    }

    fn read(&self, controller: &str, file: &str) -> GroupResult<String> {
        let path = self.dir(controller).join(file);
        std::fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))
    }

    /// Creates the group (an existing one is kept). With v2 the CPU and memory controllers are
    /// enabled for the parent's children first, which needs a parent without processes.
    pub fn create(&self) -> GroupResult<()> {
        if self.version == Version::V2
            && let Some(parent) = self.dir("").parent()
        {
            let control = parent.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&control).unwrap_or_default();
            let want: Vec<&str> = ["cpu", "memory"]
                .into_iter()
                .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
                .collect();
            if !want.is_empty() {
                let line = want.iter().map(|c| format!("+{c}")).collect::<Vec<_>>();
                std::fs::write(&control, line.join(" "))
                    .map_err(|e| io_err("write", &control, e))?;
            }
        }
        for dir in self.dirs() {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("create", &dir, e)),
            }
        }
        Ok(())
    }

    /// Sets the CPU weight and memory ceiling; swap is not available to the group where the
    /// kernel lets us say so, so a desktop over its ceiling meets the OOM killer.
    pub fn set_limits(&self, limits: Limits) -> GroupResult<()> {
        let weight = limits.cpu_weight.clamp(1, 10_000);
        match self.version {
            Version::V1 => {
                let shares = (u64::from(weight) * 1024 / 100).max(2);
                self.write("cpu", "cpu.shares", &shares.to_string())?;
                if limits.memory_bytes > 0 {
                    let bytes = limits.memory_bytes.to_string();
                    self.write("memory", "memory.limit_in_bytes", &bytes)?;
                    // Absent without swap accounting; the limit above is then the whole story.
                    let _ = self.write("memory", "memory.memsw.limit_in_bytes", &bytes);
                    let _ = self.write("memory", "memory.swappiness", "0");
                }
            }
            Version::V2 => {
                self.write("", "cpu.weight", &weight.to_string())?;
                if limits.memory_bytes > 0 {
                    self.write("", "memory.max", &limits.memory_bytes.to_string())?;
                    let _ = self.write("", "memory.swap.max", "0");
                }
            }
        }
        Ok(())
    }

    /// The processes in the group.
    pub fn procs(&self) -> GroupResult<Vec<u32>> {
        let controller = match self.version {
            Version::V1 => "freezer",
            Version::V2 => "",
        };
        Ok(self
            .read(controller, "cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Moves process `pid` (all its threads) into the group; one that is gone is not an error.
    pub fn place(&self, pid: u32) -> GroupResult<()> {
        for dir in self.dirs() {
            let path = dir.join("cgroup.procs");
            match std::fs::write(&path, pid.to_string()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(ESRCH) => return Ok(()),
                Err(e) => return Err(io_err("move a process into", &path, e)),
            }
        }
        Ok(())
    }

    /// Moves every process carrying `tag` in [`TAG_VAR`], and every descendant of one (Chromium
    /// rewrites its helpers' environment area with their titles, so a zygote or renderer forked
    /// before the move shows no tag), into the group, among `candidates` (`None`: every process
    /// of this pid namespace). Scans until a pass finds none left out, so a child forked during
    /// a pass follows. Returns how many were moved.
    pub fn place_tagged(
        &self,
        tag: &str,
        candidates: Option<&dyn Fn() -> Vec<u32>>,
    ) -> GroupResult<usize> {
        let want = format!("{TAG_VAR}={tag}");
        let mut moved = 0;
        for _ in 0..PLACE_PASSES {
            let inside: HashSet<u32> = self.procs()?.into_iter().collect();
            let pids = match candidates {
                Some(list) => list(),
                None => all_pids(),
            };
            let parents: HashMap<u32, u32> = pids
                .iter()
                .filter_map(|p| Some((*p, parent_of(*p)?)))
                .collect();
            let mut members: HashSet<u32> = pids
                .iter()
                .copied()
                .filter(|p| inside.contains(p) || carries(*p, &want))
                .collect();
            loop {
                let born: Vec<u32> = pids
                    .iter()
                    .copied()
                    .filter(|p| {
                        !members.contains(p)
                            && parents.get(p).is_some_and(|pp| members.contains(pp))
                    })
                    .collect();
                if born.is_empty() {
                    break;
                }
                members.extend(born);
            }
            let mut this_pass = 0;
            for pid in members.into_iter().filter(|p| !inside.contains(p)) {
                self.place(pid)?;
                this_pass += 1;
            }
            moved += this_pass;
            if this_pass == 0 {
                break;
            }
        }
        Ok(moved)
    }

    /// Freezes or thaws the group and waits until the kernel says it is done.
    pub fn set_frozen(&self, frozen: bool) -> GroupResult<()> {
        match self.version {
            Version::V1 => {
                let state = if frozen { "FROZEN" } else { "THAWED" };
                self.write("freezer", "freezer.state", state)?;
            }
            Version::V2 => {
                self.write("", "cgroup.freeze", if frozen { "1" } else { "0" })?;
            }
        }
        let started = Instant::now();
        loop {
            if self.is_frozen()? == frozen {
                return Ok(());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(GroupError(format!(
                    "the group did not {} in time",
                    if frozen { "freeze" } else { "thaw" }
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether the group is frozen (a freeze in progress is not yet).
    pub fn is_frozen(&self) -> GroupResult<bool> {
        Ok(match self.version {
            Version::V1 => self.read("freezer", "freezer.state")?.trim() == "FROZEN",
            Version::V2 => field(&self.read("", "cgroup.events")?, "frozen") == Some(1),
        })
    }

    /// CPU time, OOM kills and the frozen state of the group.
    pub fn usage(&self) -> GroupResult<Usage> {
        let (cpu_ns, oom_kills) = match self.version {
            Version::V1 => (
                self.read("cpuacct", "cpuacct.usage")?
                    .trim()
                    .parse()
                    .unwrap_or(0),
                field(&self.read("memory", "memory.oom_control")?, "oom_kill").unwrap_or(0),
            ),
            Version::V2 => (
                field(&self.read("", "cpu.stat")?, "usage_usec").unwrap_or(0) * 1000,
                field(&self.read("", "memory.events")?, "oom_kill").unwrap_or(0),
            ),
        };
        Ok(Usage {
            cpu_ns,
            oom_kills,
            frozen: self.is_frozen()?,
        })
    }

    /// Thaws and removes the group once its processes are gone (they were stopped before);
    /// a group already gone is fine.
    pub fn remove(&self) -> GroupResult<()> {
        if !self.dir("freezer").exists() {
            return Ok(());
        }
        let _ = self.set_frozen(false);
        let started = Instant::now();
        loop {
            let mut busy = None;
            for dir in self.dirs() {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => busy = Some(io_err("remove", &dir, e)),
                }
            }
            match busy {
                None => return Ok(()),
                Some(e) if started.elapsed() > REMOVE_TIMEOUT => return Err(e),
                Some(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Removes the empty child groups of this one whose names start with `prefix` and whose
    /// owner (the process id after the prefix) is gone, deepest first. Busy ones stay.
    pub fn remove_stale_children(&self, prefix: &str) {
        let Ok(entries) = std::fs::read_dir(self.dir("freezer")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(prefix)
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            let stale = self.child(&name);
            stale.remove_tree();
        }
    }

    fn remove_tree(&self) {
        if let Ok(entries) = std::fs::read_dir(self.dir("freezer")) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    self.child(&entry.file_name().to_string_lossy())
                        .remove_tree();
                }
            }
        }
        for dir in self.dirs() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The number after `name ` on its own line of a flat-keyed control file.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// `ESRCH` on Linux: the process is gone.
const ESRCH: i32 = 3;

/// Every process id of this pid namespace.
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The parent of process `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether process `pid`'s environment holds exactly `entry` (`NAME=value`).
fn carries(pid: u32, entry: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
}

/// The group name of the desktop whose processes carry `tag`: short and free of the tag's
/// path characters.
pub fn group_name(tag: &str) -> String {
    use sha2::{Digest, Sha256};
    format!(
        "desktop-{}",
        hex::encode(&Sha256::digest(tag.as_bytes())[..6])
    )
}

/// Whether `name` is one [`group_name`] gives.
pub fn is_group_name(name: &str) -> bool {
    name.strip_prefix("desktop-").is_some_and(|h| {
        h.len() == 12
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flat_keyed_fields() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(field(text, "oom_kill"), Some(3));
        assert_eq!(field(text, "under_oom"), Some(0));
        assert_eq!(field(text, "oom"), None);
    }

    #[test]
    fn group_names_are_stable_and_plain() {
        let a = group_name("/data/run/desktop/abc/screen-1");
        assert_eq!(a, group_name("/data/run/desktop/abc/screen-1"));
        assert_ne!(a, group_name("/data/run/desktop/abc/screen-2"));
        assert!(a.starts_with("desktop-") && a.len() == 20);
        assert!(!a.contains('/'));
        assert!(is_group_name(&a));
        for bad in [
            "desktop-",
            "desktop-../../../x",
            "desktop-ABCDEF123456",
            "other-0123456789ab",
        ] {
            assert!(!is_group_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_missing_hierarchy_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = detect(dir.path()).unwrap_err().to_string();
        assert!(err.contains("cpu, cpuacct, memory, freezer"), "{err}");
    }
}
