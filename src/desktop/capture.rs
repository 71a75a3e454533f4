//! Screenshots straight from the X server: one persistent connection, the root window read
//! through memory shared with the server (MIT-SHM, see [`super::shared_image`]) or, where the
//! server cannot share memory with this connection, `GetImage`; a fast frame hash, and PNG
//! encoding with the fastest filter/deflate settings, at full size or scaled down to fit a
//! [`FrameSize`] (box filter, see [`super::frame_scale`]).
//!
//! The connection also listens to the X DAMAGE extension on the root window: the server says
//! when anything is drawn, so a screen that was not drawn on since the last frame is answered
//! from that frame (kept with its encoding) without capturing or deflating again, and a batch of
//! input is settled when the screen has been quiet for a short window (see
//! [`XDisplay::settle`]) instead of by comparing captured frames. A full-size frame is encoded
//! by bands of rows, and only the bands that changed since the last frame are deflated again
//! (see [`super::png_bands`]).

use std::time::{Duration, Instant};

use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::Event;
use x11rb::protocol::damage::{self, ConnectionExt as _, ReportLevel};
use x11rb::protocol::xproto::{
    ChangeWindowAttributesAux, ConnectionExt as _, EventMask, ImageFormat, ImageOrder, Window,
};
use x11rb::rust_connection::RustConnection;

use rakazo_actors::provider::FrameSize;

use super::DesktopError;
use super::frame_scale;
use super::png_bands::BandPng;
use super::shared_image::SharedImage;

/// A connection to one X display, shared by capture and input (see [`super::input`]).
pub struct XDisplay {
    /// The connection; requests on it are ordered, which keeps input batches in order.
    pub(crate) conn: RustConnection,
    /// The root window of the default screen.
    pub(crate) root: Window,
    /// Screen width in pixels.
    pub(crate) width: u16,
    /// Screen height in pixels.
    pub(crate) height: u16,
    /// Keyboard mapping, loaded on first keyboard input.
    pub(crate) keymap: Option<super::input::Keymap>,
    /// The DAMAGE object on the root window (`None`: the server lacks the extension, and
    /// every frame is captured).
    damage: Option<damage::Damage>,
    /// Whether the screen may have been drawn on since [`Self::frame`] last captured it.
    dirty: bool,
    /// The last frame [`Self::frame`] captured, its pixels and its last PNG.
    kept: Option<Kept>,
    /// How many times the screen was captured on this connection.
    grabs: u64,
    /// Shared-memory capture on this connection.
    shared: Shared,
    /// Full-size frames' PNG bands, re-encoded only where the screen changed.
    bands: BandPng,
    /// The pixel buffer of a frame no longer kept, which the next capture fills: capturing
    /// allocates (and faults in) no screen's worth of fresh memory per frame.
    spare: Vec<u8>,
    /// The watch of top-level windows begun by [`Self::watch_windows`], while it lasts.
    window_watch: Option<WindowWatch>,
}

/// A watch of a display's top-level windows.
struct WindowWatch {
    /// The sequence number of the request that began it: an event the server sent before it
    /// took effect (late news of an earlier watch) does not count.
    from: u64,
    /// Whether a window was unmapped, destroyed or reparented since.
    changed: bool,
}

/// Whether captures go through memory shared with the X server.
enum Shared {
    /// Not tried yet: the first capture tries.
    Untried,
    /// Attached: captures use it.
    Ready(SharedImage),
    /// Refused by the server, failed, or turned off: captures use `GetImage`.
    Off,
}

/// How a screen capture reached this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturePath {
    /// `ShmGetImage` into a memfd shared with the X server.
    SharedMemory,
    /// `GetImage`, the pixels through the X socket.
    Socket,
}

/// The last captured frame: its pixels, and the last scaled-down PNG made of them with the
/// size asked (its full-size PNG is the encoder's bands, put together again when asked).
struct Kept {
    raw: RawFrame,
    scaled: Option<(FrameSize, Shot)>,
}

/// A screen frame as PNG, with the hash of its pixels.
#[derive(Clone, Debug)]
pub struct Shot {
    /// Width of the image in pixels.
    pub width: u32,
    /// Height of the image in pixels.
    pub height: u32,
    /// The PNG.
    pub png: Vec<u8>,
    /// [`frame_hash`] of the screen's pixels (before any scaling).
    pub hash: u64,
    /// The screen's size when the image was scaled down to fit a [`FrameSize`]; `None` when
    /// the image is the screen at full size.
    pub screen: Option<(u32, u32)>,
}

impl From<Shot> for super::runtime::Observation {
    fn from(shot: Shot) -> Self {
        Self {
            frame: rakazo_actors::provider::Frame {
                png: shot.png,
                width: shot.width,
                height: shot.height,
                notice: None,
                screen: shot.screen,
            },
            hash: shot.hash,
        }
    }
}

/// Step between looks at the connection while waiting for a quiet screen.
const QUIET_STEP: Duration = Duration::from_millis(2);

/// A captured screen in the server's native 32-bit BGRX layout, with its hash.
pub struct RawFrame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// BGRX pixels, row-major, 4 bytes each.
    pub bgrx: Vec<u8>,
    /// [`frame_hash`] of the pixels: equal hashes mean an unchanged screen.
    pub hash: u64,
}

impl XDisplay {
    /// Connects to display `:number` on this host.
    pub fn connect(number: u32) -> Result<Self, DesktopError> {
        let (conn, screen) = x11rb::connect(Some(&format!(":{number}"))).map_err(x_err)?;
        Self::from_connection(conn, screen)
    }

    /// Connects to display `:number` through its socket `X<number>` in `socket_dir`: the
    /// X server runs elsewhere (in a container) and shares its `/tmp/.X11-unix` with us. The
    /// computer can write there, so the socket is reached without following links.
    pub fn connect_in(socket_dir: &std::path::Path, number: u32) -> Result<Self, DesktopError> {
        let stream = crate::providers::beneath::connect_socket(socket_dir, &format!("X{number}"))
            .map_err(|e| DesktopError::X(format!("display socket: {e}")))?;
        let (stream, _) =
            x11rb::rust_connection::DefaultStream::from_unix_stream(stream).map_err(x_err)?;
        let conn = RustConnection::connect_to_stream(stream, 0).map_err(x_err)?;
        Self::from_connection(conn, 0)
    }

    fn from_connection(conn: RustConnection, screen: usize) -> Result<Self, DesktopError> {
        let setup = conn.setup();
        if setup.image_byte_order != ImageOrder::LSB_FIRST {
            return Err(DesktopError::X(
                "only LSB-first image byte order is supported".into(),
            ));
        }
        let s = &setup.roots[screen];
        let (root, width, height, depth) =
            (s.root, s.width_in_pixels, s.height_in_pixels, s.root_depth);
        let bpp = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == depth)
            .map(|f| f.bits_per_pixel);
        if depth != 24 || bpp != Some(32) {
            return Err(DesktopError::X(format!(
                "unsupported visual: depth {depth}, {bpp:?} bits per pixel"
            )));
        }
        let damage = match watch_damage(&conn, root) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(event = "desktop.damage_unavailable", error = %e);
                None
            }
        };
        Ok(Self {
            conn,
            root,
            width,
            height,
            keymap: None,
            damage,
            dirty: true,
            kept: None,
            grabs: 0,
            shared: Shared::Untried,
            bands: BandPng::new(),
            spare: Vec::new(),
            window_watch: None,
        })
    }

    /// Has the server report every top-level window unmapped, destroyed or reparented from
    /// now on, so [`Self::end_window_watch`] can tell without asking it.
    pub fn watch_windows(&mut self) -> Result<(), DesktopError> {
        let selected = self.select_root_events(EventMask::SUBSTRUCTURE_NOTIFY)?;
        let from = selected.sequence_number();
        selected.check().map_err(x_err)?;
        self.window_watch = Some(WindowWatch {
            from,
            changed: false,
        });
        Ok(())
    }

    /// Ends the watch of [`Self::watch_windows`]: whether no top-level window went away while
    /// it lasted, read from the events that arrived, without a round trip to the server. False
    /// when nothing was watched, and an error when the connection ended (the server is gone).
    pub fn end_window_watch(&mut self) -> Result<bool, DesktopError> {
        // The watch ends whatever the events say, even on a connection that ended.
        let drained = self.take_damage();
        let unchanged = self.window_watch.take().is_some_and(|w| !w.changed);
        drained?;
        self.select_root_events(EventMask::NO_EVENT)?;
        self.conn.flush().map_err(x_err)?;
        Ok(unchanged)
    }

    /// Sets the events this connection hears of on the root window (only the window watch
    /// asks for any).
    fn select_root_events(
        &self,
        mask: EventMask,
    ) -> Result<x11rb::cookie::VoidCookie<'_, RustConnection>, DesktopError> {
        let events = ChangeWindowAttributesAux::new().event_mask(mask);
        self.conn
            .change_window_attributes(self.root, &events)
            .map_err(x_err)
    }

    /// Allows or forbids shared-memory capture on this connection (allowed by default; when
    /// allowed again, the next capture tries to attach once more).
    pub fn set_shared_memory(&mut self, allowed: bool) {
        match (allowed, std::mem::replace(&mut self.shared, Shared::Off)) {
            (true, Shared::Ready(image)) => self.shared = Shared::Ready(image),
            (true, _) => self.shared = Shared::Untried,
            (false, Shared::Ready(image)) => image.detach(&self.conn),
            (false, _) => {}
        }
    }

    /// How the next capture will reach this process, attaching the shared memory first if it
    /// was not tried yet.
    pub fn capture_path(&mut self) -> CapturePath {
        if self.shared_ready() {
            CapturePath::SharedMemory
        } else {
            CapturePath::Socket
        }
    }

    /// Whether the server reports damage on this connection.
    pub fn tracks_damage(&self) -> bool {
        self.damage.is_some()
    }

    /// How many times the screen was captured on this connection.
    pub fn grabs(&self) -> u64 {
        self.grabs
    }

    /// How many bands of rows full-size frames deflated on this connection
    /// ([`super::png_bands`]): every band for the first frame, then only changed ones.
    pub fn bands_deflated(&self) -> u64 {
        self.bands.deflated()
    }

    /// Reads the damage reports that arrived, and notes watched windows that went away;
    /// whether there were damage reports. Each report re-arms the damage object (reports come
    /// once per quiet-to-drawn change, so they never pile up).
    fn take_damage(&mut self) -> Result<bool, DesktopError> {
        let mut seen = false;
        while let Some((event, sequence)) =
            self.conn.poll_for_event_with_sequence().map_err(x_err)?
        {
            match event {
                Event::DamageNotify(_) => seen = true,
                Event::UnmapNotify(_) | Event::DestroyNotify(_) | Event::ReparentNotify(_) => {
                    // An event carries the last request of ours the server had done.
                    if let Some(watch) = &mut self.window_watch
                        && sequence >= watch.from
                    {
                        watch.changed = true;
                    }
                }
                _ => {}
            }
        }
        if seen {
            self.dirty = true;
            if let Some(d) = self.damage {
                self.conn
                    .damage_subtract(d, x11rb::NONE, x11rb::NONE)
                    .map_err(x_err)?;
                self.conn.flush().map_err(x_err)?;
            }
        }
        Ok(seen)
    }

    /// The screen as a full-size PNG (see [`Self::frame_sized`]).
    pub fn frame(&mut self) -> Result<Shot, DesktopError> {
        self.frame_sized(FrameSize::FULL)
    }

    /// The screen as PNG, scaled down to fit `size`: the last frame again when nothing was
    /// drawn since it was captured (no capture; no encoding either when the same size was
    /// asked last time), a fresh capture otherwise.
    pub fn frame_sized(&mut self, size: FrameSize) -> Result<Shot, DesktopError> {
        if self.damage.is_some() {
            // After a round trip, every report of drawing done before it has arrived.
            self.sync()?;
            self.take_damage()?;
            if !self.dirty
                && let Some(kept) = &mut self.kept
            {
                return kept.shot(&mut self.bands, size);
            }
            // Reports from here on belong to the frame after this one.
            self.dirty = false;
        }
        let raw = self.grab()?;
        let previous = self.kept.as_ref().map(|k| &k.raw);
        let shot = shot_of(&mut self.bands, &raw, previous, size)?;
        if self.damage.is_some() {
            let scaled = shot.screen.is_some().then(|| (size, shot.clone()));
            if let Some(old) = self.kept.replace(Kept { raw, scaled }) {
                self.recycle(old.raw);
            }
        } else {
            self.recycle(raw);
        }
        Ok(shot)
    }

    /// [`Self::settle_sized`] with a full-size frame.
    pub fn settle(
        &mut self,
        react: Duration,
        quiet: Duration,
        timeout: Duration,
    ) -> Result<Shot, DesktopError> {
        self.settle_sized(react, quiet, timeout, FrameSize::FULL)
    }

    /// Waits until the screen has been quiet (nothing drawn) for `quiet`, but at least
    /// `react` (time for an application to answer input), at most `timeout`, then returns
    /// [`Self::frame_sized`]. A screen that was not drawn on at all is answered without
    /// capturing. Without the DAMAGE extension, polls captured frames until two are equal
    /// instead.
    pub fn settle_sized(
        &mut self,
        react: Duration,
        quiet: Duration,
        timeout: Duration,
        size: FrameSize,
    ) -> Result<Shot, DesktopError> {
        if self.damage.is_none() {
            return self.settle_by_polling(react, quiet, timeout)?.shot(size);
        }
        let start = Instant::now();
        self.sync()?;
        let mut last_drawn = start;
        loop {
            if self.take_damage()? {
                last_drawn = Instant::now();
            }
            let now = Instant::now();
            let ready = (start + react).max(last_drawn + quiet);
            if now >= ready || now >= start + timeout {
                break;
            }
            std::thread::sleep(QUIET_STEP.min(ready - now));
        }
        self.frame_sized(size)
    }

    /// Screen size in pixels.
    pub fn size(&self) -> (u32, u32) {
        (u32::from(self.width), u32::from(self.height))
    }

    /// Captures the whole screen: through shared memory when the server takes it on this
    /// connection, through the socket (`GetImage`) otherwise.
    pub fn grab(&mut self) -> Result<RawFrame, DesktopError> {
        self.grabs += 1;
        let (width, height) = self.size();
        let expected = width as usize * height as usize * 4;
        let mut bgrx = std::mem::take(&mut self.spare);
        if !self.grab_shared(&mut bgrx) {
            bgrx = self.grab_socket(expected)?;
        }
        let hash = frame_hash(&bgrx);
        Ok(RawFrame {
            width,
            height,
            bgrx,
            hash,
        })
    }

    /// Hands `frame`'s buffer back for the next capture to fill (what [`Self::frame`] does
    /// with every frame it no longer keeps).
    pub fn recycle(&mut self, frame: RawFrame) {
        self.spare = frame.bgrx;
    }

    /// Whether captures go through shared memory, attaching it on first use (tried once per
    /// connection).
    fn shared_ready(&mut self) -> bool {
        if matches!(self.shared, Shared::Untried) {
            let len = usize::from(self.width) * usize::from(self.height) * 4;
            self.shared = match SharedImage::attach(&self.conn, len) {
                Ok(image) => {
                    tracing::debug!(event = "desktop.capture.shared_memory", bytes = len);
                    Shared::Ready(image)
                }
                Err(reason) => {
                    tracing::info!(event = "desktop.capture.shared_memory_unavailable", %reason);
                    Shared::Off
                }
            };
        }
        matches!(self.shared, Shared::Ready(_))
    }

    /// The screen through shared memory into `bgrx`; `false` when that path is off or just
    /// failed (then it stays off on this connection).
    fn grab_shared(&mut self, bgrx: &mut Vec<u8>) -> bool {
        if !self.shared_ready() {
            return false;
        }
        let Shared::Ready(image) = &self.shared else {
            return false;
        };
        match image.get_image(&self.conn, self.root, self.width, self.height, bgrx) {
            Ok(()) => true,
            Err(reason) => {
                tracing::warn!(event = "desktop.capture.shared_memory_failed", %reason);
                if let Shared::Ready(image) = std::mem::replace(&mut self.shared, Shared::Off) {
                    image.detach(&self.conn);
                }
                false
            }
        }
    }

    /// The screen through the X socket.
    fn grab_socket(&self, expected: usize) -> Result<Vec<u8>, DesktopError> {
        let reply = self
            .conn
            .get_image(
                ImageFormat::Z_PIXMAP,
                self.root,
                0,
                0,
                self.width,
                self.height,
                !0,
            )
            .map_err(x_err)?
            .reply()
            .map_err(x_err)?;
        if reply.data.len() < expected {
            return Err(DesktopError::X(format!(
                "short image: {} of {expected} bytes",
                reply.data.len()
            )));
        }
        let mut bgrx = reply.data;
        bgrx.truncate(expected);
        Ok(bgrx)
    }
}

impl RawFrame {
    /// Encodes the frame as an 8-bit RGB PNG with the fastest settings (`Up` filter and
    /// fdeflate's ultra-fast mode): screens are large flat areas, so this is both quick and small.
    pub fn encode_png(&self) -> Result<Vec<u8>, DesktopError> {
        // Written in place rather than pushed: the loop then needs no capacity check per pixel
        // (half the time of pushing three bytes at a time, 2.5 ms against 4.7 for 1280x800).
        let mut rgb = vec![0u8; self.width as usize * self.height as usize * 3];
        for (out, px) in rgb.chunks_exact_mut(3).zip(self.bgrx.chunks_exact(4)) {
            out.copy_from_slice(&[px[2], px[1], px[0]]);
        }
        encode_rgb(&rgb, self.width, self.height)
    }

    /// The frame as a [`Shot`] no larger than `size`: scaled down with a box filter straight
    /// from the BGRX pixels (so a smaller frame costs less to encode), or at full size.
    pub fn shot(&self, size: FrameSize) -> Result<Shot, DesktopError> {
        let (width, height) = size.fit(self.width, self.height);
        if (width, height) == (self.width, self.height) {
            return Ok(Shot {
                png: self.encode_png()?,
                width,
                height,
                hash: self.hash,
                screen: None,
            });
        }
        let rgb = frame_scale::box_downscale(
            &self.bgrx,
            frame_scale::BGRX,
            self.width,
            self.height,
            width,
            height,
        );
        Ok(Shot {
            png: encode_rgb(&rgb, width, height)?,
            width,
            height,
            hash: self.hash,
            screen: Some((self.width, self.height)),
        })
    }
}

impl Kept {
    /// The kept frame as a [`Shot`] fitting `size`: at full size from the encoder's bands
    /// (nothing deflated when they still hold this frame), scaled down from the last scaled
    /// shot when it had this size.
    fn shot(&mut self, bands: &mut BandPng, size: FrameSize) -> Result<Shot, DesktopError> {
        if let Some((kept_size, shot)) = &self.scaled
            && *kept_size == size
        {
            return Ok(shot.clone());
        }
        let shot = shot_of(bands, &self.raw, Some(&self.raw), size)?;
        if shot.screen.is_some() {
            self.scaled = Some((size, shot.clone()));
        }
        Ok(shot)
    }
}

/// `raw` as a [`Shot`] fitting `size`: at full size through the screen's band encoder (only
/// the bands that differ from `previous` are deflated, when `previous` is the frame it encoded
/// last), scaled down through [`RawFrame::shot`].
fn shot_of(
    bands: &mut BandPng,
    raw: &RawFrame,
    previous: Option<&RawFrame>,
    size: FrameSize,
) -> Result<Shot, DesktopError> {
    if size.fit(raw.width, raw.height) != (raw.width, raw.height) {
        return raw.shot(size);
    }
    Ok(Shot {
        png: bands.encode(raw, previous)?.png,
        width: raw.width,
        height: raw.height,
        hash: raw.hash,
        screen: None,
    })
}

/// Encodes 8-bit RGB pixels as PNG with the fastest settings (see [`RawFrame::encode_png`]).
pub fn encode_rgb(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, DesktopError> {
    let mut out = Vec::with_capacity(rgb.len() / 8);
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fastest);
    let mut writer = encoder.write_header().map_err(png_err)?;
    writer.write_image_data(rgb).map_err(png_err)?;
    writer.finish().map_err(png_err)?;
    Ok(out)
}

/// A fast 64-bit hash of frame bytes (XXH3). Not cryptographic: it only tells consecutive
/// frames of one screen apart.
pub fn frame_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Starts damage reports for everything drawn on the screen; `None` without the extension.
fn watch_damage(
    conn: &RustConnection,
    root: Window,
) -> Result<Option<damage::Damage>, DesktopError> {
    if conn
        .extension_information(damage::X11_EXTENSION_NAME)
        .map_err(x_err)?
        .is_none()
    {
        return Ok(None);
    }
    // The version handshake must come before any other DAMAGE request.
    conn.damage_query_version(1, 1)
        .map_err(x_err)?
        .reply()
        .map_err(x_err)?;
    let id = conn.generate_id().map_err(x_err)?;
    conn.damage_create(id, root, ReportLevel::NON_EMPTY)
        .map_err(x_err)?
        .check()
        .map_err(x_err)?;
    Ok(Some(id))
}

pub(crate) fn x_err(e: impl std::fmt::Display) -> DesktopError {
    DesktopError::X(e.to_string())
}

fn png_err(e: png::EncodingError) -> DesktopError {
    DesktopError::X(format!("png: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tells_single_pixel_changes_apart() {
        let a = vec![0u8; 1280 * 800 * 4];
        let mut b = a.clone();
        b[1280 * 400 * 4 + 17] = 1;
        assert_eq!(frame_hash(&a), frame_hash(&a.clone()));
        assert_ne!(frame_hash(&a), frame_hash(&b));
        assert_ne!(frame_hash(&a[..8]), frame_hash(&a[..9]));
    }

    #[test]
    fn encodes_a_decodable_png() {
        let (width, height) = (4u32, 2u32);
        let mut bgrx = vec![0u8; 32];
        bgrx[0..4].copy_from_slice(&[1, 2, 3, 0]);
        let frame = RawFrame {
            width,
            height,
            hash: frame_hash(&bgrx),
            bgrx,
        };
        let png = frame.encode_png().unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (4, 2));
        assert_eq!(&buf[0..3], &[3, 2, 1]);
    }
}
