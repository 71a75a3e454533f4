//! What a call under a run's execution lease checks before it acts, read in one statement:
//! the run, its bot, its space (and whether a user is a member), its computer, and the latest
//! grant of the run's execution lease. Judging is the caller's: this only reads.
//!
//! One statement rather than one per row: every statement is a round trip to a connection's
//! worker thread, and a tool call pays them before its command starts.

use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query, SelectStatement};
use sea_orm::{ColumnTrait, ConnectionTrait, FromQueryResult, IdenStatic, Iterable, JoinType};

use crate::entity::{bot, computer, lease, run, space, space_member};
use crate::error::DomainResult;
use crate::leases::LeaseKind;

/// A run's bot as the checks need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunBot {
    /// The space the bot belongs to.
    pub space_id: String,
    /// `team` or `private`.
    pub computer_mode: String,
}

/// Everything read for one run (see the module docs).
#[derive(Clone, Debug)]
pub struct RunChecks {
    /// The run.
    pub run: run::Model,
    /// Its bot, unless it is gone.
    pub bot: Option<RunBot>,
    /// Whether the run's space exists.
    pub space_found: bool,
    /// Whether the user asked about is a member of the run's space (false when none was).
    pub member: bool,
    /// Its computer, unless it is gone.
    pub computer: Option<computer::Model>,
    /// The latest grant of the run's execution lease (its bot on its computer), if any.
    pub lease: Option<lease::Model>,
}

const RUN: &str = "r";
const COMPUTER: &str = "c";
const LEASE: &str = "l";
const LATER: &str = "m";

/// Every column `C` of an entity, from `table`, named `{table}_{column}`.
fn columns<C: IdenStatic + Iterable>(q: &mut SelectStatement, table: &str) {
    for col in C::iter() {
        q.expr_as(
            Expr::col((Alias::new(table), col)),
            Alias::new(format!("{table}_{}", col.as_str())),
        );
    }
}

/// The statement behind [`read`].
pub fn statement(run_id: &str, member_of: Option<&str>) -> SelectStatement {
    let r = || Alias::new(RUN);
    let mut q = Query::select();
    columns::<run::Column>(&mut q, RUN);
    columns::<computer::Column>(&mut q, COMPUTER);
    columns::<lease::Column>(&mut q, LEASE);
    q.expr_as(
        Expr::col((bot::Entity, bot::Column::SpaceId)),
        Alias::new("b_space_id"),
    )
    .expr_as(
        Expr::col((bot::Entity, bot::Column::ComputerMode)),
        Alias::new("b_computer_mode"),
    )
    .expr_as(
        Expr::col((space::Entity, space::Column::Id)),
        Alias::new("s_id"),
    );
    let member = match member_of {
        Some(user) => Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(space_member::Entity)
                .and_where(
                    Expr::col((space_member::Entity, space_member::Column::SpaceId))
                        .equals((r(), run::Column::SpaceId)),
                )
                .and_where(space_member::Column::UserId.eq(user))
                .to_owned(),
        ),
        None => Expr::val(false),
    };
    q.expr_as(member, Alias::new("member"));
    // The run's execution lease: its latest grant, found through the fence index.
    let same_key = |t: &str| {
        let t = || Alias::new(t);
        Expr::col((t(), lease::Column::ComputerId))
            .equals((r(), run::Column::ComputerId))
            .and(Expr::col((t(), lease::Column::Kind)).eq(LeaseKind::Execution.as_str()))
            .and(Expr::col((t(), lease::Column::Subject)).equals((r(), run::Column::BotId)))
    };
    let latest_fence = Query::select()
        .expr(Expr::col((Alias::new(LATER), lease::Column::Fence)).max())
        .from_as(lease::Entity, Alias::new(LATER))
        .and_where(same_key(LATER))
        .to_owned();
    q.from_as(run::Entity, r())
        .join_as(
            JoinType::LeftJoin,
            computer::Entity,
            Alias::new(COMPUTER),
            Expr::col((Alias::new(COMPUTER), computer::Column::Id))
                .equals((r(), run::Column::ComputerId)),
        )
        .join(
            JoinType::LeftJoin,
            bot::Entity,
            Expr::col((bot::Entity, bot::Column::Id)).equals((r(), run::Column::BotId)),
        )
        .join(
            JoinType::LeftJoin,
            space::Entity,
            Expr::col((space::Entity, space::Column::Id)).equals((r(), run::Column::SpaceId)),
        )
        .join_as(
            JoinType::LeftJoin,
            lease::Entity,
            Alias::new(LEASE),
            same_key(LEASE).and(
                Expr::col((Alias::new(LEASE), lease::Column::Fence)).in_subquery(latest_fence),
            ),
        )
        .and_where(Expr::col((r(), run::Column::Id)).eq(run_id));
    q
}

/// Read everything a call under `run_id`'s lease checks; `member_of`: the user whose
/// membership of the run's space is asked about. `None` when there is no such run.
pub async fn read<C: ConnectionTrait>(
    db: &C,
    run_id: &str,
    member_of: Option<&str>,
) -> DomainResult<Option<RunChecks>> {
    let Some(row) = db.query_one(&statement(run_id, member_of)).await? else {
        return Ok(None);
    };
    let present = |table: &str| -> DomainResult<bool> {
        Ok(row
            .try_get::<Option<String>>(&format!("{table}_"), "id")?
            .is_some())
    };
    let computer = if present(COMPUTER)? {
        Some(computer::Model::from_query_result(
            &row,
            &format!("{COMPUTER}_"),
        )?)
    } else {
        None
    };
    let lease = if present(LEASE)? {
        Some(lease::Model::from_query_result(&row, &format!("{LEASE}_"))?)
    } else {
        None
    };
    let bot = match (
        row.try_get::<Option<String>>("b_", "space_id")?,
        row.try_get::<Option<String>>("b_", "computer_mode")?,
    ) {
        (Some(space_id), Some(computer_mode)) => Some(RunBot {
            space_id,
            computer_mode,
        }),
        _ => None,
    };
    Ok(Some(RunChecks {
        run: run::Model::from_query_result(&row, &format!("{RUN}_"))?,
        bot,
        space_found: row.try_get::<Option<String>>("s_", "id")?.is_some(),
        member: row.try_get::<bool>("", "member")?,
        computer,
        lease,
    }))
}
