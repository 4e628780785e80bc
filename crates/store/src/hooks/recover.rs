//! A session left running by an owner that is gone: recorded as interrupted
//! (its messages returned), or, when its end was journaled before a crash,
//! that end completed from the journal line (`replay_end`), never recorded
//! twice.

use super::finish::{Completion, Ending, finish, finish_with};
use super::*;

/// If `agent`'s session.json says a session is running but its owner is gone,
/// record it as an error ("interrupted") and return its messages to the inbox.
/// Used by `check --repair` (and, later, by the daemon at start-up).
pub fn recover_stale(
    agent: impl Into<AgentSettings>,
    dir: &AgentDir,
    reason: &str,
    now: Timestamp,
) -> Result<Option<FinishResult>> {
    let agent = &agent.into();
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let current: Session = dir.load(&lock, now, &mut notes)?;
    if !current.is_running() {
        // Its start journaled (the commit), a crash before session.json
        // and report.json were renamed in: recorded interrupted as one
        // that was, so the start has its end and its claims go back.
        if let Some(entry) = unrecorded_start(dir, &current.session_id)?
            && let Event::SessionStart(start) = &entry.event
        {
            let session =
                crate::state::rebuild::session_of_start(dir.name.as_str(), entry.ts, start);
            notes.push(format!(
                "session {}: its start was journaled at {} but session.json was not written (a crash); recorded interrupted",
                start.session_id, entry.ts
            ));
            let reason = format!("{reason} (during its start)");
            return interrupted(agent, dir, &lock, session, reason, now, notes).map(Some);
        }
        metrics::catch_up(dir, &lock, now, &mut notes)?;
        // Ended, but report.json may not say so yet (a crash between the
        // two commits): complete it from the journal.
        let report: Report = dir.load(&lock, now, &mut notes)?;
        if report.current_session.as_deref() == Some(current.session_id.as_str())
            && let Some(entry) = journaled_end(dir, &current.session_id)?
        {
            let mut result = replay_end(dir, &lock, current, &entry, &mut notes)?;
            result.notes = notes;
            return Ok(Some(result));
        }
        return Ok(None);
    }
    let why = match owner_liveness(dir, &current, agent.timeout, now) {
        Liveness::Alive => return Ok(None),
        Liveness::Gone(why) => why,
    };
    // Its end was journaled before a crash: complete that end, do not
    // record another.
    if let Some(entry) = journaled_end(dir, &current.session_id)? {
        let mut result = replay_end(dir, &lock, current, &entry, &mut notes)?;
        result.notes = notes;
        return Ok(Some(result));
    }
    let reason = format!("{reason} ({why})");
    interrupted(agent, dir, &lock, current, reason, now, notes).map(Some)
}

/// Records `session` as an error for `reason`, its messages returned
/// without an attempt: its owner (the daemon, a script) was killed under
/// it, which is no failure of its messages.
fn interrupted(
    agent: &AgentSettings,
    dir: &AgentDir,
    lock: &crate::state::lock::AgentLock,
    session: Session,
    reason: String,
    now: Timestamp,
    mut notes: Vec<String>,
) -> Result<FinishResult> {
    let mut result = finish(
        agent,
        dir,
        lock,
        session,
        Ending::Failed {
            outcome: SessionStatus::Error,
            reason,
            count_attempts: false,
            code: None,
            verdict: None,
        },
        &mut Args::default(),
        now,
        &mut notes,
    )?;
    result.notes = notes;
    Ok(result)
}

/// The journal entry that ended session `id`, if its end was journaled
/// (searched back to its start).
pub fn journaled_end(dir: &AgentDir, id: &str) -> Result<Option<crate::state::journal::Entry>> {
    let mut found = None;
    crate::state::journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        if e.event.ended_session() == Some(id) {
            found = Some(e);
            return std::ops::ControlFlow::Break(());
        }
        match &e.event {
            Event::SessionStart(s) if s.session_id == id => std::ops::ControlFlow::Break(()),
            _ => std::ops::ControlFlow::Continue(()),
        }
    })?;
    Ok(found)
}

/// The journal's last session event, if it is the start of a session
/// other than `current` (session.json's) with no end after it: a start
/// journaled by a begin that a crash cut before its files were renamed in.
pub fn unrecorded_start(
    dir: &AgentDir,
    current: &str,
) -> Result<Option<crate::state::journal::Entry>> {
    let mut found = None;
    crate::state::journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        if e.event.ended_session().is_some() {
            return std::ops::ControlFlow::Break(());
        }
        match &e.event {
            Event::SessionStart(s) => {
                if s.session_id != current {
                    found = Some(e);
                }
                std::ops::ControlFlow::Break(())
            }
            _ => std::ops::ControlFlow::Continue(()),
        }
    })?;
    Ok(found)
}

/// Complete a journaled end (see [`finish_with`]), at the time it was journaled.
pub(super) fn replay_end(
    dir: &AgentDir,
    lock: &AgentLock,
    session: Session,
    entry: &crate::state::journal::Entry,
    notes: &mut Vec<String>,
) -> Result<FinishResult> {
    let ending = match &entry.event {
        Event::SessionEnd(e) => Ending::Completed(Completion {
            claimed: None,
            sources_archived: e.sources_archived,
            branch: e.branch.clone(),
            pr_number: e.pr_number,
            summary: e.summary.clone(),
            next_priority: e.next_priority.clone(),
            handoff_notes: e.handoff.clone(),
            tokens_used: e.tokens_used,
            cost_usd: e.cost_usd,
        }),
        Event::Timeout(f) => Ending::Failed {
            outcome: SessionStatus::Timeout,
            reason: f.reason.clone(),
            count_attempts: !f.is_stop(),
            code: f.code.clone(),
            verdict: f.verdict,
        },
        Event::Error(f) => Ending::Failed {
            outcome: SessionStatus::Error,
            reason: f.reason.clone(),
            count_attempts: !f.is_stop(),
            code: f.code.clone(),
            verdict: f.verdict,
        },
        _ => {
            return Err(Error::Data(format!(
                "{}: journal entry is not a session end",
                dir.name
            )));
        }
    };
    let mut result = finish_with(
        dir,
        lock,
        session,
        (ending, &Facts::default()),
        Some(&entry.event),
        &mut Args::default(),
        entry.ts,
        notes,
    )?;
    result.replayed = true;
    notes.push(format!(
        "session {}: its end was journaled at {} but not fully recorded (a crash); completed from the journal",
        result.session_id, entry.ts
    ));
    Ok(result)
}
