//! Deployment keys given as 64 hex characters, or generated once and kept under `DATA_DIR`
//! (readable by the owner only).

use std::path::Path;

use rakazo_actors::keys::{KeyBytes, random_key};

use crate::auth::write_private;
use crate::config::Secret;

fn parse_hex(s: &str) -> Option<KeyBytes> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut out).ok()?;
    Some(out)
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
            write_private(&path, &hex::encode(key))
                .map_err(|e| format!("write {}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}

/// The configured key, or the one in `data_dir/file`; never creates one.
pub fn load(configured: Option<&Secret>, data_dir: &Path, file: &str) -> Result<KeyBytes, String> {
    if let Some(secret) = configured {
        return parse_hex(&secret.0)
            .ok_or_else(|| "a configured key is not 64 hex characters".to_owned());
    }
    let path = data_dir.join(file);
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    parse_hex(&text).ok_or_else(|| format!("{} is not a 64-hex-character key", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_only_from_64_hex_characters() {
        let key = hex::encode([7u8; 32]);
        assert_eq!(parse_hex(&format!(" {key}\n")), Some([7u8; 32]));
        assert_eq!(parse_hex(&key[..62]), None);
        assert_eq!(parse_hex(&"zz".repeat(32)), None);
        // 64 bytes, but not 64 characters: refused, never a panic.
        assert_eq!(parse_hex(&"é".repeat(32)), None);
    }
}
