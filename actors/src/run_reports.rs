//! The two operator reports over `computer_runs` (Postgres, run as the database owner), as the
//! README prints them: run hours per user over the last 7 days, and runs open longer than 6
//! hours. Times are stored as Unix milliseconds; `to_timestamp` turns them into UTC instants.

/// Run hours per user over the last 7 days, counting runs still open up to now. Columns:
/// `user_id`, `email`, `hours` (numeric, one decimal). Runs of a deleted user are grouped
/// under a null `user_id`.
pub const RUN_HOURS_PER_USER_7D: &str = "\
WITH now_utc AS (SELECT now() AS at)
SELECT r.user_id, u.email,
       round((sum(extract(epoch FROM
         coalesce(to_timestamp(r.ended_at_ms / 1000.0), n.at)
           - greatest(to_timestamp(r.started_at_ms / 1000.0), n.at - interval '7 days')
       )) / 3600)::numeric, 1) AS hours
FROM computer_runs r
CROSS JOIN now_utc n
LEFT JOIN users u ON u.id = r.user_id
WHERE coalesce(to_timestamp(r.ended_at_ms / 1000.0), n.at) > n.at - interval '7 days'
GROUP BY r.user_id, u.email
ORDER BY hours DESC";

/// Runs open longer than 6 hours (computers that may be left on). Columns: `computer_id`,
/// `user_id`, `space_id`, `kind`, `started_at`, `hours_open` (numeric, one decimal).
pub const RUNS_OPEN_OVER_6H: &str = "\
SELECT r.computer_id, r.user_id, r.space_id, r.kind,
       to_timestamp(r.started_at_ms / 1000.0) AS started_at,
       round((extract(epoch FROM now() - to_timestamp(r.started_at_ms / 1000.0)) / 3600)::numeric, 1)
         AS hours_open
FROM computer_runs r
WHERE r.ended_at_ms IS NULL
  AND to_timestamp(r.started_at_ms / 1000.0) < now() - interval '6 hours'
ORDER BY r.started_at_ms";
