//! Relay benchmark: throughput and per-message latency through the proxy against a direct
//! connection to the same upstream, side by side, and memory of 1,000 idle view sockets.
//!
//! Upstreams: a Rust websocket echo server (once on the client's thread, once on a thread of its
//! own, as an upstream is a process of its own: every message then crosses threads, direct or
//! through the proxy), and (when
//! installed) websockify in front of a TCP echo server, which is the real screen gateway's
//! relay. Run with `cargo bench -p rakazo-web-proxy --bench relay`
//! (`RAKAZO_BENCH_READ_BUFFER=<bytes>` sets the proxy's upstream read buffer). Memory is
//! measured in child processes (`relay memory-direct|memory-proxy`) so that each starts from a
//! clean heap.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{App, HttpServer};
use async_trait::async_trait;
use futures_util::{SinkExt as _, StreamExt as _};
use rakazo_web_proxy::authority::{Authority, AuthorityError, Target};
use rakazo_web_proxy::capability::{Capability, Keyring, Policy, now_ms};
use rakazo_web_proxy::gateway::GatewayActor;
use rakazo_web_proxy::service::{ProxyConfig, ProxyState, configure};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::Message;

const LATENCY_ROUNDS: usize = 2000;
const THROUGHPUT_MESSAGE: usize = 64 * 1024;
const IDLE_SOCKETS: usize = 1000;
const HANDSHAKE: &[u8] = b"RFB 003.008\n\x01\x01";
const FB_REQUEST: [u8; 10] = [3, 1, 0, 0, 0, 0, 0, 10, 0, 10];
/// What asks the Rust echo for a burst: [`BURST_LARGE`] bytes, then a 10-byte message.
const BURST_REQUEST: [u8; 11] = [0x42; 11];
const BURST_LARGE: usize = 16 * 1024;
const BURST_ROUNDS: usize = 300;

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct StaticAuthority(String);

#[async_trait]
impl Authority for StaticAuthority {
    async fn target(&self, c: &Capability) -> Result<Target, AuthorityError> {
        Ok(Target::new(&self.0, "benchToken", c.policy)?)
    }
}

fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").unwrap()
}

/// A websocket echo server (any path).
fn start_ws_echo() -> SocketAddr {
    let l = listener();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    actix_rt::spawn(async move {
        let l = tokio::net::TcpListener::from_std(l).unwrap();
        while let Ok((tcp, _)) = l.accept().await {
            let _ = tcp.set_nodelay(true);
            actix_rt::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if !m.is_binary() {
                        continue;
                    }
                    // A burst request is answered by a screen-update-like burst: a large
                    // message, then a small one.
                    let sent = if m.len() == BURST_REQUEST.len() {
                        let large = Message::Binary(vec![0x42u8; BURST_LARGE].into());
                        let small = Message::Binary(FB_REQUEST.to_vec().into());
                        match ws.send(large).await {
                            Ok(()) => ws.send(small).await,
                            Err(e) => Err(e),
                        }
                    } else {
                        ws.send(m).await
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// [`start_ws_echo`] on a thread of its own.
fn start_ws_echo_thread() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            tx.send(start_ws_echo()).unwrap();
            std::future::pending::<()>().await
        })
    });
    rx.recv().unwrap()
}

/// A TCP echo server (what websockify relays to in the websockify comparison).
fn start_tcp_echo() -> SocketAddr {
    let l = listener();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    actix_rt::spawn(async move {
        let l = tokio::net::TcpListener::from_std(l).unwrap();
        while let Ok((mut tcp, _)) = l.accept().await {
            let _ = tcp.set_nodelay(true);
            actix_rt::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 || tcp.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn start_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Keyring>) {
    let keyring = Arc::new(Keyring::random(1));
    let authority = Arc::new(StaticAuthority(format!("http://{upstream}")));
    let state = ProxyState::new(
        keyring.clone(),
        authority,
        GatewayActor::start_default(),
        proxy_config(),
    );
    let l = listener();
    let addr = l.local_addr().unwrap();
    let server = HttpServer::new(move || {
        let state = state.clone();
        App::new().configure(move |cfg| configure(cfg, state))
    })
    .on_connect(rakazo_web_proxy::on_connect)
    .workers(1)
    .backlog(4096)
    .max_connections(100_000)
    .disable_signals()
    .listen(l)
    .unwrap()
    .run();
    actix_rt::spawn(server);
    (addr, keyring)
}

fn proxy_config() -> ProxyConfig {
    let mut config = ProxyConfig::default();
    if let Some(bytes) = std::env::var("RAKAZO_BENCH_READ_BUFFER")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.upstream_read_buffer_bytes = bytes;
    }
    config
}

fn seal(keyring: &Keyring, policy: Policy) -> String {
    keyring
        .seal(&Capability {
            computer_id: "6f1c1f9e-2b1d-4c39-9b7e-0c6a2f1d9e11".into(),
            bot_id: "bench".into(),
            slot: 0,
            generation: 1,
            policy,
            fence: if policy == Policy::Control { 1 } else { 0 },
            expires_at_ms: now_ms() + 3_600_000,
        })
        .unwrap()
}

async fn connect(url: &str) -> Client {
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

async fn next_binary(ws: &mut Client) -> usize {
    loop {
        match ws.next().await.unwrap().unwrap() {
            Message::Binary(b) => return b.len(),
            Message::Close(_) => panic!("closed"),
            _ => {}
        }
    }
}

/// Sequential round trips of a 10-byte FramebufferUpdateRequest (allowed for view, so the
/// view filter is on the measured path). Returns per-message microseconds (p50, p99, mean).
async fn latency(url: &str) -> (f64, f64, f64) {
    let mut ws = connect(url).await;
    ws.send(Message::Binary(HANDSHAKE.to_vec().into()))
        .await
        .unwrap();
    let mut got = 0;
    while got < HANDSHAKE.len() {
        got += next_binary(&mut ws).await;
    }
    let mut samples = Vec::with_capacity(LATENCY_ROUNDS);
    for i in 0..LATENCY_ROUNDS + 100 {
        let t = Instant::now();
        ws.send(Message::Binary(FB_REQUEST.to_vec().into()))
            .await
            .unwrap();
        let mut got = 0;
        while got < FB_REQUEST.len() {
            got += next_binary(&mut ws).await;
        }
        if i >= 100 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _ = ws.close(None).await;
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
        mean,
    )
}

/// Sequential bursts: one request, answered by a 16 KiB message then a 10-byte one (the shape
/// of a screen update followed by a small one). Returns the time to the burst's last byte,
/// per burst in microseconds (p50, p99, mean).
async fn burst_latency(url: &str) -> (f64, f64, f64) {
    let mut ws = connect(url).await;
    let mut samples = Vec::with_capacity(BURST_ROUNDS);
    for i in 0..BURST_ROUNDS + 20 {
        let t = Instant::now();
        ws.send(Message::Binary(BURST_REQUEST.to_vec().into()))
            .await
            .unwrap();
        let mut got = 0;
        while got < BURST_LARGE + FB_REQUEST.len() {
            got += next_binary(&mut ws).await;
        }
        if i >= 20 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _ = ws.close(None).await;
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
        mean,
    )
}

/// Pipelined 64 KiB messages, echoed back; returns MiB/s of echoed payload.
async fn throughput(url: &str, messages: usize) -> f64 {
    let ws = connect(url).await;
    let (mut tx, mut rx) = ws.split();
    let payload = vec![0x42u8; THROUGHPUT_MESSAGE];
    let total = messages * THROUGHPUT_MESSAGE;
    let t = Instant::now();
    let writer = actix_rt::spawn(async move {
        for _ in 0..messages {
            tx.send(Message::Binary(payload.clone().into()))
                .await
                .unwrap();
        }
        tx
    });
    let mut got = 0;
    while got < total {
        match rx.next().await.unwrap().unwrap() {
            Message::Binary(b) => got += b.len(),
            Message::Close(_) => panic!("closed"),
            _ => {}
        }
    }
    let elapsed = t.elapsed().as_secs_f64();
    let tx = writer.await.unwrap();
    let _ = tx
        .reunite(rx)
        .map(|mut ws| async move { ws.close(None).await });
    total as f64 / (1024.0 * 1024.0) / elapsed
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Child process: opens IDLE_SOCKETS view sockets (direct or through the proxy) and prints the
/// RSS growth of the whole process in KiB.
async fn memory(through_proxy: bool) {
    let echo = start_ws_echo();
    let url = if through_proxy {
        let (proxy, keyring) = start_proxy(echo);
        format!(
            "ws://{proxy}/screen/{}/websockify",
            seal(&keyring, Policy::View)
        )
    } else {
        format!("ws://{echo}/websockify")
    };
    // Warm up the runtime, the allocator and the proxy's worker with one connection.
    let mut warm = connect(&url).await;
    warm.send(Message::Binary(HANDSHAKE.to_vec().into()))
        .await
        .unwrap();
    next_binary(&mut warm).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib();
    let mut sockets = Vec::with_capacity(IDLE_SOCKETS);
    for _ in 0..IDLE_SOCKETS {
        sockets.push(connect(&url).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib();
    println!("{}", after.saturating_sub(before));
    drop(sockets);
}

fn memory_in_child(mode: &str) -> u64 {
    let out = Command::new(std::env::current_exe().unwrap())
        .arg(mode)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

struct Websockify(Child);

impl Drop for Websockify {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_websockify(target: SocketAddr) -> Option<(SocketAddr, Websockify)> {
    use std::os::unix::process::CommandExt as _;
    let port = listener().local_addr().unwrap().port();
    let child = Command::new("websockify")
        .arg(format!("127.0.0.1:{port}"))
        .arg(target.to_string())
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let guard = Websockify(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((addr, guard))
}

/// Latency and throughput direct and through the proxy; `bursts` when the upstream is the Rust
/// echo (which answers burst requests).
async fn compare(name: &str, upstream: SocketAddr, messages: usize, bursts: bool) {
    let (proxy, keyring) = start_proxy(upstream);
    let direct = format!("ws://{upstream}/websockify");
    let view = format!(
        "ws://{proxy}/screen/{}/websockify",
        seal(&keyring, Policy::View)
    );
    let control = format!(
        "ws://{proxy}/screen/{}/websockify",
        seal(&keyring, Policy::Control)
    );
    let (d50, d99, dmean) = latency(&direct).await;
    let (p50, p99, pmean) = latency(&view).await;
    println!("\n## upstream: {name}");
    println!("latency per message, round trip, {LATENCY_ROUNDS} sequential 10-byte messages (us):");
    println!("  {:<22} {:>9} {:>9} {:>9}", "", "p50", "p99", "mean");
    println!("  {:<22} {d50:>9.1} {d99:>9.1} {dmean:>9.1}", "direct");
    println!(
        "  {:<22} {p50:>9.1} {p99:>9.1} {pmean:>9.1}",
        "proxy (view, filtered)"
    );
    println!(
        "  added by proxy: p50 +{:.1} us, mean +{:.1} us (ratio {:.2}x)",
        p50 - d50,
        pmean - dmean,
        pmean / dmean
    );
    if bursts {
        let (d50, d99, dmean) = burst_latency(&direct).await;
        let (p50, p99, pmean) = burst_latency(&control).await;
        println!(
            "burst latency, {BURST_ROUNDS} sequential requests answered by {} KiB + 10 bytes (us):",
            BURST_LARGE / 1024
        );
        println!("  {:<22} {:>9} {:>9} {:>9}", "", "p50", "p99", "mean");
        println!("  {:<22} {d50:>9.1} {d99:>9.1} {dmean:>9.1}", "direct");
        println!(
            "  {:<22} {p50:>9.1} {p99:>9.1} {pmean:>9.1}",
            "proxy (control)"
        );
        println!(
            "  added by proxy: p50 +{:.1} us, mean +{:.1} us",
            p50 - d50,
            pmean - dmean
        );
    }
    let td = throughput(&direct, messages).await;
    let tp = throughput(&control, messages).await;
    println!(
        "throughput, {messages} pipelined {} KiB messages echoed (MiB/s):",
        THROUGHPUT_MESSAGE / 1024
    );
    println!(
        "  direct {td:>9.1}   proxy (control) {tp:>9.1}   ratio {:.2}",
        tp / td
    );
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let system = actix_rt::System::new();
    match mode.as_str() {
        "memory-direct" => return system.block_on(memory(false)),
        "memory-proxy" => return system.block_on(memory(true)),
        _ => {}
    }
    system.block_on(async {
        println!("# rakazo-web-proxy relay benchmark");
        println!(
            "proxy upstream read buffer: {} bytes",
            proxy_config().upstream_read_buffer_bytes
        );
        // The echo on the client's thread (no thread crossing on the direct path: the figure
        // earlier runs reported), then on a thread of its own (as a real upstream).
        let echo = start_ws_echo();
        compare(
            "Rust websocket echo (on the client's thread)",
            echo,
            4000,
            true,
        )
        .await;
        let echo = start_ws_echo_thread();
        compare(
            "Rust websocket echo (on a thread of its own)",
            echo,
            4000,
            true,
        )
        .await;
        let tcp = start_tcp_echo();
        match start_websockify(tcp) {
            Some((ws, _guard)) => compare("websockify -> TCP echo", ws, 1000, false).await,
            None => println!("\n(websockify not installed: skipped the websockify comparison)"),
        }
    });
    let direct = memory_in_child("memory-direct");
    let proxied = memory_in_child("memory-proxy");
    println!("\n## memory, {IDLE_SOCKETS} idle view sockets (RSS growth of the process, KiB)");
    println!("  direct (client + upstream ends)        {direct:>8}");
    println!("  through the proxy (+ proxy's two ends) {proxied:>8}");
    println!(
        "  proxy's share: {} KiB total, {:.1} KiB per socket",
        proxied.saturating_sub(direct),
        proxied.saturating_sub(direct) as f64 / IDLE_SOCKETS as f64
    );
}
