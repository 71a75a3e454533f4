//! The X window tree of a bot's screen as a person sees it: which top-level windows are up,
//! and the check that a fresh desktop shows its browser and nothing else.
#![allow(dead_code)]

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{AtomEnum, ConnectionExt as _, MapState, Window};
use x11rb::rust_connection::RustConnection;

/// A viewable child of the root window.
#[derive(Debug)]
pub struct TopLevel {
    /// The window.
    pub window: Window,
    /// The `WM_CLASS` classes of the clients in it (itself or, for a window manager's frame,
    /// the windows below it).
    pub classes: Vec<String>,
}

/// Connects to display `:n` of this host.
pub fn connect_local(n: u32) -> RustConnection {
    x11rb::connect(Some(&format!(":{n}"))).expect("display").0
}

/// Connects to display `:n` through its socket in `dir` (a container's shared `/tmp/.X11-unix`).
pub fn connect_in(dir: &std::path::Path, n: u32) -> RustConnection {
    let stream = std::os::unix::net::UnixStream::connect(dir.join(format!("X{n}"))).unwrap();
    let (stream, _) = x11rb::rust_connection::DefaultStream::from_unix_stream(stream).unwrap();
    RustConnection::connect_to_stream(stream, 0).unwrap()
}

fn class_of(conn: &RustConnection, w: Window) -> Option<String> {
    let reply = conn
        .get_property(false, w, AtomEnum::WM_CLASS, AtomEnum::STRING, 0, 256)
        .ok()?
        .reply()
        .ok()?;
    let class = reply.value.split(|b| *b == 0).nth(1)?;
    (!class.is_empty()).then(|| String::from_utf8_lossy(class).into_owned())
}

fn classes_below(conn: &RustConnection, w: Window, depth: u32, out: &mut Vec<String>) {
    if let Some(c) = class_of(conn, w) {
        out.push(c);
        return;
    }
    if depth == 0 {
        return;
    }
    if let Ok(tree) = conn.query_tree(w).unwrap().reply() {
        for child in tree.children {
            classes_below(conn, child, depth - 1, out);
        }
    }
}

/// Every viewable child of the root window with the client classes it holds.
pub fn viewable_top_levels(conn: &RustConnection) -> Vec<TopLevel> {
    let root = conn.setup().roots[0].root;
    let tree = conn.query_tree(root).unwrap().reply().unwrap();
    let mut out = Vec::new();
    for w in tree.children {
        let Ok(attrs) = conn.get_window_attributes(w).unwrap().reply() else {
            continue;
        };
        if attrs.map_state != MapState::VIEWABLE {
            continue;
        }
        let mut classes = Vec::new();
        classes_below(conn, w, 3, &mut classes);
        out.push(TopLevel { window: w, classes });
    }
    out
}

/// The screen shows the browser's window and no other client window: exactly one viewable
/// top-level window holds a client, and that client is Chromium.
pub fn assert_only_the_browser(conn: &RustConnection) {
    let tops = viewable_top_levels(conn);
    let clients: Vec<&TopLevel> = tops.iter().filter(|t| !t.classes.is_empty()).collect();
    assert_eq!(clients.len(), 1, "one client window is up: {tops:?}");
    assert!(
        clients[0]
            .classes
            .iter()
            .all(|c| c.eq_ignore_ascii_case("chromium")),
        "the only window up is the browser's: {tops:?}"
    );
}

/// How many pixels of row `y` of a PNG frame are not black.
pub fn painted_in_row(png_bytes: &[u8], y: u32) -> usize {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let samples = info.color_type.samples();
    let row = &buf[info.line_size * y as usize..][..info.line_size];
    row.chunks(samples)
        .take(info.width as usize)
        .filter(|px| px[..3] != [0, 0, 0])
        .count()
}
