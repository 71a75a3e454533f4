//! Shared by the docker test binaries: whether a Docker engine and the computer image are
//! here (their absence fails the test, see `gate`), and an in-process supervisor on
//! 127.0.0.1:0 running on its own thread and actix system.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

// Its own copy of the gate: some docker test binaries have no `common`.
#[allow(clippy::duplicate_mod)]
#[path = "../gate/mod.rs"]
mod gate;

use rakazo::config::{DockerNetwork, DockerSettings, EgressSettings};
use rakazo::desktop::groups::DesktopLimits;
use rakazo::providers::docker::{DockerProvider, DockerProviderConfig};
use rakazo::supervisor::engine::{Engine, EngineSettings};
use rakazo::supervisor::routes::State;

/// Whether the docker tests can run here. Without an engine or the image they fail, saying
/// what is missing (or are skipped with a note under `RAKAZO_TEST_SKIP_MISSING=1`).
pub fn docker_ready() -> bool {
    let image = rakazo::image::default_image();
    let problem = if !std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        Some((
            "a Docker engine".to_string(),
            "install Docker and start it; scripts/test.sh then builds the computer image",
        ))
    } else if !rakazo::image::exists(&image) {
        Some((
            format!("the computer image {image}"),
            "scripts/test.sh builds it (scripts/build-computer-image.sh)",
        ))
    } else {
        None
    };
    match problem {
        None => true,
        Some((part, how)) => {
            gate::missing(&part, how);
            false
        }
    }
}

/// A running in-process supervisor.
pub struct TestSupervisor {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its token.
    pub token: String,
    /// Its `DATA_DIR` (homes, X socket directories).
    pub data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestSupervisor {
    /// Starts a supervisor whose computers use `network` (bridged ones behind the default
    /// egress guard).
    pub fn start(network: DockerNetwork) -> Self {
        Self::start_with(network, EgressSettings::default())
    }

    /// Starts a supervisor whose computers use `network` and the egress guard `egress`.
    pub fn start_with(network: DockerNetwork, egress: EgressSettings) -> Self {
        Self::start_full(network, egress, rakazo::image::default_image())
    }

    /// Starts a supervisor creating computers from `image` (it builds no image).
    pub fn start_with_image(image: &str) -> Self {
        Self::start_full(DockerNetwork::None, EgressSettings::default(), image.into())
    }

    /// Starts a supervisor that gives desktops no control groups, saying `why`.
    pub fn start_without_desktop_groups(why: &'static str) -> Self {
        Self::start_engine(
            DockerNetwork::None,
            EgressSettings::default(),
            rakazo::image::default_image(),
            Some(why),
        )
    }

    fn start_full(network: DockerNetwork, egress: EgressSettings, image: String) -> Self {
        Self::start_engine(network, egress, image, None)
    }

    fn start_engine(
        network: DockerNetwork,
        egress: EgressSettings,
        image: String,
        no_groups: Option<&'static str>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().canonicalize().unwrap();
        let token = format!("test-{}", uuid::Uuid::new_v4().simple());
        let settings = EngineSettings {
            data_dir: data_dir.clone(),
            image,
            docker: DockerSettings {
                image: None,
                nano_cpus: 2_000_000_000,
                memory_bytes: 4 << 30,
                pids_limit: 2048,
                network,
                egress,
            },
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let token2 = token.clone();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let mut engine = Engine::connect(settings).await.expect("docker engine");
                if let Some(why) = no_groups {
                    engine = engine.without_desktop_groups(why);
                }
                let state = actix_web::web::Data::new(State::new(engine, &token2));
                rakazo::supervisor::serve(listener, state)
                    .unwrap()
                    .await
                    .unwrap();
            })
        });
        Self {
            url,
            token,
            data_dir,
            _dir: dir,
        }
    }

    /// An engine of its own on this supervisor's `DATA_DIR` (a second supervisor's view:
    /// its own pool owners and claims).
    pub async fn engine(&self) -> Engine {
        Engine::connect(EngineSettings {
            data_dir: self.data_dir.clone(),
            image: rakazo::image::default_image(),
            docker: DockerSettings {
                image: None,
                nano_cpus: 2_000_000_000,
                memory_bytes: 4 << 30,
                pids_limit: 2048,
                network: DockerNetwork::None,
                egress: EgressSettings::default(),
            },
        })
        .await
        .expect("docker engine")
    }

    /// A fresh provider talking to this supervisor.
    pub fn provider(&self) -> Arc<DockerProvider> {
        self.provider_with(false)
    }

    /// A fresh provider that reaches screens through commands only, as remote providers do.
    pub fn command_provider(&self) -> Arc<DockerProvider> {
        self.provider_with(true)
    }

    /// Removes every container this supervisor created, whoever asked for it (a provider, an
    /// emulator's sandboxes, an app under test): they are the ones whose home is mounted from
    /// its `DATA_DIR`. Containers of other supervisors are never touched.
    pub fn remove_containers(&self) {
        remove_containers_of(&self.data_dir);
    }

    /// Removes this supervisor's containers when the test binary exits, for a supervisor
    /// shared by the tests of a binary (a static is never dropped).
    pub fn remove_containers_at_exit(&self) {
        static DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
        extern "C" fn at_exit() {
            let dirs = std::mem::take(&mut *DIRS.lock().unwrap_or_else(|e| e.into_inner()));
            for dir in dirs {
                remove_containers_of(&dir);
            }
        }
        unsafe extern "C" {
            fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
        }
        let mut dirs = DIRS.lock().unwrap();
        if dirs.is_empty() {
            // SAFETY: registers a plain function once; it runs on the process's normal exit.
            unsafe { atexit(at_exit) };
        }
        dirs.push(self.data_dir.clone());
    }

    fn provider_with(&self, commands_only: bool) -> Arc<DockerProvider> {
        self.provider_full(commands_only, None)
    }

    /// A fresh provider keeping `computers` pooled computers with `warm_stacks` spare desktops
    /// each (its pool starts with [`DockerProvider::start_pool`]).
    pub fn pooled_provider(&self, computers: usize, warm_stacks: usize) -> Arc<DockerProvider> {
        Arc::new(
            DockerProvider::new(DockerProviderConfig {
                supervisor_url: self.url.clone(),
                supervisor_token: self.token.clone(),
                screen_limit: 0,
                commands_only: false,
                warm_stacks,
                limits: None,
            })
            .unwrap()
            .with_warm_computers(computers),
        )
    }

    /// A fresh provider whose desktops get control groups with `limits`.
    pub fn provider_with_limits(&self, limits: DesktopLimits) -> Arc<DockerProvider> {
        self.provider_full(false, Some(limits))
    }

    fn provider_full(
        &self,
        commands_only: bool,
        limits: Option<DesktopLimits>,
    ) -> Arc<DockerProvider> {
        Arc::new(
            DockerProvider::new(DockerProviderConfig {
                supervisor_url: self.url.clone(),
                supervisor_token: self.token.clone(),
                screen_limit: 0,
                commands_only,
                warm_stacks: 0,
                limits,
            })
            .unwrap(),
        )
    }
}

impl Drop for TestSupervisor {
    /// A test's computers go with its supervisor, passed or failed.
    fn drop(&mut self) {
        self.remove_containers();
    }
}

/// Removes the managed containers whose mounts come from under `data_dir`.
fn remove_containers_of(data_dir: &std::path::Path) {
    let Ok(out) = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            "label=rakazo.managed=true",
        ])
        .output()
    else {
        return;
    };
    let prefix = format!("{}/", data_dir.display());
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let Ok(mounts) = std::process::Command::new("docker")
            .args([
                "inspect",
                "--format",
                "{{range .Mounts}}{{.Source}}\n{{end}}",
                id,
            ])
            .output()
        else {
            continue;
        };
        let ours = String::from_utf8_lossy(&mounts.stdout)
            .lines()
            .any(|source| source.starts_with(&prefix));
        if ours {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", "-v", id])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Removes, when dropped, every computer whose mounts come from under a `DATA_DIR` (pooled
/// ones included), so a failing test leaves none running.
pub struct RemoveUnder(pub PathBuf);

impl Drop for RemoveUnder {
    fn drop(&mut self) {
        remove_containers_of(&self.0);
    }
}

/// Removes a container when dropped, so a failing test leaves no computer running.
pub struct RemoveOnDrop(pub String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The id of the running computer container of a space (a Team Computer), found by its label.
pub fn space_container(space: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=rakazo.workspaceId={space}"))
        .output()
        .unwrap();
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(!id.is_empty(), "the space's computer container runs");
    id
}
