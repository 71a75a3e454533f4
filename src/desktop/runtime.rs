//! [`DesktopRuntime`]: the screens of one machine, one per active bot, each on a display slot.
//! The slot a screen opens on is chosen by the caller (the computer's slot table,
//! `rakazo_actors::slots`); this runtime starts the stack there or refuses a busy slot with
//! [`DesktopError::SlotBusy`], never picking another. The X display number is the host's
//! ([`DisplayPool`]), independent of the slot.
//!
//! A slot runs Xvfb (`:display`, 1280x800x24), a window manager and the bot's Chromium on its
//! persistent profile. Every (re)assignment and every teardown bumps the slot's generation.
//! Teardown announces the ended generation on [`DesktopRuntime::subscribe`] first, then revokes
//! the slot's gateway capabilities, then stops the processes; only then is the slot free. A
//! teardown that fails leaves the slot reserved (not reusable) until a retry succeeds.
//!
//! The slot table's lock is held only to read or change the table, never while a display
//! stack or a browser starts or stops: a slot being started or stopped is marked so, and other
//! bots' screens keep working meanwhile. Which screen gives way at the screen limit is decided
//! by the screen actors (`rakazo_actors::slots`); at the limit this runtime only refuses.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use rakazo_actors::provider::{ActStop, Action, Frame, FrameSize};
use tokio::sync::{Mutex, broadcast};
use x11rb::protocol::xproto::{AtomEnum, ConnectionExt as _, MapState};

use super::action_rules::answers_later;
use super::browser::{
    DevToolsAction, LOCK_FILES, Launch, chromium_args, devtools_script, profile_dir,
};
use super::capture::{XDisplay, x_err};
use super::cgroup::{Join, Phase};
use super::command::{
    CommandRunner, Readiness, SCRIPT_TIMEOUT, SpawnSpec, TAG_VAR, install_program, last_log_line,
    minimal_env, reap_script, sweep_script, wait_ready,
};
use super::gateway::{Capability, Gateway, Policy};
use super::group_notice::{GroupNotice, read_notice};
use super::groups::DesktopGroups;
use super::profile_local;
use super::screen_commands::CommandScreen;
use super::spare_profile;
use super::start_watch::StartWatch;
use super::warm::{WarmPool, WarmStatus};
use super::{DesktopError, check_id, shell_quote};

/// Screen size of every display.
pub const SCREEN_WIDTH: u32 = 1280;
/// Screen height of every display.
pub const SCREEN_HEIGHT: u32 = 800;
/// How long Xvfb gets to accept connections.
const XVFB_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new browser gets to map its first window.
const BROWSER_WINDOW_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between looks for a new browser's first window, and how many looks pass between
/// asking whether it still runs.
const BROWSER_WINDOW_LOOK: Duration = Duration::from_millis(100);
const BROWSER_ALIVE_EVERY: u32 = 10;
/// First look, interval and limit of the wait for a new browser's screen to stop changing.
const BROWSER_QUIET_DELAY: Duration = Duration::from_millis(300);
const BROWSER_QUIET_INTERVAL: Duration = Duration::from_millis(250);
const BROWSER_QUIET_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a browser seen running is taken to be running without asking again.
const BROWSER_CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long a caller waits between looks at a slot another call is starting or stopping.
const SLOT_BUSY_POLL: Duration = Duration::from_millis(50);
/// How long a checkpoint waits for the browsers' profiles to stop changing.
const PROFILE_QUIET_TIMEOUT: Duration = Duration::from_secs(6);
/// How long Chromium gets to save its session and cookies on SIGTERM.
const BROWSER_STOP_GRACE: Duration = Duration::from_secs(20);
/// How long Xvfb and the window manager get on SIGTERM.
const STACK_STOP_GRACE: Duration = Duration::from_secs(2);
/// How long the browsers an earlier process left get to quit before their displays stop.
pub const REAP_GRACE: Duration = Duration::from_secs(10);
/// How long the background filler waits after a spare stack failed to start, times the
/// failures in a row (at most [`WARM_RETRY_MAX`]).
const WARM_RETRY: Duration = Duration::from_secs(2);
const WARM_RETRY_MAX: Duration = Duration::from_secs(60);
/// How long after a spare was taken its replacement starts.
const REFILL_DELAY: Duration = Duration::from_secs(2);
/// How long a new desktop waits for a spare that is starting (its display stack and
/// browser) before starting a stack of its own.
const SPARE_WAIT: Duration = Duration::from_secs(10);
/// How long a spare's browser that a bot with its own profile replaces gets on SIGTERM: its
/// profile is removed after it, so it has nothing to save.
const SPARE_BROWSER_GRACE: Duration = Duration::from_millis(200);
/// Display numbers tried before giving up on finding a free one.
const DISPLAY_SEARCH: u32 = 64;
/// Display slots one machine hosts at most (no more than the display numbers tried).
const MAX_SLOTS: u32 = DISPLAY_SEARCH;

/// The in-computer DevTools bridge (Python 3 standard library only).
const DEVTOOLS_BRIDGE_SOURCE: &str = include_str!("devtools_bridge.py");
/// How long a fresh browser gets to publish its DevTools endpoint.
const DEVTOOLS_ENDPOINT_WAIT: Duration = Duration::from_secs(10);

/// A route to a bot's browser's DevTools through the screen gateway (see
/// [`DesktopRuntime::devtools_route`]): the gateway's socket route, and the browser's own
/// loopback port and browser path, which the DevTools handshake names.
pub struct DevToolsRoute {
    /// The gateway and the bridge's socket token.
    pub route: rakazo_actors::provider::ScreenRoute,
    /// The browser's DevTools port on the machine's loopback.
    pub port: u16,
    /// The browser's DevTools path (`/devtools/browser/<id>`).
    pub path: String,
}

/// Default [`Settle::pointer_quiet`] in milliseconds: the same as every other batch's. 20 ms
/// (one Chromium frame) was tried and, on a loaded machine, returned a frame without the hover
/// repaint the moves caused (`tests/hover_settle.rs`), so it is not the default.
pub const POINTER_QUIET_MS: u64 = 30;

/// How a batch waits for the screen to stop changing.
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    /// Time applications get to answer input before the screen counts as settled (on a
    /// direct display only after clicks, drags, scrolls and keys; see
    /// [`super::action_rules::answers_later`]), and the pause before the first look when
    /// polling.
    pub first_delay: Duration,
    /// Pause between looks when polling (the command path, or no DAMAGE extension).
    pub interval: Duration,
    /// On a direct display with DAMAGE: settled once nothing was drawn for this long.
    pub quiet: Duration,
    /// [`Self::quiet`] for a batch of pointer moves only: about one Chromium frame, as moves
    /// repaint at most hover styles, which come with the next frame.
    pub pointer_quiet: Duration,
    /// Give up and return the latest frame after this long.
    pub timeout: Duration,
}

impl Default for Settle {
    fn default() -> Self {
        Self {
            first_delay: Duration::from_millis(50),
            interval: Duration::from_millis(50),
            quiet: Duration::from_millis(30),
            pointer_quiet: Duration::from_millis(POINTER_QUIET_MS),
            timeout: Duration::from_secs(2),
        }
    }
}

/// X display numbers of one host, shared by every runtime whose displays live there.
#[derive(Debug)]
pub struct DisplayPool {
    /// First display number (`:1` by default).
    first: u32,
    /// Numbers in use by us, or found in use by someone else.
    taken: StdMutex<BTreeSet<u32>>,
}

impl DisplayPool {
    /// A pool handing out `:first` upward.
    pub fn new(first: u32) -> Arc<Self> {
        Arc::new(Self {
            first,
            taken: StdMutex::new(BTreeSet::new()),
        })
    }

    fn claim(&self) -> Option<u32> {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let n = (self.first..self.first + DISPLAY_SEARCH).find(|n| !taken.contains(n))?;
        taken.insert(n);
        Some(n)
    }

    fn release(&self, n: u32) {
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&n);
    }
}

/// What a runtime needs to know about its machine.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The workspace root on the machine (profiles live under it).
    pub workspace: PathBuf,
    /// A private directory on the machine for logs, the window manager's home and gateway sockets.
    pub run_dir: PathBuf,
    /// Most active screens at once; 0 = no limit (`SANDBOX_TEAM_SCREEN_LIMIT`).
    pub screen_limit: usize,
    /// X display numbers to use.
    pub displays: Arc<DisplayPool>,
    /// The gateway's TCP port on the machine; 0 = a free loopback port, chosen each time the
    /// gateway starts (a host's own gateway).
    pub gateway_port: u16,
    /// How batches settle.
    pub settle: Settle,
    /// Where this host finds the machine's X sockets (`X<display>`), when the displays run
    /// elsewhere and share their socket directory with us (a container's `/tmp/.X11-unix`
    /// bind-mounted from the host); `None` for this host's own `/tmp/.X11-unix`.
    pub x11_socket_dir: Option<PathBuf>,
    /// Reach the displays through commands only (an in-computer capture helper and
    /// `xdotool`), as on a remote vendor's machine; `x11_socket_dir` is then unused.
    pub commands_only: bool,
    /// The address the screen gateway listens on inside the machine: loopback on a host,
    /// every interface inside a container (whose port is published on the host's loopback).
    pub gateway_host: String,
    /// The owner of the machine's desktop control groups (CPU weight, memory ceiling,
    /// freezer); `None` where the machine has none to give.
    pub groups: Option<Arc<dyn DesktopGroups>>,
    /// Freeze a desktop after this long without a tool call, viewer or control (needs
    /// `groups`); `None` = never.
    pub freeze_after: Option<Duration>,
    /// Spare display stacks (Xvfb and window manager, no browser) kept started for the next
    /// desktops, refilled in the background once [`DesktopRuntime::start_warm_pool`] runs;
    /// 0 = none (`SANDBOX_DESKTOP_WARM_STACKS`).
    pub warm_stacks: usize,
}

impl RuntimeConfig {
    /// A machine on this host: its workspace and private run directory, displays from
    /// `displays`, a gateway on a free loopback port, this host's X sockets; no screen limit,
    /// no control groups, no freezing, no spares (callers set what they need).
    pub fn on_host(workspace: PathBuf, run_dir: PathBuf, displays: Arc<DisplayPool>) -> Self {
        Self {
            workspace,
            run_dir,
            screen_limit: 0,
            displays,
            gateway_port: 0,
            settle: Settle::default(),
            x11_socket_dir: None,
            commands_only: false,
            gateway_host: "127.0.0.1".into(),
            groups: None,
            freeze_after: None,
            warm_stacks: 0,
        }
    }
}

/// A desktop was frozen or thawed (for the screen's row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreezeChange {
    /// The bot whose desktop it is.
    pub bot_id: String,
    /// Whether it is frozen now.
    pub frozen: bool,
}

/// Announced when a slot generation ends, before the slot can be reused: every capability and
/// connection of `slot` granted at `ended` or earlier must be closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Teardown {
    /// The display slot.
    pub slot: u32,
    /// The generation that ended.
    pub ended: u64,
    /// The slot's generation from now on.
    pub generation: u64,
    /// The bot whose screen it was.
    pub bot_id: String,
}

/// A bot's open screen, as callers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScreenHandle {
    /// Display slot (ports and capabilities are per slot).
    pub slot: u32,
    /// The slot's current generation.
    pub generation: u64,
    /// X display number (`:display`).
    pub display: u32,
}

/// A frame and its hash.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The PNG frame.
    pub frame: Frame,
    /// Hash of the pixels; equal to the previous observation's when nothing changed.
    pub hash: u64,
}

/// The outcome of a batch.
#[derive(Clone, Debug)]
pub struct ActResult {
    /// How many actions completed, in order.
    pub completed: usize,
    /// Why the next action failed, if one did.
    pub error: Option<ActStop>,
    /// The settled screen after the batch.
    pub observation: Observation,
}

/// The processes and connection of one bot's screen.
struct Screen {
    bot_id: String,
    /// [`TAG_VAR`] value of every process of this screen, for the final sweep.
    tag: String,
    display: u32,
    xvfb: Option<u32>,
    wm: Option<u32>,
    browser: Option<u32>,
    /// How capture and input reach the display.
    io: Option<Io>,
    /// When the screen was last observed or acted on (eviction picks the oldest).
    last_used: Instant,
    /// Operations in progress; a screen with any is not idle.
    busy: Arc<AtomicUsize>,
    /// Its processes are in its control group.
    grouped: bool,
    /// Every process of it was started in its control group ([`DesktopGroups::prepare`]), so
    /// entering the group looks for none outside it.
    born_grouped: bool,
    /// Its control group is frozen.
    frozen: bool,
    /// Its stack or browser is starting (see [`Phase::Starting`]).
    starting: bool,
    /// OOM kills in its group already told to the bot (raised by whichever call tells it).
    oom_seen: Arc<AtomicU64>,
    /// When its browser was last seen running.
    browser_seen: Option<Instant>,
    /// The spare profile name its browser was started on, now a link to the bot's profile
    /// (removed at teardown; see [`super::spare_profile`]).
    spare_link: Option<String>,
}

impl Screen {
    /// The leaders of its process groups: the X server, the window manager, the browser.
    fn process_groups(&self) -> Vec<u32> {
        [self.xvfb, self.wm, self.browser]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// How capture and input reach one display.
#[derive(Clone)]
enum Io {
    /// A persistent X connection (x11rb) from this process.
    X(Arc<StdMutex<XDisplay>>),
    /// Commands on the machine.
    Commands(Arc<CommandScreen>),
}

enum SlotState {
    Free,
    /// The bot's stack or browser is starting, or its screen stopping, without the table lock.
    Busy(String),
    Active(Box<Screen>),
    /// Teardown failed; the slot stays out of use until a retry stops what is left.
    Reserved(Box<Screen>),
}

struct Slot {
    generation: u64,
    state: SlotState,
}

struct Table {
    slots: Vec<Slot>,
}

impl Table {
    fn slot_of(&self, bot_id: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(&s.state, SlotState::Active(sc) if sc.bot_id == bot_id))
    }

    /// The slot and screen of the bot's active screen.
    fn active_mut(&mut self, bot_id: &str) -> Result<(usize, &mut Screen), DesktopError> {
        let i = self.slot_of(bot_id).ok_or(DesktopError::NoScreen)?;
        let SlotState::Active(screen) = &mut self.slots[i].state else {
            unreachable!("slot_of finds active slots")
        };
        Ok((i, screen))
    }

    fn reserved_of(&self, bot_id: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(&s.state, SlotState::Reserved(sc) if sc.bot_id == bot_id))
    }

    fn busy_of(&self, bot_id: &str) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(&s.state, SlotState::Busy(b) if b == bot_id))
    }

    fn any_busy(&self) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(&s.state, SlotState::Busy(_)))
    }

    fn occupied(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s.state, SlotState::Free))
            .count()
    }
}

/// The screens of one machine.
pub struct DesktopRuntime {
    runner: Arc<dyn CommandRunner>,
    config: RuntimeConfig,
    gateway: Gateway,
    table: Mutex<Table>,
    events: broadcast::Sender<Teardown>,
    freezes: broadcast::Sender<FreezeChange>,
    /// Whether the browser must run without its sandbox (we are root); probed once.
    as_root: tokio::sync::OnceCell<bool>,
    /// Set once what an earlier process left in this run directory was stopped.
    reaped: tokio::sync::OnceCell<()>,
    /// Spare display stacks, owned by no bot until one is taken.
    warm: Arc<WarmPool<Box<Screen>>>,
    /// How desktops start.
    launch: Launch,
}

impl Drop for DesktopRuntime {
    fn drop(&mut self) {
        // Lets the background filler go; spares left here are swept like any screen.
        self.warm.close();
    }
}

impl DesktopRuntime {
    /// A runtime with no screens yet; nothing starts until the first [`Self::open_screen`]
    /// (or [`Self::start_warm_pool`]).
    pub fn new(runner: Arc<dyn CommandRunner>, config: RuntimeConfig) -> Self {
        let gateway = Gateway::new(runner.clone(), config.run_dir.clone(), config.gateway_port)
            .listening_on(&config.gateway_host);
        let (events, _) = broadcast::channel(64);
        let (freezes, _) = broadcast::channel(64);
        let warm = Arc::new(WarmPool::new(config.warm_stacks));
        Self {
            runner,
            config,
            gateway,
            table: Mutex::new(Table { slots: Vec::new() }),
            events,
            freezes,
            as_root: tokio::sync::OnceCell::new(),
            reaped: tokio::sync::OnceCell::new(),
            warm,
            launch: Launch::default(),
        }
    }

    /// The same runtime, starting desktops as `launch` says (benches compare
    /// [`Launch::plain`] with the default).
    pub fn with_launch(mut self, launch: Launch) -> Self {
        self.launch = launch;
        self
    }

    /// Whether a desktop's start is lowered only while it lasts: asked for, and this runtime
    /// can raise the desktop back afterwards ([`Launch::start_only`]).
    fn lowered_while_starting(&self) -> bool {
        self.launch.start_only
            && self.launch.nice > 0
            && self.runner.on_this_host()
            && super::priority_local::may_raise()
    }

    /// What raises a lowered start of `screen`'s browser `pid` at once, should it starve: its
    /// browser's and window manager's process groups by nice value, or its desktop's control
    /// group to its own weight. `None` for a start that is not lowered.
    fn start_raise(
        &self,
        screen: &Screen,
        pid: u32,
    ) -> Option<Pin<Box<dyn Future<Output = usize> + Send>>> {
        if self.lowered_while_starting() {
            let groups = [Some(pid), screen.wm].into_iter().flatten().collect();
            return Some(Box::pin(super::priority_local::raise_off_thread(groups)));
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
    fn start_nice(&self) -> u8 {
        if self.launch.start_only && !self.lowered_while_starting() {
            0
        } else {
            self.launch.nice
        }
    }

    /// The nice value of the programs a bot launches on its desktop.
    fn program_nice(&self) -> u8 {
        if self.launch.start_only {
            0
        } else {
            self.launch.nice
        }
    }

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

    /// The workspace as the computer's processes see it (the bots' home).
    pub fn workspace(&self) -> &std::path::Path {
        &self.config.workspace
    }

    /// How the spare display stacks stand (for health).
    pub fn warm_status(&self) -> WarmStatus {
        self.warm.status()
    }

    /// Starts one spare desktop, its display stack and a browser on a spare profile
    /// ([`super::spare_profile`]).
    async fn start_spare(&self) -> Result<Box<Screen>, DesktopError> {
        self.reap_leftovers().await?;
        let started = Instant::now();
        let name = spare_profile::spare_name();
        let (stack, profile) =
            tokio::join!(self.start_stack(&name), self.prepare_profile(&name, None));
        let mut screen = match stack {
            Ok(screen) => screen,
            Err(e) => {
                let profiles = self.config.workspace.join(super::browser::PROFILES_DIR);
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
    async fn groups_pss_kib(&self, groups: &[u32]) -> u64 {
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
    async fn take_spare(&self, bot_id: &str, wait: Duration) -> Option<Screen> {
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
    async fn hand_over(
        &self,
        screen: &mut Screen,
        bot_id: &str,
        profile: Profile,
    ) -> Result<Handover, DesktopError> {
        let spare = std::mem::replace(&mut screen.bot_id, bot_id.to_owned());
        let profiles = self.config.workspace.join(super::browser::PROFILES_DIR);
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
    async fn spare_alive(&self, spare: &Screen) -> bool {
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

    /// Teardown announcements, sent before a slot is reused.
    pub fn subscribe(&self) -> broadcast::Receiver<Teardown> {
        self.events.subscribe()
    }

    /// Freezes and thaws of desktops.
    pub fn subscribe_freezes(&self) -> broadcast::Receiver<FreezeChange> {
        self.freezes.subscribe()
    }

    /// The machine's screen gateway.
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

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

    /// CPU time, OOM kills and frozen state of the bot's desktop group, read from the group.
    pub async fn group_usage(&self, bot_id: &str) -> Result<super::cgroup::Usage, DesktopError> {
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
    async fn thaw(&self, screen: &mut Screen) -> Result<(), DesktopError> {
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
    async fn enter_group(&self, screen: &mut Screen) {
        let Some(groups) = &self.config.groups else {
            return;
        };
        let phase = Phase::of(screen.starting);
        let entered = if screen.born_grouped {
            groups.prepare(&screen.tag, phase).await.map(drop)
        } else {
            groups.enter(&screen.tag, phase).await
        };
        match entered {
            Ok(()) => screen.grouped = true,
            Err(e) => {
                tracing::warn!(bot.id = %screen.bot_id, error = %e, "desktop.limits.enter_failed")
            }
        }
    }

    /// How a process about to start for the desktop tagged `tag` is born in its control group
    /// as `phase` wants, where the group's owner can place it so on this host; `None` where it
    /// cannot (the process is then found by its tag, [`Self::enter_group`]) or the group could
    /// not be made ready (logged: the desktop runs without its limits).
    async fn group_joins(&self, tag: &str, phase: Phase) -> Option<Vec<Join>> {
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
    async fn join_screen_group(&self, screen: &mut Screen, spec: &mut SpawnSpec) {
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
    async fn enter_group_watched(&self, screen: &mut Screen, watch: &Option<StartWatch>) {
        self.enter_group(screen).await;
        if screen.starting && watch.as_ref().is_some_and(StartWatch::raised) {
            screen.starting = false;
            self.enter_group(screen).await;
        }
    }

    /// How a call on `screen` learns what the bot must hear about its desktop's group, read
    /// beside the call's own work ([`GroupNotice::read`]); `None` for a desktop without one.
    fn group_notice(&self, screen: &Screen) -> Option<GroupNotice> {
        let groups = self.config.groups.clone().filter(|_| screen.grouped)?;
        Some(GroupNotice {
            groups,
            tag: screen.tag.clone(),
            bot_id: screen.bot_id.clone(),
            seen: screen.oom_seen.clone(),
        })
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
    async fn keep_browser(
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
    /// screen.
    pub async fn launch(&self, bot_id: &str, argv: Vec<String>) -> Result<(), DesktopError> {
        let mut table = self.table.lock().await;
        let (_, screen) = table.active_mut(bot_id)?;
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
        self.runner.spawn(&spec).await?;
        if !screen.born_grouped {
            self.enter_group(screen).await;
        }
        Ok(())
    }

    /// Opens a URL or file in the bot's own browser: a second Chromium on the same profile
    /// hands it to the running one (a new tab) and exits.
    pub async fn open_in_browser(&self, bot_id: &str, target: &str) -> Result<(), DesktopError> {
        let profile = profile_dir(&self.config.workspace, bot_id);
        let as_root = *self.as_root.get().unwrap_or(&false);
        let mut argv = vec!["chromium".to_string()];
        argv.extend(chromium_args(
            &profile,
            SCREEN_WIDTH,
            SCREEN_HEIGHT,
            as_root,
            self.launch.lean,
        ));
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
        shell: &super::terminal::ShellSpec,
        published: Option<u16>,
    ) -> Result<rakazo_actors::provider::ScreenRoute, DesktopError> {
        let token = self
            .gateway
            .open_terminal(&super::gateway::Token::from_secret(control), shell)
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
            .revoke(&super::gateway::Token::from_secret(token))
            .await
    }

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
        let token = super::gateway::Token::fresh();
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
    async fn devtools_endpoint(&self, bot_id: &str) -> Result<(u16, String), DesktopError> {
        check_id(bot_id)?;
        let file = self
            .config
            .workspace
            .join(super::browser::PROFILES_DIR)
            .join(bot_id)
            .join("DevToolsActivePort");
        let read = format!("head -c 4096 -- {}", shell_quote(&file.to_string_lossy()));
        let deadline = Instant::now() + DEVTOOLS_ENDPOINT_WAIT;
        loop {
            let out = self.runner.run(&read, SCRIPT_TIMEOUT).await?;
            if let Some(endpoint) = super::cdp::parse_endpoint(&out.stdout) {
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

    /// The tag and display of the bot's screen, marked used and thawed.
    async fn active_screen(&self, bot_id: &str) -> Result<(String, u32), DesktopError> {
        let mut table = self.table.lock().await;
        let (_, screen) = table.active_mut(bot_id)?;
        screen.last_used = Instant::now();
        self.thaw(screen).await?;
        Ok((screen.tag.clone(), screen.display))
    }

    /// Starts a DevTools bridge on `socket` to the browser's loopback `port`, as one of the
    /// bot's screen's processes.
    async fn spawn_bridge(
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
                observation.frame = super::frame_scale::fit_png(observation.frame, size)?;
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
        let (io, _busy, notice) = self.use_screen(bot_id).await?;
        // The group's counters are read while the batch runs.
        let notice = read_notice(notice);
        let settle = self.config.settle;
        let x = match io {
            Io::X(x) => x,
            Io::Commands(c) => {
                let batch = async {
                    let (completed, error) = c.apply(actions).await;
                    Ok::<_, DesktopError>((completed, error, c.settle(settle).await?))
                };
                let (batch, notice) = tokio::join!(batch, notice);
                let (completed, error, mut observation) = batch?;
                observation.frame = super::frame_scale::fit_png(observation.frame, size)?;
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
            let react = if actions.iter().any(answers_later) {
                settle.first_delay
            } else {
                Duration::ZERO
            };
            let quiet = if actions.iter().all(|a| matches!(a, Action::Move { .. })) {
                settle.pointer_quiet
            } else {
                settle.quiet
            };
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
    async fn use_screen(
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

    /// Ends slot `i`'s generation: announce, revoke capabilities, stop processes. On failure
    /// the slot is reserved for a retry.
    async fn teardown(&self, table: &mut Table, i: usize) -> Result<(), DesktopError> {
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
    fn begin_teardown(&self, table: &mut Table, i: usize) -> Option<(Box<Screen>, u64)> {
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
    async fn finish_teardown(
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

    async fn stop_retired(
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

    async fn retry_reserved(&self, table: &mut Table) {
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
    async fn stop_screen(&self, screen: &mut Screen) -> Result<(), DesktopError> {
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
        let profiles = self.config.workspace.join(super::browser::PROFILES_DIR);
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
    async fn quit_browser(&self, screen: &mut Screen) -> Result<(), DesktopError> {
        let Some(pid) = screen.browser else {
            return Ok(());
        };
        self.browser_devtools(screen, DevToolsAction::Save).await;
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

    /// Saves or loads the cookies of the screen's browser through its DevTools port; a failure
    /// is logged, never fatal (the browser keeps running either way). Says whether a file was
    /// written.
    async fn browser_devtools(&self, screen: &Screen, action: DevToolsAction) -> bool {
        self.devtools_of(&screen.bot_id, action).await
    }

    /// [`Self::browser_devtools`] of `bot_id`'s browser.
    async fn devtools_of(&self, bot_id: &str, action: DevToolsAction) -> bool {
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
    /// ([`super::browser::SAVED_COOKIES`], rewritten only when they changed); the archive
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
    async fn wait_for_quiet_profiles(&self) {
        let profiles = self
            .config
            .workspace
            .join(super::browser::PROFILES_DIR)
            .to_string_lossy()
            .into_owned();
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

    /// Before this runtime starts its first process, stops what an earlier process of the
    /// server left in the same run directory (a server that was killed, or a container that
    /// outlived its server), so the displays, the gateway port and the profiles are free.
    async fn reap_leftovers(&self) -> Result<(), DesktopError> {
        self.reaped
            .get_or_try_init(|| async {
                let prefix = format!("{}/", self.config.run_dir.to_string_lossy());
                // Then the spare profiles their browsers ran on.
                let profiles = self.config.workspace.join(super::browser::PROFILES_DIR);
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

    fn env(&self, tag: &str, display: u32, home: &str) -> Vec<(String, String)> {
        let mut env = tagged_env(tag);
        env.push(("DISPLAY".into(), format!(":{display}")));
        env.push(("HOME".into(), home.to_string()));
        env
    }

    /// Starts Xvfb on a free display number and the window manager on it, both born in the
    /// desktop's control group where its owner can place them so; a group made for a stack
    /// that did not start is removed.
    async fn start_stack(&self, bot_id: &str) -> Result<Screen, DesktopError> {
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
    async fn start_stack_tagged(
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
    async fn prepare_profile(
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
            let profiles = self.config.workspace.join(super::browser::PROFILES_DIR);
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
    async fn start_browser(
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

    /// The browser and the window manager of a desktop whose start was lowered, back at the
    /// runtime's priority ([`Launch::start_only`]).
    async fn raise_priority(&self, screen: &Screen) {
        let groups: Vec<u32> = screen.browser.iter().chain(&screen.wm).copied().collect();
        let raised = super::priority_local::raise_off_thread(groups).await;
        tracing::debug!(
            screen.display = screen.display,
            bot.id = %screen.bot_id,
            threads = raised,
            "desktop.priority.raised"
        );
    }

    /// [`Self::start_browser`], while the group is held.
    async fn start_browser_held(
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
        argv.extend(chromium_args(
            &profile,
            SCREEN_WIDTH,
            SCREEN_HEIGHT,
            as_root,
            self.launch.lean,
        ));
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
                Io::Commands(c) => c.settle(quiet).await.map(drop),
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
    async fn first_window(
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

/// What became of a taken spare desktop ([`DesktopRuntime::hand_over`]).
enum Handover {
    /// The bot took its running browser: nothing is left to start.
    Taken,
    /// The bot keeps its display stack; its own browser starts on this profile.
    Start(Profile),
    /// The spare is gone: a new stack and the bot's browser start.
    Gone(Profile),
}

/// A profile made ready by [`DesktopRuntime::prepare_profile`].
struct Profile {
    /// It had no browser state yet.
    fresh: bool,
    /// Browsers on this machine run as root (so without Chromium's sandbox).
    as_root: bool,
    /// How the hand-over of a spare's profile done in the same script went (its exit code,
    /// [`spare_profile::HANDED_OVER`] when the profile is now the spare's); `None`: not tried.
    handover: Option<i32>,
}

/// The lock and port files an earlier browser may have left in `profile`, shell-quoted.
fn lock_paths(profile: &std::path::Path) -> Vec<String> {
    LOCK_FILES
        .iter()
        .map(|f| shell_quote(&profile.join(f).to_string_lossy()))
        .collect()
}

/// Why a browser showed no window.
struct NoWindow {
    /// It exited (rather than running past the deadline).
    exited: bool,
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

fn tagged_env(tag: &str) -> Vec<(String, String)> {
    let mut env = minimal_env();
    env.push((TAG_VAR.into(), tag.to_string()));
    env
}

/// A refused slot, logged.
fn slot_busy(slot: u32, why: String) -> DesktopError {
    tracing::info!(screen.slot = slot, reason = %why, "desktop.screen.slot_busy");
    DesktopError::SlotBusy { slot, why }
}

fn handle(slot: &Slot, i: usize) -> ScreenHandle {
    let display = match &slot.state {
        SlotState::Active(sc) | SlotState::Reserved(sc) => sc.display,
        SlotState::Free | SlotState::Busy(_) => 0,
    };
    ScreenHandle {
        slot: i as u32,
        generation: slot.generation,
        display,
    }
}

/// Frees a busy slot whose start or stop was dropped before it finished (best effort: the
/// table is free at once in all but a race with another caller).
struct BusySlot<'a> {
    table: &'a Mutex<Table>,
    slot: usize,
    finished: bool,
}

impl<'a> BusySlot<'a> {
    fn new(table: &'a Mutex<Table>, slot: usize) -> Self {
        Self {
            table,
            slot,
            finished: false,
        }
    }

    fn done(&mut self) {
        self.finished = true;
    }
}

impl Drop for BusySlot<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(mut table) = self.table.try_lock()
            && let Some(slot) = table.slots.get_mut(self.slot)
            && matches!(slot.state, SlotState::Busy(_))
        {
            slot.state = SlotState::Free;
        }
    }
}

/// Decrements a screen's busy count when an operation ends.
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

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

/// How many browser windows are up: entries of the window manager's `_NET_CLIENT_LIST` whose
/// `WM_CLASS` class is Chromium's and which are mapped and viewable. Another client (a dialog)
/// does not count.
fn browser_windows(x: &XDisplay) -> Result<usize, DesktopError> {
    let atom = x
        .conn
        .intern_atom(true, b"_NET_CLIENT_LIST")
        .map_err(x_err)?
        .reply()
        .map_err(x_err)?
        .atom;
    if atom == 0 {
        return Ok(0);
    }
    let reply = x
        .conn
        .get_property(false, x.root, atom, AtomEnum::WINDOW, 0, 1024)
        .map_err(x_err)?
        .reply()
        .map_err(x_err)?;
    // Every window's class and map state asked at once: one round trip for them all (a spare's
    // check waits for these on a new bot's way to its desktop).
    let mut asked = Vec::new();
    for window in reply.value32().into_iter().flatten() {
        let class = x
            .conn
            .get_property(false, window, AtomEnum::WM_CLASS, AtomEnum::STRING, 0, 256)
            .map_err(x_err)?;
        asked.push((class, x.conn.get_window_attributes(window).map_err(x_err)?));
    }
    let mut count = 0;
    for (class, attributes) in asked {
        // WM_CLASS is "instance\0class\0"; Chromium's class is "Chromium".
        let is_browser = class.reply().is_ok_and(|class| {
            class
                .value
                .split(|b| *b == 0)
                .nth(1)
                .is_some_and(|c| c.eq_ignore_ascii_case(b"chromium"))
        });
        let viewable = attributes
            .reply()
            .is_ok_and(|a| a.map_state == MapState::VIEWABLE);
        if is_browser && viewable {
            count += 1;
        }
    }
    Ok(count)
}
