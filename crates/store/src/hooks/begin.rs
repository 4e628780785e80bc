//! `session begin`: a new session (or joining the running one), its id and instance, the claim, the start journaled.

use super::*;

// ---- begin ---------------------------------------------------------------

#[derive(Debug, Clone, Default)]
pub struct BeginRequest {
    pub session_type: Option<String>,
    pub branch: Option<String>,
    pub model: Option<String>,
    pub timeout: Option<String>,
    pub research_question: Option<String>,
    pub belief_targeted: Option<String>,
    pub disconfirmation_target: Option<String>,
    pub sources_expected: Option<String>,
    /// `AGENT_STATE_SESSION_ID`: join this session if it is the one running.
    pub join: Option<String>,
    pub owner: Option<Owner>,
    /// The instance id of the spawn (set by the daemon).
    pub instance: Option<String>,
    /// The daemon ends this session itself, after verification: its
    /// script's own ends are kept until then (see [`super::joint`]).
    pub hold_end: bool,
    /// Inbox files a writer still has open (the daemon knows from its
    /// watch): left waiting, never claimed half-written.
    pub writing: inbox::Writing,
    /// What the daemon already read of the inbox's files: claimed without
    /// being read again.
    pub known: Option<std::sync::Arc<inbox::Known>>,
    /// The inbox's names, listed beforehand (the daemon lists a big inbox
    /// off its loop): claimed from these instead of a listing.
    pub listed: Option<std::sync::Arc<inbox::Listed>>,
    /// The clock the inbox's files settle by (the caller's: the CLI and
    /// the daemon pass [`FileClock::Real`]).
    pub files: FileClock,
}

#[derive(Debug, Default)]
pub struct BeginResult {
    pub session_id: String,
    pub joined: bool,
    pub claim: Claim,
    pub bad_arguments: Vec<BadArgument>,
    /// Repairs and other things the caller should tell the user.
    pub notes: Vec<String>,
    /// The new session's owner lock, held for as long as this lives: the
    /// caller keeps it (the daemon) or hands it to a keeper (a script).
    pub owner_lock: Option<owner::OwnerLock>,
}

/// The pre-session hook.
pub fn begin(
    agent: impl Into<AgentSettings>,
    dir: &AgentDir,
    req: &BeginRequest,
    now: Timestamp,
) -> Result<BeginResult> {
    let agent = &agent.into();
    refuse(agent)?;
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut args = Args::default();
    let kind = args
        .parse::<SessionType>(
            "--type",
            req.session_type.as_deref(),
            "the configured session type was used",
        )
        .unwrap_or(agent.session_type);
    let timeout = args
        .duration("--timeout", req.timeout.as_deref())
        .unwrap_or(agent.timeout);
    let sources_expected = args.count("--sources-expected", req.sources_expected.as_deref());

    let current: Session = dir.load(&lock, now, &mut notes)?;
    let last_id = current.session_id.clone();
    // Fields other tools added are kept; what this program recorded about the
    // last session (its usage, its signal block) is not the new one's.
    let mut extra = current.extra.clone();
    for key in PER_SESSION_EXTRA {
        extra.remove(key);
    }
    if req.hold_end {
        let held = super::joint::Held {
            by_pid: std::process::id(),
            since: now,
        };
        let value = serde_json::to_value(&held).map_err(|e| Error::Data(e.to_string()))?;
        extra.insert(super::joint::HELD.into(), value);
    }
    if current.is_running() {
        let same_owner = req
            .owner
            .is_some_and(|o| o.is(current.owner_pid, current.owner_start));
        if req.join.as_deref() == Some(current.session_id.as_str()) || same_owner {
            return join(
                dir,
                &lock,
                current,
                req,
                &mut args,
                sources_expected,
                now,
                notes,
            );
        }
        let why = match owner_liveness(dir, &current, agent.timeout, now) {
            Liveness::Alive => return Err(busy(&current)),
            Liveness::Gone(why) => why,
        };
        let pid = current
            .owner_pid
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unknown".into());
        let id = current.session_id.clone();
        finish(
            agent,
            dir,
            &lock,
            current,
            Ending::Failed {
                outcome: SessionStatus::Error,
                reason: format!(
                    "interrupted: owner process {pid} is gone without calling `session end` or `session fail` ({why})"
                ),
                // The script died: that may be the agent failing on a message.
                count_attempts: true,
                code: None,
                verdict: None,
            },
            &mut Args::default(),
            now,
            &mut notes,
        )?;
        notes.push(format!(
            "{}: session {id} was left running by a process that is gone; recorded it as an error and returned its messages",
            dir.name
        ));
    }

    let session_id = new_session_id(dir, &last_id, now);
    // A new session is a spawn (seed 000): it gets an instance id. The
    // daemon assigns its own; a script run by cron takes one here, if it may
    // write the counters (a script of another user may not: noted, not fatal).
    let instance = match &req.instance {
        Some(i) => Some(i.clone()),
        None => {
            let root = crate::state::StateRoot::new(dir.path.parent().unwrap_or(&dir.path))
                .with_lock_wait(dir.lock_wait)
                .with_store(dir.store.clone());
            match crate::state::counters::next_instance(&root, dir, now) {
                Ok(i) => Some(i),
                Err(e) => {
                    notes.push(format!("no instance id for this session: {e}"));
                    None
                }
            }
        }
    };
    let req = &BeginRequest {
        instance,
        ..req.clone()
    };
    let claim = inbox::claim(
        dir,
        &session_id,
        now,
        agent.inbox_settle,
        req.files,
        &req.writing,
        req.known.as_deref(),
        req.listed.as_deref(),
    )?;
    let message_ids: Vec<String> = claim.claimed.iter().map(|m| m.id.clone()).collect();
    let model = Args::text(req.model.as_deref()).unwrap_or_else(|| agent.model.clone());
    let disconfirmation_target = Args::text(req.disconfirmation_target.as_deref());
    let start = Event::SessionStart(SessionStart {
        session_id: session_id.clone(),
        kind,
        model: Some(model.clone()),
        branch: Args::text(req.branch.as_deref()),
        timeout_seconds: Some(timeout.as_secs()),
        research_question: Args::text(req.research_question.as_deref()),
        disconfirmation_target: disconfirmation_target.clone(),
        messages: message_ids.clone(),
        owner_pid: req.owner.map(|o| o.pid),
        instance: req.instance.clone(),
    });
    let session = Session {
        agent: dir.name.to_string(),
        session_id: session_id.clone(),
        started_at: Some(now),
        ended_at: None,
        kind,
        domain: agent.domain.clone(),
        branch: Args::text(req.branch.as_deref()),
        status: Some(SessionStatus::Running),
        model: Some(model),
        timeout_seconds: Some(timeout.as_secs()),
        research_question: Args::text(req.research_question.as_deref()),
        belief_targeted: Args::text(req.belief_targeted.as_deref()),
        disconfirmation_target,
        sources_archived: None,
        sources_expected,
        tokens_used: None,
        cost_usd: None,
        errors: args.as_errors(now),
        handoff_notes: None,
        pr_number: None,
        reason: None,
        owner_pid: req.owner.map(|o| o.pid),
        owner_start: req.owner.and_then(|o| o.start),
        instance: req.instance.clone(),
        messages: message_ids,
        verdict: None,
        extra,
    };
    let mut report: Report = dir.load(&lock, now, &mut notes)?;
    report.agent = dir.name.to_string();
    report.status = AgentStatus::for_session(kind);
    report.current_session = Some(session_id.clone());
    report.instance = req.instance.clone();
    report.updated_at = Some(now);
    report.lifecycle = Some(Lifecycle::Alive);
    // Both files are on disk before the journal says the session started;
    // renamed in after it (journal first, for readers).
    let staged_session = dir.stage(&lock, &session)?;
    let staged_report = dir.stage(&lock, &report)?;
    // The owner takes its lock before the session is recorded as running,
    // so nobody ever sees it running with its lock free.
    let owner_lock = req.owner.and_then(|o| match owner::acquire(dir, &session_id, &o) {
        Ok(l) => Some(l),
        Err(e) => {
            notes.push(format!(
                "{}: session {session_id} has no owner lock ({e}); it counts as running until its timeout of {}",
                dir.name,
                humantime::format_duration(timeout)
            ));
            None
        }
    });
    if let Err(e) = dir.journal_append(&lock, now, start.clone()) {
        let _ = owner::release(dir, &session_id);
        return Err(e);
    }
    // One directory sync for both renames (the journal line is the commit).
    atomic::commit_all([staged_session, staged_report])?;
    // Mail the claim got to before the daemon's intake did (or with no
    // daemon): its arrival is journaled once the session has begun (never
    // between the claim and the session's start, which a crash must not
    // widen); what the intake read was journaled by it.
    let known = req.known.as_deref().map(|k| k.ids()).unwrap_or_default();
    let unseen: Vec<&inbox::Message> = claim
        .claimed
        .iter()
        .filter(|m| !known.contains(m.id.as_str()))
        .collect();
    if let Err(e) = inbox::journal_arrivals(dir, &lock, &unseen, now) {
        notes.push(format!(
            "{}: cannot journal the arrival of its messages: {e}",
            dir.name
        ));
    }

    metrics::apply(dir, &lock, &start, now, &mut notes)?;
    work_on_claimed_tasks(dir, &lock, &claim.claimed, now, &mut notes)?;

    Ok(BeginResult {
        session_id,
        joined: false,
        claim,
        bad_arguments: args.bad,
        notes,
        owner_lock,
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) fn join(
    dir: &AgentDir,
    lock: &AgentLock,
    mut session: Session,
    req: &BeginRequest,
    args: &mut Args,
    sources_expected: Option<u64>,
    now: Timestamp,
    mut notes: Vec<String>,
) -> Result<BeginResult> {
    let mut fields = Vec::new();
    let mut set = |slot: &mut Option<String>, value: Option<&str>, name: &str| {
        if let Some(v) = Args::text(value)
            && slot.as_deref() != Some(v.as_str())
        {
            *slot = Some(v);
            fields.push(name.to_string());
        }
    };
    set(&mut session.branch, req.branch.as_deref(), "branch");
    set(&mut session.model, req.model.as_deref(), "model");
    set(
        &mut session.research_question,
        req.research_question.as_deref(),
        "research_question",
    );
    set(
        &mut session.belief_targeted,
        req.belief_targeted.as_deref(),
        "belief_targeted",
    );
    let had_target = session.disconfirmation_target.is_some();
    set(
        &mut session.disconfirmation_target,
        req.disconfirmation_target.as_deref(),
        "disconfirmation_target",
    );
    if sources_expected.is_some() && session.sources_expected != sources_expected {
        session.sources_expected = sources_expected;
        fields.push("sources_expected".into());
    }
    session.errors.extend(args.as_errors(now));
    if !fields.is_empty() || !args.bad.is_empty() {
        let update = Event::SessionUpdated(SessionUpdated {
            session_id: session.session_id.clone(),
            disconfirmation_target_added: !had_target && session.disconfirmation_target.is_some(),
            fields,
        });
        dir.journal_append(lock, now, update.clone())?;
        dir.save(lock, &session)?;
        metrics::apply(dir, lock, &update, now, &mut notes)?;
    }
    Ok(BeginResult {
        session_id: session.session_id.clone(),
        joined: true,
        claim: Claim::default(),
        bad_arguments: std::mem::take(&mut args.bad),
        notes,
        owner_lock: None,
    })
}

/// `YYYYMMDD-HHMMSS`, with `-2`, `-3`, … for a second session in one second.
/// Never an id already used: ids only grow past the last one (a clock that
/// stepped back continues from the last id with a suffix), and an id whose
/// claim directory, log, prompt or owner lock exists is skipped.
pub(super) fn new_session_id(dir: &AgentDir, last: &str, now: Timestamp) -> String {
    let sessions = dir.sessions_dir();
    let taken = |id: &str| {
        last == id
            || dir.claimed(id).exists()
            || ["log", "prompt.md", "owner"].iter().any(|ext| {
                sessions
                    .join(format!("{id}.{ext}"))
                    .symlink_metadata()
                    .is_ok()
            })
    };
    let (base, first) = next_id_base(last, &now.session_id());
    (first..)
        .map(|n| match n {
            1 => base.clone(),
            n => format!("{base}-{n}"),
        })
        .find(|id| !taken(id))
        .expect("a free session id")
}

/// The second the next id is in, and the first suffix to try (1: none):
/// `now`'s, unless the last id is of that second or later (the clock went
/// back, or a second session in one second), then the last id's, after its
/// suffix. Pure.
pub(super) fn next_id_base(last: &str, now_id: &str) -> (String, u32) {
    let (last_base, last_n) = match last.get(..15) {
        Some(b) if last.len() == 15 => (b, 1),
        Some(b) => match last[15..]
            .strip_prefix('-')
            .and_then(|n| n.parse::<u32>().ok())
        {
            Some(n) => (b, n),
            None => return (now_id.to_string(), 1),
        },
        None => return (now_id.to_string(), 1),
    };
    if last_base < now_id {
        (now_id.to_string(), 1)
    } else {
        (last_base.to_string(), last_n + 1)
    }
}

/// Task messages add a pending task when received (once per message).
pub fn add_tasks_from_messages(
    dir: &AgentDir,
    lock: &AgentLock,
    messages: &[Message],
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<()> {
    // `tasks::add_all` adds a message's task once (it looks for its source
    // message under the lock), so a message seen twice adds nothing.
    let news = messages
        .iter()
        .filter(|m| m.kind == MessageType::Task)
        .map(task_from_message)
        .collect();
    tasks::add_all(dir, lock, news, now, notes)?;
    Ok(())
}

/// The tasks of the task messages a session claimed are what it works on:
/// added if they are not yet, and `active` (report.json's `current_task`).
fn work_on_claimed_tasks(
    dir: &AgentDir,
    lock: &AgentLock,
    messages: &[Message],
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<()> {
    let news = messages
        .iter()
        .filter(|m| m.kind == MessageType::Task)
        .map(task_from_message)
        .collect();
    let tasks = tasks::add_all(dir, lock, news, now, notes)?;
    // Each once: two claimed messages may name one task.
    let mut seen = std::collections::HashSet::new();
    let pending: Vec<&str> = tasks
        .iter()
        .filter(|t| t.status == tasks::TaskStatus::Pending && seen.insert(t.id.as_str()))
        .map(|t| t.id.as_str())
        .collect();
    tasks::update_all(
        dir,
        lock,
        &pending,
        tasks::TaskStatus::Active,
        None,
        now,
        notes,
    )?;
    Ok(())
}

pub fn task_from_message(m: &Message) -> NewTask {
    NewTask {
        kind: TaskType::Research,
        description: m.subject.clone(),
        priority: match m.priority {
            inbox::Priority::High => TaskPriority::High,
            inbox::Priority::Normal => TaskPriority::Medium,
        },
        context: Some(if m.body.trim().is_empty() {
            format!("From {} ({})", m.from, m.created_at.date())
        } else {
            format!(
                "From {} ({}): {}",
                m.from,
                m.created_at.date(),
                m.body.trim()
            )
        }),
        follow_up_from: m.source_ref.clone(),
        source_message: Some(m.id.clone()),
    }
}
