//! What the daemon learned about its own session by its end — the
//! workspace, the iterations, Claude Code's conversation and what its result
//! says the session cost, the Context Summary and signal block at the end of
//! the output — recorded in the same write as the end: the daemon's `end` or
//! `fail` carries them ([`EndRequest::facts`], [`FailRequest::facts`]). When
//! the session's script recorded its end first, [`amend_ended`] adds them,
//! with the daemon's verdict and reason, in one more write. So a reader of
//! session.json never sees a daemon-recorded end without them, and at most
//! one write follows a script's.

use super::*;
use crate::state::journal::{SessionUsage, VerdictAmended};

/// See the module's text. Empty for a script's hooks.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// session.json fields beyond the schema that describe this session
    /// (`workspace`, `iterations`, `claude_session_id`, …; see
    /// [`PER_SESSION_EXTRA`]): set, replacing what was there.
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// What Claude Code's result said the session cost: recorded unless the
    /// script set it through `session end`, and journaled
    /// (`session_usage`, which `agent-state usage` and the budgets add up).
    pub cost_usd: Option<f64>,
    pub tokens_used: Option<u64>,
    /// The token breakdown (session.json `usage`).
    pub usage: Option<serde_json::Value>,
    /// What the end of the output said (the Context Summary Block, the
    /// signal block): into report.json and session.json, except what the
    /// script set itself through `session end` (its values win).
    pub summary: Option<OutputSummary>,
}

/// report.json's note of the iteration running (`{"n", "of", "phase"}`):
/// gone at the end, when session.json's `iterations` says how they went.
pub const REPORT_ITERATION: &str = "iteration";

/// What the script's `session end` said itself, which the output's summary
/// does not replace.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SaidByScript {
    pub(super) summary: bool,
    pub(super) next_priority: bool,
    pub(super) handoff_notes: bool,
}

impl SaidByScript {
    fn of(end: Option<&Event>) -> SaidByScript {
        match end {
            Some(Event::SessionEnd(e)) => SaidByScript {
                summary: e.summary.is_some(),
                next_priority: e.next_priority.is_some(),
                handoff_notes: e.handoff.is_some(),
            },
            _ => SaidByScript::default(),
        }
    }
}

impl Facts {
    pub fn is_empty(&self) -> bool {
        self.extra.is_empty()
            && self.cost_usd.is_none()
            && self.tokens_used.is_none()
            && self.usage.is_none()
            && self.summary.is_none()
    }

    /// Whether the summary's "Blockers: none" needs the journal's word on
    /// the session's own BLOCKED/RESOLVED signals.
    fn needs_signals(&self) -> bool {
        self.summary
            .as_ref()
            .is_some_and(|s| matches!(s.blocked_by, Some(None)))
    }

    /// Into `session` and `report` as they are once the end is recorded
    /// (report.json's `last_session` names the session). Returns the
    /// journal line of the session's usage, if it records one, and whether
    /// session.json changed.
    pub(super) fn apply(
        &self,
        session: &mut Session,
        report: &mut Report,
        said: SaidByScript,
        blocked_by_signal: bool,
        now: Timestamp,
    ) -> (Option<Event>, bool) {
        let mut changed = false;
        for (k, v) in &self.extra {
            if session.extra.get(k) != Some(v) {
                session.extra.insert(k.clone(), v.clone());
                changed = true;
            }
        }
        let usage = self.apply_usage(session);
        changed |= usage.is_some();
        if let Some(summary) = &self.summary {
            changed |= apply_summary(session, report, &summary.capped(), said, blocked_by_signal);
            report.updated_at = Some(now);
        }
        (usage, changed)
    }

    /// The usage part of [`Facts::apply`]: the session's `usage` journal
    /// line when anything was recorded.
    fn apply_usage(&self, session: &mut Session) -> Option<Event> {
        // The agent's output is its input: a figure past the bounds a
        // script's `session end` is held to is not recorded.
        let cost_usd = self.cost_usd.filter(|c| {
            c.is_finite() && (0.0..=crate::state::caps::MAX_SESSION_COST_USD).contains(c)
        });
        let tokens_used = self
            .tokens_used
            .filter(|t| *t <= crate::state::caps::MAX_SESSION_TOKENS);
        let mut changed = false;
        if session.cost_usd.is_none() && cost_usd.is_some() {
            session.cost_usd = cost_usd;
            changed = true;
        }
        if session.tokens_used.is_none() && tokens_used.is_some() {
            session.tokens_used = tokens_used;
            changed = true;
        }
        if let Some(usage) = &self.usage
            && !session.extra.contains_key("usage")
        {
            session.extra.insert("usage".into(), usage.clone());
            changed = true;
        }
        if !changed {
            return None;
        }
        // The journal keeps what each session used (`agent-state usage`,
        // the budgets); session.json shows the last session's.
        let count = |k: &str| {
            session
                .extra
                .get("usage")
                .and_then(|u| u.get(k))
                .and_then(serde_json::Value::as_u64)
        };
        Some(Event::SessionUsage(SessionUsage {
            session_id: session.session_id.clone(),
            input_tokens: count("input_tokens"),
            output_tokens: count("output_tokens"),
            cache_creation_input_tokens: count("cache_creation_input_tokens"),
            cache_read_input_tokens: count("cache_read_input_tokens"),
            tokens_used: session.tokens_used,
            cost_usd: session.cost_usd,
        }))
    }
}

/// The output's summary into session.json and report.json (report.json
/// only while its `last_session` is this one). Returns whether
/// session.json changed.
fn apply_summary(
    session: &mut Session,
    report: &mut Report,
    from_output: &OutputSummary,
    said: SaidByScript,
    blocked_by_signal: bool,
) -> bool {
    let mut changed = false;
    if let (Some(notes), false) = (&from_output.handoff_notes, said.handoff_notes)
        && session.handoff_notes.is_none()
    {
        session.handoff_notes = Some(notes.clone());
        changed = true;
    }
    if let Some(block) = &from_output.signal_block {
        session.extra.insert("signal_block".into(), block.clone());
        changed = true;
    }
    let ours = report.current_session.is_none()
        && report
            .last_session
            .as_ref()
            .is_some_and(|l| l.id == session.session_id);
    if !ours {
        return changed;
    }
    if let (Some(s), false) = (&from_output.summary, said.summary) {
        report.summary = Some(s.clone());
    }
    if let (Some(p), false) = (&from_output.next_priority, said.next_priority) {
        report.next_priority = Some(p.clone());
    }
    // The summary's "Blockers: none" does not clear what the agent said
    // itself: a BLOCKED signal of this session with no RESOLVED after it
    // stands.
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
    changed
}

/// The facts of a session whose end is being recorded now (by
/// `finish_with`, under the lock): applied to its session.json and
/// report.json before they are staged. Returns the usage journal line.
pub(super) fn apply_at_end(
    dir: &AgentDir,
    facts: &Facts,
    session: &mut Session,
    report: &mut Report,
    ending: &Event,
    now: Timestamp,
) -> Result<Option<Event>> {
    report.extra.remove(REPORT_ITERATION);
    if facts.is_empty() {
        return Ok(None);
    }
    // The end's journal line is not written yet: the signals are read
    // back to the session's start.
    let blocked_by_signal = facts.needs_signals() && journaled(dir, &session.session_id)?.1;
    let (usage, _) = facts.apply(
        session,
        report,
        SaidByScript::of(Some(ending)),
        blocked_by_signal,
        now,
    );
    Ok(usage)
}

/// What [`amend_ended`] adds to an ended session its script recorded first.
#[derive(Debug, Clone, Default)]
pub struct Amendment<'a> {
    /// A usage limit the daemon found in the output of a session its script
    /// recorded as failed: journaled (`session_verdict`, which the counters
    /// follow), and the agent back to idle.
    pub verdict: Option<SessionVerdict>,
    /// What the daemon decided, put in front of the failure reason the
    /// script recorded (session.json `reason`, report.json
    /// `last_session.reason` and `summary`), unless the reason says it
    /// already. The journal keeps what was recorded first.
    pub reason: Option<&'a str>,
    pub facts: Facts,
}

/// What [`amend_ended`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amended {
    pub verdict: bool,
    pub reason: bool,
    pub facts: bool,
}

/// Add `amendment` to the ended session `session_id` (recorded by its
/// script first), in one write of session.json and report.json (and the
/// journal lines of the verdict and the usage in one append). Nothing if
/// that session is not the one in session.json or is still running.
pub fn amend_ended(
    dir: &AgentDir,
    session_id: &str,
    amendment: &Amendment<'_>,
    now: Timestamp,
) -> Result<Amended> {
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut session: Session = dir.load(&lock, now, &mut notes)?;
    let mut done = Amended::default();
    if session.session_id != session_id || session.is_running() {
        return Ok(done);
    }
    let mut report: Report = dir.load(&lock, now, &mut notes)?;
    let verdict = amendment
        .verdict
        .and_then(|v| amend_verdict(&mut session, &mut report, v));
    done.verdict = verdict.is_some();
    let mut usage = None;
    if let Some(decided) = amendment.reason {
        done.reason = amend_reason(&mut session, &mut report, decided);
    }
    if !amendment.facts.is_empty() {
        let (end, blocked) = journaled(dir, session_id)?;
        let changed;
        (usage, changed) = amendment.facts.apply(
            &mut session,
            &mut report,
            SaidByScript::of(end.as_ref()),
            blocked,
            now,
        );
        done.facts = changed || amendment.facts.summary.is_some();
    }
    report.extra.remove(REPORT_ITERATION);
    if done == Amended::default() {
        return Ok(done);
    }
    let staged_session = dir.stage(&lock, &session)?;
    let staged_report = dir.stage(&lock, &report)?;
    let lines: Vec<Event> = verdict.iter().chain(&usage).cloned().collect();
    dir.journal_append_all(&lock, now, &lines)?;
    // The counters follow the verdict (the usage line counts nothing).
    let staged_metrics = match &verdict {
        Some(event) => metrics::stage(dir, &lock, event, now, &mut notes)?.1,
        None => None,
    };
    atomic::commit_all(
        [staged_session, staged_report]
            .into_iter()
            .chain(staged_metrics),
    )?;
    Ok(done)
}

/// The verdict part of [`amend_ended`]: its journal line, if it changes
/// anything (only a failure, and only once).
fn amend_verdict(
    session: &mut Session,
    report: &mut Report,
    verdict: SessionVerdict,
) -> Option<Event> {
    let was = match session.status {
        Some(SessionStatus::Error) => SessionVerdict::Error,
        Some(SessionStatus::Timeout) => SessionVerdict::Timeout,
        _ => return None,
    };
    if session.verdict.is_some() || was == verdict {
        return None;
    }
    session.verdict = Some(verdict);
    if let Some(last) = report
        .last_session
        .as_mut()
        .filter(|l| l.id == session.session_id)
    {
        last.verdict = Some(verdict);
        if report.current_session.is_none() && verdict == SessionVerdict::UsageLimit {
            report.status = AgentStatus::Idle;
        }
    }
    Some(Event::SessionVerdict(VerdictAmended {
        session_id: session.session_id.clone(),
        was,
        verdict,
    }))
}

/// The reason part of [`amend_ended`]: whether it changed anything.
fn amend_reason(session: &mut Session, report: &mut Report, decided: &str) -> bool {
    let failed = matches!(
        session.status,
        Some(SessionStatus::Error | SessionStatus::Timeout)
    );
    let recorded = session.reason.clone().unwrap_or_default();
    if !failed || recorded.contains(decided) {
        return false;
    }
    let reason = if recorded.is_empty() {
        decided.to_string()
    } else {
        format!("{decided}; the session script reported: {recorded}")
    };
    session.reason = Some(reason.clone());
    let id = session.session_id.clone();
    if let Some(last) = report.last_session.as_mut().filter(|l| l.id == id) {
        last.reason = Some(reason.clone());
        if report.current_session.is_none()
            && let Some(summary) = report.summary.as_mut()
            && summary.ends_with(&recorded)
            && summary.starts_with(&format!("Session {id} "))
        {
            let head = summary.len() - recorded.len();
            summary.truncate(head);
            summary.push_str(&reason);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ended(status: SessionStatus, reason: Option<&str>) -> (Session, Report) {
        let session = Session {
            session_id: "20261129-070000".into(),
            status: Some(status),
            reason: reason.map(str::to_string),
            ..Session::default()
        };
        let report = Report {
            summary: reason.map(|r| format!("Session 20261129-070000 failed: {r}")),
            last_session: Some(LastSession {
                id: "20261129-070000".into(),
                outcome: Some(status),
                reason: reason.map(str::to_string),
                ..LastSession::default()
            }),
            ..Report::default()
        };
        (session, report)
    }

    fn now() -> Timestamp {
        Timestamp::parse("2026-11-29T07:00:00Z").unwrap()
    }

    /// (what the session says already, the facts' figures) → what it says
    /// after, and whether a `session_usage` line is journaled (with what).
    #[test]
    fn usage_is_recorded_once_and_never_over_the_script_s_own() {
        let usage = json!({"input_tokens": 100, "output_tokens": 20});
        type Row = (
            Option<f64>,
            Option<u64>,
            Option<f64>,
            Option<u64>,
            Option<f64>,
            Option<u64>,
            bool,
        );
        let rows: [Row; 5] = [
            // session (cost, tokens), facts (cost, tokens) → session after, journaled
            (None, None, Some(0.5), Some(120), Some(0.5), Some(120), true),
            // The script's `session end --cost-usd` wins.
            (
                Some(1.0),
                None,
                Some(0.5),
                Some(120),
                Some(1.0),
                Some(120),
                true,
            ),
            // A figure past the caps is the agent's word, not recorded.
            (None, None, Some(f64::NAN), Some(u64::MAX), None, None, true),
            (None, None, Some(-1.0), None, None, None, true),
            // Already recorded: nothing to journal again.
            (
                Some(0.5),
                Some(120),
                Some(0.5),
                Some(120),
                Some(0.5),
                Some(120),
                false,
            ),
        ];
        for (i, (cost, tokens, f_cost, f_tokens, want_cost, want_tokens, journaled)) in
            rows.into_iter().enumerate()
        {
            let (mut s, mut r) = ended(SessionStatus::Completed, None);
            s.cost_usd = cost;
            s.tokens_used = tokens;
            if !journaled {
                s.extra.insert("usage".into(), usage.clone());
            }
            let facts = Facts {
                cost_usd: f_cost,
                tokens_used: f_tokens,
                usage: Some(usage.clone()),
                ..Facts::default()
            };
            let (line, _) = facts.apply(&mut s, &mut r, SaidByScript::default(), false, now());
            assert_eq!(
                (s.cost_usd, s.tokens_used),
                (want_cost, want_tokens),
                "row {i}"
            );
            assert_eq!(line.is_some(), journaled, "row {i}");
            if let Some(Event::SessionUsage(u)) = line {
                assert_eq!(
                    (u.cost_usd, u.tokens_used),
                    (want_cost, want_tokens),
                    "row {i}"
                );
                assert_eq!(
                    (u.input_tokens, u.output_tokens),
                    (Some(100), Some(20)),
                    "row {i}"
                );
            }
        }
    }

    /// (status, verdict already there) → whether a usage limit is added.
    #[test]
    fn a_usage_limit_amends_only_a_failure_without_a_verdict() {
        let rows = [
            (SessionStatus::Error, None, Some(SessionVerdict::Error)),
            (SessionStatus::Timeout, None, Some(SessionVerdict::Timeout)),
            (SessionStatus::Completed, None, None),
            (SessionStatus::Error, Some(SessionVerdict::Stopped), None),
        ];
        for (status, already, was) in rows {
            let (mut s, mut r) = ended(status, Some("the trap said so"));
            r.status = AgentStatus::Error;
            s.verdict = already;
            let line = amend_verdict(&mut s, &mut r, SessionVerdict::UsageLimit);
            match (line, was) {
                (Some(Event::SessionVerdict(v)), Some(was)) => {
                    assert_eq!((v.was, v.verdict), (was, SessionVerdict::UsageLimit));
                    assert_eq!(s.verdict, Some(SessionVerdict::UsageLimit));
                    assert_eq!(
                        r.last_session.unwrap().verdict,
                        Some(SessionVerdict::UsageLimit)
                    );
                    assert_eq!(r.status, AgentStatus::Idle, "not a failure");
                }
                (None, None) => assert_eq!(s.verdict, already, "{status:?}"),
                (line, was) => panic!("{status:?}: {line:?}, expected a change from {was:?}"),
            }
        }
    }

    /// (status, the script's reason) → the reason after the daemon's
    /// "the session command exited with status 1".
    #[test]
    fn the_daemon_s_reason_goes_in_front_of_the_script_s_once() {
        let decided = "the session command exited with status 1";
        let rows = [
            (
                SessionStatus::Error,
                Some("trap: claude failed"),
                Some(
                    "the session command exited with status 1; the session script reported: trap: claude failed",
                ),
            ),
            (SessionStatus::Error, Some(""), Some(decided)),
            // Said already: unchanged.
            (
                SessionStatus::Error,
                Some("the session command exited with status 1 (twice)"),
                Some("the session command exited with status 1 (twice)"),
            ),
            // Not a failure: nothing to put in front of.
            (SessionStatus::Completed, None, None),
        ];
        for (status, recorded, want) in rows {
            let (mut s, mut r) = ended(status, recorded);
            let changed = amend_reason(&mut s, &mut r, decided);
            assert_eq!(s.reason.as_deref(), want, "{recorded:?}");
            assert_eq!(changed, recorded != want, "{recorded:?}");
            if changed {
                let last = r.last_session.as_ref().unwrap();
                assert_eq!(last.reason.as_deref(), want);
                assert_eq!(
                    r.summary.as_deref(),
                    Some(format!("Session 20261129-070000 failed: {}", want.unwrap()).as_str())
                );
            }
        }
    }

    /// What the script said through `session end` wins over the output's
    /// summary; "Blockers: none" does not clear a BLOCKED signal that stands.
    #[test]
    fn the_output_s_summary_fills_only_what_the_script_left_unsaid() {
        let summary = OutputSummary {
            summary: Some("from the output".into()),
            next_priority: Some("next from the output".into()),
            handoff_notes: Some("notes from the output".into()),
            blocked_by: Some(None),
            confidence: Some(4),
            risk: Some("low".into()),
            signal_block: Some(json!({"agent": "Actor"})),
        };
        let facts = Facts {
            summary: Some(summary),
            ..Facts::default()
        };
        // Nothing said by the script, no signal standing.
        let (mut s, mut r) = ended(SessionStatus::Completed, None);
        r.blocked_by = Some("old blocker".into());
        facts.apply(&mut s, &mut r, SaidByScript::default(), false, now());
        assert_eq!(r.summary.as_deref(), Some("from the output"));
        assert_eq!(r.next_priority.as_deref(), Some("next from the output"));
        assert_eq!(s.handoff_notes.as_deref(), Some("notes from the output"));
        assert_eq!(r.blocked_by, None, "Blockers: none clears it");
        assert_eq!(r.extra["confidence"], 4);
        assert_eq!(s.extra["signal_block"]["agent"], "Actor");
        // The script said its summary and notes; a BLOCKED signal stands.
        let (mut s, mut r) = ended(SessionStatus::Completed, None);
        r.summary = Some("the script's".into());
        s.handoff_notes = Some("the script's notes".into());
        r.blocked_by = Some("waiting for a key".into());
        let said = SaidByScript {
            summary: true,
            next_priority: false,
            handoff_notes: true,
        };
        facts.apply(&mut s, &mut r, said, true, now());
        assert_eq!(r.summary.as_deref(), Some("the script's"));
        assert_eq!(r.next_priority.as_deref(), Some("next from the output"));
        assert_eq!(s.handoff_notes.as_deref(), Some("the script's notes"));
        assert_eq!(r.blocked_by.as_deref(), Some("waiting for a key"));
    }
}
