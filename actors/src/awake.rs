//! What holds a computer up against its idle timer: live leases, and a fresh takeover request.
//!
//! A bot that asks for a person (`request_takeover`) leaves a page open that needs them (a
//! login, a 2FA prompt, a CAPTCHA). On providers that do not bill while running, the request
//! keeps the computer awake for [`TAKEOVER_KEEP_AWAKE`], so that page is still there when the
//! person arrives; after that the computer may suspend while the run keeps waiting. Billed
//! providers follow the normal idle timer, which the request restarts. Either way, the waiting
//! run's own execution lease does not hold the computer up.

use std::time::Duration;

use crate::entity::run;
use crate::leases::{Grant, LeaseKind};

/// How long a takeover request keeps a computer awake on providers that do not bill while
/// running.
pub const TAKEOVER_KEEP_AWAKE: Duration = Duration::from_secs(30 * 60);

/// Whether the computer must stay up now, whatever its idle timer says. `waiting` are the runs
/// on it that wait for a person; `bills` whether its provider bills while running.
pub fn held_awake(leases: &[Grant], waiting: &[run::Model], bills: bool, now_ms: i64) -> bool {
    let window = TAKEOVER_KEEP_AWAKE.as_millis() as i64;
    let fresh = |r: &run::Model| {
        r.takeover_requested_at_ms
            .is_some_and(|at| now_ms.saturating_sub(at) < window)
    };
    if !bills && waiting.iter().any(fresh) {
        return true;
    }
    leases.iter().any(|g| {
        let waiting_run =
            g.kind == LeaseKind::Execution && waiting.iter().any(|r| r.bot_id == g.subject);
        !waiting_run
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn lease(kind: LeaseKind, bot: &str) -> Grant {
        Grant {
            computer_id: "c".into(),
            kind,
            subject: bot.into(),
            holder: "h".into(),
            fence: 1,
            expires_at_ms: i64::MAX,
        }
    }

    fn waiting(bot: &str, asked_at: i64) -> run::Model {
        run::Model {
            id: format!("run-{bot}"),
            space_id: "s".into(),
            bot_id: bot.into(),
            computer_id: "c".into(),
            state: "waiting_takeover".into(),
            lease_fence: 1,
            takeover_requested_at_ms: Some(asked_at),
            created_at_ms: 0,
            updated_at_ms: asked_at,
            ended_at_ms: None,
        }
    }

    #[test]
    fn a_takeover_request_keeps_a_non_billing_computer_awake_for_thirty_minutes() {
        let now = 100 * MIN;
        let runs = [waiting("a", now - 29 * MIN)];
        assert!(held_awake(&[], &runs, false, now));
        let runs = [waiting("a", now - 30 * MIN)];
        assert!(!held_awake(&[], &runs, false, now));
    }

    #[test]
    fn billed_providers_follow_the_idle_timer() {
        let now = 100 * MIN;
        let runs = [waiting("a", now - MIN)];
        assert!(!held_awake(&[], &runs, true, now));
        // Not even the waiting run's own execution lease holds the computer up.
        let leases = [lease(LeaseKind::Execution, "a")];
        assert!(!held_awake(&leases, &runs, true, now));
    }

    #[test]
    fn after_the_window_a_waiting_run_lets_the_computer_suspend() {
        let now = 100 * MIN;
        let runs = [waiting("a", now - 45 * MIN)];
        let leases = [lease(LeaseKind::Execution, "a")];
        assert!(!held_awake(&leases, &runs, false, now));
    }

    #[test]
    fn other_leases_still_hold_it() {
        let now = 100 * MIN;
        let runs = [waiting("a", now - 45 * MIN)];
        for other in [
            lease(LeaseKind::Execution, "b"),
            lease(LeaseKind::Control, "a"),
            lease(LeaseKind::Maintenance, "*"),
        ] {
            assert!(held_awake(std::slice::from_ref(&other), &runs, false, now));
            assert!(held_awake(std::slice::from_ref(&other), &runs, true, now));
        }
        assert!(held_awake(
            &[lease(LeaseKind::Execution, "a")],
            &[],
            true,
            now
        ));
    }
}
