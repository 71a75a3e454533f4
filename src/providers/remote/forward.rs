//! A loopback forwarder to one port of a remote sandbox: the screen proxy and the terminal
//! connect to `http://127.0.0.1:<local port>` as they do on Docker, and each connection is
//! carried to the vendor's port address with the headers the vendor needs (its `Host` for
//! routing by host name, a traffic token). The vendor's host and headers never leave this
//! module. Each connection's first request head is rewritten; the rest (a websocket after the
//! upgrade) is relayed byte for byte.
//!
//! Only `http://` port addresses are forwarded (the e2b-emulator's, a vendor's plain port
//! host); TLS port hosts are not built yet and are refused when the forwarder is made.

use std::net::SocketAddr;

use rakazo_actors::provider::{ProviderError, ProviderResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::PortEndpoint;

/// Largest request head accepted from the local side.
const MAX_HEAD: usize = 64 << 10;

/// A running forwarder; dropping it stops accepting (open connections finish on their own).
pub struct Forwarder {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Forwarder {
    /// Starts forwarding `127.0.0.1:<ephemeral>` to `endpoint`.
    pub async fn start(endpoint: PortEndpoint) -> ProviderResult<Self> {
        let url = reqwest::Url::parse(&endpoint.url).map_err(|_| {
            ProviderError::Failed("the vendor gave an unreadable port address".into())
        })?;
        if url.scheme() != "http" {
            return Err(ProviderError::Unsupported(
                "live screens through a TLS port host are not built yet".into(),
            ));
        }
        let host = url
            .host_str()
            .ok_or_else(|| ProviderError::Failed("port address without a host".into()))?
            .to_string();
        let port = url.port_or_known_default().unwrap_or(80);
        let target = format!("{host}:{port}");
        let mut headers = endpoint.headers;
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            headers.push(("Host".into(), url.authority().to_string()));
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| ProviderError::Failed(format!("forwarder: {}", e.kind())))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ProviderError::Failed(format!("forwarder: {}", e.kind())))?;
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (target, headers) = (target.clone(), headers.clone());
                tokio::spawn(async move {
                    if let Err(e) = relay(conn, &target, &headers).await {
                        tracing::debug!(error = %e.kind(), "remote.forward.closed");
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The local port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// Reads the local side's request head, rewrites its headers and relays the connection.
async fn relay(
    mut local: TcpStream,
    target: &str,
    headers: &[(String, String)],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let end = loop {
        let mut chunk = [0u8; 4096];
        let n = local.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut out = String::new();
    out.push_str(lines.next().unwrap_or_default());
    out.push_str("\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name)) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&buf[end..]).await?;
    tokio::io::copy_bidirectional(&mut local, &mut upstream).await?;
    Ok(())
}
