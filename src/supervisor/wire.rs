//! The supervisor's HTTP/JSON types, shared by its routes and by the docker provider's client.
//!
//! Every route is under `/v1` and needs `Authorization: Bearer <SANDBOX_SUPERVISOR_TOKEN>`.
//! Errors are `{"code": ..., "message": ...}` with a stable [`ErrorCode`].

use rakazo_actors::provider::ExecOutput;
use serde::{Deserialize, Serialize};

/// `POST /v1/computers`: create (replacing a stale container of the same name) and start.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateComputer {
    /// The computer's id (label `rakazo.computerId`).
    pub computer_id: String,
    /// The space (workspace) id (label `rakazo.workspaceId`).
    pub space_id: String,
    /// The bot of a Private Computer (label `rakazo.botId`; names the container).
    pub bot_id: Option<String>,
    /// The home key: `DATA_DIR/homes/<home key>` is mounted at the workspace.
    pub home_key: String,
    /// For a vendor emulator's machine: the name uid 1000 goes by, with its home (the
    /// mounted workspace) at `/home/<account>` instead of `/home/rakazo` (E2B's `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// `POST /v1/pool`: create and start a pooled computer for `owner`, to be claimed later
/// (`POST /v1/computers/{id}/claim` with a [`CreateComputer`]). An owner renews its pool with
/// `POST /v1/pool/{owner}/renew`; unclaimed computers of an owner that stopped renewing are
/// removed.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreatePooled {
    /// The owner (an API process): letters, digits, `-`, `_`, `.`.
    pub owner: String,
}

/// The answer to `POST /v1/pool/{owner}/renew`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRenewal {
    /// The owner's unclaimed pooled computers that are running.
    pub containers: Vec<String>,
}

/// A computer container, as the supervisor reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputerInfo {
    /// Docker's container id: the provider reference.
    pub id: String,
    /// `rakazo-bot-<bot id>`, `rakazo-team-<space id>` or `rakazo-home-<home key>`.
    pub name: String,
    /// Whether the container runs.
    pub running: bool,
    /// The label values.
    pub computer_id: String,
    /// Label `rakazo.workspaceId`.
    pub space_id: String,
    /// Label `rakazo.botId` (empty for Team Computers).
    pub bot_id: String,
    /// Label `rakazo.homeKey`.
    pub home_key: String,
    /// The host directory mounted at the workspace.
    pub home_dir: String,
    /// The host directory mounted at the container's `/tmp/.X11-unix` (its X sockets).
    pub x11_dir: String,
    /// The host port on 127.0.0.1 of the screen gateway, when running with a network.
    pub gateway_port: Option<u16>,
}

/// `POST /v1/computers/{id}/exec`: run a script with `bash -c` as uid 1000.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecBody {
    /// The script.
    pub script: String,
    /// Absolute working directory inside the container.
    pub cwd: String,
    /// The complete environment of the script.
    pub env: Vec<(String, String)>,
    /// Deadline in milliseconds; the script's process group is killed when it passes.
    pub timeout_ms: u64,
    /// A caller-chosen id (32 hex digits) under which `POST .../exec/{run}/kill` stops the
    /// script early: the caller sends it when it gives up waiting (its future was dropped).
    #[serde(default)]
    pub run_id: Option<String>,
}

/// The outcome of an exec.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    /// Exit status (`-1` when the deadline killed it).
    pub exit_code: i32,
    /// Standard output (capped).
    pub stdout: String,
    /// Standard error (capped).
    pub stderr: String,
    /// Whether the deadline stopped it.
    pub timed_out: bool,
}

impl From<ExecOutput> for ExecResult {
    fn from(out: ExecOutput) -> Self {
        Self {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            timed_out: out.timed_out,
        }
    }
}

impl From<ExecResult> for ExecOutput {
    fn from(out: ExecResult) -> Self {
        Self {
            exit_code: out.exit_code,
            stdout: out.stdout,
            stderr: out.stderr,
            timed_out: out.timed_out,
        }
    }
}

/// `POST /v1/computers/{id}/ask`: one line to a long-lived helper the container's exec agent
/// keeps (started as uid 1000 on the first ask, in a session of its own, and started again
/// after it ends).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AskBody {
    /// The helper's key: one helper runs per key.
    pub helper: String,
    /// The helper's command line, used when it is started.
    pub argv: Vec<String>,
    /// The helper's complete environment, used when it is started.
    pub env: Vec<(String, String)>,
    /// The line, without its line end.
    pub line: String,
    /// Deadline in milliseconds; the helper is killed when it passes without an answer.
    pub timeout_ms: u64,
}

/// What came of an ask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum AskAnswer {
    /// The helper's answer line.
    Answered {
        /// The line, without its line end.
        line: String,
    },
    /// No answer: the helper ended, ran late or could not start.
    Failed {
        /// Why.
        reason: String,
    },
    /// The container runs no exec agent (an image without `python3`): no helper is kept.
    NoAgent,
}

/// Stable error codes of the supervisor API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// Missing or wrong token.
    Unauthorized,
    /// The container does not exist or is not a managed computer.
    MachineGone,
    /// The request was malformed.
    InvalidRequest,
    /// The computer image is not on the engine (`rakazo image build`).
    ImageMissing,
    /// The Docker engine refused or failed.
    Engine,
    /// This host gives desktops no control groups (cgroup v2, or not root).
    DesktopGroupsUnavailable,
    /// A desktop's control group could not be used.
    DesktopGroupFailed,
    /// A pooled computer was not claimed: the home it would take holds files.
    HomeInUse,
}

/// An error answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable code.
    pub code: ErrorCode,
    /// Human-readable detail (never contains the token).
    pub message: String,
}

/// `GET /v1/image` and `POST /v1/image` (which waits until the image is built).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageStatus {
    /// The computer image the supervisor creates containers from.
    pub image: String,
    /// Whether it is on the engine.
    pub present: bool,
}

/// `GET /v1/health`: the engine answered; the egress guard's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// `active`, `off`, `not needed: ...` or `inactive: <why>`.
    pub egress_guard: String,
    /// Whether bridged computers are kept off private destinations (or have no network).
    pub egress_active: bool,
    /// `active (cgroup v1)` or `unavailable: <why>`: whether computers' desktops get their
    /// own control groups.
    #[serde(default)]
    pub desktop_groups: String,
    /// Whether they do.
    #[serde(default)]
    pub desktop_groups_active: bool,
}

/// `PUT /v1/computers/{id}/desktops/{desktop}`: create the desktop's control group (the
/// `desktop` name is [`crate::desktop::cgroup::group_name`] of the tag) with these limits,
/// and move the container's processes carrying the tag into it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesktopEnter {
    /// The tag every process of the desktop carries (`RAKAZO_DESKTOP_TAG`).
    pub tag: String,
    /// CPU weight, 1 to 10000 (100 is an equal share).
    pub cpu_weight: u32,
    /// Memory ceiling in MiB; 0 = none.
    pub memory_mb: u64,
    /// The desktop is starting: while another desktop of the container is at work, it is
    /// held off the container's first CPU (`cgroup::hold_for_phase`).
    #[serde(default)]
    pub starting: bool,
}

/// `GET /v1/computers/{id}/desktops/{desktop}`: read from the desktop's group. Also
/// `POST .../freeze`, `POST .../thaw` and `DELETE` (its processes were stopped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DesktopUsage {
    /// CPU time its processes used so far, in nanoseconds.
    pub cpu_ns: u64,
    /// How many of its processes the OOM killer took.
    pub oom_kills: u64,
    /// Whether it is frozen.
    pub frozen: bool,
}
