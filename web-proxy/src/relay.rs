//! The websocket relay: actix-ws toward the browser, tokio-tungstenite toward websockify.
//!
//! Order of a connection: register with the gateway (refused if revoked meanwhile), open the
//! upstream websocket (`ws://gateway/websockify?token=<socket token>`), accept the browser's
//! upgrade with the subprotocol upstream chose, then relay in one task until either side closes
//! or the gateway revokes. Each direction runs in its own future so a slow side never blocks the
//! other. For view connections the client-to-upstream bytes pass through the RFB
//! [`ViewFilter`]; text frames are dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use actix_ws::{AggregatedMessage, AggregatedMessageStream, CloseCode, CloseReason, Session};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as UpCloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message as UpMessage};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::authority::{Authority, AuthorityError, Target};
use crate::capability::{Capability, Policy};
use crate::connection::BrowserConnection;
use crate::gateway::{
    CloseAck, CloseSocket, GatewayActor, REVOKED_CLOSE_REASON, Register, RegisterError, SocketId,
    SocketKind, SocketScope, Unregister,
};
use crate::rfb::ViewFilter;
use crate::service::{ConnectionId, ProxyState, Refusal, RefusalReason, reject};
use crate::sessions::{Counter, SessionNotes, Tally};

/// Longest time spent closing both sides after the relay ends.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest wait for the browser's reply to a close frame the relay sent, before its connection
/// is ended anyway (the close frame still leaves first).
pub const CLOSE_REPLY_TIMEOUT: Duration = Duration::from_millis(100);
/// The only websocket subprotocol relayed (websockify's binary mode).
const BINARY_PROTOCOL: &str = "binary";

type Upstream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Unregisters the socket from the gateway when the relay ends, whatever the path.
struct Registration {
    gateway: actix::Addr<GatewayActor>,
    id: SocketId,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.gateway.do_send(Unregister(self.id));
    }
}

/// Why the relay loop ended.
enum End {
    /// The browser closed (or went away).
    Client(Option<CloseReason>),
    /// The browser broke the websocket protocol or sent an oversized message.
    ClientError,
    /// The browser sent what a view connection may not send and cannot be parsed.
    Filter,
    /// Upstream closed (or went away).
    Upstream(Option<CloseFrame>),
    /// Upstream failed.
    UpstreamError,
    /// The gateway revoked the capability.
    Revoked(Option<CloseAck>),
}

impl End {
    fn closed_by(&self) -> &'static str {
        match self {
            End::Client(_) | End::ClientError | End::Filter => "client",
            End::Upstream(_) | End::UpstreamError => "upstream",
            End::Revoked(_) => "revoked",
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
    req: &HttpRequest,
    body: web::Payload,
    state: &ProxyState,
    capability: Capability,
    target: Target,
    policy: Policy,
    kind: SocketKind,
    conn: ConnectionId,
    json: bool,
) -> HttpResponse {
    let shared = &state.inner;
    let (close_tx, close_rx) = mpsc::unbounded_channel();
    let registered = shared
        .gateway
        .send(Register {
            scope: SocketScope::of(&capability, kind),
            connection_id: conn.to_string(),
            closer: close_tx.into(),
        })
        .await;
    let id = match registered {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => {
            let detail = match e {
                RegisterError::Revoked => "revoked",
                RegisterError::Expired => "expired",
            };
            let refusal = Refusal::new(RefusalReason::AuthorityRejected, detail);
            return reject(conn, Some(policy), refusal, json);
        }
        Err(_) => {
            let refusal = Refusal::new(RefusalReason::AuthorityUnavailable, "gateway");
            return reject(conn, Some(policy), refusal, json);
        }
    };
    let registration = Registration {
        gateway: shared.gateway.clone(),
        id,
    };
    // A control socket is noted as a session when it closes (who, when, input counts).
    let tally = match (policy, shared.notes.get()) {
        (Policy::Control, Some(notes)) => {
            Some((notes.clone(), Tally::new(capability.clone(), kind)))
        }
        _ => None,
    };

    let started = Instant::now();
    let handshake_failed = |error: &'static str, status: Option<u16>| {
        tracing::event!(
            name: "screen.proxy.websocket_handshake_failed",
            tracing::Level::WARN,
            screen.connection_id = %conn,
            policy = policy.as_str(),
            error,
            status,
            duration_ms = started.elapsed().as_millis() as u64,
            "screen.proxy.websocket_handshake_failed"
        );
        Refusal::new(RefusalReason::UpstreamFailed, error).response(json)
    };
    let offered_binary = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == BINARY_PROTOCOL);
    let mut request = match target.websocket_url().into_client_request() {
        Ok(r) => r,
        Err(_) => return handshake_failed("url", None),
    };
    if target.is_proxy() {
        // That proxy answers from what its own process holds and never relays it on.
        request.headers_mut().insert(
            crate::authority::FORWARDED_HEADER,
            tungstenite::http::HeaderValue::from_static("1"),
        );
    }
    if offered_binary {
        request.headers_mut().insert(
            tungstenite::http::header::SEC_WEBSOCKET_PROTOCOL,
            tungstenite::http::HeaderValue::from_static(BINARY_PROTOCOL),
        );
    }
    let config = WebSocketConfig::default()
        .read_buffer_size(shared.config.upstream_read_buffer_bytes)
        .max_message_size(Some(shared.config.max_upstream_message_bytes))
        .max_frame_size(Some(shared.config.max_upstream_message_bytes));
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    let (upstream, response) =
        match tokio::time::timeout(shared.config.upstream_timeout, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(tungstenite::Error::Http(resp))) => {
                return handshake_failed("status", Some(resp.status().as_u16()));
            }
            Ok(Err(tungstenite::Error::Io(_))) => return handshake_failed("connect", None),
            Ok(Err(_)) => return handshake_failed("protocol", None),
            Err(_) => return handshake_failed("timeout", None),
        };
    let chosen = response
        .headers()
        .get(tungstenite::http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .filter(|p| *p == BINARY_PROTOCOL);
    let protocols: &[&str] = if chosen.is_some() {
        &[BINARY_PROTOCOL]
    } else {
        &[]
    };
    let (response, session, stream) = match actix_ws::handle_with_protocols(req, body, protocols) {
        Ok(parts) => parts,
        Err(_) => {
            let refusal = Refusal::new(RefusalReason::InvalidPath, "bad_upgrade");
            return reject(conn, Some(policy), refusal, json);
        }
    };
    let (mut response, connection) = BrowserConnection::prepare(req, response);
    let headers = response.headers_mut();
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static(crate::service::CACHE_CONTROL),
    );
    tracing::event!(
        name: "screen.proxy.websocket_upgraded",
        tracing::Level::INFO,
        screen.connection_id = %conn,
        policy = policy.as_str(),
        socket = kind.as_str(),
        subprotocol = chosen.unwrap_or(""),
        duration_ms = started.elapsed().as_millis() as u64,
        "screen.proxy.websocket_upgraded"
    );
    let stream = stream
        .max_frame_size(shared.config.max_client_message_bytes)
        .aggregate_continuations()
        .max_continuation_size(shared.config.max_client_message_bytes);
    if let Some((notes, tally)) = &tally {
        notes.control_session_started(tally.start());
    }
    let recheck = Recheck {
        authority: shared.authority.clone(),
        capability: capability.clone(),
        kind,
        timeout: shared.config.authority_timeout,
    };
    actix_rt::spawn(relay(
        session,
        stream,
        upstream,
        close_rx,
        registration,
        connection,
        policy,
        conn,
        tally,
        recheck,
    ));
    response
}

/// Asks the authority again when the upstream ends a socket: a capability that no longer
/// holds was revoked, whichever process learned of it first.
struct Recheck {
    authority: Arc<dyn Authority>,
    capability: Capability,
    kind: SocketKind,
    timeout: Duration,
}

impl Recheck {
    async fn revoked(&self) -> bool {
        let asked = match self.kind {
            SocketKind::Screen => self.authority.target(&self.capability),
            SocketKind::Terminal => self.authority.terminal_target(&self.capability),
        };
        matches!(
            tokio::time::timeout(self.timeout, asked).await,
            Ok(Err(AuthorityError::Rejected(_)))
        )
    }
}

#[allow(clippy::too_many_arguments)]
async fn relay(
    session: Session,
    mut client: AggregatedMessageStream,
    upstream: Upstream,
    mut close_rx: mpsc::UnboundedReceiver<CloseSocket>,
    registration: Registration,
    connection: Option<BrowserConnection>,
    policy: Policy,
    conn: ConnectionId,
    tally: Option<(Arc<dyn SessionNotes>, Tally)>,
    recheck: Recheck,
) {
    let started = Instant::now();
    let (mut up_tx, mut up_rx) = upstream.split();
    let mut filter = (policy == Policy::View).then(ViewFilter::new);
    let mut counter = tally.as_ref().map(|(_, t)| Counter::new(t.socket));
    let mut to_client = session.clone();
    let mut pong = session;
    let mut end = tokio::select! {
        closed = close_rx.recv() => End::Revoked(closed.map(|m| m.ack)),
        end = client_to_upstream(&mut client, &mut up_tx, &mut pong, filter.as_mut(), counter.as_mut(), conn, policy) => end,
        end = upstream_to_client(&mut up_rx, &mut to_client, conn, policy) => end,
    };
    if matches!(end, End::Upstream(_)) && recheck.revoked().await {
        // A revocation can reach the upstream before this process hears of it (a holder on
        // another process stops the terminal server first): the browser hears "revoked".
        end = End::Revoked(None);
    }
    let closed_by = end.closed_by();
    if let (Some((notes, tally)), Some(counter)) = (tally, &counter) {
        let (inputs, counted) = counter.finish();
        notes.control_session_ended(tally.ended(inputs, counted, closed_by));
    }
    let ack = match &mut end {
        End::Revoked(ack) => ack.take(),
        _ => None,
    };
    let client_reason = match &end {
        End::Revoked(_) => Some(CloseReason {
            code: CloseCode::Policy,
            description: Some(REVOKED_CLOSE_REASON.into()),
        }),
        End::Client(reason) => reason.clone(),
        End::ClientError => Some(CloseCode::Protocol.into()),
        End::Filter => Some(CloseReason {
            code: CloseCode::Policy,
            description: Some("view only".into()),
        }),
        End::Upstream(frame) => Some(match frame {
            Some(f) => CloseReason {
                code: u16::from(f.code).into(),
                description: (!f.reason.is_empty()).then(|| f.reason.to_string()),
            },
            None => CloseCode::Away.into(),
        }),
        End::UpstreamError => Some(CloseCode::Error.into()),
    };
    let upstream_frame = match &end {
        End::Revoked(_) => Some(CloseFrame {
            code: UpCloseCode::Normal,
            reason: REVOKED_CLOSE_REASON.into(),
        }),
        _ => Some(CloseFrame {
            code: UpCloseCode::Normal,
            reason: "".into(),
        }),
    };
    let upstream_open = !matches!(end, End::Upstream(_) | End::UpstreamError);
    // The relay closes first unless the browser did (or broke the protocol): then it waits
    // briefly for the browser's close reply before ending the connection.
    let await_reply = !matches!(end, End::Client(_) | End::ClientError);
    // The browser's side first: its close frame. A revocation is acknowledged once it is
    // queued (nothing can follow it); the upstream is cleaned up off the revocation path
    // (nothing it sends reaches the browser). Then the browser's connection ends.
    let closed = tokio::time::timeout(CLOSE_TIMEOUT, to_client.close(client_reason)).await;
    drop(pong);
    drop(registration);
    drop(ack);
    actix_rt::spawn(async move {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
            if upstream_open {
                let _ = up_tx.send(UpMessage::Close(upstream_frame)).await;
            }
            let _ = up_tx.close().await;
        })
        .await;
        drop(up_rx);
    });
    // Without a kept connection socket (no `on_connect`), actix-http ends the connection after
    // its linger.
    let mut connection_ended = false;
    if let Some(connection) = connection {
        if await_reply && matches!(closed, Ok(Ok(()))) {
            let _ = tokio::time::timeout(CLOSE_REPLY_TIMEOUT, close_reply(&mut client)).await;
        }
        connection_ended = connection.end(CLOSE_TIMEOUT).await;
    }
    drop(client);
    tracing::event!(
        name: "screen.proxy.websocket_closed",
        tracing::Level::INFO,
        screen.connection_id = %conn,
        policy = policy.as_str(),
        upstream_handshake_completed = true,
        closed_by,
        connection_ended,
        duration_ms = started.elapsed().as_millis() as u64,
        dropped_input = filter.as_ref().map_or(0, ViewFilter::dropped),
        "screen.proxy.websocket_closed"
    );
}

/// Reads the browser's side until its close reply (or its end): the reply proves the close
/// frame reached the browser, so ending the connection next leaves nothing unread.
async fn close_reply(client: &mut AggregatedMessageStream) {
    loop {
        match client.recv().await {
            Some(Ok(AggregatedMessage::Close(_))) | Some(Err(_)) | None => return,
            Some(Ok(_)) => {}
        }
    }
}

fn socket_error(conn: ConnectionId, policy: Policy, side: &'static str, error: &'static str) {
    tracing::event!(
        name: "screen.proxy.websocket_error",
        tracing::Level::WARN,
        screen.connection_id = %conn,
        policy = policy.as_str(),
        side,
        error,
        "screen.proxy.websocket_error"
    );
}

async fn client_to_upstream(
    client: &mut AggregatedMessageStream,
    up_tx: &mut SplitSink<Upstream, UpMessage>,
    pong: &mut Session,
    mut filter: Option<&mut ViewFilter>,
    mut counter: Option<&mut Counter>,
    conn: ConnectionId,
    policy: Policy,
) -> End {
    let mut scratch = Vec::new();
    loop {
        let message = match client.recv().await {
            None => return End::Client(None),
            Some(Err(_)) => {
                socket_error(conn, policy, "client", "protocol");
                return End::ClientError;
            }
            Some(Ok(m)) => m,
        };
        if let Some(c) = counter.as_deref_mut() {
            match &message {
                AggregatedMessage::Binary(bytes) => c.binary(bytes),
                AggregatedMessage::Text(_) => c.text(),
                _ => {}
            }
        }
        let outgoing = match message {
            AggregatedMessage::Binary(bytes) => match filter.as_deref_mut() {
                None => UpMessage::Binary(bytes),
                Some(f) => {
                    if f.feed(&bytes, &mut scratch).is_err() {
                        socket_error(conn, policy, "client", "view_filter");
                        return End::Filter;
                    }
                    if scratch.is_empty() {
                        continue;
                    }
                    UpMessage::Binary(Bytes::from(std::mem::take(&mut scratch)))
                }
            },
            AggregatedMessage::Text(text) => {
                if filter.is_some() {
                    continue;
                }
                UpMessage::Text(text.to_string().into())
            }
            AggregatedMessage::Ping(payload) => {
                let _ = pong.pong(&payload).await;
                continue;
            }
            AggregatedMessage::Pong(_) => continue,
            AggregatedMessage::Close(reason) => return End::Client(reason),
        };
        if up_tx.send(outgoing).await.is_err() {
            socket_error(conn, policy, "upstream", "send");
            return End::UpstreamError;
        }
    }
}

async fn upstream_to_client(
    up_rx: &mut SplitStream<Upstream>,
    to_client: &mut Session,
    conn: ConnectionId,
    policy: Policy,
) -> End {
    loop {
        let message = match up_rx.next().await {
            None => return End::Upstream(None),
            Some(Err(_)) => {
                socket_error(conn, policy, "upstream", "receive");
                return End::UpstreamError;
            }
            Some(Ok(m)) => m,
        };
        let sent = match message {
            UpMessage::Binary(bytes) => to_client.binary(bytes).await,
            UpMessage::Text(text) => to_client.text(text.as_str().to_owned()).await,
            UpMessage::Close(frame) => return End::Upstream(frame),
            UpMessage::Ping(_) | UpMessage::Pong(_) | UpMessage::Frame(_) => continue,
        };
        if sent.is_err() {
            return End::Client(None);
        }
    }
}
