//! The watch over a desktop start lowered while it lasts ([`super::priority_local`] by nice
//! value, [`super::start_group`] by control group): beside CPU-heavy work at normal priority a
//! lowered start would wait for that work to end, so while it lasts its browser's main thread is
//! looked at, and once it waits for a CPU most of the time the start is raised at once.

use std::fs;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a lowered start's browser is looked at for starvation.
const STARVED_LOOK: Duration = Duration::from_millis(200);

/// How long the thread `tid` has run on a CPU and how long it has waited for one, in
/// nanoseconds (the first two fields of `/proc/<tid>/schedstat`).
fn ran_and_waited(tid: u32) -> Option<(u64, u64)> {
    let line = fs::read_to_string(format!("/proc/{tid}/schedstat")).ok()?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// Whether a thread that ran `ran` and waited to run `waited` during one look of `span` (all in
/// nanoseconds) was starved: it waited for a CPU for half the look and for most of the time it
/// could have run. A start beside a running bot's observations shares the CPUs and stays below
/// both marks; beside CPU-bound work at normal priority it barely runs.
fn starved(ran: u64, waited: u64, span: u64) -> bool {
    waited >= span / 2 && waited >= 3 * ran
}

/// Resolves once the thread `leader` (a lowered browser's main thread) is starved ([`starved`]
/// over one look), with `true`; with `false` once the thread is gone.
async fn starving(leader: u32) -> bool {
    let Some(mut last) = ran_and_waited(leader) else {
        return false;
    };
    let mut looked = Instant::now();
    loop {
        tokio::time::sleep(STARVED_LOOK).await;
        let Some(now) = ran_and_waited(leader) else {
            return false;
        };
        // The look as long as it really was: a sleep may end late on a busy machine.
        let span = looked.elapsed().as_nanos() as u64;
        looked = Instant::now();
        let (ran, waited) = (now.0.saturating_sub(last.0), now.1.saturating_sub(last.1));
        if starved(ran, waited, span) {
            return true;
        }
        last = now;
    }
}

/// The watch over a lowered start: while it lasts, its raise runs as soon as the thread
/// `leader` is starved. Dropping it ends the watch.
pub struct StartWatch {
    task: tokio::task::JoinHandle<()>,
    raised: Arc<AtomicBool>,
}

impl StartWatch {
    /// Watches the start of the desktop on `screen_display` (bot `bot_id`): `leader` is its
    /// browser's main thread, `raise` what puts the desktop back at the runtime's priority
    /// (answering how many threads or processes it moved).
    pub fn new(
        leader: u32,
        screen_display: u32,
        bot_id: String,
        raise: Pin<Box<dyn Future<Output = usize> + Send>>,
    ) -> Self {
        let raised = Arc::new(AtomicBool::new(false));
        let flag = raised.clone();
        let task = tokio::spawn(async move {
            if !starving(leader).await {
                return;
            }
            // Said before the raise begins: a lowering that reads `false` afterwards is
            // followed by the whole raise.
            flag.store(true, Ordering::SeqCst);
            let raised = raise.await;
            tracing::info!(
                screen.display = screen_display,
                bot.id = %bot_id,
                raised,
                "desktop.priority.raised_starved"
            );
        });
        Self { task, raised }
    }

    /// Whether the start was found starved (its raise has begun or is done).
    pub fn raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }
}

impl Drop for StartWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_starved_when_it_waits_most_of_a_look_and_barely_runs() {
        let look = 200_000_000;
        // Beside CPU-bound work at normal priority: runnable all the look, running a little.
        assert!(starved(10_000_000, 190_000_000, look));
        // Sharing the CPUs with a running bot: it ran more than it waited.
        assert!(!starved(120_000_000, 80_000_000, look));
        // Waiting most of the time it could run, but mostly asleep (idle, not starved).
        assert!(!starved(5_000_000, 40_000_000, look));
        // Waiting half the look, yet running as much as a third of it.
        assert!(!starved(70_000_000, 110_000_000, look));
    }
}
