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
//!
//! The runtime's methods live by concern in the submodules: [`open`], [`start`], [`calls`],
//! [`devtools`], [`limits`], [`spares`] and [`teardown`].

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use rakazo_actors::provider::{ActOutcome, ActStop, Action, Frame, FrameSize};
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

mod calls;
mod devtools;
mod limits;
mod open;
mod spares;
mod start;
mod teardown;

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
const DEVTOOLS_BRIDGE_SOURCE: &str = include_str!("../devtools_bridge.py");
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

impl Settle {
    /// How a batch of `actions` waits where drawing is reported: `(react, quiet)`, the time
    /// applications get to answer (none for a batch of pointer moves and waits) and the quiet
    /// window (about a frame for a batch of moves only).
    pub fn for_batch(&self, actions: &[Action]) -> (Duration, Duration) {
        let react = if actions.iter().any(answers_later) {
            self.first_delay
        } else {
            Duration::ZERO
        };
        let quiet = if actions.iter().all(|a| matches!(a, Action::Move { .. })) {
            self.pointer_quiet
        } else {
            self.quiet
        };
        (react, quiet)
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

impl From<ActResult> for ActOutcome {
    fn from(result: ActResult) -> Self {
        Self {
            completed: result.completed,
            frame: result.observation.frame,
            stopped: result.error,
        }
    }
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
    /// Held to read by each program a bot starts on it, without the slot table, and to write
    /// once by its stop, which sets it: a program starts before the stop sweeps its
    /// processes, or not at all ([`DesktopRuntime::launch`]).
    retired: Arc<tokio::sync::RwLock<bool>>,
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

    /// Chromium's arguments for a bot's browser on `profile`, on this runtime's screen size and
    /// launch settings.
    fn chromium_args(&self, profile: &std::path::Path, as_root: bool) -> Vec<String> {
        chromium_args(
            profile,
            SCREEN_WIDTH,
            SCREEN_HEIGHT,
            as_root,
            self.launch.lean,
        )
    }

    /// The same runtime, starting desktops as `launch` says (benches compare
    /// [`Launch::plain`] with the default).
    pub fn with_launch(mut self, launch: Launch) -> Self {
        self.launch = launch;
        self
    }

    /// The workspace as the computer's processes see it (the bots' home).
    pub fn workspace(&self) -> &std::path::Path {
        &self.config.workspace
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

    /// The machine's screen gateway, started if it is not running; what an earlier server
    /// left in the run directory is stopped first, as before a first screen (that sweep
    /// would otherwise take a gateway started before it).
    pub async fn started_gateway(&self) -> Result<&Gateway, DesktopError> {
        self.reap_leftovers().await?;
        self.gateway.ensure_started().await?;
        Ok(&self.gateway)
    }
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

/// Why a browser showed no window.
struct NoWindow {
    /// It exited (rather than running past the deadline).
    exited: bool,
}

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
