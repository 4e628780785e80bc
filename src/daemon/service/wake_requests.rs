//! Wake requests: the `inbox/.wake-*` files `agent-state wake` drops. They
//! are learned by name from the watcher's events (and from a listing at
//! start, at the reconcile scan and after a lost event), served as one wake
//! per loop turn however many arrived, and removed off the loop.
//!
//! Any member of the inbox group may make a wake request, so a flood of
//! them (and of junk beside them) is somebody's input: it must never hold
//! up the loop, another agent or a stop. Hence no listing per event (a
//! listing of a flooded inbox costs its whole size), the removals (an
//! unlink each, [`SWEPT_PER_BATCH`] at a time) and the listing that finds
//! the requests past [`NAMES_KEPT`] done on a blocking thread, one batch per
//! agent at a time ([`Event::WakeRequestsSwept`] comes back), the
//! backlog logged once, and one journal line for all the requests a running
//! session makes wait. Serving a request (the wake) never waits for its
//! removal: a request is served when it is seen, once.
//!
//! A request starts a session of an idle agent at most once per its
//! `wake_request_interval` (default 1 s): one arriving sooner after the
//! last session a request started is held, with every other arriving
//! meanwhile, until that interval has passed ([`wake_request_due`]), and is
//! served by any session of that agent that starts first. A flood of
//! requests costs the loop one session begin and end per interval, not one
//! after another. Schedules, mail and a running session's skips are as
//! before.

use super::*;

/// The most wake requests one blocking batch removes (tens of
/// milliseconds of unlinks in a flooded directory, off the loop); the rest
/// wait for the next batch.
pub(super) const SWEPT_PER_BATCH: usize = 5_000;
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
    /// Agents with a batch of removals (and perhaps a listing) on a
    /// blocking thread: no second one until it comes back.
    sweeping: std::collections::BTreeSet<AgentName>,
    /// Per agent, when its last session asked for by a wake request began
    /// (the `wake_request_interval` counts from it).
    started: BTreeMap<AgentName, DateTime<Utc>>,
    /// Per agent, a wake request held back by `wake_request_interval`:
    /// asked for at this time (however many more arrive meanwhile), unless
    /// a session of that agent starts first and serves it.
    held: BTreeMap<AgentName, DateTime<Utc>>,
}

/// When a wake request for an idle agent may ask for a session: `None` now,
/// else the time. `last` is when the agent's last session asked for by a
/// wake request began, `interval` its `wake_request_interval`. A clock
/// stepped back (a `last` in the future) never holds a request longer than
/// `interval` from now.
pub(super) fn wake_request_due(
    last: Option<DateTime<Utc>>,
    interval: Duration,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let last = last?;
    let due = crate::clock::later(last, interval).min(crate::clock::later(now, interval));
    (due > now).then_some(due)
}

/// What a batch of removals did, off the loop.
pub(super) struct Swept {
    pub(super) agent: AgentName,
    /// The names it was given.
    pub(super) batch: Vec<String>,
    /// Names it could not remove, and why.
    pub(super) failed: Vec<(String, String)>,
    /// With a listing: the wake requests it found in the inbox.
    pub(super) listed: Option<Vec<String>>,
    /// The listing is the start's or the reconcile scan's: what it finds
    /// is served (one wake), not only removed.
    serves: bool,
}

#[derive(Default)]
struct Backlog {
    names: std::collections::BTreeSet<String>,
    /// More requests were seen than are remembered: list the inbox again
    /// once `names` is empty.
    list_again: bool,
    /// A request arrived since the last wake was asked for.
    unserved: bool,
    /// The listing asked for is a big inbox's at start, at the reconcile
    /// scan or a reload (made off the loop): what it finds asks for a wake.
    list_serves: bool,
    /// Requests seen in this backlog (for the log).
    seen: u64,
    /// The deferral was logged.
    logged: bool,
}

impl WakeRequests {
    /// Learn every wake request in `agent`'s inbox from a listing (at
    /// start, the reconcile scan, a rescan, a reload); they are served at
    /// the end of this loop turn. Never through a link: a request is a name.
    pub(super) fn take(&mut self, dir: &AgentDir) {
        let agent = &dir.name;
        if inbox::is_big(dir) {
            // A flooded inbox: listed on a blocking thread (its listing
            // costs tens of milliseconds per 100,000 entries), what it
            // finds served when it is back.
            let b = self.backlog.entry(agent.clone()).or_default();
            b.list_again = true;
            b.list_serves = true;
            return;
        }
        let inbox_dir = dir.inbox();
        let Ok(names) = crate::fsx::list(&inbox_dir) else {
            return;
        };
        let requests = self;
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

    /// A batch of removals came back: failures noted (each such request was
    /// served once, and is never served again), a listing's requests
    /// remembered.
    /// (`known`: the agent is still configured.)
    pub(super) fn swept(&mut self, root: &StateRoot, known: bool, swept: Swept) {
        let requests = self;
        requests.sweeping.remove(&swept.agent);
        let inbox_dir = root.agent(&swept.agent).inbox();
        let failed: std::collections::BTreeMap<&String, &String> =
            swept.failed.iter().map(|(n, e)| (n, e)).collect();
        for name in &swept.batch {
            let path = inbox_dir.join(name);
            match failed.get(name) {
                None => {
                    requests.failed.remove(&path);
                }
                Some(e) => {
                    tracing::warn!(agent = %swept.agent, "cannot remove the wake request {}: {e}; it is served once", path.display());
                    requests.failed.insert(path);
                }
            }
        }
        if !known {
            requests.backlog.remove(&swept.agent);
            return;
        }
        for name in swept.listed.unwrap_or_default() {
            if requests.failed.contains(&inbox_dir.join(&name)) {
                // Served already; its removal failed (a read-only disk):
                // tried again by the next batch, never served twice.
                let b = requests.backlog.entry(swept.agent.clone()).or_default();
                if b.names.len() < NAMES_KEPT {
                    b.names.insert(name);
                }
            } else if swept.serves {
                requests.arrived(&swept.agent, name);
            } else {
                requests.found(&swept.agent, name);
            }
        }
        // Whatever is left (or the "served" line) at the next turn.
        requests.backlog.entry(swept.agent).or_default();
    }

    /// The earliest time a held-back wake request is due.
    pub(super) fn held_until(&self) -> Option<DateTime<Utc>> {
        self.held.values().min().copied()
    }

    /// A session of `agent` starts, asked for by `reason`: it serves any
    /// wake request held back; one asked for by a wake request starts
    /// the agent's `wake_request_interval`.
    pub(super) fn session_starts(
        &mut self,
        agent: &AgentName,
        reason: WakeReason,
        now: DateTime<Utc>,
    ) {
        self.held.remove(agent);
        if reason == WakeReason::Manual {
            self.started.insert(agent.clone(), now);
        }
    }

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

    /// A request found by a listing made because more arrived than are
    /// remembered: those were served by the wake that overflowing asked for,
    /// so this asks for none.
    fn found(&mut self, agent: &AgentName, name: String) {
        let b = self.backlog.entry(agent.clone()).or_default();
        if b.names.len() >= NAMES_KEPT {
            b.list_again = true;
        } else if b.names.insert(name) {
            b.seen += 1;
        }
    }

    /// Whether there is work left for the next loop turn (not counting the
    /// agents whose batch is on a blocking thread: its return is an event).
    pub(super) fn pending(&self) -> bool {
        self.backlog.keys().any(|a| !self.sweeping.contains(a))
    }
}

/// Remove `batch` from `inbox_dir` (through one handle: never through a
/// link, an unlinkat each), then, with `list`, list the wake requests left.
/// Blocking: run off the loop.
fn sweep(
    agent: AgentName,
    inbox_dir: PathBuf,
    batch: Vec<String>,
    list: bool,
    serves: bool,
) -> Swept {
    let mut failed = Vec::new();
    match crate::fsx::open_dir(&inbox_dir) {
        Ok(Some(fd)) => {
            for name in &batch {
                match nix::unistd::unlinkat(
                    &fd,
                    name.as_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                ) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(e) => failed.push((name.clone(), e.to_string())),
                }
            }
        }
        // The inbox is gone: so are its requests.
        Ok(None) => {}
        Err(e) => failed.extend(batch.iter().map(|n| (n.clone(), e.to_string()))),
    }
    let listed = list.then(|| {
        crate::fsx::list(&inbox_dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| files::is_wake_request(n))
            .collect()
    });
    Swept {
        agent,
        batch,
        failed,
        listed,
        serves,
    }
}

/// One loop turn's serving of wake requests, over what it reads and
/// changes: the requests, the core's slots, the economy's refusals (a
/// manual wake says a refusal again), the skip counts.
pub(super) struct Serving<'a> {
    pub(super) requests: &'a mut WakeRequests,
    pub(super) core: &'a mut Core,
    pub(super) economy: &'a mut economy::Economy,
    pub(super) tally: &'a mut metrics::Tally,
    pub(super) root: &'a StateRoot,
    pub(super) config: &'a Config,
    pub(super) agent_index: &'a std::collections::HashMap<AgentName, usize>,
    pub(super) tx: &'a mpsc::UnboundedSender<Event>,
    pub(super) now: DateTime<Utc>,
}

impl Serving<'_> {
    /// One loop turn of wake requests: a wake for each agent with a new
    /// request, and a batch of removals sent off the loop for each agent
    /// with requests left and none on the way.
    pub(super) fn serve_wake_requests(&mut self) {
        let now = self.now;
        let due: Vec<AgentName> = self
            .requests
            .held
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(a, _)| a.clone())
            .collect();
        for agent in due {
            self.requests.held.remove(&agent);
            self.serve_wake_request(&agent);
        }
        let agents: Vec<AgentName> = self.requests.backlog.keys().cloned().collect();
        for agent in agents {
            self.serve_wake_requests_of(&agent);
        }
    }

    /// Serve the wake requests that arrived for `agent`: one wake, unless
    /// the agent is idle and its last session asked for by a wake request
    /// began less than its `wake_request_interval` ago; then one wake at
    /// the end of that interval, however many requests arrive meanwhile.
    /// While a session runs (or a wake waits for a slot) the request goes
    /// to the core as always: skipped or merged, it starts nothing more.
    fn serve_wake_request(&mut self, agent: &AgentName) {
        if !self.core.contains(agent) {
            return;
        }
        let busy = self
            .core
            .slot(agent)
            .is_some_and(|s| s.running.is_some() || s.pending.is_some());
        if !busy {
            let interval = agent_in(self.config, self.agent_index, agent)
                .map(|a| a.session.wake_request_interval)
                .unwrap_or_default();
            let last = self.requests.started.get(agent).copied();
            if let Some(at) = wake_request_due(last, interval, self.now) {
                if self.requests.held.insert(agent.clone(), at).is_none() {
                    tracing::debug!(agent = %agent, "wake request held back until {at}: a session asked for by a wake request began less than {} ago (wake_request_interval)", humantime::format_duration(interval));
                }
                return;
            }
        }
        self.requests.held.remove(agent);
        if self.request_manual_wake(agent) {
            tracing::info!(agent = %agent, "wake requested");
        }
    }

    fn serve_wake_requests_of(&mut self, agent: &AgentName) {
        let Some(mut b) = self.requests.backlog.remove(agent) else {
            return;
        };
        if !self.core.contains(agent) {
            return;
        }
        if b.unserved {
            b.unserved = false;
            self.serve_wake_request(agent);
        }
        if self.requests.sweeping.contains(agent) {
            // A batch is being removed: the next one when it is back.
            self.requests.backlog.insert(agent.clone(), b);
            return;
        }
        if b.names.is_empty() && !b.list_again {
            // Said once, when a backlog was big enough to be deferred.
            if b.logged {
                tracing::info!(agent = %agent, "the {} wake requests in its inbox are served and removed", b.seen);
            }
            return;
        }
        let mut batch = Vec::new();
        while batch.len() < SWEPT_PER_BATCH {
            let Some(name) = b.names.pop_first() else {
                break;
            };
            batch.push(name);
        }
        // The requests not remembered are listed once these are removed.
        let list = b.list_again && b.names.is_empty();
        let serves = list && std::mem::take(&mut b.list_serves);
        if list {
            b.list_again = false;
        }
        // A listing at start or at the reconcile scan is no backlog yet: what
        // it finds is said once it is one.
        if !b.logged
            && ((list && !serves) || !b.names.is_empty() || b.seen > SWEPT_PER_BATCH as u64)
        {
            b.logged = true;
            tracing::warn!(agent = %agent, "{} wake requests or more in its inbox: collapsed into one wake, removed off the loop {SWEPT_PER_BATCH} at a time (every other agent is served meanwhile)", b.seen);
        }
        self.requests.backlog.insert(agent.clone(), b);
        self.requests.sweeping.insert(agent.clone());
        let tx = self.tx.clone();
        let inbox_dir = self.root.agent(agent).inbox();
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            let swept = sweep(agent, inbox_dir, batch, list, serves);
            let _ = tx.send(Event::WakeRequestsSwept(Box::new(swept)));
        });
    }

    /// Ask for a manual wake; while a session runs, journal its skip (at
    /// most [`SKIPS_JOURNALED`] times per session). Whether this is worth a
    /// log line: not merged into a manual wake already waiting, nor past
    /// the journaled skips.
    fn request_manual_wake(&mut self, agent: &AgentName) -> bool {
        self.economy.manual_wake_requested(agent);
        let now = self.now;
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
        let noted = self.requests.skip_noted.entry(agent.clone()).or_default();
        if noted.0 != s.running {
            *noted = (s.running.clone(), 0);
        }
        noted.1 += 1;
        match noted.1 {
            n if n <= SKIPS_JOURNALED => {
                wakes::wake_skipped(self.root, self.tally, s);
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
    fn a_wake_request_waits_out_the_interval_since_the_last_one_started() {
        let t = |s: &str| {
            DateTime::parse_from_rfc3339(&format!("2026-11-26T12:00:{s}Z"))
                .unwrap()
                .with_timezone(&Utc)
        };
        let secs = Duration::from_secs;
        // (last session asked for by a wake request, interval, now) -> due
        let cases = [
            (None, secs(1), "10", None, "never woken by a request: now"),
            (Some("10"), secs(0), "10", None, "no limit"),
            (Some("10"), secs(1), "10", Some("11"), "just began"),
            (Some("10"), secs(1), "10.5", Some("11"), "half way"),
            (Some("10"), secs(1), "11", None, "the interval has passed"),
            (Some("10"), secs(1), "30", None, "long ago"),
            (Some("10"), secs(5), "12", Some("15"), "a longer interval"),
            (
                Some("50"),
                secs(1),
                "10",
                Some("11"),
                "the clock stepped back: never longer than the interval from now",
            ),
        ];
        for (last, interval, now, want, why) in cases {
            assert_eq!(
                wake_request_due(last.map(t), interval, t(now)),
                want.map(t),
                "{why}"
            );
        }
        // An interval past the calendar's end saturates, never panics.
        assert!(wake_request_due(Some(t("10")), Duration::MAX, t("10")).is_some());
    }

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

    #[test]
    fn listed_requests_ask_for_no_wake_and_a_sweep_is_not_pending() {
        let rio = AgentName::parse("rio").unwrap();
        let mut r = WakeRequests::default();
        r.found(&rio, ".wake-a".into());
        r.found(&rio, ".wake-a".into());
        let b = &r.backlog[&rio];
        assert!(!b.unserved, "served by the wake of the overflow");
        assert_eq!((b.names.len(), b.seen), (1, 1));
        assert!(r.pending());
        r.sweeping.insert(rio.clone());
        assert!(!r.pending(), "its return is an event");
        r.arrived(&rio, ".wake-b".into());
        assert!(r.backlog[&rio].unserved);
    }
}
