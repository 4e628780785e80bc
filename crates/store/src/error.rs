//! The crate's error type and the sysexits(3) exit codes it maps to.
//!
//! Every variant names what it is about (a path, an agent, a field) and, where
//! there is one, the command that fixes it, because the reader of these
//! messages is an operator looking at a cron mail or a journal line.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// sysexits(3) codes, as `main` returns them.
pub mod exit {
    pub const OK: u8 = 0;
    /// A check or a waited-for session failed (`doctor`, `wake --wait`).
    pub const FAILED: u8 = 1;
    pub const USAGE: u8 = 64;
    pub const DATAERR: u8 = 65;
    pub const NOINPUT: u8 = 66;
    pub const NOUSER: u8 = 67;
    pub const UNAVAILABLE: u8 = 69;
    pub const SOFTWARE: u8 = 70;
    pub const OSERR: u8 = 71;
    pub const CANTCREAT: u8 = 73;
    pub const IOERR: u8 = 74;
    pub const TEMPFAIL: u8 = 75;
    pub const NOPERM: u8 = 77;
    pub const CONFIG: u8 = 78;
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error while {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "{path} is not a valid state file: {reason}; run `agent-state check --repair` to set it aside and rebuild it from the journal"
    )]
    Corrupt { path: PathBuf, reason: String },

    #[error(
        "{path} {reason}: agent-state never follows a link or opens a special file below the state root; move it aside (`mv {path} {path}.suspect`), then run `agent-state check --repair` to recreate what is missing"
    )]
    Unsafe { path: PathBuf, reason: String },

    #[error(
        "{path} is locked by another process and was not released within {waited_ms} ms; `fuser -v {path}` shows who holds it"
    )]
    LockBusy { path: PathBuf, waited_ms: u64 },

    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("invalid agent name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },

    #[error(
        "agent `{agent}` is not configured in {config}; add an [[agent]] entry with name = \"{agent}\""
    )]
    UnknownAgent { agent: String, config: PathBuf },

    #[error(
        "{agent}: state directory {path} does not exist; run `agent-state bootstrap {agent}` first"
    )]
    NotBootstrapped { agent: String, path: PathBuf },

    #[error(
        "{agent}: session {session} is still running (owner pid {pid}); an agent never runs two sessions at once. Wait for it, or end it with `agent-state session fail {agent} --session {session} --outcome error --reason ...`"
    )]
    SessionBusy {
        agent: String,
        session: String,
        pid: i32,
    },

    #[error(
        "{agent}: session {session} is running and belongs to another process (owner pid {pid}) that is still alive; `session end` or `session fail` without --session ends only a session this script began, so nothing was changed. If $SESSION was lost, pass the id: --session {session}"
    )]
    NotOwner {
        agent: String,
        session: String,
        pid: i32,
    },

    /// The calling user may not do this (exit 77).
    #[error("{0}")]
    NotPermitted(String),

    #[error("{0}")]
    NoSession(String),

    #[error("{0}")]
    NotFound(String),

    #[error("{0}")]
    Usage(String),

    #[error("{0}")]
    Data(String),

    #[error("{0}")]
    Unavailable(String),

    /// Something could not be created (an agent's directory at a reload:
    /// exit 73).
    #[error("{0}")]
    CannotCreate(String),
}

impl Error {
    pub fn io(op: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// Whether this is "no such file or directory".
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// The OS error number behind an I/O error (`ENOSPC`, `EROFS`, `EIO`, ...).
    pub fn errno(&self) -> Option<i32> {
        use nix::libc;
        let Error::Io { source, .. } = self else {
            return None;
        };
        // Some layers (tempfile) wrap the OS error and keep only its kind.
        source.raw_os_error().or(match source.kind() {
            io::ErrorKind::StorageFull => Some(libc::ENOSPC),
            io::ErrorKind::QuotaExceeded => Some(libc::EDQUOT),
            io::ErrorKind::ReadOnlyFilesystem => Some(libc::EROFS),
            _ => None,
        })
    }

    /// The error code (docs/errors.md) this error is recorded under.
    pub fn code(&self) -> crate::catalogue::Code {
        use crate::catalogue::Code;
        match (self, self.errno()) {
            (_, Some(libc_enospc)) if libc_enospc == nix::libc::ENOSPC => Code::DiskFull,
            (_, Some(e)) if e == nix::libc::EDQUOT => Code::DiskFull,
            (_, Some(e)) if e == nix::libc::EROFS => Code::FsReadonly,
            (Error::Io { .. }, _) => Code::IoError,
            (Error::Corrupt { .. }, _) => Code::StateCorrupt,
            (Error::Unsafe { .. }, _) => Code::PathUnsafe,
            (Error::LockBusy { .. }, _) => Code::LockBusy,
            (Error::Config(_), _) => Code::ConfigInvalid,
            _ => Code::IoError,
        }
    }

    /// The sysexits code `main` exits with for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::PermissionDenied => exit::NOPERM,
                io::ErrorKind::NotFound => exit::NOINPUT,
                io::ErrorKind::AlreadyExists => exit::CANTCREAT,
                _ => exit::IOERR,
            },
            Error::Corrupt { .. } | Error::Data(_) => exit::DATAERR,
            Error::Config(_) => exit::CONFIG,
            Error::InvalidName { .. } | Error::Usage(_) => exit::USAGE,
            Error::UnknownAgent { .. } => exit::NOUSER,
            Error::NotBootstrapped { .. } | Error::NotFound(_) | Error::NoSession(_) => {
                exit::NOINPUT
            }
            Error::SessionBusy { .. } | Error::LockBusy { .. } => exit::TEMPFAIL,
            Error::Unsafe { .. } => exit::IOERR,
            Error::NotOwner { .. } | Error::NotPermitted(_) => exit::NOPERM,
            Error::Unavailable(_) => exit::UNAVAILABLE,
            Error::CannotCreate(_) => exit::CANTCREAT,
        }
    }
}

/// Attach the operation and path to an `io::Result`, so no I/O error reaches
/// the user without saying which file it was about.
pub trait IoContext<T> {
    fn at(self, op: &'static str, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, op: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(op, path, e))
    }
}

// ---- config errors --------------------------------------------------------------

/// What is wrong with a config file (re-exported as `config::ConfigError`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}; pass --config PATH or set AGENT_STATE_CONFIG")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("config {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config {path} has {} problem{}:\n{}", problems.len(), if problems.len() == 1 { "" } else { "s" }, list(problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
    #[error("the daemon refused config {path}; the old config stays in force:\n{}", reasons.iter().map(|r| format!("  - {r}")).collect::<Vec<_>>().join("\n"))]
    Refused { path: PathBuf, reasons: Vec<String> },
}

impl ConfigError {
    /// One line for a warning: the first problem, and how many more.
    pub fn brief(&self) -> String {
        match self {
            ConfigError::Read { source, .. } => source.to_string(),
            ConfigError::Syntax { message, .. } => {
                format!(
                    "not valid TOML: {}",
                    message.lines().next().unwrap_or_default()
                )
            }
            ConfigError::Invalid { problems, .. } => match problems.as_slice() {
                [one] => one.to_string(),
                [first, rest @ ..] => format!("{first}; and {} more", rest.len()),
                [] => "invalid".into(),
            },
            ConfigError::Refused { reasons, .. } => reasons.join("; "),
        }
    }
}

/// One bad field: where it is and what is wrong with it (re-exported as
/// `config::Problem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}
