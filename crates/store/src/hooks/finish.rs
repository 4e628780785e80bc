//! `session end` and `session fail`: the end recorded in every file (journal first), and the daemon's word on how its session ended. Recovery of a session left running and the replay of an end journaled before a crash are in `recover.rs`.

use super::*;

// ---- end / fail ------------------------------------------------------------

/// The most sources one session may say it archived (`--sources-archived`).
pub const MAX_SOURCES_ARCHIVED: u64 = 1_000_000;

#[derive(Debug, Clone, Default)]
pub struct EndRequest {
    pub session: Option<String>,
    pub outcome: Option<String>,
    pub sources_archived: Option<String>,
    pub branch: Option<String>,
    pub pr: Option<String>,
    pub summary: Option<String>,
    pub next_priority: Option<String>,
    pub handoff_notes: Option<String>,
    pub tokens_used: Option<String>,
    pub cost_usd: Option<String>,
    /// The processes the hook was called from (see [`Caller`]).
    /// The messages the session's claim read, when its caller kept them
    /// (the daemon, bodies dropped): the end lists them from here instead
    /// of reading `.claimed/` again. `None`: read from `.claimed/`.
    pub claimed: Option<Vec<Message>>,
    pub caller: Caller,
    /// What the daemon learned about its session, recorded with the end
    /// (see [`Facts`]). Empty for a script's `session end`.
    pub facts: Facts,
}

#[derive(Debug, Clone, Default)]
pub struct FailRequest {
    pub session: Option<String>,
    pub outcome: String,
    pub reason: String,
    /// The catalogue code of the failure, when the daemon judged it
    /// (journaled with the end; a script's `session fail` has none).
    pub code: Option<String>,
    /// What the end counts as when the daemon knows better than the
    /// status: [`SessionVerdict::UsageLimit`] (a script's `session fail`
    /// has none).
    pub verdict: Option<SessionVerdict>,
    /// The session's command could not be executed at all (missing, not
    /// executable): its messages go back without counting an attempt (the
    /// agent never saw them). The daemon's word only; a script's `session
    /// fail` always counts.
    pub not_an_attempt: bool,
    /// The processes the hook was called from (see [`Caller`]).
    pub caller: Caller,
    /// As [`EndRequest::facts`].
    pub facts: Facts,
}

/// Who called `end` or `fail`: the processes it was called from, nearest
/// first (a script, its parents), as far as the caller can see them. An
/// `end` that names no session ends the running one only if one of these
/// owns it (or its owner is gone): a script whose `$SESSION` was lost must
/// not end a session another live process owns.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub ancestors: Vec<Owner>,
}

impl Caller {
    /// The processes this process was started from.
    pub fn this_process() -> Caller {
        Caller {
            ancestors: Owner::ancestors(),
        }
    }

    fn owns(&self, session: &Session) -> bool {
        self.ancestors
            .iter()
            .any(|o| o.is(session.owner_pid, session.owner_start))
    }
}

#[derive(Debug, Default)]
pub struct FinishResult {
    pub session_id: String,
    pub outcome: Option<SessionStatus>,
    /// The session had already ended: nothing was changed.
    pub already_ended: bool,
    pub processed: Vec<String>,
    pub returned: Vec<String>,
    pub undeliverable: Vec<String>,
    pub bad_arguments: Vec<BadArgument>,
    pub notes: Vec<String>,
    /// The end had been journaled before a crash and was completed from it.
    pub replayed: bool,
    /// The daemon holds the session's end (it verifies first): what the
    /// script said was kept, and the session goes on running until the
    /// daemon ends it (see [`joint`]).
    pub kept: bool,
}

/// What ended a session.
pub(super) enum Ending {
    Completed(Completion),
    Failed {
        outcome: SessionStatus,
        reason: String,
        /// Count this as a failed delivery attempt of its messages. Not when
        /// the session was interrupted (its process or the daemon killed
        /// under it): a crash-looping daemon must not make messages
        /// undeliverable.
        count_attempts: bool,
        /// The catalogue code the daemon judged the failure by, for the
        /// journal line (see [`SessionFailed::code`]).
        code: Option<String>,
        /// See [`FailRequest::verdict`].
        verdict: Option<SessionVerdict>,
    },
}

impl Ending {
    /// Its texts within their documented caps (see `state::caps`).
    fn capped(self) -> Ending {
        match self {
            Ending::Completed(c) => Ending::Completed(Completion {
                branch: caps::cap_opt(Field::Branch, c.branch),
                summary: caps::cap_opt(Field::Summary, c.summary),
                next_priority: caps::cap_opt(Field::NextPriority, c.next_priority),
                handoff_notes: caps::cap_opt(Field::HandoffNotes, c.handoff_notes),
                ..c
            }),
            Ending::Failed {
                outcome,
                reason,
                count_attempts,
                code,
                verdict,
            } => Ending::Failed {
                outcome,
                reason: caps::cap(Field::Reason, reason),
                count_attempts,
                code,
                verdict,
            },
        }
    }
}

impl Ending {
    /// As [`joint::Said`], and what it carries that a script's word does
    /// not: the claim's messages, the catalogue code, whether attempts count.
    fn into_said(
        self,
        now: Timestamp,
    ) -> (
        joint::Said,
        Option<Vec<Message>>,
        Option<String>,
        bool,
        Option<SessionVerdict>,
    ) {
        match self {
            Ending::Completed(c) => (
                joint::Said {
                    sources_archived: c.sources_archived,
                    branch: c.branch,
                    pr_number: c.pr_number,
                    summary: c.summary,
                    next_priority: c.next_priority,
                    handoff_notes: c.handoff_notes,
                    tokens_used: c.tokens_used,
                    cost_usd: c.cost_usd,
                    ..joint::Said::completed(now)
                },
                c.claimed,
                None,
                true,
                None,
            ),
            Ending::Failed {
                outcome,
                reason,
                count_attempts,
                code,
                verdict,
            } => (
                joint::Said::failed(outcome, &reason, now),
                None,
                code,
                count_attempts,
                verdict,
            ),
        }
    }

    fn from_said(
        said: joint::Said,
        claimed: Option<Vec<Message>>,
        code: Option<String>,
        count_attempts: bool,
        verdict: Option<SessionVerdict>,
    ) -> Ending {
        if said.is_failure() {
            return Ending::Failed {
                outcome: said.outcome,
                reason: said.reason.unwrap_or_else(|| "no reason given".into()),
                count_attempts,
                code,
                verdict,
            };
        }
        Ending::Completed(Completion {
            claimed,
            sources_archived: said.sources_archived,
            branch: said.branch,
            pr_number: said.pr_number,
            summary: said.summary,
            next_priority: said.next_priority,
            handoff_notes: said.handoff_notes,
            tokens_used: said.tokens_used,
            cost_usd: said.cost_usd,
        })
    }
}

/// The daemon's hold on a running session's end (see [`joint`]). `None`:
/// not held.
fn held_of(session: &Session) -> Option<joint::Held> {
    serde_json::from_value(session.extra.get(joint::HELD)?.clone()).ok()
}

/// What a held session's script said so far, if anything (see [`joint`]).
pub fn kept_word(session: &Session) -> Option<joint::Said> {
    held_of(session)?;
    serde_json::from_value(session.extra.get(joint::SAID)?.clone()).ok()
}

#[derive(Default)]
pub(super) struct Completion {
    /// What the claim read (see [`EndRequest::claimed`]).
    pub(super) claimed: Option<Vec<Message>>,
    pub(super) sources_archived: Option<u64>,
    pub(super) branch: Option<String>,
    pub(super) pr_number: Option<u64>,
    pub(super) summary: Option<String>,
    pub(super) next_priority: Option<String>,
    pub(super) handoff_notes: Option<String>,
    pub(super) tokens_used: Option<u64>,
    pub(super) cost_usd: Option<f64>,
}

/// The post-session hook.
pub fn end(
    agent: impl Into<AgentSettings>,
    dir: &AgentDir,
    req: &EndRequest,
    now: Timestamp,
) -> Result<FinishResult> {
    let mut args = Args::default();
    let completion = Completion {
        claimed: req.claimed.clone(),
        sources_archived: args.count_at_most(
            "--sources-archived",
            req.sources_archived.as_deref(),
            MAX_SOURCES_ARCHIVED,
            "sources",
        ),
        branch: Args::text(req.branch.as_deref()),
        pr_number: args.pr("--pr", req.pr.as_deref()),
        summary: Args::text(req.summary.as_deref()),
        next_priority: Args::text(req.next_priority.as_deref()),
        handoff_notes: Args::text(req.handoff_notes.as_deref()),
        tokens_used: args.count_at_most(
            "--tokens-used",
            req.tokens_used.as_deref(),
            crate::state::caps::MAX_SESSION_TOKENS,
            "tokens",
        ),
        cost_usd: args.money("--cost-usd", req.cost_usd.as_deref()),
    };
    let ending = match req.outcome.as_deref().map(str::trim) {
        None | Some("completed") => Ending::Completed(completion),
        Some("timeout") => Ending::Failed {
            outcome: SessionStatus::Timeout,
            reason: "reported as timeout by `session end`".into(),
            count_attempts: true,
            code: None,
            verdict: None,
        },
        Some("error") => Ending::Failed {
            outcome: SessionStatus::Error,
            reason: "reported as error by `session end`".into(),
            count_attempts: true,
            code: None,
            verdict: None,
        },
        Some(other) => {
            args.note(
                "--outcome",
                other,
                "not completed, timeout or error; recorded as completed",
            );
            Ending::Completed(completion)
        }
    };
    finish_request(
        &agent.into(),
        dir,
        (req.session.as_deref(), &req.caller),
        (ending, &req.facts),
        args,
        now,
    )
}

/// The error hook.
pub fn fail(
    agent: impl Into<AgentSettings>,
    dir: &AgentDir,
    req: &FailRequest,
    now: Timestamp,
) -> Result<FinishResult> {
    let mut args = Args::default();
    let outcome = match req.outcome.trim() {
        "timeout" => SessionStatus::Timeout,
        "error" => SessionStatus::Error,
        other => {
            args.note(
                "--outcome",
                other,
                "not error or timeout; recorded as error",
            );
            SessionStatus::Error
        }
    };
    let reason = match req.reason.trim() {
        "" => "no reason given".to_string(),
        r => r.to_string(),
    };
    finish_request(
        &agent.into(),
        dir,
        (req.session.as_deref(), &req.caller),
        (
            Ending::Failed {
                outcome,
                reason,
                count_attempts: !req.not_an_attempt,
                code: req.code.clone(),
                // Only a usage limit is worth saying beside the status.
                verdict: req.verdict.filter(|v| *v == SessionVerdict::UsageLimit),
            },
            &req.facts,
        ),
        args,
        now,
    )
}

// ---- the daemon's word on how its session ended ------------------------------

/// The session.json key under which the daemon notes, before it sends SIGTERM,
/// that it is ending the session itself (its timeout, a stall, a stop).
pub const DAEMON_ENDING: &str = "ending_by_daemon";

/// Fields of session.json beyond the schema that describe one session only:
/// a new session does not inherit them from the last one.
pub(super) const PER_SESSION_EXTRA: [&str; 10] = [
    "usage",
    "signal_block",
    "workspace",
    "iterations",
    "claude_session_id",
    "claude_resumed",
    "claude_resumable",
    DAEMON_ENDING,
    joint::HELD,
    joint::SAID,
];

/// What the daemon noted in session.json (under [`DAEMON_ENDING`]) just
/// before it signalled the session to end.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DaemonEnding {
    /// `timeout` or `error`.
    pub outcome: String,
    pub reason: String,
    /// The daemon's pid: the daemon's own `fail` is not merged with itself.
    pub by_pid: u32,
    pub at: Timestamp,
    /// The catalogue code of the ending when it says more than `outcome`:
    /// `SESSION_STOPPED` for an operator's `agent-state stop` (recorded
    /// with that code, its messages returned without counting an attempt,
    /// whoever records the end). Absent otherwise, and in older notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// Note in session.json that the daemon is ending the running session
/// `session_id` (see [`DaemonEnding`]): whatever its script's trap records
/// next (`session fail`, `session end`), the outcome is the daemon's, and the
/// reason keeps both. Returns whether the note was written (not if the
/// session is no longer running).
pub fn note_daemon_ending(
    dir: &AgentDir,
    session_id: &str,
    ending: &DaemonEnding,
    now: Timestamp,
) -> Result<bool> {
    let value = serde_json::to_value(ending).map_err(|e| Error::Data(e.to_string()))?;
    dir.update::<Session>(now, |s| {
        if s.session_id == session_id && s.is_running() {
            s.extra.insert(DAEMON_ENDING.into(), value);
        }
    })
}

/// A script's ending of a session the daemon is ending itself: the daemon's
/// outcome, and both reasons. `None` if the daemon noted nothing, or if this
/// is the daemon's own call (then only an operator's stop changes it: its
/// code is kept and no attempt is counted).
pub(super) fn daemon_wins(current: &Session, ending: &Ending) -> Option<Ending> {
    let noted: DaemonEnding =
        serde_json::from_value(current.extra.get(DAEMON_ENDING)?.clone()).ok()?;
    let stopped = crate::catalogue::stopped(noted.code.as_deref());
    if noted.by_pid == std::process::id() {
        return match ending {
            Ending::Failed {
                outcome, reason, ..
            } if stopped => Some(Ending::Failed {
                outcome: *outcome,
                reason: reason.clone(),
                count_attempts: false,
                code: noted.code,
                verdict: Some(SessionVerdict::Stopped),
            }),
            _ => None,
        };
    }
    let outcome = match noted.outcome.as_str() {
        "timeout" => SessionStatus::Timeout,
        _ => SessionStatus::Error,
    };
    let said = match ending {
        Ending::Completed(_) => "it completed".to_string(),
        Ending::Failed { reason, .. } => reason.clone(),
    };
    Some(Ending::Failed {
        outcome,
        reason: format!("{}; the session script reported: {said}", noted.reason),
        count_attempts: !stopped,
        code: noted.code.filter(|_| stopped),
        verdict: stopped.then_some(SessionVerdict::Stopped),
    })
}

/// report.json `last_session.code`: `SESSION_STOPPED` when an operator
/// stopped the last session (its `outcome` stays the seed's `error`).
pub const LAST_SESSION_CODE: &str = "code";

/// session.json's `errors` entry of a session an operator stopped: the
/// typed outcome beside `status: "error"`, with who stopped it and why (in
/// `reason`, as the journal line has it).
fn stop_error(reason: &str, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "at": now,
        "code": crate::catalogue::Code::SessionStopped.as_str(),
        "outcome": "stopped",
        "message": reason,
    })
}

pub(super) fn finish_request(
    agent: &AgentSettings,
    dir: &AgentDir,
    (wanted, caller): (Option<&str>, &Caller),
    (ending, facts): (Ending, &Facts),
    mut args: Args,
    now: Timestamp,
) -> Result<FinishResult> {
    refuse(agent)?;
    let ending = ending.capped();
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let current: Session = dir.load(&lock, now, &mut notes)?;
    let ending = if current.is_running() {
        daemon_wins(&current, &ending).unwrap_or(ending)
    } else {
        ending
    };
    let wanted = wanted.map(str::trim).filter(|s| !s.is_empty());
    let matches = wanted.is_none_or(|w| w == current.session_id);

    // Naming no session ends the running one only for its owner (or when
    // its owner is gone): never another live process's session.
    if current.is_running()
        && wanted.is_none()
        && !caller.owns(&current)
        && owner_liveness(dir, &current, agent.timeout, now) == Liveness::Alive
    {
        return Err(Error::NotOwner {
            agent: dir.name.to_string(),
            session: current.session_id.clone(),
            pid: current.owner_pid.unwrap_or(0),
        });
    }

    if current.is_running() && !matches {
        return Err(Error::NoSession(format!(
            "{}: session {} is not running; the running session is {} (see {})",
            dir.name,
            wanted.unwrap_or_default(),
            current.session_id,
            dir.session().display()
        )));
    }
    // Hooks are idempotent: ending an ended session changes nothing. A
    // `fail` that names no session while none runs is not a repeat, though:
    // it is a run that died before `begin`, and it is recorded below.
    let repeat = match (wanted, &ending) {
        (Some(_), _) | (None, Ending::Completed(_)) => matches,
        (None, Ending::Failed { .. }) => false,
    };
    // Held by the daemon (it verifies first): the script's word is kept and
    // the session goes on; the daemon's own end records it, that word in it.
    let ending = match current.is_running().then(|| held_of(&current)).flatten() {
        None => ending,
        Some(held) => {
            let phase = joint::Phase::Held {
                kept: kept_word(&current).map(Box::new),
            };
            let (said, claimed, code, count_attempts, verdict) = ending.into_said(now);
            // The session's owner is the daemon: a caller it started (the
            // session's script) descends from it.
            let from = if held.by_pid == std::process::id() {
                joint::Ender::Holder
            } else if caller.owns(&current) {
                joint::Ender::Child
            } else {
                joint::Ender::Other
            };
            let end = joint::End { from, said };
            match joint::on(&phase, end, now) {
                joint::Action::Record(said) => {
                    // A failure's code is the daemon's, whoever said it first.
                    Ending::from_said(said, claimed, code, count_attempts, verdict)
                }
                joint::Action::Keep(said) => {
                    return keep_word(dir, &lock, current, said, args, now, notes);
                }
                joint::Action::Repeat => unreachable!("a held session is running"),
            }
        }
    };
    if !current.is_running() && repeat && !current.session_id.is_empty() {
        return Ok(FinishResult {
            session_id: current.session_id.clone(),
            outcome: current.status,
            already_ended: true,
            bad_arguments: args.bad,
            notes,
            ..FinishResult::default()
        });
    }
    let session = if current.is_running() {
        current
    } else {
        match ending {
            Ending::Completed(_) => {
                return Err(Error::NoSession(format!(
                    "{}: no session is running, so there is nothing to end{}; start one with `agent-state session begin {}`",
                    dir.name,
                    if current.session_id.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " (the last one, {}, ended {})",
                            current.session_id,
                            current.status.map(|s| s.as_str()).unwrap_or("unrecorded")
                        )
                    },
                    dir.name
                )));
            }
            // A failure with no session running (the script died before
            // `begin`, say) is still recorded, so no failed run goes unseen.
            Ending::Failed { .. } => Session {
                agent: dir.name.to_string(),
                session_id: new_session_id(dir, &current.session_id, now),
                started_at: Some(now),
                kind: agent.session_type,
                domain: agent.domain.clone(),
                status: Some(SessionStatus::Running),
                model: Some(agent.model.clone()),
                extra: current.extra,
                ..Session::default()
            },
        }
    };
    let mut result = finish_with(
        dir,
        &lock,
        session,
        (ending, facts),
        None,
        &mut args,
        now,
        &mut notes,
    )?;
    result.notes = notes;
    Ok(result)
}

/// Keep what a held session's script said (session.json, and a
/// `session_updated` line under the session's id); the session runs on.
fn keep_word(
    dir: &AgentDir,
    lock: &AgentLock,
    mut session: Session,
    said: joint::Said,
    mut args: Args,
    now: Timestamp,
    mut notes: Vec<String>,
) -> Result<FinishResult> {
    let value = serde_json::to_value(&said).map_err(|e| Error::Data(e.to_string()))?;
    session.extra.insert(joint::SAID.into(), value);
    session.errors.extend(args.as_errors(now));
    let update = Event::SessionUpdated(SessionUpdated {
        session_id: session.session_id.clone(),
        disconfirmation_target_added: false,
        fields: vec![joint::SAID.to_string()],
    });
    dir.journal_append(lock, now, update.clone())?;
    dir.save(lock, &session)?;
    metrics::apply(dir, lock, &update, now, &mut notes)?;
    Ok(FinishResult {
        session_id: session.session_id,
        outcome: Some(said.outcome),
        kept: true,
        bad_arguments: std::mem::take(&mut args.bad),
        notes,
        ..FinishResult::default()
    })
}

/// Record the end of `session` in every file. Call with the lock held.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    _agent: &AgentSettings,
    dir: &AgentDir,
    lock: &AgentLock,
    session: Session,
    ending: Ending,
    args: &mut Args,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<FinishResult> {
    finish_with(
        dir,
        lock,
        session,
        (ending, &Facts::default()),
        None,
        args,
        now,
        notes,
    )
}

/// [`finish`], or with `journaled` the completion of an end whose journal
/// line was written before a crash: the journal is the commit record of a
/// session's end, and what follows it (moving messages, session.json,
/// report.json, metrics) is replayed from it, never journaled twice.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_with(
    dir: &AgentDir,
    lock: &AgentLock,
    mut session: Session,
    (ending, facts): (Ending, &Facts),
    journaled: Option<&Event>,
    args: &mut Args,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<FinishResult> {
    let id = session.session_id.clone();
    let duration = session.started_at.map(|s| now.seconds_since(&s));
    let mut result = FinishResult {
        session_id: id.clone(),
        ..FinishResult::default()
    };
    let mut report: Report = dir.load(lock, now, notes)?;
    let mut memory_lines: Vec<String> = Vec::new();
    let event = match ending {
        Ending::Completed(c) => {
            // Listed, not yet moved: they move to processed/ only after the
            // journal says so. As the claim read them when the caller kept
            // them (one read per message); from `.claimed/` otherwise (a
            // script's `session end`, a replay after a crash).
            let processed: Vec<Message> = match c.claimed {
                Some(m) => m,
                None => inbox::claimed(dir, &id)?
                    .into_iter()
                    .map(|(_, m)| m)
                    .collect(),
            };
            let flags: Vec<&Message> = processed
                .iter()
                .filter(|m| m.kind == MessageType::Flag)
                .collect();
            let flag_lines: Vec<String> = flags
                .iter()
                .map(|m| {
                    format!(
                        "- {} ({}): \"{}\"",
                        title_case(&m.from),
                        m.created_at.date(),
                        m.subject.replace(['\n', '\r'], " ").trim()
                    )
                })
                .collect();
            result.processed = processed.iter().map(|m| m.id.clone()).collect();
            let event = Event::SessionEnd(SessionEnd {
                session_id: id.clone(),
                outcome: SessionStatus::Completed,
                sources_archived: c.sources_archived,
                handoff: c.handoff_notes.clone(),
                summary: c.summary.clone(),
                next_priority: c.next_priority.clone(),
                branch: c.branch.clone().or(session.branch.clone()),
                pr_number: c.pr_number,
                tokens_used: c.tokens_used,
                cost_usd: c.cost_usd,
                messages_processed: result.processed.clone(),
                flags_received: flags.len() as u64,
                duration_seconds: duration,
            });
            memory_lines = flag_lines;

            session.status = Some(SessionStatus::Completed);
            session.sources_archived = c.sources_archived.or(session.sources_archived);
            session.branch = c.branch.or(session.branch.take());
            session.pr_number = c.pr_number.or(session.pr_number);
            session.tokens_used = c.tokens_used.or(session.tokens_used);
            session.cost_usd = c.cost_usd.or(session.cost_usd);
            session.handoff_notes = c.handoff_notes.or(session.handoff_notes.take());

            report.status = AgentStatus::Idle;
            report.summary = Some(c.summary.unwrap_or_else(|| {
                format!(
                    "Session {id} completed{}",
                    session
                        .sources_archived
                        .map(|n| format!(" — {n} sources archived"))
                        .unwrap_or_default()
                )
            }));
            if c.next_priority.is_some() {
                report.next_priority = c.next_priority;
            }
            event
        }
        Ending::Failed {
            outcome,
            reason,
            count_attempts,
            code,
            verdict,
        } => {
            let (returned, undeliverable) =
                inbox::return_claimed_counting(dir, &id, now, count_attempts)?;
            let failed = SessionFailed {
                session_id: id.clone(),
                reason: reason.clone(),
                messages_returned: returned.clone(),
                messages_undeliverable: undeliverable.clone(),
                duration_seconds: duration,
                code,
                verdict,
            };
            let event = match outcome {
                SessionStatus::Timeout => Event::Timeout(failed),
                _ => Event::Error(failed),
            };
            result.returned = returned;
            result.undeliverable = undeliverable;

            session.status = Some(outcome);
            session.reason = Some(reason.clone());
            let stopped = matches!(&event, Event::Error(f) | Event::Timeout(f) if f.is_stop());
            if stopped {
                session.errors.push(stop_error(&reason, now));
            }
            session.verdict = verdict.or(stopped.then_some(SessionVerdict::Stopped));
            // A timeout, a usage limit or an operator's stop is not a fault
            // of the agent: it goes back to idle, and last_session says how
            // the session ended and why.
            let (status, verb) = match (outcome, verdict) {
                _ if stopped => (AgentStatus::Idle, "stopped"),
                (_, Some(SessionVerdict::UsageLimit)) => {
                    (AgentStatus::Idle, "stopped at the usage limit")
                }
                (SessionStatus::Timeout, _) => (AgentStatus::Idle, "timed out"),
                _ => (AgentStatus::Error, "failed"),
            };
            report.status = status;
            report.summary = Some(format!("Session {id} {verb}: {reason}"));
            event
        }
    };
    session.ended_at = Some(now);
    session.owner_pid = None;
    session.owner_start = None;
    session.extra.remove(DAEMON_ENDING);
    session.extra.remove(joint::HELD);
    session.extra.remove(joint::SAID);
    session.errors.extend(args.as_errors(now));

    report.agent = dir.name.to_string();
    report.current_session = None;
    report.updated_at = Some(now);
    // Sleeping, or still hatching while it has written no identity.
    report.lifecycle = Some(Lifecycle::at_rest(dir));
    report.last_session = Some(LastSession {
        id: id.clone(),
        started_at: session.started_at,
        ended_at: session.ended_at,
        outcome: session.status,
        sources_archived: session.sources_archived,
        branch: session.branch.clone(),
        pr_number: session.pr_number,
        reason: session.reason.clone(),
        verdict: session.verdict,
        extra: report
            .last_session
            .take()
            .map(|l| l.extra)
            .unwrap_or_default(),
    });
    // An operator's stop said beside `outcome` (`status` shows "stopped");
    // this session's word only, never inherited from the last one.
    if let Some(last) = report.last_session.as_mut() {
        last.extra.remove(LAST_SESSION_CODE);
        if matches!(&event, Event::Error(f) | Event::Timeout(f) if f.is_stop()) {
            last.extra.insert(
                LAST_SESSION_CODE.into(),
                crate::catalogue::Code::SessionStopped.as_str().into(),
            );
        }
    }
    // What the daemon learned about its session goes in with the end: no
    // reader sees the end without it.
    let usage = facts::apply_at_end(dir, facts, &mut session, &mut report, &event, now)?;
    // Both files are on disk before the journal records the end, renamed
    // in after it: a full disk fails the whole end, which can be retried.
    let staged_session = dir.stage(lock, &session)?;
    let staged_report = dir.stage(lock, &report)?;
    let event = match journaled {
        Some(e) => e.clone(),
        None => {
            // The usage line with the end's, in one append: never one
            // without the other, never twice.
            let mut lines = vec![event.clone()];
            lines.extend(usage);
            dir.journal_append_all(lock, now, &lines)?;
            event
        }
    };
    if matches!(event, Event::SessionEnd(_)) {
        inbox::acknowledge(dir, &id)?;
        memory::append_entries(
            &dir.store,
            &dir.memory(),
            memory::FLAGS_SECTION,
            &memory_lines,
        )?;
    }
    // metrics.json from the journal as it is now, staged with the others:
    // the three renames into the agent's directory share one directory
    // sync. A crash before it is recovered from the journal line (the end
    // replayed, the metrics caught up by `counted_session`).
    let (_, staged_metrics) = metrics::stage(dir, lock, &event, now, notes)?;
    atomic::commit_all(
        [staged_session, staged_report]
            .into_iter()
            .chain(staged_metrics),
    )?;
    // Ended: its owner lock goes (a keeper holding it sees that and exits).
    if let Err(e) = owner::release(dir, &id) {
        notes.push(e.to_string());
    }

    result.outcome = session.status;
    result.bad_arguments = std::mem::take(&mut args.bad);
    Ok(result)
}
