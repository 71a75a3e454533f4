//! The browser terminal end to end on the `fake` provider: `computer.terminalUrl` for the
//! person holding control, the emulated shell reached through the sealed capability and the
//! screen proxy in the terminal frame protocol, and its end with the control lease. Also the
//! screen authority over internal RPC (`POST /internal/screen-authority`), as a proxy in
//! another process asks it.

mod common;

use std::time::{Duration, Instant};

use common::terminal::{Ended, TerminalClient};
use common::{Backend, TestServer};
use rakazo_web_proxy::{Authority, AuthorityError, HttpAuthority, RejectCause};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

#[actix_rt::test]
async fn a_controller_gets_shells_that_end_with_control() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];

    let refused = s
        .call("computer.terminalUrl", json!({ "botId": bot }))
        .await
        .unwrap_err();
    assert_eq!((refused.0, refused.1.as_str()), (409, "CONTROL_REQUIRED"));

    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let fence = control["fence"].as_i64().unwrap();
    let issued = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
    let url = issued["url"].as_str().unwrap().to_owned();
    assert!(
        url.starts_with("/screen/") && url.ends_with("/terminal"),
        "{url}"
    );
    assert!(!url.contains("127.0.0.1"));
    assert_eq!(issued["protocol"], "rakazo.terminal.v1");

    // A shell: what it types runs on the computer, and files it makes are the bot's.
    let mut first = TerminalClient::connect(&s.base, &url).await.unwrap();
    first.resize(100, 30).await;
    first.send("echo made-in-terminal > note.txt\r").await;
    first.send("cat note.txt\r").await;
    first.expect("made-in-terminal\r\n", WAIT).await;

    // A second session under the same lease (another tab) gets its own shell; the first keeps
    // running.
    let again = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
    let mut second = TerminalClient::connect(&s.base, again["url"].as_str().unwrap())
        .await
        .unwrap();
    second.send("exit 3\r").await;
    assert_eq!(second.ended(WAIT).await, Ended::Exit(3));
    first.send("ls\r").await;
    first.expect("note.txt", WAIT).await;

    // Release: the live shell is closed as revoked within a second, and the URL is refused.
    let released = Instant::now();
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": fence }),
    )
    .await;
    assert_eq!(first.ended(WAIT).await, Ended::Closed("revoked".into()));
    assert!(released.elapsed() < Duration::from_secs(1));
    let err = TerminalClient::connect(&s.base, &url).await.err().unwrap();
    assert!(err.to_string().contains("403"), "{err}");
}

#[actix_rt::test]
async fn a_view_capability_never_reaches_a_terminal() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    s.ok("computer.takeControl", json!({ "botId": bots[0] }))
        .await;
    let terminal = s
        .ok("computer.terminalUrl", json!({ "botId": bots[0] }))
        .await;
    // The terminal path under a view capability of the same screen is no session path.
    let cap = terminal["url"].as_str().unwrap().split('/').nth(2).unwrap();
    let mut opened = s.app.screens.keyring().open(cap, 0).unwrap();
    opened.policy = rakazo_web_proxy::Policy::View;
    opened.fence = 0;
    let view = s.app.screens.keyring().seal(&opened).unwrap();
    let err = TerminalClient::connect(&s.base, &format!("/screen/{view}/terminal"))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("404"), "{err}");
    // And a plain GET of the terminal path is not proxied anywhere.
    let page = s
        .http
        .get(format!("{}{}", s.base, terminal["url"].as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 404);
}

#[actix_rt::test]
async fn the_screen_authority_answers_over_internal_rpc() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let issued = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
    let sealed = issued["url"].as_str().unwrap().split('/').nth(2).unwrap();
    let cap = s.app.screens.keyring().open(sealed, 0).unwrap();

    let over_http = HttpAuthority::new(&s.base, &s.app.internal_token.0, WAIT).unwrap();
    let target = over_http.terminal_target(&cap).await.unwrap();
    let local = s.app.authority.terminal_target(&cap).await.unwrap();
    assert_eq!(target, local);
    // The fake serves no screen route, only the terminal.
    assert!(matches!(
        over_http.target(&cap).await,
        Err(AuthorityError::Rejected(RejectCause::Revoked))
    ));

    // Only the internal credential may ask, never an API token (not even the operator's):
    // the answer holds the upstream and the socket token.
    let user = s.ok("user.create", json!({ "name": "someone" })).await;
    for bearer in [
        user["token"].as_str().unwrap(),
        s.operator_token.as_str(),
        "not-a-token",
    ] {
        let stranger = HttpAuthority::new(&s.base, bearer, WAIT).unwrap();
        assert_eq!(
            stranger.terminal_target(&cap).await,
            Err(AuthorityError::Rejected(RejectCause::ApiError))
        );
    }

    // A stale fence is refused with the lease's end as the cause.
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    assert_eq!(
        over_http.terminal_target(&cap).await,
        Err(AuthorityError::Rejected(RejectCause::LeaseEnded))
    );
}

#[actix_rt::test]
async fn renewing_control_keeps_it_and_its_shell_and_only_its_holder_may() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (space, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let fence = control["fence"].as_i64().unwrap();
    let issued = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
    let mut shell = TerminalClient::connect(&s.base, issued["url"].as_str().unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let renewed = s
        .ok(
            "computer.renewControl",
            json!({ "botId": bot, "fence": fence }),
        )
        .await;
    assert_eq!(renewed["fence"], fence);
    assert!(renewed["expiresAtMs"].as_i64() > control["expiresAtMs"].as_i64());
    shell.send("echo still-here\r").await;
    shell.expect("still-here\r\n", WAIT).await;

    let stale = s
        .call(
            "computer.renewControl",
            json!({ "botId": bot, "fence": fence + 1 }),
        )
        .await
        .unwrap_err();
    assert_eq!(stale.1, "LEASE_FENCED");
    let someone = s.member_token(&space).await;
    let theirs = s
        .call_as(
            &someone,
            "computer.renewControl",
            json!({ "botId": bot, "fence": fence }),
        )
        .await
        .unwrap_err();
    assert_eq!((theirs.0, theirs.1.as_str()), (409, "CONTROL_HELD"));
}

/// A grant that ended where this process saw no message (another process's change, a lost
/// notification) closes its sockets at the sweep after the next gap; the socket of a grant
/// still live stays open.
#[actix_rt::test]
async fn a_grant_ended_unseen_is_swept_after_a_gap() {
    use rakazo_actors::leases::{LeaseKey, Leases};
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(2, "team").await;
    let mut shells = Vec::new();
    let mut grants = Vec::new();
    for bot in &bots {
        let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
        grants.push(control["fence"].as_i64().unwrap());
        let issued = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
        let mut shell = TerminalClient::connect(&s.base, issued["url"].as_str().unwrap())
            .await
            .unwrap();
        shell.send("echo up\r").await;
        shell.expect("up\r\n", WAIT).await;
        shells.push(shell);
    }
    let computer = s.ok("computer.forBot", json!({ "botId": bots[0] })).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Released in the table only: no revocation is sent.
    Leases::new(s.app.db.clone())
        .release(&LeaseKey::control(&computer, &bots[0]), grants[0])
        .await
        .unwrap();
    s.app.runtime().events.gap();
    assert_eq!(shells[0].ended(WAIT).await, Ended::Closed("revoked".into()));
    shells[1].send("echo still-here\r").await;
    shells[1].expect("still-here\r\n", WAIT).await;
}

/// A route this process holds, reached through another process's proxy (so no socket of it
/// is here), is closed by the sweep once its grant ended unseen; one whose grant is live stays.
#[actix_rt::test]
async fn the_sweep_closes_a_route_whose_grant_ended_unseen_without_a_socket_here() {
    use rakazo::screens::{RouteBook, RouteEntry, RouteKey, Watch, sweep};
    use rakazo_actors::entity::screen;
    use rakazo_actors::leases::{LeaseKey, Leases};
    use rakazo_actors::provider::{ProviderRef, ScreenPolicy, ScreenRoute};
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "private").await;
    let bot = &bots[0];
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let fence = control["fence"].as_i64().unwrap();
    let row = screen::Entity::find()
        .filter(screen::Column::BotId.eq(bot.as_str()))
        .one(&s.app.db)
        .await
        .unwrap()
        .unwrap();
    let key = RouteKey {
        computer_id: row.computer_id.clone(),
        bot_id: bot.clone(),
        slot: row.slot.unwrap() as u32,
        generation: row.generation,
        policy: ScreenPolicy::Control,
        fence,
        channel: rakazo_web_proxy::Channel::Screen,
    };
    let routes = std::sync::Arc::new(RouteBook::default());
    routes.insert(
        key.clone(),
        RouteEntry {
            route: ScreenRoute {
                upstream: "http://127.0.0.1:9".into(),
                token: "elsewhere".into(),
            },
            machine: ProviderRef("gone".into()),
        },
    );
    let watch = Watch {
        db: s.app.db.clone(),
        gateway: rakazo_web_proxy::GatewayActor::start_default(),
        routes: routes.clone(),
        provider: s.app.runtime().provider.clone(),
    };
    assert_eq!(sweep(&watch).await, 0);
    assert!(routes.contains_key(&key), "a live grant's route stays");
    // Released in the table only: no revocation is sent.
    Leases::new(s.app.db.clone())
        .release(&LeaseKey::control(&row.computer_id, bot), fence)
        .await
        .unwrap();
    assert_eq!(sweep(&watch).await, 1);
    let deadline = Instant::now() + WAIT;
    while routes.contains_key(&key) {
        assert!(Instant::now() < deadline, "the ended grant's route stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
