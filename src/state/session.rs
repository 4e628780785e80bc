//! `session.json`: the current or last session of an agent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::Timestamp;
use crate::string_enum::string_enum;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Session {
    pub agent: String,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Running,
    Completed,
    Timeout,
    Error,
}
string_enum!(
    SessionStatus,
    "session status",
    Running = "running",
    Completed = "completed",
    Timeout = "timeout",
    Error = "error"
);

impl Session {
    pub fn is_running(&self) -> bool {
        self.status == Some(SessionStatus::Running)
    }
}
