//! The kubernetes emulator as the benches run it: its own process (`rakazo emulator
//! kubernetes` on 127.0.0.1:0, so only the API side is in the bench's process), a kubeconfig
//! for it, and the settings of bench computers.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use rakazo::config::KubernetesSettings;

/// A running emulator process, stopped on drop.
pub struct EmulatorProcess {
    child: Child,
    /// A kubeconfig reaching it, without authentication, in the namespace given.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl EmulatorProcess {
    /// Starts the emulator and writes its kubeconfig.
    pub fn start(namespace: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_rakazo"))
            .args(["emulator", "kubernetes", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Its log shares its standard output: read up to the address, then drain the rest.
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_owned))
            .expect("the emulator listens");
        std::thread::spawn(move || lines.for_each(drop));
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: bench\n    namespace: {namespace}\ncurrent-context: emulator\nusers:\n- name: bench\n  user: {{}}\n"
            ),
        )
        .unwrap();
        Self {
            child,
            kubeconfig,
            _dir: dir,
        }
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The settings of bench computers in `namespace`: the built-in image, small requests.
pub fn settings(namespace: &str) -> KubernetesSettings {
    KubernetesSettings {
        namespace: namespace.into(),
        image: None,
        cpu_request: "100m".into(),
        cpu_limit: "2".into(),
        memory_request: "256Mi".into(),
        memory_limit: "2Gi".into(),
        home_claim: None,
    }
}
