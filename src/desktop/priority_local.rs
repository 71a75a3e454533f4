//! Raising a desktop's processes back to the runtime's CPU priority once its start is over, by
//! system calls in this process, for desktops on this host ([`super::browser::Launch::start_only`]).
//!
//! A start lowered only while it lasts keeps a starting browser from slowing the other bots'
//! observations, then gives the desktop the priority every desktop has. Raising a priority
//! needs `CAP_SYS_NICE` ([`may_raise`]); the programs of the desktop, run without it, cannot
//! raise their own. Only threads of the named process groups whose nice value is above this
//! process's are touched, and only to this process's: never above the runtime's priority. A
//! process of the bot cannot join those groups (each is a session's own group, and `setpgid`
//! stays inside a session).
//!
//! A lowered start beside CPU-heavy work at normal priority would wait for that work to end, so
//! a start is also watched while it lasts ([`super::start_watch::StartWatch`]): once its browser
//! waits for a CPU most of the time, it is raised at once.

use std::collections::HashSet;
use std::fs;
use std::sync::OnceLock;

use rustix::process::{Pid, getpriority_process, setpriority_process};

/// `CAP_SYS_NICE`'s bit in the capability sets.
const CAP_SYS_NICE: u32 = 23;

/// Whether this process may raise other processes' CPU priority (`CAP_SYS_NICE` in its
/// effective set, read once from `/proc/self/status`).
pub fn may_raise() -> bool {
    static MAY: OnceLock<bool> = OnceLock::new();
    *MAY.get_or_init(|| {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
                u64::from_str_radix(hex.trim(), 16).ok()
            })
            .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
    })
}

/// The process group and nice value of a process or thread, from its `stat` line (the fifth
/// and the nineteenth field; the name, second, may hold spaces and parentheses).
fn group_and_nice(stat: &str) -> Option<(u32, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state, ppid, pgrp (index 2), ..., nice (index 16).
    Some((fields.get(2)?.parse().ok()?, fields.get(16)?.parse().ok()?))
}

fn numbered(dir: &str) -> Vec<u32> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// One pass: every thread of a process in `groups` whose nice value is above `to` set to `to`.
/// Returns how many were raised.
fn raise_pass(groups: &HashSet<u32>, to: i32) -> usize {
    let mut raised = 0;
    for pid in numbered("/proc") {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if !group_and_nice(&stat).is_some_and(|(group, _)| groups.contains(&group)) {
            continue;
        }
        for tid in numbered(&format!("/proc/{pid}/task")) {
            let Some(tid) = Pid::from_raw(tid as i32) else {
                continue;
            };
            // Asked of the thread itself: `stat` may be a moment old.
            if getpriority_process(Some(tid)).is_ok_and(|nice| nice > to)
                && setpriority_process(Some(tid), to).is_ok()
            {
                raised += 1;
            }
        }
    }
    raised
}

/// Raises every thread of the processes in `groups` whose nice value is above this process's
/// to this process's, and the scheduling group (autogroup) of each group's session to 0 where
/// the kernel has them (each group here leads its own session). A second pass catches threads
/// started by a thread before it was raised. Returns how many threads were raised; 0 without
/// the capability.
pub fn raise(groups: &[u32]) -> usize {
    let groups: HashSet<u32> = groups.iter().copied().filter(|g| *g > 1).collect();
    let Ok(own) = getpriority_process(None) else {
        return 0;
    };
    if groups.is_empty() {
        return 0;
    }
    for group in &groups {
        // Absent without autogroups; refused without the capability (then nothing is raised).
        let _ = fs::write(format!("/proc/{group}/autogroup"), "0");
    }
    let first = raise_pass(&groups, own);
    first + raise_pass(&groups, own)
}

/// [`raise`] on the blocking pool: what a lowered start's end or its starvation runs.
pub async fn raise_off_thread(groups: Vec<u32>) -> usize {
    tokio::task::spawn_blocking(move || raise(&groups))
        .await
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desktop::start_watch::StartWatch;
    use std::process::Command;

    #[test]
    fn a_stat_line_gives_its_group_and_nice_value() {
        let stat =
            "4242 (a (b) c) S 1 4240 4240 0 -1 4194560 10 0 0 0 0 0 0 0 30 10 1 0 100 1000 10";
        assert_eq!(group_and_nice(stat), Some((4240, 10)));
        assert_eq!(group_and_nice("4242 (x) S 1"), None);
    }

    fn nice_of(pid: u32) -> i32 {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        group_and_nice(&stat).unwrap().1
    }

    /// A lowered process in a session of its own, with a second thread (a `sleep` in a
    /// subshell shares its group; `python3` starts a thread).
    fn lowered_session() -> std::process::Child {
        Command::new("setsid")
            .args([
                "nice",
                "-n",
                "10",
                "python3",
                "-c",
                "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\ntime.sleep(30)",
            ])
            .spawn()
            .unwrap()
    }

    /// A process in a session of its own running `sh -c script` at `nice` (its scheduling
    /// group too, where the kernel has them).
    fn busy_session(nice: u8) -> std::process::Child {
        Command::new("setsid")
            .args([
                "sh",
                "-c",
                &format!(
                    "echo {nice} > /proc/self/autogroup 2>/dev/null; exec nice -n {nice} sh -c 'while :; do :; done'"
                ),
            ])
            .spawn()
            .unwrap()
    }

    #[tokio::test]
    async fn a_starved_start_is_raised_while_it_lasts() {
        if !may_raise() {
            eprintln!("raising priorities needs CAP_SYS_NICE: checked only where it is held");
            return;
        }
        let own = getpriority_process(None).unwrap();
        let mut start = busy_session(15);
        let pid = start.id();
        // One CPU-bound loop at normal priority per CPU, and one more.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut loops: Vec<_> = (0..=cpus).map(|_| busy_session(0)).collect();
        // The shell that lowers itself, then the loop it becomes.
        let mut lowered = false;
        for _ in 0..200 {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.contains("(sh)") && group_and_nice(&stat).is_some_and(|(_, n)| n > own) {
                lowered = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(lowered, "the start never ran lowered");
        let _watch = StartWatch::new(pid, 0, "bot".into(), Box::pin(raise_off_thread(vec![pid])));
        let mut raised = false;
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if nice_of(pid) == own {
                raised = true;
                break;
            }
        }
        for child in loops.iter_mut().chain([&mut start]) {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(raised, "a starved start stayed lowered");
    }

    #[test]
    fn raised_groups_run_at_the_runtimes_priority_again_and_others_stay() {
        if !may_raise() {
            eprintln!("raising priorities needs CAP_SYS_NICE: checked only where it is held");
            assert_eq!(raise(&[std::process::id()]), 0);
            return;
        }
        let mut target = lowered_session();
        let mut other = lowered_session();
        let (t, o) = (target.id(), other.id());
        // Both have their second thread once python runs it.
        for _ in 0..200 {
            if numbered(&format!("/proc/{t}/task")).len() >= 2
                && numbered(&format!("/proc/{o}/task")).len() >= 2
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let own = getpriority_process(None).unwrap();
        assert_eq!(nice_of(t), (own + 10).min(19));
        let raised = raise(&[t]);
        assert!(raised >= 2, "raised {raised} threads");
        for tid in numbered(&format!("/proc/{t}/task")) {
            assert_eq!(
                getpriority_process(Pid::from_raw(tid as i32)).unwrap(),
                own,
                "thread {tid}"
            );
        }
        if let Ok(group) = fs::read_to_string(format!("/proc/{t}/autogroup")) {
            assert!(group.trim().ends_with("nice 0"), "{group}");
        }
        // Another session's process is left as it was.
        assert_eq!(nice_of(o), (own + 10).min(19));
        for child in [&mut target, &mut other] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
