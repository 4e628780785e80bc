//! The daemon's event loop: one tokio task that owns every decision.
//!
//! It waits — never polls — for the next of: an inbox event from the
//! watcher, a session ending, a signal (SIGTERM, SIGINT, SIGHUP), the next
//! deadline (a schedule, an inbox debounce, a file settling), the watchdog
//! interval, and the reconcile scan (a backstop, every few minutes). Each is
//! handed to the pure `core`, and what it decides is carried out here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::clock::Clock;
use super::core::{AgentSlot, Core, InboxSummary, Priority, Skipped, WakeReason};
use super::files::{self, Heartbeat, RunningEntry, ScheduleState};
use super::runner::{self, OutputObserver, RunReport};
use super::session;
use super::systemd;
use super::watcher::{InboxWatcher, WatchEvent};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{AgentConfig, AgentKind, Config};
use crate::error::{Error, Result};
use crate::hooks;
use crate::inbox;
use crate::schedule::{self, Missed};
use crate::state::journal::{Event, ScheduleMissed, WakeSkipped};
use crate::state::report::Report;
use crate::state::session::Session;
use crate::state::{AgentDir, StateRoot, bootstrap};

/// How often the reconcile scan looks at every inbox, as a backstop to the
/// watcher. It also refreshes the heartbeat.
const RECONCILE_EVERY: Duration = Duration::from_secs(300);

enum LoopEvent {
    Watch(WatchEvent),
    SessionPid { agent: AgentName, pid: u32 },
    SessionDone { agent: AgentName, report: RunReport },
}

struct Running {
    session_id: String,
    instance: String,
    pid: Option<u32>,
    started_at: Timestamp,
    stop: watch::Sender<bool>,
}

struct Daemon {
    config: Config,
    config_path: PathBuf,
    root: StateRoot,
    clock: Clock,
    core: Core,
    watcher: InboxWatcher,
    schedule_state: ScheduleState,
    /// The scheduled (un-jittered) time each agent's schedule next fires.
    next_scheduled: BTreeMap<AgentName, DateTime<Utc>>,
    running: BTreeMap<AgentName, Running>,
    /// Inboxes with a file still being written: look again at this time.
    settle_at: BTreeMap<AgentName, DateTime<Utc>>,
    tx: mpsc::UnboundedSender<LoopEvent>,
    started_at: Timestamp,
    stopping: Option<DateTime<Utc>>,
    /// The last heartbeat written, without its time: rewritten only when
    /// something in it changed (and by the reconcile scan), not per event.
    last_heartbeat: String,
    last_status: String,
    /// Inboxes with events not yet scanned.
    dirty: std::collections::BTreeSet<AgentName>,
    /// Consecutive failed sessions per agent (reset by a success).
    failures: BTreeMap<AgentName, u32>,
}

/// Run the daemon until SIGTERM/SIGINT. Returns once every session has
/// ended and every file is consistent.
pub async fn run(config_path: &Path) -> Result<()> {
    let config = Config::load(config_path)?;
    let root = StateRoot::new(&config.state_root);
    bootstrap::root(&root)?;
    let _lock = files::lock_root(&root)?;
    let clock = Clock::from_env();
    let (tx, mut rx) = mpsc::unbounded_channel::<LoopEvent>();
    let (watch_tx, mut watch_rx) = mpsc::unbounded_channel::<WatchEvent>();
    let watcher = InboxWatcher::new(watch_tx)?;
    let mut daemon = Daemon {
        core: Core::new(config.daemon.max_concurrent_sessions),
        config_path: config_path.to_path_buf(),
        schedule_state: files::read_schedule_state(&root),
        config,
        root,
        clock,
        watcher,
        next_scheduled: BTreeMap::new(),
        running: BTreeMap::new(),
        settle_at: BTreeMap::new(),
        tx,
        started_at: Timestamp::now(),
        stopping: None,
        last_heartbeat: String::new(),
        last_status: String::new(),
        dirty: Default::default(),
        failures: BTreeMap::new(),
    };
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| Error::io("installing a handler for", "SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| Error::io("installing a handler for", "SIGINT", e))?;
    let mut sighup = signal(SignalKind::hangup())
        .map_err(|e| Error::io("installing a handler for", "SIGHUP", e))?;
    // Test hook: with AGENT_STATE_TEST_STALL=1, SIGUSR2 blocks the main loop,
    // so a test can show that systemd's watchdog restarts a stuck daemon.
    let stall_allowed = std::env::var("AGENT_STATE_TEST_STALL").as_deref() == Ok("1");
    let mut sigusr2 = signal(SignalKind::user_defined2())
        .map_err(|e| Error::io("installing a handler for", "SIGUSR2", e))?;

    // Bootstrapping thousands of agents on a slow disk can outlast systemd's
    // start timeout: ask for time in proportion (generously, 50 ms each).
    let agents = daemon.config.agents.len() as u64;
    if agents > 100 {
        systemd::extend_start(Duration::from_secs(60) + Duration::from_millis(50 * agents));
    }
    daemon.recover();
    daemon.apply_agents(true);
    // Files that arrived while the daemon was down: scanned only now that the
    // watches are in place, so nothing can fall between scan and watch.
    daemon.scan_all_inboxes();
    // Start what is due already (a catch-up run) before waiting for anything.
    daemon.tick();
    systemd::ready(&daemon.status_line());
    tracing::info!(
        "agent-state {} ready: {} agents on {}",
        env!("CARGO_PKG_VERSION"),
        daemon.config.agents.len(),
        daemon.root.path.display()
    );

    let watchdog_every = systemd::watchdog_interval();
    let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(Duration::from_secs(3600)));
    watchdog.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    reconcile.tick().await;

    loop {
        if daemon.stopping.is_some() && daemon.running.is_empty() {
            break;
        }
        let sleep_for = daemon
            .next_deadline()
            .map(|t| daemon.clock.until(t))
            .unwrap_or(Duration::from_secs(86_400));
        tokio::select! {
            Some(event) = rx.recv() => {
                daemon.handle(event);
                while let Ok(event) = rx.try_recv() {
                    daemon.handle(event);
                }
                while let Ok(e) = watch_rx.try_recv() {
                    daemon.handle(LoopEvent::Watch(e));
                }
            }
            Some(e) = watch_rx.recv() => {
                daemon.handle(LoopEvent::Watch(e));
                while let Ok(e) = watch_rx.try_recv() {
                    daemon.handle(LoopEvent::Watch(e));
                }
                while let Ok(event) = rx.try_recv() {
                    daemon.handle(event);
                }
            }
            _ = tokio::time::sleep(sleep_for) => {}
            _ = sigterm.recv() => daemon.shutdown("SIGTERM"),
            _ = sigint.recv() => daemon.shutdown("SIGINT"),
            _ = sighup.recv() => daemon.reload(),
            _ = watchdog.tick(), if watchdog_every.is_some() => {
                systemd::watchdog();
                continue;
            }
            _ = reconcile.tick() => {
                daemon.scan_all_inboxes();
                daemon.last_heartbeat.clear();
            }
            _ = sigusr2.recv(), if stall_allowed => {
                tracing::warn!("SIGUSR2 with AGENT_STATE_TEST_STALL=1: blocking the main loop (test hook)");
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        daemon.tick();
    }
    daemon.last_heartbeat.clear();
    daemon.write_heartbeat();
    tracing::info!("stopped: every session has ended");
    Ok(())
}

/// The session's output as it streams. Parsers of the next issues plug in
/// here; for now it only counts.
struct Observer;

impl OutputObserver for Observer {
    fn on_output(&mut self, _chunk: &[u8]) {}
}

impl Daemon {
    fn dir(&self, agent: &AgentName) -> AgentDir {
        self.root.agent(agent)
    }

    fn agent_config(&self, agent: &AgentName) -> Option<&AgentConfig> {
        self.config.agents.iter().find(|a| &a.name == agent)
    }

    /// Sessions left `running` by a process that is gone (a previous daemon
    /// killed, a crashed script) become errors; their messages go back.
    fn recover(&mut self) {
        let now = Timestamp::now();
        for agent in self.config.working_agents() {
            let dir = self.root.agent(&agent.name);
            if !dir.path.is_dir() {
                continue;
            }
            // A daemon killed outright (SIGKILL, OOM) leaves its sessions'
            // processes running: end them before their session is recorded,
            // or the agent would run twice.
            if let Ok(Some(s)) = dir.read::<Session>()
                && hooks::is_stale(&s, now)
                && let Some(owner) = s.owner_pid
            {
                let marker = (
                    "AGENT_STATE_RUN".to_string(),
                    format!("{owner}:{}:{}", agent.name, s.session_id),
                );
                let killed = runner::kill_marked(&marker);
                if killed > 0 {
                    tracing::warn!(agent = %agent.name, session_id = %s.session_id, "killed {killed} process(es) left running by the session of a daemon that died (pid {owner})");
                }
            }
            match hooks::recover_stale(agent, &dir, "interrupted: daemon restarted", now) {
                Ok(Some(r)) => tracing::warn!(
                    agent = %agent.name,
                    session_id = %r.session_id,
                    "session {} was left running by a process that is gone; recorded as an error, {} message(s) returned to the inbox",
                    r.session_id,
                    r.returned.len()
                ),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(agent = %agent.name, error_code = "STATE_CORRUPT", "recovery failed: {e}")
                }
            }
            // Messages claimed by sessions that are not running go back.
            let running: Option<Session> = dir
                .read()
                .ok()
                .flatten()
                .filter(|s: &Session| s.is_running());
            if let Ok(claimed) = inbox::claimed_sessions(&dir) {
                for sid in claimed {
                    if running.as_ref().is_some_and(|s| s.session_id == sid) {
                        continue;
                    }
                    if let Ok(lock) = dir.lock() {
                        let _ = inbox::return_claimed(&dir, &sid, now);
                        drop(lock);
                    }
                }
            }
        }
    }

    /// Make the core, the watches and the schedules match the config.
    fn apply_agents(&mut self, at_start: bool) {
        let now = self.clock.now();
        let wanted: Vec<AgentConfig> = self.config.agents.clone();
        // Removed agents: unwatch; their directories stay (never deleted).
        let removed: Vec<AgentName> = self
            .core
            .agents
            .keys()
            .filter(|n| {
                !wanted
                    .iter()
                    .any(|a| &a.name == *n && a.kind == AgentKind::Agent)
            })
            .cloned()
            .collect();
        for name in removed {
            self.watcher.unwatch(&name);
            if !self.running.contains_key(&name) {
                self.core.agents.remove(&name);
            }
            self.next_scheduled.remove(&name);
            tracing::info!(agent = %name, "agent removed from the config: no longer woken (its directory is kept)");
        }
        for agent in wanted.iter().filter(|a| a.kind == AgentKind::Agent) {
            let dir = self.root.agent(&agent.name);
            if let Err(e) = bootstrap::agent(agent, &dir, Timestamp::now()) {
                tracing::error!(agent = %agent.name, error_code = "IO_ERROR", "cannot bootstrap: {e}");
                continue;
            }
            if let Err(e) = self.watcher.watch(&agent.name, &dir.inbox()) {
                tracing::error!(agent = %agent.name, error_code = "IO_ERROR", "{e}");
            }
            let slot = self
                .core
                .agents
                .entry(agent.name.clone())
                .or_insert_with(|| {
                    AgentSlot::new(agent.session.wake_on_inbox, agent.session.inbox_debounce)
                });
            slot.wake_on_inbox = agent.session.wake_on_inbox;
            slot.inbox_debounce = agent.session.inbox_debounce;
            self.plan_schedule(agent, now, at_start);
        }
        // Human mailboxes: bootstrapped, never woken.
        for agent in wanted.iter().filter(|a| a.kind == AgentKind::Human) {
            let _ = bootstrap::agent(agent, &self.root.agent(&agent.name), Timestamp::now());
        }
        self.save_schedule_state();
    }

    /// Compute the next fire time of `agent`'s schedule, and at start-up
    /// decide about runs missed while the daemon was down.
    fn plan_schedule(&mut self, agent: &AgentConfig, now: DateTime<Utc>, at_start: bool) {
        let name = agent.name.clone();
        let Some(sched) = &agent.schedule else {
            self.next_scheduled.remove(&name);
            if let Some(slot) = self.core.agents.get_mut(&name) {
                slot.next_fire = None;
            }
            self.set_next_wake(&name, None);
            return;
        };
        let last = self
            .schedule_state
            .last_fire
            .get(name.as_str())
            .map(|t| t.0);
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
                    self.schedule_state
                        .last_fire
                        .insert(name.to_string(), Timestamp::from_datetime(scheduled));
                }
                Missed::TooLate { scheduled, count } => {
                    tracing::warn!(agent = %name, "{count} scheduled run(s) missed while the daemon was down, the last at {scheduled}: outside catch_up_window, not run");
                    self.journal(
                        &name,
                        Event::ScheduleMissed(ScheduleMissed {
                            scheduled: Timestamp::from_datetime(scheduled),
                            count,
                            catch_up_window: humantime::format_duration(
                                self.config.daemon.catch_up_window,
                            )
                            .to_string(),
                        }),
                    );
                    self.schedule_state
                        .last_fire
                        .insert(name.to_string(), Timestamp::from_datetime(scheduled));
                }
            }
        }
        // A new agent's schedule counts from now: nothing before it was missed.
        self.schedule_state
            .last_fire
            .entry(name.to_string())
            .or_insert_with(|| Timestamp::from_datetime(now));
        let next = sched.next_after(now, agent.timezone);
        self.set_fire(agent, next);
    }

    fn set_fire(&mut self, agent: &AgentConfig, scheduled: Option<DateTime<Utc>>) {
        let wake = scheduled.map(|t| wake_at(agent, t));
        if let Some(slot) = self.core.agents.get_mut(&agent.name) {
            slot.next_fire = wake;
        }
        self.record_next_fire(&agent.name, scheduled, wake);
    }

    /// Remember the scheduled time of the next fire and publish its wake time
    /// (report.json `next_wake_at`).
    fn record_next_fire(
        &mut self,
        agent: &AgentName,
        scheduled: Option<DateTime<Utc>>,
        wake: Option<DateTime<Utc>>,
    ) {
        match scheduled {
            Some(t) => self.next_scheduled.insert(agent.clone(), t),
            None => self.next_scheduled.remove(agent),
        };
        self.set_next_wake(agent, wake);
    }

    /// report.json `next_wake_at`.
    fn set_next_wake(&self, agent: &AgentName, wake: Option<DateTime<Utc>>) {
        let dir = self.dir(agent);
        let result = dir.lock().and_then(|lock| {
            let mut notes = Vec::new();
            let mut report: Report = dir.load(&lock, Timestamp::now(), &mut notes)?;
            let wake = wake.map(Timestamp::from_datetime);
            if report.next_wake_at != wake {
                report.next_wake_at = wake;
                dir.save(&lock, &report)?;
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(agent = %agent, "cannot update next_wake_at: {e}");
        }
    }

    fn save_schedule_state(&self) {
        if let Err(e) = files::write_schedule_state(&self.root, &self.schedule_state) {
            tracing::error!(error_code = "IO_ERROR", "cannot write schedule.json: {e}");
        }
    }

    fn journal(&self, agent: &AgentName, event: Event) {
        let dir = self.dir(agent);
        if let Err(e) = dir.lock().and_then(|lock| {
            dir.journal_append(&lock, Timestamp::now(), event)
                .map(|_| ())
        }) {
            tracing::error!(agent = %agent, error_code = "IO_ERROR", "cannot write the journal: {e}");
        }
    }

    fn handle(&mut self, event: LoopEvent) {
        match event {
            LoopEvent::Watch(WatchEvent::Inbox(agent)) => {
                self.dirty.insert(agent);
            }
            LoopEvent::Watch(WatchEvent::Wake(agent)) => self.take_wake_requests(&agent),
            LoopEvent::Watch(WatchEvent::Rescan(why)) => {
                tracing::warn!("rescanning every inbox: {why}");
                self.scan_all_inboxes();
            }
            LoopEvent::SessionPid { agent, pid } => {
                if let Some(r) = self.running.get_mut(&agent) {
                    r.pid = Some(pid);
                }
            }
            LoopEvent::SessionDone { agent, report } => self.session_done(agent, report),
        }
    }

    fn scan_all_inboxes(&mut self) {
        let agents: Vec<AgentName> = self.core.agents.keys().cloned().collect();
        for agent in agents {
            self.take_wake_requests(&agent);
            self.scan_inbox(&agent);
        }
    }

    /// Receive what waits in `agent`'s inbox: reject settled junk, add tasks
    /// for task messages, and tell the core what waits.
    fn scan_inbox(&mut self, agent: &AgentName) {
        let Some(summary) = self.receive(agent) else {
            return;
        };
        let now = self.clock.now();
        if self.running.contains_key(agent)
            && summary
                .wants_wake(self.core.agents[agent].wake_on_inbox)
                .is_some()
        {
            // Remembered for a follow-up after the running session.
            if let Some(s) = self
                .core
                .request(agent, WakeReason::Inbox, Priority::Normal, now)
            {
                self.skipped(s);
            }
            return;
        }
        self.core.inbox_scanned(agent, summary, now);
    }

    fn receive(&mut self, agent: &AgentName) -> Option<InboxSummary> {
        let dir = self.dir(agent);
        let now = Timestamp::now();
        let result = dir.lock().and_then(|lock| {
            let received = inbox::receive(&dir, now)?;
            let mut notes = Vec::new();
            hooks::add_tasks_from_messages(&dir, &lock, &received.tasks, now, &mut notes)?;
            Ok(received)
        });
        match result {
            Ok(r) => {
                for (name, reason) in &r.rejected {
                    tracing::warn!(agent = %agent, error_code = "INBOX_REJECTED", "inbox/{name} rejected: {reason}");
                }
                if r.unsettled {
                    let at = self.clock.now()
                        + chrono::Duration::from_std(inbox::SETTLE_TIME).unwrap_or_default();
                    self.settle_at.insert(agent.clone(), at);
                }
                Some(InboxSummary {
                    high: r.high,
                    normal: r.normal,
                })
            }
            Err(e) => {
                tracing::error!(agent = %agent, error_code = "IO_ERROR", "cannot scan the inbox: {e}");
                None
            }
        }
    }

    fn take_wake_requests(&mut self, agent: &AgentName) {
        let inbox_dir = self.dir(agent).inbox();
        let Ok(entries) = std::fs::read_dir(&inbox_dir) else {
            return;
        };
        let mut found = false;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if files::is_wake_request(&name) {
                let _ = std::fs::remove_file(entry.path());
                found = true;
            }
        }
        if found {
            tracing::info!(agent = %agent, "wake requested");
            let now = self.clock.now();
            if let Some(s) = self
                .core
                .request(agent, WakeReason::Manual, Priority::High, now)
            {
                self.skipped(s);
            }
        }
    }

    fn skipped(&self, s: Skipped) {
        tracing::info!(agent = %s.agent, session_id = %s.running, "{} wake skipped: session {} is running", s.reason.as_str(), s.running);
        self.journal(
            &s.agent,
            Event::WakeSkipped(WakeSkipped {
                reason: s.reason.as_str().to_string(),
                running_session: s.running,
            }),
        );
    }

    /// Everything that is due now: schedules, debounces, settling files,
    /// then start what can start.
    fn tick(&mut self) {
        for agent in std::mem::take(&mut self.dirty) {
            self.scan_inbox(&agent);
        }
        let now = self.clock.now();
        let settled: Vec<AgentName> = self
            .settle_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(a, _)| a.clone())
            .collect();
        for agent in settled {
            self.settle_at.remove(&agent);
            self.scan_inbox(&agent);
        }
        // The core advances each due schedule through this closure, which
        // computes the next fire once; it is recorded right after.
        let config = &self.config;
        let next_scheduled = &self.next_scheduled;
        let mut advanced: Vec<(AgentName, DateTime<Utc>, Option<DateTime<Utc>>)> = Vec::new();
        let (_, skipped) = self.core.fire_due_schedules(now, |name, _wake| {
            let scheduled = next_scheduled.get(name).copied()?;
            let cfg = config.agents.iter().find(|a| &a.name == name)?;
            let next = cfg.schedule.as_ref()?.next_after(scheduled, cfg.timezone);
            advanced.push((name.clone(), scheduled, next));
            next.map(|t| wake_at(cfg, t))
        });
        for s in skipped {
            self.skipped(s);
        }
        if !advanced.is_empty() {
            for (name, fired, next) in advanced {
                self.schedule_state
                    .last_fire
                    .insert(name.to_string(), Timestamp::from_datetime(fired));
                let wake = self.core.agents.get(&name).and_then(|slot| slot.next_fire);
                self.record_next_fire(&name, next, wake);
            }
            self.save_schedule_state();
        }
        for s in self.core.fire_due_inbox(now) {
            self.skipped(s);
        }
        let startable = self.core.take_startable(now);
        for (agent, wake) in startable {
            self.start(&agent, wake.reason);
        }
        self.after_change();
    }

    fn start(&mut self, agent: &AgentName, reason: WakeReason) {
        let Some(cfg) = self.agent_config(agent).cloned() else {
            self.core
                .session_ended(agent, InboxSummary::default(), self.clock.now());
            return;
        };
        let now = Timestamp::from_datetime(self.clock.now());
        let prepared = match session::prepare(&self.config, &cfg, &self.root, now) {
            Ok(p) => p,
            Err(Error::SessionBusy { session, pid, .. }) => {
                // A session script run by something else (cron) holds it.
                tracing::info!(agent = %agent, session_id = %session, "{} wake skipped: session {session} is running (pid {pid}) outside the daemon", reason.as_str());
                self.journal(
                    agent,
                    Event::WakeSkipped(WakeSkipped {
                        reason: reason.as_str().to_string(),
                        running_session: session,
                    }),
                );
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                return;
            }
            Err(e) => {
                tracing::error!(agent = %agent, error_code = "AGENT_SPAWN_FAILED", "cannot begin a session: {e}");
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                return;
            }
        };
        tracing::info!(
            agent = %agent,
            session_id = %prepared.session_id,
            instance = %prepared.instance,
            "session {} started ({}), instance {}",
            prepared.session_id,
            reason.as_str(),
            prepared.instance
        );
        self.core.session_started(agent, &prepared.session_id);
        let (stop_tx, stop_rx) = watch::channel(false);
        self.running.insert(
            agent.clone(),
            Running {
                session_id: prepared.session_id.clone(),
                instance: prepared.instance.clone(),
                pid: None,
                started_at: now,
                stop: stop_tx,
            },
        );
        let tx = self.tx.clone();
        let name = agent.clone();
        let spec = prepared.spec;
        tokio::spawn(async move {
            let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<u32>();
            let pid_forward = {
                let tx = tx.clone();
                let name = name.clone();
                async move {
                    if let Ok(pid) = pid_rx.await {
                        let _ = tx.send(LoopEvent::SessionPid { agent: name, pid });
                    }
                }
            };
            let mut observer = Observer;
            let (report, ()) = tokio::join!(
                runner::run(spec, &mut observer, stop_rx, Some(pid_tx)),
                pid_forward
            );
            let _ = tx.send(LoopEvent::SessionDone {
                agent: name,
                report,
            });
        });
    }

    fn session_done(&mut self, agent: AgentName, report: RunReport) {
        let Some(running) = self.running.remove(&agent) else {
            return;
        };
        let now = Timestamp::from_datetime(self.clock.now());
        let dir = self.dir(&agent);
        let cfg = self.agent_config(&agent).cloned();
        let outcome = match &cfg {
            Some(cfg) => session::finish(cfg, &dir, &running.session_id, &report, now),
            // Removed from the config while it ran: record it all the same.
            None => Err(Error::Usage("agent no longer configured".into())),
        };
        let failed = !matches!(&outcome, Ok(text) if text.starts_with("completed"));
        match outcome {
            Ok(text) if text.starts_with("completed") => tracing::info!(
                agent = %agent, session_id = %running.session_id, instance = %running.instance,
                "session {} {text}", running.session_id
            ),
            Ok(text) => tracing::warn!(
                agent = %agent, session_id = %running.session_id, instance = %running.instance,
                "session {} {text}", running.session_id
            ),
            Err(e) => tracing::error!(
                agent = %agent, session_id = %running.session_id, error_code = "IO_ERROR",
                "cannot record the end of session {}: {e}", running.session_id
            ),
        }
        if report.truncated {
            tracing::warn!(agent = %agent, session_id = %running.session_id, error_code = "OUTPUT_TRUNCATED",
                "output truncated at {} bytes ({} produced)", report.logged_bytes, report.output_bytes);
        }
        self.note_outcome(&agent, failed);
        let waiting = self.receive(&agent).unwrap_or_default();
        self.core.session_ended(&agent, waiting, self.clock.now());
        if !self
            .config
            .agents
            .iter()
            .any(|a| a.name == agent && a.kind == AgentKind::Agent)
        {
            self.core.agents.remove(&agent);
        }
    }

    /// Consecutive failures hold back the agent's automatic wakes (30 s, 1 min,
    /// 2 min, … up to an hour), so a broken command or a failing API does not
    /// turn waiting messages into a burst of failed sessions. A manual wake is
    /// still served, and the first success clears it.
    fn note_outcome(&mut self, agent: &AgentName, failed: bool) {
        let count = self.failures.entry(agent.clone()).or_insert(0);
        *count = if failed { *count + 1 } else { 0 };
        let backoff = (*count > 0).then(|| {
            let secs = 30u64.saturating_mul(1 << (*count - 1).min(7)).min(3600);
            self.clock.now() + chrono::Duration::seconds(secs as i64)
        });
        if let (Some(until), Some(n)) = (backoff, self.failures.get(agent)) {
            tracing::warn!(agent = %agent, "{n} failed session(s) in a row: automatic wakes held back until {}", Timestamp::from_datetime(until));
        }
        if let Some(slot) = self.core.agents.get_mut(agent) {
            slot.backoff_until = backoff;
        }
    }

    fn shutdown(&mut self, why: &str) {
        if self.stopping.is_some() {
            // A second signal: stop the sessions now.
            tracing::warn!("{why} again: ending running sessions now");
            for r in self.running.values() {
                let _ = r.stop.send(true);
            }
            return;
        }
        let grace = self.config.daemon.shutdown_grace;
        self.stopping =
            Some(self.clock.now() + chrono::Duration::from_std(grace).unwrap_or_default());
        self.core.waking_stopped = true;
        let longest_kill = self
            .config
            .agents
            .iter()
            .map(|a| a.session.kill_grace)
            .max()
            .unwrap_or_default();
        let status = format!(
            "stopping: waiting up to {} for {} session(s)",
            humantime::format_duration(grace),
            self.running.len()
        );
        systemd::stopping(&status, grace + longest_kill + Duration::from_secs(15));
        tracing::info!("{why}: {status}");
    }

    fn reload(&mut self) {
        systemd::reloading();
        match Config::load(&self.config_path) {
            Ok(config) => {
                if config.state_root != self.config.state_root {
                    tracing::error!(
                        error_code = "CONFIG_INVALID",
                        "config reload refused: state_root cannot change while the daemon runs (restart it instead)"
                    );
                } else {
                    self.core.max_concurrent = config.daemon.max_concurrent_sessions.max(1);
                    self.config = config;
                    self.apply_agents(false);
                    self.scan_all_inboxes();
                    tracing::info!("config reloaded: {} agents", self.config.agents.len());
                }
            }
            Err(e) => tracing::error!(
                error_code = "CONFIG_INVALID",
                "config reload refused, the old config stays in force: {e}"
            ),
        }
        systemd::ready(&self.status_line());
    }

    fn next_deadline(&self) -> Option<DateTime<Utc>> {
        [
            self.core.next_deadline(),
            self.settle_at.values().min().copied(),
            self.stopping.filter(|_| !self.running.is_empty()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// After anything changed: the shutdown deadline, the heartbeat, STATUS=.
    fn after_change(&mut self) {
        if let Some(deadline) = self.stopping
            && self.clock.now() >= deadline
        {
            for r in self.running.values() {
                let _ = r.stop.send(true);
            }
        }
        self.write_heartbeat();
        let status = self.status_line();
        if status != self.last_status {
            systemd::status(&status);
            self.last_status = status;
        }
    }

    fn status_line(&self) -> String {
        let running: Vec<String> = self.running.keys().map(|a| a.to_string()).collect();
        let next = self
            .core
            .agents
            .iter()
            .filter_map(|(n, s)| s.next_fire.map(|t| (t, n)))
            .min()
            .map(|(t, n)| format!("; next: {n} at {}", Timestamp::from_datetime(t)))
            .unwrap_or_default();
        let state = if self.stopping.is_some() {
            "stopping; "
        } else {
            ""
        };
        format!(
            "{state}{} agents, {} running{}, {} waiting{next}",
            self.core.agents.len(),
            running.len(),
            if running.is_empty() {
                String::new()
            } else {
                format!(" ({})", running.join(", "))
            },
            self.core.waiting_count()
        )
    }

    fn write_heartbeat(&mut self) {
        let mut hb = Heartbeat {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
            updated_at: Timestamp::now(),
            state_root: self.root.path.display().to_string(),
            config: self.config_path.display().to_string(),
            agents: self.core.agents.keys().map(|a| a.to_string()).collect(),
            running: self
                .running
                .iter()
                .map(|(a, r)| RunningEntry {
                    agent: a.to_string(),
                    session_id: r.session_id.clone(),
                    instance: r.instance.clone(),
                    pid: r.pid,
                    started_at: r.started_at,
                })
                .collect(),
            waiting: self
                .core
                .agents
                .iter()
                .filter(|(_, s)| s.pending.is_some())
                .map(|(a, _)| a.to_string())
                .collect(),
            next_wakes: self
                .core
                .agents
                .iter()
                .filter_map(|(a, s)| {
                    s.next_fire
                        .map(|t| (a.to_string(), Timestamp::from_datetime(t)))
                })
                .collect(),
            paused: None,
            stopping: self.stopping.is_some(),
        };
        let updated_at = hb.updated_at;
        hb.updated_at = self.started_at;
        let content = serde_json::to_string(&hb).unwrap_or_default();
        if content == self.last_heartbeat {
            return;
        }
        hb.updated_at = updated_at;
        self.last_heartbeat = content;
        if let Err(e) = files::write_heartbeat(&self.root, &hb) {
            tracing::error!(error_code = "IO_ERROR", "cannot write daemon.json: {e}");
        }
    }
}

/// When `agent` wakes for the fire scheduled at `scheduled`: plus its jitter.
fn wake_at(agent: &AgentConfig, scheduled: DateTime<Utc>) -> DateTime<Utc> {
    let jitter = schedule::jitter_offset(agent.name.as_str(), scheduled, agent.session.jitter);
    scheduled + chrono::Duration::from_std(jitter).unwrap_or_default()
}
