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

    pub fn watch(&mut self, agent: &AgentName, inbox: &Path) -> Result<()> {
        if self.watched.contains_key(agent) {
            return Ok(());
        }
        self.watcher
            .watch(inbox, RecursiveMode::NonRecursive)
            .map_err(|e| Error::Data(format!("cannot watch {}: {e}", inbox.display())))?;
        self.watched.insert(agent.clone(), inbox.to_path_buf());
        Ok(())
    }

    pub fn unwatch(&mut self, agent: &AgentName) {
        if let Some(path) = self.watched.remove(agent) {
            let _ = self.watcher.unwatch(&path);
        }
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
    let relevant = matches!(
        event.kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(
                RenameMode::To | RenameMode::Both | RenameMode::Any
            ))
            | EventKind::Create(CreateKind::File | CreateKind::Any)
    );
    if !relevant {
        return Vec::new();
    }
    let mut out = Vec::new();
    for path in &event.paths {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(agent) = agent_of(path) else {
            continue;
        };
        let e = if is_wake_request(name) {
            WatchEvent::Wake(agent)
        } else if is_message_name(name) {
            WatchEvent::Inbox(agent)
        } else {
            continue;
        };
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
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
            [WatchEvent::Inbox(rio.clone())]
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
        // Not an inbox.
        assert!(ev(closed, "/s/rio/a.json").is_empty());
    }

    #[test]
    fn overflow_asks_for_a_rescan() {
        let e = Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        assert!(matches!(classify(Ok(e))[..], [WatchEvent::Rescan(_)]));
    }
}
