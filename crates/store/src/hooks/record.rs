//! What the daemon learns after a session's end and records in its files: usage from Claude Code's result, the output summary (signal block, Context Summary).

use super::*;

/// What a session cost, from Claude Code's JSON result: `cost_usd` and
/// `tokens_used` in session.json (unless the script set them through
/// `session end`), and the token breakdown as `usage`. Only for the session
/// `session_id`; returns whether anything was written.
pub fn record_usage(
    dir: &AgentDir,
    session_id: &str,
    cost_usd: Option<f64>,
    tokens_used: Option<u64>,
    usage: Option<serde_json::Value>,
    now: Timestamp,
) -> Result<bool> {
    // The agent's output is its input: a figure past the bounds a script's
    // `session end` is held to is not recorded.
    let cost_usd = cost_usd
        .filter(|c| c.is_finite() && (0.0..=crate::state::caps::MAX_SESSION_COST_USD).contains(c));
    let tokens_used = tokens_used.filter(|t| *t <= crate::state::caps::MAX_SESSION_TOKENS);
    if cost_usd.is_none() && tokens_used.is_none() && usage.is_none() {
        return Ok(false);
    }
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut session: Session = dir.load(&lock, now, &mut notes)?;
    if session.session_id != session_id {
        return Ok(false);
    }
    let mut changed = false;
    if session.cost_usd.is_none() && cost_usd.is_some() {
        session.cost_usd = cost_usd;
        changed = true;
    }
    if session.tokens_used.is_none() && tokens_used.is_some() {
        session.tokens_used = tokens_used;
        changed = true;
    }
    if let Some(usage) = usage
        && !session.extra.contains_key("usage")
    {
        session.extra.insert("usage".into(), usage);
        changed = true;
    }
    if changed {
        // The journal keeps what each session used (`agent-state usage`,
        // the budgets); session.json shows the last session's.
        let count = |k: &str| {
            session
                .extra
                .get("usage")
                .and_then(|u| u.get(k))
                .and_then(serde_json::Value::as_u64)
        };
        let record = crate::state::journal::SessionUsage {
            session_id: session_id.to_string(),
            input_tokens: count("input_tokens"),
            output_tokens: count("output_tokens"),
            cache_creation_input_tokens: count("cache_creation_input_tokens"),
            cache_read_input_tokens: count("cache_read_input_tokens"),
            tokens_used: session.tokens_used,
            cost_usd: session.cost_usd,
        };
        dir.journal_append(&lock, now, Event::SessionUsage(record))?;
        dir.save(&lock, &session)?;
    }
    Ok(changed)
}

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
    fn capped(&self) -> OutputSummary {
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
fn journaled(dir: &AgentDir, id: &str) -> Result<(Option<Event>, bool)> {
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

/// Fill report.json and session.json from the session's own summary, for
/// the session `session_id` that has ended, except what the session script
/// set itself through `session end` (its values win).
pub fn record_output_summary(
    dir: &AgentDir,
    session_id: &str,
    from_output: &OutputSummary,
    now: Timestamp,
) -> Result<bool> {
    let from_output = &from_output.capped();
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut session: Session = dir.load(&lock, now, &mut notes)?;
    if session.session_id != session_id || session.is_running() {
        return Ok(false);
    }
    let (end, blocked_by_signal) = journaled(dir, session_id)?;
    let by_script = match end {
        Some(Event::SessionEnd(e)) => (
            e.summary.is_some(),
            e.next_priority.is_some(),
            e.handoff.is_some(),
        ),
        _ => (false, false, false),
    };
    let mut report: Report = dir.load(&lock, now, &mut notes)?;
    let mut session_changed = false;
    if let (Some(notes_text), false) = (&from_output.handoff_notes, by_script.2)
        && session.handoff_notes.is_none()
    {
        session.handoff_notes = Some(notes_text.clone());
        session_changed = true;
    }
    if let Some(block) = &from_output.signal_block {
        session.extra.insert("signal_block".into(), block.clone());
        session_changed = true;
    }
    if report.current_session.is_none()
        && report
            .last_session
            .as_ref()
            .is_some_and(|l| l.id == session_id)
    {
        if let (Some(s), false) = (&from_output.summary, by_script.0) {
            report.summary = Some(s.clone());
        }
        if let (Some(p), false) = (&from_output.next_priority, by_script.1) {
            report.next_priority = Some(p.clone());
        }
        // The summary's "Blockers: none" does not clear what the agent
        // said itself: a BLOCKED signal of this session with no RESOLVED
        // after it stands.
        if let Some(b) = &from_output.blocked_by
            && (b.is_some() || !blocked_by_signal)
        {
            report.blocked_by = b.clone();
        }
        if let Some(c) = from_output.confidence {
            report
                .extra
                .insert("confidence".into(), serde_json::json!(c));
        }
        if let Some(r) = &from_output.risk {
            report.extra.insert("risk".into(), serde_json::json!(r));
        }
        report.updated_at = Some(now);
    }
    if session_changed {
        dir.save(&lock, &session)?;
    }
    dir.save(&lock, &report)?;
    Ok(true)
}
