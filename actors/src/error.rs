//! The error codes clients see, in one place, with their stable string form and HTTP status.

use std::fmt;

/// A stable, client-visible error code. The string form (`as_str`) is part of the contract:
/// clients match on it, so a variant is never renamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The request is malformed or a parameter is out of range.
    InvalidParams,
    /// No such method (JSON-RPC `-32601`).
    MethodNotFound,
    /// No valid bearer token was presented.
    Unauthorized,
    /// The caller may not act on this space, bot or computer.
    Forbidden,
    /// The named object does not exist (or is not visible to the caller).
    NotFound,
    /// The bot already has a driver (a live execution lease held by someone else).
    LeaseHeld,
    /// The presented fence is not the current grant of that lease.
    LeaseFenced,
    /// Take control refused while the bot runs; stop the bot first (HTTP 409).
    StopBotFirst,
    /// Another user already controls this bot's screen.
    ControlHeld,
    /// The operation needs the caller to hold control of the bot's screen (take control first).
    ControlRequired,
    /// A computer-wide maintenance reservation excludes this operation.
    ComputerReserved,
    /// The provider cannot allocate another display for this bot.
    MultiScreenUnavailable,
    /// The run is not in a state that allows this transition.
    RunStateConflict,
    /// The machine behind the computer was lost; a replacement is being provisioned.
    MachineGone,
    /// The computer is restarting or unavailable; retry shortly.
    ComputerUnavailable,
    /// No sandbox provider is configured (`SANDBOX_PROVIDER=none`).
    NoProvider,
    /// The provider failed for a reason that is not "machine gone".
    ProviderFailed,
    /// The command ran past its timeout and was stopped.
    CommandTimeout,
    /// A path is outside the computer's workspace or otherwise not allowed.
    PathRejected,
    /// A file or request exceeds a size limit.
    TooLarge,
    /// A workspace archive broke a restore rule or failed verification.
    ArchiveRejected,
    /// The provider does not offer this (for example live screens on the `fake` emulator).
    Unsupported,
    /// A command's stop was not confirmed, so the computer was paused (or its pause asked
    /// for) and is quarantined: nothing resumes it until a recover or reset replaces it.
    ComputerQuarantined,
    /// The same visual action kept leaving the screen unchanged; use page tools or takeover.
    RepeatedNoOp,
    /// A page-browser ref is stale: the page changed since the snapshot (nothing was done).
    StaleRef,
    /// A page-browser action failed; the message says which steps were confirmed.
    PageActionFailed,
    /// A JavaScript dialog of the page blocks it until `browser_dialog` answers it (nothing
    /// was done).
    PageDialogOpen,
    /// Unexpected server-side failure.
    Internal,
}

impl ErrorCode {
    /// The stable string clients match on.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidParams => "INVALID_PARAMS",
            Self::MethodNotFound => "METHOD_NOT_FOUND",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Forbidden => "FORBIDDEN",
            Self::NotFound => "NOT_FOUND",
            Self::LeaseHeld => "LEASE_HELD",
            Self::LeaseFenced => "LEASE_FENCED",
            Self::StopBotFirst => "STOP_BOT_FIRST",
            Self::ControlHeld => "CONTROL_HELD",
            Self::ControlRequired => "CONTROL_REQUIRED",
            Self::ComputerReserved => "COMPUTER_RESERVED",
            Self::MultiScreenUnavailable => "MULTI_SCREEN_UNAVAILABLE",
            Self::RunStateConflict => "RUN_STATE_CONFLICT",
            Self::MachineGone => "MACHINE_GONE",
            Self::ComputerUnavailable => "COMPUTER_UNAVAILABLE",
            Self::NoProvider => "NO_PROVIDER",
            Self::ProviderFailed => "PROVIDER_FAILED",
            Self::CommandTimeout => "COMMAND_TIMEOUT",
            Self::PathRejected => "PATH_REJECTED",
            Self::TooLarge => "TOO_LARGE",
            Self::ArchiveRejected => "ARCHIVE_REJECTED",
            Self::Unsupported => "UNSUPPORTED",
            Self::ComputerQuarantined => "COMPUTER_QUARANTINED",
            Self::RepeatedNoOp => "REPEATED_NO_OP",
            Self::StaleRef => "STALE_REF",
            Self::PageActionFailed => "PAGE_ACTION_FAILED",
            Self::PageDialogOpen => "PAGE_DIALOG_OPEN",
            Self::Internal => "INTERNAL",
        }
    }

    /// The HTTP status a transport uses for this code.
    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidParams | Self::PathRejected | Self::ArchiveRejected => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound | Self::MethodNotFound => 404,
            Self::LeaseHeld
            | Self::LeaseFenced
            | Self::StopBotFirst
            | Self::ControlHeld
            | Self::ControlRequired
            | Self::ComputerReserved
            | Self::RunStateConflict
            | Self::RepeatedNoOp
            | Self::StaleRef
            | Self::PageDialogOpen
            | Self::ComputerQuarantined => 409,
            Self::TooLarge => 413,
            Self::MultiScreenUnavailable
            | Self::NoProvider
            | Self::Unsupported
            | Self::PageActionFailed => 422,
            Self::CommandTimeout => 504,
            Self::MachineGone | Self::ComputerUnavailable | Self::ProviderFailed => 503,
            Self::Internal => 500,
        }
    }

    /// A short human sentence shown when no more specific message is given.
    pub fn default_message(self) -> &'static str {
        match self {
            Self::StopBotFirst => "Stop the bot first",
            Self::MultiScreenUnavailable => "This computer cannot open another screen",
            Self::LeaseFenced => {
                "This fence is not the live grant of its lease (released, expired or granted again)"
            }
            Self::LeaseHeld => "The bot already has a driver",
            Self::ControlHeld => "Someone else controls this screen",
            Self::ControlRequired => "Take control of this screen first",
            Self::ComputerReserved => "The computer is reserved for maintenance",
            Self::MachineGone => "The machine was lost; a replacement is starting",
            Self::ComputerUnavailable => "The computer is restarting; try again",
            Self::ComputerQuarantined => {
                "The computer is quarantined: recover or reset it to replace it from saved work"
            }
            _ => "Request failed",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A domain failure: a stable code plus a human message (never containing secrets).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct DomainError {
    /// The stable code.
    pub code: ErrorCode,
    /// A human explanation; safe to show and to log.
    pub message: String,
}

impl DomainError {
    /// An error with an explicit message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An error with the code's default message.
    pub fn code(code: ErrorCode) -> Self {
        Self::new(code, code.default_message())
    }

    /// "not found" for a kind of object.
    pub fn not_found(what: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("{what} not found"))
    }

    /// "invalid params" with a reason.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message)
    }
}

impl From<sea_orm::DbErr> for DomainError {
    fn from(err: sea_orm::DbErr) -> Self {
        tracing::error!(target: "rakazo::db", event = "db.error", error = %err);
        Self::new(ErrorCode::Internal, "database error")
    }
}

impl From<actix::MailboxError> for DomainError {
    fn from(_: actix::MailboxError) -> Self {
        Self::code(ErrorCode::ComputerUnavailable)
    }
}

/// Result alias for domain operations.
pub type DomainResult<T> = Result<T, DomainError>;
