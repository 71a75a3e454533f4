//! [`WarmPool`]: items started ahead, ready for the next taker: the spare display stacks of
//! one machine, or the docker provider's pooled computers.
//!
//! The pool only keeps count: what an item is, how it starts and how it stops is the
//! runtime's. An item is handed out once and never comes back once used: a bot's desktop is
//! torn down whole, so nothing of one bot reaches another through the pool.

use std::sync::Mutex;
use std::time::Duration;

use rakazo_actors::provider::WarmDesktops;
use tokio::sync::Notify;

/// Spare items, the starts in progress, and the configured size.
pub struct WarmPool<T> {
    target: usize,
    state: Mutex<State<T>>,
    /// Woken when an item is ready or a start ended (waiting takers).
    settled: Notify,
    /// Woken when the pool wants a refill (the background filler).
    wanted: Notify,
}

struct State<T> {
    /// Ready items with their memory (PSS, KiB) as measured when they were ready.
    ready: Vec<(T, u64)>,
    filling: usize,
    closed: bool,
    /// Drained: no start until the next [`WarmPool::want`].
    held: bool,
}

/// How a pool stands, for health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarmStatus {
    /// The configured number of spares.
    pub target: usize,
    /// Spares ready now.
    pub ready: usize,
    /// Spares starting now.
    pub filling: usize,
    /// Memory of the ready spares (PSS, KiB).
    pub pss_kib: u64,
}

impl<T> WarmPool<T> {
    /// A pool keeping `target` spares (0: none, every take finds nothing).
    pub fn new(target: usize) -> Self {
        Self {
            target,
            state: Mutex::new(State {
                ready: Vec::new(),
                filling: 0,
                closed: false,
                held: false,
            }),
            settled: Notify::new(),
            wanted: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configured number of spares.
    pub fn target(&self) -> usize {
        self.target
    }

    /// A ready spare; when none is ready but one is starting, waits up to `wait` for it
    /// (it started earlier than a new one would). `None`: start one yourself.
    pub async fn take(&self, wait: Duration) -> Option<T> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let mut state = self.state();
                if let Some((item, _)) = state.ready.pop() {
                    return Some(item);
                }
                if state.filling == 0 || state.closed {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return None;
            }
        }
    }

    /// Reserves one start when the pool is short of its size and open; the caller then
    /// calls [`Self::finish_fill`] whatever happens.
    pub fn begin_fill(&self) -> bool {
        let mut state = self.state();
        if state.closed || state.held || state.ready.len() + state.filling >= self.target {
            return false;
        }
        state.filling += 1;
        true
    }

    /// Ends a start: a started item joins the pool, unless the pool closed meanwhile, in
    /// which case it comes back to be stopped.
    pub fn finish_fill(&self, started: Option<(T, u64)>) -> Option<T> {
        let back = {
            let mut state = self.state();
            state.filling -= 1;
            match started {
                Some((item, _)) if state.closed => Some(item),
                Some(entry) => {
                    state.ready.push(entry);
                    None
                }
                None => None,
            }
        };
        self.settled.notify_waiters();
        back
    }

    /// Returns an item taken but not used, changed in nothing (for items that can be given
    /// back, such as a computer whose claim was refused); a closed pool gives it back to be
    /// stopped.
    pub fn put_back(&self, item: T) -> Option<T> {
        let back = {
            let mut state = self.state();
            if state.closed {
                Some(item)
            } else {
                state.ready.push((item, 0));
                None
            }
        };
        self.settled.notify_waiters();
        back
    }

    /// Keeps the ready items `keep` picks; returns the others.
    pub fn retain(&self, keep: impl Fn(&T) -> bool) -> Vec<T> {
        let mut state = self.state();
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut state.ready)
            .into_iter()
            .partition(|(item, _)| keep(item));
        state.ready = kept;
        dropped.into_iter().map(|(item, _)| item).collect()
    }

    /// `f` of every ready item.
    pub fn map_ready<R>(&self, f: impl Fn(&T) -> R) -> Vec<R> {
        self.state().ready.iter().map(|(item, _)| f(item)).collect()
    }

    /// Whether a ready spare is one `is` picks.
    pub fn holds(&self, is: impl Fn(&T) -> bool) -> bool {
        self.state().ready.iter().any(|(item, _)| is(item))
    }

    /// Records the memory of the ready spare `is` picks, measured after it joined the pool
    /// (a spare taken meanwhile is no longer counted).
    pub fn note_pss(&self, is: impl Fn(&T) -> bool, kib: u64) {
        if let Some(entry) = self.state().ready.iter_mut().find(|(item, _)| is(item)) {
            entry.1 = kib;
        }
    }

    /// Asks the filler to top the pool up.
    pub fn want(&self) {
        self.state().held = false;
        self.wanted.notify_one();
    }

    /// Waits until [`Self::want`] is called (or was, since the last wait).
    pub async fn wanted(&self) {
        self.wanted.notified().await
    }

    /// Takes every spare out to be stopped (the machine's screens all stop), those starting
    /// included once their start ends; no start begins until the next [`Self::want`], when
    /// the pool refills.
    pub async fn drain(&self) -> Vec<T> {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let mut state = self.state();
                state.held = true;
                if state.filling == 0 {
                    let drained = std::mem::take(&mut state.ready);
                    return drained.into_iter().map(|(item, _)| item).collect();
                }
            }
            settled.await;
        }
    }

    /// Closes the pool for good and returns the ready spares to be stopped.
    pub fn close(&self) -> Vec<T> {
        let drained = {
            let mut state = self.state();
            state.closed = true;
            std::mem::take(&mut state.ready)
        };
        self.settled.notify_waiters();
        self.wanted.notify_one();
        drained.into_iter().map(|(item, _)| item).collect()
    }

    /// Whether the pool was closed.
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// How the pool stands.
    pub fn status(&self) -> WarmStatus {
        let state = self.state();
        WarmStatus {
            target: self.target,
            ready: state.ready.len(),
            filling: state.filling,
            pss_kib: state.ready.iter().map(|(_, kib)| kib).sum(),
        }
    }
}

/// What health says of the pools of `statuses` (one per computer), each keeping `target`.
pub fn summary(target: usize, statuses: impl IntoIterator<Item = WarmStatus>) -> WarmDesktops {
    statuses.into_iter().fold(
        WarmDesktops {
            per_computer: target,
            ..WarmDesktops::default()
        },
        |mut sum, s| {
            sum.computers += 1;
            sum.ready += s.ready;
            sum.starting += s.filling;
            sum.pss_kib += s.pss_kib;
            sum
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fills_to_its_size_and_hands_each_item_out_once() {
        let pool = WarmPool::new(2);
        assert!(pool.begin_fill());
        assert!(pool.begin_fill());
        assert!(!pool.begin_fill(), "two spares at most");
        assert_eq!(pool.finish_fill(Some((1, 10))), None);
        assert_eq!(pool.finish_fill(Some((2, 20))), None);
        assert_eq!(
            pool.status(),
            WarmStatus {
                target: 2,
                ready: 2,
                filling: 0,
                pss_kib: 30
            }
        );
        assert!(pool.holds(|item| *item == 2));
        assert!(!pool.holds(|item| *item == 3));
        pool.note_pss(|item| *item == 2, 25);
        assert_eq!(pool.status().pss_kib, 35, "measured after it was ready");
        let a = pool.take(Duration::ZERO).await.unwrap();
        let b = pool.take(Duration::ZERO).await.unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.take(Duration::ZERO).await, None);
    }

    #[tokio::test]
    async fn a_taker_waits_for_a_start_in_progress() {
        let pool = std::sync::Arc::new(WarmPool::new(1));
        assert!(pool.begin_fill());
        let p = pool.clone();
        let taker = tokio::spawn(async move { p.take(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        pool.finish_fill(Some((7, 0)));
        assert_eq!(taker.await.unwrap(), Some(7));
        // A start that fails lets the waiter go at once.
        assert!(pool.begin_fill());
        let p = pool.clone();
        let taker = tokio::spawn(async move { p.take(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        pool.finish_fill(None);
        assert_eq!(taker.await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_closed_pool_gives_back_what_it_holds_and_what_finishes_later() {
        let pool = WarmPool::new(2);
        assert!(pool.begin_fill());
        pool.finish_fill(Some((1, 0)));
        assert_eq!(pool.drain().await, vec![1]);
        assert!(!pool.begin_fill(), "a drained pool waits to be wanted");
        pool.want();
        assert!(pool.begin_fill(), "then refills");
        pool.finish_fill(Some((3, 0)));
        assert!(pool.begin_fill());
        assert_eq!(pool.close(), vec![3]);
        assert_eq!(pool.finish_fill(Some((2, 0))), Some(2), "to be stopped");
        assert!(!pool.begin_fill());
        assert_eq!(pool.take(Duration::from_secs(1)).await, None);
    }

    #[tokio::test]
    async fn a_drain_waits_for_the_start_in_progress() {
        let pool = std::sync::Arc::new(WarmPool::new(2));
        assert!(pool.begin_fill());
        let p = pool.clone();
        let drain = tokio::spawn(async move { p.drain().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!drain.is_finished(), "the start in progress is waited for");
        assert!(!pool.begin_fill(), "and no other begins");
        assert_eq!(pool.finish_fill(Some((7, 0))), None);
        assert_eq!(drain.await.unwrap(), vec![7]);
        assert_eq!(pool.status().ready, 0);
    }

    #[test]
    fn health_sums_the_computers_pools() {
        let one = WarmStatus {
            target: 1,
            ready: 1,
            filling: 0,
            pss_kib: 20_000,
        };
        let two = WarmStatus {
            target: 1,
            ready: 0,
            filling: 1,
            pss_kib: 0,
        };
        assert_eq!(
            summary(1, [one, two]),
            WarmDesktops {
                per_computer: 1,
                computers: 2,
                ready: 1,
                starting: 1,
                pss_kib: 20_000,
                ..WarmDesktops::default()
            }
        );
    }

    #[tokio::test]
    async fn size_zero_never_fills() {
        let pool: WarmPool<u8> = WarmPool::new(0);
        assert!(!pool.begin_fill());
        assert_eq!(pool.take(Duration::from_secs(1)).await, None);
    }
}
