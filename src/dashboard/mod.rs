//! The web dashboard: static ES modules and CSS embedded in the binary, served at `/` and
//! `/assets/...` with a strict content security policy that still allows frames of this origin
//! (the screen proxy's noVNC pages, which the dashboard frames with `sandbox="allow-scripts"`
//! and the proxy serves sandboxed: they run in an opaque origin).

use actix_web::http::header;
use actix_web::{HttpResponse, web};

/// The policy of every dashboard response: only our own scripts, styles, sockets and frames.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    style-src-attr 'unsafe-inline'; \
    img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; frame-ancestors 'none'; \
    base-uri 'none'; form-action 'none'; object-src 'none'";

/// One embedded file: (name under `/assets/`, content type, bytes).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("assets/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    ),
    (
        "screen.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/screen.js"),
    ),
    (
        "dock.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/dock.js"),
    ),
    (
        "terminal.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/terminal.js"),
    ),
    (
        "maintenance.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/maintenance.js"),
    ),
    (
        "activity.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/activity.js"),
    ),
    (
        "replay.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/replay.js"),
    ),
];

const INDEX: &str = include_str!("assets/index.html");

/// Where Debian's `libjs-term.js` puts the terminal emulator the Terminal window uses.
pub const TERM_JS: &str = "/usr/share/javascript/term.js/term.js";

/// Mount `/`, `/assets/{name}` and `/assets/vendor/term.js`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/assets/vendor/term.js", web::get().to(term_js))
        .route("/assets/{name}", web::get().to(asset));
}

/// The system's term.js, read when asked (so a package upgrade needs no rebuild); 404 with a
/// plain reason when the package is not installed.
async fn term_js() -> HttpResponse {
    match tokio::fs::read(TERM_JS).await {
        Ok(body) => HttpResponse::Ok()
            .insert_header((header::CONTENT_TYPE, "text/javascript; charset=utf-8"))
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .body(body),
        Err(_) => HttpResponse::NotFound()
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body("the terminal library is not installed (Debian package libjs-term.js)"),
    }
}

fn respond(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .body(body)
}

async fn index() -> HttpResponse {
    respond("text/html; charset=utf-8", INDEX)
}

async fn asset(name: web::Path<String>) -> HttpResponse {
    match ASSETS.iter().find(|(n, _, _)| *n == name.as_str()) {
        Some((_, ty, body)) => respond(ty, body),
        None => HttpResponse::NotFound()
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body("not found"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_starts_with_a_comment() {
        assert!(INDEX.starts_with("<!--"));
        for (name, _, body) in ASSETS {
            assert!(
                body.starts_with("//") || body.starts_with("/*"),
                "{name} starts with a comment"
            );
        }
    }
}
