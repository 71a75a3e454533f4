//! The viewer page's parts: the reporter script the proxy serves beside noVNC (and names first
//! in noVNC's `<head>`), the screen pages' content security policy, and the fixed refusal page
//! shown instead of a blank frame.
//!
//! The reporter runs before noVNC's module scripts (its `<script src>` is the first element of
//! `<head>`, a classic script, so it runs before the deferred modules):
//! - in the sandbox's opaque origin `localStorage`, `sessionStorage` and `document.cookie` throw;
//!   it puts an in-memory storage in their place and a cookie accessor that keeps nothing, so
//!   noVNC's settings work and nothing outlives the page;
//! - posts `{type: "rakazo.screen", state}` to `window.parent`: `loading` at once, then
//!   `connecting`, `connected`, `failed` (the connection ended before it was ever connected,
//!   or noVNC showed an error before connecting) or `disconnected` (it had been connected),
//!   read from the classes noVNC sets on `<html>` (`noVNC_connecting`, `noVNC_connected`, ...)
//!   and its `#noVNC_status` element;
//! - removes `VideoDecoder` from `window`, so noVNC never probes WebCodecs H.264 (which hangs on
//!   some Android devices and leaves the page on `noVNC_loading`);
//! - lets an element of the page take focus only while the page has it or in answer to an input
//!   inside it: noVNC focuses its screen when it connects, which would take the keyboard from
//!   what the person types into beside the frame (the dashboard's terminal);
//! - when the page URL has no `path` setting, points noVNC's websocket at
//!   `screen/<capability>/websockify` on this host (in the page URL, and in the storage noVNC
//!   reads its settings from when the URL cannot be rewritten).

use std::sync::LazyLock;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::viewer::{REPORTER_PATH, STYLE_PATH};

/// The fixed, human reason shown (and sent) for every refusal.
pub const SCREEN_FAILURE_MESSAGE: &str = "The screen did not respond.";

/// The reporter script, served at [`REPORTER_PATH`] under the capability.
pub const REPORTER_JS: &str = r#"// Rakazo's screen reporter: storage that stays in the page, state reports to the embedding window.
(function () {
  "use strict";
  function memoryStorage() {
    var data = new Map();
    return Object.freeze({
      get length() { return data.size; },
      key: function (i) { var k = Array.from(data.keys())[i]; return k === undefined ? null : k; },
      getItem: function (k) { k = String(k); return data.has(k) ? data.get(k) : null; },
      setItem: function (k, v) { data.set(String(k), String(v)); },
      removeItem: function (k) { data.delete(String(k)); },
      clear: function () { data.clear(); }
    });
  }
  var shim = null;
  ["localStorage", "sessionStorage"].forEach(function (name) {
    try { void window[name].length; } catch (e) {
      try {
        var store = memoryStorage();
        Object.defineProperty(window, name, { value: store, configurable: true });
        if (name === "localStorage") shim = store;
      } catch (e2) {}
    }
  });
  try { void document.cookie; } catch (e) {
    try {
      Object.defineProperty(document, "cookie", { get: function () { return ""; }, set: function () {}, configurable: true });
    } catch (e2) {}
  }
  try { delete window.VideoDecoder; } catch (e) {}
  try {
    if ("VideoDecoder" in window) {
      Object.defineProperty(window, "VideoDecoder", { value: undefined, configurable: true, writable: true });
    }
  } catch (e) {}
  // noVNC focuses its screen when it connects: embedded, that would take the keyboard from
  // whatever the person is typing into beside it (the dashboard's terminal). The screen takes
  // focus only while its own document has it, or in answer to an input inside it.
  try {
    var focus = HTMLElement.prototype.focus;
    if (navigator.userActivation) {
      HTMLElement.prototype.focus = function () {
        if (document.hasFocus() || navigator.userActivation.isActive) return focus.apply(this, arguments);
      };
    }
  } catch (e) {}
  var last = "", seenConnected = false;
  function post(state) {
    if (state === last) return;
    last = state;
    try { window.parent.postMessage({ type: "rakazo.screen", state: state }, "*"); } catch (e) {}
  }
  post("loading");
  try {
    var m = location.pathname.match(/^\/?(.*\/)?(screen\/[^\/]+\/)/);
    if (m && !/[?&#]path=/.test(location.search + location.hash)) {
      var path = (m[1] || "") + m[2] + "websockify";
      if (shim) shim.setItem("path", path);
      var q = new URLSearchParams(location.search);
      q.set("path", path);
      history.replaceState(history.state, "", location.pathname + "?" + q.toString() + location.hash);
    }
  } catch (e) {}
  function statusIsError() {
    var s = document.getElementById("noVNC_status");
    return !!(s && s.classList.contains("noVNC_status_error") && s.classList.contains("noVNC_open"));
  }
  function check() {
    var c = document.documentElement.classList;
    if (c.contains("noVNC_connected")) { seenConnected = true; post("connected"); return; }
    if (c.contains("noVNC_connecting") || c.contains("noVNC_reconnecting")) { post("connecting"); return; }
    if (c.contains("noVNC_disconnecting")) return;
    if (last === "connecting" || last === "connected") {
      post(seenConnected ? "disconnected" : "failed");
    } else if (last === "loading" && statusIsError()) {
      post("failed");
    }
  }
  try {
    new MutationObserver(check).observe(document.documentElement, { attributes: true, attributeFilter: ["class"], subtree: true });
  } catch (e) {}
})();
"#;

/// The screen stylesheet, served at [`STYLE_PATH`] and linked last in noVNC's `<head>`: an
/// embedded screen shows the desktop only. noVNC's side control bar (and its handle) and its
/// status banner ("Connected (unencrypted) to ...", which behind TLS is false) stay hidden;
/// the embedding page shows its own status from the reporter's messages.
pub const STYLE_CSS: &str = "/* Rakazo's screen chrome: the desktop only. */\n\
#noVNC_control_bar_anchor, #noVNC_status { display: none !important; }\n";

/// The refusal page's one inline script: tells the embedding window at once.
const REFUSAL_SCRIPT: &str =
    r#"try{window.parent.postMessage({type:"rakazo.screen",state:"failed"},"*")}catch(e){}"#;
/// The refusal page's one inline style.
const REFUSAL_STYLE: &str = "body{font-family:sans-serif;display:flex;align-items:center;\
    justify-content:center;height:100vh;margin:0}";

/// The `Content-Security-Policy` of every response under `/screen/`: the page runs sandboxed
/// in an opaque origin (scripts only: no same-origin storage or cookies, no credentialed
/// same-origin requests, no popups, forms or top navigation), loads only its own files, connects
/// only to its own host (the relayed websocket), and may be framed only by the API's origin.
/// The refusal page's inline script and style are allowed by hash.
pub static CSP: LazyLock<String> = LazyLock::new(|| {
    let script = sha256_source(REFUSAL_SCRIPT);
    let style = sha256_source(REFUSAL_STYLE);
    format!(
        "sandbox allow-scripts; default-src 'none'; script-src 'self' {script}; \
         style-src 'self' {style}; img-src 'self' data:; font-src 'self'; media-src 'self'; \
         connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
    )
});

fn sha256_source(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// `html` with `<script src="rakazo-reporter.js"></script>` as the first child of `<head>` (or
/// of `<html>`, or at the very start).
pub fn with_reporter_tag(html: &str) -> String {
    let script = format!("<script src=\"{REPORTER_PATH}\"></script>");
    let at = tag_end(html, "<head").or_else(|| tag_end(html, "<html"));
    let mut out = String::with_capacity(html.len() + script.len());
    match at {
        Some(i) => {
            out.push_str(&html[..i]);
            out.push_str(&script);
            out.push_str(&html[i..]);
        }
        None => {
            out.push_str(&script);
            out.push_str(html);
        }
    }
    out
}

/// `html` with `<link rel="stylesheet" href="rakazo-screen.css">` just before `</head>`, after
/// noVNC's own stylesheets (or at the very end when there is no `</head>`).
pub fn with_style_link(html: &str) -> String {
    let link = format!("<link rel=\"stylesheet\" href=\"{STYLE_PATH}\">");
    let at = html.to_ascii_lowercase().find("</head>");
    match at {
        Some(i) => format!("{}{link}{}", &html[..i], &html[i..]),
        None => format!("{html}{link}"),
    }
}

/// The index just after the `>` of the first `<name` start tag (ASCII case-insensitive).
fn tag_end(html: &str, name: &str) -> Option<usize> {
    let bytes = html.as_bytes();
    let n = name.len();
    let mut i = 0;
    while i + n <= bytes.len() {
        if bytes[i..i + n].eq_ignore_ascii_case(name.as_bytes())
            && bytes
                .get(i + n)
                .is_some_and(|b| *b == b'>' || b.is_ascii_whitespace())
        {
            let close = html[i..].find('>')?;
            return Some(i + close + 1);
        }
        i += 1;
    }
    None
}

/// The page shown in the frame when the proxy refuses: the fixed reason, nothing else.
pub fn refusal_page() -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Screen unavailable</title>\
         <script>{REFUSAL_SCRIPT}</script><style>{REFUSAL_STYLE}</style>\
         </head><body><p>{SCREEN_FAILURE_MESSAGE}</p></body></html>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "<script src=\"rakazo-reporter.js\"></script>";

    #[test]
    fn names_the_reporter_first_in_head() {
        let html = "<!DOCTYPE html>\n<html lang=\"en\" class=\"noVNC_loading\">\n<HEAD data-x>\n<script type=\"module\" src=\"app/ui.js\"></script></head></html>";
        let out = with_reporter_tag(html);
        let script = out.find(TAG).unwrap();
        let module = out.find("<script type=\"module\"").unwrap();
        let head = out.find("<HEAD data-x>").unwrap();
        assert!(head < script && script < module);
        assert!(REPORTER_JS.contains("VideoDecoder"));
        assert!(REPORTER_JS.contains("navigator.userActivation.isActive"));
    }

    #[test]
    fn links_the_screen_style_last_in_head() {
        let html = "<html><head><link rel=\"stylesheet\" href=\"app/styles/base.css\"></HEAD><body></body></html>";
        let out = with_style_link(html);
        let ours = out.find("href=\"rakazo-screen.css\"").unwrap();
        assert!(out.find("base.css").unwrap() < ours && ours < out.find("</HEAD>").unwrap());
        assert!(
            with_style_link("<p>x</p>")
                .ends_with("<link rel=\"stylesheet\" href=\"rakazo-screen.css\">")
        );
        assert!(
            STYLE_CSS.contains("#noVNC_control_bar_anchor") && STYLE_CSS.contains("#noVNC_status")
        );
    }

    #[test]
    fn names_the_reporter_without_head() {
        let tagged = format!("<html>{TAG}");
        assert!(with_reporter_tag("<html><body>x</body></html>").starts_with(&tagged));
        assert!(with_reporter_tag("<p>x</p>").starts_with(TAG));
        // "<header" is not "<head".
        assert!(with_reporter_tag("<header>x</header>").starts_with(TAG));
    }

    #[test]
    fn the_policy_sandboxes_and_allows_the_refusal_page() {
        assert!(CSP.starts_with("sandbox allow-scripts;"));
        assert!(!CSP.contains("allow-same-origin"));
        assert!(!CSP.contains("unsafe-inline"));
        assert!(CSP.contains("frame-ancestors 'self'"));
        let page = refusal_page();
        assert!(page.contains(&format!("<script>{REFUSAL_SCRIPT}</script>")));
        assert!(page.contains(&format!("<style>{REFUSAL_STYLE}</style>")));
        assert!(CSP.contains(&sha256_source(REFUSAL_SCRIPT)));
        assert!(!page.contains("style=\""));
    }

    #[test]
    fn novnc_pages_get_the_reporter() {
        for page in ["vnc.html", "vnc_lite.html"] {
            let path = format!("{}/{page}", crate::viewer::DEFAULT_NOVNC_DIR);
            let Ok(html) = std::fs::read_to_string(&path) else {
                continue;
            };
            let out = with_reporter_tag(&html);
            let script = out.find(TAG).unwrap();
            if let Some(module) = out.find("type=\"module\"") {
                assert!(script < module, "{page}: reporter after noVNC modules");
            }
        }
    }
}
