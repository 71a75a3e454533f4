//! Desktop groups and CPU priority of a runtime's screens: entering, freezing, thawing, raising a lowered start, and what a bot hears of its group.

use super::*;

impl DesktopRuntime {
    /// Whether a desktop's start is lowered only while it lasts: asked for, and this runtime
    /// can raise the desktop back afterwards ([`Launch::start_only`]).
    pub(super) fn lowered_while_starting(&self) -> bool {
        self.launch.start_only
            && self.launch.nice > 0
            && self.runner.on_this_host()
            && crate::desktop::priority_local::may_raise()
    }

    /// What raises a lowered start of `screen`'s browser `pid` at once, should it starve: its
    /// browser's and window manager's process groups by nice value, or its desktop's control
    /// group to its own weight. `None` for a start that is not lowered.
    pub(super) fn start_raise(
        &self,
        screen: &Screen,
        pid: u32,
    ) -> Option<Pin<Box<dyn Future<Output = usize> + Send>>> {
        if self.lowered_while_starting() {
            let groups = [Some(pid), screen.wm].into_iter().flatten().collect();
            return Some(Box::pin(crate::desktop::priority_local::raise_off_thread(
                groups,
            )));
        }
        let groups = self.config.groups.clone().filter(|g| g.lowers_starts())?;
        let tag = screen.tag.clone();
        // The CPU part goes back to the desktop's own group; what is outside is left to the
        // screen's next entry.
        Some(Box::pin(async move {
            usize::from(groups.prepare(&tag, Phase::AtWork).await.is_ok())
        }))
    }

    /// The nice value of a starting desktop's browser and window manager.
    pub(super) fn start_nice(&self) -> u8 {
        if self.launch.start_only && !self.lowered_while_starting() {
            0
        } else {
            self.launch.nice
        }
    }

    /// The nice value of the programs a bot launches on its desktop.
    pub(super) fn program_nice(&self) -> u8 {
        if self.launch.start_only {
            0
        } else {
            self.launch.nice
        }
    }

    /// CPU time, OOM kills and frozen state of the bot's desktop group, read from the group.
    pub async fn group_usage(
        &self,
        bot_id: &str,
    ) -> Result<crate::desktop::cgroup::Usage, DesktopError> {
        let tag = {
            let table = self.table.lock().await;
            let i = table.slot_of(bot_id).ok_or(DesktopError::NoScreen)?;
            match &table.slots[i].state {
                SlotState::Active(sc) if sc.grouped => sc.tag.clone(),
                _ => {
                    return Err(DesktopError::Stack(
                        "the desktop has no control group".into(),
                    ));
                }
            }
        };
        let groups = self
            .config
            .groups
            .as_ref()
            .ok_or_else(|| DesktopError::Stack("the desktop has no control group".into()))?;
        groups.usage(&tag).await
    }

    /// Whether the bot's desktop is frozen now.
    pub async fn is_frozen(&self, bot_id: &str) -> bool {
        let table = self.table.lock().await;
        table
            .slot_of(bot_id)
            .is_some_and(|i| matches!(&table.slots[i].state, SlotState::Active(sc) if sc.frozen))
    }

    /// Freezes every desktop idle past `freeze_after`: no tool call for that long, no live
    /// viewer capability, no user in control and no operation in progress. Returns how many
    /// it froze.
    pub async fn freeze_idle(&self) -> usize {
        let (Some(groups), Some(after)) = (&self.config.groups, self.config.freeze_after) else {
            return 0;
        };
        let mut table = self.table.lock().await;
        let mut frozen = 0;
        for i in 0..table.slots.len() {
            let SlotState::Active(screen) = &mut table.slots[i].state else {
                continue;
            };
            // A person in control holds a live control capability: counted below.
            if screen.frozen
                || !screen.grouped
                || screen.busy.load(Ordering::SeqCst) > 0
                || screen.last_used.elapsed() < after
                || self.gateway.live_count(i as u32).await > 0
            {
                continue;
            }
            match groups.set_frozen(&screen.tag, true).await {
                Ok(()) => {
                    screen.frozen = true;
                    frozen += 1;
                    tracing::info!(screen.slot = i, bot.id = %screen.bot_id, "desktop.screen.frozen");
                    let _ = self.freezes.send(FreezeChange {
                        bot_id: screen.bot_id.clone(),
                        frozen: true,
                    });
                }
                Err(e) => {
                    // Half frozen is worse than not at all.
                    let _ = groups.set_frozen(&screen.tag, false).await;
                    tracing::warn!(bot.id = %screen.bot_id, error = %e, "desktop.freeze.failed");
                }
            }
        }
        frozen
    }

    /// Runs [`Self::freeze_idle`] in the background while the runtime lives, when freezing is
    /// configured.
    pub fn start_freezer(self: &Arc<Self>) {
        let Some(after) = self
            .config
            .freeze_after
            .filter(|_| self.config.groups.is_some())
        else {
            return;
        };
        let tick = (after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(runtime) = weak.upgrade() else { break };
                runtime.freeze_idle().await;
            }
        });
    }

    /// Thaws a frozen screen.
    pub(super) async fn thaw(&self, screen: &mut Screen) -> Result<(), DesktopError> {
        let Some(groups) = self.config.groups.as_ref().filter(|_| screen.frozen) else {
            return Ok(());
        };
        let started = Instant::now();
        groups.set_frozen(&screen.tag, false).await?;
        screen.frozen = false;
        tracing::info!(bot.id = %screen.bot_id, elapsed_us = started.elapsed().as_micros() as u64, "desktop.screen.thawed");
        let _ = self.freezes.send(FreezeChange {
            bot_id: screen.bot_id.clone(),
            frozen: false,
        });
        Ok(())
    }

    /// Moves the screen's processes into its control group (creating it); a failure is logged
    /// and the desktop runs without its limits.
    pub(super) async fn enter_group(&self, screen: &mut Screen) {
        let phase = Phase::of(screen.starting);
        if self
            .enter_tagged(&screen.tag, &screen.bot_id, phase, screen.born_grouped)
            .await
        {
            screen.grouped = true;
        }
    }

    /// [`Self::enter_group`] for the desktop tagged `tag`, without its screen: whether its
    /// processes are now in the group.
    pub(super) async fn enter_tagged(
        &self,
        tag: &str,
        bot_id: &str,
        phase: Phase,
        born_grouped: bool,
    ) -> bool {
        let Some(groups) = &self.config.groups else {
            return false;
        };
        let entered = if born_grouped {
            groups.prepare(tag, phase).await.map(drop)
        } else {
            groups.enter(tag, phase).await
        };
        match entered {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(bot.id = bot_id, error = %e, "desktop.limits.enter_failed");
                false
            }
        }
    }

    /// How a process about to start for the desktop tagged `tag` is born in its control group
    /// as `phase` wants, where the group's owner can place it so on this host; `None` where it
    /// cannot (the process is then found by its tag, [`Self::enter_group`]) or the group could
    /// not be made ready (logged: the desktop runs without its limits).
    pub(super) async fn group_joins(&self, tag: &str, phase: Phase) -> Option<Vec<Join>> {
        let groups = self
            .config
            .groups
            .as_ref()
            .filter(|_| self.runner.on_this_host())?;
        match groups.prepare(tag, phase).await {
            Ok(joins) => joins,
            Err(e) => {
                tracing::warn!(error = %e, "desktop.limits.enter_failed");
                None
            }
        }
    }

    /// `spec`, started for `screen`, born in its control group where every process of the
    /// screen is; a screen otherwise looks for its processes by their tag from then on.
    pub(super) async fn join_screen_group(&self, screen: &mut Screen, spec: &mut SpawnSpec) {
        if !screen.born_grouped {
            return;
        }
        match self
            .group_joins(&screen.tag, Phase::of(screen.starting))
            .await
        {
            Some(joins) => spec.join = joins,
            None => screen.born_grouped = false,
        }
    }

    /// [`Self::enter_group`] during a start `watch` watches: once the start was found starved,
    /// the screen enters as a desktop at work, then and from then on (the raise may have begun
    /// before this entry, which would otherwise lower it again).
    pub(super) async fn enter_group_watched(
        &self,
        screen: &mut Screen,
        watch: &Option<StartWatch>,
    ) {
        self.enter_group(screen).await;
        if screen.starting && watch.as_ref().is_some_and(StartWatch::raised) {
            screen.starting = false;
            self.enter_group(screen).await;
        }
    }

    /// How a call on `screen` learns what the bot must hear about its desktop's group, read
    /// beside the call's own work ([`GroupNotice::read`]); `None` for a desktop without one.
    pub(super) fn group_notice(&self, screen: &Screen) -> Option<GroupNotice> {
        let groups = self.config.groups.clone().filter(|_| screen.grouped)?;
        Some(GroupNotice {
            groups,
            tag: screen.tag.clone(),
            bot_id: screen.bot_id.clone(),
            seen: screen.oom_seen.clone(),
        })
    }

    /// The browser and the window manager of a desktop whose start was lowered, back at the
    /// runtime's priority ([`Launch::start_only`]).
    pub(super) async fn raise_priority(&self, screen: &Screen) {
        let groups: Vec<u32> = screen.browser.iter().chain(&screen.wm).copied().collect();
        let raised = crate::desktop::priority_local::raise_off_thread(groups).await;
        tracing::debug!(
            screen.display = screen.display,
            bot.id = %screen.bot_id,
            threads = raised,
            "desktop.priority.raised"
        );
    }
}
