//! Box's JSON shapes (the vendor the spec calls Box or Boat): the sandbox, the envelope every
//! answer comes in, and the state rules the adapter relies on. The module is `boat` because
//! `box` is a Rust keyword; the provider kind is `box`.

use serde::{Deserialize, Serialize};

/// The header naming a create's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// The header a delete must carry, equal to the sandbox id.
pub const CONFIRM_DELETE_HEADER: &str = "X-Ascii-Confirm-Delete";
/// The query parameter of a protected host URL's token.
pub const HOST_TOKEN_PARAM: &str = "_token";
/// Longest command deadline the API takes.
pub const MAX_COMMAND_SECONDS: u64 = 600;

/// A sandbox.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// `bx_` and 8 characters; opaque, kept across stop and resume.
    pub id: String,
    /// The lifecycle state (see [`State`]).
    pub state: String,
    /// Its base URL.
    #[serde(default)]
    pub url: String,
    /// Its subdomain.
    #[serde(default)]
    pub subdomain: String,
    /// When its TTL runs out and it is archived (RFC 3339), while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_after: Option<String>,
    /// Whether an archived sandbox still has its snapshot (resume needs it).
    #[serde(default)]
    pub snapshot_available: bool,
    /// What went wrong, in `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Creation time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

/// `POST /sandboxes`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    /// The machine type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// Seconds until it is archived unless refreshed.
    pub ttl_seconds: u64,
    /// Do not inject the account's environment (required when a third party holds the key).
    #[serde(default)]
    pub no_env: bool,
    /// A snapshot to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// `POST /sandboxes/{id}/resume`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resume {
    /// A fresh TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// As at create.
    #[serde(default)]
    pub no_env: bool,
}

/// `PATCH /sandboxes/{id}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// The TTL from now.
    pub ttl_seconds: u64,
}

/// `POST /sandboxes/{id}/commands`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Command {
    /// A shell command line.
    pub command: String,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// 1 to [`MAX_COMMAND_SECONDS`].
    pub timeout_seconds: u64,
    /// Start it and answer at once.
    #[serde(default)]
    pub detached: bool,
}

/// Its outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandResult {
    /// Exit status (`null` when killed at the deadline).
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Standard output.
    #[serde(default)]
    pub stdout: String,
    /// Standard error.
    #[serde(default)]
    pub stderr: String,
    /// Whether the deadline killed it.
    #[serde(default)]
    pub timed_out: bool,
}

/// A file's content (`GET` answer and `PUT` body of `/sandboxes/{id}/files`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileContent {
    /// Absolute path, under the user's home or `/tmp`.
    pub path: String,
    /// The content in `encoding`.
    pub content: String,
    /// `utf8` or `base64`.
    pub encoding: String,
}

/// `POST /sandboxes/{id}/host`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPort {
    /// The machine's port.
    pub port: u16,
    /// Public (no token) or protected.
    pub public: bool,
}

/// Its answer: a protected URL carries its token as `?_token=`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostUrl {
    /// The URL.
    pub url: String,
    /// `public` or `protected`.
    pub access: String,
    /// Whether the URL needs its token.
    pub is_protected: bool,
}

/// An asynchronous operation (delete).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// Its id.
    pub id: String,
    /// What it does (`delete`).
    pub kind: String,
    /// `pending`, `done`.
    pub status: String,
}

/// The envelope of every answer: `ok`, then the call's fields or the error's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// Whether the call succeeded.
    pub ok: bool,
    /// The event name of a lifecycle answer (`sandbox.created`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    /// The sandbox, for sandbox calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    /// The operation, for a delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

/// The error envelope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorEnvelope {
    /// Always false.
    pub ok: bool,
    /// The HTTP status.
    pub status: u16,
    /// A stable code (see [`codes`]).
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// The request's id, for support.
    pub request_id: String,
}

/// The error codes the adapter tells apart.
pub mod codes {
    /// 401: no or a wrong key.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 404: no such sandbox (or it was deleted).
    pub const NOT_FOUND: &str = "not_found";
    /// 400: a malformed request.
    pub const INVALID_REQUEST: &str = "invalid_request";
    /// 409: the sandbox's state does not allow the call.
    pub const INVALID_STATE: &str = "invalid_state";
    /// 410: an archived sandbox whose snapshot expired: it can never resume.
    pub const SNAPSHOT_EXPIRED: &str = "snapshot_expired";
    /// 428: a delete without its confirmation header.
    pub const CONFIRMATION_REQUIRED: &str = "confirmation_required";
    /// 403: a file path outside the allowed roots.
    pub const PATH_NOT_ALLOWED: &str = "path_not_allowed";
    /// 404 on a file.
    pub const FILE_NOT_FOUND: &str = "file_not_found";
    /// 502 from a host URL whose port nothing listens on (the emulator's word; Box's own
    /// is not documented).
    pub const PORT_UNREACHABLE: &str = "port_unreachable";
}

/// The states of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Being created.
    Provisioning,
    /// Created, booting.
    Provisioned,
    /// Booted, nothing ran yet.
    Ready,
    /// Running, no recent activity.
    Idle,
    /// Running.
    Running,
    /// Taking its snapshot after a stop or a TTL expiry.
    Archiving,
    /// Stopped with a snapshot; resume reconnects the same id.
    Archived,
    /// Failed.
    Error,
    /// Its creation was cancelled.
    Cancelled,
    /// Deleted.
    Deleted,
    /// A state this client does not know.
    Unknown,
}

impl State {
    /// The state named by `s`.
    pub fn parse(s: &str) -> Self {
        match s {
            "provisioning" => Self::Provisioning,
            "provisioned" => Self::Provisioned,
            "ready" => Self::Ready,
            "idle" => Self::Idle,
            "running" => Self::Running,
            "archiving" => Self::Archiving,
            "archived" => Self::Archived,
            "error" => Self::Error,
            "cancelled" => Self::Cancelled,
            "deleted" => Self::Deleted,
            _ => Self::Unknown,
        }
    }

    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::Provisioned => "provisioned",
            Self::Ready => "ready",
            Self::Idle => "idle",
            Self::Running => "running",
            Self::Archiving => "archiving",
            Self::Archived => "archived",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::Deleted => "deleted",
            Self::Unknown => "unknown",
        }
    }

    /// Commands and files work.
    pub fn usable(self) -> bool {
        matches!(self, Self::Ready | Self::Idle | Self::Running)
    }

    /// On its way somewhere: poll again.
    pub fn in_transition(self) -> bool {
        matches!(
            self,
            Self::Provisioning | Self::Provisioned | Self::Archiving
        )
    }
}

impl Sandbox {
    /// Its state.
    pub fn state(&self) -> State {
        State::parse(&self.state)
    }

    /// Whether the API can never bring it back: deleted, cancelled, archived without its
    /// snapshot. (An `error` is gone only once a resume failed to fix it.)
    pub fn is_gone(&self) -> bool {
        match self.state() {
            State::Deleted | State::Cancelled => true,
            State::Archived => !self.snapshot_available,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_only_running_ones_are_usable() {
        for s in [
            "provisioning",
            "provisioned",
            "ready",
            "idle",
            "running",
            "archiving",
            "archived",
            "error",
            "cancelled",
            "deleted",
        ] {
            let st = State::parse(s);
            assert_eq!(st.as_str(), s);
            assert_eq!(
                st.usable(),
                matches!(s, "ready" | "idle" | "running"),
                "{s}"
            );
        }
        assert_eq!(State::parse("hibernating"), State::Unknown);
    }

    #[test]
    fn gone_means_deleted_cancelled_or_an_expired_snapshot() {
        let sb = |state: &str, snapshot_available: bool| Sandbox {
            state: state.into(),
            snapshot_available,
            ..Default::default()
        };
        assert!(sb("deleted", false).is_gone());
        assert!(sb("cancelled", false).is_gone());
        assert!(sb("archived", false).is_gone());
        assert!(!sb("archived", true).is_gone());
        assert!(
            !sb("error", false).is_gone(),
            "an error is gone only when resume fails"
        );
        assert!(!sb("running", false).is_gone());
    }

    #[test]
    fn the_error_envelope_is_camel_case() {
        let e = ErrorEnvelope {
            ok: false,
            status: 404,
            code: codes::NOT_FOUND.into(),
            message: "no sandbox".into(),
            request_id: "req_1".into(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["requestId"], "req_1");
        assert_eq!(v["ok"], false);
    }
}
