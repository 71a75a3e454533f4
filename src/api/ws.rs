//! JSON-RPC over the `/rpc/ws` websocket, with live subscriptions.
//!
//! Authentication: an `Authorization: Bearer` header on the upgrade, or (for browsers) a
//! first call `auth {token}`. `subscribe {spaceId}` streams that space's events as
//! notifications `{"method":"event","params":{topic, spaceId, data}}`. Calls run
//! concurrently; each answer carries its request id.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use actix_web::{HttpRequest, HttpResponse, web};
use actix_ws::{AggregatedMessage, Session};
use futures_util::StreamExt;
use rakazo_actors::{DomainError, ErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::{methods, rpc};
use crate::app::App;
use crate::auth::{self, Caller};

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

pub async fn upgrade(
    app: web::Data<App>,
    req: HttpRequest,
    body: web::Payload,
) -> actix_web::Result<HttpResponse> {
    let caller = match super::bearer(&req) {
        Some(token) => Some(
            auth::authenticate(&app.db, &token)
                .await
                .map_err(|_| actix_web::error::ErrorUnauthorized("invalid bearer token"))?,
        ),
        None => None,
    };
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream = stream
        .max_frame_size(rpc::MAX_REQUEST_BYTES)
        .aggregate_continuations()
        .max_continuation_size(rpc::MAX_REQUEST_BYTES);
    actix_web::rt::spawn(run(app.into_inner(), caller, session, stream));
    Ok(response)
}

async fn send(session: &mut Session, value: &Value) -> bool {
    session.text(value.to_string()).await.is_ok()
}

async fn run(
    app: std::sync::Arc<App>,
    caller: Option<Caller>,
    mut session: Session,
    mut stream: actix_ws::AggregatedMessageStream,
) {
    let caller = Rc::new(RefCell::new(caller));
    let spaces: Rc<RefCell<HashSet<String>>> = Rc::default();
    let mut events = app.runtime().events.subscribe();
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(Ok(msg)) = msg else { break };
                match msg {
                    AggregatedMessage::Text(text) => {
                        on_text(&app, &caller, &spaces, &mut session, text.as_bytes()).await;
                    }
                    AggregatedMessage::Ping(bytes) if session.pong(&bytes).await.is_err() => break,
                    AggregatedMessage::Close(_) => break,
                    _ => {}
                }
            }
            event = events.recv() => {
                match event {
                    Ok(event) if spaces.borrow().contains(&event.space_id) => {
                        let note = json!({ "jsonrpc": "2.0", "method": "event", "params": event });
                        if !send(&mut session, &note).await { break; }
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(missed)) => {
                        let note = json!({ "jsonrpc": "2.0", "method": "event.lagged", "params": { "missed": missed } });
                        if !send(&mut session, &note).await { break; }
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        }
    }
    let _ = session.close(None).await;
}

async fn on_text(
    app: &std::sync::Arc<App>,
    caller: &Rc<RefCell<Option<Caller>>>,
    spaces: &Rc<RefCell<HashSet<String>>>,
    session: &mut Session,
    text: &[u8],
) {
    let Ok(env) = serde_json::from_slice::<Envelope>(text) else {
        send(
            session,
            &rpc::protocol_error(Value::Null, -32700, "parse error"),
        )
        .await;
        return;
    };
    let id = env.id.clone().unwrap_or(Value::Null);
    let reply = |outcome: Result<Value, DomainError>| match outcome {
        Ok(v) => rpc::result(id.clone(), v),
        Err(e) => rpc::error(id.clone(), &e),
    };
    if env.method == "auth" {
        let outcome = match methods::params::<AuthParams>(env.params) {
            Ok(p) => auth::authenticate(&app.db, &p.token).await.map(|c| {
                let user = c.user_id.clone();
                *caller.borrow_mut() = Some(c);
                json!({ "userId": user })
            }),
            Err(e) => Err(e),
        };
        send(session, &reply(outcome)).await;
        return;
    }
    let Some(who) = caller.borrow().clone() else {
        send(
            session,
            &reply(Err(DomainError::new(
                ErrorCode::Unauthorized,
                "call auth first",
            ))),
        )
        .await;
        return;
    };
    match env.method.as_str() {
        "subscribe" | "unsubscribe" => {
            let outcome = match methods::params::<SpaceParams>(env.params) {
                Ok(p) => {
                    let ctx = methods::Ctx { app, caller: &who };
                    match super::methods::visible_space(&ctx, &p.space_id).await {
                        Ok(()) => {
                            if env.method == "subscribe" {
                                spaces.borrow_mut().insert(p.space_id.clone());
                            } else {
                                spaces.borrow_mut().remove(&p.space_id);
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
            let (app, mut session) = (app.clone(), session.clone());
            let raw = json!({ "jsonrpc": "2.0", "id": env.id, "method": env.method, "params": env.params });
            actix_web::rt::spawn(async move {
                let ctx = methods::Ctx {
                    app: &app,
                    caller: &who,
                };
                if let (Some(resp), _) = rpc::handle_one(&ctx, raw).await {
                    let _ = session.text(resp.to_string()).await;
                }
            });
        }
    }
}
