//! One resumable stream of everything that happened under a state root:
//! every agent's `journal.jsonl` (working agents and human mailboxes alike)
//! and the daemon's own logs (`.daemon/errors.jsonl`, `.daemon/signals.jsonl`),
//! for `agent-state events`.
//!
//! **Cursors.** A [`Cursor`] is, per source file, the byte offset read so
//! far: every whole line before it has been seen, everything after it is new.
//! So a reader that stores the cursor of the last event it printed and comes
//! back with it sees every later event exactly once, however the files were
//! appended to in between and however their times interleave. Sources are
//! named by agent (`rio`) or by daemon log (`.errors`, `.signals`: agent
//! names never start with a dot); a source the cursor does not name starts
//! at 0, and a source the reader does not read (another agent, with
//! `--agent`) keeps its offset. On the command line a cursor is
//! `v1.` + base64url (no padding) of `KEY:OFFSET,KEY:OFFSET…` (sorted, zero
//! offsets left out) followed by a 4-byte FNV-1a checksum of that text, so a
//! truncated or mistyped cursor is refused rather than read as "start over".
//!
//! **Batches.** A [`Reader`] reads, for each source, the whole lines after
//! its offset (a torn or still-being-written last line is left for the next
//! read), and merges them by `(ts, source, offset)`, keeping each source's
//! own lines in file order (journal times are only nearly ordered: a cursor
//! must never pass a line that has not been printed). Each event carries the
//! end of its line; the cursor that resumes right after an event is the
//! batch's start with the event's source moved to that end (see
//! [`Batch::cursors`]). Lines that do not parse are skipped, and the offset
//! moves past them with the event before them. A file shorter than its
//! offset, or one without a line ending just before it, was truncated or
//! replaced (`check --repair` rewrites a journal without its torn lines): it
//! is read again from the start, with a note.
//!
//! [`classify`] turns inotify events (the `notify` crate) into "read this
//! source again", "a new directory to watch" or "rescan", for `--follow`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::agent_name::AgentName;
use crate::error::{Error, Result};
use crate::state::StateRoot;
use crate::state::rotation;

/// A daemon-wide log under `.daemon/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DaemonLog {
    /// `.daemon/errors.jsonl`: one [`crate::catalogue::ErrorRecord`] a line.
    Errors,
    /// `.daemon/signals.jsonl`: invalid agent signals found in sessions'
    /// output ([`crate::protocol::signals::SignalRecord`]).
    Signals,
}

impl DaemonLog {
    pub const ALL: [DaemonLog; 2] = [DaemonLog::Errors, DaemonLog::Signals];

    pub fn file_name(self) -> &'static str {
        match self {
            DaemonLog::Errors => "errors.jsonl",
            DaemonLog::Signals => "signals.jsonl",
        }
    }

    /// The event kind its records are shown as.
    pub fn kind(self) -> &'static str {
        match self {
            DaemonLog::Errors => "error",
            DaemonLog::Signals => "signal",
        }
    }

    fn key(self) -> &'static str {
        match self {
            DaemonLog::Errors => ".errors",
            DaemonLog::Signals => ".signals",
        }
    }
}

/// One file of the stream.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceId {
    /// `{root}/{agent}/journal.jsonl`
    Agent(AgentName),
    /// `{root}/.daemon/{log}`
    Daemon(DaemonLog),
}

impl SourceId {
    /// The name in a cursor: the agent's name, or `.errors` / `.signals`.
    pub fn key(&self) -> &str {
        match self {
            SourceId::Agent(a) => a.as_str(),
            SourceId::Daemon(d) => d.key(),
        }
    }

    pub fn parse_key(key: &str) -> Result<SourceId, CursorFault> {
        if let Some(d) = DaemonLog::ALL.into_iter().find(|d| d.key() == key) {
            return Ok(SourceId::Daemon(d));
        }
        if key.starts_with('.') {
            return Err(CursorFault::NotADaemonLog(key.to_string()));
        }
        AgentName::parse(key)
            .map(SourceId::Agent)
            .map_err(|e| CursorFault::InvalidSource(Box::new(e)))
    }

    /// What the stream shows as its source: the agent, or `daemon`.
    pub fn label(&self) -> &str {
        match self {
            SourceId::Agent(a) => a.as_str(),
            SourceId::Daemon(_) => "daemon",
        }
    }

    pub fn path(&self, root: &StateRoot) -> PathBuf {
        match self {
            SourceId::Agent(a) => root.agent(a).journal(),
            SourceId::Daemon(d) => root.daemon_dir().join(d.file_name()),
        }
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceId::Agent(a) => write!(f, "{a}/journal.jsonl"),
            SourceId::Daemon(d) => write!(f, ".daemon/{}", d.file_name()),
        }
    }
}

/// Where a reader is: per source, the bytes read so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    offsets: BTreeMap<SourceId, u64>,
}

const CURSOR_PREFIX: &str = "v1.";

/// Why a token is not a cursor [`Cursor::parse`] can read (the text of a
/// usage error: `--after: …`).
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    #[error("the cursor is empty; pass one printed by `agent-state events`")]
    Empty,
    /// The token (shortened) does not start with the prefix.
    #[error(
        "`{0}` is not an events cursor: cursors start with `{CURSOR_PREFIX}` \
         (copy one from the output of `agent-state events`)"
    )]
    NotACursor(String),
    /// `shown`: the token, shortened.
    #[error("cursor `{shown}` {fault}")]
    Bad { shown: String, fault: CursorFault },
}

/// What is wrong inside a cursor (read after "cursor `…` ").
#[derive(Debug, thiserror::Error)]
pub enum CursorFault {
    #[error(
        "contains `{0}`, which no cursor does (after `{CURSOR_PREFIX}` a cursor has \
         only letters, digits, `-` and `_`)"
    )]
    Character(char),
    #[error("is truncated: its length is not that of any cursor")]
    Length,
    #[error("is damaged or truncated: it does not decode (copy the whole cursor)")]
    Undecodable,
    #[error("is truncated: too short to hold its checksum")]
    TooShort,
    #[error("is damaged or truncated: its checksum does not match (copy the whole cursor)")]
    Checksum,
    #[error("does not hold text")]
    NotText,
    #[error("has an entry `{0}` without an offset")]
    NoOffset(String),
    #[error("names `{0}`, which is not a daemon log (.errors, .signals)")]
    NotADaemonLog(String),
    #[error("names an invalid source: {0}")]
    InvalidSource(Box<Error>),
    #[error("has `{offset}` as the offset of {key}, not a number")]
    OffsetNotANumber { key: String, offset: String },
    #[error("has an offset of {0} too large for a file")]
    OffsetTooLarge(String),
    #[error("names {0} twice")]
    Twice(String),
}
const CHECKSUM_LEN: usize = 4;

impl Cursor {
    /// Before everything: every source from its first byte.
    pub fn start() -> Cursor {
        Cursor::default()
    }

    pub fn offset(&self, source: &SourceId) -> u64 {
        self.offsets.get(source).copied().unwrap_or(0)
    }

    pub fn set(&mut self, source: &SourceId, offset: u64) {
        if offset == 0 {
            self.offsets.remove(source);
        } else if let Some(o) = self.offsets.get_mut(source) {
            *o = offset;
        } else {
            self.offsets.insert(source.clone(), offset);
        }
    }

    /// The sources with an offset, and their offsets.
    pub fn offsets(&self) -> impl Iterator<Item = (&SourceId, u64)> {
        self.offsets.iter().map(|(s, o)| (s, *o))
    }

    fn payload(&self) -> String {
        let mut out = String::new();
        for (source, offset) in &self.offsets {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(source.key());
            out.push(':');
            out.push_str(&offset.to_string());
        }
        out
    }

    /// The printable token: `v1.` and base64url, shell-safe.
    pub fn encode(&self) -> String {
        let mut bytes = self.payload().into_bytes();
        let sum = fnv1a(&bytes);
        bytes.extend_from_slice(&sum.to_be_bytes());
        format!("{CURSOR_PREFIX}{}", base64url_encode(&bytes))
    }

    /// Read a token printed by [`Cursor::encode`]. The error says what is
    /// wrong with it (for a usage error naming the problem).
    pub fn parse(token: &str) -> Result<Cursor, CursorError> {
        let shown = shorten(token);
        if token.is_empty() {
            return Err(CursorError::Empty);
        }
        let Some(body) = token.strip_prefix(CURSOR_PREFIX) else {
            return Err(CursorError::NotACursor(shown));
        };
        let bad = |fault| CursorError::Bad {
            shown: shown.clone(),
            fault,
        };
        let bytes = base64url_decode(body).map_err(bad)?;
        if bytes.len() < CHECKSUM_LEN {
            return Err(bad(CursorFault::TooShort));
        }
        let (payload, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
        if fnv1a(payload).to_be_bytes() != sum {
            return Err(bad(CursorFault::Checksum));
        }
        let payload = std::str::from_utf8(payload).map_err(|_| bad(CursorFault::NotText))?;
        let mut cursor = Cursor::start();
        if payload.is_empty() {
            return Ok(cursor);
        }
        for entry in payload.split(',') {
            let Some((key, offset)) = entry.split_once(':') else {
                return Err(bad(CursorFault::NoOffset(entry.to_string())));
            };
            let source = SourceId::parse_key(key).map_err(bad)?;
            if offset.is_empty() || !offset.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(CursorFault::OffsetNotANumber {
                    key: key.to_string(),
                    offset: offset.to_string(),
                }));
            }
            let offset: u64 = offset
                .parse()
                .map_err(|_| bad(CursorFault::OffsetTooLarge(key.to_string())))?;
            if cursor.offsets.insert(source, offset).is_some() {
                return Err(bad(CursorFault::Twice(key.to_string())));
            }
        }
        Ok(cursor)
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

fn shorten(token: &str) -> String {
    const MAX: usize = 40;
    if token.chars().count() <= MAX {
        token.to_string()
    } else {
        let head: String = token.chars().take(MAX).collect();
        format!("{head}…")
    }
}

/// FNV-1a, 32 bits: enough to catch a truncated or mistyped cursor.
fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(B64[((v >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn base64url_decode(text: &str) -> Result<Vec<u8>, CursorFault> {
    let mut values = Vec::with_capacity(text.len());
    for c in text.chars() {
        match B64.iter().position(|b| char::from(*b) == c) {
            Some(v) => values.push(v as u32),
            None => {
                return Err(CursorFault::Character(c));
            }
        }
    }
    if values.len() % 4 == 1 {
        return Err(CursorFault::Length);
    }
    let mut out = Vec::with_capacity(values.len() * 3 / 4);
    for chunk in values.chunks(4) {
        let mut v = 0u32;
        for (i, x) in chunk.iter().enumerate() {
            v |= x << (18 - 6 * i);
        }
        let n = chunk.len() - 1;
        let bytes = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        // Bits beyond the last byte must be zero in a token we printed.
        let unused = match n {
            1 => v & 0xffff,
            2 => v & 0xff,
            _ => 0,
        };
        if unused != 0 {
            return Err(CursorFault::Undecodable);
        }
        out.extend_from_slice(&bytes[..n]);
    }
    Ok(out)
}

/// One event of the stream.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    pub source: SourceId,
    /// The journal's `event`; `error` or `signal` for the daemon's logs.
    pub kind: String,
    /// For ordering (sub-second precision kept).
    pub ts: DateTime<Utc>,
    /// `ts` as the file has it.
    pub ts_text: String,
    /// The line, parsed: always a JSON object.
    pub event: Value,
    /// Where its line starts.
    pub offset: u64,
    /// Where the next line that may be printed starts: after its own line
    /// and any unreadable lines right after it.
    pub end: u64,
}

impl StreamEvent {
    /// One line for a human: the fields that say what happened.
    pub fn summary(&self) -> String {
        summary(&self.source, &self.kind, &self.event)
    }
}

/// What one read found.
#[derive(Debug, Default)]
pub struct Batch {
    /// The cursor before the batch's first event (past any unreadable lines
    /// at the start of a source).
    pub start: Cursor,
    /// Merged by `(ts, source, offset)`, each source in file order.
    pub events: Vec<StreamEvent>,
    /// After everything read (the reader's position now).
    pub end: Cursor,
    /// Sources read again from the start, and sources that could not be
    /// read (left for the next read): for stderr.
    pub notes: Vec<String>,
}

impl Batch {
    /// Each event with the cursor that resumes right after it.
    pub fn cursors(&self) -> impl Iterator<Item = (&StreamEvent, Cursor)> {
        let mut running = self.start.clone();
        self.events.iter().map(move |e| {
            running.set(&e.source, e.end);
            (e, running.clone())
        })
    }
}

/// Reads the stream batch by batch from a position.
#[derive(Debug)]
pub struct Reader {
    root: StateRoot,
    agent: Option<AgentName>,
    position: Cursor,
}

impl Reader {
    /// Read from `position`; with `agent`, only that agent's journal and the
    /// daemon's records about it or about no agent in particular (other
    /// sources keep their offsets in the cursor).
    pub fn new(root: StateRoot, position: Cursor, agent: Option<AgentName>) -> Reader {
        Reader {
            root,
            agent,
            position,
        }
    }

    pub fn position(&self) -> &Cursor {
        &self.position
    }

    /// Does this reader read `source`?
    pub fn wants(&self, source: &SourceId) -> bool {
        match (source, &self.agent) {
            (SourceId::Agent(a), Some(only)) => a == only,
            _ => true,
        }
    }

    /// Every source there is now: each directory under the root named like
    /// an agent, and the daemon's logs (missing files are empty sources).
    pub fn sources(&self) -> Result<Vec<SourceId>> {
        let mut out = Vec::new();
        if let Some(a) = &self.agent {
            out.push(SourceId::Agent(a.clone()));
        } else {
            if !crate::fsx::exists(&self.root.path) {
                return Err(Error::NotFound(format!(
                    "the state root {} does not exist; run `agent-state bootstrap` first",
                    self.root.path.display()
                )));
            }
            for name in crate::fsx::list(&self.root.path)? {
                let Some(name) = name.to_str().map(str::to_string) else {
                    continue;
                };
                if let Ok(agent) = AgentName::parse(&name)
                    && crate::fsx::is_dir(&self.root.path.join(&name))
                {
                    out.push(SourceId::Agent(agent));
                }
            }
        }
        out.extend(DaemonLog::ALL.map(SourceId::Daemon));
        out.sort();
        Ok(out)
    }

    /// Read what is new in every source (`only: None`) or in some, and
    /// move the reader's position past it.
    pub fn read(&mut self, only: Option<&BTreeSet<SourceId>>) -> Result<Batch> {
        let sources: Vec<SourceId> = match only {
            Some(set) => set.iter().filter(|s| self.wants(s)).cloned().collect(),
            None => self.sources()?,
        };
        let mut batch = Batch {
            start: self.position.clone(),
            end: self.position.clone(),
            ..Batch::default()
        };
        let mut per_source = Vec::with_capacity(sources.len());
        for source in sources {
            let path = source.path(&self.root);
            let from = self.position.offset(&source);
            let agent = self.agent.as_ref();
            let keep = |v: &Value| match (&source, agent) {
                (SourceId::Daemon(_), Some(a)) => concerns(v, a),
                _ => true,
            };
            match read_source(&path, &source, from, &keep) {
                Ok(read) => {
                    if let Some(why) = read.restarted {
                        batch
                            .notes
                            .push(format!("{source} {why}: reading it again from the start"));
                    }
                    for gap in read.gaps {
                        batch.notes.push(format!("{source}: {gap}"));
                    }
                    batch.start.set(&source, read.base);
                    batch.end.set(&source, read.end);
                    per_source.push(read.events);
                }
                Err(e) => batch.notes.push(format!(
                    "cannot read {}: {e}; left for the next read",
                    path.display()
                )),
            }
        }
        batch.events = merge(per_source);
        self.position = batch.end.clone();
        Ok(batch)
    }
}

/// The agent and session a daemon record is about: `context.agent` in
/// errors.jsonl, `agent` in signals.jsonl.
fn record_field<'a>(record: &'a Value, key: &str) -> Option<&'a Value> {
    record
        .get("context")
        .and_then(|c| c.get(key))
        .or_else(|| record.get(key))
}

/// Is a daemon record about `agent` (by name, or by an instance id such as
/// `rio-047`), or about no agent in particular?
fn concerns(record: &Value, agent: &AgentName) -> bool {
    let Some(named) = record_field(record, "agent") else {
        return true;
    };
    let Some(named) = named.as_str() else {
        return true;
    };
    named == agent.as_str()
        || named
            .strip_prefix(agent.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Merge sources (each in file order) by `(ts, source, offset)` of their
/// next event: a source's events never overtake each other.
pub fn merge(sources: Vec<Vec<StreamEvent>>) -> Vec<StreamEvent> {
    let total = sources.iter().map(Vec::len).sum();
    let mut queues: Vec<std::vec::IntoIter<StreamEvent>> =
        sources.into_iter().map(Vec::into_iter).collect();
    let mut heads: Vec<Option<StreamEvent>> = queues.iter_mut().map(Iterator::next).collect();
    type Key = (DateTime<Utc>, SourceId, u64, usize);
    let key = |e: &StreamEvent, i: usize| -> Key { (e.ts, e.source.clone(), e.offset, i) };
    let mut heap: BinaryHeap<Reverse<Key>> = heads
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.as_ref().map(|e| Reverse(key(e, i))))
        .collect();
    let mut out = Vec::with_capacity(total);
    while let Some(Reverse((_, _, _, i))) = heap.pop() {
        let Some(event) = heads[i].take() else {
            continue;
        };
        out.push(event);
        heads[i] = queues[i].next();
        if let Some(e) = &heads[i] {
            heap.push(Reverse(key(e, i)));
        }
    }
    out
}

/// What reading one source found.
#[derive(Debug, Default)]
struct SourceRead {
    /// Why it was read from the start (truncated, replaced).
    restarted: Option<String>,
    /// Events that could not be read (pruned or missing segments).
    gaps: Vec<String>,
    /// Where its first event (or the end) starts.
    base: u64,
    /// After the last whole line.
    end: u64,
    events: Vec<StreamEvent>,
}

/// Read the whole lines of the log at `path` after stream offset `from`:
/// from its rotated segments where `from` is in them (see
/// [`crate::state::rotation`]), then from the live file. A missing file is
/// empty (its offset kept); anything but a regular file is refused, and a
/// FIFO never blocks the reader.
fn read_source(
    path: &Path,
    source: &SourceId,
    from: u64,
    keep: &dyn Fn(&Value) -> bool,
) -> io::Result<SourceRead> {
    // Never through a link, never blocking on a FIFO (crate::fsx).
    let file = match crate::fsx::open_read(path) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Ok(SourceRead {
                base: from,
                end: from,
                ..SourceRead::default()
            });
        }
        Err(e) => return Err(io::Error::other(e.to_string())),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    // Where the live file starts in the stream, read from the open file
    // itself, so a rotation between here and the reads cannot mislead.
    let live_base = rotation::base_of(&file)?;
    let mut read = SourceRead {
        base: from,
        end: from,
        ..SourceRead::default()
    };
    if from < live_base {
        read_segments(path, source, from, live_base, keep, &mut read)?;
    }
    let len = meta.len();
    let mut at = read.end - live_base;
    if len < at {
        read.restarted = Some(format!(
            "is shorter ({len} bytes) than the cursor's offset {}: it was truncated or replaced",
            read.end
        ));
        at = 0;
    } else if at > 0 && !newline_at(&file, at - 1)? {
        read.restarted = Some(format!(
            "has no line ending just before the cursor's offset {}: it was rewritten or replaced",
            read.end
        ));
        at = 0;
    }
    if read.restarted.is_some() {
        read.base = live_base;
        read.end = live_base;
        read.events.clear();
    }
    let mut file = file;
    file.seek(SeekFrom::Start(at))?;
    let reader = BufReader::new(file.take(len - at));
    read_lines(reader, source, keep, &mut read, false)?;
    Ok(read)
}

/// The rotated part of a source, from `from` up to `live_base`: each
/// segment that holds or follows `from`, decompressed, its lines read.
/// A position older than every segment kept (pruned by retention) starts
/// at the oldest, and says so.
fn read_segments(
    path: &Path,
    source: &SourceId,
    from: u64,
    live_base: u64,
    keep: &dyn Fn(&Value) -> bool,
    read: &mut SourceRead,
) -> io::Result<()> {
    let segments = rotation::segments(path, live_base).map_err(io::Error::other)?;
    let oldest = segments.first().map_or(live_base, |s| s.start);
    let mut from = from;
    if from < oldest {
        // From the start, nothing is missed that a reader had seen.
        if from > 0 {
            read.gaps.push(format!(
                "events between offsets {from} and {oldest} were removed by retention"
            ));
        }
        from = oldest;
        read.base = from;
        read.end = from;
    }
    for (i, segment) in segments.iter().enumerate() {
        let next = segments.get(i + 1).map_or(live_base, |s| s.start);
        if next <= from {
            continue;
        }
        // A reader of the stream only: a bad segment is a gap here, set
        // aside by the daemon's own reads or `check --repair`.
        let Some(bytes) = rotation::read_segment_or_skip(&crate::state::Store::default(), segment)
            .map_err(io::Error::other)?
        else {
            read.gaps.push(format!(
                "{} cannot be read (damaged or not a file; `agent-state check` names it): events between offsets {} and {next} are skipped",
                segment.path.display(),
                from.max(segment.start)
            ));
            read.end = next;
            if read.events.is_empty() {
                read.base = next;
            }
            from = next;
            continue;
        };
        let mut skip = (from - segment.start) as usize;
        if skip > bytes.len() {
            skip = bytes.len();
        } else if skip > 0 && bytes[skip - 1] != b'\n' {
            // Not a line boundary: the cursor was not made by this log.
            skip += bytes[skip..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(bytes.len() - skip, |p| p + 1);
        }
        read.end = segment.start + skip as u64;
        if read.events.is_empty() {
            read.base = read.end;
        }
        read_lines(&bytes[skip..], source, keep, read, true)?;
        if read.end != next {
            read.gaps.push(format!(
                "{} ends at offset {} but the next part starts at {next}: a segment is missing or damaged",
                segment.path.display(),
                read.end
            ));
            read.end = next;
            if read.events.is_empty() {
                read.base = next;
            }
        }
        from = next;
    }
    Ok(())
}

/// Read whole lines into `read`, from `read.end` on. A last line without
/// its newline (still being written, or torn) is not consumed, unless
/// `to_the_end` (a rotated segment, which nothing writes to any more).
fn read_lines(
    mut reader: impl BufRead,
    source: &SourceId,
    keep: &dyn Fn(&Value) -> bool,
    read: &mut SourceRead,
    to_the_end: bool,
) -> io::Result<()> {
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = reader.read_until(b'\n', &mut raw)?;
        if n == 0 || (raw.last() != Some(&b'\n') && !to_the_end) {
            // The end, or a line still being written (or torn): not consumed.
            break;
        }
        let start = read.end;
        read.end += n as u64;
        match parse_line(source, &raw).filter(|(_, _, _, v)| keep(v)) {
            Some((ts, ts_text, kind, event)) => read.events.push(StreamEvent {
                source: source.clone(),
                kind,
                ts,
                ts_text,
                event,
                offset: start,
                end: read.end,
            }),
            None => match read.events.last_mut() {
                Some(last) => last.end = read.end,
                None => read.base = read.end,
            },
        }
    }
    Ok(())
}

fn newline_at(file: &File, at: u64) -> io::Result<bool> {
    let mut b = [0u8];
    file.read_exact_at(&mut b, at)?;
    Ok(b[0] == b'\n')
}

/// A line of a source as an event: a JSON object with an RFC 3339 `ts`
/// and, in a journal, an `event` name. Anything else is skipped.
pub fn parse_line(
    source: &SourceId,
    line: &[u8],
) -> Option<(DateTime<Utc>, String, String, Value)> {
    if matches!(source, SourceId::Daemon(_)) && rotation::is_marker(line.trim_ascii_end()) {
        return None;
    }
    let value: Value = serde_json::from_slice(line).ok()?;
    let object = value.as_object()?;
    let ts_text = object.get("ts")?.as_str()?.to_string();
    let ts = DateTime::parse_from_rfc3339(&ts_text)
        .ok()?
        .with_timezone(&Utc);
    let kind = match source {
        SourceId::Agent(_) => object.get("event")?.as_str()?.to_string(),
        SourceId::Daemon(d) => d.kind().to_string(),
    };
    Some((ts, ts_text, kind, value))
}

/// The fields worth a glance, per kind of event, in the order shown.
fn summary_keys(source: &SourceId, kind: &str) -> &'static [&'static str] {
    match (source, kind) {
        (SourceId::Daemon(DaemonLog::Errors), _) => &["code", "message"],
        (SourceId::Daemon(DaemonLog::Signals), _) => &["code", "raw", "message"],
        (_, "session_start") => &["session_id", "type", "model", "instance"],
        (_, "session_updated") => &["session_id", "fields"],
        (_, "session_end") => &["session_id", "outcome", "summary"],
        (_, "error" | "timeout") => &["session_id", "reason"],
        (_, "task_added") => &["task_id", "priority", "description"],
        (_, "task_updated") => &["task_id", "status", "outcome"],
        (_, "message_sent") => &["message_id", "to", "type", "subject"],
        (_, "message_received") => &["message_id", "from", "type", "subject"],
        (_, "message_rejected") => &["file", "reason"],
        (_, "message_expired") => &["message_id", "file"],
        (_, "state_repaired") => &["file", "rebuilt_from"],
        (_, "wake_skipped") => &["reason", "running_session"],
        (_, "schedule_missed") => &["scheduled", "count"],
        (_, "bootstrap") => &["created"],
        _ => &[],
    }
}

/// Longest summary, in characters.
const SUMMARY_MAX: usize = 160;

/// One line saying what an event is about: its kind's main fields, or
/// `key=value` for every plain field of an event this version does not
/// know. Never more than one line.
pub fn summary(source: &SourceId, kind: &str, event: &Value) -> String {
    let plain = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Array(items) if !items.is_empty() => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|i| match i {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                Some(parts.join(","))
            }
            _ => None,
        }
    };
    let mut parts: Vec<String> = summary_keys(source, kind)
        .iter()
        .filter_map(|k| event.get(*k).and_then(plain))
        .collect();
    if parts.is_empty()
        && let Some(object) = event.as_object()
    {
        parts = object
            .iter()
            .filter(|(k, _)| *k != "ts" && *k != "event")
            .filter_map(|(k, v)| plain(v).map(|v| format!("{k}={v}")))
            .collect();
    }
    // A message's `from` is its writer's label; the file's owner, when
    // another name, is said beside it.
    if kind == "message_received"
        && let Some(sender) = event.get("sender").and_then(Value::as_str)
        && event.get("from").and_then(Value::as_str) != Some(sender)
    {
        parts.push(format!("(file of {sender})"));
    }
    if let SourceId::Daemon(_) = source {
        let mut ctx: Vec<String> = ["agent", "session"]
            .iter()
            .filter_map(|k| record_field(event, k).and_then(plain))
            .collect();
        if let Some(n) = record_field(event, "attempt").and_then(Value::as_u64) {
            ctx.push(format!("attempt {n}"));
        }
        if !ctx.is_empty() {
            parts.push(format!("[{}]", ctx.join(" ")));
        }
    }
    let mut text = parts
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if text.chars().count() > SUMMARY_MAX {
        text = text.chars().take(SUMMARY_MAX - 1).collect();
        text.push('…');
    }
    text
}

/// What an inotify event under the root means for a follower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Lines may have been appended to (or the file replaced in) a source.
    Source(SourceId),
    /// A directory appeared under the root (an agent, `.daemon`): watch it
    /// and read its sources.
    NewDir(PathBuf),
    /// Events may have been lost: read everything and watch what is new.
    Rescan,
}

/// Turn one notify event (from watches on the root, `.daemon/` and each
/// agent's directory, none recursive) into changes. Opening, reading and
/// attribute changes are nothing (the reader's own opens must not wake it).
pub fn classify(root: &Path, event: notify::Result<notify::Event>) -> Vec<Change> {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    let event = match event {
        Ok(e) => e,
        Err(_) => return vec![Change::Rescan],
    };
    if event.need_rescan() {
        return vec![Change::Rescan];
    }
    let relevant = match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        _ => true,
    };
    if !relevant {
        return Vec::new();
    }
    let mut out = Vec::new();
    for path in &event.paths {
        let Some(change) = change_at(root, path, &event.kind) else {
            continue;
        };
        if !out.contains(&change) {
            out.push(change);
        }
    }
    out
}

fn change_at(root: &Path, path: &Path, kind: &notify::EventKind) -> Option<Change> {
    use notify::EventKind;
    let name = path.file_name()?.to_str()?;
    let parent = path.parent()?;
    if parent == root {
        let appeared = matches!(kind, EventKind::Create(_) | EventKind::Modify(_));
        let named = name == ".daemon" || AgentName::parse(name).is_ok();
        return (appeared && named).then(|| Change::NewDir(path.to_path_buf()));
    }
    if parent.parent()? != root {
        return None;
    }
    let dir = parent.file_name()?.to_str()?;
    if dir == ".daemon" {
        let log = DaemonLog::ALL.into_iter().find(|d| d.file_name() == name)?;
        return Some(Change::Source(SourceId::Daemon(log)));
    }
    if name != "journal.jsonl" {
        return None;
    }
    AgentName::parse(dir)
        .ok()
        .map(|a| Change::Source(SourceId::Agent(a)))
}

#[cfg(test)]
mod tests;
