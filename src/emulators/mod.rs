//! Offline vendor emulators: servers on loopback that answer a sandbox vendor's wire as the
//! vendor does, so that the real adapter (and the vendor's own SDK) runs against them
//! unchanged. `rakazo emulator <vendor> --listen ADDR` runs one; `SANDBOX_PROVIDER=
//! <vendor>-emulator` starts one in-process on a loopback port and points the real adapter
//! at it.
//!
//! - [`machines`]: the shared machine backend: a sandbox is a real container of the computer
//!   image through the supervisor (account name and home of the vendor's user), commands by
//!   the supervisor's exec, background processes followed through files, chunked file bytes;
//! - [`front`]: the shared listener that routes a vendor's port hosts
//!   (`<port>-<sandbox id>.<domain>`) by the `Host` header to the machine's published port
//!   and everything else to the emulator's HTTP app;
//! - [`e2b`]: E2B's control plane (`/v2/sandboxes`...) and envd (Connect RPC, `/files`), and
//!   Novita's E2B-compatible API in its Novita mode;
//! - [`daytona`]: Daytona's API (`/api/sandbox`...) and toolbox (`/toolbox/{id}/...`), with
//!   a preview listener per sandbox port;
//! - [`boat`]: Box's API (`/api/v1/sandboxes`...), the vendor the spec calls Box or Boat;
//! - [`kubernetes`]: the Kubernetes API subset kubectl and kube-rs use, pods backed by
//!   Docker containers of this host.

pub mod boat;
pub mod daytona;
pub mod e2b;
pub mod files;
pub mod front;
pub mod kubernetes;
pub mod machines;

pub use files::{Entry, list, port_addr, read, running};

use rand::Rng as _;

/// A random id of `len` characters from `[a-z0-9]`.
pub fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Whether `presented` is the secret `expected`, compared in constant time; an empty secret
/// never is.
pub fn same_secret(presented: &str, expected: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    !presented.is_empty() && bool::from(presented.as_bytes().ct_eq(expected.as_bytes()))
}

/// Whether a request's `Authorization: Bearer <key>` is accepted: `key` itself, or any
/// non-empty key when the emulator takes every key (`None`).
pub fn bearer_accepted(req: &actix_web::HttpRequest, key: Option<&str>) -> bool {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    match key {
        Some(key) => same_secret(presented, key),
        None => !presented.is_empty(),
    }
}

/// The emulators this build has.
pub const VENDORS: &[&str] = &["e2b", "novita", "daytona", "box", "kubernetes"];
