//! The proxy end to end against a fake screen gateway on real sockets.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use rakazo_web_proxy::authority::{AuthorityError, RejectCause};
use rakazo_web_proxy::capability::{Keyring, Policy, now_ms};
use rakazo_web_proxy::gateway::{CountSockets, RevokeControl, RevokeSlot};
use rakazo_web_proxy::page::{CSP, REPORTER_JS, SCREEN_FAILURE_MESSAGE, STYLE_CSS};

const TOKEN: &str = "sock3tT0ken_for-tests";

struct Fixture {
    proxy: std::net::SocketAddr,
    gateway: actix::Addr<rakazo_web_proxy::GatewayActor>,
    keyring: Arc<Keyring>,
    authority: TestAuthority,
    seen: Arc<std::sync::Mutex<Seen>>,
}

fn fixture() -> Fixture {
    fixture_on(TOKEN)
}

/// A fixture whose upstream socket token is `token`.
fn fixture_on(token: &str) -> Fixture {
    let (upstream, seen) = start_fake_gateway(token);
    let authority = TestAuthority::new(&format!("http://{upstream}"), token);
    let keyring = Arc::new(Keyring::random(1));
    let (proxy, gateway) = start_proxy(keyring.clone(), Arc::new(authority.clone()));
    Fixture {
        proxy,
        gateway,
        keyring,
        authority,
        seen,
    }
}

impl Fixture {
    fn seal(&self, policy: Policy, generation: u64, fence: u64) -> String {
        self.keyring
            .seal(&capability(policy, generation, fence))
            .unwrap()
    }

    fn url(&self, token: &str, tail: &str) -> String {
        format!("http://{}/screen/{token}/{tail}", self.proxy)
    }

    /// Waits until the fake gateway has received at least `n` bytes.
    async fn upstream_bytes(&self, n: usize) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let bytes = self.seen.lock().unwrap().bytes.clone();
            if bytes.len() >= n || Instant::now() > deadline {
                return bytes;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The screen headers every response under `/screen/` carries.
fn assert_screen_headers(h: &reqwest::header::HeaderMap) {
    assert_eq!(h["content-security-policy"], CSP.as_str());
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox allow-scripts;")
    );
    assert!(
        h["cache-control"]
            .to_str()
            .unwrap()
            .contains("no-transform")
    );
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert!(h.get("set-cookie").is_none(), "upstream cookie leaked");
}

#[actix_rt::test]
async fn the_packaged_viewer_is_served_never_the_computers_pages() {
    let f = fixture();
    let token = f.seal(Policy::View, 1, 0);
    let http = reqwest::Client::new();
    for tail in ["vnc.html", ""] {
        let resp = http
            .get(f.url(&token, tail))
            .header("cookie", "session=browser-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_screen_headers(resp.headers());
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let body = resp.text().await.unwrap();
        assert!(body.contains("packaged-body"), "{body}");
        assert!(!body.contains("bot-page"), "{body}");
        let script = body
            .find("<script src=\"rakazo-reporter.js\"></script>")
            .expect("reporter named");
        assert!(script < body.find("type=\"module\"").unwrap());
    }
    // The reporter and noVNC's modules, readable from the sandbox's opaque origin.
    for (tail, want, kind) in [
        ("rakazo-reporter.js", REPORTER_JS, "text/javascript"),
        ("rakazo-screen.css", STYLE_CSS, "text/css"),
        ("app/ui.js", "export default 1;", "text/javascript"),
        ("core/rfb.js", "export default 2;", "text/javascript"),
    ] {
        let resp = http.get(f.url(&token, tail)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{tail}");
        assert_screen_headers(resp.headers());
        assert_eq!(resp.headers()["access-control-allow-origin"], "*");
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
        assert_eq!(resp.text().await.unwrap(), want);
    }
    // Nothing else: not the computer's other pages, not the package's other files.
    for tail in [
        "anything-else.html",
        "nope.js",
        "vnc_lite.html",
        "utils/launch.sh",
        "app/",
        "websockify",
        "terminal",
    ] {
        let (status, reason, detail, _) = refusal(&f, &token, tail).await;
        assert_eq!((status, reason.as_str()), (404, "invalid_path"), "{tail}");
        assert!(
            matches!(detail.as_str(), "unknown_file" | "bad_path"),
            "{tail}: {detail}"
        );
        let resp = http.get(f.url(&token, tail)).send().await.unwrap();
        assert_screen_headers(resp.headers());
        assert!(!resp.text().await.unwrap().contains("bot-page"));
    }
    // The computer's gateway was never asked for a page or a file.
    let asked = f.seen.lock().unwrap().http_paths.clone();
    assert!(asked.is_empty(), "{asked:?}");
    // The bare capability path redirects into the directory.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let resp = no_redirect
        .get(format!("http://{}/screen/{token}", f.proxy))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 308);
    assert_screen_headers(resp.headers());
    assert_eq!(resp.headers()["location"], format!("./{token}/").as_str());
    // A link that names another place is no way off this origin.
    for elsewhere in [
        "http:evil.example",
        "https:%2F%2Fevil.example",
        "%5Cevil.example",
    ] {
        let resp = no_redirect
            .get(format!("http://{}/screen/{elsewhere}", f.proxy))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 404, "{elsewhere}");
        assert!(resp.headers().get("location").is_none(), "{elsewhere}");
    }
}

#[actix_rt::test]
async fn without_novnc_pages_are_refused_with_a_stable_reason() {
    let (upstream, _seen) = start_fake_gateway(TOKEN);
    let authority = TestAuthority::new(&format!("http://{upstream}"), TOKEN);
    let keyring = Arc::new(Keyring::random(1));
    let empty = tempfile::tempdir().unwrap();
    let (proxy, _gateway) = start_proxy_serving(
        keyring.clone(),
        Arc::new(authority),
        &empty.path().join("novnc"),
    );
    let token = keyring.seal(&capability(Policy::View, 1, 0)).unwrap();
    let resp = reqwest::Client::new()
        .get(format!("http://{proxy}/screen/{token}/vnc.html"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_screen_headers(resp.headers());
    assert_eq!(resp.headers()["x-rakazo-screen-reason"], "viewer_missing");
    assert_eq!(resp.headers()["x-rakazo-screen-detail"], "novnc_missing");
    // The relay itself does not need the viewer.
    let mut ws = connect(proxy, &token).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
}

async fn refusal(f: &Fixture, token: &str, tail: &str) -> (u16, String, String, String) {
    let resp = reqwest::Client::new()
        .get(f.url(token, tail))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    assert_screen_headers(resp.headers());
    let reason = resp.headers()["x-rakazo-screen-reason"]
        .to_str()
        .unwrap()
        .to_string();
    let detail = resp.headers()["x-rakazo-screen-detail"]
        .to_str()
        .unwrap()
        .to_string();
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["reason"], reason.as_str());
    assert_eq!(body["error"]["message"], SCREEN_FAILURE_MESSAGE);
    (status, reason, detail, body.to_string())
}

/// A malformed websocket upgrade (no `Connection: upgrade`, no key) is refused as
/// `invalid_path` before the API is asked: with a capability the authority would reject,
/// the answer is still the path's refusal.
#[actix_rt::test]
async fn a_malformed_upgrade_is_refused_before_the_authority_is_asked() {
    let f = fixture();
    let stale = f.seal(Policy::View, 0, 0);
    let resp = reqwest::Client::new()
        .get(f.url(&stale, "websockify"))
        .header("upgrade", "websocket")
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-rakazo-screen-reason"], "invalid_path");
    assert_eq!(resp.headers()["x-rakazo-screen-detail"], "bad_upgrade");
    // The same capability on a whole handshake reaches the authority, which refuses it.
    assert!(connect(f.proxy, &stale).await.is_err());
}

#[actix_rt::test]
async fn refusals_carry_the_right_reason() {
    let f = fixture();
    let good = f.seal(Policy::View, 1, 0);

    // Tampered: one byte of the ciphertext flipped.
    let mut raw = URL_SAFE_NO_PAD.decode(&good).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 1;
    let tampered = URL_SAFE_NO_PAD.encode(raw);
    let (status, reason, detail, _) = refusal(&f, &tampered, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (404, "invalid_path", "tampered")
    );

    // Expired.
    let mut cap = capability(Policy::View, 1, 0);
    cap.expires_at_ms = now_ms() - 1;
    let expired = f.keyring.seal(&cap).unwrap();
    let (status, reason, detail, _) = refusal(&f, &expired, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (403, "authority_rejected", "expired")
    );

    // Wrong key: another deployment's keyring.
    let foreign = Keyring::random(77)
        .seal(&capability(Policy::View, 1, 0))
        .unwrap();
    let (status, reason, detail, _) = refusal(&f, &foreign, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (404, "invalid_path", "unknown_key")
    );
    // Same key id, different key.
    let impostor = Keyring::random(1)
        .seal(&capability(Policy::View, 1, 0))
        .unwrap();
    let (_, reason, detail, _) = refusal(&f, &impostor, "vnc.html").await;
    assert_eq!(
        (reason.as_str(), detail.as_str()),
        ("invalid_path", "tampered")
    );

    // Wrong generation: the authority knows the slot moved on.
    let stale = f.seal(Policy::View, 0, 0);
    let (status, reason, detail, _) = refusal(&f, &stale, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (403, "authority_rejected", "stale_generation")
    );

    // Not a session path at all.
    let (status, reason, detail, _) = refusal(&f, "not-a-capability", "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (404, "invalid_path", "malformed")
    );
    // (Clients normalize `..` away; what reaches us is checked segment by segment.)
    for tail in ["a%20b", "a//b", "app/%2Fetc"] {
        let (_, reason, detail, _) = refusal(&f, &good, tail).await;
        assert_eq!(
            (reason.as_str(), detail.as_str()),
            ("invalid_path", "bad_path"),
            "{tail}"
        );
    }

    // Authority failures.
    f.authority
        .update(|l| l.fail = Some(AuthorityError::Unavailable("timeout")));
    let (status, reason, ..) = refusal(&f, &good, "vnc.html").await;
    assert_eq!((status, reason.as_str()), (503, "authority_unavailable"));
    f.authority
        .update(|l| l.fail = Some(AuthorityError::InvalidResponse("malformed_body")));
    let (status, reason, ..) = refusal(&f, &good, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str()),
        (502, "invalid_authority_response")
    );
    f.authority
        .update(|l| l.fail = Some(AuthorityError::Rejected(RejectCause::ApiError)));
    let (status, reason, detail, _) = refusal(&f, &good, "vnc.html").await;
    assert_eq!(
        (status, reason.as_str(), detail.as_str()),
        (403, "authority_rejected", "api_error")
    );
    f.authority.update(|l| l.fail = None);

    // A browser (no JSON) gets the fixed human page.
    let page = reqwest::get(f.url(&tampered, "vnc.html")).await.unwrap();
    assert_eq!(page.status(), 404);
    assert!(page.text().await.unwrap().contains(SCREEN_FAILURE_MESSAGE));

    // Websocket upgrades are refused before any upgrade, with the same statuses.
    assert_eq!(refused_status(f.proxy, &tampered).await, 404);
    assert_eq!(refused_status(f.proxy, &stale).await, 403);
    assert_eq!(refused_status(f.proxy, &expired).await, 403);
    // The gateway was never asked for a socket with a bad token.
    assert!(f.seen.lock().unwrap().tokens.is_empty());
}

#[actix_rt::test]
async fn upstream_failures_are_reported() {
    let f = fixture();
    let good = f.seal(Policy::View, 1, 0);
    // The gateway refuses the socket token.
    f.authority.update(|l| l.socket_token = "wrong".into());
    assert_eq!(refused_status(f.proxy, &good).await, 502);
    // Nothing listens upstream.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    f.authority.update(|l| l.upstream = dead);
    assert_eq!(refused_status(f.proxy, &good).await, 502);
    // The page is ours: it loads, and its websocket is what fails (the reporter says so).
    let page = reqwest::get(f.url(&good, "vnc.html")).await.unwrap();
    assert_eq!(page.status(), 200);
}

#[actix_rt::test]
async fn view_never_forwards_input() {
    let f = fixture();
    let mut ws = connect(f.proxy, &f.seal(Policy::View, 1, 0)).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    send(&mut ws, CLIENT_HANDSHAKE).await;
    // Input split across frames and mixed with allowed messages in one frame.
    send(&mut ws, &POINTER[..3]).await;
    let mut mixed = POINTER[3..].to_vec();
    mixed.extend(KEY);
    mixed.extend(FB_REQUEST);
    send(&mut ws, &mixed).await;
    send(&mut ws, &[6, 0, 0, 0, 0, 0, 0, 3, b'a', b'b', b'c']).await;
    send(&mut ws, &FB_REQUEST).await;
    let mut expected = CLIENT_HANDSHAKE.to_vec();
    expected.extend(FB_REQUEST);
    expected.extend(FB_REQUEST);
    let got = f.upstream_bytes(expected.len()).await;
    assert_eq!(got, expected);
    // Text frames never pass for view.
    ws.send(tokio_tungstenite::tungstenite::Message::Text(
        "\u{5}".into(),
    ))
    .await
    .unwrap();
    // Something the filter cannot parse closes the connection.
    send(&mut ws, &[0x7f]).await;
    let reason = closed_and_nothing_after(&mut ws).await;
    assert_eq!(reason.as_deref(), Some("view only"));
    assert_eq!(f.seen.lock().unwrap().bytes, expected);
}

use futures_util::SinkExt as _;

#[actix_rt::test]
async fn control_forwards_input() {
    let f = fixture();
    f.authority.update(|l| l.control_fence = Some(5));
    let mut ws = connect(f.proxy, &f.seal(Policy::Control, 1, 5))
        .await
        .unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    send(&mut ws, CLIENT_HANDSHAKE).await;
    send(&mut ws, &POINTER).await;
    send(&mut ws, &KEY).await;
    let mut expected = CLIENT_HANDSHAKE.to_vec();
    expected.extend(POINTER);
    expected.extend(KEY);
    assert_eq!(f.upstream_bytes(expected.len()).await, expected);
    // Upstream to client passes through.
    assert_eq!(next_binary(&mut ws).await, b"ack");
}

#[actix_rt::test]
async fn release_closes_control_within_a_second_and_refuses_the_old_url() {
    let f = fixture();
    f.authority.update(|l| l.control_fence = Some(5));
    let control = f.seal(Policy::Control, 1, 5);
    let view = f.seal(Policy::View, 1, 0);
    let mut control_ws = connect(f.proxy, &control).await.unwrap();
    let mut view_ws = connect(f.proxy, &view).await.unwrap();
    next_binary(&mut control_ws).await;
    next_binary(&mut view_ws).await;
    assert_eq!(f.gateway.send(CountSockets).await.unwrap(), 2);

    // Release: the API ends the lease, then tells the gateway and awaits it.
    let started = Instant::now();
    f.authority.update(|l| l.control_fence = None);
    let revoked = f
        .gateway
        .send(RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence: 5,
        })
        .await
        .unwrap();
    assert_eq!(revoked.closed, 1);
    let reason = wait_close(&mut control_ws, Duration::from_secs(1)).await;
    assert_eq!(reason.as_deref(), Some("revoked"));
    assert!(started.elapsed() < Duration::from_secs(1));
    // The view socket is untouched.
    send(&mut view_ws, CLIENT_HANDSHAKE).await;
    assert_eq!(next_binary(&mut view_ws).await, b"ack");
    // The old control URL is refused, for the page and the socket.
    assert_eq!(refused_status(f.proxy, &control).await, 403);
    let (_, reason, detail, _) = refusal(&f, &control, "vnc.html").await;
    assert_eq!(
        (reason.as_str(), detail.as_str()),
        ("authority_rejected", "lease_ended")
    );
}

#[actix_rt::test]
async fn slot_reuse_closes_everything_and_refuses_old_urls() {
    let f = fixture();
    f.authority.update(|l| l.control_fence = Some(9));
    let control = f.seal(Policy::Control, 1, 9);
    let view = f.seal(Policy::View, 1, 0);
    let mut sockets = vec![
        connect(f.proxy, &control).await.unwrap(),
        connect(f.proxy, &view).await.unwrap(),
    ];
    for ws in &mut sockets {
        next_binary(ws).await;
    }
    // Teardown: revoke first (awaiting the closes), then reuse the slot with a new generation.
    let revoked = f
        .gateway
        .send(RevokeSlot {
            computer_id: COMPUTER.into(),
            slot: SLOT,
            generation: 1,
        })
        .await
        .unwrap();
    assert_eq!(revoked.closed, 2);
    f.authority.update(|l| {
        l.generation = 2;
        l.control_fence = Some(10);
    });
    for ws in &mut sockets {
        let reason = wait_close(ws, Duration::from_secs(1)).await;
        assert_eq!(reason.as_deref(), Some("revoked"));
    }
    assert_eq!(f.gateway.send(CountSockets).await.unwrap(), 0);
    for old in [&control, &view] {
        assert_eq!(refused_status(f.proxy, old).await, 403);
        let (_, reason, detail, _) = refusal(&f, old, "vnc.html").await;
        assert_eq!(
            (reason.as_str(), detail.as_str()),
            ("authority_rejected", "stale_generation")
        );
    }
    // New capabilities of the new generation work.
    let mut fresh = connect(f.proxy, &f.seal(Policy::View, 2, 0)).await.unwrap();
    assert_eq!(next_binary(&mut fresh).await, b"RFB 003.008\n");
}

#[actix_rt::test]
async fn a_stale_authority_answer_is_still_refused_by_the_gateway() {
    // The authority has not caught up yet, but the gateway already retired generation 1.
    let f = fixture();
    f.gateway
        .send(RevokeSlot {
            computer_id: COMPUTER.into(),
            slot: SLOT,
            generation: 1,
        })
        .await
        .unwrap();
    assert_eq!(
        refused_status(f.proxy, &f.seal(Policy::View, 1, 0)).await,
        403
    );
}

#[actix_rt::test]
async fn client_and_upstream_closes_unregister() {
    let f = fixture();
    let mut ws = connect(f.proxy, &f.seal(Policy::View, 1, 0)).await.unwrap();
    next_binary(&mut ws).await;
    ws.close(None).await.unwrap();
    // The relay answers the browser's close and ends the connection.
    assert_eq!(closed_and_nothing_after(&mut ws).await, None);
    let deadline = Instant::now() + Duration::from_secs(2);
    while f.gateway.send(CountSockets).await.unwrap() != 0 {
        assert!(Instant::now() < deadline, "socket still registered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads a revoked socket to its end: frames may come before the close frame, none after it,
/// and the connection itself ends after it: the server closes the TCP connection (a raw read
/// returns end of file, not a reset). Returns the close reason.
async fn closed_and_nothing_after(ws: &mut Client) -> Option<String> {
    use futures_util::StreamExt as _;
    use tokio::io::AsyncReadExt as _;
    use tokio_tungstenite::MaybeTlsStream;
    use tokio_tungstenite::tungstenite::{Error, Message};
    let reason = loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("the revoked socket was not closed")
        {
            Some(Ok(Message::Close(f))) => break f.map(|f| f.reason.to_string()),
            Some(Ok(_)) => {}
            other => panic!("the socket ended without a close frame: {other:?}"),
        }
    };
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("the connection stayed open after the close frame")
        {
            None | Some(Err(Error::ConnectionClosed)) => break,
            Some(Ok(Message::Close(_))) => {}
            other => panic!("something arrived after the close frame: {other:?}"),
        }
    }
    let MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
        panic!("a plain connection");
    };
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut [0u8; 1]))
        .await
        .expect("the connection stayed open after the close frame");
    assert_eq!(
        read.expect("the connection was reset, not closed"),
        0,
        "the connection ends with end of file"
    );
    reason
}

/// Fifty revocations of every kind (control released, slot reused, bot stopped: both) while
/// the upstream sends frames without pause: every old socket is closed from the browser's
/// side, nothing arrives after its close frame, and the next round's sockets work.
#[actix_rt::test]
async fn fifty_revocations_close_every_socket_and_nothing_follows_the_close() {
    let f = fixture_on(&format!("{FLOOD_PREFIX}-sock3t_for-tests"));
    for round in 0..50u64 {
        let (generation, fence) = (round + 1, round + 1);
        f.authority.update(|l| {
            l.generation = generation;
            l.control_fence = Some(fence);
        });
        let mut control = connect(f.proxy, &f.seal(Policy::Control, generation, fence))
            .await
            .unwrap();
        let mut view = connect(f.proxy, &f.seal(Policy::View, generation, 0))
            .await
            .unwrap();
        for ws in [&mut control, &mut view] {
            assert_eq!(next_binary(ws).await, b"RFB 003.008\n");
            assert_eq!(next_binary(ws).await, b"frame");
        }
        let release = RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence,
        };
        let reuse = RevokeSlot {
            computer_id: COMPUTER.into(),
            slot: SLOT,
            generation,
        };
        let closed = match round % 3 {
            0 => {
                f.authority.update(|l| l.control_fence = None);
                assert_eq!(f.gateway.send(release).await.unwrap().closed, 1);
                vec![&mut control]
            }
            1 => {
                f.authority.update(|l| l.generation = generation + 1);
                assert_eq!(f.gateway.send(reuse).await.unwrap().closed, 2);
                vec![&mut control, &mut view]
            }
            _ => {
                f.authority.update(|l| {
                    l.control_fence = None;
                    l.generation = generation + 1;
                });
                // Both revocations at once, as the revocation watcher sends them: the
                // sockets close together, neither waits for the other's acknowledgement.
                let (released, reused) =
                    futures_util::future::join(f.gateway.send(release), f.gateway.send(reuse))
                        .await;
                assert_eq!(released.unwrap().closed + reused.unwrap().closed, 2);
                vec![&mut control, &mut view]
            }
        };
        for ws in closed {
            assert_eq!(
                closed_and_nothing_after(ws).await.as_deref(),
                Some("revoked"),
                "round {round}"
            );
        }
        if round % 3 == 0 {
            // The view survives a control release and still streams.
            assert_eq!(next_binary(&mut view).await, b"frame");
            drop(view);
        }
    }
    // Every socket is gone from the gateway's table (the released rounds' views closed by
    // their clients unregister shortly after).
    let deadline = Instant::now() + Duration::from_secs(5);
    while f.gateway.send(CountSockets).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "sockets left registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the computer's side closes, the browser gets its close frame and then the end of its
/// connection.
#[actix_rt::test]
async fn an_upstream_close_reaches_the_browser_and_ends_its_connection() {
    let f = fixture_on(&format!("{CLOSING_PREFIX}-sock3t_for-tests"));
    let mut ws = connect(f.proxy, &f.seal(Policy::View, 1, 0)).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    assert_eq!(
        closed_and_nothing_after(&mut ws).await.as_deref(),
        Some("bye")
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while f.gateway.send(CountSockets).await.unwrap() != 0 {
        assert!(Instant::now() < deadline, "socket still registered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A proxy whose process hears no revocation asks its authority where its sockets stand:
/// what no longer holds is closed, though its upstream never closes (a screen that keeps
/// sending), and a renewed control grant keeps its socket past the capability's expiry.
#[actix_rt::test]
async fn the_standing_sweep_closes_what_no_longer_holds_and_extends_a_renewed_grant() {
    let f = fixture_on(&format!("{FLOOD_PREFIX}-sock3t_for-tests"));
    f.authority.update(|l| l.control_fence = Some(1));
    rakazo_web_proxy::spawn_standing_sweep(
        f.gateway.clone(),
        Arc::new(f.authority.clone()),
        Duration::from_millis(100),
    );
    let mut control = connect(f.proxy, &f.seal(Policy::Control, 1, 1))
        .await
        .unwrap();
    let mut view = connect(f.proxy, &f.seal(Policy::View, 1, 0)).await.unwrap();
    for ws in [&mut control, &mut view] {
        assert_eq!(next_binary(ws).await, b"RFB 003.008\n");
    }
    // Renewed: the socket's expiry follows the grant's.
    let renewed = now_ms() + 3_600_000;
    f.authority
        .update(|l| l.control_expires_at_ms = Some(renewed));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let scopes = f.gateway.send(rakazo_web_proxy::ListScopes).await.unwrap();
        if scopes
            .iter()
            .any(|s| s.policy == Policy::Control && s.expires_at_ms == renewed)
        {
            break;
        }
        assert!(Instant::now() < deadline, "not extended: {scopes:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The grant ends: the control socket closes, the view stays.
    let ended = Instant::now();
    f.authority.update(|l| l.control_fence = None);
    assert_eq!(
        closed_and_nothing_after(&mut control).await.as_deref(),
        Some("revoked")
    );
    assert!(
        ended.elapsed() < Duration::from_secs(1),
        "{:?}",
        ended.elapsed()
    );
    assert_eq!(next_binary(&mut view).await, b"frame");
    // The slot is reused: the view closes too.
    f.authority.update(|l| l.generation = 2);
    assert_eq!(
        closed_and_nothing_after(&mut view).await.as_deref(),
        Some("revoked")
    );
}

/// A bot that serves its own gateway and sends a message larger than any screen server's
/// loses the socket: the message is not held for the browser, nor passed on to it.
#[actix_rt::test]
async fn an_upstream_message_past_the_limit_ends_the_socket_and_never_reaches_the_browser() {
    use futures_util::StreamExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let f = fixture_on(&format!("{BIG_PREFIX}-sock3t_for-tests"));
    let mut ws = connect(f.proxy, &f.seal(Policy::View, 1, 0)).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    loop {
        match tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("the socket stayed open")
        {
            Some(Ok(Message::Binary(b))) => panic!("a {} byte message came through", b.len()),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while f.gateway.send(CountSockets).await.unwrap() != 0 {
        assert!(Instant::now() < deadline, "socket still registered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Approves a capability once, then rejects it as revoked: a revocation that reached the
/// upstream before this proxy heard of it (the holder of the computer is another process).
struct OnceThenRevoked(TestAuthority, std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl rakazo_web_proxy::Authority for OnceThenRevoked {
    async fn target(
        &self,
        c: &rakazo_web_proxy::Capability,
    ) -> Result<rakazo_web_proxy::Target, AuthorityError> {
        if self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(AuthorityError::Rejected(RejectCause::Revoked));
        }
        self.0.target(c).await
    }
}

/// An upstream that ends a socket whose capability no longer holds: the browser hears
/// "revoked", as from this proxy's own revocation, not the upstream's reason.
#[actix_rt::test]
async fn an_upstream_close_after_a_revocation_reaches_the_browser_as_revoked() {
    let token = format!("{CLOSING_PREFIX}-sock3t_for-tests");
    let (upstream, _) = start_fake_gateway(&token);
    let authority = OnceThenRevoked(
        TestAuthority::new(&format!("http://{upstream}"), &token),
        std::sync::atomic::AtomicBool::new(false),
    );
    let keyring = Arc::new(Keyring::random(1));
    let (proxy, _) = start_proxy(keyring.clone(), Arc::new(authority));
    let sealed = keyring.seal(&capability(Policy::View, 1, 0)).unwrap();
    let mut ws = connect(proxy, &sealed).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    assert_eq!(
        closed_and_nothing_after(&mut ws).await.as_deref(),
        Some("revoked")
    );
}

/// A server without `on_connect` keeps no connection sockets: a revoked socket still gets its
/// close frame, and its connection still ends with end of file (after actix-http's linger).
#[actix_rt::test]
async fn without_on_connect_a_revoked_socket_still_closes_cleanly() {
    let (upstream, _) = start_fake_gateway(TOKEN);
    let authority = TestAuthority::new(&format!("http://{upstream}"), TOKEN);
    let keyring = Arc::new(Keyring::random(1));
    let (proxy, gateway) = start_proxy_lingering(keyring.clone(), Arc::new(authority.clone()));
    authority.update(|l| l.control_fence = Some(1));
    let sealed = keyring.seal(&capability(Policy::Control, 1, 1)).unwrap();
    let mut ws = connect(proxy, &sealed).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    authority.update(|l| l.control_fence = None);
    let release = RevokeControl {
        computer_id: COMPUTER.into(),
        bot_id: BOT.into(),
        fence: 1,
    };
    assert_eq!(gateway.send(release).await.unwrap().closed, 1);
    assert_eq!(
        closed_and_nothing_after(&mut ws).await.as_deref(),
        Some("revoked")
    );
}

/// A socket relayed through another proxy (`Target::through_proxy`, for a computer held by a
/// process on another host): input reaches the gateway through both proxies, the far one
/// opens and checks the capability again, and a request one proxy relayed to another is never
/// relayed on to a third.
#[actix_rt::test]
async fn a_socket_relayed_through_another_proxy_is_checked_there_and_never_relayed_on() {
    let far = fixture();
    far.authority.update(|l| l.control_fence = Some(5));
    let cap = far.seal(Policy::Control, 1, 5);
    let near_authority = TestAuthority::new("http://127.0.0.1:9", TOKEN);
    near_authority.update(|l| {
        l.control_fence = Some(5);
        l.through = Some((format!("http://{}", far.proxy), cap.clone()));
    });
    let (near, _) = start_proxy(far.keyring.clone(), Arc::new(near_authority));

    let mut ws = connect(near, &cap).await.unwrap();
    assert_eq!(next_binary(&mut ws).await, b"RFB 003.008\n");
    send(&mut ws, CLIENT_HANDSHAKE).await;
    send(&mut ws, &POINTER).await;
    let mut expected = CLIENT_HANDSHAKE.to_vec();
    expected.extend(POINTER);
    assert_eq!(far.upstream_bytes(expected.len()).await, expected);

    // The far proxy decides for itself: once its control lease moved on, the near proxy's
    // belief does not get a new socket through.
    far.authority.update(|l| l.control_fence = Some(6));
    assert!(connect(near, &cap).await.is_err());

    // What a proxy relays carries the forwarded header; a proxy asked with it refuses to
    // relay through yet another.
    let relayed = reqwest::Client::new()
        .get(format!("http://{near}/screen/{cap}/websockify"))
        .header("accept", "application/json")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header(rakazo_web_proxy::authority::FORWARDED_HEADER, "1")
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), 502);
    assert_eq!(relayed.headers()["x-rakazo-screen-detail"], "second_hop");
}
