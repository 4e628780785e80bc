//! `journal.jsonl`: the append-only event log of an agent, and the source of
//! truth that metrics, reports and tasks can be rebuilt from.
//!
//! Appends are one whole line per `write(2)` on an `O_APPEND` descriptor,
//! fsynced. A crash can leave a torn last line; the next append starts on a
//! fresh line, and readers skip torn lines and count them, never fail on them.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::session::{SessionStatus, SessionType, SessionVerdict};
use super::store::Store;
use super::words::{TaskPriority, TaskStatus, TaskType};
use crate::clock::Timestamp;
use crate::error::{IoContext, Result};
use crate::string_enum::string_enum;

/// The `type` of an inbox message (`inbox::MessageType`), as messages
/// and the journal's `message_sent` events record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageType {
    Flag,
    Task,
    Question,
    Cascade,
}
string_enum!(
    MessageType,
    "message type",
    Flag = "flag",
    Task = "task",
    Question = "question",
    Cascade = "cascade"
);

/// One journal line: a time and an event.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub ts: Timestamp,
    #[serde(flatten)]
    pub event: Event,
}

/// Every event this crate writes. Events written by other tools (an agent's
/// own `orient_complete`, say) read as [`Event::Other`] and are kept in the
/// file untouched.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Bootstrap(Bootstrap),
    SessionStart(SessionStart),
    SessionUpdated(SessionUpdated),
    SessionEnd(SessionEnd),
    Error(SessionFailed),
    Timeout(SessionFailed),
    TaskAdded(TaskAdded),
    TaskUpdated(TaskUpdated),
    MessageSent(MessageSent),
    MessageReceived(MessageReceived),
    MessageRejected(MessageRejected),
    MessageRetried(MessageRetried),
    MessageExpired(MessageExpired),
    MessageAcknowledged(MessageAcknowledged),
    Record(Record),
    StateRepaired(StateRepaired),
    WakeSkipped(WakeSkipped),
    ScheduleMissed(ScheduleMissed),
    Signal(SignalSeen),
    PromptCut(PromptCut),
    SessionUsage(SessionUsage),
    UsageLimit(UsageLimitHit),
    SessionVerdict(VerdictAmended),
    IterationStart(IterationStart),
    IterationEnd(IterationEnd),
    #[serde(other)]
    Other,
}

/// An iteration of a session's verify loop starts (the second and later:
/// the first is the session's start), with the verification's feedback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IterationStart {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub n: u32,
    pub of: u32,
}

/// An iteration's verification ended: `verify` is `passed` or `failed`,
/// with the failed command and how it ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IterationEnd {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub n: u32,
    pub of: u32,
    pub verify: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The daemon's verdict on a session whose end its script recorded first
/// (`session fail` from the script's trap, before the daemon saw the
/// output): the end counts as `verdict`, not as what was recorded (`was`).
/// A usage limit found in the output of a session its script failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerdictAmended {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub was: SessionVerdict,
    pub verdict: SessionVerdict,
}

/// What a session used, as its agent's output reported it (Claude Code's
/// result: tokens by kind, cost), journaled by the daemon after the end.
/// `agent-state usage` and the budgets add these up; a session whose
/// `session_end` carries `tokens_used`/`cost_usd` (from the script) and has
/// no `session_usage` line is counted from those.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionUsage {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    /// Every token of the session (the four above added up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<u64>,
    /// What the output reported (for a subscription login, what the same
    /// use would cost through the API: nothing is billed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// The prompt of a session was over its budget: what was left out.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PromptCut {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub section: String,
    pub bytes_dropped: usize,
    pub reason: String,
}

impl Event {
    /// What the session this event ends counts as (`session_end`,
    /// `error`, `timeout`; see [`SessionFailed::verdict_of`]).
    pub fn verdict(&self) -> Option<SessionVerdict> {
        match self {
            Event::SessionEnd(_) => Some(SessionVerdict::Completed),
            Event::Timeout(f) => Some(f.verdict_of(SessionStatus::Timeout)),
            Event::Error(f) => Some(f.verdict_of(SessionStatus::Error)),
            _ => None,
        }
    }

    /// The session this event ends (`session_end`, `error`, `timeout`).
    pub fn ended_session(&self) -> Option<&str> {
        match self {
            Event::SessionEnd(e) => Some(&e.session_id),
            Event::Error(f) | Event::Timeout(f) => Some(&f.session_id),
            _ => None,
        }
    }
}

/// A valid agent signal (`<axiom>TYPE:payload</axiom>`) seen in a session's
/// output, and what the daemon did with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SignalSeen {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// What it led to ("report.json progress = 40", "flag sent to 5 agents").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

/// A wake (schedule, inbox, manual) came while the agent's session ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WakeSkipped {
    pub reason: String,
    /// The session that was running (empty when another cause skipped it).
    #[serde(default)]
    pub running_session: String,
    /// Why, when it was not a running session: `budget`, `no_work`,
    /// `usage_limit`, `credential`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<SkipCause>,
    /// The budget or condition, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When a wake that waits (mail, a manual wake) is tried again: the
    /// budget's next day, the hold's end. Absent: when something clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

/// Why a wake did not start a session, when no session of the agent ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipCause {
    /// A daily budget (the agent's or the fleet's) is spent.
    Budget,
    /// `wake_if` found nothing to do.
    NoWork,
    /// The credential waits for a usage limit (or an admin's cap).
    UsageLimit,
    /// The credential's login failed.
    Credential,
    /// The agent's command does not exist (`AGENT_NOT_FOUND`): held until
    /// it can run; nothing was claimed.
    AgentNotFound,
    /// The agent's command is not executable (`AGENT_PERMISSION_DENIED`).
    AgentPermissionDenied,
    /// A cause written by a later version.
    #[serde(other)]
    Other,
}

impl SkipCause {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipCause::Budget => "budget",
            SkipCause::NoWork => "no_work",
            SkipCause::UsageLimit => "usage_limit",
            SkipCause::Credential => "credential",
            SkipCause::AgentNotFound => "agent_not_found",
            SkipCause::AgentPermissionDenied => "agent_permission_denied",
            SkipCause::Other => "other",
        }
    }

    /// Does it refuse a wake that waits for it to pass (a budget, a hold),
    /// rather than find nothing to do?
    pub fn refuses(self) -> bool {
        matches!(
            self,
            SkipCause::Budget | SkipCause::UsageLimit | SkipCause::Credential
        )
    }

    /// Does it say the agent cannot start at all until someone fixes its
    /// command (not a refusal that passes by itself)?
    pub fn cannot_start(self) -> bool {
        matches!(
            self,
            SkipCause::AgentNotFound | SkipCause::AgentPermissionDenied
        )
    }
}

/// A session hit a usage or rate limit: the agents of its credential are
/// held (`hold_until`), or, for an admin's cap, until a session succeeds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UsageLimitHit {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    /// `usage_limit`, `extra_usage_exhausted`, `api_rate_limit`, `admin_disabled`.
    pub kind: String,
    pub credential: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_until: Option<Timestamp>,
    pub evidence: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Scheduled runs missed while the daemon was down, too long ago to catch up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScheduleMissed {
    pub scheduled: Timestamp,
    pub count: u32,
    pub catch_up_window: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Bootstrap {
    pub created: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionStart {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    #[serde(rename = "type")]
    pub kind: SessionType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub research_question: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconfirmation_target: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_pid: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// A script joined a running session and added fields to it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionUpdated {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    #[serde(default)]
    pub fields: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disconfirmation_target_added: bool,
}

fn completed() -> SessionStatus {
    SessionStatus::Completed
}

/// A `session_end` line's `outcome`: the word when it is a known end
/// (`completed`, `timeout`, `error`), else `completed` (what the event
/// itself says; see [`Event::verdict`]).
fn lenient_end_outcome<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<SessionStatus, D::Error> {
    let word = serde_json::Value::deserialize(d)?;
    Ok(match word.as_str().map(str::parse::<SessionStatus>) {
        Some(Ok(s)) if s != SessionStatus::Running => s,
        _ => SessionStatus::Completed,
    })
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionEnd {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    /// Always `completed` as written (a `session_end` line is a completed
    /// end; errors and timeouts are their own events). Read leniently: a
    /// missing or unknown word in a journal is `completed`, never a torn line.
    #[serde(default = "completed", deserialize_with = "lenient_end_outcome")]
    pub outcome: SessionStatus,
    #[serde(default)]
    pub sources_archived: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_priority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages_processed: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub flags_received: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<i64>,
}

impl Default for SessionEnd {
    fn default() -> Self {
        SessionEnd {
            session_id: Default::default(),
            outcome: SessionStatus::Completed,
            sources_archived: Default::default(),
            handoff: Default::default(),
            summary: Default::default(),
            next_priority: Default::default(),
            branch: Default::default(),
            pr_number: Default::default(),
            tokens_used: Default::default(),
            cost_usd: Default::default(),
            messages_processed: Default::default(),
            flags_received: Default::default(),
            duration_seconds: Default::default(),
        }
    }
}

/// The `error` and `timeout` events.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionFailed {
    #[serde(deserialize_with = "crate::session_id::de")]
    pub session_id: String,
    pub reason: String,
    /// The catalogue code the daemon judged the failure by
    /// (`AGENT_NOT_FOUND`, `SESSION_TIMEOUT`, …), in the line that commits
    /// the end: `wake --wait` tells from it, and from nothing written later,
    /// whether the session it asked for could start. None from a script's
    /// own `session fail` and in lines written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What the end counts as, when the event's name does not say it:
    /// `usage_limit` on an `error` line (see [`SessionVerdict`]). Absent
    /// for the agent's own failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<SessionVerdict>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages_returned: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages_undeliverable: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<i64>,
}

impl SessionFailed {
    /// What this `error` or `timeout` line counts as: its `verdict`; in a
    /// line written before the field existed, what its catalogue code says
    /// (a daemon's `USAGE_LIMIT` end was journaled with that code).
    pub fn verdict_of(&self, status: SessionStatus) -> SessionVerdict {
        match self.verdict {
            Some(SessionVerdict::UsageLimit) => SessionVerdict::UsageLimit,
            _ => SessionVerdict::of_failure(
                status,
                self.code.as_deref().and_then(crate::catalogue::Code::parse),
            ),
        }
    }

    /// An operator stopped the session (`agent-state stop`, code
    /// `SESSION_STOPPED`): not a failure of the agent, and not one of its
    /// messages' delivery attempts.
    pub fn is_stop(&self) -> bool {
        crate::catalogue::stopped(self.code.as_deref())
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskAdded {
    pub task_id: String,
    #[serde(rename = "type")]
    pub kind: TaskType,
    pub description: String,
    pub priority: TaskPriority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_up_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_message: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TaskUpdated {
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessageSent {
    pub message_id: String,
    pub to: String,
    #[serde(rename = "type")]
    pub kind: MessageType,
    pub subject: String,
}

/// A message arrived in this agent's inbox (written once per message by
/// whoever saw it first: the daemon's intake or a session's claim), so the
/// recipient's journal shows its side of the conversation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessageReceived {
    pub message_id: String,
    /// What the message says it is from: a label its writer chose.
    pub from: String,
    #[serde(rename = "type")]
    pub kind: MessageType,
    pub priority: String,
    pub subject: String,
    /// Addition: who owned the file it arrived in (the kernel's word for
    /// who wrote it: a user name, or `uid N` without a passwd entry); absent
    /// when it was not read from a file of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MessageRejected {
    pub file: String,
    pub reason: String,
    pub moved_to: String,
}

/// A rejected file was completed and became valid: moved back to the inbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MessageRetried {
    pub file: String,
    pub from: String,
    pub reason: String,
}

/// A waiting message a person marked handled (`inbox ack`): moved to
/// `processed/` without a session.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MessageAcknowledged {
    pub message_id: String,
    pub file: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MessageExpired {
    pub message_id: String,
    pub file: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    pub claims_proposed: u64,
    pub claims_accepted: u64,
    pub claims_challenged: u64,
    pub claims_rejected: u64,
    pub disconfirmation_hits: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StateRepaired {
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_aside_as: Option<String>,
    pub rebuilt_from: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Entry {
    pub fn new(ts: Timestamp, event: Event) -> Entry {
        Entry { ts, event }
    }

    pub fn to_line(&self) -> Vec<u8> {
        // serde_json escapes newlines inside strings, so this is one line.
        let mut line = serde_json::to_vec(self).expect("journal entries always serialize");
        line.push(b'\n');
        line
    }
}

/// Append one entry as one whole line, durably. Call with the agent lock held.
pub fn append(store: &Store, path: &Path, entry: &Entry) -> Result<()> {
    append_lines(store, path, &entry.to_line())
}

/// Append already-formatted whole lines in one write (once more after
/// `ENOSPC` and pruning, or after `EIO`: see [`super::atomic::retrying`]; a
/// failed attempt leaves at most a torn line, which readers skip and the
/// next append starts after).
pub fn append_lines(store: &Store, path: &Path, lines: &[u8]) -> Result<()> {
    super::atomic::retrying(store, || append_lines_once(path, lines, true))
}

/// [`append`] without the sync: for a caller that makes the file system
/// durable itself before anyone is told (the batched bootstrap's `syncfs`).
pub fn append_unsynced(path: &Path, entry: &Entry) -> Result<()> {
    append_lines_once(path, &entry.to_line(), false)
}

fn append_lines_once(path: &Path, lines: &[u8], sync: bool) -> Result<()> {
    // Never through a link, never a FIFO (a reader-less FIFO would block,
    // one with a reader would swallow the line).
    let mut file = crate::fsx::open_append(path, 0o644)?;
    let len = file.metadata().at("reading journal", path)?.len();
    let mut buf = Vec::with_capacity(lines.len() + 1);
    // A crash can leave a torn last line without its newline; start on a
    // fresh line so this entry does not get glued to it.
    if len > 0 && !ends_with_newline(&file, len).at("reading journal", path)? {
        buf.push(b'\n');
    }
    buf.extend_from_slice(lines);
    file.write_all(&buf).at("appending to journal", path)?;
    if !sync {
        return Ok(());
    }
    file.sync_data().at("syncing journal", path)?;
    if len == 0 {
        super::atomic::sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    }
    Ok(())
}

/// Does the journal end in a torn line (no final newline)? False for a
/// missing or empty journal, or one that cannot be read.
pub fn ends_torn(path: &Path) -> bool {
    let Ok(Some(f)) = crate::fsx::open_read(path) else {
        return false;
    };
    f.metadata()
        .and_then(|m| Ok(m.len() > 0 && !ends_with_newline(&f, m.len())?))
        .unwrap_or(false)
}

fn ends_with_newline(file: &File, len: u64) -> io::Result<bool> {
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1)?;
    Ok(last[0] == b'\n')
}

/// What reading a journal found.
#[derive(Debug, Default)]
pub struct Scan {
    pub entries: Vec<Entry>,
    /// Lines that are not JSON at all (a crash mid-write, a bad hand edit).
    pub torn: Vec<TornLine>,
    /// Lines that are JSON but not a readable event (wrong field types).
    pub unreadable: Vec<TornLine>,
    pub lines: usize,
    /// What the live file's rotation marker carries past the segments
    /// retention may have removed ([`super::rotation::Marker::carried`]).
    pub carried: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct TornLine {
    /// 1-based line number.
    pub line: usize,
    pub text: String,
}

/// Read every entry of the journal's whole history: its rotated segments
/// (see [`super::rotation`]), then the live file. Torn and unreadable lines
/// are counted in the live file only (their line numbers are the live
/// file's: what `check` reports and repairs); a segment's are skipped, and
/// so is a bad segment ([`super::rotation::read_segment_or_skip`]). A
/// missing journal is an empty one.
pub fn read(store: &Store, path: &Path) -> Result<Scan> {
    let file = crate::fsx::open_read(path)?;
    let mut scan = Scan::default();
    let base = match &file {
        Some(f) => match super::rotation::head_marker(f).at("reading journal", path)? {
            Some(marker) => {
                scan.carried = marker.carried;
                marker.offset
            }
            None => 0,
        },
        None => u64::MAX,
    };
    for segment in super::rotation::segments(path, base)? {
        let Some(bytes) = super::rotation::read_segment_or_skip(store, &segment)? else {
            continue;
        };
        scan_lines(&bytes[..], &mut scan, false).at("reading", &segment.path)?;
    }
    if let Some(file) = file {
        scan_lines(BufReader::new(file), &mut scan, true).at("reading journal", path)?;
    }
    Ok(scan)
}

/// The highest `task-N` number a `task_added` event of the live file at
/// `path` names (0: none), for the rotation marker's carried number. Only
/// lines that mention the event are parsed; an unreadable one is skipped.
pub fn highest_task_added(path: &Path) -> Result<u64> {
    let Some(file) = crate::fsx::open_read(path)? else {
        return Ok(0);
    };
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let mut raw = Vec::new();
    let mut highest = 0u64;
    loop {
        raw.clear();
        let (n, overlong) =
            read_line_capped(&mut reader, &mut raw, MAX_LINE).at("reading journal", path)?;
        if n == 0 {
            break;
        }
        if overlong || !raw.windows(12).any(|w| w == b"\"task_added\"") {
            continue;
        }
        if let Ok(Entry {
            event: Event::TaskAdded(t),
            ..
        }) = serde_json::from_slice::<Entry>(&raw)
            && let Some(number) = t
                .task_id
                .strip_prefix("task-")
                .and_then(|n| n.parse::<u64>().ok())
        {
            highest = highest.max(number);
        }
    }
    Ok(highest)
}

/// Parse the lines of `reader` into `scan`; with `count`, torn and
/// unreadable lines are recorded with their line numbers.
fn scan_lines(mut reader: impl BufRead, scan: &mut Scan, count: bool) -> io::Result<()> {
    let mut raw = Vec::new();
    let mut line = 0;
    loop {
        raw.clear();
        let (n, overlong) = read_line_capped(&mut reader, &mut raw, MAX_LINE)?;
        if n == 0 {
            break;
        }
        line += 1;
        if count {
            scan.lines += 1;
        }
        if overlong {
            if count {
                scan.torn.push(TornLine {
                    line,
                    text: format!("(a line of {n} bytes, over the limit of {MAX_LINE})"),
                });
            }
            continue;
        }
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Entry>(text) {
            Ok(entry) => scan.entries.push(entry),
            Err(_) if !count => {}
            Err(_) => {
                let torn = TornLine {
                    line,
                    text: text.chars().take(200).collect(),
                };
                if serde_json::from_str::<serde_json::Value>(text).is_ok() {
                    scan.unreadable.push(torn);
                } else {
                    scan.torn.push(torn);
                }
            }
        }
    }
    Ok(())
}

/// Visit entries from the newest back, until `visit` says stop. Reads the
/// file backwards in blocks, so the cost is what is visited, not the size of
/// the journal. Unreadable lines are skipped.
pub fn scan_backwards(
    store: &Store,
    path: &Path,
    visit: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<()> {
    scan_entries_backwards(store, path, |_| true, visit)
}

/// [`scan_backwards`] through the lines that mention `kind` (an event's
/// name, e.g. `session_start`) only: the others (an agent's thousands of
/// `message_received` between two sessions) are passed over without being
/// parsed. A line that mentions it elsewhere (a subject) is parsed and
/// visited like any other, so `visit` still matches on the event. So is a
/// line with a JSON `\u` escape (an event name written escaped, by hand).
pub fn scan_backwards_for(
    store: &Store,
    path: &Path,
    kind: &str,
    visit: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<()> {
    let finder = memchr::memmem::Finder::new(kind.as_bytes());
    let escape = memchr::memmem::Finder::new(b"\\u");
    let wanted = |line: &[u8]| finder.find(line).is_some() || escape.find(line).is_some();
    scan_entries_backwards(store, path, wanted, visit)
}

/// The entries of the lines `wanted` lets through, newest first: rotation
/// markers and unreadable lines skipped.
fn scan_entries_backwards(
    store: &Store,
    path: &Path,
    wanted: impl Fn(&[u8]) -> bool,
    mut visit: impl FnMut(Entry) -> ControlFlow<()>,
) -> Result<()> {
    scan_lines_backwards(store, path, |line| {
        // A rotation marker says where a rotation happened: not an event
        // of the agent's.
        if !wanted(line) || super::rotation::is_marker(line) {
            return ControlFlow::Continue(());
        }
        match serde_json::from_slice::<Entry>(line) {
            Ok(entry) => visit(entry),
            Err(_) => ControlFlow::Continue(()),
        }
    })
}

/// Visit the raw lines of a JSON-lines log from the last back (without
/// their newline; empty lines included), until `visit` says stop: the live
/// file, then its rotated segments newest first (see
/// [`super::rotation`]; a segment is decompressed only when the visit
/// reaches it, and a bad one is skipped).
pub fn scan_lines_backwards(
    store: &Store,
    path: &Path,
    mut visit: impl FnMut(&[u8]) -> ControlFlow<()>,
) -> Result<()> {
    let base = match crate::fsx::open_read(path)? {
        Some(file) => {
            if scan_file_backwards(&file, path, &mut visit)?.is_break() {
                return Ok(());
            }
            super::rotation::base_of(&file).at("reading journal", path)?
        }
        None => u64::MAX,
    };
    for segment in super::rotation::segments(path, base)?.iter().rev() {
        let Some(bytes) = super::rotation::read_segment_or_skip(store, segment)? else {
            continue;
        };
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        if body.is_empty() {
            continue;
        }
        for line in body.split(|b| *b == b'\n').rev() {
            if line.len() as u64 <= MAX_LINE && visit(line).is_break() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// [`scan_lines_backwards`] over one open file, in blocks from its end.
fn scan_file_backwards(
    file: &File,
    path: &Path,
    visit: &mut impl FnMut(&[u8]) -> ControlFlow<()>,
) -> Result<ControlFlow<()>> {
    const BLOCK: u64 = 64 * 1024;
    let mut pos = file.metadata().at("reading journal", path)?.len();
    // Bytes after `pos` that do not yet form a whole line (read, not visited).
    let mut carry: Vec<u8> = Vec::new();
    while pos > 0 {
        let start = pos.saturating_sub(BLOCK);
        let mut block = vec![0u8; (pos - start) as usize];
        file.read_exact_at(&mut block, start)
            .at("reading journal", path)?;
        block.extend_from_slice(&carry);
        pos = start;
        // A "line" longer than any event (a hostile or broken file) is
        // skipped, not held in memory.
        if block.len() as u64 > MAX_LINE + BLOCK && !block.contains(&b'\n') {
            carry.clear();
            continue;
        }
        // The first piece may be the tail of a line that starts earlier.
        let first_newline = if pos == 0 {
            None
        } else {
            block.iter().position(|b| *b == b'\n')
        };
        let (head, lines) = match first_newline {
            Some(i) => block.split_at(i + 1),
            None if pos == 0 => (&[][..], &block[..]),
            None => {
                carry = block;
                continue;
            }
        };
        for line in lines.split(|b| *b == b'\n').rev() {
            if visit(line).is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        carry = head.to_vec();
    }
    Ok(ControlFlow::Continue(()))
}

/// The longest journal line read: far over any event this crate writes
/// (texts are capped); a longer one is counted as torn and skipped, so a
/// file without newlines cannot exhaust memory.
pub const MAX_LINE: u64 = 4 << 20;

/// `read_until(b'\n')` that keeps at most `cap` bytes of a line (the rest
/// is read and dropped). Returns the line's full length and whether it was
/// over the cap.
fn read_line_capped(
    r: &mut impl BufRead,
    out: &mut Vec<u8>,
    cap: u64,
) -> io::Result<(usize, bool)> {
    let mut total = 0usize;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok((total, total as u64 > cap));
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if (out.len() as u64) < cap {
            let room = (cap as usize).saturating_sub(out.len()).min(take);
            out.extend_from_slice(&buf[..room]);
        }
        total += take;
        r.consume(take);
        if done {
            return Ok((total, total as u64 > cap));
        }
    }
}

/// How far past the time it looks for a backward scan of a journal goes
/// before it stops: a journal's times are nearly ordered (concurrent writers
/// may interleave within a second).
pub const OUT_OF_ORDER_SLACK: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Entries with `ts >= since`, oldest first, read from the end of the file,
/// until a line [`OUT_OF_ORDER_SLACK`] older than `since`.
pub fn read_since(store: &Store, path: &Path, since: Timestamp) -> Result<Vec<Entry>> {
    let stop_before = since.minus(OUT_OF_ORDER_SLACK);
    let mut entries = Vec::new();
    scan_backwards(store, path, |e| {
        if e.ts < stop_before {
            return ControlFlow::Break(());
        }
        if e.ts >= since {
            entries.push(e);
        }
        ControlFlow::Continue(())
    })?;
    entries.reverse();
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_end_outcome_is_read_leniently_and_written_as_its_word() {
        let table = [
            (
                r#"{"session_id":"a","outcome":"completed"}"#,
                SessionStatus::Completed,
            ),
            (
                r#"{"session_id":"a","outcome":"timeout"}"#,
                SessionStatus::Timeout,
            ),
            (
                r#"{"session_id":"a","outcome":"error"}"#,
                SessionStatus::Error,
            ),
            (
                r#"{"session_id":"a","outcome":"running"}"#,
                SessionStatus::Completed,
            ),
            (
                r#"{"session_id":"a","outcome":"finished"}"#,
                SessionStatus::Completed,
            ),
            (
                r#"{"session_id":"a","outcome":null}"#,
                SessionStatus::Completed,
            ),
            (r#"{"session_id":"a"}"#, SessionStatus::Completed),
        ];
        for (line, want) in table {
            let end: SessionEnd = serde_json::from_str(line).expect(line);
            assert_eq!(end.outcome, want, "{line}");
        }
        let written = serde_json::to_value(SessionEnd::default()).unwrap();
        assert_eq!(written["outcome"], "completed");
    }

    /// Only lines mentioning the event are parsed: the last session_start
    /// is found past thousands of arrivals, one of whose subjects mentions
    /// it (visited, and passed over by the match); one written with its
    /// name escaped is found too.
    #[test]
    fn a_scan_for_an_event_finds_it_past_other_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let ts = Timestamp::parse("2026-11-29T14:00:00Z").unwrap();
        let start = |id: &str| {
            Entry::new(
                ts,
                Event::SessionStart(SessionStart {
                    session_id: id.into(),
                    ..SessionStart::default()
                }),
            )
            .to_line()
        };
        let arrival = |subject: &str| {
            Entry::new(
                ts,
                Event::MessageReceived(MessageReceived {
                    message_id: "m".into(),
                    from: "leo".into(),
                    kind: MessageType::Flag,
                    priority: "normal".into(),
                    subject: subject.into(),
                    sender: None,
                }),
            )
            .to_line()
        };
        let mut text = start("20261129-120000");
        text.extend(start("20261129-130000"));
        for i in 0..3000 {
            text.extend(arrival(&format!("note {i}")));
        }
        let escaped = String::from_utf8(start("20261129-135000"))
            .unwrap()
            .replace("\"session_start\"", "\"session\\u005fstart\"");
        assert!(escaped.contains("\\u005f"), "{escaped}");
        text.extend(escaped.into_bytes());
        text.extend(arrival("about session_start"));
        text.extend(arrival("later"));
        std::fs::write(&path, &text).unwrap();
        let (mut visited, mut found) = (0, None);
        scan_backwards_for(
            &crate::state::Store::default(),
            &path,
            "session_start",
            |e| {
                visited += 1;
                match e.event {
                    Event::SessionStart(s) => {
                        found = Some(s.session_id);
                        ControlFlow::Break(())
                    }
                    _ => ControlFlow::Continue(()),
                }
            },
        )
        .unwrap();
        assert_eq!(found.as_deref(), Some("20261129-135000"));
        assert_eq!(visited, 2, "the subject's mention and the escaped start");
    }

    #[test]
    fn lines_look_like_the_seed() {
        let e = Entry::new(
            Timestamp::parse("2026-03-31T20:30:00Z").unwrap(),
            Event::SessionStart(SessionStart {
                session_id: "20260331-220000".into(),
                kind: SessionType::Research,
                ..SessionStart::default()
            }),
        );
        assert_eq!(
            String::from_utf8(e.to_line()).unwrap(),
            "{\"ts\":\"2026-03-31T20:30:00Z\",\"event\":\"session_start\",\"session_id\":\"20260331-220000\",\"type\":\"research\"}\n"
        );
    }

    #[test]
    fn foreign_events_read_as_other() {
        let line = r#"{"ts":"2026-03-31T20:35:00Z","event":"orient_complete","files_read":["identity.md"]}"#;
        let e: Entry = serde_json::from_str(line).unwrap();
        assert!(matches!(e.event, Event::Other));
    }

    #[test]
    fn torn_lines_are_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let good = Entry::new(Timestamp::now(), Event::Record(Record::default()));
        append(&crate::state::Store::default(), &path, &good).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"ts\":\"2026-03-31T20:35:00Z\",\"ev")
            .unwrap();
        append(&crate::state::Store::default(), &path, &good).unwrap();
        let scan = read(&crate::state::Store::default(), &path).unwrap();
        assert_eq!(scan.entries.len(), 2);
        assert_eq!(scan.torn.len(), 1);
        assert_eq!(scan.torn[0].line, 2);
    }

    #[test]
    fn backwards_scans_see_every_line_across_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let base = Timestamp::parse("2026-01-01T00:00:00Z").unwrap();
        // Enough lines, of uneven length, to span several 64 KiB blocks.
        let mut text = Vec::new();
        for i in 0..5000u64 {
            let e = Entry::new(
                base.plus(std::time::Duration::from_secs(i * 3600)),
                Event::Record(Record {
                    claims_proposed: i,
                    ..Record::default()
                }),
            );
            text.extend_from_slice(&e.to_line());
            if i % 7 == 0 {
                text.extend_from_slice(b"{\"torn\n");
            }
        }
        std::fs::write(&path, &text).unwrap();
        let mut seen = Vec::new();
        scan_backwards(&crate::state::Store::default(), &path, |e| {
            if let Event::Record(r) = e.event {
                seen.push(r.claims_proposed);
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(seen, (0..5000).rev().collect::<Vec<_>>());

        let since = base.plus(std::time::Duration::from_secs(4990 * 3600));
        let tail = read_since(&crate::state::Store::default(), &path, since).unwrap();
        let got: Vec<u64> = tail
            .iter()
            .map(|e| match &e.event {
                Event::Record(r) => r.claims_proposed,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(got, (4990..5000).collect::<Vec<_>>());
    }

    #[test]
    fn every_reader_sees_the_history_across_rotations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let base = Timestamp::parse("2026-01-01T00:00:00Z").unwrap();
        let record = |i: u64| {
            Entry::new(
                base.plus(std::time::Duration::from_secs(i * 3600)),
                Event::Record(Record {
                    claims_proposed: i,
                    ..Record::default()
                }),
            )
        };
        // 300 entries, rotated after every 100, the last segment closing
        // a torn line.
        for i in 0..300u64 {
            append(&crate::state::Store::default(), &path, &record(i)).unwrap();
            if i % 100 == 99 {
                if i == 199 {
                    std::fs::OpenOptions::new()
                        .append(true)
                        .open(&path)
                        .unwrap()
                        .write_all(b"{\"torn")
                        .unwrap();
                }
                // Rotated long before the entries (a clock set back): the
                // marker's time must not end a backward scan.
                crate::state::rotation::rotate_if_over(
                    &crate::state::Store::default(),
                    &path,
                    10,
                    base.minus(std::time::Duration::from_secs(86_400 * 30)),
                )
                .unwrap();
            }
        }
        append(&crate::state::Store::default(), &path, &record(300)).unwrap();
        let numbers = |entries: &[Entry]| -> Vec<u64> {
            entries
                .iter()
                .filter_map(|e| match &e.event {
                    Event::Record(r) => Some(r.claims_proposed),
                    _ => None,
                })
                .collect()
        };
        let scan = read(&crate::state::Store::default(), &path).unwrap();
        assert_eq!(numbers(&scan.entries), (0..=300).collect::<Vec<_>>());
        assert!(
            scan.torn.is_empty(),
            "a segment's torn line is not the live file's"
        );
        let mut back = Vec::new();
        scan_backwards(&crate::state::Store::default(), &path, |e| {
            back.push(e);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(numbers(&back), (0..=300).rev().collect::<Vec<_>>());
        // A window that reaches into the second segment.
        let since = base.plus(std::time::Duration::from_secs(150 * 3600));
        assert_eq!(
            numbers(&read_since(&crate::state::Store::default(), &path, since).unwrap()),
            (150..=300).collect::<Vec<_>>()
        );
        // Stopping early decompresses nothing it does not reach: the
        // newest entry comes from the live file even with the segments gone.
        for seg in crate::state::rotation::segments(&path, u64::MAX).unwrap() {
            std::fs::write(&seg.path, b"not zstd").unwrap();
        }
        let mut newest = None;
        scan_backwards(&crate::state::Store::default(), &path, |e| {
            newest = Some(e);
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(numbers(&[newest.unwrap()]), [300]);
        // A damaged segment is skipped, never an error that stops the
        // agent's recording: the past is shorter by what it held (the
        // daemon sets it aside and says so; `check` names it).
        let rest = numbers(
            &read(&crate::state::Store::default(), &path)
                .unwrap()
                .entries,
        );
        assert!(!rest.is_empty() && rest.len() < 301, "{rest:?}");
        assert_eq!(rest.last(), Some(&300));
    }
}
