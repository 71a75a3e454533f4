//! What a DevTools connection knows of its attached tab, kept from the tab's own events: its
//! top document and whether it has loaded, the JavaScript dialog open on it, the last download
//! it began.

use serde_json::{Value, json};

use super::DesktopError;

/// Most characters kept of a dialog's message or default answer (the page writes them).
const DIALOG_TEXT: usize = 500;

/// What a connection knows of its attached tab; forgotten when it attaches to another.
#[derive(Default)]
pub(super) struct Tab {
    /// The tab's top frame, once known (stable for a tab; named again by each navigation).
    pub(super) frame: Option<String>,
    /// The isolated world made in the tab's current document.
    pub(super) world: Option<i64>,
    /// Whether every event sent before the last answer has been read since this page command
    /// began: `world` is current.
    pub(super) caught_up: bool,
    /// The loader of the tab's current top document, as its last navigation named it.
    pub(super) document: Option<String>,
    /// Whether the current top document has fired its load event.
    pub(super) loaded: bool,
    /// The JavaScript dialog open on the tab, as its events said.
    pub(super) dialog: Option<PageDialog>,
    /// The last download the tab began since `Cdp::expect_download`.
    download: Option<Download>,
    /// Isolated worlds made in frames of other origins of the current document, by frame id:
    /// the session that reaches the frame (the tab's, or the frame's own when it runs in a
    /// process of its own) and the world's context.
    pub(super) frame_worlds: std::collections::HashMap<String, (String, i64)>,
    /// The frames of other origins the last snapshot read: its number, and each frame by its
    /// number in the snapshot.
    pub(super) snapshot_frames: Option<(u64, std::collections::HashMap<u64, ReadFrame>)>,
    /// The sessions (the tab's, and those of frames in processes of their own) that attach
    /// the frames below them that run in processes of their own.
    pub(super) auto_attached: std::collections::HashSet<String>,
    /// The sessions of the tab's frames that run in processes of their own, by frame id, as
    /// their attachments were announced.
    pub(super) frame_sessions: std::collections::HashMap<String, String>,
}

/// A frame of another origin a snapshot read: its DevTools id, and the frame of another origin
/// whose world lists it (`None`: the page's).
#[derive(Clone, Debug)]
pub struct ReadFrame {
    /// The frame's id.
    pub id: String,
    /// The frame whose world lists it.
    pub owner: Option<u64>,
}

/// A download a tab began, as its events said.
#[derive(Clone, Debug)]
struct Download {
    guid: String,
    /// The file name the server suggested, bounded (the browser may save it under another
    /// when one of that name exists).
    file: String,
    /// `inProgress`, `completed` or `canceled`.
    state: String,
    bytes: u64,
    /// The state an answer last named.
    told: Option<String>,
}

/// A JavaScript dialog open on the attached tab (alert, confirm, prompt, beforeunload), as
/// the tab announced it. While it is open, the page runs nothing: its scripts, the isolated
/// world, the frame tree and input all wait for an answer.
#[derive(Clone, Debug)]
pub struct PageDialog {
    /// `alert`, `confirm`, `prompt` or `beforeunload`.
    pub kind: String,
    /// Its message, bounded.
    pub message: String,
    /// A prompt's default answer, bounded.
    pub default_prompt: Option<String>,
}

impl PageDialog {
    fn from_event(params: &Value) -> Self {
        PageDialog {
            kind: bounded(&params["type"]).unwrap_or_else(|| "alert".into()),
            message: bounded(&params["message"]).unwrap_or_default(),
            default_prompt: bounded(&params["defaultPrompt"])
                .filter(|_| params["type"] == "prompt"),
        }
    }

    /// The dialog as a tool's answer names it.
    pub fn to_json(&self) -> Value {
        let mut v =
            json!({ "type": self.kind, "message": self.message, "answerWith": "browser_dialog" });
        if let Some(default) = &self.default_prompt {
            v["defaultPrompt"] = json!(default);
        }
        v
    }

    /// The refusal of a page command while the dialog is open.
    pub fn refusal(&self) -> DesktopError {
        let message: String = self.message.chars().take(200).collect();
        DesktopError::DialogOpen(format!(
            "a {} dialog of the page is open ({message:?}): answer it with browser_dialog (accept or dismiss) first; nothing was done",
            self.kind
        ))
    }
}

/// Whether the browser answers `method` on a tab while a dialog is open there (everything
/// else waits for the page, and so for the dialog's answer).
pub(super) fn answers_with_dialog(method: &str) -> bool {
    matches!(
        method,
        "Page.handleJavaScriptDialog" | "Page.getNavigationHistory" | "Page.navigate"
    )
}

impl Tab {
    /// Keeps up with the sessions of frames in processes of their own, as the tab or such a
    /// frame (for the frames below it) attaches and detaches them.
    pub(super) fn note_frame_session(&mut self, method: Option<&str>, params: &Value) {
        match method {
            Some("Target.attachedToTarget") => {
                if let (Some(frame), Some(session)) = (
                    params["targetInfo"]["targetId"].as_str(),
                    params["sessionId"].as_str(),
                ) {
                    self.frame_sessions
                        .insert(frame.to_owned(), session.to_owned());
                }
            }
            Some("Target.detachedFromTarget") => {
                let gone = params["sessionId"].as_str().unwrap_or_default();
                self.frame_sessions.retain(|_, s| s != gone);
                self.frame_worlds.retain(|_, (s, _)| s != gone);
                self.auto_attached.remove(gone);
            }
            _ => {}
        }
    }

    /// Keeps up with an event of the tab: a new top document has no world yet and has not
    /// loaded.
    pub(super) fn note(&mut self, method: Option<&str>, params: &Value) {
        let frame = &params["frame"];
        match method {
            Some("Page.frameNavigated") if frame["parentId"].is_null() => {
                *self = Tab {
                    frame: frame["id"].as_str().map(str::to_owned),
                    document: frame["loaderId"].as_str().map(str::to_owned),
                    caught_up: self.caught_up,
                    // A download goes on whatever page the tab shows.
                    download: self.download.take(),
                    ..Tab::default()
                };
            }
            Some("Page.loadEventFired") => self.loaded = true,
            Some("Target.attachedToTarget" | "Target.detachedFromTarget") => {
                self.note_frame_session(method, params);
            }
            Some("Page.javascriptDialogOpening") => {
                self.dialog = Some(PageDialog::from_event(params));
            }
            Some("Page.javascriptDialogClosed") => self.dialog = None,
            Some("Page.downloadWillBegin") => {
                self.download = Some(Download {
                    guid: params["guid"].as_str().unwrap_or_default().to_owned(),
                    file: bounded(&params["suggestedFilename"]).unwrap_or_default(),
                    state: "inProgress".into(),
                    bytes: 0,
                    told: None,
                });
            }
            Some("Page.downloadProgress") => {
                if let Some(d) = self.download.as_mut().filter(|d| params["guid"] == d.guid) {
                    d.state = params["state"].as_str().unwrap_or("inProgress").to_owned();
                    d.bytes = params["receivedBytes"].as_u64().unwrap_or(d.bytes);
                }
            }
            _ => {}
        }
    }

    /// Forgets the last download.
    pub(super) fn forget_download(&mut self) {
        self.download = None;
    }

    /// Whether the last download has ended (completed or canceled).
    pub(super) fn download_ended(&self) -> bool {
        self.download
            .as_ref()
            .is_some_and(|d| d.state != "inProgress")
    }

    /// The last download as an answer names it: its file name as the server suggested it and
    /// the folder the browser saves into (`/Downloads`: from the workspace root, as the file
    /// tools read a path); counted as told.
    pub(super) fn tell_download(&mut self) -> Value {
        match &mut self.download {
            Some(d) => {
                d.told = Some(d.state.clone());
                json!({ "suggestedFilename": d.file, "state": d.state, "bytes": d.bytes, "folder": "/Downloads" })
            }
            None => json!({ "state": "notStarted" }),
        }
    }

    /// The last download when its state changed since an answer last named it.
    pub(super) fn download_news(&mut self) -> Option<Value> {
        let d = self.download.as_ref()?;
        (d.told.as_deref() != Some(d.state.as_str())).then(|| self.tell_download())
    }
}

/// Page-written text, bounded.
fn bounded(v: &Value) -> Option<String> {
    v.as_str().map(|t| t.chars().take(DIALOG_TEXT).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialog_is_bounded_and_its_refusal_names_the_way_out() {
        let long = "x".repeat(5000);
        let prompt = PageDialog::from_event(
            &json!({ "type": "prompt", "message": long, "defaultPrompt": "nobody" }),
        );
        assert_eq!(prompt.message.chars().count(), DIALOG_TEXT);
        assert_eq!(prompt.to_json()["defaultPrompt"], "nobody");
        let DesktopError::DialogOpen(refusal) = prompt.refusal() else {
            panic!("not a dialog refusal");
        };
        assert!(refusal.len() < 400, "{refusal}");
        assert!(refusal.contains("prompt dialog") && refusal.contains("browser_dialog"));
        // Only a prompt has a default answer, whatever the event claims.
        let alert = PageDialog::from_event(
            &json!({ "type": "alert", "message": "hi", "defaultPrompt": "" }),
        );
        assert!(alert.to_json().get("defaultPrompt").is_none());
    }

    #[test]
    fn the_tab_follows_its_dialogs_downloads_and_documents() {
        let mut tab = Tab::default();
        tab.note(
            Some("Page.javascriptDialogOpening"),
            &json!({ "type": "confirm", "message": "Sure?" }),
        );
        assert_eq!(tab.dialog.as_ref().unwrap().kind, "confirm");
        tab.note(
            Some("Page.javascriptDialogClosed"),
            &json!({ "result": true }),
        );
        assert!(tab.dialog.is_none());

        tab.note(
            Some("Page.downloadWillBegin"),
            &json!({ "guid": "g1", "suggestedFilename": "a.csv" }),
        );
        // Another download's progress is not this one's.
        let done = json!({ "guid": "g2", "state": "completed", "receivedBytes": 9 });
        tab.note(Some("Page.downloadProgress"), &done);
        assert!(!tab.download_ended());
        let done = json!({ "guid": "g1", "state": "completed", "receivedBytes": 7 });
        tab.note(Some("Page.downloadProgress"), &done);
        assert!(tab.download_ended());
        assert_eq!(tab.download_news().unwrap()["bytes"], 7);
        // Told once, and kept through the tab's next document.
        assert!(tab.download_news().is_none());

        tab.world = Some(3);
        tab.caught_up = true;
        let top = json!({ "frame": { "id": "f", "loaderId": "l2" } });
        tab.note(Some("Page.frameNavigated"), &top);
        assert_eq!((tab.world, tab.caught_up, tab.loaded), (None, true, false));
        assert_eq!(tab.document.as_deref(), Some("l2"));
        // A child frame's navigation leaves the top document alone.
        tab.world = Some(4);
        let child = json!({ "frame": { "id": "c", "parentId": "f", "loaderId": "l3" } });
        tab.note(Some("Page.frameNavigated"), &child);
        assert_eq!(tab.world, Some(4));
    }
}
