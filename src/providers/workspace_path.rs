//! Workspace path rules shared by every provider: relative paths only, no `.` or `..`
//! segments, no empty segments, no NUL or other control characters.

use rakazo_actors::provider::ProviderError;

/// Whether a target names a web page (`http(s)://...`) rather than a workspace path.
pub fn is_web_url(target: &str) -> bool {
    target.starts_with("http://") || target.starts_with("https://")
}

/// Longest accepted path, in bytes.
const MAX_PATH_LEN: usize = 4096;

/// Normalize a workspace path into its segments, refusing anything that could escape the
/// workspace root. A trailing slash is tolerated; the root itself is `""` only where
/// `allow_root` says so.
pub fn segments(path: &str, allow_root: bool) -> Result<Vec<String>, ProviderError> {
    let reject = |why: &str| ProviderError::PathRejected(why.to_owned());
    if path.len() > MAX_PATH_LEN {
        return Err(reject("path too long"));
    }
    if path.chars().any(char::is_control) {
        return Err(reject("path contains NUL or a control character"));
    }
    if path.starts_with('/') || path.starts_with('\\') {
        return Err(reject("absolute paths are outside this computer's home"));
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return if allow_root {
            Ok(Vec::new())
        } else {
            Err(reject("empty path"))
        };
    }
    let mut out = Vec::new();
    for seg in trimmed.split('/') {
        match seg {
            "" | "." => return Err(reject("empty or '.' path segment")),
            ".." => return Err(reject("path is outside this computer's home")),
            s => out.push(s.to_owned()),
        }
    }
    Ok(out)
}

/// The normalized string form of a workspace path.
pub fn normalize(path: &str, allow_root: bool) -> Result<String, ProviderError> {
    Ok(segments(path, allow_root)?.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        assert_eq!(normalize("a/b.txt", false).unwrap(), "a/b.txt");
        assert_eq!(normalize("dir/", false).unwrap(), "dir");
        assert_eq!(normalize("", true).unwrap(), "");
    }

    #[test]
    fn refuses_escapes() {
        for bad in [
            "../x",
            "/etc/passwd",
            "a/../../b",
            "a/./b",
            "a//b",
            "",
            "a\0b",
            "a\nb",
            "a\u{1b}[2Jb",
        ] {
            assert!(normalize(bad, false).is_err(), "{bad:?}");
        }
    }
}
