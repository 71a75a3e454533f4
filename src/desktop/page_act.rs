//! `browser_act`: acting on an element of the last snapshot by its ref (click, type, press,
//! select an option, upload a workspace file). A ref is looked up in the isolated world of the
//! snapshot's document and refused when stale; nothing is replayed. An action a dialog of the
//! page interrupts is answered with the dialog and what was done.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::DesktopError;
use super::cdp::{Cdp, Place};

/// Finds a ref of the current snapshot, or reports it stale. The point is in the page's
/// viewport: an element of a frame is offset by each frame's content box up to the page (a
/// frame taken out of the page makes its elements stale).
const FIND_JS: &str = r#"(() => { __ORIGIN_FNS__
  const state = window.__rakazo; const ref = __REF__;
  const el = state && state.refs[ref];
  if (!el || !el.isConnected || !ref.startsWith(state.prefix)) return { stale: true };
  el.scrollIntoView({ block: 'center', inline: 'center' });
  const r = el.getBoundingClientRect(), o = origin(el.ownerDocument.defaultView);
  if (!o) return { stale: true };
  return { stale: false, x: o.x + r.left + r.width / 2, y: o.y + r.top + r.height / 2, tag: el.tagName.toLowerCase() };
})()"#;

/// Chooses an option of a ref's select element by its value, else by its label, and tells the
/// page as a person's choice would (`input`, then `change`).
const SELECT_JS: &str = r#"(() => { const el = window.__rakazo && window.__rakazo.refs[__REF__];
  if (!el || !el.isConnected) return { stale: true };
  if (el.tagName.toLowerCase() !== 'select') return { notSelect: true };
  const want = __WANT__, options = Array.from(el.options);
  const opt = options.find(o => o.value === want) || options.find(o => o.label.trim() === want || o.text.trim() === want);
  if (!opt) return { missing: true };
  if (opt.disabled) return { disabled: true };
  el.focus(); el.value = opt.value; opt.selected = true;
  el.dispatchEvent(new Event('input', { bubbles: true }));
  el.dispatchEvent(new Event('change', { bubbles: true }));
  return { value: opt.value, label: opt.label };
})()"#;

/// A ref's element when it is a file input still in the page, else `null`.
const FILE_INPUT_JS: &str = r#"(() => { const el = window.__rakazo && window.__rakazo.refs[__REF__];
  return el && el.isConnected && el.tagName.toLowerCase() === 'input' && el.type === 'file' ? el : null; })()"#;

/// Focuses a ref's element and clears it (before typing).
const FOCUS_CLEAR_JS: &str = r#"(() => { const el = window.__rakazo && window.__rakazo.refs[__REF__];
  if (!el || !el.isConnected) return false; el.focus(); if ('value' in el) { el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true })); } return true; })()"#;

/// The JSON value of `expression` evaluated at `place`.
async fn value_at(cdp: &mut Cdp, place: &Place, expression: &str) -> Result<Value, DesktopError> {
    Ok(cdp.evaluate_at(place, expression, true).await?["value"].take())
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Longest wait for the page to answer after its input (see [`after_input`]).
const INPUT_FENCE: Duration = Duration::from_secs(1);

/// After input the page handles on its main thread (a click, keys, text): one round trip to
/// the element's document, queued behind that handling, so a dialog its handler opened is
/// known before the answer (the browser may answer the input itself first). A page still
/// busy after [`INPUT_FENCE`] is left to the next call, which finds its dialog.
async fn after_input(cdp: &mut Cdp, place: &Place) -> Result<(), DesktopError> {
    match tokio::time::timeout(INPUT_FENCE, cdp.evaluate_at(place, "0", true)).await {
        Ok(Err(e @ DesktopError::DialogOpen(_))) => Err(e),
        _ => Ok(()),
    }
}

/// The answer of an action interrupted by `e` after its `done` steps: a dialog the page opened
/// is named with what was done (the action reached the page); any other failure says what was
/// confirmed.
fn interrupted(
    cdp: &Cdp,
    element: &str,
    action: &str,
    done: &[&str],
    e: DesktopError,
) -> Result<Value, DesktopError> {
    if let (DesktopError::DialogOpen(_), Some(dialog)) = (&e, cdp.dialog()) {
        return Ok(
            json!({ "ref": element, "action": action, "confirmed": done, "dialog": dialog.to_json() }),
        );
    }
    Err(DesktopError::Browser(format!(
        "{e}; confirmed steps: [{}]; the outcome may be uncertain, look before retrying",
        done.join(", ")
    )))
}

/// Does `action` on the element `element` of the last snapshot.
pub(super) async fn act(
    cdp: &mut Cdp,
    element: &str,
    action: &str,
    text: Option<&str>,
    home: &Path,
) -> Result<Value, DesktopError> {
    let stale = || {
        DesktopError::Browser(format!(
            "stale ref {element}: the page changed since the snapshot; take a new browser_snapshot (nothing was done)"
        ))
    };
    let (place, frame) = super::page_frames::place_of(cdp, element)
        .await?
        .ok_or_else(stale)?;
    let found = match value_at(
        cdp,
        &place,
        &FIND_JS
            .replace("__ORIGIN_FNS__", super::page_frames::ORIGIN_FNS)
            .replace("__REF__", &quote(element)),
    )
    .await
    {
        Ok(found) => found,
        Err(e @ DesktopError::DialogOpen(_)) => return Err(e),
        Err(_) if frame.is_some() => return Err(stale()),
        Err(e) => return Err(e),
    };
    if found["stale"] != false {
        return Err(stale());
    }
    let (mut x, mut y) = (
        found["x"].as_f64().unwrap_or(0.0),
        found["y"].as_f64().unwrap_or(0.0),
    );
    if let Some((n, k)) = frame {
        let (left, top) = super::page_frames::frame_origin(cdp, n, k)
            .await?
            .ok_or_else(stale)?;
        (x, y) = (x + left, y + top);
    }
    let mut done: Vec<&str> = Vec::new();
    match action {
        "click" => {
            for kind in ["mousePressed", "mouseReleased"] {
                let event =
                    json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 });
                if let Err(e) = cdp.call("Input.dispatchMouseEvent", event).await {
                    return interrupted(cdp, element, action, &done, e);
                }
                done.push(kind);
            }
            if let Err(e) = after_input(cdp, &place).await {
                return interrupted(cdp, element, action, &done, e);
            }
        }
        "type" => {
            let text = text.ok_or_else(|| DesktopError::Browser("type needs text".into()))?;
            let focus = FOCUS_CLEAR_JS.replace("__REF__", &quote(element));
            let focused = match value_at(cdp, &place, &focus).await {
                Ok(focused) => focused,
                Err(e @ DesktopError::DialogOpen(_)) => {
                    return interrupted(cdp, element, action, &done, e);
                }
                Err(e) => return Err(e),
            };
            if focused != true {
                return Err(DesktopError::Browser(format!(
                    "stale ref {element}: take a new browser_snapshot"
                )));
            }
            done.push("focused");
            // At the element's place: a frame in a process of its own takes the text through
            // its own session, whichever frame the browser last saw focused.
            let typed = cdp.call_at(&place, "Input.insertText", json!({ "text": text }));
            if let Err(e) = typed.await {
                return interrupted(cdp, element, action, &done, e);
            }
            done.push("typed");
            if let Err(e) = after_input(cdp, &place).await {
                return interrupted(cdp, element, action, &done, e);
            }
        }
        "press" => {
            let key = text.unwrap_or("Enter");
            let focus = FOCUS_CLEAR_JS.replace("__REF__", &quote(element)).replace(
                "el.value = ''; el.dispatchEvent(new Event('input', { bubbles: true }));",
                "",
            );
            match value_at(cdp, &place, &focus).await {
                Ok(_) => {}
                Err(e @ DesktopError::DialogOpen(_)) => {
                    return interrupted(cdp, element, action, &done, e);
                }
                Err(e) => return Err(e),
            }
            for kind in ["keyDown", "keyUp"] {
                let mut ev = json!({ "type": kind, "key": key, "code": key });
                if key == "Enter" {
                    ev["windowsVirtualKeyCode"] = json!(13);
                    if kind == "keyDown" {
                        ev["text"] = json!("\r");
                    }
                }
                if let Err(e) = cdp.call_at(&place, "Input.dispatchKeyEvent", ev).await {
                    return interrupted(cdp, element, action, &done, e);
                }
                done.push(kind);
            }
            if let Err(e) = after_input(cdp, &place).await {
                return interrupted(cdp, element, action, &done, e);
            }
        }
        "upload" => {
            let file = text.ok_or_else(|| {
                DesktopError::Browser("upload needs text: the workspace file's path".into())
            })?;
            let input = cdp
                .evaluate_at(
                    &place,
                    &FILE_INPUT_JS.replace("__REF__", &quote(element)),
                    false,
                )
                .await?["objectId"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| {
                    DesktopError::Browser(format!(
                        "{element} is not a file input (nothing was done): upload works on an input of type file"
                    ))
                })?;
            let files = json!([home.join(file).to_string_lossy()]);
            let params = json!({ "files": files, "objectId": input });
            if let Err(e) = cdp.call_at(&place, "DOM.setFileInputFiles", params).await {
                return interrupted(cdp, element, action, &done, e);
            }
            done.push("files set");
        }
        "select" => {
            let want = text.ok_or_else(|| {
                DesktopError::Browser("select needs text: the option's value or label".into())
            })?;
            let script = SELECT_JS
                .replace("__REF__", &quote(element))
                .replace("__WANT__", &quote(want));
            let chosen = match value_at(cdp, &place, &script).await {
                Ok(chosen) => chosen,
                Err(e @ DesktopError::DialogOpen(_)) => {
                    return interrupted(cdp, element, action, &["selected"], e);
                }
                Err(e) => return Err(e),
            };
            let refused =
                |why: &str| Err(DesktopError::Browser(format!("{why} (nothing was done)")));
            if chosen["stale"] == true {
                return refused(&format!("stale ref {element}: take a new browser_snapshot"));
            }
            if chosen["notSelect"] == true {
                return refused(&format!(
                    "{element} is not a select element: click it, or type into it"
                ));
            }
            if chosen["missing"] == true || chosen["disabled"] == true {
                return refused(&format!(
                    "{element} has no option {want:?} that can be chosen: give an option's value or label from the snapshot"
                ));
            }
            return Ok(
                json!({ "ref": element, "action": action, "confirmed": ["selected"],
                              "value": chosen["value"], "label": chosen["label"] }),
            );
        }
        other => {
            return Err(DesktopError::Browser(format!(
                "browser_act cannot {other:?}; use click, type, press, select or upload, or the desktop tools for anything else"
            )));
        }
    }
    Ok(json!({ "ref": element, "action": action, "confirmed": done }))
}
