//! What the daemon learns after a session's end and records in its files: usage from Claude Code's result, the output summary (signal block, Context Summary).

use super::*;

/// What the end of a session's output said about it (the Context Summary
/// Block and the signal block, seed 004).
#[derive(Debug, Clone, Default)]
pub struct OutputSummary {
    pub summary: Option<String>,
    /// `Some(None)`: the block says there is no blocker (clears one).
    pub blocked_by: Option<Option<String>>,
    pub next_priority: Option<String>,
    pub handoff_notes: Option<String>,
    pub confidence: Option<u8>,
    pub risk: Option<String>,
    pub signal_block: Option<serde_json::Value>,
}

impl OutputSummary {
    /// Its texts within their documented caps (see `state::caps`).
    pub(super) fn capped(&self) -> OutputSummary {
        OutputSummary {
            summary: caps::cap_opt(Field::Summary, self.summary.clone()),
            blocked_by: self
                .blocked_by
                .clone()
                .map(|b| caps::cap_opt(Field::NextPriority, b)),
            next_priority: caps::cap_opt(Field::NextPriority, self.next_priority.clone()),
            handoff_notes: caps::cap_opt(Field::HandoffNotes, self.handoff_notes.clone()),
            ..self.clone()
        }
    }
}

/// What session `id`'s own journal lines say, read back once to its
/// start: the line that ended it, and whether its last BLOCKED/RESOLVED
/// signal was BLOCKED.
pub(super) fn journaled(dir: &AgentDir, id: &str) -> Result<(Option<Event>, bool)> {
    let (mut end, mut signal) = (None, None);
    crate::state::journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        match &e.event {
            Event::SessionStart(s) if s.session_id == id => {
                return std::ops::ControlFlow::Break(());
            }
            Event::Signal(s)
                if signal.is_none()
                    && s.session_id == id
                    && matches!(s.kind.as_str(), "BLOCKED" | "RESOLVED") =>
            {
                signal = Some(s.kind == "BLOCKED");
            }
            ev if end.is_none() && ev.ended_session() == Some(id) => end = Some(e.event),
            _ => {}
        }
        if end.is_some() && signal.is_some() {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })?;
    Ok((end, signal.unwrap_or(false)))
}
