//! Schedules: when each agent's cron schedule next fires (with its jitter),
//! what a missed run comes to at start, and the tick that turns due
//! schedules and waiting inboxes into wakes (the decisions are `core`'s).

use super::*;

/// What the schedules keep between events.
pub(super) struct Schedules {
    /// `.daemon/schedule.json`: each agent's last fire, for catch-up.
    pub(super) schedule_state: ScheduleState,
    /// The scheduled (un-jittered) time each agent's schedule next fires.
    pub(super) next_scheduled: BTreeMap<AgentName, DateTime<Utc>>,
}

impl Schedules {
    /// Remember the scheduled time of `agent`'s next fire (the caller
    /// publishes its wake time, report.json `next_wake_at`).
    pub(super) fn next_fire(&mut self, agent: &AgentName, scheduled: Option<DateTime<Utc>>) {
        match scheduled {
            Some(t) => self.next_scheduled.insert(agent.clone(), t),
            None => self.next_scheduled.remove(agent),
        };
    }

    /// Write `.daemon/schedule.json`.
    pub(super) fn save(&self, root: &StateRoot) {
        if let Err(e) = files::write_schedule_state(root, &self.schedule_state) {
            tracing::error!(
                error_code = e.code().as_str(),
                "cannot write schedule.json: {e}"
            );
        }
    }

    pub(super) fn new(schedule_state: ScheduleState) -> Schedules {
        Schedules {
            schedule_state,
            next_scheduled: BTreeMap::new(),
        }
    }
}

impl Daemon {
    /// Compute the next fire time of `agent`'s schedule, and at start-up
    /// decide about runs missed while the daemon was down.
    pub(super) fn plan_schedule(
        &mut self,
        agent: &AgentConfig,
        now: DateTime<Utc>,
        at_start: bool,
    ) {
        let name = agent.name.clone();
        let Some(sched) = &agent.schedule else {
            self.schedules.next_scheduled.remove(&name);
            if let Some(mut slot) = self.core.slot_mut(&name) {
                slot.next_fire = None;
            }
            self.published
                .set_next_wake(&self.root, &self.core, self.clock.now(), &name, None);
            return;
        };
        let mut last = self
            .schedules
            .schedule_state
            .last_fire
            .get(name.as_str())
            .map(|t| t.0);
        if at_start && last.is_none() {
            // The first start after a move from cron (no schedule.json yet):
            // the agent's last session, run by its cron script, stands for
            // its last fire, so a run missed earlier today is caught up.
            last = last_session_start(&self.root.agent(&name));
        }
        if at_start {
            match schedule::missed_runs(
                sched,
                agent.timezone,
                last,
                now,
                self.config.daemon.catch_up_window,
            ) {
                Missed::Nothing => {}
                Missed::CatchUp { scheduled } => {
                    tracing::info!(agent = %name, "catching up the run scheduled at {scheduled} (missed while the daemon was down)");
                    self.core
                        .request(&name, WakeReason::CatchUp, Priority::Normal, now);
                    self.schedules
                        .schedule_state
                        .last_fire
                        .insert(name.to_string(), Timestamp::from_datetime(scheduled));
                }
                Missed::TooLate { scheduled, count } => {
                    tracing::warn!(agent = %name, "{count} scheduled run(s) missed while the daemon was down, the last at {scheduled}: outside catch_up_window, not run");
                    publish::journal(
                        &self.root,
                        &name,
                        journal::Event::ScheduleMissed(ScheduleMissed {
                            scheduled: Timestamp::from_datetime(scheduled),
                            count,
                            catch_up_window: humantime::format_duration(
                                self.config.daemon.catch_up_window,
                            )
                            .to_string(),
                        }),
                    );
                    self.schedules
                        .schedule_state
                        .last_fire
                        .insert(name.to_string(), Timestamp::from_datetime(scheduled));
                }
            }
        }
        // A new agent's schedule counts from now: nothing before it was missed.
        let last = self
            .schedules
            .schedule_state
            .last_fire
            .entry(name.to_string())
            .or_insert_with(|| Timestamp::from_datetime(now))
            .0;
        // After the last fire, even if the clock stepped back behind it (NTP,
        // a VM resumed): a run that fired never fires again.
        let next = sched.next_after(now.max(last), agent.timezone);
        if last > now {
            tracing::warn!(agent = %name, "the clock is behind this agent's last scheduled run ({last}); its next run is the one after that");
        }
        let wake = next.map(|t| wake_at(agent, t));
        if let Some(mut slot) = self.core.slot_mut(&agent.name) {
            slot.next_fire = wake;
        }
        self.schedules.next_fire(&agent.name, next);
        let now = self.clock.now();
        (self.published).set_next_wake(&self.root, &self.core, now, &agent.name, wake);
    }

    /// Everything that is due now: schedules, debounces, settling files,
    /// then start what can start.
    pub(super) fn tick(&mut self) {
        wake_requests::Serving {
            requests: &mut self.intake.requests,
            core: &mut self.core,
            economy: &mut self.economy,
            tally: &mut self.tally,
            root: &self.root,
            config: &self.config,
            agent_index: &self.agent_index,
            tx: &self.tx,
            now: self.clock.now(),
        }
        .serve_wake_requests();
        for agent in std::mem::take(&mut self.intake.rejected_written) {
            self.intake
                .retry_rejected(&self.root, self.lock_busy.wait(&agent), &agent);
        }
        for agent in std::mem::take(&mut self.intake.dirty) {
            self.scan_inbox(&agent);
        }
        let now = self.clock.now();
        let settled: Vec<AgentName> = self
            .intake
            .settle_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(a, _)| a.clone())
            .collect();
        for agent in settled {
            self.intake.settle_at.remove(&agent);
            self.scan_inbox(&agent);
        }
        // The core advances each due schedule through this closure, which
        // computes the next fire once; it is recorded right after.
        let config = &self.config;
        let next_scheduled = &self.schedules.next_scheduled;
        let mut advanced: Vec<(AgentName, DateTime<Utc>, Option<DateTime<Utc>>)> = Vec::new();
        let (_, skipped) = self.core.fire_due_schedules(now, |name, _wake| {
            let scheduled = next_scheduled.get(name).copied()?;
            let cfg = config.agents.iter().find(|a| &a.name == name)?;
            let next = cfg.schedule.as_ref()?.next_after(scheduled, cfg.timezone);
            advanced.push((name.clone(), scheduled, next));
            next.map(|t| wake_at(cfg, t))
        });
        for s in skipped {
            wake_skipped(&self.root, &mut self.tally, s);
        }
        if !advanced.is_empty() {
            for (name, fired, next) in advanced {
                self.schedules
                    .schedule_state
                    .last_fire
                    .insert(name.to_string(), Timestamp::from_datetime(fired));
                let wake = self.core.slot(&name).and_then(|slot| slot.next_fire);
                self.schedules.next_fire(&name, next);
                let now = self.clock.now();
                (self.published).set_next_wake(&self.root, &self.core, now, &name, wake);
            }
            self.schedules.save(&self.root);
        }
        for s in self.core.fire_due_inbox(now) {
            wake_skipped(&self.root, &mut self.tally, s);
        }
        let startable = self.core.take_startable(now);
        for (agent, wake) in startable {
            self.intake
                .requests
                .session_starts(&agent, wake.reason, self.clock.now());
            self.start(&agent, wake.reason);
        }
        // Wakes held back by a backoff: report.json says when they will run.
        let held: Vec<AgentName> = self
            .core
            .busy()
            .filter(|(_, s)| s.pending.is_some() && s.backoff_until.is_some_and(|t| t > now))
            .map(|(a, _)| a.clone())
            .collect();
        for agent in held {
            let wake = self
                .core
                .effective_wake(self.clock.now(), &agent)
                .map(Timestamp::from_datetime);
            if self.published.published_wake.get(&agent) != Some(&wake) {
                self.published.set_next_wake(
                    &self.root,
                    &self.core,
                    self.clock.now(),
                    &agent,
                    None,
                );
            }
        }
        self.after_change();
    }
}

/// When `agent` wakes for the fire scheduled at `scheduled`: plus its jitter.
pub(super) fn wake_at(agent: &AgentConfig, scheduled: DateTime<Utc>) -> DateTime<Utc> {
    let jitter = schedule::jitter_offset(agent.name.as_str(), scheduled, agent.session.jitter);
    crate::clock::later(scheduled, jitter)
}

/// When the agent's last session began, from the end of its journal.
fn last_session_start(dir: &crate::state::AgentDir) -> Option<DateTime<Utc>> {
    let mut found = None;
    let _ = crate::state::journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        if matches!(e.event, journal::Event::SessionStart(_)) {
            found = Some(e.ts.0);
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    });
    found
}

/// A wake skipped because a session of its agent runs: counted, said and
/// journaled (naming the session).
pub(super) fn wake_skipped(root: &StateRoot, tally: &mut metrics::Tally, s: Skipped) {
    if s.running.is_empty() {
        // Its session is starting (its big inbox is being listed off
        // the loop): nothing ran yet to name; the start serves the wake.
        tracing::debug!(agent = %s.agent, "{} wake merged into the session that is starting", s.reason.as_str());
        return;
    }
    *tally
        .skips
        .entry((s.agent.clone(), "running".to_string()))
        .or_default() += 1;
    tracing::info!(agent = %s.agent, session_id = %s.running, "{} wake skipped: session {} is running", s.reason.as_str(), s.running);
    publish::journal(
        root,
        &s.agent,
        journal::Event::WakeSkipped(WakeSkipped {
            reason: s.reason.as_str().to_string(),
            running_session: s.running,
            ..Default::default()
        }),
    );
}
