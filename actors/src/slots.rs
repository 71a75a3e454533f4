//! The screen slots of one computer as this process holds them, and the eviction policy at the
//! Team screen limit: which bot holds which slot at which generation, which bots are opening a
//! screen, and which screen gives way to a new one (the oldest idle screen that no person
//! controls and whose bot has no run executing). Plain data and rules; the `ScreenActor`s of
//! the computer apply them and providers only start and stop display stacks.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex as StdMutex;

/// A screen a bot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Display slot the provider gave it.
    pub slot: u32,
    /// Generation that capabilities bind (the computer's counter).
    pub generation: i64,
    /// Last open, observe or act (milliseconds since the epoch).
    pub last_used_ms: i64,
}

/// What a screen under the limit may be, as the lease table says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The bot whose screen it is.
    pub bot_id: String,
    /// Last use.
    pub last_used_ms: i64,
    /// A person holds a live control grant on it.
    pub controlled: bool,
    /// The bot's run executes (it holds a live execution lease).
    pub executing: bool,
}

/// What a bot asking for a screen gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Below the limit (or no limit): open.
    Open,
    /// At the limit: this bot's screen gives way first.
    Evict(String),
    /// At the limit and every screen is controlled or executing: `MULTI_SCREEN_UNAVAILABLE`.
    Full,
}

/// The eviction policy: the oldest idle screen no person controls and whose bot's run does
/// not execute; ties go to the smaller bot id, so the choice is stable.
pub fn victim(candidates: &[Candidate]) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| !c.controlled && !c.executing)
        .min_by(|a, b| {
            a.last_used_ms
                .cmp(&b.last_used_ms)
                .then_with(|| a.bot_id.cmp(&b.bot_id))
        })
}

/// Whether a new screen opens, evicts one, or is refused, with `occupied` screens (held or
/// opening) under `limit` (0 = none).
pub fn admit(limit: u32, occupied: usize, candidates: &[Candidate]) -> Admission {
    if limit == 0 || occupied < limit as usize {
        return Admission::Open;
    }
    match victim(candidates) {
        Some(c) => Admission::Evict(c.bot_id.clone()),
        None => Admission::Full,
    }
}

#[derive(Default)]
struct Table {
    held: HashMap<String, Held>,
    opening: HashSet<String>,
}

/// The slot table of one computer in this process, shared by its `ScreenActor`s.
#[derive(Default)]
pub struct Slots {
    table: StdMutex<Table>,
    /// Serializes admission decisions (count, pick, reserve), never the display start.
    admission: tokio::sync::Mutex<()>,
}

impl Slots {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bot's held screen.
    pub fn held(&self, bot_id: &str) -> Option<Held> {
        self.table().held.get(bot_id).cloned()
    }

    /// Marks the bot's screen used now; returns it when held.
    pub fn touch(&self, bot_id: &str, now_ms: i64) -> Option<Held> {
        let mut table = self.table();
        let held = table.held.get_mut(bot_id)?;
        held.last_used_ms = held.last_used_ms.max(now_ms);
        Some(held.clone())
    }

    /// Screens held or opening (what counts against the limit).
    pub fn occupied(&self) -> usize {
        let table = self.table();
        table.held.len() + table.opening.len()
    }

    /// Every held screen by bot.
    pub fn all_held(&self) -> HashMap<String, Held> {
        self.table().held.clone()
    }

    /// Takes the admission lock; decide and [`Slots::reserve`] under it, then let it go
    /// before the display starts.
    pub async fn admission(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    /// Counts the bot as opening (it occupies a place until [`Slots::hold`] or
    /// [`Slots::abandon`]); an evicted bot (`gives_way`) stops counting at once.
    pub fn reserve(&self, bot_id: &str, gives_way: Option<&str>) {
        let mut table = self.table();
        if let Some(v) = gives_way {
            table.held.remove(v);
        }
        table.opening.insert(bot_id.to_owned());
    }

    /// The bot's screen opened on `slot` at `generation`.
    pub fn hold(&self, bot_id: &str, held: Held) {
        let mut table = self.table();
        table.opening.remove(bot_id);
        table.held.insert(bot_id.to_owned(), held);
    }

    /// The bot's screen did not open.
    pub fn abandon(&self, bot_id: &str) {
        self.table().opening.remove(bot_id);
    }

    /// Every screen is gone (a new machine): forgets what was held.
    pub fn clear(&self) {
        self.table().held.clear();
    }

    /// The bot's screen is gone (teardown, eviction); returns what it held.
    pub fn release(&self, bot_id: &str) -> Option<Held> {
        self.table().held.remove(bot_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(bot: &str, last: i64, controlled: bool, executing: bool) -> Candidate {
        Candidate {
            bot_id: bot.into(),
            last_used_ms: last,
            controlled,
            executing,
        }
    }

    #[test]
    fn below_the_limit_or_without_one_every_screen_opens() {
        assert_eq!(admit(0, 50, &[]), Admission::Open);
        assert_eq!(admit(3, 2, &[c("a", 1, true, true)]), Admission::Open);
    }

    #[test]
    fn the_oldest_idle_screen_gives_way() {
        let all = [
            c("a", 30, false, false),
            c("b", 10, false, false),
            c("c", 20, false, false),
        ];
        assert_eq!(admit(3, 3, &all), Admission::Evict("b".into()));
    }

    #[test]
    fn a_controlled_screen_or_an_executing_bot_never_gives_way() {
        let all = [
            c("old", 1, true, false),
            c("run", 2, false, true),
            c("new", 99, false, false),
        ];
        assert_eq!(admit(3, 3, &all), Admission::Evict("new".into()));
        let none = [
            c("old", 1, true, false),
            c("run", 2, false, true),
            c("both", 3, true, true),
        ];
        assert_eq!(admit(3, 3, &none), Admission::Full);
        assert_eq!(
            admit(1, 1, &[]),
            Admission::Full,
            "only opening screens: nothing to evict"
        );
    }

    #[test]
    fn ties_go_to_the_smaller_bot_id() {
        let all = [c("z", 5, false, false), c("m", 5, false, false)];
        assert_eq!(victim(&all).map(|c| c.bot_id.as_str()), Some("m"));
    }

    #[test]
    fn opening_screens_count_and_an_evicted_one_stops_counting_at_once() {
        let slots = Slots::default();
        slots.reserve("a", None);
        assert_eq!(slots.occupied(), 1);
        slots.hold(
            "a",
            Held {
                slot: 0,
                generation: 4,
                last_used_ms: 10,
            },
        );
        assert_eq!(slots.occupied(), 1);
        slots.reserve("b", Some("a"));
        assert_eq!(slots.occupied(), 1);
        assert_eq!(slots.held("a"), None);
        slots.abandon("b");
        assert_eq!(slots.occupied(), 0);
        slots.hold(
            "c",
            Held {
                slot: 1,
                generation: 7,
                last_used_ms: 10,
            },
        );
        assert_eq!(
            slots.touch("c", 5).map(|h| h.last_used_ms),
            Some(10),
            "time never goes back"
        );
        assert_eq!(slots.touch("c", 20).map(|h| h.last_used_ms), Some(20));
        assert_eq!(slots.release("c").map(|h| h.generation), Some(7));
        assert_eq!(slots.touch("c", 30), None);
    }
}
