//! The screen viewer the proxy serves itself: noVNC's page and files from the host's package
//! directory (Debian's `novnc`, `/usr/share/novnc`), read once into an allowlist, plus the
//! reporter script. A computer's gateway never serves a page or a script to a browser: only the
//! RFB websocket is relayed from it.
//!
//! What is served: `vnc.html` (with `<script src="rakazo-reporter.js">` as the first child of
//! `<head>` and `<link rel="stylesheet" href="rakazo-screen.css">` as its last), [`REPORTER_PATH`],
//! [`STYLE_PATH`], and the regular files under `app/`, `core/` and `vendor/` whose
//! extension has a known content type. Nothing else of the directory (not `utils/`, not the
//! other pages). Links are followed only when their target stays inside the directory;
//! directories are never entered through a link. Lookups are exact matches on the relative path,
//! so a request path never reaches the file system.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use actix_web::web::Bytes;

use crate::page::{REPORTER_JS, STYLE_CSS};

/// Where Debian's `novnc` package puts noVNC.
pub const DEFAULT_NOVNC_DIR: &str = "/usr/share/novnc";
/// The page the viewer opens.
pub const PAGE_PATH: &str = "vnc.html";
/// The reporter script's path under the capability.
pub const REPORTER_PATH: &str = "rakazo-reporter.js";
/// The screen stylesheet's path under the capability.
pub const STYLE_PATH: &str = "rakazo-screen.css";
/// The directories of the package that are served (recursively).
const SERVED_DIRS: &[&str] = &["app", "core", "vendor"];
/// Files the viewer cannot work without; a directory lacking one is not a noVNC.
const REQUIRED: &[&str] = &[PAGE_PATH, "app/ui.js", "core/rfb.js"];
/// Upper bounds on what is read, so a wrong directory cannot exhaust memory.
const MAX_FILES: usize = 2_000;
const MAX_TOTAL_BYTES: u64 = 32 * 1024 * 1024;
const MAX_DEPTH: usize = 8;

/// Content types by extension; files with other extensions are not served.
const TYPES: &[(&str, &str)] = &[
    ("html", "text/html; charset=utf-8"),
    ("js", "text/javascript; charset=utf-8"),
    ("css", "text/css; charset=utf-8"),
    ("json", "application/json"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("ico", "image/x-icon"),
    ("mp3", "audio/mpeg"),
    ("oga", "audio/ogg"),
    ("ogg", "audio/ogg"),
    ("woff", "font/woff"),
    ("woff2", "font/woff2"),
    ("ttf", "font/ttf"),
];

/// One served file.
#[derive(Clone)]
pub struct ViewerFile {
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: Bytes,
}

/// Why the viewer could not be loaded. The message names the directory and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ViewerError {
    /// The directory lacks a file noVNC needs (the package is not installed).
    #[error(
        "noVNC is not installed: {dir} has no {file} (install Debian's novnc package or point SCREEN_NOVNC_DIR at noVNC's files)"
    )]
    Missing {
        /// The configured directory.
        dir: String,
        /// The first required file it lacks.
        file: &'static str,
    },
    /// The directory could not be read.
    #[error("noVNC's directory {dir} could not be read: {error}")]
    Unreadable {
        /// The configured directory.
        dir: String,
        /// The system's reason.
        error: String,
    },
    /// The directory holds more than a viewer would.
    #[error(
        "{dir} holds more than noVNC would (over {MAX_FILES} files or {MAX_TOTAL_BYTES} bytes)"
    )]
    TooLarge {
        /// The configured directory.
        dir: String,
    },
}

impl ViewerError {
    /// Stable name (refusal detail, logs).
    pub fn as_str(&self) -> &'static str {
        match self {
            ViewerError::Missing { .. } => "novnc_missing",
            ViewerError::Unreadable { .. } => "novnc_unreadable",
            ViewerError::TooLarge { .. } => "novnc_too_large",
        }
    }
}

/// noVNC's files by relative path.
pub struct Viewer {
    files: HashMap<String, ViewerFile>,
}

impl fmt::Debug for Viewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Viewer")
            .field("files", &self.files.len())
            .finish()
    }
}

impl Viewer {
    /// Reads the allowlisted files of the noVNC directory `dir`.
    pub fn load(dir: &Path) -> Result<Viewer, ViewerError> {
        let shown = dir.display().to_string();
        let unreadable = |e: std::io::Error| ViewerError::Unreadable {
            dir: shown.clone(),
            error: e.kind().to_string(),
        };
        let root = match dir.canonicalize() {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ViewerError::Missing {
                    dir: shown,
                    file: PAGE_PATH,
                });
            }
            Err(e) => return Err(unreadable(e)),
        };
        let mut walk = Walk {
            root: root.clone(),
            files: HashMap::new(),
            total: 0,
            dir: shown.clone(),
        };
        walk.file(&root.join(PAGE_PATH), PAGE_PATH)?;
        for sub in SERVED_DIRS {
            let path = root.join(sub);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => walk.dir(&path, sub, 1)?,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(unreadable(e)),
            }
        }
        if let Some(file) = REQUIRED.iter().find(|f| !walk.files.contains_key(**f)) {
            return Err(ViewerError::Missing { dir: shown, file });
        }
        let mut files = walk.files;
        let page = files.get_mut(PAGE_PATH).expect("required");
        let html = String::from_utf8_lossy(&page.body);
        page.body = Bytes::from(crate::page::with_style_link(
            &crate::page::with_reporter_tag(&html),
        ));
        files.insert(
            STYLE_PATH.to_owned(),
            ViewerFile {
                content_type: "text/css; charset=utf-8",
                body: Bytes::from_static(STYLE_CSS.as_bytes()),
            },
        );
        files.insert(
            REPORTER_PATH.to_owned(),
            ViewerFile {
                content_type: "text/javascript; charset=utf-8",
                body: Bytes::from_static(REPORTER_JS.as_bytes()),
            },
        );
        Ok(Viewer { files })
    }

    /// The file at `path` (relative, as requested under the capability), if it is served.
    pub fn get(&self, path: &str) -> Option<&ViewerFile> {
        self.files.get(path)
    }

    /// How many files are served.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether nothing is served (never, for a loaded viewer).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

struct Walk {
    root: PathBuf,
    files: HashMap<String, ViewerFile>,
    total: u64,
    dir: String,
}

impl Walk {
    fn unreadable(&self, e: std::io::Error) -> ViewerError {
        ViewerError::Unreadable {
            dir: self.dir.clone(),
            error: e.kind().to_string(),
        }
    }

    fn dir(&mut self, path: &Path, rel: &str, depth: usize) -> Result<(), ViewerError> {
        if depth > MAX_DEPTH {
            return Ok(());
        }
        let entries = std::fs::read_dir(path).map_err(|e| self.unreadable(e))?;
        for entry in entries {
            let entry = entry.map_err(|e| self.unreadable(e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !plain_name(&name) {
                continue;
            }
            let child = format!("{rel}/{name}");
            let kind = entry.file_type().map_err(|e| self.unreadable(e))?;
            if kind.is_dir() {
                self.dir(&entry.path(), &child, depth + 1)?;
            } else {
                self.file(&entry.path(), &child)?;
            }
        }
        Ok(())
    }

    /// Adds the file at `path` as `rel` when its type is known and it resolves to a regular
    /// file inside the root.
    fn file(&mut self, path: &Path, rel: &str) -> Result<(), ViewerError> {
        let Some(content_type) = content_type(rel) else {
            return Ok(());
        };
        let real = match path.canonicalize() {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(self.unreadable(e)),
        };
        if !real.starts_with(&self.root) {
            return Ok(());
        }
        let meta = std::fs::metadata(&real).map_err(|e| self.unreadable(e))?;
        if !meta.is_file() {
            return Ok(());
        }
        self.total += meta.len();
        if self.files.len() >= MAX_FILES || self.total > MAX_TOTAL_BYTES {
            return Err(ViewerError::TooLarge {
                dir: self.dir.clone(),
            });
        }
        let body = std::fs::read(&real).map_err(|e| self.unreadable(e))?;
        self.files.insert(
            rel.to_owned(),
            ViewerFile {
                content_type,
                body: Bytes::from(body),
            },
        );
        Ok(())
    }
}

/// A name a request path can spell (the proxy's path check accepts no other).
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~'))
}

fn content_type(rel: &str) -> Option<&'static str> {
    let ext = rel.rsplit_once('.')?.1;
    TYPES
        .iter()
        .find(|(e, _)| e.eq_ignore_ascii_case(ext))
        .map(|(_, t)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("app/styles")).unwrap();
        std::fs::create_dir_all(root.join("core")).unwrap();
        std::fs::create_dir_all(root.join("utils")).unwrap();
        std::fs::write(
            root.join("vnc.html"),
            "<!DOCTYPE html><html><head><title>noVNC</title></head></html>",
        )
        .unwrap();
        std::fs::write(root.join("vnc_lite.html"), "<html></html>").unwrap();
        std::fs::write(root.join("app/ui.js"), "export default 1;").unwrap();
        std::fs::write(root.join("app/styles/base.css"), "body{}").unwrap();
        std::fs::write(root.join("app/README"), "x").unwrap();
        std::fs::write(root.join("core/rfb.js"), "export default 2;").unwrap();
        std::fs::write(root.join("utils/novnc_proxy.js"), "x").unwrap();
        dir
    }

    #[test]
    fn serves_the_allowlist_only() {
        let dir = fixture();
        let v = Viewer::load(dir.path()).unwrap();
        let page = v.get("vnc.html").unwrap();
        assert!(page.content_type.starts_with("text/html"));
        let html = std::str::from_utf8(&page.body).unwrap();
        assert!(html.starts_with(
            "<!DOCTYPE html><html><head><script src=\"rakazo-reporter.js\"></script>"
        ));
        assert_eq!(&v.get("app/ui.js").unwrap().body[..], b"export default 1;");
        assert!(v.get("app/styles/base.css").is_some());
        assert_eq!(
            v.get(REPORTER_PATH).unwrap().body,
            Bytes::from_static(REPORTER_JS.as_bytes())
        );
        for absent in [
            "vnc_lite.html",
            "app/README",
            "utils/novnc_proxy.js",
            "",
            "app",
            "/vnc.html",
            "./vnc.html",
            "app/../vnc.html",
        ] {
            assert!(v.get(absent).is_none(), "{absent}");
        }
        assert_eq!(
            v.get(STYLE_PATH).unwrap().body,
            Bytes::from_static(STYLE_CSS.as_bytes())
        );
        assert!(html.contains("<link rel=\"stylesheet\" href=\"rakazo-screen.css\">"));
        assert_eq!(v.len(), 6);
    }

    #[test]
    fn links_out_of_the_directory_are_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.js"), "secret").unwrap();
        std::fs::create_dir(outside.path().join("tree")).unwrap();
        std::fs::write(outside.path().join("tree/x.js"), "secret").unwrap();
        let dir = fixture();
        let app = dir.path().join("app");
        std::os::unix::fs::symlink(outside.path().join("secret.js"), app.join("leak.js")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("tree"), app.join("tree")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", app.join("host.js")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("core/rfb.js"), app.join("inside.js")).unwrap();
        let v = Viewer::load(dir.path()).unwrap();
        assert!(v.get("app/leak.js").is_none());
        assert!(v.get("app/tree/x.js").is_none());
        assert!(v.get("app/host.js").is_none());
        assert_eq!(
            &v.get("app/inside.js").unwrap().body[..],
            b"export default 2;"
        );
    }

    #[test]
    fn a_missing_package_says_what_to_install() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("novnc");
        let e = Viewer::load(&gone).unwrap_err();
        assert_eq!(e.as_str(), "novnc_missing");
        assert!(e.to_string().contains("novnc package"), "{e}");
        std::fs::create_dir(&gone).unwrap();
        std::fs::write(gone.join("vnc.html"), "<html></html>").unwrap();
        let e = Viewer::load(&gone).unwrap_err();
        assert_eq!(
            e,
            ViewerError::Missing {
                dir: gone.display().to_string(),
                file: "app/ui.js"
            }
        );
    }

    #[test]
    fn debians_novnc_loads() {
        let root = Path::new(DEFAULT_NOVNC_DIR);
        if !root.join(PAGE_PATH).exists() {
            assert_eq!(
                std::env::var("RAKAZO_TEST_SKIP_MISSING").as_deref(),
                Ok("1"),
                "noVNC is missing: scripts/test.sh installs it (scripts/install-screen-deps.sh)"
            );
            eprintln!("skipped (RAKAZO_TEST_SKIP_MISSING=1): {DEFAULT_NOVNC_DIR} is missing");
            return;
        }
        let v = Viewer::load(root).unwrap();
        for f in [
            "app/ui.js",
            "core/rfb.js",
            "app/styles/base.css",
            "app/error-handler.js",
        ] {
            assert!(v.get(f).is_some(), "{f}");
        }
        assert!(v.get("utils/novnc_proxy").is_none());
    }
}
