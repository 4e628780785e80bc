//! The daemon's decisions, as plain data and functions: which agent to wake,
//! when, and in what order. No IO and no clock: every function takes `now`.
//!
//! The IO layer (`daemon::run`) turns what happens — a schedule coming due,
//! an inbox scan, `agent-state wake`, a session ending — into calls here, and
//! carries out what comes back: sessions to start, journal lines to write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::agent_name::AgentName;
use crate::config::WakeOnInbox;

/// Why an agent is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    /// Its schedule came due (at the scheduled time).
    Schedule,
    /// A run missed while the daemon was down, within the catch-up window.
    CatchUp,
    /// Messages arrived (after the debounce).
    Inbox,
    /// `agent-state wake`.
    Manual,
    /// Messages waited while a session ran; one session after it.
    FollowUp,
    /// The last session failed in a way that is retried (timeout, empty
    /// output, API error, spawn failure).
    Retry,
}

impl WakeReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            WakeReason::Schedule => "schedule",
            WakeReason::CatchUp => "catch-up",
            WakeReason::Inbox => "inbox",
            WakeReason::Manual => "manual",
            WakeReason::FollowUp => "follow-up",
            WakeReason::Retry => "retry",
        }
    }
}

/// Waiting wakes are served high priority first, then oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    High,
    Normal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingWake {
    pub reason: WakeReason,
    pub priority: Priority,
    pub since: DateTime<Utc>,
}

/// What an inbox scan found waiting (valid messages only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxSummary {
    pub high: usize,
    pub normal: usize,
}

impl InboxSummary {
    pub fn total(&self) -> usize {
        self.high + self.normal
    }

    /// Does this inbox call for a session under `policy`? With what priority?
    pub fn wants_wake(&self, policy: WakeOnInbox) -> Option<Priority> {
        match policy {
            WakeOnInbox::Never => None,
            WakeOnInbox::High if self.high > 0 => Some(Priority::High),
            WakeOnInbox::High => None,
            WakeOnInbox::Any if self.high > 0 => Some(Priority::High),
            WakeOnInbox::Any if self.normal > 0 => Some(Priority::Normal),
            WakeOnInbox::Any => None,
        }
    }
}

/// What the core knows about one working agent.
#[derive(Debug, Clone)]
pub struct AgentSlot {
    pub wake_on_inbox: WakeOnInbox,
    pub inbox_debounce: Duration,
    /// When the schedule next fires (jitter included); `None` = no schedule.
    pub next_fire: Option<DateTime<Utc>>,
    /// The session running now (its id once known).
    pub running: Option<String>,
    pub pending: Option<PendingWake>,
    /// Messages arrived: wake at this time (debounce) with this priority.
    pub inbox_due: Option<(DateTime<Utc>, Priority)>,
    /// A wake came while a session ran: after it, one follow-up if messages wait.
    pub skipped_while_running: bool,
    /// After failed sessions: no automatic wake before this time (a manual
    /// `wake` is still served). Set by the IO layer from the failure count.
    pub backoff_until: Option<DateTime<Utc>>,
    /// No automatic wakes at all, and why (the command is not executable):
    /// until the config is reloaded or a manual wake.
    pub disabled: Option<String>,
    /// A high 30-day error rate: when sessions wait for a slot, this agent
    /// goes after healthy ones of the same priority.
    pub unhealthy: bool,
    /// An operator stopped its session: the messages that session returned
    /// wake nothing by themselves (see [`InboxMute`]).
    pub inbox_mute: Option<InboxMute>,
}

/// After an operator's stop (`agent-state stop`), the messages its session
/// had claimed are back in the inbox; they must not start the next session
/// by themselves (the stop would undo itself after the debounce). The next
/// wake delivers them: a schedule, `agent-state wake`, or a message that
/// arrives after the stop. Any session that starts ends the mute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxMute {
    /// The stopped session is ending: no inbox wake, no follow-up.
    Stopping,
    /// It ended with this many messages waiting: a scan that finds no more
    /// wakes nothing (one that finds fewer lowers the mark).
    UpTo(usize),
}

impl AgentSlot {
    pub fn new(wake_on_inbox: WakeOnInbox, inbox_debounce: Duration) -> AgentSlot {
        AgentSlot {
            wake_on_inbox,
            inbox_debounce,
            next_fire: None,
            running: None,
            pending: None,
            inbox_due: None,
            skipped_while_running: false,
            backoff_until: None,
            disabled: None,
            unhealthy: false,
            inbox_mute: None,
        }
    }

    /// Anything going on that a loop turn looks at (a wake, a debounce, a
    /// session, a backoff, disabled): such agents are in [`Core`]'s busy set.
    fn is_busy(&self) -> bool {
        self.running.is_some()
            || self.pending.is_some()
            || self.inbox_due.is_some()
            || self.backoff_until.is_some()
            || self.disabled.is_some()
            || self.skipped_while_running
    }

    fn held_back(&self, wake: &PendingWake, now: DateTime<Utc>) -> bool {
        wake.reason != WakeReason::Manual
            && (self.disabled.is_some() || self.backoff_until.is_some_and(|t| t > now))
    }
}

/// A wake that could not be served because the agent's session is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub agent: AgentName,
    pub reason: WakeReason,
    pub running: String,
}

/// The slots of every working agent, with two indexes kept by every change
/// (through [`SlotMut`]): the agents with anything going on, and the
/// scheduled fires in time order. A loop turn's questions (what is due,
/// what waits, the next deadline, what daemon.json and `STATUS=` say) walk
/// these, not every agent: at 10,000 agents a dozen walks of all of them
/// per turn were a large part of a wake.
#[derive(Debug, Default)]
pub struct Core {
    agents: BTreeMap<AgentName, AgentSlot>,
    busy: BTreeSet<AgentName>,
    fires: BTreeSet<(DateTime<Utc>, AgentName)>,
    fires_generation: u64,
    pub max_concurrent: usize,
    /// A session's OOM kill lowered `max_concurrent` by one until then
    /// ([`super::memory::concurrent_limit`]).
    pub oom_lowered_until: Option<DateTime<Utc>>,
    /// No new sessions (shutting down, or paused by the health monitor).
    pub waking_stopped: bool,
}

/// A slot borrowed for a change: the indexes follow it when it is dropped.
pub struct SlotMut<'a> {
    name: AgentName,
    slot: &'a mut AgentSlot,
    busy: &'a mut BTreeSet<AgentName>,
    fires: &'a mut BTreeSet<(DateTime<Utc>, AgentName)>,
    fires_generation: &'a mut u64,
    fire_before: Option<DateTime<Utc>>,
}

impl std::ops::Deref for SlotMut<'_> {
    type Target = AgentSlot;
    fn deref(&self) -> &AgentSlot {
        self.slot
    }
}

impl std::ops::DerefMut for SlotMut<'_> {
    fn deref_mut(&mut self) -> &mut AgentSlot {
        self.slot
    }
}

impl Drop for SlotMut<'_> {
    fn drop(&mut self) {
        if self.slot.next_fire != self.fire_before {
            if let Some(t) = self.fire_before {
                self.fires.remove(&(t, self.name.clone()));
            }
            if let Some(t) = self.slot.next_fire {
                self.fires.insert((t, self.name.clone()));
            }
            *self.fires_generation += 1;
        }
        if self.slot.is_busy() {
            if !self.busy.contains(&self.name) {
                self.busy.insert(self.name.clone());
            }
        } else {
            self.busy.remove(&self.name);
        }
    }
}

impl Core {
    /// Put a wake that cannot be served now back, to be tried after `delay`.
    pub fn defer(
        &mut self,
        now: DateTime<Utc>,
        agent: &AgentName,
        reason: WakeReason,
        delay: Duration,
    ) {
        self.session_ended(agent, InboxSummary::default(), now);
        self.request(agent, reason, Priority::Normal, now);
        if let Some(mut slot) = self.slot_mut(agent) {
            slot.backoff_until = Some(crate::clock::later(now, delay));
        }
    }

    /// When the agent will next be woken automatically: its schedule's next
    /// fire, or a waiting retry, pushed past any backoff; never if disabled.
    pub fn effective_wake(&self, now: DateTime<Utc>, agent: &AgentName) -> Option<DateTime<Utc>> {
        let slot = self.slot(agent)?;
        if slot.disabled.is_some() {
            return None;
        }
        let backoff = slot.backoff_until.filter(|t| *t > now);
        match (slot.pending.is_some(), backoff) {
            (true, Some(b)) => Some(b),
            _ => slot.next_fire.map(|w| backoff.map_or(w, |b| w.max(b))),
        }
    }

    pub fn new(max_concurrent: usize) -> Core {
        Core {
            max_concurrent: max_concurrent.max(1),
            ..Core::default()
        }
    }

    pub fn slot(&self, agent: &AgentName) -> Option<&AgentSlot> {
        self.agents.get(agent)
    }

    /// The slot of `agent`, to change (the indexes follow on drop).
    pub fn slot_mut(&mut self, agent: &AgentName) -> Option<SlotMut<'_>> {
        let slot = self.agents.get_mut(agent)?;
        Some(SlotMut {
            name: agent.clone(),
            fire_before: slot.next_fire,
            slot,
            busy: &mut self.busy,
            fires: &mut self.fires,
            fires_generation: &mut self.fires_generation,
        })
    }

    /// The slot of `agent`, made by `make` if it has none.
    pub fn slot_or_insert(
        &mut self,
        agent: &AgentName,
        make: impl FnOnce() -> AgentSlot,
    ) -> SlotMut<'_> {
        if !self.agents.contains_key(agent) {
            self.agents.insert(agent.clone(), make());
        }
        self.slot_mut(agent).expect("inserted above")
    }

    pub fn remove(&mut self, agent: &AgentName) -> Option<AgentSlot> {
        let slot = self.agents.remove(agent)?;
        self.busy.remove(agent);
        if let Some(t) = slot.next_fire {
            self.fires.remove(&(t, agent.clone()));
            self.fires_generation += 1;
        }
        Some(slot)
    }

    pub fn contains(&self, agent: &AgentName) -> bool {
        self.agents.contains_key(agent)
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Every agent, in name order.
    pub fn slots(&self) -> impl Iterator<Item = (&AgentName, &AgentSlot)> {
        self.agents.iter()
    }

    pub fn names(&self) -> impl Iterator<Item = &AgentName> {
        self.agents.keys()
    }

    /// The agents with anything going on (a wake waiting, a debounce, a
    /// session, a backoff, disabled), in name order. Every other agent has
    /// none of these.
    pub fn busy(&self) -> impl Iterator<Item = (&AgentName, &AgentSlot)> {
        self.busy
            .iter()
            .filter_map(|n| self.agents.get(n).map(|s| (n, s)))
    }

    /// Scheduled fires, earliest first.
    pub fn fires(&self) -> impl Iterator<Item = (DateTime<Utc>, &AgentName)> {
        self.fires.iter().map(|(t, n)| (*t, n))
    }

    /// Changes with every change to a scheduled fire.
    pub fn fires_generation(&self) -> u64 {
        self.fires_generation
    }

    pub fn running_count(&self) -> usize {
        self.busy().filter(|(_, a)| a.running.is_some()).count()
    }

    /// Ask for a session of `agent`. If it is running, the wake is skipped
    /// (and remembered for a follow-up); otherwise it waits for a slot, merged
    /// with any wake already waiting (highest priority, earliest time).
    pub fn request(
        &mut self,
        agent: &AgentName,
        reason: WakeReason,
        priority: Priority,
        now: DateTime<Utc>,
    ) -> Option<Skipped> {
        let mut slot = self.slot_mut(agent)?;
        if reason == WakeReason::Manual {
            // An operator asked: that is the "user action" a disabled agent
            // waits for.
            slot.disabled = None;
        }
        if let Some(running) = slot.running.clone() {
            slot.skipped_while_running = true;
            return Some(Skipped {
                agent: agent.clone(),
                reason,
                running,
            });
        }
        let wake = PendingWake {
            reason,
            priority,
            since: now,
        };
        slot.pending = Some(match slot.pending.take() {
            None => wake,
            Some(old) => PendingWake {
                // A manual wake always wins: it is served through a backoff,
                // and merging it into a held-back wake must not lose that.
                reason: if reason == WakeReason::Manual
                    || (priority < old.priority && old.reason != WakeReason::Manual)
                {
                    reason
                } else {
                    old.reason
                },
                priority: old.priority.min(priority),
                since: old.since.min(now),
            },
        });
        None
    }

    /// Schedules that are due at `now`: request their wakes and advance them
    /// with `advance(agent, fired_at)` (which returns the next fire time).
    pub fn fire_due_schedules(
        &mut self,
        now: DateTime<Utc>,
        mut advance: impl FnMut(&AgentName, DateTime<Utc>) -> Option<DateTime<Utc>>,
    ) -> (Vec<(AgentName, DateTime<Utc>)>, Vec<Skipped>) {
        let due: Vec<(AgentName, DateTime<Utc>)> = self
            .fires()
            .take_while(|(t, _)| *t <= now)
            .map(|(t, name)| (name.clone(), t))
            .collect();
        let mut skipped = Vec::new();
        for (name, fired) in &due {
            if let Some(s) = self.request(name, WakeReason::Schedule, Priority::Normal, now) {
                skipped.push(s);
            }
            let next = advance(name, *fired);
            if let Some(mut slot) = self.slot_mut(name) {
                slot.next_fire = next;
            }
        }
        (due, skipped)
    }

    /// An inbox scan of `agent` found `summary`. Starts the debounce timer
    /// if the policy wants a wake and none is timing yet; a burst of
    /// messages within the debounce becomes one wake.
    pub fn inbox_scanned(&mut self, agent: &AgentName, summary: InboxSummary, now: DateTime<Utc>) {
        let Some(mut slot) = self.slot_mut(agent) else {
            return;
        };
        match slot.inbox_mute {
            Some(InboxMute::Stopping) => {
                slot.inbox_due = None;
                return;
            }
            Some(InboxMute::UpTo(n)) if summary.total() <= n => {
                slot.inbox_mute = Some(InboxMute::UpTo(summary.total()));
                slot.inbox_due = None;
                return;
            }
            Some(InboxMute::UpTo(_)) => slot.inbox_mute = None,
            None => {}
        }
        let Some(priority) = summary.wants_wake(slot.wake_on_inbox) else {
            slot.inbox_due = None;
            return;
        };
        let debounce = slot.inbox_debounce;
        slot.inbox_due = Some(match slot.inbox_due {
            Some((due, p)) => (due, p.min(priority)),
            None => (crate::clock::later(now, debounce), priority),
        });
    }

    /// Inbox debounces that have run out: request their wakes.
    pub fn fire_due_inbox(&mut self, now: DateTime<Utc>) -> Vec<Skipped> {
        let due: Vec<(AgentName, Priority)> = self
            .busy()
            .filter_map(|(n, s)| {
                s.inbox_due
                    .filter(|(t, _)| *t <= now)
                    .map(|(_, p)| (n.clone(), p))
            })
            .collect();
        let mut skipped = Vec::new();
        for (name, priority) in due {
            if let Some(mut slot) = self.slot_mut(&name) {
                slot.inbox_due = None;
            }
            if let Some(s) = self.request(&name, WakeReason::Inbox, priority, now) {
                skipped.push(s);
            }
        }
        skipped
    }

    /// Agents to start now, in order (high priority first, then oldest),
    /// as many as there are free slots. They are marked as running.
    pub fn take_startable(&mut self, now: DateTime<Utc>) -> Vec<(AgentName, PendingWake)> {
        if self.waking_stopped {
            return Vec::new();
        }
        let free = self
            .concurrent_limit(now)
            .saturating_sub(self.running_count());
        let mut waiting: Vec<(AgentName, PendingWake)> = self
            .busy()
            .filter(|(_, s)| s.running.is_none())
            .filter_map(|(n, s)| {
                s.pending
                    .clone()
                    .filter(|p| !s.held_back(p, now))
                    .map(|p| (n.clone(), p))
            })
            .collect();
        let unhealthy = |name: &AgentName| self.agents.get(name).is_some_and(|s| s.unhealthy);
        waiting.sort_by(|a, b| {
            (a.1.priority, unhealthy(&a.0), a.1.since, &a.0).cmp(&(
                b.1.priority,
                unhealthy(&b.0),
                b.1.since,
                &b.0,
            ))
        });
        waiting.truncate(free);
        for (name, _) in &waiting {
            if let Some(mut slot) = self.slot_mut(name) {
                slot.pending = None;
                slot.running = Some(String::new());
                slot.skipped_while_running = false;
                // The session claims what waits in the inbox: a debounce
                // that was timing for those messages has nothing left to do.
                slot.inbox_due = None;
                slot.inbox_mute = None;
            }
        }
        waiting
    }

    pub fn session_started(&mut self, agent: &AgentName, session_id: &str) {
        if let Some(mut slot) = self.slot_mut(agent) {
            slot.running = Some(session_id.to_string());
        }
    }

    /// An operator asked to stop `agent`'s running session: until it has
    /// ended, its inbox wakes nothing (see [`InboxMute`]).
    pub fn stop_requested(&mut self, agent: &AgentName) {
        if let Some(mut slot) = self.slot_mut(agent) {
            slot.inbox_mute = Some(InboxMute::Stopping);
            slot.inbox_due = None;
        }
    }

    /// The session of `agent` ended (or never started). If wakes were
    /// skipped while it ran and messages wait, one follow-up is requested,
    /// unless an operator stopped it: then the `waiting` messages wait for
    /// the next wake ([`InboxMute`]).
    pub fn session_ended(&mut self, agent: &AgentName, waiting: InboxSummary, now: DateTime<Utc>) {
        let Some(mut slot) = self.slot_mut(agent) else {
            return;
        };
        slot.running = None;
        if slot.inbox_mute == Some(InboxMute::Stopping) {
            slot.inbox_mute = Some(InboxMute::UpTo(waiting.total()));
            slot.skipped_while_running = false;
            slot.inbox_due = None;
            return;
        }
        let follow_up = std::mem::take(&mut slot.skipped_while_running) && waiting.total() > 0;
        drop(slot);
        if follow_up {
            let priority = if waiting.high > 0 {
                Priority::High
            } else {
                Priority::Normal
            };
            self.request(agent, WakeReason::FollowUp, priority, now);
        }
    }

    /// The next time something is due (a schedule or a debounce), if any.
    /// A backoff that has already ended is no deadline: the wake it held
    /// waits for a slot (or the end of a pause), which something else
    /// announces; returning it would make the loop spin.
    pub fn next_deadline(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let first_fire = self.fires().next().map(|(t, _)| t);
        self.busy()
            .map(|(_, s)| s)
            .flat_map(|s| {
                let backoff_ends = s
                    .pending
                    .as_ref()
                    .filter(|_| s.disabled.is_none())
                    .and(s.backoff_until)
                    .filter(|t| *t > now);
                [s.inbox_due.map(|(t, _)| t), backoff_ends]
            })
            .flatten()
            .chain(first_fire)
            // The limit comes back: a wake waiting for a slot may start.
            .chain(self.oom_lowered_until.filter(|t| *t > now))
            .min()
    }

    /// How many sessions may run at once now: `max_concurrent`, lowered
    /// by one after an OOM kill.
    pub fn concurrent_limit(&self, now: DateTime<Utc>) -> usize {
        super::memory::concurrent_limit(self.max_concurrent, self.oom_lowered_until, now)
    }

    pub fn waiting_count(&self) -> usize {
        self.busy().filter(|(_, s)| s.pending.is_some()).count()
    }

    /// The indexes agree with the slots (tests).
    #[cfg(test)]
    fn check_indexes(&self) {
        for (n, s) in &self.agents {
            assert_eq!(
                self.busy.contains(n),
                s.is_busy(),
                "busy index of {n}: {s:?}"
            );
            if let Some(t) = s.next_fire {
                assert!(self.fires.contains(&(t, n.clone())), "fire of {n}");
            }
        }
        assert_eq!(
            self.fires.len(),
            self.agents
                .values()
                .filter(|s| s.next_fire.is_some())
                .count()
        );
        assert!(self.busy.iter().all(|n| self.agents.contains_key(n)));
    }
}

#[cfg(test)]
mod tests;
