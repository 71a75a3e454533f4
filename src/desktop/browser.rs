//! How a bot's Chromium is launched: its persistent profile under the workspace and its flags.
//!
//! A profile belongs to one bot for good: it is never cloned from another bot, merged or
//! deleted here. Only Chromium's single-instance lock files are removed before a launch, since
//! the runtime knows no other Chromium of that bot is running (a stale lock left by a killed
//! browser, or one written on another machine, would otherwise block the start).

use std::path::{Path, PathBuf};

/// Directory, relative to the workspace root, that holds every bot's profile.
pub const PROFILES_DIR: &str = ".browser-profiles";

/// Chromium's single-instance lock files inside a profile.
pub const LOCK_FILES: [&str; 4] = [
    "SingletonLock",
    "SingletonSocket",
    "SingletonCookie",
    "DevToolsActivePort",
];

/// The profile directory of `bot_id` (already checked with [`super::check_id`]).
pub fn profile_dir(workspace: &Path, bot_id: &str) -> PathBuf {
    workspace.join(PROFILES_DIR).join(bot_id)
}

/// How much lower than the runtime's own the CPU priority of a desktop's programs (the
/// browser, the window manager and what the bot launches) is in a lowered start
/// ([`Launch::lowered`]); the X server, which answers every observe and action, keeps the
/// runtime's priority. Desktops start at the runtime's priority by default; the host provider
/// without desktop groups can lower a desktop while it starts (`SANDBOX_DESKTOP_START_NICE`,
/// [`Launch::start_only`]): see ARCHITECTURE.md ("CPU priority of desktops") for what each
/// costs.
pub const DESKTOP_NICE: u8 = 10;

/// Chromium features a bot's browser goes without (`--disable-features`).
///
/// - `Translate`, `MediaRouter`, `OptimizationHints`: services that call out to Google.
/// - `SpareRendererForSitePerProcess`: a renderer process kept started ahead for the next
///   navigation to a new site (about 6 MiB per desktop).
/// - `WebUIOmniboxAimPopup`: a second page (the "AI Mode" compose popup) the address bar's
///   suggestion renderer keeps loaded beside the suggestion list (about 14 MiB per desktop);
///   the list itself stays.
/// - `WebUIOmniboxPopup`: the address bar's suggestion list drawn as a web page in a renderer
///   started with the browser (about 30 MiB per desktop and much of the browser's start-up
///   CPU); without it the browser's own views draw the list. (It was kept on for a while for a
///   lost click, which was the page tools attached to a background tab: see `cdp.rs`.)
pub const DISABLED_FEATURES: [&str; 6] = [
    "Translate",
    "MediaRouter",
    "OptimizationHints",
    "SpareRendererForSitePerProcess",
    "WebUIOmniboxAimPopup",
    "WebUIOmniboxPopup",
];

/// Switches of the lean start that fold helper processes into the browser's own, each a copy
/// of shared libraries and heaps less per desktop (BENCHMARKS.md, "Memory"):
///
/// - the compositor in the browser process (`--in-process-gpu`: the browser draws in
///   software, `--disable-gpu`, so this is not a GPU driver in the browser process);
/// - no zygote for unsandboxed helpers (`--no-unsandboxed-zygote`): with the compositor in
///   the browser, nothing is left for it to start. Each switch alone moves the cost to the
///   other process; together they save about 16 MiB per desktop;
/// - the network service in the browser process (`NetworkServiceInProcess2`), about 16 MiB
///   more.
///
/// The price: a crash of the compositor or of the network service now takes the browser with
/// it, and a flaw in the network stack lands in the browser process rather than in a process
/// of its own. Both run as the workspace user inside the computer, which is the boundary (the
/// bot already is that user). The renderers and their sandbox are unchanged.
pub const LEAN_SWITCHES: [&str; 3] = [
    "--in-process-gpu",
    "--no-unsandboxed-zygote",
    "--enable-features=NetworkServiceInProcess2",
];

/// The features the plain start (before [`DISABLED_FEATURES`] grew) went without.
const PLAIN_DISABLED_FEATURES: [&str; 3] = ["Translate", "MediaRouter", "OptimizationHints"];

/// How desktops start. The default is what the runtime uses; [`Launch::plain`] is the start
/// as it was before desktops were trimmed and lowered in priority, kept so that benches
/// measure both side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Nice value of the browser, the window manager and the bot's programs.
    pub nice: u8,
    /// Chromium without [`DISABLED_FEATURES`]' processes and Xvfb without GLX (a software
    /// OpenGL the browser, started with `--disable-gpu`, never uses); `false`: without only
    /// the first three features, and with GLX.
    pub lean: bool,
    /// [`Self::nice`] holds only while the desktop starts: once its browser is open, or as
    /// soon as its start is starved ([`super::priority_local::StartWatch`]), the browser's and
    /// the window manager's processes are raised back to the runtime's priority, and the bot's
    /// programs start at it. Raising needs a runtime on the desktop's
    /// host that may raise priorities ([`super::priority_local::may_raise`]); where it may
    /// not, such a desktop is not lowered at all.
    pub start_only: bool,
}

impl Default for Launch {
    fn default() -> Self {
        Self {
            nice: 0,
            lean: true,
            start_only: false,
        }
    }
}

impl Launch {
    /// The default start with the browser, the window manager and the bot's programs
    /// [`DESKTOP_NICE`] below the runtime's priority, for good.
    pub fn lowered() -> Self {
        Self {
            nice: DESKTOP_NICE,
            ..Self::default()
        }
    }

    /// The default start with the browser and the window manager [`DESKTOP_NICE`] below the
    /// runtime's priority until the browser is open ([`Self::start_only`]).
    pub fn lowered_while_starting() -> Self {
        Self {
            nice: DESKTOP_NICE,
            start_only: true,
            ..Self::default()
        }
    }

    /// The start before this trimming: priority of the runtime, every feature and GLX.
    pub fn plain() -> Self {
        Self {
            nice: 0,
            lean: false,
            start_only: false,
        }
    }
}

/// Chromium's arguments for a bot's browser on a `width`x`height` screen.
///
/// `no_sandbox` is only for a browser that has to run as root (Chromium refuses otherwise);
/// the computer is then the security boundary, as the spec's providers document. `lean`: see
/// [`Launch::lean`].
pub fn chromium_args(
    profile: &Path,
    width: u32,
    height: u32,
    no_sandbox: bool,
    lean: bool,
) -> Vec<String> {
    let disabled = if lean {
        &DISABLED_FEATURES[..]
    } else {
        &PLAIN_DISABLED_FEATURES[..]
    };
    let mut args = vec![
        format!("--user-data-dir={}/", profile.display()),
        "--password-store=basic".into(),
        "--restore-last-session".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--disable-session-crashed-bubble".into(),
        "--hide-crash-restore-bubble".into(),
        format!("--disable-features={}", disabled.join(",")),
        "--disable-component-update".into(),
        "--disable-background-networking".into(),
        "--disable-sync".into(),
        "--disable-breakpad".into(),
        "--disable-dev-shm-usage".into(),
        "--disable-gpu".into(),
        "--window-position=0,0".into(),
        format!("--window-size={width},{height}"),
        "--start-maximized".into(),
        // DevTools on loopback only, on a port Chromium picks and writes to
        // `DevToolsActivePort` in the profile: the runtime closes the browser through it.
        "--remote-debugging-address=127.0.0.1".into(),
        "--remote-debugging-port=0".into(),
    ];
    if lean {
        args.extend(LEAN_SWITCHES.map(String::from));
    }
    if no_sandbox {
        // `--test-type` hides the "unsupported command-line flag" bar that would shift the page.
        args.push("--no-sandbox".into());
        args.push("--test-type".into());
    }
    args
}

/// The file in a profile that holds the browser's cookies as DevTools reported them at the
/// last checkpoint or quit ([`devtools_script`]`(.., Save)`); the browser gets them back at its
/// next start. It stands for Chromium's own cookie database, which a running browser flushes
/// only now and then and which the archive leaves out.
pub const SAVED_COOKIES: &str = "Saved Cookies.json";

/// What [`devtools_script`] asks of a browser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevToolsAction {
    /// Quit the way a person quitting it would (DevTools `Browser.close`): Chromium then writes
    /// its databases and session, which it skips on SIGTERM.
    Close,
    /// Write its cookies (`Storage.getCookies`) to [`SAVED_COOKIES`], sorted, and only when
    /// they differ from the file's, so an unchanged browser changes no file.
    Save,
    /// Give it the cookies of [`SAVED_COOKIES`] (`Storage.setCookies`), right after its start.
    /// It connects even without a file: Chromium rewrites its preferences on its first DevTools
    /// connection, which would otherwise happen at the first checkpoint and look like a change.
    Load,
}

/// A script, run inside the computer as the workspace user, that does `action` through the
/// DevTools port of the browser of `profile` (`browser_devtools.py`). Exits 0 when done,
/// non-zero when the browser has no DevTools endpoint or refused (a caller closing it then
/// falls back to signals).
pub fn devtools_script(profile: &Path, action: DevToolsAction) -> String {
    let profile = crate::desktop::shell_quote(&profile.display().to_string());
    let action = match action {
        DevToolsAction::Close => "close",
        DevToolsAction::Save => "save",
        DevToolsAction::Load => "load",
    };
    format!("python3 -I - {profile} {action} <<'PY'\n{DEVTOOLS_PY}PY\n")
}

/// The in-computer DevTools client (Python 3 standard library only).
const DEVTOOLS_PY: &str = include_str!("browser_devtools.py");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_lives_under_the_workspace_per_bot() {
        let p = profile_dir(Path::new("/w"), "bot-a");
        assert_eq!(p, Path::new("/w/.browser-profiles/bot-a"));
        let args = chromium_args(&p, 1280, 800, false, true);
        assert!(args.contains(&"--user-data-dir=/w/.browser-profiles/bot-a/".to_string()));
        assert!(args.contains(&"--password-store=basic".to_string()));
        assert!(args.contains(&"--restore-last-session".to_string()));
        assert!(!args.iter().any(|a| a == "--no-sandbox"));
        // Site isolation and the sandbox stay on: nothing turns them off.
        for a in &args {
            assert!(
                !a.contains("site-per-process")
                    && !a.contains("IsolateOrigins")
                    && !a.contains("single-process")
                    && !a.contains("no-zygote"),
                "{a}"
            );
        }
        let features = |lean| {
            chromium_args(&p, 1280, 800, false, lean)
                .into_iter()
                .filter(|a| a.starts_with("--disable-features="))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            features(true),
            [format!(
                "--disable-features={}",
                DISABLED_FEATURES.join(",")
            )]
        );
        assert_eq!(
            features(false),
            ["--disable-features=Translate,MediaRouter,OptimizationHints"]
        );
        // The lean start folds helpers into the browser; the plain one does not.
        let plain = chromium_args(&p, 1280, 800, false, false);
        for switch in LEAN_SWITCHES {
            assert!(args.iter().any(|a| a == switch), "{switch}");
            assert!(!plain.iter().any(|a| a == switch), "{switch}");
        }
    }
}
