//! Sealed screen capabilities: AES-256-GCM tokens that bind a screen slot, its policy and expiry.
//!
//! A capability is what a browser holds instead of a provider host or a socket token. It is
//! sealed by the API with the current key of a [`Keyring`] and opened by the proxy on every
//! request. The token is URL-safe base64 (no padding) of:
//!
//! ```text
//! version (1) | key id (4, big endian) | nonce (12) | AES-256-GCM(plaintext) with 16-byte tag
//! ```
//!
//! The version and key id travel in clear so that the proxy can pick the key, and are the AEAD
//! associated data, so changing them is detected like any other tampering. The plaintext is a
//! fixed binary layout (see `Capability::encode`); identifiers that are canonical UUIDs take
//! 16 bytes, others are length-prefixed UTF-8.
//!
//! Opening checks, in order: shape and length (`Malformed`), key id (`UnknownKey`),
//! authentication (`Tampered`), decoded fields (`Malformed`), expiry (`Expired`). Whether the
//! slot generation and control lease are still current is not known here: the
//! [`Authority`](crate::authority::Authority) answers that on every request.

use std::collections::HashMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore as _;

/// Format version of the sealed token; bumped if the layout ever changes.
pub const TOKEN_VERSION: u8 = 1;
/// Longest token text the proxy will even try to decode, to bound the work a request can cause.
pub const MAX_TOKEN_CHARS: usize = 1024;
/// Longest identifier (computer or bot id) that can be sealed, in bytes.
pub const MAX_ID_BYTES: usize = 128;

const HEADER_LEN: usize = 1 + 4;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const ID_UUID: u8 = 0;
const ID_TEXT: u8 = 1;

/// What a capability lets its holder do on the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Watch only: input is never forwarded.
    View,
    /// Watch and send pointer, keyboard and clipboard input (under a control lease).
    Control,
}

impl Policy {
    /// The stable lowercase name used in logs, JSON and headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::View => "view",
            Policy::Control => "control",
        }
    }

    /// The weaker of two policies: a view anywhere makes the whole connection view-only.
    pub fn weakest(self, other: Policy) -> Policy {
        if self == Policy::View || other == Policy::View {
            Policy::View
        } else {
            Policy::Control
        }
    }

    fn code(self) -> u8 {
        match self {
            Policy::View => 1,
            Policy::Control => 2,
        }
    }

    fn from_code(code: u8) -> Option<Policy> {
        match code {
            1 => Some(Policy::View),
            2 => Some(Policy::Control),
            _ => None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fields a capability binds. Everything here is authenticated; nothing is secret from the
/// proxy, but the whole token is secret from everyone else (it is a bearer credential).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// The computer whose screen this is.
    pub computer_id: String,
    /// The bot that owns the screen slot.
    pub bot_id: String,
    /// The display slot on the computer (display `:N` is derived from it by the runtime).
    pub slot: u16,
    /// The slot generation at issue time; moves when the slot is torn down or reused.
    pub generation: u64,
    /// View or control.
    pub policy: Policy,
    /// The control lease fence for `control`; always 0 for `view`.
    pub fence: u64,
    /// When the capability stops working, in unix milliseconds.
    pub expires_at_ms: u64,
}

impl Capability {
    /// The plaintext layout:
    /// `computer id | bot id | slot u16 | generation u64 | policy u8 | fence u64 | expiry u64`,
    /// integers big endian, ids as `0x00 + 16 UUID bytes` or `0x01 + len u8 + UTF-8`.
    fn encode(&self) -> Result<Vec<u8>, SealError> {
        let mut out = Vec::with_capacity(64);
        encode_id(&mut out, &self.computer_id)?;
        encode_id(&mut out, &self.bot_id)?;
        out.extend_from_slice(&self.slot.to_be_bytes());
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.push(self.policy.code());
        out.extend_from_slice(&self.fence.to_be_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> Option<Capability> {
        let mut r = Reader(bytes);
        let computer_id = r.id()?;
        let bot_id = r.id()?;
        let slot = u16::from_be_bytes(r.array()?);
        let generation = u64::from_be_bytes(r.array()?);
        let policy = Policy::from_code(r.array::<1>()?[0])?;
        let fence = u64::from_be_bytes(r.array()?);
        let expires_at_ms = u64::from_be_bytes(r.array()?);
        if !r.0.is_empty() || (policy == Policy::View && fence != 0) {
            return None;
        }
        Some(Capability {
            computer_id,
            bot_id,
            slot,
            generation,
            policy,
            fence,
            expires_at_ms,
        })
    }
}

fn encode_id(out: &mut Vec<u8>, id: &str) -> Result<(), SealError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(SealError::BadId);
    }
    match uuid::Uuid::try_parse(id) {
        Ok(u) if u.hyphenated().to_string() == id => {
            out.push(ID_UUID);
            out.extend_from_slice(u.as_bytes());
        }
        _ => {
            out.push(ID_TEXT);
            out.push(id.len() as u8);
            out.extend_from_slice(id.as_bytes());
        }
    }
    Ok(())
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn id(&mut self) -> Option<String> {
        match self.array::<1>()?[0] {
            ID_UUID => Some(
                uuid::Uuid::from_bytes(self.array()?)
                    .hyphenated()
                    .to_string(),
            ),
            ID_TEXT => {
                let len = self.array::<1>()?[0] as usize;
                if len == 0 || len > MAX_ID_BYTES {
                    return None;
                }
                String::from_utf8(self.take(len)?.to_vec()).ok()
            }
            _ => None,
        }
    }
}

/// Why a token could not be opened. Each variant is a distinct refusal reason in the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Not a token of ours: bad base64, wrong length or version, or an impossible field.
    #[error("malformed capability")]
    Malformed,
    /// Sealed with a key this keyring does not hold (rotated out, or another deployment's).
    #[error("capability sealed with an unknown key")]
    UnknownKey,
    /// Authentication failed: some byte was changed.
    #[error("capability failed authentication")]
    Tampered,
    /// Authentic, but its expiry has passed.
    #[error("capability expired")]
    Expired,
}

impl OpenError {
    /// The stable name used as the refusal detail.
    pub fn as_str(self) -> &'static str {
        match self {
            OpenError::Malformed => "malformed",
            OpenError::UnknownKey => "unknown_key",
            OpenError::Tampered => "tampered",
            OpenError::Expired => "expired",
        }
    }
}

/// Why a capability could not be sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// An id is empty or longer than [`MAX_ID_BYTES`].
    #[error("capability id is empty or too long")]
    BadId,
    /// A view capability must carry fence 0.
    #[error("a view capability cannot carry a lease fence")]
    ViewWithFence,
    /// Encryption failed (does not happen with valid keys).
    #[error("capability encryption failed")]
    Encrypt,
}

/// The AES-256-GCM keys that seal and open capabilities: one current key (used to seal) and
/// older keys by id (still accepted to open until they are dropped), so keys can rotate without
/// breaking links issued a moment earlier.
pub struct Keyring {
    current: u32,
    keys: HashMap<u32, Aes256Gcm>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<_> = self.keys.keys().copied().collect();
        ids.sort_unstable();
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("key_ids", &ids)
            .finish()
    }
}

impl Keyring {
    /// A keyring whose current (sealing) key is `key` with id `key_id`.
    pub fn new(key_id: u32, key: &[u8; 32]) -> Keyring {
        let mut keys = HashMap::new();
        keys.insert(key_id, Aes256Gcm::new(key.into()));
        Keyring {
            current: key_id,
            keys,
        }
    }

    /// A keyring with a fresh random key (tests and single-process development).
    pub fn random(key_id: u32) -> Keyring {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Keyring::new(key_id, &key)
    }

    /// Also accept tokens sealed with an older key `key_id` (never used to seal).
    /// A key id equal to the current one is ignored.
    pub fn with_previous(mut self, key_id: u32, key: &[u8; 32]) -> Keyring {
        if key_id != self.current {
            self.keys.insert(key_id, Aes256Gcm::new(key.into()));
        }
        self
    }

    /// The id of the key that seals new capabilities.
    pub fn current_key_id(&self) -> u32 {
        self.current
    }

    /// Seals `cap` with the current key and a fresh random nonce.
    pub fn seal(&self, cap: &Capability) -> Result<String, SealError> {
        if cap.policy == Policy::View && cap.fence != 0 {
            return Err(SealError::ViewWithFence);
        }
        let plaintext = cap.encode()?;
        let header = header(self.current);
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let cipher = &self.keys[&self.current];
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &plaintext,
                    aad: &header,
                },
            )
            .map_err(|_| SealError::Encrypt)?;
        let mut raw = Vec::with_capacity(HEADER_LEN + NONCE_LEN + sealed.len());
        raw.extend_from_slice(&header);
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        Ok(URL_SAFE_NO_PAD.encode(raw))
    }

    /// Opens `token` and checks its expiry against `now_ms` (unix milliseconds).
    pub fn open(&self, token: &str, now_ms: u64) -> Result<Capability, OpenError> {
        if token.len() > MAX_TOKEN_CHARS {
            return Err(OpenError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD
            .decode(token)
            .map_err(|_| OpenError::Malformed)?;
        if raw.len() < HEADER_LEN + NONCE_LEN + TAG_LEN || raw[0] != TOKEN_VERSION {
            return Err(OpenError::Malformed);
        }
        let (header, rest) = raw.split_at(HEADER_LEN);
        let key_id = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let cipher = self.keys.get(&key_id).ok_or(OpenError::UnknownKey)?;
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let plaintext = cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: header,
                },
            )
            .map_err(|_| OpenError::Tampered)?;
        let cap = Capability::decode(&plaintext).ok_or(OpenError::Malformed)?;
        if cap.expires_at_ms <= now_ms {
            return Err(OpenError::Expired);
        }
        Ok(cap)
    }
}

fn header(key_id: u32) -> [u8; HEADER_LEN] {
    let k = key_id.to_be_bytes();
    [TOKEN_VERSION, k[0], k[1], k[2], k[3]]
}

/// The current time in unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const NOW: u64 = 1_700_000_000_000;

    fn cap(policy: Policy) -> Capability {
        Capability {
            computer_id: "0b6f3a5e-8f7c-4d2b-9a1e-3c5d7e9f1a2b".into(),
            bot_id: "bot-7".into(),
            slot: 3,
            generation: 42,
            policy,
            fence: if policy == Policy::Control { 9 } else { 0 },
            expires_at_ms: NOW + 60_000,
        }
    }

    #[test]
    fn round_trips_and_is_short() {
        let ring = Keyring::random(7);
        for policy in [Policy::View, Policy::Control] {
            let c = cap(policy);
            let token = ring.seal(&c).unwrap();
            assert!(token.len() < 140, "token is {} chars", token.len());
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            assert_eq!(ring.open(&token, NOW).unwrap(), c);
        }
    }

    #[test]
    fn nonces_make_every_token_different() {
        let ring = Keyring::random(1);
        let c = cap(Policy::View);
        assert_ne!(ring.seal(&c).unwrap(), ring.seal(&c).unwrap());
    }

    #[test]
    fn expired_is_refused_at_the_boundary() {
        let ring = Keyring::random(1);
        let c = cap(Policy::View);
        let token = ring.seal(&c).unwrap();
        assert!(ring.open(&token, c.expires_at_ms - 1).is_ok());
        assert_eq!(ring.open(&token, c.expires_at_ms), Err(OpenError::Expired));
    }

    #[test]
    fn rotation_keeps_old_tokens_until_the_old_key_is_dropped() {
        let old_key = [1u8; 32];
        let new_key = [2u8; 32];
        let old = Keyring::new(1, &old_key);
        let token = old.seal(&cap(Policy::View)).unwrap();
        let rotated = Keyring::new(2, &new_key).with_previous(1, &old_key);
        assert!(rotated.open(&token, NOW).is_ok());
        assert_eq!(rotated.current_key_id(), 2);
        let fresh = rotated.seal(&cap(Policy::View)).unwrap();
        assert_eq!(old.open(&fresh, NOW), Err(OpenError::UnknownKey));
        let dropped = Keyring::new(2, &new_key);
        assert_eq!(dropped.open(&token, NOW), Err(OpenError::UnknownKey));
    }

    #[test]
    fn same_key_id_with_another_key_is_tampered() {
        let a = Keyring::new(1, &[1u8; 32]);
        let b = Keyring::new(1, &[3u8; 32]);
        let token = a.seal(&cap(Policy::Control)).unwrap();
        assert_eq!(b.open(&token, NOW), Err(OpenError::Tampered));
    }

    #[test]
    fn header_is_authenticated() {
        let old_key = [5u8; 32];
        // Both ids hold the same key: only the associated data can tell them apart.
        let ring = Keyring::new(1, &old_key).with_previous(2, &old_key);
        let token = ring.seal(&cap(Policy::View)).unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(&token).unwrap();
        raw[4] = 2;
        let moved = URL_SAFE_NO_PAD.encode(&raw);
        assert_eq!(ring.open(&moved, NOW), Err(OpenError::Tampered));
        raw[4] = 1;
        raw[0] = 2;
        assert_eq!(
            ring.open(&URL_SAFE_NO_PAD.encode(&raw), NOW),
            Err(OpenError::Malformed)
        );
    }

    #[test]
    fn sealing_validates_fields() {
        let ring = Keyring::random(1);
        let mut c = cap(Policy::View);
        c.fence = 1;
        assert_eq!(ring.seal(&c), Err(SealError::ViewWithFence));
        let mut c = cap(Policy::View);
        c.bot_id = String::new();
        assert_eq!(ring.seal(&c), Err(SealError::BadId));
        c.bot_id = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(ring.seal(&c), Err(SealError::BadId));
        // Non-canonical UUID text survives unchanged (sealed as text, not as 16 bytes).
        let mut c = cap(Policy::View);
        c.computer_id = "0B6F3A5E-8F7C-4D2B-9A1E-3C5D7E9F1A2B".into();
        let token = ring.seal(&c).unwrap();
        assert_eq!(ring.open(&token, NOW).unwrap(), c);
    }

    #[test]
    fn obvious_garbage_is_malformed() {
        let ring = Keyring::random(1);
        for token in ["", "a", "!!!!", "AAAA", &"A".repeat(MAX_TOKEN_CHARS + 4)] {
            assert_eq!(ring.open(token, NOW), Err(OpenError::Malformed), "{token}");
        }
    }

    /// Property test: random strings, random byte strings under a valid header, and every kind
    /// of mutation of valid tokens never panic and never open.
    #[test]
    fn fuzz_random_and_mutated_tokens_never_open() {
        let ring = Keyring::new(9, &[7u8; 32]).with_previous(3, &[8u8; 32]);
        let mut rng = StdRng::seed_from_u64(0x5eed_cafe);
        let alphabet: Vec<char> =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.%"
                .chars()
                .collect();
        let originals: Vec<String> = (0..16)
            .map(|i| {
                let mut c = cap(if i % 2 == 0 {
                    Policy::View
                } else {
                    Policy::Control
                });
                c.slot = i;
                ring.seal(&c).unwrap()
            })
            .collect();
        let mut counts = HashMap::<&'static str, usize>::new();
        for round in 0..40_000u32 {
            let candidate = match round % 5 {
                // Random text.
                0 => {
                    let len = rng.random_range(0..200);
                    (0..len)
                        .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                        .collect::<String>()
                }
                // Random bytes behind a valid header for a known key.
                1 => {
                    let len = rng.random_range(0..150);
                    let mut raw = header(9).to_vec();
                    raw.extend((0..len).map(|_| rng.random::<u8>()));
                    URL_SAFE_NO_PAD.encode(raw)
                }
                // Bit flips in the decoded bytes.
                2 => {
                    let orig = &originals[rng.random_range(0..originals.len())];
                    let mut raw = URL_SAFE_NO_PAD.decode(orig).unwrap();
                    for _ in 0..rng.random_range(1..4) {
                        let i = rng.random_range(0..raw.len());
                        raw[i] ^= 1 << rng.random_range(0..8);
                    }
                    URL_SAFE_NO_PAD.encode(raw)
                }
                // Character substitutions in the text.
                3 => {
                    let orig = &originals[rng.random_range(0..originals.len())];
                    let mut chars: Vec<char> = orig.chars().collect();
                    let i = rng.random_range(0..chars.len());
                    chars[i] = alphabet[rng.random_range(0..alphabet.len())];
                    chars.into_iter().collect()
                }
                // Truncation, extension and splicing.
                _ => {
                    let a = &originals[rng.random_range(0..originals.len())];
                    let b = &originals[rng.random_range(0..originals.len())];
                    match rng.random_range(0..3) {
                        0 => a[..rng.random_range(0..a.len())].to_string(),
                        1 => format!("{a}{}", &b[..rng.random_range(1..b.len())]),
                        _ => {
                            let cut = rng.random_range(1..a.len());
                            format!("{}{}", &a[..cut], &b[cut..])
                        }
                    }
                }
            };
            if originals.contains(&candidate) {
                continue;
            }
            match ring.open(&candidate, NOW) {
                Ok(c) => panic!("false accept of {candidate:?}: {c:?}"),
                Err(e) => *counts.entry(e.as_str()).or_default() += 1,
            }
        }
        // Every refusal class is exercised.
        for kind in ["malformed", "unknown_key", "tampered"] {
            assert!(counts.get(kind).copied().unwrap_or(0) > 100, "{counts:?}");
        }
    }
}
