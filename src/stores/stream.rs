//! Streamed saves: a workspace archive as a machine sends it (one tar stream) read once, in
//! bounded buffers, into a chunked revision. As the bytes arrive they are hashed (the archive's
//! SHA-256 fingerprint), checked against every restore rule (or unpacked as the store's latest
//! copy) on a second thread, and cut into chunks by the same rule as a packed tree; a chunk no
//! kept revision holds goes to the store as soon as it is cut. A file larger than a chunk is
//! cut inside its data, so no buffer ever grows with the archive.
//!
//! Content addressing makes an unchanged archive free: every chunk it is cut into is held
//! already, nothing is stored, and its fingerprint equals the one the previous revision was
//! saved at.

use std::io::Read;
use std::path::Path;

use bytes::Bytes;
use rakazo_actors::home_store::StoreError;
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::archive::{self, Counts, Cutter, Limits, PIECE_MAX};
use super::chunks::{ChunkRef, FORMAT, Kept, Manifest, Namer};
use super::local::{fail, refused};
use super::seal::{self, Binding};

/// Bytes read from the machine at once.
pub const BLOCK: usize = 256 << 10;
/// Blocks queued between the reader, the cutter and the checker.
const BLOCKS_QUEUED: usize = 8;
/// Most bytes of long-name and extended headers an entry may have: a reader holds them whole
/// (a path is at most 3,072 bytes), so an archive with more is refused as it arrives.
const LEAD_MAX: usize = 1 << 20;

/// A chunk cut from the stream.
pub struct Cut {
    /// Its plaintext.
    pub bytes: Vec<u8>,
    /// The entries whose headers it holds.
    pub counts: Counts,
}

/// Cuts a tar byte stream into chunks as it arrives: before an entry where the [`Cutter`]
/// rule starts a piece, and inside an entry's data whenever a chunk reaches [`PIECE_MAX`].
/// The end blocks and whatever follows them are left out; after a header that does not parse
/// the rest is cut by size only (the restore rules refuse such an archive).
#[derive(Default)]
pub struct StreamCutter {
    rule: Cutter,
    chunk: Vec<u8>,
    counts: Counts,
    /// Long-name and extended headers (with their data) waiting for their entry.
    lead: Vec<u8>,
    /// Where a long name's data starts in `lead`, and its length.
    lead_name: Option<(usize, usize)>,
    long_name: Option<Vec<u8>>,
    /// A header block being read.
    header: Vec<u8>,
    /// Padded data bytes of the current entry still to come.
    data_left: u64,
    /// Those bytes belong to a lead entry.
    data_to_lead: bool,
    ended: bool,
    broken: bool,
}

impl StreamCutter {
    /// Takes the next bytes of the stream, handing every finished chunk to `emit`.
    pub fn push(
        &mut self,
        mut bytes: &[u8],
        emit: &mut dyn FnMut(Cut) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        while !bytes.is_empty() && !self.ended {
            if self.broken {
                return self.append(bytes, emit);
            }
            if self.data_left > 0 {
                let n = (self.data_left.min(bytes.len() as u64)) as usize;
                if self.data_to_lead {
                    self.lead.extend_from_slice(&bytes[..n]);
                } else {
                    self.append(&bytes[..n], emit)?;
                }
                self.data_left -= n as u64;
                bytes = &bytes[n..];
                if self.data_left == 0 && self.data_to_lead {
                    if let Some((start, len)) = self.lead_name.take() {
                        let name = &self.lead[start..start + len];
                        self.long_name =
                            Some(name.split(|b| *b == 0).next().unwrap_or(name).into());
                    }
                    if self.lead.len() > LEAD_MAX {
                        return Err(lead_too_long());
                    }
                }
                continue;
            }
            let n = (512 - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < 512 {
                continue;
            }
            let block = std::mem::take(&mut self.header);
            if block.iter().all(|b| *b == 0) {
                self.ended = true;
                break;
            }
            let header = tar::Header::from_byte_slice(&block);
            let Ok(size) = header.entry_size() else {
                self.lead.extend_from_slice(&block);
                self.break_off(emit)?;
                continue;
            };
            let padded = size.div_ceil(512) * 512;
            let kind = header.entry_type();
            if kind.is_gnu_longname()
                || kind.is_gnu_longlink()
                || kind.is_pax_local_extensions()
                || kind.is_pax_global_extensions()
            {
                self.lead.extend_from_slice(&block);
                if kind.is_gnu_longname() {
                    self.lead_name = Some((self.lead.len(), size.min(LEAD_MAX as u64) as usize));
                }
                if padded > LEAD_MAX as u64 {
                    return Err(lead_too_long());
                }
                self.data_to_lead = true;
                self.data_left = padded;
                continue;
            }
            let name = self
                .long_name
                .take()
                .unwrap_or_else(|| header.path_bytes().into_owned());
            let len = (self.lead.len() + 512) as u64 + padded;
            if self.rule.starts_piece(&String::from_utf8_lossy(&name), len)
                && !self.chunk.is_empty()
            {
                self.emit(emit)?;
            }
            let lead = std::mem::take(&mut self.lead);
            self.counts.entries += 1;
            if matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
                self.counts.file_bytes += size;
            }
            self.append(&lead, emit)?;
            self.append(&block, emit)?;
            self.data_to_lead = false;
            self.data_left = padded;
        }
        Ok(())
    }

    /// The stream ended: hands over the last chunk.
    pub fn finish(
        mut self,
        emit: &mut dyn FnMut(Cut) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let rest = std::mem::take(&mut self.lead);
        self.append(&rest, emit)?;
        let header = std::mem::take(&mut self.header);
        if !self.ended {
            self.append(&header, emit)?;
        }
        if !self.chunk.is_empty() {
            self.emit(emit)?;
        }
        Ok(())
    }

    /// From here on the stream is not read as entries: cut by size only.
    fn break_off(
        &mut self,
        emit: &mut dyn FnMut(Cut) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.broken = true;
        self.data_left = 0;
        let lead = std::mem::take(&mut self.lead);
        self.append(&lead, emit)
    }

    fn append(
        &mut self,
        mut data: &[u8],
        emit: &mut dyn FnMut(Cut) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        while !data.is_empty() {
            let room = PIECE_MAX as usize - self.chunk.len();
            let n = room.min(data.len());
            self.chunk.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.chunk.len() == PIECE_MAX as usize {
                self.emit(emit)?;
            }
        }
        Ok(())
    }

    fn emit(
        &mut self,
        emit: &mut dyn FnMut(Cut) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let bytes = std::mem::take(&mut self.chunk);
        let counts = std::mem::take(&mut self.counts);
        emit(Cut { bytes, counts })
    }
}

/// The refusal of an entry whose long-name and extended headers pass [`LEAD_MAX`].
fn lead_too_long() -> StoreError {
    StoreError::Rejected(format!(
        "archive refused: an entry's extended headers are longer than {LEAD_MAX} bytes"
    ))
}

/// Where a streamed save puts the chunks no kept revision holds.
pub trait ChunkSink {
    /// Stores `plain` as the chunk `name` (sealing it); may return before it is durable.
    fn put(&mut self, name: &str, plain: Vec<u8>) -> Result<(), StoreError>;
    /// Every chunk put is stored and durable.
    fn finish(&mut self) -> Result<(), StoreError>;
}

/// What a streamed archive made.
#[derive(Debug)]
pub struct Streamed {
    /// The revision's manifest.
    pub manifest: Manifest,
    /// The SHA-256 of every byte received (hex).
    pub fingerprint: String,
    /// The chunks stored (names and plaintext lengths), each once.
    pub new: Vec<(String, usize)>,
}

/// What [`feed`] sends: a block, or the read error that ended the archive.
pub type Block = Result<Bytes, StoreError>;

/// The channel [`feed`] sends on and [`save`] reads.
pub fn channel() -> (
    tokio::sync::mpsc::Sender<Block>,
    tokio::sync::mpsc::Receiver<Block>,
) {
    tokio::sync::mpsc::channel(BLOCKS_QUEUED)
}

impl Streamed {
    /// Sealed bytes its save stores: its new chunks and its manifest (`manifest_len`
    /// plaintext bytes).
    pub fn stored_bytes(&self, storage_id: &str, revision: i64, manifest_len: usize) -> u64 {
        let chunks: u64 = self
            .new
            .iter()
            .map(|(name, len)| seal::sealed_len(&Binding::chunk(storage_id, name), *len))
            .sum();
        chunks + seal::sealed_len(&Binding::revision(storage_id, revision), manifest_len)
    }
}

/// Reads `input` to its end in blocks of at most [`BLOCK`] bytes, sending each to `to`; a
/// read error is sent too (the save then fails) and returned.
pub async fn feed(
    input: &mut (dyn AsyncRead + Unpin + Send),
    to: tokio::sync::mpsc::Sender<Block>,
) -> Result<(), StoreError> {
    loop {
        let mut block = bytes::BytesMut::with_capacity(BLOCK);
        while block.len() < BLOCK {
            match input.read_buf(&mut block).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    let e = fail(format!("reading the archive: {e}"));
                    let _ = to.send(Err(e.clone())).await;
                    return Err(e);
                }
            }
        }
        if block.is_empty() {
            return Ok(());
        }
        let last = block.len() < BLOCK;
        if to.send(Ok(block.freeze())).await.is_err() {
            // The save stopped reading (it failed): its error is the one reported.
            return Ok(());
        }
        if last {
            return Ok(());
        }
    }
}

/// The sync side of a channel of blocks, as a reader.
struct Blocks {
    from: std::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for Blocks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.from.recv() {
                Ok(block) => self.current = block,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Where the checked archive goes besides the store.
pub enum Unpack<'a> {
    /// Nowhere: only checked against the restore rules.
    Check,
    /// Unpacked into the new directory `into`, linking files `reuse` holds the same bytes of.
    Into {
        /// The staging directory (must not exist).
        into: &'a Path,
        /// The current copy to link unchanged files from.
        reuse: Option<&'a Path>,
    },
}

/// Saves the archive arriving on `blocks` for the home with `data_key`, which holds `kept`:
/// every byte hashed, checked (or unpacked) by `unpack`'s rules on a second thread, and cut
/// into chunks, those no kept revision holds handed to `sink` as they are cut. Blocking;
/// nothing grows with the archive but the manifest. A refused archive is `Rejected` (the
/// chunks already put are the caller's to take back: `sink` saw them all).
pub fn save(
    data_key: &[u8; 32],
    kept: &Kept,
    limits: Limits,
    mut blocks: tokio::sync::mpsc::Receiver<Block>,
    unpack: Unpack<'_>,
    sink: &mut dyn ChunkSink,
) -> Result<Streamed, StoreError> {
    let namer = Namer::new(data_key);
    let held: std::collections::HashMap<&str, &ChunkRef> = kept
        .manifests()
        .flat_map(|m| m.chunks.iter().map(|c| (c.name.as_str(), c)))
        .collect();
    let mut manifest = Manifest {
        format: FORMAT.into(),
        chunks: Vec::new(),
    };
    let mut new: Vec<(String, usize)> = Vec::new();
    let mut planned = std::collections::HashSet::new();
    let mut sha = sha2::Sha256::new();
    let (to_check, checked) = std::sync::mpsc::sync_channel::<Bytes>(BLOCKS_QUEUED);
    std::thread::scope(|scope| {
        let checker = scope.spawn(move || {
            let input = Blocks {
                from: checked,
                current: Bytes::new(),
            };
            match unpack {
                Unpack::Check => archive::check_stream(input, limits),
                Unpack::Into { into, reuse } => archive::unpack_stream(input, into, limits, reuse),
            }
        });
        let mut cutter = StreamCutter::default();
        let mut emit = |cut: Cut| -> Result<(), StoreError> {
            let name = namer.content(&cut.bytes);
            manifest.chunks.push(ChunkRef {
                name: name.clone(),
                len: cut.bytes.len() as u64,
                entries: cut.counts.entries,
                file_bytes: cut.counts.file_bytes,
            });
            if !held.contains_key(name.as_str()) && planned.insert(name.clone()) {
                new.push((name.clone(), cut.bytes.len()));
                sink.put(&name, cut.bytes)?;
            }
            Ok(())
        };
        let cut = (|| {
            while let Some(block) = blocks.blocking_recv() {
                let block = block?;
                sha.update(&block);
                if to_check.send(block.clone()).is_err() {
                    // The checker stopped early: it refused the archive.
                    return Ok(());
                }
                cutter.push(&block, &mut emit)?;
            }
            std::mem::take(&mut cutter).finish(&mut emit)
        })();
        drop(to_check);
        // The reader stops at once when this side gave up.
        blocks.close();
        let checked = checker
            .join()
            .unwrap_or_else(|_| {
                Err(archive::ArchiveError::Io(std::io::Error::other(
                    "the check panicked",
                )))
            })
            .map_err(refused);
        // A failure here ends the checker's input early: its verdict then says nothing.
        cut?;
        checked.map(drop)
    })?;
    sink.finish()?;
    Ok(Streamed {
        manifest,
        fingerprint: hex::encode(sha.finalize()),
        new,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar of small files in a few folders, one with a long name, and `big` bytes in one file.
    fn archive(big: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, data).unwrap();
        };
        for d in 0..6 {
            for f in 0..40 {
                add(&format!("d{d}/f{f}"), &vec![(d * 40 + f) as u8; 30_000 + f]);
            }
        }
        add(&format!("d1/{}", "n".repeat(150)), b"long");
        let mut data = vec![0u8; big];
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        add("z/big.bin", &data);
        b.into_inner().unwrap()
    }

    /// A long name longer than any path: a reader would hold it whole, so the stream is
    /// refused when its header comes, before its data does.
    #[test]
    fn an_entry_whose_long_name_passes_the_lead_limit_is_refused_at_its_header() {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(8 << 30);
        h.set_cksum();
        let mut cutter = StreamCutter::default();
        let mut emitted = 0;
        let mut emit = |_: Cut| {
            emitted += 1;
            Ok(())
        };
        let refused = cutter.push(h.as_bytes(), &mut emit);
        assert!(
            matches!(&refused, Err(StoreError::Rejected(why)) if why.contains("extended headers")),
            "{refused:?}"
        );
        assert_eq!(emitted, 0);
    }

    fn cuts(bytes: &[u8], step: usize) -> Vec<Cut> {
        let mut out = Vec::new();
        let mut cutter = StreamCutter::default();
        let mut emit = |cut: Cut| {
            out.push(cut);
            Ok(())
        };
        for piece in bytes.chunks(step) {
            cutter.push(piece, &mut emit).unwrap();
        }
        cutter.finish(&mut emit).unwrap();
        out
    }

    #[test]
    fn cuts_join_to_the_archive_and_a_large_file_is_cut_inside() {
        let tar = archive(20 << 20);
        let cut = cuts(&tar, 777);
        let joined: Vec<u8> = cut.iter().flat_map(|c| c.bytes.clone()).collect();
        let end = archive::cut(&tar).last().unwrap().end;
        assert_eq!(joined, tar[..end]);
        assert!(cut.iter().all(|c| c.bytes.len() <= PIECE_MAX as usize));
        assert!(cut.len() >= 4, "{}", cut.len());
        assert_eq!(cut.iter().map(|c| c.counts.entries).sum::<u64>(), 242);
        // Without a file larger than a piece, the cuts are those of an archive in memory.
        let small = archive(1 << 20);
        let streamed: Vec<usize> = cuts(&small, 4096).iter().map(|c| c.bytes.len()).collect();
        let whole: Vec<usize> = archive::cut(&small).iter().map(|r| r.len()).collect();
        assert_eq!(streamed, whole);
    }

    /// Remembers what it was given.
    #[derive(Default)]
    struct Kept2(Vec<String>);

    impl ChunkSink for Kept2 {
        fn put(&mut self, name: &str, _: Vec<u8>) -> Result<(), StoreError> {
            self.0.push(name.to_owned());
            Ok(())
        }
        fn finish(&mut self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    fn save_blocks(blocks: Vec<Block>) -> (Result<Streamed, StoreError>, Vec<String>) {
        let (to, from) = channel();
        let feeding = std::thread::spawn(move || {
            for block in blocks {
                if to.blocking_send(block).is_err() {
                    return;
                }
            }
        });
        let mut sink = Kept2::default();
        let saved = save(
            &[3; 32],
            &Kept::default(),
            Limits::default(),
            from,
            Unpack::Check,
            &mut sink,
        );
        feeding.join().unwrap();
        (saved, sink.0)
    }

    fn blocks(bytes: &[u8]) -> Vec<Block> {
        bytes
            .chunks(BLOCK)
            .map(|b| Ok(Bytes::copy_from_slice(b)))
            .collect()
    }

    #[test]
    fn an_archive_is_fingerprinted_and_every_chunk_named_once() {
        use sha2::Digest as _;
        let tar = archive(9 << 20);
        let (saved, put) = save_blocks(blocks(&tar));
        let saved = saved.unwrap();
        assert_eq!(saved.fingerprint, hex::encode(sha2::Sha256::digest(&tar)));
        assert_eq!(saved.manifest.chunks.len(), put.len());
        assert_eq!(
            saved.manifest.archive_bytes(),
            archive::cut(&tar).last().unwrap().end as u64 + 1024
        );
    }

    #[test]
    fn a_link_refuses_the_archive_and_a_failed_read_fails_the_save() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, "escape", "/etc/passwd").unwrap();
        let linked = b.into_inner().unwrap();
        let (saved, _) = save_blocks(blocks(&linked));
        assert!(matches!(saved, Err(StoreError::Rejected(_))), "{saved:?}");

        let tar = archive(1 << 20);
        let mut cut = blocks(&tar[..tar.len() / 2]);
        cut.push(Err(StoreError::Failed("the machine went away".into())));
        let (saved, _) = save_blocks(cut);
        assert!(
            matches!(&saved, Err(StoreError::Failed(why)) if why.contains("went away")),
            "{saved:?}"
        );
    }
}
