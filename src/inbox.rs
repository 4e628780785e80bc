//! Inbox messages: the schema, validation, delivery (`send`), and the claim /
//! acknowledge / return cycle of a session. Modelled on Maildir.
//!
//! A message is complete when its name appears in `inbox/`: senders write in
//! `inbox/.tmp/`, fsync and rename in. Validation never trusts the file: it is
//! `lstat`ed, opened without following links or blocking, read up to a limit,
//! and parsed field by field so a rejection can say which field is wrong.
//! Nothing here deletes input: bad files move to `rejected/` with a
//! `.reason.json` beside them. This module never interprets message text.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::SFlag;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::agent_name::{self, AgentName};
use crate::clock::Timestamp;
use crate::error::{Error, IoContext, Result};
use crate::fsx;
use crate::state::bootstrap::{INBOX_DIR_MODE, INBOX_PRIVATE_DIR_MODE};
use crate::state::journal::{self, Entry, Event, MessageExpired, MessageRejected};
use crate::state::tasks::string_enum;
use crate::state::{AgentDir, atomic};

/// Largest message file accepted.
pub const MAX_MESSAGE_BYTES: u64 = 1 << 20;
/// Failed deliveries after which a message is set aside as undeliverable.
pub const MAX_ATTEMPTS: u32 = 3;
/// Default of `inbox_settle`: how long a `.json` that does not parse yet
/// may still be being written (long enough for a person typing into `cat >`).
pub const SETTLE_TIME: Duration = Duration::from_secs(60);
/// Mode of message files: the inbox group (e.g. `teleo`, the daemon's
/// group) may read them, and only their owner may change them.
pub const MESSAGE_MODE: u32 = 0o640;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    pub from: String,
    pub to: String,
    pub created_at: Timestamp,
    #[serde(rename = "type")]
    pub kind: MessageType,
    pub priority: Priority,
    pub subject: String,
    pub body: String,
    pub source_ref: Option<String>,
    pub expires_at: Option<Timestamp>,
    /// Addition: failed deliveries so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A message's `type`: defined in the store, whose journal records it.
pub use crate::state::journal::MessageType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    High,
    Normal,
}
string_enum!(Priority, "priority", High = "high", Normal = "normal");

impl Message {
    /// High priority first, then oldest first (then by id, for a total order).
    pub fn delivery_order(a: &Message, b: &Message) -> std::cmp::Ordering {
        (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
    }

    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// Why a file is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub field: Option<&'static str>,
    pub reason: String,
    /// It did not parse (perhaps unfinished): retried if completed later.
    pub incomplete: bool,
}

impl Rejection {
    fn field(field: &'static str, reason: impl Into<String>) -> Self {
        Rejection {
            field: Some(field),
            reason: format!("field `{field}` {}", reason.into()),
            incomplete: false,
        }
    }
    fn file(reason: impl Into<String>) -> Self {
        Rejection {
            field: None,
            reason: reason.into(),
            incomplete: false,
        }
    }
}

/// Validate the bytes of a message file found in `owner`'s inbox. Pure.
///
/// Defaults: `id` = the file's stem, `to` = the owner, `priority` = normal,
/// `created_at` = the file's mtime, `type` = flag, `body` = "".
pub fn validate(
    bytes: &[u8],
    stem: &str,
    owner: &AgentName,
    mtime: Timestamp,
) -> Result<Message, Rejection> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| Rejection {
        incomplete: true,
        ..Rejection::file(format!("not valid JSON: {e}"))
    })?;
    let Value::Object(mut map) = value else {
        return Err(Rejection::file("the top level must be a JSON object"));
    };
    let mut take_string =
        |key: &'static str, required: bool| -> Result<Option<String>, Rejection> {
            match map.remove(key) {
                None | Some(Value::Null) if required => Err(Rejection::field(key, "is missing")),
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(Rejection::field(
                    key,
                    format!("must be a string, not {}", json_type(&other)),
                )),
            }
        };
    let id = take_string("id", false)?
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| stem.to_string());
    let from = take_string("from", true)?.unwrap_or_default();
    if let Some(problem) = agent_name::problem(&from) {
        return Err(Rejection::field(
            "from",
            format!("{from:?} is not an agent name: {problem}"),
        ));
    }
    let to = take_string("to", false)?.unwrap_or_else(|| owner.to_string());
    if to != owner.as_str() {
        return Err(Rejection::field(
            "to",
            format!("names `{to}`, but this is {owner}'s inbox"),
        ));
    }
    let created_at = match take_string("created_at", false)? {
        None => mtime,
        Some(t) => Timestamp::parse(&t).map_err(|e| Rejection::field("created_at", e))?,
    };
    let kind = match take_string("type", false)? {
        None => MessageType::Flag,
        Some(t) => t.parse().map_err(|e: String| Rejection::field("type", e))?,
    };
    let priority = match take_string("priority", false)? {
        None => Priority::Normal,
        Some(p) => p
            .parse()
            .map_err(|e: String| Rejection::field("priority", e))?,
    };
    let subject = take_string("subject", true)?.unwrap_or_default();
    if subject.trim().is_empty() {
        return Err(Rejection::field("subject", "is empty"));
    }
    let body = take_string("body", false)?.unwrap_or_default();
    let source_ref = take_string("source_ref", false)?;
    let expires_at = match take_string("expires_at", false)? {
        None => None,
        Some(t) => Some(Timestamp::parse(&t).map_err(|e| Rejection::field("expires_at", e))?),
    };
    let attempts = match map.remove("attempts") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) if n.as_u64().is_some() => {
            n.as_u64().unwrap_or(0).min(u32::MAX as u64) as u32
        }
        Some(other) => {
            return Err(Rejection::field(
                "attempts",
                format!("must be a whole number, not {}", json_type(&other)),
            ));
        }
    };
    Ok(Message {
        id,
        from,
        to,
        created_at,
        kind,
        priority,
        subject,
        body,
        source_ref,
        expires_at,
        attempts,
        extra: map,
    })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What a file waiting in an inbox turned out to be.
#[derive(Debug)]
pub enum Verdict {
    Valid(Box<Message>),
    /// Does not parse yet, but was written too recently to call it broken.
    Unsettled(String),
    Invalid(Rejection),
}

/// Names in `inbox/` that are messages to look at: `*.json`, not dotfiles.
/// Editor leftovers (`*.swp`, `*~`, `#x#`, `4913`) and anything else are
/// left alone.
pub fn waiting_names(agent: &AgentDir) -> Result<Vec<String>> {
    let mut names: Vec<String> = fsx::list(&agent.inbox())?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| is_message_name(n))
        .collect();
    names.sort();
    Ok(names)
}

/// Names in `inbox/` that would be messages (`*.json`, not dotfiles) but
/// are not UTF-8: they cannot be shown or quoted as they are, so they are
/// rejected under a safe name with their bytes recorded.
pub fn undecodable_names(agent: &AgentDir) -> Result<Vec<OsString>> {
    let mut names: Vec<OsString> = fsx::list(&agent.inbox())?
        .into_iter()
        .filter(|n| {
            let b = n.as_bytes();
            n.to_str().is_none() && !b.starts_with(b".") && b.ends_with(b".json")
        })
        .collect();
    names.sort();
    Ok(names)
}

/// How a name that is not UTF-8 is shown: its bytes, escaped (`\xff`).
pub fn escaped_name(name: &OsStr) -> String {
    name.as_bytes().escape_ascii().to_string()
}

/// Reject every waiting name that is not UTF-8. Returns (shown name, reason).
pub fn reject_undecodable(agent: &AgentDir, now: Timestamp) -> Result<Vec<(String, String)>> {
    reject_names(agent, undecodable_names(agent)?, now)
}

/// An inbox opened once for a pass over its files (a scan, a claim): its
/// handle, through which every file is looked at and moved, and its names,
/// listed once.
struct Listing {
    dir: std::os::fd::OwnedFd,
    /// Message names ([`is_message_name`]), sorted.
    names: Vec<String>,
    /// Would-be message names that are not UTF-8, sorted.
    undecodable: Vec<OsString>,
}

impl Listing {
    /// `None` when the inbox is missing.
    fn open(agent: &AgentDir) -> Result<Option<Listing>> {
        let path = agent.inbox();
        let Some(dir) = fsx::open_dir(&path)? else {
            return Ok(None);
        };
        let listed = dir
            .try_clone()
            .map_err(|e| Error::io("listing", &path, e))?;
        let mut names = Vec::new();
        let mut undecodable = Vec::new();
        for n in fsx::list_fd(listed, &path)? {
            match n.into_string() {
                Ok(n) if is_message_name(&n) => names.push(n),
                Ok(_) => {}
                Err(n) => {
                    let b = n.as_bytes();
                    if !b.starts_with(b".") && b.ends_with(b".json") {
                        undecodable.push(n);
                    }
                }
            }
        }
        names.sort();
        undecodable.sort();
        Ok(Some(Listing {
            dir,
            names,
            undecodable,
        }))
    }
}

fn reject_names(
    agent: &AgentDir,
    names: Vec<OsString>,
    now: Timestamp,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in names {
        let reason = "its name is not UTF-8; the original bytes are in `original_name_bytes` of the .reason.json (hex). Send it again under a UTF-8 name".to_string();
        reject(agent, &agent.inbox().join(&name), &reason, now)?;
        out.push((escaped_name(&name), reason));
    }
    Ok(out)
}

pub fn is_message_name(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".json") && name.len() > ".json".len()
}

/// Look at one waiting file without moving it.
/// What the caller knows of a waiting file beyond its content.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    /// The agent's `inbox_settle`.
    pub settle: Duration,
    /// A writer still has the file open (the daemon's inotify watch saw it
    /// written and not yet closed).
    pub writer_open: bool,
}

impl Intake {
    pub fn settle(settle: Duration) -> Intake {
        Intake {
            settle,
            writer_open: false,
        }
    }
}

/// How long a file seen open for writing is waited for without a change
/// before its writer is taken to be gone (a close missed in an overflow).
pub fn writer_patience(settle: Duration) -> Duration {
    (settle * 10).max(Duration::from_secs(600))
}

/// Whether a waiting file must be left to settle, and why; `None` when it
/// is to be judged now. Pure: `parsed` is whether its bytes are a valid
/// message, `extra_links` whether another name links to it, `quiet_for` how
/// long since it last changed.
pub fn settle_decision(
    parsed: bool,
    extra_links: bool,
    quiet_for: Duration,
    intake: Intake,
) -> Option<String> {
    let secs =
        |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs())).to_string();
    if intake.writer_open && quiet_for < writer_patience(intake.settle) {
        return Some(format!(
            "still open for writing (last change {} ago); looked at again when it is closed",
            secs(quiet_for)
        ));
    }
    if quiet_for >= intake.settle {
        return None;
    }
    if extra_links {
        return Some(format!(
            "has another link (a sender linking it in and removing its temp name?); judged if it still has one {} after its last change",
            secs(intake.settle)
        ));
    }
    if !parsed {
        return Some(format!(
            "does not parse yet, last changed {} ago: it may still be being written; judged {} after its last change",
            secs(quiet_for),
            secs(intake.settle)
        ));
    }
    None
}

/// What has been learned of message files: a file read and validated once
/// is not read again while it is the same file (device and inode) with the
/// same size, mtime and ctime. The daemon keeps one per agent,
/// so a message is read once when it arrives; the scans that follow, and the
/// claim, only stat it. Bounded: at most [`KNOWN_MAX`] files, bodies of at
/// most [`KNOWN_BODY_MAX`] bytes (a bigger one is simply read again).
#[derive(Debug, Default, Clone)]
pub struct Known {
    files: std::collections::HashMap<(u64, u64), (Stamp, Message)>,
}

/// The most files a [`Known`] remembers.
pub const KNOWN_MAX: usize = 200_000;
/// The longest body a [`Known`] keeps.
pub const KNOWN_BODY_MAX: usize = 16 * 1024;

/// A file's identity and version, as stat tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    /// Changed by every write and by no one at will (unlike the mtime): a
    /// file rewritten in place with its old size and mtime is read again.
    ctime: (i64, i64),
}

impl Stamp {
    fn of_stat(st: &nix::sys::stat::FileStat) -> Stamp {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }

    fn of_meta(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size() as i64,
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

impl Known {
    fn get(&self, st: &Stamp) -> Option<&Message> {
        self.files
            .get(&(st.dev, st.ino))
            .filter(|(known, _)| known == st)
            .map(|(_, m)| m)
    }

    fn learn(&mut self, st: Stamp, m: &Message) {
        if self.get(&st).is_some() {
            return;
        }
        if m.body.len() <= KNOWN_BODY_MAX
            && (self.files.len() < KNOWN_MAX || self.files.contains_key(&(st.dev, st.ino)))
        {
            self.files.insert((st.dev, st.ino), (st, m.clone()));
        }
    }

    /// Forget every file not in `seen` (gone from the inbox: claimed,
    /// rejected or removed).
    fn keep_only(&mut self, seen: &std::collections::HashSet<(u64, u64)>) {
        self.files.retain(|k, _| seen.contains(k));
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

pub fn inspect(agent: &AgentDir, name: &str, now: SystemTime, intake: Intake) -> Verdict {
    // Looked at through a handle: never through a link, never blocking on a
    // FIFO, and what is read is what was checked.
    let dir = match fsx::dir(&agent.inbox()) {
        Ok(d) => d,
        Err(e) => {
            return Verdict::Invalid(Rejection::file(format!("cannot open the inbox: {e}")));
        }
    };
    inspect_with(agent, dir.as_fd(), name, now, intake, None).0
}

/// [`inspect`], answering from `known` when the file is one already read
/// (no open, no read), and returning the stamp of a valid file (to be
/// learned, or kept).
/// `dir` is the inbox's handle, opened once for a whole pass.
fn inspect_with(
    agent: &AgentDir,
    dir: std::os::fd::BorrowedFd<'_>,
    name: &str,
    now: SystemTime,
    intake: Intake,
    known: Option<&Known>,
) -> (Verdict, Option<Stamp>) {
    let verdict = |v: Verdict| (v, None);
    let path = agent.inbox().join(name);
    let st = match fsx::stat_at(dir, OsStr::new(name), &path) {
        Ok(Some(st)) => st,
        Ok(None) => {
            return verdict(Verdict::Invalid(Rejection::file(
                "vanished while being looked at",
            )));
        }
        Err(e) => {
            return verdict(Verdict::Invalid(Rejection::file(format!(
                "cannot stat: {e}"
            ))));
        }
    };
    let kind = fsx::file_type(&st);
    if kind == SFlag::S_IFLNK {
        return verdict(Verdict::Invalid(Rejection::file(
            "is a symbolic link; messages must be regular files (the link was moved, its target left untouched)",
        )));
    }
    if kind != SFlag::S_IFREG {
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "is {}; messages must be regular files",
            fsx::describe_stat(&st)
        ))));
    }
    if let Some(m) = known.and_then(|k| k.get(&Stamp::of_stat(&st)))
        && st.st_nlink == 1
    {
        let quiet_for = now.duration_since(fsx::modified(&st)).unwrap_or_default();
        if let Some(why) = settle_decision(true, false, quiet_for, intake) {
            return verdict(Verdict::Unsettled(why));
        }
        return (
            Verdict::Valid(Box::new(m.clone())),
            Some(Stamp::of_stat(&st)),
        );
    }
    let file = match fsx::open_read_at(dir, OsStr::new(name), &path) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return verdict(Verdict::Invalid(Rejection::file(
                "vanished while being looked at",
            )));
        }
        Err(e) => {
            return verdict(Verdict::Invalid(Rejection::file(format!(
                "cannot open: {e}"
            ))));
        }
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => {
            return verdict(Verdict::Invalid(Rejection::file(format!(
                "cannot stat: {e}"
            ))));
        }
    };
    let mtime = meta.modified().unwrap_or(now);
    let quiet_for = now.duration_since(mtime).unwrap_or_default();
    // A hard link to a file the sender may not read (the daemon reads with
    // its own rights and quotes what it reads into a prompt): never read.
    // A sender that links a file in and then removes its temp name is given
    // the settle time to do so.
    if meta.nlink() > 1 {
        if let Some(why) = settle_decision(false, true, quiet_for, intake) {
            return verdict(Verdict::Unsettled(why));
        }
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "has {} hard links; a message must be a file of its own (write it, then rename it in), so it was not read",
            meta.nlink()
        ))));
    }
    if meta.len() > MAX_MESSAGE_BYTES {
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "is {} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (1 MiB): put large content in a file and name it in `source_ref`",
            meta.len()
        ))));
    }
    // Sized by the stat: one read(2) for the file, one for its end.
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    if let Err(e) = file.take(MAX_MESSAGE_BYTES + 1).read_to_end(&mut bytes) {
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "cannot read: {e}"
        ))));
    }
    let more = bytes.len() as u64 > MAX_MESSAGE_BYTES;
    if more {
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "grew past the limit of {MAX_MESSAGE_BYTES} bytes while being read"
        ))));
    }
    let stem = name.trim_end_matches(".json");
    let owner = &agent.name;
    let mtime_ts = Timestamp::from_datetime(chrono::DateTime::<chrono::Utc>::from(mtime));
    let result = validate(&bytes, stem, owner, mtime_ts);
    // Only a file that does not parse at all may be unfinished; one that
    // parses but has a wrong field is judged at once (unless still open).
    let parsed = !matches!(&result, Err(r) if r.field.is_none());
    if let Some(why) = settle_decision(parsed, false, quiet_for, intake) {
        return verdict(Verdict::Unsettled(why));
    }
    match result {
        Ok(m) => (Verdict::Valid(Box::new(m)), Some(Stamp::of_meta(&meta))),
        Err(r) => verdict(Verdict::Invalid(r)),
    }
}

/// The longest name kept as it is when a message is moved: room is left for
/// a de-duplicating `-N` and a `.reason.json` beside it within the 255-byte
/// limit of a file name.
pub const MAX_KEPT_NAME: usize = 200;

/// `name` if it can be kept (de-duplicated and with a `.reason.json` beside
/// it) within the file name limit; else a shortened form: its first bytes,
/// `~`, a hash of the whole, and its extension.
pub fn keepable_name(name: &str) -> String {
    if name.len() <= MAX_KEPT_NAME {
        return name.to_string();
    }
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let ext = if name.ends_with(".json") { ".json" } else { "" };
    let mut cut = MAX_KEPT_NAME - 32;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}{ext}", &name[..cut])
}

/// A unique path for `name` in `dir` (`x.json`, `x-2.json`, …), the name
/// shortened first if it could not be kept whole ([`keepable_name`]).
fn unique_in(dir: &Path, name: &str) -> PathBuf {
    let name = keepable_name(name);
    let candidate = dir.join(&name);
    if !fsx::exists(&candidate) {
        return candidate;
    }
    let (stem, ext) = match name.rsplit_once('.') {
        Some((s, e)) => (s.to_string(), format!(".{e}")),
        None => (name.to_string(), String::new()),
    };
    (2..)
        .map(|n| dir.join(format!("{stem}-{n}{ext}")))
        .find(|p| !fsx::exists(p))
        .expect("an unused name")
}

/// [`move_unique`] without the directory fsyncs: for a batch of moves, the
/// caller syncs both directories once after the last one. Tries the name as
/// it is first (no stat): only a name already taken costs a search.
fn move_unique_unsynced(from: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let first = dir.join(keepable_name(name));
    match fsx::rename(from, &first, false) {
        Ok(()) => return Ok(first),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    loop {
        let target = unique_in(dir, name);
        match fsx::rename(from, &target, false) {
            Ok(()) => return Ok(target),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
            }
            Err(e) => return Err(e),
        }
    }
}

/// Move `from` to a unique name in `dir` (never replacing anything, never
/// through a link); returns where it went.
fn move_unique(from: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    loop {
        let target = unique_in(dir, name);
        if atomic::rename_new(from, &target)? {
            return Ok(target);
        }
    }
}

/// Move `source` (a file in one of `agent`'s inbox directories) to
/// `rejected/`, write the reason beside it and journal it. Returns the new path.
pub fn reject(agent: &AgentDir, source: &Path, reason: &str, now: Timestamp) -> Result<PathBuf> {
    reject_marked(agent, source, reason, now, false)
}

/// [`reject`]; `retry_when_valid` marks a file that did not parse, to be
/// moved back if it is completed later ([`retry_completed`]).
fn reject_marked(
    agent: &AgentDir,
    source: &Path,
    reason: &str,
    now: Timestamp,
    retry_when_valid: bool,
) -> Result<PathBuf> {
    let rejected = agent.rejected();
    atomic::create_dir(&rejected, INBOX_PRIVATE_DIR_MODE)?;
    let raw_name = source.file_name().unwrap_or_default();
    let name = match raw_name.to_str() {
        Some(n) => n.to_string(),
        None => format!("not-utf8-{}.json", uuid::Uuid::new_v4().simple()),
    };
    let target = unique_in(&rejected, &name);
    let target_name = target
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let mut reason_doc = serde_json::json!({
        "file": target_name,
        "original_name": raw_name.to_str().map(str::to_string).unwrap_or_else(|| escaped_name(raw_name)),
        "agent": agent.name.as_str(),
        "rejected_at": now,
        "code": "INBOX_REJECTED",
        "reason": reason,
    });
    if retry_when_valid {
        reason_doc["retry_when_valid"] = Value::Bool(true);
        // What it was when judged: a change after this is a writer coming
        // back to finish it.
        if let Ok(Some(st)) = fsx::metadata(source) {
            reason_doc["judged_version"] = Value::String(file_version(&st));
        }
    }
    if raw_name.to_str().is_none() {
        let hex: String = raw_name
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        reason_doc["original_name_bytes"] = Value::String(hex);
    }
    let mut bytes = serde_json::to_vec_pretty(&reason_doc).unwrap_or_default();
    bytes.push(b'\n');
    // The reason and the journal first, the move last: a crash in between
    // leaves the message where it was (rejected again next time), never a
    // rejected message without its reason or its journal line.
    atomic::write_file(
        &rejected.join(format!("{target_name}.reason.json")),
        &bytes,
        0o640,
    )?;
    journal::append(
        &agent.journal(),
        &Entry::new(
            now,
            Event::MessageRejected(MessageRejected {
                file: raw_name
                    .to_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| escaped_name(raw_name)),
                reason: reason.to_string(),
                moved_to: format!("inbox/rejected/{target_name}"),
            }),
        ),
    )?;
    // Never replacing anything: if the name was taken meanwhile, another.
    if !atomic::rename_new(source, &target)? {
        let target = move_unique(source, &rejected, &target_name)?;
        let _ = atomic::rename(
            &rejected.join(format!("{target_name}.reason.json")),
            &rejected.join(format!(
                "{}.reason.json",
                target.file_name().unwrap_or_default().to_string_lossy()
            )),
        );
        return Ok(target);
    }
    Ok(target)
}

/// What claiming found.
#[derive(Debug, Default)]
pub struct Claim {
    /// In delivery order.
    pub claimed: Vec<Message>,
    pub rejected: Vec<(String, String)>,
    pub expired: Vec<String>,
    pub unsettled: Vec<String>,
}

/// Validate every waiting message and move the valid ones to
/// `.claimed/{session_id}/`. Call with the agent lock held.
/// Names a writer still has open (known to the daemon's watch).
pub type Writing = std::collections::BTreeSet<String>;

pub fn claim(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
    settle: Duration,
    writing: &Writing,
    known: Option<&Known>,
) -> Result<Claim> {
    let mut out = Claim::default();
    let Some(listing) = Listing::open(agent)? else {
        return Ok(out);
    };
    out.rejected
        .extend(reject_names(agent, listing.undecodable, now)?);
    if listing.names.is_empty() {
        return Ok(out);
    }
    let inbox_dir = listing.dir.as_fd();
    let claimed_dir = agent.claimed(session_id);
    // Opened once, at the first message claimed.
    let mut claimed_fd: Option<std::os::fd::OwnedFd> = None;
    let now_sys: SystemTime = now.0.into();
    // Use the real clock for settling: `now` is whole seconds.
    let settle_now = SystemTime::now().max(now_sys);
    for name in listing.names {
        let path = agent.inbox().join(&name);
        let intake = Intake {
            settle,
            writer_open: writing.contains(&name),
        };
        match inspect_with(agent, inbox_dir, &name, settle_now, intake, known).0 {
            Verdict::Unsettled(_) => out.unsettled.push(name),
            Verdict::Invalid(r) => {
                let kept = reject_as(agent, &path, &r, now)?;
                out.rejected.push((kept_as(&name, &kept), r.reason));
            }
            Verdict::Valid(m) if m.attempts >= MAX_ATTEMPTS => {
                let reason = format!("undeliverable: {} failed delivery attempts", m.attempts);
                reject(agent, &path, &reason, now)?;
                out.rejected.push((name, reason));
            }
            Verdict::Valid(m) if m.is_expired(now) => {
                atomic::create_dir(&agent.processed(), INBOX_PRIVATE_DIR_MODE)?;
                move_unique_unsynced(&path, &agent.processed(), &name)?;
                journal::append(
                    &agent.journal(),
                    &Entry::new(
                        now,
                        Event::MessageExpired(MessageExpired {
                            message_id: m.id.clone(),
                            file: name.clone(),
                        }),
                    ),
                )?;
                out.expired.push(m.id.clone());
            }
            Verdict::Valid(m) => {
                if claimed_fd.is_none() {
                    atomic::create_dir(&claimed_dir, INBOX_PRIVATE_DIR_MODE)?;
                    claimed_fd = Some(fsx::dir(&claimed_dir)?);
                }
                let to = claimed_fd.as_ref().expect("opened above").as_fd();
                fsx::rename_at(inbox_dir, name.as_ref(), to, name.as_ref(), false).map_err(
                    |e| {
                        let to = claimed_dir.join(&name);
                        Error::io(
                            "renaming",
                            &path,
                            std::io::Error::new(e.kind(), format!("to {}: {e}", to.display())),
                        )
                    },
                )?;
                out.claimed.push(*m);
            }
        }
    }
    if !out.claimed.is_empty() || !out.expired.is_empty() {
        fsx::sync_fd(inbox_dir, &agent.inbox())?;
    }
    if let Some(fd) = &claimed_fd {
        fsx::sync_fd(fd, &claimed_dir)?;
    }
    if !out.expired.is_empty() {
        atomic::sync_dir(&agent.processed())?;
    }
    out.claimed.sort_by(Message::delivery_order);
    Ok(out)
}

/// The messages claimed by `session_id`, in delivery order, with their files.
pub fn claimed(agent: &AgentDir, session_id: &str) -> Result<Vec<(PathBuf, Message)>> {
    let dir = agent.claimed(session_id);
    let mut out = Vec::new();
    // One handle for the directory: each file is opened by name in it.
    let Some(handle) = fsx::open_dir(&dir)? else {
        return Ok(out);
    };
    let listed = handle
        .try_clone()
        .map_err(|e| Error::io("listing", &dir, e))?;
    for name in fsx::list_fd(listed, &dir)? {
        let path = dir.join(&name);
        let Some(name) = name.to_str().map(str::to_string) else {
            continue;
        };
        if !is_message_name(&name) {
            continue;
        }
        let stem = name.trim_end_matches(".json");
        let Some(file) = fsx::open_read_at(handle.as_fd(), OsStr::new(&name), &path)? else {
            continue;
        };
        let Ok(meta) = file.metadata() else {
            continue;
        };
        // Swapped for a hard link since it was claimed: never read.
        if meta.nlink() > 1 {
            continue;
        }
        let mut bytes = Vec::with_capacity(meta.len().min(MAX_MESSAGE_BYTES) as usize + 1);
        (&file)
            .take(MAX_MESSAGE_BYTES + 1)
            .read_to_end(&mut bytes)
            .at("reading", &path)?;
        // The file's mtime (kept by the renames), as for a waiting message:
        // a message without `created_at` keeps the same sent time and order.
        let mtime = meta
            .modified()
            .map(|t| Timestamp::from_datetime(chrono::DateTime::<chrono::Utc>::from(t)))
            .unwrap_or_else(|_| Timestamp::now());
        // A claimed file was valid when claimed; if someone edited it since,
        // keep it in the session anyway with what can be read.
        if let Ok(m) = validate(&bytes, stem, &agent.name, mtime) {
            out.push((path, m));
        }
    }
    out.sort_by(|a, b| Message::delivery_order(&a.1, &b.1));
    Ok(out)
}

/// Session succeeded: move its claimed messages to `processed/`, without
/// reading them again (what they say was read when they were claimed and
/// when the session's end was journaled). One fsync of each directory for
/// the whole batch, after the last rename. Returns how many moved. Call with
/// the agent lock held.
pub fn acknowledge(agent: &AgentDir, session_id: &str) -> Result<usize> {
    let dir = agent.claimed(session_id);
    let Some(from) = fsx::open_dir(&dir)? else {
        finish_claim_dir(agent, session_id)?;
        return Ok(0);
    };
    let listed = from
        .try_clone()
        .map_err(|e| Error::io("listing", &dir, e))?;
    let names: Vec<String> = fsx::list_fd(listed, &dir)?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| is_message_name(n))
        .collect();
    if !names.is_empty() {
        let processed = agent.processed();
        atomic::create_dir(&processed, INBOX_PRIVATE_DIR_MODE)?;
        let to = fsx::dir(&processed)?;
        for name in &names {
            // By the two handles, under its own name; a name already taken
            // in processed/ (a message sent twice under one name) costs a
            // search for a free one.
            let kept = keepable_name(name);
            match fsx::rename_at(
                from.as_fd(),
                name.as_ref(),
                to.as_fd(),
                kept.as_ref(),
                false,
            ) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    move_unique_unsynced(&dir.join(name), &processed, name)?;
                }
                Err(e) => {
                    return Err(Error::io(
                        "renaming",
                        dir.join(name),
                        std::io::Error::new(
                            e.kind(),
                            format!("to {}: {e}", processed.join(&kept).display()),
                        ),
                    ));
                }
            }
        }
        fsx::sync_fd(&to, &processed)?;
        fsx::sync_fd(&from, &dir)?;
    }
    finish_claim_dir(agent, session_id)?;
    Ok(names.len())
}

/// Session failed: put its claimed messages back in the inbox with one more
/// attempt counted, or in `rejected/` once they reach [`MAX_ATTEMPTS`].
/// Returns (returned ids, undeliverable ids). Call with the agent lock held.
pub fn return_claimed(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
) -> Result<(Vec<String>, Vec<String>)> {
    return_claimed_counting(agent, session_id, now, true)
}

/// [`return_claimed`]; with `count = false` the attempt is not counted: the
/// session did not fail on its messages, its process (or the daemon) was
/// killed under it, and a crash-looping daemon must not make messages
/// undeliverable.
pub fn return_claimed_counting(
    agent: &AgentDir,
    session_id: &str,
    now: Timestamp,
    count: bool,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut returned = Vec::new();
    let mut undeliverable = Vec::new();
    let dir = agent.claimed(session_id);
    if fsx::open_dir(&dir)?.is_none() {
        return Ok((returned, undeliverable));
    }
    for raw in fsx::list(&dir)? {
        let path = dir.join(&raw);
        let name = raw.to_string_lossy().to_string();
        let bytes = match fsx::read_limited(&path, MAX_MESSAGE_BYTES)? {
            Some((b, _)) => b,
            None => continue,
        };
        let stem = name.trim_end_matches(".json");
        match validate(&bytes, stem, &agent.name, now) {
            Ok(mut m) => {
                if count {
                    m.attempts += 1;
                }
                if m.attempts >= MAX_ATTEMPTS {
                    // Record the count in the file first, so the rejected
                    // copy says how many times it was tried.
                    write_message(&path, &m)?;
                    let reason = format!(
                        "undeliverable: {} sessions that claimed it failed (last: {session_id})",
                        m.attempts
                    );
                    reject(agent, &path, &reason, now)?;
                    undeliverable.push(m.id);
                } else {
                    // Only a counted attempt changes the file: an uncounted
                    // return is a rename (no rewrite, no fsync per message:
                    // thousands of messages go back after a crash).
                    if count {
                        write_message(&path, &m)?;
                    }
                    move_unique_unsynced(&path, &agent.inbox(), &name)?;
                    returned.push(m.id);
                }
            }
            Err(r) => {
                reject(
                    agent,
                    &path,
                    &format!("edited while claimed: {}", r.reason),
                    now,
                )?;
                undeliverable.push(stem.to_string());
            }
        }
    }
    atomic::sync_dir(&agent.inbox())?;
    finish_claim_dir(agent, session_id)?;
    Ok((returned, undeliverable))
}

fn finish_claim_dir(agent: &AgentDir, session_id: &str) -> Result<()> {
    let dir = agent.claimed(session_id);
    match fsx::remove_dir(&dir) {
        Ok(true) => atomic::sync_dir(&agent.claimed_root()),
        Ok(false) => Ok(()),
        // Something unexpected is left in it: keep it for a human.
        Err(_) => Ok(()),
    }
}

/// Sessions with a `.claimed/` directory.
pub fn claimed_sessions(agent: &AgentDir) -> Result<Vec<String>> {
    let dir = agent.claimed_root();
    let mut out = Vec::new();
    for name in fsx::list(&dir)? {
        if let Some(name) = name.to_str()
            && fsx::is_dir(&dir.join(name))
        {
            out.push(name.to_string());
        }
    }
    out.sort();
    Ok(out)
}

fn write_message(path: &Path, m: &Message) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(m).unwrap_or_default();
    bytes.push(b'\n');
    atomic::write_file(path, &bytes, MESSAGE_MODE)
}

/// A message to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub from: AgentName,
    pub kind: MessageType,
    pub priority: Priority,
    pub subject: String,
    pub body: String,
    pub source_ref: Option<String>,
    pub expires_at: Option<Timestamp>,
}

/// Deliver `out` into `to`'s inbox: written in `inbox/.tmp/`, fsynced, renamed
/// in, directory fsynced. Returns the message as delivered.
pub fn deliver(to: &AgentDir, out: &Outgoing, now: Timestamp) -> Result<Message> {
    to.require()?;
    let id = uuid::Uuid::new_v4().to_string();
    let message = Message {
        id: id.clone(),
        from: out.from.to_string(),
        to: to.name.to_string(),
        created_at: now,
        kind: out.kind,
        priority: out.priority,
        subject: out.subject.clone(),
        body: out.body.clone(),
        source_ref: out.source_ref.clone(),
        expires_at: out.expires_at,
        attempts: 0,
        extra: Map::new(),
    };
    let mut bytes = serde_json::to_vec_pretty(&message).unwrap_or_default();
    bytes.push(b'\n');
    if bytes.len() as u64 > MAX_MESSAGE_BYTES {
        return Err(Error::Data(format!(
            "the message to {} would be {} bytes; the limit is {MAX_MESSAGE_BYTES} (1 MiB): put large content in a file and name it with --source-ref",
            to.name,
            bytes.len()
        )));
    }
    let tmp_dir = to.inbox_tmp();
    atomic::create_dir(&tmp_dir, INBOX_DIR_MODE)?;
    // Written under a new name in inbox/.tmp/ (O_EXCL, never through a link,
    // its mode set exactly whatever the umask), fsynced, renamed in without
    // replacing anything.
    let tmp_fd = fsx::dir(&tmp_dir)?;
    let (mut f, tmp_name) = fsx::create_temp(tmp_fd.as_fd(), &tmp_dir, MESSAGE_MODE)?;
    let tmp = tmp_dir.join(&tmp_name);
    let written = f
        .write_all(&bytes)
        .and_then(|()| f.sync_all())
        .at("writing", &tmp);
    if let Err(e) = written {
        fsx::discard_at(tmp_fd.as_fd(), &tmp_name);
        return Err(e);
    }
    let target = to.inbox().join(format!("{id}.json"));
    if let Err(e) = atomic::rename_new(&tmp, &target) {
        fsx::discard_at(tmp_fd.as_fd(), &tmp_name);
        return Err(e);
    }
    Ok(message)
}

/// A file that `inbox` lists under rejected/, with its reason if recorded.
#[derive(Debug, Serialize)]
pub struct RejectedFile {
    pub file: String,
    pub reason: Option<String>,
    pub rejected_at: Option<String>,
}

pub fn rejected_files(agent: &AgentDir) -> Result<Vec<RejectedFile>> {
    let dir = agent.rejected();
    let mut out = Vec::new();
    let Ok(entries) = fsx::list(&dir) else {
        return Ok(out);
    };
    for raw in entries {
        let name = match raw.to_str() {
            Some(n) => n.to_string(),
            None => escaped_name(&raw),
        };
        if name.ends_with(".reason.json") || name.starts_with('.') {
            continue;
        }
        let reason_doc: Option<Value> =
            fsx::read_limited(&dir.join(format!("{name}.reason.json")), MAX_MESSAGE_BYTES)
                .ok()
                .flatten()
                .and_then(|(b, _)| serde_json::from_slice(&b).ok());
        out.push(RejectedFile {
            file: name,
            reason: reason_doc
                .as_ref()
                .and_then(|d| d["reason"].as_str().map(str::to_string)),
            rejected_at: reason_doc
                .as_ref()
                .and_then(|d| d["rejected_at"].as_str().map(str::to_string)),
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

/// Count of regular entries in a directory (0 if it does not exist).
pub fn count_files(dir: &Path) -> usize {
    fsx::list(dir)
        .map(|names| {
            names
                .iter()
                .filter(|n| {
                    matches!(fsx::metadata(&dir.join(n)), Ok(Some(st)) if fsx::file_type(&st) == SFlag::S_IFREG)
                })
                .count()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_waits_for_writers_and_for_unfinished_files_only() {
        let s = |secs| Duration::from_secs(secs);
        let intake = |open| Intake {
            settle: s(60),
            writer_open: open,
        };
        // (parsed, extra links, quiet for, writer open) → waits?
        let table = [
            (true, false, 0, false, false),   // valid, closed: judged at once
            (true, false, 0, true, true),     // valid but still open: waits
            (false, false, 8, true, true),    // a person typing, paused 8 s
            (false, false, 90, true, true),   // paused longer than settle, still open
            (false, false, 900, true, false), // open 15 min without a change: writer gone
            (false, false, 30, false, true),  // closed, broken, 30 s old: may be rewritten
            (false, false, 60, false, false), // closed, broken, settled: rejected
            (true, true, 5, false, true),     // linked in, temp name not yet removed
            (true, true, 61, false, false),   // still two links after settle: rejected
            (true, false, 61, false, false),
        ];
        for (parsed, links, quiet, open, waits) in table {
            let got = settle_decision(parsed, links, s(quiet), intake(open));
            assert_eq!(
                got.is_some(),
                waits,
                "parsed {parsed}, links {links}, quiet {quiet}s, open {open}: {got:?}"
            );
        }
    }

    fn owner() -> AgentName {
        AgentName::parse("rio").unwrap()
    }

    /// A message read once is served from [`Known`] while it is the same
    /// file; rewritten in place with its old size and mtime (the ctime
    /// changes), it is read again; gone from the inbox, it is forgotten.
    #[test]
    fn a_known_message_is_read_once_and_a_rewritten_one_again() {
        let tmp = tempfile::tempdir().unwrap();
        let root = crate::state::StateRoot::new(tmp.path());
        let agent = root.agent(&owner());
        std::fs::create_dir_all(agent.inbox()).unwrap();
        let path = agent.inbox().join("m1.json");
        let write = |subject: &str| {
            std::fs::write(&path, format!(r#"{{"from":"leo","subject":"{subject}"}}"#)).unwrap();
        };
        write("aaaa");
        let old = std::fs::metadata(&path).unwrap().modified().unwrap();
        let past = SystemTime::now() + Duration::from_secs(1);
        let mut known = Known::default();
        let writing = Writing::new();
        let settle = Duration::ZERO;
        let first = receive(&agent, Timestamp::now(), settle, &writing, &mut known).unwrap();
        assert_eq!(first.normal, 1);
        assert_eq!(known.len(), 1);
        let inbox_dir = fsx::dir(&agent.inbox()).unwrap();
        let (v, stamp) = inspect_with(
            &agent,
            inbox_dir.as_fd(),
            "m1.json",
            past,
            Intake::settle(settle),
            Some(&known),
        );
        assert!(
            matches!(&v, Verdict::Valid(m) if m.subject == "aaaa"),
            "{v:?}"
        );
        assert!(
            known.get(&stamp.unwrap()).is_some(),
            "served from what is known"
        );
        // Same size, same mtime, new content: read again.
        write("bbbb");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let (v, _) = inspect_with(
            &agent,
            inbox_dir.as_fd(),
            "m1.json",
            past,
            Intake::settle(settle),
            Some(&known),
        );
        assert!(
            matches!(&v, Verdict::Valid(m) if m.subject == "bbbb"),
            "{v:?}"
        );
        std::fs::remove_file(&path).unwrap();
        receive(&agent, Timestamp::now(), settle, &writing, &mut known).unwrap();
        assert!(known.is_empty());
    }

    fn check(json: &str, expect: Result<(), &str>) {
        let mtime = Timestamp::parse("2026-03-31T18:00:00Z").unwrap();
        let got = validate(json.as_bytes(), "abc", &owner(), mtime);
        match (got, expect) {
            (Ok(_), Ok(())) => {}
            (Err(r), Err(want)) => {
                assert!(r.reason.contains(want), "{json}: {} !~ {want}", r.reason)
            }
            (got, want) => panic!("{json}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn the_seed_message_is_valid() {
        let seed = r#"{ "id": "msg-abc123", "from": "theseus", "to": "rio", "created_at": "2026-03-31T18:00:00Z", "type": "flag", "priority": "high", "subject": "Check MetaDAO for AI agent participation", "body": "Found evidence.", "source_ref": "theseus/research-2026-03-31", "expires_at": null }"#;
        check(seed, Ok(()));
    }

    #[test]
    fn defaults_fill_missing_fields() {
        let mtime = Timestamp::parse("2026-03-31T18:00:00Z").unwrap();
        let m = validate(
            br#"{"from":"leo","subject":"hi","weight":2}"#,
            "abc",
            &owner(),
            mtime,
        )
        .unwrap();
        assert_eq!(m.id, "abc");
        assert_eq!(m.to, "rio");
        assert_eq!(m.priority, Priority::Normal);
        assert_eq!(m.created_at, mtime);
        assert_eq!(m.kind, MessageType::Flag);
        assert_eq!(m.extra["weight"], 2);
    }

    #[test]
    fn bad_messages_say_which_field() {
        let cases = [
            ("{", "not valid JSON"),
            ("[1]", "must be a JSON object"),
            (r#"{"subject":"x"}"#, "field `from` is missing"),
            (
                r#"{"from":"../etc","subject":"x"}"#,
                "field `from` \"../etc\" is not an agent name",
            ),
            (r#"{"from":"leo"}"#, "field `subject` is missing"),
            (r#"{"from":"leo","subject":""}"#, "field `subject` is empty"),
            (
                r#"{"from":"leo","subject":"x","to":"leo"}"#,
                "field `to` names `leo`, but this is rio's inbox",
            ),
            (
                r#"{"from":"leo","subject":"x","type":"order"}"#,
                "field `type` \"order\" is not a message type",
            ),
            (
                r#"{"from":"leo","subject":"x","priority":"urgent"}"#,
                "field `priority`",
            ),
            (
                r#"{"from":"leo","subject":7}"#,
                "field `subject` must be a string, not a number",
            ),
            (
                r#"{"from":"leo","subject":"x","created_at":"now"}"#,
                "field `created_at`",
            ),
            (
                r#"{"from":"leo","subject":"x","attempts":"two"}"#,
                "field `attempts`",
            ),
        ];
        for (json, want) in cases {
            check(json, Err(want));
        }
    }

    #[test]
    fn delivery_order_is_high_then_oldest() {
        let mtime = Timestamp::parse("2026-03-31T18:00:00Z").unwrap();
        let mk = |p: &str, t: &str, id: &str| {
            validate(
                format!(r#"{{"from":"leo","subject":"s","priority":"{p}","created_at":"{t}","id":"{id}"}}"#).as_bytes(),
                id,
                &owner(),
                mtime,
            )
            .unwrap()
        };
        let mut v = [
            mk("normal", "2026-01-01T00:00:00Z", "a"),
            mk("high", "2026-01-03T00:00:00Z", "b"),
            mk("high", "2026-01-02T00:00:00Z", "c"),
        ];
        v.sort_by(Message::delivery_order);
        let ids: Vec<_> = v.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a"]);
    }
}

/// What receiving an inbox found: valid messages waiting (by priority),
/// whether some file is still settling, and what was rejected.
#[derive(Debug, Default)]
pub struct Received {
    pub high: usize,
    pub normal: usize,
    pub unsettled: bool,
    pub rejected: Vec<(String, String)>,
    /// Valid `task` messages (their tasks are added by the caller).
    pub tasks: Vec<Message>,
}

/// Look at every waiting file as the daemon receives it: settled invalid
/// files go to `rejected/`, valid ones are counted and left waiting for the
/// next session to claim. Call with the agent lock held.
pub fn receive(
    agent: &AgentDir,
    now: Timestamp,
    settle: Duration,
    writing: &Writing,
    known: &mut Known,
) -> Result<Received> {
    let mut out = Received::default();
    let sys_now = SystemTime::now();
    let Some(listing) = Listing::open(agent)? else {
        known.keep_only(&Default::default());
        return Ok(out);
    };
    out.rejected
        .extend(reject_names(agent, listing.undecodable, now)?);
    let mut seen = std::collections::HashSet::new();
    for name in listing.names {
        let intake = Intake {
            settle,
            writer_open: writing.contains(&name),
        };
        let (verdict, stamp) = inspect_with(
            agent,
            listing.dir.as_fd(),
            &name,
            sys_now,
            intake,
            Some(known),
        );
        if let (Verdict::Valid(m), Some(stamp)) = (&verdict, stamp) {
            known.learn(stamp, m);
            seen.insert((stamp.dev, stamp.ino));
        }
        match verdict {
            Verdict::Valid(m) if m.is_expired(now) => {}
            Verdict::Valid(m) => {
                match m.priority {
                    Priority::High => out.high += 1,
                    Priority::Normal => out.normal += 1,
                }
                if m.kind == MessageType::Task {
                    out.tasks.push(*m);
                }
            }
            Verdict::Unsettled(_) => out.unsettled = true,
            Verdict::Invalid(r) => {
                let kept = reject_as(agent, &agent.inbox().join(&name), &r, now)?;
                out.rejected.push((kept_as(&name, &kept), r.reason));
            }
        }
    }
    known.keep_only(&seen);
    Ok(out)
}

/// A file's content version as far as stat tells: size and mtime to the
/// nanosecond.
fn file_version(st: &nix::sys::stat::FileStat) -> String {
    format!("{}:{}.{:09}", st.st_size, st.st_mtime, st.st_mtime_nsec)
}

/// `name`, and where it was really kept if that is another name.
fn kept_as(name: &str, kept: &Path) -> String {
    let kept = kept.file_name().unwrap_or_default().to_string_lossy();
    if kept == name {
        name.to_string()
    } else {
        format!("{name} (kept as inbox/rejected/{kept})")
    }
}

/// Reject for `r`: a file that did not parse is marked to be retried if it
/// is completed later (a writer that paused longer than the settle time).
fn reject_as(agent: &AgentDir, path: &Path, r: &Rejection, now: Timestamp) -> Result<PathBuf> {
    reject_marked(agent, path, &r.reason, now, r.incomplete)
}

/// Files rejected because they did not parse, changed since and valid now:
/// moved back to the inbox (journaled), so a message a person finished
/// after it was judged is delivered, not lost. Returns their new names.
/// Call with the agent lock held.
pub fn retry_completed(agent: &AgentDir, now: Timestamp) -> Result<Vec<String>> {
    let dir = agent.rejected();
    let mut out = Vec::new();
    for reason_name in fsx::list(&dir)? {
        let Some(reason_name) = reason_name.to_str() else {
            continue;
        };
        let Some(file) = reason_name.strip_suffix(".reason.json") else {
            continue;
        };
        let reason_path = dir.join(reason_name);
        let Ok(Some((bytes, _))) = fsx::read_limited(&reason_path, MAX_MESSAGE_BYTES) else {
            continue;
        };
        let Ok(doc) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if doc["retry_when_valid"] != Value::Bool(true) {
            continue;
        }
        let path = dir.join(file);
        let Ok(Some(st)) = fsx::metadata(&path) else {
            continue;
        };
        if doc["judged_version"].as_str() == Some(file_version(&st).as_str()) {
            continue;
        }
        let Ok(Some(f)) = fsx::open_read(&path) else {
            continue;
        };
        let Ok(meta) = f.metadata() else { continue };
        if meta.nlink() > 1 || meta.len() > MAX_MESSAGE_BYTES {
            continue;
        }
        let mut content = Vec::new();
        if (&f)
            .take(MAX_MESSAGE_BYTES + 1)
            .read_to_end(&mut content)
            .is_err()
        {
            continue;
        }
        let stem = file.trim_end_matches(".json");
        if validate(&content, stem, &agent.name, now).is_err() {
            continue;
        }
        let original = doc["original_name"].as_str().unwrap_or(file).to_string();
        let back = move_unique(&path, &agent.inbox(), &original)?;
        fsx::remove_file(&reason_path)?;
        let back_name = back
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        journal::append(
            &agent.journal(),
            &Entry::new(
                now,
                Event::MessageRetried(crate::state::journal::MessageRetried {
                    file: back_name.clone(),
                    from: format!("inbox/rejected/{file}"),
                    reason: "completed after it was rejected as unparsable: delivered".into(),
                }),
            ),
        )?;
        out.push(back_name);
    }
    Ok(out)
}
