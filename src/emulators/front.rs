//! The front listener of an emulator: reads each connection's first request head and sends
//! the whole connection either to a machine port (a port host `<port>-<id>.<domain>` that
//! the emulator's [`PortRoutes`] resolves) or to the emulator's own HTTP app on an internal
//! loopback port. A port host that resolves to nothing gets the vendor's 502. The pieces of
//! that relay (reading a request head, answering with a refusal, splicing to a machine port)
//! serve the emulators' other port listeners too.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head read before routing.
const MAX_HEAD: usize = 64 << 10;

/// Where a port host goes.
pub enum PortTarget {
    /// Not a port host of this emulator: the HTTP app answers.
    App,
    /// A machine port, reached at this address.
    Machine(SocketAddr),
    /// A port host of no running sandbox, or a port that cannot be reached: 502 with this
    /// JSON body.
    Unavailable(String),
}

/// Resolves a request's `Host` header.
pub trait PortRoutes: Send + Sync + 'static {
    /// Where the connection whose first request names `host` goes.
    fn route(&self, host: &str) -> PortTarget;
}

/// Serves `listener`, sending app traffic to `app`.
pub async fn serve(listener: TcpListener, app: SocketAddr, routes: Arc<dyn PortRoutes>) {
    while let Ok((conn, _)) = listener.accept().await {
        let routes = routes.clone();
        tokio::spawn(async move {
            if let Err(e) = carry(conn, app, routes).await {
                tracing::debug!(error = %e.kind(), "emulator.front.closed");
            }
        });
    }
}

/// Reads a connection's first request head: everything read so far and where the head ends
/// (after its blank line); `None` when the peer closes first or the head passes 64 KiB.
pub async fn read_head(conn: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some((buf, i + 4)));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// The value of header `name` in a request head, if it has one.
pub fn header(head: &str, name: &str) -> Option<String> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Answers a connection with `status` and a JSON `body`, then closes it.
pub async fn refuse(conn: &mut TcpStream, status: u16, body: &str) -> std::io::Result<()> {
    let reason = actix_web::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let answer = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(answer.as_bytes()).await?;
    conn.shutdown().await
}

/// Sends `head` (the first request, as the machine should see it) and what followed it, then
/// relays both ways.
pub async fn splice(
    conn: &mut TcpStream,
    target: SocketAddr,
    head: &[u8],
    rest: &[u8],
) -> std::io::Result<()> {
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(head).await?;
    upstream.write_all(rest).await?;
    tokio::io::copy_bidirectional(conn, &mut upstream).await?;
    Ok(())
}

async fn carry(
    mut conn: TcpStream,
    app: SocketAddr,
    routes: Arc<dyn PortRoutes>,
) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let Some((buf, head_end)) = read_head(&mut conn).await? else {
        return Ok(());
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let host = header(&head, "host").unwrap_or_default();
    let target = match routes.route(&host) {
        PortTarget::App => app,
        PortTarget::Machine(addr) => addr,
        PortTarget::Unavailable(body) => return refuse(&mut conn, 502, &body).await,
    };
    splice(&mut conn, target, &buf, &[]).await
}
