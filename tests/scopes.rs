//! Scopes: every RPC method over HTTP, the websocket and MCP against every kind of caller
//! (a table that must name every method), and the attacker's cases: run mutations, control
//! release, minted bot tokens, event subscriptions, the internal endpoint and bounded input.

mod common;

use std::time::Duration;

use common::{Backend, CallResult, TestServer};
use futures_util::{SinkExt, StreamExt};
use rakazo::api::methods::METHODS;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// Who calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    /// No token at all.
    Nobody,
    /// A token that was never issued.
    Garbage,
    /// The operator.
    Operator,
    /// A user of the space (its owner).
    Member,
    /// A user of another space.
    Stranger,
    /// The target bot's own token.
    OwnBot,
    /// Another bot of the same space (a Team bot).
    OtherBot,
    /// A bot of another space, its token minted by the operator.
    ForeignBot,
}

use Who::*;

const EVERYONE: [Who; 8] = [
    Nobody, Garbage, Operator, Member, Stranger, OwnBot, OtherBot, ForeignBot,
];
const PEOPLE: &[Who] = &[Operator, Member];
const OWN: &[Who] = &[Operator, Member, OwnBot];

/// Who gets past authorization, per method. The target is always the space, its private
/// bot, that bot's computer or one of its runs. A method missing here fails the test.
const ROWS: &[(&str, &[Who])] = &[
    ("space.create", &[Operator, Member, Stranger]),
    ("space.list", &[Operator, Member, Stranger]),
    ("space.addMember", PEOPLE),
    ("user.create", &[Operator]),
    ("user.delete", &[Operator]),
    ("space.delete", PEOPLE),
    ("bot.create", PEOPLE),
    ("bot.setComputerMode", PEOPLE),
    ("bot.list", PEOPLE),
    ("bot.stop", OWN),
    ("bot.status", OWN),
    ("token.createForBot", PEOPLE),
    ("computer.get", OWN),
    ("computer.list", PEOPLE),
    ("computer.forBot", OWN),
    ("computer.exec", OWN),
    ("computer.openScreen", OWN),
    ("computer.machine", &[Operator]),
    ("computer.stop", OWN),
    ("computer.revisions", OWN),
    ("computer.restoreRevision", PEOPLE),
    ("computer.delete", PEOPLE),
    ("computer.takeControl", PEOPLE),
    ("computer.screenUrl", OWN),
    ("computer.releaseControl", PEOPLE),
    ("computer.renewControl", PEOPLE),
    ("computer.terminalUrl", PEOPLE),
    ("computer.update", PEOPLE),
    ("computer.recover", PEOPLE),
    ("computer.reset", PEOPLE),
    ("computer.operations", PEOPLE),
    ("computer.releaseInterrupted", &[Operator]),
    ("run.start", OWN),
    ("run.get", OWN),
    ("run.renew", OWN),
    ("run.requestTakeover", OWN),
    ("run.resume", OWN),
    ("run.finish", OWN),
    (
        "tools/list",
        &[Operator, Member, Stranger, OwnBot, OtherBot, ForeignBot],
    ),
    ("tools/call", OWN),
    ("activity.list", OWN),
    ("files.list", OWN),
    ("files.read", OWN),
    ("files.upload", PEOPLE),
    ("activity.timeline", PEOPLE),
    ("activity.verify", PEOPLE),
    ("run.replay", PEOPLE),
    ("run.replayFrame", PEOPLE),
    ("control.replay", PEOPLE),
    ("control.replayFrame", PEOPLE),
];

/// Error codes that mean "refused by authorization".
const DENIALS: &[&str] = &["UNAUTHORIZED", "FORBIDDEN", "NOT_FOUND"];

/// A space owned by a user, with a private bot (the target) and a Team bot, another user
/// with a space and a Team bot, and a token for each.
struct Fixture {
    s: TestServer,
    member: String,
    stranger: String,
    own_bot_token: String,
    other_bot_token: String,
    foreign_bot_token: String,
    space: String,
    bot: String,
    other_bot: String,
    computer: String,
}

fn token_of(v: &Value) -> String {
    v["token"].as_str().unwrap().to_owned()
}

fn id_of(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

impl Fixture {
    async fn new() -> Fixture {
        let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
        let member = token_of(&s.ok("user.create", json!({ "name": "Ada" })).await);
        let stranger = token_of(&s.ok("user.create", json!({ "name": "Bea" })).await);
        let as_ = async |token: &str, method: &str, params: Value| {
            s.call_as(token, method, params.clone())
                .await
                .unwrap_or_else(|e| panic!("{method} {params}: {e:?}"))
        };
        let space = id_of(&as_(&member, "space.create", json!({ "name": "A" })).await);
        let bot = id_of(
            &as_(
                &member,
                "bot.create",
                json!({ "spaceId": space, "name": "mine", "computerMode": "private" }),
            )
            .await,
        );
        let other_bot = id_of(
            &as_(
                &member,
                "bot.create",
                json!({ "spaceId": space, "name": "other", "computerMode": "team" }),
            )
            .await,
        );
        let far = id_of(&as_(&stranger, "space.create", json!({ "name": "B" })).await);
        let foreign_bot = id_of(
            &as_(
                &stranger,
                "bot.create",
                json!({ "spaceId": far, "name": "far", "computerMode": "team" }),
            )
            .await,
        );
        let own_bot_token =
            token_of(&as_(&member, "token.createForBot", json!({ "botId": bot })).await);
        let other_bot_token =
            token_of(&as_(&member, "token.createForBot", json!({ "botId": other_bot })).await);
        // Minted by the operator: still only that bot's scope.
        let foreign_bot_token = token_of(
            &s.ok("token.createForBot", json!({ "botId": foreign_bot }))
                .await,
        );
        let computer = id_of(&as_(&member, "computer.forBot", json!({ "botId": bot })).await);
        // A file and a kept revision.
        let (run, fence) = s.start_run(&bot).await;
        s.exec(&run, fence, "echo hi > notes.txt").await.unwrap();
        s.ok(
            "run.finish",
            json!({ "runId": run, "fence": fence, "outcome": "completed" }),
        )
        .await;
        Fixture {
            s,
            member,
            stranger,
            own_bot_token,
            other_bot_token,
            foreign_bot_token,
            space,
            bot,
            other_bot,
            computer,
        }
    }

    fn token(&self, who: Who) -> Option<String> {
        Some(match who {
            Nobody => return None,
            Garbage => "rkz_never-issued-token".into(),
            Operator => self.s.operator_token.clone(),
            Member => self.member.clone(),
            Stranger => self.stranger.clone(),
            OwnBot => self.own_bot_token.clone(),
            OtherBot => self.other_bot_token.clone(),
            ForeignBot => self.foreign_bot_token.clone(),
        })
    }

    /// A call over `POST /rpc`.
    async fn http(&self, who: Who, method: &str, params: Value) -> CallResult {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let mut req = self.s.http.post(format!("{}/rpc", self.s.base)).json(&body);
        if let Some(token) = self.token(who) {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.expect("json body");
        outcome(status, &v)
    }

    /// A call over a fresh `/rpc/ws` socket, authenticated with `auth {token}` first.
    async fn ws(&self, who: Who, method: &str, params: Value) -> CallResult {
        let mut ws = connect(&self.s).await;
        if let Some(token) = self.token(who) {
            send(&mut ws, json!({ "jsonrpc": "2.0", "id": 1, "method": "auth", "params": { "token": token } })).await;
            reply(&mut ws, 1).await;
        }
        send(
            &mut ws,
            json!({ "jsonrpc": "2.0", "id": 2, "method": method, "params": params }),
        )
        .await;
        let v = reply(&mut ws, 2).await;
        outcome(0, &v)
    }

    /// As the operator, expected to succeed.
    async fn op(&self, method: &str, params: Value) -> Value {
        self.s.ok(method, params).await
    }

    /// A fresh run of the target bot, started by the operator: (run id, fence).
    /// A control session's screen recording of the target bot: its id and first frame.
    async fn control_recording(&self) -> (String, String) {
        use rakazo::recordings::control::{self, ControlRecorder};
        use rakazo_web_proxy::{ControlSession, SessionStart, SocketKind};
        let (run, fence) = self.fresh_run().await;
        self.op(
            "tools/call",
            json!({ "runId": run, "fence": fence, "name": "computer_observe", "arguments": {} }),
        )
        .await;
        let app = &self.s.app;
        let recorder = ControlRecorder::new(
            app.db.clone(),
            app.registry.clone(),
            app.recorder.clone(),
            Duration::from_millis(20),
        );
        let id = uuid::Uuid::new_v4().simple().to_string();
        recorder.started(SessionStart {
            id: id.clone(),
            computer_id: self.computer.clone(),
            bot_id: self.bot.clone(),
            fence: 1,
            socket: SocketKind::Screen,
            started_at_ms: 0,
        });
        let recorded = recorder
            .ended(&ControlSession {
                id,
                computer_id: self.computer.clone(),
                bot_id: self.bot.clone(),
                fence: 1,
                socket: SocketKind::Screen,
                started_at_ms: 0,
                ended_at_ms: 1,
                inputs: Default::default(),
                counted: true,
                closed_by: "client".into(),
            })
            .await
            .expect("recorded");
        let id = recorded["id"].as_str().unwrap().to_owned();
        let replay = control::replay(&app.db, &id).await.unwrap();
        let digest = replay["frames"][0]["digest"].as_str().unwrap().to_owned();
        (id, digest)
    }

    async fn fresh_run(&self) -> (String, i64) {
        self.op("bot.stop", json!({ "botId": self.bot })).await;
        self.s.start_run(&self.bot).await
    }

    /// The target bot's control, held by `who` when it is a person (else by the member):
    /// its fence.
    async fn control_for(&self, who: Who) -> i64 {
        let status = self.op("bot.status", json!({ "botId": self.bot })).await;
        if let Some(fence) = status["control"]["fence"].as_i64() {
            self.op(
                "computer.releaseControl",
                json!({ "botId": self.bot, "fence": fence }),
            )
            .await;
        }
        let holder = if PEOPLE.contains(&who) { who } else { Member };
        let token = self.token(holder).unwrap();
        let grant = self
            .s
            .call_as(&token, "computer.takeControl", json!({ "botId": self.bot }))
            .await
            .unwrap();
        grant["fence"].as_i64().unwrap()
    }

    /// Parameters for a method aimed at the target, prepared so an admitted caller gets
    /// through (state is made fresh where the method consumes it).
    async fn params(&self, method: &str, who: Who) -> Value {
        let bot = json!({ "botId": self.bot });
        let computer = json!({ "computerId": self.computer });
        match method {
            "space.create" => json!({ "name": "New" }),
            "space.list" | "tools/list" => json!({}),
            "space.addMember" => {
                let user = self.op("user.create", json!({ "name": "Cy" })).await;
                json!({ "spaceId": self.space, "userId": user["id"] })
            }
            "user.create" => json!({ "name": "Dee" }),
            "user.delete" => {
                let user = self.op("user.create", json!({ "name": "Eve" })).await;
                json!({ "userId": user["id"] })
            }
            "space.delete" => {
                // A space of the member's own (the target space stays for the other rows).
                let made = self
                    .s
                    .call_as(&self.member, "space.create", json!({ "name": "Gone" }))
                    .await
                    .unwrap();
                json!({ "spaceId": made["id"] })
            }
            // Its own mode: gets past authorization without moving the bot.
            "bot.setComputerMode" => json!({ "botId": self.bot, "computerMode": "private" }),
            "bot.create" => json!({ "spaceId": self.space, "name": "new" }),
            "bot.list" | "computer.list" => json!({ "spaceId": self.space }),
            "bot.stop"
            | "bot.status"
            | "token.createForBot"
            | "computer.forBot"
            | "computer.takeControl"
            | "computer.screenUrl"
            | "computer.terminalUrl"
            | "activity.list" => bot,
            "computer.get" | "computer.machine" | "computer.stop" | "computer.revisions" => {
                computer
            }
            "computer.restoreRevision" => {
                let kept = self.op("computer.revisions", computer).await;
                json!({ "computerId": self.computer, "revision": kept[0]["revision"] })
            }
            "computer.delete" => {
                let b = self
                    .op(
                        "bot.create",
                        json!({ "spaceId": self.space, "name": "gone", "computerMode": "private" }),
                    )
                    .await;
                let c = self
                    .op("computer.forBot", json!({ "botId": b["id"] }))
                    .await;
                json!({ "computerId": c["id"] })
            }
            "computer.update" | "computer.recover" | "computer.reset" => {
                // A computer of its own: the operation replaces its machine.
                let b = self
                    .op(
                        "bot.create",
                        json!({ "spaceId": self.space, "name": "kept", "computerMode": "private" }),
                    )
                    .await;
                let c = self
                    .op("computer.forBot", json!({ "botId": b["id"] }))
                    .await;
                json!({ "computerId": c["id"] })
            }
            "computer.operations" => json!({ "spaceId": self.space }),
            "computer.releaseInterrupted" => {
                // An operation in a space the server owner owns; without the assertion the
                // owner gets past authorization and is refused with INVALID_PARAMS.
                let space = self.op("space.create", json!({ "name": "Ops" })).await;
                let b = self
                    .op(
                        "bot.create",
                        json!({ "spaceId": space["id"], "name": "ops", "computerMode": "private" }),
                    )
                    .await;
                let c = self
                    .op("computer.forBot", json!({ "botId": b["id"] }))
                    .await;
                let queued = self
                    .op("computer.reset", json!({ "computerId": c["id"] }))
                    .await;
                json!({ "id": queued["id"], "workersStopped": false })
            }
            "computer.releaseControl" | "computer.renewControl" => {
                json!({ "botId": self.bot, "fence": self.control_for(who).await })
            }
            "computer.exec" => {
                let (run, fence) = self.fresh_run().await;
                json!({ "runId": run, "fence": fence, "command": "true" })
            }
            "tools/call" => {
                let (run, fence) = self.fresh_run().await;
                json!({ "runId": run, "fence": fence, "name": "shell",
                        "arguments": { "command": "true" } })
            }
            "computer.openScreen" | "run.renew" | "run.requestTakeover" => {
                let (run, fence) = self.fresh_run().await;
                json!({ "runId": run, "fence": fence })
            }
            "run.finish" => {
                let (run, fence) = self.fresh_run().await;
                json!({ "runId": run, "fence": fence, "outcome": "completed" })
            }
            "run.resume" => {
                let (run, fence) = self.fresh_run().await;
                let p = json!({ "runId": run, "fence": fence });
                self.op("run.requestTakeover", p.clone()).await;
                p
            }
            "run.get" | "run.replay" => json!({ "runId": self.fresh_run().await.0 }),
            "activity.timeline" | "activity.verify" => computer,
            "control.replay" => json!({ "recordingId": self.control_recording().await.0 }),
            "control.replayFrame" => {
                let (id, digest) = self.control_recording().await;
                json!({ "recordingId": id, "digest": digest })
            }
            "run.replayFrame" => {
                let (run, fence) = self.fresh_run().await;
                let observed = self
                    .op(
                        "tools/call",
                        json!({ "runId": run, "fence": fence, "name": "computer_observe", "arguments": {} }),
                    )
                    .await;
                json!({ "runId": run, "digest": observed["structuredContent"]["frameDigest"] })
            }
            "run.start" => {
                self.op("bot.stop", bot.clone()).await;
                bot
            }
            "files.list" => json!({ "botId": self.bot, "path": "" }),
            "files.read" => json!({ "botId": self.bot, "path": "notes.txt" }),
            "files.upload" => {
                self.fresh_run().await;
                self.control_for(who).await;
                json!({ "botId": self.bot, "name": "up.txt", "contentBase64": "aGk=" })
            }
            other => panic!("no parameters for `{other}`"),
        }
    }
}

fn outcome(status: u16, v: &Value) -> CallResult {
    match v.get("error") {
        Some(e) => Err((
            status,
            e["data"]["code"].as_str().unwrap_or_default().to_owned(),
            e["message"].as_str().unwrap_or_default().to_owned(),
        )),
        None => Ok(v["result"].clone()),
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(s: &TestServer) -> Socket {
    let url = format!("{}/rpc/ws", s.base.replace("http://", "ws://"));
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

async fn send(ws: &mut Socket, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// The next text message, or `None` when the socket ends or nothing arrives in `wait`.
async fn next_text(ws: &mut Socket, wait: Duration) -> Option<Value> {
    loop {
        match tokio::time::timeout(wait, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return Some(serde_json::from_str(&t).unwrap()),
            Ok(Some(Ok(Message::Close(_)))) | Ok(Some(Err(_))) | Ok(None) | Err(_) => {
                return None;
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

/// The answer with this id (events in between are skipped).
async fn reply(ws: &mut Socket, id: i64) -> Value {
    loop {
        let v = next_text(ws, Duration::from_secs(20))
            .await
            .expect("an answer");
        if v["id"] == id {
            return v;
        }
    }
}

/// Check one cell; a message when it is wrong.
fn judge(
    method: &str,
    who: Who,
    transport: &str,
    allowed: bool,
    got: &CallResult,
) -> Option<String> {
    let code = got.as_ref().err().map(|e| e.1.as_str());
    let wrong = match (allowed, code) {
        (true, None) => false,
        (true, Some(code)) => DENIALS.contains(&code),
        (false, None) => true,
        (false, Some(code)) if matches!(who, Nobody | Garbage) => code != "UNAUTHORIZED",
        (false, Some(code)) => !DENIALS.contains(&code) || code == "UNAUTHORIZED",
    };
    wrong.then(|| {
        format!(
            "{method} as {who:?} over {transport}: expected {}, got {got:?}",
            if allowed { "allow" } else { "deny" }
        )
    })
}

#[actix_rt::test]
async fn the_table_names_every_method_and_nothing_else() {
    for m in METHODS {
        assert!(
            ROWS.iter().any(|(name, _)| *name == m.name),
            "`{}` has no row in the scopes table",
            m.name
        );
    }
    for (name, _) in ROWS {
        assert!(
            METHODS.iter().any(|m| m.name == *name),
            "the scopes table names `{name}`, which is no method"
        );
    }
}

#[actix_rt::test]
async fn every_method_admits_exactly_its_scopes_over_http_and_websocket() {
    let mut wrong = Vec::new();
    for m in METHODS {
        let allowed = ROWS
            .iter()
            .find(|(name, _)| *name == m.name)
            .unwrap_or_else(|| panic!("`{}` has no row in the scopes table", m.name))
            .1;
        // One fixture per method: what one method changes does not leak into another's row.
        let f = Fixture::new().await;
        for who in EVERYONE {
            let admitted = allowed.contains(&who);
            let p = f.params(m.name, who).await;
            let got = f.http(who, m.name, p).await;
            if let Some(why) = judge(m.name, who, "http", admitted, &got) {
                wrong.push(why);
            }
            if matches!(who, Nobody | Garbage) && got.as_ref().err().map(|e| e.0) != Some(401) {
                wrong.push(format!("{} as {who:?}: HTTP status {got:?}", m.name));
            }
            let p = f.params(m.name, who).await;
            let got = f.ws(who, m.name, p).await;
            if let Some(why) = judge(m.name, who, "websocket", admitted, &got) {
                wrong.push(why);
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `POST /mcp` with a token and an optional session.
async fn mcp(
    s: &TestServer,
    token: Option<&str>,
    session: Option<&str>,
    method: &str,
    params: Value,
) -> (u16, Option<String>, Value) {
    common::mcp::request(&s.http, &s.base, token, session, method, params).await
}

#[actix_rt::test]
async fn mcp_serves_bot_tokens_only_and_only_the_tools() {
    let f = Fixture::new().await;
    let s = &f.s;
    let mut wrong = Vec::new();
    for who in EVERYONE {
        let token = f.token(who);
        let (status, session, body) = mcp(
            s,
            token.as_deref(),
            None,
            "initialize",
            json!({ "protocolVersion": "2025-06-18" }),
        )
        .await;
        let expected = match who {
            Nobody | Garbage => 401,
            Operator | Member | Stranger => 403,
            OwnBot | OtherBot | ForeignBot => 200,
        };
        if status != expected {
            wrong.push(format!("initialize as {who:?}: {status} {body}"));
            continue;
        }
        let Some(session) = session else {
            // Refused callers get no session; every RPC method is refused the same way.
            for m in METHODS {
                let (status, _, _) = mcp(s, token.as_deref(), None, m.name, json!({})).await;
                if status != expected {
                    wrong.push(format!("{} over MCP as {who:?}: {status}", m.name));
                }
            }
            continue;
        };
        // The session serves the MCP tools; no other RPC method is reachable through it.
        for m in METHODS {
            let params = match m.name {
                "tools/call" => json!({ "name": "shell", "arguments": { "command": "true" } }),
                _ => json!({}),
            };
            let (status, _, body) = mcp(s, token.as_deref(), Some(&session), m.name, params).await;
            let served = matches!(m.name, "tools/list" | "tools/call");
            let ok = status == 200
                && if served {
                    body.get("result").is_some()
                } else {
                    body["error"]["data"]["code"] == "METHOD_NOT_FOUND"
                        && body["error"]["code"] == -32601
                };
            if !ok {
                wrong.push(format!("{} over MCP as {who:?}: {status} {body}", m.name));
            }
        }
        // Another token cannot use this session.
        let thief = if who == OwnBot { OtherBot } else { OwnBot };
        let (status, _, _) = mcp(
            s,
            f.token(thief).as_deref(),
            Some(&session),
            "tools/list",
            json!({}),
        )
        .await;
        if status != 404 {
            wrong.push(format!("{thief:?} used {who:?}'s MCP session: {status}"));
        }
        let resp = s
            .http
            .delete(format!("{}/mcp", s.base))
            .bearer_auth(token.unwrap())
            .header("mcp-session-id", &session)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 204);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[actix_rt::test]
async fn subscriptions_follow_the_scope() {
    let f = Fixture::new().await;
    let mut wrong = Vec::new();
    for who in EVERYONE {
        let mut ws = connect(&f.s).await;
        if let Some(token) = f.token(who) {
            send(&mut ws, json!({ "jsonrpc": "2.0", "id": 1, "method": "auth", "params": { "token": token } })).await;
            reply(&mut ws, 1).await;
        }
        send(&mut ws, json!({ "jsonrpc": "2.0", "id": 2, "method": "subscribe", "params": { "spaceId": f.space } })).await;
        let got = outcome(0, &reply(&mut ws, 2).await);
        let admitted = matches!(who, Operator | Member | OwnBot | OtherBot);
        if let Some(why) = judge("subscribe", who, "websocket", admitted, &got) {
            wrong.push(why);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[actix_rt::test]
async fn a_bot_token_hears_only_its_own_bot() {
    let f = Fixture::new().await;
    let s = &f.s;
    let mut bot_ws = connect(s).await;
    let mut member_ws = connect(s).await;
    for (ws, token) in [(&mut bot_ws, &f.own_bot_token), (&mut member_ws, &f.member)] {
        send(
            ws,
            json!({ "jsonrpc": "2.0", "id": 1, "method": "auth", "params": { "token": token } }),
        )
        .await;
        reply(ws, 1).await;
        send(ws, json!({ "jsonrpc": "2.0", "id": 2, "method": "subscribe", "params": { "spaceId": f.space } })).await;
        assert!(reply(ws, 2).await.get("result").is_some());
    }
    // The other bot (on the Team Computer) runs a command with a secret in its output, then
    // the bot itself runs one.
    let (run, fence) = s.start_run(&f.other_bot).await;
    s.exec(&run, fence, "echo other-bot-secret").await.unwrap();
    s.ok(
        "run.finish",
        json!({ "runId": run, "fence": fence, "outcome": "completed" }),
    )
    .await;
    let (run, fence) = s.start_run(&f.bot).await;
    s.exec(&run, fence, "echo mine").await.unwrap();
    let mut heard = Vec::new();
    loop {
        let v = next_text(&mut bot_ws, Duration::from_secs(20))
            .await
            .expect("the bot's own command event");
        let mine = v["params"]["topic"] == "computer.command"
            && v["params"]["data"]["botId"] == f.bot.as_str();
        heard.push(v);
        if mine {
            break;
        }
    }
    for v in &heard {
        assert!(
            !v.to_string().contains(&f.other_bot) && !v.to_string().contains("other-bot-secret"),
            "a bot token heard another bot: {v}"
        );
    }
    // The member hears both.
    let mut other = false;
    while !other {
        let v = next_text(&mut member_ws, Duration::from_secs(20))
            .await
            .expect("the other bot's events reach the member");
        other = v["params"]["topic"] == "computer.command"
            && v["params"]["data"]["botId"] == f.other_bot.as_str();
    }
}

#[actix_rt::test]
async fn a_bot_token_minted_by_the_operator_is_no_operator() {
    let f = Fixture::new().await;
    let s = &f.s;
    let minted = token_of(
        &s.ok("token.createForBot", json!({ "botId": f.other_bot }))
            .await,
    );
    for (method, params) in [
        ("user.create", json!({ "name": "evil" })),
        ("computer.machine", json!({ "computerId": f.computer })),
        ("space.list", json!({})),
        ("computer.list", json!({ "spaceId": f.space })),
        ("bot.list", json!({ "spaceId": f.space })),
        ("token.createForBot", json!({ "botId": f.other_bot })),
        ("computer.get", json!({ "computerId": f.computer })),
    ] {
        let err = s.call_as(&minted, method, params).await.unwrap_err();
        assert!(
            ["FORBIDDEN", "NOT_FOUND"].contains(&err.1.as_str()),
            "{method}: {err:?}"
        );
    }
    // Its own Team Computer: visible without the home key, and not to be stopped by one bot.
    let team = s
        .call_as(&minted, "computer.forBot", json!({ "botId": f.other_bot }))
        .await
        .unwrap();
    assert!(team.get("homeKey").is_none() && team.get("providerRef").is_none());
    let err = s
        .call_as(
            &minted,
            "computer.stop",
            json!({ "computerId": team["id"] }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.1, "FORBIDDEN");
    // The internal endpoint takes none of the API tokens.
    for token in [&minted, &s.operator_token, &f.member] {
        let resp = s
            .http
            .post(format!("{}/internal/screen-authority", s.base))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
    }
    let resp = s
        .http
        .post(format!("{}/internal/screen-authority", s.base))
        .bearer_auth(&s.app.internal_token.0)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        400,
        "the credential passes; the body is wrong"
    );
}

#[actix_rt::test]
async fn run_mutations_check_access() {
    let f = Fixture::new().await;
    let s = &f.s;
    let (run, fence) = s.start_run(&f.bot).await;
    let p = json!({ "runId": run, "fence": fence });
    for who in [Stranger, OtherBot, ForeignBot] {
        for method in ["run.requestTakeover", "run.resume"] {
            let err = f.http(who, method, p.clone()).await.unwrap_err();
            assert!(
                ["FORBIDDEN", "NOT_FOUND"].contains(&err.1.as_str()),
                "{method} as {who:?}: {err:?}"
            );
        }
    }
    let r = s.ok("run.get", json!({ "runId": run })).await;
    assert!(
        r["takeoverRequestedAtMs"].is_null(),
        "the run was not moved: {r}"
    );
    // The bot itself asks for a person, and resumes.
    f.http(OwnBot, "run.requestTakeover", p.clone())
        .await
        .unwrap();
    f.http(OwnBot, "run.resume", p).await.unwrap();
}

#[actix_rt::test]
async fn control_is_released_only_by_its_holder_or_an_operator() {
    let f = Fixture::new().await;
    let s = &f.s;
    let colleague = s.member_token(&f.space).await;
    let fence = f.control_for(Member).await;
    let release = json!({ "botId": f.bot, "fence": fence });
    let err = s
        .call_as(&colleague, "computer.releaseControl", release.clone())
        .await
        .unwrap_err();
    assert_eq!(err.1, "CONTROL_HELD");
    let status = s.ok("bot.status", json!({ "botId": f.bot })).await;
    assert_eq!(status["control"]["fence"], fence, "control still held");
    s.call_as(&f.member, "computer.releaseControl", release)
        .await
        .unwrap();
    // An operator may end anyone's control.
    let fence = f.control_for(Member).await;
    s.ok(
        "computer.releaseControl",
        json!({ "botId": f.bot, "fence": fence }),
    )
    .await;
}

/// Send a request head and part of a large body over raw TCP; the status line of the answer.
async fn status_after_partial_body(s: &TestServer, path: &str, bearer: Option<&str>) -> String {
    let addr = s.base.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
        20 * 1024 * 1024
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&vec![b' '; 64 * 1024]).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("answered before the body was sent")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[actix_rt::test]
async fn unauthenticated_bodies_are_refused_before_they_are_read() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    for path in ["/rpc", "/mcp", "/internal/screen-authority"] {
        for bearer in [None, Some("rkz_garbage")] {
            let line = status_after_partial_body(&s, path, bearer).await;
            assert!(line.contains(" 401 "), "{path} {bearer:?}: {line}");
        }
    }
    // The operator's token passes the check; an API token is still refused internally.
    let line =
        status_after_partial_body(&s, "/internal/screen-authority", Some(&s.operator_token)).await;
    assert!(line.contains(" 401 "), "{line}");
}

#[actix_rt::test]
async fn batches_are_bounded() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let batch = |n: usize| -> Value {
        Value::Array(
            (0..n)
                .map(|i| json!({ "jsonrpc": "2.0", "id": i, "method": "space.list" }))
                .collect(),
        )
    };
    let post = async |body: Value| {
        let resp = s
            .http
            .post(format!("{}/rpc", s.base))
            .bearer_auth(&s.operator_token)
            .json(&body)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    };
    let max = rakazo::api::rpc::MAX_BATCH;
    let (status, body) = post(batch(max)).await;
    assert_eq!((status, body.as_array().map(Vec::len)), (200, Some(max)));
    let (status, body) = post(batch(max + 1)).await;
    assert_eq!(status, 413);
    assert_eq!(body["error"]["data"]["code"], "TOO_LARGE");
}

#[actix_rt::test]
async fn unauthenticated_sockets_are_closed() {
    let f = Fixture::new().await;
    let s = &f.s;
    // Silent: closed after the authentication window.
    let mut ws = connect(s).await;
    let started = std::time::Instant::now();
    assert!(next_text(&mut ws, Duration::from_secs(15)).await.is_none());
    assert!(started.elapsed() < Duration::from_secs(10));
    // Talking without authenticating: a few answers, then closed; never subscribed.
    let mut ws = connect(s).await;
    for id in 1..=3 {
        send(&mut ws, json!({ "jsonrpc": "2.0", "id": id, "method": "subscribe", "params": { "spaceId": f.space } })).await;
        assert_eq!(
            reply(&mut ws, id).await["error"]["data"]["code"],
            "UNAUTHORIZED"
        );
    }
    send(
        &mut ws,
        json!({ "jsonrpc": "2.0", "id": 4, "method": "space.list" }),
    )
    .await;
    assert!(next_text(&mut ws, Duration::from_secs(5)).await.is_none());
    // Authenticated in time: stays open past the window.
    let mut ws = connect(s).await;
    send(
        &mut ws,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "auth", "params": { "token": f.member } }),
    )
    .await;
    reply(&mut ws, 1).await;
    tokio::time::sleep(rakazo::api::ws::AUTH_WINDOW + Duration::from_secs(1)).await;
    send(
        &mut ws,
        json!({ "jsonrpc": "2.0", "id": 2, "method": "space.list" }),
    )
    .await;
    assert!(reply(&mut ws, 2).await.get("result").is_some());
}

#[actix_rt::test]
async fn names_with_control_characters_are_refused() {
    let f = Fixture::new().await;
    let s = &f.s;
    for name in ["a\u{0}b", "line\nbreak", "bell\u{7}", "esc\u{1b}[2J"] {
        for (method, params) in [
            ("space.create", json!({ "name": name })),
            ("user.create", json!({ "name": name })),
            ("bot.create", json!({ "spaceId": f.space, "name": name })),
        ] {
            let err = s.call(method, params).await.unwrap_err();
            assert_eq!(err.1, "INVALID_PARAMS", "{method} {name:?}");
        }
        f.fresh_run().await;
        f.control_for(Operator).await;
        let err = s
            .call(
                "files.upload",
                json!({ "botId": f.bot, "name": name, "contentBase64": "aGk=" }),
            )
            .await
            .unwrap_err();
        assert_eq!(err.1, "PATH_REJECTED", "upload {name:?}");
        let (run, fence) = f.fresh_run().await;
        let out = s
            .ok(
                "tools/call",
                json!({ "runId": run, "fence": fence, "name": "write_file",
                        "arguments": { "path": name, "content": "x" } }),
            )
            .await;
        assert_eq!(out["isError"], true, "write_file {name:?}: {out}");
    }
}

#[actix_rt::test]
async fn one_socket_runs_a_bounded_number_of_calls_at_once() {
    let s = TestServer::start(Backend::Sqlite, &[]).await.unwrap();
    let n = rakazo::api::ws::MAX_TASKS + 1;
    let (_, bots) = s.space_with_bots(n, "team").await;
    let mut runs = Vec::new();
    for bot in &bots {
        runs.push(s.start_run(bot).await);
    }
    let mut ws = connect(&s).await;
    send(&mut ws, json!({ "jsonrpc": "2.0", "id": 0, "method": "auth", "params": { "token": s.operator_token } })).await;
    reply(&mut ws, 0).await;
    let started = std::time::Instant::now();
    for (i, (run, fence)) in runs.iter().enumerate() {
        send(
            &mut ws,
            json!({ "jsonrpc": "2.0", "id": i + 1, "method": "computer.exec",
                              "params": { "runId": run, "fence": fence, "command": "sleep 1" } }),
        )
        .await;
    }
    for _ in 0..n {
        let v = next_text(&mut ws, Duration::from_secs(20))
            .await
            .expect("every call is answered");
        assert!(v.get("result").is_some(), "{v}");
    }
    // The call beyond the bound waited for one of the first to finish.
    assert!(started.elapsed() >= Duration::from_secs(2));
}
