//! The kubernetes emulator is faithful to kubectl: a pod manifest is applied, waited for,
//! exec'd into, copied in and out of with `kubectl cp`, listed by label, reached on its pod IP
//! from this host, and deleted; a request without the token is refused. (kubectl, like all of
//! client-go, sends credentials over TLS only: it talks to an emulator without a token.)

mod docker_support;
mod kubernetes_support;

#[allow(clippy::duplicate_mod)]
#[path = "gate/mod.rs"]
mod gate;

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use docker_support::docker_ready;
use kubernetes_support::{NAMESPACE, cluster, open_cluster};

fn kubectl_ready() -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        gate::missing(
            "kubectl",
            "scripts/test.sh installs it (apt-get install kubectl, or the machine's own)",
        );
    }
    ok
}

fn kubectl(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let c = open_cluster();
    let mut cmd = Command::new("kubectl");
    cmd.env("KUBECONFIG", &c.kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl runs");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(data).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = kubectl(args, None);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kubectl_applies_waits_execs_copies_and_deletes() {
    if !docker_ready() || !kubectl_ready() {
        return;
    }
    let c = cluster();
    let name = format!(
        "kubectl-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let manifest = c.dir.join(format!("{name}.yaml"));
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: faithful\n    run: {name}\nspec:\n  automountServiceAccountToken: false\n  securityContext:\n    runAsUser: 1000\n  containers:\n  - name: main\n    image: {image}\n    command: [\"python3\", \"-m\", \"http.server\", \"8080\", \"--directory\", \"/tmp\"]\n    ports:\n    - containerPort: 8080\n",
            image = rakazo::image::default_image()
        ),
    )
    .unwrap();
    let applied = ok(&["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(applied.trim(), format!("pod/{name} created"));
    ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "--timeout=120s",
    ]);
    assert_eq!(
        ok(&["get", "pod", &name, "-o", "jsonpath={.status.phase}"]),
        "Running"
    );
    let listed = ok(&["get", "pods", "-l", &format!("run={name}"), "-o", "name"]);
    assert_eq!(listed.trim(), format!("pod/{name}"));
    assert_eq!(
        ok(&["get", "pods", "-l", "run=nothing-of-this", "-o", "name"]).trim(),
        ""
    );

    // exec: output, exit code, standard input.
    let out = kubectl(
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo hi; echo oops >&2; exit 3",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    let out = kubectl(
        &["exec", "-i", &name, "--", "tr", "a-z", "A-Z"],
        Some(b"piped in\n"),
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "PIPED IN\n");
    assert_eq!(ok(&["exec", &name, "--", "id", "-u"]).trim(), "1000");

    // cp in and out (tar over exec), with a file larger than one WebSocket frame.
    let local = c.dir.join(format!("{name}-in.bin"));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    ok(&[
        "cp",
        local.to_str().unwrap(),
        &format!("{name}:/tmp/in.bin"),
    ]);
    assert_eq!(
        ok(&["exec", &name, "--", "sh", "-c", "wc -c < /tmp/in.bin"]).trim(),
        "300000"
    );
    let back = c.dir.join(format!("{name}-out.bin"));
    ok(&["cp", &format!("{name}:/tmp/in.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), data);

    // The pod IP answers from this host, as a pod IP does inside a cluster.
    let ip = ok(&["get", "pod", &name, "-o", "jsonpath={.status.podIP}"]);
    assert!(ip.starts_with("127."), "{ip}");
    let mut served = None;
    for _ in 0..50 {
        if let Ok(resp) = reqwest::blocking_get(&format!("http://{ip}:8080/in.bin")) {
            served = Some(resp);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(served.expect("the pod IP answers"), data);

    // delete waits until the pod is gone.
    let deleted = ok(&["delete", "pod", &name, "--wait=true", "--timeout=60s"]);
    assert_eq!(deleted.trim(), format!("pod \"{name}\" deleted"));
    let out = kubectl(&["get", "pod", &name], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn requests_without_the_token_are_refused() {
    if !docker_ready() {
        return;
    }
    let c = cluster();
    for path in [
        "/version",
        "/api/v1",
        &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
    ] {
        let status = reqwest::blocking_status(&format!("{}{path}", c.url), Some("wrong-token"));
        assert_eq!(status, 401, "{path}");
        let status = reqwest::blocking_status(&format!("{}{path}", c.url), None);
        assert_eq!(status, 401, "{path}");
    }
    assert_eq!(
        reqwest::blocking_status(&format!("{}/version", c.url), Some(&c.token)),
        200
    );
}

/// Plain HTTP for a plain `#[test]`: a small runtime per call.
mod reqwest {
    pub fn blocking_get(url: &str) -> Result<Vec<u8>, ()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let resp = ::reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .get(url)
                .send()
                .await
                .map_err(drop)?;
            if !resp.status().is_success() {
                return Err(());
            }
            resp.bytes().await.map(|b| b.to_vec()).map_err(drop)
        })
    }

    pub fn blocking_status(url: &str, token: Option<&str>) -> u16 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut req = ::reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .get(url);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.unwrap().status().as_u16()
        })
    }
}
