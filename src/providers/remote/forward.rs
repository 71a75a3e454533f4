//! A loopback forwarder to one port of a remote sandbox: the screen proxy and the terminal
//! connect to `http://127.0.0.1:<local port>` as they do on Docker, and each connection is
//! carried to the vendor's port address with what the vendor needs: its headers (a `Host` for
//! routing by host name, a traffic token), the path of its port address before every request
//! path, and its query parameters (Box's `?_token=`) on every request. The vendor's host,
//! headers and parameters never leave this module. Each connection's first request head is
//! rewritten; the rest (a websocket after the upgrade) is relayed byte for byte, and a request
//! that is not an upgrade asks the vendor to close the connection after its answer, so no
//! later request on it goes out unrewritten.
//!
//! Plain `http://` port addresses (the e2b-emulator's) are relayed over TCP; `https://` ones
//! (E2B's `<port>-<id>.<domain>`) over TLS to the vendor, verified against the system's roots
//! with the port host's name, so the local side stays plain loopback HTTP either way.

use std::net::SocketAddr;
use std::sync::Arc;

use rakazo_actors::provider::{ProviderError, ProviderResult};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
    /// Starts forwarding `127.0.0.1:<ephemeral>` to `endpoint` (TLS verified against the
    /// system's roots for `https://`).
    pub async fn start(endpoint: PortEndpoint) -> ProviderResult<Self> {
        Self::start_with_roots(endpoint, system_roots).await
    }

    /// [`Forwarder::start`] with the roots TLS port hosts are verified against.
    pub async fn start_with_roots(
        endpoint: PortEndpoint,
        roots: impl FnOnce() -> rustls::RootCertStore,
    ) -> ProviderResult<Self> {
        let url = reqwest::Url::parse(&endpoint.url).map_err(|_| {
            ProviderError::Failed("the vendor gave an unreadable port address".into())
        })?;
        let host = url
            .host_str()
            .ok_or_else(|| ProviderError::Failed("port address without a host".into()))?
            .to_string();
        let tls = match url.scheme() {
            "http" => None,
            "https" => {
                let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|_| {
                    ProviderError::Failed("the port host is not a valid TLS name".into())
                })?;
                let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ProviderError::Failed(format!("forwarder TLS: {e}")))?
                    .with_root_certificates(roots())
                    .with_no_client_auth();
                Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
            }
            _ => {
                return Err(ProviderError::Failed(
                    "the vendor gave a port address that is neither http nor https".into(),
                ));
            }
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let target = format!("{host}:{port}");
        let mut headers = endpoint.headers;
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            headers.push(("Host".into(), url.authority().to_string()));
        }
        let mut query: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        query.extend(endpoint.query);
        let rewrite = Arc::new(Rewrite {
            headers,
            prefix: url.path().trim_end_matches('/').to_string(),
            query,
        });
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| ProviderError::Failed(format!("forwarder: {}", e.kind())))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ProviderError::Failed(format!("forwarder: {}", e.kind())))?;
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (target, rewrite, tls) = (target.clone(), rewrite.clone(), tls.clone());
                tokio::spawn(async move {
                    if let Err(e) = relay(conn, &target, &rewrite, tls).await {
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

/// The system's trusted roots (those it cannot read are left out).
fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!("remote.forward.no_roots");
    }
    roots
}

/// How a forwarder reaches a TLS port host.
type Tls = Option<(
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
)>;

/// What the forwarder changes in the first request head of each connection.
struct Rewrite {
    /// Headers set (any of the same name the local request carries are dropped).
    headers: Vec<(String, String)>,
    /// The port address's path, put before every request path (`""` for `/`).
    prefix: String,
    /// Query parameters added (any of the same name the local request carries are dropped).
    query: Vec<(String, String)>,
}

impl Rewrite {
    /// The request target sent for the local origin-form `target`; `None` for any other form.
    fn target(&self, target: &str) -> Option<String> {
        if !target.starts_with('/') || target.starts_with("//") {
            return None;
        }
        let mut url = reqwest::Url::parse("http://local.invalid")
            .ok()?
            .join(target)
            .ok()?;
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .into_owned()
            .filter(|(k, _)| !self.query.iter().any(|(q, _)| q == k))
            .collect();
        url.set_query(None);
        if !kept.is_empty() || !self.query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(&kept)
                .extend_pairs(&self.query);
        }
        let query = url.query().map(|q| format!("?{q}")).unwrap_or_default();
        Some(format!("{}{}{query}", self.prefix, url.path()))
    }

    /// The head sent upstream for the local request `head` (its lines, the blank one left out).
    fn head(&self, head: &str) -> Option<String> {
        let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
        let mut request = lines.next()?.splitn(3, ' ');
        let (method, target, version) = (request.next()?, request.next()?, request.next()?);
        let lines: Vec<&str> = lines.collect();
        let name = |line: &str| {
            line.split(':')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        let upgrade = lines
            .iter()
            .any(|l| name(l).eq_ignore_ascii_case("upgrade"));
        let mut out = format!("{method} {} {version}\r\n", self.target(target)?);
        for line in lines {
            let name = name(line);
            if self
                .headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(&name))
                || (!upgrade && name.eq_ignore_ascii_case("connection"))
            {
                continue;
            }
            out.push_str(line);
            out.push_str("\r\n");
        }
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if !upgrade {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        Some(out)
    }
}

/// Reads the local side's request head, rewrites it and relays the connection.
async fn relay(
    mut local: TcpStream,
    target: &str,
    rewrite: &Rewrite,
    tls: Tls,
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
    let head = String::from_utf8_lossy(&buf[..end]);
    let Some(out) = rewrite.head(&head) else {
        local
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .await?;
        return local.shutdown().await;
    };
    let upstream = TcpStream::connect(target).await?;
    upstream.set_nodelay(true)?;
    match tls {
        None => splice(local, upstream, out.as_bytes(), &buf[end..]).await,
        Some((connector, name)) => {
            let upstream = connector.connect(name, upstream).await?;
            splice(local, upstream, out.as_bytes(), &buf[end..]).await
        }
    }
}

/// Sends the rewritten head and what followed it, then relays both ways.
async fn splice(
    mut local: TcpStream,
    mut upstream: impl AsyncRead + AsyncWrite + Unpin,
    head: &[u8],
    rest: &[u8],
) -> std::io::Result<()> {
    upstream.write_all(head).await?;
    upstream.write_all(rest).await?;
    upstream.flush().await?;
    tokio::io::copy_bidirectional(&mut local, &mut upstream).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    /// A self-signed certificate for `localhost`, made by openssl: (cert PEM, key PEM).
    fn self_signed() -> (Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let made = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
            .args(["-addext", "subjectAltName=DNS:localhost"])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .args(["-addext", "extendedKeyUsage=serverAuth"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("openssl runs");
        assert!(made.status.success(), "{made:?}");
        (std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
    }

    /// A TLS port host on 127.0.0.1 answering each request with its `Host` and `X-Token`.
    async fn tls_port_host(cert: &[u8], key: &[u8]) -> u16 {
        let certs = vec![CertificateDer::from_pem_slice(cert).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(conn).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_lowercase();
                    let header = |name: &str| {
                        head.lines()
                            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                            .unwrap_or("-")
                            .to_owned()
                    };
                    let body = format!("{}|{}", header("host"), header("x-token"));
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        port
    }

    async fn get(port: u16) -> Result<String, reqwest::Error> {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await?
            .text()
            .await
    }

    #[tokio::test]
    async fn a_tls_port_host_is_reached_verified_with_its_headers() {
        let (cert, key) = self_signed();
        let port = tls_port_host(&cert, &key).await;
        let endpoint = || PortEndpoint {
            url: format!("https://localhost:{port}"),
            headers: vec![("X-Token".into(), "traffic-token".into())],
            query: Vec::new(),
        };
        let trusted = move || {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(&cert).unwrap())
                .unwrap();
            roots
        };
        let f = Forwarder::start_with_roots(endpoint(), trusted)
            .await
            .unwrap();
        assert_eq!(
            get(f.port()).await.unwrap(),
            format!("localhost:{port}|traffic-token")
        );
        // A host whose certificate the roots do not vouch for is never spoken to.
        let untrusted = Forwarder::start(endpoint()).await.unwrap();
        assert!(get(untrusted.port()).await.is_err());
    }

    #[tokio::test]
    async fn only_http_and_https_port_addresses_are_forwarded() {
        let refused = Forwarder::start(PortEndpoint {
            url: "ftp://localhost:21".into(),
            ..PortEndpoint::default()
        })
        .await;
        assert!(refused.is_err());
    }
    fn rewrite() -> Rewrite {
        Rewrite {
            headers: vec![("Host".into(), "vendor.example:443".into())],
            prefix: "/host/bx_1/6080".into(),
            query: vec![("_token".into(), "vendor-secret".into())],
        }
    }

    #[test]
    fn every_request_gets_the_port_path_and_the_vendor_parameters() {
        let r = rewrite();
        assert_eq!(
            r.target("/websockify?token=abc").as_deref(),
            Some("/host/bx_1/6080/websockify?token=abc&_token=vendor-secret")
        );
        assert_eq!(
            r.target("/").as_deref(),
            Some("/host/bx_1/6080/?_token=vendor-secret")
        );
        // A local request cannot choose the vendor's parameter, nor leave the port's path.
        assert_eq!(
            r.target("/x?_token=forged&a=1").as_deref(),
            Some("/host/bx_1/6080/x?a=1&_token=vendor-secret")
        );
        assert_eq!(
            r.target("/../../sandboxes/bx_2/6080/").as_deref(),
            Some("/host/bx_1/6080/sandboxes/bx_2/6080/?_token=vendor-secret")
        );
        for other_form in ["http://elsewhere/", "//elsewhere/x", "*"] {
            assert_eq!(r.target(other_form), None, "{other_form}");
        }
        // Without parameters or a path the target is the local one.
        let plain = Rewrite {
            headers: Vec::new(),
            prefix: String::new(),
            query: Vec::new(),
        };
        assert_eq!(
            plain.target("/websockify?token=abc").as_deref(),
            Some("/websockify?token=abc")
        );
    }

    #[test]
    fn plain_requests_close_after_their_answer_and_upgrades_stay_open() {
        let r = rewrite();
        let get = r
            .head("GET /a HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: keep-alive\r\n\r\n")
            .unwrap();
        assert_eq!(
            get,
            "GET /host/bx_1/6080/a?_token=vendor-secret HTTP/1.1\r\nHost: vendor.example:443\r\nConnection: close\r\n\r\n"
        );
        let upgrade = r
            .head("GET /websockify?token=t HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .unwrap();
        assert!(upgrade.contains("Connection: Upgrade\r\n"), "{upgrade}");
        assert!(!upgrade.contains("close"), "{upgrade}");
        assert!(r.head("garbage\r\n\r\n").is_none());
    }

    /// A websocket port host on 127.0.0.1 that sends the request target it was asked for.
    async fn websocket_port_host() -> u16 {
        use futures_util::SinkExt as _;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let seen = Arc::new(std::sync::Mutex::new(String::new()));
                    let record = seen.clone();
                    // The callback's error type is tungstenite's own response.
                    #[allow(clippy::result_large_err)]
                    let callback =
                        move |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                              resp| {
                            *record.lock().unwrap() = req.uri().to_string();
                            Ok(resp)
                        };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(conn, callback).await
                    else {
                        return;
                    };
                    let target = seen.lock().unwrap().clone();
                    let _ = ws.send(target.into()).await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_websocket_upgrade_carries_the_vendor_parameters() {
        use futures_util::StreamExt as _;
        let port = websocket_port_host().await;
        let f = Forwarder::start(PortEndpoint {
            url: format!("http://127.0.0.1:{port}/host/bx_1/6080/"),
            headers: Vec::new(),
            query: vec![("_token".into(), "vendor-secret".into())],
        })
        .await
        .unwrap();
        let (mut ws, _) = tokio_tungstenite::connect_async(format!(
            "ws://127.0.0.1:{}/websockify?token=abc",
            f.port()
        ))
        .await
        .unwrap();
        let first = ws.next().await.unwrap().unwrap();
        assert_eq!(
            first.into_text().unwrap().as_str(),
            "/host/bx_1/6080/websockify?token=abc&_token=vendor-secret"
        );
    }
}
