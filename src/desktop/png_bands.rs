//! PNG encoding that re-encodes only the rows that changed. The image is cut into bands of
//! [`BAND_ROWS`] rows, each filtered and deflated on its own (its first row with the `Sub`
//! filter, which looks only within the row, the others with `Up`; a full flush ends each
//! band's deflate output on a byte boundary and the next band starts a fresh window), so a
//! band's bytes depend on its own pixels alone. The encoder keeps every band's output and
//! Adler-32, and for the next frame deflates only the bands whose pixels differ from the frame
//! it last encoded; the zlib stream is the bands in order, a final empty block, and the
//! Adler-32 of the whole, combined from the bands'. The result is an ordinary PNG, written
//! straight into its buffer.

use flate2::{Compress, Compression, FlushCompress};
use zlib_rs::adler32::{adler32, adler32_combine};

use super::DesktopError;
use super::capture::RawFrame;

/// Rows per band: small enough that a caret or a spinner re-encodes little, large enough that
/// each band compresses about as well as the whole image (16 rows of a 1280-wide screen are
/// 61 KiB before compression, twice deflate's window).
pub const BAND_ROWS: usize = 16;
/// zlib header for a deflate stream with a 32 KiB window and the fastest level.
const ZLIB_HEADER: [u8; 2] = [0x78, 0x01];
/// The eight bytes every PNG starts with.
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
/// A final, empty block with fixed codes (`BFINAL`, `BTYPE=01`, end of block).
const FINAL_BLOCK: [u8; 2] = [0x03, 0x00];

/// One band's deflated bytes and the Adler-32 of its filtered bytes.
#[derive(Clone, Default)]
struct Band {
    deflated: Vec<u8>,
    adler: u32,
    len: u64,
}

/// Encodes the frames of one screen, keeping each band's encoding for the next frame.
pub struct BandPng {
    /// The size and [`RawFrame::hash`] of the frame the bands hold.
    encoded: Option<(u32, u32, u64)>,
    bands: Vec<Band>,
    deflate: Compress,
    filtered: Vec<u8>,
    /// Bands deflated since the encoder was made.
    deflated: u64,
}

/// A frame as PNG, and how much of it was deflated anew.
pub struct Encoded {
    /// The PNG.
    pub png: Vec<u8>,
    /// Bands deflated for this frame.
    pub deflated: usize,
    /// Bands in the image.
    pub bands: usize,
}

impl Default for BandPng {
    fn default() -> Self {
        Self::new()
    }
}

impl BandPng {
    /// An encoder holding no bands yet.
    pub fn new() -> Self {
        BandPng {
            encoded: None,
            bands: Vec::new(),
            deflate: Compress::new(Compression::fast(), false),
            filtered: Vec::new(),
            deflated: 0,
        }
    }

    /// Bands deflated since the encoder was made.
    pub fn deflated(&self) -> u64 {
        self.deflated
    }

    /// `frame` as an 8-bit RGB PNG. When `previous` is the frame this encoder encoded last
    /// (the same size and hash), only the bands whose pixels differ from it are deflated.
    pub fn encode(
        &mut self,
        frame: &RawFrame,
        previous: Option<&RawFrame>,
    ) -> Result<Encoded, DesktopError> {
        let (width, height) = (frame.width as usize, frame.height as usize);
        let stride = width * 4;
        if frame.bgrx.len() < stride * height {
            return Err(DesktopError::X("short frame".into()));
        }
        let count = height.div_ceil(BAND_ROWS);
        let base = previous.filter(|p| {
            self.encoded == Some((p.width, p.height, p.hash))
                && (p.width, p.height) == (frame.width, frame.height)
                && p.bgrx.len() >= stride * height
                && self.bands.len() == count
        });
        if base.is_none() {
            self.bands = vec![Band::default(); count];
        }
        self.encoded = None;
        let mut deflated = 0;
        for (i, band) in self.bands.iter_mut().enumerate() {
            let rows = i * BAND_ROWS * stride..((i + 1) * BAND_ROWS).min(height) * stride;
            // The frame itself as its own base (an unchanged screen) needs no comparing.
            if let Some(p) = base
                && (std::ptr::eq(p, frame) || p.bgrx[rows.clone()] == frame.bgrx[rows.clone()])
            {
                continue;
            }
            filter_band(&frame.bgrx[rows], width, &mut self.filtered);
            deflate_band(&mut self.deflate, &self.filtered, &mut band.deflated)?;
            band.adler = adler32(1, &self.filtered);
            band.len = self.filtered.len() as u64;
            deflated += 1;
        }
        let png = self.assemble(frame.width, frame.height);
        self.encoded = Some((frame.width, frame.height, frame.hash));
        self.deflated += deflated as u64;
        Ok(Encoded {
            png,
            deflated,
            bands: count,
        })
    }
}

impl BandPng {
    /// The PNG of the bands held: signature, header, one `IDAT` chunk (the zlib stream: the
    /// bands in order, a final empty block and the Adler-32 of the whole, combined from the
    /// bands'), written straight into the image's buffer, and the end chunk.
    fn assemble(&self, width: u32, height: u32) -> Vec<u8> {
        let deflated: usize = self.bands.iter().map(|b| b.deflated.len()).sum();
        let idat_len = ZLIB_HEADER.len() + deflated + FINAL_BLOCK.len() + 4;
        let mut png = Vec::with_capacity(PNG_SIGNATURE.len() + 25 + 12 + idat_len + 12);
        png.extend_from_slice(&PNG_SIGNATURE);
        let mut header = [0u8; 13];
        header[..4].copy_from_slice(&width.to_be_bytes());
        header[4..8].copy_from_slice(&height.to_be_bytes());
        // 8 bits per sample, RGB; deflate, adaptive filtering, no interlace.
        header[8..].copy_from_slice(&[8, 2, 0, 0, 0]);
        chunk(&mut png, b"IHDR", |out| out.extend_from_slice(&header));
        chunk(&mut png, b"IDAT", |out| {
            out.extend_from_slice(&ZLIB_HEADER);
            let mut adler = 1;
            for band in &self.bands {
                out.extend_from_slice(&band.deflated);
                adler = adler32_combine(adler, band.adler, band.len);
            }
            out.extend_from_slice(&FINAL_BLOCK);
            out.extend_from_slice(&adler.to_be_bytes());
        });
        chunk(&mut png, b"IEND", |_| {});
        png
    }
}

/// Appends a PNG chunk of `kind` whose data `write` appends: length, type, data, CRC-32 of
/// type and data.
fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], write: impl FnOnce(&mut Vec<u8>)) {
    let at = png.len();
    png.extend_from_slice(&[0; 4]);
    png.extend_from_slice(kind);
    write(png);
    let len = u32::try_from(png.len() - at - 8).expect("a chunk under 4 GiB");
    png[at..at + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc32fast::hash(&png[at + 4..]);
    png.extend_from_slice(&crc.to_be_bytes());
}

/// Filters one band of BGRX rows into PNG scanlines of RGB: the first row with `Sub`, the
/// others with `Up` against the row above within the band.
fn filter_band(bgrx: &[u8], width: usize, out: &mut Vec<u8>) {
    let stride = width * 4;
    let line = width * 3 + 1;
    let rows = bgrx.len() / stride;
    out.clear();
    out.resize(rows * line, 0);
    for (y, scan) in out.chunks_exact_mut(line).enumerate() {
        let row = &bgrx[y * stride..(y + 1) * stride];
        let (kind, pixels) = scan.split_at_mut(1);
        if y == 0 {
            kind[0] = 1;
            let mut left = [0u8; 3];
            for (d, px) in pixels.chunks_exact_mut(3).zip(row.chunks_exact(4)) {
                let rgb = [px[2], px[1], px[0]];
                for c in 0..3 {
                    d[c] = rgb[c].wrapping_sub(left[c]);
                }
                left = rgb;
            }
        } else {
            kind[0] = 2;
            let above = &bgrx[(y - 1) * stride..y * stride];
            for ((d, px), up) in pixels
                .chunks_exact_mut(3)
                .zip(row.chunks_exact(4))
                .zip(above.chunks_exact(4))
            {
                d[0] = px[2].wrapping_sub(up[2]);
                d[1] = px[1].wrapping_sub(up[1]);
                d[2] = px[0].wrapping_sub(up[0]);
            }
        }
    }
}

/// Deflates `data` on a fresh window, ending with a full flush (byte-aligned, not final).
fn deflate_band(
    deflate: &mut Compress,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), DesktopError> {
    deflate.reset();
    out.clear();
    // Incompressible data grows by at most 5 bytes per 16 KiB block, plus the flush marker.
    out.reserve(data.len() + data.len() / 1000 + 64);
    loop {
        let read = deflate.total_in() as usize;
        deflate
            .compress_vec(&data[read..], out, FlushCompress::Full)
            .map_err(|e| DesktopError::X(format!("deflate: {e}")))?;
        if deflate.total_in() as usize == data.len() && out.len() < out.capacity() {
            return Ok(());
        }
        out.reserve(64 * 1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desktop::capture::frame_hash;

    fn frame(width: u32, height: u32, mut paint: impl FnMut(u32, u32) -> [u8; 3]) -> RawFrame {
        let mut bgrx = Vec::with_capacity((width * height * 4) as usize);
        for y in 0..height {
            for x in 0..width {
                let [r, g, b] = paint(x, y);
                bgrx.extend_from_slice(&[b, g, r, 0]);
            }
        }
        RawFrame {
            width,
            height,
            hash: frame_hash(&bgrx),
            bgrx,
        }
    }

    fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes))
            .read_info()
            .unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    fn rgb(f: &RawFrame) -> Vec<u8> {
        f.bgrx
            .chunks_exact(4)
            .flat_map(|p| [p[2], p[1], p[0]])
            .collect()
    }

    fn busy(x: u32, y: u32) -> [u8; 3] {
        let n = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 7;
        [(x + y) as u8, (n % 7) as u8 * 36, (x * 3) as u8]
    }

    #[test]
    fn every_frame_decodes_to_its_pixels_and_only_changed_bands_are_deflated() {
        // 37 rows: two full bands and a short one.
        let (w, h) = (203, 37);
        let mut enc = BandPng::new();
        let first = frame(w, h, busy);
        let out = enc.encode(&first, None).unwrap();
        assert_eq!((out.deflated, out.bands), (3, 3));
        assert_eq!(decode(&out.png), (w, h, rgb(&first)));

        // A caret in the second band only.
        let second = frame(w, h, |x, y| {
            if (20..24).contains(&y) && x == 50 {
                [0, 0, 0]
            } else {
                busy(x, y)
            }
        });
        let out = enc.encode(&second, Some(&first)).unwrap();
        assert_eq!(out.deflated, 1);
        assert_eq!(decode(&out.png), (w, h, rgb(&second)));

        // The same pixels again: nothing to deflate, the same image.
        let out = enc.encode(&second, Some(&second)).unwrap();
        assert_eq!(out.deflated, 0);
        assert_eq!(decode(&out.png), (w, h, rgb(&second)));

        // A previous frame this encoder did not encode last is not trusted.
        let out = enc.encode(&second, Some(&first)).unwrap();
        assert_eq!(out.deflated, 3);
        assert_eq!(decode(&out.png), (w, h, rgb(&second)));

        // A new size starts over.
        let small = frame(40, 16, busy);
        let out = enc.encode(&small, Some(&second)).unwrap();
        assert_eq!((out.deflated, out.bands), (1, 1));
        assert_eq!(decode(&out.png), (40, 16, rgb(&small)));
    }

    #[test]
    fn incompressible_bands_still_make_a_valid_image() {
        let mut seed = 0x9E37_79B9u32;
        let noise = frame(300, 50, |_, _| {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            [(seed >> 24) as u8, (seed >> 16) as u8, (seed >> 8) as u8]
        });
        let out = BandPng::new().encode(&noise, None).unwrap();
        assert_eq!(decode(&out.png), (300, 50, rgb(&noise)));
    }
}
