//! Wake requests: the `inbox/.wake-*` files `agent-state wake` drops. They
//! are learned by name from the watcher's events (and from a listing at
//! start, at the reconcile scan and after a lost event), served as one wake
//! per loop turn however many arrived, and removed at most
//! [`REMOVED_PER_TURN`] per agent per loop turn.
//!
//! Any member of the inbox group may make a wake request, so a flood of
//! them (and of junk beside them) is somebody's input: it must never hold
//! up the loop, another agent or a stop. Hence no listing per event (a
//! listing of a flooded inbox costs its whole size), a bounded amount of
//! work per turn (the rest deferred to the next turn, counted, and logged
//! once), and one journal line for all the requests a running session
//! makes wait.

use super::*;

/// The most wake requests removed per agent per loop turn (a few
/// milliseconds of unlinks); the rest wait for the next turn.
pub(super) const REMOVED_PER_TURN: usize = 500;
/// The most request names remembered per agent; past it the inbox is
/// listed again once those are removed.
const NAMES_KEPT: usize = 10_000;
/// The most `wake_skipped` lines journaled for manual wakes per running
/// session: each `agent-state wake` a person types is journaled, a flood
/// is not (it is logged once).
const SKIPS_JOURNALED: usize = 10;

/// What the loop keeps of wake requests between turns.
#[derive(Default)]
pub(super) struct WakeRequests {
    /// Per agent, requests seen and not yet removed.
    backlog: BTreeMap<AgentName, Backlog>,
    /// Requests whose removal failed (a read-only disk): served once, never
    /// again, removed when possible.
    failed: std::collections::BTreeSet<PathBuf>,
    /// Per agent, the running session the last `wake_skipped` lines were
    /// journaled for, and how many: at most [`SKIPS_JOURNALED`] per session.
    skip_noted: BTreeMap<AgentName, (String, usize)>,
}

#[derive(Default)]
struct Backlog {
    names: std::collections::BTreeSet<String>,
    /// More requests were seen than are remembered: list the inbox again
    /// once `names` is empty.
    list_again: bool,
    /// A request arrived since the last wake was asked for.
    unserved: bool,
    /// Requests seen in this backlog (for the log).
    seen: u64,
    /// The deferral was logged.
    logged: bool,
}

impl WakeRequests {
    /// A request named `name` arrived in `agent`'s inbox.
    pub(super) fn arrived(&mut self, agent: &AgentName, name: String) {
        let b = self.backlog.entry(agent.clone()).or_default();
        if b.names.len() >= NAMES_KEPT {
            b.list_again = true;
            b.unserved = true;
        } else if b.names.insert(name) {
            b.seen += 1;
            b.unserved = true;
        }
    }

    /// Whether there is work left for the next loop turn.
    pub(super) fn pending(&self) -> bool {
        !self.backlog.is_empty()
    }
}

impl Daemon {
    /// Learn every wake request in `agent`'s inbox from a listing (at
    /// start, the reconcile scan, a rescan, a reload); they are served at
    /// the end of this loop turn. Never through a link: a request is a name.
    pub(super) fn take_wake_requests(&mut self, agent: &AgentName) {
        let inbox_dir = self.dir(agent).inbox();
        let Ok(names) = crate::fsx::list(&inbox_dir) else {
            return;
        };
        let requests = &mut self.intake.requests;
        if let Some(b) = requests.backlog.get_mut(agent) {
            b.list_again = false;
        }
        for name in names {
            let Some(name) = name.to_str() else {
                continue;
            };
            if !files::is_wake_request(name) {
                continue;
            }
            let path = inbox_dir.join(name);
            if requests.failed.contains(&path) {
                // Served already; its removal failed (a read-only disk):
                // removed now if it can be, never served twice.
                if crate::fsx::remove_file(&path).is_ok() {
                    requests.failed.remove(&path);
                }
            } else {
                requests.arrived(agent, name.to_string());
            }
        }
    }

    /// One loop turn of wake requests: a wake for each agent with a new
    /// request, and at most [`REMOVED_PER_TURN`] request files removed per
    /// agent.
    pub(super) fn serve_wake_requests(&mut self) {
        let agents: Vec<AgentName> = self.intake.requests.backlog.keys().cloned().collect();
        for agent in agents {
            self.serve_wake_requests_of(&agent);
        }
    }

    fn serve_wake_requests_of(&mut self, agent: &AgentName) {
        let Some(mut b) = self.intake.requests.backlog.remove(agent) else {
            return;
        };
        if !self.core.contains(agent) {
            return;
        }
        if b.names.is_empty() && b.list_again {
            self.intake.requests.backlog.insert(agent.clone(), b);
            self.take_wake_requests(agent);
            let Some(again) = self.intake.requests.backlog.remove(agent) else {
                return;
            };
            b = again;
        }
        let inbox_dir = self.dir(agent).inbox();
        // One handle for the turn's removals (never through a link): an
        // unlink each, not a walk of the path each.
        let handle = crate::fsx::open_dir(&inbox_dir);
        for _ in 0..REMOVED_PER_TURN {
            let Some(name) = b.names.pop_first() else {
                break;
            };
            let path = inbox_dir.join(&name);
            let removed = match &handle {
                Ok(Some(fd)) => match nix::unistd::unlinkat(
                    fd,
                    name.as_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                ) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
                    Err(e) => Err(e.to_string()),
                },
                // The inbox is gone: so are its requests.
                Ok(None) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            match removed {
                Ok(()) => {
                    self.intake.requests.failed.remove(&path);
                }
                Err(e) => {
                    tracing::warn!(agent = %agent, "cannot remove the wake request {}: {e}; it is served once", path.display());
                    self.intake.requests.failed.insert(path);
                }
            }
        }
        if b.unserved {
            b.unserved = false;
            if self.request_manual_wake(agent) {
                tracing::info!(agent = %agent, "wake requested");
            }
        }
        if b.names.is_empty() && !b.list_again {
            // Said once, when a backlog was big enough to be deferred.
            if b.logged {
                tracing::info!(agent = %agent, "the {} wake requests in its inbox are served and removed", b.seen);
            }
            return;
        }
        if !b.logged {
            b.logged = true;
            tracing::warn!(agent = %agent, "{} wake requests or more in its inbox: collapsed into one wake, removed {REMOVED_PER_TURN} per loop turn, the rest deferred (every other agent is served meanwhile)", b.seen);
        }
        self.intake.requests.backlog.insert(agent.clone(), b);
    }

    /// Ask for a manual wake; while a session runs, journal its skip (at
    /// most [`SKIPS_JOURNALED`] times per session). Whether this is worth a
    /// log line: not merged into a manual wake already waiting, nor past
    /// the journaled skips.
    fn request_manual_wake(&mut self, agent: &AgentName) -> bool {
        let now = self.clock.now();
        let waiting = self
            .core
            .slot(agent)
            .and_then(|s| s.pending.as_ref().map(|p| p.reason == WakeReason::Manual))
            .unwrap_or(false);
        let Some(s) = self
            .core
            .request(agent, WakeReason::Manual, Priority::High, now)
        else {
            return !waiting;
        };
        let noted = self
            .intake
            .requests
            .skip_noted
            .entry(agent.clone())
            .or_default();
        if noted.0 != s.running {
            *noted = (s.running.clone(), 0);
        }
        noted.1 += 1;
        match noted.1 {
            n if n <= SKIPS_JOURNALED => {
                self.skipped(s);
                true
            }
            n if n == SKIPS_JOURNALED + 1 => {
                tracing::warn!(agent = %agent, session_id = %s.running, "more than {SKIPS_JOURNALED} manual wakes while session {} runs: the rest are not journaled (one follow-up session serves them all)", s.running);
                false
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_collapse_and_are_bounded() {
        let rio = AgentName::parse("rio").unwrap();
        let mut r = WakeRequests::default();
        for i in 0..NAMES_KEPT + 5 {
            r.arrived(&rio, format!(".wake-{i}"));
        }
        r.arrived(&rio, ".wake-0".into());
        let b = &r.backlog[&rio];
        assert_eq!(b.names.len(), NAMES_KEPT, "no more names than kept");
        assert_eq!(b.seen, NAMES_KEPT as u64, "a name seen twice counts once");
        assert!(b.list_again, "the rest is found by a listing later");
        assert!(b.unserved);
        assert!(r.pending());
    }
}
