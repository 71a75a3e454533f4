//! Screenshots straight from the X server: one persistent connection, `GetImage` of the root
//! window, a fast frame hash, and PNG encoding with the fastest filter/deflate settings.

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat, ImageOrder, Window};
use x11rb::rust_connection::RustConnection;

use super::DesktopError;

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
}

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
        Ok(Self {
            conn,
            root,
            width,
            height,
            keymap: None,
        })
    }

    /// Screen size in pixels.
    pub fn size(&self) -> (u32, u32) {
        (u32::from(self.width), u32::from(self.height))
    }

    /// Captures the whole screen.
    pub fn grab(&self) -> Result<RawFrame, DesktopError> {
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
        let (width, height) = self.size();
        let expected = width as usize * height as usize * 4;
        if reply.data.len() < expected {
            return Err(DesktopError::X(format!(
                "short image: {} of {expected} bytes",
                reply.data.len()
            )));
        }
        let mut bgrx = reply.data;
        bgrx.truncate(expected);
        let hash = frame_hash(&bgrx);
        Ok(RawFrame {
            width,
            height,
            bgrx,
            hash,
        })
    }
}

impl RawFrame {
    /// Encodes the frame as an 8-bit RGB PNG with the fastest settings (`Up` filter and
    /// fdeflate's ultra-fast mode): screens are large flat areas, so this is both quick and small.
    pub fn encode_png(&self) -> Result<Vec<u8>, DesktopError> {
        let mut rgb = Vec::with_capacity(self.width as usize * self.height as usize * 3);
        for px in self.bgrx.chunks_exact(4) {
            rgb.extend_from_slice(&[px[2], px[1], px[0]]);
        }
        let mut out = Vec::with_capacity(rgb.len() / 8);
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::Fastest);
        let mut writer = encoder.write_header().map_err(png_err)?;
        writer.write_image_data(&rgb).map_err(png_err)?;
        writer.finish().map_err(png_err)?;
        Ok(out)
    }
}

/// A fast 64-bit hash of frame bytes (word-wise multiply-xorshift, length mixed in). Not
/// cryptographic: it only tells consecutive frames of one screen apart.
pub fn frame_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(K);
        h ^= h >> 32;
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K);
    }
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
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
