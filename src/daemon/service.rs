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

use super::alerts::{Alerts, EscalationMemory};
use super::clock::Clock;
use super::core::{AgentSlot, Core, InboxSummary, Priority, Skipped, WakeReason};
use super::effects;
use super::failure::{self, Next, Observed, Streak};
use super::files::{self, Heartbeat, RunningEntry, ScheduleState};
use super::health::{self, DiskLevel, HealthState, PruneStats, Thresholds};
use super::output::{self, ClaudeResult, SessionOutput};
use super::runner::{self, Ending, OutputObserver, OutputStream, RunReport};
use super::session;
use super::systemd;
use super::watcher::{InboxWatcher, WatchEvent};
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::config::{AgentConfig, AgentKind, Config};
use crate::error::{Error, Result};
use crate::errors::{Code, ErrorRecord};
use crate::hooks;
use crate::inbox;
use crate::schedule::{self, Missed};
use crate::state::journal::{Event, ScheduleMissed, WakeSkipped};
use crate::state::report::{AgentStatus, Lifecycle, Report, ReportError};
use crate::state::session::Session;
use crate::state::{AgentDir, StateRoot, bootstrap};

/// How often the reconcile scan looks at every inbox, as a backstop to the
/// watcher. It also refreshes the heartbeat.
const RECONCILE_EVERY: Duration = Duration::from_secs(300);
/// How often the daemon checks that its root's lock is still its own.
const ROOT_CHECK_EVERY: Duration = Duration::from_secs(5);

/// A session whose process has not started after this long expires.
const HATCH_EXPIRY: Duration = Duration::from_secs(300);

/// How often stale temp files, old processed messages and old session logs
/// are pruned when the disk is fine (below `disk_pause`: every health check).
const ROUTINE_PRUNE_EVERY: Duration = Duration::from_secs(3600);

enum LoopEvent {
    Watch(WatchEvent),
    SessionPid {
        agent: AgentName,
        pid: u32,
    },
    SessionStalled {
        agent: AgentName,
        silent_for: Duration,
    },
    /// A signal (or an invalid one) in a session's output, as it streams.
    Signal {
        agent: AgentName,
        signal: Box<crate::protocol::signals::SignalResult>,
    },
    SessionDone {
        agent: AgentName,
        report: Box<RunReport>,
        output: Box<OutputSummary>,
    },
}

/// What the daemon keeps of a session's output once it ended.
struct OutputSummary {
    empty: bool,
    fingerprint: Option<u64>,
    claude: Option<ClaudeResult>,
    /// The end of stdout (at most 256 KiB), where the summary blocks are.
    tail: String,
}

impl OutputSummary {
    /// For a session that never ran.
    fn none() -> OutputSummary {
        OutputSummary {
            empty: false,
            fingerprint: None,
            claude: None,
            tail: String::new(),
        }
    }
}

struct Running {
    session_id: String,
    instance: String,
    pid: Option<u32>,
    started_at: Timestamp,
    stop: watch::Sender<bool>,
    /// Why the daemon stopped it, if it did for another reason than shutdown.
    stop_reason: Option<String>,
    /// The same, for the session's observer, which notes it in session.json
    /// before the runner signals the session.
    stop_note: StopNote,
    /// The session signalled COMPLETE.
    completed_by_signal: bool,
    /// Signals (valid or not) handled so far, and the last PROGRESS value:
    /// an agent that prints signals in a loop must not turn the daemon's
    /// loop into a stream of fsyncs.
    signals_seen: u32,
    /// `DISCOVERY_GLOBAL` signals shared with every agent so far.
    global_discoveries: u32,
    last_progress: Option<u8>,
    /// The session's owner lock: held while the daemon owns the session.
    owner_lock: Option<crate::owner::OwnerLock>,
}

/// Why the daemon stops a session, shared with its [`Observer`].
type StopNote = std::sync::Arc<std::sync::Mutex<Option<String>>>;

impl Running {
    /// Stop the session for `why` (not a shutdown): recorded as an error
    /// with this reason.
    fn stop_for(&mut self, why: String) {
        if let Ok(mut note) = self.stop_note.lock() {
            *note = Some(why.clone());
        }
        self.stop_reason = Some(why);
        let _ = self.stop.send(true);
    }
}

/// Signals handled per session; the rest are counted and ignored.
const SIGNALS_PER_SESSION: u32 = 1000;

struct Daemon {
    /// Inbox files a writer has open (written, not yet closed), per agent.
    writing: BTreeMap<AgentName, inbox::Writing>,
    /// Agents whose lock was busy at the last try: logged once when that
    /// starts and once when it ends, not at every retry.
    lock_busy: std::collections::BTreeSet<AgentName>,
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
    /// Each agent's run of failed sessions (reset by a success).
    streaks: BTreeMap<AgentName, Streak>,
    alerts: Alerts,
    escalated: EscalationMemory,
    health: Option<HealthState>,
    last_routine_prune: Option<std::time::Instant>,
    /// External sessions past their timeout already reported.
    overdue_reported: std::collections::BTreeSet<String>,
    /// report.json `next_wake_at` as last written, per agent.
    published_wake: std::cell::RefCell<BTreeMap<AgentName, Option<Timestamp>>>,
    /// Wake request files already served that could not be removed (a
    /// read-only disk): not served again, removed when possible.
    served_wakes: std::collections::BTreeSet<PathBuf>,
    /// daemon.json could not be written (said once per outage).
    heartbeat_failing: bool,
    /// Owner locks of sessions that ended but whose end could not be
    /// recorded: still ours until `finish_orphan` records it.
    orphan_locks: BTreeMap<AgentName, crate::owner::OwnerLock>,
}

/// Run the daemon until SIGTERM/SIGINT. Returns once every session has
/// ended and every file is consistent.
/// How long recovery at start waits for an agent's lock.
const RECOVERY_WAIT: Duration = Duration::from_secs(5);

/// How long work deferred by a busy agent lock waits before it is tried again.
const LOCK_RETRY: Duration = Duration::from_secs(2);

pub async fn run(config_path: &Path) -> Result<()> {
    let (config, config_text) = Config::load_with_text(config_path)?;
    let root = StateRoot::new(&config.state_root);
    bootstrap::root(&root)?;
    let lock = files::lock_root(&root)?;
    // The loop never waits long for an agent's lock: anyone who can read
    // `.lock` can hold it. Work that cannot have it is deferred.
    crate::state::lock::set_wait(crate::state::lock::DAEMON_WAIT);
    // The CLI falls back to this copy while the file on disk is invalid.
    if let Err(e) = files::record_reload_verdict(&root, config_path, Some(&config_text), vec![]) {
        tracing::warn!("cannot keep a copy of the accepted config: {e}");
    }
    // Per-session cgroups when systemd delegated ours (logged either way).
    super::cgroup::available();
    let clock = Clock::from_env();
    let (tx, mut rx) = mpsc::unbounded_channel::<LoopEvent>();
    let (watch_tx, mut watch_rx) = mpsc::unbounded_channel::<WatchEvent>();
    let watcher = InboxWatcher::new(watch_tx)?;
    {
        // A write that fails with ENOSPC prunes what retention allows and
        // tries once more (state::atomic::retrying).
        let root = root.clone();
        let config = config.clone();
        crate::state::atomic::set_reclaimer(move || prune_all(&root, &config, &[]).bytes);
    }
    let mut daemon = Daemon {
        writing: BTreeMap::new(),
        lock_busy: Default::default(),
        alerts: Alerts::new(&config),
        escalated: EscalationMemory::load(&root),
        health: None,
        last_routine_prune: None,
        overdue_reported: Default::default(),
        published_wake: Default::default(),
        served_wakes: Default::default(),
        heartbeat_failing: false,
        orphan_locks: BTreeMap::new(),
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
        streaks: BTreeMap::new(),
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
    crate::state::record_repairs();
    daemon.config_warnings();
    daemon.recover();
    daemon.apply_agents(true);
    // Files that arrived while the daemon was down: scanned only now that the
    // watches are in place, so nothing can fall between scan and watch.
    daemon.scan_all_inboxes();
    // The disk before any session starts (a full or read-only one holds them).
    daemon.health_check();
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
    let mut health_every = daemon.config.health.interval;
    let mut health_tick = tokio::time::interval(health_every);
    health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    health_tick.tick().await;
    // Is `.daemon/lock` still ours (the root not removed and made again)?
    let mut root_check = tokio::time::interval(ROOT_CHECK_EVERY);
    root_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut root_lost: Option<String> = None;

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
            _ = health_tick.tick() => {
                daemon.health_check();
                if daemon.config.health.interval != health_every {
                    health_every = daemon.config.health.interval;
                    health_tick = tokio::time::interval_at(
                        tokio::time::Instant::now() + health_every,
                        health_every,
                    );
                    health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
            }
            _ = root_check.tick(), if root_lost.is_none() => {
                if let Err(why) = lock.check() {
                    daemon.raise(ErrorRecord::new(Code::IoError, why.clone()), false);
                    daemon.shutdown("the state root was replaced");
                    root_lost = Some(why);
                }
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
    match root_lost {
        Some(why) => Err(Error::Unavailable(why)),
        None => Ok(()),
    }
}

/// The session's output as it streams: analysed by [`SessionOutput`]
/// (bounded memory), with stalls reported to the loop as they happen.
struct Observer {
    output: SessionOutput,
    agent: AgentName,
    tx: mpsc::UnboundedSender<LoopEvent>,
    /// One signal scanner per stream: chunks of the two interleave.
    scanners: [crate::protocol::signals::SignalScanner; 2],
    ending: EndingNote,
}

impl OutputObserver for Observer {
    fn on_output(&mut self, chunk: &[u8]) {
        self.on_stream_output(OutputStream::Stdout, chunk);
    }

    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        self.output.on_stream_output(stream, chunk);
        let i = match stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        };
        for signal in self.scanners[i].feed(chunk) {
            self.send_signal(signal);
        }
    }

    fn on_stall(&mut self, silent_for: Duration) {
        let _ = self.tx.send(LoopEvent::SessionStalled {
            agent: self.agent.clone(),
            silent_for,
        });
    }

    fn on_terminate(&mut self, why: &Ending) {
        self.ending.note(why);
    }
}

/// What an [`Observer`] needs to note in session.json that the daemon is
/// ending the session, before the runner's SIGTERM reaches its script.
struct EndingNote {
    agent: AgentConfig,
    dir: AgentDir,
    session_id: String,
    stop_note: StopNote,
}

impl EndingNote {
    fn note(&self, why: &Ending) {
        let now = Timestamp::now();
        let stop_reason = self.stop_note.lock().ok().and_then(|n| n.clone());
        let result = match (why, stop_reason) {
            // A stop for a reason (not a shutdown) is recorded as an error.
            (Ending::Stopped, Some(reason)) => hooks::note_daemon_ending(
                &self.dir,
                &self.session_id,
                &hooks::DaemonEnding {
                    outcome: "error".into(),
                    reason,
                    by_pid: std::process::id(),
                    at: now,
                },
                now,
            ),
            _ => session::note_ending(&self.agent, &self.dir, &self.session_id, why, now),
        };
        if let Err(e) = result {
            tracing::warn!(agent = %self.agent.name, session_id = %self.session_id, "cannot note in session.json that the daemon ends the session: {e}");
        }
    }
}

impl Observer {
    fn send_signal(&self, signal: crate::protocol::signals::SignalResult) {
        let _ = self.tx.send(LoopEvent::Signal {
            agent: self.agent.clone(),
            signal: Box::new(signal),
        });
    }

    /// The end of the output: an unterminated signal is reported.
    fn finish(&mut self) {
        let mut rest = Vec::new();
        for scanner in &mut self.scanners {
            rest.extend(scanner.finish());
        }
        for signal in rest {
            self.send_signal(signal);
        }
    }

    fn summary(&self) -> OutputSummary {
        OutputSummary {
            empty: self.output.is_empty(),
            fingerprint: self.output.fingerprint(),
            claude: self.output.claude_result(),
            tail: String::from_utf8_lossy(&self.output.stdout_tail()).into_owned(),
        }
    }
}

/// Prune every agent's old processed messages, old session logs and stale
/// temp files, as the config's retention allows; never the files of the
/// `running` sessions.
fn prune_all(root: &StateRoot, config: &Config, running: &[(AgentName, String)]) -> PruneStats {
    let now = std::time::SystemTime::now();
    let h = &config.health;
    let mut total = PruneStats::default();
    for agent in &config.agents {
        let dir = root.agent(&agent.name);
        if !crate::fsx::is_dir(&dir.path) {
            continue;
        }
        let protect = running
            .iter()
            .find(|(a, _)| *a == agent.name)
            .map(|(_, s)| s.as_str());
        let results = [
            health::prune_processed(&dir, now - h.processed_retention),
            health::prune_sessions(
                &dir,
                now - h.session_log_retention,
                h.keep_sessions,
                protect,
            ),
            health::prune_stale_temps(&dir, now - Duration::from_secs(3600)),
        ];
        for r in results {
            match r {
                Ok(stats) => total += stats,
                Err(e) => tracing::warn!(agent = %agent.name, "pruning: {e}"),
            }
        }
    }
    // Temp files of the daemon's own writes interrupted by a crash.
    match health::prune_atomic_temps(&root.daemon_dir(), now - health::STALE_TEMP_AGE) {
        Ok(stats) => total += stats,
        Err(e) => tracing::warn!("pruning .daemon/: {e}"),
    }
    total
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
        let mut records = Vec::new();
        for agent in self.config.working_agents() {
            let dir = self.root.agent(&agent.name);
            if !crate::fsx::is_dir(&dir.path) {
                continue;
            }
            // A crash in the middle of an append leaves a torn last line:
            // readers skip it and the next append starts on a fresh line.
            if crate::state::journal::ends_torn(&dir.journal()) {
                records.push(
                    ErrorRecord::new(
                        Code::JournalTorn,
                        format!(
                            "{}: the journal's last line is incomplete (a crash mid-append); it is skipped",
                            agent.name
                        ),
                    )
                    .details(dir.journal().display().to_string())
                    .agent(&agent.name),
                );
            }
            // A daemon killed outright (SIGKILL, OOM) leaves its sessions'
            // processes running: end them before their session is recorded,
            // or the agent would run twice.
            if let Ok(Some(s)) = dir.read::<Session>()
                && hooks::stale(&dir, &s, agent.session.timeout, now).is_some()
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
            // Recovery at start may wait longer for a lock than the loop
            // does (a hook of a script still finishing on a loaded machine),
            // but never without a bound: a lock held for good still lets the
            // daemon start, and that agent's recovery is retried later.
            let result = crate::state::lock::with_wait(RECOVERY_WAIT, || {
                hooks::recover_stale(agent, &dir, "interrupted: daemon restarted", now)
            });
            records.extend(recovered(agent, result, "the daemon restarted"));
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
                        let _ = inbox::return_claimed_counting(&dir, &sid, now, false);
                        drop(lock);
                    }
                }
            }
        }
        for record in records {
            self.raise(record, false);
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
        if at_start {
            // Directories of agents removed while the daemon was down.
            let configured: std::collections::BTreeSet<String> =
                wanted.iter().map(|a| a.name.to_string()).collect();
            let gone: Vec<AgentName> = crate::fsx::list(&self.root.path)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|n| AgentName::parse(n.to_str()?).ok())
                .filter(|n| !configured.contains(n.as_str()))
                .filter(|n| crate::fsx::is_dir(&self.root.agent(n).path))
                .filter(|n| crate::fsx::exists(&self.root.agent(n).report()))
                .collect();
            for name in gone {
                self.set_lifecycle(&name, |_| Some(Lifecycle::Expired));
            }
        }
        for name in removed {
            self.set_lifecycle(&name, |_| Some(Lifecycle::Expired));
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
                let code = e.code();
                tracing::error!(agent = %agent.name, error_code = code.as_str(), "cannot bootstrap: {e}");
                // A busy lock or a bad path: the agent stays configured and
                // its work is deferred or refused with the reason each time.
                if !matches!(e, Error::LockBusy { .. } | Error::Unsafe { .. }) {
                    continue;
                }
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
            self.refresh_rank(&agent.name);
            // New, or configured again after it expired: hatching or
            // sleeping (a running session keeps `alive`).
            let dir = self.root.agent(&agent.name);
            self.set_lifecycle(&agent.name, |current| match current {
                None | Some(Lifecycle::Expired) => Some(Lifecycle::at_rest(&dir)),
                Some(Lifecycle::Hatching) => Some(Lifecycle::at_rest(&dir)),
                other => other,
            });
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
        let last = self
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
        // Pushed past a backoff, or none while disabled.
        let wake = if self.core.agents.contains_key(agent) {
            self.effective_wake(agent)
        } else {
            wake
        };
        let wake = wake.map(Timestamp::from_datetime);
        let result = self
            .dir(agent)
            .update(Timestamp::now(), |report: &mut Report| {
                report.next_wake_at = wake;
            });
        if result.is_ok() {
            self.published_wake.borrow_mut().insert(agent.clone(), wake);
        }
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
            LoopEvent::Watch(WatchEvent::Writing(agent, name)) => {
                self.writing.entry(agent).or_default().insert(name);
            }
            LoopEvent::Watch(WatchEvent::Closed(agent, name)) => {
                if let Some(w) = self.writing.get_mut(&agent) {
                    w.remove(&name);
                }
                self.dirty.insert(agent);
            }
            LoopEvent::Watch(WatchEvent::Rejected(agent)) => self.retry_rejected(&agent),
            LoopEvent::Watch(WatchEvent::Lost(agent)) => {
                if self.watcher.is_watching(&agent) {
                    tracing::warn!(agent = %agent, "its inbox directory was removed or moved away; watching it again when it is back (or recreated)");
                    self.watcher.forget(&agent);
                    let at = self.clock.now() + chrono::Duration::seconds(1);
                    self.settle_at.insert(agent, at);
                }
            }
            LoopEvent::Watch(WatchEvent::Wake(agent)) => self.take_wake_requests(&agent),
            LoopEvent::Watch(WatchEvent::Rescan(why)) => {
                tracing::warn!("rescanning every inbox: {why}");
                // What was being written is not known any more: each file
                // is judged by its age again.
                self.writing.clear();
                self.scan_all_inboxes();
            }
            LoopEvent::SessionPid { agent, pid } => {
                if let Some(r) = self.running.get_mut(&agent) {
                    r.pid = Some(pid);
                }
            }
            LoopEvent::SessionStalled { agent, silent_for } => {
                self.session_stalled(&agent, silent_for)
            }
            LoopEvent::Signal { agent, signal } => self.signal(&agent, *signal),
            LoopEvent::SessionDone {
                agent,
                report,
                output,
            } => self.session_done(agent, *report, *output),
        }
    }

    /// Move back to the inbox what was rejected as unfinished and has been
    /// finished since.
    fn retry_rejected(&mut self, agent: &AgentName) {
        let dir = self.dir(agent);
        let wait = self.lock_wait(agent);
        let result = crate::state::lock::with_wait(wait, || dir.lock())
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

    fn scan_all_inboxes(&mut self) {
        let agents: Vec<AgentName> = self.core.agents.keys().cloned().collect();
        for agent in agents {
            self.take_wake_requests(&agent);
            self.retry_rejected(&agent);
            self.scan_inbox(&agent);
        }
    }

    /// Receive what waits in `agent`'s inbox: reject settled junk, add tasks
    /// for task messages, and tell the core what waits.
    fn scan_inbox(&mut self, agent: &AgentName) {
        // An inbox replaced under us (rm -r + mkdir, mv away and back) lost
        // its watch: watched again (recreated if it is missing), then read.
        if !self.watcher.is_watching(agent)
            && let Some(cfg) = self.agent_config(agent).cloned()
        {
            let dir = self.dir(agent);
            if !crate::fsx::exists(&dir.inbox()) {
                let _ = bootstrap::agent(&cfg, &dir, Timestamp::now());
            }
            match self.watcher.watch(agent, &dir.inbox()) {
                Ok(()) => tracing::info!(agent = %agent, "its inbox is watched again"),
                Err(e) => tracing::warn!(agent = %agent, "cannot watch its inbox: {e}"),
            }
            self.retry_rejected(agent);
        }
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
        let wait = self.lock_wait(agent);
        let settle = self
            .agent_config(agent)
            .map(|a| a.session.inbox_settle)
            .unwrap_or(inbox::SETTLE_TIME);
        let writing = self.writing.get(agent).cloned().unwrap_or_default();
        let result = crate::state::lock::with_wait(wait, || dir.lock()).and_then(|lock| {
            let received = inbox::receive(&dir, now, settle, &writing)?;
            let mut notes = Vec::new();
            hooks::add_tasks_from_messages(&dir, &lock, &received.tasks, now, &mut notes)?;
            Ok(received)
        });
        match result {
            Ok(r) => {
                self.note_lock_free(agent);
                for (name, reason) in &r.rejected {
                    self.raise(rejected(agent, name, reason), false);
                }
                if r.unsettled {
                    // Looked at again soon: a file settles `inbox_settle`
                    // after its last change, a closed writer wakes us anyway.
                    let again = (settle / 4).clamp(Duration::from_secs(1), Duration::from_secs(15));
                    let at =
                        self.clock.now() + chrono::Duration::from_std(again).unwrap_or_default();
                    self.settle_at.insert(agent.clone(), at);
                }
                Some(InboxSummary {
                    high: r.high,
                    normal: r.normal,
                })
            }
            Err(e @ Error::LockBusy { .. }) => {
                // Looked at again shortly; every other agent is served.
                self.note_lock_busy(agent, &format!("inbox scan deferred: {e}"));
                let at =
                    self.clock.now() + chrono::Duration::from_std(LOCK_RETRY).unwrap_or_default();
                self.settle_at.insert(agent.clone(), at);
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

    fn take_wake_requests(&mut self, agent: &AgentName) {
        let inbox_dir = self.dir(agent).inbox();
        // Never through a link: a wake request is a name, its removal an
        // unlink in the inbox itself.
        let Ok(names) = crate::fsx::list(&inbox_dir) else {
            return;
        };
        let mut found = false;
        for name in names {
            let Some(name) = name.to_str() else {
                continue;
            };
            if files::is_wake_request(name) {
                let path = inbox_dir.join(name);
                let served = self.served_wakes.contains(&path);
                match crate::fsx::remove_file(&path) {
                    Ok(_) => {
                        self.served_wakes.remove(&path);
                    }
                    Err(e) => {
                        if !served {
                            tracing::warn!(agent = %agent, "cannot remove the wake request {}: {e}; it is served once", path.display());
                        }
                        self.served_wakes.insert(path);
                    }
                }
                found |= !served;
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
        // Wakes held back by a backoff: report.json says when they will run.
        let held: Vec<AgentName> = self
            .core
            .agents
            .iter()
            .filter(|(_, s)| s.pending.is_some() && s.backoff_until.is_some_and(|t| t > now))
            .map(|(a, _)| a.clone())
            .collect();
        for agent in held {
            let wake = self.effective_wake(&agent).map(Timestamp::from_datetime);
            if self.published_wake.borrow().get(&agent) != Some(&wake) {
                self.set_next_wake(&agent, None);
            }
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
        // Never join a session of our own whose end was not recorded.
        if let Ok(Some(s)) = self.dir(agent).read::<Session>()
            && s.is_running()
            && began_here(&s)
        {
            self.finish_orphan(&cfg, &s.session_id, now);
            if matches!(self.dir(agent).read::<Session>(), Ok(Some(s)) if s.is_running()) {
                tracing::warn!(agent = %agent, "{} wake deferred: the end of session {} is not recorded yet", reason.as_str(), s.session_id);
                self.defer_wake(agent, reason, self.config.health.interval);
                return;
            }
        }
        let wait = self.lock_wait(agent);
        let writing = self.writing.get(agent).cloned().unwrap_or_default();
        let prepared = match crate::state::lock::with_wait(wait, || {
            session::prepare(&self.config, &cfg, &self.root, now, &writing)
        }) {
            Ok(p) => {
                self.note_lock_free(agent);
                p
            }
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
            Err(e @ Error::LockBusy { .. }) => {
                // Somebody holds the agent's lock: try again shortly, not
                // a failure of the agent.
                self.note_lock_busy(agent, &format!("{} wake deferred: {e}", reason.as_str()));
                self.defer_wake(agent, reason, LOCK_RETRY);
                return;
            }
            Err(e) => {
                // Nothing ran: judged like a failed spawn (retried with
                // backoff), recorded under the code of what went wrong.
                let code = match e.code() {
                    Code::IoError | Code::StateCorrupt => Code::AgentSpawnFailed,
                    other => other,
                };
                let ending = Ending::SpawnFailed {
                    reason: format!("cannot begin a session: {e}"),
                    kind: runner::SpawnFailure::Other,
                };
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                self.judge_and_apply(
                    agent,
                    &cfg,
                    None,
                    &ending,
                    &OutputSummary::none(),
                    Some(code),
                );
                if matches!(code, Code::DiskFull | Code::FsReadonly) {
                    self.health_check();
                }
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
        for (name, reason) in &prepared.rejected {
            self.raise(
                rejected(agent, name, reason).session(prepared.session_id.clone()),
                false,
            );
        }
        self.core.session_started(agent, &prepared.session_id);
        let (stop_tx, stop_rx) = watch::channel(false);
        let stop_note = StopNote::default();
        self.running.insert(
            agent.clone(),
            Running {
                session_id: prepared.session_id.clone(),
                instance: prepared.instance.clone(),
                pid: None,
                started_at: now,
                stop: stop_tx,
                stop_reason: None,
                stop_note: stop_note.clone(),
                completed_by_signal: false,
                signals_seen: 0,
                global_discoveries: 0,
                last_progress: None,
                owner_lock: prepared.owner_lock,
            },
        );
        let tx = self.tx.clone();
        let name = agent.clone();
        let spec = prepared.spec;
        let dir = self.dir(agent);
        let session_id = prepared.session_id.clone();
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
            let mut observer = Observer {
                output: SessionOutput::new(),
                agent: name.clone(),
                tx: tx.clone(),
                scanners: Default::default(),
                ending: EndingNote {
                    agent: cfg,
                    dir,
                    session_id,
                    stop_note,
                },
            };
            let (report, ()) = tokio::join!(
                runner::run(spec, &mut observer, stop_rx, Some(pid_tx)),
                pid_forward
            );
            observer.finish();
            let output = observer.summary();
            let _ = tx.send(LoopEvent::SessionDone {
                agent: name,
                report: Box::new(report),
                output: Box::new(output),
            });
        });
    }

    /// Log that `agent`'s work waits for its lock: at warning level once,
    /// then quietly at every retry (every [`LOCK_RETRY`]).
    fn note_lock_busy(&mut self, agent: &AgentName, what: &str) {
        if self.lock_busy.insert(agent.clone()) {
            tracing::warn!(agent = %agent, error_code = "LOCK_BUSY", "{what}; retried every {}s, every other agent is served meanwhile", LOCK_RETRY.as_secs());
        } else {
            tracing::debug!(agent = %agent, error_code = "LOCK_BUSY", "{what}");
        }
    }

    /// How long to wait for `agent`'s lock: not at all if it was busy at
    /// the last try (a lock held for good must cost the loop nothing).
    fn lock_wait(&self, agent: &AgentName) -> Duration {
        if self.lock_busy.contains(agent) {
            Duration::ZERO
        } else {
            crate::state::lock::DAEMON_WAIT
        }
    }

    /// `agent`'s lock was had: say so if it had been busy.
    fn note_lock_free(&mut self, agent: &AgentName) {
        if self.lock_busy.remove(agent) {
            tracing::info!(agent = %agent, "its lock is free again; deferred work goes on");
        }
    }

    /// Put a wake that cannot be served now back, to be tried after `delay`.
    fn defer_wake(&mut self, agent: &AgentName, reason: WakeReason, delay: Duration) {
        let now = self.clock.now();
        self.core.session_ended(agent, InboxSummary::default(), now);
        self.core.request(agent, reason, Priority::Normal, now);
        if let Some(slot) = self.core.agents.get_mut(agent) {
            slot.backoff_until = Some(now + chrono::Duration::from_std(delay).unwrap_or_default());
        }
    }

    fn session_done(&mut self, agent: AgentName, mut report: RunReport, output: OutputSummary) {
        let Some(running) = self.running.remove(&agent) else {
            return;
        };
        if running.completed_by_signal
            && !report.ending.is_success()
            && !matches!(report.ending, Ending::SpawnFailed { .. })
        {
            // The agent said it finished its work: that counts, whatever
            // became of the process afterwards.
            tracing::warn!(
                agent = %agent, session_id = %running.session_id,
                "the session signalled COMPLETE; counted as completed although the command {}",
                report.ending
            );
            report.ending = Ending::Exited { code: 0 };
        }
        let now = Timestamp::from_datetime(self.clock.now());
        let dir = self.dir(&agent);
        let cfg = self.agent_config(&agent).cloned();
        let sid = running.session_id.clone();
        let claude_failure = output.claude.as_ref().and_then(output::classify);
        let ended_by_script = session::ended_by_script(&dir, &sid);
        let retries = cfg.as_ref().map(|c| c.session.retries).unwrap_or_default();
        let streak = self.streaks.entry(agent.clone()).or_default();
        let verdict = failure::judge(
            &Observed {
                ending: &report.ending,
                empty: output.empty,
                fingerprint: output.fingerprint,
                claude: claude_failure.as_ref(),
                ended_by_script,
            },
            streak,
            &retries,
        );
        // What session.json and the journal say, where the daemon knows
        // better than the exit status.
        // A timeout, a stall or a stop was noted in session.json before the
        // session was signalled (EndingNote), so the script's trap records it.
        let override_reason = match (&report.ending, &running.stop_reason) {
            (Ending::Stopped, Some(why)) => Some(why.clone()),
            (e, _) if e.is_success() && verdict.code.is_some() => Some(verdict.message.clone()),
            // What the error matrix made of it ("Claude Code is not logged
            // in: ..."), not only the exit status.
            (Ending::Exited { .. } | Ending::Signaled { .. }, _)
                if claude_failure.is_some()
                    || verdict.code.is_some_and(|c| c != Code::SessionFailed) =>
            {
                Some(verdict.message.clone())
            }
            _ => None,
        };
        let outcome = match &cfg {
            Some(cfg) => session::finish(cfg, &dir, &sid, &report, override_reason.as_deref(), now),
            // Removed from the config while it ran: record it all the same.
            None => Err(Error::Usage("agent no longer configured".into())),
        };
        match &outcome {
            Ok(text) if text.starts_with("completed") => tracing::info!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} {text}"
            ),
            Ok(text) => tracing::warn!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} {text}"
            ),
            Err(e) => self.raise(
                ErrorRecord::new(e.code(), format!("cannot record the end of session {sid}"))
                    .details(e.to_string())
                    .agent(&agent)
                    .session(&sid),
                false,
            ),
        }
        // The script's trap recorded the failure first, in its own words.
        if let (Some(decided), Ok(_)) = (&override_reason, &outcome)
            && matches!(
                report.ending,
                Ending::Exited { .. } | Ending::Signaled { .. }
            )
            && let Err(e) = hooks::amend_failure_reason(&dir, &sid, decided, now)
        {
            tracing::warn!(agent = %agent, session_id = %sid, "cannot record the daemon's reason for the session's failure: {e}");
        }
        if let Some(result) = &output.claude {
            let usage = result.usage.and_then(|u| serde_json::to_value(u).ok());
            if let Err(e) = hooks::record_usage(
                &dir,
                &sid,
                result.total_cost_usd,
                result.tokens_total(),
                usage,
                now,
            ) {
                tracing::warn!(agent = %agent, session_id = %sid, "cannot record the session's cost: {e}");
            }
        }
        self.record_output_summary(&agent, &running, &output, now);
        if report.truncated {
            self.raise(
                ErrorRecord::new(
                    Code::OutputTruncated,
                    format!(
                        "session output truncated at {} bytes ({} printed)",
                        report.logged_bytes, report.output_bytes
                    ),
                )
                .agent(&agent)
                .session(&sid),
                false,
            );
        }
        if let Some(e) = &report.log_error {
            // The code of any I/O error (ENOSPC → DISK_FULL, EROFS → FS_READONLY).
            let code = Error::io("writing", "the session log", std::io::Error::from(e.kind)).code();
            self.raise(
                ErrorRecord::new(code, "the session log could not be written".to_string())
                    .details(e.message.clone())
                    .agent(&agent)
                    .session(&sid),
                false,
            );
        }
        // Its end not recorded (a full disk): it stays ours, lock and all,
        // until `finish_orphan` records it.
        if let Some(lock) = running.owner_lock
            && matches!(dir.read::<Session>(), Ok(Some(s)) if s.is_running() && s.session_id == sid)
        {
            self.orphan_locks.insert(agent.clone(), lock);
        }
        let waiting = self.receive(&agent).unwrap_or_default();
        self.core.session_ended(&agent, waiting, self.clock.now());
        if let Some(cfg) = &cfg {
            self.apply_verdict(&agent, cfg, Some(&sid), verdict, &report);
        }
        self.refresh_rank(&agent);
        if !self
            .config
            .agents
            .iter()
            .any(|a| a.name == agent && a.kind == AgentKind::Agent)
        {
            self.core.agents.remove(&agent);
        }
    }

    /// Judge a session that never ran (nothing to finish) and apply the verdict.
    fn judge_and_apply(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        session_id: Option<&str>,
        ending: &Ending,
        output: &OutputSummary,
        code: Option<Code>,
    ) {
        let streak = self.streaks.entry(agent.clone()).or_default();
        let mut verdict = failure::judge(
            &Observed {
                ending,
                empty: output.empty,
                fingerprint: output.fingerprint,
                claude: None,
                ended_by_script: false,
            },
            streak,
            &cfg.session.retries,
        );
        if let (Some(c), Some(_)) = (code, verdict.code) {
            verdict.code = Some(c);
        }
        let report = RunReport::not_run(ending.clone());
        self.apply_verdict(agent, cfg, session_id, verdict, &report);
    }

    /// Raise the verdict's error and carry out what it decided: a retry, a
    /// backoff, disabling the agent, or clearing its failures.
    fn apply_verdict(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        session_id: Option<&str>,
        verdict: failure::Verdict,
        report: &RunReport,
    ) {
        let now = self.clock.now();
        if let Some(code) = verdict.code {
            let mut record = ErrorRecord::new(code, format!("{agent}: {}", verdict.message))
                .agent(agent)
                .attempt(verdict.attempt)
                .details(format!(
                    "{}; {} bytes of output",
                    report.ending, report.output_bytes
                ));
            if let Some(sid) = session_id {
                record = record.session(sid);
            }
            if let (Some(sid), Some(_)) = (session_id, report.pid) {
                record = record.suggest(format!(
                    "Read the session log: {}",
                    self.dir(agent)
                        .sessions_dir()
                        .join(format!("{sid}.log"))
                        .display()
                ));
            }
            self.raise(record, verdict.escalate);
        }
        let failures = self.streaks.get(agent).map(|s| s.failures).unwrap_or(0);
        let Some(slot) = self.core.agents.get_mut(agent) else {
            return;
        };
        let (state, until) = match verdict.next {
            Next::Nothing => return,
            Next::Clear => {
                slot.backoff_until = None;
                self.escalated.clear(Some(agent));
                self.publish_agent(agent, None);
                return;
            }
            Next::Retry { after } => {
                let at = now + chrono::Duration::from_std(after).unwrap_or_default();
                slot.backoff_until = Some(at);
                self.core
                    .request(agent, WakeReason::Retry, Priority::Normal, now);
                tracing::info!(agent = %agent, "retrying in {}", humantime::format_duration(after));
                ("retrying", Some(at))
            }
            Next::Backoff { hold } => {
                let at = now + chrono::Duration::from_std(hold).unwrap_or_default();
                slot.backoff_until = Some(at);
                tracing::warn!(agent = %agent, "{failures} failed session(s) in a row: automatic wakes held back until {}", Timestamp::from_datetime(at));
                ("backoff", Some(at))
            }
            Next::Disable => {
                slot.disabled = Some(verdict.message.clone());
                tracing::error!(agent = %agent, "disabled until the config is reloaded or `agent-state wake {agent}` is run: {}", verdict.message);
                ("disabled", None)
            }
        };
        let since = self.report_error_since(agent);
        let error = ReportError {
            code: verdict
                .code
                .map(|c| c.as_str().to_string())
                .unwrap_or_default(),
            message: verdict.message,
            failures,
            state: state.to_string(),
            until: until.map(Timestamp::from_datetime),
            since: Some(since.unwrap_or_else(|| Timestamp::from_datetime(now))),
        };
        let _ = cfg;
        self.publish_agent(agent, Some(error));
    }

    /// The Context Summary Block and the signal block at the end of the
    /// output (in Claude Code's result text when there is one): into
    /// report.json and session.json; malformed ones to signals.jsonl.
    fn record_output_summary(
        &self,
        agent: &AgentName,
        running: &Running,
        output: &OutputSummary,
        now: Timestamp,
    ) {
        let text = output
            .claude
            .as_ref()
            .and_then(|c| c.result.clone())
            .unwrap_or_else(|| output.tail.clone());
        let mut found = hooks::OutputSummary::default();
        let mut problems = Vec::new();
        let mut any = false;
        match crate::protocol::summary::parse_context_summary(&text) {
            Some(Ok(cs)) => {
                any = true;
                found.summary = cs.summary_text();
                if cs.blockers.is_some() {
                    found.blocked_by = Some(cs.blocked_by());
                }
                found.next_priority = cs.next_priority();
                found.handoff_notes = cs.handoff_notes();
                found.confidence = cs.report_confidence();
                found.risk = cs
                    .report_risk()
                    .and_then(|r| serde_json::to_value(r).ok())
                    .and_then(|v| v.as_str().map(str::to_string));
            }
            Some(Err(p)) => problems.push(p),
            None => {}
        }
        match crate::protocol::summary::parse_signal_block(&text) {
            Some(Ok(block)) => {
                any = true;
                found.signal_block = serde_json::to_value(&block).ok();
            }
            Some(Err(p)) => problems.push(p),
            None => {}
        }
        for p in problems {
            tracing::warn!(agent = %agent, session_id = %running.session_id, "{}: {}", p.code.as_str(), p.message);
            let record = crate::protocol::signals::SignalRecord {
                ts: now,
                level: "warn".into(),
                code: p.code.as_str().to_string(),
                agent: agent.to_string(),
                task: None,
                session: Some(running.session_id.clone()),
                raw: p.raw.clone(),
                kind: p.field.clone(),
                message: Some(p.message.clone()),
            };
            if let Err(e) =
                crate::protocol::signals::append(&effects::signals_log(&self.root), &record)
            {
                tracing::warn!("cannot append to signals.jsonl: {e}");
            }
        }
        if any
            && let Err(e) =
                hooks::record_output_summary(&self.dir(agent), &running.session_id, &found, now)
        {
            tracing::warn!(agent = %agent, session_id = %running.session_id, "cannot record the session's summary: {e}");
        }
    }

    /// Set report.json `lifecycle` to `f(current)` (written only if it changes).
    fn set_lifecycle(
        &self,
        agent: &AgentName,
        f: impl FnOnce(Option<Lifecycle>) -> Option<Lifecycle>,
    ) {
        let dir = self.dir(agent);
        if !crate::fsx::is_dir(&dir.path) {
            return;
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
    fn refresh_rank(&mut self, agent: &AgentName) {
        let rolling = self
            .dir(agent)
            .read::<crate::state::metrics::Metrics>()
            .ok()
            .flatten()
            .map(|m| m.rolling_30d);
        if let (Some(slot), Some(r)) = (self.core.agents.get_mut(agent), rolling) {
            slot.unhealthy = r.sessions >= 3 && r.error_rate >= 0.5;
        }
    }

    fn report_error_since(&self, agent: &AgentName) -> Option<Timestamp> {
        self.dir(agent)
            .read::<Report>()
            .ok()
            .flatten()
            .and_then(|r| r.error)
            .and_then(|e| e.since)
    }

    /// report.json: the error state (`None` clears it) and the next wake.
    fn publish_agent(&self, agent: &AgentName, error: Option<ReportError>) {
        let wake = self.effective_wake(agent).map(Timestamp::from_datetime);
        let result = self
            .dir(agent)
            .update(Timestamp::now(), |report: &mut Report| {
                match &error {
                    Some(e) => {
                        // A retry on its way is not yet an agent in error (a
                        // timeout stays distinguishable from an error): the
                        // status changes when the retries are spent.
                        if report.current_session.is_none() && e.state != "retrying" {
                            report.status = AgentStatus::Error;
                        }
                        report.error = Some(e.clone());
                    }
                    None => report.error = None,
                }
                report.next_wake_at = wake;
            });
        if result.is_ok() {
            self.published_wake.borrow_mut().insert(agent.clone(), wake);
        }
        if let Err(e) = result {
            tracing::warn!(agent = %agent, "cannot update report.json: {e}");
        }
    }

    /// When the agent will next be woken automatically: its schedule's next
    /// fire, or a waiting retry, pushed past any backoff; never if disabled.
    fn effective_wake(&self, agent: &AgentName) -> Option<DateTime<Utc>> {
        let slot = self.core.agents.get(agent)?;
        if slot.disabled.is_some() {
            return None;
        }
        let now = self.clock.now();
        let backoff = slot.backoff_until.filter(|t| *t > now);
        match (slot.pending.is_some(), backoff) {
            (true, Some(b)) => Some(b),
            _ => slot.next_fire.map(|w| backoff.map_or(w, |b| w.max(b))),
        }
    }

    /// A signal from a running session: carry it out, or log it as invalid.
    fn signal(&mut self, agent: &AgentName, signal: crate::protocol::signals::SignalResult) {
        let Some(running) = self.running.get_mut(agent) else {
            return;
        };
        let (session_id, instance) = (running.session_id.clone(), running.instance.clone());
        if let Ok(s) = &signal {
            if s.kind() == crate::protocol::signals::SignalType::Complete {
                running.completed_by_signal = true;
            }
            // The same progress again changes nothing.
            if s.kind() == crate::protocol::signals::SignalType::Progress {
                if s.progress() == running.last_progress {
                    return;
                }
                running.last_progress = s.progress();
            }
        }
        running.signals_seen += 1;
        if running.signals_seen > SIGNALS_PER_SESSION {
            if running.signals_seen == SIGNALS_PER_SESSION + 1 {
                tracing::warn!(
                    agent = %agent, session_id = %session_id,
                    "more than {SIGNALS_PER_SESSION} signals in one session: the rest are ignored (COMPLETE still counts)"
                );
            }
            return;
        }
        let may_fan_out = running.global_discoveries < effects::GLOBAL_DISCOVERIES_PER_SESSION;
        if matches!(&signal, Ok(s) if s.kind() == crate::protocol::signals::SignalType::DiscoveryGlobal)
        {
            running.global_discoveries += 1;
        }
        let origin = effects::Origin {
            may_fan_out,
            agent,
            session_id: &session_id,
            instance: &instance,
        };
        let now = Timestamp::now();
        match signal {
            Err(e) => effects::record_invalid(&self.root, &origin, &e, now),
            Ok(s) => match effects::apply(&self.root, &self.config, &origin, &s, now) {
                Ok(effect) => tracing::info!(
                    agent = %agent, session_id = %session_id,
                    "signal {}: {effect}", s.raw()
                ),
                Err(e) => self.raise(
                    ErrorRecord::new(
                        e.code(),
                        format!("{agent}: cannot carry out the signal {}", s.raw()),
                    )
                    .details(e.to_string())
                    .agent(agent)
                    .session(session_id.clone()),
                    false,
                ),
            },
        }
    }

    /// A session printed nothing for `stall_timeout`.
    fn session_stalled(&mut self, agent: &AgentName, silent_for: Duration) {
        let Some(running) = self.running.get(agent) else {
            return;
        };
        let action = self
            .agent_config(agent)
            .map(|c| c.session.stall_action)
            .unwrap_or_default();
        let then = match action {
            crate::config::StallAction::Warn => "it goes on (stall_action = \"warn\")",
            crate::config::StallAction::Stop => "ending it (stall_action = \"stop\")",
        };
        let record = ErrorRecord::new(
            Code::SessionStalled,
            format!(
                "{agent}: session {} printed nothing for {}; {then}",
                running.session_id,
                humantime::format_duration(silent_for)
            ),
        )
        .agent(agent)
        .session(running.session_id.clone());
        self.raise(record, false);
    }

    /// A session this daemon began that is not running (its end could not
    /// be written): recorded as an error now, its messages returned.
    fn finish_orphan(&mut self, agent: &AgentConfig, session_id: &str, now: Timestamp) {
        let dir = self.root.agent(&agent.name);
        let req = hooks::FailRequest {
            session: Some(session_id.to_string()),
            outcome: "error".into(),
            reason: "interrupted: its end could not be recorded when it ended (see errors.jsonl)"
                .into(),
            ..hooks::FailRequest::default()
        };
        match hooks::fail(agent, &dir, &req, now) {
            Ok(r) => {
                self.orphan_locks.remove(&agent.name);
                self.raise(
                ErrorRecord::new(
                    Code::SessionInterrupted,
                    format!(
                        "{}: session {session_id} ended while its end could not be written; recorded now, {} message(s) returned",
                        agent.name,
                        r.returned.len()
                    ),
                )
                .agent(&agent.name)
                .session(session_id.to_string()),
                false,
            )
            }
            Err(e) => {
                tracing::warn!(agent = %agent.name, session_id, "cannot record the end of session {session_id} yet: {e}")
            }
        }
    }

    /// Raise an error through [`Alerts`], escalating each code once per
    /// agent's failure streak.
    fn raise(&mut self, record: ErrorRecord, escalate: bool) {
        let agent = record
            .context
            .agent
            .as_deref()
            .and_then(|a| AgentName::parse(a).ok());
        let escalate = escalate
            && record
                .code()
                .is_some_and(|c| self.escalated.first(agent.as_ref(), c));
        self.alerts.raise(record, escalate);
    }

    /// Settings that took their default: one `CONFIG_DEFAULTED` each.
    fn config_warnings(&mut self) {
        for w in self.config.warnings.clone() {
            self.raise(
                ErrorRecord::new(Code::ConfigDefaulted, format!("{}: {}", w.field, w.message))
                    .details(self.config_path.display().to_string()),
                false,
            );
        }
    }

    /// The health monitor: the disk (free space, read-only), pruning, and
    /// sessions that outlived their owner or their timeout.
    fn health_check(&mut self) {
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
        let prev = self.health.clone();
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
            .last_routine_prune
            .is_none_or(|t| t.elapsed() >= ROUTINE_PRUNE_EVERY);
        if state.should_prune() || (routine_due && !state.read_only) {
            self.last_routine_prune = Some(std::time::Instant::now());
            let running: Vec<(AgentName, String)> = self
                .running
                .iter()
                .map(|(a, r)| (a.clone(), r.session_id.clone()))
                .collect();
            let stats = prune_all(&self.root, &self.config, &running);
            if !stats.is_empty() {
                tracing::info!(
                    "pruned {} file(s), {} (processed messages and session logs past retention, stale temp files)",
                    stats.files,
                    health::format_bytes(stats.bytes)
                );
                state.record_prune(stats, now);
            }
        }
        self.health = Some(state);
        if !self.health.as_ref().is_some_and(|h| h.read_only) {
            self.alerts.flush();
        }
        self.core.waking_stopped = self.stopping.is_some()
            || self
                .health
                .as_ref()
                .is_some_and(|h| !h.level.allows_new_sessions());
        if !self.health.as_ref().is_some_and(|h| h.read_only) {
            self.check_sessions(now);
        }
        if recovered {
            // Scans and writes that failed during the outage: look again
            // now rather than at the next reconcile.
            self.scan_all_inboxes();
        }
        self.after_change();
    }

    /// Sessions recorded as running that the daemon does not run: finished
    /// when their owner is gone; their owner is told to stop when they ran
    /// past their timeout. The daemon's own sessions past their timeout
    /// (which the runner should have ended) are stopped.
    fn check_sessions(&mut self, now: Timestamp) {
        let agents: Vec<AgentConfig> = self.config.working_agents().cloned().collect();
        for agent in agents {
            if let Some(r) = self.running.get_mut(&agent.name) {
                let started = r.started_at.0;
                // Seed 003's placeholder expiry: a session whose process
                // never started within 5 minutes is given up (a hatching
                // agent stays hatching for its next wake).
                if r.pid.is_none()
                    && r.stop_reason.is_none()
                    && now.seconds_since(&r.started_at) >= HATCH_EXPIRY.as_secs() as i64
                {
                    r.stop_for(format!(
                        "expired: its process did not start within {}",
                        humantime::format_duration(HATCH_EXPIRY)
                    ));
                    continue;
                }
                if health::overdue(
                    started,
                    agent.session.timeout,
                    agent.session.kill_grace,
                    now.0,
                ) && r.stop_reason.is_none()
                {
                    r.stop_for("ran past its timeout; stopped by the health monitor".into());
                    let sid = r.session_id.clone();
                    self.raise(
                        ErrorRecord::new(
                            Code::SessionTimeout,
                            format!("{}: session {sid} ran past its timeout and was not ended; stopping it", agent.name),
                        )
                        .agent(&agent.name)
                        .session(sid),
                        false,
                    );
                }
                continue;
            }
            let dir = self.root.agent(&agent.name);
            let Ok(Some(s)) = dir.read::<Session>() else {
                continue;
            };
            if !s.is_running() {
                continue;
            }
            if began_here(&s) {
                // Ours, but not running: its end could not be recorded (a
                // full disk). Record it now.
                self.finish_orphan(&agent, &s.session_id, now);
                continue;
            }
            // Its owner's lock says whether it is alive, wherever it runs
            // (a script in another PID namespace is invisible to us).
            if hooks::stale(&dir, &s, agent.session.timeout, now).is_some() {
                let result =
                    hooks::recover_stale(&agent, &dir, "interrupted: its process is gone", now);
                if let Some(record) = recovered(&agent, result, "its process is gone") {
                    self.raise(record, false);
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
                && self.overdue_reported.insert(s.session_id.clone())
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
                self.raise(
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
                    false,
                );
            }
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
        let verdict = match Config::load_with_text(&self.config_path) {
            Ok((config, text)) => {
                if config.state_root != self.config.state_root {
                    let why = "state_root cannot change while the daemon runs (restart it instead)";
                    self.raise(
                        ErrorRecord::new(
                            Code::ConfigInvalid,
                            format!("config reload refused: {why}"),
                        )
                        .details(self.config_path.display().to_string()),
                        false,
                    );
                    (None, vec![format!("state_root: {why}")])
                } else {
                    self.core.max_concurrent = config.daemon.max_concurrent_sessions.max(1);
                    let old = std::mem::replace(&mut self.alerts, Alerts::new(&config));
                    self.alerts.adopt(&old);
                    self.config = config;
                    // A reload is the operator's action a disabled agent waits for.
                    for slot in self.core.agents.values_mut() {
                        if slot.disabled.take().is_some() {
                            slot.backoff_until = None;
                        }
                    }
                    self.config_warnings();
                    self.apply_agents(false);
                    self.scan_all_inboxes();
                    tracing::info!("config reloaded: {} agents", self.config.agents.len());
                    (Some(text), vec![])
                }
            }
            Err(e) => {
                let reasons = match &e {
                    crate::config::ConfigError::Invalid { problems, .. } => {
                        problems.iter().map(|p| p.to_string()).collect()
                    }
                    other => vec![other.to_string()],
                };
                self.raise(
                    ErrorRecord::new(
                        Code::ConfigInvalid,
                        "config reload refused, the old config stays in force",
                    )
                    .details(e.to_string()),
                    false,
                );
                (None, reasons)
            }
        };
        // The verdict `agent-state reload` (ExecReload=) waits for.
        let (accepted, reasons) = verdict;
        if let Err(e) = files::record_reload_verdict(
            &self.root,
            &self.config_path,
            accepted.as_deref(),
            reasons,
        ) {
            tracing::warn!("cannot record the verdict on the reloaded config: {e}");
        }
        systemd::ready(&self.status_line());
    }

    fn next_deadline(&self) -> Option<DateTime<Utc>> {
        [
            self.core.next_deadline(self.clock.now()),
            self.settle_at.values().min().copied(),
            self.stopping.filter(|_| !self.running.is_empty()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// After anything changed: repairs to report, the shutdown deadline, the
    /// heartbeat, STATUS=.
    fn after_change(&mut self) {
        for (agent, note) in crate::state::take_repairs() {
            let mut record = ErrorRecord::new(Code::StateCorrupt, note);
            if !agent.is_empty() {
                record = record.agent(agent);
            }
            self.raise(record, false);
        }
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
        let mut state = if self.stopping.is_some() {
            "stopping; ".to_string()
        } else {
            String::new()
        };
        if let Some(h) = &self.health
            && (h.level != DiskLevel::Ok || h.read_only)
        {
            state.push_str(&h.status_fragment());
            state.push_str("; ");
        }
        let failing = self
            .core
            .agents
            .iter()
            .filter(|(a, slot)| {
                slot.disabled.is_some() || self.streaks.get(*a).is_some_and(|s| s.failures > 0)
            })
            .count();
        if failing > 0 {
            state.push_str(&format!("{failing} failing; "));
        }
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
            paused: self
                .health
                .as_ref()
                .filter(|h| !h.level.allows_new_sessions())
                .map(|h| h.status_fragment()),
            stopping: self.stopping.is_some(),
            health: self.health.clone(),
            failing: self
                .core
                .agents
                .iter()
                .filter_map(|(a, slot)| {
                    let failures = self.streaks.get(a).map(|s| s.failures).unwrap_or(0);
                    if let Some(why) = &slot.disabled {
                        Some((a.to_string(), format!("disabled: {why}")))
                    } else if failures > 0 {
                        let until = slot
                            .backoff_until
                            .map(|t| format!(" until {}", Timestamp::from_datetime(t)))
                            .unwrap_or_default();
                        Some((
                            a.to_string(),
                            format!("{failures} failure(s) in a row; held back{until}"),
                        ))
                    } else {
                        None
                    }
                })
                .collect(),
        };
        // Compared without the times that change at every look: written
        // when something a reader cares about changed.
        let updated_at = hb.updated_at;
        hb.updated_at = self.started_at;
        let checked_at = hb.health.as_ref().map(|h| h.checked_at);
        if let Some(h) = hb.health.as_mut() {
            h.checked_at = self.started_at;
        }
        let content = serde_json::to_string(&hb).unwrap_or_default();
        if content == self.last_heartbeat {
            return;
        }
        hb.updated_at = updated_at;
        if let (Some(h), Some(t)) = (hb.health.as_mut(), checked_at) {
            h.checked_at = t;
        }
        match files::write_heartbeat(&self.root, &hb) {
            Ok(()) => {
                self.last_heartbeat = content;
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

/// The record of an inbox file rejected as a message.
/// `name` is the file's name, or `NAME (kept as inbox/rejected/KEPT)` when
/// it was kept under another name (de-duplicated, shortened, not UTF-8).
fn rejected(agent: &AgentName, name: &str, reason: &str) -> ErrorRecord {
    let (file, kept) = match name.split_once(" (kept as ") {
        Some((file, kept)) => (file, kept.trim_end_matches(')').to_string()),
        None => (name, format!("inbox/rejected/{name}")),
    };
    ErrorRecord::new(
        Code::InboxRejected,
        format!("{agent}: inbox/{file} rejected: {reason}"),
    )
    .details(format!("kept as {kept}"))
    .agent(agent)
}

/// What recovering `agent`'s stale session came to: the error to raise (the
/// session was interrupted, or the recovery failed), or nothing when there
/// was nothing to do or its end had been journaled and was completed.
/// Did this daemon process begin `session`? By pid and start time: a
/// script in another PID namespace can have the daemon's pid, not also
/// its start time.
fn began_here(session: &Session) -> bool {
    hooks::Owner::me().is(session.owner_pid, session.owner_start) && session.owner_start.is_some()
}

fn recovered(
    agent: &AgentConfig,
    result: Result<Option<hooks::FinishResult>>,
    why: &str,
) -> Option<ErrorRecord> {
    match result {
        Ok(None) => None,
        Ok(Some(r)) if r.replayed => {
            tracing::warn!(
                agent = %agent.name,
                session_id = %r.session_id,
                "session {}: its end was journaled but not fully recorded ({why}); completed from the journal",
                r.session_id
            );
            None
        }
        Ok(Some(r)) => Some(
            ErrorRecord::new(
                Code::SessionInterrupted,
                format!(
                    "{}: session {} was left running ({why}); recorded as an error, {} message(s) returned to the inbox",
                    agent.name,
                    r.session_id,
                    r.returned.len()
                ),
            )
            .agent(&agent.name)
            .session(r.session_id.clone()),
        ),
        Err(e) => Some(
            ErrorRecord::new(e.code(), format!("{}: cannot finish a stale session ({why})", agent.name))
                .details(e.to_string())
                .agent(&agent.name),
        ),
    }
}

/// When `agent` wakes for the fire scheduled at `scheduled`: plus its jitter.
fn wake_at(agent: &AgentConfig, scheduled: DateTime<Utc>) -> DateTime<Utc> {
    let jitter = schedule::jitter_offset(agent.name.as_str(), scheduled, agent.session.jitter);
    scheduled + chrono::Duration::from_std(jitter).unwrap_or_default()
}
