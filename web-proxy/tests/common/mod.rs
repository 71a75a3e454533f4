//! Shared test fixtures: an in-process authority, a fake screen gateway (whose HTTP pages play
//! the bot's own), a small noVNC directory, and a proxy server.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use async_trait::async_trait;
use futures_util::{SinkExt as _, StreamExt as _};
use rakazo_web_proxy::authority::{Authority, AuthorityError, Channel, RejectCause, Target};
use rakazo_web_proxy::capability::{Capability, Keyring, Policy, now_ms};
use rakazo_web_proxy::gateway::{GatewayActor, SocketScope};
use rakazo_web_proxy::service::{ProxyConfig, ProxyState, configure};
use rakazo_web_proxy::standing::Standing;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{self, Message};

pub const COMPUTER: &str = "6f1c1f9e-2b1d-4c39-9b7e-0c6a2f1d9e11";
pub const BOT: &str = "bot-1";
pub const SLOT: u16 = 0;

/// What the in-process authority currently believes.
#[derive(Clone, Debug)]
pub struct Live {
    pub upstream: String,
    pub socket_token: String,
    pub generation: u64,
    /// The live control lease fence, if any.
    pub control_fence: Option<u64>,
    /// Forced answer instead of a target.
    pub fail: Option<AuthorityError>,
    /// Relay through another proxy instead: (its base URL, the capability sealed for it).
    pub through: Option<(String, String)>,
    /// The live control lease's expiry as renewed, if it was.
    pub control_expires_at_ms: Option<u64>,
}

/// An in-process [`Authority`] over [`Live`], the way the server implements it.
#[derive(Clone)]
pub struct TestAuthority(pub Arc<Mutex<Live>>);

impl TestAuthority {
    pub fn new(upstream: &str, socket_token: &str) -> TestAuthority {
        TestAuthority(Arc::new(Mutex::new(Live {
            upstream: upstream.into(),
            socket_token: socket_token.into(),
            generation: 1,
            control_fence: None,
            fail: None,
            through: None,
            control_expires_at_ms: None,
        })))
    }

    pub fn update(&self, f: impl FnOnce(&mut Live)) {
        f(&mut self.0.lock().unwrap());
    }
}

#[async_trait]
impl Authority for TestAuthority {
    async fn target(&self, c: &Capability) -> Result<Target, AuthorityError> {
        let live = self.0.lock().unwrap().clone();
        if let Some(e) = live.fail {
            return Err(e);
        }
        if c.generation != live.generation {
            return Err(AuthorityError::Rejected(RejectCause::StaleGeneration));
        }
        if c.policy == Policy::Control && live.control_fence != Some(c.fence) {
            return Err(AuthorityError::Rejected(RejectCause::LeaseEnded));
        }
        if let Some((proxy, capability)) = &live.through {
            return Ok(Target::through_proxy(
                proxy,
                capability,
                Channel::Screen,
                c.policy,
            )?);
        }
        Ok(Target::new(&live.upstream, &live.socket_token, c.policy)?)
    }

    async fn standing(
        &self,
        scopes: &[SocketScope],
    ) -> Option<Result<Vec<Standing>, AuthorityError>> {
        let live = self.0.lock().unwrap().clone();
        let standing = scopes
            .iter()
            .map(|s| {
                if s.generation != live.generation {
                    Standing::SlotRetired
                } else if s.policy == Policy::Control && live.control_fence != Some(s.fence) {
                    Standing::ControlEnded
                } else if s.policy == Policy::Control {
                    Standing::Holds {
                        expires_at_ms: live.control_expires_at_ms,
                    }
                } else {
                    Standing::Holds {
                        expires_at_ms: None,
                    }
                }
            })
            .collect();
        Some(Ok(standing))
    }
}

pub fn capability(policy: Policy, generation: u64, fence: u64) -> Capability {
    Capability {
        computer_id: COMPUTER.into(),
        bot_id: BOT.into(),
        slot: SLOT,
        generation,
        policy,
        fence,
        expires_at_ms: now_ms() + 60_000,
    }
}

fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

/// The page of [`fake_novnc`].
pub const PACKAGED_PAGE: &str = "<!DOCTYPE html><html><head><title>noVNC</title>\
<script type=\"module\" crossorigin=\"anonymous\" src=\"app/ui.js\"></script></head>\
<body>packaged-body</body></html>";

/// A small noVNC directory: `vnc.html`, `app/ui.js`, `core/rfb.js`, and `utils/launch.sh`
/// (present in the package, never served).
pub fn fake_novnc() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for sub in ["app", "core", "utils"] {
        std::fs::create_dir(root.join(sub)).unwrap();
    }
    std::fs::write(root.join("vnc.html"), PACKAGED_PAGE).unwrap();
    std::fs::write(root.join("app/ui.js"), "export default 1;").unwrap();
    std::fs::write(root.join("core/rfb.js"), "export default 2;").unwrap();
    std::fs::write(root.join("utils/launch.sh"), "#!/bin/sh").unwrap();
    dir
}

/// Starts the proxy in the current actix system, serving [`fake_novnc`]. Returns its address
/// and the gateway.
pub fn start_proxy(
    keyring: Arc<Keyring>,
    authority: Arc<dyn Authority>,
) -> (SocketAddr, Addr<GatewayActor>) {
    let novnc = fake_novnc();
    start_proxy_serving(keyring, authority, novnc.path())
}

/// Starts the proxy in the current actix system, serving noVNC from `novnc_dir`.
pub fn start_proxy_serving(
    keyring: Arc<Keyring>,
    authority: Arc<dyn Authority>,
    novnc_dir: &std::path::Path,
) -> (SocketAddr, Addr<GatewayActor>) {
    start_proxy_server(keyring, authority, novnc_dir, true)
}

/// Starts the proxy on a server that does not keep its connections' sockets (no
/// `on_connect`): closed websockets' connections end after actix-http's linger.
pub fn start_proxy_lingering(
    keyring: Arc<Keyring>,
    authority: Arc<dyn Authority>,
) -> (SocketAddr, Addr<GatewayActor>) {
    let novnc = fake_novnc();
    start_proxy_server(keyring, authority, novnc.path(), false)
}

fn start_proxy_server(
    keyring: Arc<Keyring>,
    authority: Arc<dyn Authority>,
    novnc_dir: &std::path::Path,
    keep_connections: bool,
) -> (SocketAddr, Addr<GatewayActor>) {
    let gateway = GatewayActor::start_default();
    let config = ProxyConfig {
        authority_timeout: Duration::from_secs(2),
        upstream_timeout: Duration::from_secs(5),
        novnc_dir: novnc_dir.to_path_buf(),
        ..ProxyConfig::default()
    };
    let state = ProxyState::new(keyring, authority, gateway.clone(), config);
    let listener = bind();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        let state = state.clone();
        App::new().configure(move |cfg| configure(cfg, state))
    });
    let server = if keep_connections {
        server.on_connect(rakazo_web_proxy::on_connect)
    } else {
        server
    };
    let server = server
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
    actix_rt::spawn(server);
    (addr, gateway)
}

/// What the fake gateway saw.
#[derive(Default)]
pub struct Seen {
    /// Bytes received from the proxy on websockets, in order.
    pub bytes: Vec<u8>,
    /// Tokens presented on websocket requests.
    pub tokens: Vec<String>,
    /// Paths of plain HTTP requests (the proxy must never make one).
    pub http_paths: Vec<String>,
}

/// What the fake gateway answers every plain HTTP request with: the bot's own page.
pub const BOT_PAGE: &str = "<!DOCTYPE html><html><head><title>noVNC</title>\
<script>parent.postMessage(sessionStorage.getItem('rakazo.token'), '*')</script></head>\
<body>bot-page</body></html>";

/// A socket token starting so has the fake gateway send `frame` messages without pause after
/// its greeting.
pub const FLOOD_PREFIX: &str = "flood";

/// A socket token starting so has the fake gateway close the socket itself ("bye") right after
/// its greeting, as a screen that goes away.
pub const CLOSING_PREFIX: &str = "closing";

/// A socket token starting so has the fake gateway send one 2 MiB message after its greeting:
/// a bot that serves its own gateway.
pub const BIG_PREFIX: &str = "big";

/// A fake websockify run by the bot: any plain HTTP GET answers [`BOT_PAGE`] (recorded), and
/// `/websockify?token=` greets with `RFB 003.008\n`, records what it receives, and echoes a
/// frame `ack` after each message.
/// A token starting with [`FLOOD_PREFIX`] gets a stream of `frame` messages instead, one
/// starting with [`CLOSING_PREFIX`] a close after the greeting, one starting with
/// [`BIG_PREFIX`] a 2 MiB message.
pub fn start_fake_gateway(token: &str) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let token = token.to_string();
    let listener = bind();
    let addr = listener.local_addr().unwrap();
    let data = seen.clone();
    let server = HttpServer::new(move || {
        let seen = data.clone();
        let token = token.clone();
        App::new()
            .app_data(web::Data::new(seen))
            .app_data(web::Data::new(token))
            .route("/websockify", web::get().to(fake_websockify))
            .default_service(web::to(
                |req: HttpRequest, seen: web::Data<Arc<Mutex<Seen>>>| async move {
                    seen.lock().unwrap().http_paths.push(req.path().to_owned());
                    HttpResponse::Ok()
                        .content_type("text/html")
                        .insert_header(("set-cookie", "upstream=secret"))
                        .body(BOT_PAGE)
                },
            ))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_rt::spawn(server);
    (addr, seen)
}

async fn fake_websockify(
    req: HttpRequest,
    body: web::Payload,
    seen: web::Data<Arc<Mutex<Seen>>>,
    token: web::Data<String>,
) -> Result<HttpResponse, actix_web::Error> {
    let query = req.query_string().to_string();
    let presented = query.strip_prefix("token=").unwrap_or_default().to_string();
    seen.lock().unwrap().tokens.push(presented.clone());
    if presented != *token.get_ref() {
        return Ok(HttpResponse::Forbidden().finish());
    }
    let (response, mut session, mut stream) =
        actix_ws::handle_with_protocols(&req, body, &["binary"])?;
    let seen = seen.get_ref().clone();
    actix_rt::spawn(async move {
        let _ = session.binary(&b"RFB 003.008\n"[..]).await;
        if presented.starts_with(CLOSING_PREFIX) {
            let reason = actix_ws::CloseReason {
                code: actix_ws::CloseCode::Normal,
                description: Some("bye".into()),
            };
            let _ = session.close(Some(reason)).await;
            return;
        }
        if presented.starts_with(BIG_PREFIX) {
            let _ = session.binary(vec![7u8; 2 << 20]).await;
        }
        if presented.starts_with(FLOOD_PREFIX) {
            // Frames without pause until the socket goes, like a busy screen.
            let mut flood = session.clone();
            actix_rt::spawn(async move {
                while flood.binary(&b"frame"[..]).await.is_ok() {
                    actix_rt::task::yield_now().await;
                }
            });
        }
        while let Some(Ok(msg)) = stream.recv().await {
            match msg {
                actix_ws::Message::Binary(b) => {
                    seen.lock().unwrap().bytes.extend_from_slice(&b);
                    if session.binary(&b"ack"[..]).await.is_err() {
                        break;
                    }
                }
                actix_ws::Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = session.close(None).await;
    });
    Ok(response)
}

pub type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a websocket through the proxy (offering the `binary` subprotocol like noVNC).
pub async fn connect(proxy: SocketAddr, token: &str) -> Result<Client, tungstenite::Error> {
    let mut request = format!("ws://{proxy}/screen/{token}/websockify")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().unwrap());
    tokio_tungstenite::connect_async(request)
        .await
        .map(|(ws, _)| ws)
}

/// The HTTP status of a refused websocket upgrade.
pub async fn refused_status(proxy: SocketAddr, token: &str) -> u16 {
    match connect(proxy, token).await {
        Err(tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("upgrade was accepted"),
    }
}

/// Next binary message, with a timeout.
pub async fn next_binary(ws: &mut Client) -> Vec<u8> {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("timed out waiting for a message")
            .expect("stream ended")
            .expect("websocket error");
        match msg {
            Message::Binary(b) => return b.to_vec(),
            Message::Close(f) => panic!("closed: {f:?}"),
            _ => {}
        }
    }
}

pub async fn send(ws: &mut Client, bytes: &[u8]) {
    ws.send(Message::Binary(bytes.to_vec().into()))
        .await
        .unwrap();
}

/// Waits for the close frame; returns its reason and how long it took.
pub async fn wait_close(ws: &mut Client, within: Duration) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let next = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("socket not closed in time");
        match next {
            Some(Ok(Message::Close(f))) => return f.map(|f| f.reason.to_string()),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return None,
        }
    }
}

/// The client side of an RFB 3.8 handshake with security None and a shared ClientInit.
pub const CLIENT_HANDSHAKE: &[u8] = b"RFB 003.008\n\x01\x01";
/// PointerEvent: button mask 0, x = 300, y = 200.
pub const POINTER: [u8; 6] = [5, 0, 0x01, 0x2c, 0x00, 0xc8];
/// KeyEvent: down, keysym 'a'.
pub const KEY: [u8; 8] = [4, 1, 0, 0, 0, 0, 0, 0x61];
/// FramebufferUpdateRequest, incremental, 0,0 10x10.
pub const FB_REQUEST: [u8; 10] = [3, 1, 0, 0, 0, 0, 0, 10, 0, 10];
