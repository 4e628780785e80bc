//! The daemon's event loop: one tokio task that owns every decision.
//!
//! It waits — never polls — for the next of: an inbox event from the
//! watcher, a session ending, a signal (SIGTERM, SIGINT, SIGHUP), the next
//! deadline (a schedule, an inbox debounce, a file settling), the watchdog
//! interval, and the reconcile scan (a backstop, every few minutes). Each is
//! handed to the pure `core`, and what it decides is carried out here.

/// The loop's state as the publisher reads it ([`publish::Seen`]):
/// borrowed field by field, so `published` can be borrowed mutably
/// alongside.
macro_rules! seen {
    ($daemon:expr) => {
        publish::Seen {
            core: &$daemon.core,
            running: &$daemon.running,
            streaks: &$daemon.streaks,
            monitor: &$daemon.monitor,
            economy: &$daemon.economy,
            started_at: $daemon.started_at,
            stopping: $daemon.stopping.is_some(),
            root: &$daemon.root,
            config_path: &$daemon.config_path,
        }
    };
}

mod adopted;
mod economy;
mod ending;
mod facts;
mod flows;
mod intake;
mod iterations;
mod metrics;
mod monitor;
mod observer;
mod publish;
mod reload;
mod running;
mod start;
mod stop;
mod unrunnable;
mod wake_requests;
mod wakes;

use intake::rejected;
use monitor::prune_all;
use observer::{Observer, OutputSummary};
use running::{Running, StopNote};
use start::{began_here, recovered};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use super::alerts::{Alerts, EscalationMemory};
use super::clock::{Clock, SessionClock};
use super::core::{AgentSlot, Core, InboxSummary, Priority, Skipped, WakeReason};
use super::effects;
use super::failure::{self, Next, Observed, Streak};
use super::files::{self, HeartbeatOut, RunningEntry, ScheduleState};
use super::health::{self, DiskLevel, HealthState, PruneStats, Thresholds};
use super::machine;
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
use crate::state::journal::{self, ScheduleMissed, WakeSkipped};
use crate::state::report::{AgentStatus, ErrorState, Lifecycle, Report, ReportError};
use crate::state::session::{Session, SessionVerdict};
use crate::state::{AgentDir, StateRoot, bootstrap};

/// How often the reconcile scan looks at every inbox, as a backstop to the
/// watcher. It also refreshes the heartbeat.
const RECONCILE_EVERY: Duration = Duration::from_secs(300);
/// [`RECONCILE_EVERY`], or a test's (`AGENT_STATE_TEST_RECONCILE`: a
/// reconcile cannot be waited 5 minutes for in a test; operators never set
/// it).
fn reconcile_every() -> Duration {
    std::env::var("AGENT_STATE_TEST_RECONCILE")
        .ok()
        .and_then(|t| humantime::parse_duration(&t).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(RECONCILE_EVERY)
}

/// How often the daemon checks that its root's lock is still its own.
const ROOT_CHECK_EVERY: Duration = Duration::from_secs(5);
/// A stop signal this soon after the first is the same one sent twice
/// (`timeout(1)` signals its child and then its process group), not an
/// operator's "stop now".
const REPEATED_SIGNAL: Duration = Duration::from_secs(1);
/// [`REPEATED_SIGNAL`], or a test's (`AGENT_STATE_TEST_REPEATED_SIGNAL`:
/// a test signals again once it has read that the first was taken, which
/// a busy machine may make later than a second; operators never set it).
fn repeated_signal() -> chrono::TimeDelta {
    let window = std::env::var("AGENT_STATE_TEST_REPEATED_SIGNAL")
        .ok()
        .and_then(|t| humantime::parse_duration(&t).ok())
        .unwrap_or(REPEATED_SIGNAL);
    chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX)
}

/// Everything the daemon reacts to, from one [`Daemon::next_event`]: the
/// inbox watcher, the sessions and the tasks the loop spawned (over a
/// channel), the timers, and the signals. [`Daemon::handle`] is the one
/// `match` over it.
enum Event {
    /// The inbox watcher saw something (an arrival, a file being written or
    /// closed, a rejected file finished, a lost directory, a wake request,
    /// a lost event that asks for a rescan).
    Watch(WatchEvent),
    /// A session's process started with this pid.
    SessionPid { agent: AgentName, pid: u32 },
    /// A remote session runs on worker `host` (its lease's holder).
    SessionHost { agent: AgentName, host: String },
    /// A signal (or an invalid one) in a session's output, as it streams.
    Signal {
        agent: AgentName,
        signal: Box<crate::protocol::signals::SignalResult>,
    },
    /// A session's streamed usage reached its `session_budget.max_tokens`.
    SessionOverBudget { agent: AgentName, tokens: u64 },
    /// A `wake_if` command came back.
    WakeCondition {
        agent: AgentName,
        result: std::result::Result<(), crate::daemon::credential::CheckError>,
    },
    /// A credential's login check came back.
    CredentialChecked {
        group: String,
        result: std::result::Result<(), crate::daemon::credential::CheckError>,
    },
    /// A session's runner ended: its exit, its output, its worktree.
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
    /// A run of a session with `verify` ended well (or said COMPLETE): its
    /// machine judges it, and its task waits for the order (`reply`).
    RunEnded {
        agent: AgentName,
        report: Box<RunReport>,
        output: Box<OutputSummary>,
        reply: tokio::sync::oneshot::Sender<iterations::Order>,
    },
    /// Iteration `n`'s verification ended: passed, or failed with what
    /// (`failure`, for the journal; `verified`, for its machine, whose
    /// order the task waits for).
    IterationVerified {
        agent: AgentName,
        n: u32,
        of: u32,
        failure: Option<String>,
        verified: machine::Verified,
        reply: tokio::sync::oneshot::Sender<iterations::Order>,
    },
    /// The monitor's pruning of worktrees ended: what it removed, errors.
    WorkspacesPruned {
        removed: Vec<String>,
        errors: Vec<String>,
    },
    /// Errors found off the loop (a flow's publish), to raise: each with
    /// whether it is escalated.
    Raise(Vec<(ErrorRecord, bool)>),
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
    /// The next deadline came (a schedule, a debounce, a file settling, a
    /// deferred wake, the shutdown's grace); `lag` is how late the loop
    /// woke for it.
    Deadline { lag: Duration },
    /// Time to publish the metrics (`[metrics] interval`).
    MetricsDue,
    /// Time to see which credential checks are due.
    CredentialChecksDue,
    /// Time to tell systemd's watchdog the loop is alive (the only event
    /// after which the loop does not look for work).
    Watchdog,
    /// The reconcile scan, a backstop to the watcher: every inbox, the
    /// requests in `.daemon/`, the heartbeat.
    Reconcile,
    /// Time for the health check (`[health] interval`).
    HealthDue,
    /// Time to check that `.daemon/lock` is still ours.
    RootCheckDue,
    /// SIGTERM or SIGINT (named): stop waking, let sessions end, exit; a
    /// second one stops the sessions now.
    Shutdown(&'static str),
    /// SIGHUP: reload the config.
    Reload,
    /// SIGUSR1: `agent-state credential release` or `agent-state stop` left
    /// a request in `.daemon/`.
    Requests,
    /// SIGUSR2 with `AGENT_STATE_TEST_STALL=1`: block the loop (test hook,
    /// so a test can show systemd's watchdog restarts a stuck daemon).
    Stall,
}

impl Event {
    /// An event from a channel: what else is queued in the channels is
    /// handled with it, before the loop looks for work (one turn, however
    /// many events a burst brings).
    fn came_by_channel(&self) -> bool {
        !matches!(
            self,
            Event::Deadline { .. }
                | Event::MetricsDue
                | Event::CredentialChecksDue
                | Event::Watchdog
                | Event::Reconcile
                | Event::HealthDue
                | Event::RootCheckDue
                | Event::Shutdown(_)
                | Event::Reload
                | Event::Requests
                | Event::Stall
        )
    }
}

/// Where the loop's events come from: the channels, the timers, the
/// signals. Only [`Sources::next`] waits on them.
struct Sources {
    rx: mpsc::UnboundedReceiver<Event>,
    watch_rx: mpsc::UnboundedReceiver<WatchEvent>,
    /// The last event came from the watcher: its channel is drained first.
    watch_first: bool,
    sigterm: tokio::signal::unix::Signal,
    sigint: tokio::signal::unix::Signal,
    sighup: tokio::signal::unix::Signal,
    sigusr1: tokio::signal::unix::Signal,
    sigusr2: tokio::signal::unix::Signal,
    stall_allowed: bool,
    watchdog: Option<tokio::time::Interval>,
    reconcile: tokio::time::Interval,
    health_every: Duration,
    health: tokio::time::Interval,
    root_check: tokio::time::Interval,
    credential: tokio::time::Interval,
    /// With `[metrics]` on at the start.
    metrics: Option<tokio::time::Interval>,
}

/// An interval whose missed ticks are not made up for.
fn every(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

impl Sources {
    /// Wait for the next event: `deadline` is the daemon's next one; the
    /// credential timer runs only while `credential_checks`, the root check
    /// only until the root is lost.
    async fn next(
        &mut self,
        deadline: tokio::time::Instant,
        credential_checks: bool,
        root_checks: bool,
    ) -> Event {
        let metrics_on = self.metrics.is_some();
        let watchdog_on = self.watchdog.is_some();
        tokio::select! {
            Some(event) = self.rx.recv() => {
                self.watch_first = false;
                event
            }
            Some(e) = self.watch_rx.recv() => {
                self.watch_first = true;
                Event::Watch(e)
            }
            _ = tokio::time::sleep_until(deadline) => Event::Deadline {
                lag: tokio::time::Instant::now().saturating_duration_since(deadline),
            },
            _ = tick(&mut self.metrics), if metrics_on => Event::MetricsDue,
            _ = self.credential.tick(), if credential_checks => Event::CredentialChecksDue,
            _ = self.sigterm.recv() => Event::Shutdown("SIGTERM"),
            _ = self.sigint.recv() => Event::Shutdown("SIGINT"),
            _ = self.sighup.recv() => Event::Reload,
            _ = self.sigusr1.recv() => Event::Requests,
            _ = tick(&mut self.watchdog), if watchdog_on => Event::Watchdog,
            _ = self.reconcile.tick() => Event::Reconcile,
            _ = self.health.tick() => Event::HealthDue,
            _ = self.root_check.tick(), if root_checks => Event::RootCheckDue,
            _ = self.sigusr2.recv(), if self.stall_allowed => Event::Stall,
        }
    }

    /// An event already queued in a channel (the one the last event came
    /// from first), if any: handled in the same turn as that event.
    fn queued(&mut self) -> Option<Event> {
        let from_loop = |s: &mut Self| s.rx.try_recv().ok();
        let from_watch = |s: &mut Self| s.watch_rx.try_recv().ok().map(Event::Watch);
        if self.watch_first {
            from_watch(self).or_else(|| from_loop(self))
        } else {
            from_loop(self).or_else(|| from_watch(self))
        }
    }

    /// After a health check: follow a changed `[health] interval` (reload).
    fn health_every(&mut self, period: Duration) {
        if period != self.health_every {
            self.health_every = period;
            self.health = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            self.health
                .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
    }
}

/// The tick of an optional interval (`select!` disables the branch when
/// there is none).
async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
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
    /// The sessions' machines' clock (monotonic from the daemon's start).
    session_clock: SessionClock,
    /// The pure decisions: slots, wakes due, inbox summaries, backoff.
    core: Core,
    watcher: InboxWatcher,
    running: BTreeMap<AgentName, Running>,
    tx: mpsc::UnboundedSender<Event>,
    started_at: Timestamp,
    stopping: Option<DateTime<Utc>>,
    /// When the stop was asked for, on the session clock (monotonic).
    stop_asked: Option<DateTime<Utc>>,
    intake: intake::Intake,
    schedules: wakes::Schedules,
    monitor: monitor::Monitor,
    published: publish::Published,
    /// Agents whose lock was busy at the last try: logged once when that
    /// starts and once when it ends, not at every retry.
    lock_busy: start::BusyLocks,
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
    /// Where the events come from ([`Daemon::next_event`]).
    sources: Sources,
    /// `.daemon/lock`, held while the daemon runs.
    root_lock: files::DaemonLock,
    /// Why the root stopped being ours, if it did: the daemon then stops.
    root_lost: Option<String>,
    /// Where sessions run when `[cluster]` says this host runs none
    /// (`local_sessions = false`): on the workers. Set at the start; a
    /// reload does not change it.
    remote: Option<std::sync::Arc<super::remote::Remote>>,
}

/// What serves `[web]`: bound before READY, then served as a task. It
/// lives above the daemon (it reads the state like the CLI), so the daemon
/// is handed it.
pub type WebHook = fn(&Config, &Path) -> Result<()>;

/// Run the daemon until SIGTERM/SIGINT. Returns once every session has
/// ended and every file is consistent.
pub async fn run(config_path: &Path, web: WebHook) -> Result<()> {
    let (config, config_text) = Config::load_with_text(config_path)?;
    let root = StateRoot::new(&config.state_root);
    bootstrap::root(&root)?;
    let lock = files::lock_root(&root)?;
    // The loop never waits long for an agent's lock: anyone who can read
    // `.lock` can hold it. Work that cannot have it is deferred. Every
    // AgentDir the daemon takes from this root carries the bound.
    let root = root.with_lock_wait(crate::state::lock::DAEMON_WAIT);
    // The CLI falls back to this copy while the file on disk is invalid.
    if let Err(e) = files::record_reload_verdict(
        &root,
        config_path,
        Some(&config_text),
        vec![],
        Timestamp::now(),
    ) {
        tracing::warn!("cannot keep a copy of the accepted config: {e}");
    }
    // Per-session cgroups when systemd delegated ours (logged either way).
    super::cgroup::available();
    let clock = Clock::from_env();
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let (watch_tx, watch_rx) = mpsc::unbounded_channel::<WatchEvent>();
    let watcher = InboxWatcher::new(watch_tx)?;
    // This daemon's store, carried by its root and every AgentDir taken
    // from it: its reads repair what they find, the repairs noted (under
    // its clock) for `after_change` to raise as STATE_CORRUPT; a write
    // that fails with ENOSPC prunes what retention allows and tries once
    // more (state::atomic::retrying); sessions ending together acknowledge
    // their messages one at a time. The pruning itself writes through a
    // root without the reclaimer, so a prune never reclaims again.
    let root = {
        let repairs = crate::state::Store::default()
            .recording_repairs(move || Timestamp::from_datetime(clock.now()))
            .acknowledging_one_at_a_time();
        let pruned = root.clone().with_store(repairs.clone());
        let health = config.health.clone();
        let agents: Vec<AgentName> = config.agents.iter().map(|a| a.name.clone()).collect();
        // It takes an instance id for every session: what it wrote to
        // counters.json last is kept, not read and parsed again.
        root.with_store(
            repairs.with_reclaimer(move || prune_all(&pruned, &health, &agents, &[]).bytes),
        )
        .keeping_counters()
    };
    let sigterm = signal(SignalKind::terminate())
        .map_err(|e| Error::io("installing a handler for", "SIGTERM", e))?;
    let sigint = signal(SignalKind::interrupt())
        .map_err(|e| Error::io("installing a handler for", "SIGINT", e))?;
    let sighup = signal(SignalKind::hangup())
        .map_err(|e| Error::io("installing a handler for", "SIGHUP", e))?;
    // `agent-state credential release` or `agent-state stop` left a
    // request in `.daemon/`.
    let sigusr1 = signal(SignalKind::user_defined1())
        .map_err(|e| Error::io("installing a handler for", "SIGUSR1", e))?;
    // Test hook: with AGENT_STATE_TEST_STALL=1, SIGUSR2 blocks the main loop,
    // so a test can show that systemd's watchdog restarts a stuck daemon.
    let stall_allowed = std::env::var("AGENT_STATE_TEST_STALL").as_deref() == Ok("1");
    let sigusr2 = signal(SignalKind::user_defined2())
        .map_err(|e| Error::io("installing a handler for", "SIGUSR2", e))?;

    let metrics = config.metrics.clone();
    let sources = Sources {
        rx,
        watch_rx,
        watch_first: false,
        sigterm,
        sigint,
        sighup,
        sigusr1,
        sigusr2,
        stall_allowed,
        watchdog: systemd::watchdog_interval().map(every),
        reconcile: every(reconcile_every()),
        health_every: config.health.interval,
        health: every(config.health.interval),
        // Is `.daemon/lock` still ours (the root not removed and made again)?
        root_check: every(ROOT_CHECK_EVERY),
        credential: every(Duration::from_secs(5)),
        metrics: metrics.enabled().then(|| every(metrics.interval)),
    };
    let mut daemon = Daemon {
        remote: super::remote::Remote::of(config.cluster.as_ref(), clock, &config.source),
        sources,
        root_lock: lock,
        root_lost: None,
        lock_busy: Default::default(),
        alerts: Alerts::new(&config, &root.store),
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
        session_clock: SessionClock::starting(clock.now()),
        watcher,
        running: BTreeMap::new(),
        tx,
        started_at: Timestamp::now(),
        stopping: None,
        stop_asked: None,
        streaks: BTreeMap::new(),
    };
    // Bootstrapping thousands of agents on a slow disk can outlast systemd's
    // start timeout: ask for time in proportion (generously, 50 ms each).
    let agents = daemon.config.agents.len() as u64;
    if agents > 100 {
        systemd::extend_start(Duration::from_secs(60) + Duration::from_millis(50 * agents));
    }
    daemon.agent_index = index_agents(&daemon.config);
    let warnings = reload::config_warnings(&daemon.config, config_path);
    daemon.raise_each(warnings);
    daemon.economy.load(&daemon.root);
    daemon.core.oom_lowered_until = ending::saved_oom_lowering(
        &daemon.root,
        daemon.config.daemon.oom_lower_for,
        daemon.core.max_concurrent,
        daemon.clock.now(),
    );
    // What `credential release` and `stop` asked meanwhile (a stop asked of
    // a daemon that has gone since is dropped: no session of it runs).
    daemon.daemon_requests();
    let (records, remote_sessions) = start::recover(&daemon.config, &daemon.root);
    daemon.raise_each(records);
    // What a crash left of the flows: answers not applied, messages not sent.
    let flows: Vec<AgentName> = daemon.config.flows.iter().map(|f| f.name.clone()).collect();
    flows::apply_flows(
        &daemon.root,
        &daemon.config,
        daemon.clock.now(),
        &flows,
        &daemon.tx,
    );
    // At start an agent that cannot be set up is logged (and shown
    // missing); the daemon runs the others.
    let _ = daemon.apply_agents(true, &Default::default());
    // Sessions a previous controller left running on workers: followed
    // again (cluster mode).
    for (agent, record) in remote_sessions {
        adopted::adopt(&mut daemon, &agent, record);
    }
    // The disk before any session starts (a full or read-only one holds them).
    // The disk only (a full or read-only one holds every session): the
    // routine prune and the look at every agent's session (which recovery
    // has just done) cost a few syscalls per agent, seconds at 10,000
    // agents; the first periodic check does them, one `health.interval`
    // later. A disk under pressure is pruned now all the same.
    daemon.check_health(false);
    // The metrics listener is bound before READY: an address in use fails
    // the start, with the reason, instead of a daemon without its metrics.
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
        // Cluster mode: the worker registry read for the metrics, each
        // interval, off the loop (`daemon::fleet`).
        if let Some(remote) = daemon.remote.clone() {
            let every = daemon.config.metrics.interval.max(Duration::from_secs(1));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    remote.refresh_fleet().await;
                }
            });
        }
        daemon.publish_metrics();
    }
    // The web view too: an address in use or an unreadable token file fails
    // the start.
    web(&daemon.config, config_path)?;
    // `[cluster]`: with `local_sessions = false` every session goes to the
    // workers (issue 24); else they all still run on this host: say which.
    match (&daemon.config.cluster, &daemon.remote) {
        (Some(cluster), Some(_)) => {
            tracing::info!(
                "[cluster] in {}: sessions run on the workers through NATS at {} (local_sessions = false; dispatch timeout {})",
                config_path.display(),
                cluster.urls.join(", "),
                humantime::format_duration(cluster.dispatch_timeout)
            );
            // Said once here, not only in each refused session's reason.
            let mut here = Vec::new();
            for agent in &daemon.config.agents {
                if agent.session.runs_on == crate::config::RunsOn::Controller {
                    here.push(agent.name.to_string());
                } else if !agent.session.iteration.verify.is_empty() {
                    tracing::warn!(agent = %agent.name, "{}: {} has [agent.session.iteration] verify, which cannot run on a worker yet: each of its sessions is refused (set runs_on = \"controller\" for it, local_sessions = true in [cluster], or remove its verify)", config_path.display(), agent.name);
                }
            }
            if !here.is_empty() {
                tracing::info!(
                    "{}: the sessions of {} run on this host (runs_on = \"controller\"); they stop with the daemon",
                    config_path.display(),
                    here.join(", ")
                );
            }
        }
        (Some(cluster), None) => tracing::warn!(
            "[cluster] in {} names NATS at {}, but local_sessions is true: every session runs on this host (set local_sessions = false to run them on the workers)",
            config_path.display(),
            cluster.urls.join(", ")
        ),
        _ => {}
    }
    // Ready once the state is recovered and the watches are in place: what
    // the inboxes hold, and what is due, is work like any other. A backlog
    // of thousands of messages never holds READY (nor systemd's start job).
    daemon.published.write_heartbeat(&seen!(daemon));
    systemd::ready(&seen!(daemon).status_line());
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

    // The reconcile and the health check are due one period from now (the
    // start did both); the other timers tick at once.
    daemon.sources.reconcile.reset();
    daemon.sources.health.reset();

    loop {
        if daemon.stopping.is_some() && daemon.running.is_empty() {
            break;
        }
        let event = daemon.next_event().await;
        let batch = event.came_by_channel();
        // The watchdog's tick changes nothing: no need to look for work.
        let look_for_work = !matches!(event, Event::Watchdog);
        daemon.handle(event);
        if batch {
            while let Some(event) = daemon.sources.queued() {
                daemon.handle(event);
            }
        }
        if look_for_work {
            daemon.tick();
        }
    }
    daemon.published.heartbeat_written = false;
    daemon.published.write_heartbeat(&seen!(daemon));
    tracing::info!("stopped: every session has ended");
    match daemon.root_lost.take() {
        Some(why) => Err(Error::Unavailable(why)),
        None => Ok(()),
    }
}

impl Daemon {
    /// An agent's config: by the index built at start and reload (checked,
    /// so a stale index can only cost a search), not a search of every agent
    /// (at 10k agents, per-agent work at start was quadratic).
    fn agent_config(&self, agent: &AgentName) -> Option<&AgentConfig> {
        agent_in(&self.config, &self.agent_index, agent)
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Watch(WatchEvent::Inbox(agent)) => {
                self.intake.arrived(&agent);
                self.intake.dirty.insert(agent);
            }
            Event::Watch(WatchEvent::Writing(agent, name)) => {
                self.intake.writing.entry(agent).or_default().insert(name);
            }
            Event::Watch(WatchEvent::Closed(agent, name)) => {
                if let Some(w) = self.intake.writing.get_mut(&agent) {
                    w.remove(&name);
                }
                self.intake.arrived(&agent);
                self.intake.dirty.insert(agent);
            }
            Event::Watch(WatchEvent::Rejected(agent)) => {
                // Once per loop turn, however many writes: it reads all
                // of `rejected/`.
                self.intake.rejected_written.insert(agent);
            }
            Event::Watch(WatchEvent::Lost(agent)) => {
                self.intake.arrived(&agent);
                if self.watcher.is_watching(&agent) {
                    tracing::warn!(agent = %agent, "its inbox directory was removed or moved away; watching it again when it is back (or recreated)");
                    self.watcher.forget(&agent);
                    let at = self.clock.now() + chrono::Duration::seconds(1);
                    self.intake.settle_at.insert(agent, at);
                }
            }
            Event::Watch(WatchEvent::Wake(agent, name)) => {
                self.intake.requests.arrived(&agent, name)
            }
            Event::Watch(WatchEvent::Session(agent)) => {
                let dir = self.root.agent(&agent);
                if let Some(r) = self.running.get_mut(&agent) {
                    r.script_said(&dir);
                }
            }
            Event::Watch(WatchEvent::Rescan(why)) => {
                tracing::warn!("rescanning every inbox: {why}");
                self.intake.reusable.clear();
                // What was being written is not known any more: each file
                // is judged by its age again.
                self.intake.writing.clear();
                self.scan_all_inboxes();
            }
            Event::SessionPid { agent, pid } => {
                if let Some(r) = self.running.get_mut(&agent) {
                    r.pid = Some(pid);
                    // Made its workspace first: its run starts now.
                    r.feed(machine::Event::Launched);
                }
            }
            Event::SessionHost { agent, host } => {
                if let Some(r) = self.running.get_mut(&agent) {
                    r.host = Some(host);
                }
            }
            Event::SessionOverBudget { agent, tokens } => {
                if let Some(cfg) = self.agent_config(&agent).cloned() {
                    let running = self.running.get_mut(&agent);
                    economy::session_over_budget(running, &agent, &cfg, tokens);
                }
            }
            Event::WakeCondition { agent, result } => {
                self.economy.conditions_running.remove(&agent);
                let now = self.clock.now();
                self.economy.condition_result.insert(agent, (now, result));
            }
            Event::CredentialChecked { group, result } => {
                let now = self.clock.now();
                match (self.economy).checked(&self.root, &self.config, &group, result, now) {
                    economy::Checked::Nothing => {}
                    economy::Checked::Released => self.released(&group),
                    economy::Checked::Held(record) => self.raise(*record, true),
                }
            }
            Event::Signal { agent, signal } => {
                // Late for a session whose end is being recorded: dropped,
                // as once the session is gone.
                let error = match self.running.get_mut(&agent).filter(|r| !r.recording) {
                    Some(running) => running.signal(&self.root, &self.config, &agent, *signal),
                    None => None,
                };
                self.raise_each(error);
            }
            Event::SessionDone {
                agent,
                report,
                output,
                workspace,
                iterations,
            } => self.session_done(agent, *report, *output, workspace.map(|w| *w), iterations),
            Event::EndRecorded(ended) => {
                let (recorded, outcome) = *ended;
                self.end_recorded(recorded, outcome)
            }
            Event::Iteration {
                agent,
                n,
                of,
                phase,
            } => {
                // The run its machine ordered (`Launch`) started: its
                // timeout from now.
                if phase == iterations::Phase::Executing
                    && let Some(r) = self.running.get_mut(&agent)
                {
                    r.feed(machine::Event::Launched);
                }
                let dir = self.root.agent(&agent);
                iterations::iteration(self.running.get_mut(&agent), &dir, n, of, phase)
            }
            Event::RunEnded {
                agent,
                report,
                output,
                reply,
            } => {
                let dir = self.root.agent(&agent);
                let now = self.clock.now();
                let order = match self.running.get_mut(&agent).filter(|r| !r.recording) {
                    Some(r) => iterations::run_ended(r, &dir, &report, &output, now),
                    None => iterations::Order::Finish,
                };
                let _ = reply.send(order);
            }
            Event::IterationVerified {
                agent,
                n,
                of,
                failure,
                verified,
                reply,
            } => {
                let dir = self.root.agent(&agent);
                iterations::verified(self.running.get(&agent), &dir, n, of, failure);
                let order = match self.running.get_mut(&agent).filter(|r| !r.recording) {
                    Some(r) => {
                        let actions = r.feed(machine::Event::VerifyFinished(verified));
                        r.order_of(actions)
                    }
                    None => iterations::Order::Finish,
                };
                let _ = reply.send(order);
            }
            Event::WorkspacesPruned { removed, errors } => {
                for record in self.monitor.workspaces_pruned(removed, errors) {
                    self.raise(record, false);
                }
            }
            Event::Raise(records) => {
                for (record, escalate) in records {
                    self.raise(record, escalate);
                }
            }
            Event::LogsRotated(outcome) => {
                for record in self.monitor.logs_rotated(*outcome) {
                    self.raise(record, false);
                }
            }
            Event::WakeRequestsSwept(swept) => {
                let known = self.core.contains(&swept.agent);
                self.intake.requests.swept(&self.root, known, *swept);
            }
            Event::InboxListed {
                agent,
                reason,
                listed,
                arrivals,
            } => self.inbox_listed(agent, reason, listed, arrivals),
            Event::Deadline { lag } => {
                self.tally.loop_lag = lag;
                // The sessions whose machine's timer came are told the time
                // (their timeouts and stalls, the graces after SIGTERM);
                // what is left for the loop is a stall's error record.
                let mut stalled = Vec::new();
                for (agent, r) in self.running.iter_mut() {
                    let actions = r.due();
                    if actions.iter().any(|a| {
                        *a == machine::Action::Raise {
                            code: Code::SessionStalled,
                        }
                    }) {
                        stalled.push(agent.clone());
                    }
                }
                for agent in stalled {
                    let cfg = self.agent_config(&agent);
                    let silent_for = cfg.and_then(|c| c.session.stall_timeout);
                    let record = ending::session_stalled(
                        self.running.get(&agent),
                        cfg,
                        &agent,
                        silent_for.unwrap_or_default(),
                    );
                    self.raise_each(record);
                }
            }
            Event::MetricsDue => self.publish_metrics(),
            Event::CredentialChecksDue => {
                for group in self.economy.checks_due(&self.config, self.clock.now()) {
                    self.economy
                        .start_check(&self.config, &self.root, &self.tx, &group);
                }
            }
            Event::Watchdog => systemd::watchdog(),
            Event::Reconcile => {
                self.scan_all_inboxes();
                self.daemon_requests();
                self.published.heartbeat_written = false;
                // Cluster mode: the leases against the sessions run here.
                if let Some(remote) = self.remote.clone() {
                    let running = self
                        .running
                        .iter()
                        .map(|(a, r)| (a.to_string(), r.session_id.clone()))
                        .collect();
                    tokio::spawn(async move { remote.reconcile(running).await });
                }
            }
            Event::HealthDue => {
                self.check_health(true);
                // An operator who installs or `chmod +x`es a held agent's command
                // need do nothing else: it is released within one interval.
                self.recheck_unrunnable();
                self.sources.health_every(self.config.health.interval);
            }
            Event::RootCheckDue => {
                if let Err(lost) = self.root_lock.check() {
                    let why = lost.to_string();
                    self.raise(ErrorRecord::new(lost.code(), why.clone()), false);
                    self.shutdown("the state root was replaced");
                    self.root_lost = Some(why);
                }
            }
            Event::Shutdown(signal) => self.shutdown(signal),
            Event::Reload => self.reload(),
            Event::Requests => {
                self.daemon_requests();
            }
            Event::Stall => {
                tracing::warn!(
                    "SIGUSR2 with AGENT_STATE_TEST_STALL=1: blocking the main loop (test hook)"
                );
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    /// Wait for the next event (see [`Event`]): whatever comes first of the
    /// channels, the timers, the signals and the next deadline.
    async fn next_event(&mut self) -> Event {
        // The next deadline: a schedule, a debounce or a backoff (the
        // core's), a file settling, the shutdown's grace, wake requests left
        // for the next turn, one held back by its wake_request_interval.
        let now = self.clock.now();
        let next_deadline = [
            self.core.next_deadline(now),
            self.intake.settle_at.values().min().copied(),
            self.stopping.filter(|_| !self.running.is_empty()),
            self.intake.requests.pending().then_some(now),
            self.intake.requests.held_until(),
        ]
        .into_iter()
        .flatten()
        .min();
        // The sessions' timers are on their own (monotonic) line.
        let session_timer = self.running.values().filter_map(|r| r.timer).min();
        let sleep_for = [
            next_deadline.map(|t| self.clock.until(t)),
            session_timer.map(|t| self.session_clock.until(t)),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::from_secs(86_400));
        let deadline = tokio::time::Instant::now() + sleep_for;
        let credential_checks = economy::has_credential_checks(&self.config);
        let root_checks = self.root_lost.is_none();
        self.sources
            .next(deadline, credential_checks, root_checks)
            .await
    }

    fn shutdown(&mut self, why: &str) {
        let asked = self.session_clock.now();
        if self.stopping.is_some() {
            // One signal sent twice (`timeout` signals its child, then its
            // whole process group): still the graceful stop.
            if self
                .stop_asked
                .is_some_and(|first| asked - first < repeated_signal())
            {
                tracing::info!(
                    "{why} again at once: taken as the same stop (send it again to end the running sessions now)"
                );
                return;
            }
            // A second signal: stop the sessions now.
            tracing::warn!("{why} again: ending running sessions now");
            for r in self.running.values_mut() {
                r.feed(machine::Event::Shutdown);
            }
            return;
        }
        // Cluster mode: sessions on workers go on without this daemon; the
        // next start follows them again.
        let left = adopted::leave_remote_sessions(&mut self.running);
        if left > 0 {
            tracing::info!(
                "{why}: {left} session(s) on workers left running; the next start follows them again"
            );
        }
        let grace = self.config.daemon.shutdown_grace;
        self.stop_asked = Some(asked);
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

    /// After anything changed: repairs to report, the shutdown deadline, the
    /// heartbeat, STATUS=.
    fn after_change(&mut self) {
        for (agent, note) in self.root.store.take_repairs() {
            let mut record = ErrorRecord::new(Code::StateCorrupt, note);
            if !agent.is_empty() {
                record = record.agent(agent);
            }
            self.raise(record, false);
        }
        let now = self.clock.now();
        if let Some(deadline) = self.stopping
            && now >= deadline
        {
            for r in self.running.values_mut() {
                r.feed(machine::Event::Shutdown);
            }
        }
        self.published.write_heartbeat(&seen!(self));
        let status = seen!(self).status_line();
        if status != self.published.last_status {
            systemd::status(&status);
            self.published.last_status = status;
        }
    }
}

/// Position of each agent in `config.agents`, for [`Daemon::agent_config`]
/// (built at start and at each reload).
fn index_agents(config: &Config) -> std::collections::HashMap<AgentName, usize> {
    config
        .agents
        .iter()
        .enumerate()
        .map(|(i, a)| (a.name.clone(), i))
        .collect()
}

/// `agent`'s config, by `index` (see [`Daemon::agent_config`]).
fn agent_in<'a>(
    config: &'a Config,
    index: &std::collections::HashMap<AgentName, usize>,
    agent: &AgentName,
) -> Option<&'a AgentConfig> {
    if let Some(&i) = index.get(agent)
        && let Some(a) = config.agents.get(i)
        && &a.name == agent
    {
        return Some(a);
    }
    config.agents.iter().find(|a| &a.name == agent)
}
