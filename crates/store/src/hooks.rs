//! The session hooks — `session begin`, `session end`, `session fail` — as one
//! library shared by the CLI (called from session scripts) and the daemon.
//!
//! Each hook is one critical section under the agent lock and updates every
//! file the seed names: journal first (it is the source of truth), then
//! session.json, report.json, metrics.json, inbox and memory.md.
//!
//! Hooks are idempotent and forgiving: a second `begin` from the same script or
//! with `AGENT_STATE_SESSION_ID` joins the running session; a second `end`
//! is a no-op; a bad optional argument (`--pr unknown`) is recorded in
//! session.json `errors` and reported, but never costs the session record.

use std::str::FromStr;
use std::time::Duration;

use serde_json::json;

use crate::agent_name::{AgentName, title_case};
use crate::clock::{FileClock, Timestamp};
use crate::error::{Error, Result};
use crate::inbox::{self, Claim, Message, MessageType};
use crate::state::AgentDir;
use crate::state::atomic;
use crate::state::bootstrap::AgentKind;
use crate::state::caps::{self, Field};
use crate::state::journal::{Event, SessionEnd, SessionFailed, SessionStart, SessionUpdated};
use crate::state::lock::AgentLock;
use crate::state::memory;
use crate::state::metrics;
use crate::state::report::{AgentStatus, LastSession, Lifecycle, Report};
use crate::state::session::{Session, SessionStatus, SessionType, SessionVerdict};
use crate::state::tasks::{self, NewTask, TaskPriority, TaskType};

/// A hook argument that could not be used, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BadArgument {
    pub flag: &'static str,
    pub value: String,
    pub problem: String,
}

impl std::fmt::Display for BadArgument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}: {}", self.flag, self.value, self.problem)
    }
}

/// Lenient parsing of the text arguments shell scripts pass.
#[derive(Default)]
struct Args {
    bad: Vec<BadArgument>,
}

impl Args {
    fn note(&mut self, flag: &'static str, value: &str, problem: impl Into<String>) {
        self.bad.push(BadArgument {
            flag,
            value: value.to_string(),
            problem: problem.into(),
        });
    }

    /// A count such as `--sources-archived 8` (surrounding whitespace allowed).
    fn count(&mut self, flag: &'static str, value: Option<&str>) -> Option<u64> {
        let raw = value?;
        match raw.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) if raw.trim().parse::<i64>().is_ok() => {
                self.note(flag, raw, "a negative count; the field was left unset");
                None
            }
            Err(_) => {
                self.note(flag, raw, "not a whole number; the field was left unset");
                None
            }
        }
    }

    /// A count of one session's things (`--tokens-used`,
    /// `--sources-archived`) of at most `max`: a larger one is a value no
    /// session produces, refused rather than added into the lifetime sums.
    fn count_at_most(
        &mut self,
        flag: &'static str,
        value: Option<&str>,
        max: u64,
        unit: &str,
    ) -> Option<u64> {
        let n = self.count(flag, value)?;
        if n > max {
            self.note(
                flag,
                value.unwrap_or_default(),
                format!("more than the maximum of {max} {unit} for one session; the field was left unset"),
            );
            return None;
        }
        Some(n)
    }

    /// A PR number: `247`, `#247` or a `…/pull/247` URL.
    fn pr(&mut self, flag: &'static str, value: Option<&str>) -> Option<u64> {
        let raw = value?;
        let t = raw.trim().trim_start_matches('#');
        let t = t
            .rsplit_once("/pull/")
            .map(|(_, n)| n.trim_end_matches('/'))
            .unwrap_or(t);
        match t.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.note(
                    flag,
                    raw,
                    "not a PR number (247, #247 or a …/pull/247 URL); pr_number was left unset",
                );
                None
            }
        }
    }

    fn money(&mut self, flag: &'static str, value: Option<&str>) -> Option<f64> {
        let raw = value?;
        match raw.trim().trim_start_matches('$').parse::<f64>() {
            Ok(n) if n > crate::state::caps::MAX_SESSION_COST_USD => {
                self.note(
                    flag,
                    raw,
                    "more than the maximum of $1000000 for one session; the field was left unset",
                );
                None
            }
            Ok(n) if n.is_finite() && n >= 0.0 => Some(n),
            Ok(n) if n < 0.0 => {
                self.note(flag, raw, "a negative amount; the field was left unset");
                None
            }
            _ => {
                self.note(
                    flag,
                    raw,
                    "not an amount in USD such as 0.42; the field was left unset",
                );
                None
            }
        }
    }

    fn duration(&mut self, flag: &'static str, value: Option<&str>) -> Option<Duration> {
        let raw = value?;
        let t = raw.trim();
        // Bare numbers are seconds, as `timeout 5400` takes them.
        let parsed = t
            .parse::<u64>()
            .map(Duration::from_secs)
            .or_else(|_| humantime::parse_duration(t));
        match parsed {
            Ok(d) if !d.is_zero() && d <= crate::clock::MAX_DURATION => Some(d),
            _ => {
                self.note(
                    flag,
                    raw,
                    "not a duration such as 90m or 5400 of at most 100 years; the configured timeout was used",
                );
                None
            }
        }
    }

    fn parse<T: FromStr<Err: std::fmt::Display>>(
        &mut self,
        flag: &'static str,
        value: Option<&str>,
        fallback: &str,
    ) -> Option<T> {
        let raw = value?;
        match raw.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(e) => {
                self.note(flag, raw, format!("{e}; {fallback}"));
                None
            }
        }
    }

    fn text(value: Option<&str>) -> Option<String> {
        value
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The bad arguments as session.json `errors` entries.
    fn as_errors(&self, now: Timestamp) -> Vec<serde_json::Value> {
        self.bad
            .iter()
            .map(|b| {
                json!({
                    "at": now,
                    "code": "BAD_ARGUMENT",
                    "argument": b.flag,
                    "value": b.value,
                    "message": b.problem,
                })
            })
            .collect()
    }
}

pub use crate::owner::Owner;
use crate::owner::{self, Liveness};

mod begin;
mod facts;
mod finish;
pub mod joint;
mod record;
mod recover;
pub use begin::*;
pub use facts::*;
pub use finish::*;
pub use record::*;
pub use recover::*;

/// What the hooks read of an agent's configuration. The store cannot name
/// the config (the binary parses it, above the store): `agent-state`
/// converts its `AgentConfig` (`impl From<&AgentConfig> for AgentSettings`,
/// in `config::agent`), and every hook takes anything that converts, so its
/// callers pass their `&AgentConfig` as before.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    pub name: AgentName,
    /// A human mailbox has no sessions: every hook refuses it.
    pub kind: AgentKind,
    /// report.json `domain`.
    pub domain: Option<String>,
    /// The session's type when `session begin --type` names none.
    pub session_type: SessionType,
    /// A session's timeout when `session begin --timeout` names none; how
    /// long a session that recorded none may run before its owner counts as
    /// gone when its lock cannot be checked.
    pub timeout: Duration,
    /// How long a message file must be left alone before `session begin`
    /// claims it (a writer may still be at it).
    pub inbox_settle: Duration,
    /// session.json `model` when `session begin --model` names none.
    pub model: String,
}

impl From<&AgentSettings> for AgentSettings {
    fn from(agent: &AgentSettings) -> AgentSettings {
        agent.clone()
    }
}

/// A human mailbox has no sessions.
pub fn refuse_human(agent: impl Into<AgentSettings>) -> Result<()> {
    refuse(&agent.into())
}

fn refuse(agent: &AgentSettings) -> Result<()> {
    if agent.kind == AgentKind::Human {
        return Err(Error::Usage(format!(
            "{} is a human mailbox (kind = \"human\"): it has no sessions, tasks or metrics; send it messages instead",
            agent.name
        )));
    }
    Ok(())
}

/// Is the owner of `session` (recorded as running) still there? From its
/// owner lock, never from its pid (see [`crate::owner`]); a session whose
/// lock cannot be checked is alive until its timeout (its own, or the
/// agent's `fallback` timeout when it recorded none).
pub fn owner_liveness(
    dir: &AgentDir,
    session: &Session,
    fallback: Duration,
    now: Timestamp,
) -> Liveness {
    let timeout = session
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(fallback);
    let probe = owner::probe(dir, &session.session_id);
    owner::judge(&probe, session.started_at, timeout, now)
}

/// The error that refuses a second session while `session` runs.
fn busy(session: &Session) -> Error {
    Error::SessionBusy {
        agent: session.agent.clone(),
        session: session.session_id.clone(),
        pid: session.owner_pid.unwrap_or(0),
    }
}

/// Is `session` recorded as running with an owner that is gone? Why, if so.
pub fn stale(
    dir: &AgentDir,
    session: &Session,
    fallback: Duration,
    now: Timestamp,
) -> Option<String> {
    if !session.is_running() {
        return None;
    }
    match owner_liveness(dir, session, fallback, now) {
        Liveness::Alive => None,
        Liveness::Gone(why) => Some(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_never_go_back() {
        let now = "20260101-100000";
        assert_eq!(next_id_base("", now), (now.to_string(), 1));
        assert_eq!(next_id_base("20260101-090000", now), (now.to_string(), 1));
        // A second session in the same second.
        assert_eq!(next_id_base(now, now), (now.to_string(), 2));
        assert_eq!(next_id_base("20260101-100000-7", now), (now.to_string(), 8));
        // The clock stepped back an hour: continue after the last id.
        assert_eq!(
            next_id_base("20260101-110000", now),
            ("20260101-110000".to_string(), 2)
        );
        assert_eq!(
            next_id_base("20260101-110000-3", now),
            ("20260101-110000".to_string(), 4)
        );
    }

    #[test]
    fn shell_style_arguments() {
        let mut a = Args::default();
        assert_eq!(a.count("--sources-archived", Some("8\n")), Some(8));
        assert_eq!(a.count("--sources-archived", Some("0\n0")), None);
        assert_eq!(a.pr("--pr", Some("#247")), Some(247));
        assert_eq!(
            a.pr("--pr", Some("https://github.com/o/r/pull/12")),
            Some(12)
        );
        assert_eq!(a.pr("--pr", Some("unknown")), None);
        assert_eq!(
            a.duration("--timeout", Some("5400")),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            a.duration("--timeout", Some("90m")),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(a.money("--cost-usd", Some("$0.42")), Some(0.42));
        let flags: Vec<_> = a.bad.iter().map(|b| b.flag).collect();
        assert_eq!(flags, ["--sources-archived", "--pr"]);
    }
}
