//! The bots' browsers through DevTools: bridges and routes to their ports, and their state saved for a checkpoint.

use super::*;

impl DesktopRuntime {
    /// Bridges the bot's browser's DevTools port (on the machine's loopback) to a unix socket
    /// in the machine's X socket directory, which this process shares; returns the socket's
    /// file name there. The bridge is one of the screen's processes: teardown stops it.
    pub async fn devtools_bridge(&self, bot_id: &str, port: u16) -> Result<String, DesktopError> {
        let (tag, display) = self.active_screen(bot_id).await?;
        let name = format!("cdp-{display}-{port}");
        let socket = format!("/tmp/.X11-unix/{name}");
        let out = self
            .runner
            .run(&format!("test -S {}", shell_quote(&socket)), SCRIPT_TIMEOUT)
            .await?;
        if out.exit_code != 0 {
            self.spawn_bridge(bot_id, &tag, &socket, port).await?;
        }
        Ok(name)
    }

    /// A route to the bot's browser's DevTools through the machine's screen gateway, for a
    /// machine whose sockets this process cannot dial: a bridge listening on a fresh token's
    /// socket in the gateway's directory. The route is this process's own, never handed to
    /// anyone; the bridge is one of the screen's processes, so teardown stops it and its
    /// token reaches nothing after (a later screen's bridge has a token of its own).
    /// `published`: the gateway's port as this process reaches it, as for [`Self::route`].
    pub async fn devtools_route(
        &self,
        bot_id: &str,
        published: Option<u16>,
    ) -> Result<DevToolsRoute, DesktopError> {
        let (port, path) = self.devtools_endpoint(bot_id).await?;
        let tag = self.active_screen(bot_id).await?.0;
        self.gateway.ensure_started().await?;
        let token = crate::desktop::gateway::Token::fresh();
        let socket = self.gateway.socket_of(&token);
        self.spawn_bridge(bot_id, &tag, &socket.to_string_lossy(), port)
            .await?;
        let gateway = published.unwrap_or_else(|| self.gateway.port());
        Ok(DevToolsRoute {
            route: rakazo_actors::provider::ScreenRoute {
                upstream: format!("http://127.0.0.1:{gateway}"),
                token: token.expose().to_owned(),
            },
            port,
            path,
        })
    }

    /// Where the bot's browser listens for DevTools (port, browser path), from its profile's
    /// `DevToolsActivePort` read inside the machine (at most 4 KiB; a browser that has just
    /// started gets a little time to write it).
    pub(super) async fn devtools_endpoint(
        &self,
        bot_id: &str,
    ) -> Result<(u16, String), DesktopError> {
        check_id(bot_id)?;
        let file = self.profiles_dir().join(bot_id).join("DevToolsActivePort");
        let read = format!("head -c 4096 -- {}", shell_quote(&file.to_string_lossy()));
        let deadline = Instant::now() + DEVTOOLS_ENDPOINT_WAIT;
        loop {
            let out = self.runner.run(&read, SCRIPT_TIMEOUT).await?;
            if let Some(endpoint) = crate::desktop::cdp::parse_endpoint(&out.stdout) {
                return Ok(endpoint);
            }
            if Instant::now() >= deadline {
                return Err(DesktopError::Browser(
                    "the browser has no DevTools endpoint yet".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts a DevTools bridge on `socket` to the browser's loopback `port`, as one of the
    /// bot's screen's processes.
    pub(super) async fn spawn_bridge(
        &self,
        bot_id: &str,
        tag: &str,
        socket: &str,
        port: u16,
    ) -> Result<(), DesktopError> {
        let q = shell_quote(socket);
        let program = install_program(
            &*self.runner,
            &self.config.run_dir,
            "devtools-bridge",
            DEVTOOLS_BRIDGE_SOURCE,
        )
        .await?;
        let joins = self.group_joins(tag, Phase::AtWork).await;
        let pid = self
            .runner
            .spawn(&SpawnSpec {
                argv: vec![
                    "python3".into(),
                    "-I".into(),
                    program.to_string_lossy().into_owned(),
                    socket.to_owned(),
                    port.to_string(),
                ],
                env: tagged_env(tag),
                join: joins.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await?;
        if wait_ready(
            &*self.runner,
            pid,
            &format!("test -S {q}"),
            XVFB_READY_TIMEOUT,
        )
        .await?
            != Readiness::Ready
        {
            let _ = self.runner.stop(pid, STACK_STOP_GRACE).await;
            return Err(DesktopError::Browser(
                "the DevTools bridge did not start".into(),
            ));
        }
        if joins.is_none()
            && let Some(groups) = &self.config.groups
            && let Err(e) = groups.enter(tag, Phase::AtWork).await
        {
            tracing::warn!(bot.id = bot_id, error = %e, "desktop.limits.enter_failed");
        }
        Ok(())
    }

    /// Saves or loads the cookies of `bot_id`'s browser through its DevTools port; a failure
    /// is logged, never fatal (the browser keeps running either way). Says whether a file was
    /// written.
    pub(super) async fn devtools_of(&self, bot_id: &str, action: DevToolsAction) -> bool {
        let profile = profile_dir(&self.config.workspace, bot_id);
        // A load waits for the port of a browser that is still starting.
        let timeout = match action {
            DevToolsAction::Load => BROWSER_WINDOW_TIMEOUT + SCRIPT_TIMEOUT,
            _ => SCRIPT_TIMEOUT,
        };
        let out = self
            .runner
            .run(&devtools_script(&profile, action), timeout)
            .await;
        let failed = match &out {
            Ok(o) if o.exit_code == 0 => return o.stdout.trim() == "written",
            Ok(o) => format!("exit {}", o.exit_code),
            Err(e) => e.to_string(),
        };
        let event = match action {
            DevToolsAction::Load => "desktop.browser.cookies_restore_failed",
            _ => "desktop.browser.cookies_save_failed",
        };
        tracing::warn!(bot.id = bot_id, error = %failed, "{event}");
        false
    }

    /// Makes every running browser's state consistent in the workspace without closing it (a
    /// person may be watching or driving it, a bot's run may be using it), then runs
    /// `export`. Each browser's cookies are read through DevTools and written to its profile
    /// ([`crate::desktop::browser::SAVED_COOKIES`], rewritten only when they changed); the archive
    /// leaves out the cookie database Chromium writes on its own schedule and the files it
    /// rewrites while idle, and the browser gets the saved cookies back at its next start.
    /// The browsers keep their processes, windows and viewers.
    pub async fn with_browser_state_saved<T>(
        &self,
        export: impl std::future::Future<Output = T>,
    ) -> Result<T, DesktopError> {
        // Under the table lock only to thaw each browser and mark its screen busy (the
        // freezer leaves a busy screen alone); the saves themselves run without it, so the
        // bots' tools go on meanwhile.
        let browsers: Vec<(String, BusyGuard)> = {
            let mut table = self.table.lock().await;
            let mut browsers = Vec::new();
            for slot in &mut table.slots {
                if let SlotState::Active(screen) = &mut slot.state
                    && screen.browser.is_some()
                {
                    // A frozen browser answers no DevTools call; the next sweep freezes it again.
                    if let Err(e) = self.thaw(screen).await {
                        tracing::warn!(bot.id = %screen.bot_id, error = %e, "desktop.freeze.thaw_failed");
                    }
                    screen.busy.fetch_add(1, Ordering::SeqCst);
                    browsers.push((screen.bot_id.clone(), BusyGuard(screen.busy.clone())));
                }
            }
            browsers
        };
        let running = browsers.len();
        let saves = browsers
            .iter()
            .map(|(bot_id, _)| async move { self.devtools_of(bot_id, DevToolsAction::Save).await });
        let written = futures_util::future::join_all(saves)
            .await
            .into_iter()
            .filter(|w| *w)
            .count();
        drop(browsers);
        tracing::info!(browsers = running, written, "desktop.browsers.state_saved");
        if written > 0 || running > 0 {
            // A file younger than the survey's window (a new snapshot, or what a browser
            // wrote a while after activity) is not vouched for, and the next checkpoint
            // would read its piece again.
            self.wait_for_quiet_profiles().await;
        }
        Ok(export.await)
    }

    /// Waits, for at most [`PROFILE_QUIET_TIMEOUT`], until no archived file of the profiles
    /// changed within the survey's window: a browser writes its profile a while after
    /// activity, and a file that young would keep the checkpoint from vouching for its piece.
    pub(super) async fn wait_for_quiet_profiles(&self) {
        let profiles = self.profiles_dir().to_string_lossy().into_owned();
        let transient = crate::stores::archive::TRANSIENT
            .iter()
            .map(|n| format!("-name {}", shell_quote(n)))
            .collect::<Vec<_>>()
            .join(" -o ");
        let window_s = (crate::stores::archive::RACY_WINDOW_NS / 1_000_000_000) as u64 + 1;
        let script = format!(
            "[ -d {p} ] || exit 0
             find {p} \\( {transient} -o -name '{spare}*' \\) -prune -o -newermt '-{window_s} seconds' -print -quit 2>/dev/null",
            p = shell_quote(&profiles),
            spare = crate::stores::archive::SPARE_PROFILE_PREFIX
        );
        let started = Instant::now();
        while started.elapsed() < PROFILE_QUIET_TIMEOUT {
            match self.runner.run(&script, SCRIPT_TIMEOUT).await {
                Ok(o) if o.exit_code == 0 && o.stdout.trim().is_empty() => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                Err(_) => return,
            }
        }
        tracing::info!("desktop.browsers.profiles_busy");
    }
}
