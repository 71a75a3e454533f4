//! The page-browser tools over DevTools: navigate, snapshot (bounded text and up to 80
//! interactive elements with refs, password values masked, the frames of the page's origin
//! read too), act on a ref (click, type, press,
//! select an option, upload a workspace file), and answer the page's JavaScript dialogs. Refs
//! live only in the isolated world of the document they were taken from: a ref whose element
//! is gone, replaced or from an older snapshot is refused, never retargeted. Snapshots are numbered
//! across the process (from a random start), so a ref of another document, or of a browser
//! before a restart, never names an element of this one.

use std::path::Path;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rakazo_actors::provider::BrowserCommand;
use serde_json::{Value, json};

use super::DesktopError;
use super::cdp::Cdp;

/// DevTools connections of a provider's browsers, by machine and bot, each behind a lock of
/// its own: one bot's slow page never holds up another bot's page tools. A connection to an
/// earlier browser (restarted, closed) is replaced once per command.
#[derive(Default)]
pub struct PageSessions {
    pages: dashmap::DashMap<String, std::sync::Arc<tokio::sync::Mutex<Option<Cdp>>>>,
}

impl PageSessions {
    /// Runs `command` on the connection of `key`, dialing one with `connect` when there is
    /// none (or the old one closed); `home` is the workspace as the browser sees it.
    pub async fn run<F, Fut>(
        &self,
        key: String,
        home: &Path,
        connect: F,
        command: &BrowserCommand,
    ) -> Result<Value, rakazo_actors::provider::ProviderError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Cdp, DesktopError>>,
    {
        // The map's shard lock is held only to clone the slot's handle, never across an await.
        let slot = self.pages.entry(key).or_default().clone();
        let mut page = slot.lock().await;
        for attempt in 0..2 {
            let cdp = match &mut *page {
                Some(cdp) => cdp,
                empty => empty.insert(connect().await?),
            };
            match run(cdp, command, home).await {
                Err(DesktopError::Browser(msg))
                    if attempt == 0 && msg.contains("DevTools connection") =>
                {
                    *page = None;
                }
                other => return Ok(other?),
            }
        }
        Err(rakazo_actors::provider::ProviderError::PageAction(
            "the browser's DevTools connection keeps closing".into(),
        ))
    }
}

impl PageSessions {
    /// Drops the connections of `machine`'s browsers (keys `<machine>/<bot>`), when the
    /// machine stops or goes: nothing of it is held open after.
    pub fn forget_machine(&self, machine: &str) {
        let prefix = format!("{machine}/");
        self.pages.retain(|key, _| !key.starts_with(&prefix));
    }
}

/// Most interactive elements in a snapshot.
pub const MAX_ELEMENTS: usize = 80;
/// Most characters of page text in a snapshot.
pub const MAX_TEXT: usize = 8000;
/// Most options listed of one select element in a snapshot.
pub const MAX_OPTIONS: usize = 50;
/// Most options listed in one snapshot, all its select elements together.
pub const MAX_ALL_OPTIONS: usize = 200;
/// How long a navigation may take to load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(20);

/// The number of the next snapshot: every snapshot of this process has its own.
static SNAPSHOTS: LazyLock<AtomicU64> =
    LazyLock::new(|| AtomicU64::new(rand::random_range(1..1_000_000)));

/// Most frames deep a snapshot reads (a frame in a frame in a frame of the page).
pub const MAX_FRAME_DEPTH: usize = 3;
/// Most frames listed in one snapshot.
pub const MAX_FRAMES: usize = 20;

/// Snapshot script, given its settings (`cfg`, see [`SnapshotPart`]): numbers the elements in
/// `window.__rakazo` of the isolated world, as snapshot `cfg.n`, with refs `cfg.prefix` and a
/// number; elements inside open shadow roots (web components) are found too. The frames of
/// the document's own origin are read too, as far as `cfg.depth`: their
/// elements carry the frame's number (`frame`), their text follows the document's, headed by
/// it. A frame of another origin is listed (`crossOrigin`) and kept in `state.frames` by its
/// number, for the caller to read through DevTools ([`super::page_frames`]): the page's own
/// scripts cannot read it. Frames are numbered from `cfg.frameBase` on, so the parts of one
/// snapshot (the page, then each frame of another origin) never number two frames alike.
const SNAPSHOT_JS: &str = r#"(cfg => {
  const max = cfg.max, maxDepth = cfg.depth, maxFrames = cfg.frames;
  let optionsLeft = cfg.allOptions, textLeft = cfg.text, truncated = false;
  const sel = 'a[href],button,input,select,textarea,[role=button],[role=link],[role=checkbox],[role=tab],[role=menuitem],[contenteditable=true]';
  const visible = el => { const r = el.getBoundingClientRect(); const s = el.ownerDocument.defaultView.getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
  const named = (...names) => (names.find(n => n && n.trim()) || '').trim().slice(0, 120);
  const state = window.__rakazo = window.__rakazo || {};
  state.n = cfg.n; state.prefix = cfg.prefix; state.refs = {}; state.frames = {};
  const items = [], frames = [], texts = [];
  // A document's text, then its shadow roots' (which its own text leaves out).
  const textOf = (doc, shadows) => [doc.body ? doc.body.innerText : '', ...shadows.map(root =>
    Array.from(root.children).filter(c => !['STYLE', 'SCRIPT', 'TEMPLATE', 'LINK'].includes(c.tagName)
      && c.getClientRects().length).map(c => c.innerText).join('\n'))].filter(t => t.trim()).join('\n');
  const addText = (doc, head, shadows) => {
    const all = textOf(doc, shadows);
    if (head && !all.trim()) return;
    const part = (head ? '\n\n' + head + '\n' : '') + all;
    if (part.length > textLeft) truncated = true;
    texts.push(part.slice(0, Math.max(textLeft, 0))); textLeft -= part.length;
  };
  // A document and every open shadow root in it (closed ones are the page's own).
  const roots = root => { const all = [root];
    for (const el of root.querySelectorAll('*')) if (el.shadowRoot) all.push(...roots(el.shadowRoot));
    return all; };
  const walk = (doc, frame, depth) => {
    const all = roots(doc);
    const found = what => all.flatMap(root => Array.from(root.querySelectorAll(what)));
    for (const el of found(sel)) {
      if (items.length >= max) break;
      if (!visible(el)) continue;
      const ref = cfg.prefix + items.length;
      state.refs[ref] = el;
      const tag = el.tagName.toLowerCase();
      const type = (el.getAttribute('type') || '').toLowerCase();
      let value = ('value' in el) ? String(el.value) : null;
      if (type === 'password' && value) value = '*'.repeat(Math.min(value.length, 8));
      const label = el.labels && el.labels[0] ? el.labels[0].innerText : '';
      const attr = a => el.getAttribute(a);
      const item = { ref, tag, type: type || null, role: attr('role'), value,
        name: tag === 'select' ? named(attr('aria-label'), label, attr('name'), attr('title'))
          : named(attr('aria-label'), attr('placeholder'), el.innerText, attr('name'), attr('title')) };
      if (frame !== null) item.frame = frame;
      if (tag === 'select') {
        const listed = Math.min(el.options.length, cfg.options, optionsLeft);
        optionsLeft -= listed;
        item.options = Array.from(el.options).slice(0, listed).map(o =>
          ({ value: o.value.slice(0, 120), label: o.label.trim().slice(0, 120), selected: o.selected }));
        if (el.options.length > listed) item.moreOptions = el.options.length - listed;
      }
      items.push(item);
    }
    addText(doc, frame === null ? null : '[frame ' + frame + ']', all.slice(1));
    for (const f of found('iframe,frame')) {
      if (frames.length >= maxFrames) break;
      if (!visible(f)) continue;
      const entry = { frame: cfg.frameBase + frames.length, name: named(f.getAttribute('title'), f.getAttribute('name')),
        src: (f.getAttribute('src') || '').slice(0, 200) };
      if (frame !== null) entry.in = frame;
      frames.push(entry);
      state.frames[entry.frame] = f;
      let inner = null;
      try { inner = f.contentDocument; } catch (e) {}
      if (!inner) { entry.crossOrigin = true; continue; }
      entry.url = inner.URL.slice(0, 200);
      if (depth + 1 > maxDepth) { entry.tooDeep = true; continue; }
      walk(inner, entry.frame, depth + 1);
    }
  };
  walk(document, cfg.frame, 0);
  return { url: location.href, title: document.title, text: texts.join(''), truncated,
           elements: items, frames };
})(__CFG__)"#;

/// What one snapshot script reads: the page itself, or a frame of another origin read in its
/// own world, within what the page's part left of the bounds.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotPart {
    /// The snapshot's number.
    pub n: u64,
    /// The frame read (its number in the snapshot's list), `None` for the page.
    pub frame: Option<u64>,
    /// The number of the first frame this part lists (the frames listed before it).
    pub frame_base: u64,
    /// How many more frames it may list.
    pub frames: usize,
    /// Elements, characters of text and select options it may add.
    pub elements: usize,
    /// See `elements`.
    pub text: usize,
    /// See `elements`.
    pub options: usize,
}

impl SnapshotPart {
    /// The page's part of snapshot `n`, with every bound whole.
    pub fn page(n: u64) -> Self {
        SnapshotPart {
            n,
            frame: None,
            frame_base: 0,
            frames: MAX_FRAMES,
            elements: MAX_ELEMENTS,
            text: MAX_TEXT,
            options: MAX_ALL_OPTIONS,
        }
    }

    /// The prefix of this part's refs: `s<n>e` on the page, `s<n>f<frame>e` in a frame.
    pub fn prefix(&self) -> String {
        match self.frame {
            Some(k) => format!("s{}f{k}e", self.n),
            None => format!("s{}e", self.n),
        }
    }

    /// The script that reads it. A frame of another origin is read as the page is: the frames
    /// of its own origin inside it as well, and those of other origins listed.
    pub fn script(&self) -> String {
        let cfg = json!({
            "n": self.n,
            "prefix": self.prefix(),
            "frame": self.frame,
            "max": self.elements,
            "text": self.text,
            "allOptions": self.options,
            "options": MAX_OPTIONS,
            "depth": MAX_FRAME_DEPTH,
            "frames": self.frames,
            "frameBase": self.frame_base,
        });
        SNAPSHOT_JS.replace("__CFG__", &cfg.to_string())
    }
}

/// The script of the page's part of snapshot `n`.
pub fn snapshot_script(n: u64) -> String {
    SnapshotPart::page(n).script()
}

/// Run one command on the attached tab. While a JavaScript dialog of the page is open, a
/// snapshot or an action is refused (the page runs nothing until the dialog is answered); a
/// navigation dismisses the dialog, as the browser does, and says so. A dialog that opens
/// during a navigation or an action is named in its answer, the action done as far as its
/// answer says.
///
/// `home` is the workspace as the browser sees it: a file an upload names (a workspace path,
/// checked by the caller) is given to the page from there.
pub async fn run(
    cdp: &mut Cdp,
    command: &BrowserCommand,
    home: &Path,
) -> Result<Value, DesktopError> {
    cdp.follow_screen().await?;
    let takes_dialog = matches!(
        command,
        BrowserCommand::Dialog { .. } | BrowserCommand::Navigate { .. }
    );
    if let Some(dialog) = cdp.dialog().filter(|_| !takes_dialog) {
        return Err(dialog.refusal());
    }
    match command {
        BrowserCommand::Navigate { url } => {
            if !crate::providers::workspace_path::is_web_url(url) {
                return Err(DesktopError::Browser(
                    "only http(s) URLs can be opened".into(),
                ));
            }
            // Leaving the page dismisses its dialog, as the browser does; said in the answer.
            let dismissed = match cdp.dialog().cloned() {
                Some(dialog) => {
                    answer_dialog(cdp, false, None).await?;
                    Some(dialog.to_json())
                }
                None => None,
            };
            let mut answer = navigate(cdp, url).await?;
            if dismissed.is_some() {
                answer["dismissedDialog"] = json!(dismissed);
            }
            Ok(answer)
        }
        BrowserCommand::Snapshot => {
            let n = SNAPSHOTS.fetch_add(1, Ordering::Relaxed);
            let mut snapshot = cdp.evaluate(&snapshot_script(n)).await?;
            super::page_frames::read_other_origins(cdp, n, &mut snapshot).await?;
            Ok(with_download_news(cdp, snapshot))
        }
        BrowserCommand::Act {
            element,
            action,
            text,
        } => {
            let done = super::page_act::act(cdp, element, action, text.as_deref(), home).await?;
            Ok(with_download_news(cdp, done))
        }
        BrowserCommand::Dialog { accept, text } => {
            answer_dialog(cdp, *accept, text.as_deref()).await
        }
    }
}

/// `answer` with the tab's download news, if any (`download`).
fn with_download_news(cdp: &mut Cdp, mut answer: Value) -> Value {
    if let (Some(news), Value::Object(fields)) = (cdp.download_news(), &mut answer) {
        fields.insert("download".into(), news);
    }
    answer
}

/// Loads `url` in the tab and waits for its document to load (or for the download it turned
/// into to end, or for a dialog the new page opened).
async fn navigate(cdp: &mut Cdp, url: &str) -> Result<Value, DesktopError> {
    cdp.expect_download();
    let started = cdp.call("Page.navigate", json!({ "url": url })).await?;
    // A file the server sends as an attachment is saved, not shown: the page stays.
    if started["isDownload"] == true {
        let download = cdp.wait_download(LOAD_TIMEOUT).await?;
        return Ok(json!({ "url": url, "loaded": false, "download": download }));
    }
    if let Some(error) = started["errorText"].as_str().filter(|e| !e.is_empty()) {
        return Ok(json!({ "url": url, "loaded": false, "error": error }));
    }
    // A navigation within the document has no loader: nothing to wait for.
    if let Some(loader) = started["loaderId"].as_str() {
        match cdp.wait_loaded(loader, LOAD_TIMEOUT).await {
            Ok(true) => {}
            Ok(false) => return Ok(json!({ "url": url, "loaded": false })),
            // The new page holds its load for the dialog it opened.
            Err(DesktopError::DialogOpen(_)) => {
                let dialog = cdp.dialog().map(|d| d.to_json());
                return Ok(json!({ "url": url, "loaded": false, "dialog": dialog }));
            }
            Err(e) => return Err(e),
        }
    }
    // The browser's own record of the page: a page that has just loaded may keep its
    // main thread busy for a while, and the browser answers without it.
    let history = cdp.call("Page.getNavigationHistory", json!({})).await?;
    let current = history["currentIndex"].as_u64().unwrap_or(0) as usize;
    let page = &history["entries"][current];
    Ok(json!({ "url": page["url"], "title": page["title"], "loaded": true }))
}

/// Answers the dialog open on the page: accepted (with `text` for a prompt) or dismissed.
async fn answer_dialog(
    cdp: &mut Cdp,
    accept: bool,
    text: Option<&str>,
) -> Result<Value, DesktopError> {
    let Some(dialog) = cdp.dialog().cloned() else {
        return Err(DesktopError::Browser(
            "no dialog of the page is open (nothing was done); a dialog shown before the page tools attached is answered on the screen: computer_act, key Return or Escape".into(),
        ));
    };
    let mut params = json!({ "accept": accept });
    if let Some(text) = text.filter(|_| accept) {
        params["promptText"] = json!(text);
    }
    cdp.call("Page.handleJavaScriptDialog", params).await?;
    cdp.dialog_answered();
    Ok(json!({ "dialog": dialog.to_json(), "accepted": accept }))
}
