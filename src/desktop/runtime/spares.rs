//! The spare desktops: started ahead by a background filler and handed to the next bots.

use super::*;

impl DesktopRuntime {
    /// Starts the background filler of the spare display stacks, when any are configured:
    /// it starts spares until [`RuntimeConfig::warm_stacks`] are ready, then waits until one
    /// is taken. It never holds the slot table, so tool calls do not wait for it.
    pub fn start_warm_pool(self: &Arc<Self>) {
        if self.warm.target() == 0 {
            return;
        }
        let weak = Arc::downgrade(self);
        let pool = self.warm.clone();
        tokio::spawn(async move {
            let mut failures = 0u32;
            loop {
                while pool.begin_fill() {
                    let Some(runtime) = weak.upgrade() else {
                        pool.finish_fill(None);
                        return;
                    };
                    match runtime.start_spare().await {
                        Ok(spare) => {
                            failures = 0;
                            // Ready at once; its memory is read a while after, for health.
                            let (number, groups) = (spare.display, spare.process_groups());
                            if let Some(mut late) = pool.finish_fill(Some((spare, 0))) {
                                let _ = runtime.stop_screen(&mut late).await;
                                continue;
                            }
                            // Not while a bot that was waiting for it takes it over.
                            let (weak, pool) = (weak.clone(), pool.clone());
                            tokio::spawn(async move {
                                tokio::time::sleep(REFILL_DELAY).await;
                                let Some(runtime) = weak.upgrade() else {
                                    return;
                                };
                                if !pool.holds(|s| s.display == number) {
                                    return;
                                }
                                let kib = runtime.groups_pss_kib(&groups).await;
                                pool.note_pss(|s| s.display == number, kib);
                                tracing::info!(
                                    screen.display = number,
                                    desktop.pss_kib = kib,
                                    "desktop.warm.measured"
                                );
                            });
                        }
                        Err(e) => {
                            pool.finish_fill(None);
                            failures += 1;
                            tracing::warn!(error = %e, failures, "desktop.warm.start_failed");
                            drop(runtime);
                            tokio::time::sleep((WARM_RETRY * failures).min(WARM_RETRY_MAX)).await;
                        }
                    }
                }
                if pool.is_closed() {
                    return;
                }
                pool.wanted().await;
                // The desktop that took a spare gets its first calls without a browser
                // starting beside it.
                tokio::time::sleep(REFILL_DELAY).await;
            }
        });
    }

    /// How the spare display stacks stand (for health).
    pub fn warm_status(&self) -> WarmStatus {
        self.warm.status()
    }

    /// Starts one spare desktop, its display stack and a browser on a spare profile
    /// ([`crate::desktop::spare_profile`]).
    pub(super) async fn start_spare(&self) -> Result<Box<Screen>, DesktopError> {
        self.reap_leftovers().await?;
        let started = Instant::now();
        let name = spare_profile::spare_name();
        let (stack, profile) =
            tokio::join!(self.start_stack(&name), self.prepare_profile(&name, None));
        let mut screen = match stack {
            Ok(screen) => screen,
            Err(e) => {
                let profiles = self.profiles_dir();
                let _ = self
                    .runner
                    .run(
                        &spare_profile::remove_script(&profiles, &name),
                        SCRIPT_TIMEOUT,
                    )
                    .await;
                return Err(e);
            }
        };
        // Stopping the screen removes its profile too.
        let browser = match profile {
            Ok(profile) => self.start_browser(&mut screen, Some(profile)).await,
            Err(e) => Err(e),
        };
        if browser.is_ok() {
            watch_spare(&screen).await;
        }
        if let Err(e) = browser {
            let _ = self.stop_screen(&mut screen).await;
            return Err(e);
        }
        tracing::info!(
            screen.display = screen.display,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "desktop.warm.ready"
        );
        Ok(Box::new(screen))
    }

    /// PSS in KiB of every process of the process groups led by `groups`.
    pub(super) async fn groups_pss_kib(&self, groups: &[u32]) -> u64 {
        let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
        // Five programs in all, however many processes: `cat` goes on past a process that
        // exited since `ps` listed it.
        let script = format!(
            "ps -eo pid=,pgid= | awk -v g=' {} ' 'index(g, \" \" $2 \" \") {{ print \"/proc/\" $1 \"/smaps_rollup\" }}' \\\n\
             | xargs -r cat 2>/dev/null | awk '/^Pss:/ {{ s += $2 }} END {{ print s + 0 }}'",
            groups.join(" ")
        );
        match self.runner.run(&script, SCRIPT_TIMEOUT).await {
            Ok(o) => o.stdout.trim().parse().unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// A spare desktop for `bot_id`'s new screen when the pool has one alive (or is starting
    /// one, waited for up to `wait`), its browser still on its spare profile (see
    /// [`Self::hand_over`]).
    pub(super) async fn take_spare(&self, bot_id: &str, wait: Duration) -> Option<Screen> {
        while let Some(mut spare) = self.warm.take(wait).await {
            if self.spare_alive(&spare).await {
                spare.last_used = Instant::now();
                tracing::info!(
                    screen.display = spare.display,
                    bot.id = bot_id,
                    "desktop.warm.taken"
                );
                return Some(*spare);
            }
            tracing::warn!(screen.display = spare.display, "desktop.warm.spare_lost");
            let _ = self.stop_screen(&mut spare).await;
        }
        None
    }

    /// Gives a taken spare desktop to `bot_id`. A bot without a profile of its own takes the
    /// spare's running browser with its profile; any other gets the display stack only, the
    /// spare's browser stopped and its profile removed, and its own browser is then started.
    /// A spare found gone here is not used at all.
    pub(super) async fn hand_over(
        &self,
        screen: &mut Screen,
        bot_id: &str,
        profile: Profile,
    ) -> Result<Handover, DesktopError> {
        let spare = std::mem::replace(&mut screen.bot_id, bot_id.to_owned());
        let profiles = self.profiles_dir();
        let pids = screen.process_groups();
        let mut outcome = profile.handover;
        // On the command path the spare's processes were not looked at when it was taken:
        // the hand-over's script looks.
        let unchecked = matches!(screen.io, Some(Io::Commands(_)));
        let takes_browser = profile.fresh && screen.browser.is_some();
        if outcome.is_none() && (takes_browser || unchecked) {
            let script = if takes_browser {
                let taken = spare_profile::Spare {
                    name: &spare,
                    alive: &pids,
                    browser: screen.browser,
                };
                spare_profile::handover_script(&profiles, bot_id, &taken)
            } else {
                format!(
                    "{}exit {}\n",
                    spare_profile::alive_script(&pids),
                    spare_profile::BOT_HAS_PROFILE
                )
            };
            outcome = Some(self.runner.run(&script, SCRIPT_TIMEOUT).await?.exit_code);
        }
        if outcome == Some(spare_profile::SPARE_GONE) {
            tracing::warn!(screen.display = screen.display, "desktop.warm.spare_lost");
            // Stopping the screen removes the spare's profile.
            screen.spare_link = Some(spare);
            return Ok(Handover::Gone(profile));
        }
        if screen.browser.is_some() && outcome == Some(spare_profile::HANDED_OVER) {
            screen.spare_link = Some(spare);
            // Its processes were just seen running.
            screen.browser_seen = Some(Instant::now());
            tracing::info!(
                screen.display = screen.display,
                bot.id = bot_id,
                "desktop.warm.browser_taken"
            );
            return Ok(Handover::Taken);
        }
        tracing::info!(
            screen.display = screen.display,
            bot.id = bot_id,
            handover.exit = outcome,
            "desktop.warm.browser_replaced"
        );
        if let Some(pid) = screen.browser {
            self.runner.stop(pid, SPARE_BROWSER_GRACE).await?;
            screen.browser = None;
        }
        // The spare's profile (or, where the hand-over stopped halfway, nothing) goes off the
        // opening path.
        let runner = self.runner.clone();
        let remove = spare_profile::remove_script(&profiles, &spare);
        tokio::spawn(async move {
            if let Err(e) = runner.run(&remove, SCRIPT_TIMEOUT).await {
                tracing::warn!(error = %e, "desktop.warm.profile_remove_failed");
            }
        });
        Ok(Handover::Start(profile))
    }

    /// Whether a spare's X server still answers and its browser still shows a window (on a
    /// display reached through commands, left to [`Self::hand_over`]). While the server has
    /// reported none of the spare's windows gone since it was ready ([`watch_spare`]) and its
    /// connection is open, the answer needs no round trip; the hand-over still looks at its
    /// processes. The watch ends here: a taken desktop's windows are its bot's business.
    pub(super) async fn spare_alive(&self, spare: &Screen) -> bool {
        match &spare.io {
            Some(Io::X(x)) => {
                let x = x.clone();
                let browser = spare.browser.is_some();
                if browser
                    && let Ok(mut watched) = x.try_lock()
                    && watched.end_window_watch().unwrap_or(false)
                {
                    return true;
                }
                tokio::task::spawn_blocking(move || {
                    let x = x.lock().unwrap_or_else(|e| e.into_inner());
                    // The browser's windows, when it has one, are asked of the X server: its
                    // answer also says that it answers.
                    if browser {
                        browser_windows(&x).is_ok_and(|n| n > 0)
                    } else {
                        x.conn
                            .get_input_focus()
                            .ok()
                            .is_some_and(|c| c.reply().is_ok())
                    }
                })
                .await
                .unwrap_or(false)
            }
            // An exec round trip each: [`Self::hand_over`] looks in its own script instead.
            Some(Io::Commands(_)) => true,
            None => false,
        }
    }
}

/// Starts watching a ready spare's windows ([`XDisplay::watch_windows`]), then checks that its
/// browser shows one: from here on, taking the spare asks the X server nothing unless a window
/// went away. A spare whose browser window is not viewable right then (a busy machine, the
/// window manager still at work), or whose watch failed, is left unwatched: taking it runs the
/// full check. A display reached through commands is not watched.
async fn watch_spare(spare: &Screen) {
    let Some(Io::X(x)) = &spare.io else {
        return;
    };
    let x = x.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let mut x = x.lock().unwrap_or_else(|e| e.into_inner());
        if x.watch_windows().is_ok() && !browser_windows(&x).is_ok_and(|n| n > 0) {
            let _ = x.end_window_watch();
        }
    })
    .await;
}
