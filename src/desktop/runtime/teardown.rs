//! Ending screens: a slot's generation torn down, failed teardowns retried, the machine's shutdown, and what an earlier process left.

use super::*;

impl DesktopRuntime {
    /// Tears down `bot_id`'s screen; its profile stays in the workspace. Closing a bot with no
    /// screen succeeds.
    pub async fn close_screen(&self, bot_id: &str) -> Result<(), DesktopError> {
        let mut table = loop {
            let table = self.table.lock().await;
            if !table.busy_of(bot_id) {
                break table;
            }
            drop(table);
            tokio::time::sleep(SLOT_BUSY_POLL).await;
        };
        self.retry_reserved(&mut table).await;
        match table.slot_of(bot_id) {
            Some(i) => {
                let Some(screen) = self.begin_teardown(&mut table, i) else {
                    return Ok(());
                };
                drop(table);
                self.finish_teardown(i, screen).await
            }
            None if table.reserved_of(bot_id).is_some() => Err(DesktopError::Stack(
                "the bot's screen teardown is still failing".into(),
            )),
            None => Ok(()),
        }
    }

    /// Tears down every screen and stops the gateway (machine stop).
    pub async fn shutdown(&self) -> Result<(), DesktopError> {
        let mut table = loop {
            let table = self.table.lock().await;
            if !table.any_busy() {
                break table;
            }
            drop(table);
            tokio::time::sleep(SLOT_BUSY_POLL).await;
        };
        let mut failure = None;
        for mut spare in self.warm.drain().await {
            if let Err(e) = self.stop_screen(&mut spare).await {
                failure = Some(e);
            }
        }
        for i in 0..table.slots.len() {
            if matches!(table.slots[i].state, SlotState::Active(_))
                && let Err(e) = self.teardown(&mut table, i).await
            {
                failure = Some(e);
            }
        }
        self.retry_reserved(&mut table).await;
        if table.occupied() > 0 && failure.is_none() {
            failure = Some(DesktopError::Stack(
                "some screens could not be torn down".into(),
            ));
        }
        if let Err(e) = self.gateway.shutdown().await {
            failure = Some(e);
        }
        if failure.is_none() {
            let prefix = format!("{}/", self.config.run_dir.to_string_lossy());
            self.runner
                .run(&sweep_script(&prefix), SCRIPT_TIMEOUT)
                .await?;
        }
        failure.map_or(Ok(()), Err)
    }

    /// Retries the teardown of reserved slots; returns how many are still reserved.
    pub async fn retry_teardowns(&self) -> usize {
        let mut table = self.table.lock().await;
        self.retry_reserved(&mut table).await;
        table
            .slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Reserved(_)))
            .count()
    }

    /// Ends slot `i`'s generation: announce, revoke capabilities, stop processes. On failure
    /// the slot is reserved for a retry.
    pub(super) async fn teardown(&self, table: &mut Table, i: usize) -> Result<(), DesktopError> {
        let Some((mut screen, ended)) = self.begin_teardown(table, i) else {
            return Ok(());
        };
        let result = self.stop_retired(i, ended, &mut screen).await;
        table.slots[i].state = match result {
            Ok(()) => SlotState::Free,
            Err(_) => SlotState::Reserved(screen),
        };
        result
    }

    /// Under the table lock: moves slot `i`'s generation, announces the end and marks the
    /// slot busy; returns the screen to stop.
    pub(super) fn begin_teardown(&self, table: &mut Table, i: usize) -> Option<(Box<Screen>, u64)> {
        let slot = &mut table.slots[i];
        let bot_id = match &slot.state {
            SlotState::Active(sc) => sc.bot_id.clone(),
            _ => return None,
        };
        let SlotState::Active(screen) =
            std::mem::replace(&mut slot.state, SlotState::Busy(bot_id.clone()))
        else {
            return None;
        };
        let ended = slot.generation;
        slot.generation += 1;
        let _ = self.events.send(Teardown {
            slot: i as u32,
            ended,
            generation: slot.generation,
            bot_id,
        });
        Some((screen, ended))
    }

    /// Without the table lock: revokes and stops a screen [`Self::begin_teardown`] took, then
    /// frees its slot (or reserves it when the stop failed).
    pub(super) async fn finish_teardown(
        &self,
        i: usize,
        (mut screen, ended): (Box<Screen>, u64),
    ) -> Result<(), DesktopError> {
        let mut guard = BusySlot::new(&self.table, i);
        let result = self.stop_retired(i, ended, &mut screen).await;
        let mut table = self.table.lock().await;
        table.slots[i].state = match result {
            Ok(()) => SlotState::Free,
            Err(_) => SlotState::Reserved(screen),
        };
        guard.done();
        result
    }

    pub(super) async fn stop_retired(
        &self,
        i: usize,
        ended: u64,
        screen: &mut Screen,
    ) -> Result<(), DesktopError> {
        let result = match self.gateway.revoke_slot(i as u32).await {
            Ok(()) => self.stop_screen(screen).await,
            Err(e) => Err(e),
        };
        match &result {
            Ok(()) => {
                tracing::info!(screen.slot = i, screen.generation = ended, bot.id = %screen.bot_id, "desktop.screen.torn_down")
            }
            Err(e) => {
                tracing::warn!(screen.slot = i, screen.generation = ended, bot.id = %screen.bot_id, error = %e, "desktop.screen.teardown_failed")
            }
        }
        result
    }

    pub(super) async fn retry_reserved(&self, table: &mut Table) {
        for i in 0..table.slots.len() {
            if !matches!(table.slots[i].state, SlotState::Reserved(_)) {
                continue;
            }
            let SlotState::Reserved(mut screen) =
                std::mem::replace(&mut table.slots[i].state, SlotState::Free)
            else {
                continue;
            };
            let result = match self.gateway.revoke_slot(i as u32).await {
                Ok(()) => self.stop_screen(&mut screen).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    tracing::info!(screen.slot = i, bot.id = %screen.bot_id, "desktop.screen.torn_down")
                }
                Err(e) => {
                    tracing::warn!(screen.slot = i, bot.id = %screen.bot_id, error = %e, "desktop.screen.teardown_failed");
                    table.slots[i].state = SlotState::Reserved(screen);
                }
            }
        }
    }

    /// Stops a screen's processes, browser first (so it saves its session), clearing each pid
    /// once it is gone. The display number returns to the pool when all are gone.
    pub(super) async fn stop_screen(&self, screen: &mut Screen) -> Result<(), DesktopError> {
        // A program starting on it finishes its start first (it is swept below); none starts
        // after.
        *screen.retired.write().await = true;
        // Frozen processes neither save their state nor die.
        self.thaw(screen).await?;
        screen.io = None;
        self.quit_browser(screen).await?;
        if let Some(pid) = screen.wm {
            self.runner.stop(pid, STACK_STOP_GRACE).await?;
            screen.wm = None;
        }
        // What left the process groups (crash handlers, dialogs, the DevTools bridge) goes by
        // its tag; the bridge's socket with it.
        // A spare's profile, or the link a hand-over left at its name, goes with it.
        let profiles = self.profiles_dir();
        let spare = [Some(&screen.bot_id), screen.spare_link.as_ref()]
            .into_iter()
            .flatten()
            .filter(|name| spare_profile::is_spare(name))
            .map(|name| spare_profile::remove_script(&profiles, name))
            .collect::<String>();
        let out = self
            .runner
            .run(
                &format!(
                    "{spare}rm -f /tmp/.X11-unix/cdp-{}-*\n{}",
                    screen.display,
                    sweep_script(&screen.tag)
                ),
                SCRIPT_TIMEOUT,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(DesktopError::Stack(
                "could not sweep the screen's processes".into(),
            ));
        }
        if let Some(pid) = screen.xvfb {
            self.runner.stop(pid, STACK_STOP_GRACE).await?;
            screen.xvfb = None;
            self.config.displays.release(screen.display);
        }
        if screen.grouped
            && let Some(groups) = &self.config.groups
        {
            match groups.remove(&screen.tag).await {
                Ok(()) => screen.grouped = false,
                Err(e) => {
                    tracing::warn!(bot.id = %screen.bot_id, error = %e, "desktop.limits.remove_failed")
                }
            }
        }
        Ok(())
    }

    /// Quits the screen's browser like a person would first, so cookies and the session are
    /// written (and its cookies saved to the profile first); the signals after it only clean
    /// up what is left.
    pub(super) async fn quit_browser(&self, screen: &mut Screen) -> Result<(), DesktopError> {
        let Some(pid) = screen.browser else {
            return Ok(());
        };
        self.devtools_of(&screen.bot_id, DevToolsAction::Save).await;
        let profile = profile_dir(&self.config.workspace, &screen.bot_id);
        let closed = self
            .runner
            .run(
                &devtools_script(&profile, DevToolsAction::Close),
                SCRIPT_TIMEOUT,
            )
            .await;
        // A browser that quits writes its cookie database after its window is gone: let it
        // finish before any signal.
        let exited = match closed {
            Ok(o) if o.exit_code == 0 => self.runner.wait_exit(pid, BROWSER_STOP_GRACE).await?,
            _ => false,
        };
        if !exited {
            tracing::warn!(bot.id = %screen.bot_id, "desktop.browser.close_fallback");
        }
        self.runner.stop(pid, BROWSER_STOP_GRACE).await?;
        screen.browser = None;
        Ok(())
    }

    /// Before this runtime starts its first process, stops what an earlier process of the
    /// server left in the same run directory (a server that was killed, or a container that
    /// outlived its server), so the displays, the gateway port and the profiles are free.
    pub(super) async fn reap_leftovers(&self) -> Result<(), DesktopError> {
        self.reaped
            .get_or_try_init(|| async {
                let prefix = format!("{}/", self.config.run_dir.to_string_lossy());
                // Then the spare profiles their browsers ran on.
                let profiles = self.profiles_dir();
                let out = self
                    .runner
                    .run(
                        &format!(
                            "(\n{})\n{}",
                            reap_script(&prefix, REAP_GRACE),
                            spare_profile::leftovers_script(&profiles)
                        ),
                        REAP_GRACE + SCRIPT_TIMEOUT,
                    )
                    .await?;
                let found: u64 = out.stdout.trim().parse().unwrap_or(0);
                if found > 0 {
                    tracing::info!(processes = found, "desktop.leftovers.reaped");
                }
                Ok::<_, DesktopError>(())
            })
            .await
            .map(|_| ())
    }
}
