//! The daemon's event loop: one tokio task that owns every decision.
//!
//! It waits — never polls — for the next of: an inbox event from the
//! watcher, a session ending, a signal (SIGTERM, SIGINT, SIGHUP), the next
//! deadline (a schedule, an inbox debounce, a file settling), the watchdog
//! interval, and the reconcile scan (a backstop, every few minutes). Each is
//! handed to the pure `core`, and what it decides is carried out here.

mod economy;
mod ending;
mod flows;
mod intake;
mod iterations;
mod metrics;
mod monitor;
mod observer;
mod publish;
mod reload;
mod start;
mod stop;
mod unrunnable;
mod wake_requests;
mod wakes;

use intake::rejected;
use monitor::prune_all;
use observer::{EndingNote, Observer, OutputSummary};
use start::{began_here, recovered};

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
use super::files::{self, HeartbeatOut, RunningEntry, ScheduleState};
use super::health::{self, DiskLevel, HealthState, PruneStats, Thresholds};
use super::output::{self, ClaudeResult, SessionOutput};
use super::runner::{self, Ending, OutputObserver, OutputStream, RunReport};
use super::session;
use super::systemd;
use super::watcher::{InboxWatcher, WatchEvent};
use super::workspaces;
use crate::agent_name::AgentName;
use crate::catalogue::{Code, ErrorRecord};
use crate::clock::Timestamp;
use crate::config::{AgentConfig, AgentKind, Config};
use crate::error::{Error, Result};
use crate::hooks;
use crate::inbox;
use crate::schedule::{self, Missed};
use crate::state::journal::{Event, ScheduleMissed, WakeSkipped};
use crate::state::report::{AgentStatus, ErrorState, Lifecycle, Report, ReportError};
use crate::state::session::{Session, SessionVerdict};
use crate::state::{AgentDir, StateRoot, bootstrap};

/// How often the reconcile scan looks at every inbox, as a backstop to the
/// watcher. It also refreshes the heartbeat.
const RECONCILE_EVERY: Duration = Duration::from_secs(300);
/// How often the daemon checks that its root's lock is still its own.
const ROOT_CHECK_EVERY: Duration = Duration::from_secs(5);

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
    /// A session's streamed usage reached its `session_budget.max_tokens`.
    SessionOverBudget {
        agent: AgentName,
        tokens: u64,
    },
    /// A `wake_if` command came back.
    WakeCondition {
        agent: AgentName,
        result: std::result::Result<(), String>,
    },
    /// A credential's login check came back.
    CredentialChecked {
        group: String,
        result: std::result::Result<(), String>,
    },
    SessionDone {
        agent: AgentName,
        report: Box<RunReport>,
        output: Box<OutputSummary>,
        /// What became of its worktree, with a `workspace`.
        workspace: Option<Box<super::workspaces::Outcome>>,
        /// How its iterations went.
        iterations: iterations::Tally,
    },
    /// A session's end was recorded off the loop (`session::finish`).
    EndRecorded(Box<(ending::Recorded, Result<session::Finished>)>),
    /// A session's iteration `n` (of at most `of`) is executing or verifying.
    Iteration {
        agent: AgentName,
        n: u32,
        of: u32,
        phase: iterations::Phase,
    },
    /// The monitor's pruning of worktrees ended: what it removed, errors.
    WorkspacesPruned {
        removed: Vec<String>,
        errors: Vec<String>,
    },
    /// The monitor's rotation of the logs ended.
    LogsRotated(Box<crate::daemon::rotation::Outcome>),
    /// A batch of wake requests was removed off the loop.
    WakeRequestsSwept(Box<wake_requests::Swept>),
    /// A big inbox was listed off the loop for the start of a session
    /// (with the wake's reason) or for a scan (`None`: the start-up's, the
    /// reconcile's, a rescan's).
    InboxListed {
        agent: AgentName,
        reason: Option<WakeReason>,
        listed: Option<std::sync::Arc<crate::inbox::Listed>>,
        /// The agent's arrivals counted when the listing was asked for.
        arrivals: u64,
    },
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
    /// What the claim read (bodies dropped), for the end.
    claimed: Vec<crate::inbox::Message>,
    /// Claude Code's conversation id, and whether the session continued it.
    conversation: Option<(String, bool)>,
    /// Its runner ended; its end is being recorded off the loop
    /// ([`LoopEvent::EndRecorded`] follows).
    recording: bool,
}

/// Why the daemon stops a session, shared with its [`Observer`].
type StopNote = std::sync::Arc<std::sync::Mutex<Option<StopWhy>>>;

/// Why the daemon stops a session (not a shutdown): the reason recorded,
/// and the catalogue code when the reason is not the agent's failure
/// (`SESSION_STOPPED`: an operator's `agent-state stop`).
#[derive(Debug, Clone)]
struct StopWhy {
    reason: String,
    code: Option<Code>,
}

impl Running {
    /// Stop the session for `why` (not a shutdown): recorded as an error
    /// with this reason.
    fn stop_for(&mut self, why: String) {
        self.stop_with(why, None);
    }

    /// Stop it for `why`, typed by `code` (see [`StopWhy`]): the runner's
    /// path of a timeout (SIGTERM to the group and the cgroup, SIGKILL
    /// after `kill_grace`).
    fn stop_with(&mut self, why: String, code: Option<Code>) {
        if let Ok(mut note) = self.stop_note.lock() {
            *note = Some(StopWhy {
                reason: why.clone(),
                code,
            });
        }
        self.stop_reason = Some(why);
        let _ = self.stop.send(true);
    }
}

/// The loop's state. Each concern's own state is in its module's struct
/// (`intake`, `schedules`, `monitor`, `published`); what several concerns
/// read (the config, the core, the running sessions) is here.
struct Daemon {
    config: Config,
    /// Position of each agent in `config.agents`.
    agent_index: std::collections::HashMap<AgentName, usize>,
    /// What the metrics count, and where they go (`None`: `[metrics]` off).
    tally: metrics::Tally,
    economy: economy::Economy,
    metrics_out: Option<metrics::Publishing>,
    config_path: PathBuf,
    root: StateRoot,
    clock: Clock,
    /// The pure decisions: slots, wakes due, inbox summaries, backoff.
    core: Core,
    watcher: InboxWatcher,
    running: BTreeMap<AgentName, Running>,
    tx: mpsc::UnboundedSender<LoopEvent>,
    started_at: Timestamp,
    stopping: Option<DateTime<Utc>>,
    intake: intake::Intake,
    schedules: wakes::Schedules,
    monitor: monitor::Monitor,
    published: publish::Published,
    /// Agents whose lock was busy at the last try: logged once when that
    /// starts and once when it ends, not at every retry.
    lock_busy: std::collections::BTreeSet<AgentName>,
    /// Each agent's run of failed sessions (reset by a success).
    streaks: BTreeMap<AgentName, Streak>,
    alerts: Alerts,
    escalated: EscalationMemory,
    /// Owner locks of sessions that ended but whose end could not be
    /// recorded: still ours until `finish_orphan` records it.
    orphan_locks: BTreeMap<AgentName, crate::owner::OwnerLock>,
    /// Agents held because their command cannot be executed, with what its
    /// check found (`unrunnable.rs`).
    unrunnable: BTreeMap<AgentName, super::runnable::Probe>,
}

/// Run the daemon until SIGTERM/SIGINT. Returns once every session has
/// ended and every file is consistent.
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
        let health = config.health.clone();
        let agents: Vec<AgentName> = config.agents.iter().map(|a| a.name.clone()).collect();
        crate::state::atomic::set_reclaimer(move || prune_all(&root, &health, &agents, &[]).bytes);
    }
    let mut daemon = Daemon {
        lock_busy: Default::default(),
        alerts: Alerts::new(&config),
        escalated: EscalationMemory::load(&root),
        orphan_locks: BTreeMap::new(),
        unrunnable: BTreeMap::new(),
        core: Core::new(config.daemon.max_concurrent_sessions),
        config_path: config_path.to_path_buf(),
        schedules: wakes::Schedules::new(files::read_schedule_state(&root)),
        intake: Default::default(),
        agent_index: Default::default(),
        tally: Default::default(),
        economy: Default::default(),
        metrics_out: None,
        monitor: Default::default(),
        published: Default::default(),
        config,
        root,
        clock,
        watcher,
        running: BTreeMap::new(),
        tx,
        started_at: Timestamp::now(),
        stopping: None,
        streaks: BTreeMap::new(),
    };
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| Error::io("installing a handler for", "SIGTERM", e))?;
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| Error::io("installing a handler for", "SIGINT", e))?;
    let mut sighup = signal(SignalKind::hangup())
        .map_err(|e| Error::io("installing a handler for", "SIGHUP", e))?;
    // `agent-state credential release` or `agent-state stop` left a
    // request in `.daemon/`.
    let mut sigusr1 = signal(SignalKind::user_defined1())
        .map_err(|e| Error::io("installing a handler for", "SIGUSR1", e))?;
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
    daemon.index_agents();
    daemon.config_warnings();
    daemon.load_economy();
    daemon.release_requests();
    daemon.recover();
    // A stop asked of a daemon that has gone since: no session of it runs.
    daemon.stop_requests();
    // What a crash left of the flows: answers not applied, messages not sent.
    let flows: Vec<AgentName> = daemon.config.flows.iter().map(|f| f.name.clone()).collect();
    daemon.apply_flows(&flows);
    daemon.apply_agents(true);
    // The disk before any session starts (a full or read-only one holds them).
    daemon.health_check_at_start();
    // The metrics listener is bound before READY: an address in use fails
    // the start, with the reason, instead of a daemon without its metrics.
    let metrics = daemon.config.metrics.clone();
    if metrics.enabled() {
        let publishing = metrics::Publishing::new(metrics.textfile.clone());
        if let Some(addr) = metrics.listen {
            let listener = super::exporter::bind(addr).await.map_err(|e| {
                Error::Unavailable(format!(
                    "cannot listen for metrics on {addr} ([metrics] listen in {}): {e}",
                    config_path.display()
                ))
            })?;
            tracing::info!("metrics at http://{addr}/metrics");
            tokio::spawn(super::exporter::serve(listener, publishing.board.clone()));
        }
        daemon.metrics_out = Some(publishing);
        daemon.publish_metrics();
    }
    // Ready once the state is recovered and the watches are in place: what
    // the inboxes hold, and what is due, is work like any other. A backlog
    // of thousands of messages never holds READY (nor systemd's start job).
    daemon.write_heartbeat();
    systemd::ready(&daemon.status_line());
    tracing::info!(
        "agent-state {} ready: {} agents on {}",
        env!("CARGO_PKG_VERSION"),
        daemon.config.agents.len(),
        daemon.root.path.display()
    );
    // Files that arrived while the daemon was down: scanned only now that the
    // watches are in place, so nothing can fall between scan and watch.
    daemon.scan_all_inboxes();
    // Start what is due already (a catch-up run) before waiting for anything.
    daemon.tick();
    reload::give_back_memory();

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
    let mut credential_tick = tokio::time::interval(Duration::from_secs(5));
    credential_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut metrics_tick = tokio::time::interval(metrics.interval);
    metrics_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        if daemon.stopping.is_some() && daemon.running.is_empty() {
            break;
        }
        let sleep_for = daemon
            .next_deadline()
            .map(|t| daemon.clock.until(t))
            .unwrap_or(Duration::from_secs(86_400));
        let deadline = tokio::time::Instant::now() + sleep_for;
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
            _ = tokio::time::sleep_until(deadline) => {
                daemon.tally.loop_lag = tokio::time::Instant::now().saturating_duration_since(deadline);
            }
            _ = metrics_tick.tick(), if metrics.enabled() => daemon.publish_metrics(),
            _ = credential_tick.tick(), if daemon.has_credential_checks() => daemon.credential_checks_due(),
            _ = sigterm.recv() => daemon.shutdown("SIGTERM"),
            _ = sigint.recv() => daemon.shutdown("SIGINT"),
            _ = sighup.recv() => daemon.reload(),
            _ = sigusr1.recv() => {
                daemon.release_requests();
                daemon.stop_requests();
            }
            _ = watchdog.tick(), if watchdog_every.is_some() => {
                systemd::watchdog();
                continue;
            }
            _ = reconcile.tick() => {
                daemon.scan_all_inboxes();
                daemon.release_requests();
                daemon.stop_requests();
                daemon.published.heartbeat_written = false;
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
    daemon.published.heartbeat_written = false;
    daemon.write_heartbeat();
    tracing::info!("stopped: every session has ended");
    match root_lost {
        Some(why) => Err(Error::Unavailable(why)),
        None => Ok(()),
    }
}

impl Daemon {
    fn dir(&self, agent: &AgentName) -> AgentDir {
        self.root.agent(agent)
    }

    /// An agent's config: by the index built at start and reload (checked,
    /// so a stale index can only cost a search), not a search of every agent
    /// (at 10k agents, per-agent work at start was quadratic).
    fn agent_config(&self, agent: &AgentName) -> Option<&AgentConfig> {
        if let Some(&i) = self.agent_index.get(agent)
            && let Some(a) = self.config.agents.get(i)
            && &a.name == agent
        {
            return Some(a);
        }
        self.config.agents.iter().find(|a| &a.name == agent)
    }

    /// Rebuild the index of [`Daemon::agent_config`] after the config changed.
    fn index_agents(&mut self) {
        self.agent_index = self
            .config
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| (a.name.clone(), i))
            .collect();
    }

    fn handle(&mut self, event: LoopEvent) {
        match event {
            LoopEvent::Watch(WatchEvent::Inbox(agent)) => {
                self.intake.arrived(&agent);
                self.intake.dirty.insert(agent);
            }
            LoopEvent::Watch(WatchEvent::Writing(agent, name)) => {
                self.intake.writing.entry(agent).or_default().insert(name);
            }
            LoopEvent::Watch(WatchEvent::Closed(agent, name)) => {
                if let Some(w) = self.intake.writing.get_mut(&agent) {
                    w.remove(&name);
                }
                self.intake.arrived(&agent);
                self.intake.dirty.insert(agent);
            }
            LoopEvent::Watch(WatchEvent::Rejected(agent)) => {
                // Once per loop turn, however many writes: it reads all
                // of `rejected/`.
                self.intake.rejected_written.insert(agent);
            }
            LoopEvent::Watch(WatchEvent::Lost(agent)) => {
                self.intake.arrived(&agent);
                if self.watcher.is_watching(&agent) {
                    tracing::warn!(agent = %agent, "its inbox directory was removed or moved away; watching it again when it is back (or recreated)");
                    self.watcher.forget(&agent);
                    let at = self.clock.now() + chrono::Duration::seconds(1);
                    self.intake.settle_at.insert(agent, at);
                }
            }
            LoopEvent::Watch(WatchEvent::Wake(agent, name)) => {
                self.intake.requests.arrived(&agent, name)
            }
            LoopEvent::Watch(WatchEvent::Rescan(why)) => {
                tracing::warn!("rescanning every inbox: {why}");
                self.intake.reusable.clear();
                // What was being written is not known any more: each file
                // is judged by its age again.
                self.intake.writing.clear();
                self.scan_all_inboxes();
            }
            LoopEvent::SessionPid { agent, pid } => {
                if let Some(r) = self.running.get_mut(&agent) {
                    r.pid = Some(pid);
                }
            }
            LoopEvent::SessionOverBudget { agent, tokens } => {
                self.session_over_budget(&agent, tokens)
            }
            LoopEvent::WakeCondition { agent, result } => {
                self.economy.conditions_running.remove(&agent);
                let now = self.clock.now();
                self.economy.condition_result.insert(agent, (now, result));
            }
            LoopEvent::CredentialChecked { group, result } => {
                self.credential_checked(&group, result)
            }
            LoopEvent::SessionStalled { agent, silent_for } => {
                self.session_stalled(&agent, silent_for)
            }
            LoopEvent::Signal { agent, signal } => self.signal(&agent, *signal),
            LoopEvent::SessionDone {
                agent,
                report,
                output,
                workspace,
                iterations,
            } => self.session_done(agent, *report, *output, workspace.map(|w| *w), iterations),
            LoopEvent::EndRecorded(ended) => {
                let (recorded, outcome) = *ended;
                self.end_recorded(recorded, outcome)
            }
            LoopEvent::Iteration {
                agent,
                n,
                of,
                phase,
            } => self.iteration(&agent, n, of, phase),
            LoopEvent::WorkspacesPruned { removed, errors } => {
                self.workspaces_pruned(removed, errors)
            }
            LoopEvent::LogsRotated(outcome) => self.logs_rotated(*outcome),
            LoopEvent::WakeRequestsSwept(swept) => self.wake_requests_swept(*swept),
            LoopEvent::InboxListed {
                agent,
                reason,
                listed,
                arrivals,
            } => self.inbox_listed(agent, reason, listed, arrivals),
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
        self.stopping = Some(crate::clock::later(self.clock.now(), grace));
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

    fn next_deadline(&self) -> Option<DateTime<Utc>> {
        [
            self.core.next_deadline(self.clock.now()),
            self.intake.settle_at.values().min().copied(),
            self.stopping.filter(|_| !self.running.is_empty()),
            // Wake requests left for the next turn.
            self.intake.requests.pending().then(|| self.clock.now()),
            // A wake request held back by its agent's wake_request_interval.
            self.wake_request_held_until(),
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
        if status != self.published.last_status {
            systemd::status(&status);
            self.published.last_status = status;
        }
    }
}
