//! The session hooks — `session begin`, `session end`, `session fail` — as one
//! library shared by the CLI (called from session scripts) and the daemon.
//!
//! Each hook is one critical section under the agent lock and updates every
//! file the seed names: journal first (it is the source of truth), then
//! session.json, report.json, metrics.json, inbox and memory.md.
//!
//! Hooks are idempotent and forgiving: a second `begin` from the same script or
//! with `AGENT_STATE_SESSION_ID` joins the running session; a second `end`
//! is a no-op; a bad optional argument (`--pr unknown`) is recorded in
//! session.json `errors` and reported, but never costs the session record.

use std::str::FromStr;
use std::time::Duration;

use serde_json::json;

use crate::agent_name::title_case;
use crate::clock::Timestamp;
use crate::config::AgentConfig;
use crate::error::{Error, Result};
use crate::inbox::{self, Claim, Message, MessageType};
use crate::state::AgentDir;
use crate::state::atomic;
use crate::state::caps::{self, Field};
use crate::state::journal::{Event, SessionEnd, SessionFailed, SessionStart, SessionUpdated};
use crate::state::lock::AgentLock;
use crate::state::memory;
use crate::state::metrics;
use crate::state::report::{AgentStatus, LastSession, Lifecycle, Report};
use crate::state::session::{Session, SessionStatus, SessionType};
use crate::state::tasks::{self, NewTask, TaskPriority, TaskType};

/// A hook argument that could not be used, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct BadArgument {
    pub flag: &'static str,
    pub value: String,
    pub problem: String,
}

impl std::fmt::Display for BadArgument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}: {}", self.flag, self.value, self.problem)
    }
}

/// Lenient parsing of the text arguments shell scripts pass.
#[derive(Default)]
struct Args {
    bad: Vec<BadArgument>,
}

impl Args {
    fn note(&mut self, flag: &'static str, value: &str, problem: impl Into<String>) {
        self.bad.push(BadArgument {
            flag,
            value: value.to_string(),
            problem: problem.into(),
        });
    }

    /// A count such as `--sources-archived 8` (surrounding whitespace allowed).
    fn count(&mut self, flag: &'static str, value: Option<&str>) -> Option<u64> {
        let raw = value?;
        match raw.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) if raw.trim().parse::<i64>().is_ok() => {
                self.note(flag, raw, "a negative count; the field was left unset");
                None
            }
            Err(_) => {
                self.note(flag, raw, "not a whole number; the field was left unset");
                None
            }
        }
    }

    /// A PR number: `247`, `#247` or a `…/pull/247` URL.
    fn pr(&mut self, flag: &'static str, value: Option<&str>) -> Option<u64> {
        let raw = value?;
        let t = raw.trim().trim_start_matches('#');
        let t = t
            .rsplit_once("/pull/")
            .map(|(_, n)| n.trim_end_matches('/'))
            .unwrap_or(t);
        match t.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                self.note(
                    flag,
                    raw,
                    "not a PR number (247, #247 or a …/pull/247 URL); pr_number was left unset",
                );
                None
            }
        }
    }

    fn money(&mut self, flag: &'static str, value: Option<&str>) -> Option<f64> {
        let raw = value?;
        match raw.trim().trim_start_matches('$').parse::<f64>() {
            Ok(n) if n.is_finite() && n >= 0.0 => Some(n),
            Ok(n) if n < 0.0 => {
                self.note(flag, raw, "a negative amount; the field was left unset");
                None
            }
            _ => {
                self.note(
                    flag,
                    raw,
                    "not an amount in USD such as 0.42; the field was left unset",
                );
                None
            }
        }
    }

    fn duration(&mut self, flag: &'static str, value: Option<&str>) -> Option<Duration> {
        let raw = value?;
        let t = raw.trim();
        // Bare numbers are seconds, as `timeout 5400` takes them.
        let parsed = t
            .parse::<u64>()
            .map(Duration::from_secs)
            .or_else(|_| humantime::parse_duration(t));
        match parsed {
            Ok(d) if !d.is_zero() => Some(d),
            _ => {
                self.note(
                    flag,
                    raw,
                    "not a duration such as 90m or 5400; the configured timeout was used",
                );
                None
            }
        }
    }

    fn parse<T: FromStr<Err = String>>(
        &mut self,
        flag: &'static str,
        value: Option<&str>,
        fallback: &str,
    ) -> Option<T> {
        let raw = value?;
        match raw.trim().parse::<T>() {
            Ok(v) => Some(v),
            Err(e) => {
                self.note(flag, raw, format!("{e}; {fallback}"));
                None
            }
        }
    }

    fn text(value: Option<&str>) -> Option<String> {
        value
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The bad arguments as session.json `errors` entries.
    fn as_errors(&self, now: Timestamp) -> Vec<serde_json::Value> {
        self.bad
            .iter()
            .map(|b| {
                json!({
                    "at": now,
                    "code": "BAD_ARGUMENT",
                    "argument": b.flag,
                    "value": b.value,
                    "message": b.problem,
                })
            })
            .collect()
    }
}

pub use crate::owner::Owner;
use crate::owner::{self, Liveness};

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
    /// Inbox files a writer still has open (the daemon knows from its
    /// watch): left waiting, never claimed half-written.
    pub writing: inbox::Writing,
    /// What the daemon already read of the inbox's files: claimed without
    /// being read again.
    pub known: Option<std::sync::Arc<inbox::Known>>,
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
    agent: &AgentConfig,
    dir: &AgentDir,
    req: &BeginRequest,
    now: Timestamp,
) -> Result<BeginResult> {
    refuse_human(agent)?;
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut args = Args::default();
    let kind = args
        .parse::<SessionType>(
            "--type",
            req.session_type.as_deref(),
            "the configured session type was used",
        )
        .unwrap_or(agent.session.session_type);
    let timeout = args
        .duration("--timeout", req.timeout.as_deref())
        .unwrap_or(agent.session.timeout);
    let sources_expected = args.count("--sources-expected", req.sources_expected.as_deref());

    let current: Session = dir.load(&lock, now, &mut notes)?;
    let last_id = current.session_id.clone();
    // Fields other tools added are kept; what this program recorded about the
    // last session (its usage, its signal block) is not the new one's.
    let mut extra = current.extra.clone();
    for key in PER_SESSION_EXTRA {
        extra.remove(key);
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
        let why = match owner_liveness(dir, &current, agent.session.timeout, now) {
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
            let root = crate::state::StateRoot::new(dir.path.parent().unwrap_or(&dir.path));
            match crate::state::counters::next_instance(&root, dir) {
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
        agent.session.inbox_settle,
        &req.writing,
        req.known.as_deref(),
    )?;
    let message_ids: Vec<String> = claim.claimed.iter().map(|m| m.id.clone()).collect();
    let model = Args::text(req.model.as_deref()).unwrap_or_else(|| agent.session.model.clone());
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

    metrics::apply(dir, &lock, &start, now, &mut notes)?;
    add_tasks_from_messages(dir, &lock, &claim.claimed, now, &mut notes)?;

    Ok(BeginResult {
        session_id,
        joined: false,
        claim,
        bad_arguments: args.bad,
        notes,
        owner_lock,
    })
}

/// A human mailbox has no sessions.
pub fn refuse_human(agent: &AgentConfig) -> Result<()> {
    if agent.kind == crate::config::AgentKind::Human {
        return Err(Error::Usage(format!(
            "{} is a human mailbox (kind = \"human\"): it has no sessions, tasks or metrics; send it messages instead",
            agent.name
        )));
    }
    Ok(())
}

/// Is the owner of `session` (recorded as running) still there? From its
/// owner lock, never from its pid (see [`crate::owner`]); a session whose
/// lock cannot be checked is alive until its timeout (its own, or the
/// agent's `fallback` timeout when it recorded none).
pub fn owner_liveness(
    dir: &AgentDir,
    session: &Session,
    fallback: Duration,
    now: Timestamp,
) -> Liveness {
    let timeout = session
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(fallback);
    let probe = owner::probe(dir, &session.session_id);
    owner::judge(&probe, session.started_at, timeout, now)
}

/// The error that refuses a second session while `session` runs.
fn busy(session: &Session) -> Error {
    Error::SessionBusy {
        agent: session.agent.clone(),
        session: session.session_id.clone(),
        pid: session.owner_pid.unwrap_or(0),
    }
}

#[allow(clippy::too_many_arguments)]
fn join(
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
fn new_session_id(dir: &AgentDir, last: &str, now: Timestamp) -> String {
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
fn next_id_base(last: &str, now_id: &str) -> (String, u32) {
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
pub(crate) fn add_tasks_from_messages(
    dir: &AgentDir,
    lock: &AgentLock,
    messages: &[Message],
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<()> {
    // `tasks::add` adds a message's task once (it looks for its source
    // message under the lock), so a message seen twice adds nothing.
    for m in messages.iter().filter(|m| m.kind == MessageType::Task) {
        tasks::add(dir, lock, task_from_message(m), now, notes)?;
    }
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

// ---- end / fail ------------------------------------------------------------

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
}

#[derive(Debug, Clone, Default)]
pub struct FailRequest {
    pub session: Option<String>,
    pub outcome: String,
    pub reason: String,
    /// The processes the hook was called from (see [`Caller`]).
    pub caller: Caller,
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
}

/// What ended a session.
enum Ending {
    Completed(Completion),
    Failed {
        outcome: SessionStatus,
        reason: String,
        /// Count this as a failed delivery attempt of its messages. Not when
        /// the session was interrupted (its process or the daemon killed
        /// under it): a crash-looping daemon must not make messages
        /// undeliverable.
        count_attempts: bool,
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
            } => Ending::Failed {
                outcome,
                reason: caps::cap(Field::Reason, reason),
                count_attempts,
            },
        }
    }
}

#[derive(Default)]
struct Completion {
    /// What the claim read (see [`EndRequest::claimed`]).
    claimed: Option<Vec<Message>>,
    sources_archived: Option<u64>,
    branch: Option<String>,
    pr_number: Option<u64>,
    summary: Option<String>,
    next_priority: Option<String>,
    handoff_notes: Option<String>,
    tokens_used: Option<u64>,
    cost_usd: Option<f64>,
}

/// The post-session hook.
pub fn end(
    agent: &AgentConfig,
    dir: &AgentDir,
    req: &EndRequest,
    now: Timestamp,
) -> Result<FinishResult> {
    let mut args = Args::default();
    let completion = Completion {
        claimed: req.claimed.clone(),
        sources_archived: args.count("--sources-archived", req.sources_archived.as_deref()),
        branch: Args::text(req.branch.as_deref()),
        pr_number: args.pr("--pr", req.pr.as_deref()),
        summary: Args::text(req.summary.as_deref()),
        next_priority: Args::text(req.next_priority.as_deref()),
        handoff_notes: Args::text(req.handoff_notes.as_deref()),
        tokens_used: args.count("--tokens-used", req.tokens_used.as_deref()),
        cost_usd: args.money("--cost-usd", req.cost_usd.as_deref()),
    };
    let ending = match req.outcome.as_deref().map(str::trim) {
        None | Some("completed") => Ending::Completed(completion),
        Some("timeout") => Ending::Failed {
            outcome: SessionStatus::Timeout,
            reason: "reported as timeout by `session end`".into(),
            count_attempts: true,
        },
        Some("error") => Ending::Failed {
            outcome: SessionStatus::Error,
            reason: "reported as error by `session end`".into(),
            count_attempts: true,
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
        agent,
        dir,
        (req.session.as_deref(), &req.caller),
        ending,
        args,
        now,
    )
}

/// The error hook.
pub fn fail(
    agent: &AgentConfig,
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
        agent,
        dir,
        (req.session.as_deref(), &req.caller),
        Ending::Failed {
            outcome,
            reason,
            count_attempts: true,
        },
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
const PER_SESSION_EXTRA: [&str; 8] = [
    "usage",
    "signal_block",
    "workspace",
    "iterations",
    "claude_session_id",
    "claude_resumed",
    "claude_resumable",
    DAEMON_ENDING,
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
/// is the daemon's own call.
fn daemon_wins(current: &Session, ending: &Ending) -> Option<Ending> {
    let noted: DaemonEnding =
        serde_json::from_value(current.extra.get(DAEMON_ENDING)?.clone()).ok()?;
    if noted.by_pid == std::process::id() {
        return None;
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
        count_attempts: true,
    })
}

/// Put what the daemon decided in front of the reason of an ended, failed
/// session `session_id` that its script recorded first (session.json
/// `reason`, report.json `last_session.reason` and `summary`), unless the
/// reason says it already. The journal keeps what was recorded first.
pub fn amend_failure_reason(
    dir: &AgentDir,
    session_id: &str,
    decided: &str,
    now: Timestamp,
) -> Result<bool> {
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let mut session: Session = dir.load(&lock, now, &mut notes)?;
    let failed = matches!(
        session.status,
        Some(SessionStatus::Error | SessionStatus::Timeout)
    );
    let recorded = session.reason.clone().unwrap_or_default();
    if session.session_id != session_id || !failed || recorded.contains(decided) {
        return Ok(false);
    }
    let reason = if recorded.is_empty() {
        decided.to_string()
    } else {
        format!("{decided}; the session script reported: {recorded}")
    };
    session.reason = Some(reason.clone());
    let mut report: Report = dir.load(&lock, now, &mut notes)?;
    if let Some(last) = report.last_session.as_mut().filter(|l| l.id == session_id) {
        last.reason = Some(reason.clone());
        if report.current_session.is_none()
            && let Some(summary) = report.summary.as_mut()
            && summary.ends_with(&recorded)
            && summary.starts_with(&format!("Session {session_id} "))
        {
            let head = summary.len() - recorded.len();
            summary.truncate(head);
            summary.push_str(&reason);
        }
    }
    dir.save(&lock, &session)?;
    dir.save(&lock, &report)?;
    Ok(true)
}

fn finish_request(
    agent: &AgentConfig,
    dir: &AgentDir,
    (wanted, caller): (Option<&str>, &Caller),
    ending: Ending,
    mut args: Args,
    now: Timestamp,
) -> Result<FinishResult> {
    refuse_human(agent)?;
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
        && owner_liveness(dir, &current, agent.session.timeout, now) == Liveness::Alive
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
                kind: agent.session.session_type,
                domain: agent.domain.clone(),
                status: Some(SessionStatus::Running),
                model: Some(agent.session.model.clone()),
                extra: current.extra,
                ..Session::default()
            },
        }
    };
    let mut result = finish(
        agent, dir, &lock, session, ending, &mut args, now, &mut notes,
    )?;
    result.notes = notes;
    Ok(result)
}

/// Record the end of `session` in every file. Call with the lock held.
#[allow(clippy::too_many_arguments)]
fn finish(
    _agent: &AgentConfig,
    dir: &AgentDir,
    lock: &AgentLock,
    session: Session,
    ending: Ending,
    args: &mut Args,
    now: Timestamp,
    notes: &mut Vec<String>,
) -> Result<FinishResult> {
    finish_with(dir, lock, session, ending, None, args, now, notes)
}

/// [`finish`], or with `journaled` the completion of an end whose journal
/// line was written before a crash: the journal is the commit record of a
/// session's end, and what follows it (moving messages, session.json,
/// report.json, metrics) is replayed from it, never journaled twice.
#[allow(clippy::too_many_arguments)]
fn finish_with(
    dir: &AgentDir,
    lock: &AgentLock,
    mut session: Session,
    ending: Ending,
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
                outcome: "completed".into(),
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
        } => {
            let (returned, undeliverable) =
                inbox::return_claimed_counting(dir, &id, now, count_attempts)?;
            let failed = SessionFailed {
                session_id: id.clone(),
                reason: reason.clone(),
                messages_returned: returned.clone(),
                messages_undeliverable: undeliverable.clone(),
                duration_seconds: duration,
            };
            let event = match outcome {
                SessionStatus::Timeout => Event::Timeout(failed),
                _ => Event::Error(failed),
            };
            result.returned = returned;
            result.undeliverable = undeliverable;

            session.status = Some(outcome);
            session.reason = Some(reason.clone());
            // A timeout is not a fault of the agent: it goes back to idle,
            // and last_session says how the session ended and why.
            let (status, verb) = match outcome {
                SessionStatus::Timeout => (AgentStatus::Idle, "timed out"),
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
    session.errors.extend(args.as_errors(now));

    report.agent = dir.name.to_string();
    report.current_session = None;
    report.updated_at = Some(now);
    report.lifecycle = Some(if matches!(event, Event::SessionEnd(_)) {
        Lifecycle::Sleeping
    } else {
        Lifecycle::at_rest(dir)
    });
    report.last_session = Some(LastSession {
        id: id.clone(),
        started_at: session.started_at,
        ended_at: session.ended_at,
        outcome: session.status,
        sources_archived: session.sources_archived,
        branch: session.branch.clone(),
        pr_number: session.pr_number,
        reason: session.reason.clone(),
        extra: report
            .last_session
            .take()
            .map(|l| l.extra)
            .unwrap_or_default(),
    });
    // Both files are on disk before the journal records the end, renamed
    // in after it: a full disk fails the whole end, which can be retried.
    let staged_session = dir.stage(lock, &session)?;
    let staged_report = dir.stage(lock, &report)?;
    let event = match journaled {
        Some(e) => e.clone(),
        None => {
            dir.journal_append(lock, now, event.clone())?;
            event
        }
    };
    if matches!(event, Event::SessionEnd(_)) {
        inbox::acknowledge(dir, &id)?;
        memory::append_entries(&dir.memory(), memory::FLAGS_SECTION, &memory_lines)?;
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

/// If `agent`'s session.json says a session is running but its owner is gone,
/// record it as an error ("interrupted") and return its messages to the inbox.
/// Used by `check --repair` (and, later, by the daemon at start-up).
pub fn recover_stale(
    agent: &AgentConfig,
    dir: &AgentDir,
    reason: &str,
    now: Timestamp,
) -> Result<Option<FinishResult>> {
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let current: Session = dir.load(&lock, now, &mut notes)?;
    if !current.is_running() {
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
    let why = match owner_liveness(dir, &current, agent.session.timeout, now) {
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
    let mut result = finish(
        agent,
        dir,
        &lock,
        current,
        Ending::Failed {
            outcome: SessionStatus::Error,
            reason: format!("{reason} ({why})"),
            // Its owner (the daemon, a script) was killed under it: not a
            // failure of its messages.
            count_attempts: false,
        },
        &mut Args::default(),
        now,
        &mut notes,
    )?;
    result.notes = notes;
    Ok(Some(result))
}

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
    let by_script = match journaled_end(dir, session_id)?.map(|e| e.event) {
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
        if let Some(b) = &from_output.blocked_by {
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

/// The journal entry that ended session `id`, if its end was journaled
/// (searched back to its start).
fn journaled_end(dir: &AgentDir, id: &str) -> Result<Option<crate::state::journal::Entry>> {
    let mut found = None;
    crate::state::journal::scan_backwards(&dir.journal(), |e| {
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

/// Complete a journaled end (see [`finish_with`]), at the time it was journaled.
fn replay_end(
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
            count_attempts: true,
        },
        Event::Error(f) => Ending::Failed {
            outcome: SessionStatus::Error,
            reason: f.reason.clone(),
            count_attempts: true,
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
        ending,
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

/// Is `session` recorded as running with an owner that is gone? Why, if so.
pub fn stale(
    dir: &AgentDir,
    session: &Session,
    fallback: Duration,
    now: Timestamp,
) -> Option<String> {
    if !session.is_running() {
        return None;
    }
    match owner_liveness(dir, session, fallback, now) {
        Liveness::Alive => None,
        Liveness::Gone(why) => Some(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_never_go_back() {
        let now = "20260101-100000";
        assert_eq!(next_id_base("", now), (now.to_string(), 1));
        assert_eq!(next_id_base("20260101-090000", now), (now.to_string(), 1));
        // A second session in the same second.
        assert_eq!(next_id_base(now, now), (now.to_string(), 2));
        assert_eq!(next_id_base("20260101-100000-7", now), (now.to_string(), 8));
        // The clock stepped back an hour: continue after the last id.
        assert_eq!(
            next_id_base("20260101-110000", now),
            ("20260101-110000".to_string(), 2)
        );
        assert_eq!(
            next_id_base("20260101-110000-3", now),
            ("20260101-110000".to_string(), 4)
        );
    }

    #[test]
    fn shell_style_arguments() {
        let mut a = Args::default();
        assert_eq!(a.count("--sources-archived", Some("8\n")), Some(8));
        assert_eq!(a.count("--sources-archived", Some("0\n0")), None);
        assert_eq!(a.pr("--pr", Some("#247")), Some(247));
        assert_eq!(
            a.pr("--pr", Some("https://github.com/o/r/pull/12")),
            Some(12)
        );
        assert_eq!(a.pr("--pr", Some("unknown")), None);
        assert_eq!(
            a.duration("--timeout", Some("5400")),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            a.duration("--timeout", Some("90m")),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(a.money("--cost-usd", Some("$0.42")), Some(0.42));
        let flags: Vec<_> = a.bad.iter().map(|b| b.flag).collect();
        assert_eq!(flags, ["--sources-archived", "--pr"]);
    }
}
