//! The command path's settle, against a real Xvfb: the in-computer capture helper reads the
//! screen until two reads in a row are the same and prints only that frame, in one command for
//! the whole wait, whatever the number of looks.

#[path = "xvfb/mod.rs"]
mod xvfb;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rakazo::desktop::DesktopError;
use rakazo::desktop::command::{CommandRunner, HostRunner};
use rakazo::desktop::runtime::Settle;
use rakazo::desktop::screen_commands::CommandScreen;
use rakazo_actors::provider::ExecOutput;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{ChangeWindowAttributesAux, ConnectionExt as _};
use xvfb::{Xvfb, pixel};

/// The host runner, counting the scripts it runs.
struct Counting {
    inner: HostRunner,
    runs: AtomicUsize,
}

#[async_trait]
impl CommandRunner for Counting {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.inner.run(script, timeout).await
    }
}

/// Paints the root window `rgb` (24-bit TrueColor: the pixel value is the colour).
fn paint(conn: &impl Connection, root: u32, rgb: u32) {
    conn.change_window_attributes(
        root,
        &ChangeWindowAttributesAux::new().background_pixel(rgb),
    )
    .unwrap();
    conn.clear_area(false, root, 0, 0, 0, 0).unwrap();
    conn.flush().unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();
}

#[tokio::test]
async fn the_helper_settles_inside_the_computer_in_one_command() {
    let xvfb = Xvfb::start(440);
    let dir = tempfile::tempdir().unwrap();
    let runner = Arc::new(Counting {
        inner: HostRunner::minimal(),
        runs: AtomicUsize::new(0),
    });
    let screen = CommandScreen::connect(
        runner.clone(),
        dir.path(),
        xvfb.display,
        Duration::from_secs(20),
    )
    .await
    .expect("the helper reads the display");

    // The screen changes every 20 ms for a while, then stays red.
    let (conn, n) = x11rb::connect(Some(&format!(":{}", xvfb.display))).unwrap();
    let root = conn.setup().roots[n].root;
    let painter = std::thread::spawn(move || {
        for i in 0..15u32 {
            paint(&conn, root, if i % 2 == 0 { 0x00_00ff } else { 0x00_ff00 });
            std::thread::sleep(Duration::from_millis(20));
        }
        paint(&conn, root, 0xff_0000);
    });

    let before = runner.runs.load(Ordering::SeqCst);
    let settled = screen
        .settle(Settle {
            first_delay: Duration::ZERO,
            interval: Duration::from_millis(400),
            quiet: Duration::from_millis(400),
            pointer_quiet: Duration::from_millis(400),
            timeout: Duration::from_secs(20),
        })
        .await
        .unwrap();
    assert_eq!(
        runner.runs.load(Ordering::SeqCst) - before,
        1,
        "one command for the whole settle"
    );
    painter.join().unwrap();
    // Returned after the painting ended: the last colour, not one on the way.
    assert_eq!(pixel(&settled.frame.png, 320, 240), [255, 0, 0]);
    assert_eq!((settled.frame.width, settled.frame.height), (640, 480));

    // Still the same when looked at again: the settled frame is the screen.
    let again = screen.grab().await.unwrap();
    assert_eq!(again.hash, settled.hash);
}
