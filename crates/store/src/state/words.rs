//! The words of a task (`tasks.json`'s `type`, `status`, `priority`), in a
//! leaf module of `state/`: `tasks` and the journal's events both use them,
//! and the journal is below `tasks` (which uses the report, which uses the
//! metrics, which read the journal). `state::tasks` re-exports them.

use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskType {
    #[default]
    Research,
    Extract,
    Evaluate,
    FollowUp,
    Disconfirm,
}
string_enum!(
    TaskType,
    "task type",
    Research = "research",
    Extract = "extract",
    Evaluate = "evaluate",
    FollowUp = "follow-up",
    Disconfirm = "disconfirm"
);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    #[default]
    Pending,
    Active,
    Completed,
    Dropped,
}
string_enum!(
    TaskStatus,
    "task status",
    Pending = "pending",
    Active = "active",
    Completed = "completed",
    Dropped = "dropped"
);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskPriority {
    High,
    #[default]
    Medium,
    Low,
}
string_enum!(
    TaskPriority,
    "task priority",
    High = "high",
    Medium = "medium",
    Low = "low"
);
