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

/// Chromium's arguments for a bot's browser on a `width`x`height` screen.
///
/// `no_sandbox` is only for a browser that has to run as root (Chromium refuses otherwise);
/// the computer is then the security boundary, as the spec's providers document.
pub fn chromium_args(profile: &Path, width: u32, height: u32, no_sandbox: bool) -> Vec<String> {
    let mut args = vec![
        format!("--user-data-dir={}/", profile.display()),
        "--password-store=basic".into(),
        "--restore-last-session".into(),
        "--no-first-run".into(),
        "--no-default-browser-check".into(),
        "--disable-session-crashed-bubble".into(),
        "--hide-crash-restore-bubble".into(),
        "--disable-features=Translate,MediaRouter,OptimizationHints".into(),
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
    if no_sandbox {
        // `--test-type` hides the "unsupported command-line flag" bar that would shift the page.
        args.push("--no-sandbox".into());
        args.push("--test-type".into());
    }
    args
}

/// A script, run inside the computer, that closes the browser of `profile` the way a person
/// quitting it would (DevTools `Browser.close`): Chromium then writes its cookie database and
/// session, which it skips on SIGTERM. Exits 0 once the browser answered; non-zero when it
/// has no DevTools endpoint (the caller then falls back to signals).
pub fn close_script(profile: &Path) -> String {
    let port_file =
        crate::desktop::shell_quote(&format!("{}/DevToolsActivePort", profile.display()));
    format!("python3 - {port_file} <<'PY'\n{CLOSE_PY}PY\n")
}

/// A minimal websocket client (RFC 6455 handshake, one masked text frame, one reply).
const CLOSE_PY: &str = r#"import base64, json, os, socket, sys
lines = open(sys.argv[1]).read().split()
port, path = int(lines[0]), lines[1]
s = socket.create_connection(("127.0.0.1", port), timeout=5)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, port, key)).encode())
head = b""
while b"\r\n\r\n" not in head:
    chunk = s.recv(4096)
    if not chunk:
        sys.exit(2)
    head += chunk
if b" 101 " not in head.split(b"\r\n")[0]:
    sys.exit(3)
body = json.dumps({"id": 1, "method": "Browser.close"}).encode()
mask = os.urandom(4)
frame = bytes([0x81, 0x80 | len(body)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(body))
s.sendall(frame)
try:
    s.recv(4096)
except OSError:
    pass
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_lives_under_the_workspace_per_bot() {
        let p = profile_dir(Path::new("/w"), "bot-a");
        assert_eq!(p, Path::new("/w/.browser-profiles/bot-a"));
        let args = chromium_args(&p, 1280, 800, false);
        assert!(args.contains(&"--user-data-dir=/w/.browser-profiles/bot-a/".to_string()));
        assert!(args.contains(&"--password-store=basic".to_string()));
        assert!(args.contains(&"--restore-last-session".to_string()));
        assert!(!args.iter().any(|a| a == "--no-sandbox"));
    }
}
