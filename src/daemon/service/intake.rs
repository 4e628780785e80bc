//! Inbox intake: what the watcher and the reconcile scan found in an inbox
//! becomes claimable mail, rejected junk, tasks and wake requests, and the
//! core learns what waits. Owns nothing but what it reads; the files that
//! are being written (`writing`, `settle_at`) and the inboxes not yet
//! scanned (`dirty`) are the loop's.

use super::*;

/// What intake keeps between events.
#[derive(Default)]
pub(super) struct Intake {
    /// Inbox files a writer has open (written, not yet closed), per agent.
    pub(super) writing: BTreeMap<AgentName, inbox::Writing>,
    /// Inboxes with a file still being written: look again at this time.
    pub(super) settle_at: BTreeMap<AgentName, DateTime<Utc>>,
    /// Inboxes with events not yet scanned.
    pub(super) dirty: std::collections::BTreeSet<AgentName>,
    /// Wake requests seen and not yet served or removed.
    pub(super) requests: super::wake_requests::WakeRequests,
    /// What has been read of each inbox's files: a message is read once,
    /// when it arrives; later scans and the claim only stat it.
    pub(super) known: BTreeMap<AgentName, std::sync::Arc<inbox::Known>>,
    /// Agents with a file written to in `inbox/rejected/` this loop turn.
    pub(super) rejected_written: std::collections::BTreeSet<AgentName>,
    /// Inboxes whose junk is being rejected a pass at a time (logged once).
    pub(super) deferring: std::collections::BTreeSet<AgentName>,
    /// Humans' replies to flows already handed to the router (by message
    /// id): not handed again while the router moves them.
    pub(super) flow_replies: std::collections::BTreeSet<String>,
    /// Agents whose big inbox is being listed off the loop before their
    /// session starts (their slot stays taken meanwhile).
    pub(super) listing: std::collections::BTreeSet<AgentName>,
    /// Agents whose big inbox is being listed off the loop for a scan.
    pub(super) scan_listing: std::collections::BTreeSet<AgentName>,
    /// Listings back from the blocking thread, for the start that asked
    /// for them (`None`: the listing failed; the claim lists on the loop).
    pub(super) listed: BTreeMap<AgentName, Option<std::sync::Arc<inbox::Listed>>>,
    /// Per agent, how many message arrivals (watch events naming a
    /// would-be message, a lost watch) the loop has seen.
    pub(super) arrivals: BTreeMap<AgentName, u64>,
    /// A big inbox's last listing and the arrivals counted when it was
    /// asked for: while no message has arrived since, it holds every
    /// message that can be there (a name gone since is skipped by the
    /// claim), so the next session's claim goes through it again instead
    /// of listing the whole inbox again. Forgotten at a rescan and at the
    /// reconcile scan.
    pub(super) reusable: BTreeMap<AgentName, (u64, std::sync::Arc<inbox::Listed>)>,
    /// Running agents: when their inbox was last scanned while their
    /// session ran ([`running_scan_waits`]).
    pub(super) scanned_running: BTreeMap<AgentName, DateTime<Utc>>,
    /// Running agents whose inbox changed since that scan: scanned at the
    /// end of the window, or by the session's end, whichever comes first.
    pub(super) owed: std::collections::BTreeSet<AgentName>,
}

/// The shortest time between two scans of a running agent's inbox. Its
/// messages wait for the session's end whatever the scan finds; a scan per
/// arrival (a read, a journal append and its sync under the agent's lock)
/// competed with that end for the lock and the loop. A second at most
/// before a message to a running agent is journaled, its task added.
pub(super) const RUNNING_SCAN_INTERVAL: chrono::Duration = chrono::Duration::seconds(1);

/// When a running agent's inbox may be scanned next, if not now: `last` is
/// its last scan while its session ran (pure). A last scan after `now` (the
/// clock stepped back) is no reason to wait.
pub(super) fn running_scan_waits(
    last: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let last = last.filter(|t| *t <= now)?;
    let due = last + RUNNING_SCAN_INTERVAL;
    (due > now).then_some(due)
}

impl Intake {
    /// Move back to the inbox what was rejected as unfinished and has been
    /// finished since.
    pub(super) fn retry_rejected(
        &mut self,
        root: &StateRoot,
        lock_wait: Duration,
        agent: &AgentName,
    ) {
        let dir = root.agent(agent);
        let wait = lock_wait;
        let result = dir
            .lock_within(wait)
            .and_then(|_lock| inbox::retry_completed(&dir, Timestamp::now()));
        match result {
            Ok(back) if !back.is_empty() => {
                for name in &back {
                    tracing::info!(agent = %agent, "inbox/{name}: rejected as unfinished, completed since: back in the inbox");
                }
                self.dirty.insert(agent.clone());
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(agent = %agent, error_code = e.code().as_str(), "cannot look at rejected messages: {e}")
            }
        }
    }

    /// List `agent`'s big inbox on a blocking thread for the start of its
    /// session ([`Event::InboxListed`] comes back). Its slot stays
    /// taken: wakes meanwhile are skipped as for a running session.
    pub(super) fn list_inbox(
        &mut self,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        agent: &AgentName,
        reason: WakeReason,
    ) {
        if !self.listing.insert(agent.clone()) {
            return;
        }
        tracing::debug!(agent = %agent, "its inbox is big: listed off the loop before its session starts");
        self.spawn_listing(root, tx, agent, Some(reason));
    }

    /// List `agent`'s big inbox on a blocking thread for a scan (at start,
    /// the reconcile scan, a rescan): the scan goes through the listing
    /// when it is back, instead of listing the whole inbox on the loop.
    pub(super) fn list_inbox_for_scan(
        &mut self,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        agent: &AgentName,
    ) {
        if !self.scan_listing.insert(agent.clone()) {
            return;
        }
        tracing::debug!(agent = %agent, "its inbox is big: listed off the loop before it is scanned");
        self.spawn_listing(root, tx, agent, None);
    }

    /// List `agent`'s inbox on a blocking thread: [`Event::InboxListed`]
    /// comes back on `tx`.
    fn spawn_listing(
        &self,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        agent: &AgentName,
        reason: Option<WakeReason>,
    ) {
        let tx = tx.clone();
        let dir = root.agent(agent);
        let arrivals = self.arrivals_of(agent);
        let agent = agent.clone();
        tokio::task::spawn_blocking(move || {
            let listed = inbox::list_messages(&dir);
            let _ = tx.send(Event::InboxListed {
                agent,
                reason,
                listed: listed.ok().flatten().map(std::sync::Arc::new),
                arrivals,
            });
        });
    }

    /// A would-be message arrived in `agent`'s inbox (or its watch was lost).
    pub(super) fn arrived(&mut self, agent: &AgentName) {
        *self.arrivals.entry(agent.clone()).or_default() += 1;
    }

    /// The arrivals counted for `agent` so far.
    pub(super) fn arrivals_of(&self, agent: &AgentName) -> u64 {
        self.arrivals.get(agent).copied().unwrap_or(0)
    }

    /// `agent`'s last listing, if no message has arrived since it was
    /// asked for.
    pub(super) fn reusable_listing(
        &self,
        agent: &AgentName,
    ) -> Option<std::sync::Arc<inbox::Listed>> {
        self.reusable
            .get(agent)
            .filter(|(n, _)| *n == self.arrivals_of(agent))
            .map(|(_, l)| l.clone())
    }
}

impl Daemon {
    pub(super) fn scan_all_inboxes(&mut self) {
        // The backstop for missed events: every big inbox listed afresh.
        self.intake.reusable.clear();
        let agents: Vec<AgentName> = self.core.names().cloned().collect();
        for agent in agents {
            self.intake.requests.take(&self.root.agent(&agent));
            self.intake
                .retry_rejected(&self.root, self.lock_busy.wait(&agent), &agent);
            // A fresh listing: now for a small inbox; a big one (a flood of junk
            // beside the mail: its listing costs tens of milliseconds per 100,000
            // entries) is listed off the loop first, scanned when it is back.
            if inbox::is_big(&self.root.agent(&agent)) {
                (self.intake).list_inbox_for_scan(&self.root, &self.tx, &agent);
            } else {
                self.scan_inbox(&agent);
            }
        }
    }

    /// Receive what waits in `agent`'s inbox: reject settled junk, add tasks
    /// for task messages, and tell the core what waits.
    pub(super) fn scan_inbox(&mut self, agent: &AgentName) {
        if scan_can_wait(
            &self.core,
            &self.running,
            &self.watcher,
            self.clock.now(),
            agent,
        ) {
            // Looked at by the claim when its session starts; still dirty
            // (looked at again by the next tick) should that start not come.
            self.intake.dirty.insert(agent.clone());
            return;
        }
        // An inbox replaced under us (rm -r + mkdir, mv away and back) lost
        // its watch: mended as bootstrap does (created if missing, its
        // parts made — `rejected/`, `.tmp/`, … — and its modes set: a
        // `mkdir inbox` leaves 0755), watched again, then read.
        if !self.watcher.is_watching(agent)
            && let Some(cfg) = self.agent_config(agent).cloned()
        {
            let dir = self.root.agent(agent);
            match bootstrap::agent(&cfg, &dir, Timestamp::now()) {
                Ok(created) if !created.is_empty() => {
                    tracing::info!(agent = %agent, "its inbox was replaced: made again {}", created.join(", "))
                }
                Ok(_) => {}
                Err(e) => self.raise(
                    ErrorRecord::new(e.code(), format!("{agent}: cannot mend its replaced inbox"))
                        .details(e.to_string())
                        .agent(agent),
                    false,
                ),
            }
            match self.watcher.watch(agent, &dir.inbox()) {
                Ok(()) => tracing::info!(agent = %agent, "its inbox is watched again"),
                Err(e) => tracing::warn!(agent = %agent, "cannot watch its inbox: {e}"),
            }
            self.intake
                .retry_rejected(&self.root, self.lock_busy.wait(agent), agent);
        }
        if self.running.contains_key(agent) {
            let now = self.clock.now();
            if let Some(due) =
                running_scan_waits(self.intake.scanned_running.get(agent).copied(), now)
            {
                self.intake.owed.insert(agent.clone());
                let at = self.intake.settle_at.entry(agent.clone()).or_insert(due);
                *at = (*at).min(due);
                return;
            }
            self.intake.scanned_running.insert(agent.clone(), now);
        }
        self.intake.owed.remove(agent);
        let Some(summary) = self.receive(agent) else {
            return;
        };
        if self.running.contains_key(agent) {
            let now = self.clock.now();
            skip_for_running(
                &mut self.core,
                &self.root,
                &mut self.tally,
                agent,
                &summary,
                now,
            );
            return;
        }
        self.core.inbox_scanned(agent, summary, self.clock.now());
    }

    pub(super) fn receive(&mut self, agent: &AgentName) -> Option<InboxSummary> {
        let dir = self.root.agent(agent);
        let now = Timestamp::now();
        let wait = self.lock_busy.wait(agent);
        let settle = self
            .agent_config(agent)
            .map(|a| a.session.inbox_settle)
            .unwrap_or(inbox::SETTLE_TIME);
        let writing = self.intake.writing.get(agent).cloned().unwrap_or_default();
        // A big inbox's listing, while no message has arrived since (after
        // a session of a flooded agent: not its whole junk listed again).
        let listed = self.intake.reusable_listing(agent);
        let known = std::sync::Arc::make_mut(self.intake.known.entry(agent.clone()).or_default());
        let result = dir.lock_within(wait).and_then(|lock| {
            let received = inbox::receive(
                &dir,
                now,
                settle,
                crate::clock::FileClock::Real,
                &writing,
                known,
                listed.as_deref(),
            )?;
            let mut notes = Vec::new();
            hooks::add_tasks_from_messages(&dir, &lock, &received.tasks, now, &mut notes)?;
            let arrived: Vec<&inbox::Message> = received.arrived.iter().collect();
            if let Err(e) = inbox::journal_arrivals(&dir, &lock, &arrived, now) {
                tracing::warn!(agent = %agent, error_code = e.code().as_str(), "{agent}: cannot journal the arrival of {} message(s): {e}", arrived.len());
            }
            Ok(received)
        });
        match result {
            Ok(r) => {
                self.lock_busy.free(agent);
                self.tally.waiting.insert(agent.clone(), r.high + r.normal);
                *self.tally.rejected.entry(agent.clone()).or_default() += r.rejected.len() as u64;
                for r in &r.rejected {
                    self.raise(rejected(agent, r), false);
                }
                let now = self.clock.now();
                (self.intake).route_flow_replies(&self.root, &self.config, now, agent, &r.replies);
                self.intake
                    .note_deferred(agent, r.deferred, r.rejected.len());
                if r.deferred > 0 {
                    // The rest at the next loop turn (not this one), after
                    // every other agent's work of this one.
                    let next = self.clock.now() + chrono::Duration::milliseconds(10);
                    self.intake.settle_at.insert(agent.clone(), next);
                } else if r.unsettled {
                    // Looked at again soon: a file settles `inbox_settle`
                    // after its last change, a closed writer wakes us anyway.
                    let again = (settle / 4).clamp(Duration::from_secs(1), Duration::from_secs(15));
                    let at = crate::clock::later(self.clock.now(), again);
                    self.intake.settle_at.insert(agent.clone(), at);
                }
                Some(InboxSummary {
                    high: r.high,
                    normal: r.normal,
                })
            }
            Err(e @ Error::LockBusy { .. }) => {
                // Looked at again shortly; every other agent is served.
                self.lock_busy
                    .busy(agent, &format!("inbox scan deferred: {e}"));
                let at = crate::clock::later(self.clock.now(), super::start::LOCK_RETRY);
                self.intake.settle_at.insert(agent.clone(), at);
                None
            }
            Err(e) => {
                self.raise(
                    ErrorRecord::new(e.code(), format!("{agent}: cannot scan the inbox"))
                        .details(e.to_string())
                        .agent(agent),
                    false,
                );
                None
            }
        }
    }
}

impl Intake {
    /// Say once when an inbox holds more junk than one pass rejects, and
    /// once when it is through.
    fn note_deferred(&mut self, agent: &AgentName, deferred: usize, rejected: usize) {
        let noted = self.deferring.contains(agent);
        if deferred > 0 && !noted {
            self.deferring.insert(agent.clone());
            tracing::warn!(agent = %agent, "{rejected} files rejected from its inbox and {deferred} more to look at: {} per loop turn, the rest deferred (every other agent is served meanwhile)", inbox::REJECTED_PER_PASS);
        } else if deferred == 0 && noted {
            self.deferring.remove(agent);
            tracing::info!(agent = %agent, "every file deferred in its inbox has been looked at");
        }
    }
}

/// Mail found while `agent`'s session runs: a wake skipped, remembered
/// for a follow-up after it.
pub(super) fn skip_for_running(
    core: &mut Core,
    root: &StateRoot,
    tally: &mut metrics::Tally,
    agent: &AgentName,
    summary: &InboxSummary,
    now: DateTime<Utc>,
) {
    let wake_on_inbox = core
        .slot(agent)
        .map(|s| s.wake_on_inbox)
        .unwrap_or(crate::config::WakeOnInbox::Never);
    if summary.wants_wake(wake_on_inbox).is_none() {
        return;
    }
    if let Some(s) = core.request(agent, WakeReason::Inbox, Priority::Normal, now) {
        wakes::wake_skipped(root, tally, s);
    }
}

/// The record of an inbox file rejected as a message, naming the file it
/// is really kept as (de-duplicated, shortened, `not-utf8-….json`).
pub(super) fn rejected(agent: &AgentName, r: &inbox::Rejected) -> ErrorRecord {
    ErrorRecord::new(
        Code::InboxRejected,
        format!("{agent}: inbox/{} rejected: {}", r.file, r.reason),
    )
    .details(format!("kept as {}", r.kept))
    .agent(agent)
}

/// Coalescing: an agent waiting for a free slot with a high-priority
/// wake learns nothing from a scan that could change its wake (nothing
/// is more urgent, and a wake once requested stays), and the claim at
/// its start looks at every file (rejects junk, adds tasks). In a burst
/// this spares a scan of a growing inbox per agent per loop turn. Not
/// while it is held back (a backoff, disabled): then the scan is all that
/// looks at its inbox.
fn scan_can_wait(
    core: &Core,
    running: &BTreeMap<AgentName, Running>,
    watcher: &InboxWatcher,
    now: DateTime<Utc>,
    agent: &AgentName,
) -> bool {
    if running.contains_key(agent) || !watcher.is_watching(agent) {
        return false;
    }
    core.slot(agent).is_some_and(|slot| {
        slot.running.is_none()
            && slot.disabled.is_none()
            && slot.backoff_until.is_none_or(|t| t <= now)
            && slot
                .pending
                .as_ref()
                .is_some_and(|p| p.priority == Priority::High)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().expect("a time")
    }

    #[test]
    fn a_running_agents_inbox_is_scanned_at_most_once_a_second() {
        let now = at("2026-11-29T10:00:00.500Z");
        let table: [(Option<&str>, Option<&str>); 6] = [
            // Never scanned while this session runs: now.
            (None, None),
            // Scanned a second ago or more: now.
            (Some("2026-11-29T09:59:59.500Z"), None),
            (Some("2026-11-29T09:59:58Z"), None),
            // Scanned less than a second ago: at the end of the second.
            (Some("2026-11-29T10:00:00Z"), Some("2026-11-29T10:00:01Z")),
            (
                Some("2026-11-29T10:00:00.500Z"),
                Some("2026-11-29T10:00:01.500Z"),
            ),
            // The clock stepped back an hour since: now, not in an hour.
            (Some("2026-11-29T11:00:00Z"), None),
        ];
        for (last, want) in table {
            assert_eq!(
                running_scan_waits(last.map(at), now),
                want.map(at),
                "last scan {last:?}"
            );
        }
    }
}
