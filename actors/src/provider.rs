//! The `SandboxProvider` port: the one boundary every computer backend implements.
//!
//! Backends differ only in how commands, files and screens reach the machine; everything above
//! this trait (actors, leases, tools) is provider-neutral. Vendor errors are translated into
//! [`ProviderError`] at the adapter's edge; nothing above it matches on vendor types.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{DomainError, ErrorCode};
use crate::workspace::Workspace;

/// An opaque machine reference. Only ever handed back to the provider kind that issued it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProviderRef(pub String);

/// What a provider can do, as `describe()` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Can allocate distinct screens for several bots of one Team Computer.
    pub multi_screen: bool,
    /// Serves a browser terminal (`connectTerminal`).
    pub terminal: bool,
    /// Implements the page-browser contract (CDP helper).
    pub page_browser: bool,
    /// The vendor bills while the machine runs (uptime cap applies).
    pub bills_while_running: bool,
    /// The machine's workspace is the store's latest copy itself (`DATA_DIR/homes/<key>`,
    /// mounted or on this host): checkpoints seal a revision but never replace that copy.
    pub mounted_home: bool,
    /// Freezes an idle desktop (its processes stop using CPU, memory stays) and thaws it on
    /// the next tool call or viewer. Needs a root process outside the machine that owns its
    /// control groups (the host `desktop` provider running as root); `false` where the
    /// machine cannot delegate them, and for every other provider so far.
    pub desktop_freezing: bool,
    /// Per-desktop CPU weight and memory ceiling (one control group per bot's display stack);
    /// same requirement as `desktop_freezing`.
    pub desktop_limits: bool,
}

/// The provider's self-description.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Description {
    /// The provider kind, as named in `SANDBOX_PROVIDER` (`fake`, `docker`, ...).
    pub kind: String,
    /// What it supports.
    pub capabilities: Capabilities,
}

/// What a machine is for: enough for the provider to name, label and mount it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineSpec {
    /// The computer's id.
    pub computer_id: String,
    /// The space (workspace) id, for labels.
    pub space_id: String,
    /// The bot of a Private Computer.
    pub bot_id: Option<String>,
    /// The home key naming the durable workspace.
    pub home_key: String,
}

/// A command to run inside the machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Shell command line, run by the machine's shell.
    pub command: String,
    /// Working directory relative to the workspace root (empty = the root).
    pub cwd: String,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Hard deadline; the provider stops the command when it passes.
    pub timeout: Duration,
}

/// The outcome of a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecOutput {
    /// Exit status (`-1` when killed by the deadline).
    pub exit_code: i32,
    /// Captured standard output.
    pub stdout: String,
    /// Captured standard error.
    pub stderr: String,
    /// Whether the deadline stopped the command.
    pub timed_out: bool,
}

/// A directory entry in the workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// Name within its directory.
    pub name: String,
    /// Path relative to the workspace root.
    pub path: String,
    /// `file`, `dir`, `link` (a symbolic link, never followed) or `other` (a fifo, socket or
    /// device, never opened).
    pub kind: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
}

/// Which entries of a directory a listing page holds: the first `first` by name among those
/// whose names sort at or after `from` (the empty name: from the start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListingRange {
    /// The name the page starts at: a directory's entry of this name is on it.
    pub from: String,
    /// The most entries the page holds.
    pub first: usize,
}

impl ListingRange {
    /// A directory's first `first` entries by name.
    pub fn first(first: usize) -> Self {
        Self {
            from: String::new(),
            first,
        }
    }

    /// The `first` entries by name at or after `from`.
    pub fn from(from: impl Into<String>, first: usize) -> Self {
        Self {
            from: from.into(),
            first,
        }
    }

    /// Keeps the items of this page from `items` (named by `name`), sorted, and answers the
    /// name of the first item past it: the rest is dropped unsorted.
    pub fn keep<T>(&self, items: &mut Vec<T>, name: impl Fn(&T) -> &str + Copy) -> Option<String> {
        items.retain(|item| name(item) >= self.from.as_str());
        keep_first(items, self.first.saturating_add(1), |a, b| {
            name(a).cmp(name(b))
        });
        if items.len() > self.first {
            items.pop().map(|item| name(&item).to_owned())
        } else {
            None
        }
    }

    /// Whether a page a machine answered is one of this range: no more entries than asked
    /// or than it counts, in name order from `from` on, and the next page's name past them
    /// (a name, never a path).
    pub fn holds(&self, entries: &[FileEntry], next: Option<&str>, total: usize) -> bool {
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        let in_order = names.windows(2).all(|w| w[0] < w[1]);
        let next_fits = next.is_none_or(|n| {
            !n.is_empty() && !n.contains('/') && names.last().is_none_or(|last| *last < n)
        });
        names.len() <= self.first.min(total)
            && in_order
            && names
                .first()
                .copied()
                .or(next)
                .is_none_or(|n| n >= self.from.as_str())
            && next_fits
    }
}

/// A page of a directory's entries by name, and how many it holds
/// ([`SandboxProvider::list_files_first`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListingPage {
    /// The page's entries in name order.
    pub entries: Vec<FileEntry>,
    /// How many entries the directory holds.
    pub total: usize,
    /// The name of the first entry past the page, where one is: the next page starts there.
    #[serde(default)]
    pub next: Option<String>,
}

impl ListingPage {
    /// The page `range` names of `entries`, and their number: the rest is never sorted.
    pub fn of(mut entries: Vec<FileEntry>, range: &ListingRange) -> Self {
        let total = entries.len();
        let next = range.keep(&mut entries, |e| e.name.as_str());
        Self {
            entries,
            total,
            next,
        }
    }
}

/// Keeps the first `first` of `items` in the order `cmp` gives, sorted; the rest is dropped
/// unsorted.
fn keep_first<T>(
    items: &mut Vec<T>,
    first: usize,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering + Copy,
) {
    if items.len() > first && first > 0 {
        items.select_nth_unstable_by(first - 1, cmp);
    }
    items.truncate(first);
    items.sort_unstable_by(cmp);
}

/// The spare display stacks a provider keeps started on its computers for their next
/// desktops (for `/internal/health`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmDesktops {
    /// Spares each computer keeps (`SANDBOX_DESKTOP_WARM_STACKS`).
    pub per_computer: usize,
    /// Computers this process holds.
    pub computers: usize,
    /// Spares ready now, over all computers.
    pub ready: usize,
    /// Spares starting now.
    pub starting: usize,
    /// Memory of the ready spares (PSS, KiB, as measured when each was ready).
    pub pss_kib: u64,
    /// Computers kept created ahead for the next provisions (`SANDBOX_DOCKER_WARM_COMPUTERS`;
    /// their spare desktops are counted above).
    #[serde(default)]
    pub pooled_target: usize,
    /// Pooled computers ready now.
    #[serde(default)]
    pub pooled_ready: usize,
}

/// A desktop of a machine was frozen (its processes stopped, memory kept) or thawed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesktopFreeze {
    /// The machine.
    pub machine: ProviderRef,
    /// The bot whose desktop it is.
    pub bot_id: String,
    /// Whether it is frozen now.
    pub frozen: bool,
}

/// One captured frame of a screen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// PNG bytes.
    pub png: Vec<u8>,
    /// Width of the image in pixels.
    pub width: u32,
    /// Height of the image in pixels.
    pub height: u32,
    /// What happened to the screen that its bot should be told (a tab its desktop lost to
    /// the memory ceiling), once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<String>,
    /// The screen's width and height when the image was scaled down to fit a [`FrameSize`];
    /// `None` when the image is the screen at full size. Actions use screen pixels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<(u32, u32)>,
}

/// The largest screenshot a caller wants: a screen that fits is returned as it is, a larger
/// one scaled down (aspect ratio kept) to fit. Action coordinates stay in screen pixels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameSize {
    /// Largest image width in pixels (`None`: any).
    pub max_width: Option<u32>,
    /// Largest image height in pixels (`None`: any).
    pub max_height: Option<u32>,
}

impl FrameSize {
    /// The screen at full size.
    pub const FULL: Self = Self {
        max_width: None,
        max_height: None,
    };

    /// The image size of a `width`x`height` screen: scaled down by one factor until both
    /// limits hold (each side at least one pixel), never scaled up.
    pub fn fit(&self, width: u32, height: u32) -> (u32, u32) {
        let (w, h) = (u64::from(width), u64::from(height));
        let (mut ow, mut oh) = (w, h);
        if let Some(mw) = self.max_width.map(u64::from)
            && ow > mw
        {
            (ow, oh) = (mw, (h * mw + w / 2) / w.max(1));
        }
        if let Some(mh) = self.max_height.map(u64::from)
            && oh > mh
        {
            (ow, oh) = ((w * mh + h / 2) / h.max(1), mh);
        }
        (ow.max(1) as u32, oh.max(1) as u32)
    }
}

/// A mouse button.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Button {
    /// Primary button.
    Left,
    /// Middle button.
    Middle,
    /// Secondary button.
    Right,
}

/// One step of an ordered action batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Action {
    /// Move the pointer.
    Move { x: i32, y: i32 },
    /// Click at a point.
    Click {
        x: i32,
        y: i32,
        #[serde(default = "default_button")]
        button: Button,
        #[serde(default)]
        double: bool,
    },
    /// Press at one point, release at another.
    Drag {
        from_x: i32,
        from_y: i32,
        to_x: i32,
        to_y: i32,
    },
    /// Scroll by wheel notches (positive = down/right).
    Scroll { x: i32, y: i32, dx: i32, dy: i32 },
    /// Type literal text.
    Type { text: String },
    /// Press a key combination such as `ctrl+l` or `Return`.
    Key { keys: String },
    /// Pause.
    Wait { ms: u64 },
}

fn default_button() -> Button {
    Button::Left
}

/// An entry an export left out (a name the store cannot hold), and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Skipped {
    /// Its path in the workspace (not-UTF-8 bytes shown as U+FFFD).
    pub path: String,
    /// Why it was left out.
    pub reason: String,
}

/// What [`SandboxProvider::export_workspace_since`] found.
#[derive(Debug)]
pub enum WorkspaceExport {
    /// The workspace still matches the fingerprint: nothing was packed.
    Unchanged,
    /// The workspace archive.
    Archive {
        /// The archive, in pieces (pieces the `since` fingerprint vouches for may be named
        /// by their stamp only).
        workspace: Workspace,
        /// A fingerprint of exactly what the archive holds, when the provider can tell one.
        fingerprint: Option<String>,
        /// Entries left out, with the reason (the rest is saved).
        skipped: Vec<Skipped>,
    },
}

/// The result of an action batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActOutcome {
    /// How many actions completed, in order.
    pub completed: usize,
    /// The settled frame after the batch.
    pub frame: Frame,
    /// Why the action after the completed ones was not done, when the batch stopped early.
    pub stopped: Option<ActStop>,
}

/// Why a batch stopped before its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActStop {
    /// `InvalidParams` when the action cannot be done on this screen (a point outside it,
    /// an unknown key, a scroll, text or wait beyond its bound); `ProviderFailed` when the
    /// computer failed to do it.
    pub code: ErrorCode,
    /// The reason, for the agent (for example `point (5000, 10) is outside the 1280x800
    /// screen`).
    pub reason: String,
}

impl ActStop {
    /// An action that cannot be done on this screen.
    pub fn invalid(reason: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidParams,
            reason: reason.into(),
        }
    }

    /// An action the computer failed to do.
    pub fn failed(reason: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::ProviderFailed,
            reason: reason.into(),
        }
    }
}

/// An open screen: the display slot a bot's desktop runs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScreenInfo {
    /// Display slot: always the one [`SandboxProvider::open_screen`] was asked for (the
    /// computer's slot table numbers slots; the X display number is the provider's own).
    pub slot: u32,
}

/// What a person may do on a live screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScreenPolicy {
    /// Watch only.
    View,
    /// Watch and send input.
    Control,
}

/// A route to one screen through the machine's screen gateway. Both fields are secret from
/// browsers and logs: only the screen proxy uses them, through the authority.
#[derive(Clone, PartialEq, Eq)]
pub struct ScreenRoute {
    /// Base URL of the gateway as the server reaches it (`http://host:port`).
    pub upstream: String,
    /// The gateway's per-route socket token.
    pub token: String,
}

impl std::fmt::Debug for ScreenRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScreenRoute([redacted])")
    }
}

/// A page-browser command on the bot's visible browser (the `browser_*` tools).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum BrowserCommand {
    /// Load a URL in the active tab and wait for it.
    Navigate {
        /// An http(s) URL.
        url: String,
    },
    /// Bounded page text and up to 80 interactive elements with refs.
    Snapshot,
    /// Act on an element of the last snapshot.
    Act {
        /// The element's ref from the last snapshot.
        #[serde(rename = "ref")]
        element: String,
        /// `click`, `type` (replace the value with `text`), `press` (a key such as `Enter`),
        /// `select` (the option of a select element whose value or label is `text`),
        /// `upload` (the workspace file at the workspace path `text` into a file input).
        action: String,
        /// Text for `type`, key for `press`, option for `select`, file for `upload`.
        #[serde(default)]
        text: Option<String>,
    },
    /// Answer the JavaScript dialog open on the page (alert, confirm, prompt, leave-page).
    Dialog {
        /// Accept (OK) or dismiss (Cancel).
        accept: bool,
        /// The answer to a prompt, when accepted.
        #[serde(default)]
        text: Option<String>,
    },
}

/// Provider failures, classified for the actors above.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The machine no longer exists (or can never be resumed): replace and restore.
    #[error("machine gone")]
    MachineGone,
    /// No further display can be allocated on this machine.
    #[error("no further screen can be allocated")]
    MultiScreenUnavailable,
    /// The display slot asked for is busy on this machine (another bot's screen, a screen
    /// starting or stopping, one whose teardown failed and waits for a retry), or the bot's
    /// screen runs on another slot. Nothing was started; no other slot is ever picked instead.
    #[error("display slot {slot} is busy: {why}")]
    SlotBusy {
        /// The slot asked for.
        slot: u32,
        /// What holds it.
        why: String,
    },
    /// A path is outside the workspace or not allowed.
    #[error("path rejected: {0}")]
    PathRejected(String),
    /// The file or directory does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A size limit was exceeded.
    #[error("too large: {0}")]
    TooLarge(String),
    /// A stored workspace archive was refused.
    #[error("archive rejected: {0}")]
    ArchiveRejected(String),
    /// The capability is not supported by this provider.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A page-browser ref no longer names the element it was taken from.
    #[error("{0}")]
    StaleRef(String),
    /// A page-browser command failed; its message says what was confirmed.
    #[error("{0}")]
    PageAction(String),
    /// A JavaScript dialog blocks the page until it is answered (nothing was done).
    #[error("{0}")]
    DialogOpen(String),
    /// A command's stop could not be confirmed: the machine was paused (or its pause asked
    /// for) with the command possibly suspended in it, and must not be resumed until a
    /// recover or reset replaces it. The computer is quarantined.
    #[error("{0}")]
    Quarantined(String),
    /// Any other failure; the machine may still be there.
    #[error("provider failure: {0}")]
    Failed(String),
}

impl ProviderError {
    /// A workspace file larger than the `max` bytes a read was given.
    pub fn file_too_large(path: &str, max: u64) -> Self {
        let path: String = path.chars().take(200).collect();
        Self::TooLarge(format!("{path}: larger than {max} bytes"))
    }
}

impl From<ProviderError> for DomainError {
    fn from(err: ProviderError) -> Self {
        let code = match &err {
            ProviderError::MachineGone => ErrorCode::MachineGone,
            ProviderError::MultiScreenUnavailable => ErrorCode::MultiScreenUnavailable,
            ProviderError::SlotBusy { .. } => ErrorCode::ProviderFailed,
            ProviderError::PathRejected(_) => ErrorCode::PathRejected,
            ProviderError::NotFound(_) => ErrorCode::NotFound,
            ProviderError::TooLarge(_) => ErrorCode::TooLarge,
            ProviderError::ArchiveRejected(_) => ErrorCode::ArchiveRejected,
            ProviderError::Unsupported(_) => ErrorCode::Unsupported,
            ProviderError::StaleRef(_) => ErrorCode::StaleRef,
            ProviderError::PageAction(_) => ErrorCode::PageActionFailed,
            ProviderError::DialogOpen(_) => ErrorCode::PageDialogOpen,
            ProviderError::Quarantined(_) => ErrorCode::ComputerQuarantined,
            ProviderError::Failed(_) => ErrorCode::ProviderFailed,
        };
        DomainError::new(code, err.to_string())
    }
}

/// Result alias for provider calls.
pub type ProviderResult<T> = Result<T, ProviderError>;

/// A stage a provider passes through while it readies a new machine (shown while the
/// computer is `provisioning`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preparation {
    /// Building the computer image.
    ImageBuild,
    /// Creating and starting the container.
    ContainerStart,
}

impl Preparation {
    /// The stage's name in `computer.state` events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ImageBuild => "image_build",
            Self::ContainerStart => "container_start",
        }
    }
}

/// The provider boundary: lifecycle, desktop, execution and files.
#[async_trait]
pub trait SandboxProvider: Send + Sync + 'static {
    /// Kind and capabilities.
    fn describe(&self) -> Description;

    /// Whether the backend answers (for `/internal/health`); a plain sentence when not.
    async fn health(&self) -> Result<(), String> {
        Ok(())
    }

    /// The state of the egress guard keeping machines off private destinations (for
    /// `/internal/health`): `Ok(words)` when it holds (`active`, or why none is needed),
    /// `Err(why)` when it does not; `None` when the provider has no such guard.
    async fn egress_guard(&self) -> Option<Result<String, String>> {
        None
    }

    /// Freezes and thaws of this provider's desktops, for the screens' rows; `None` when it
    /// never freezes one.
    fn desktop_freezes(&self) -> Option<tokio::sync::broadcast::Receiver<DesktopFreeze>> {
        None
    }

    /// Whether desktops get their own control groups (limits and freezing, for
    /// `/internal/health`): `Ok(words)` when they do, `Err(why)` when the machine cannot
    /// delegate control groups; `None` when the provider has none or they are not configured.
    async fn desktop_groups(&self) -> Option<Result<String, String>> {
        None
    }

    /// The spare display stacks of this process's computers (for `/internal/health`);
    /// `None` when the provider keeps none.
    async fn warm_desktops(&self) -> Option<WarmDesktops> {
        None
    }

    /// Why `machine` is quarantined when this provider quarantined it on its own (a command's
    /// stop that went unconfirmed after its caller had stopped waiting); `None` otherwise. The
    /// computer's actor asks after a failed call and at every idle check, and quarantines the
    /// computer's row ([`ProviderError::Quarantined`]).
    fn quarantined(&self, _machine: &ProviderRef) -> Option<String> {
        None
    }

    // --- lifecycle -------------------------------------------------------------------------

    /// Ready what a new machine needs before [`Self::provision`] creates it, telling `stage`
    /// each preparation stage it passes through (docker: the computer image build when the
    /// image is missing, then the container start). Default: nothing to ready.
    async fn prepare(&self, stage: &(dyn Fn(Preparation) + Send + Sync)) -> ProviderResult<()> {
        let _ = stage;
        Ok(())
    }
    /// Create a fresh machine for `spec`, with an empty workspace.
    async fn provision(&self, spec: &MachineSpec) -> ProviderResult<ProviderRef>;
    /// Reattach to an existing machine, resuming it if stopped; `MachineGone` when it cannot.
    async fn reconnect(&self, machine: &ProviderRef, spec: &MachineSpec) -> ProviderResult<()>;
    /// Stop (suspend) the machine, keeping it resumable.
    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()>;
    /// Destroy the machine; destroying a machine that is already gone succeeds.
    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()>;
    /// Start-up: stop what an earlier process of this deployment left running and cannot
    /// adopt (processes of a server that was killed). Machines that outlive a process (such
    /// as containers) are not touched here; they are reconnected on first use.
    async fn recover(&self) -> ProviderResult<()> {
        Ok(())
    }
    /// The server is stopping: stop what must not outlive this process (host processes).
    /// Machines that can outlive it are left running for the next start to reconnect.
    async fn shutdown(&self) -> ProviderResult<()> {
        Ok(())
    }

    // --- desktop ---------------------------------------------------------------------------

    /// Start `bot_id`'s display stack on display slot `slot`, or return its open screen
    /// there. The slot is chosen above this trait (the computer's slot table, lowest free
    /// number); the provider only starts and stops stacks. `SlotBusy` when `slot` is busy on
    /// the machine or the bot's screen runs on another slot (never another slot instead);
    /// `MultiScreenUnavailable` when the machine cannot host another display (a single-screen
    /// machine asked for any slot but its one, slot 0).
    async fn open_screen(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        slot: u32,
    ) -> ProviderResult<ScreenInfo>;
    /// Tear down a bot's screen; its profile stays in the workspace.
    async fn close_screen(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<()>;
    /// Capture the bot's screen at full size.
    async fn observe(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<Frame> {
        self.observe_sized(machine, bot_id, FrameSize::FULL).await
    }
    /// Capture the bot's screen no larger than `size`. A provider that captures only at full
    /// size answers the full frame ([`Frame::screen`] stays `None`) and the caller scales it.
    async fn observe_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        size: FrameSize,
    ) -> ProviderResult<Frame>;
    /// Perform an ordered batch; stops at the first failure and reports how far it got. Its
    /// screenshot is the full frame.
    async fn act(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        actions: &[Action],
    ) -> ProviderResult<ActOutcome> {
        self.act_sized(machine, bot_id, actions, FrameSize::FULL)
            .await
    }
    /// [`Self::act`] with its screenshot no larger than `size` (or at full size, as
    /// [`Self::observe_sized`] says).
    async fn act_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        actions: &[Action],
        size: FrameSize,
    ) -> ProviderResult<ActOutcome>;
    /// Open a fresh route to the bot's (open) screen for a person: its own VNC server behind
    /// the gateway, view-only for `View`. Providers without a live screen answer
    /// `Unsupported`.
    async fn open_route(
        &self,
        _machine: &ProviderRef,
        _bot_id: &str,
        _policy: ScreenPolicy,
    ) -> ProviderResult<ScreenRoute> {
        Err(ProviderError::Unsupported(
            "this provider serves no live screens".into(),
        ))
    }
    /// Start a graphical program on the bot's screen (`launch_app`, `open_path`).
    async fn launch(
        &self,
        _machine: &ProviderRef,
        _bot_id: &str,
        _argv: &[String],
    ) -> ProviderResult<()> {
        Err(ProviderError::Unsupported(
            "this provider cannot start programs on a screen".into(),
        ))
    }
    /// Open a URL or an absolute file path in the bot's browser (`open_path`).
    async fn open(&self, machine: &ProviderRef, bot_id: &str, target: &str) -> ProviderResult<()> {
        self.launch(machine, bot_id, &["xdg-open".to_owned(), target.to_owned()])
            .await
    }
    /// Run a page-browser command; providers without the page-browser contract answer
    /// `Unsupported` (desktop tools still work).
    async fn browser(
        &self,
        _machine: &ProviderRef,
        _bot_id: &str,
        _command: &BrowserCommand,
    ) -> ProviderResult<serde_json::Value> {
        Err(ProviderError::Unsupported(
            "page tools are not available on this computer: use computer_observe and computer_act"
                .into(),
        ))
    }
    /// Start (or join) the bot's terminal server for the person holding control
    /// (`connectTerminal`): a PTY server beside the screen gateway, reached through it by the
    /// returned route's own token, speaking the terminal frame protocol; each connection gets
    /// its own shell. `control` is the bot's control route when the provider serves screens:
    /// the terminal is bound to it and stops when that route closes. Closing the returned
    /// route stops it too. Providers without a browser shell answer `Unsupported`.
    async fn connect_terminal(
        &self,
        _machine: &ProviderRef,
        _bot_id: &str,
        _control: Option<&ScreenRoute>,
    ) -> ProviderResult<ScreenRoute> {
        Err(ProviderError::Unsupported(
            "this computer has no browser terminal".into(),
        ))
    }
    /// Close a route: its token stops working and its VNC server stops.
    async fn close_route(&self, _machine: &ProviderRef, _token: &str) -> ProviderResult<()> {
        Ok(())
    }

    // --- execution -------------------------------------------------------------------------

    /// Run a command; dropping the future cancels it.
    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput>;

    // --- files -----------------------------------------------------------------------------

    /// List a directory of the workspace.
    async fn list_files(&self, machine: &ProviderRef, path: &str)
    -> ProviderResult<Vec<FileEntry>>;
    /// A page of a workspace directory's entries by name (`range`), how many it holds and
    /// where the next page starts: a provider that can leave the rest unread past their names
    /// (their sizes and kinds) answers this without listing the whole directory.
    async fn list_files_first(
        &self,
        machine: &ProviderRef,
        path: &str,
        range: &ListingRange,
    ) -> ProviderResult<ListingPage> {
        let entries = self.list_files(machine, path).await?;
        Ok(ListingPage::of(entries, range))
    }
    /// Read a workspace file.
    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>>;
    /// Read a workspace file of at most `max` bytes: a larger one is refused with `TooLarge`
    /// ([`ProviderError::file_too_large`]), where the provider can tell, before it is read.
    async fn read_file_within(
        &self,
        machine: &ProviderRef,
        path: &str,
        max: u64,
    ) -> ProviderResult<Vec<u8>> {
        let data = self.read_file(machine, path).await?;
        if data.len() as u64 > max {
            return Err(ProviderError::file_too_large(path, max));
        }
        Ok(data)
    }
    /// Write a workspace file, creating parent directories.
    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()>;
    /// Export the workspace as a tar archive of directories and regular files, unless it
    /// still matches `since`, a fingerprint that an earlier export of this machine returned
    /// (a provider that cannot tell returns no fingerprint). Pieces that `since` vouches for
    /// may come as [`Piece::Same`], named by stamp only. With no `since` it always exports
    /// every byte.
    ///
    /// [`Piece::Same`]: crate::workspace::Piece::Same
    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport>;
    /// Export the whole workspace as a tar archive of directories and regular files.
    async fn export_workspace(&self, machine: &ProviderRef) -> ProviderResult<Vec<u8>> {
        match self.export_workspace_since(machine, None).await? {
            WorkspaceExport::Archive { workspace, .. } => {
                workspace.into_archive().ok_or_else(|| {
                    ProviderError::Failed("an export without a fingerprint referred back".into())
                })
            }
            WorkspaceExport::Unchanged => Err(ProviderError::Failed(
                "an export without a fingerprint came back unchanged".into(),
            )),
        }
    }
    /// Replace the whole workspace with a tar archive (as produced by `export_workspace`).
    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()>;
    /// Whether this machine's workspace comes as one whole archive streamed from the machine
    /// ([`Self::export_workspace_to`]), so a checkpoint streams it to the store instead of
    /// exporting pieces.
    async fn streams_workspace(&self, _machine: &ProviderRef) -> bool {
        false
    }
    /// Streams the whole workspace, as one tar archive of directories and regular files, into
    /// `out`; answers the entries left out. Where the provider cannot stream, the archive is
    /// exported whole first.
    async fn export_workspace_to(
        &self,
        machine: &ProviderRef,
        out: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    ) -> ProviderResult<Vec<Skipped>> {
        use tokio::io::AsyncWriteExt as _;
        let archive = self.export_workspace(machine).await?;
        out.write_all(&archive)
            .await
            .map_err(|e| ProviderError::Failed(format!("transfer: {}", e.kind())))?;
        Ok(Vec::new())
    }
    /// Replaces the whole workspace with the tar archive read from `input`; a read error
    /// fails it. Where the provider cannot stream, the archive is read whole first.
    async fn import_workspace_from(
        &self,
        machine: &ProviderRef,
        input: &mut (dyn tokio::io::AsyncRead + Unpin + Send),
    ) -> ProviderResult<()> {
        use tokio::io::AsyncReadExt as _;
        let mut archive = Vec::new();
        input
            .read_to_end(&mut archive)
            .await
            .map_err(|e| ProviderError::Failed(format!("transfer: {e}")))?;
        self.import_workspace(machine, &archive).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> FileEntry {
        FileEntry {
            name: name.into(),
            path: format!("d/{name}"),
            kind: "file".into(),
            size: 1,
        }
    }

    #[test]
    fn a_page_a_machine_answers_is_held_to_its_range() {
        let page = |names: &[&str]| names.iter().map(|n| entry(n)).collect::<Vec<_>>();
        let range = ListingRange::from("b", 2);
        assert!(range.holds(&page(&["b", "c"]), Some("d"), 9));
        assert!(range.holds(&page(&[]), None, 9));
        // Too many, more than it counts, out of order, before its name, a next page that
        // does not follow or is a path.
        assert!(!range.holds(&page(&["b", "c", "d"]), None, 9));
        assert!(!range.holds(&page(&["b", "c"]), None, 1));
        assert!(!range.holds(&page(&["c", "b"]), None, 9));
        assert!(!range.holds(&page(&["a", "c"]), None, 9));
        assert!(!range.holds(&page(&[]), Some("a"), 9));
        assert!(!range.holds(&page(&["b", "c"]), Some("c"), 9));
        assert!(!range.holds(&page(&["b"]), Some("x/../y"), 9));
        assert!(!range.holds(&page(&["b"]), Some(""), 9));
    }

    #[test]
    fn a_page_keeps_the_first_entries_by_name_and_counts_them_all() {
        let names = ["k", "b", "z", "a", "m", "c"];
        let all = || names.iter().map(|n| entry(n)).collect::<Vec<_>>();
        let shown = |page: &ListingPage| -> Vec<String> {
            page.entries.iter().map(|e| e.name.clone()).collect()
        };
        let page = ListingPage::of(all(), &ListingRange::first(3));
        assert_eq!(
            (shown(&page), page.total),
            (vec!["a".to_string(), "b".into(), "c".into()], 6)
        );
        assert_eq!(page.next.as_deref(), Some("k"));
        let whole = ListingPage::of(all(), &ListingRange::first(10));
        assert_eq!((whole.entries.len(), whole.next), (6, None));
        assert!(whole.entries.windows(2).all(|w| w[0].name < w[1].name));
        let none = ListingPage::of(all(), &ListingRange::first(0));
        assert_eq!((none.entries.len(), none.total), (0, 6));
        assert_eq!(none.next.as_deref(), Some("a"));

        // A page starts at its name, there or not; the next page where the last one ended.
        let next = ListingPage::of(all(), &ListingRange::from("k", 2));
        assert_eq!(
            (shown(&next), next.next.as_deref()),
            (vec!["k".to_string(), "m".into()], Some("z"))
        );
        let between = ListingPage::of(all(), &ListingRange::from("d", 1));
        assert_eq!((shown(&between), between.total), (vec!["k".to_string()], 6));
        let last = ListingPage::of(all(), &ListingRange::from("z", 5));
        assert_eq!((shown(&last), last.next), (vec!["z".to_string()], None));
        let past = ListingPage::of(all(), &ListingRange::from("zz", 5));
        assert_eq!((past.entries.len(), past.total, past.next), (0, 6, None));
    }
}
