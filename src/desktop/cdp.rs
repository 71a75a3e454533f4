//! A minimal DevTools-protocol client for the bot's visible Chromium (bound to loopback): the
//! page-browser tools talk to the active tab through it, in an isolated script world so the
//! page cannot see or tamper with what they do.

use std::path::Path;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::DesktopError;
use super::cdp_tab::{PageDialog, Tab, answers_with_dialog};

/// How long a fresh browser gets to publish its DevTools endpoint.
const ENDPOINT_WAIT: Duration = Duration::from_secs(10);
/// Largest `DevToolsActivePort` read (a port and a path).
const ENDPOINT_FILE_CAP: u64 = 4096;
/// Largest DevTools message taken (a snapshot's answer is far smaller: its text and elements
/// are bounded by the script).
pub const MAX_MESSAGE: usize = 8 << 20;
/// How long one DevTools command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a tab gets to say whether it is on the screen (a busy background page must not
/// hold up finding the one that is).
const VISIBLE_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a tab gets to take the page domain. A tab whose dialog opened before this
/// connection attached never does while the dialog is open, and nothing says so.
const ENABLE_TIMEOUT: Duration = Duration::from_secs(5);
/// What [`Cdp::evaluate_at`] says when a frame's world is gone: nothing ran.
pub const FRAME_GONE: &str = "the frame's document is gone";
/// How long the announcement of a frame's session is waited for, once the tab attaches its
/// frames.
const FRAME_ATTACH_WAIT: Duration = Duration::from_secs(2);

/// A byte stream to the DevTools endpoint: loopback TCP, or a unix socket bridged to it.
pub trait DevToolsStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> DevToolsStream for T {}

type Socket = tokio_tungstenite::WebSocketStream<Box<dyn DevToolsStream>>;

fn err(msg: impl Into<String>) -> DesktopError {
    DesktopError::Browser(msg.into())
}

/// The loopback port and browser path of a `DevToolsActivePort` file's text (its first two
/// lines); `None` unless the port is a number and the path a plain `/devtools/browser/...`
/// path (the file is in the workspace: the bot can write anything there).
pub fn parse_endpoint(text: &str) -> Option<(u16, String)> {
    let mut lines = text.lines();
    let port: u16 = lines.next()?.trim().parse().ok()?;
    let path = lines.next()?.trim();
    let plain = path.starts_with("/devtools/browser/")
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_".contains(&b));
    plain.then(|| (port, path.to_owned()))
}

/// One browser-level DevTools connection, attached to the active tab.
///
/// The isolated world of the tab's document is made once per document and kept until the
/// tab reports a new top-level document (`Page.frameNavigated`, a page restored from the
/// back-forward cache included). Events come in order with the answers, so an event sent
/// before a command is read before that command's answer; what happened while nobody read
/// (between two page commands) is read by one `Page.getFrameTree` before the world is used
/// again. Context ids are reused across renderer processes, so a world id is never sent
/// before that read: after a navigation to another process, an old id could name a context
/// of the new page. A world that is gone anyway (a renderer that went away) is made again and
/// the evaluation sent again: it never ran. A navigation is awaited by reading the tab's
/// events until its document has loaded. A JavaScript dialog the tab shows is kept from its
/// events too: while it is open, a command the page must answer is refused at once rather
/// than left waiting for the dialog's answer.
pub struct Cdp {
    socket: Socket,
    next_id: u64,
    session: String,
    /// What is known of the attached tab.
    tab: Tab,
}

/// Whether a DevTools error says the execution context asked for does not exist (its
/// document went away): the expression did not run.
fn context_gone(e: &DesktopError) -> bool {
    matches!(e, DesktopError::Browser(msg) if msg.contains("Cannot find context with specified id"))
}

impl Cdp {
    /// Where the browser of `bot_id` in `home` listens: its loopback port and browser path
    /// (from its profile's `DevToolsActivePort`, which a browser that has just started may
    /// not have written yet: it gets a little time). The file is in the workspace, so it is
    /// read beneath the home, never through a link, and at most 4 KiB of it.
    pub async fn endpoint(home: &Path, bot_id: &str) -> Result<(u16, String), DesktopError> {
        let rel = format!(
            "{}/{bot_id}/DevToolsActivePort",
            crate::stores::archive::PROFILES_DIR
        );
        let deadline = tokio::time::Instant::now() + ENDPOINT_WAIT;
        let read = || {
            let (home, rel) = (home.to_path_buf(), rel.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    crate::providers::beneath::Beneath::open(&home)?.read(&rel, ENDPOINT_FILE_CAP)
                })
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|bytes| String::from_utf8(bytes).ok())
            }
        };
        let text = loop {
            match read().await {
                Some(text) if text.lines().count() >= 2 => break text,
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(err("the browser has no DevTools endpoint yet"));
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        parse_endpoint(&text).ok_or_else(|| err("bad DevToolsActivePort"))
    }

    /// Connect over this host's loopback and attach to the active tab.
    pub async fn connect(home: &Path, bot_id: &str) -> Result<Cdp, DesktopError> {
        let (port, path) = Self::endpoint(home, bot_id).await?;
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| err(format!("DevTools: {e}")))?;
        Self::over(Box::new(stream), port, &path).await
    }

    /// Speak DevTools over `stream` (already connected to the browser's port `port`) and
    /// attach to the active tab.
    pub async fn over(
        stream: Box<dyn DevToolsStream>,
        port: u16,
        path: &str,
    ) -> Result<Cdp, DesktopError> {
        let url = format!("ws://127.0.0.1:{port}{path}");
        // The browser is the bot's: what it answers is bounded like any input.
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (socket, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(config))
            .await
            .map_err(|e| err(format!("DevTools: {e}")))?;
        let mut cdp = Cdp {
            socket,
            next_id: 0,
            session: String::new(),
            tab: Tab::default(),
        };
        cdp.attach_visible().await?;
        Ok(cdp)
    }

    /// Attaches to the tab on the screen: the first page whose document is visible, asked in
    /// each tab's isolated world (a page cannot fake its answer there), or the first page when
    /// none is (a minimized window). Target order is no guide: Chromium lists background tabs
    /// first or last as it likes, and input sent to a background tab is lost.
    async fn attach_visible(&mut self) -> Result<(), DesktopError> {
        let targets = self.call_browser("Target.getTargets", json!({})).await?;
        let pages: Vec<String> = targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "page")
            .filter_map(|t| t["targetId"].as_str().map(str::to_owned))
            .collect();
        let first = pages
            .first()
            .cloned()
            .ok_or_else(|| err("the browser has no open tab"))?;
        for page in &pages {
            self.attach(page).await?;
            // A tab showing a dialog is in front: a background tab's dialog waits until its
            // tab is shown.
            if matches!(
                self.visible().await,
                Ok(true) | Err(DesktopError::DialogOpen(_))
            ) {
                return Ok(());
            }
            self.detach().await;
        }
        self.attach(&first).await
    }

    async fn attach(&mut self, target: &str) -> Result<(), DesktopError> {
        let attached = self
            .call_browser(
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await?;
        self.session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| err("attach failed"))?
            .to_owned();
        self.tab = Tab::default();
        let session = self.session.clone();
        match self
            .send(Some(&session), "Page.enable", json!({}), ENABLE_TIMEOUT)
            .await
        {
            Err(DesktopError::Browser(msg)) if msg.ends_with("timed out") => Err(err(
                "the tab does not answer: a dialog it showed before the page tools attached \
                 (answer it on the screen: computer_act, key Return or Escape), or a page busy \
                 running script",
            )),
            other => other.map(|_| ()),
        }
    }

    /// Leaves the attached tab (best effort: a closed tab has no session to leave).
    async fn detach(&mut self) {
        let session = std::mem::take(&mut self.session);
        self.tab = Tab::default();
        let _ = self
            .call_browser("Target.detachFromTarget", json!({ "sessionId": session }))
            .await;
    }

    /// Whether the attached tab's document is the one on the screen.
    async fn visible(&mut self) -> Result<bool, DesktopError> {
        let probe = self.evaluate("document.visibilityState");
        match tokio::time::timeout(VISIBLE_PROBE_TIMEOUT, probe).await {
            Ok(state) => Ok(state? == "visible"),
            Err(_) => Ok(false),
        }
    }

    /// Follows the screen: when the attached tab is no longer the one shown (the bot switched
    /// tabs or opened a new one), attaches to the one that is. Starts every page command.
    /// A tab with a dialog open stays attached: it is the one in front, and the dialog is
    /// looked at again first (a person may have answered it on the screen).
    pub async fn follow_screen(&mut self) -> Result<(), DesktopError> {
        self.tab.caught_up = false;
        if self.tab.dialog.is_some() {
            // Answered with a dialog open, after every event sent before it; a tab that is
            // gone (closed with its dialog) has no dialog left.
            if self
                .call("Page.getNavigationHistory", json!({}))
                .await
                .is_err()
            {
                self.tab.dialog = None;
            }
            if self.tab.dialog.is_some() {
                return Ok(());
            }
        }
        if matches!(
            self.visible().await,
            Ok(true) | Err(DesktopError::DialogOpen(_))
        ) {
            return Ok(());
        }
        self.detach().await;
        self.attach_visible().await
    }

    /// Notes that the tab's dialog was answered: closed, though its closing event may come
    /// later (the page resumes only after the answer, so a dialog it opens next is announced
    /// after the answer too).
    pub fn dialog_answered(&mut self) {
        self.tab.dialog = None;
    }

    /// The dialog open on the attached tab, as far as its events have been read.
    pub fn dialog(&self) -> Option<&PageDialog> {
        self.tab.dialog.as_ref()
    }

    /// Sends `method` and waits up to `within` for its answer. A command the page must answer
    /// is refused while the tab has a dialog open, and stops waiting when one opens (its
    /// answer would wait for the dialog's): the dialog's refusal.
    async fn send(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        within: Duration,
    ) -> Result<Value, DesktopError> {
        let waits_on_page = session.is_some() && !answers_with_dialog(method);
        if waits_on_page && let Some(dialog) = &self.tab.dialog {
            return Err(dialog.refusal());
        }
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.socket
            .send(Message::Text(msg.to_string().into()))
            .await
            .map_err(|e| err(e.to_string()))?;
        let wait = async {
            loop {
                let v = self.next_message().await?;
                if v["id"].as_u64() == Some(id) {
                    if let Some(e) = v.get("error") {
                        return Err(err(format!(
                            "{method}: {}",
                            e["message"].as_str().unwrap_or("failed")
                        )));
                    }
                    return Ok(v["result"].clone());
                }
                if waits_on_page && let Some(dialog) = &self.tab.dialog {
                    return Err(dialog.refusal());
                }
            }
        };
        tokio::time::timeout(within, wait)
            .await
            .map_err(|_| err(format!("{method} timed out")))?
    }

    /// The next message of the connection, its events noted (see [`Self::note`]).
    async fn next_message(&mut self) -> Result<Value, DesktopError> {
        while let Some(frame) = self.socket.next().await {
            let Ok(Message::Text(text)) = frame else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            self.note(&v);
            return Ok(v);
        }
        Err(err("the DevTools connection closed"))
    }

    /// Keeps up with the attached tab's events (its documents, dialogs and downloads: see
    /// [`Tab::note`]).
    fn note(&mut self, v: &Value) {
        let session = v["sessionId"].as_str();
        if session == Some(self.session.as_str()) {
            self.tab.note(v["method"].as_str(), &v["params"]);
        } else if session.is_some_and(|s| self.tab.auto_attached.contains(s)) {
            // A frame in a process of its own attaching the frames below it.
            self.tab
                .note_frame_session(v["method"].as_str(), &v["params"]);
        }
    }

    /// Waits until the document of the navigation `loader` (or one it was replaced by, a
    /// redirect made by the page itself) has fired its load event; `false` when `within`
    /// passed first, the dialog's refusal when a dialog opened first. Nothing is asked of the
    /// tab: its events say it.
    pub async fn wait_loaded(
        &mut self,
        loader: &str,
        within: Duration,
    ) -> Result<bool, DesktopError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut committed = false;
        loop {
            committed |= self.tab.document.as_deref() == Some(loader);
            if committed && self.tab.loaded {
                return Ok(true);
            }
            if let Some(dialog) = &self.tab.dialog {
                return Err(dialog.refusal());
            }
            match tokio::time::timeout_at(deadline, self.next_message()).await {
                Ok(message) => message.map(|_| ())?,
                Err(_) => return Ok(false),
            }
        }
    }

    /// Forgets the tab's last download: the next one it begins is the one
    /// [`Self::wait_download`] waits for.
    pub fn expect_download(&mut self) {
        self.tab.forget_download();
    }

    /// Waits until the download the tab began (a navigation answered as one) has completed or
    /// was canceled, or `within` passed; what is known of it.
    pub async fn wait_download(&mut self, within: Duration) -> Result<Value, DesktopError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.tab.download_ended() {
                break;
            }
            match tokio::time::timeout_at(deadline, self.next_message()).await {
                Ok(message) => message.map(|_| ())?,
                Err(_) => break,
            }
        }
        Ok(self.tab.tell_download())
    }

    /// The tab's last download when it began or ended since an answer last named it (a
    /// click on a link to a file, say).
    pub fn download_news(&mut self) -> Option<Value> {
        self.tab.download_news()
    }

    async fn call_browser(&mut self, method: &str, params: Value) -> Result<Value, DesktopError> {
        self.send(None, method, params, COMMAND_TIMEOUT).await
    }

    /// A command to the attached tab.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, DesktopError> {
        let session = self.session.clone();
        self.send(Some(&session), method, params, COMMAND_TIMEOUT)
            .await
    }

    /// The isolated world of the tab's current document, made on first use per document.
    async fn world(&mut self) -> Result<i64, DesktopError> {
        if !self.tab.caught_up {
            // Reads every event sent before it, and names the top frame.
            let tree = self.call("Page.getFrameTree", json!({})).await?;
            let frame = tree["frameTree"]["frame"]["id"]
                .as_str()
                .ok_or_else(|| err("the tab has no top frame"))?;
            if self.tab.frame.as_deref() != Some(frame) {
                (self.tab.frame, self.tab.world) = (Some(frame.to_owned()), None);
            }
            self.tab.caught_up = true;
        }
        if let Some(ctx) = self.tab.world {
            return Ok(ctx);
        }
        let frame = self.tab.frame.clone().unwrap_or_default();
        let made = self
            .call(
                "Page.createIsolatedWorld",
                json!({ "frameId": frame, "worldName": "rakazo", "grantUniveralAccess": false }),
            )
            .await?;
        let ctx = made["executionContextId"]
            .as_i64()
            .ok_or_else(|| err("no isolated world"))?;
        self.tab.world = Some(ctx);
        Ok(ctx)
    }

    /// The isolated world of frame `frame` (an id) of the tab's current document, made on
    /// first use: in the tab's session, or in that of `via` (the world that lists the frame:
    /// a frame of another site runs the frames of its own site in its process), or, for a
    /// frame that runs in a process of its own, in a session attached to that frame.
    pub async fn frame_place(
        &mut self,
        frame: &str,
        via: Option<&Place>,
    ) -> Result<Place, DesktopError> {
        if let Some((session, context)) = self.tab.frame_worlds.get(frame) {
            return Ok(Place::Frame {
                session: session.clone(),
                context: *context,
            });
        }
        let params =
            json!({ "frameId": frame, "worldName": "rakazo", "grantUniveralAccess": false });
        let via = match via {
            Some(Place::Frame { session, .. }) => Some(session.clone()),
            _ => None,
        };
        let mut sessions = vec![self.session.clone()];
        sessions.extend(via.clone());
        let mut made = None;
        for session in sessions {
            match self
                .send(
                    Some(&session),
                    "Page.createIsolatedWorld",
                    params.clone(),
                    COMMAND_TIMEOUT,
                )
                .await
            {
                Ok(world) => {
                    made = Some((session, world));
                    break;
                }
                Err(e @ DesktopError::DialogOpen(_)) => return Err(e),
                Err(_) => {}
            }
        }
        let (session, made) = match made {
            Some(made) => made,
            None => {
                let session = self.frame_session(frame, via.as_deref()).await?;
                let made = self
                    .send(
                        Some(&session),
                        "Page.createIsolatedWorld",
                        params,
                        COMMAND_TIMEOUT,
                    )
                    .await?;
                (session, made)
            }
        };
        let context = made["executionContextId"]
            .as_i64()
            .ok_or_else(|| err("no isolated world in the frame"))?;
        self.tab
            .frame_worlds
            .insert(frame.to_owned(), (session.clone(), context));
        Ok(Place::Frame { session, context })
    }

    /// The session of frame `frame`, which runs in a process of its own: the frames of that
    /// kind below the tab, and below `via` (the session of the frame that holds it, itself in
    /// a process of its own), are attached as they come (`Target.setAutoAttach`, asked once
    /// per document and session), each announced with its session.
    async fn frame_session(
        &mut self,
        frame: &str,
        via: Option<&str>,
    ) -> Result<String, DesktopError> {
        let tab = self.session.clone();
        for session in std::iter::once(tab.as_str()).chain(via) {
            if self.tab.auto_attached.contains(session) {
                continue;
            }
            let params =
                json!({ "autoAttach": true, "waitForDebuggerOnStart": false, "flatten": true });
            // Noted first: the frames are announced on that session before its answer.
            self.tab.auto_attached.insert(session.to_owned());
            let asked = self
                .send(
                    Some(session),
                    "Target.setAutoAttach",
                    params,
                    COMMAND_TIMEOUT,
                )
                .await;
            if let Err(e) = asked {
                self.tab.auto_attached.remove(session);
                return Err(e);
            }
        }
        let deadline = tokio::time::Instant::now() + FRAME_ATTACH_WAIT;
        loop {
            if let Some(session) = self.tab.frame_sessions.get(frame) {
                return Ok(session.clone());
            }
            match tokio::time::timeout_at(deadline, self.next_message()).await {
                Ok(message) => message.map(|_| ())?,
                Err(_) => return Err(err("the frame has no DevTools target")),
            }
        }
    }

    /// Notes the frames of other origins snapshot `n` read, by their numbers in it.
    pub fn remember_frames(
        &mut self,
        n: u64,
        frames: std::collections::HashMap<u64, super::cdp_tab::ReadFrame>,
    ) {
        self.tab.snapshot_frames = Some((n, frames));
    }

    /// The frames of other origins snapshot `n` read, if it is the last snapshot.
    pub fn snapshot_frames(
        &self,
        n: u64,
    ) -> Option<std::collections::HashMap<u64, super::cdp_tab::ReadFrame>> {
        let (last, frames) = self.tab.snapshot_frames.as_ref()?;
        (*last == n).then(|| frames.clone())
    }

    /// A command to the session of `place`.
    pub async fn call_at(
        &mut self,
        place: &Place,
        method: &str,
        params: Value,
    ) -> Result<Value, DesktopError> {
        match place {
            Place::Page => self.call(method, params).await,
            Place::Frame { session, .. } => {
                self.send(Some(session), method, params, COMMAND_TIMEOUT)
                    .await
            }
        }
    }

    /// [`Self::evaluate`] at `place`. In a frame's world that is gone (the frame navigated
    /// or was removed) the expression did not run: its world is forgotten and the error says
    /// so.
    pub async fn evaluate_at(
        &mut self,
        place: &Place,
        expression: &str,
        by_value: bool,
    ) -> Result<Value, DesktopError> {
        let Place::Frame { context, .. } = place else {
            return self.evaluate_as(expression, by_value).await;
        };
        let params = json!({ "expression": expression, "contextId": context, "returnByValue": by_value, "awaitPromise": true });
        let out = match self.call_at(place, "Runtime.evaluate", params).await {
            Err(e) if context_gone(&e) => {
                self.tab.frame_worlds.retain(|_, (_, c)| c != context);
                return Err(err(FRAME_GONE));
            }
            out => out?,
        };
        evaluated(out)
    }

    /// Evaluate `expression` in the isolated world; its JSON value.
    pub async fn evaluate(&mut self, expression: &str) -> Result<Value, DesktopError> {
        Ok(self.evaluate_as(expression, true).await?["value"].take())
    }

    /// Evaluate `expression` in the isolated world; the remote object it gives, by value or
    /// by reference.
    async fn evaluate_as(
        &mut self,
        expression: &str,
        by_value: bool,
    ) -> Result<Value, DesktopError> {
        let mut retried = false;
        let out = loop {
            let ctx = self.world().await?;
            let params = json!({ "expression": expression, "contextId": ctx, "returnByValue": by_value, "awaitPromise": true });
            match self.call("Runtime.evaluate", params).await {
                Err(e) if !retried && context_gone(&e) => {
                    retried = true;
                    if self.tab.world == Some(ctx) {
                        self.tab.world = None;
                    }
                }
                out => break out?,
            }
        };
        evaluated(out)
    }
}

/// The result of a `Runtime.evaluate` answer, or the exception it reports.
fn evaluated(mut out: Value) -> Result<Value, DesktopError> {
    if let Some(ex) = out.get("exceptionDetails") {
        return Err(err(format!(
            "page script failed: {}",
            ex["text"].as_str().unwrap_or("exception")
        )));
    }
    Ok(out["result"].take())
}

/// Where a page script runs: the isolated world of the tab's document, or one made in a frame
/// of another origin ([`Cdp::frame_place`]).
#[derive(Clone, Debug)]
pub enum Place {
    /// The tab's document.
    Page,
    /// A frame of another origin: the session that reaches it and its world's context.
    Frame {
        /// The tab's session, or the frame's own.
        session: String,
        /// The world's execution context.
        context: i64,
    },
}
