//! A test hook: `RAKAZO_CRASH_AT=<point>` makes the process abort at that named point, so tests
//! prove what a crash there leaves behind (`home.file_written`, `home.before_swap`,
//! `home.mid_swap`, `home.staged`, `home.mid_replace`, `checkpoint.stored`, `restore.saved`,
//! `restore.recorded`, `restore.applied`, `maintenance.torn_down`: a maintenance operation's
//! worker dies after tearing the old machine down, `delete.stored_gone`: a deleted computer's
//! stored workspace is gone, its row not yet). Never set in a deployment; unset, a point costs
//! one environment lookup.

pub use rakazo_actors::crash_point::{CRASH_AT_ENV, crash_point};
