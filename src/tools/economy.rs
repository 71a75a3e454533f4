//! Model-context economy: identical consecutive frames lose their image bytes, and a visual
//! action that keeps leaving the screen unchanged is refused after a few tries.

use std::collections::HashMap;
use std::sync::Mutex;

/// How many identical no-op batches are allowed before the next copy is refused.
pub const REPEAT_LIMIT: u32 = 2;

/// Per run and bot: the last frame seen and the no-op count of each action batch.
#[derive(Default)]
pub struct Economy {
    runs: Mutex<HashMap<String, RunMemory>>,
}

#[derive(Default)]
struct RunMemory {
    last_frame: Option<String>,
    no_ops: HashMap<String, u32>,
}

/// A frame's digest: the hex BLAKE3 hash of its PNG, the frame's name in its run's recording
/// (BLAKE3 rather than SHA-256: a 1.8 MB screenshot hashes in a third of the time).
pub fn digest(png: &[u8]) -> String {
    blake3::hash(png).to_hex().to_string()
}

impl Economy {
    fn with<T>(&self, run_id: &str, f: impl FnOnce(&mut RunMemory) -> T) -> T {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        f(runs.entry(run_id.to_owned()).or_default())
    }

    /// Record a frame; answers whether it equals the previous one of this run.
    pub fn seen(&self, run_id: &str, frame_digest: &str) -> bool {
        self.with(run_id, |m| {
            m.last_frame.replace(frame_digest.to_owned()).as_deref() == Some(frame_digest)
        })
    }

    /// Whether `batch` already left the screen unchanged `REPEAT_LIMIT` times in a row.
    pub fn exhausted(&self, run_id: &str, batch: &str) -> bool {
        self.with(run_id, |m| {
            m.no_ops.get(batch).copied().unwrap_or(0) >= REPEAT_LIMIT
        })
    }

    /// Count the outcome of a batch: unchanged screens add up, any change resets.
    pub fn count(&self, run_id: &str, batch: &str, unchanged: bool) {
        self.with(run_id, |m| {
            if unchanged {
                *m.no_ops.entry(batch.to_owned()).or_default() += 1;
            } else {
                m.no_ops.clear();
            }
        });
    }

    /// Forget a finished run.
    pub fn forget(&self, run_id: &str) {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
    }
}
