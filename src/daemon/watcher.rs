//! Watches every agent's `inbox/` (inotify, with exactly the events acted
//! on) and turns what happens there into loop events. It never reads a
//! message: it only says "look at rio's inbox" — the scan decides.
//!
//! Acted on: a file closed after writing (`IN_CLOSE_WRITE`), a file moved in
//! (`IN_MOVED_TO`: the senders' rename from `inbox/.tmp/`), a file created
//! (`IN_CREATE`: a hard link, as Maildir delivery makes), a file written to
//! and not yet closed (`IN_MODIFY`: a writer has it open), and the inbox
//! itself removed or moved away (`IN_DELETE_SELF`, `IN_MOVE_SELF`). A
//! `.wake-*` dotfile is a wake request. Anything the watcher cannot account
//! for (queue overflow, a read error) asks for a full rescan of every inbox.
//!
//! While an agent's session runs, its directory is watched too, for
//! session.json replaced (`IN_MOVED_TO`): its script's own `session
//! end|fail` is told to the session's machine as it happens.
//!
//! Nothing else is asked of the kernel: no `IN_OPEN`, `IN_ATTRIB`,
//! `IN_DELETE` or `IN_MOVED_FROM`, so the daemon's own reads and claims
//! (every message opened, every rename out of the inbox) queue no event and
//! wake no thread. (The `notify` crate always asks for `IN_OPEN` and more.)

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc::UnboundedSender;

use super::files::is_wake_request;
use crate::agent_name::AgentName;
use crate::error::{Error, Result};
use crate::inbox::is_message_name;

/// The document a script's `session end|fail` replaces.
const SESSION_FILE: &str = "session.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// Something arrived in this agent's inbox.
    Inbox(AgentName),
    /// A message file was written to and is not closed yet.
    Writing(AgentName, String),
    /// A message file was closed after writing (it has arrived, too).
    Closed(AgentName, String),
    /// A file in `inbox/rejected/` was written to: perhaps a message
    /// rejected as unfinished has been finished.
    Rejected(AgentName),
    /// The watched inbox directory itself was removed or moved away.
    Lost(AgentName),
    /// `agent-state wake` asked for a session of this agent (the request
    /// file's name).
    Wake(AgentName, String),
    /// Events may have been lost: scan every inbox.
    Rescan(String),
    /// This agent's session.json was replaced while its session runs: its
    /// script may have said its end (`session end|fail`).
    Session(AgentName),
}

/// What a watch descriptor watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Inbox,
    Rejected,
    /// The agent's directory, while its session runs: only session.json's
    /// replacement (a rename) is acted on.
    Session,
}

type ByWatch = Arc<Mutex<HashMap<WatchDescriptor, (AgentName, Watched)>>>;

pub struct InboxWatcher {
    watches: Watches,
    by_watch: ByWatch,
    watched: BTreeMap<AgentName, (PathBuf, WatchDescriptor, Option<WatchDescriptor>)>,
    /// The directories of the agents whose session runs.
    sessions: BTreeMap<AgentName, WatchDescriptor>,
}

/// An agent's directory while its session runs: state documents are
/// replaced by a rename; appends to the journal ask for nothing.
fn session_mask() -> WatchMask {
    WatchMask::MOVED_TO | WatchMask::ONLYDIR | WatchMask::DONT_FOLLOW | WatchMask::EXCL_UNLINK
}

/// An inbox: what arrives, what is written, the directory itself going.
fn inbox_mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

/// `inbox/rejected/`: a file written to there.
fn rejected_mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

impl InboxWatcher {
    /// Start the watcher's thread, which reads the kernel's events and
    /// sends what they mean on `tx`.
    pub fn new(tx: UnboundedSender<WatchEvent>) -> Result<InboxWatcher> {
        let start = |e: std::io::Error| Error::Data(format!("cannot start the inbox watcher: {e}"));
        let mut inotify = Inotify::init().map_err(start)?;
        let watches = inotify.watches();
        let by_watch: ByWatch = Default::default();
        let map = by_watch.clone();
        std::thread::Builder::new()
            .name("inbox-watch".into())
            .spawn(move || {
                let mut buffer = vec![0u8; 64 * 1024];
                loop {
                    let events = match inotify.read_events_blocking(&mut buffer) {
                        Ok(events) => events,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            if tx
                                .send(WatchEvent::Rescan(format!("watcher error: {e}")))
                                .is_err()
                            {
                                return;
                            }
                            // Not a busy loop on an error that stays.
                            std::thread::sleep(std::time::Duration::from_secs(1));
                            continue;
                        }
                    };
                    let mut out = Vec::new();
                    {
                        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                        for event in events {
                            let what = map.get(&event.wd).cloned();
                            if event.mask.contains(EventMask::IGNORED) {
                                map.remove(&event.wd);
                            }
                            for e in classify(event.mask, what.as_ref(), event.name) {
                                coalesce(&mut out, e);
                            }
                        }
                    }
                    for e in out {
                        // The loop is gone only when the daemon is shutting down.
                        if tx.send(e).is_err() {
                            return;
                        }
                    }
                }
            })
            .map_err(start)?;
        Ok(InboxWatcher {
            watches,
            by_watch,
            watched: BTreeMap::new(),
            sessions: BTreeMap::new(),
        })
    }

    /// Watch `agent`'s inbox and its `rejected/` (where a message rejected
    /// as unfinished may be finished). Only real directories: never a link.
    pub fn watch(&mut self, agent: &AgentName, inbox: &Path) -> Result<()> {
        if self.watched.contains_key(agent) {
            return Ok(());
        }
        crate::fsx::dir(inbox)?;
        // Registered under the lock the reader takes: no event of a new
        // watch is read before it is known whose it is.
        let mut map = self.by_watch.lock().unwrap_or_else(|p| p.into_inner());
        let wd = self
            .watches
            .add(inbox, inbox_mask())
            .map_err(|e| Error::Data(format!("cannot watch {}: {e}", inbox.display())))?;
        map.insert(wd.clone(), (agent.clone(), Watched::Inbox));
        let rejected = inbox.join("rejected");
        let rejected_wd = if crate::fsx::is_dir(&rejected) {
            self.watches.add(&rejected, rejected_mask()).ok()
        } else {
            None
        };
        if let Some(r) = &rejected_wd {
            map.insert(r.clone(), (agent.clone(), Watched::Rejected));
        }
        self.watched
            .insert(agent.clone(), (inbox.to_path_buf(), wd, rejected_wd));
        Ok(())
    }

    /// Whether `agent`'s inbox is watched now.
    pub fn is_watching(&self, agent: &AgentName) -> bool {
        self.watched.contains_key(agent)
    }

    /// Forget a watch the kernel dropped (its directory is gone).
    pub fn forget(&mut self, agent: &AgentName) {
        if let Some((_, wd, rejected)) = self.watched.remove(agent) {
            let mut map = self.by_watch.lock().unwrap_or_else(|p| p.into_inner());
            for wd in std::iter::once(wd).chain(rejected) {
                map.remove(&wd);
                let _ = self.watches.remove(wd);
            }
        }
    }

    pub fn unwatch(&mut self, agent: &AgentName) {
        self.forget(agent);
    }

    /// Watch `agent`'s directory while its session runs, so a script's own
    /// `session end|fail` (a new session.json) is heard as it happens.
    pub fn watch_session(&mut self, agent: &AgentName, dir: &Path) -> Result<()> {
        self.unwatch_session(agent);
        let mut map = self.by_watch.lock().unwrap_or_else(|p| p.into_inner());
        let wd = self
            .watches
            .add(dir, session_mask())
            .map_err(|e| Error::Data(format!("cannot watch {}: {e}", dir.display())))?;
        map.insert(wd.clone(), (agent.clone(), Watched::Session));
        self.sessions.insert(agent.clone(), wd);
        Ok(())
    }

    /// Its session ended: its directory is no longer watched.
    pub fn unwatch_session(&mut self, agent: &AgentName) {
        if let Some(wd) = self.sessions.remove(agent) {
            let mut map = self.by_watch.lock().unwrap_or_else(|p| p.into_inner());
            map.remove(&wd);
            let _ = self.watches.remove(wd);
        }
    }

    pub fn watched(&self) -> impl Iterator<Item = &AgentName> {
        self.watched.keys()
    }
}

/// Add `e` to a batch of events once, where its last occurrence is: the
/// loop must see a file's `Writing` and `Closed` in the order they last
/// happened (a batch holding the close of one write, the next write and
/// its close must end in `Closed`, or the file would count as still open
/// for writing and wait out the writer's patience before it is claimed).
fn coalesce(out: &mut Vec<WatchEvent>, e: WatchEvent) {
    if let Some(i) = out.iter().position(|x| *x == e) {
        out.remove(i);
    }
    out.push(e);
}

/// What one inotify event means for the loop. `what` is what its watch
/// watches (`None`: a watch already forgotten), `name` the file's name in
/// that directory (`None`: the directory itself).
fn classify(
    mask: EventMask,
    what: Option<&(AgentName, Watched)>,
    name: Option<&OsStr>,
) -> Vec<WatchEvent> {
    if mask.contains(EventMask::Q_OVERFLOW) {
        return vec![WatchEvent::Rescan(
            "the watcher's event queue overflowed".into(),
        )];
    }
    let Some((agent, watched)) = what else {
        return Vec::new();
    };
    let agent = agent.clone();
    let closed = mask.contains(EventMask::CLOSE_WRITE);
    let written = mask.contains(EventMask::MODIFY);
    let arrived = closed || mask.intersects(EventMask::MOVED_TO | EventMask::CREATE);
    match watched {
        // A message its sender finishes where it lies; never the daemon's
        // own reason files and temp files (each rejection writes one: an
        // event for each would look at the whole of `rejected/` again).
        Watched::Rejected
            if (closed || written)
                && name
                    .and_then(OsStr::to_str)
                    .is_none_or(|n| !n.starts_with('.') && !n.ends_with(".reason.json")) =>
        {
            return vec![WatchEvent::Rejected(agent)];
        }
        Watched::Rejected => return Vec::new(),
        Watched::Session
            if mask.contains(EventMask::MOVED_TO)
                && name.is_some_and(|n| n == OsStr::new(SESSION_FILE)) =>
        {
            return vec![WatchEvent::Session(agent)];
        }
        Watched::Session => return Vec::new(),
        Watched::Inbox => {}
    }
    // The watched inbox itself removed or moved away: its watch is gone
    // with it.
    if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF) {
        return vec![WatchEvent::Lost(agent)];
    }
    if mask.contains(EventMask::ISDIR) {
        return Vec::new();
    }
    // A name that is not UTF-8 is looked at too (to be rejected under a
    // safe name), never skipped forever.
    let Some(name) = name.map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let message = !name.starts_with('.') && name.ends_with(".json");
    // A wake request is one when its name appears (its close adds nothing).
    let appeared = mask.intersects(EventMask::MOVED_TO | EventMask::CREATE);
    let event = if is_wake_request(&name) && appeared {
        WatchEvent::Wake(agent, name)
    } else if message && written && !closed {
        WatchEvent::Writing(agent, name)
    } else if message && closed {
        WatchEvent::Closed(agent, name)
    } else if (is_message_name(&name) || message) && arrived {
        WatchEvent::Inbox(agent)
    } else {
        return Vec::new();
    };
    vec![event]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_keeps_the_last_order_of_writing_and_closed() {
        let rio = AgentName::parse("rio").unwrap();
        let writing = || WatchEvent::Writing(rio.clone(), "edited.json".into());
        let closed = || WatchEvent::Closed(rio.clone(), "edited.json".into());
        // `printf … > edited.json; printf … >> edited.json`, the first
        // write read in an earlier batch: close, write, close.
        let mut out = Vec::new();
        for e in [closed(), writing(), closed()] {
            coalesce(&mut out, e);
        }
        assert_eq!(out, [writing(), closed()]);
        let mut out = Vec::new();
        for e in [writing(), closed(), writing()] {
            coalesce(&mut out, e);
        }
        assert_eq!(out, [closed(), writing()], "still being written");
    }

    fn ev(mask: EventMask, watched: Watched, name: Option<&str>) -> Vec<WatchEvent> {
        let rio = AgentName::parse("rio").unwrap();
        classify(mask, Some(&(rio, watched)), name.map(OsStr::new))
    }

    #[test]
    fn what_counts_as_arrival() {
        let rio = AgentName::parse("rio").unwrap();
        let inbox = Watched::Inbox;
        let closed = EventMask::CLOSE_WRITE;
        let moved = EventMask::MOVED_TO;
        assert_eq!(
            ev(closed, inbox, Some("a.json")),
            [WatchEvent::Closed(rio.clone(), "a.json".into())]
        );
        assert_eq!(
            ev(moved, inbox, Some("a.json")),
            [WatchEvent::Inbox(rio.clone())]
        );
        assert_eq!(
            ev(EventMask::CREATE, inbox, Some("a.json")),
            [WatchEvent::Inbox(rio.clone())]
        );
        assert_eq!(
            ev(moved, inbox, Some(".wake-1")),
            [WatchEvent::Wake(rio.clone(), ".wake-1".into())]
        );
        // Editor leftovers, dotfiles, directories: nothing.
        assert!(ev(closed, inbox, Some(".a.json.swp")).is_empty());
        assert!(ev(closed, inbox, Some("a.json~")).is_empty());
        assert!(ev(closed, inbox, Some("4913")).is_empty());
        assert!(ev(EventMask::CREATE | EventMask::ISDIR, inbox, Some("x.json")).is_empty());
        // Written and not yet closed: a writer has it open.
        assert_eq!(
            ev(EventMask::MODIFY, inbox, Some("a.json")),
            [WatchEvent::Writing(rio.clone(), "a.json".into())]
        );
        assert_eq!(
            ev(closed, Watched::Rejected, Some("a.json")),
            [WatchEvent::Rejected(rio.clone())]
        );
        assert!(ev(moved, Watched::Rejected, Some("a.json")).is_empty());
        // The daemon's own writes there: its reason files, its temp files.
        assert!(ev(closed, Watched::Rejected, Some("a.json.reason.json")).is_empty());
        assert!(ev(closed, Watched::Rejected, Some(".as-0123456789ab.tmp")).is_empty());
        assert_eq!(
            ev(EventMask::DELETE_SELF, inbox, None),
            [WatchEvent::Lost(rio.clone())]
        );
        assert_eq!(
            ev(EventMask::MOVE_SELF, inbox, None),
            [WatchEvent::Lost(rio.clone())]
        );
        // An agent's directory while its session runs: session.json
        // replaced, nothing else.
        assert_eq!(
            ev(moved, Watched::Session, Some("session.json")),
            [WatchEvent::Session(rio.clone())]
        );
        assert!(ev(moved, Watched::Session, Some("report.json")).is_empty());
        assert!(ev(closed, Watched::Session, Some("session.json")).is_empty());
        assert!(ev(EventMask::DELETE_SELF, Watched::Session, None).is_empty());
        // A watch already forgotten.
        assert!(classify(closed, None, Some(OsStr::new("a.json"))).is_empty());
    }

    #[test]
    fn overflow_asks_for_a_rescan() {
        assert!(matches!(
            classify(EventMask::Q_OVERFLOW, None, None)[..],
            [WatchEvent::Rescan(_)]
        ));
    }

    #[test]
    fn the_kernel_is_asked_for_no_open_or_access() {
        for mask in [inbox_mask(), rejected_mask(), session_mask()] {
            assert!(!mask.intersects(
                WatchMask::OPEN
                    | WatchMask::ACCESS
                    | WatchMask::ATTRIB
                    | WatchMask::CLOSE_NOWRITE
                    | WatchMask::MOVED_FROM
                    | WatchMask::DELETE
            ));
        }
    }
}
