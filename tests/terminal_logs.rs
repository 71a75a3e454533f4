//! Captures every log line of a browser terminal session (issued, relayed, revoked) and checks
//! that no capability, socket token or terminal upstream appears in it.
//!
//! Its own test binary: it installs the process-wide tracing subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::terminal::{Ended, TerminalClient};
use common::{Backend, TestServer};
use rakazo_web_proxy::Authority;
use serde_json::json;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[actix_rt::test]
async fn logs_of_a_terminal_session_hold_no_secret() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let filter = format!("trace,{}", rakazo_web_proxy::SAFE_LOG_DIRECTIVES);
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let bot = &bots[0];
    let control = s.ok("computer.takeControl", json!({ "botId": bot })).await;
    let issued = s.ok("computer.terminalUrl", json!({ "botId": bot })).await;
    let url = issued["url"].as_str().unwrap().to_owned();
    let sealed = url.split('/').nth(2).unwrap().to_owned();
    let cap = s.app.screens.keyring().open(&sealed, 0).unwrap();
    let target = s.app.authority.terminal_target(&cap).await.unwrap();

    let mut shell = TerminalClient::connect(&s.base, &url).await.unwrap();
    shell.send("echo logged-session\r").await;
    shell
        .expect("logged-session\r\n", Duration::from_secs(10))
        .await;
    s.ok(
        "computer.releaseControl",
        json!({ "botId": bot, "fence": control["fence"] }),
    )
    .await;
    assert_eq!(
        shell.ended(Duration::from_secs(10)).await,
        Ended::Closed("revoked".into())
    );
    assert!(TerminalClient::connect(&s.base, &url).await.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    for event in [
        "screen.terminal_issued",
        "screen.proxy.websocket_upgraded",
        "screen.proxy.websocket_closed",
        "screen.proxy.target_rejected",
    ] {
        assert!(logs.contains(event), "missing {event} in:\n{logs}");
    }
    assert!(logs.contains("\"socket\":\"terminal\""), "{logs}");
    let upstream_port = target
        .upstream()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let secrets = [
        ("terminal capability", sealed.clone()),
        ("capability prefix", sealed[..24].to_owned()),
        ("socket token", target.socket_token().to_owned()),
        ("terminal upstream", format!("127.0.0.1:{upstream_port}")),
        ("operator token", s.operator_token.clone()),
    ];
    for (what, secret) in secrets {
        assert!(!logs.contains(&secret), "{what} found in logs:\n{logs}");
    }
}
