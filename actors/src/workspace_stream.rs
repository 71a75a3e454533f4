//! Workspaces streamed between a machine and the home store through a bounded pipe: a save
//! reads the machine's archive into the store as it arrives, a restore writes a stored
//! revision into the machine as it is opened; neither side ever holds the whole archive.
//!
//! The pipe's reader ends only as its producer did: when the producer fails, the consumer
//! reads an error instead of an end, so a cut archive is never kept (a save) or taken for a
//! whole one (a restore).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::oneshot;

use crate::error::{DomainError, DomainResult};
use crate::home_store::{HomeId, HomeStore, StoreError, StreamSaved};
use crate::provider::{ProviderRef, SandboxProvider, Skipped};

/// Bytes in flight between the two sides.
const PIPE: usize = 1 << 20;

/// The reading end of the pipe: the producer's outcome decides whether its end is an end.
struct Produced {
    pipe: DuplexStream,
    done: Option<oneshot::Receiver<Result<(), String>>>,
    failed: Option<String>,
}

impl AsyncRead for Produced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.pipe).poll_read(cx, buf))?;
        if buf.filled().len() > before || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if let Some(done) = self.done.as_mut() {
            let outcome = ready!(Pin::new(done).poll(cx));
            self.done = None;
            if let Err(why) = outcome.unwrap_or_else(|_| Err("the transfer stopped".into())) {
                self.failed = Some(why);
            }
        }
        Poll::Ready(match &self.failed {
            Some(why) => Err(std::io::Error::other(why.clone())),
            None => Ok(()),
        })
    }
}

/// A pipe: its writer, its reader, and the sender of the producer's outcome.
fn pipe() -> (DuplexStream, Produced, oneshot::Sender<Result<(), String>>) {
    let (writer, reader) = tokio::io::duplex(PIPE);
    let (done, outcome) = oneshot::channel();
    let reader = Produced {
        pipe: reader,
        done: Some(outcome),
        failed: None,
    };
    (writer, reader, done)
}

/// Streams `machine`'s workspace into `homes` as `revision` of `home` (see
/// [`HomeStore::save_stream`]); unchanged when its fingerprint is `unless`. Answers what the
/// store did and the entries the machine left out.
#[allow(clippy::too_many_arguments)]
pub async fn save(
    provider: &dyn SandboxProvider,
    machine: &ProviderRef,
    homes: &dyn HomeStore,
    home: &HomeId,
    revision: i64,
    unless: Option<&str>,
    replace_latest: bool,
) -> DomainResult<(StreamSaved, Vec<Skipped>)> {
    let (mut writer, mut reader, done) = pipe();
    let export = async move {
        let exported = provider.export_workspace_to(machine, &mut writer).await;
        let _ = writer.shutdown().await;
        drop(writer);
        let _ = done.send(exported.as_ref().map(drop).map_err(|e| e.to_string()));
        exported
    };
    let store = homes.save_stream(home, revision, &mut reader, unless, replace_latest);
    let (exported, saved) = tokio::join!(export, store);
    match (exported, saved) {
        (Ok(skipped), Ok(saved)) => Ok((saved, skipped)),
        // The store refused what it read, or failed on its own: the export then broke off.
        (_, Err(e @ (StoreError::Rejected(_) | StoreError::Stale(_) | StoreError::NotFound))) => {
            Err(e.into())
        }
        (Err(e), _) => Err(e.into()),
        (Ok(_), Err(e)) => Err(e.into()),
    }
}

/// Streams `revision` of `home` from `homes` into `machine`'s workspace, replacing it.
pub async fn restore(
    provider: &dyn SandboxProvider,
    machine: &ProviderRef,
    homes: &dyn HomeStore,
    home: &HomeId,
    revision: i64,
) -> DomainResult<()> {
    let (mut writer, mut reader, done) = pipe();
    let load = async move {
        let loaded = homes.load_to(home, revision, &mut writer).await;
        let _ = writer.shutdown().await;
        drop(writer);
        let _ = done.send(loaded.as_ref().map(drop).map_err(|e| e.to_string()));
        loaded
    };
    let import = provider.import_workspace_from(machine, &mut reader);
    let (loaded, imported) = tokio::join!(load, import);
    loaded.map_err(DomainError::from)?;
    imported?;
    Ok(())
}
