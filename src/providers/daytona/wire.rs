//! Daytona's JSON shapes as the API and the toolbox speak them (the subset this adapter and
//! the daytona-emulator use), and the state rules the adapter relies on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The label the official SDK sets on every sandbox it creates (and reads back on `get`).
pub const LANGUAGE_LABEL: &str = "code-toolbox-language";

/// A sandbox as `GET /sandbox/{id}` and every lifecycle call answer it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// The sandbox id.
    pub id: String,
    /// Owning organization.
    #[serde(default)]
    pub organization_id: String,
    /// Its name (the id unless one was given).
    #[serde(default)]
    pub name: String,
    /// The snapshot it started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The OS user commands run as.
    #[serde(default)]
    pub user: String,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Whether previews are public.
    #[serde(default)]
    pub public: bool,
    /// Whether all network access is blocked.
    #[serde(default)]
    pub network_block_all: bool,
    /// Whether KVM is exposed.
    #[serde(default)]
    pub kvm: bool,
    /// The region.
    #[serde(default)]
    pub target: String,
    /// CPUs.
    #[serde(default)]
    pub cpu: i64,
    /// GPUs.
    #[serde(default)]
    pub gpu: i64,
    /// Memory in GiB.
    #[serde(default)]
    pub memory: i64,
    /// Disk in GiB.
    #[serde(default)]
    pub disk: i64,
    /// The lifecycle state (see [`State`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The state the platform is driving towards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_state: Option<String>,
    /// Why the sandbox is in `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// Whether `recover` can bring an errored sandbox back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recoverable: Option<bool>,
    /// Minutes of inactivity before the platform stops it (0 = never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_stop_interval: Option<i64>,
    /// Minutes stopped before it is archived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_archive_interval: Option<i64>,
    /// Minutes stopped before it is deleted (negative = never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete_interval: Option<i64>,
    /// Creation time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Last update (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// The toolbox daemon's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_version: Option<String>,
    /// Where the toolbox of this sandbox is reached: `{toolboxProxyUrl}/{id}/...`.
    #[serde(default)]
    pub toolbox_proxy_url: String,
}

/// `POST /sandbox`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    /// A name (unique per organization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The snapshot to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The OS user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Public previews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    /// Minutes of inactivity before an automatic stop (0 = never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_stop_interval: Option<i64>,
    /// Minutes stopped before an automatic archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_archive_interval: Option<i64>,
    /// Minutes stopped before an automatic delete (negative = never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete_interval: Option<i64>,
}

/// `GET /sandbox` (a page).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPage {
    /// The sandboxes of this page.
    pub items: Vec<Sandbox>,
    /// The next page's cursor, `null` on the last.
    pub next_cursor: Option<String>,
}

/// `GET /sandbox/{id}/ports/{port}/preview-url`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviewUrl {
    /// The sandbox.
    pub sandbox_id: String,
    /// The port's URL.
    pub url: String,
    /// The token clients send as [`PREVIEW_TOKEN_HEADER`].
    pub token: String,
}

/// The header carrying a preview token.
pub const PREVIEW_TOKEN_HEADER: &str = "x-daytona-preview-token";

/// Daytona's error body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// The HTTP status.
    pub status_code: u16,
    /// What went wrong.
    pub message: String,
    /// The status's name (`Not Found`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A stable code (`FILE_NOT_FOUND`, `PROCESS_EXECUTION_TIMEOUT`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Who answered: [`SOURCE_API`] or [`SOURCE_DAEMON`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// `source` of an error of the API.
pub const SOURCE_API: &str = "DAYTONA_API";
/// `source` of an error of a sandbox's toolbox daemon.
pub const SOURCE_DAEMON: &str = "DAYTONA_DAEMON";

/// `POST /process/execute` on the toolbox.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecuteRequest {
    /// The command line.
    pub command: String,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
    /// Seconds before the daemon kills the command and answers 408.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// Its answer: `result` is stdout and stderr together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteResponse {
    /// Exit status.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Output.
    #[serde(default)]
    pub result: String,
}

/// A file as `GET /files` lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    /// Name within its directory.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Size in bytes.
    pub size: u64,
    /// The mode, as `ls` shows it.
    pub mode: String,
    /// Octal permissions (`0644`).
    pub permissions: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// Modification time (Go's layout).
    pub mod_time: String,
    /// Modification time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<String>,
    /// Full path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `POST /files/bulk-download`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BulkDownload {
    /// The paths wanted.
    pub paths: Vec<String>,
}

/// The states of a sandbox, as the API names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Being created.
    Creating,
    /// Starting.
    Starting,
    /// Running: the toolbox answers.
    Started,
    /// Stopping.
    Stopping,
    /// Stopped: its disk is kept on its runner.
    Stopped,
    /// Being archived.
    Archiving,
    /// Archived: its disk is in object storage; `start` restores it.
    Archived,
    /// Being destroyed.
    Destroying,
    /// Destroyed.
    Destroyed,
    /// Failed (see `errorReason` and `recoverable`).
    Error,
    /// Its snapshot failed to build.
    BuildFailed,
    /// Waiting for its snapshot to build.
    PendingBuild,
    /// Building its snapshot.
    BuildingSnapshot,
    /// Restoring from an archive.
    Restoring,
    /// Pulling its snapshot.
    PullingSnapshot,
    /// Pausing.
    Pausing,
    /// Paused (memory kept).
    Paused,
    /// Resuming from a pause.
    Resuming,
    /// A state this client does not know.
    Unknown,
}

impl State {
    /// The state named by `s`.
    pub fn parse(s: &str) -> Self {
        match s {
            "creating" => Self::Creating,
            "starting" => Self::Starting,
            "started" => Self::Started,
            "stopping" => Self::Stopping,
            "stopped" => Self::Stopped,
            "archiving" => Self::Archiving,
            "archived" => Self::Archived,
            "destroying" => Self::Destroying,
            "destroyed" => Self::Destroyed,
            "error" => Self::Error,
            "build_failed" => Self::BuildFailed,
            "pending_build" => Self::PendingBuild,
            "building_snapshot" => Self::BuildingSnapshot,
            "restoring" => Self::Restoring,
            "pulling_snapshot" => Self::PullingSnapshot,
            "pausing" => Self::Pausing,
            "paused" => Self::Paused,
            "resuming" => Self::Resuming,
            _ => Self::Unknown,
        }
    }

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Starting => "starting",
            Self::Started => "started",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Archiving => "archiving",
            Self::Archived => "archived",
            Self::Destroying => "destroying",
            Self::Destroyed => "destroyed",
            Self::Error => "error",
            Self::BuildFailed => "build_failed",
            Self::PendingBuild => "pending_build",
            Self::BuildingSnapshot => "building_snapshot",
            Self::Restoring => "restoring",
            Self::PullingSnapshot => "pulling_snapshot",
            Self::Pausing => "pausing",
            Self::Paused => "paused",
            Self::Resuming => "resuming",
            Self::Unknown => "unknown",
        }
    }

    /// A state on its way somewhere: poll again.
    pub fn in_transition(self) -> bool {
        matches!(
            self,
            Self::Creating
                | Self::Starting
                | Self::Stopping
                | Self::Archiving
                | Self::PendingBuild
                | Self::BuildingSnapshot
                | Self::Restoring
                | Self::PullingSnapshot
                | Self::Pausing
                | Self::Resuming
        )
    }
}

impl Sandbox {
    /// Its state ([`State::Unknown`] when absent or new).
    pub fn state(&self) -> State {
        self.state.as_deref().map_or(State::Unknown, State::parse)
    }

    /// Whether the API cannot bring this sandbox back: destroyed or destroying, a failed
    /// build, or an error that `recover` cannot fix. Such a machine is gone: replace it and
    /// restore the workspace.
    pub fn is_gone(&self) -> bool {
        match self.state() {
            State::Destroyed | State::Destroying | State::BuildFailed => true,
            State::Error => self.recoverable != Some(true),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_state_round_trips_and_unknown_stays_unknown() {
        for s in [
            "creating",
            "starting",
            "started",
            "stopping",
            "stopped",
            "archiving",
            "archived",
            "destroying",
            "destroyed",
            "error",
            "build_failed",
            "pending_build",
            "restoring",
            "pausing",
            "paused",
            "resuming",
        ] {
            assert_eq!(State::parse(s).as_str(), s);
        }
        assert_eq!(State::parse("resizing"), State::Unknown);
    }

    #[test]
    fn only_unrecoverable_states_are_gone() {
        let with = |state: &str, recoverable: Option<bool>| Sandbox {
            state: Some(state.into()),
            recoverable,
            ..Default::default()
        };
        assert!(with("destroyed", None).is_gone());
        assert!(with("build_failed", None).is_gone());
        assert!(with("error", None).is_gone());
        assert!(with("error", Some(false)).is_gone());
        assert!(!with("error", Some(true)).is_gone());
        for kept in ["stopped", "archived", "started", "starting", "paused"] {
            assert!(!with(kept, None).is_gone(), "{kept}");
        }
    }

    #[test]
    fn a_sandbox_parses_from_the_camel_case_wire() {
        let s: Sandbox = serde_json::from_value(serde_json::json!({
            "id": "abc", "organizationId": "o", "name": "abc", "user": "daytona",
            "env": {}, "labels": {"a": "b"}, "public": false, "networkBlockAll": false,
            "kvm": false, "target": "us", "cpu": 1, "gpu": 0, "memory": 1, "disk": 3,
            "state": "started", "toolboxProxyUrl": "http://127.0.0.1:1/toolbox",
            "autoStopInterval": 15, "somethingNew": [1]
        }))
        .unwrap();
        assert_eq!(s.state(), State::Started);
        assert_eq!(s.auto_stop_interval, Some(15));
        assert_eq!(s.toolbox_proxy_url, "http://127.0.0.1:1/toolbox");
    }
}
