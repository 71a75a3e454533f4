//! Screen capture through memory shared with a real Xvfb (MIT-SHM with a memfd): the same
//! pixels as `GetImage`, `GetImage` where the server has no MIT-SHM, nothing left behind when
//! a connection ends, scaled frames whose coordinates map back to screen pixels, and full-size
//! frames encoded by bands of rows, of which a small change deflates only its own.

#[path = "xvfb/mod.rs"]
mod xvfb;

use std::time::{Duration, Instant};

use rakazo::desktop::capture::{CapturePath, XDisplay};
use rakazo::desktop::shared_image::MEMFD_NAME;
use rakazo_actors::provider::{Action, Button, FrameSize};
use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::xproto::{
    ConnectionExt as _, CreateGCAux, CreateWindowAux, EventMask, Rectangle, WindowClass,
};
use xvfb::{Xvfb, pixel};

/// Held by every test here: the leak test counts this process's memfds.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Paints a still picture on the screen: a window of stripes in several colours and a yellow
/// 40x40 square at (400, 300). Returns the connection holding the window up.
fn paint(display: u32) -> x11rb::rust_connection::RustConnection {
    let (conn, screen) = x11rb::connect(Some(&format!(":{display}"))).unwrap();
    let root = conn.setup().roots[screen].root;
    let win = conn.generate_id().unwrap();
    conn.create_window(
        0,
        win,
        root,
        0,
        0,
        640,
        480,
        0,
        WindowClass::INPUT_OUTPUT,
        0,
        &CreateWindowAux::new()
            .background_pixel(0x203040)
            .event_mask(EventMask::EXPOSURE),
    )
    .unwrap();
    conn.map_window(win).unwrap();
    conn.flush().unwrap();
    loop {
        if let Event::Expose(_) = conn.wait_for_event().unwrap() {
            break;
        }
    }
    let gc = conn.generate_id().unwrap();
    conn.create_gc(gc, win, &CreateGCAux::new()).unwrap();
    for i in 0..16u32 {
        conn.change_gc(
            gc,
            &x11rb::protocol::xproto::ChangeGCAux::new().foreground(i * 0x0f1e2d + 0x102030),
        )
        .unwrap();
        conn.poly_fill_rectangle(
            win,
            gc,
            &[Rectangle {
                x: (i * 37) as i16,
                y: (i * 11) as i16,
                width: 29,
                height: 200,
            }],
        )
        .unwrap();
    }
    conn.change_gc(
        gc,
        &x11rb::protocol::xproto::ChangeGCAux::new().foreground(0xffff00),
    )
    .unwrap();
    conn.poly_fill_rectangle(
        win,
        gc,
        &[Rectangle {
            x: 400,
            y: 300,
            width: 40,
            height: 40,
        }],
    )
    .unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();
    conn
}

/// System V shared-memory segments this process created (`/proc/sysvipc/shm`: key, shmid,
/// perms, size, creator pid, ...).
fn our_sysv_segments() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_to_string("/proc/sysvipc/shm")
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| l.split_whitespace().nth(4) == Some(me.as_str()))
                .count()
        })
        .unwrap_or(0)
}

/// Open descriptors of this process that are capture memfds.
fn our_memfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy().contains(MEMFD_NAME))
                .unwrap_or(false)
        })
        .count()
}

/// Mappings of capture memfds in the X server.
fn server_mappings(xvfb: &Xvfb) -> usize {
    std::fs::read_to_string(format!("/proc/{}/maps", xvfb.child.id()))
        .unwrap()
        .lines()
        .filter(|l| l.contains(MEMFD_NAME))
        .count()
}

#[test]
fn shared_memory_frames_equal_socket_frames_byte_for_byte() {
    let _serial = one_at_a_time();
    let xvfb = Xvfb::start(290);
    let _painter = paint(xvfb.display);
    let mut x = XDisplay::connect(xvfb.display).unwrap();
    assert_eq!(x.capture_path(), CapturePath::SharedMemory);
    let shared = x.grab().unwrap();
    // Twice: the segment is reused.
    let again = x.grab().unwrap();
    x.set_shared_memory(false);
    assert_eq!(x.capture_path(), CapturePath::Socket);
    let socket = x.grab().unwrap();
    assert_eq!(shared.bgrx.len(), 640 * 480 * 4);
    assert!(shared.bgrx == socket.bgrx, "the same pixels both ways");
    assert!(again.bgrx == socket.bgrx);
    assert_eq!(shared.hash, socket.hash);
    // The picture is really there (yellow square, BGRX).
    let at = (320 * 640 + 420) * 4;
    assert_eq!(&shared.bgrx[at..at + 3], &[0, 255, 255]);
    // Allowed again: shared memory once more, same pixels.
    x.set_shared_memory(true);
    assert_eq!(x.capture_path(), CapturePath::SharedMemory);
    assert!(x.grab().unwrap().bgrx == socket.bgrx);
}

#[test]
fn a_server_without_shared_memory_is_read_through_the_socket() {
    let _serial = one_at_a_time();
    let xvfb = Xvfb::start_with(320, &["-extension", "MIT-SHM"]);
    let _painter = paint(xvfb.display);
    let mut x = XDisplay::connect(xvfb.display).unwrap();
    assert_eq!(x.capture_path(), CapturePath::Socket);
    let frame = x.grab().unwrap();
    let at = (320 * 640 + 420) * 4;
    assert_eq!(&frame.bgrx[at..at + 3], &[0, 255, 255]);
    let shot = x.frame().unwrap();
    assert_eq!((shot.width, shot.height), (640, 480));
    assert_eq!(pixel(&shot.png, 420, 320), [255, 255, 0]);
}

#[test]
fn nothing_of_a_capture_connection_outlives_it() {
    let _serial = one_at_a_time();
    let xvfb = Xvfb::start(350);
    let _painter = paint(xvfb.display);
    let segments = our_sysv_segments();
    let fds = our_memfds();
    for _ in 0..3 {
        let mut x = XDisplay::connect(xvfb.display).unwrap();
        for _ in 0..5 {
            x.grab().unwrap();
        }
        assert_eq!(x.capture_path(), CapturePath::SharedMemory);
        assert_eq!(our_memfds(), fds + 1, "one memfd while connected");
        assert_eq!(our_sysv_segments(), segments, "and no System V segment");
        assert!(server_mappings(&xvfb) >= 1, "the server mapped it");
        drop(x);
        assert_eq!(
            our_memfds(),
            fds,
            "our descriptor closed with the connection"
        );
        // The server notices the closed connection on its own schedule.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server_mappings(&xvfb) > 0 {
            assert!(Instant::now() < deadline, "the server still maps the memfd");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(
        our_sysv_segments(),
        segments,
        "no System V segment was left"
    );
}

#[test]
fn scaled_frames_fit_and_map_back_to_screen_pixels() {
    let _serial = one_at_a_time();
    let xvfb = Xvfb::start(380);
    let display = xvfb.display;
    let _painter = paint(display);
    // A listener on the yellow square, reporting where it was clicked.
    let (conn, screen) = x11rb::connect(Some(&format!(":{display}"))).unwrap();
    let root = conn.setup().roots[screen].root;
    let target = conn.generate_id().unwrap();
    conn.create_window(
        0,
        target,
        root,
        400,
        300,
        40,
        40,
        0,
        WindowClass::INPUT_ONLY,
        0,
        &CreateWindowAux::new().event_mask(EventMask::BUTTON_PRESS),
    )
    .unwrap();
    conn.map_window(target).unwrap();
    conn.get_input_focus().unwrap().reply().unwrap();

    let mut x = XDisplay::connect(display).unwrap();
    let full = x.frame().unwrap();
    assert_eq!((full.width, full.height, full.screen), (640, 480, None));
    let half = FrameSize {
        max_width: Some(320),
        max_height: None,
    };
    let shot = x.frame_sized(half).unwrap();
    assert_eq!(
        (shot.width, shot.height, shot.screen),
        (320, 240, Some((640, 480)))
    );
    assert!(shot.png.len() < full.png.len());
    // The height limit binds when it is the tighter one.
    let short = x
        .frame_sized(FrameSize {
            max_width: Some(600),
            max_height: Some(120),
        })
        .unwrap();
    assert_eq!((short.width, short.height), (160, 120));
    // A limit above the screen: the full frame.
    let roomy = x
        .frame_sized(FrameSize {
            max_width: Some(4000),
            max_height: None,
        })
        .unwrap();
    assert_eq!((roomy.width, roomy.height, roomy.screen), (640, 480, None));
    assert_eq!(roomy.png, full.png);

    // Find the yellow square in the scaled image, map its centre back to the screen, click.
    let mut reader = png::Decoder::new(std::io::Cursor::new(&shot.png))
        .read_info()
        .unwrap();
    let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
    reader.next_frame(&mut rgb).unwrap();
    let yellow: Vec<(u32, u32)> = (0..240u32)
        .flat_map(|y| (0..320u32).map(move |x| (x, y)))
        .filter(|&(x, y)| rgb[((y * 320 + x) * 3) as usize..][..3] == [255, 255, 0])
        .collect();
    assert!(!yellow.is_empty(), "the square shows in the scaled frame");
    let n = yellow.len() as u32;
    let (cx, cy) = (
        yellow.iter().map(|p| p.0).sum::<u32>() / n,
        yellow.iter().map(|p| p.1).sum::<u32>() / n,
    );
    let (sw, _) = shot.screen.unwrap();
    let scale = f64::from(shot.width) / f64::from(sw);
    let (sx, sy) = (
        (f64::from(cx) / scale).round() as i32,
        (f64::from(cy) / scale).round() as i32,
    );
    x.apply_batch(&[Action::Click {
        x: sx,
        y: sy,
        button: Button::Left,
        double: false,
    }])
    .unwrap();
    let pressed = loop {
        if let Event::ButtonPress(e) = conn.wait_for_event().unwrap() {
            break e;
        }
    };
    assert_eq!(pressed.event, target);
    assert!((0..40).contains(&pressed.event_x) && (0..40).contains(&pressed.event_y));
    assert_eq!(
        (i32::from(pressed.root_x), i32::from(pressed.root_y)),
        (sx, sy)
    );
}

/// The screen's pixels as RGB rows.
fn rgb(frame: &rakazo::desktop::capture::RawFrame) -> Vec<u8> {
    frame
        .bgrx
        .chunks_exact(4)
        .flat_map(|p| [p[2], p[1], p[0]])
        .collect()
}

/// A PNG's pixels as RGB rows.
fn decoded(png_bytes: &[u8]) -> Vec<u8> {
    let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    buf
}

#[test]
fn a_small_change_deflates_only_its_bands_and_every_frame_is_the_screen() {
    let _serial = one_at_a_time();
    let xvfb = Xvfb::start(410);
    let painter = paint(xvfb.display);
    let mut x = XDisplay::connect(xvfb.display).unwrap();
    assert!(x.tracks_damage());
    let first = x.frame().unwrap();
    assert_eq!(x.bands_deflated(), 30, "every band of 480 rows, 16 each");
    assert!(decoded(&first.png) == rgb(&x.grab().unwrap()));

    // A 10x10 red window at (100, 200): rows 200 to 209, in the bands of rows 192-207 and
    // 208-223.
    let root = painter.setup().roots[0].root;
    let win = painter.generate_id().unwrap();
    painter
        .create_window(
            0,
            win,
            root,
            100,
            200,
            10,
            10,
            0,
            WindowClass::INPUT_OUTPUT,
            0,
            &CreateWindowAux::new()
                .background_pixel(0xff0000)
                .override_redirect(1),
        )
        .unwrap();
    painter.map_window(win).unwrap();
    painter.get_input_focus().unwrap().reply().unwrap();

    let second = x.frame().unwrap();
    assert_eq!(
        x.bands_deflated(),
        32,
        "only the two bands the window covers"
    );
    assert_eq!(pixel(&second.png, 105, 205), [255, 0, 0]);
    assert_eq!(pixel(&second.png, 95, 205), pixel(&first.png, 95, 205));
    assert!(decoded(&second.png) == rgb(&x.grab().unwrap()));

    // Nothing drawn since: the same image, nothing deflated, nothing captured.
    let grabs = x.grabs();
    let third = x.frame().unwrap();
    assert_eq!((x.bands_deflated(), x.grabs()), (32, grabs));
    assert_eq!(third.png, second.png);

    // A scaled frame of the same screen between two full ones changes neither; asked again
    // at that size, it is the same scaled image.
    let half = FrameSize {
        max_width: Some(320),
        max_height: None,
    };
    let scaled = x.frame_sized(half).unwrap();
    assert_eq!((scaled.width, scaled.screen), (320, Some((640, 480))));
    assert_eq!(x.frame_sized(half).unwrap().png, scaled.png);
    assert_eq!(x.frame().unwrap().png, second.png);
    assert_eq!((x.bands_deflated(), x.grabs()), (32, grabs));

    // The window goes: the next frames are captured into the buffers of the frames before
    // them, and each is still exactly the screen.
    painter.unmap_window(win).unwrap();
    painter.get_input_focus().unwrap().reply().unwrap();
    let fourth = x.frame().unwrap();
    assert_ne!(pixel(&fourth.png, 105, 205), [255, 0, 0]);
    assert_eq!(pixel(&fourth.png, 95, 205), pixel(&second.png, 95, 205));
    painter.map_window(win).unwrap();
    painter.get_input_focus().unwrap().reply().unwrap();
    let fifth = x.frame().unwrap();
    assert!(decoded(&fifth.png) == decoded(&second.png));
    assert_eq!(x.grabs(), grabs + 2);
    assert!(decoded(&fifth.png) == rgb(&x.grab().unwrap()));
}
