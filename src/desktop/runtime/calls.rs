//! The calls on a bot's open screen: observe, act, capabilities, launches and routes.

use super::*;

impl DesktopRuntime {
    /// Thaws the bot's desktop if it is frozen and counts it as used (a call that reaches its
    /// browser another way, such as DevTools).
    pub async fn wake(&self, bot_id: &str) -> Result<(), DesktopError> {
        self.active_screen(bot_id).await.map(|_| ())
    }

    /// [`Self::wake`] before DevTools reaches the bot's browser directly (a frozen one would
    /// never answer); a bot without a screen has nothing to thaw.
    pub async fn wake_browser(&self, bot_id: &str) -> Result<(), DesktopError> {
        match self.wake(bot_id).await {
            Ok(()) | Err(DesktopError::NoScreen) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The bot's browser process on the machine, while its screen is open.
    pub async fn browser_pid(&self, bot_id: &str) -> Option<u32> {
        let table = self.table.lock().await;
        let i = table.slot_of(bot_id)?;
        match &table.slots[i].state {
            SlotState::Active(sc) => sc.browser,
            _ => None,
        }
    }

    /// The bot's screen, if one is open.
    pub async fn screen(&self, bot_id: &str) -> Option<ScreenHandle> {
        let table = self.table.lock().await;
        table.slot_of(bot_id).map(|i| handle(&table.slots[i], i))
    }

    /// Every open screen by bot.
    pub async fn screens(&self) -> HashMap<String, ScreenHandle> {
        let table = self.table.lock().await;
        let mut out = HashMap::new();
        for (i, slot) in table.slots.iter().enumerate() {
            if let SlotState::Active(sc) = &slot.state {
                out.insert(sc.bot_id.clone(), handle(slot, i));
            }
        }
        out
    }

    /// Grants a view or control capability on the bot's screen through the gateway. Its VNC
    /// server starts without the slot table (the other bots' tools go on meanwhile), the
    /// screen marked busy so it is not frozen under it; a screen torn down meanwhile gets no
    /// capability: its slot's revocation may have run before this grant was recorded, so the
    /// grant is revoked here and the caller told the screen is gone.
    pub async fn grant(&self, bot_id: &str, policy: Policy) -> Result<Capability, DesktopError> {
        let (i, generation, display, _busy) = {
            let mut table = self.table.lock().await;
            let (i, screen) = table.active_mut(bot_id)?;
            self.thaw(screen).await?;
            screen.busy.fetch_add(1, Ordering::SeqCst);
            let (busy, display) = (BusyGuard(screen.busy.clone()), screen.display);
            (i, table.slots[i].generation, display, busy)
        };
        let cap = self
            .gateway
            .grant(i as u32, generation, display, policy)
            .await?;
        {
            // A teardown moves the generation under this lock before it revokes the slot: one
            // that began after this look revokes the grant itself.
            let table = self.table.lock().await;
            if table.slot_of(bot_id) == Some(i) && table.slots[i].generation == generation {
                return Ok(cap);
            }
        }
        tracing::info!(
            screen.slot = i,
            screen.generation = generation,
            bot.id = bot_id,
            "desktop.gateway.grant_outlived"
        );
        self.gateway.revoke(&cap.token).await?;
        Err(DesktopError::NoScreen)
    }

    /// Starts a program on the bot's display (an app, or a file or URL handed to the bot's
    /// browser), as the workspace user with the screen's environment; it is swept with the
    /// screen. The program starts without the slot table (the other bots' tools go on
    /// meanwhile), its screen marked busy so it is not frozen under it; a stop of the screen
    /// waits for a start already under way, so nothing started here outlives the sweep.
    pub async fn launch(&self, bot_id: &str, argv: Vec<String>) -> Result<(), DesktopError> {
        let (i, generation, tag, phase, born_grouped, retired, spec, _busy) = {
            let mut table = self.table.lock().await;
            let (i, screen) = table.active_mut(bot_id)?;
            self.thaw(screen).await?;
            screen.last_used = Instant::now();
            let workspace = self.config.workspace.to_string_lossy().into_owned();
            let mut spec = SpawnSpec {
                argv,
                env: self.env(&screen.tag, screen.display, &workspace),
                cwd: workspace,
                log: String::new(),
                nice: self.program_nice(),
                join: Vec::new(),
            };
            self.join_screen_group(screen, &mut spec).await;
            screen.busy.fetch_add(1, Ordering::SeqCst);
            let busy = BusyGuard(screen.busy.clone());
            let (tag, phase) = (screen.tag.clone(), Phase::of(screen.starting));
            let (born_grouped, retired) = (screen.born_grouped, screen.retired.clone());
            let generation = table.slots[i].generation;
            (i, generation, tag, phase, born_grouped, retired, spec, busy)
        };
        let entered = {
            let retired = retired.read().await;
            if *retired {
                return Err(DesktopError::NoScreen);
            }
            self.runner.spawn(&spec).await?;
            !born_grouped && self.enter_tagged(&tag, bot_id, phase, false).await
        };
        if entered {
            let mut table = self.table.lock().await;
            match table.slots.get_mut(i) {
                Some(Slot {
                    generation: g,
                    state: SlotState::Active(screen),
                }) if *g == generation => screen.grouped = true,
                // Torn down since: its stop may have found no group to remove.
                _ => {
                    drop(table);
                    if let Some(groups) = &self.config.groups
                        && let Err(e) = groups.remove(&tag).await
                    {
                        tracing::warn!(bot.id = bot_id, error = %e, "desktop.limits.remove_failed")
                    }
                }
            }
        }
        Ok(())
    }

    /// Opens a URL or file in the bot's own browser: a second Chromium on the same profile
    /// hands it to the running one (a new tab) and exits.
    pub async fn open_in_browser(&self, bot_id: &str, target: &str) -> Result<(), DesktopError> {
        let profile = profile_dir(&self.config.workspace, bot_id);
        let as_root = *self.as_root.get().unwrap_or(&false);
        let mut argv = vec!["chromium".to_string()];
        argv.extend(self.chromium_args(&profile, as_root));
        argv.push(target.to_owned());
        self.launch(bot_id, argv).await
    }

    /// A route for a person to the bot's screen: a fresh capability on the gateway, reached
    /// from this host at `127.0.0.1:<published>` (the port an engine publishes the gateway on),
    /// or at the gateway's own port when `published` is `None`.
    pub async fn route(
        &self,
        bot_id: &str,
        policy: rakazo_actors::provider::ScreenPolicy,
        published: Option<u16>,
    ) -> Result<rakazo_actors::provider::ScreenRoute, DesktopError> {
        let policy = match policy {
            rakazo_actors::provider::ScreenPolicy::View => Policy::View,
            rakazo_actors::provider::ScreenPolicy::Control => Policy::Control,
        };
        let cap = self.grant(bot_id, policy).await?;
        let port = published.unwrap_or(cap.port);
        Ok(rakazo_actors::provider::ScreenRoute {
            upstream: format!("http://127.0.0.1:{port}"),
            token: cap.token.expose().to_owned(),
        })
    }

    /// A route to the terminal server bound to the control route whose token is `control`
    /// (started on first use), reached like the screens (see [`Self::route`]).
    pub async fn terminal_route(
        &self,
        control: &str,
        shell: &crate::desktop::terminal::ShellSpec,
        published: Option<u16>,
    ) -> Result<rakazo_actors::provider::ScreenRoute, DesktopError> {
        let token = self
            .gateway
            .open_terminal(&crate::desktop::gateway::Token::from_secret(control), shell)
            .await?;
        let port = published.unwrap_or_else(|| self.gateway.port());
        Ok(rakazo_actors::provider::ScreenRoute {
            upstream: format!("http://127.0.0.1:{port}"),
            token: token.expose().to_owned(),
        })
    }

    /// Revokes one capability: its socket goes and its VNC server stops.
    pub async fn revoke(&self, token: &str) -> Result<(), DesktopError> {
        self.gateway
            .revoke(&crate::desktop::gateway::Token::from_secret(token))
            .await
    }

    /// The tag and display of the bot's screen, marked used and thawed.
    pub(super) async fn active_screen(&self, bot_id: &str) -> Result<(String, u32), DesktopError> {
        let mut table = self.table.lock().await;
        let (_, screen) = table.active_mut(bot_id)?;
        screen.last_used = Instant::now();
        self.thaw(screen).await?;
        Ok((screen.tag.clone(), screen.display))
    }

    /// A screenshot of the bot's screen at full size.
    pub async fn observe(&self, bot_id: &str) -> Result<Observation, DesktopError> {
        self.observe_sized(bot_id, FrameSize::FULL).await
    }

    /// A screenshot of the bot's screen, no larger than `size`.
    pub async fn observe_sized(
        &self,
        bot_id: &str,
        size: FrameSize,
    ) -> Result<Observation, DesktopError> {
        let (io, _busy, notice) = self.use_screen(bot_id).await?;
        // The group's counters are read while the screen is captured.
        let notice = read_notice(notice);
        let x = match io {
            Io::X(x) => x,
            Io::Commands(c) => {
                let (grabbed, notice) = tokio::join!(c.grab(), notice);
                let mut observation = grabbed?;
                observation.frame = crate::desktop::frame_scale::fit_png(observation.frame, size)?;
                observation.frame.notice = notice;
                return Ok(observation);
            }
        };
        let capture = tokio::task::spawn_blocking(move || {
            x.lock()
                .unwrap_or_else(|e| e.into_inner())
                .frame_sized(size)
        });
        let (shot, notice) = tokio::join!(capture, notice);
        let shot = shot.map_err(|e| DesktopError::X(format!("capture task: {e}")))??;
        let mut observation = Observation::from(shot);
        observation.frame.notice = notice;
        Ok(observation)
    }

    /// [`Self::act_sized`] with a full-size screenshot.
    pub async fn act(&self, bot_id: &str, actions: &[Action]) -> Result<ActResult, DesktopError> {
        self.act_sized(bot_id, actions, FrameSize::FULL).await
    }

    /// Applies `actions` in order, waits for the screen to settle and returns the frame, no
    /// larger than `size`. A failing action stops the batch; the result says how many
    /// completed and why.
    pub async fn act_sized(
        &self,
        bot_id: &str,
        actions: &[Action],
        size: FrameSize,
    ) -> Result<ActResult, DesktopError> {
        let result = self.run_batch(bot_id, actions, size).await?;
        if let Some(stop) = &result.error {
            tracing::info!(bot.id = bot_id, act.completed = result.completed, act.code = stop.code.as_str(), act.error = %stop.reason, "desktop.act.stopped");
        }
        Ok(result)
    }

    /// [`Self::act_sized`] without its log line.
    async fn run_batch(
        &self,
        bot_id: &str,
        actions: &[Action],
        size: FrameSize,
    ) -> Result<ActResult, DesktopError> {
        let (io, _busy, notice) = self.use_screen(bot_id).await?;
        // The group's counters are read while the batch runs.
        let notice = read_notice(notice);
        let settle = self.config.settle;
        let x = match io {
            Io::X(x) => x,
            Io::Commands(c) => {
                let (react, quiet) = settle.for_batch(actions);
                let batch = c.act(actions, settle, react, quiet);
                let (batch, notice) = tokio::join!(batch, notice);
                let (completed, error, mut observation) = batch?;
                observation.frame = crate::desktop::frame_scale::fit_png(observation.frame, size)?;
                observation.frame.notice = notice;
                return Ok(ActResult {
                    completed,
                    error,
                    observation,
                });
            }
        };
        let actions = actions.to_vec();
        let batch = tokio::task::spawn_blocking(move || {
            let mut x = x.lock().unwrap_or_else(|e| e.into_inner());
            let (completed, error) = match x.apply_batch(&actions) {
                Ok(()) => (actions.len(), None),
                Err(DesktopError::Action {
                    index,
                    reason,
                    invalid: true,
                }) => (index, Some(ActStop::invalid(reason))),
                Err(DesktopError::Action { index, reason, .. }) => {
                    (index, Some(ActStop::failed(reason)))
                }
                Err(e) => (0, Some(ActStop::failed(e.to_string()))),
            };
            let (react, quiet) = settle.for_batch(&actions);
            let shot = x.settle_sized(react, quiet, settle.timeout, size)?;
            Ok::<_, DesktopError>((completed, error, shot))
        });
        let (batch, notice) = tokio::join!(batch, notice);
        let (completed, error, shot) =
            batch.map_err(|e| DesktopError::X(format!("input task: {e}")))??;
        let mut observation = Observation::from(shot);
        observation.frame.notice = notice;
        Ok(ActResult {
            completed,
            error,
            observation,
        })
    }

    /// The display connection of the bot's screen, thawed, marked used and busy, with how the
    /// call learns what the bot must hear about its desktop. The table is let go before that
    /// is read: a group's counters (a request to the supervisor for a container's desktop)
    /// never hold up another bot's calls.
    pub(super) async fn use_screen(
        &self,
        bot_id: &str,
    ) -> Result<(Io, BusyGuard, Option<GroupNotice>), DesktopError> {
        let mut table = self.table.lock().await;
        let (_, screen) = table.active_mut(bot_id)?;
        screen.last_used = Instant::now();
        self.thaw(screen).await?;
        let io = screen
            .io
            .clone()
            .ok_or_else(|| DesktopError::X("no display connection".into()))?;
        let notice = self.group_notice(screen);
        screen.busy.fetch_add(1, Ordering::SeqCst);
        Ok((io, BusyGuard(screen.busy.clone()), notice))
    }
}
