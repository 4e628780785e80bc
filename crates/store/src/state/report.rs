//! `report.json`: the agent's current status, read by pipelines at any moment.
//!
//! Seed fields keep their names and types; additions (`current_session`,
//! `last_session.reason`) are written only when set, and fields other tools
//! added are carried through every rewrite in `extra`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::session::{SessionStatus, SessionType};
use crate::clock::Timestamp;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    pub agent: String,
    pub updated_at: Option<Timestamp>,
    pub status: AgentStatus,
    pub summary: Option<String>,
    pub current_task: Option<String>,
    pub last_session: Option<LastSession>,
    pub blocked_by: Option<String>,
    pub next_priority: Option<String>,
    /// Addition: the id of the session running now, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_session: Option<String>,
    /// Addition: the instance id of the running or last session (`rio-047`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Addition: when the daemon will next wake the agent on its schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_wake_at: Option<Timestamp>,
    /// Addition: set by the daemon while the agent's sessions fail (retrying,
    /// backing off, disabled); cleared by the first success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ReportError>,
    /// Addition: seed 003's lifecycle adapted to a daemon; missing reads as
    /// `sleeping` ([`Report::lifecycle`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Where an agent is in its life (seed 003, adapted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    /// Never completed a session and has no identity.md: its first
    /// session gets the birth prompt.
    Hatching,
    /// A session is running.
    Alive,
    /// Between sessions.
    Sleeping,
    /// Removed from the config: its directory is kept and it comes back if
    /// configured again.
    Expired,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Hatching => "hatching",
            Lifecycle::Alive => "alive",
            Lifecycle::Sleeping => "sleeping",
            Lifecycle::Expired => "expired",
        }
    }

    /// Between sessions: `hatching` until the agent has an identity
    /// (identity.md or prompt.md), however many sessions it completed
    /// without writing one (each gets the birth prompt; past
    /// [`HATCH_LIMIT`] completed sessions `health` and `status` say so).
    pub fn at_rest(dir: &super::AgentDir) -> Lifecycle {
        Lifecycle::at_rest_given(dir, None)
    }

    /// [`Lifecycle::at_rest`] (metrics.json, if the caller read it, is not
    /// needed: kept for the callers that have it).
    pub fn at_rest_given(
        dir: &super::AgentDir,
        _metrics: Option<&super::metrics::Metrics>,
    ) -> Lifecycle {
        if dir.file("identity.md").is_file() || dir.file("prompt.md").is_file() {
            Lifecycle::Sleeping
        } else {
            Lifecycle::Hatching
        }
    }
}

/// Completed sessions after which an agent still without an identity is
/// reported (`health` WARNING, `status`): its birth prompt is not working.
pub const HATCH_LIMIT: u64 = 3;

/// Why an agent is in `error`, and what the daemon does about it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReportError {
    /// The error code (docs/errors.md).
    pub code: String,
    pub message: String,
    /// Failed sessions in a row.
    pub failures: u32,
    /// `retrying`, `backoff`, `disabled` or `held`.
    pub state: ErrorState,
    /// When the next attempt or automatic wake may happen (`None` when disabled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
    pub since: Option<Timestamp>,
}

/// What the daemon does about an agent in `error` (`error.state` in
/// report.json). A word this build does not know (a newer daemon's) is kept
/// as written, so a read-modify-write does not lose it, and decides nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ErrorState {
    /// Woken again after a short delay.
    Retrying,
    /// Automatic wakes held back until `until`.
    Backoff,
    /// No automatic wakes until a reload or a manual wake.
    Disabled,
    /// Held by the economy (usage limit, credential).
    Held,
    /// Any other word, as written (empty when the file had none).
    Unknown(String),
}

impl Default for ErrorState {
    /// What a file without the field reads as (and writes back: `""`).
    fn default() -> Self {
        ErrorState::Unknown(String::new())
    }
}

impl ErrorState {
    pub fn as_str(&self) -> &str {
        match self {
            ErrorState::Retrying => "retrying",
            ErrorState::Backoff => "backoff",
            ErrorState::Disabled => "disabled",
            ErrorState::Held => "held",
            ErrorState::Unknown(s) => s,
        }
    }
}

impl From<String> for ErrorState {
    fn from(s: String) -> Self {
        match s.as_str() {
            "retrying" => ErrorState::Retrying,
            "backoff" => ErrorState::Backoff,
            "disabled" => ErrorState::Disabled,
            "held" => ErrorState::Held,
            _ => ErrorState::Unknown(s),
        }
    }
}

impl From<ErrorState> for String {
    fn from(s: ErrorState) -> Self {
        match s {
            ErrorState::Unknown(s) => s,
            known => known.as_str().to_string(),
        }
    }
}

impl std::fmt::Display for ErrorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    #[default]
    Idle,
    Researching,
    Extracting,
    Evaluating,
    Error,
}

impl AgentStatus {
    /// What the agent is doing during a session of this type. An ad-hoc
    /// session has no status of its own in the seed; it reads as research.
    pub fn for_session(kind: SessionType) -> AgentStatus {
        match kind {
            SessionType::Research | SessionType::AdHoc => AgentStatus::Researching,
            SessionType::Extract => AgentStatus::Extracting,
            SessionType::Evaluate => AgentStatus::Evaluating,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            AgentStatus::Idle => "idle",
            AgentStatus::Researching => "researching",
            AgentStatus::Extracting => "extracting",
            AgentStatus::Evaluating => "evaluating",
            AgentStatus::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LastSession {
    pub id: String,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub outcome: Option<SessionStatus>,
    pub sources_archived: Option<u64>,
    pub branch: Option<String>,
    pub pr_number: Option<u64>,
    /// Addition: why a session ended in error or timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Addition: session.json's `verdict` (`usage_limit`: not a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<crate::state::session::SessionVerdict>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Report {
    /// The lifecycle; a file without the field reads as `sleeping`.
    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle.unwrap_or(Lifecycle::Sleeping)
    }

    pub fn new(agent: &str) -> Report {
        Report {
            agent: agent.to_string(),
            ..Report::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_state_reads_its_words_and_keeps_unknown_ones() {
        let table = [
            ("retrying", ErrorState::Retrying),
            ("backoff", ErrorState::Backoff),
            ("disabled", ErrorState::Disabled),
            ("held", ErrorState::Held),
            ("parked", ErrorState::Unknown("parked".into())),
            ("", ErrorState::Unknown(String::new())),
        ];
        for (word, want) in table {
            let json = serde_json::Value::String(word.into());
            let got: ErrorState = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(got, want, "{word:?}");
            assert_eq!(serde_json::to_value(&got).unwrap(), json, "{word:?} back");
            assert_eq!(got.as_str(), word);
        }
    }

    #[test]
    fn a_report_error_without_a_state_reads_and_writes_as_before() {
        let e: ReportError = serde_json::from_str(r#"{"code":"X"}"#).unwrap();
        assert_eq!(e.state, ErrorState::Unknown(String::new()));
        let back = serde_json::to_value(&e).unwrap();
        assert_eq!(back["state"], "");
        let e: ReportError = serde_json::from_str(r#"{"state":"later"}"#).unwrap();
        assert_eq!(serde_json::to_value(&e).unwrap()["state"], "later");
    }
}
