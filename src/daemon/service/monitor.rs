//! The health monitor: the disk, pruning by retention, sessions that
//! outlived their owner or their timeout; and `raise`, the one way an error
//! leaves the loop (errors.jsonl, journald, hook, escalation).

use super::*;

/// A session whose process has not started after this long expires.
pub(super) const HATCH_EXPIRY: Duration = Duration::from_secs(300);

/// A session that began at `began` and whose process has not started is
/// given up at `now` (both on the sessions' clock).
fn hatch_expired(began: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now >= crate::clock::later(began, HATCH_EXPIRY)
}

/// How often stale temp files, old processed messages and old session logs
/// are pruned when the disk is fine (below `disk_pause`: every health check).
pub(super) const ROUTINE_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// What the health monitor keeps between checks.
#[derive(Default)]
pub(super) struct Monitor {
    pub(super) health: Option<HealthState>,
    pub(super) last_routine_prune: Option<std::time::Instant>,
    /// External sessions past their timeout already reported.
    pub(super) overdue_reported: std::collections::BTreeSet<String>,
    /// Worktrees are being pruned (off the loop; one pruning at a time).
    pub(super) workspace_prune_running: bool,
    pub(super) last_workspace_prune: Option<std::time::Instant>,
    /// Logs are being rotated (off the loop; one round at a time).
    pub(super) log_rotation_running: bool,
    pub(super) last_segment_prune: Option<std::time::Instant>,
}

impl Monitor {
    /// Worktrees of sessions that are gone: pruned off the loop, once an
    /// hour (every five minutes while the disk is low), one pruning at a
    /// time. What it did comes back as `Event::WorkspacesPruned`.
    /// (`live`: the worktrees of the sessions running, asked for only when
    /// a pruning starts.)
    fn prune_workspaces(
        &mut self,
        config: &Config,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        disk_low: bool,
        live: impl FnOnce() -> Vec<PathBuf>,
        now: Timestamp,
    ) {
        let every = if disk_low {
            Duration::from_secs(300)
        } else {
            Duration::from_secs(3600)
        };
        if self.workspace_prune_running
            || self
                .last_workspace_prune
                .is_some_and(|t| t.elapsed() < every)
        {
            return;
        }
        let root = root.clone();
        let jobs = workspaces::prune_jobs(config.working_agents(), |a: &AgentConfig| {
            root.agent(&a.name)
        });
        if jobs.is_empty() {
            return;
        }
        let live = live();
        self.workspace_prune_running = true;
        self.last_workspace_prune = Some(std::time::Instant::now());
        let tx = tx.clone();
        let now: std::time::SystemTime = now.0.into();
        tokio::task::spawn_blocking(move || {
            let (removed, errors) = workspaces::prune(&jobs, &live, now);
            let _ = tx.send(Event::WorkspacesPruned { removed, errors });
        });
    }
    /// The logs over `[logs] rotate_size` rotated, off the loop, at every
    /// health check (a `stat` per agent); segments past retention pruned
    /// hourly. What it did comes back as `Event::LogsRotated`.
    fn rotate_logs(
        &mut self,
        config: &Config,
        root: &StateRoot,
        tx: &mpsc::UnboundedSender<Event>,
        now: Timestamp,
    ) {
        if self.log_rotation_running {
            return;
        }
        let prune = self
            .last_segment_prune
            .is_none_or(|t| t.elapsed() >= ROUTINE_PRUNE_EVERY);
        if prune {
            self.last_segment_prune = Some(std::time::Instant::now());
        }
        let job = crate::daemon::rotation::Job {
            agents: config.agents.iter().map(|a| root.agent(&a.name)).collect(),
            daemon_logs: vec![
                crate::state::error_log::log_path(root),
                effects::signals_log(root),
            ],
            settings: config.logs.clone(),
            prune,
            store: root.store.clone(),
        };
        self.log_rotation_running = true;
        let tx = tx.clone();
        tokio::task::spawn_blocking(move || {
            let outcome = crate::daemon::rotation::run(&job, now);
            let _ = tx.send(Event::LogsRotated(Box::new(outcome)));
        });
    }

    /// The monitor's pruning of worktrees came back (returns the errors to
    /// raise).
    pub(super) fn workspaces_pruned(
        &mut self,
        removed: Vec<String>,
        errors: Vec<String>,
    ) -> Vec<ErrorRecord> {
        self.workspace_prune_running = false;
        for line in removed {
            tracing::info!("workspace pruned: {line}");
        }
        errors
            .into_iter()
            .map(|e| ErrorRecord::new(Code::WorkspaceFailed, "cannot prune workspaces").details(e))
            .collect()
    }

    /// The rotation of the logs came back (returns the errors to raise).
    pub(super) fn logs_rotated(
        &mut self,
        outcome: crate::daemon::rotation::Outcome,
    ) -> Vec<ErrorRecord> {
        self.log_rotation_running = false;
        for line in &outcome.rotated {
            tracing::info!("log rotated: {line}");
        }
        if outcome.pruned.0 > 0 {
            tracing::info!(
                "removed {} rotated log segment(s), {}, past [logs] retention",
                outcome.pruned.0,
                health::format_bytes(outcome.pruned.1)
            );
        }
        for shown in &outcome.deferred {
            tracing::info!(
                "{shown} is due for rotation but its agent's lock is busy: next health check"
            );
        }
        outcome
            .errors
            .into_iter()
            .map(|e| ErrorRecord::new(Code::IoError, "cannot rotate a log").details(e))
            .collect()
    }
}

impl Daemon {
    /// Raise an error through [`Alerts`], escalating each code once per
    /// agent's failure streak.
    pub(super) fn raise(&mut self, mut record: ErrorRecord, escalate: bool) {
        record.stamp(Timestamp::from_datetime(self.clock.now()));
        let agent = record
            .context
            .agent
            .as_deref()
            .and_then(|a| AgentName::parse(a).ok());
        let escalate = escalate
            && record
                .code()
                .is_some_and(|c| self.escalated.first(agent.as_ref(), c));
        *self
            .tally
            .errors
            .entry((record.code.clone(), record.severity.to_string()))
            .or_default() += 1;
        self.alerts.raise(record, escalate);
    }

    /// Raise each of `records` (not escalated): what a part returned.
    pub(super) fn raise_each(&mut self, records: impl IntoIterator<Item = ErrorRecord>) {
        for record in records {
            self.raise(record, false);
        }
    }

    /// The health check: with `full`, the routine prune, the rotation of
    /// the logs and the look at every session too.
    pub(super) fn check_health(&mut self, full: bool) {
        let now = Timestamp::now();
        let probe = match health::probe(&self.root.path) {
            Ok(p) => p,
            Err(e) => {
                self.raise(
                    ErrorRecord::new(Code::IoError, "cannot check free space on the state root")
                        .details(format!("statvfs {}: {e}", self.root.path.display())),
                    false,
                );
                return;
            }
        };
        let prev = self.monitor.health.clone();
        let mut state = HealthState::observe(
            prev.as_ref(),
            probe,
            &Thresholds::from(&self.config.health),
            now,
        );
        let was_ro = prev.as_ref().is_some_and(|p| p.read_only);
        let mut recovered = false;
        let old = prev.as_ref().map(|p| p.level).unwrap_or_default();
        let fragment = state.status_fragment();
        if state.read_only && !was_ro {
            self.raise(
                ErrorRecord::new(
                    Code::FsReadonly,
                    format!(
                        "the state root {} is on a read-only file system: no writes, no wakes",
                        self.root.path.display()
                    ),
                ),
                false,
            );
        } else if !state.read_only && state.level > old {
            let (code, escalate) = match state.level {
                DiskLevel::Low => (Code::DiskLow, false),
                DiskLevel::Paused => (Code::DiskCritical, true),
                _ => (Code::DiskFull, false),
            };
            if state.level != DiskLevel::Ok {
                self.raise(
                    ErrorRecord::new(code, fragment.clone()).details(format!(
                        "{} free of {} on {}",
                        health::format_bytes(state.free),
                        health::format_bytes(state.total),
                        self.root.path.display()
                    )),
                    escalate,
                );
            }
        }
        if (state.level < old || (was_ro && !state.read_only)) && state.level.allows_new_sessions()
        {
            tracing::info!("disk recovered ({fragment}): waking agents again");
            for code in [Code::DiskCritical, Code::DiskFull, Code::FsReadonly] {
                self.escalated.clear_code(code);
            }
            recovered = true;
        }
        if state.level.stops_sessions() {
            let why = format!("ended by the health monitor: {fragment}");
            for r in self.running.values_mut() {
                if r.stop_reason.is_none() {
                    tracing::warn!(session_id = %r.session_id, "{why}");
                    r.stop_for(why.clone());
                }
            }
        }
        let routine_due = self
            .monitor
            .last_routine_prune
            .is_none_or(|t| t.elapsed() >= ROUTINE_PRUNE_EVERY);
        if state.should_prune() || (full && routine_due && !state.read_only) {
            self.monitor.last_routine_prune = Some(std::time::Instant::now());
            let running: Vec<(AgentName, String)> = self
                .running
                .iter()
                .map(|(a, r)| (a.clone(), r.session_id.clone()))
                .collect();
            let agents: Vec<&AgentName> = self.config.agents.iter().map(|a| &a.name).collect();
            let stats = prune_all(&self.root, &self.config.health, &agents, &running);
            if !stats.is_empty() {
                tracing::info!(
                    "pruned {} file(s), {} (processed messages and session logs past retention, stale temp files)",
                    stats.files,
                    health::format_bytes(stats.bytes)
                );
                state.record_prune(stats, now);
            }
        }
        if full {
            let (running, config, index, root) =
                (&self.running, &self.config, &self.agent_index, &self.root);
            let live = || {
                running
                    .iter()
                    .filter_map(|(a, r)| {
                        let cfg = agent_in(config, index, a)?;
                        let w = cfg.session.workspace.as_ref()?;
                        Some(workspaces::root_of(w, cfg, &root.agent(a)).join(&r.session_id))
                    })
                    .collect()
            };
            (self.monitor).prune_workspaces(
                &self.config,
                &self.root,
                &self.tx,
                state.level != DiskLevel::Ok,
                live,
                Timestamp::from_datetime(self.clock.now()),
            );
            if !state.read_only {
                let now = Timestamp::from_datetime(self.clock.now());
                (self.monitor).rotate_logs(&self.config, &self.root, &self.tx, now);
            }
        }
        self.monitor.health = Some(state);
        if !self.monitor.health.as_ref().is_some_and(|h| h.read_only) {
            self.alerts.flush();
        }
        self.core.waking_stopped = self.stopping.is_some()
            || self
                .monitor
                .health
                .as_ref()
                .is_some_and(|h| !h.level.allows_new_sessions());
        if full && !self.monitor.health.as_ref().is_some_and(|h| h.read_only) {
            let raise = check_sessions(
                &self.config,
                &self.agent_index,
                &mut self.running,
                &self.root,
                &mut self.orphan_locks,
                &mut self.monitor.overdue_reported,
                now,
            );
            self.raise_each(raise);
        }
        if recovered {
            // Scans and writes that failed during the outage: look again
            // now rather than at the next reconcile.
            self.scan_all_inboxes();
        }
        self.after_change();
    }
}

/// Prune every agent's old processed messages, old session logs and stale
/// temp files, as the config's retention allows; never the files of the
/// `running` sessions.
pub(super) fn prune_all(
    root: &StateRoot,
    h: &crate::config::HealthSettings,
    agents: &[impl std::borrow::Borrow<AgentName>],
    running: &[(AgentName, String)],
) -> PruneStats {
    let now = std::time::SystemTime::now();
    let mut total = PruneStats::default();
    for name in agents {
        let name = name.borrow();
        let dir = root.agent(name);
        if !crate::fsx::is_dir(&dir.path) {
            continue;
        }
        let protect = running
            .iter()
            .find(|(a, _)| a == name)
            .map(|(_, s)| s.as_str());
        let results = [
            health::prune_processed(&dir, now - h.processed_retention),
            health::prune_sessions(
                &dir,
                now - h.session_log_retention,
                h.keep_sessions,
                protect,
            ),
            health::prune_stale_temps(&dir, now - Duration::from_secs(3600), now),
        ];
        for r in results {
            match r {
                Ok(stats) => total += stats,
                Err(e) => tracing::warn!(agent = %name, "pruning: {e}"),
            }
        }
    }
    // Temp files of the daemon's own writes interrupted by a crash.
    match health::prune_atomic_temps(&root.daemon_dir(), now - health::STALE_TEMP_AGE, now) {
        Ok(stats) => total += stats,
        Err(e) => tracing::warn!("pruning .daemon/: {e}"),
    }
    total
}

/// Sessions recorded as running that the daemon does not run: finished
/// when their owner is gone; their owner is told to stop when they ran
/// past their timeout. The daemon's own sessions past their timeout
/// (which the runner should have ended) are stopped.
/// (Returns the records to raise.)
pub(super) fn check_sessions(
    config: &Config,
    agent_index: &std::collections::HashMap<AgentName, usize>,
    running: &mut BTreeMap<AgentName, Running>,
    root: &StateRoot,
    orphan_locks: &mut BTreeMap<AgentName, crate::owner::OwnerLock>,
    overdue_reported: &mut std::collections::BTreeSet<String>,
    now: Timestamp,
) -> Vec<ErrorRecord> {
    let mut raise = Vec::new();
    // Names, not configs: each health check cloned every agent's config
    // (10,000 of them in the benchmark). A config is cloned only for a
    // session recorded as running that the daemon does not run.
    let names: Vec<AgentName> = config.working_agents().map(|a| a.name.clone()).collect();
    for name in names {
        if agent_in(config, agent_index, &name).is_none() {
            continue;
        }
        if let Some(r) = running.get_mut(&name) {
            if r.recording {
                // Ended; its end is being recorded.
                continue;
            }
            // Seed 003's placeholder expiry: a session whose process
            // never started within 5 minutes is given up (a hatching
            // agent stays hatching for its next wake). A session on a
            // worker has no pid here: its worker says it started.
            // Timed on the sessions' monotonic clock: a wall clock step
            // expires no session early (nor late).
            if r.pid.is_none()
                && r.host.is_none()
                && r.stop_reason.is_none()
                && hatch_expired(r.began, r.clock.now())
            {
                r.stop_for(format!(
                    "expired: its process did not start within {}",
                    humantime::format_duration(HATCH_EXPIRY)
                ));
                continue;
            }
            // Overdue by its machine's timers: its run's timeout and grace
            // (each iteration's own), never a verification's time.
            if r.machine
                .due_to_end()
                .is_some_and(|due| health::past_due(due, r.clock.now()))
                && r.stop_reason.is_none()
            {
                r.stop_for("ran past its timeout; stopped by the health monitor".into());
                let sid = r.session_id.clone();
                raise.push(
                    ErrorRecord::new(
                        Code::SessionTimeout,
                        format!("{name}: session {sid} ran past its timeout and was not ended; stopping it"),
                    )
                    .agent(&name)
                    .session(sid)
                );
            }
            continue;
        }
        let dir = root.agent(&name);
        let Ok(s) = dir.read::<Session>() else {
            continue;
        };
        let Some(s) = s.filter(Session::is_running) else {
            // Claims a recovery at start could not return (the lock was
            // held): never waiting here, the next check tries again.
            match start::return_orphan_claims(&dir, Duration::ZERO, now) {
                Ok(returned) => {
                    start::log_returned(&name, &returned, "found by the health monitor")
                }
                Err(e) => tracing::debug!(agent = %name, "orphan claims not returned yet: {e}"),
            }
            continue;
        };
        let Some(agent) = agent_in(config, agent_index, &name).cloned() else {
            continue;
        };
        if began_here(&s) {
            // Ours, but not running: its end could not be recorded (a
            // full disk). Record it now.
            let record = ending::finish_orphan(root, orphan_locks, &agent, &s.session_id, now);
            raise.extend(record);
            continue;
        }
        // Its owner's lock says whether it is alive, wherever it runs
        // (a script in another PID namespace is invisible to us).
        if hooks::stale(&dir, &s, agent.session.timeout, now).is_some() {
            let result =
                hooks::recover_stale(&agent, &dir, "interrupted: its process is gone", now);
            if let Some(record) = recovered(&agent, result, "its process is gone") {
                raise.push(record);
            }
            continue;
        }
        if let Some(started) = s.started_at
            && health::overdue(
                started.0,
                agent.session.timeout,
                agent.session.kill_grace,
                now.0,
            )
            && overdue_reported.insert(s.session_id.clone())
        {
            let mut details = "its owner is alive".to_string();
            // Only a process we can see, and that is the owner (its
            // start time matches): a pid from another PID namespace
            // may name an unrelated process of ours.
            if let Some(pid) = s.owner_pid
                && s.owner_start.is_some()
                && hooks::Owner::of(pid).start == s.owner_start
            {
                let sent = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
                details = match sent {
                    Ok(()) => format!(
                        "sent SIGTERM to its owner, pid {pid}; it is finished once that exits"
                    ),
                    Err(e) => format!("cannot signal its owner, pid {pid}: {e}"),
                };
            } else if let Some(pid) = s.owner_pid {
                details = format!(
                    "its owner (pid {pid}) holds its lock but is not visible to the daemon (another PID namespace or user); end it with `agent-state session fail {} --session {} --outcome timeout --reason ...`",
                    agent.name, s.session_id
                );
            }
            raise.push(
                ErrorRecord::new(
                    Code::SessionTimeout,
                    format!(
                        "{}: session {} (run outside the daemon) is past its timeout of {}",
                        agent.name,
                        s.session_id,
                        humantime::format_duration(agent.session.timeout)
                    ),
                )
                .details(details)
                .agent(&agent.name)
                .session(s.session_id.clone()),
            );
        }
    }
    raise
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::clock::SessionClock;

    /// The expiry of a process that never started is timed on the
    /// sessions' clock: seconds since the daemon's start on the monotonic
    /// clock, whatever the wall clock did meanwhile.
    #[test]
    fn a_process_that_never_started_expires_after_five_minutes_of_the_sessions_clock() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-26T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let clock = SessionClock::starting(t0);
        let at = |s: u64| clock.at(Duration::from_secs(s));
        let began = at(100);
        let rows = [(100, false), (399, false), (400, true), (4000, true)];
        for (secs, expired) in rows {
            assert_eq!(hatch_expired(began, at(secs)), expired, "+{secs}s");
        }
        // The wall clock an hour ahead at +200 s: a wall clock reading
        // would have expired it; the sessions' clock does not.
        let wall = t0 + chrono::Duration::seconds(200 + 3600);
        assert!(hatch_expired(began, wall), "the wall clock's answer");
        assert!(!hatch_expired(began, at(200)));
    }
}
