//! A workspace on its way from a provider to a store: the pieces of one tar archive, some of
//! them named only by the stamp of a piece the previous revision already holds.

/// The two zero blocks that end a tar archive.
pub const ARCHIVE_END: [u8; 1024] = [0; 1024];

/// One part of a workspace archive, in archive order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Archive bytes made of whole entries. A stamped piece is one the provider can name
    /// again without reading it: the same stamp only ever names the same bytes.
    Bytes {
        /// The entries.
        bytes: Vec<u8>,
        /// The provider's stamp for exactly these bytes, if it can vouch for one.
        stamp: Option<String>,
    },
    /// The bytes of the previous revision's piece with this stamp, not read again.
    Same {
        /// The stamp the previous revision's piece was stored with.
        stamp: String,
    },
}

/// A workspace archive as pieces, in archive order; without its end-of-archive blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workspace {
    /// The pieces.
    pub pieces: Vec<Piece>,
}

impl Workspace {
    /// The whole archive, if every piece holds its bytes (none is [`Piece::Same`]).
    pub fn into_archive(self) -> Option<Vec<u8>> {
        let len = self.pieces.iter().try_fold(0, |len, piece| match piece {
            Piece::Bytes { bytes, .. } => Some(len + bytes.len()),
            Piece::Same { .. } => None,
        })?;
        let mut archive = Vec::with_capacity(len + ARCHIVE_END.len());
        for piece in self.pieces {
            if let Piece::Bytes { bytes, .. } = piece {
                if archive.is_empty() {
                    archive = bytes;
                    archive.reserve(len - archive.len() + ARCHIVE_END.len());
                } else {
                    archive.extend_from_slice(&bytes);
                }
            }
        }
        archive.extend_from_slice(&ARCHIVE_END);
        Some(archive)
    }
}

/// A whole tar archive (as a remote machine exports it) is one unstamped piece.
impl From<Vec<u8>> for Workspace {
    fn from(archive: Vec<u8>) -> Self {
        Self {
            pieces: vec![Piece::Bytes {
                bytes: archive,
                stamp: None,
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_is_its_pieces_then_the_end_blocks() {
        let w = Workspace {
            pieces: vec![
                Piece::Bytes {
                    bytes: vec![1; 512],
                    stamp: Some("a".into()),
                },
                Piece::Bytes {
                    bytes: vec![2; 512],
                    stamp: None,
                },
            ],
        };
        let archive = w.into_archive().unwrap();
        assert_eq!(archive.len(), 2048);
        assert_eq!(&archive[512..1024], &[2; 512]);
        let back = Workspace {
            pieces: vec![Piece::Same { stamp: "a".into() }],
        };
        assert_eq!(back.into_archive(), None);
    }
}
