//! Settling input batches on X DAMAGE reports, against a real Xvfb: a batch that draws nothing
//! settles without capturing the screen, one that opens a window settles after the window
//! finished painting, with one capture.

#[path = "xvfb/mod.rs"]
mod xvfb;

use std::time::Duration;

use rakazo::desktop::capture::XDisplay;
use rakazo_actors::provider::{Action, Button};
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{
    ConnectionExt as _, CreateGCAux, CreateWindowAux, EventMask, Rectangle, WindowClass,
};
use xvfb::{Xvfb, pixel};

#[test]
fn a_batch_that_draws_nothing_settles_without_capturing() {
    let xvfb = Xvfb::start(230);
    let mut x = XDisplay::connect(xvfb.display).unwrap();
    assert!(x.tracks_damage(), "Xvfb has the DAMAGE extension");
    let first = x.frame().unwrap();
    let grabs = x.grabs();

    // Asked again with nothing drawn: the kept frame, not a new capture.
    let again = x.frame().unwrap();
    assert_eq!(x.grabs(), grabs);
    assert_eq!(again.png, first.png);

    let moves: Vec<Action> = (0..10)
        .map(|i| Action::Move {
            x: 100 + i * 7,
            y: 100 + i * 5,
        })
        .collect();
    x.apply_batch(&moves).unwrap();
    let settled = x
        .settle(
            Duration::ZERO,
            Duration::from_millis(30),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(x.grabs(), grabs, "the screen was not captured");
    assert_eq!(settled.hash, first.hash);
    assert_eq!(settled.png, first.png);
}

#[test]
fn a_batch_that_opens_a_window_settles_after_it_painted() {
    let xvfb = Xvfb::start(260);
    let display = xvfb.display;
    // An application: a full-screen black window that, when clicked, opens a red window and
    // paints it in several steps, the last one a white square.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let app = std::thread::spawn(move || {
        let (conn, screen) = x11rb::connect(Some(&format!(":{display}"))).unwrap();
        let s = &conn.setup().roots[screen];
        let (root, width, height) = (s.root, s.width_in_pixels, s.height_in_pixels);
        let base = conn.generate_id().unwrap();
        conn.create_window(
            0,
            base,
            root,
            0,
            0,
            width,
            height,
            0,
            WindowClass::INPUT_OUTPUT,
            0,
            &CreateWindowAux::new()
                .background_pixel(0x000000)
                .event_mask(EventMask::BUTTON_PRESS | EventMask::EXPOSURE),
        )
        .unwrap();
        conn.map_window(base).unwrap();
        conn.flush().unwrap();
        loop {
            if let Event::Expose(_) = conn.wait_for_event().unwrap() {
                break;
            }
        }
        ready_tx.send(()).unwrap();
        loop {
            if let Event::ButtonPress(_) = conn.wait_for_event().unwrap() {
                break;
            }
        }
        let popup = conn.generate_id().unwrap();
        conn.create_window(
            0,
            popup,
            root,
            100,
            100,
            200,
            200,
            0,
            WindowClass::INPUT_OUTPUT,
            0,
            &CreateWindowAux::new().background_pixel(0xff0000),
        )
        .unwrap();
        conn.map_window(popup).unwrap();
        conn.flush().unwrap();
        let gc = conn.generate_id().unwrap();
        conn.create_gc(gc, popup, &CreateGCAux::new().foreground(0x00ff00))
            .unwrap();
        for step in 0..5i16 {
            std::thread::sleep(Duration::from_millis(40));
            conn.poly_fill_rectangle(
                popup,
                gc,
                &[Rectangle {
                    x: 0,
                    y: step * 20,
                    width: 200,
                    height: 10,
                }],
            )
            .unwrap();
            conn.flush().unwrap();
        }
        std::thread::sleep(Duration::from_millis(40));
        conn.change_gc(
            gc,
            &x11rb::protocol::xproto::ChangeGCAux::new().foreground(0xffffff),
        )
        .unwrap();
        conn.poly_fill_rectangle(
            popup,
            gc,
            &[Rectangle {
                x: 150,
                y: 150,
                width: 20,
                height: 20,
            }],
        )
        .unwrap();
        conn.get_input_focus().unwrap().reply().unwrap();
        // Keep the windows up until the test has looked.
        std::thread::sleep(Duration::from_secs(2));
    });
    ready_rx.recv().unwrap();

    let mut x = XDisplay::connect(display).unwrap();
    let before = x.frame().unwrap();
    assert_eq!(pixel(&before.png, 260, 260), [0, 0, 0]);
    let grabs = x.grabs();
    x.apply_batch(&[Action::Click {
        x: 320,
        y: 240,
        button: Button::Left,
        double: false,
    }])
    .unwrap();
    // Quiet window well above the 40 ms between paint steps.
    let settled = x
        .settle(
            Duration::from_millis(500),
            Duration::from_millis(300),
            Duration::from_secs(20),
        )
        .unwrap();
    assert_eq!(
        x.grabs(),
        grabs + 1,
        "one capture, after the screen went quiet"
    );
    assert_eq!(
        pixel(&settled.png, 260, 260),
        [255, 255, 255],
        "the last step"
    );
    assert_eq!(pixel(&settled.png, 110, 105), [0, 255, 0], "a stripe");
    assert_eq!(pixel(&settled.png, 110, 115), [255, 0, 0], "the window");
    app.join().unwrap();
}
