//! A bare Xvfb (no window manager) on a free display for tests that talk X directly.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rakazo::desktop::capture::XDisplay;

/// A bare Xvfb on a free display; stopped when dropped.
pub struct Xvfb {
    pub child: Child,
    pub display: u32,
}

impl Xvfb {
    /// Starts a 640x480x24 screen on the first free display from `first` (tests running at
    /// once use apart ranges), with `extra` server arguments.
    pub fn start_with(first: u32, extra: &[&str]) -> Self {
        let display = (first..first + 30)
            .find(|n| {
                !std::path::Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                    && !std::path::Path::new(&format!("/tmp/.X{n}-lock")).exists()
            })
            .expect("a free display number");
        // Servers starting at once on a machine without the socket directory race to make
        // it, and the one whose `mkdir` loses runs on without a socket: it is made first.
        let _ = Command::new("mkdir")
            .args(["-p", "-m", "1777", "/tmp/.X11-unix"])
            .status();
        let child = Command::new("Xvfb")
            .args([
                &format!(":{display}"),
                "-screen",
                "0",
                "640x480x24",
                "-nolisten",
                "tcp",
                // Without it the server resets when its last client leaves (the readiness
                // probe below is one), and a connection made during the reset is refused.
                "-noreset",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb is installed");
        let deadline = Instant::now() + Duration::from_secs(20);
        while XDisplay::connect(display).is_err() {
            assert!(Instant::now() < deadline, "Xvfb :{display} did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, display }
    }

    /// [`Self::start_with`] without extra arguments.
    pub fn start(first: u32) -> Self {
        Self::start_with(first, &[])
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        // SIGTERM, so the server removes its socket and lock file.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// The RGB pixel at (`x`, `y`) of a PNG, and the PNG's size.
pub fn pixel(png: &[u8], x: usize, y: usize) -> [u8; 3] {
    let mut reader = png::Decoder::new(std::io::Cursor::new(png))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let i = y * info.line_size + x * 3;
    [buf[i], buf[i + 1], buf[i + 2]]
}
