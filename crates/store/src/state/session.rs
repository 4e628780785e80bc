//! `session.json`: the current or last session of an agent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::Timestamp;
use crate::string_enum::string_enum;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Session {
    pub agent: String,
    /// Checked as a path component when read ([`crate::session_id`]).
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    #[serde(rename = "type")]
    pub kind: SessionType,
    pub domain: Option<String>,
    pub branch: Option<String>,
    /// `None` only for a file that never recorded one; reads as "not running".
    pub status: Option<SessionStatus>,
    pub model: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub research_question: Option<String>,
    pub belief_targeted: Option<String>,
    pub disconfirmation_target: Option<String>,
    pub sources_archived: Option<u64>,
    pub sources_expected: Option<u64>,
    pub tokens_used: Option<u64>,
    pub cost_usd: Option<f64>,
    /// Problems met during the session (bad hook arguments, …), as objects.
    pub errors: Vec<Value>,
    pub handoff_notes: Option<String>,
    /// Addition: the PR the session opened.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    /// Addition: why the session ended in error or timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Addition: the process that owns the running session (the session
    /// script, or the daemon's child), and its start time in clock ticks since
    /// boot, so a reused pid is not mistaken for the owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_pid: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_start: Option<u64>,
    /// Addition: the instance id of the spawn that ran it (`rio-047`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Addition: ids of the inbox messages claimed for this session.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
    /// Addition: what the end counts as when `status` alone does not say
    /// it: `usage_limit` for a session the subscription's usage limit
    /// stopped (`status` stays `error`, the seed's word for "did not
    /// complete, its messages went back"; the error counts leave it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<SessionVerdict>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionType {
    #[default]
    Research,
    Extract,
    Evaluate,
    AdHoc,
}
string_enum!(
    SessionType,
    "session type",
    Research = "research",
    Extract = "extract",
    Evaluate = "evaluate",
    AdHoc = "ad-hoc"
);

/// session.json's `status`, a word of its own below the state files: the
/// session machine (crates/decide) answers it for an outcome.
pub use crate::session_status::SessionStatus;

/// What a session's end counts as: seed 001's three outcomes, and a usage
/// limit, which ended the session (`status: "error"`, its messages
/// returned, the session run again when the hold ends) but is not the
/// agent's failure. metrics.json, `status`, the daemon's log line and
/// `wake --wait` decide by this, never by a reason's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionVerdict {
    Completed,
    Timeout,
    Error,
    /// The subscription's usage or rate limit (or an admin's cap) stopped
    /// it: `USAGE_LIMIT`, `USAGE_DISABLED`.
    UsageLimit,
    /// An operator stopped it (`agent-state stop`, `SESSION_STOPPED`).
    Stopped,
}

impl SessionVerdict {
    /// The verdict of a failure the daemon judged by `code`, a catalogue
    /// code: a usage limit or an admin's cap is not the agent's failure.
    pub fn of_failure(
        status: SessionStatus,
        code: Option<crate::catalogue::Code>,
    ) -> SessionVerdict {
        use crate::catalogue::Code;
        match (status, code) {
            (_, Some(Code::UsageLimit | Code::UsageDisabled)) => SessionVerdict::UsageLimit,
            (_, Some(Code::SessionStopped)) => SessionVerdict::Stopped,
            (SessionStatus::Timeout, _) => SessionVerdict::Timeout,
            (SessionStatus::Completed, _) => SessionVerdict::Completed,
            _ => SessionVerdict::Error,
        }
    }

    /// Does it count as a failure of the agent (metrics.json's error and
    /// timeout counts, `status`' FAIL/30D and TIMEOUT/30D, the error rate)?
    pub fn is_failure(self) -> bool {
        matches!(self, SessionVerdict::Timeout | SessionVerdict::Error)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SessionVerdict::Completed => "completed",
            SessionVerdict::Timeout => "timeout",
            SessionVerdict::Error => "error",
            SessionVerdict::UsageLimit => "usage_limit",
            SessionVerdict::Stopped => "stopped",
        }
    }
}

impl Session {
    pub fn is_running(&self) -> bool {
        self.status == Some(SessionStatus::Running)
    }
}
