//! Publishing state for readers: report.json's lifecycle, rank and next
//! wake, the journal lines the loop writes, the status line for systemd and
//! the heartbeat (`.daemon/daemon.json`), each written only when it changed.

use super::*;

/// What was last published, so that nothing is rewritten unchanged.
#[derive(Default)]
pub(super) struct Published {
    /// daemon.json is written and says what [`Daemon::heartbeat_key`] of
    /// `last_heartbeat_key` describes; false makes the next look rewrite it
    /// (the reconcile scan, the end).
    pub(super) heartbeat_written: bool,
    pub(super) last_heartbeat_key: u64,
    /// daemon.json's `agents` and `next_wakes`, kept as JSON.
    pub(super) agents_json: files::CachedJson,
    pub(super) wakes_json: files::CachedJson,
    /// Counts the changes to the set of agents (apply_agents), for the key.
    pub(super) agents_generation: u64,
    pub(super) last_status: String,
    /// daemon.json could not be written (said once per outage).
    pub(super) heartbeat_failing: bool,
    /// report.json `next_wake_at` as last written, per agent.
    pub(super) published_wake: BTreeMap<AgentName, Option<Timestamp>>,
    /// report.json `next_wake_at` as read by the survey of the agents being
    /// applied (start, reload): spares [`Published::set_next_wake`] a read.
    /// Taken once per agent; emptied at the end of the apply.
    pub(super) surveyed_wake: BTreeMap<AgentName, Option<Timestamp>>,
}

/// Append `event` to the agent's journal (an error is logged, not returned:
/// the journal is the agent's record, not the loop's).
pub(super) fn journal(root: &StateRoot, agent: &AgentName, event: journal::Event) {
    let dir = root.agent(agent);
    if let Err(e) = dir.lock().and_then(|lock| {
        dir.journal_append(&lock, Timestamp::now(), event)
            .map(|_| ())
    }) {
        tracing::error!(agent = %agent, error_code = e.code().as_str(), "cannot write the journal: {e}");
    }
}

/// Set report.json `lifecycle` to `f(current)` (written only if it changes).
pub(super) fn set_lifecycle(
    root: &StateRoot,
    agent: &AgentName,
    f: impl Fn(Option<Lifecycle>) -> Option<Lifecycle>,
) {
    let seen = root.agent(agent).read::<Report>().ok().flatten();
    set_lifecycle_seen(root, agent, seen.map(|r| r.lifecycle), f);
}

/// [`set_lifecycle`] with report.json's lifecycle as just read
/// (`None`: no readable report.json).
pub(super) fn set_lifecycle_seen(
    root: &StateRoot,
    agent: &AgentName,
    seen: Option<Option<Lifecycle>>,
    f: impl Fn(Option<Lifecycle>) -> Option<Lifecycle>,
) {
    let dir = root.agent(agent);
    // Unchanged (every agent at every start and reload): decided on a
    // read without the lock, which is safe as report.json is replaced
    // whole; only a change takes the lock and reads it again.
    match seen {
        Some(lifecycle) if f(lifecycle) == lifecycle => return,
        _ if !crate::fsx::is_dir(&dir.path) => return,
        _ => {}
    }
    let result = dir.update(Timestamp::now(), |report: &mut Report| {
            let next = f(report.lifecycle);
            if next != report.lifecycle {
                tracing::info!(agent = %agent, "lifecycle: {}", next.map(|l| l.as_str()).unwrap_or("-"));
                report.lifecycle = next;
            }
        });
    if let Err(e) = result {
        tracing::warn!(agent = %agent, "cannot update the lifecycle in report.json: {e}");
    }
}

/// Rank the agent by its 30-day error rate (metrics.json): at 50 % or
/// more over at least 3 sessions it waits behind healthy agents.
pub(super) fn refresh_rank(root: &StateRoot, core: &mut Core, agent: &AgentName) {
    let metrics = root
        .agent(agent)
        .read::<crate::state::metrics::Metrics>()
        .ok()
        .flatten();
    rank(core, agent, metrics.map(|m| m.rolling_30d).as_ref());
}

/// [`refresh_rank`] with metrics.json's 30 days already read.
pub(super) fn rank(
    core: &mut Core,
    agent: &AgentName,
    rolling: Option<&crate::state::metrics::Rolling>,
) {
    if let (Some(mut slot), Some(r)) = (core.slot_mut(agent), rolling) {
        slot.unhealthy = r.sessions >= 3 && r.error_rate >= 0.5;
    }
}

/// report.json `error.since`: when the agent's error state began.
pub(super) fn report_error_since(root: &StateRoot, agent: &AgentName) -> Option<Timestamp> {
    root.agent(agent)
        .read::<Report>()
        .ok()
        .flatten()
        .and_then(|r| r.error)
        .and_then(|e| e.since)
}

impl Published {
    /// report.json: the error state (`None` clears it) and the next wake.
    pub(super) fn publish_agent(
        &mut self,
        root: &StateRoot,
        core: &Core,
        now: DateTime<Utc>,
        agent: &AgentName,
        error: Option<ReportError>,
    ) {
        let wake = core
            .effective_wake(now, agent)
            .map(Timestamp::from_datetime);
        let result = root
            .agent(agent)
            .update(Timestamp::now(), |report: &mut Report| {
                match &error {
                    Some(e) => {
                        // A retry on its way is not yet an agent in error (a
                        // timeout stays distinguishable from an error): the
                        // status changes when the retries are spent. A held
                        // credential is not the agent's error either (its
                        // own failure, if any, set the status already).
                        if report.current_session.is_none()
                            && e.state != ErrorState::Retrying
                            && e.state != ErrorState::Held
                        {
                            report.status = AgentStatus::Error;
                        }
                        report.error = Some(e.clone());
                    }
                    None => report.error = None,
                }
                report.next_wake_at = wake;
            });
        if result.is_ok() {
            self.published_wake.insert(agent.clone(), wake);
        }
        if let Err(e) = result {
            tracing::warn!(agent = %agent, "cannot update report.json: {e}");
        }
    }

    /// report.json `next_wake_at`.
    pub(super) fn set_next_wake(
        &mut self,
        root: &StateRoot,
        core: &Core,
        now: DateTime<Utc>,
        agent: &AgentName,
        wake: Option<DateTime<Utc>>,
    ) {
        // Pushed past a backoff, or none while disabled.
        let wake = if core.contains(agent) {
            core.effective_wake(now, agent)
        } else {
            wake
        };
        let wake = wake.map(Timestamp::from_datetime);
        // Unchanged on disk (every agent at every start): decided on a read
        // without the lock, report.json being replaced whole (the survey's,
        // at a start or reload).
        let on_disk = match self.surveyed_wake.remove(agent) {
            Some(seen) => Some(seen),
            None => root
                .agent(agent)
                .read::<Report>()
                .ok()
                .flatten()
                .map(|r| r.next_wake_at),
        };
        if on_disk == Some(wake) {
            self.published_wake.insert(agent.clone(), wake);
            return;
        }
        let result = root
            .agent(agent)
            .update(Timestamp::now(), |report: &mut Report| {
                report.next_wake_at = wake;
            });
        if result.is_ok() {
            self.published_wake.insert(agent.clone(), wake);
        }
        if let Err(e) = result {
            tracing::warn!(agent = %agent, "cannot update next_wake_at: {e}");
        }
    }
}

/// What the publisher reads of the loop's state, borrowed field by field
/// (see `seen!`) so that [`Published`] can be borrowed mutably alongside.
pub(super) struct Seen<'a> {
    pub(super) core: &'a Core,
    pub(super) running: &'a BTreeMap<AgentName, Running>,
    pub(super) streaks: &'a BTreeMap<AgentName, Streak>,
    pub(super) monitor: &'a monitor::Monitor,
    pub(super) economy: &'a economy::Economy,
    pub(super) started_at: Timestamp,
    pub(super) stopping: bool,
    pub(super) root: &'a StateRoot,
    pub(super) config_path: &'a Path,
}

impl Seen<'_> {
    /// systemd's STATUS= line.
    pub(super) fn status_line(&self) -> String {
        let running: Vec<String> = self.running.keys().map(|a| a.to_string()).collect();
        let next = self
            .core
            .fires()
            .next()
            .map(|(t, n)| format!("; next: {n} at {}", Timestamp::from_datetime(t)))
            .unwrap_or_default();
        let mut state = if self.stopping {
            "stopping; ".to_string()
        } else {
            String::new()
        };
        if let Some(h) = &self.monitor.health
            && (h.level != DiskLevel::Ok || h.read_only)
        {
            state.push_str(&h.status_fragment());
            state.push_str("; ");
        }
        let streaks = failing_streaks(self.streaks);
        let failing = failing_agents(self.core, &streaks).len();
        if failing > 0 {
            state.push_str(&format!("{failing} failing; "));
        }
        format!(
            "{state}{} agents, {} running{}, {} waiting{next}",
            self.core.len(),
            running.len(),
            if running.is_empty() {
                String::new()
            } else {
                format!(" ({})", running.join(", "))
            },
            self.core.waiting_count()
        )
    }
}

impl Published {
    /// What daemon.json says that a reader cares about (not its times), as
    /// a hash computed without building it. At 10,000 agents, building,
    /// serializing (150 KB) and comparing the heartbeat at every tick was a
    /// large part of a wake's CPU; now that is done only when this changes.
    fn heartbeat_key(&self, seen: &Seen) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.agents_generation, seen.core.len()).hash(&mut h);
        for (a, r) in seen.running {
            (
                a,
                &r.session_id,
                &r.instance,
                r.pid,
                r.started_at.0,
                &r.host,
            )
                .hash(&mut h);
        }
        seen.core.fires_generation().hash(&mut h);
        for (a, slot) in seen.core.busy() {
            if slot.pending.is_some() || slot.disabled.is_some() {
                (a, slot.pending.is_some(), &slot.disabled).hash(&mut h);
            }
        }
        for (a, streak) in seen.streaks.iter().filter(|(_, s)| s.failures > 0) {
            let backoff = seen.core.slot(a).map(|s| s.backoff_until);
            (a, streak.failures, backoff).hash(&mut h);
        }
        for (g, hold) in &seen.economy.holds.groups {
            (g, &hold.reason, hold.until.map(|t| t.0)).hash(&mut h);
            std::mem::discriminant(&hold.cause).hash(&mut h);
        }
        seen.stopping.hash(&mut h);
        seen.core.oom_lowered_until.hash(&mut h);
        if let Some(health) = &seen.monitor.health {
            let mut health = health.clone();
            health.checked_at = seen.started_at;
            serde_json::to_string(&health)
                .unwrap_or_default()
                .hash(&mut h);
        }
        h.finish()
    }

    /// daemon.json, written only when what it says changed.
    pub(super) fn write_heartbeat(&mut self, seen: &Seen) {
        let key = self.heartbeat_key(seen);
        if key == self.last_heartbeat_key && self.heartbeat_written {
            return;
        }
        let wakes_key = seen.core.fires_generation();
        // Field by field (not `failing_streaks`): the JSON caches below
        // are borrowed mutably alongside.
        let streaks: BTreeMap<&AgentName, u32> = seen
            .streaks
            .iter()
            .filter(|(_, s)| s.failures > 0)
            .map(|(a, s)| (a, s.failures))
            .collect();
        let agents_key = self.agents_generation ^ (seen.core.len() as u64) << 32;
        let core = seen.core;
        let agents = self.agents_json.get(agents_key, || {
            let names: Vec<&str> = core.names().map(|a| a.as_str()).collect();
            serde_json::to_string(&names).unwrap_or_default()
        });
        let next_wakes = self.wakes_json.get(wakes_key, || {
            let wakes: BTreeMap<&str, Timestamp> = core
                .fires()
                .map(|(t, a)| (a.as_str(), Timestamp::from_datetime(t)))
                .collect();
            serde_json::to_string(&wakes).unwrap_or_default()
        });
        let state_root = seen.root.path.display().to_string();
        let config = seen.config_path.display().to_string();
        let me = crate::daemon::files::this_process();
        let updated_at = Timestamp::now();
        let hb = HeartbeatOut {
            pid: std::process::id(),
            pid_start: me.start,
            pid_ns: me.ns,
            version: env!("CARGO_PKG_VERSION"),
            started_at: seen.started_at,
            updated_at,
            state_root: &state_root,
            config: &config,
            agents,
            running: seen
                .running
                .iter()
                .map(|(a, r)| RunningEntry {
                    agent: a.to_string(),
                    session_id: r.session_id.clone(),
                    instance: r.instance.clone(),
                    pid: r.pid,
                    started_at: r.started_at,
                    host: r.host.clone(),
                })
                .collect(),
            waiting: seen
                .core
                .busy()
                .filter(|(_, s)| s.pending.is_some())
                .map(|(a, _)| a.to_string())
                .collect(),
            next_wakes,
            paused: seen
                .monitor
                .health
                .as_ref()
                .filter(|h| !h.level.allows_new_sessions())
                .map(|h| h.status_fragment()),
            stopping: seen.stopping,
            health: seen.monitor.health.as_ref(),
            failing: failing_agents(seen.core, &streaks),
            held: seen
                .economy
                .holds
                .groups
                .iter()
                .map(|(g, h)| {
                    (
                        g.clone(),
                        files::HeldEntry {
                            cause: files::HeldCause::Known(h.cause),
                            reason: h.reason.clone(),
                            until: h.until,
                        },
                    )
                })
                .collect(),
            concurrency_lowered: lowered(seen.core, updated_at),
        };
        match files::write_heartbeat(seen.root, &hb) {
            Ok(()) => {
                self.heartbeat_written = true;
                self.last_heartbeat_key = key;
                if std::mem::take(&mut self.heartbeat_failing) {
                    tracing::info!("daemon.json is written again");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.heartbeat_failing, true) {
                    tracing::error!(error_code = %e.code(), "cannot write daemon.json (said once until it works again): {e}");
                }
            }
        }
    }
}

/// daemon.json's `concurrency_lowered`: the limit an OOM kill lowered,
/// while it is.
fn lowered(core: &Core, now: Timestamp) -> Option<files::Lowered> {
    let until = core.oom_lowered_until.filter(|t| *t > now.0)?;
    Some(files::Lowered {
        limit: core.concurrent_limit(now.0),
        configured: core.max_concurrent,
        until: Timestamp::from_datetime(until),
    })
}

/// daemon.json's `failing`: disabled agents (busy in the core) and agents
/// with failures in a row, by name.
fn failing_agents(
    core: &crate::daemon::core::Core,
    streaks: &BTreeMap<&AgentName, u32>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (a, slot) in core.busy() {
        if let Some(why) = &slot.disabled {
            out.insert(a.to_string(), format!("{}{why}", files::FAILING_DISABLED));
        }
    }
    for (a, failures) in streaks {
        let Some(slot) = core.slot(a) else {
            continue;
        };
        if slot.disabled.is_some() {
            continue;
        }
        let until = slot
            .backoff_until
            .map(|t| format!(" until {}", Timestamp::from_datetime(t)))
            .unwrap_or_default();
        out.insert(
            a.to_string(),
            format!("{failures} failure(s) in a row; held back{until}"),
        );
    }
    out
}

/// The agents with failures in a row, and how many: looked up among these,
/// not in every agent's streak (at 10,000 agents a lookup per agent in
/// `status_line` and the heartbeat was a large part of a wake).
fn failing_streaks(streaks: &BTreeMap<AgentName, Streak>) -> BTreeMap<&AgentName, u32> {
    streaks
        .iter()
        .filter(|(_, s)| s.failures > 0)
        .map(|(a, s)| (a, s.failures))
        .collect()
}
