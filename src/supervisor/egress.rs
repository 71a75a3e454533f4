//! The egress guard of Docker computers: the supervisor owns a dedicated bridge network and
//! the firewall rules (iptables and ip6tables, filter table) that keep its computers off
//! private destinations, the host itself and each other.
//!
//! Rules live in chains named from the network (`RKZ-EG-<hash>` for forwarded traffic,
//! `RKZ-IN-<hash>` for traffic to the host), filled atomically with `iptables-restore
//! --noflush` and jumped to from `DOCKER-USER` (which the engine keeps across its restarts) or
//! `FORWARD`, and from `INPUT`. [`Guard::ensure`] installs them idempotently; it runs at start,
//! before every create and on every health check, and reinstalls whatever is missing or was
//! changed (a host reboot, a flushed table). Forwarded traffic from a computer to a refused
//! range is rejected with `admin-prohibited`; every packet from a computer to the host is
//! refused but replies; computers never reach each other (`enable_icc=false` and a rule).

use std::collections::HashMap;
use std::process::{Command, Stdio};

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use bollard::query_parameters::InspectNetworkOptions;
use sha2::{Digest, Sha256};

use crate::config::egress::EgressAllow;

/// IPv4 destinations a computer never reaches unless allowlisted.
pub const DENIED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
/// IPv6 destinations a computer never reaches unless allowlisted (IPv4-mapped and NAT64
/// prefixes too, so the IPv4 ranges cannot be reached through them).
pub const DENIED_V6: &[&str] = &[
    "::/128",
    "::1/128",
    "::ffff:0.0.0.0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// Label on the network the guard owns.
pub const LABEL_EGRESS: &str = "rakazo.egressGuard";

/// An address family: which tool writes its rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// IPv4 (`iptables`).
    V4,
    /// IPv6 (`ip6tables`).
    V6,
}

impl Family {
    fn tool(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    fn reject(self) -> &'static str {
        match self {
            Family::V4 => "--reject-with icmp-admin-prohibited",
            Family::V6 => "--reject-with icmp6-adm-prohibited",
        }
    }

    fn denied(self) -> &'static [&'static str] {
        match self {
            Family::V4 => DENIED_V4,
            Family::V6 => DENIED_V6,
        }
    }
}

/// The guard's state, as `/v1/health` and `/internal/health` report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardState {
    /// Network and rules are in place.
    Active,
    /// Not needed: computers have no network (`SANDBOX_DOCKER_NETWORK=none`).
    NoNetwork,
    /// Turned off by the operator (`SANDBOX_EGRESS_GUARD=off`).
    Off,
    /// On, but the network or rules could not be installed (creates are refused).
    Failed(String),
}

impl GuardState {
    /// The one word (or sentence) health shows.
    pub fn describe(&self) -> String {
        match self {
            GuardState::Active => "active".into(),
            GuardState::NoNetwork => "not needed: computers have no network".into(),
            GuardState::Off => "off".into(),
            GuardState::Failed(why) => format!("inactive: {why}"),
        }
    }
}

/// The guard of one network.
#[derive(Clone, Debug)]
pub struct Guard {
    /// The Docker network.
    pub network: String,
    /// Its bridge interface (at most 15 bytes).
    pub bridge: String,
    /// Chain of forwarded traffic.
    pub forward_chain: String,
    /// Chain of traffic to the host.
    pub input_chain: String,
    allow: Vec<EgressAllow>,
    /// `iptables -S` of the chains right after the last install, per family: what a later
    /// check expects to find (the tools print rules in their own canonical form).
    installed_as: std::sync::Arc<std::sync::Mutex<Vec<(Family, String)>>>,
}

/// One jump the guard keeps: `(chain, match)`.
type Jump = (String, Vec<String>);

impl Guard {
    /// The guard of `network`, opening `allow`.
    pub fn new(network: &str, allow: &[EgressAllow]) -> Self {
        let digest = Sha256::digest(network.as_bytes());
        let tag = hex::encode(&digest[..4]);
        Self {
            network: network.to_owned(),
            bridge: format!("rkz-{tag}"),
            forward_chain: format!("RKZ-EG-{tag}"),
            input_chain: format!("RKZ-IN-{tag}"),
            allow: allow.to_vec(),
            installed_as: Default::default(),
        }
    }

    fn allows(&self, family: Family) -> impl Iterator<Item = &EgressAllow> {
        self.allow
            .iter()
            .filter(move |a| a.addr.is_ipv4() == (family == Family::V4))
    }

    /// `-d <cidr> [-p proto --dport ports]` for each allowlisted destination.
    fn allow_matches(&self, family: Family) -> Vec<String> {
        let mut out = Vec::new();
        for a in self.allows(family) {
            match a.ports {
                None => out.push(format!("-d {}", a.cidr())),
                Some((lo, hi)) => {
                    let ports = if lo == hi {
                        lo.to_string()
                    } else {
                        format!("{lo}:{hi}")
                    };
                    for proto in ["tcp", "udp"] {
                        out.push(format!(
                            "-d {} -p {proto} -m {proto} --dport {ports}",
                            a.cidr()
                        ));
                    }
                }
            }
        }
        out
    }

    /// The `iptables-restore --noflush` input that (re)fills both chains of `family`.
    pub fn rules(&self, family: Family) -> String {
        let (f, i, b) = (&self.forward_chain, &self.input_chain, &self.bridge);
        let reject = format!("-j REJECT {}", family.reject());
        let mut r = vec![
            "*filter".to_string(),
            format!(":{f} - [0:0]"),
            format!(":{i} - [0:0]"),
            // Other computers, whatever the allowlist says.
            format!("-A {f} -i {b} -o {b} -j DROP"),
            // Replies into a computer (of allowlisted connections too: the engine's isolation
            // between networks would drop them).
            format!("-A {f} -o {b} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
            // New connections into computers: the engine's own rules decide.
            format!("-A {f} -o {b} -j RETURN"),
            // Packets of connections already let through (allowlisted ones included).
            format!("-A {f} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ];
        for m in self.allow_matches(family) {
            r.push(format!("-A {f} {m} -j ACCEPT"));
        }
        for cidr in family.denied() {
            r.push(format!("-A {f} -d {cidr} {reject}"));
        }
        r.push(format!("-A {f} -j RETURN"));
        // The host itself, on any of its addresses: replies only.
        r.push(format!(
            "-A {i} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        ));
        if family == Family::V6 {
            // Router solicitation, neighbour solicitation and advertisement.
            for t in [133, 135, 136] {
                r.push(format!(
                    "-A {i} -p ipv6-icmp -m icmp6 --icmpv6-type {t} -j ACCEPT"
                ));
            }
        }
        for m in self.allow_matches(family) {
            r.push(format!("-A {i} {m} -j ACCEPT"));
        }
        r.push(format!("-A {i} {reject}"));
        r.push("COMMIT".into());
        r.join("\n") + "\n"
    }

    /// The jumps to the chains of `family`: from `DOCKER-USER` when the engine made it (its
    /// rules come first and survive the engine's restarts), else from `FORWARD`.
    fn jumps(&self, family: Family) -> Vec<Jump> {
        let forward = if family == Family::V4 && chain_exists(family, "DOCKER-USER") {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        let to = |dir: &str, chain: &str| {
            vec![
                dir.to_string(),
                self.bridge.clone(),
                "-j".into(),
                chain.into(),
            ]
        };
        vec![
            (forward.into(), to("-o", &self.forward_chain)),
            (forward.into(), to("-i", &self.forward_chain)),
            ("INPUT".into(), to("-i", &self.input_chain)),
        ]
    }

    /// Which families the host filters: IPv4 always; IPv6 when the kernel has it.
    fn families() -> Vec<Family> {
        let mut f = vec![Family::V4];
        if std::path::Path::new("/proc/net/if_inet6").exists() {
            f.push(Family::V6);
        }
        f
    }

    /// Both chains of `family` as the tool lists them, if both exist.
    fn listing(&self, family: Family) -> Result<Option<String>, String> {
        let f = list_chain(family, &self.forward_chain)?;
        let i = list_chain(family, &self.input_chain)?;
        Ok(f.zip(i).map(|(f, i)| format!("{f}\n{i}")))
    }

    /// Whether every rule is in place as this guard last installed it (same chains, jumps
    /// present). False before the first install.
    pub fn installed(&self) -> Result<bool, String> {
        let expected = self
            .installed_as
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        if expected.is_empty() {
            return Ok(false);
        }
        for (family, listing) in expected {
            for (chain, spec) in self.jumps(family) {
                if !check_rule(family, &chain, &spec)? {
                    return Ok(false);
                }
            }
            if self.listing(family)?.as_deref() != Some(listing.as_str()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Installs (or re-installs) the chains and jumps; idempotent.
    pub fn install(&self) -> Result<(), String> {
        let mut listings = Vec::new();
        for family in Self::families() {
            run_with_input(family.restore(), &["-w", "--noflush"], &self.rules(family))?;
            for (chain, spec) in self.jumps(family) {
                if !check_rule(family, &chain, &spec)? {
                    let mut args = vec!["-w".to_string(), "-I".into(), chain, "1".into()];
                    args.extend(spec);
                    run(family.tool(), &args)?;
                }
            }
            let listing = self
                .listing(family)?
                .ok_or_else(|| format!("{}: the chains were not made", family.tool()))?;
            listings.push((family, listing));
        }
        if let Ok(mut kept) = self.installed_as.lock() {
            *kept = listings;
        }
        Ok(())
    }

    /// Removes the jumps and chains (a test's own guard; an operator turning the guard off).
    pub fn uninstall(&self) {
        for family in Self::families() {
            for chain in ["DOCKER-USER", "FORWARD", "INPUT"] {
                for (_, spec) in self.jumps(family) {
                    let mut args = vec!["-w".to_string(), "-D".into(), chain.into()];
                    args.extend(spec);
                    while run(family.tool(), &args).is_ok() {}
                }
            }
            for chain in [&self.forward_chain, &self.input_chain] {
                let _ = run(family.tool(), &["-w".into(), "-F".into(), chain.clone()]);
                let _ = run(family.tool(), &["-w".into(), "-X".into(), chain.clone()]);
            }
        }
    }

    /// Makes sure the network exists as the guard's own (bridge named, inter-computer traffic
    /// off); a same-named network of another shape is refused, never adopted.
    pub async fn ensure_network(&self, docker: &Docker) -> Result<(), String> {
        for _ in 0..2 {
            match docker
                .inspect_network(&self.network, None::<InspectNetworkOptions>)
                .await
            {
                Ok(net) => {
                    let options = net.options.unwrap_or_default();
                    let bridge = options.get("com.docker.network.bridge.name");
                    let icc = options.get("com.docker.network.bridge.enable_icc");
                    return if bridge == Some(&self.bridge)
                        && icc.map(String::as_str) == Some("false")
                    {
                        Ok(())
                    } else {
                        Err(format!(
                            "the Docker network {} exists but is not the guard's (bridge {}, enable_icc=false)",
                            self.network, self.bridge
                        ))
                    };
                }
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => {
                    let mut options = HashMap::new();
                    options.insert(
                        "com.docker.network.bridge.name".to_string(),
                        self.bridge.clone(),
                    );
                    options.insert(
                        "com.docker.network.bridge.enable_icc".to_string(),
                        "false".to_string(),
                    );
                    let mut labels = HashMap::new();
                    labels.insert(LABEL_EGRESS.to_string(), "true".to_string());
                    let created = docker
                        .create_network(NetworkCreateRequest {
                            name: self.network.clone(),
                            driver: Some("bridge".into()),
                            options: Some(options),
                            labels: Some(labels),
                            ..Default::default()
                        })
                        .await;
                    match created {
                        Ok(_) => {
                            tracing::info!(network = %self.network, "supervisor.egress.network_created");
                            return Ok(());
                        }
                        // Another supervisor made it meanwhile: inspect again.
                        Err(bollard::errors::Error::DockerResponseServerError {
                            status_code: 409,
                            ..
                        }) => continue,
                        Err(e) => return Err(format!("creating the Docker network: {e}")),
                    }
                }
                Err(e) => return Err(format!("inspecting the Docker network: {e}")),
            }
        }
        Err(format!(
            "the Docker network {} could not be made",
            self.network
        ))
    }

    /// Network and rules in place, reinstalling what is missing: the guard's state.
    pub async fn ensure(&self, docker: &Docker) -> GuardState {
        if let Err(why) = self.ensure_network(docker).await {
            tracing::error!(error = %why, "supervisor.egress.failed");
            return GuardState::Failed(why);
        }
        let me = self.clone();
        let checked = tokio::task::spawn_blocking(move || -> Result<bool, String> {
            if me.installed()? {
                return Ok(false);
            }
            me.install()?;
            Ok(true)
        })
        .await
        .unwrap_or_else(|e| Err(format!("firewall task: {e}")));
        match checked {
            Ok(reinstalled) => {
                if reinstalled {
                    tracing::info!(network = %self.network, "supervisor.egress.installed");
                }
                GuardState::Active
            }
            Err(why) => {
                tracing::error!(error = %why, "supervisor.egress.failed");
                GuardState::Failed(why)
            }
        }
    }
}

fn chain_exists(family: Family, chain: &str) -> bool {
    matches!(list_chain(family, chain), Ok(Some(_)))
}

/// `iptables -S <chain>` (trimmed); `None` when the chain does not exist.
fn list_chain(family: Family, chain: &str) -> Result<Option<String>, String> {
    let out = Command::new(family.tool())
        .args(["-w", "-S", chain])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", family.tool()))?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim_end)
            .collect::<Vec<_>>()
            .join("\n"),
    ))
}

fn check_rule(family: Family, chain: &str, spec: &[String]) -> Result<bool, String> {
    let status = Command::new(family.tool())
        .args(["-w", "-C", chain])
        .args(spec)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", family.tool()))?;
    Ok(status.success())
}

fn run(tool: &str, args: &[String]) -> Result<(), String> {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{tool}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn run_with_input(tool: &str, args: &[&str], input: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{tool}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| format!("{tool}: no stdin"))?
        .write_all(input.as_bytes())
        .map_err(|e| format!("{tool}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{tool}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::egress::parse_allow;

    #[test]
    fn names_fit_the_kernels_limits() {
        let g = Guard::new("rakazo-computers-with-a-rather-long-name", &[]);
        assert!(g.bridge.len() <= 15, "{}", g.bridge);
        assert!(g.forward_chain.len() <= 28);
        assert_ne!(Guard::new("a", &[]).bridge, Guard::new("b", &[]).bridge);
    }

    #[test]
    fn rules_refuse_private_ranges_after_the_allowlist() {
        let allow = parse_allow("10.9.0.0/16:5432,[fd00::/8]:443,192.168.1.5").unwrap();
        let g = Guard::new("n", &allow);
        let v4 = g.rules(Family::V4);
        let f = &g.forward_chain;
        for cidr in [
            "10.0.0.0/8",
            "169.254.0.0/16",
            "100.64.0.0/10",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "127.0.0.0/8",
        ] {
            assert!(
                v4.contains(&format!(
                    "-A {f} -d {cidr} -j REJECT --reject-with icmp-admin-prohibited"
                )),
                "{cidr}"
            );
        }
        let accept = v4
            .find(&format!(
                "-A {f} -d 10.9.0.0/16 -p tcp -m tcp --dport 5432 -j ACCEPT"
            ))
            .unwrap();
        let host = v4
            .find(&format!("-A {f} -d 192.168.1.5/32 -j ACCEPT"))
            .unwrap();
        let deny = v4.find("-d 10.0.0.0/8 -j REJECT").unwrap();
        assert!(accept < deny && host < deny);
        assert!(!v4.contains("fd00"));
        assert!(v4.contains(&format!("-A {} -j REJECT", g.input_chain)));
        let v6 = g.rules(Family::V6);
        assert!(v6.contains(&format!(
            "-A {f} -d fd00::/8 -p tcp -m tcp --dport 443 -j ACCEPT"
        )));
        assert!(v6.contains(&format!(
            "-A {f} -d fc00::/7 -j REJECT --reject-with icmp6-adm-prohibited"
        )));
        assert!(v6.contains(&format!("-A {f} -d ::ffff:0.0.0.0/96 -j REJECT")));
        assert!(!v6.contains("10.9.0.0"));
    }
}
