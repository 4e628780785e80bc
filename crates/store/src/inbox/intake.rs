//! Looking at a waiting file: settling (is a writer still at it?), the known-file cache, `inspect` (validate once, never trusting the file), and the daemon's `receive` pass over an inbox.

use super::*;

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
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    /// Changed by every write and by no one at will (unlike the mtime): a
    /// file rewritten in place with its old size and mtime is read again.
    ctime: (i64, i64),
}

impl Stamp {
    /// Is `st` (of a file renamed since) still this file, a regular file
    /// of one link? Same device and inode. Its size and mtime are not
    /// compared: a file rewritten in place (an editor's save) is the same
    /// message, read again from `.claimed/` as before, never delivered
    /// twice; an inode freed and reused by a new regular file is no worse.
    pub(super) fn still(&self, st: &nix::sys::stat::FileStat) -> bool {
        fsx::file_type(st) == SFlag::S_IFREG
            && st.st_nlink == 1
            && (st.st_dev, st.st_ino) == (self.dev, self.ino)
    }

    pub(super) fn of_stat(st: &nix::sys::stat::FileStat) -> Stamp {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

impl Known {
    pub(super) fn get(&self, st: &Stamp) -> Option<&Message> {
        self.files
            .get(&(st.dev, st.ino))
            .filter(|(known, _)| known == st)
            .map(|(_, m)| m)
    }

    pub(super) fn learn(&mut self, st: Stamp, m: &Message) {
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
    pub(super) fn keep_only(&mut self, seen: &std::collections::HashSet<(u64, u64)>) {
        self.files.retain(|k, _| seen.contains(k));
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// The ids of the messages it holds (read, and their arrival journaled,
    /// by the daemon's intake).
    pub fn ids(&self) -> std::collections::HashSet<&str> {
        self.files.values().map(|(_, m)| m.id.as_str()).collect()
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
pub(super) fn inspect_with(
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
    let (mut file, st) = match fsx::open_read_at_stat(dir, OsStr::new(name), &path) {
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
    let mtime = fsx::modified(&st);
    let quiet_for = now.duration_since(mtime).unwrap_or_default();
    // A hard link to a file the sender may not read (the daemon reads with
    // its own rights and quotes what it reads into a prompt): never read.
    // A sender that links a file in and then removes its temp name is given
    // the settle time to do so.
    if st.st_nlink > 1 {
        if let Some(why) = settle_decision(false, true, quiet_for, intake) {
            return verdict(Verdict::Unsettled(why));
        }
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "has {} hard links; a message must be a file of its own (write it, then rename it in), so it was not read",
            st.st_nlink
        ))));
    }
    let len = u64::try_from(st.st_size).unwrap_or(0);
    if len > MAX_MESSAGE_BYTES {
        return verdict(Verdict::Invalid(Rejection::file(format!(
            "is {len} bytes; the limit is {MAX_MESSAGE_BYTES} bytes (1 MiB): put large content in a file and name it in `source_ref`"
        ))));
    }
    // Sized by the stat: one read(2) when the file is the size it said.
    let bytes = match fsx::read_sized(&mut file, len, MAX_MESSAGE_BYTES) {
        Ok(b) => b,
        Err(e) => {
            return verdict(Verdict::Invalid(Rejection::file(format!(
                "cannot read: {e}"
            ))));
        }
    };
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
        Ok(m) => {
            let m = Message {
                file_owner: Some(st.st_uid),
                ..m
            };
            (Verdict::Valid(Box::new(m)), Some(Stamp::of_stat(&st)))
        }
        Err(r) => verdict(Verdict::Invalid(r)),
    }
}

/// What receiving an inbox found: valid messages waiting (by priority),
/// whether some file is still settling, and what was rejected.
#[derive(Debug, Default)]
pub struct Received {
    pub high: usize,
    pub normal: usize,
    pub unsettled: bool,
    pub rejected: Vec<Rejected>,
    /// Valid `task` messages (their tasks are added by the caller).
    pub tasks: Vec<Message>,
    /// Valid messages read for the first time (not answered from
    /// `known`), without their body: their `message_received` lines are
    /// journaled by the caller ([`super::journal_arrivals`]).
    pub arrived: Vec<Message>,
    /// Files left for a later pass: this one rejected
    /// [`REJECTED_PER_PASS`] already (each costs a few syncs), so the names
    /// after them were not looked at.
    pub deferred: usize,
    /// Valid messages answering one of a flow's messages (`source_ref`
    /// `flow-…`, the flow router's ids), with their file names: the
    /// router acts on a human's reply ("approve", "reject …", "stop").
    pub replies: Vec<(String, Message)>,
}

/// The most files one [`receive`] pass rejects: each is a rename, a reason
/// file and their syncs, and a member of the inbox group can drop junk by
/// the hundred thousand; the rest waits for the next pass (`deferred`), so
/// one inbox's junk never holds up the loop, another agent or a stop.
pub const REJECTED_PER_PASS: usize = 50;

/// Look at every waiting file as the daemon receives it: settled invalid
/// files go to `rejected/` (at most [`REJECTED_PER_PASS`] per pass), valid
/// ones are counted and left waiting for the next session to claim. Call
/// with the agent lock held. `files` is the clock the files settle by.
pub fn receive(
    agent: &AgentDir,
    now: Timestamp,
    settle: Duration,
    files: FileClock,
    writing: &Writing,
    known: &mut Known,
    listed: Option<&Listed>,
) -> Result<Received> {
    let mut out = Received::default();
    let sys_now = files.now();
    let Some(listing) = Listing::open(agent, listed)? else {
        known.keep_only(&Default::default());
        return Ok(out);
    };
    let mut undecodable = listing.undecodable;
    if undecodable.len() > REJECTED_PER_PASS {
        out.deferred += undecodable.len() - REJECTED_PER_PASS;
        undecodable.truncate(REJECTED_PER_PASS);
    }
    out.rejected.extend(reject_names(agent, undecodable, now)?);
    let mut seen = std::collections::HashSet::new();
    let total = listing.names.len();
    for (i, name) in listing.names.into_iter().enumerate() {
        if out.rejected.len() >= REJECTED_PER_PASS {
            out.deferred += total - i;
            break;
        }
        // A name listed beforehand and gone since: skipped, not rejected.
        if listed.is_some()
            && matches!(
                fsx::stat_at(
                    listing.dir.as_fd(),
                    OsStr::new(&name),
                    &agent.inbox().join(&name)
                ),
                Ok(None)
            )
        {
            continue;
        }
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
            if known.get(&stamp).is_none() && !m.is_expired(now) {
                out.arrived.push(Message {
                    body: String::new(),
                    extra: Default::default(),
                    ..(**m).clone()
                });
            }
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
                if m.source_ref
                    .as_deref()
                    .is_some_and(|r| r.starts_with("flow-"))
                {
                    out.replies.push((name.clone(), (*m).clone()));
                }
                if m.kind == MessageType::Task {
                    out.tasks.push(*m);
                }
            }
            Verdict::Unsettled(_) => out.unsettled = true,
            Verdict::Invalid(r) => {
                let kept = reject_as(agent, &agent.inbox().join(&name), &r, now)?;
                out.rejected.push(Rejected::new(name, &kept, r.reason));
            }
        }
    }
    // A partial pass did not see every file: forget nothing yet.
    if out.deferred == 0 {
        known.keep_only(&seen);
    }
    Ok(out)
}

/// A file's content version as far as stat tells: size and mtime to the
/// nanosecond.
pub(super) fn file_version(st: &nix::sys::stat::FileStat) -> String {
    format!("{}:{}.{:09}", st.st_size, st.st_mtime, st.st_mtime_nsec)
}
