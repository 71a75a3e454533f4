//! Whether a coding agent CLI (Codex, Claude Code, OpenCode) is writing its session files in
//! the workspace: the one activity that lifts the uptime cap without holding a lease.
//!
//! Each CLI appends to session files under its own directory of the home. A look lists those
//! directories through the provider (names and sizes, bounded) and reduces them to a
//! fingerprint; [`AgentWatch`] remembers when the fingerprint last changed, by the runtime's
//! clock. An agent waiting at its prompt writes nothing, so its fingerprint stays the same and
//! it does not hold the computer. Listing sizes rather than file times works on every
//! provider (the file API reports no times); an append always changes a size.

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::provider::{ProviderError, ProviderRef, SandboxProvider};

/// Where the CLIs keep their sessions, relative to the workspace root (the home).
pub const SESSION_DIRS: &[&str] = &[
    ".codex/sessions",
    ".claude/projects",
    ".local/share/opencode",
];
/// How deep a look descends below each session directory.
const MAX_DEPTH: usize = 6;
/// How many entries one look reads at most (the rest is not fingerprinted).
const MAX_ENTRIES: usize = 4096;

/// The fingerprint of the session files now; `None` when the provider could not list them
/// (a failed look never counts as a write).
pub async fn fingerprint(provider: &dyn SandboxProvider, machine: &ProviderRef) -> Option<String> {
    let mut hash = DefaultHasher::new();
    let mut seen = 0usize;
    let mut stack: Vec<(String, usize)> = SESSION_DIRS.iter().map(|d| ((*d).into(), 0)).collect();
    while let Some((dir, depth)) = stack.pop() {
        let entries = match provider.list_files(machine, &dir).await {
            Ok(entries) => entries,
            // A CLI that never ran has no directory.
            Err(ProviderError::NotFound(_)) => continue,
            Err(_) => return None,
        };
        for entry in entries {
            seen += 1;
            if seen > MAX_ENTRIES {
                break;
            }
            match entry.kind.as_str() {
                "dir" if depth < MAX_DEPTH => stack.push((entry.path.clone(), depth + 1)),
                "file" => {
                    entry.path.hash(&mut hash);
                    entry.size.hash(&mut hash);
                }
                _ => {}
            }
        }
    }
    Some(format!("{:016x}", hash.finish()))
}

/// What the session files looked like at the last look, and when they last changed.
#[derive(Clone, Debug, Default)]
pub struct AgentWatch {
    last: Option<String>,
    changed_at_ms: Option<i64>,
}

impl AgentWatch {
    /// Record a look at `now_ms`; whether it was the first one (nothing to compare with).
    pub fn observe(&mut self, fingerprint: Option<String>, now_ms: i64) -> bool {
        let Some(fingerprint) = fingerprint else {
            return self.last.is_none();
        };
        let first = self.last.is_none();
        if !first && self.last.as_deref() != Some(fingerprint.as_str()) {
            self.changed_at_ms = Some(now_ms);
        }
        self.last = Some(fingerprint);
        first
    }

    /// Whether the files changed within `window_ms` before `now_ms`.
    pub fn wrote_within(&self, window_ms: i64, now_ms: i64) -> bool {
        self.changed_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < window_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_after_the_first_look_is_a_write_until_the_window_passes() {
        let mut watch = AgentWatch::default();
        assert!(watch.observe(Some("a".into()), 0), "first look");
        assert!(!watch.wrote_within(600, 10), "the first look is no write");
        assert!(!watch.observe(Some("a".into()), 100));
        assert!(
            !watch.wrote_within(600, 100),
            "unchanged: an agent at its prompt"
        );
        watch.observe(Some("b".into()), 200);
        assert!(watch.wrote_within(600, 700));
        assert!(!watch.wrote_within(600, 800));
        watch.observe(None, 900);
        assert!(!watch.wrote_within(600, 900), "a failed look is no write");
    }
}
