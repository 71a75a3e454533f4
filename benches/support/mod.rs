//! What the Docker benches share: an in-process supervisor on 127.0.0.1:0.

use std::net::TcpListener;

use rakazo::config::{DockerNetwork, DockerSettings};
use rakazo::supervisor::engine::{Engine, EngineSettings};
use rakazo::supervisor::routes::State;

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
