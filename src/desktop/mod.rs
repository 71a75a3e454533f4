//! The shared Linux desktop runtime: per-bot X displays, browsers, screen gateway, capture and input.
//!
//! A tour of the files:
//! - [`command`]: the one thing a provider must supply, a [`command::CommandRunner`] that runs
//!   shell scripts on the machine, plus the host implementation.
//! - [`runtime`]: [`runtime::DesktopRuntime`], the per-machine screen table: display slots and
//!   their generations, the stack per slot (Xvfb, window manager, Chromium), the screen limit
//!   and the teardown event.
//! - [`browser`]: how a bot's Chromium is launched on its persistent profile.
//! - [`gateway`]: the token-protected screen gateway (websockify + one x11vnc per capability).
//! - [`terminal`]: the PTY terminal servers beside the gateway, one per control capability,
//!   and their frame protocol (`terminal_server.py`).
//! - [`capture`]: screenshots straight from the X server, PNG encoding, scaled frames and
//!   frame hashes; [`shared_image`]: the memfd the X server writes screenshots into (MIT-SHM).
//! - [`input`] and [`keys`]: ordered action batches through XTEST, and key names to keysyms.
//! - [`screen_commands`]: capture and input through commands only (an in-computer helper and
//!   xdotool), for machines whose X server this process cannot reach.
//! - [`files`]: workspace path checks and tar export/import for host workspaces.
//! - [`warm`]: the spare desktops a runtime keeps ready for its next bots;
//!   [`spare_profile`]: the profile a spare's browser starts on, handed over to a new bot;
//!   [`profile_local`]: the same readying and hand-over by system calls on this host.
//! - [`provider`]: the `desktop` [`rakazo_actors::provider::SandboxProvider`] on the host.
//!
//! Architecture invariant: nothing here knows about HTTP, the database or leases. The caller
//! (the screen actor) decides who controls a screen and when to tear it down; this module only
//! keeps the processes and sockets true to that decision.

pub mod action_rules;
pub mod browser;
pub mod capture;
pub mod cdp;
pub mod cdp_tab;
pub mod cgroup;
pub mod command;
pub mod files;
pub mod frame_scale;
pub mod gateway;
pub mod gateway_stream;
pub mod group_notice;
pub mod groups;
pub mod input;
pub mod keys;
pub mod page;
pub mod page_act;
pub mod page_frames;
pub mod png_bands;
pub mod priority_local;
pub mod profile_local;
pub mod provider;
pub mod runtime;
pub mod screen_commands;
pub mod shared_image;
pub mod spare_profile;
pub mod start_group;
pub mod start_watch;
pub mod terminal;
pub mod terminal_frames;
pub mod warm;

use rakazo_actors::provider::ProviderError;

/// Failures of the desktop runtime.
#[derive(Debug, thiserror::Error)]
pub enum DesktopError {
    /// The screen limit is reached and no idle, uncontrolled screen can be evicted.
    #[error("no further screen can be allocated")]
    MultiScreenUnavailable,
    /// The display slot asked for is busy (another bot's screen, one starting or stopping, or
    /// one whose teardown failed), or the bot's screen runs on another slot.
    #[error("display slot {slot} is busy: {why}")]
    SlotBusy {
        /// The slot asked for.
        slot: u32,
        /// What holds it.
        why: String,
    },
    /// The bot has no open screen.
    #[error("no screen is open for this bot")]
    NoScreen,
    /// A command on the machine failed to run or exited badly.
    #[error("command failed: {0}")]
    Command(String),
    /// A process of the display stack did not start or did not stop.
    #[error("display stack: {0}")]
    Stack(String),
    /// Talking to the X server failed.
    #[error("x server: {0}")]
    X(String),
    /// A request was malformed (a point off the screen, an unknown key, a too long wait).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// An action of a batch was invalid or could not be applied.
    #[error("action {index} failed: {reason}")]
    Action {
        /// Zero-based index of the failing action; also how many completed before it.
        index: usize,
        /// Why it failed.
        reason: String,
        /// Whether the action itself was invalid on this screen (rather than the display
        /// failing to do it).
        invalid: bool,
    },
    /// An identifier (bot id, home key) is not acceptable as a path component.
    #[error("invalid identifier: {0}")]
    InvalidId(String),
    /// A page-browser command failed (a stale ref, an unsupported action, DevTools trouble).
    #[error("{0}")]
    Browser(String),
    /// A JavaScript dialog of the page blocks it: nothing more can be done on the page until
    /// the dialog is answered (the message says which dialog).
    #[error("{0}")]
    DialogOpen(String),
}

impl From<DesktopError> for ProviderError {
    fn from(err: DesktopError) -> Self {
        match err {
            DesktopError::MultiScreenUnavailable => ProviderError::MultiScreenUnavailable,
            DesktopError::SlotBusy { slot, why } => ProviderError::SlotBusy { slot, why },
            DesktopError::NoScreen => ProviderError::NotFound(err.to_string()),
            DesktopError::InvalidId(_) => ProviderError::PathRejected(err.to_string()),
            DesktopError::Browser(msg) if msg.starts_with("stale ref") => {
                ProviderError::StaleRef(msg)
            }
            DesktopError::Browser(msg) => ProviderError::PageAction(msg),
            DesktopError::DialogOpen(msg) => ProviderError::DialogOpen(msg),
            other => ProviderError::Failed(other.to_string()),
        }
    }
}

/// Accepts ids used as single path components and process arguments: ASCII letters, digits,
/// `-`, `_` and `.`, not starting with `.`, at most 128 bytes.
pub fn check_id(id: &str) -> Result<(), DesktopError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(DesktopError::InvalidId(id.chars().take(64).collect()))
    }
}

/// Quotes a string for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_single_safe_components() {
        assert!(check_id("bot-1_a.b").is_ok());
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "a\0b",
            &"x".repeat(129),
        ] {
            assert!(check_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
