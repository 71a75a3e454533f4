//! Deployment keys given as 64 hex characters, or generated once and kept under `DATA_DIR`
//! (readable by the owner only).

use std::path::Path;

use rakazo_actors::keys::{KeyBytes, random_key};

use crate::auth::write_private;
use crate::config::Secret;

fn parse_hex(s: &str) -> Option<KeyBytes> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(key: &KeyBytes) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The configured key, or the one kept in `data_dir/file`, or a new one saved there.
pub fn load_or_create(
    configured: Option<&Secret>,
    data_dir: &Path,
    file: &str,
) -> Result<KeyBytes, String> {
    if let Some(secret) = configured {
        return parse_hex(&secret.0)
            .ok_or_else(|| "a configured key is not 64 hex characters".to_owned());
    }
    let path = data_dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_hex(&text)
            .ok_or_else(|| format!("{} is not a 64-hex-character key", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = random_key();
            write_private(&path, &to_hex(&key))
                .map_err(|e| format!("write {}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}
