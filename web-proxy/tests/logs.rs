//! Captures every log line of proxied sessions and checks that no secret appears in it.
//!
//! Its own test binary: it installs the process-wide tracing subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rakazo_web_proxy::capability::{Keyring, Policy};
use rakazo_web_proxy::gateway::RevokeControl;

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

const TOKEN: &str = "SuperSecretSocketToken_0123456789";

#[actix_rt::test]
async fn logs_of_a_proxied_session_hold_no_secret() {
    let buffer = Buffer::default();
    let writer = buffer.clone();
    // Everything at trace level, capped only by the crate's required directives.
    let filter = format!("trace,{}", rakazo_web_proxy::SAFE_LOG_DIRECTIVES);
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let (upstream, _seen) = start_fake_gateway(TOKEN);
    // Name the upstream by host name so that the host is a recognizable string.
    let upstream_url = format!("http://localhost:{}", upstream.port());
    let authority = TestAuthority::new(&upstream_url, TOKEN);
    authority.update(|l| l.control_fence = Some(3));
    let keyring = Arc::new(Keyring::random(4));
    let (proxy, gateway) = start_proxy(keyring.clone(), Arc::new(authority.clone()));
    let view = keyring.seal(&capability(Policy::View, 1, 0)).unwrap();
    let control = keyring.seal(&capability(Policy::Control, 1, 3)).unwrap();
    // The fixtures' own startup lines name their ports; the session starts after them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    buffer.0.lock().unwrap().clear();

    // A page load with browser cookies and headers.
    let page = reqwest::Client::new()
        .get(format!("http://{proxy}/screen/{view}/vnc.html"))
        .header("cookie", "rakazo_session=CookieSecret")
        .header("authorization", "Bearer HeaderSecret")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    // A view session that sends input, and a control session that is revoked.
    let mut ws = connect(proxy, &view).await.unwrap();
    next_binary(&mut ws).await;
    send(&mut ws, CLIENT_HANDSHAKE).await;
    send(&mut ws, &POINTER).await;
    ws.close(None).await.unwrap();
    let mut cws = connect(proxy, &control).await.unwrap();
    next_binary(&mut cws).await;
    authority.update(|l| l.control_fence = None);
    gateway
        .send(RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence: 3,
        })
        .await
        .unwrap();
    wait_close(&mut cws, Duration::from_secs(1)).await;
    // Refusals: tampered, revoked, and an upstream that fails.
    let mut tampered = view.clone();
    tampered.replace_range(20..21, if &view[20..21] == "A" { "B" } else { "A" });
    refused_status(proxy, &tampered).await;
    refused_status(proxy, &control).await;
    authority.update(|l| l.socket_token = "Wrong_SuperSecretSocketToken".into());
    refused_status(proxy, &view).await;
    authority.update(|l| l.upstream = "http://localhost:1".into());
    refused_status(proxy, &view).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    for event in [
        "screen.proxy.file_served",
        "screen.proxy.websocket_upgraded",
        "screen.proxy.websocket_closed",
        "screen.proxy.websocket_handshake_failed",
        "screen.proxy.target_rejected",
        "screen.proxy.revoked",
    ] {
        assert!(logs.contains(event), "missing {event} in:\n{logs}");
    }
    assert!(logs.contains("\"closed_by\":\"revoked\""), "{logs}");
    assert!(logs.contains("\"closed_by\":\"client\""), "{logs}");
    for line in logs.lines().filter(|l| l.contains("screen.proxy.")) {
        assert!(line.contains("screen.connection_id"), "{line}");
        assert!(line.contains("\"policy\""), "{line}");
    }
    let port = format!(":{}", upstream.port());
    let secrets: Vec<(&str, &str)> = vec![
        ("view capability", &view),
        ("control capability", &control),
        ("tampered capability", &tampered),
        ("capability prefix", &view[..24]),
        ("socket token", TOKEN),
        ("upstream host", "localhost"),
        ("upstream port", &port),
        ("cookie", "CookieSecret"),
        ("request header", "HeaderSecret"),
    ];
    for (what, secret) in secrets {
        assert!(!logs.contains(secret), "{what} found in logs:\n{logs}");
    }
}
