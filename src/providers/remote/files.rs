//! Workspace files of a remote computer through the command path: a helper program on the
//! machine (`workspace_helper.py`) confines every path to the workspace and opens it without
//! following links; bytes travel through the vendor's upload and download calls via a
//! private transfer directory. What comes back is checked here again: listings are parsed
//! with caps, exported archives pass the restore rules of [`crate::stores::archive`] before
//! they are used.

use rakazo_actors::provider::{
    FileEntry, ListingPage, ListingRange, ProviderError, ProviderResult, Skipped, WorkspaceExport,
};
use rakazo_actors::workspace::{Piece, Workspace};

use super::RemoteSandboxes;
use crate::desktop::DesktopError;
use crate::desktop::command::{CommandRunner, SCRIPT_TIMEOUT, install_program};
use crate::desktop::files::MAX_READ_BYTES;
use crate::desktop::shell_quote;
use crate::providers::MAX_LISTING;
use crate::providers::workspace_path::segments;
use crate::stores::archive::{self, Limits, TRANSIENT};

const HELPER: &str = include_str!("workspace_helper.py");

/// How long a whole-workspace export or import may take on the machine.
const ARCHIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Largest listing the helper prints; a larger one comes through a transfer file, since a
/// script's kept output ends at [`OUTPUT_CAP`](crate::desktop::command::OUTPUT_CAP).
const INLINE_LISTING: usize = 512 << 10;

/// The workspace of one remote sandbox.
pub struct RemoteFiles<'a, V: RemoteSandboxes> {
    /// The vendor.
    pub vendor: &'a V,
    /// The sandbox.
    pub session: &'a V::Session,
    /// Absolute workspace path on the machine.
    pub workspace: &'a str,
    /// The runtime's private directory on the machine.
    pub run_dir: &'a str,
    /// Scripts on the machine (the sandbox's runtime runner).
    pub runner: &'a dyn CommandRunner,
    /// Where the helper was installed on this machine, once it was.
    pub helper: &'a tokio::sync::OnceCell<std::path::PathBuf>,
}

impl<V: RemoteSandboxes> RemoteFiles<'_, V> {
    async fn run(
        &self,
        script: String,
        timeout: std::time::Duration,
    ) -> ProviderResult<(String, String, i32)> {
        let out = self
            .runner
            .run(&script, timeout)
            .await
            .map_err(|e| match e {
                DesktopError::Command(m) if m == "machine gone" => ProviderError::MachineGone,
                other => ProviderError::from(other),
            })?;
        if out.timed_out {
            return Err(ProviderError::Failed(
                "a workspace file operation timed out".into(),
            ));
        }
        Ok((out.stdout, out.stderr, out.exit_code))
    }

    /// Runs one helper operation; its exit status becomes the error kind.
    async fn helper(
        &self,
        op: &str,
        args: serde_json::Value,
        timeout: std::time::Duration,
        what: &str,
    ) -> ProviderResult<String> {
        let program = self
            .helper
            .get_or_try_init(|| async {
                install_program(
                    self.runner,
                    std::path::Path::new(self.run_dir),
                    "workspace",
                    HELPER,
                )
                .await
                .map_err(ProviderError::from)
            })
            .await?;
        let script = format!(
            "mkdir -p {ws} && exec python3 -I {p} {ws} {op} {a}",
            ws = shell_quote(self.workspace),
            p = shell_quote(&program.to_string_lossy()),
            a = shell_quote(&args.to_string()),
        );
        let (stdout, stderr, code) = self.run(script, timeout).await?;
        let what: String = what.chars().take(200).collect();
        match code {
            0 => Ok(stdout),
            3 => Err(ProviderError::NotFound(what)),
            4 => Err(ProviderError::PathRejected(format!(
                "{what}: {}",
                stderr.trim()
            ))),
            6 => Err(ProviderError::TooLarge(what)),
            _ => Err(ProviderError::Failed(format!(
                "workspace {op}: {}",
                stderr.trim().chars().take(300).collect::<String>()
            ))),
        }
    }

    fn transfer_path(&self) -> String {
        format!("{}/xfer/{}", self.run_dir, uuid::Uuid::new_v4().simple())
    }

    async fn prepare_transfer(&self) -> ProviderResult<()> {
        let (_, stderr, code) = self
            .run(
                format!(
                    "mkdir -p {d}/xfer && chmod 700 {d} {d}/xfer",
                    d = shell_quote(self.run_dir)
                ),
                SCRIPT_TIMEOUT,
            )
            .await?;
        if code != 0 {
            return Err(ProviderError::Failed(format!(
                "transfer directory: {}",
                stderr.trim()
            )));
        }
        Ok(())
    }

    /// The absolute path on the machine of a workspace directory (for a shell's cwd): the
    /// workspace itself without a look (a link the bot put in its place would only start the
    /// bot's own shell where the bot may `cd` anyway), any other through the helper, which
    /// follows no link.
    pub async fn dir(&self, rel: &str) -> ProviderResult<String> {
        let segs = segments(rel, true)?;
        if segs.is_empty() {
            return Ok(self.workspace.to_string());
        }
        let out = self
            .helper(
                "dir",
                serde_json::json!({"path": segs}),
                SCRIPT_TIMEOUT,
                rel,
            )
            .await?;
        let path = out.trim_end_matches('\n');
        if !path.starts_with(self.workspace) || path.contains('\n') {
            return Err(ProviderError::Failed(
                "the machine answered an unexpected path".into(),
            ));
        }
        Ok(path.to_string())
    }

    /// Lists a workspace directory; links are listed, never followed. A listing larger than
    /// [`INLINE_LISTING`] is written to a transfer file and downloaded.
    pub async fn list(&self, rel: &str) -> ProviderResult<Vec<FileEntry>> {
        let segs = segments(rel, true)?;
        let out = self.listing(rel, serde_json::json!({"path": segs})).await?;
        let entries: Vec<Listed> = serde_json::from_str(&out).map_err(|_| unreadable())?;
        listed(&segs, entries)
    }

    /// A page of a workspace directory by name (`range`), how many entries it holds and where
    /// the next page starts: the machine reads every name and looks only at the page's.
    pub async fn list_first(&self, rel: &str, range: &ListingRange) -> ProviderResult<ListingPage> {
        let segs = segments(rel, true)?;
        let args = serde_json::json!({"path": segs, "first": range.first, "from": range.from});
        #[derive(serde::Deserialize)]
        struct Page {
            entries: Vec<Listed>,
            total: usize,
            next: Option<String>,
        }
        let page: Page =
            serde_json::from_str(&self.listing(rel, args).await?).map_err(|_| unreadable())?;
        let entries = listed(&segs, page.entries)?;
        if !range.holds(&entries, page.next.as_deref(), page.total) {
            return Err(unreadable());
        }
        Ok(ListingPage {
            entries,
            total: page.total,
            next: page.next,
        })
    }

    /// The helper's listing of a directory (`args`: its path and what else the listing
    /// takes), downloaded when it was too large for the script's output.
    async fn listing(&self, rel: &str, mut args: serde_json::Value) -> ProviderResult<String> {
        let dest = self.transfer_path();
        args["dest"] = dest.clone().into();
        args["inline"] = INLINE_LISTING.into();
        let mut out = self.helper("list", args, SCRIPT_TIMEOUT, rel).await?;
        let too_large = || ProviderError::TooLarge(crate::providers::LISTING_TOO_LARGE.into());
        if out.is_empty() {
            let data = self
                .vendor
                .download(self.session, &dest, MAX_LISTING as u64)
                .await;
            self.remove(&dest).await;
            let data = match data {
                Err(ProviderError::TooLarge(_)) => return Err(too_large()),
                other => other?,
            };
            out = String::from_utf8(data).map_err(|_| unreadable())?;
        }
        if out.len() > MAX_LISTING {
            return Err(too_large());
        }
        Ok(out)
    }

    /// Reads a workspace file of at most `max` bytes (and [`MAX_READ_BYTES`]): a larger one
    /// is refused by its size in the machine, unread.
    pub async fn read(&self, rel: &str, max: u64) -> ProviderResult<Vec<u8>> {
        let segs = segments(rel, false)?;
        let max = max.min(MAX_READ_BYTES);
        self.prepare_transfer().await?;
        let dest = self.transfer_path();
        let copied = self
            .helper(
                "read",
                serde_json::json!({"path": segs, "dest": dest, "limit": max}),
                SCRIPT_TIMEOUT,
                rel,
            )
            .await;
        if let Err(e) = copied {
            // The helper refuses before it makes the transfer file.
            return Err(match e {
                ProviderError::TooLarge(_) => ProviderError::file_too_large(rel, max),
                e => e,
            });
        }
        let data = self.vendor.download(self.session, &dest, max).await;
        self.remove(&dest).await;
        match data {
            Err(ProviderError::TooLarge(_)) => Err(ProviderError::file_too_large(rel, max)),
            data => data,
        }
    }

    /// Writes a workspace file, creating parent directories; never through a link.
    pub async fn write(&self, rel: &str, data: &[u8]) -> ProviderResult<()> {
        let segs = segments(rel, false)?;
        self.prepare_transfer().await?;
        let src = self.transfer_path();
        self.vendor
            .upload(self.session, &src, data.to_vec())
            .await?;
        let written = self
            .helper(
                "write",
                serde_json::json!({"path": segs, "src": src}),
                SCRIPT_TIMEOUT,
                rel,
            )
            .await;
        if written.is_err() {
            self.remove(&src).await;
        }
        written.map(drop)
    }

    async fn remove(&self, path: &str) {
        if let Err(e) = self
            .run(format!("rm -f {}", shell_quote(path)), SCRIPT_TIMEOUT)
            .await
        {
            tracing::debug!(error = %e, "remote.files.cleanup_failed");
        }
    }

    /// Packs the workspace on the machine as a tar stream (directories and regular files;
    /// transient browser files left out), brings it here and checks it against the restore
    /// rules. The fingerprint is the archive's digest.
    pub async fn export(&self, since: Option<&str>) -> ProviderResult<WorkspaceExport> {
        use sha2::Digest as _;
        self.prepare_transfer().await?;
        let dest = self.transfer_path();
        let out = self
            .helper(
                "export",
                serde_json::json!({"dest": dest, "transient": TRANSIENT}),
                ARCHIVE_TIMEOUT,
                "workspace",
            )
            .await;
        let limits = Limits::default();
        let data = match &out {
            Ok(_) => {
                self.vendor
                    .download(self.session, &dest, limits.max_archive_bytes())
                    .await
            }
            Err(e) => Err(e.clone()),
        };
        self.remove(&dest).await;
        let skipped: Vec<Skipped> = match &out {
            Ok(text) => serde_json::from_str::<Vec<serde_json::Value>>(text)
                .unwrap_or_default()
                .into_iter()
                .take(1000)
                .map(|v| Skipped {
                    path: v["path"].as_str().unwrap_or("").chars().take(200).collect(),
                    reason: v["reason"]
                        .as_str()
                        .unwrap_or("")
                        .chars()
                        .take(200)
                        .collect(),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        let data = data?;
        archive::check(&data, limits).map_err(|e| {
            ProviderError::Failed(format!(
                "the machine exported an archive the store refuses: {e}"
            ))
        })?;
        let fingerprint = hex::encode(sha2::Sha256::digest(&data));
        if since == Some(fingerprint.as_str()) {
            return Ok(WorkspaceExport::Unchanged);
        }
        let pieces = archive::cut(&data)
            .into_iter()
            .map(|r| Piece::Bytes {
                bytes: data[r].to_vec(),
                stamp: None,
            })
            .collect();
        Ok(WorkspaceExport::Archive {
            workspace: Workspace { pieces },
            fingerprint: Some(fingerprint),
            skipped,
        })
    }

    /// Replaces the whole workspace with `archive` (checked here first).
    pub async fn import(&self, archive_bytes: &[u8]) -> ProviderResult<()> {
        archive::check(archive_bytes, Limits::default())
            .map_err(|e| ProviderError::ArchiveRejected(e.to_string()))?;
        self.prepare_transfer().await?;
        let src = self.transfer_path();
        self.vendor
            .upload(self.session, &src, archive_bytes.to_vec())
            .await?;
        let done = self
            .helper(
                "import",
                serde_json::json!({"src": src}),
                ARCHIVE_TIMEOUT,
                "workspace",
            )
            .await;
        if done.is_err() {
            self.remove(&src).await;
        }
        done.map(drop)
    }
}

/// An entry as the helper lists it.
#[derive(serde::Deserialize)]
struct Listed {
    name: String,
    kind: String,
    size: u64,
}

fn unreadable() -> ProviderError {
    ProviderError::Failed("the machine answered an unreadable listing".into())
}

/// The helper's entries of the folder `segs` as the port gives them: whatever the machine
/// says, a name stays one name below the folder.
fn listed(segs: &[String], entries: Vec<Listed>) -> ProviderResult<Vec<FileEntry>> {
    let base = segs.join("/");
    entries
        .into_iter()
        .map(|e| {
            segments(&e.name, false)
                .ok()
                .filter(|s| s.len() == 1)
                .ok_or_else(|| {
                    ProviderError::Failed("the machine listed an impossible name".into())
                })?;
            let kind = match e.kind.as_str() {
                "file" | "dir" | "link" => e.kind,
                _ => "other".into(),
            };
            Ok(FileEntry {
                path: if base.is_empty() {
                    e.name.clone()
                } else {
                    format!("{base}/{}", e.name)
                },
                name: e.name,
                size: if kind == "file" { e.size } else { 0 },
                kind,
            })
        })
        .collect()
}
