//! What the benches share: an in-process supervisor on 127.0.0.1:0, one JSON-RPC call, and
//! the PSS of desktops ([`pss`]).

#![allow(dead_code)]

pub mod pss;

use std::net::TcpListener;

use rakazo::config::{DockerNetwork, DockerSettings};
use rakazo::supervisor::engine::{Engine, EngineSettings};
use rakazo::supervisor::routes::State;
use serde_json::{Value, json};

/// Starts a supervisor on its own thread, keeping its state in `data_dir` and giving its
/// computers `network` and every core; returns its URL.
pub fn start_supervisor(
    data_dir: std::path::PathBuf,
    token: String,
    network: DockerNetwork,
) -> String {
    let settings = EngineSettings {
        data_dir,
        image: rakazo::image::default_image(),
        docker: DockerSettings {
            image: None,
            nano_cpus: 0,
            memory_bytes: 0,
            pids_limit: 4096,
            network,
            egress: Default::default(),
        },
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let engine = Engine::connect(settings).await.expect("docker engine");
            let state = actix_web::web::Data::new(State::new(engine, &token));
            rakazo::supervisor::serve(listener, state)
                .unwrap()
                .await
                .unwrap();
        })
    });
    url
}

/// One JSON-RPC call to the API at `base` as `token`; its result (an error panics).
pub async fn rpc(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    method: &str,
    params: Value,
) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let v: Value = http
        .post(format!("{base}/rpc"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(v.get("error").is_none(), "{method}: {v}");
    v["result"].clone()
}
