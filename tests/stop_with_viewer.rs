//! Stopping a computer while a person watches its screen: the viewer is disconnected and the
//! stop completes promptly.

mod common;

use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

#[actix_rt::test]
async fn stop_completes_while_a_viewer_is_connected() {
    let s = TestServer::start(
        Backend::Sqlite,
        &[("SANDBOX_PROVIDER", "desktop"), ("RAKAZO_ENV", "test")],
    )
    .await
    .unwrap();
    let (_, bots) = s.space_with_bots(1, "team").await;
    let view = s
        .ok("computer.screenUrl", json!({ "botId": bots[0] }))
        .await;
    let path = view["url"]
        .as_str()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .replace("/vnc.html", "/websockify");
    let mut request = format!("{}{path}", s.base.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "binary".parse().unwrap());
    let (_viewer, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let c = s.ok("computer.forBot", json!({ "botId": bots[0] })).await;
    let started = Instant::now();
    let stopped = tokio::time::timeout(
        Duration::from_secs(45),
        s.call("computer.stop", json!({ "computerId": c["id"] })),
    )
    .await
    .expect("computer.stop hung with a viewer connected");
    assert_eq!(stopped.unwrap()["state"], "stopped");
    eprintln!("stop took {:?}", started.elapsed());
}
