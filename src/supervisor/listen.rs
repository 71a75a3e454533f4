//! Where the supervisor may listen: loopback or a private address, never a public or
//! unspecified one (access to the supervisor is control of the Docker host).

use std::net::{IpAddr, SocketAddr};

/// Accepts loopback, RFC 1918 / link-local IPv4, and loopback / unique-local / link-local IPv6.
pub fn check(addr: SocketAddr) -> Result<(), String> {
    let private = match addr.ip() {
        IpAddr::V4(ip) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        IpAddr::V6(ip) => {
            ip.is_loopback()
                || (ip.segments()[0] & 0xfe00) == 0xfc00
                || (ip.segments()[0] & 0xffc0) == 0xfe80
        }
    };
    if private {
        Ok(())
    } else {
        Err(format!(
            "refusing to listen on {}: the supervisor controls the Docker host, so it listens on loopback or a private address only",
            addr.ip()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_and_private_addresses() {
        for ok in [
            "127.0.0.1:7091",
            "10.1.2.3:1",
            "172.20.0.5:1",
            "192.168.1.1:1",
            "[::1]:1",
            "[fd00::1]:1",
        ] {
            assert!(check(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for bad in [
            "0.0.0.0:7091",
            "8.8.8.8:1",
            "[::]:1",
            "[2001:db8::1]:1",
            "172.32.0.1:1",
        ] {
            assert!(check(bad.parse().unwrap()).is_err(), "{bad}");
        }
    }
}
