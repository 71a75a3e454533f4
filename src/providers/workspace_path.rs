//! Workspace path rules shared by every provider: relative paths only, no `.` or `..`
//! segments, no empty segments, no NUL or other control characters; and how a path an agent
//! gives (relative to its folder, or from the workspace root) becomes one.

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

/// The workspace path meant by `path`, a path an agent gave: relative to `base` (a workspace
/// path: the bot's folder on a Team Computer, the root on a Private one), or from the
/// workspace root when it starts with `/`. Empty and `.` segments are dropped and `..` goes up
/// one name (never through what is on disk, so a link is never followed); climbing above the
/// root is refused. The result obeys [`segments`].
pub fn resolve(base: &str, path: &str, allow_root: bool) -> Result<String, ProviderError> {
    let reject = |why: &str| ProviderError::PathRejected(why.to_owned());
    if path.len() > MAX_PATH_LEN {
        return Err(reject("path too long"));
    }
    if path.chars().any(char::is_control) {
        return Err(reject("path contains NUL or a control character"));
    }
    let mut out: Vec<&str> = if path.starts_with('/') {
        Vec::new()
    } else {
        base.split('/').filter(|s| !s.is_empty()).collect()
    };
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(reject("path is outside the workspace"));
                }
            }
            s => out.push(s),
        }
    }
    normalize(&out.join("/"), allow_root)
}

/// How a workspace path reads for an agent whose relative paths start at `base`: relative
/// when it is under `base`, else from the workspace root (`/shared/x`).
pub fn shown(base: &str, workspace_path: &str) -> String {
    if base.is_empty() {
        return workspace_path.to_owned();
    }
    match workspace_path.strip_prefix(base) {
        Some("") => String::new(),
        Some(rest) if rest.starts_with('/') => rest[1..].to_owned(),
        _ => format!("/{workspace_path}"),
    }
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
    fn agent_paths_start_at_their_folder() {
        let bot = "bots/b1";
        assert_eq!(
            resolve(bot, "notes/a.txt", false).unwrap(),
            "bots/b1/notes/a.txt"
        );
        assert_eq!(
            resolve(bot, "./notes//a.txt", false).unwrap(),
            "bots/b1/notes/a.txt"
        );
        assert_eq!(resolve(bot, "../../shared/x", false).unwrap(), "shared/x");
        assert_eq!(resolve(bot, "/shared/x", false).unwrap(), "shared/x");
        assert_eq!(resolve(bot, "", true).unwrap(), "bots/b1");
        assert_eq!(resolve(bot, "../..", true).unwrap(), "");
        assert_eq!(resolve("", "a/../b", false).unwrap(), "b");
        for bad in ["../../../x", "/..", "/../etc/passwd", "a\0b", "a\nb"] {
            assert!(resolve(bot, bad, false).is_err(), "{bad:?}");
        }
        assert!(resolve(bot, "../..", false).is_err());
        assert_eq!(shown(bot, "bots/b1/notes/a.txt"), "notes/a.txt");
        assert_eq!(shown(bot, "bots/b12/x"), "/bots/b12/x");
        assert_eq!(shown(bot, "shared/x"), "/shared/x");
        assert_eq!(shown("", "shared/x"), "shared/x");
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
