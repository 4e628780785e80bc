//! Watches every agent's `inbox/` (inotify through the notify crate) and
//! turns what happens there into loop events. It never reads a message: it
//! only says "look at rio's inbox" — the scan decides.
//!
//! Acted on: a file closed after writing, a file moved in (the senders'
//! rename from `inbox/.tmp/`), a file created (a hard link, as Maildir
//! delivery makes). A `.wake-*` dotfile is a wake request. Anything the
//! watcher cannot account for (queue overflow, an error) asks for a full
//! rescan of every inbox.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

use super::files::is_wake_request;
use crate::agent_name::AgentName;
use crate::error::{Error, Result};
use crate::inbox::is_message_name;

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
    /// `agent-state wake` asked for a session of this agent.
    Wake(AgentName),
    /// Events may have been lost: scan every inbox.
    Rescan(String),
}

pub struct InboxWatcher {
    watcher: RecommendedWatcher,
    watched: BTreeMap<AgentName, PathBuf>,
}

impl InboxWatcher {
    pub fn new(tx: UnboundedSender<WatchEvent>) -> Result<InboxWatcher> {
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
            for event in classify(res) {
                // The loop is gone only when the daemon is shutting down.
                let _ = tx.send(event);
            }
        })
        .map_err(|e| Error::Data(format!("cannot start the inbox watcher: {e}")))?;
        Ok(InboxWatcher {
            watcher,
            watched: BTreeMap::new(),
        })
    }

    /// Watch `agent`'s inbox and its `rejected/` (where a message rejected
    /// as unfinished may be finished). Only real directories: never a link.
    pub fn watch(&mut self, agent: &AgentName, inbox: &Path) -> Result<()> {
        if self.watched.contains_key(agent) {
            return Ok(());
        }
        crate::fsx::dir(inbox)?;
        self.watcher
            .watch(inbox, RecursiveMode::NonRecursive)
            .map_err(|e| Error::Data(format!("cannot watch {}: {e}", inbox.display())))?;
        let rejected = inbox.join("rejected");
        if crate::fsx::is_dir(&rejected) {
            let _ = self.watcher.watch(&rejected, RecursiveMode::NonRecursive);
        }
        self.watched.insert(agent.clone(), inbox.to_path_buf());
        Ok(())
    }

    /// Whether `agent`'s inbox is watched now.
    pub fn is_watching(&self, agent: &AgentName) -> bool {
        self.watched.contains_key(agent)
    }

    /// Forget a watch the kernel dropped (its directory is gone).
    pub fn forget(&mut self, agent: &AgentName) {
        if let Some(path) = self.watched.remove(agent) {
            let _ = self.watcher.unwatch(&path);
            let _ = self.watcher.unwatch(&path.join("rejected"));
        }
    }

    pub fn unwatch(&mut self, agent: &AgentName) {
        self.forget(agent);
    }

    pub fn watched(&self) -> impl Iterator<Item = &AgentName> {
        self.watched.keys()
    }
}

/// What one notify callback means for the loop.
fn classify(res: notify::Result<notify::Event>) -> Vec<WatchEvent> {
    let event = match res {
        Ok(e) => e,
        Err(e) => return vec![WatchEvent::Rescan(format!("watcher error: {e}"))],
    };
    if event.need_rescan() {
        return vec![WatchEvent::Rescan(
            "the watcher's event queue overflowed".into(),
        )];
    }
    let closed = matches!(
        event.kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
    );
    let written = matches!(event.kind, EventKind::Modify(ModifyKind::Data(_)));
    let arrived = closed
        || matches!(
            event.kind,
            EventKind::Modify(ModifyKind::Name(
                RenameMode::To | RenameMode::Both | RenameMode::Any
            )) | EventKind::Create(CreateKind::File | CreateKind::Any)
        );
    // The watched inbox itself removed or moved away (IN_DELETE_SELF,
    // IN_MOVE_SELF): its watch is gone with it.
    let self_gone = matches!(
        event.kind,
        EventKind::Remove(_)
            | EventKind::Modify(ModifyKind::Name(RenameMode::From | RenameMode::Any))
    );
    let mut out = Vec::new();
    let mut push = |e: WatchEvent| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    for path in &event.paths {
        if self_gone && let Some(agent) = inbox_itself(path) {
            push(WatchEvent::Lost(agent));
            continue;
        }
        if (closed || written)
            && let Some(agent) = rejected_of(path)
        {
            push(WatchEvent::Rejected(agent));
            continue;
        }
        let Some(agent) = agent_of(path) else {
            continue;
        };
        // A name that is not UTF-8 is looked at too (to be rejected under a
        // safe name), never skipped forever.
        let name = match path.file_name() {
            Some(n) => n.to_string_lossy().into_owned(),
            None => continue,
        };
        let message = !name.starts_with('.') && name.ends_with(".json");
        if is_wake_request(&name) && arrived {
            push(WatchEvent::Wake(agent));
        } else if message && written && !closed {
            push(WatchEvent::Writing(agent, name));
        } else if message && closed {
            push(WatchEvent::Closed(agent, name));
        } else if (is_message_name(&name) || message) && arrived {
            push(WatchEvent::Inbox(agent));
        }
    }
    out
}

/// `{root}/{agent}/inbox` itself → the agent.
fn inbox_itself(path: &Path) -> Option<AgentName> {
    if path.file_name()? != "inbox" {
        return None;
    }
    AgentName::parse(path.parent()?.file_name()?.to_str()?).ok()
}

/// `{root}/{agent}/inbox/rejected/{file}` → the agent.
fn rejected_of(path: &Path) -> Option<AgentName> {
    let rejected = path.parent()?;
    if rejected.file_name()? != "rejected" {
        return None;
    }
    inbox_itself(rejected.parent()?)
}

/// `{root}/{agent}/inbox/{file}` → the agent.
fn agent_of(path: &Path) -> Option<AgentName> {
    let inbox = path.parent()?;
    if inbox.file_name()? != "inbox" {
        return None;
    }
    AgentName::parse(inbox.parent()?.file_name()?.to_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::Event;

    fn ev(kind: EventKind, path: &str) -> Vec<WatchEvent> {
        classify(Ok(Event::new(kind).add_path(PathBuf::from(path))))
    }

    #[test]
    fn what_counts_as_arrival() {
        let rio = AgentName::parse("rio").unwrap();
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        let moved = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert_eq!(
            ev(closed, "/s/rio/inbox/a.json"),
            [WatchEvent::Closed(rio.clone(), "a.json".into())]
        );
        assert_eq!(
            ev(moved, "/s/rio/inbox/a.json"),
            [WatchEvent::Inbox(rio.clone())]
        );
        assert_eq!(
            ev(moved, "/s/rio/inbox/.wake-1"),
            [WatchEvent::Wake(rio.clone())]
        );
        // Editor leftovers, dotfiles, data writes in progress: nothing.
        assert!(ev(closed, "/s/rio/inbox/.a.json.swp").is_empty());
        assert!(ev(closed, "/s/rio/inbox/a.json~").is_empty());
        assert!(ev(closed, "/s/rio/inbox/4913").is_empty());
        assert!(ev(EventKind::Modify(ModifyKind::Any), "/s/rio/inbox/a.json").is_empty());
        // Written and not yet closed: a writer has it open.
        let data = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        assert_eq!(
            ev(data, "/s/rio/inbox/a.json"),
            [WatchEvent::Writing(rio.clone(), "a.json".into())]
        );
        assert_eq!(
            ev(closed, "/s/rio/inbox/rejected/a.json"),
            [WatchEvent::Rejected(rio.clone())]
        );
        let gone = EventKind::Remove(notify::event::RemoveKind::Folder);
        assert_eq!(ev(gone, "/s/rio/inbox"), [WatchEvent::Lost(rio.clone())]);
        // Not an inbox.
        assert!(ev(closed, "/s/rio/a.json").is_empty());
    }

    #[test]
    fn overflow_asks_for_a_rescan() {
        let e = Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        assert!(matches!(classify(Ok(e))[..], [WatchEvent::Rescan(_)]));
    }
}
