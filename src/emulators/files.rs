//! What the daytona- and box-emulators need of a machine beyond [`Machines`]: a file read
//! that says `NotFound`, directory listings (links listed, never followed), whether a
//! machine is still there, and where this host reaches one of its ports.

use std::time::Duration;

use rakazo_actors::provider::{ProviderError, ProviderResult};
use serde::Deserialize;

use super::machines::Machines;
use crate::desktop::shell_quote;
use crate::supervisor::engine::GATEWAY_PORT;

/// Where this host reaches `port` of a machine: only the screen gateway's port is published
/// by the machines, so any other port is `None`.
pub async fn port_addr(
    machines: &Machines,
    machine: &str,
    port: u16,
) -> ProviderResult<Option<std::net::SocketAddr>> {
    if port != GATEWAY_PORT {
        return Ok(None);
    }
    Ok(machines
        .inspect(machine)
        .await?
        .gateway_port
        .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))))
}

/// Largest file the emulators read.
pub const MAX_FILE: u64 = 64 << 20;

/// An entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Entry {
    /// Name within the directory.
    pub name: String,
    /// A directory.
    pub dir: bool,
    /// Size in bytes.
    pub size: u64,
    /// `st_mode`.
    pub mode: u32,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// Prints one JSON line per entry of `argv[1]`, never following a link.
const LIST_PY: &str = r#"import grp, json, os, pwd, stat, sys
d = sys.argv[1]
def name(f, i):
    try:
        return f(i)[0]
    except KeyError:
        return str(i)
for n in sorted(os.listdir(d)):
    try:
        s = os.lstat(os.path.join(d, n))
    except OSError:
        continue
    print(json.dumps({"name": n, "dir": stat.S_ISDIR(s.st_mode), "size": s.st_size, "mode": s.st_mode, "owner": name(pwd.getpwuid, s.st_uid), "group": name(grp.getgrgid, s.st_gid), "mtime": int(s.st_mtime)}))
"#;

/// Reads a regular file; `NotFound` when there is none.
pub async fn read(machines: &Machines, container: &str, path: &str) -> ProviderResult<Vec<u8>> {
    machines
        .read_file(container, path, MAX_FILE)
        .await?
        .ok_or_else(|| ProviderError::NotFound(path.chars().take(200).collect()))
}

/// Lists a directory; `NotFound` when it is not one.
pub async fn list(machines: &Machines, container: &str, path: &str) -> ProviderResult<Vec<Entry>> {
    let out = machines
        .exec(
            container,
            &format!(
                "[ -d {p} ] || exit 3\nexec python3 -c {py} {p}",
                p = shell_quote(path),
                py = shell_quote(LIST_PY)
            ),
            "/",
            &[],
            Duration::from_secs(30),
        )
        .await?;
    match out.exit_code {
        0 => out
            .stdout
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .map_err(|_| ProviderError::Failed("listing unreadable".into()))
            })
            .collect(),
        3 => Err(ProviderError::NotFound(path.chars().take(200).collect())),
        _ => Err(ProviderError::Failed(
            out.stderr.trim().chars().take(200).collect(),
        )),
    }
}

/// Whether the machine is still there and whether it runs: `None` when it is gone.
pub async fn running(machines: &Machines, container: &str) -> ProviderResult<Option<bool>> {
    match machines.inspect(container).await {
        Ok(info) => Ok(Some(info.running)),
        Err(ProviderError::MachineGone) => Ok(None),
        Err(e) => Err(e),
    }
}
