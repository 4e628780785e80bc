//! What the daemon learned about a session by its end, gathered on the loop
//! before the end is recorded, so that the record carries it
//! (`hooks::Facts`): the workspace, the iterations, Claude Code's
//! conversation and usage, the Context Summary and signal block at the end
//! of the output. A malformed summary or signal block is logged here (and to
//! signals.jsonl); what parses goes into the facts.

use super::*;

/// What [`gather`] reads.
pub(super) struct Learned<'a> {
    pub root: &'a StateRoot,
    pub agent: &'a AgentName,
    pub session_id: &'a str,
    pub cfg: Option<&'a AgentConfig>,
    pub output: &'a OutputSummary,
    pub workspace: Option<&'a workspaces::Outcome>,
    pub iterations: &'a iterations::Tally,
    /// Claude Code's conversation id, and whether the session continued it.
    pub conversation: Option<&'a (String, bool)>,
    /// A conversation that ended in a login or usage-limit failure is never
    /// continued.
    pub resumable: bool,
    pub now: Timestamp,
}

/// The facts of a session's end (see the module's text).
pub(super) fn gather(l: &Learned<'_>) -> hooks::Facts {
    let mut facts = hooks::Facts::default();
    if let Some(ws) = l.workspace {
        facts.extra.insert(
            "workspace".into(),
            serde_json::to_value(ws).unwrap_or_default(),
        );
    }
    if let Some((id, resumed)) = l.conversation
        && l.cfg.is_some_and(|c| {
            c.session
                .command
                .iter()
                .any(|a| a.contains("{claude_session"))
        })
    {
        facts
            .extra
            .insert("claude_session_id".into(), id.clone().into());
        facts
            .extra
            .insert("claude_resumed".into(), (*resumed).into());
        facts
            .extra
            .insert("claude_resumable".into(), l.resumable.into());
    }
    if l.cfg
        .is_some_and(|c| !c.session.iteration.verify.is_empty())
    {
        facts.extra.insert(
            "iterations".into(),
            serde_json::json!({
                "count": l.iterations.count,
                "verify_failures": l.iterations.verify_failures,
            }),
        );
    }
    let results = l.iterations.results(l.output.claude.as_ref());
    if !results.is_empty() {
        let (cost, tokens, usage) = iterations::usage_of(&results);
        facts.cost_usd = cost;
        facts.tokens_used = tokens;
        facts.usage = usage.and_then(|u| serde_json::to_value(u).ok());
    }
    facts.summary = output_summary(l);
    facts
}

/// The Context Summary Block and the signal block at the end of the output
/// (in Claude Code's result text when there is one); malformed ones logged
/// and appended to signals.jsonl.
fn output_summary(l: &Learned<'_>) -> Option<hooks::OutputSummary> {
    let text = l.output.answer_text();
    let mut found = hooks::OutputSummary::default();
    let mut problems = Vec::new();
    let mut any = false;
    match crate::protocol::summary::parse_context_summary(&text) {
        Some(Ok(cs)) => {
            any = true;
            found.summary = cs.summary_text();
            if cs.blockers.is_some() {
                found.blocked_by = Some(cs.blocked_by());
            }
            found.next_priority = cs.next_priority();
            found.handoff_notes = cs.handoff_notes();
            found.confidence = cs.report_confidence();
            found.risk = cs
                .report_risk()
                .and_then(|r| serde_json::to_value(r).ok())
                .and_then(|v| v.as_str().map(str::to_string));
        }
        Some(Err(p)) => problems.push(p),
        None => {}
    }
    match crate::protocol::summary::parse_signal_block(&text) {
        Some(Ok(block)) => {
            any = true;
            found.signal_block = serde_json::to_value(&block).ok();
        }
        Some(Err(p)) => problems.push(p),
        None => {}
    }
    for p in problems {
        tracing::warn!(agent = %l.agent, session_id = %l.session_id, "{}: {}", p.code.as_str(), p.message);
        let record = crate::protocol::signals::SignalRecord {
            ts: l.now,
            level: "warn".into(),
            code: p.code.as_str().to_string(),
            agent: l.agent.to_string(),
            task: None,
            session: Some(l.session_id.to_string()),
            raw: p.raw.clone(),
            kind: p.field.clone(),
            message: Some(p.message.clone()),
        };
        if let Err(e) = effects::append_signal(l.root, &record) {
            tracing::warn!("cannot append to signals.jsonl: {e}");
        }
    }
    any.then_some(found)
}

/// What a workspace's end says in the log; a worktree that could not be
/// judged is an error to raise (it is kept), returned. (Its record is in
/// the facts.)
pub(super) fn workspace_said(
    agent: &AgentName,
    sid: &str,
    ws: &workspaces::Outcome,
) -> Option<ErrorRecord> {
    match ws.state {
        "kept" => {
            tracing::info!(agent = %agent, session_id = %sid, "workspace kept: {} on {} ({}{} commit(s) not on the base)", ws.path.display(), ws.branch, if ws.dirty { "uncommitted changes, " } else { "" }, ws.commits_ahead);
            None
        }
        "removed" => {
            tracing::info!(agent = %agent, session_id = %sid, "workspace removed (nothing changed): {}", ws.path.display());
            None
        }
        // Its error (WORKSPACE_INVALID_COMMITS) is the session's.
        "reset" => {
            tracing::warn!(agent = %agent, session_id = %sid, "workspace reset to the base after invalid commits ({}): {} removed", ws.invalid.as_deref().unwrap_or_default(), ws.path.display());
            None
        }
        _ => Some(
            ErrorRecord::new(
                Code::WorkspaceFailed,
                format!("{agent}: cannot judge the workspace of session {sid}; it is kept"),
            )
            .details(ws.error.clone().unwrap_or_default())
            .agent(agent)
            .session(sid),
        ),
    }
}
