//! What a bot must hear about its desktop's control group since it last heard: processes the
//! OOM killer took at the group's memory ceiling (Chromium gives its renderers the first turn).
//! A call reads it beside its own work, and of calls that read the same kills at once exactly
//! one tells them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::groups::DesktopGroups;

/// How one call on a desktop learns what its bot must hear.
pub struct GroupNotice {
    /// The desktop's group owner.
    pub groups: Arc<dyn DesktopGroups>,
    /// The desktop's tag.
    pub tag: String,
    /// The bot whose desktop it is (for the log).
    pub bot_id: String,
    /// The kills already told, shared by every call on the desktop.
    pub seen: Arc<AtomicU64>,
}

impl GroupNotice {
    /// Reads the group's OOM kills; the notice when there are kills no call told yet. A
    /// group that cannot be read tells nothing.
    pub async fn read(self) -> Option<String> {
        let usage = self.groups.usage(&self.tag).await.ok()?;
        let told = self.seen.fetch_max(usage.oom_kills, Ordering::SeqCst);
        if usage.oom_kills <= told {
            return None;
        }
        let lost = usage.oom_kills - told;
        tracing::warn!(bot.id = %self.bot_id, desktop.oom_kills = lost, "desktop.memory.ceiling_reached");
        Some(format!(
            "This desktop reached its memory ceiling ({} MiB) and lost {lost} browser process{} (a tab shows \"Aw, Snap!\" or closed): reload it or open a lighter page.",
            self.groups.memory_mb(),
            if lost == 1 { "" } else { "es" }
        ))
    }
}

/// [`GroupNotice::read`] of a call's notice, if it has one.
pub async fn read_notice(notice: Option<GroupNotice>) -> Option<String> {
    match notice {
        Some(notice) => notice.read().await,
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::desktop::DesktopError;
    use crate::desktop::cgroup::{Phase, Usage};

    /// A group whose kill count the test sets.
    #[derive(Debug, Default)]
    struct Kills(Mutex<u64>);

    #[async_trait]
    impl DesktopGroups for Kills {
        async fn enter(&self, _: &str, _: Phase) -> Result<(), DesktopError> {
            Ok(())
        }
        async fn set_frozen(&self, _: &str, _: bool) -> Result<(), DesktopError> {
            Ok(())
        }
        async fn usage(&self, _: &str) -> Result<Usage, DesktopError> {
            // Every reader gets a turn before answering, so the calls overlap.
            tokio::task::yield_now().await;
            Ok(Usage {
                cpu_ns: 0,
                oom_kills: *self.0.lock().unwrap(),
                frozen: false,
            })
        }
        async fn remove(&self, _: &str) -> Result<(), DesktopError> {
            Ok(())
        }
        fn memory_mb(&self) -> u64 {
            800
        }
    }

    fn notices(groups: &Arc<Kills>, seen: &Arc<AtomicU64>, calls: usize) -> Vec<GroupNotice> {
        (0..calls)
            .map(|_| GroupNotice {
                groups: groups.clone(),
                tag: "t".into(),
                bot_id: "b".into(),
                seen: seen.clone(),
            })
            .collect()
    }

    #[tokio::test]
    async fn kills_read_by_calls_at_once_are_told_by_exactly_one() {
        let groups = Arc::new(Kills::default());
        let seen = Arc::new(AtomicU64::new(0));
        let told = |calls: Vec<GroupNotice>| async move {
            let reads = calls
                .into_iter()
                .map(|n| tokio::spawn(read_notice(Some(n))));
            let mut out = Vec::new();
            for read in reads {
                if let Some(text) = read.await.unwrap() {
                    out.push(text);
                }
            }
            out
        };
        assert!(told(notices(&groups, &seen, 8)).await.is_empty());

        *groups.0.lock().unwrap() = 2;
        let heard = told(notices(&groups, &seen, 8)).await;
        assert_eq!(heard.len(), 1, "{heard:?}");
        assert!(
            heard[0].contains("memory ceiling (800 MiB)"),
            "{}",
            heard[0]
        );
        assert!(
            heard[0].contains("lost 2 browser processes"),
            "{}",
            heard[0]
        );
        // Told once: the same kills again say nothing.
        assert!(told(notices(&groups, &seen, 8)).await.is_empty());

        // One more kill is told as one.
        *groups.0.lock().unwrap() = 3;
        let heard = told(notices(&groups, &seen, 4)).await;
        assert_eq!(heard.len(), 1, "{heard:?}");
        assert!(heard[0].contains("lost 1 browser process "), "{}", heard[0]);
    }

    #[tokio::test]
    async fn a_desktop_without_a_group_tells_nothing() {
        assert_eq!(read_notice(None).await, None);
    }
}
