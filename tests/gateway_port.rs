//! The screen gateway's listening port against real websockify: it reports itself ready only
//! when websockify itself listens, never when another program holds the port.
//!
//! Needs websockify (`scripts/install-desktop-deps.sh`).

use std::sync::Arc;
use std::time::Duration;

use rakazo::desktop::command::{CommandRunner, HostRunner};
use rakazo::desktop::gateway::Gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a plain HTTP GET on `port` answers: its status line.
async fn status_line(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// An HTTP server that answers every request with 404, as another test's server would.
async fn squatter() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    (port, task)
}

#[tokio::test]
async fn a_gateway_whose_port_another_program_holds_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let (port, squatter) = squatter().await;
    let gateway = Gateway::new(
        Arc::new(HostRunner::minimal()),
        dir.path().join("run"),
        port,
    );
    let err = gateway.ensure_started().await.unwrap_err();
    assert!(err.to_string().contains("exited before listening"), "{err}");
    // The port still answers as the other program, which nothing was routed to.
    assert!(status_line(port).await.contains("404"));
    squatter.abort();
}

#[tokio::test]
async fn a_host_gateway_picks_its_port_when_it_starts_and_listens_there_itself() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Arc::new(HostRunner::minimal());
    let gateway = Gateway::new(runner.clone(), dir.path().join("run"), 0);
    assert_eq!(gateway.port(), 0, "no port before the first start");
    gateway.ensure_started().await.unwrap();
    let port = gateway.port();
    assert_ne!(port, 0);
    // websockify serves websockets only: a plain GET is refused by websockify itself.
    assert!(
        status_line(port).await.contains("405"),
        "websockify answers"
    );
    gateway.shutdown().await.unwrap();
    let out = runner
        .run(
            &format!("exec 3<>/dev/tcp/127.0.0.1/{port}"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_ne!(out.exit_code, 0, "websockify stopped with the gateway");
}
