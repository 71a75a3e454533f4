//! Chunked revisions: a revision is a sealed manifest naming, in order, the sealed chunks its
//! archive is made of. A chunk is whole archive entries (a piece a provider cut, or a cut of
//! a received archive); a chunk the previous revision holds is named again, not stored again.
//!
//! Chunk names are keyed hashes (the key derived from the home's data key, so names reveal
//! nothing): of the provider's stamp for a stamped piece, else of the bytes. Chunks are sealed
//! bound to the home and their name; the manifest is sealed bound to the home and the
//! revision, so a revision opens only with exactly the chunks it names, in its order.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use rakazo_actors::home_store::{HomeId, StoreError};
use rakazo_actors::workspace::{ARCHIVE_END, Piece, Workspace};
use serde::{Deserialize, Serialize};

use super::archive::{self, Counts, Limits};
use super::local::refused;
use super::seal::{self, Binding};

/// The manifest format written.
pub(crate) const FORMAT: &str = "rakazo-revision-1";
/// The key derivation context of chunk names.
const NAME_KEY_CONTEXT: &str = "rakazo 2026-11-29 chunk names v1";

/// One chunk of a revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Its name (hex).
    pub name: String,
    /// Its plaintext length.
    pub len: u64,
    /// Entries in it.
    pub entries: u64,
    /// Sum of its file sizes.
    pub file_bytes: u64,
}

/// What a revision is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format.
    pub format: String,
    /// The chunks, in archive order.
    pub chunks: Vec<ChunkRef>,
}

impl Manifest {
    /// The manifest's plaintext.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest serializes")
    }

    /// Reads a manifest's plaintext (already authenticated), refusing an unknown format or a
    /// chunk name that is not hex.
    pub fn decode(plain: &[u8]) -> Result<Self, StoreError> {
        let manifest: Self = serde_json::from_slice(plain)
            .map_err(|_| StoreError::Rejected("unreadable revision manifest".into()))?;
        let named = manifest
            .chunks
            .iter()
            .all(|c| c.name.len() == 64 && c.name.bytes().all(|b| b.is_ascii_hexdigit()));
        if manifest.format != FORMAT || !named {
            return Err(StoreError::Rejected("unknown revision manifest".into()));
        }
        Ok(manifest)
    }

    /// The archive's size (its chunks and the end blocks).
    pub fn archive_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum::<u64>() + ARCHIVE_END.len() as u64
    }

    /// The names of its chunks.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.chunks.iter().map(|c| c.name.as_str())
    }

    /// The whole archive from its chunks' plaintexts, in order, each checked for length.
    pub fn assemble(
        &self,
        chunks: impl IntoIterator<Item = Result<Vec<u8>, StoreError>>,
    ) -> Result<Vec<u8>, StoreError> {
        let mut archive = Vec::with_capacity(self.archive_bytes() as usize);
        let mut chunks = chunks.into_iter();
        for chunk in &self.chunks {
            let plain = chunks
                .next()
                .unwrap_or_else(|| Err(StoreError::Rejected("a chunk is missing".into())))?;
            if plain.len() as u64 != chunk.len {
                return Err(StoreError::Rejected("a chunk has the wrong length".into()));
            }
            archive.extend_from_slice(&plain);
        }
        archive.extend_from_slice(&ARCHIVE_END);
        Ok(archive)
    }
}

/// A home's kept revisions, opened once per save: what a new revision can name, and what
/// retention keeps after it.
#[derive(Debug, Default)]
pub struct Kept {
    /// Each kept revision and its manifest (`None`: sealed whole, it names no chunks).
    read: Vec<(i64, Option<Manifest>)>,
    /// Kept revisions that could not be read.
    unreadable: Vec<i64>,
}

impl Kept {
    /// Adds what opening kept `revision` gave.
    pub fn add(&mut self, revision: i64, opened: Result<Revision, StoreError>) {
        match opened {
            Ok(opened) => self.read.push((revision, opened.manifest())),
            Err(_) => self.unreadable.push(revision),
        }
    }

    /// The manifests read.
    pub fn manifests(&self) -> impl Iterator<Item = &Manifest> {
        self.read.iter().filter_map(|(_, m)| m.as_ref())
    }

    /// Whether every kept revision was read: only then can no kept revision have named a
    /// chunk the manifests read do not.
    pub fn complete(&self) -> bool {
        self.unreadable.is_empty()
    }

    /// After `revision` (with `manifest`) was saved, keeping the newest `keep`: the revisions
    /// to forget, and the chunk names every remaining revision names (`None` while one of
    /// them cannot be read: then no chunk may go). The newest revision before `revision` is
    /// never forgotten here: until the database records `revision` (a crash may come first),
    /// that one is the computer's revision, and the next save forgets it.
    pub fn retention<'a>(
        &'a self,
        keep: usize,
        revision: i64,
        manifest: &'a Manifest,
    ) -> (Vec<i64>, Option<HashSet<&'a str>>) {
        let mut revisions: Vec<i64> = self.read.iter().map(|(rev, _)| *rev).collect();
        revisions.extend(&self.unreadable);
        revisions.push(revision);
        revisions.sort_unstable();
        revisions.dedup();
        let recorded = revisions.iter().rev().find(|rev| **rev < revision).copied();
        let expired: Vec<i64> = revisions[..revisions.len().saturating_sub(keep)]
            .iter()
            .copied()
            .filter(|rev| Some(*rev) != recorded)
            .collect();
        let remains = |rev: &i64| !expired.contains(rev);
        let blocked = self
            .unreadable
            .iter()
            .any(|rev| remains(rev) && *rev != revision);
        let named = (!blocked).then(|| {
            self.read
                .iter()
                .filter(|(rev, _)| remains(rev) && *rev != revision)
                .filter_map(|(_, m)| m.as_ref())
                .chain([manifest])
                .flat_map(Manifest::names)
                .collect()
        });
        (expired, named)
    }
}

/// A stored revision, opened.
pub enum Revision {
    /// A whole archive (revisions sealed before chunks).
    Whole(Vec<u8>),
    /// A manifest of chunks.
    Chunked(Manifest),
}

impl Revision {
    /// Opens a sealed revision of `home`.
    pub fn open(home: &HomeId, revision: i64, sealed: &[u8]) -> Result<Self, StoreError> {
        let binding = Binding::revision(&home.storage_id, revision);
        let plain = seal::open(&home.data_key, &binding, sealed)
            .map_err(|e| StoreError::Rejected(e.to_string()))?;
        if seal::version(sealed) == Some(1) {
            return Ok(Self::Whole(plain));
        }
        Manifest::decode(&plain).map(Self::Chunked)
    }

    /// Its manifest, if it has one.
    pub fn manifest(self) -> Option<Manifest> {
        match self {
            Self::Whole(_) => None,
            Self::Chunked(manifest) => Some(manifest),
        }
    }
}

/// Opens a sealed chunk of `home`.
pub fn open_chunk(home: &HomeId, name: &str, sealed: &[u8]) -> Result<Vec<u8>, StoreError> {
    seal::open(
        &home.data_key,
        &Binding::chunk(&home.storage_id, name),
        sealed,
    )
    .map_err(|e| StoreError::Rejected(e.to_string()))
}

/// Names chunks for one home.
pub struct Namer {
    key: [u8; 32],
}

impl Namer {
    /// The namer of the home with this data key.
    pub fn new(data_key: &[u8; 32]) -> Self {
        Self {
            key: blake3::derive_key(NAME_KEY_CONTEXT, data_key),
        }
    }

    /// The name of a stamped piece.
    pub fn stamped(&self, stamp: &str) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"stamp\0");
        h.update(stamp.as_bytes());
        h.finalize().to_hex().to_string()
    }

    /// The name of unstamped bytes.
    pub fn content(&self, bytes: &[u8]) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(b"bytes\0");
        h.update(bytes);
        h.finalize().to_hex().to_string()
    }
}

/// A chunk the workspace brought: where its bytes are, and its name.
#[derive(Clone, Debug)]
pub struct BroughtChunk {
    /// Index into [`Plan::bytes`].
    pub piece: usize,
    /// Its range there.
    pub range: Range<usize>,
    /// Its name.
    pub name: String,
}

/// What saving a workspace takes: the manifest, and the chunks not stored yet.
#[derive(Debug)]
pub struct Plan {
    /// The new revision's manifest.
    pub manifest: Manifest,
    /// The bytes the workspace brought.
    pub bytes: Vec<Vec<u8>>,
    /// Every chunk the workspace brought bytes for.
    pub brought: Vec<BroughtChunk>,
    /// The chunks to store: those brought that no stored revision holds (each once).
    pub new: Vec<BroughtChunk>,
}

impl Plan {
    /// The plaintext of a chunk the workspace brought.
    pub fn chunk(&self, chunk: &BroughtChunk) -> &[u8] {
        &self.bytes[chunk.piece][chunk.range.clone()]
    }

    /// Sealed bytes a save of this plan stores: its new chunks and its manifest
    /// (`manifest_len` plaintext bytes).
    pub fn sealed_bytes(&self, storage_id: &str, revision: i64, manifest_len: usize) -> u64 {
        let chunks: u64 = self
            .new
            .iter()
            .map(|c| seal::sealed_len(&Binding::chunk(storage_id, &c.name), c.range.len()))
            .sum();
        chunks + seal::sealed_len(&Binding::revision(storage_id, revision), manifest_len)
    }

    /// The whole archive, with chunks the workspace did not bring read through `stored`.
    pub fn archive(
        &self,
        mut stored: impl FnMut(&str) -> Result<Vec<u8>, StoreError>,
    ) -> Result<Vec<u8>, StoreError> {
        let brought: HashMap<&str, &[u8]> = self
            .brought
            .iter()
            .map(|c| (c.name.as_str(), self.chunk(c)))
            .collect();
        let mut archive = Vec::with_capacity(self.manifest.archive_bytes() as usize);
        for chunk in &self.manifest.chunks {
            match brought.get(chunk.name.as_str()) {
                Some(bytes) => archive.extend_from_slice(bytes),
                None => archive.extend_from_slice(&stored(&chunk.name)?),
            }
        }
        archive.extend_from_slice(&ARCHIVE_END);
        Ok(archive)
    }
}

/// Plans saving `workspace` for the home with `data_key`, which holds the revisions with
/// manifests `kept`: cuts unstamped bytes into chunks, names every chunk, checks every chunk
/// it brought against the restore rules and the totals against the limits, and stores only
/// chunks no kept revision holds. A [`Piece::Same`] no kept revision holds is stale.
pub fn plan(
    data_key: &[u8; 32],
    workspace: Workspace,
    kept: &Kept,
    limits: Limits,
) -> Result<Plan, StoreError> {
    let namer = Namer::new(data_key);
    let held: HashMap<&str, &ChunkRef> = kept
        .manifests()
        .flat_map(|m| m.chunks.iter().map(|c| (c.name.as_str(), c)))
        .collect();
    let mut plan = Plan {
        manifest: Manifest {
            format: FORMAT.into(),
            chunks: Vec::new(),
        },
        bytes: Vec::new(),
        brought: Vec::new(),
        new: Vec::new(),
    };
    let mut planned = HashSet::new();
    for piece in workspace.pieces {
        let (bytes, stamp) = match piece {
            Piece::Same { stamp } => {
                let name = namer.stamped(&stamp);
                let chunk = held.get(name.as_str()).ok_or_else(|| {
                    StoreError::Stale("the previous revision does not hold a named piece".into())
                })?;
                plan.manifest.chunks.push((*chunk).clone());
                continue;
            }
            Piece::Bytes { bytes, stamp } => (bytes, stamp),
        };
        let index = plan.bytes.len();
        let ranges = match &stamp {
            Some(_) => std::iter::once(0..bytes.len()).collect(),
            None => archive::cut(&bytes),
        };
        for range in ranges {
            let chunk = &bytes[range.clone()];
            let name = match &stamp {
                Some(stamp) => namer.stamped(stamp),
                None => namer.content(chunk),
            };
            let Counts {
                entries,
                file_bytes,
            } = archive::check(chunk, limits).map_err(refused)?;
            plan.manifest.chunks.push(ChunkRef {
                name: name.clone(),
                len: chunk.len() as u64,
                entries,
                file_bytes,
            });
            let chunk = BroughtChunk {
                piece: index,
                range,
                name,
            };
            if !held.contains_key(chunk.name.as_str()) && planned.insert(chunk.name.clone()) {
                plan.new.push(chunk.clone());
            }
            plan.brought.push(chunk);
        }
        plan.bytes.push(bytes);
    }
    let entries: u64 = plan.manifest.chunks.iter().map(|c| c.entries).sum();
    let file_bytes: u64 = plan.manifest.chunks.iter().map(|c| c.file_bytes).sum();
    if entries > limits.max_entries as u64 {
        return Err(StoreError::Rejected(format!(
            "archive refused: more than {} entries",
            limits.max_entries
        )));
    }
    if file_bytes > limits.max_total_bytes {
        return Err(StoreError::Rejected(format!(
            "archive refused: more than {} bytes in total",
            limits.max_total_bytes
        )));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(name: &str) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            chunks: vec![ChunkRef {
                name: name.into(),
                len: 1,
                entries: 1,
                file_bytes: 1,
            }],
        }
    }

    /// Keeping one revision, a save keeps the one before it too (the database still names
    /// that one until it records the new one), and the save after forgets it.
    #[test]
    fn retention_never_forgets_the_revision_a_save_follows() {
        let mut kept = Kept::default();
        kept.add(1, Ok(Revision::Chunked(manifest("a"))));
        kept.add(2, Ok(Revision::Chunked(manifest("b"))));
        let new = manifest("c");
        let (expired, named) = kept.retention(1, 3, &new);
        assert_eq!(expired, vec![1]);
        let named = named.unwrap();
        assert!(named.contains("b") && named.contains("c") && !named.contains("a"));
        // A manifest a crash left past the recorded revision is overwritten by the next save
        // of that number: the one before it still stays.
        let (expired, _) = kept.retention(1, 2, &new);
        assert_eq!(expired, Vec::<i64>::new());
        let (expired, _) = kept.retention(2, 3, &new);
        assert_eq!(expired, vec![1]);
    }
}
