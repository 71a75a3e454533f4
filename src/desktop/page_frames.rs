//! Frames of other origins in the page tools. The page's own scripts cannot read such a frame,
//! nor can the snapshot script in the page's isolated world; DevTools can: each is read in an
//! isolated world made in the frame (through the tab's session, or through a session of the
//! frame's own when it runs in a process of its own), with refs of its own (`s<n>f<k>e<i>`).
//! Such a frame is read as the page is: the frames of its own origin inside it too, and those of
//! other origins it holds are listed and read in turn (a card form's frame inside a payment
//! provider's frame), each in a world of its own. An action on such a ref finds the element in
//! the frame's world and offsets it by the frame's content box in the page: each frame's box
//! measured in the world that lists it, added up to the page's; a frame that navigated, or was
//! taken out of its document, makes its refs stale.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use super::DesktopError;
use super::cdp::{Cdp, Place};
use super::cdp_tab::ReadFrame;
use super::page::{MAX_ALL_OPTIONS, MAX_ELEMENTS, MAX_FRAMES, MAX_TEXT, SnapshotPart};

/// Most frames of other origins one snapshot reads.
pub const MAX_OTHER_ORIGINS: usize = 5;
/// How long one frame of another origin gets to be read: a frame in a process of its own may
/// be busy (an advertisement's script) while the page answers.
const FRAME_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The frame element numbered `__K__` by snapshot `__N__`, while it is in the page.
const FRAME_ELEMENT_JS: &str = r#"(() => { const s = window.__rakazo;
  const f = s && s.n === __N__ && s.frames[__K__]; return f && f.isConnected ? f : null; })()"#;

/// Script functions shared by the page tools' lookups: `box(f)`, where frame element `f`'s
/// content box starts in its own document's viewport (border and padding included), and
/// `origin(w)`, where window `w`'s viewport starts in the page's, through the frames of the
/// page's origin it sits in (`null` when one of them is out of the page).
pub const ORIGIN_FNS: &str = r#"const box = f => { const r = f.getBoundingClientRect(), st = f.ownerDocument.defaultView.getComputedStyle(f);
    return { x: r.left + f.clientLeft + parseFloat(st.paddingLeft), y: r.top + f.clientTop + parseFloat(st.paddingTop) }; };
  const origin = w => { let x = 0, y = 0;
    while (w !== window) { const f = w && w.frameElement; if (!f || !f.isConnected) return null;
      const b = box(f); x += b.x; y += b.y; w = f.ownerDocument.defaultView; }
    return { x, y }; };"#;

/// Where the content box of frame `__K__` of snapshot `__N__` starts in the page's viewport,
/// the frame scrolled into view first.
const FRAME_ORIGIN_JS: &str = r#"(() => { __ORIGIN_FNS__ const s = window.__rakazo;
  const f = s && s.n === __N__ && s.frames[__K__];
  if (!f || !f.isConnected) return { stale: true };
  f.scrollIntoView({ block: 'nearest', inline: 'nearest' });
  const o = origin(f.ownerDocument.defaultView);
  if (!o) return { stale: true };
  const b = box(f);
  return { stale: false, x: o.x + b.x, y: o.y + b.y };
})()"#;

fn with_frame(script: &str, n: u64, k: u64) -> String {
    script
        .replace("__ORIGIN_FNS__", ORIGIN_FNS)
        .replace("__N__", &n.to_string())
        .replace("__K__", &k.to_string())
}

/// The snapshot and frame numbers of a ref of a frame of another origin (`s<n>f<k>e<i>`).
pub fn frame_ref(reference: &str) -> Option<(u64, u64)> {
    let rest = reference.strip_prefix('s')?;
    let (n, rest) = rest.split_once('f')?;
    let (k, i) = rest.split_once('e')?;
    i.parse::<u64>().ok()?;
    Some((n.parse().ok()?, k.parse().ok()?))
}

/// Reads the frames of other origins snapshot `n` of the page listed into `snapshot`, and the
/// frames of other origins those list in turn, nearest first (at most [`MAX_OTHER_ORIGINS`]
/// in all, within what the parts before left of the bounds): their elements and text, each
/// frame's entry marked `read` with its address, and the frames each lists (with the number
/// of the frame they are `in`). A frame that cannot be read (gone, busy past
/// [`FRAME_READ_TIMEOUT`]) stays listed, marked `unread`. Only an open dialog stops the
/// snapshot.
pub async fn read_other_origins(
    cdp: &mut Cdp,
    n: u64,
    snapshot: &mut Value,
) -> Result<(), DesktopError> {
    // Each frame with the frame of another origin whose world lists it (`None`: the page's).
    let mut due: VecDeque<(u64, Option<u64>)> = other_origins(snapshot, 0)
        .into_iter()
        .map(|k| (k, None))
        .collect();
    let mut read: HashMap<u64, ReadFrame> = HashMap::new();
    let mut tried = 0;
    while let Some((k, owner)) = due.pop_front() {
        if tried >= MAX_OTHER_ORIGINS {
            break;
        }
        tried += 1;
        // The frames this one lists are appended after these.
        let before = snapshot["frames"].as_array().map_or(0, Vec::len);
        let outcome = tokio::time::timeout(
            FRAME_READ_TIMEOUT,
            read_frame(cdp, n, k, owner, &read, snapshot),
        )
        .await;
        match outcome {
            Ok(Ok(Some(id))) => {
                read.insert(k, ReadFrame { id, owner });
                due.extend(
                    other_origins(snapshot, before)
                        .into_iter()
                        .map(|j| (j, Some(k))),
                );
            }
            Ok(Ok(None)) => mark(snapshot, k, "unread", json!(true)),
            Ok(Err(e @ DesktopError::DialogOpen(_))) => return Err(e),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "page.frame_unread");
                mark(snapshot, k, "unread", json!(true));
            }
            Err(_) => {
                tracing::debug!("page.frame_unread");
                mark(snapshot, k, "unread", json!(true));
            }
        }
    }
    cdp.remember_frames(n, read);
    Ok(())
}

/// The numbers of the frames of other origins in `snapshot`'s list from position `from` on.
fn other_origins(snapshot: &Value, from: usize) -> Vec<u64> {
    snapshot["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .skip(from)
        .filter(|f| f["crossOrigin"] == true)
        .filter_map(|f| f["frame"].as_u64())
        .collect()
}

fn mark(snapshot: &mut Value, k: u64, field: &str, value: Value) {
    if let Some(entry) = snapshot["frames"]
        .as_array_mut()
        .and_then(|frames| frames.iter_mut().find(|f| f["frame"] == k))
    {
        entry[field] = value;
    }
}

/// Where the world is that lists frame `owner`'s frames: the page's, or that of a frame of
/// another origin read before.
async fn owner_place(
    cdp: &mut Cdp,
    owner: Option<u64>,
    read: &HashMap<u64, ReadFrame>,
) -> Result<Option<Place>, DesktopError> {
    let Some(o) = owner else {
        return Ok(Some(Place::Page));
    };
    let Some(frame) = read.get(&o) else {
        return Ok(None);
    };
    let via = Box::pin(owner_place(cdp, frame.owner, read)).await?;
    Ok(Some(cdp.frame_place(&frame.id, via.as_ref()).await?))
}

/// Reads frame `k` of snapshot `n`, listed by the world of `owner`, into `snapshot`; its id,
/// `None` when its owner no longer has it or nothing is left of the bounds.
async fn read_frame(
    cdp: &mut Cdp,
    n: u64,
    k: u64,
    owner: Option<u64>,
    read: &HashMap<u64, ReadFrame>,
    snapshot: &mut Value,
) -> Result<Option<String>, DesktopError> {
    let elements = snapshot["elements"].as_array().map_or(0, Vec::len);
    let text = snapshot["text"].as_str().map_or(0, |t| t.chars().count());
    let listed = snapshot["frames"].as_array().map_or(0, Vec::len);
    let options: usize = snapshot["elements"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["options"].as_array().map(Vec::len))
        .sum();
    if elements >= MAX_ELEMENTS && text >= MAX_TEXT {
        return Ok(None);
    }
    let Some(via) = owner_place(cdp, owner, read).await? else {
        return Ok(None);
    };
    let Some(frame) = frame_id(cdp, &via, n, k).await? else {
        return Ok(None);
    };
    let part = SnapshotPart {
        n,
        frame: Some(k),
        frame_base: listed as u64,
        frames: MAX_FRAMES.saturating_sub(listed),
        elements: MAX_ELEMENTS.saturating_sub(elements),
        text: MAX_TEXT.saturating_sub(text),
        options: MAX_ALL_OPTIONS.saturating_sub(options),
    };
    // A world kept from an earlier snapshot is gone once the frame has loaded another
    // document: made again, once.
    let mut got = Value::Null;
    for attempt in 0..2 {
        let place = cdp.frame_place(&frame, Some(&via)).await?;
        match cdp.evaluate_at(&place, &part.script(), true).await {
            Ok(mut out) => {
                got = out["value"].take();
                break;
            }
            Err(e) if attempt == 0 && is_gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    if let (Some(all), Some(more)) = (
        snapshot["elements"].as_array_mut(),
        got["elements"].as_array_mut(),
    ) {
        all.append(more);
    }
    if let (Some(all), Some(more)) = (
        snapshot["frames"].as_array_mut(),
        got["frames"].as_array_mut(),
    ) {
        all.append(more);
    }
    let joined = format!(
        "{}{}",
        snapshot["text"].as_str().unwrap_or_default(),
        got["text"].as_str().unwrap_or_default()
    );
    snapshot["text"] = json!(joined);
    if got["truncated"] == true {
        snapshot["truncated"] = json!(true);
    }
    mark(snapshot, k, "url", got["url"].take());
    mark(snapshot, k, "read", json!(true));
    Ok(Some(frame))
}

/// Whether `e` says a frame's world was gone before ([`Cdp::evaluate_at`]) or went while a
/// snapshot script ran there (the frame loaded another document): the script, which only
/// reads, may run again.
fn is_gone(e: &DesktopError) -> bool {
    matches!(e, DesktopError::Browser(msg)
        if msg == super::cdp::FRAME_GONE || msg.contains("Execution context was destroyed"))
}

/// The DevTools id of frame `k` of snapshot `n`, from its frame element in the world `at`
/// that listed it (the frame's node is described in that world's session).
async fn frame_id(
    cdp: &mut Cdp,
    at: &Place,
    n: u64,
    k: u64,
) -> Result<Option<String>, DesktopError> {
    let element = cdp
        .evaluate_at(at, &with_frame(FRAME_ELEMENT_JS, n, k), false)
        .await?;
    let Some(object) = element["objectId"].as_str() else {
        return Ok(None);
    };
    let node = cdp
        .call_at(at, "DOM.describeNode", json!({ "objectId": object }))
        .await;
    let _ = cdp
        .call_at(at, "Runtime.releaseObject", json!({ "objectId": object }))
        .await;
    Ok(node?["node"]["frameId"].as_str().map(str::to_owned))
}

/// Where a ref's element is: the page, or the world of its frame of another origin with that
/// frame's number in its snapshot. `None`: the ref's frame is not the last snapshot's, or is
/// gone.
pub async fn place_of(
    cdp: &mut Cdp,
    reference: &str,
) -> Result<Option<(Place, Option<(u64, u64)>)>, DesktopError> {
    let Some((n, k)) = frame_ref(reference) else {
        return Ok(Some((Place::Page, None)));
    };
    let Some(read) = cdp.snapshot_frames(n) else {
        return Ok(None);
    };
    let found = match owner_place(cdp, Some(k), &read).await {
        Ok(place) => place,
        Err(e @ DesktopError::DialogOpen(_)) => return Err(e),
        Err(_) => None,
    };
    Ok(found.map(|place| (place, Some((n, k)))))
}

/// Where frame `k` of snapshot `n` starts in the page's viewport, each frame it is in scrolled
/// into view; `None` when it, or a frame it is in, is no longer there.
pub async fn frame_origin(
    cdp: &mut Cdp,
    n: u64,
    k: u64,
) -> Result<Option<(f64, f64)>, DesktopError> {
    let Some(read) = cdp.snapshot_frames(n) else {
        return Ok(None);
    };
    // From the frame up to the page: each frame's box in the world that lists it.
    let (mut x, mut y) = (0.0, 0.0);
    let mut frame = k;
    loop {
        let Some(owner) = read.get(&frame).map(|f| f.owner) else {
            return Ok(None);
        };
        let Some(at) = owner_place(cdp, owner, &read).await? else {
            return Ok(None);
        };
        let got = cdp
            .evaluate_at(&at, &with_frame(FRAME_ORIGIN_JS, n, frame), true)
            .await?["value"]
            .take();
        if got["stale"] != false {
            return Ok(None);
        }
        x += got["x"].as_f64().unwrap_or(0.0);
        y += got["y"].as_f64().unwrap_or(0.0);
        match owner {
            Some(o) => frame = o,
            None => return Ok(Some((x, y))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_refs_name_their_snapshot_and_frame() {
        assert_eq!(frame_ref("s12f3e4"), Some((12, 3)));
        assert_eq!(frame_ref("s12e4"), None);
        assert_eq!(frame_ref("s12f3e"), None);
        assert_eq!(frame_ref("sxf3e4"), None);
        assert_eq!(
            SnapshotPart {
                frame: Some(3),
                ..SnapshotPart::page(12)
            }
            .prefix(),
            "s12f3e"
        );
        assert_eq!(SnapshotPart::page(12).prefix(), "s12e");
    }
}
