//! PSS of a desktop's processes: every process tagged for a runtime and the whole process trees
//! under them (Chromium's helpers do not inherit the tag).

use rakazo::desktop::command::TAG_VAR;

/// Parent of every process on the host.
pub fn parents() -> std::collections::HashMap<u32, u32> {
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
            out.insert(pid, ppid);
        }
    }
    out
}

pub fn tagged(pid: u32, want: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|environ| {
            environ
                .split(|&b| b == 0)
                .any(|v| v.starts_with(want.as_bytes()))
        })
        .unwrap_or(false)
}

pub fn pss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|rollup| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// PSS in KiB of the processes whose runtime tag starts with `prefix`: (tagged processes
/// only, their count; the whole process trees under them, their count). Chromium's helper
/// processes do not inherit the tag, so only the trees count every process of a desktop.
pub fn pss_kib(prefix: &str) -> ((u64, usize), (u64, usize)) {
    let want = format!("{TAG_VAR}={prefix}");
    let parents = parents();
    let roots: std::collections::HashSet<u32> = parents
        .keys()
        .copied()
        .filter(|&p| tagged(p, &want))
        .collect();
    let in_tree = |mut pid: u32| loop {
        if roots.contains(&pid) {
            return true;
        }
        match parents.get(&pid) {
            Some(&parent) if parent > 1 && parent != pid => pid = parent,
            _ => return false,
        }
    };
    let tree: Vec<u32> = parents.keys().copied().filter(|&p| in_tree(p)).collect();
    let tagged_kib = roots.iter().map(|&p| pss_of(p)).sum();
    let tree_kib = tree.iter().map(|&p| pss_of(p)).sum();
    ((tagged_kib, roots.len()), (tree_kib, tree.len()))
}
