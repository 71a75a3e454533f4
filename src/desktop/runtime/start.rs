//! Starting a screen's display stack, readying its profile and starting its browser.

use super::*;

impl DesktopRuntime {
    /// The directory of the bots' (and the spares') browser profiles in the workspace.
    pub(super) fn profiles_dir(&self) -> PathBuf {
        self.config
            .workspace
            .join(crate::desktop::browser::PROFILES_DIR)
    }

    pub(super) fn env(&self, tag: &str, display: u32, home: &str) -> Vec<(String, String)> {
        let mut env = tagged_env(tag);
        env.push(("DISPLAY".into(), format!(":{display}")));
        env.push(("HOME".into(), home.to_string()));
        env
    }

    /// Starts Xvfb on a free display number and the window manager on it, both born in the
    /// desktop's control group where its owner can place them so; a group made for a stack
    /// that did not start is removed.
    pub(super) async fn start_stack(&self, bot_id: &str) -> Result<Screen, DesktopError> {
        let run_dir = self.config.run_dir.to_string_lossy();
        let tag = format!("{run_dir}/screen-{}", uuid::Uuid::new_v4().simple());
        let joins = self.group_joins(&tag, Phase::Starting).await;
        let started = self.start_stack_tagged(bot_id, &tag, joins.clone()).await;
        if started.is_err()
            && joins.is_some()
            && let Some(groups) = &self.config.groups
            && let Err(e) = groups.remove(&tag).await
        {
            tracing::warn!(bot.id = bot_id, error = %e, "desktop.limits.remove_failed");
        }
        started
    }

    /// [`Self::start_stack`] tagged `tag`, its processes joining `joins` (`None`: found by
    /// their tag once started).
    pub(super) async fn start_stack_tagged(
        &self,
        bot_id: &str,
        tag: &str,
        joins: Option<Vec<Join>>,
    ) -> Result<Screen, DesktopError> {
        let run_dir = self.config.run_dir.to_string_lossy().into_owned();
        // The run directory is made in the same script as the first display number's check
        // and the X server's start: two round trips fewer on a machine reached through its
        // vendor's exec.
        let mut prepare = Some(format!(
            "mkdir -p {q}/wm/.fluxbox {q}/xdg-config {q}/xdg-cache && chmod 700 {q} || exit 4\n\
             printf '%s\\n' {init} > {q}/wm/.fluxbox/init || exit 4\n\
             printf '%s\\n' {overlay} > {q}/wm/.fluxbox/overlay || exit 4\n",
            q = shell_quote(&run_dir),
            init = FLUXBOX_INIT
                .iter()
                .map(|l| shell_quote(&l.replace("{home}", &format!("{run_dir}/wm"))))
                .collect::<Vec<_>>()
                .join(" "),
            overlay = FLUXBOX_OVERLAY
                .iter()
                .map(|l| shell_quote(l))
                .collect::<Vec<_>>()
                .join(" "),
        ));
        for _ in 0..DISPLAY_SEARCH {
            let display = self
                .config
                .displays
                .claim()
                .ok_or_else(|| DesktopError::Stack("no free X display number".into()))?;
            // The socket directory is made first: an X server makes it itself when it is
            // missing, but of two servers starting at once on such a machine the one whose
            // `mkdir` loses the race runs on without any socket (Xtrans: "mkdir failed,
            // errno = 17"), and nothing can connect to it. Then, when a live server owns this
            // number (someone else's), the number stays claimed and the search moves on.
            let check = format!(
                "[ -d /tmp/.X11-unix ] || mkdir -p -m 1777 /tmp/.X11-unix 2>/dev/null\n\
                 lock=/tmp/.X{display}-lock\n\
                 if [ -e \"$lock\" ]; then pid=$(tr -d ' \\n' < \"$lock\" 2>/dev/null)\n\
                   s=$(ps -o stat= -p \"$pid\" 2>/dev/null) && [ \"${{s#Z}}\" = \"$s\" ] && exit 3\n\
                 fi\n\
                 rm -f \"$lock\" /tmp/.X11-unix/X{display}\n"
            );
            let mut argv: Vec<String> = vec![
                "Xvfb".into(),
                format!(":{display}"),
                "-screen".into(),
                "0".into(),
                format!("{SCREEN_WIDTH}x{SCREEN_HEIGHT}x24"),
                "-nolisten".into(),
                "tcp".into(),
                "-noreset".into(),
                "-br".into(),
            ];
            if self.launch.lean {
                // No software OpenGL for clients: Mesa's libraries cost about 50 MiB in the
                // first server and 8 MiB in each further one, and the browser
                // (`--disable-gpu`) never uses them.
                argv.extend(["-extension".into(), "GLX".into()]);
            }
            let xvfb = SpawnSpec {
                argv,
                env: tagged_env(tag),
                log: format!("{run_dir}/xvfb-{display}.log"),
                join: joins.clone().unwrap_or_default(),
                ..Default::default()
            };
            // The check and the server's start are one script.
            let before = match prepare.take() {
                Some(prepare) => prepare + &check,
                None => check,
            };
            let xvfb = match self.runner.spawn_after(&before, &xvfb).await {
                Ok(Ok(pid)) => pid,
                Ok(Err(out)) if out.exit_code == 3 => continue,
                Ok(Err(out)) => {
                    self.config.displays.release(display);
                    let what = match out.exit_code {
                        4 => "run directory".to_owned(),
                        code => format!("X server start (exit {code})"),
                    };
                    return Err(DesktopError::Stack(format!(
                        "{what}: {}",
                        out.stderr.trim()
                    )));
                }
                Err(e) => {
                    self.config.displays.release(display);
                    return Err(e);
                }
            };
            let mut screen = Screen {
                bot_id: bot_id.to_string(),
                tag: tag.to_owned(),
                display,
                xvfb: Some(xvfb),
                wm: None,
                browser: None,
                io: None,
                last_used: Instant::now(),
                busy: Arc::new(AtomicUsize::new(0)),
                grouped: joins.is_some(),
                born_grouped: joins.is_some(),
                starting: true,
                frozen: false,
                oom_seen: Arc::default(),
                retired: Arc::default(),
                browser_seen: None,
                spare_link: None,
            };
            let connect = async {
                if self.config.commands_only {
                    CommandScreen::connect(
                        self.runner.clone(),
                        &self.config.run_dir,
                        display,
                        XVFB_READY_TIMEOUT,
                    )
                    .await
                    .map(|c| Io::Commands(Arc::new(c)))
                } else {
                    let socket_dir = self.config.x11_socket_dir.clone();
                    connect_when_ready(socket_dir, display, XVFB_READY_TIMEOUT)
                        .await
                        .map(|x| Io::X(Arc::new(StdMutex::new(x))))
                }
            };
            // The window manager starts while the runtime connects: it waits for the server's
            // socket itself.
            let wm = SpawnSpec {
                argv: wm_argv(display),
                env: self.env(tag, display, &format!("{run_dir}/wm")),
                log: format!("{run_dir}/wm-{display}.log"),
                nice: self.start_nice(),
                join: joins.clone().unwrap_or_default(),
                ..Default::default()
            };
            let wm = self.runner.spawn(&wm);
            let (io, wm) = tokio::join!(connect, wm);
            screen.wm = wm.as_ref().ok().copied();
            match (io, wm) {
                (Ok(io), Ok(_)) => screen.io = Some(io),
                (Err(e), _) | (_, Err(e)) => {
                    if matches!(e, DesktopError::X(_)) {
                        // Whether the server died or never answered in time, for whoever reads
                        // the log after a failed start.
                        let alive = self.runner.is_running(xvfb).await.ok();
                        tracing::warn!(bot.id = bot_id, screen.display = screen.display, x_server.alive = ?alive, error = %e, "desktop.x_server.not_ready");
                    }
                    let _ = self.stop_screen(&mut screen).await;
                    return Err(e);
                }
            }
            self.enter_group(&mut screen).await;
            return Ok(screen);
        }
        Err(DesktopError::Stack("no free X display number".into()))
    }

    /// Makes `bot_id`'s profile directory ready for a browser: created, the locks and DevTools
    /// port file of an earlier browser removed. Says whether the profile is new and whether
    /// browsers here run as root. With `spare`, a taken spare desktop, the same script hands
    /// its profile over to a bot without one ([`spare_profile::handover_script`]) and says how
    /// that went. On this host the same is done by system calls ([`profile_local`]), the script
    /// only where that path declines.
    pub(super) async fn prepare_profile(
        &self,
        bot_id: &str,
        spare: Option<spare_profile::Spare<'_>>,
    ) -> Result<Profile, DesktopError> {
        if self.runner.on_this_host() {
            let (workspace, bot) = (self.config.workspace.clone(), bot_id.to_owned());
            let spare = spare.map(|s| (s.name.to_owned(), s.alive.to_vec(), s.browser));
            let done = tokio::task::spawn_blocking(move || {
                let spare = spare
                    .as_ref()
                    .map(|(name, alive, browser)| spare_profile::Spare {
                        name,
                        alive,
                        browser: *browser,
                    });
                profile_local::prepare(&workspace, &bot, spare)
            })
            .await
            .ok()
            .flatten();
            if let Some(done) = done {
                let as_root = *self.as_root.get_or_init(|| async { done.uid == 0 }).await;
                return Ok(Profile {
                    fresh: done.fresh,
                    as_root,
                    handover: done.handover,
                });
            }
        }
        let profile = profile_dir(&self.config.workspace, bot_id);
        let p = shell_quote(&profile.to_string_lossy());
        // The spare's check and hand-over run in a subshell: they end with `exit`.
        let handover = spare.map(|spare| {
            let profiles = self.profiles_dir();
            // Its processes are looked at first, then whether the bot has a profile.
            let unchecked = spare_profile::Spare {
                alive: &[],
                ..spare
            };
            format!(
                "(\n{}[ -d {p}/Default ] && exit {}\n{}) >/dev/null 2>&1\necho \"handover $?\"\n",
                spare_profile::alive_script(spare.alive),
                spare_profile::BOT_HAS_PROFILE,
                spare_profile::handover_script(&profiles, bot_id, &unchecked),
            )
        });
        // Builtins but where there is something to do: `rm` only when an earlier browser left
        // a lock, `mkdir` only when the profile is missing (after a hand-over it is the
        // spare's). The locks go before a hand-over, which brings the spare browser's own.
        let out = self
            .runner
            .run(
                &format!(
                    "if [ -d {p}/Default ]; then echo existing; else echo fresh; fi\n\
                     for f in {locks}; do\n\
                     if [ -e \"$f\" ] || [ -L \"$f\" ]; then rm -f -- {locks} || exit 1; break; fi\n\
                     done\necho \"$EUID\"\n{}[ -d {p} ] || mkdir -p -- {p} || exit 1\n",
                    handover.unwrap_or_default(),
                    locks = lock_paths(&profile).join(" "),
                ),
                SCRIPT_TIMEOUT,
            )
            .await?;
        if out.exit_code != 0 {
            return Err(DesktopError::Stack(format!(
                "browser profile: {}",
                out.stderr.trim()
            )));
        }
        let mut lines = out.stdout.lines();
        let fresh = lines.next() == Some("fresh");
        let uid = lines.next().unwrap_or_default().trim().to_string();
        let handover = lines
            .next()
            .and_then(|l| l.strip_prefix("handover "))
            .and_then(|code| code.trim().parse().ok());
        let as_root = *self.as_root.get_or_init(|| async { uid == "0" }).await;
        Ok(Profile {
            fresh,
            as_root,
            handover,
        })
    }

    /// Starts the bot's Chromium on its profile and waits for its first window, its group held
    /// as a starting desktop's until then; started or not, the group gets every CPU again (a
    /// screen whose restart failed stays, and must not stay held).
    pub(super) async fn start_browser(
        &self,
        screen: &mut Screen,
        prepared: Option<Profile>,
    ) -> Result<(), DesktopError> {
        screen.starting = true;
        let started = self.start_browser_held(screen, prepared).await;
        screen.starting = false;
        self.enter_group(screen).await;
        if self.lowered_while_starting() {
            self.raise_priority(screen).await;
        }
        started
    }

    /// [`Self::start_browser`], while the group is held.
    pub(super) async fn start_browser_held(
        &self,
        screen: &mut Screen,
        prepared: Option<Profile>,
    ) -> Result<(), DesktopError> {
        let workspace = self.config.workspace.to_string_lossy().into_owned();
        let profile = profile_dir(&self.config.workspace, &screen.bot_id);
        let locks = lock_paths(&profile);
        let Profile { fresh, as_root, .. } = match prepared {
            Some(prepared) => prepared,
            None => self.prepare_profile(&screen.bot_id, None).await?,
        };
        let mut argv = Vec::new();
        if as_root && self.start_nice() > 0 {
            // Chromium sets its threads' nice values itself (0, and -8 for the threads that
            // draw), which only a process allowed to raise priorities manages: a browser run
            // by root goes without that capability, so it stays below the X server like
            // any other.
            argv.extend(
                [
                    "setpriv",
                    "--inh-caps=-sys_nice",
                    "--bounding-set=-sys_nice",
                ]
                .map(String::from),
            );
        }
        argv.push("chromium".to_string());
        argv.extend(self.chromium_args(&profile, as_root));
        if fresh {
            // A new profile opens a blank page rather than the new-tab page, which keeps
            // loading without a network and resets the address bar when it gives up.
            argv.push("about:blank".into());
        }
        let log = format!(
            "{}/browser-{}.log",
            self.config.run_dir.to_string_lossy(),
            screen.display
        );
        let mut env = self.env(&screen.tag, screen.display, &workspace);
        // Chromium's own config and cache outside the profile stay out of the workspace.
        let run_dir = self.config.run_dir.to_string_lossy();
        env.push(("XDG_CONFIG_HOME".into(), format!("{run_dir}/xdg-config")));
        env.push(("XDG_CACHE_HOME".into(), format!("{run_dir}/xdg-cache")));
        let mut spec = SpawnSpec {
            argv,
            env,
            cwd: workspace.clone(),
            log: log.clone(),
            nice: self.start_nice(),
            join: Vec::new(),
        };
        let started = Instant::now();
        let bot_id = screen.bot_id.clone();
        // A browser that dies before its first window (seen under heavy load) gets one more
        // try; the error carries the last line of its log.
        let mut attempt = 0;
        // A lowered start is watched while it lasts, and raised at once should it starve.
        let mut _watch = None;
        let (io, cookies) = loop {
            attempt += 1;
            self.join_screen_group(screen, &mut spec).await;
            let pid = self.runner.spawn(&spec).await?;
            screen.browser = Some(pid);
            _watch = self
                .start_raise(screen, pid)
                .map(|raise| StartWatch::new(pid, screen.display, screen.bot_id.clone(), raise));
            // Its group at once, where it was not born there: the browser's start-up (its
            // zygotes, network process, first page) is most of a desktop's CPU and memory, and
            // counts against the desktop's own weight and ceiling.
            self.enter_group_watched(screen, &_watch).await;
            // The cookies saved at the last checkpoint or quit go back as soon as its DevTools
            // port answers, while its window is awaited (the cookie database itself is not in
            // the archive, so a restored profile has only these). The port file of an earlier
            // browser was removed with the locks, so the script waits for this one's.
            let mut cookies: Pin<Box<dyn Future<Output = u64> + Send + '_>> = Box::pin(async {
                self.devtools_of(&bot_id, DevToolsAction::Load).await;
                started.elapsed().as_millis() as u64
            });
            let mut loaded = None;
            let window = {
                let window = self.first_window(screen, pid);
                tokio::pin!(window);
                loop {
                    tokio::select! {
                        w = &mut window => break w?,
                        at = &mut cookies, if loaded.is_none() => loaded = Some(at),
                    }
                }
            };
            match window {
                Ok(io) => {
                    break (
                        io,
                        match loaded {
                            Some(at) => Box::pin(std::future::ready(at)),
                            None => cookies,
                        },
                    );
                }
                Err(why) if attempt < 2 && why.exited => {
                    drop(cookies);
                    tracing::warn!(bot.id = %screen.bot_id, "desktop.browser.start_retry");
                    let _ = self.runner.stop(pid, BROWSER_STOP_GRACE).await;
                    screen.browser = None;
                    let _ = self
                        .runner
                        .run(&format!("rm -f {}", locks.join(" ")), SCRIPT_TIMEOUT)
                        .await;
                }
                Err(why) => {
                    let last = last_log_line(&*self.runner, &log, &[]).await;
                    return Err(DesktopError::Stack(if why.exited {
                        format!("the browser exited before opening a window ({last})")
                    } else {
                        "the browser did not open a window in time".into()
                    }));
                }
            }
        };
        let window_ms = started.elapsed().as_millis() as u64;
        // Let the first page finish loading: a page that replaces the address bar's contents
        // would swallow what the first batch types there.
        let quiet = Settle {
            first_delay: BROWSER_QUIET_DELAY,
            interval: BROWSER_QUIET_INTERVAL,
            quiet: BROWSER_QUIET_INTERVAL,
            pointer_quiet: BROWSER_QUIET_INTERVAL,
            timeout: BROWSER_QUIET_TIMEOUT,
        };
        let settled = async {
            match io {
                Io::X(x) => tokio::task::spawn_blocking(move || {
                    x.lock().unwrap_or_else(|e| e.into_inner()).settle(
                        quiet.first_delay,
                        quiet.quiet,
                        quiet.timeout,
                    )
                })
                .await
                .map_err(|e| DesktopError::X(format!("settle task: {e}")))?
                .map(drop),
                Io::Commands(c) => c
                    .settle(quiet, quiet.first_delay, quiet.quiet)
                    .await
                    .map(drop),
            }?;
            Ok::<_, DesktopError>(started.elapsed().as_millis() as u64)
        };
        // Meanwhile, the group again, for any process the first scan could not place (what it
        // forks from now on inherits the group; none is left out of a screen whose processes
        // are born in it), and the cookies.
        let grouped = async {
            self.enter_group_watched(screen, &_watch).await;
            cookies.await
        };
        let (settled_at, cookies_at) = tokio::join!(settled, grouped);
        let settled_at = settled_at?;
        screen.browser_seen = Some(Instant::now());
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            screen.display = screen.display,
            bot.id = %screen.bot_id,
            elapsed_ms,
            window_ms,
            cookies_ms = cookies_at,
            settle_ms = settled_at - window_ms,
            "desktop.browser.started"
        );
        Ok(())
    }

    /// Waits for the browser `pid` to map its first window on the screen, returning the
    /// screen's connection; the inner error says whether the browser exited or timed out.
    pub(super) async fn first_window(
        &self,
        screen: &Screen,
        pid: u32,
    ) -> Result<Result<Io, NoWindow>, DesktopError> {
        let io = screen
            .io
            .clone()
            .ok_or_else(|| DesktopError::X("no display connection".into()))?;
        let started = Instant::now();
        let mut looks = 0u32;
        loop {
            looks += 1;
            let windows = match &io {
                Io::X(x) => {
                    let x2 = x.clone();
                    tokio::task::spawn_blocking(move || {
                        browser_windows(&x2.lock().unwrap_or_else(|e| e.into_inner()))
                    })
                    .await
                    .map_err(|e| DesktopError::X(format!("window task: {e}")))??
                }
                Io::Commands(c) => c.browser_windows().await?,
            };
            if windows > 0 {
                return Ok(Ok(io));
            }
            // Whether it still runs is a script on the machine (a shell and `ps`): asked once
            // a second, not at every look, so that many browsers starting at once do not
            // spend the CPU they need on being watched.
            if looks.is_multiple_of(BROWSER_ALIVE_EVERY) && !self.runner.is_running(pid).await? {
                return Ok(Err(NoWindow { exited: true }));
            }
            if started.elapsed() > BROWSER_WINDOW_TIMEOUT {
                return Ok(Err(NoWindow { exited: false }));
            }
            tokio::time::sleep(BROWSER_WINDOW_LOOK).await;
        }
    }
}

/// The window manager's command on `display`: it waits (up to 10 s) for the X server's socket,
/// then becomes fluxbox.
fn wm_argv(display: u32) -> Vec<String> {
    let wait = format!(
        "i=0; while [ ! -S /tmp/.X11-unix/X{display} ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; exec fluxbox"
    );
    vec!["sh".into(), "-c".into(), wait]
}

/// The lock and port files an earlier browser may have left in `profile`, shell-quoted.
fn lock_paths(profile: &std::path::Path) -> Vec<String> {
    LOCK_FILES
        .iter()
        .map(|f| shell_quote(&profile.join(f).to_string_lossy()))
        .collect()
}

/// The window manager's settings: no toolbar, new windows focused, and the style overlay
/// below.
const FLUXBOX_INIT: &[&str] = &[
    "session.screen0.toolbar.visible: false",
    "session.screen0.focusNewWindows: true",
    "session.styleOverlay: {home}/.fluxbox/overlay",
];

/// The style overlay: leave the root window alone (Xvfb paints it black). Any other
/// background option, `none`, `flat` and `solid` included, has fluxbox 1.3 run `fbsetbg`,
/// which on a computer without a wallpaper setter opens an `xmessage` dialog on the screen.
const FLUXBOX_OVERLAY: &[&str] = &["background: unset"];

async fn connect_when_ready(
    socket_dir: Option<PathBuf>,
    display: u32,
    timeout: Duration,
) -> Result<XDisplay, DesktopError> {
    let started = Instant::now();
    loop {
        let dir = socket_dir.clone();
        let connect = move || match dir {
            Some(dir) => XDisplay::connect_in(&dir, display),
            None => XDisplay::connect(display),
        };
        match tokio::task::spawn_blocking(connect).await {
            Ok(Ok(x)) => return Ok(x),
            Ok(Err(e)) if started.elapsed() > timeout => return Err(e),
            Err(e) => return Err(DesktopError::X(format!("connect task: {e}"))),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
