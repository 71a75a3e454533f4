//! JSON-RPC over the `/rpc/ws` websocket, with live subscriptions.
//!
//! Authentication: an `Authorization: Bearer` header on the upgrade, or (for browsers) a
//! first call `auth {token}`, within [`AUTH_WINDOW`] and [`UNAUTHENTICATED_MESSAGES`]
//! messages; otherwise the socket is closed. `subscribe {spaceId}` streams that space's
//! events as notifications `{"method":"event","params":{topic, spaceId, data}}`; a bot token
//! subscribes to its own space only and receives only its bot's events (and those of the
//! computer it uses). Calls run concurrently, at most [`MAX_TASKS`] at once per socket (more
//! wait); each answer carries its request id.
//!
//! A socket opened with `?images=binary` receives the screenshots of tool answers as binary
//! messages instead of base64 inside the JSON (see [`crate::tools::Attachments`]): each
//! image's message comes before the answer that names it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use actix_ws::{AggregatedMessage, Session};
use futures_util::StreamExt;
use rakazo_actors::computers::Computers;
use rakazo_actors::events::Event;
use rakazo_actors::{DomainError, ErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::sync::broadcast::error::RecvError;

use super::{methods, rpc};
use crate::app::App;
use crate::auth::{self, Caller};
use crate::config::Secret;
use crate::tools::Attachments;

/// Time an unauthenticated socket has to call `auth`.
pub const AUTH_WINDOW: Duration = Duration::from_secs(5);
/// Messages an unauthenticated socket may send before it is closed.
pub const UNAUTHENTICATED_MESSAGES: u32 = 3;
/// Calls one socket runs at once; further calls wait for one to finish.
pub const MAX_TASKS: usize = 8;

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    id: Option<Value>,
    method: String,
    #[serde(default)]
    params: Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpaceParams {
    space_id: String,
}

#[derive(Deserialize)]
struct AuthParams {
    token: String,
}

/// `GET /rpc/ws`: the upgrade, authenticated by a bearer header when one is given.
pub async fn upgrade(
    app: web::Data<App>,
    req: HttpRequest,
    body: web::Payload,
) -> actix_web::Result<HttpResponse> {
    let (caller, token) = match super::bearer(&req) {
        Some(token) => (
            Some(auth::authenticate(&app.db, &token).await.map_err(|e| {
                if e.code == ErrorCode::Unauthorized {
                    actix_web::error::ErrorUnauthorized("invalid bearer token")
                } else {
                    // The database failed: the token may be good, the client keeps it.
                    actix_web::error::ErrorServiceUnavailable("try again")
                }
            })?),
            Some(Secret(token)),
        ),
        None => (None, None),
    };
    let binary_images = req.query_string().split('&').any(|p| p == "images=binary");
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream
        .max_frame_size(rpc::MAX_REQUEST_BYTES)
        .aggregate_continuations()
        .max_continuation_size(rpc::MAX_REQUEST_BYTES);
    let conn = Conn {
        app: app.into_inner(),
        caller,
        token,
        subscriptions: HashSet::new(),
        reach: HashMap::new(),
        unauthenticated_messages: 0,
        tasks: Arc::new(Semaphore::new(MAX_TASKS)),
        attachment_ids: binary_images.then(|| Arc::new(AtomicU64::new(1))),
    };
    actix_web::rt::spawn(run(conn, session, stream));
    Ok(response)
}

/// One socket's state.
struct Conn {
    app: Arc<App>,
    caller: Option<Caller>,
    /// The token `caller` came from, looked up again every `RPC_WS_RECHECK_MS`: a token that
    /// no longer authenticates (its user or bot deleted) closes the socket, and what a bot
    /// token reaches (its computer mode) is read afresh.
    token: Option<Secret>,
    /// Subscribed spaces.
    subscriptions: HashSet<String>,
    /// For a bot token: whether it reaches a computer, by id.
    reach: HashMap<String, bool>,
    unauthenticated_messages: u32,
    tasks: Arc<Semaphore>,
    /// With `?images=binary`: the socket's attachment id counter.
    attachment_ids: Option<Arc<AtomicU64>>,
}

impl Conn {
    /// Whether an event goes to this socket: a subscribed space, and for a bot token only
    /// its bot's events or those of the computer it uses.
    async fn wants(&mut self, event: &Event) -> bool {
        if !self.subscriptions.contains(&event.space_id) {
            return false;
        }
        let Some(caller) = &self.caller else {
            return false;
        };
        let Some(bot) = caller.bot_id() else {
            return true;
        };
        if let Some(of) = event.data.get("botId").filter(|v| !v.is_null()) {
            return of.as_str() == Some(bot);
        }
        let Some(computer_id) = event.data["computerId"].as_str() else {
            return false;
        };
        if let Some(known) = self.reach.get(computer_id) {
            return *known;
        }
        let reaches = match Computers::new(self.app.db.clone()).get(computer_id).await {
            Ok(c) => methods::bot_reaches(&self.app.db, caller, &c)
                .await
                .unwrap_or(false),
            Err(_) => false,
        };
        self.reach.insert(computer_id.to_owned(), reaches);
        reaches
    }
}

impl Conn {
    /// Looks the token up again: `false` when it no longer authenticates. A database error
    /// keeps the socket (the next look decides).
    async fn recheck(&mut self) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        match auth::authenticate(&self.app.db, &token.0).await {
            Ok(caller) => {
                // A space the caller no longer sees (a membership ended) sends it nothing more.
                let mut gone = Vec::new();
                for space_id in &self.subscriptions {
                    let ctx = methods::Ctx {
                        app: &self.app,
                        caller: &caller,
                        attachments: None,
                    };
                    if let Err(e) = methods::visible_space(&ctx, space_id).await
                        && e.code != ErrorCode::Internal
                    {
                        gone.push(space_id.clone());
                    }
                }
                for space_id in gone {
                    self.subscriptions.remove(&space_id);
                }
                self.caller = Some(caller);
                self.reach.clear();
                true
            }
            Err(e) => e.code != ErrorCode::Unauthorized,
        }
    }
}

async fn send(session: &mut Session, value: &Value) -> bool {
    session.text(value.to_string()).await.is_ok()
}

async fn run(mut conn: Conn, mut session: Session, mut stream: actix_ws::AggregatedMessageStream) {
    let mut events = conn.app.runtime().events.subscribe();
    let deadline = tokio::time::sleep(AUTH_WINDOW);
    tokio::pin!(deadline);
    let mut recheck = tokio::time::interval(conn.app.config.ws_recheck);
    recheck.reset();
    loop {
        tokio::select! {
            _ = recheck.tick(), if conn.caller.is_some() => {
                if !conn.recheck().await {
                    tracing::info!(event = "rpc.ws.token_ended");
                    let reason = actix_ws::CloseReason {
                        code: actix_ws::CloseCode::Policy,
                        description: Some("the token no longer authenticates".into()),
                    };
                    let _ = session.close(Some(reason)).await;
                    return;
                }
            }
            msg = stream.next() => {
                let Some(Ok(msg)) = msg else { break };
                match msg {
                    AggregatedMessage::Text(text)
                        if !on_text(&mut conn, &mut session, text.as_bytes()).await =>
                    {
                        tracing::info!(event = "rpc.ws.unauthenticated_closed", reason = "messages");
                        break;
                    }
                    AggregatedMessage::Binary(_) if conn.caller.is_none() => {
                        tracing::info!(event = "rpc.ws.unauthenticated_closed", reason = "binary");
                        break;
                    }
                    AggregatedMessage::Ping(bytes) if session.pong(&bytes).await.is_err() => break,
                    AggregatedMessage::Close(_) => break,
                    _ => {}
                }
            }
            () = &mut deadline, if conn.caller.is_none() => {
                tracing::info!(event = "rpc.ws.unauthenticated_closed", reason = "timeout");
                break;
            }
            event = events.recv() => {
                match event {
                    Ok(event) if conn.wants(&event).await => {
                        let note = json!({ "jsonrpc": "2.0", "method": "event", "params": event });
                        if !send(&mut session, &note).await { break; }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) if conn.caller.is_some() => {
                        let note = json!({ "jsonrpc": "2.0", "method": "event.lagged", "params": { "missed": missed } });
                        if !send(&mut session, &note).await { break; }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => break,
                }
            }
        }
    }
    let _ = session.close(None).await;
}

/// Handle one text message; `false` closes the socket (an unauthenticated socket that
/// keeps talking without authenticating).
async fn on_text(conn: &mut Conn, session: &mut Session, text: &[u8]) -> bool {
    if conn.caller.is_none() {
        conn.unauthenticated_messages += 1;
        if conn.unauthenticated_messages > UNAUTHENTICATED_MESSAGES {
            return false;
        }
    }
    let Ok(env) = serde_json::from_slice::<Envelope>(text) else {
        send(
            session,
            &rpc::protocol_error(Value::Null, -32700, "parse error"),
        )
        .await;
        return true;
    };
    let id = env.id.clone().unwrap_or(Value::Null);
    let reply = |outcome: Result<Value, DomainError>| match outcome {
        Ok(v) => rpc::result(id.clone(), v),
        Err(e) => rpc::error(id.clone(), &e),
    };
    if env.method == "auth" {
        let outcome = match methods::params::<AuthParams>(env.params) {
            Ok(p) => auth::authenticate(&conn.app.db, &p.token).await.map(|c| {
                let answer = json!({ "userId": c.user_id, "isOperator": c.is_operator() });
                // A new identity starts without the old one's subscriptions.
                conn.subscriptions.clear();
                conn.reach.clear();
                conn.caller = Some(c);
                conn.token = Some(Secret(p.token.clone()));
                answer
            }),
            Err(e) => Err(e),
        };
        send(session, &reply(outcome)).await;
        return true;
    }
    let Some(who) = conn.caller.clone() else {
        send(
            session,
            &reply(Err(DomainError::new(
                ErrorCode::Unauthorized,
                "call auth first",
            ))),
        )
        .await;
        return true;
    };
    match env.method.as_str() {
        "subscribe" | "unsubscribe" => {
            let outcome = match methods::params::<SpaceParams>(env.params) {
                Ok(p) => {
                    let ctx = methods::Ctx {
                        app: &conn.app,
                        caller: &who,
                        attachments: None,
                    };
                    match methods::visible_space(&ctx, &p.space_id).await {
                        Ok(()) => {
                            if env.method == "subscribe" {
                                conn.subscriptions.insert(p.space_id.clone());
                            } else {
                                conn.subscriptions.remove(&p.space_id);
                            }
                            Ok(json!({ "spaceId": p.space_id }))
                        }
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            send(session, &reply(outcome)).await;
        }
        _ => {
            // Bounded: a socket waits for one of its running calls before starting another.
            let Ok(permit) = conn.tasks.clone().acquire_owned().await else {
                return false;
            };
            let (app, mut session) = (conn.app.clone(), session.clone());
            let attachments = conn.attachment_ids.clone().map(Attachments::new);
            let raw = json!({ "jsonrpc": "2.0", "id": env.id, "method": env.method, "params": env.params });
            actix_web::rt::spawn(async move {
                let ctx = methods::Ctx {
                    app: &app,
                    caller: &who,
                    attachments: attachments.as_ref(),
                };
                let (answer, _) = rpc::handle_one(&ctx, raw).await;
                if let Some(resp) = answer {
                    // The images first: the answer names them.
                    for message in attachments
                        .map(Attachments::into_messages)
                        .unwrap_or_default()
                    {
                        if session.binary(message).await.is_err() {
                            return;
                        }
                    }
                    let _ = session.text(resp.to_string()).await;
                }
                drop(permit);
            });
        }
    }
    true
}
