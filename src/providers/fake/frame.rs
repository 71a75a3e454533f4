//! Frames of the fake desktops: a small PNG whose pixels follow the screen's state, so equal
//! states give byte-identical frames and any action changes the picture.

use std::hash::{DefaultHasher, Hash, Hasher};

use rakazo_actors::provider::{Frame, ProviderError};

/// Frame size of fake screens.
pub const WIDTH: u32 = 160;
/// Frame size of fake screens.
pub const HEIGHT: u32 = 100;

/// Render a frame for a state digest.
pub fn render(state: &impl Hash) -> Result<Frame, ProviderError> {
    let mut h = DefaultHasher::new();
    state.hash(&mut h);
    let seed = h.finish().to_le_bytes();
    let mut pixels = Vec::with_capacity((WIDTH * HEIGHT * 3) as usize);
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            let band = ((x / 20 + y / 20) % 8) as usize;
            pixels.extend_from_slice(&[seed[band], seed[(band + 3) % 8], seed[(band + 5) % 8]]);
        }
    }
    let mut png = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png, WIDTH, HEIGHT);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let fail = |e: png::EncodingError| ProviderError::Failed(format!("encode frame: {e}"));
        let mut writer = enc.write_header().map_err(fail)?;
        writer.write_image_data(&pixels).map_err(fail)?;
    }
    Ok(Frame {
        png,
        width: WIDTH,
        height: HEIGHT,
        notice: None,
        screen: None,
    })
}
