//! The front listener of an emulator: reads each connection's first request head and sends
//! the whole connection either to a machine port (a port host `<port>-<id>.<domain>` that
//! the emulator's [`PortRoutes`] resolves) or to the emulator's own HTTP app on an internal
//! loopback port. A port host that resolves to nothing gets the vendor's 502.

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

async fn carry(
    mut conn: TcpStream,
    app: SocketAddr,
    routes: Arc<dyn PortRoutes>,
) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let host = head
        .split("\r\n")
        .skip(1)
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("host")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    let target = match routes.route(&host) {
        PortTarget::App => app,
        PortTarget::Machine(addr) => addr,
        PortTarget::Unavailable(body) => {
            let answer = format!(
                "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await?;
            return conn.shutdown().await;
        }
    };
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(&buf).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}
