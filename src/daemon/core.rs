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
        let Some(priority) = summary.wants_wake(slot.wake_on_inbox) else {
            slot.inbox_due = None;
            return;
        };
        let debounce = chrono::Duration::from_std(slot.inbox_debounce).unwrap_or_default();
        slot.inbox_due = Some(match slot.inbox_due {
            Some((due, p)) => (due, p.min(priority)),
            None => (now + debounce, priority),
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
        let free = self.max_concurrent.saturating_sub(self.running_count());
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
            }
        }
        waiting
    }

    pub fn session_started(&mut self, agent: &AgentName, session_id: &str) {
        if let Some(mut slot) = self.slot_mut(agent) {
            slot.running = Some(session_id.to_string());
        }
    }

    /// The session of `agent` ended (or never started). If wakes were
    /// skipped while it ran and messages wait, one follow-up is requested.
    pub fn session_ended(&mut self, agent: &AgentName, waiting: InboxSummary, now: DateTime<Utc>) {
        let Some(mut slot) = self.slot_mut(agent) else {
            return;
        };
        slot.running = None;
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
            .min()
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
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }
    fn name(n: &str) -> AgentName {
        AgentName::parse(n).unwrap()
    }
    fn core(names: &[&str], max: usize) -> Core {
        let mut c = Core::new(max);
        for n in names {
            c.slot_or_insert(&name(n), || {
                AgentSlot::new(WakeOnInbox::High, Duration::from_secs(30))
            });
        }
        c
    }
    fn started(c: &mut Core) -> Vec<String> {
        let out = c
            .take_startable(t("2026-01-01T00:00:00Z"))
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        c.check_indexes();
        out
    }

    #[test]
    fn the_indexes_follow_every_change_and_the_walks_use_them() {
        let mut c = core(&["a", "b", "c", "d"], 2);
        let t0 = t("2026-01-01T00:00:00Z");
        c.check_indexes();
        assert_eq!(c.busy().count(), 0, "idle agents are not busy");
        assert_eq!(c.next_deadline(t0), None);
        // Schedules, in time order whatever the name order.
        c.slot_mut(&name("d")).unwrap().next_fire = Some(t("2026-01-01T01:00:00Z"));
        c.slot_mut(&name("b")).unwrap().next_fire = Some(t("2026-01-01T02:00:00Z"));
        c.check_indexes();
        let fires: Vec<String> = c.fires().map(|(_, n)| n.to_string()).collect();
        assert_eq!(fires, ["d", "b"]);
        assert_eq!(c.next_deadline(t0), Some(t("2026-01-01T01:00:00Z")));
        let generation = c.fires_generation();
        // Due at 01:30: d fires and moves to 03:00; b is not due.
        let (due, _) = c.fire_due_schedules(t("2026-01-01T01:30:00Z"), |_, _| {
            Some(t("2026-01-01T03:00:00Z"))
        });
        c.check_indexes();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0.as_str(), "d");
        assert!(c.fires_generation() > generation);
        let fires: Vec<String> = c.fires().map(|(_, n)| n.to_string()).collect();
        assert_eq!(fires, ["b", "d"]);
        assert_eq!(c.waiting_count(), 1);
        // A debounce, a start, an end.
        c.inbox_scanned(&name("a"), InboxSummary { high: 1, normal: 0 }, t0);
        c.check_indexes();
        assert!(c.busy().any(|(n, _)| n.as_str() == "a"));
        c.fire_due_inbox(t("2026-01-01T00:01:00Z"));
        c.check_indexes();
        assert_eq!(started(&mut c), ["a", "d"]);
        assert_eq!(c.running_count(), 2);
        c.session_started(&name("a"), "s1");
        c.session_ended(&name("a"), InboxSummary::default(), t0);
        c.session_ended(&name("d"), InboxSummary::default(), t0);
        c.check_indexes();
        assert_eq!(c.busy().count(), 0, "nothing going on after both ended");
        // A backoff and a removal.
        c.slot_mut(&name("c")).unwrap().backoff_until = Some(t("2026-01-01T05:00:00Z"));
        c.check_indexes();
        assert_eq!(c.busy().count(), 1);
        c.remove(&name("c"));
        c.remove(&name("b"));
        c.check_indexes();
        assert_eq!(c.busy().count(), 0);
        assert_eq!(c.fires().count(), 1);
    }

    #[test]
    fn slots_are_served_high_priority_first_then_oldest() {
        let mut c = core(&["a", "b", "c", "d"], 2);
        c.request(
            &name("a"),
            WakeReason::Schedule,
            Priority::Normal,
            t("2026-01-01T00:00:00Z"),
        );
        c.request(
            &name("b"),
            WakeReason::Schedule,
            Priority::Normal,
            t("2026-01-01T00:00:01Z"),
        );
        c.request(
            &name("c"),
            WakeReason::Inbox,
            Priority::High,
            t("2026-01-01T00:00:02Z"),
        );
        c.request(
            &name("d"),
            WakeReason::Schedule,
            Priority::Normal,
            t("2025-12-31T00:00:00Z"),
        );
        assert_eq!(started(&mut c), ["c", "d"]);
        assert_eq!(started(&mut c), Vec::<String>::new(), "no free slot");
        c.session_ended(
            &name("d"),
            InboxSummary::default(),
            t("2026-01-01T00:01:00Z"),
        );
        assert_eq!(started(&mut c), ["a"]);
    }

    #[test]
    fn unhealthy_agents_go_after_healthy_ones_of_the_same_priority() {
        let mut c = core(&["a", "b", "c"], 1);
        c.slot_mut(&name("a")).unwrap().unhealthy = true;
        for (n, p, at) in [
            ("a", Priority::Normal, "2026-01-01T00:00:00Z"),
            ("b", Priority::Normal, "2026-01-01T00:00:05Z"),
            ("c", Priority::High, "2026-01-01T00:00:09Z"),
        ] {
            c.request(&name(n), WakeReason::Schedule, p, t(at));
        }
        let now = t("2026-01-01T00:01:00Z");
        let mut order = Vec::new();
        for _ in 0..3 {
            let got = c.take_startable(now);
            let n = got[0].0.clone();
            order.push(n.to_string());
            c.session_ended(&n, InboxSummary::default(), now);
        }
        assert_eq!(
            order,
            ["c", "b", "a"],
            "priority first, then health, then age"
        );
    }

    #[test]
    fn a_disabled_agent_waits_for_a_manual_wake() {
        let mut c = core(&["rio"], 1);
        let now = t("2026-01-01T00:00:00Z");
        c.slot_mut(&name("rio")).unwrap().disabled = Some("not executable".into());
        c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
        assert!(started(&mut c).is_empty());
        assert_eq!(c.next_deadline(now), None, "nothing to wait for");
        c.request(&name("rio"), WakeReason::Manual, Priority::High, now);
        assert_eq!(started(&mut c), ["rio"]);
    }

    #[test]
    fn a_retry_waits_out_its_delay() {
        let mut c = core(&["rio"], 1);
        let now = t("2026-01-01T00:00:00Z");
        let until = t("2026-01-01T00:00:30Z");
        c.slot_mut(&name("rio")).unwrap().backoff_until = Some(until);
        c.request(&name("rio"), WakeReason::Retry, Priority::Normal, now);
        assert!(c.take_startable(now).is_empty());
        assert_eq!(c.next_deadline(now), Some(until));
        let got = c.take_startable(until);
        assert_eq!(got[0].1.reason, WakeReason::Retry);
    }

    #[test]
    fn a_manual_wake_merged_into_a_held_back_one_is_still_served() {
        let mut c = core(&["rio"], 1);
        let t0 = t("2026-01-01T00:00:00Z");
        c.slot_mut(&name("rio")).unwrap().backoff_until = Some(t0 + chrono::Duration::hours(1));
        c.request(&name("rio"), WakeReason::Inbox, Priority::High, t0);
        assert!(c.take_startable(t0).is_empty(), "held back");
        c.request(&name("rio"), WakeReason::Manual, Priority::High, t0);
        let got = c.take_startable(t0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.reason, WakeReason::Manual);
    }

    #[test]
    fn an_ended_backoff_is_no_deadline_while_nothing_can_start() {
        let mut c = core(&["rio"], 1);
        let t0 = t("2026-01-01T00:00:00Z");
        c.slot_mut(&name("rio")).unwrap().backoff_until = Some(t0);
        c.request(&name("rio"), WakeReason::Retry, Priority::Normal, t0);
        c.waking_stopped = true;
        let later = t("2026-01-01T00:00:05Z");
        assert!(c.take_startable(later).is_empty());
        assert_eq!(
            c.next_deadline(later),
            None,
            "a past deadline would spin the loop"
        );
    }

    #[test]
    fn a_wake_while_running_is_skipped_and_becomes_one_follow_up_if_messages_wait() {
        let mut c = core(&["rio"], 2);
        let now = t("2026-01-01T00:00:00Z");
        c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
        assert_eq!(started(&mut c), ["rio"]);
        c.session_started(&name("rio"), "S1");
        for _ in 0..3 {
            let s = c
                .request(&name("rio"), WakeReason::Manual, Priority::High, now)
                .unwrap();
            assert_eq!(s.running, "S1");
        }
        assert!(
            started(&mut c).is_empty(),
            "never two sessions of one agent"
        );
        c.session_ended(&name("rio"), InboxSummary { high: 0, normal: 2 }, now);
        let next = c.take_startable(now);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].1.reason, WakeReason::FollowUp);
        c.session_ended(&name("rio"), InboxSummary::default(), now);
        assert!(started(&mut c).is_empty(), "one follow-up, not three");
    }

    #[test]
    fn no_follow_up_without_messages() {
        let mut c = core(&["rio"], 1);
        let now = t("2026-01-01T00:00:00Z");
        c.request(&name("rio"), WakeReason::Manual, Priority::High, now);
        started(&mut c);
        c.request(&name("rio"), WakeReason::Schedule, Priority::Normal, now);
        c.session_ended(&name("rio"), InboxSummary::default(), now);
        assert!(started(&mut c).is_empty());
    }

    #[test]
    fn a_burst_of_messages_is_one_wake_after_the_debounce() {
        let mut c = core(&["rio"], 1);
        let t0 = t("2026-01-01T00:00:00Z");
        for i in 0..50 {
            c.inbox_scanned(
                &name("rio"),
                InboxSummary {
                    high: i + 1,
                    normal: 0,
                },
                t0 + chrono::Duration::seconds(i as i64 / 10),
            );
        }
        assert!(
            c.fire_due_inbox(t0 + chrono::Duration::seconds(29))
                .is_empty()
        );
        assert!(started(&mut c).is_empty(), "still debouncing");
        assert_eq!(
            c.next_deadline(t0),
            Some(t0 + chrono::Duration::seconds(30))
        );
        c.fire_due_inbox(t0 + chrono::Duration::seconds(30));
        assert_eq!(started(&mut c), ["rio"]);
        assert_eq!(c.next_deadline(t0), None);
    }

    #[test]
    fn a_session_that_starts_takes_over_a_pending_debounce() {
        let mut c = core(&["rio"], 1);
        let t0 = t("2026-01-01T00:00:00Z");
        c.inbox_scanned(&name("rio"), InboxSummary { high: 1, normal: 0 }, t0);
        c.request(&name("rio"), WakeReason::Manual, Priority::High, t0);
        assert_eq!(started(&mut c), ["rio"]);
        c.session_ended(
            &name("rio"),
            InboxSummary::default(),
            t0 + chrono::Duration::seconds(1),
        );
        c.fire_due_inbox(t0 + chrono::Duration::seconds(31));
        assert!(started(&mut c).is_empty(), "no second, empty session");
    }

    #[test]
    fn backoff_holds_automatic_wakes_but_not_manual_ones() {
        let mut c = core(&["rio", "leo"], 2);
        let t0 = t("2026-01-01T00:00:00Z");
        let until = t0 + chrono::Duration::seconds(60);
        c.slot_mut(&name("rio")).unwrap().backoff_until = Some(until);
        c.slot_mut(&name("leo")).unwrap().backoff_until = Some(until);
        c.request(&name("rio"), WakeReason::Inbox, Priority::High, t0);
        c.request(&name("leo"), WakeReason::Manual, Priority::High, t0);
        let now: Vec<String> = c
            .take_startable(t0)
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(now, ["leo"], "a manual wake is served during backoff");
        assert_eq!(
            c.next_deadline(t0),
            Some(until),
            "the loop wakes when the backoff ends"
        );
        let later: Vec<String> = c
            .take_startable(until)
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        assert_eq!(later, ["rio"]);
    }

    #[test]
    fn the_inbox_policy_decides() {
        let high = InboxSummary { high: 1, normal: 0 };
        let normal = InboxSummary { high: 0, normal: 3 };
        assert_eq!(high.wants_wake(WakeOnInbox::High), Some(Priority::High));
        assert_eq!(normal.wants_wake(WakeOnInbox::High), None);
        assert_eq!(normal.wants_wake(WakeOnInbox::Any), Some(Priority::Normal));
        assert_eq!(high.wants_wake(WakeOnInbox::Never), None);
    }

    #[test]
    fn due_schedules_fire_once_and_advance() {
        let mut c = core(&["rio", "leo"], 2);
        c.slot_mut(&name("rio")).unwrap().next_fire = Some(t("2026-01-01T22:00:00Z"));
        c.slot_mut(&name("leo")).unwrap().next_fire = Some(t("2026-01-02T05:30:00Z"));
        let (due, _) = c.fire_due_schedules(t("2026-01-01T22:00:00Z"), |_, fired| {
            Some(fired + chrono::Duration::days(1))
        });
        assert_eq!(due.len(), 1);
        assert_eq!(
            c.slot(&name("rio")).unwrap().next_fire,
            Some(t("2026-01-02T22:00:00Z"))
        );
        assert_eq!(
            c.next_deadline(t("2026-01-01T22:00:00Z")),
            Some(t("2026-01-02T05:30:00Z"))
        );
        assert_eq!(started(&mut c), ["rio"]);
    }

    #[test]
    fn nothing_starts_while_waking_is_stopped() {
        let mut c = core(&["rio"], 1);
        c.request(
            &name("rio"),
            WakeReason::Manual,
            Priority::High,
            t("2026-01-01T00:00:00Z"),
        );
        c.waking_stopped = true;
        assert!(started(&mut c).is_empty());
        c.waking_stopped = false;
        assert_eq!(started(&mut c), ["rio"]);
    }
}
