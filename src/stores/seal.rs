//! Sealed objects: AES-256-GCM in 64 KiB segments, bound to the home's storage id, the object
//! (a revision or a chunk), the segment index and a final-segment flag.
//!
//! Layout (version 2): a header (`RKZS`, version, segment size, storage id, object kind and
//! name, a random 16-byte salt), then segments of `ciphertext || tag`. Each object is sealed
//! under its own key, derived from the data key and the salt, so nonces (the segment index)
//! never repeat under one key however many objects a home has. Every segment's associated
//! data is the whole header plus its index and the final flag, so a flipped byte, a truncated
//! object (no final segment), reordered segments, or a segment spliced in from another
//! object or another home all fail to open. Version 1 objects (whole revisions sealed under
//! the data key with a random nonce prefix) still open.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use rand::RngCore;

/// Magic bytes of a sealed object.
const MAGIC: &[u8; 4] = b"RKZS";
/// The format version written.
const VERSION: u8 = 2;
/// Plaintext bytes per segment.
pub const SEGMENT: usize = 64 * 1024;
/// GCM tag length.
const TAG: usize = 16;
/// Longest storage id accepted in a header.
const MAX_STORAGE_ID: usize = 128;
/// Longest chunk name accepted in a header.
const MAX_CHUNK_NAME: usize = 128;
/// Bytes of the per-object salt.
const SALT: usize = 16;
/// The key derivation context of per-object keys.
const OBJECT_KEY_CONTEXT: &str = "rakazo 2026-11-29 sealed object key v2";

/// Why a sealed object did not open.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not a sealed object of a known version.
    #[error("not a sealed archive (bad magic or version)")]
    BadHeader,
    /// The object belongs to another home, revision or chunk.
    #[error("archive is bound to another home or revision")]
    WrongBinding,
    /// A segment failed authentication (tampered, reordered or spliced).
    #[error("segment {0} failed authentication")]
    Tampered(u64),
    /// The object ends before its final segment.
    #[error("archive is truncated")]
    Truncated,
}

/// Which object of a home a sealed object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object<'a> {
    /// A revision (its manifest; a whole archive in version 1).
    Revision(i64),
    /// A chunk of archive bytes, by name.
    Chunk(&'a str),
}

/// What a sealed object is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding<'a> {
    /// The home's storage id.
    pub storage_id: &'a str,
    /// The object.
    pub object: Object<'a>,
}

impl<'a> Binding<'a> {
    /// A revision of a home.
    pub const fn revision(storage_id: &'a str, revision: i64) -> Self {
        Self {
            storage_id,
            object: Object::Revision(revision),
        }
    }

    /// A chunk of a home.
    pub const fn chunk(storage_id: &'a str, name: &'a str) -> Self {
        Self {
            storage_id,
            object: Object::Chunk(name),
        }
    }
}

/// The version 2 header.
fn header(binding: &Binding<'_>, salt: &[u8; SALT]) -> Vec<u8> {
    let id = binding.storage_id.as_bytes();
    let mut h = Vec::with_capacity(4 + 1 + 4 + 2 + id.len() + 2 + MAX_CHUNK_NAME + SALT);
    h.extend_from_slice(MAGIC);
    h.push(VERSION);
    h.extend_from_slice(&(SEGMENT as u32).to_be_bytes());
    h.extend_from_slice(&(id.len() as u16).to_be_bytes());
    h.extend_from_slice(id);
    match binding.object {
        Object::Revision(revision) => {
            h.push(1);
            h.extend_from_slice(&revision.to_be_bytes());
        }
        Object::Chunk(name) => {
            h.push(2);
            h.push(name.len().min(MAX_CHUNK_NAME) as u8);
            h.extend_from_slice(&name.as_bytes()[..name.len().min(MAX_CHUNK_NAME)]);
        }
    }
    h.extend_from_slice(salt);
    h
}

/// The version 1 header (revisions only).
fn header_v1(storage_id: &str, revision: i64, nonce_prefix: &[u8; 4]) -> Vec<u8> {
    let id = storage_id.as_bytes();
    let mut h = Vec::with_capacity(4 + 1 + 4 + 2 + id.len() + 8 + 4);
    h.extend_from_slice(MAGIC);
    h.push(1);
    h.extend_from_slice(&(SEGMENT as u32).to_be_bytes());
    h.extend_from_slice(&(id.len() as u16).to_be_bytes());
    h.extend_from_slice(id);
    h.extend_from_slice(&revision.to_be_bytes());
    h.extend_from_slice(nonce_prefix);
    h
}

/// The key one object is sealed under.
fn object_key(key: &[u8; 32], salt: &[u8; SALT]) -> [u8; 32] {
    let mut material = [0u8; 32 + SALT];
    material[..32].copy_from_slice(key);
    material[32..].copy_from_slice(salt);
    blake3::derive_key(OBJECT_KEY_CONTEXT, &material)
}

fn nonce(prefix: &[u8; 4], index: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(prefix);
    n[4..].copy_from_slice(&index.to_be_bytes());
    n
}

fn aad(header: &[u8], index: u64, last: bool) -> Vec<u8> {
    let mut a = Vec::with_capacity(header.len() + 9);
    a.extend_from_slice(header);
    a.extend_from_slice(&index.to_be_bytes());
    a.push(u8::from(last));
    a
}

/// The size of `plain_len` bytes sealed for `binding`.
pub fn sealed_len(binding: &Binding<'_>, plain_len: usize) -> u64 {
    let segments = plain_len.div_ceil(SEGMENT).max(1);
    (header(binding, &[0; SALT]).len() + plain_len + segments * TAG) as u64
}

/// The version of a sealed object, if it looks like one.
pub fn version(sealed: &[u8]) -> Option<u8> {
    (sealed.len() > 4 && &sealed[..4] == MAGIC).then(|| sealed[4])
}

/// Segments sealed per batch and thread: batches go to the writer in order, and their buffers
/// are reused, so sealing streams instead of touching a second archive-sized buffer.
const BATCH_SEGMENTS: usize = 64;

/// Seal `plain` for `binding` under a 32-byte key.
pub fn seal(key: &[u8; 32], binding: &Binding<'_>, plain: &[u8]) -> Vec<u8> {
    let segments = plain.len().div_ceil(SEGMENT).max(1);
    let mut out = Vec::with_capacity(64 + MAX_STORAGE_ID + plain.len() + segments * TAG);
    seal_to(key, binding, plain, &mut out).expect("writing to memory cannot fail");
    out
}

/// Seal `plain` for `binding` under a 32-byte key, streaming the sealed archive to `out`.
/// Segments are independent: each round seals one batch per core, then writes them in order.
pub fn seal_to(
    key: &[u8; 32],
    binding: &Binding<'_>,
    plain: &[u8],
    out: &mut (impl std::io::Write + ?Sized),
) -> std::io::Result<()> {
    let mut salt = [0u8; SALT];
    rand::rng().fill_bytes(&mut salt);
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&object_key(key, &salt)));
    let prefix = [0u8; 4];
    let header = header(binding, &salt);
    out.write_all(&header)?;
    let segments = plain.len().div_ceil(SEGMENT).max(1);
    let job = Job {
        cipher: &cipher,
        header: &header,
        prefix: &prefix,
        plain,
        segments,
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, segments.div_ceil(BATCH_SEGMENTS));
    let round = workers * BATCH_SEGMENTS;
    // Two sets of batch buffers: while the workers seal one round into one set, this thread
    // writes the round before from the other.
    let batch = || vec![0u8; BATCH_SEGMENTS * (SEGMENT + TAG)];
    let mut sealing: Vec<Vec<u8>> = (0..workers).map(|_| batch()).collect();
    let mut writing: Vec<Vec<u8>> = (0..workers).map(|_| batch()).collect();
    let mut written_lens: Vec<usize> = Vec::new();
    let mut first = 0;
    while first < segments {
        let mut lens = vec![0usize; workers];
        let wrote = std::thread::scope(|scope| {
            for ((w, buf), len) in sealing.iter_mut().enumerate().zip(lens.iter_mut()) {
                let start = first + w * BATCH_SEGMENTS;
                if start >= segments {
                    break;
                }
                let end = (start + BATCH_SEGMENTS).min(segments);
                let job = &job;
                scope.spawn(move || *len = job.seal_range(start, end, buf));
            }
            write_batches(out, &writing, &written_lens)
        });
        wrote?;
        std::mem::swap(&mut sealing, &mut writing);
        written_lens = lens;
        first += round;
    }
    write_batches(out, &writing, &written_lens)
}

/// Writes the sealed batches of one round, in order.
fn write_batches(
    out: &mut (impl std::io::Write + ?Sized),
    buffers: &[Vec<u8>],
    lens: &[usize],
) -> std::io::Result<()> {
    for (buf, len) in buffers.iter().zip(lens) {
        out.write_all(&buf[..*len])?;
    }
    Ok(())
}

/// What every sealing thread shares.
struct Job<'a> {
    cipher: &'a Aes256Gcm,
    header: &'a [u8],
    prefix: &'a [u8; 4],
    plain: &'a [u8],
    segments: usize,
}

impl Job<'_> {
    /// Seals segments `first..end` into the start of `out`; how many bytes they took.
    fn seal_range(&self, first: usize, end: usize, out: &mut [u8]) -> usize {
        let len = self.plain.len();
        let mut at = 0;
        for index in first..end {
            let chunk = &self.plain[(index * SEGMENT).min(len)..((index + 1) * SEGMENT).min(len)];
            let buf = &mut out[at..at + chunk.len() + TAG];
            let (text, tag) = buf.split_at_mut(chunk.len());
            text.copy_from_slice(chunk);
            let n = nonce(self.prefix, index as u64);
            let ad = aad(self.header, index as u64, index + 1 == self.segments);
            let sealed_tag = self
                .cipher
                .encrypt_in_place_detached(Nonce::from_slice(&n), &ad, text)
                .expect("AES-GCM encryption of a bounded segment cannot fail");
            tag.copy_from_slice(&sealed_tag);
            at += chunk.len() + TAG;
        }
        at
    }
}

/// Open a sealed archive, checking it is bound to `binding`.
pub fn open(key: &[u8; 32], binding: &Binding<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    let (header, body) = parse_header(sealed)?;
    let (expected, key, prefix) = match header[4] {
        1 => {
            let Object::Revision(revision) = binding.object else {
                return Err(SealError::WrongBinding);
            };
            let prefix: [u8; 4] = header[header.len() - 4..].try_into().expect("4 bytes");
            (
                header_v1(binding.storage_id, revision, &prefix),
                *key,
                prefix,
            )
        }
        _ => {
            let salt: [u8; SALT] = header[header.len() - SALT..].try_into().expect("salt");
            (
                self::header(binding, &salt),
                object_key(key, &salt),
                [0u8; 4],
            )
        }
    };
    if header != expected.as_slice() {
        return Err(SealError::WrongBinding);
    }
    if body.is_empty() {
        return Err(SealError::Truncated);
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key));
    let chunks: Vec<&[u8]> = body.chunks(SEGMENT + TAG).collect();
    let count = chunks.len();
    let plain_len: usize = chunks.iter().map(|c| c.len().saturating_sub(TAG)).sum();
    let mut out = vec![0u8; plain_len];
    // Segments are independent: open them on every core, each into its own part of `out`.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, count);
    let per = count.div_ceil(workers);
    let mut failures = Vec::new();
    std::thread::scope(|scope| {
        let mut rest = out.as_mut_slice();
        let mut handles = Vec::new();
        for first in (0..count).step_by(per) {
            let end = (first + per).min(count);
            let size: usize = chunks[first..end]
                .iter()
                .map(|c| c.len().saturating_sub(TAG))
                .sum();
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(size);
            rest = tail;
            let (cipher, chunks) = (&cipher, &chunks);
            handles.push(scope.spawn(move || {
                let mut at = 0;
                for (index, chunk) in chunks.iter().enumerate().take(end).skip(first) {
                    if chunk.len() < TAG {
                        return Some(index);
                    }
                    let (text, tag) = chunk.split_at(chunk.len() - TAG);
                    let buf = &mut mine[at..at + text.len()];
                    buf.copy_from_slice(text);
                    let n = nonce(&prefix, index as u64);
                    let ad = aad(header, index as u64, index + 1 == count);
                    if cipher
                        .decrypt_in_place_detached(
                            Nonce::from_slice(&n),
                            &ad,
                            buf,
                            aes_gcm::Tag::from_slice(tag),
                        )
                        .is_err()
                    {
                        return Some(index);
                    }
                    at += text.len();
                }
                None
            }));
        }
        failures = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap_or(Some(0)))
            .collect();
    });
    // The first failing segment decides, as if they were opened in order.
    match failures.into_iter().min() {
        None => Ok(out),
        Some(index) if index + 1 == count => Err(SealError::Truncated),
        Some(index) => Err(SealError::Tampered(index as u64)),
    }
}

/// A parsed object: the header bytes and the segments.
type Parsed<'a> = (&'a [u8], &'a [u8]);

fn parse_header(sealed: &[u8]) -> Result<Parsed<'_>, SealError> {
    let fixed = 4 + 1 + 4 + 2;
    if sealed.len() < fixed || &sealed[..4] != MAGIC || !matches!(sealed[4], 1 | VERSION) {
        return Err(SealError::BadHeader);
    }
    if u32::from_be_bytes(sealed[5..9].try_into().expect("4 bytes")) as usize != SEGMENT {
        return Err(SealError::BadHeader);
    }
    let id_len = u16::from_be_bytes([sealed[9], sealed[10]]) as usize;
    if id_len > MAX_STORAGE_ID {
        return Err(SealError::BadHeader);
    }
    let at = fixed + id_len;
    let end = if sealed[4] == 1 {
        at + 8 + 4
    } else {
        match sealed.get(at) {
            Some(1) => at + 1 + 8 + SALT,
            Some(2) => at + 2 + *sealed.get(at + 1).ok_or(SealError::BadHeader)? as usize + SALT,
            _ => return Err(SealError::BadHeader),
        }
    };
    if sealed.len() < end {
        return Err(SealError::BadHeader);
    }
    Ok(sealed.split_at(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const B: Binding<'static> = Binding::revision("home-a", 3);

    fn sample() -> Vec<u8> {
        (0..(SEGMENT * 3 + 123))
            .map(|i| (i * 31 % 251) as u8)
            .collect()
    }

    #[test]
    fn round_trips_including_empty_and_exact_segments() {
        for len in [0, 1, SEGMENT, SEGMENT * 2, SEGMENT * 3 + 123] {
            let plain: Vec<u8> = sample().into_iter().cycle().take(len).collect();
            assert_eq!(open(&KEY, &B, &seal(&KEY, &B, &plain)).unwrap(), plain);
        }
    }

    #[test]
    fn sealed_len_is_what_sealing_makes() {
        for len in [0, 1, SEGMENT, SEGMENT * 3 + 123] {
            let plain = vec![1u8; len];
            for binding in [B, Binding::chunk("home-a", "c1")] {
                assert_eq!(
                    sealed_len(&binding, len),
                    seal(&KEY, &binding, &plain).len() as u64
                );
            }
        }
    }

    #[test]
    fn a_flipped_byte_anywhere_fails() {
        let sealed = seal(&KEY, &B, &sample());
        for pos in [0, 5, 12, 20, 40, sealed.len() / 2, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[pos] ^= 0x01;
            assert!(open(&KEY, &B, &bad).is_err(), "flip at {pos}");
        }
    }

    #[test]
    fn truncation_is_detected_at_every_segment_boundary() {
        let sealed = seal(&KEY, &B, &sample());
        let header_len = sealed.len() - (sample().len() + 4 * TAG);
        for segments in 0..4 {
            let cut = header_len + segments * (SEGMENT + TAG);
            assert_eq!(
                open(&KEY, &B, &sealed[..cut]),
                Err(SealError::Truncated),
                "{segments} segments"
            );
        }
    }

    #[test]
    fn reordered_segments_fail() {
        let sealed = seal(&KEY, &B, &sample());
        let header_len = sealed.len() - (sample().len() + 4 * TAG);
        let seg = SEGMENT + TAG;
        let mut bad = sealed[..header_len].to_vec();
        bad.extend_from_slice(&sealed[header_len + seg..header_len + 2 * seg]);
        bad.extend_from_slice(&sealed[header_len..header_len + seg]);
        bad.extend_from_slice(&sealed[header_len + 2 * seg..]);
        assert_eq!(open(&KEY, &B, &bad), Err(SealError::Tampered(0)));
    }

    #[test]
    fn segments_from_another_revision_or_home_fail() {
        let plain = sample();
        let ours = seal(&KEY, &B, &plain);
        let other_rev = seal(&KEY, &Binding::revision("home-a", 4), &plain);
        let other_home = seal(&KEY, &Binding::revision("home-b", 3), &plain);
        assert_eq!(open(&KEY, &B, &other_rev), Err(SealError::WrongBinding));
        assert_eq!(open(&KEY, &B, &other_home), Err(SealError::WrongBinding));
        // Splice: our header with another archive's segment (same key, other binding).
        let header_len = ours.len() - (plain.len() + 4 * TAG);
        let other_header_len = other_rev.len() - (plain.len() + 4 * TAG);
        let mut spliced = ours[..header_len + SEGMENT + TAG].to_vec();
        spliced.extend_from_slice(&other_rev[other_header_len + SEGMENT + TAG..]);
        assert!(open(&KEY, &B, &spliced).is_err());
        // A wrong key never opens.
        assert!(open(&[8; 32], &B, &ours).is_err());
        assert_eq!(open(&KEY, &B, b"garbage"), Err(SealError::BadHeader));
    }

    #[test]
    fn chunks_open_only_under_their_own_name_and_objects_never_share_a_key() {
        let plain = sample();
        let chunk = Binding::chunk("home-a", "c1");
        let sealed = seal(&KEY, &chunk, &plain);
        assert_eq!(open(&KEY, &chunk, &sealed).unwrap(), plain);
        for other in [
            Binding::chunk("home-a", "c2"),
            Binding::chunk("home-b", "c1"),
            B,
        ] {
            assert_eq!(open(&KEY, &other, &sealed), Err(SealError::WrongBinding));
        }
        // The same plaintext sealed twice: different salts, keys and ciphertexts.
        let again = seal(&KEY, &chunk, &plain);
        let body = sealed.len() - (plain.len() + 4 * TAG);
        assert_ne!(sealed[body..], again[body..]);
    }

    /// A version 1 object, as earlier releases sealed revisions.
    fn seal_v1(binding_revision: i64, plain: &[u8]) -> Vec<u8> {
        let prefix = [9u8, 8, 7, 6];
        let header = header_v1("home-a", binding_revision, &prefix);
        let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&KEY));
        let mut out = header.clone();
        let count = plain.len().div_ceil(SEGMENT).max(1);
        for index in 0..count {
            let mut text = plain
                [(index * SEGMENT).min(plain.len())..((index + 1) * SEGMENT).min(plain.len())]
                .to_vec();
            let tag = cipher
                .encrypt_in_place_detached(
                    Nonce::from_slice(&nonce(&prefix, index as u64)),
                    &aad(&header, index as u64, index + 1 == count),
                    &mut text,
                )
                .unwrap();
            out.extend_from_slice(&text);
            out.extend_from_slice(&tag);
        }
        out
    }

    #[test]
    fn version_1_revisions_still_open_and_stay_bound() {
        let plain = sample();
        let old = seal_v1(3, &plain);
        assert_eq!(version(&old), Some(1));
        assert_eq!(open(&KEY, &B, &old).unwrap(), plain);
        assert_eq!(
            open(&KEY, &Binding::revision("home-a", 4), &old),
            Err(SealError::WrongBinding)
        );
        assert_eq!(
            open(&KEY, &Binding::chunk("home-a", "3"), &old),
            Err(SealError::WrongBinding)
        );
        let mut flipped = old.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(open(&KEY, &B, &flipped).is_err());
    }
}
