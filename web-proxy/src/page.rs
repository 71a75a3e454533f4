//! The noVNC page shim: an inline reporter injected into every proxied HTML page, and the fixed
//! refusal page shown instead of a blank frame.
//!
//! The reporter runs before noVNC's module scripts (it is the first element of `<head>`):
//! - posts `{type: "rakazo.screen", state}` to `window.parent`: `loading` at once, then
//!   `connecting`, `connected`, `failed` (the connection ended before it was ever connected,
//!   or noVNC showed an error before connecting) or `disconnected` (it had been connected), read from the classes noVNC sets on `<html>`
//!   (`noVNC_connecting`, `noVNC_connected`, ...) and its `#noVNC_status` element; Rakazo's own
//!   embed page sets the same classes;
//! - removes `VideoDecoder` from `window`, so noVNC never probes WebCodecs H.264 (which hangs on
//!   some Android devices and leaves the page on `noVNC_loading`);
//! - when the page URL has no `path` setting, points noVNC's websocket at
//!   `screen/<capability>/websockify` on this origin.

/// The fixed, human reason shown (and sent) for every refusal.
pub const SCREEN_FAILURE_MESSAGE: &str = "The screen did not respond.";

/// The reporter script (without the `<script>` tags).
pub const REPORTER_JS: &str = r#"(function () {
  "use strict";
  try { delete window.VideoDecoder; } catch (e) {}
  try {
    if ("VideoDecoder" in window) {
      Object.defineProperty(window, "VideoDecoder", { value: undefined, configurable: true, writable: true });
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
      var q = new URLSearchParams(location.search);
      q.set("path", (m[1] || "") + m[2] + "websockify");
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
})();"#;

/// Inserts the reporter as the first child of `<head>` (or of `<html>`, or at the very start).
pub fn inject_reporter(html: &str) -> String {
    let script = format!("<script>{REPORTER_JS}</script>");
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
         <script>try{{window.parent.postMessage({{type:\"rakazo.screen\",state:\"failed\"}},\"*\")}}catch(e){{}}</script>\
         </head><body style=\"font-family:sans-serif;display:flex;align-items:center;\
         justify-content:center;height:100vh;margin:0\"><p>{SCREEN_FAILURE_MESSAGE}</p></body></html>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injects_first_in_head() {
        let html = "<!DOCTYPE html>\n<html lang=\"en\" class=\"noVNC_loading\">\n<HEAD data-x>\n<script type=\"module\" src=\"app/ui.js\"></script></head></html>";
        let out = inject_reporter(html);
        let script = out.find("<script>").unwrap();
        let module = out.find("<script type=\"module\"").unwrap();
        let head = out.find("<HEAD data-x>").unwrap();
        assert!(head < script && script < module);
        assert!(out.contains("VideoDecoder"));
    }

    #[test]
    fn injects_without_head() {
        assert!(inject_reporter("<html><body>x</body></html>").starts_with("<html><script>"));
        assert!(inject_reporter("<p>x</p>").starts_with("<script>"));
        // "<header" is not "<head".
        let out = inject_reporter("<header>x</header>");
        assert!(out.starts_with("<script>"));
    }

    #[test]
    fn novnc_pages_get_the_reporter() {
        for page in ["vnc.html", "vnc_lite.html"] {
            let path = format!("/usr/share/novnc/{page}");
            let Ok(html) = std::fs::read_to_string(&path) else {
                continue;
            };
            let out = inject_reporter(&html);
            let script = out.find(REPORTER_JS).unwrap();
            if let Some(module) = out.find("type=\"module\"") {
                assert!(script < module, "{page}: reporter after noVNC modules");
            }
        }
    }
}
