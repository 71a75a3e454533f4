//! The egress guard's settings: the operator's allowlist (`SANDBOX_EGRESS_ALLOW`) and the name
//! of the dedicated Docker network (`SANDBOX_EGRESS_NETWORK`), parsed and checked at load.

use std::fmt;
use std::net::IpAddr;

/// The dedicated network of computers when `SANDBOX_EGRESS_NETWORK` is unset.
pub const DEFAULT_NETWORK: &str = "rakazo-computers";

/// One destination opened despite the guard: an address range, and optionally a port range
/// (TCP and UDP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressAllow {
    /// The network address (host bits cleared).
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
    /// Inclusive port range; `None` = every port and protocol.
    pub ports: Option<(u16, u16)>,
}

impl EgressAllow {
    /// `addr/prefix` as iptables takes it.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.addr, self.prefix)
    }
}

impl fmt::Display for EgressAllow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cidr = match self.addr {
            IpAddr::V6(_) if self.ports.is_some() => format!("[{}]", self.cidr()),
            _ => self.cidr(),
        };
        match self.ports {
            None => write!(f, "{cidr}"),
            Some((lo, hi)) if lo == hi => write!(f, "{cidr}:{lo}"),
            Some((lo, hi)) => write!(f, "{cidr}:{lo}-{hi}"),
        }
    }
}

/// Parses `SANDBOX_EGRESS_ALLOW`: entries separated by commas or spaces, each `CIDR`,
/// `CIDR:PORT` or `CIDR:LOW-HIGH`; an IPv6 range with ports is bracketed
/// (`[fd00::/8]:443`); an address without a prefix is a single host.
pub fn parse_allow(raw: &str) -> Result<Vec<EgressAllow>, String> {
    raw.split([',', ' ', '\n', '\t'])
        .filter(|e| !e.is_empty())
        .map(parse_entry)
        .collect()
}

const EXPECTED: &str =
    "comma-separated CIDR, CIDR:PORT or CIDR:LOW-HIGH entries ([v6-CIDR]:PORT for IPv6 with ports)";

fn parse_entry(entry: &str) -> Result<EgressAllow, String> {
    let bad = || format!("{EXPECTED}; `{entry}` is not one");
    let (cidr, ports) = if let Some(rest) = entry.strip_prefix('[') {
        let (cidr, tail) = rest.split_once(']').ok_or_else(bad)?;
        let ports = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or_else(bad)?),
        };
        (cidr, ports)
    } else if entry.matches(':').count() == 1 {
        let (cidr, ports) = entry.split_once(':').ok_or_else(bad)?;
        (cidr, Some(ports))
    } else {
        (entry, None)
    };
    let (addr, prefix) = match cidr.split_once('/') {
        Some((a, p)) => (
            a.parse::<IpAddr>().map_err(|_| bad())?,
            Some(p.parse::<u8>().map_err(|_| bad())?),
        ),
        None => (cidr.parse::<IpAddr>().map_err(|_| bad())?, None),
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = prefix.unwrap_or(max);
    if prefix > max {
        return Err(bad());
    }
    let ports = match ports {
        None => None,
        Some(p) => {
            let (lo, hi) = p.split_once('-').unwrap_or((p, p));
            let (lo, hi) = (
                lo.parse::<u16>().map_err(|_| bad())?,
                hi.parse::<u16>().map_err(|_| bad())?,
            );
            if lo == 0 || hi < lo {
                return Err(bad());
            }
            Some((lo, hi))
        }
    };
    Ok(EgressAllow {
        addr: mask(addr, prefix),
        prefix,
        ports,
    })
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

/// A Docker network name the guard may own: 1 to 48 of `[a-zA-Z0-9_.-]`, starting with an
/// alphanumeric.
pub fn check_network_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err("1 to 48 letters, digits, `_`, `.` or `-`, starting with a letter or digit".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_entries_parse_with_and_without_ports() {
        let got = parse_allow(
            "10.1.2.3, 192.168.0.0/16:5432 172.16.0.9/12:8000-8100,[fd00::1/8]:443,fe80::/10",
        )
        .unwrap();
        let shown: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "10.1.2.3/32",
                "192.168.0.0/16:5432",
                "172.16.0.0/12:8000-8100",
                "[fd00::/8]:443",
                "fe80::/10"
            ]
        );
        assert!(parse_allow("").unwrap().is_empty());
    }

    #[test]
    fn bad_allow_entries_are_refused() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.1:0",
            "10.0.0.1:90-80",
            "example.com",
            "10.0.0.1:http",
            "[fd00::/8",
            "fd00::/129",
            "10.0.0.1;rm",
        ] {
            assert!(parse_allow(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn network_names_are_checked() {
        assert!(check_network_name(DEFAULT_NETWORK).is_ok());
        for bad in ["", "-x", "a b", "a/b", &"x".repeat(49)] {
            assert!(check_network_name(bad).is_err(), "{bad}");
        }
    }
}
