//! Durable files: written whole to a temporary file, flushed to the disk as they grow, fsynced,
//! then renamed into place, so a reader finds the old file or the new one, never a part.

use std::path::Path;

use rakazo_actors::home_store::StoreError;

use super::local::fail;

/// Makes a directory's entries (a rename into it) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

/// Write `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_with(path, |file| file.write_all(bytes))
}

/// Write `path` atomically with what `fill` writes (through a buffer) to a temporary file,
/// flushed to the disk as it grows.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<(), StoreError> {
    write_replacing(path, fill, true)
}

/// Like [`write_atomic_with`], but without waiting for the disk: for many files written
/// together and then made durable at once with [`sync_filesystem`].
pub fn write_unsynced_with(
    path: &Path,
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<(), StoreError> {
    write_replacing(path, fill, false)
}

/// Makes everything written to the filesystem holding `dir` durable (one `syncfs`).
pub fn sync_filesystem(dir: &Path) -> Result<(), StoreError> {
    let dir = std::fs::File::open(dir).map_err(fail)?;
    rustix::fs::syncfs(&dir).map_err(fail)
}

fn write_replacing(
    path: &Path,
    fill: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
    synced: bool,
) -> Result<(), StoreError> {
    use std::io::Write;
    let dir = path.parent().ok_or_else(|| fail("no parent directory"))?;
    std::fs::create_dir_all(dir).map_err(fail)?;
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = (|| {
        let file = std::fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, Writeback::new(file.try_clone()?));
        fill(&mut out)?;
        out.flush()?;
        out.into_inner().map_err(|e| e.into_error())?.finish()?;
        if synced { file.sync_all() } else { Ok(()) }
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    crate::crash_point::crash_point("home.file_written");
    std::fs::rename(&tmp, path).map_err(fail)?;
    if synced { sync_dir(dir) } else { Ok(()) }
}

/// How much a [`Writeback`] lets pile up in the page cache before it flushes.
const WRITEBACK_EVERY: u64 = 32 << 20;

/// A file writer that flushes what it wrote so far to the disk on a second thread every
/// [`WRITEBACK_EVERY`] bytes, so the disk works while the writer goes on and the final fsync
/// has only the tail left (the page cache would otherwise hold it all until then).
struct Writeback {
    file: std::fs::File,
    pending: u64,
    /// The flusher thread and how to ask it for a flush; started on the first ask, so small
    /// files never spawn one.
    flusher: Option<(
        std::sync::mpsc::SyncSender<()>,
        std::thread::JoinHandle<std::io::Result<()>>,
    )>,
}

impl Writeback {
    fn new(file: std::fs::File) -> Self {
        Self {
            file,
            pending: 0,
            flusher: None,
        }
    }

    fn ask_flush(&mut self) -> std::io::Result<()> {
        if self.flusher.is_none() {
            let disk = self.file.try_clone()?;
            let (asks, flushes) = std::sync::mpsc::sync_channel::<()>(1);
            let thread = std::thread::spawn(move || {
                for () in flushes {
                    disk.sync_data()?;
                }
                Ok(())
            });
            self.flusher = Some((asks, thread));
        }
        if let Some((asks, _)) = &self.flusher {
            // A flush still running covers this too: no queue of them.
            let _ = asks.try_send(());
        }
        Ok(())
    }

    /// Stops the flusher, reporting a failed flush.
    fn stop(&mut self) -> std::io::Result<()> {
        let Some((asks, thread)) = self.flusher.take() else {
            return Ok(());
        };
        drop(asks);
        thread
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the flusher panicked")))
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.stop()
    }
}

impl std::io::Write for Writeback {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.pending += n as u64;
        if self.pending >= WRITEBACK_EVERY {
            self.ask_flush()?;
            self.pending = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_past_several_flushes_is_whole_and_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revision");
        let data: Vec<u8> = (0..(WRITEBACK_EVERY * 3 + 12_345))
            .map(|i| (i % 251) as u8)
            .collect();
        write_atomic_with(&path, |out| {
            for chunk in data.chunks(1 << 20) {
                out.write_all(chunk)?;
            }
            Ok(())
        })
        .unwrap();
        assert!(std::fs::read(&path).unwrap() == data);
        // A failing writer leaves neither the file nor its temporary behind.
        let failed = write_atomic_with(&dir.path().join("other"), |out| {
            out.write_all(&data[..1000])?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(failed.is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("revision")]);
    }
}
