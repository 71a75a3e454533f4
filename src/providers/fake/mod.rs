//! The `fake` provider: an in-process, stateful emulator of a computer backend.
//!
//! Each machine has a real in-memory file tree, an emulated shell ([`shell`]), desktops that
//! render frames and record actions, and screens on the slots the caller numbers (a slot
//! holding another bot's screen is refused, never swapped for another). In single-screen mode it behaves
//! like Box: one desktop per machine, so a second bot's graphical tools get
//! `MultiScreenUnavailable` while shell and files keep working.
//!
//! Test hooks: [`FakeProvider::lose_machine`] makes a machine vanish (calls in flight and later
//! ones see "machine gone"); the shell command `rakazo-fake-lose-machine` does the same from
//! inside a command, for end-to-end tests through the API. [`FakeProvider::set_bills`] makes
//! it declare that it bills while running (the uptime cap's tests), and
//! [`FakeProvider::hold_exports`] keeps checkpoints waiting mid-export.

mod frame;
mod shell;
mod terminal;
mod tree;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rakazo_actors::provider::{
    ActOutcome, ActStop, Action, Capabilities, Description, ExecOutput, ExecRequest, FileEntry,
    Frame, FrameSize, MachineSpec, Preparation, ProviderError, ProviderRef, ProviderResult,
    SandboxProvider, ScreenInfo, ScreenRoute, WorkspaceExport,
};

use crate::providers::workspace_path::normalize;
use shell::Step;
use terminal::FakeTerminals;
use tree::Tree;

/// Step of the emulated clock while a command sleeps (loss and deadline checks).
const SLEEP_TICK: Duration = Duration::from_millis(10);
/// The command that makes the machine vanish mid-command.
const LOSE_MACHINE_COMMAND: &str = "rakazo-fake-lose-machine";

/// One emulated desktop.
#[derive(Clone, Debug)]
struct Screen {
    slot: u32,
    pointer: (i32, i32),
    typed: String,
    actions: u64,
}

/// What is visible: the pointer and what was typed (a click where the pointer already is
/// changes nothing on screen).
impl std::hash::Hash for Screen {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.slot, self.pointer, &self.typed).hash(h);
    }
}

/// One emulated machine.
#[derive(Debug, Default)]
struct Machine {
    files: Tree,
    running: bool,
    lost: bool,
    screens: BTreeMap<String, Screen>,
}

/// How many desktops a fake machine can host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScreenMode {
    /// Any number (bounded by `limit` when non-zero).
    Multi {
        /// Cap on simultaneous desktops (0 = none).
        limit: u32,
    },
    /// One desktop per machine, like Box.
    Single,
}

/// The in-process emulator. Clones share the same machines.
#[derive(Clone)]
pub struct FakeProvider {
    mode: ScreenMode,
    machines: Arc<Mutex<HashMap<String, Machine>>>,
    next_id: Arc<AtomicU64>,
    terminals: Arc<FakeTerminals>,
    /// Whether it declares that it bills while running (test hook, see [`Self::set_bills`]).
    bills: Arc<AtomicBool>,
    /// Held by a test to keep workspace exports waiting (see [`Self::hold_exports`]).
    export_gate: Arc<tokio::sync::Mutex<()>>,
    /// Exports that reached the gate so far.
    exports_started: Arc<AtomicU64>,
    /// The next preparation emulates a missing image (see [`Self::hold_image_build`]).
    image_missing: Arc<AtomicBool>,
    /// Held by a test to keep that emulated image build going.
    build_gate: Arc<tokio::sync::Mutex<()>>,
}

impl FakeProvider {
    /// A fake with the given screen mode.
    pub fn new(mode: ScreenMode) -> Self {
        Self {
            mode,
            machines: Arc::new(Mutex::new(HashMap::new())),
            next_id: Arc::new(AtomicU64::new(1)),
            terminals: Arc::default(),
            bills: Arc::default(),
            export_gate: Arc::default(),
            exports_started: Arc::default(),
            image_missing: Arc::default(),
            build_gate: Arc::default(),
        }
    }

    /// Test hook: the machine vanishes, as if the vendor lost it.
    pub fn lose_machine(&self, machine: &ProviderRef) {
        if let Some(m) = self.lock().get_mut(&machine.0) {
            m.lost = true;
        }
    }

    /// Test hook: declare that this provider bills while running, like a remote vendor (the
    /// uptime cap applies to billed providers only).
    pub fn set_bills(&self, bills: bool) {
        self.bills.store(bills, Ordering::Relaxed);
    }

    /// Test hook: workspace exports wait until the returned guard is dropped, so a test can
    /// act while a checkpoint is under way.
    pub async fn hold_exports(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.export_gate.clone().lock_owned().await
    }

    /// Test hook: the next machine's preparation builds an image first (stage
    /// `image_build`, then `container_start`, like docker with the image missing); the build
    /// lasts until the returned guard is dropped.
    pub async fn hold_image_build(&self) -> tokio::sync::OwnedMutexGuard<()> {
        let held = self.build_gate.clone().lock_owned().await;
        self.image_missing.store(true, Ordering::Relaxed);
        held
    }

    /// Test hook: how many workspace exports have started (waiting at the gate or done).
    pub fn exports_started(&self) -> u64 {
        self.exports_started.load(Ordering::Relaxed)
    }

    /// Test hook: whether a machine exists, is not lost and runs.
    pub fn is_running(&self, machine: &ProviderRef) -> bool {
        self.alive(machine)
    }

    /// How many machines exist and are not lost.
    pub fn live_machines(&self) -> usize {
        self.lock().values().filter(|m| !m.lost).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Machine>> {
        self.machines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on a live, running machine.
    fn with<T>(
        &self,
        machine: &ProviderRef,
        f: impl FnOnce(&mut Machine) -> ProviderResult<T>,
    ) -> ProviderResult<T> {
        let mut machines = self.lock();
        match machines.get_mut(&machine.0) {
            Some(m) if !m.lost && m.running => f(m),
            Some(m) if !m.lost => Err(ProviderError::Failed("machine is stopped".into())),
            _ => Err(ProviderError::MachineGone),
        }
    }

    fn alive(&self, machine: &ProviderRef) -> bool {
        self.lock()
            .get(&machine.0)
            .is_some_and(|m| !m.lost && m.running)
    }
}

fn max_screens(mode: ScreenMode) -> Option<usize> {
    match mode {
        ScreenMode::Single => Some(1),
        ScreenMode::Multi { limit: 0 } => None,
        ScreenMode::Multi { limit } => Some(limit as usize),
    }
}

#[async_trait]
impl SandboxProvider for FakeProvider {
    fn describe(&self) -> Description {
        Description {
            kind: "fake".into(),
            capabilities: Capabilities {
                multi_screen: self.mode != ScreenMode::Single,
                terminal: true,
                page_browser: false,
                bills_while_running: self.bills.load(Ordering::Relaxed),
                mounted_home: false,
                desktop_freezing: false,
                desktop_limits: false,
            },
        }
    }

    async fn prepare(&self, stage: &(dyn Fn(Preparation) + Send + Sync)) -> ProviderResult<()> {
        if self.image_missing.swap(false, Ordering::Relaxed) {
            stage(Preparation::ImageBuild);
            drop(self.build_gate.lock().await);
            stage(Preparation::ContainerStart);
        }
        Ok(())
    }

    async fn provision(&self, _spec: &MachineSpec) -> ProviderResult<ProviderRef> {
        let id = format!("fake-{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        self.lock().insert(
            id.clone(),
            Machine {
                running: true,
                ..Machine::default()
            },
        );
        Ok(ProviderRef(id))
    }

    async fn reconnect(&self, machine: &ProviderRef, _spec: &MachineSpec) -> ProviderResult<()> {
        match self.lock().get_mut(&machine.0) {
            Some(m) if !m.lost => {
                m.running = true;
                Ok(())
            }
            _ => Err(ProviderError::MachineGone),
        }
    }

    async fn stop(&self, machine: &ProviderRef) -> ProviderResult<()> {
        match self.lock().get_mut(&machine.0) {
            Some(m) if !m.lost => {
                m.running = false;
                // Stopping a machine ends its desktops and shells; the workspace stays.
                m.screens.clear();
                self.terminals.close_machine(machine);
                Ok(())
            }
            _ => Err(ProviderError::MachineGone),
        }
    }

    async fn destroy(&self, machine: &ProviderRef) -> ProviderResult<()> {
        self.lock().remove(&machine.0);
        self.terminals.close_machine(machine);
        Ok(())
    }

    async fn connect_terminal(
        &self,
        machine: &ProviderRef,
        _bot_id: &str,
        _control: Option<&ScreenRoute>,
    ) -> ProviderResult<ScreenRoute> {
        self.with(machine, |_| Ok(()))?;
        self.terminals.open(self, machine).await
    }

    async fn close_route(&self, _machine: &ProviderRef, token: &str) -> ProviderResult<()> {
        self.terminals.close(token);
        Ok(())
    }

    async fn open_screen(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        slot: u32,
    ) -> ProviderResult<ScreenInfo> {
        let mode = self.mode;
        self.with(machine, |m| {
            if let Some(s) = m.screens.get(bot_id) {
                if s.slot != slot {
                    return Err(ProviderError::SlotBusy {
                        slot,
                        why: format!("this bot's screen runs on slot {}", s.slot),
                    });
                }
                return Ok(ScreenInfo { slot });
            }
            if matches!(mode, ScreenMode::Single) && slot != 0 {
                return Err(ProviderError::MultiScreenUnavailable);
            }
            if max_screens(mode).is_some_and(|max| m.screens.len() >= max) {
                return Err(ProviderError::MultiScreenUnavailable);
            }
            if m.screens.values().any(|s| s.slot == slot) {
                return Err(ProviderError::SlotBusy {
                    slot,
                    why: "another bot's screen runs there".into(),
                });
            }
            m.screens.insert(
                bot_id.into(),
                Screen {
                    slot,
                    pointer: (0, 0),
                    typed: String::new(),
                    actions: 0,
                },
            );
            Ok(ScreenInfo { slot })
        })
    }

    async fn close_screen(&self, machine: &ProviderRef, bot_id: &str) -> ProviderResult<()> {
        self.with(machine, |m| {
            m.screens.remove(bot_id);
            Ok(())
        })
    }

    /// Always the full frame: the caller scales it.
    async fn observe_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        _size: FrameSize,
    ) -> ProviderResult<Frame> {
        let screen = self.with(machine, |m| {
            m.screens
                .get(bot_id)
                .cloned()
                .ok_or_else(|| ProviderError::Failed("no screen for this bot".into()))
        })?;
        frame::render(&screen)
    }

    /// Its screenshot is always the full frame: the caller scales it.
    async fn act_sized(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        actions: &[Action],
        _size: FrameSize,
    ) -> ProviderResult<ActOutcome> {
        let mut completed = 0;
        let mut stopped = None;
        for action in actions {
            if let Err(reason) =
                crate::desktop::action_rules::check(action, frame::WIDTH, frame::HEIGHT)
            {
                stopped = Some(ActStop::invalid(reason));
                break;
            }
            if let Action::Wait { ms } = action {
                tokio::time::sleep(Duration::from_millis((*ms).min(10_000))).await;
            }
            self.with(machine, |m| {
                let s = m
                    .screens
                    .get_mut(bot_id)
                    .ok_or_else(|| ProviderError::Failed("no screen for this bot".into()))?;
                match action {
                    Action::Move { x, y }
                    | Action::Click { x, y, .. }
                    | Action::Scroll { x, y, .. } => s.pointer = (*x, *y),
                    Action::Drag { to_x, to_y, .. } => s.pointer = (*to_x, *to_y),
                    Action::Type { text } => s.typed.push_str(text),
                    Action::Key { keys } => s.typed.push_str(&format!("<{keys}>")),
                    Action::Wait { .. } => {}
                }
                s.actions += 1;
                Ok(())
            })?;
            completed += 1;
        }
        let frame = self.observe(machine, bot_id).await?;
        Ok(ActOutcome {
            completed,
            frame,
            stopped,
        })
    }

    async fn launch(
        &self,
        machine: &ProviderRef,
        bot_id: &str,
        argv: &[String],
    ) -> ProviderResult<()> {
        self.with(machine, |m| {
            let s = m
                .screens
                .get_mut(bot_id)
                .ok_or_else(|| ProviderError::Failed("no screen for this bot".into()))?;
            s.typed.push_str(&format!("<launch {}>", argv.join(" ")));
            s.actions += 1;
            Ok(())
        })
    }

    async fn exec(
        &self,
        machine: &ProviderRef,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        let deadline = Instant::now() + request.timeout;
        let mut cwd = normalize(&request.cwd, true)?;
        let mut env: BTreeMap<String, String> = [
            ("HOME", "/workspace"),
            ("USER", "rakazo"),
            ("PATH", "/usr/bin:/bin"),
        ]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
        env.extend(request.env.iter().cloned());
        let mut out = ExecOutput {
            exit_code: 0,
            stdout: String::new(),
            stderr: String::new(),
            timed_out: false,
        };
        let steps = match shell::parse(&request.command, &env) {
            Ok(steps) => steps,
            Err(e) => {
                self.with(machine, |_| Ok(()))?;
                out.stderr = format!("sh: syntax error: {e}\n");
                out.exit_code = 2;
                return Ok(out);
            }
        };
        for (and, or, cmd) in steps {
            if (and && out.exit_code != 0) || (or && out.exit_code == 0) {
                continue;
            }
            if cmd.argv.first().map(String::as_str) == Some(LOSE_MACHINE_COMMAND) {
                self.lose_machine(machine);
                return Err(ProviderError::MachineGone);
            }
            match self.with(machine, |m| {
                Ok(shell::run_simple(&mut m.files, &cwd, &env, &cmd))
            })? {
                Step::Done {
                    stdout,
                    stderr,
                    status,
                } => {
                    out.stdout.push_str(&String::from_utf8_lossy(&stdout));
                    out.stderr.push_str(&String::from_utf8_lossy(&stderr));
                    out.exit_code = status;
                }
                Step::Exit(code) => {
                    out.exit_code = code;
                    return Ok(out);
                }
                Step::Cd(dir) => {
                    cwd = dir;
                    out.exit_code = 0;
                }
                Step::Sleep(seconds) => {
                    let until =
                        Instant::now() + Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0));
                    while Instant::now() < until {
                        if Instant::now() >= deadline {
                            out.timed_out = true;
                            out.exit_code = -1;
                            return Ok(out);
                        }
                        if !self.alive(machine) {
                            return Err(ProviderError::MachineGone);
                        }
                        tokio::time::sleep(SLEEP_TICK).await;
                    }
                    out.exit_code = 0;
                }
            }
        }
        Ok(out)
    }

    async fn list_files(
        &self,
        machine: &ProviderRef,
        path: &str,
    ) -> ProviderResult<Vec<FileEntry>> {
        let path = normalize(path, true)?;
        self.with(machine, |m| m.files.list(&path))
    }

    async fn read_file(&self, machine: &ProviderRef, path: &str) -> ProviderResult<Vec<u8>> {
        let path = normalize(path, false)?;
        self.with(machine, |m| m.files.read(&path).map(<[u8]>::to_vec))
    }

    async fn write_file(
        &self,
        machine: &ProviderRef,
        path: &str,
        data: &[u8],
    ) -> ProviderResult<()> {
        let path = normalize(path, false)?;
        self.with(machine, |m| m.files.write(&path, data.to_vec()))
    }

    async fn export_workspace_since(
        &self,
        machine: &ProviderRef,
        since: Option<&str>,
    ) -> ProviderResult<WorkspaceExport> {
        use sha2::Digest as _;
        self.exports_started.fetch_add(1, Ordering::Relaxed);
        drop(self.export_gate.lock().await);
        // The emulated tree has no file times: its fingerprint is the archive's digest.
        let (archive, skipped) = self.with(machine, |m| m.files.export())?;
        let fingerprint = hex::encode(sha2::Sha256::digest(&archive));
        if since == Some(fingerprint.as_str()) {
            return Ok(WorkspaceExport::Unchanged);
        }
        Ok(WorkspaceExport::Archive {
            workspace: archive.into(),
            fingerprint: Some(fingerprint),
            skipped,
        })
    }

    async fn import_workspace(&self, machine: &ProviderRef, archive: &[u8]) -> ProviderResult<()> {
        let tree = Tree::import(archive)?;
        self.with(machine, |m| {
            m.files = tree;
            Ok(())
        })
    }
}

/// Shared handle type used by the app and tests.
pub type SharedFake = Arc<FakeProvider>;
