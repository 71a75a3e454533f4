//! The egress guard of Docker computers: a computer cannot connect to a listener on a private
//! address (one this test creates, on its own Docker network), and can once the listener is
//! allowlisted; the other refused ranges are checked by reading the installed rules, never by
//! connecting; rules removed behind the supervisor's back are reinstalled; `/internal/health`
//! says whether the guard is active. Every network, container and rule made here is removed.

mod common;
mod docker_support;

use std::process::Command;
use std::time::Duration;

use rakazo::config::egress::parse_allow;
use rakazo::config::{DockerNetwork, EgressSettings};
use rakazo::supervisor::egress::Guard;
use rakazo_actors::provider::{ExecRequest, MachineSpec, SandboxProvider};
use serde_json::Value;

use docker_support::{TestSupervisor, docker_ready};

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

fn iptables(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes what the test made, even when it fails.
struct Cleanup {
    containers: Vec<String>,
    networks: Vec<String>,
    guard: Guard,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker(&["rm", "-f", c]);
        }
        self.guard.uninstall();
        for n in &self.networks {
            let _ = docker(&["network", "rm", n]);
        }
    }
}

/// The listener: answers every TCP connection on port 7070 with a greeting.
const LISTENER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7070))
s.listen(16)
while True:
    c, _ = s.accept()
    c.sendall(b"hello-from-listener\n")
    c.close()
"#;

fn connect_script(ip: &str) -> ExecRequest {
    ExecRequest {
        command: format!("timeout 10 bash -c 'exec 3<>/dev/tcp/{ip}/7070 && head -c 19 <&3'"),
        cwd: String::new(),
        env: Vec::new(),
        timeout: Duration::from_secs(20),
    }
}

/// Packets the guard's REJECT rules have counted.
fn rejected(chain: &str) -> u64 {
    iptables("iptables", &["-w", "-L", chain, "-v", "-x", "-n"])
        .lines()
        .filter(|l| l.contains("REJECT"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[actix_rt::test]
async fn a_computer_reaches_a_private_listener_only_once_it_is_allowlisted() {
    if !docker_ready() {
        return;
    }
    let guard_net = unique("rakazo-egress-test");
    let listen_net = unique("rakazo-listen-test");
    let listener = unique("rakazo-listener");
    let mut cleanup = Cleanup {
        containers: vec![listener.clone()],
        networks: vec![guard_net.clone(), listen_net.clone()],
        guard: Guard::new(&guard_net, &[]),
    };
    let chain = cleanup.guard.forward_chain.clone();

    // The listener, on a private address of the test's own network.
    assert!(docker(&["network", "create", &listen_net]).0);
    let image = rakazo::image::default_image();
    let (ok, _) = docker(&[
        "run",
        "-d",
        "--name",
        &listener,
        "--network",
        &listen_net,
        "--user",
        "1000:1000",
        "--cap-drop",
        "ALL",
        &image,
        "python3",
        "-c",
        LISTENER,
    ]);
    assert!(ok, "listener container");
    let (_, ip) = docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &listener,
    ]);
    let addr: std::net::Ipv4Addr = ip.parse().expect("listener address");
    assert!(addr.is_private(), "{addr} is a private address");

    // A guarded computer cannot connect.
    let egress = EgressSettings {
        guard: true,
        allow: Vec::new(),
        network: guard_net.clone(),
    };
    let sup = TestSupervisor::start_with(DockerNetwork::Bridge, egress.clone());
    let p = sup.provider();
    let space = unique("space");
    let spec = MachineSpec {
        computer_id: unique("computer"),
        space_id: space.clone(),
        bot_id: None,
        home_key: format!("team-{space}"),
    };
    let m = p.provision(&spec).await.expect("computer");
    cleanup.containers.push(m.0.clone());
    let inspected: Value =
        serde_json::from_str(&docker(&["inspect", &m.0]).1).expect("docker inspect");
    assert_eq!(
        inspected[0]["HostConfig"]["NetworkMode"].as_str(),
        Some(guard_net.as_str()),
        "the computer is on the guard's network"
    );
    assert_eq!(p.egress_guard().await, Some(Ok("active".to_string())));

    let before = rejected(&chain);
    let refused = p.exec(&m, &connect_script(&ip)).await.unwrap();
    assert_ne!(
        refused.exit_code, 0,
        "connected through the guard: {refused:?}"
    );
    assert!(!refused.stdout.contains("hello-from-listener"));
    assert!(
        refused.stderr.contains("No route to host"),
        "refused by the guard's REJECT (admin-prohibited): {refused:?}"
    );
    let after = rejected(&chain);
    assert!(after > before, "the guard's rule counted the refusal");

    // The other ranges, read from the installed rules (never connected to).
    let v4 = iptables("iptables", &["-w", "-S", &chain]);
    for cidr in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
    ] {
        assert!(
            v4.contains(&format!(
                "-d {cidr} -j REJECT --reject-with icmp-admin-prohibited"
            )),
            "{cidr} refused:\n{v4}"
        );
    }
    let bridge = &cleanup.guard.bridge;
    assert!(v4.contains(&format!("-A {chain} -i {bridge} -o {bridge} -j DROP")));
    let jumps = iptables("iptables", &["-w", "-S", "DOCKER-USER"]);
    assert!(
        jumps.contains(&format!("-i {bridge} -j {chain}")),
        "{jumps}"
    );
    let input = iptables("iptables", &["-w", "-S", "INPUT"]);
    let in_chain = &cleanup.guard.input_chain;
    assert!(
        input.contains(&format!("-i {bridge} -j {in_chain}")),
        "{input}"
    );
    let host = iptables("iptables", &["-w", "-S", in_chain]);
    assert!(
        host.contains(&format!(
            "-A {in_chain} -j REJECT --reject-with icmp-admin-prohibited"
        )),
        "the host's own addresses are refused:\n{host}"
    );
    if std::path::Path::new("/proc/net/if_inet6").exists() {
        let v6 = iptables("ip6tables", &["-w", "-S", &chain]);
        for cidr in ["fc00::/7", "fe80::/10", "::1/128", "::ffff:0.0.0.0/96"] {
            assert!(
                v6.contains(&format!("-d {cidr} -j REJECT")),
                "{cidr}:\n{v6}"
            );
        }
    }

    // Rules flushed behind the supervisor's back come back on the next check.
    Command::new("iptables")
        .args(["-w", "-F", &chain])
        .status()
        .unwrap();
    assert_eq!(p.egress_guard().await, Some(Ok("active".to_string())));
    assert_eq!(iptables("iptables", &["-w", "-S", &chain]), v4);

    // Allowlisted (address and port), the same computer connects.
    let allowed = EgressSettings {
        allow: parse_allow(&format!("{ip}/32:7070")).unwrap(),
        ..egress
    };
    let sup2 = TestSupervisor::start_with(DockerNetwork::Bridge, allowed);
    let p2 = sup2.provider();
    assert_eq!(p2.egress_guard().await, Some(Ok("active".to_string())));
    let reached = p2.exec(&m, &connect_script(&ip)).await.unwrap();
    assert_eq!(
        reached.exit_code,
        0,
        "{reached:?}\n{}\n{}",
        iptables("iptables", &["-w", "-L", &chain, "-v", "-n"]),
        iptables("iptables", &["-w", "-S", "DOCKER-USER"])
    );
    assert_eq!(reached.stdout, "hello-from-listener");

    // /internal/health of an API on this supervisor says the guard is active.
    let s = common::TestServer::docker(&sup2.url, &sup2.token).await;
    let mut health = Value::Null;
    for _ in 0..50 {
        health = s.health().await;
        if health["egressGuard"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(health["egressGuard"], "active", "{health}");

    p2.destroy(&m).await.unwrap();
    drop(cleanup);
    assert!(!docker(&["network", "inspect", &guard_net]).0);
    assert!(!iptables("iptables", &["-w", "-S", "DOCKER-USER"]).contains(&chain));
}

#[actix_rt::test]
async fn without_a_network_the_guard_is_not_needed_and_health_says_so() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.provider();
    assert_eq!(
        p.egress_guard().await,
        Some(Ok("not needed: computers have no network".to_string()))
    );
}
