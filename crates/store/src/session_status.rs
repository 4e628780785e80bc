//! session.json's `status` (the seed's enum: running, completed, timeout,
//! error), a base value of its own: `state::session` keeps it in the file,
//! and the pure decisions (crates/decide, which name no state file) answer
//! it for a session's outcome. `state::session` re-exports it.

use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;

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
