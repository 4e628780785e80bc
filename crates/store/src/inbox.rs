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
use crate::clock::{FileClock, Timestamp};
use crate::error::{Error, IoContext, Result};
use crate::fsx;
use crate::state::bootstrap::{INBOX_DIR_MODE, INBOX_PRIVATE_DIR_MODE};
use crate::state::journal::{self, Entry, Event, MessageExpired, MessageRejected};
use crate::state::{AgentDir, atomic};
use crate::string_enum::{UnknownWord, string_enum};

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
    /// The uid owning the file it was read from, set by whoever read the
    /// file (never from its text, never written back).
    #[serde(skip)]
    pub file_owner: Option<u32>,
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
        Some(t) => t
            .parse()
            .map_err(|e: UnknownWord| Rejection::field("type", e.to_string()))?,
    };
    let priority = match take_string("priority", false)? {
        None => Priority::Normal,
        Some(p) => p
            .parse()
            .map_err(|e: UnknownWord| Rejection::field("priority", e.to_string()))?,
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
        file_owner: None,
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

/// Reject every waiting name that is not UTF-8.
pub fn reject_undecodable(agent: &AgentDir, now: Timestamp) -> Result<Vec<Rejected>> {
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

/// An inbox's would-be message names, listed beforehand: the daemon lists
/// a big inbox (a flood of junk beside the mail) on a blocking thread, and
/// the claim on its loop goes through these names instead of listing it
/// again. A name gone since is skipped; a message arrived since waits for
/// the next session (its arrival asked for one).
#[derive(Debug, Clone, Default)]
pub struct Listed {
    names: Vec<String>,
    undecodable: Vec<OsString>,
}

impl Listed {
    /// The message names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// An inbox directory bigger than this is listed off the daemon's loop
/// before a claim: its listing costs about 1 ms per 150 KiB (ext4, 4 KiB
/// blocks of about 100 entries; a directory never shrinks, so this is the
/// most it has ever held, which is what a listing walks).
pub const BIG_INBOX_BYTES: u64 = 256 * 1024;

/// Whether `agent`'s inbox directory is over [`BIG_INBOX_BYTES`] (its size
/// as stat tells; never through a link). One `stat`.
pub fn is_big(agent: &AgentDir) -> bool {
    matches!(fsx::metadata(&agent.inbox()), Ok(Some(st))
        if fsx::file_type(&st) == SFlag::S_IFDIR && st.st_size as u64 > BIG_INBOX_BYTES)
}

/// List `agent`'s would-be message names now, for a claim later
/// ([`Listed`]). `None` when the inbox is missing.
pub fn list_messages(agent: &AgentDir) -> Result<Option<Listed>> {
    Ok(Listing::open(agent, None)?.map(|l| Listed {
        names: l.names,
        undecodable: l.undecodable,
    }))
}

impl Listing {
    /// `None` when the inbox is missing. With `listed`, its names are taken
    /// instead of a listing.
    fn open(agent: &AgentDir, listed: Option<&Listed>) -> Result<Option<Listing>> {
        let path = agent.inbox();
        let Some(dir) = fsx::open_dir(&path)? else {
            return Ok(None);
        };
        if let Some(l) = listed {
            return Ok(Some(Listing {
                dir,
                names: l.names.clone(),
                undecodable: l.undecodable.clone(),
            }));
        }
        let handle = dir
            .try_clone()
            .map_err(|e| Error::io("listing", &path, e))?;
        let mut names = Vec::new();
        let mut undecodable = Vec::new();
        for n in fsx::list_fd(handle, &path)? {
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

fn reject_names(agent: &AgentDir, names: Vec<OsString>, now: Timestamp) -> Result<Vec<Rejected>> {
    let mut out = Vec::new();
    for name in names {
        let reason = "its name is not UTF-8; the original bytes are in `original_name_bytes` of the .reason.json (hex). Send it again under a UTF-8 name".to_string();
        let kept = reject(agent, &agent.inbox().join(&name), &reason, now)?;
        out.push(Rejected::new(escaped_name(&name), &kept, reason));
    }
    Ok(out)
}

pub fn is_message_name(name: &str) -> bool {
    !name.starts_with('.') && name.ends_with(".json") && name.len() > ".json".len()
}

mod claim;
mod deliver;
mod intake;
mod manual;
mod mover;
mod received;
mod reject;
pub use claim::*;
pub use deliver::*;
pub use intake::*;
pub use manual::*;
pub use received::journal_arrivals;
pub use reject::*;

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

    /// An inbox of `n` messages m000.json… and one file of junk.
    fn filled(tmp: &Path, n: usize) -> AgentDir {
        let root = crate::state::StateRoot::new(tmp);
        let agent = root.agent(&owner());
        std::fs::create_dir_all(agent.inbox()).unwrap();
        for i in 0..n {
            let body = format!(r#"{{"from":"leo","subject":"s{i}"}}"#);
            std::fs::write(agent.inbox().join(format!("m{i:03}.json")), body).unwrap();
        }
        std::fs::write(agent.inbox().join("junk.json"), "{not json").unwrap();
        agent
    }

    /// Claim every waiting message for `sid`, judged at once.
    fn claim_all(agent: &AgentDir, sid: &str) -> Result<Claim> {
        claim(
            agent,
            sid,
            Timestamp::now(),
            Duration::ZERO,
            FileClock::Real,
            &Writing::new(),
            None,
            None,
        )
    }

    fn names(dir: &Path) -> std::collections::BTreeSet<String> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .filter(|n| n.starts_with('m'))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A claim of more than MOVER_BATCH messages renames them on a helper
    /// thread: every valid one is claimed, junk rejected, a taken id
    /// replaced in the claimed copy; and a rename that fails midway stops
    /// the claim with an error naming the file, every message still in the
    /// inbox or claimed, none lost.
    #[test]
    fn a_big_claim_moves_every_message_once_and_stops_at_a_failed_rename() {
        let tmp = tempfile::tempdir().unwrap();
        let agent = filled(tmp.path(), 100);
        std::fs::create_dir_all(agent.processed()).unwrap();
        std::fs::write(agent.processed().join("m007.json"), "{}").unwrap();
        let sid = "20261129-140000";
        let claim = |agent: &AgentDir| claim_all(agent, sid);
        let got = claim(&agent).unwrap();
        assert_eq!(got.claimed.len(), 100);
        assert_eq!(got.rejected.len(), 1, "{:?}", got.rejected);
        assert!(names(&agent.inbox()).is_empty());
        assert_eq!(names(&agent.claimed(sid)).len(), 100);
        let copy = std::fs::read_to_string(agent.claimed(sid).join("m007.json")).unwrap();
        assert!(copy.contains(r#""original_id": "m007""#), "{copy}");
        let m7 = got
            .claimed
            .iter()
            .find(|m| m.extra.contains_key("original_id"));
        assert!(m7.is_some_and(|m| m.id != "m007"));

        let tmp = tempfile::tempdir().unwrap();
        let agent = filled(tmp.path(), 100);
        std::fs::create_dir_all(agent.claimed(sid)).unwrap();
        std::fs::write(agent.claimed(sid).join("m050.json"), "in the way").unwrap();
        let e = claim(&agent).unwrap_err().to_string();
        assert!(e.contains("m050.json"), "{e}");
        let waiting = names(&agent.inbox());
        let claimed = names(&agent.claimed(sid));
        assert!(waiting.contains("m050.json"));
        assert_eq!(
            waiting.len() + claimed.len(),
            101,
            "each message in one place (and the file in the way): {waiting:?} {claimed:?}"
        );

        // The claim's own step fails (junk that cannot be set aside: a
        // file where rejected/ should be), after the helper was given
        // every message: the error is returned, nothing is lost.
        let tmp = tempfile::tempdir().unwrap();
        let agent = filled(tmp.path(), 100);
        std::fs::rename(
            agent.inbox().join("junk.json"),
            agent.inbox().join("zz.json"),
        )
        .unwrap();
        std::fs::write(agent.rejected(), "not a directory").unwrap();
        let e = claim(&agent).unwrap_err().to_string();
        assert!(e.contains("rejected"), "{e}");
        let waiting = names(&agent.inbox());
        let claimed = names(&agent.claimed(sid));
        assert_eq!(
            waiting.len() + claimed.len(),
            100,
            "{waiting:?} {claimed:?}"
        );
        assert!(waiting.is_disjoint(&claimed));
    }

    /// A sender swaps a message for a link between the claim's check and
    /// its rename (a small claim, renamed on the caller's thread; then a
    /// big one's helper, driven directly): the claim holds the message it
    /// checked, the link goes back to the inbox unfollowed, and the next
    /// look at the inbox sets it aside. A message rewritten in place is
    /// the same file: claimed once.
    #[test]
    fn a_file_swapped_between_check_and_claim_goes_back_to_the_inbox() {
        let tmp = tempfile::tempdir().unwrap();
        let agent = filled(tmp.path(), 3);
        let outside = tmp.path().join("outside.json");
        std::fs::write(&outside, r#"{"from":"leo","subject":"outside"}"#).unwrap();
        let sid = "20261129-180000";
        let inbox = agent.inbox();
        let swap = {
            let (inbox, outside) = (inbox.clone(), outside.clone());
            move |name: &str| {
                if name == "m001.json" {
                    std::fs::remove_file(inbox.join(name)).unwrap();
                    std::os::unix::fs::symlink(&outside, inbox.join(name)).unwrap();
                }
                // Rewritten in place (an editor's save): the same file,
                // not delivered twice.
                if name == "m002.json" {
                    std::fs::write(inbox.join(name), r#"{"from":"leo","subject":"s2, edited"}"#)
                        .unwrap();
                }
            }
        };
        mover::BEFORE_RENAME.with(|h| *h.borrow_mut() = Some(Box::new(swap)));
        let got = claim_all(&agent, sid);
        mover::BEFORE_RENAME.with(|h| *h.borrow_mut() = None);
        let got = got.unwrap();
        let subjects: Vec<&str> = got.claimed.iter().map(|m| m.subject.as_str()).collect();
        assert_eq!(subjects, ["s0", "s1", "s2"]);
        let copy = std::fs::symlink_metadata(agent.claimed(sid).join("m001.json")).unwrap();
        assert!(copy.is_file(), "the claim holds the checked message");
        let back = std::fs::symlink_metadata(inbox.join("m001.json")).unwrap();
        assert!(
            back.file_type().is_symlink(),
            "the link is back, unfollowed"
        );
        assert!(!inbox.join("m002.json").exists(), "an edit is not a swap");
        let read = claimed(&agent, sid).unwrap();
        let read: Vec<&str> = read.iter().map(|(_, m)| m.subject.as_str()).collect();
        assert_eq!(read, ["s0", "s1", "s2, edited"]);
        let again = claim_all(&agent, "20261129-180001").unwrap();
        assert!(again.claimed.is_empty());
        assert!(
            again
                .rejected
                .iter()
                .any(|r| r.reason.contains("symbolic link")),
            "{:?}",
            again.rejected
        );
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            r#"{"from":"leo","subject":"outside"}"#
        );

        // The helper thread compares too.
        for threaded in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let agent = filled(tmp.path(), 2);
            let inbox = agent.inbox();
            let inode = |name: &str| {
                let path = inbox.join(name);
                let st = nix::sys::stat::lstat(&path).unwrap();
                Some(Stamp::of_stat(&st))
            };
            let (first, second) = (inode("m000.json"), inode("m001.json"));
            std::fs::remove_file(inbox.join("m000.json")).unwrap();
            nix::unistd::mkfifo(
                &inbox.join("m000.json"),
                nix::sys::stat::Mode::from_bits_truncate(0o660),
            )
            .unwrap();
            let claimed_dir = agent.claimed(sid);
            std::fs::create_dir_all(&claimed_dir).unwrap();
            let from = fsx::open_dir(&inbox).unwrap().unwrap();
            let swapped = std::thread::scope(|scope| {
                let to = fsx::dir(&claimed_dir).unwrap();
                let mut m =
                    mover::Mover::start(scope, threaded, from.as_fd(), to, &agent, &claimed_dir);
                m.claim("m000.json", first).unwrap();
                m.claim("m001.json", second).unwrap();
                m.finish().unwrap();
                m.swapped().to_vec()
            });
            assert_eq!(swapped, ["m000.json"], "threaded {threaded}");
            assert_eq!(names(&claimed_dir), ["m001.json".to_string()].into());
            let back = std::fs::symlink_metadata(inbox.join("m000.json")).unwrap();
            use std::os::unix::fs::FileTypeExt;
            assert!(back.file_type().is_fifo(), "threaded {threaded}");
        }
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
        let first = receive(
            &agent,
            Timestamp::now(),
            settle,
            FileClock::Real,
            &writing,
            &mut known,
            None,
        )
        .unwrap();
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
        receive(
            &agent,
            Timestamp::now(),
            settle,
            FileClock::Real,
            &writing,
            &mut known,
            None,
        )
        .unwrap();
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
