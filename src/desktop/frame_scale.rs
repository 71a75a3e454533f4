//! Scaled-down screenshots: a box filter (every output pixel the mean of the screen pixels it
//! covers) straight from the captured pixels to 8-bit RGB, and the same for a PNG another
//! provider returned at full size.

use rakazo_actors::provider::{Frame, FrameSize};

use super::DesktopError;
use super::capture::encode_rgb;

/// Where the colour channels sit in one source pixel.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Bytes per pixel.
    pub bytes: usize,
    /// Offsets of red, green and blue.
    pub rgb: [usize; 3],
}

/// The X server's 32-bit Z-pixmap on a little-endian 24-bit visual.
pub const BGRX: Layout = Layout {
    bytes: 4,
    rgb: [2, 1, 0],
};

/// The span `[start, end)` of source pixels that output pixel `i` of `out` covers in `len`.
fn span(i: usize, len: usize, out: usize) -> (usize, usize) {
    let start = i * len / out;
    let end = ((i + 1) * len / out).max(start + 1);
    (start, end.min(len))
}

/// `src` (`width`x`height` pixels of `layout`, rows packed) scaled down to `out_width`x
/// `out_height` 8-bit RGB with a box filter. The output size must not exceed the source size.
pub fn box_downscale(
    src: &[u8],
    layout: Layout,
    width: u32,
    height: u32,
    out_width: u32,
    out_height: u32,
) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let (ow, oh) = (out_width as usize, out_height as usize);
    assert!(
        ow <= w && oh <= h && ow > 0 && oh > 0,
        "a box filter only shrinks"
    );
    let bytes = layout.bytes;
    let [r, g, b] = layout.rgb;
    let columns: Vec<(usize, usize)> = (0..ow).map(|i| span(i, w, ow)).collect();
    let mut out = Vec::with_capacity(ow * oh * 3);
    let mut sums = vec![0u32; ow * 3];
    for oy in 0..oh {
        let (y0, y1) = span(oy, h, oh);
        sums.fill(0);
        for y in y0..y1 {
            let row = &src[y * w * bytes..(y + 1) * w * bytes];
            for (sum, &(x0, x1)) in sums.chunks_exact_mut(3).zip(&columns) {
                let (mut sr, mut sg, mut sb) = (0u32, 0u32, 0u32);
                for px in row[x0 * bytes..x1 * bytes].chunks_exact(bytes) {
                    sr += u32::from(px[r]);
                    sg += u32::from(px[g]);
                    sb += u32::from(px[b]);
                }
                sum[0] += sr;
                sum[1] += sg;
                sum[2] += sb;
            }
        }
        let rows = (y1 - y0) as u32;
        for (sum, &(x0, x1)) in sums.chunks_exact(3).zip(&columns) {
            let n = rows * (x1 - x0) as u32;
            out.extend(sum.iter().map(|&s| ((s + n / 2) / n) as u8));
        }
    }
    out
}

/// `frame` scaled down to fit `size` when it is larger (decoded, filtered, encoded again):
/// for providers that return screenshots at full size only.
pub fn fit_png(frame: Frame, size: FrameSize) -> Result<Frame, DesktopError> {
    let (width, height) = size.fit(frame.width, frame.height);
    if (width, height) == (frame.width, frame.height) {
        return Ok(frame);
    }
    let mut decoder = png::Decoder::new(std::io::Cursor::new(&frame.png));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(decode_err)?;
    let mut pixels = vec![0; reader.output_buffer_size().unwrap_or(0)];
    let info = reader.next_frame(&mut pixels).map_err(decode_err)?;
    let layout = match info.color_type {
        png::ColorType::Rgb => Layout {
            bytes: 3,
            rgb: [0, 1, 2],
        },
        png::ColorType::Rgba => Layout {
            bytes: 4,
            rgb: [0, 1, 2],
        },
        png::ColorType::Grayscale => Layout {
            bytes: 1,
            rgb: [0, 0, 0],
        },
        png::ColorType::GrayscaleAlpha => Layout {
            bytes: 2,
            rgb: [0, 0, 0],
        },
        png::ColorType::Indexed => {
            return Err(DesktopError::X("png: palette left after expansion".into()));
        }
    };
    // Rows are packed for 8-bit channels, as `box_downscale` wants them.
    pixels.truncate(info.buffer_size());
    let (width, height) = size.fit(info.width, info.height);
    let rgb = box_downscale(&pixels, layout, info.width, info.height, width, height);
    Ok(Frame {
        png: encode_rgb(&rgb, width, height)?,
        width,
        height,
        notice: frame.notice,
        screen: Some((info.width, info.height)),
    })
}

fn decode_err(e: png::DecodingError) -> DesktopError {
    DesktopError::X(format!("png: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_filter_averages_the_pixels_each_output_pixel_covers() {
        // 4x2 BGRX: left half black, right half white, one red pixel at (0, 0).
        let mut src = Vec::new();
        for y in 0..2 {
            for x in 0..4 {
                let px: [u8; 4] = match (x, y) {
                    (0, 0) => [0, 0, 255, 0],
                    (0 | 1, _) => [0, 0, 0, 0],
                    _ => [255, 255, 255, 0],
                };
                src.extend_from_slice(&px);
            }
        }
        let out = box_downscale(&src, BGRX, 4, 2, 2, 1);
        assert_eq!(out, vec![64, 0, 0, 255, 255, 255]);
    }

    #[test]
    fn a_full_size_png_is_scaled_to_fit() {
        let (w, h) = (300u32, 200u32);
        let rgb: Vec<u8> = (0..w * h).flat_map(|i| [(i % 251) as u8, 7, 9]).collect();
        let frame = Frame {
            png: encode_rgb(&rgb, w, h).unwrap(),
            width: w,
            height: h,
            notice: None,
            screen: None,
        };
        let size = FrameSize {
            max_width: Some(150),
            max_height: None,
        };
        let scaled = fit_png(frame.clone(), size).unwrap();
        assert_eq!((scaled.width, scaled.height), (150, 100));
        assert_eq!(scaled.screen, Some((300, 200)));
        let decoder = png::Decoder::new(std::io::Cursor::new(&scaled.png));
        let info = decoder.read_info().unwrap().info().clone();
        assert_eq!((info.width, info.height), (150, 100));
        // A frame that already fits is left alone.
        let same = fit_png(frame.clone(), FrameSize::FULL).unwrap();
        assert_eq!(same.png, frame.png);
    }
}
