//! Screen capture through memory shared with the X server: a memfd handed to the server over
//! the X socket (MIT-SHM 1.2 `AttachFd`), filled by `ShmGetImage` and read back with one
//! `pread`, so the pixels never travel through the socket.
//!
//! A memfd, not a System V segment: it needs no shared IPC namespace (an X server in a
//! container takes it over the unix socket like any other), and nothing outlives the
//! connection (the server drops its mapping when the connection ends, our descriptor closes
//! when the capture is dropped; no segment id is ever created, so none can be left behind).
//! The file is sealed against resizing, and read with `pread` rather than mapped, so a server
//! that misbehaves can at worst hand back wrong pixels, never fault this process.

use std::fs::File;
use std::os::unix::fs::FileExt as _;

use rustix::fs::{MemfdFlags, SealFlags};
use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::shm::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{ImageFormat, Window};
use x11rb::rust_connection::RustConnection;

/// Name of the memfd, as it shows in `/proc/<pid>/fd` and the server's `/proc/<pid>/maps`.
pub const MEMFD_NAME: &str = "rakazo-capture";

/// A memfd of one screen's size, attached to the X server as a shared-memory segment.
pub(crate) struct SharedImage {
    /// The server's name for the segment.
    seg: shm::Seg,
    /// Our descriptor of the memfd.
    file: File,
    /// Size in bytes (one 32-bit frame of the screen).
    len: usize,
}

impl SharedImage {
    /// Attaches a `len`-byte memfd on `conn`; `Err` with the reason when the server lacks
    /// MIT-SHM 1.2 or refuses the descriptor.
    pub(crate) fn attach(conn: &RustConnection, len: usize) -> Result<Self, String> {
        if conn
            .extension_information(shm::X11_EXTENSION_NAME)
            .map_err(reason)?
            .is_none()
        {
            return Err("the server has no MIT-SHM extension".into());
        }
        let version = conn
            .shm_query_version()
            .map_err(reason)?
            .reply()
            .map_err(reason)?;
        if (version.major_version, version.minor_version) < (1, 2) {
            return Err(format!(
                "MIT-SHM {}.{} takes no file descriptors",
                version.major_version, version.minor_version
            ));
        }
        let fd =
            rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(reason)?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(reason)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(reason)?;
        let theirs = fd.try_clone().map_err(reason)?;
        let seg = conn.generate_id().map_err(reason)?;
        // The server maps the memfd and closes the descriptor it received.
        conn.shm_attach_fd(seg, theirs, false)
            .map_err(reason)?
            .check()
            .map_err(reason)?;
        Ok(Self {
            seg,
            file: File::from(fd),
            len,
        })
    }

    /// The `width`x`height` Z-pixmap of `window` from (0, 0), as `len` bytes in `out` (whose
    /// memory is reused: a buffer kept from an earlier frame costs no allocation).
    pub(crate) fn get_image(
        &self,
        conn: &RustConnection,
        window: Window,
        width: u16,
        height: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let reply = conn
            .shm_get_image(
                window,
                0,
                0,
                width,
                height,
                !0,
                ImageFormat::Z_PIXMAP.into(),
                self.seg,
                0,
            )
            .map_err(reason)?
            .reply()
            .map_err(reason)?;
        if (reply.size as usize) < self.len {
            return Err(format!("short image: {} of {} bytes", reply.size, self.len));
        }
        out.resize(self.len, 0);
        self.file.read_exact_at(out, 0).map_err(reason)
    }

    /// Asks the server to drop its mapping (the connection stays open); our descriptor closes
    /// with `self`.
    pub(crate) fn detach(self, conn: &RustConnection) {
        if let Ok(cookie) = conn.shm_detach(self.seg) {
            let _ = cookie.check();
        }
    }
}

fn reason(e: impl std::fmt::Display) -> String {
    e.to_string()
}
