//! Stopping a command whose deadline passed or whose caller went away: the kill is asked for
//! again until envd confirms it, and on Novita a stop that stays unconfirmed pauses the sandbox
//! and quarantines it, so that nothing in this process resumes it (the computer's row is
//! quarantined by its actor, for every process) until a recover or reset replaces it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rakazo_actors::provider::{ProviderError, ProviderResult};

use super::{E2b, RemoteSandboxes, Session, Vendor};

/// How many times a kill is asked for before it counts as unconfirmed.
pub const KILL_ATTEMPTS: u32 = 3;
/// The pause between two kill attempts.
const KILL_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The sandboxes this process quarantined, with what their callers are told.
#[derive(Clone, Default)]
pub struct Quarantine(Arc<Mutex<HashMap<String, String>>>);

impl Quarantine {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why sandbox `id` is quarantined; `None` when it is not.
    pub fn why(&self, id: &str) -> Option<String> {
        self.lock().get(id).cloned()
    }

    fn add(&self, id: &str, why: &str) {
        self.lock().insert(id.to_owned(), why.to_owned());
    }

    /// Sandbox `id` was deleted: nothing is left to keep from resuming.
    pub fn clear(&self, id: &str) {
        self.lock().remove(id);
    }
}

impl E2b {
    /// SIGKILL for `pid`, asked up to [`KILL_ATTEMPTS`] times: `Ok` once envd confirms (killed,
    /// or no such process: it had ended); `MachineGone` at once; otherwise the last failure.
    pub(super) async fn kill_confirmed(&self, s: &Session, pid: u64) -> ProviderResult<()> {
        let mut last = ProviderError::Failed("no kill was asked for".into());
        for attempt in 0..KILL_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(KILL_RETRY_PAUSE).await;
            }
            match self.kill_process(s, pid).await {
                Ok(_) => return Ok(()),
                Err(ProviderError::MachineGone) => return Err(ProviderError::MachineGone),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// What a command's unconfirmed stop (`why`) becomes. On E2B: an error. On Novita: the
    /// sandbox is paused (confirmed by its state, asked again as for any pause) and
    /// quarantined, whether or not the pause was confirmed: the command may remain suspended
    /// in it, and a resume would let it run on.
    pub(super) async fn stop_unconfirmed(&self, s: &Session, why: &str) -> ProviderError {
        tracing::warn!(sandbox.id = %s.id, "e2b.command.kill_unconfirmed");
        if self.config.vendor != Vendor::Novita {
            return ProviderError::Failed(why.to_owned());
        }
        let paused = match self.pause(&s.id).await {
            Err(ProviderError::MachineGone) => return ProviderError::MachineGone,
            paused => paused.is_ok(),
        };
        let state = if paused {
            "paused"
        } else {
            "asked to pause (not confirmed; its lifetime, no longer pushed, ends it within ten minutes at the latest)"
        };
        let told = format!(
            "{why}. The computer was {state} and is quarantined: the command may remain \
             suspended in it, so nothing resumes it. Recover or reset the computer to replace it \
             from its saved work"
        );
        self.quarantine.add(&s.id, &told);
        tracing::warn!(sandbox.id = %s.id, paused, "novita.sandbox.quarantined");
        ProviderError::Quarantined(told)
    }

    /// The error of a call on quarantined sandbox `id`, if it is one.
    pub(super) fn refuse_quarantined(&self, id: &str) -> ProviderResult<()> {
        match self.quarantine.why(id) {
            Some(why) => Err(ProviderError::Quarantined(why)),
            None => Ok(()),
        }
    }
}
