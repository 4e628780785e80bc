//! How a session's run ended, as values: what the runner reports
//! ([`Ending`], [`SpawnFailure`]), what its output said that decides
//! ([`ClaudeFailure`]), the kernel's OOM killer's evidence
//! ([`OomEvidence`]), and how an ending reads in session.json
//! ([`describe_with`]). The facts the error matrix (`failure`) and the
//! session machine (`machine`) judge; the daemon gathers them (`runner`,
//! `output`, `memory`) and re-exports them under their old paths.

use std::fmt;
use std::time::Duration;

use crate::catalogue::Code;

/// Why a spawn failed, for the caller's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnFailure {
    /// The command (or the interpreter on its `#!` line) does not exist.
    NotFound,
    /// The command is not executable (or a directory on its path is not
    /// searchable).
    PermissionDenied,
    /// Anything else: an empty command, a missing working directory, a log
    /// that cannot be opened; the reason says which.
    Other,
    /// The session's git worktree could not be made (its code says why).
    Workspace(Code),
}

/// How the session's main process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// It exited by itself with this code.
    Exited { code: i32 },
    /// A signal killed it, not sent by the runner.
    Signaled { signal: i32 },
    /// It was still running at the timeout; the runner terminated it, as
    /// ordered (however it then exited).
    TimedOut,
    /// The orders stopped the session (a stop asked, the daemon's shutdown);
    /// the runner terminated it. Also returned, without spawning, when the stop
    /// was already requested before the start.
    Stopped,
    /// It printed nothing for `silent_for` (the stall timeout) and the
    /// orders ended it for that (the stall action `stop`).
    Stalled { silent_for: Duration },
    /// It never ran. `reason` is a sentence for an operator, naming the path.
    SpawnFailed { reason: String, kind: SpawnFailure },
    /// It ran on a worker host that was lost (its lease fenced, lost or not
    /// renewed, the worker stopped or restarted, its output not stored)
    /// before its end could be recorded: `reason` starts "interrupted:"
    /// ("worker lost", "worker restarted", "output not stored"; the
    /// daemon's remote executor).
    Lost { reason: String },
}

impl Ending {
    /// Exited by itself with code 0.
    pub fn is_success(&self) -> bool {
        matches!(self, Ending::Exited { code: 0 })
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Exited { code } => write!(f, "exited with code {code}"),
            Ending::Signaled { signal } => match signal_name(*signal) {
                Some(name) => write!(f, "killed by signal {signal} ({name})"),
                None => write!(f, "killed by signal {signal}"),
            },
            Ending::TimedOut => write!(f, "timed out"),
            Ending::Stopped => write!(f, "stopped by the daemon"),
            Ending::Stalled { silent_for } => write!(
                f,
                "stalled: no output for {}",
                humantime::format_duration(*silent_for)
            ),
            Ending::SpawnFailed { reason, .. } => write!(f, "{reason}"),
            Ending::Lost { reason } => write!(f, "{reason}"),
        }
    }
}

/// The name of Linux's signal `signal` (`SIGKILL` for 9), as nix names it
/// (the daemon's tests compare every number with nix's `Signal`); `None`
/// for a number that is no standard signal (a real-time one, 0).
pub fn signal_name(signal: i32) -> Option<&'static str> {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    let i = usize::try_from(signal).ok()?.checked_sub(1)?;
    NAMES.get(i).copied()
}

/// How `ending` reads in session.json: its status word for a failure
/// (`None` for a success) and the sentence; `timeout` is the session's
/// (`agent-state`'s `daemon::session::describe` passes the agent's).
pub fn describe_with(ending: &Ending, timeout: Duration) -> (Option<&'static str>, String) {
    match ending {
        Ending::Exited { code: 0 } => (None, "completed".into()),
        Ending::Exited { code } => (
            Some("error"),
            format!("the session command exited with status {code}"),
        ),
        Ending::Signaled { signal } => (
            Some("error"),
            format!(
                "the session command was killed by signal {}",
                signal_name(*signal).map_or_else(|| signal.to_string(), str::to_string)
            ),
        ),
        Ending::TimedOut => (
            Some("timeout"),
            format!("timed out after {}", humantime::format_duration(timeout)),
        ),
        Ending::Stopped => (
            Some("timeout"),
            "the daemon stopped: shutdown_grace ran out before the session ended".into(),
        ),
        Ending::Stalled { .. } | Ending::Lost { .. } => (Some("error"), ending.to_string()),
        Ending::SpawnFailed { reason, kind } => (
            Some("error"),
            match kind {
                SpawnFailure::NotFound => format!("{reason}; check `command` in the config"),
                _ => reason.clone(),
            },
        ),
    }
}

/// Why a session that printed an error result failed (Claude Code's JSON
/// result, classified by the daemon's `output`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaudeFailure {
    /// The CLI has no valid credentials: an operator must log in (or fix the
    /// API key). Retrying does not help.
    LoginRequired { message: String },
    /// The API failed. `retryable`: rate limits, overload, server errors and
    /// network trouble, which pass; otherwise a request the API refuses
    /// (prompt too long, forbidden, ...), which retrying repeats.
    Api { message: String, retryable: bool },
    /// Anything else (`error_max_turns`, `error_during_execution`, ...).
    Other { message: String },
}

impl ClaudeFailure {
    /// The message for the error record (cut by the classifier to its
    /// `MESSAGE_LIMIT` characters and an ellipsis).
    pub fn message(&self) -> &str {
        match self {
            ClaudeFailure::LoginRequired { message }
            | ClaudeFailure::Api { message, .. }
            | ClaudeFailure::Other { message } => message,
        }
    }

    /// Whether the same session may succeed if simply run again later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClaudeFailure::Api {
                retryable: true,
                ..
            }
        )
    }
}

/// Phrases of a network failure (compared in lower case): retried for
/// `network_retry_for`, not a number of times.
const NETWORK_PHRASES: &[&str] = &[
    "connection error",
    "connection refused",
    "econnreset",
    "econnrefused",
    "etimedout",
    "socket hang up",
];

/// Whether an API failure's message says the network failed (the seed's
/// "connection refused" row), rather than the API answering.
pub fn is_network_error(message: &str) -> bool {
    let lower = message.to_lowercase();
    NETWORK_PHRASES.iter().any(|p| lower.contains(p))
}

/// How the daemon knows the kernel's OOM killer ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomEvidence {
    /// The session's cgroup's `memory.events` counted this many OOM kills.
    Cgroup { oom_kills: u64 },
    /// SIGKILL the daemon did not send, while the kernel's `oom_kill`
    /// count (`/proc/vmstat`) went from `before` to `after`.
    Kernel { before: u64, after: u64 },
}

impl fmt::Display for OomEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OomEvidence::Cgroup { oom_kills } => write!(
                f,
                "its cgroup's memory.events counts {oom_kills} OOM kill(s)"
            ),
            OomEvidence::Kernel { before, after } => write!(
                f,
                "it was killed by SIGKILL the daemon did not send while the kernel's oom_kill count (/proc/vmstat) rose from {before} to {after}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_read_as_before() {
        let table: &[(Ending, &str, Option<&str>, &str)] = &[
            (
                Ending::Exited { code: 0 },
                "exited with code 0",
                None,
                "completed",
            ),
            (
                Ending::Exited { code: 3 },
                "exited with code 3",
                Some("error"),
                "the session command exited with status 3",
            ),
            (
                Ending::Signaled { signal: 9 },
                "killed by signal 9 (SIGKILL)",
                Some("error"),
                "the session command was killed by signal SIGKILL",
            ),
            (
                Ending::Signaled { signal: 40 },
                "killed by signal 40",
                Some("error"),
                "the session command was killed by signal 40",
            ),
            (
                Ending::TimedOut,
                "timed out",
                Some("timeout"),
                "timed out after 10m",
            ),
            (
                Ending::Stalled {
                    silent_for: Duration::from_secs(90),
                },
                "stalled: no output for 1m 30s",
                Some("error"),
                "stalled: no output for 1m 30s",
            ),
            (
                Ending::SpawnFailed {
                    reason: "cannot run /x: not found".into(),
                    kind: SpawnFailure::NotFound,
                },
                "cannot run /x: not found",
                Some("error"),
                "cannot run /x: not found; check `command` in the config",
            ),
        ];
        for (ending, shown, word, described) in table {
            assert_eq!(ending.to_string(), *shown);
            let (w, d) = describe_with(ending, Duration::from_secs(600));
            assert_eq!((w, d.as_str()), (*word, *described), "{ending:?}");
        }
    }

    #[test]
    fn signal_names_cover_the_standard_signals_only() {
        assert_eq!(signal_name(0), None);
        assert_eq!(signal_name(1), Some("SIGHUP"));
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(31), Some("SIGSYS"));
        assert_eq!(signal_name(32), None);
        assert_eq!(signal_name(-9), None);
    }

    #[test]
    fn network_errors_are_told_by_their_words() {
        assert!(is_network_error("connect ECONNREFUSED 127.0.0.1:443"));
        assert!(is_network_error("Socket hang up"));
        assert!(!is_network_error("Overloaded"));
    }
}
