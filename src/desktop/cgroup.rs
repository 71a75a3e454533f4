//! Control groups of desktops: one group per bot's display stack with a CPU weight, a memory
//! ceiling and a freezer, owned by the root process outside the computer. Two backends behind
//! one [`Node`]: v1 (a hierarchy per controller: `cpu.shares`, `memory.limit_in_bytes`,
//! `freezer.state`, `cpuacct.usage`) and v2 (one unified hierarchy: `cpu.weight`,
//! `memory.max`, `cgroup.freeze`, `cpu.stat`), detected from `/sys/fs/cgroup`.
//!
//! Where the cpuset controller can be used (its own v1 hierarchy, or enabled in v2), a group
//! can also be held to some of the machine's CPUs ([`Node::set_cpus`]); where it cannot, the
//! group runs on every CPU as before.
//!
//! A process started for a desktop on this host joins the group before its program starts
//! ([`Join`]), so it and everything it forks is born inside. Elsewhere (a machine reached
//! through commands) processes are moved in by their [`TAG_VAR`] (every process of a desktop
//! carries its screen's tag, and its children inherit both the tag and the group). Only the
//! owner of the group files (root) can move a process or change a limit; a process inside
//! never can.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
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
/// How long a tag scan keeps reading a young process whose environment reads empty.
const UNSETTLED_WAIT: Duration = Duration::from_millis(500);
/// How young a process with an empty environment must be to be read again.
const UNSETTLED_AGE: Duration = Duration::from_secs(5);

/// Why control groups cannot be used, or what failed.
#[derive(Debug, thiserror::Error)]
#[error("control groups: {0}")]
pub struct GroupError(pub String);

type GroupResult<T> = Result<T, GroupError>;

fn io_err(what: &str, path: &Path, e: std::io::Error) -> GroupError {
    GroupError(format!("{what} {}: {e}", path.display()))
}

/// One control-group file a process about to start writes its own pid into, so that it and
/// everything it forks is born in that group ([`Node::joins`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    /// The group directory's `cgroup.procs`.
    pub procs: PathBuf,
    /// Whether the start fails when the file refuses (a v1 cpuset part is the best the
    /// machine allows, as in [`Node::place`]).
    pub required: bool,
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
    /// v1: the group's directory in the cpuset hierarchy, where one is mounted.
    cpuset: Option<PathBuf>,
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
        let cpuset = v1_cpuset_root(root, version).map(|c| c.join(rel));
        Self {
            version,
            dirs,
            cpuset,
        }
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
        let cpuset = v1_cpuset_root(root, version).and_then(|c| {
            let rel = path_of(&|c: &str| c.split(',').any(|c| c == "cpuset"))?;
            Some(c.join(rel))
        });
        Ok(Self {
            version,
            dirs,
            cpuset,
        })
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
            cpuset: self.cpuset.as_ref().map(|d| d.join(name)),
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

    /// Every directory of the group (one per v1 controller, one for v2), and with v1 its
    /// cpuset directory where that was made.
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.dirs.clone();
        dirs.extend(self.cpuset.clone().filter(|d| d.is_dir()));
        dirs
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
        self.create_cpuset();
        Ok(())
    }

    /// Creates the group's cpuset part where the controller can be used; a machine where it
    /// cannot (not mounted, or read-only in a container) keeps every group on every CPU.
    fn create_cpuset(&self) {
        match (self.version, &self.cpuset) {
            (Version::V1, Some(dir)) => {
                // A v1 cpuset group takes no process until it has CPUs and memory nodes.
                let made = match std::fs::create_dir(dir) {
                    Ok(()) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
                };
                if let (true, Some(parent)) = (made, dir.parent()) {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let mine = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
                        if mine.trim().is_empty()
                            && let Ok(theirs) = std::fs::read_to_string(parent.join(file))
                        {
                            let _ = std::fs::write(dir.join(file), theirs.trim());
                        }
                    }
                }
            }
            (Version::V2, _) => {
                let Some(parent) = self.dirs[0].parent() else {
                    return;
                };
                let offered =
                    std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
                let enabled = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                    .unwrap_or_default();
                let has = |text: &str| text.split_whitespace().any(|c| c == "cpuset");
                if has(&offered) && !has(&enabled) {
                    let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpuset");
                }
            }
            (Version::V1, None) => {}
        }
    }

    /// The CPUs the group's parent may use, where the cpuset controller reaches the group.
    pub fn parent_cpus(&self) -> Option<Vec<u32>> {
        let (dir, file) = match self.version {
            Version::V1 => (self.cpuset.as_ref()?, "cpuset.effective_cpus"),
            Version::V2 => (&self.dirs[0], "cpuset.cpus.effective"),
        };
        let text = std::fs::read_to_string(dir.parent()?.join(file)).ok()?;
        parse_cpu_list(&text)
    }

    /// Holds the group to `cpus`, or (`None`) lets it use every CPU its parent may. Fails
    /// where the cpuset controller does not reach the group.
    pub fn set_cpus(&self, cpus: Option<&[u32]>) -> GroupResult<()> {
        let (dir, value) = match (self.version, cpus) {
            (Version::V1, _) => {
                let dir = self
                    .cpuset
                    .as_ref()
                    .ok_or_else(|| GroupError("the cpuset controller is not mounted".into()))?;
                let all = self
                    .parent_cpus()
                    .ok_or_else(|| GroupError("the parent's CPUs cannot be read".into()))?;
                (dir, format_cpu_list(cpus.unwrap_or(&all)))
            }
            // An empty list in v2 takes the parent's.
            (Version::V2, None) => (&self.dirs[0], String::new()),
            (Version::V2, Some(cpus)) => (&self.dirs[0], format_cpu_list(cpus)),
        };
        let path = dir.join("cpuset.cpus");
        std::fs::write(&path, value).map_err(|e| io_err("write", &path, e))
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

    /// Whether the group is a desktop at work: it holds processes, is not frozen and may use
    /// every CPU of its parent (it is not held as a starting one is, see [`hold_for_phase`]).
    pub fn is_at_work(&self) -> bool {
        let busy = self.procs().is_ok_and(|p| !p.is_empty());
        let held = match (self.version, &self.cpuset) {
            (Version::V1, Some(dir)) => {
                let mine = std::fs::read_to_string(dir.join("cpuset.cpus"))
                    .ok()
                    .and_then(|t| parse_cpu_list(&t));
                mine.is_some() && mine != self.parent_cpus()
            }
            (Version::V1, None) => false,
            (Version::V2, _) => std::fs::read_to_string(self.dirs[0].join("cpuset.cpus"))
                .is_ok_and(|t| !t.trim().is_empty()),
        };
        busy && !held && !self.is_frozen().unwrap_or(true)
    }

    /// The desktop groups ([`is_group_name`]) among this group's children, and with `depth`
    /// 2 among their children too.
    pub fn desktops(&self, depth: usize) -> Vec<Node> {
        let mut found = Vec::new();
        for name in self.child_names() {
            let child = self.child(&name);
            if is_group_name(&name) {
                found.push(child);
            } else if depth > 1 {
                found.extend(child.desktops(depth - 1));
            }
        }
        found
    }

    /// The processes in the group.
    pub fn procs(&self) -> GroupResult<Vec<u32>> {
        self.pids_in(match self.version {
            Version::V1 => "freezer",
            Version::V2 => "",
        })
    }

    /// The processes in the group's directory of `controller`.
    fn pids_in(&self, controller: &str) -> GroupResult<Vec<u32>> {
        Ok(self
            .read(controller, "cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Moves process `pid` (all its threads) into the group; one that is gone is not an error.
    pub fn place(&self, pid: u32) -> GroupResult<()> {
        for dir in &self.dirs {
            if !move_into(dir, pid)? {
                return Ok(());
            }
        }
        // The cpuset part is the best the machine allows (see `create_cpuset`).
        if let Some(dir) = self.cpuset.as_ref().filter(|d| d.is_dir()) {
            let _ = std::fs::write(dir.join("cgroup.procs"), pid.to_string());
        }
        Ok(())
    }

    /// What a process about to start writes its pid into to be born in the group: the files
    /// [`Self::place`] writes, in its order.
    pub fn joins(&self) -> Vec<Join> {
        let required = self.dirs.iter().map(|dir| Join {
            procs: dir.join("cgroup.procs"),
            required: true,
        });
        let cpuset = self.cpuset.iter().filter(|d| d.is_dir()).map(|dir| Join {
            procs: dir.join("cgroup.procs"),
            required: false,
        });
        required.chain(cpuset).collect()
    }

    /// v1: what a process about to start writes its pid into to have its CPU part born in the
    /// group ([`Self::place_cpu`]); written after [`Self::joins`] of another group, it leaves
    /// the process's other controllers there.
    pub fn cpu_join(&self) -> Join {
        Join {
            procs: self.dir("cpu").join("cgroup.procs"),
            required: true,
        }
    }

    /// v1: the processes in the group's directory of the `cpu` hierarchy, which may differ from
    /// [`Self::procs`] while a desktop starts ([`super::start_group`]).
    pub fn cpu_procs(&self) -> GroupResult<Vec<u32>> {
        self.pids_in("cpu")
    }

    /// v1: moves process `pid` (all its threads) into the group in the `cpu` hierarchy only (and
    /// in `cpuacct` where the two are mounted together); one that is gone is not an error.
    pub fn place_cpu(&self, pid: u32) -> GroupResult<()> {
        move_into(&self.dir("cpu"), pid).map(drop)
    }

    /// Moves every process carrying `tag` in [`TAG_VAR`], and every descendant of one (Chromium
    /// rewrites its helpers' environment area with their titles, so a zygote or renderer forked
    /// before the move shows no tag), into the group, among `candidates` (`None`: every process
    /// of this pid namespace). Scans until a pass finds none left out, so a child forked during
    /// a pass follows; a young process whose environment reads empty (one between changing its
    /// user and its next program, as `setpriv` is) is read again until it settles or
    /// [`UNSETTLED_WAIT`] passes. Returns how many were moved.
    pub fn place_tagged(
        &self,
        tag: &str,
        candidates: Option<&dyn Fn() -> Vec<u32>>,
    ) -> GroupResult<usize> {
        let want = format!("{TAG_VAR}={tag}");
        let started = Instant::now();
        let mut moved = 0;
        let mut passes = 0;
        while passes < PLACE_PASSES {
            let inside: HashSet<u32> = self.procs()?.into_iter().collect();
            let pids = match candidates {
                Some(list) => list(),
                None => all_pids(),
            };
            let parents: HashMap<u32, u32> = pids
                .iter()
                .filter_map(|p| Some((*p, parent_of(*p)?)))
                .collect();
            let mut unsettled = false;
            let mut members: HashSet<u32> = pids
                .iter()
                .copied()
                .filter(|p| {
                    inside.contains(p)
                        || match carries(*p, &want) {
                            Carries::Yes => true,
                            Carries::No => false,
                            Carries::Unsettled => {
                                unsettled = true;
                                false
                            }
                        }
                })
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
            if this_pass > 0 {
                passes += 1;
            } else if unsettled && started.elapsed() < UNSETTLED_WAIT {
                std::thread::sleep(Duration::from_millis(1));
            } else {
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
        starting_groups()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.dirs[0]);
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

/// Where a desktop is in its life, for the CPUs its group may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Its X server, window manager and browser are starting, until the browser's first page
    /// has settled: about a second of two busy cores for Chromium alone.
    Starting,
    /// Started.
    AtWork,
}

impl Phase {
    /// [`Phase::Starting`] when `starting`, else [`Phase::AtWork`].
    pub fn of(starting: bool) -> Self {
        if starting {
            Self::Starting
        } else {
            Self::AtWork
        }
    }
}

/// The desktop groups of this process said to be starting by their last [`hold_for_phase`],
/// by their first directory: a group holds processes, and so reads as at work, from its first
/// process on, before its own entry can hold it.
fn starting_groups() -> &'static Mutex<HashSet<PathBuf>> {
    static STARTING: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    STARTING.get_or_init(Mutex::default)
}

/// Sets the CPUs of desktop group `node` for `phase`, and keeps its phase for the others'
/// decisions. A desktop starting while another under `scope` (its desktops `depth` levels
/// down, see [`Node::desktops`]) is at work is held to every CPU of its parent but the first,
/// which stays free for the desktop at work: its X server's captures and its bot's calls then
/// never wait behind a starting browser. Only while the desktops starting under `scope`, this
/// one included, are no more than the CPUs they are held to: more would share those CPUs and
/// open later by more than the desktop at work gains (eight opened at once on 2 CPUs took 1.7
/// times as long held, BENCHMARKS.md); a desktop held before is then let go at its next
/// entry. Alone, or at work, a desktop uses every CPU. On a machine of one CPU, or where the
/// cpuset controller cannot be used, nothing is held. Answers whether the group is held.
pub fn hold_for_phase(node: &Node, scope: &Node, depth: usize, phase: Phase) -> bool {
    let starting = {
        let mut starting = starting_groups()
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match phase {
            Phase::Starting => starting.insert(node.dirs[0].clone()),
            Phase::AtWork => starting.remove(&node.dirs[0]),
        };
        starting.clone()
    };
    let held = match phase {
        Phase::AtWork => None,
        Phase::Starting => node
            .parent_cpus()
            .filter(|cpus| cpus.len() > 1)
            .filter(|cpus| {
                let others: Vec<Node> = scope
                    .desktops(depth)
                    .into_iter()
                    .filter(|d| d != node)
                    .collect();
                let (others_starting, others_at_work): (Vec<&Node>, Vec<&Node>) =
                    others.iter().partition(|d| starting.contains(&d.dirs[0]));
                others_starting.len() < cpus.len() - 1
                    && others_at_work.iter().any(|d| d.is_at_work())
            }),
    }
    .map(|cpus| cpus[1..].to_vec());
    match node.set_cpus(held.as_deref()) {
        Ok(()) => held.is_some(),
        Err(_) => false,
    }
}

/// The v1 cpuset hierarchy's root, where one is mounted.
fn v1_cpuset_root(root: &Path, version: Version) -> Option<PathBuf> {
    let dir = root.join("cpuset");
    (version == Version::V1 && dir.join("cgroup.procs").is_file()).then_some(dir)
}

/// The CPUs of a kernel CPU list (`0-3,6`); `None` for an empty or unreadable one.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
}

/// `cpus` as a kernel CPU list.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
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

/// Moves process `pid` into group directory `dir`; `false` when the process is gone.
fn move_into(dir: &Path, pid: u32) -> GroupResult<bool> {
    let path = dir.join("cgroup.procs");
    match std::fs::write(&path, pid.to_string()) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(ESRCH) => Ok(false),
        Err(e) => Err(io_err("move a process into", &path, e)),
    }
}

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

/// The fields of `/proc/<pid>/stat` after `pid (comm)`: the state first, the parent second,
/// the flags seventh, the start time twentieth (a process name may hold spaces and
/// parentheses, so the fields start after its last `)`). `None` for a process that is gone.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// Whether a process state of `/proc/<pid>/stat` is a zombie's or a dead process's.
fn is_dead_state(state: &str) -> bool {
    matches!(state, "Z" | "X" | "x")
}

/// The parent of process `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// When process `pid` started, in clock ticks since boot (`/proc/<pid>/stat`); `None` for a
/// process that is gone or a zombie. A pid and its start time name one process for good: a
/// pid the kernel hands out again comes with a later start.
pub fn started_at(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    if is_dead_state(fields.first()?) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// What process `pid`'s environment says of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carries {
    /// It holds the entry.
    Yes,
    /// It does not, or the process is gone, a kernel thread or a zombie.
    No,
    /// It reads empty or cut short in a process started moments ago: one that changed its
    /// user is not readable until its next program is loaded, and one caught loading its next
    /// program may read in part, so it is read again.
    Unsettled,
}

/// Whether process `pid`'s environment holds exactly `entry` (`NAME=value`).
fn carries(pid: u32, entry: &str) -> Carries {
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Err(_) => Carries::No,
        Ok(env) if env.split(|b| *b == 0).any(|v| v == entry.as_bytes()) => Carries::Yes,
        Ok(env) if environ_whole(&env) => Carries::No,
        Ok(_) if is_young_user_process(pid) => Carries::Unsettled,
        Ok(_) => Carries::No,
    }
}

/// Whether a process's environment as read is whole: it ends with its last entry's NUL. One
/// read while the process loads its next program can be empty or end inside an entry.
pub fn environ_whole(env: &[u8]) -> bool {
    env.last() == Some(&0)
}

/// Whether `pid` is a live user-space process started less than [`UNSETTLED_AGE`] ago.
fn is_young_user_process(pid: u32) -> bool {
    /// The kernel-thread bit of a process's flags.
    const PF_KTHREAD: u64 = 0x0020_0000;
    /// The clock ticks `/proc` counts in (USER_HZ, the same on every Linux ABI).
    const USER_HZ: f64 = 100.0;
    let Some(fields) = stat_fields(pid) else {
        return false;
    };
    let (Some(state), Some(flags), Some(start)) = (
        fields.first(),
        fields.get(6).and_then(|f| f.parse::<u64>().ok()),
        fields.get(19).and_then(|f| f.parse::<f64>().ok()),
    ) else {
        return false;
    };
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok());
    !is_dead_state(state)
        && flags & PF_KTHREAD == 0
        && uptime.is_some_and(|up| up - start / USER_HZ < UNSETTLED_AGE.as_secs_f64())
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
    fn an_environment_read_in_part_is_not_taken_for_whole() {
        assert!(environ_whole(b"PATH=/usr/bin\0LANG=C.UTF-8\0"));
        // Read while the process loads its next program: empty, or ending inside an entry.
        assert!(!environ_whole(b""));
        assert!(!environ_whole(b"PATH=/usr/local/bin:/usr/bin:/bi"));
    }

    #[test]
    fn a_process_is_named_by_its_start_until_it_ends() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let started = started_at(child.id()).expect("a running child has a start time");
        assert_eq!(started_at(child.id()), Some(started));
        assert!(started_at(std::process::id()).is_some_and(|own| own <= started));
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie names no running process.
        let deadline = Instant::now() + Duration::from_secs(5);
        while started_at(child.id()).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(started_at(child.id()), None);
        child.wait().unwrap();
        assert_eq!(started_at(child.id()), None);
    }

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
    fn reads_and_writes_cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("3,1,1"), Some(vec![1, 3]));
        assert_eq!(parse_cpu_list("\n"), None);
        assert_eq!(parse_cpu_list("1-x"), None);
        assert_eq!(format_cpu_list(&[1, 2, 5]), "1,2,5");
    }

    #[test]
    fn a_missing_hierarchy_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = detect(dir.path()).unwrap_err().to_string();
        assert!(err.contains("cpu, cpuacct, memory, freezer"), "{err}");
    }
}
