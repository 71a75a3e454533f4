//! The screen slots of one computer as this process holds them, and the eviction policy at the
//! Team screen limit: which bot holds which slot at which generation, which bots are opening a
//! screen, which slot numbers are out of use (a screen stopping, or one whose teardown failed,
//! until a retry succeeds), which number a new screen gets (the lowest free one), and which
//! screen gives way to a new one (the oldest idle screen that no person controls and whose bot
//! has no run executing). Plain data and rules; the `ScreenActor`s of the computer apply them
//! and providers only start and stop display stacks on the slots they are given.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex as StdMutex;

/// A screen a bot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Display slot (numbered by this table; the provider starts the stack there).
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

/// A slot number out of use: its screen is stopping, or its teardown failed and waits for a
/// retry (the display may still run on the machine).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stopping {
    bot_id: String,
    failed: bool,
}

#[derive(Default)]
struct Table {
    held: HashMap<String, Held>,
    /// Bots opening a screen, with the slot number once one is chosen.
    opening: HashMap<String, Option<u32>>,
    /// Slot numbers whose screen is stopping or failed to stop, by number.
    stopping: BTreeMap<u32, Stopping>,
}

impl Table {
    fn in_use(&self, slot: u32) -> bool {
        self.held.values().any(|h| h.slot == slot)
            || self.opening.values().any(|n| *n == Some(slot))
            || self.stopping.contains_key(&slot)
    }
}

/// The slot table of one computer in this process, shared by its `ScreenActor`s. It numbers
/// the slots: a new screen gets the lowest number no screen holds, opens or is stopping on
/// (a slot whose teardown failed stays out of use until a retry succeeds), and the provider
/// starts the display stack on exactly that number.
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

    /// Screens held, opening, or left on the machine by a failed teardown (what counts
    /// against the limit).
    pub fn occupied(&self) -> usize {
        let table = self.table();
        table.held.len()
            + table.opening.len()
            + table.stopping.values().filter(|s| s.failed).count()
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
    /// [`Slots::abandon`]); an evicted bot (`gives_way`) stops counting at once, and its slot
    /// number stays out of use until its teardown is done.
    pub fn reserve(&self, bot_id: &str, gives_way: Option<&str>) {
        let mut table = self.table();
        if let Some(v) = gives_way
            && let Some(held) = table.held.remove(v)
        {
            table.stopping.insert(
                held.slot,
                Stopping {
                    bot_id: v.to_owned(),
                    failed: false,
                },
            );
        }
        table.opening.insert(bot_id.to_owned(), None);
    }

    /// The slot number of the opening bot's new screen: the lowest number no screen holds,
    /// opens or is stopping on. The provider starts the display stack there.
    pub fn number(&self, bot_id: &str) -> u32 {
        let mut table = self.table();
        if let Some(Some(n)) = table.opening.get(bot_id) {
            return *n;
        }
        let n = (0u32..)
            .find(|n| !table.in_use(*n))
            .expect("fewer screens than slot numbers");
        table.opening.insert(bot_id.to_owned(), Some(n));
        n
    }

    /// The opening bot takes exactly `slot` (the provider already holds its screen there);
    /// `false` when another bot's screen holds, opens or stops on it.
    pub fn claim(&self, bot_id: &str, slot: u32) -> bool {
        let mut table = self.table();
        if table
            .stopping
            .get(&slot)
            .is_some_and(|s| s.bot_id == bot_id)
        {
            table.stopping.remove(&slot);
        }
        let others = table
            .held
            .iter()
            .any(|(b, h)| h.slot == slot && b != bot_id)
            || table
                .opening
                .iter()
                .any(|(b, n)| *n == Some(slot) && b != bot_id)
            || table.stopping.contains_key(&slot);
        if !others {
            table.opening.insert(bot_id.to_owned(), Some(slot));
        }
        !others
    }

    /// The bot's screen opened on `slot` at `generation`.
    pub fn hold(&self, bot_id: &str, held: Held) {
        let mut table = self.table();
        table.opening.remove(bot_id);
        table.held.insert(bot_id.to_owned(), held);
    }

    /// The bot's screen did not open: its slot number is free again.
    pub fn abandon(&self, bot_id: &str) {
        self.table().opening.remove(bot_id);
    }

    /// The bot's display started on its number but its screen was not recorded: the number
    /// stays out of use like a failed teardown, which the bot's next open retries.
    pub fn left_running(&self, bot_id: &str) {
        let mut table = self.table();
        if let Some(Some(n)) = table.opening.remove(bot_id) {
            table.stopping.insert(
                n,
                Stopping {
                    bot_id: bot_id.to_owned(),
                    failed: true,
                },
            );
        }
    }

    /// Every screen is gone (a new machine): forgets what was held and what was stopping.
    pub fn clear(&self) {
        let mut table = self.table();
        table.held.clear();
        table.stopping.clear();
    }

    /// The bot's screen is gone from the table (teardown, eviction) without its slot being
    /// stopped; returns what it held.
    pub fn release(&self, bot_id: &str) -> Option<Held> {
        self.table().held.remove(bot_id)
    }

    /// The bot's screen on `slot` (as its row says, or the slot it held here) starts
    /// stopping: it no longer counts as held and the number stays out of use until
    /// [`Slots::stopped`] or [`Slots::stop_failed`]. Returns the number the table had for it.
    pub fn stopping(&self, bot_id: &str, slot: Option<u32>) -> Option<u32> {
        let mut table = self.table();
        let known = table.held.remove(bot_id).map(|h| h.slot).or_else(|| {
            table
                .stopping
                .iter()
                .find(|(_, s)| s.bot_id == bot_id)
                .map(|(n, _)| *n)
        });
        if let Some(n) = slot.or(known) {
            table.stopping.insert(
                n,
                Stopping {
                    bot_id: bot_id.to_owned(),
                    failed: false,
                },
            );
        }
        known
    }

    /// The bot's display stack stopped: every number it was stopping on is free.
    pub fn stopped(&self, bot_id: &str) {
        self.table().stopping.retain(|_, s| s.bot_id != bot_id);
    }

    /// The bot's teardown failed: its numbers stay out of use until a retry succeeds.
    pub fn stop_failed(&self, bot_id: &str) {
        for s in self.table().stopping.values_mut() {
            if s.bot_id == bot_id {
                s.failed = true;
            }
        }
    }

    /// Whether the bot has a slot whose teardown failed (retry it before opening another).
    pub fn failed_teardown(&self, bot_id: &str) -> bool {
        self.table()
            .stopping
            .values()
            .any(|s| s.bot_id == bot_id && s.failed)
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

    fn held(slot: u32) -> Held {
        Held {
            slot,
            generation: 1,
            last_used_ms: 0,
        }
    }

    /// Opens `bot` the way a screen actor does: reserve, number, hold.
    fn open(slots: &Slots, bot: &str) -> u32 {
        slots.reserve(bot, None);
        let n = slots.number(bot);
        slots.hold(bot, held(n));
        n
    }

    /// Tears `bot` down the way a screen actor does, its display stopping or not.
    fn teardown(slots: &Slots, bot: &str, stops: bool) {
        slots.stopping(bot, None);
        if stops {
            slots.stopped(bot);
        } else {
            slots.stop_failed(bot);
        }
    }

    #[test]
    fn a_new_screen_gets_the_lowest_free_slot_and_a_released_slot_is_reused() {
        let slots = Slots::default();
        assert_eq!(open(&slots, "a"), 0);
        assert_eq!(open(&slots, "b"), 1);
        assert_eq!(open(&slots, "c"), 2);
        teardown(&slots, "b", true);
        assert_eq!(slots.held("b"), None);
        assert_eq!(open(&slots, "d"), 1, "the freed slot is reused");
        assert_eq!(open(&slots, "e"), 3);
        // Numbered while opening: two opening bots never share a number, and asking again
        // keeps the bot's number.
        slots.reserve("f", None);
        slots.reserve("g", None);
        assert_eq!(slots.number("f"), 4);
        assert_eq!(slots.number("g"), 5);
        assert_eq!(slots.number("f"), 4);
        slots.abandon("f");
        assert_eq!(
            open(&slots, "h"),
            4,
            "a screen that did not open frees its number"
        );
    }

    #[test]
    fn a_slot_stays_out_of_use_while_its_screen_stops_and_after_a_failed_teardown() {
        let slots = Slots::default();
        assert_eq!(open(&slots, "a"), 0);
        assert_eq!(open(&slots, "b"), 1);
        // Stopping: not held, but its number is not handed out.
        assert_eq!(slots.stopping("a", None), Some(0));
        assert_eq!(slots.held("a"), None);
        assert_eq!(open(&slots, "c"), 2);
        // Failed: still out of use, counted against the limit, retried before the bot opens.
        slots.stop_failed("a");
        assert!(slots.failed_teardown("a"));
        assert_eq!(slots.occupied(), 3);
        assert_eq!(
            open(&slots, "d"),
            3,
            "a slot whose teardown failed is skipped"
        );
        // The retry finds the number it was stopping on and frees it once the stop succeeds.
        assert_eq!(slots.stopping("a", None), Some(0));
        slots.stopped("a");
        assert!(!slots.failed_teardown("a"));
        assert_eq!(slots.occupied(), 3);
        assert_eq!(open(&slots, "a"), 0, "free again after the retry");
    }

    #[test]
    fn an_evicted_screen_keeps_its_slot_until_its_teardown_is_done() {
        let slots = Slots::default();
        assert_eq!(open(&slots, "old"), 0);
        assert_eq!(open(&slots, "busy"), 1);
        slots.reserve("new", Some("old"));
        assert_eq!(slots.occupied(), 2);
        // Another bot numbered before the eviction ends does not get the victim's slot.
        slots.reserve("other", None);
        assert_eq!(slots.number("other"), 2);
        // The victim's own teardown frees it; the new screen takes it.
        assert_eq!(slots.stopping("old", Some(0)), Some(0));
        slots.stopped("old");
        assert_eq!(slots.number("new"), 0);
    }

    #[test]
    fn a_new_machine_forgets_every_slot_and_a_running_display_keeps_its_number() {
        let slots = Slots::default();
        open(&slots, "a");
        open(&slots, "b");
        teardown(&slots, "a", false);
        slots.clear();
        assert_eq!(slots.occupied(), 0);
        assert!(!slots.failed_teardown("a"));
        assert_eq!(open(&slots, "c"), 0);
        // The display started but was not recorded: its number stays out of use, as a failed
        // teardown of that bot, until its retry.
        slots.reserve("d", None);
        assert_eq!(slots.number("d"), 1);
        slots.left_running("d");
        assert!(slots.failed_teardown("d"));
        assert_eq!(open(&slots, "e"), 2);
        assert_eq!(slots.stopping("d", None), Some(1));
        slots.stopped("d");
        assert_eq!(open(&slots, "f"), 1);
    }

    #[test]
    fn a_bot_takes_back_the_slot_its_screen_runs_on_unless_another_holds_it() {
        let slots = Slots::default();
        open(&slots, "a");
        // A new machine let every screen go while the provider reopened a's on slot 3.
        slots.clear();
        slots.reserve("a", None);
        assert!(slots.claim("a", 3));
        slots.hold("a", held(3));
        assert_eq!(open(&slots, "b"), 0);
        slots.reserve("c", None);
        assert!(!slots.claim("c", 0), "b holds slot 0");
        assert!(!slots.claim("c", 3), "a holds slot 3");
        slots.abandon("c");
        assert_eq!(slots.occupied(), 2);
    }
}
