//! The command path's settle, against a real Xvfb: the in-computer capture helper waits for the
//! X server's reports of drawing to stop (or, on a server without DAMAGE, reads the screen until
//! two reads in a row are the same) and prints only the settled frame, in one command for the
//! whole wait; kept running by an exec agent, it answers a screen nothing was drawn on with its
//! last frame, without reading the screen again. Where no helper is kept, a batch of input and
//! its settled frame are one command.

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
use rakazo::exec_agent::{Agent, Helper};
use rakazo_actors::provider::ExecOutput;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{
    ChangeWindowAttributesAux, ConnectionExt as _, CreateGCAux, ImageFormat, Rectangle,
};
use xvfb::{Xvfb, pixel};

/// The host runner, counting the scripts it runs, the lines it asks and the bytes answered;
/// with an exec agent running here, it keeps helpers as a pod's agent does.
struct Counting {
    inner: HostRunner,
    agent: Option<Arc<Agent>>,
    runs: AtomicUsize,
    asks: AtomicUsize,
    answered: AtomicUsize,
}

impl Counting {
    async fn new(keeps_helpers: bool) -> Arc<Self> {
        let agent = match keeps_helpers {
            true => Some(local_agent().await),
            false => None,
        };
        Arc::new(Self {
            inner: HostRunner::minimal(),
            agent,
            runs: AtomicUsize::new(0),
            asks: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl CommandRunner for Counting {
    async fn run(&self, script: &str, timeout: Duration) -> Result<ExecOutput, DesktopError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.inner.run(script, timeout).await
    }

    async fn ask(
        &self,
        helper: &Helper,
        line: &str,
        timeout: Duration,
    ) -> Option<Result<String, DesktopError>> {
        let agent = self.agent.as_ref()?;
        self.asks.fetch_add(1, Ordering::SeqCst);
        let answer = agent
            .ask_within(helper, line, timeout, Duration::from_secs(5))
            .await
            .map_err(DesktopError::Command);
        if let Ok(line) = &answer {
            self.answered.fetch_add(line.len(), Ordering::SeqCst);
        }
        Some(answer)
    }
}

/// The exec agent, run here over its standard input and output.
async fn local_agent() -> Arc<Agent> {
    let (mut channel, child) =
        rakazo::exec_agent::spawn_here(&[]).expect("python3 runs the exec agent");
    channel.keep = Box::new(child);
    Agent::over(channel).await.expect("the exec agent starts")
}

/// Display `:display`'s screen through `runner`, the helper installed under `dir`.
async fn connected(runner: &Arc<Counting>, dir: &std::path::Path, display: u32) -> CommandScreen {
    CommandScreen::connect(runner.clone(), dir, display, Duration::from_secs(20))
        .await
        .expect("the helper reads the display")
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

/// Paints display `:display` blue and green by turns every 20 ms for a while, then red.
fn paint_for_a_while(display: u32) -> std::thread::JoinHandle<()> {
    let (conn, n) = x11rb::connect(Some(&format!(":{display}"))).unwrap();
    let root = conn.setup().roots[n].root;
    std::thread::spawn(move || {
        for i in 0..15u32 {
            paint(&conn, root, if i % 2 == 0 { 0x00_00ff } else { 0x00_ff00 });
            std::thread::sleep(Duration::from_millis(20));
        }
        paint(&conn, root, 0xff_0000);
    })
}

/// Waits that settle only once the painting ended, whichever way the helper settles.
fn patient() -> Settle {
    Settle {
        first_delay: Duration::ZERO,
        interval: Duration::from_millis(400),
        quiet: Duration::from_millis(400),
        pointer_quiet: Duration::from_millis(400),
        timeout: Duration::from_secs(20),
    }
}

/// The settle of a screen painted for a while, on a server started with `extra`: one command
/// for the whole wait, and the colour the painting ended with.
async fn settles_in_one_command(first: u32, extra: &[&str]) {
    let xvfb = Xvfb::start_with(first, extra);
    let dir = tempfile::tempdir().unwrap();
    let runner = Counting::new(false).await;
    let screen = connected(&runner, dir.path(), xvfb.display).await;

    let painter = paint_for_a_while(xvfb.display);
    let before = runner.runs.load(Ordering::SeqCst);
    let wait = patient();
    let settled = screen
        .settle(wait, wait.first_delay, wait.quiet)
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

#[tokio::test]
async fn the_helper_settles_on_damage_inside_the_computer_in_one_command() {
    settles_in_one_command(440, &[]).await;
}

#[tokio::test]
async fn without_damage_the_helper_settles_by_polling_in_one_command() {
    settles_in_one_command(470, &["-extension", "DAMAGE"]).await;
}

/// One row of `width` noisy BGRX pixels (a fixed xorshift sequence).
fn noise_row(width: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..width * 4)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// The RGB colour of pixel `x` of a [`noise_row`].
fn noise_pixel(row: &[u8], x: usize) -> [u8; 3] {
    [row[x * 4 + 2], row[x * 4 + 1], row[x * 4]]
}

/// The image data of `png` inflated, the zlib stream's Adler-32 checked.
fn inflate_checked(png: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    let mut at = 8;
    while at + 12 <= png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        if &png[at + 4..at + 8] == b"IDAT" {
            data.extend_from_slice(&png[at + 8..at + 8 + len]);
        }
        at += 12 + len;
    }
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&data[..]), &mut out)
        .expect("one whole zlib stream, its checksum right");
    out
}

/// How many times the kept helper of `screen` read the screen.
async fn reads(runner: &Counting, screen: &CommandScreen) -> u32 {
    let answer = runner
        .ask(&screen.kept_helper(), "reads", Duration::from_secs(5))
        .await
        .expect("the runner keeps helpers")
        .expect("the helper answers");
    answer.trim().parse().expect("a count")
}

#[tokio::test]
async fn a_kept_helper_answers_an_undrawn_screen_with_its_last_frame() {
    let xvfb = Xvfb::start(500);
    let dir = tempfile::tempdir().unwrap();
    let runner = Counting::new(true).await;
    let screen = connected(&runner, dir.path(), xvfb.display).await;
    let scripts = runner.runs.load(Ordering::SeqCst);
    assert_eq!(reads(&runner, &screen).await, 1, "connecting read it once");

    // Nothing drawn: the same frame, not read again, nor sent again to the screen that has it
    // (a few bytes name it); another caller of the same helper gets it whole.
    let first = screen.grab().await.unwrap();
    let sent = runner.answered.load(Ordering::SeqCst);
    let again = screen.grab().await.unwrap();
    assert_eq!(again.hash, first.hash);
    assert_eq!(again.frame.png, first.frame.png);
    let resent = runner.answered.load(Ordering::SeqCst) - sent;
    assert!(
        resent < 64,
        "{resent} bytes answered for a frame the screen has"
    );
    let sent = runner.answered.load(Ordering::SeqCst);
    let other = connected(&runner, dir.path(), xvfb.display).await;
    assert!(runner.answered.load(Ordering::SeqCst) - sent > first.frame.png.len());
    assert_eq!(other.grab().await.unwrap().hash, first.hash);
    assert_eq!(
        runner.runs.load(Ordering::SeqCst),
        scripts + 1,
        "its install only"
    );
    let scripts = scripts + 1;
    assert_eq!(reads(&runner, &screen).await, 1);

    // Drawn on: read again.
    let (conn, n) = x11rb::connect(Some(&format!(":{}", xvfb.display))).unwrap();
    let root = conn.setup().roots[n].root;
    paint(&conn, root, 0x00_00ff);
    let blue = screen.grab().await.unwrap();
    assert_eq!(pixel(&blue.frame.png, 10, 10), [0, 0, 255]);
    assert_eq!(reads(&runner, &screen).await, 2);

    // A screen whose rows are all one row of noise: each row's deflate refers back to the row
    // above it, across bands too.
    let gc = conn.generate_id().unwrap();
    conn.create_gc(gc, root, &CreateGCAux::new().foreground(0xff_ff00))
        .unwrap();
    let noise = noise_row(640);
    for top in (0..480).step_by(60) {
        let rows: Vec<u8> = noise
            .iter()
            .copied()
            .cycle()
            .take(noise.len() * 60)
            .collect();
        conn.put_image(
            ImageFormat::Z_PIXMAP,
            root,
            gc,
            640,
            60,
            0,
            top,
            0,
            24,
            &rows,
        )
        .unwrap();
    }
    conn.get_input_focus().unwrap().reply().unwrap();
    let noisy = screen.grab().await.unwrap();
    assert_eq!(pixel(&noisy.frame.png, 110, 128), noise_pixel(&noise, 110));
    assert_eq!(reads(&runner, &screen).await, 3);

    // Rows 112 to 127, one band whole, drawn on: read again. The bands around it keep their
    // encoding but the one after it, whose first row refers back into it, and the frame is the
    // whole screen as it is.
    let spot = Rectangle {
        x: 100,
        y: 112,
        width: 20,
        height: 16,
    };
    conn.poly_fill_rectangle(root, gc, &[spot]).unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();
    let spotted = screen.grab().await.unwrap();
    assert_eq!(pixel(&spotted.frame.png, 110, 120), [255, 255, 0]);
    assert_eq!(pixel(&spotted.frame.png, 110, 127), [255, 255, 0]);
    for (x, y) in [
        (10, 10),
        (99, 120),
        (120, 120),
        (110, 111),
        (110, 128),
        (600, 400),
    ] {
        assert_eq!(
            pixel(&spotted.frame.png, x, y),
            noise_pixel(&noise, x),
            "({x}, {y})"
        );
    }
    for frame in [&blue, &noisy, &spotted] {
        let scanlines = inflate_checked(&frame.frame.png);
        assert_eq!(scanlines.len(), 480 * (1 + 640 * 3));
    }
    assert_eq!(reads(&runner, &screen).await, 4);

    // A settle with nothing drawn answers the kept frame.
    let wait = patient();
    let quiet = screen
        .settle(wait, Duration::ZERO, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(quiet.hash, spotted.hash);
    assert_eq!(reads(&runner, &screen).await, 4);

    // A settle while the screen is painted: one line, and the colour the painting ended with.
    let painter = paint_for_a_while(xvfb.display);
    let asks = runner.asks.load(Ordering::SeqCst);
    let settled = screen
        .settle(wait, wait.first_delay, wait.quiet)
        .await
        .unwrap();
    assert_eq!(runner.asks.load(Ordering::SeqCst) - asks, 1);
    painter.join().unwrap();
    assert_eq!(pixel(&settled.frame.png, 320, 240), [255, 0, 0]);
    assert_eq!(reads(&runner, &screen).await, 5, "read once, when settled");
    assert_eq!(
        runner.runs.load(Ordering::SeqCst),
        scripts,
        "no script ran for a frame"
    );
}

#[tokio::test]
async fn a_batch_and_its_settled_frame_are_one_command_where_no_helper_is_kept() {
    use rakazo_actors::provider::Action;
    let xvfb = Xvfb::start(530);
    let dir = tempfile::tempdir().unwrap();
    let runner = Counting::new(false).await;
    let screen = connected(&runner, dir.path(), xvfb.display).await;
    let wait = Settle::default();
    let moves = |points: &[(i32, i32)]| -> Vec<Action> {
        points.iter().map(|&(x, y)| Action::Move { x, y }).collect()
    };

    let before = runner.runs.load(Ordering::SeqCst);
    let batch = moves(&[(10, 10), (300, 200)]);
    let (react, quiet) = wait.for_batch(&batch);
    let (completed, stopped, frame) = screen.act(&batch, wait, react, quiet).await.unwrap();
    assert_eq!((completed, stopped.is_none()), (2, true));
    assert_eq!(
        runner.runs.load(Ordering::SeqCst) - before,
        1,
        "one command"
    );
    assert_eq!((frame.frame.width, frame.frame.height), (640, 480));
    let (conn, n) = x11rb::connect(Some(&format!(":{}", xvfb.display))).unwrap();
    let root = conn.setup().roots[n].root;
    let pointer = conn.query_pointer(root).unwrap().reply().unwrap();
    assert_eq!((pointer.root_x, pointer.root_y), (300, 200));

    // An action off the screen stops the batch there; the frame still comes, in the same command.
    let before = runner.runs.load(Ordering::SeqCst);
    let batch = moves(&[(20, 20), (9_999, 1), (30, 30)]);
    let (completed, stopped, frame) = screen.act(&batch, wait, react, quiet).await.unwrap();
    assert_eq!(completed, 1);
    assert!(stopped.is_some_and(|s| s.reason.contains("outside")));
    assert!(frame.frame.png.starts_with(b"\x89PNG"));
    assert_eq!(
        runner.runs.load(Ordering::SeqCst) - before,
        1,
        "one command"
    );
}
