//! Opening a bot's screen on its slot, from a spare or a fresh stack, and keeping its browser running.

use super::*;

impl DesktopRuntime {
    /// Opens `bot_id`'s screen (display, window manager and browser) on display slot `slot`,
    /// or returns the open one there after making sure its browser still runs (asked at most
    /// every [`BROWSER_CHECK_EVERY`]). A slot held by another bot's screen (active, starting,
    /// stopping, or reserved after a failed teardown that a retry could not clear yet), or a
    /// bot whose screen runs on another slot, gets [`DesktopError::SlotBusy`]; no other slot
    /// is picked. At the screen limit, or past the slots a machine can host,
    /// [`DesktopError::MultiScreenUnavailable`]: which screen gives way is the caller's
    /// decision. Nothing starts under the table lock.
    pub async fn open_screen(&self, bot_id: &str, slot: u32) -> Result<ScreenHandle, DesktopError> {
        check_id(bot_id)?;
        if slot >= MAX_SLOTS {
            tracing::info!(
                bot.id = bot_id,
                screen.slot = slot,
                "desktop.screen.refused"
            );
            return Err(DesktopError::MultiScreenUnavailable);
        }
        let i = slot as usize;
        loop {
            let mut table = self.table.lock().await;
            if table.busy_of(bot_id) {
                drop(table);
                tokio::time::sleep(SLOT_BUSY_POLL).await;
                continue;
            }
            if let Some(at) = table.slot_of(bot_id) {
                if at != i {
                    return Err(slot_busy(
                        slot,
                        format!("this bot's screen runs on slot {at}"),
                    ));
                }
                if let SlotState::Active(screen) = &mut table.slots[i].state {
                    self.thaw(screen).await?;
                }
                return self.keep_browser(table, bot_id, i).await;
            }
            self.retry_reserved(&mut table).await;
            if table.reserved_of(bot_id).is_some() {
                // Its old browser may still hold the profile: starting another would fight it.
                return Err(DesktopError::Stack(
                    "the bot's previous screen could not be torn down yet".into(),
                ));
            }
            let limit = self.config.screen_limit;
            if limit > 0 && table.occupied() >= limit {
                tracing::info!(
                    bot.id = bot_id,
                    screen.limit = limit,
                    "desktop.screen.refused"
                );
                return Err(DesktopError::MultiScreenUnavailable);
            }
            while table.slots.len() <= i {
                table.slots.push(Slot {
                    generation: 0,
                    state: SlotState::Free,
                });
            }
            let why = match &table.slots[i].state {
                SlotState::Free => None,
                SlotState::Busy(_) => Some("another screen is starting or stopping there"),
                SlotState::Active(_) => Some("another bot's screen runs there"),
                SlotState::Reserved(_) => {
                    Some("its last screen's teardown failed and waits for a retry")
                }
            };
            if let Some(why) = why {
                return Err(slot_busy(slot, why.to_owned()));
            }
            table.slots[i].state = SlotState::Busy(bot_id.to_owned());
            drop(table);
            let mut guard = BusySlot::new(&self.table, i);
            let opening = Instant::now();
            let started = async {
                // The profile is made ready while what an earlier process left is stopped and
                // the display stack starts (the browser, which needs both, starts after).
                // With spares, a ready one is taken at once and the script that readies the
                // profile hands its browser over; else the profile is known first: a spare
                // still starting is worth waiting for only to a bot without a profile, who can
                // take its browser.
                let (stack, profile) = if self.warm.target() == 0 {
                    let stack = async {
                        self.reap_leftovers().await?;
                        self.start_stack(bot_id).await
                    };
                    tokio::join!(stack, self.prepare_profile(bot_id, None))
                } else if let Some(spare) = self.take_spare(bot_id, Duration::ZERO).await {
                    let pids = spare.process_groups();
                    let taken = spare_profile::Spare {
                        name: &spare.bot_id,
                        alive: &pids,
                        browser: spare.browser,
                    };
                    let profile = self.prepare_profile(bot_id, Some(taken)).await;
                    (Ok(spare), profile)
                } else {
                    let (reaped, profile) =
                        tokio::join!(self.reap_leftovers(), self.prepare_profile(bot_id, None));
                    let wait = match &profile {
                        Ok(p) if p.fresh => SPARE_WAIT,
                        _ => Duration::ZERO,
                    };
                    let stack = match reaped {
                        Ok(()) => match self.take_spare(bot_id, wait).await {
                            Some(spare) => Ok(spare),
                            None => self.start_stack(bot_id).await,
                        },
                        Err(e) => Err(e),
                    };
                    (stack, profile)
                };
                let mut screen = stack?;
                let mut profile = match profile {
                    Ok(profile) => Some(profile),
                    Err(e) => {
                        let _ = self.stop_screen(&mut screen).await;
                        return Err(e);
                    }
                };
                if screen.bot_id != bot_id
                    && let Some(prepared) = profile.take()
                {
                    match self.hand_over(&mut screen, bot_id, prepared).await {
                        Ok(Handover::Taken) => {}
                        Ok(Handover::Start(prepared)) => profile = Some(prepared),
                        Ok(Handover::Gone(prepared)) => {
                            let _ = self.stop_screen(&mut screen).await;
                            screen = self.start_stack(bot_id).await?;
                            profile = Some(prepared);
                        }
                        Err(e) => {
                            let _ = self.stop_screen(&mut screen).await;
                            return Err(e);
                        }
                    }
                }
                tracing::debug!(
                    bot.id = bot_id,
                    elapsed_ms = opening.elapsed().as_millis() as u64,
                    "desktop.screen.stack_ready"
                );
                if let Some(profile) = profile
                    && let Err(e) = self.start_browser(&mut screen, Some(profile)).await
                {
                    let _ = self.stop_screen(&mut screen).await;
                    return Err(e);
                }
                Ok(screen)
            }
            .await;
            // Refill once this desktop is up (and [`REFILL_DELAY`] later), so the spare's start
            // does not compete with it.
            self.warm.want();
            let mut table = self.table.lock().await;
            let screen = match started {
                Ok(screen) => screen,
                Err(e) => {
                    table.slots[i].state = SlotState::Free;
                    guard.done();
                    return Err(e);
                }
            };
            guard.done();
            let slot = &mut table.slots[i];
            slot.generation += 1;
            tracing::info!(
                screen.slot = i,
                screen.generation = slot.generation,
                screen.display = screen.display,
                bot.id = bot_id,
                elapsed_ms = opening.elapsed().as_millis() as u64,
                "desktop.screen.started"
            );
            slot.state = SlotState::Active(Box::new(screen));
            return Ok(handle(slot, i));
        }
    }

    /// Returns the open screen of slot `i`, restarting its browser if it is gone; the table
    /// lock is let go while the browser is asked about or restarted.
    pub(super) async fn keep_browser(
        &self,
        mut table: tokio::sync::MutexGuard<'_, Table>,
        bot_id: &str,
        i: usize,
    ) -> Result<ScreenHandle, DesktopError> {
        let SlotState::Active(screen) = &table.slots[i].state else {
            unreachable!("slot_of finds active slots")
        };
        let pid = screen.browser;
        if pid.is_some()
            && screen
                .browser_seen
                .is_some_and(|t| t.elapsed() < BROWSER_CHECK_EVERY)
        {
            return Ok(handle(&table.slots[i], i));
        }
        drop(table);
        let alive = match pid {
            Some(pid) => self.runner.is_running(pid).await?,
            None => false,
        };
        table = self.table.lock().await;
        if table.slot_of(bot_id) != Some(i) {
            return Err(DesktopError::NoScreen);
        }
        if alive {
            if let SlotState::Active(screen) = &mut table.slots[i].state {
                screen.browser_seen = Some(Instant::now());
            }
            return Ok(handle(&table.slots[i], i));
        }
        let SlotState::Active(mut screen) = std::mem::replace(
            &mut table.slots[i].state,
            SlotState::Busy(bot_id.to_owned()),
        ) else {
            unreachable!("slot_of finds active slots")
        };
        drop(table);
        let mut guard = BusySlot::new(&self.table, i);
        tracing::info!(screen.slot = i, bot.id = %screen.bot_id, "desktop.browser.restarting");
        let restarted = self.start_browser(&mut screen, None).await;
        let mut table = self.table.lock().await;
        table.slots[i].state = SlotState::Active(screen);
        guard.done();
        restarted?;
        Ok(handle(&table.slots[i], i))
    }
}
