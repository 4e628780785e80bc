//! `agent-state worker`: a host that runs sessions for a cluster's
//! controller (issue 24).
//!
//! It connects with `[cluster]`, registers in the worker registry and
//! renews its record every `heartbeat` ([`agent_state_cluster::workers`]).
//! For each free slot it pulls one order ([`OrderQueue::next`]) of its
//! credential groups that work, in turn. A group with a login check in the
//! config (`[credential.NAME] check`) works once its check passed: the check
//! runs at start and every `check_every` (a failing one at least every 5
//! min), the daemon's runner ([`crate::daemon::credential::check`]: time
//! limit, bounded output, its own process group); the record says which
//! groups work and why not ([`group_state`], [`pullable`], [`checks_due`]).
//! Before each pull it reads the free space of its work directory
//! (statvfs) and `MemAvailable` (/proc/meminfo): below `--min-free-disk` or
//! `--min-free-memory` it pulls nothing, says why once, and its record's
//! `not_pulling` says it too ([`short_of_room`]).
//! Then, per order:
//!
//! 1. the spec is read ([`SessionSpec`]); a bad one ends as "not started"
//!    with the reason naming the field: it is someone else's input, so NUL
//!    bytes, oversized or too many arguments and variables, a prompt over
//!    8 MiB, and a `cwd` that is a symlink or not a directory are refused;
//! 2. an in-progress ack (the order stays this worker's while it prepares)
//!    and the take of the lease `run/<agent>`, sent together (one round
//!    trip, not two, before the session starts): held by another, the order
//!    goes back to the queue (5 s later) for whoever frees it; not extended,
//!    it goes back at once and the lease is released;
//! 3. under the lease, a session whose end is already stored (an order
//!    redelivered after its session ran here or elsewhere) is not run
//!    again: the end is published before the lease is released, so a
//!    second taker always finds it;
//! 4. an order with a `workspace` gets its worktree now, under the lease
//!    ([`workspace`]; checked against this worker's config before the
//!    lease is taken): one that cannot be made ends "not started" with its
//!    catalogue code;
//! 5. the command runs as a child in a process group of its own (and, where
//!    the worker's cgroup is delegated, a cgroup of its own, [`cgroup`],
//!    with the order's `memory_max`), stdin the spec's `stdin` (the prompt)
//!    or /dev/null; stdout and stderr are appended chunk by chunk to its
//!    spool file ([`spool`]) and published from it in numbered chunks to
//!    `<output_stream>.out.<session>` ([`relay`]): a NATS outage never
//!    blocks the session, bounded by `--max-spool`; the order is acked once
//!    it runs (the child does not wait for that ack);
//! 6. the lease is renewed by [`keep`] until the child ends and its output
//!    is stored; a lease lost (fenced, taken, or not renewed for
//!    `worker_gives_up`) kills it, as do its timeout, a silence of its
//!    stall timeout with `stall_action` stop ([`stall`]), a full spool and
//!    the worker's SIGTERM (SIGTERM to the group, SIGKILL after the
//!    grace), and the group and the cgroup are killed after it ends;
//! 7. the end (outcome, times, last chunk, lease revision, the worktree's
//!    judgement) is written to
//!    the spool, then stored in `<output_stream>.end.<session>` once every
//!    chunk is, then the spool file is removed and the lease released.
//!
//! At start it finishes, or keeps and explains, the spool files an earlier
//! run left ([`recover`]: only under its own lease, with the session's
//! processes known gone).
//!
//! A drain request (`agent-state worker drain HOST`) is read at each
//! heartbeat: the worker stops pulling, finishes its sessions and says
//! `drained` in its record. SIGTERM (or SIGINT): it stops pulling, ends its
//! sessions as above, writes a last record saying it stopped, and exits 0.
//!
//! A session's hook calls (`session begin|end|fail`, `record`, `send`)
//! go to the controller: the session's `AGENT_STATE_HOOKS` names a socket
//! of the worker's, which stamps each call with the order and the lease
//! revision it holds and forwards it ([`hooks`]).
//!
//! An order with a `workspace` (an agent with `[agent.session.workspace]`)
//! runs in a git worktree the worker makes under the lease, before the
//! command starts (its cwd), and judges after it ends; the end carries the
//! judgement, or why it could not be made ([`workspace`]: only where this
//! worker's own config puts that agent's worktrees, of the repository it
//! names there).
//!
//! What it does not do yet (issue 24): flow cycles, and `verify` with a
//! workspace (both refused by the controller, naming the setting).

mod cgroup;
mod hooks;
mod recover;
mod relay;
mod spool;
mod stall;
pub mod workspace;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agent_state_cluster::workers::unix_ms;
use agent_state_cluster::{
    Cluster, ClusterSettings, CredentialState, KeepEnd, LeaseError, LeaseTiming, Leases,
    OrderQueue, Outcome, Output, PulledOrder, RunningSession, SessionEnd, SessionSpec,
    WorkerRecord, Workers, keep_sharing,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinSet;

/// How long one pull waits for an order before the next group's turn.
const PULL_WAIT: Duration = Duration::from_secs(2);
/// An order whose agent's lease is held goes back for this long.
const HELD_DELAY: Duration = Duration::from_secs(5);
/// The grace between SIGTERM and SIGKILL when the spec names none.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
/// How long the output may take to drain once the session's group is gone.
const PIPES_CLOSE_WITHIN: Duration = Duration::from_secs(10);
/// How long a lease release is retried while NATS does not answer.
const STORE_RETRY_FOR: Duration = Duration::from_secs(120);
/// Once the worker is told to stop, how long a session's output and end are
/// still retried before its spool is left for the next start.
const STOP_FLUSH: Duration = Duration::from_secs(15);

/// What `agent-state worker` was told.
#[derive(Debug, Clone)]
pub struct Options {
    pub host: String,
    pub slots: usize,
    pub groups: Vec<String>,
    pub heartbeat: Duration,
    pub version: String,
    pub lease_timing: LeaseTiming,
    /// The login checks of its groups (`[credential.NAME] check`); a group
    /// not here counts as working.
    pub checks: BTreeMap<String, GroupCheck>,
    /// The least room it pulls with: free space on `work_dir`, memory
    /// available.
    pub minimums: Minimums,
    /// Where its config lets each agent's worktrees be made, and that
    /// config's path (for the reasons).
    pub workspaces: workspace::Allowances,
    pub config: std::path::PathBuf,
    /// The most bytes of a session's output its spool holds that NATS has
    /// not stored (`--max-spool`); past it the session is ended.
    pub spool_limit: u64,
}

/// Below these it pulls no order (0: not checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minimums {
    /// The directory whose file system's free space is checked.
    pub work_dir: std::path::PathBuf,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n.saturating_mul(1024)),
        None => Some(n),
        Some(_) => None,
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1 << 20))
}

/// Why the worker may pull nothing now (`None`: it may): free disk on the
/// work directory (`Err`: it could not be read, which also stops pulling)
/// and memory available (`None`: unknown, not held against it) against the
/// minimums. What is short (`"disk"`, `"memory"`), and the words to say.
pub fn short_of_room(
    min: &Minimums,
    disk_free: std::io::Result<u64>,
    memory_available: Option<u64>,
) -> Option<(&'static str, String)> {
    if min.disk_bytes > 0 {
        match disk_free {
            Err(e) => {
                return Some((
                    "disk",
                    format!(
                        "cannot read the free space of {}: {e}",
                        min.work_dir.display()
                    ),
                ));
            }
            Ok(free) if free < min.disk_bytes => {
                return Some((
                    "disk",
                    format!(
                        "{} free on {}, below --min-free-disk {}",
                        mib(free),
                        min.work_dir.display(),
                        mib(min.disk_bytes)
                    ),
                ));
            }
            Ok(_) => {}
        }
    }
    if min.memory_bytes > 0
        && let Some(available) = memory_available
        && available < min.memory_bytes
    {
        return Some((
            "memory",
            format!(
                "{} of memory available, below --min-free-memory {}",
                mib(available),
                mib(min.memory_bytes)
            ),
        ));
    }
    None
}

/// Reads the disk and memory and says why not to pull, if so.
fn room_now(min: &Minimums) -> Option<(&'static str, String)> {
    if min.disk_bytes == 0 && min.memory_bytes == 0 {
        return None;
    }
    let disk = if min.disk_bytes > 0 {
        crate::daemon::health::probe(&min.work_dir).map(|p| p.free)
    } else {
        Ok(u64::MAX)
    };
    let memory = if min.memory_bytes > 0 {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| mem_available(&t))
    } else {
        None
    };
    short_of_room(min, disk, memory)
}

/// How long the worker waits before it looks at the disk and memory again.
const ROOM_RECHECK: Duration = Duration::from_secs(5);

/// A credential group's login check, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupCheck {
    pub command: Vec<String>,
    pub every: Duration,
}

/// A failing credential is checked again at least this often.
const CHECK_WHILE_FAILING: Duration = Duration::from_secs(300);

/// The last result of a group's check, and when to run it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// `None`: it passed; else why it failed.
    pub failed: Option<String>,
    pub next_at: Instant,
}

impl Checked {
    /// The state after a check ended at `now`: a passing one is run again
    /// after `every`, a failing one after `every` but at most
    /// [`CHECK_WHILE_FAILING`].
    pub fn after(every: Duration, failed: Option<String>, now: Instant) -> Checked {
        let again = if failed.is_some() {
            every.min(CHECK_WHILE_FAILING)
        } else {
            every
        };
        Checked {
            failed,
            next_at: now + again,
        }
    }
}

/// Whether `group` works, and if not why: a group without a check works;
/// one with a check works once its last check passed.
pub fn group_state(
    group: &str,
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
) -> (bool, Option<String>) {
    if !checks.contains_key(group) {
        return (true, None);
    }
    match results.get(group) {
        None => (false, Some("its check has not answered yet".into())),
        Some(Checked { failed: None, .. }) => (true, None),
        Some(Checked {
            failed: Some(why), ..
        }) => (false, Some(format!("its check failed: {why}"))),
    }
}

/// The groups whose orders may be pulled (in `groups`' order).
pub fn pullable(
    groups: &[String],
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
) -> Vec<String> {
    groups
        .iter()
        .filter(|g| group_state(g, checks, results).0)
        .cloned()
        .collect()
}

/// The groups whose check is due at `now`: never run, or its time come.
pub fn checks_due(
    groups: &[String],
    checks: &BTreeMap<String, GroupCheck>,
    results: &BTreeMap<String, Checked>,
    now: Instant,
) -> Vec<String> {
    groups
        .iter()
        .filter(|g| checks.contains_key(*g))
        .filter(|g| results.get(*g).is_none_or(|c| c.next_at <= now))
        .cloned()
        .collect()
}

/// The wall clock in milliseconds since the epoch, for a session's end.
fn now_ms() -> u64 {
    unix_ms(SystemTime::now())
}

fn log(message: impl std::fmt::Display) {
    eprintln!("agent-state worker: {message}");
}

/// A test hook, the worker's side of the controller's
/// `AGENT_STATE_TEST_CONTROLLER_FENCES` (a lost lease cannot be waited
/// 120 s for in a test): `AGENT_STATE_TEST_WORKER_GIVES_UP` and
/// `AGENT_STATE_TEST_WORKER_RENEWS` replace `worker_gives_up` and
/// `renew_every`. Operators never set them; timings out of the order
/// [`LeaseTiming::check`] keeps are refused (said, and the default kept).
fn test_timing(timing: LeaseTiming) -> LeaseTiming {
    let var = |name: &str| std::env::var(name).ok();
    match timing_with(
        timing,
        var("AGENT_STATE_TEST_WORKER_GIVES_UP").as_deref(),
        var("AGENT_STATE_TEST_WORKER_RENEWS").as_deref(),
    ) {
        Ok(t) => t,
        Err(e) => {
            log(format!("the test lease timings are refused: {e}"));
            timing
        }
    }
}

/// Why the test hook's timings are refused.
#[derive(Debug, PartialEq, thiserror::Error)]
enum TestTimingError {
    #[error("{value:?} is not a duration: {detail}")]
    NotADuration { value: String, detail: String },
    #[error(transparent)]
    OutOfOrder(#[from] agent_state_cluster::TimingError),
}

/// `timing` with the test hook's `gives_up` and `renews` (durations), if
/// they keep [`LeaseTiming::check`]'s order.
fn timing_with(
    timing: LeaseTiming,
    gives_up: Option<&str>,
    renews: Option<&str>,
) -> Result<LeaseTiming, TestTimingError> {
    let parse = |text: &str| {
        humantime::parse_duration(text).map_err(|e| TestTimingError::NotADuration {
            value: text.to_string(),
            detail: e.to_string(),
        })
    };
    let mut test = timing;
    if let Some(d) = gives_up {
        test.worker_gives_up = parse(d)?;
    }
    if let Some(d) = renews {
        test.renew_every = parse(d)?;
    }
    test.check()?;
    Ok(test)
}

/// CLOCK_MONOTONIC in nanoseconds: the start and end lines of a session
/// carry it, so that the sessions of several workers on one machine can be
/// laid on one time line (tests/it/cluster_chaos.rs).
fn monotonic_ns() -> u128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| Duration::from(t).as_nanos())
        .unwrap_or(0)
}

fn notify(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        log(format!("cannot notify systemd: {e}"));
    }
}

struct Shared {
    options: Options,
    leases: Leases,
    output: Output,
    running: Mutex<BTreeMap<String, RunningSession>>,
    /// The last result of each group's check.
    checks: Mutex<BTreeMap<String, Checked>>,
    /// Why it pulls nothing now (low disk or memory).
    not_pulling: Mutex<Option<String>>,
    drained: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
    /// `<work dir>/spool` ([`spool`]).
    spool_dir: std::path::PathBuf,
    /// The sessions' hook sockets and the line to the controller (`None`:
    /// the private directory could not be made; sessions run without).
    hooks: Option<Arc<hooks::Hooks>>,
}

impl Shared {
    fn record(&self, drained: bool, stopped: bool) -> WorkerRecord {
        WorkerRecord {
            host: self.options.host.clone(),
            version: self.options.version.clone(),
            slots: self.options.slots,
            sessions: self
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect(),
            credentials: self
                .options
                .groups
                .iter()
                .map(|g| {
                    let (working, detail) = group_state(
                        g,
                        &self.options.checks,
                        &self.checks.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    CredentialState {
                        group: g.clone(),
                        working,
                        detail,
                    }
                })
                .collect(),
            drained,
            stopped,
            not_pulling: self
                .not_pulling
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            heartbeat_ms: unix_ms(SystemTime::now()),
            heartbeat_every_ms: self.options.heartbeat.as_millis() as u64,
        }
    }
}

/// Everything the worker needs from the cluster.
struct Connected {
    cluster: Cluster,
    leases: Leases,
    output: Output,
    workers: Workers,
    queues: Vec<(String, OrderQueue)>,
}

/// Why the worker could not connect, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Cluster(#[from] agent_state_cluster::ClusterError),
    #[error(transparent)]
    Dispatch(#[from] agent_state_cluster::DispatchError),
    #[error(
        "cannot make the output spool directory {}/spool: {source}; give the worker a --work-dir it owns",
        work_dir.display()
    )]
    Spool {
        work_dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen for {signal}: {source}")]
    Signal {
        signal: &'static str,
        source: std::io::Error,
    },
}

async fn connect(settings: &ClusterSettings, options: &Options) -> Result<Connected, WorkerError> {
    let name = format!("agent-state worker {}", options.host);
    let cluster = Cluster::connect(settings, &name).await?;
    let dispatch = cluster.dispatch().await?;
    let leases = cluster.leases(options.lease_timing).await?;
    let output = cluster.output().await?;
    let workers = cluster.workers().await?;
    let mut queues = Vec::new();
    for group in &options.groups {
        queues.push((group.clone(), dispatch.queue(group).await?));
    }
    Ok(Connected {
        cluster,
        leases,
        output,
        workers,
        queues,
    })
}

/// Runs the worker until SIGTERM or SIGINT. Errors only if it could not
/// start listening for signals.
pub async fn run(settings: ClusterSettings, options: Options) -> Result<(), WorkerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let options = Options {
        lease_timing: test_timing(options.lease_timing),
        ..options
    };
    let listen = |kind: SignalKind, signal_name: &'static str| {
        signal(kind).map_err(|source| WorkerError::Signal {
            signal: signal_name,
            source,
        })
    };
    let spool_dir =
        spool::dir(&options.minimums.work_dir).map_err(|source| WorkerError::Spool {
            work_dir: options.minimums.work_dir.clone(),
            source,
        })?;
    // Before any session: a restarted worker's earlier sessions' cgroups
    // are killed here ([`recover`] counts on it).
    let has_cgroups = cgroup::init();
    let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
    let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => log("SIGTERM: taking no more orders, ending the sessions"),
            _ = int.recv() => log("SIGINT: taking no more orders, ending the sessions"),
        }
        notify(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::Status("stopping: ending the sessions"),
        ]);
        let _ = stop_tx.send(true);
    });

    // Connect, retrying until the servers answer (a cluster electing its
    // leader, a worker started before NATS) or until told to stop.
    let mut stop = stop_rx.clone();
    let mut last_error = String::new();
    let connected = loop {
        match connect(&settings, &options).await {
            Ok(c) => break c,
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    log(format!("{e}; retrying every 2 s"));
                    last_error = e;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = until(&mut stop, true) => return Ok(()),
                }
            }
        }
    };
    let Connected {
        cluster,
        leases,
        output,
        workers,
        queues,
    } = connected;
    let hooks = match hooks::Hooks::new(cluster.client().clone(), settings.clone()) {
        Ok(h) => {
            log(format!(
                "sessions' hook calls go to the controller through sockets in {}",
                h.dir().display()
            ));
            Some(Arc::new(h))
        }
        Err(e) => {
            log(format!(
                "cannot make a private directory for the sessions' hook sockets: {e}; their hook calls reach no controller"
            ));
            None
        }
    };

    let (drained_tx, drained_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        options: options.clone(),
        leases,
        output,
        running: Mutex::new(BTreeMap::new()),
        checks: Mutex::new(BTreeMap::new()),
        not_pulling: Mutex::new(None),
        drained: drained_rx,
        stop: stop_rx.clone(),
        spool_dir,
        hooks,
    });
    let recovering = tokio::spawn(recover::leftovers(shared.clone(), has_cgroups));

    // Register: the first heartbeat, with the drain request as it stands.
    let drained = workers
        .drain_requested(&options.host)
        .await
        .unwrap_or(false);
    drained_tx.send_replace(drained);
    if let Err(e) = workers.beat(&shared.record(drained, false)).await {
        log(format!("cannot register: {e}"));
    }
    log(format!(
        "{} registered: {} slot(s), credential group(s) {}{}",
        options.host,
        options.slots,
        options.groups.join(", "),
        if drained {
            "; drained: pulling no order"
        } else {
            ""
        }
    ));
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status("pulling orders"),
    ]);

    let heart = tokio::spawn(heartbeat(
        workers.clone(),
        shared.clone(),
        drained_tx,
        stop_rx.clone(),
    ));
    let checker = tokio::spawn(check_credentials(shared.clone(), stop_rx.clone()));
    pull(&shared, &queues).await;
    let _ = checker.await;
    let _ = recovering.await;

    // Stopping: the sessions see `stop` and end; wait for them.
    let _ = heart.await;
    let record = shared.record(*shared.drained.borrow(), true);
    if let Err(e) = workers.beat(&record).await {
        log(format!("cannot write the last record: {e}"));
    }
    log("stopped");
    Ok(())
}

/// Runs each group's login check at start and when due, keeping its
/// result in `shared.checks`; says each change once.
async fn check_credentials(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let checks = &shared.options.checks;
    let groups = &shared.options.groups;
    if !groups.iter().any(|g| checks.contains_key(g)) {
        return;
    }
    let lock = || shared.checks.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let due = checks_due(groups, checks, &lock(), Instant::now());
        for group in due {
            let check = &checks[&group];
            let result = tokio::select! {
                r = crate::daemon::credential::check(
                    &check.command,
                    std::path::Path::new("/"),
                    crate::daemon::credential::CHECK_TIMEOUT,
                ) => r,
                _ = until(&mut stop, true) => return,
            };
            let failed = result.err().map(|e| e.to_string());
            let now = Instant::now();
            let before = lock().insert(
                group.clone(),
                Checked::after(check.every, failed.clone(), now),
            );
            let was = before.map(|b| b.failed);
            if was.as_ref() != Some(&failed) {
                match &failed {
                    None => log(format!(
                        "credential group {group}: its check passed; pulling its orders"
                    )),
                    Some(why) => log(format!(
                        "credential group {group}: its check failed: {why}; pulling none of its orders until it passes (checked again every {})",
                        humantime::format_duration(check.every.min(CHECK_WHILE_FAILING))
                    )),
                }
            }
        }
        let next = lock().values().map(|c| c.next_at).min();
        let wait = next.map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(Instant::now())
        });
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = until(&mut stop, true) => return,
        }
    }
}

/// Renews the record every `heartbeat`, reading the drain request each time.
async fn heartbeat(
    workers: Workers,
    shared: Arc<Shared>,
    drained_tx: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(shared.options.heartbeat) => {}
            _ = until(&mut stop, true) => return,
        }
        match workers.drain_requested(&shared.options.host).await {
            Ok(drain) => {
                let was = drained_tx.send_replace(drain);
                if was != drain {
                    log(if drain {
                        "drain requested: pulling no more orders; running sessions finish"
                    } else {
                        "drain withdrawn: pulling orders again"
                    });
                    notify(&[sd_notify::NotifyState::Status(if drain {
                        "drained: pulling no order"
                    } else {
                        "pulling orders"
                    })]);
                }
            }
            Err(e) => log(format!("cannot read the drain request: {e}")),
        }
        let record = shared.record(*drained_tx.borrow(), false);
        match workers.beat(&record).await {
            Ok(_) if failing => {
                log("heartbeat written again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) => {
                if !failing {
                    log(format!("cannot write the heartbeat: {e}"));
                }
                failing = true;
            }
        }
    }
}

/// Pulls one order per free slot until told to stop, then waits for the
/// sessions to end.
async fn pull(shared: &Arc<Shared>, queues: &[(String, OrderQueue)]) {
    let slots = Arc::new(Semaphore::new(shared.options.slots));
    let mut sessions = JoinSet::new();
    let mut stop = shared.stop.clone();
    let mut drained = shared.drained.clone();
    let mut turn = 0usize;
    let mut last_error = String::new();
    let mut short_said: Option<&'static str> = None;
    loop {
        while sessions.try_join_next().is_some() {}
        if *stop.borrow() {
            break;
        }
        if *drained.borrow() {
            tokio::select! {
                _ = until(&mut drained, false) => {}
                _ = until(&mut stop, true) => {}
                Some(_) = sessions.join_next() => {}
            }
            continue;
        }
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = until(&mut stop, true) => break,
            _ = until(&mut drained, true) => continue,
        };
        let short = room_now(&shared.options.minimums);
        *shared.not_pulling.lock().unwrap_or_else(|e| e.into_inner()) =
            short.as_ref().map(|(_, why)| why.clone());
        // Said once per change of what is short (the figures move).
        let what = short.as_ref().map(|(what, _)| *what);
        if what != short_said {
            match &short {
                Some((_, why)) => log(format!("pulling no order: {why}")),
                None => log("room again: pulling orders"),
            }
            short_said = what;
        }
        if short.is_some() {
            drop(permit);
            tokio::select! {
                _ = tokio::time::sleep(ROOM_RECHECK) => {}
                _ = until(&mut stop, true) => break,
            }
            continue;
        }
        let open = pullable(
            &shared.options.groups,
            &shared.options.checks,
            &shared.checks.lock().unwrap_or_else(|e| e.into_inner()),
        );
        let open: Vec<&(String, OrderQueue)> =
            queues.iter().filter(|(g, _)| open.contains(g)).collect();
        if open.is_empty() {
            // No group works: wait for a check to pass.
            drop(permit);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = until(&mut stop, true) => break,
            }
            continue;
        }
        let (group, queue) = open[turn % open.len()];
        turn = turn.wrapping_add(1);
        let pulled = tokio::select! {
            pulled = queue.next(PULL_WAIT) => pulled,
            _ = until(&mut stop, true) => break,
            _ = until(&mut drained, true) => continue,
        };
        match pulled {
            Ok(Some(order)) => {
                last_error.clear();
                if *stop.borrow() || *drained.borrow() {
                    // Came in as the worker stopped pulling: someone else's.
                    let _ = order.give_back(None).await;
                    continue;
                }
                let shared = shared.clone();
                sessions.spawn(async move {
                    session(&shared, order).await;
                    drop(permit);
                });
            }
            Ok(None) => {}
            Err(e) => {
                let text = format!("credential group {group}: {e}");
                if text != last_error {
                    log(&text);
                    last_error = text;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = until(&mut stop, true) => break,
                }
            }
        }
    }
    while sessions.join_next().await.is_some() {}
}

/// One order, from its pull to its end.
async fn session(shared: &Shared, pulled: PulledOrder) {
    let order = pulled.order.clone();
    let id = order.session_id.clone();
    let host = shared.options.host.clone();
    let pulled_at = Instant::now();
    if let Err(e) = agent_state_cluster::session::check_session(&id) {
        log(format!("{e}; the order is dropped"));
        let _ = pulled.ack().await;
        return;
    }
    let not_started = |detail: String| SessionEnd {
        session_id: id.clone(),
        agent: order.agent.clone(),
        host: host.clone(),
        outcome: Outcome::NotStarted { detail },
        started_ms: unix_ms(SystemTime::now()),
        ended_ms: unix_ms(SystemTime::now()),
        last_chunk: 0,
        lease_revision: 0,
        workspace: None,
    };
    let spec = match SessionSpec::from_order(&order.spec).and_then(|spec| {
        // A worktree's is made below, and checked there.
        if let Some(cwd) = spec.cwd.as_ref().filter(|_| spec.workspace.is_none()) {
            agent_state_cluster::session::check_cwd(std::path::Path::new(cwd))?;
        }
        Ok(spec)
    }) {
        Ok(spec) => spec,
        Err(e) => {
            let detail = e.to_string();
            log(format!("session {id} ({}): {detail}", order.agent));
            store_end(shared, &not_started(detail)).await;
            let _ = pulled.ack().await;
            return;
        }
    };
    let planned = match workspace::check(
        &order.agent,
        &spec,
        &shared.options.workspaces,
        &shared.options.config,
    )
    .and_then(|p| {
        p.as_ref()
            .map(|p| workspace::no_links(&p.path))
            .transpose()?;
        Ok(p)
    }) {
        Ok(planned) => planned,
        Err(refused) => {
            log(format!("session {id} ({}): {refused}", order.agent));
            let end = SessionEnd {
                workspace: Some(refused.end()),
                ..not_started(refused.reason)
            };
            store_end(shared, &end).await;
            let _ = pulled.ack().await;
            return;
        }
    };

    let taken_at = Instant::now();
    // The in-progress ack and the take travel together: the order stays
    // this worker's while it prepares, and the lease, not the ack, keeps a
    // second copy out (invariant 25). An order the server would not extend
    // goes back as before, its lease released.
    let (progress, lease) = tokio::join!(
        pulled.in_progress(),
        shared.leases.take(&order.agent, &host, &id)
    );
    if let Err(e) = progress {
        log(format!(
            "session {id} ({}): {e}; it will be handed out again",
            order.agent
        ));
        if let Ok(lease) = &lease {
            release_lease(shared, &id, lease).await;
        }
        return;
    }
    let lease = match lease {
        Ok(lease) => lease,
        Err(e @ LeaseError::Held { .. }) => {
            log(format!(
                "session {id}: {e}; the order goes back for {HELD_DELAY:?}"
            ));
            let _ = pulled.give_back(Some(HELD_DELAY)).await;
            return;
        }
        Err(e @ LeaseError::InvalidAgent { .. }) => {
            log(format!("session {id}: {e}"));
            store_end(shared, &not_started(e.to_string())).await;
            let _ = pulled.ack().await;
            return;
        }
        Err(e) => {
            log(format!("session {id}: {e}; the order goes back"));
            let _ = pulled.give_back(Some(Duration::from_secs(1))).await;
            return;
        }
    };
    // Under the lease: has this session already run?
    match shared.output.ended(&id).await {
        Ok(None) => {}
        Ok(Some(end)) => {
            log(format!(
                "session {id} already ended on {}; not run again",
                end.host
            ));
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.ack().await;
            return;
        }
        Err(e) => {
            log(format!("session {id}: {e}; the order goes back"));
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.give_back(Some(Duration::from_secs(1))).await;
            return;
        }
    }
    // Its worktree, under the lease (one agent's are never made at once).
    let made = match planned {
        None => None,
        Some(plan) => {
            let _ = pulled.in_progress().await;
            let repo = plan.repo.clone();
            match workspace::make(plan).await {
                Ok(ws) => {
                    log(format!(
                        "session {id} of {}: worktree {} on branch {}",
                        order.agent,
                        ws.path.display(),
                        ws.branch
                    ));
                    Some((repo, ws))
                }
                Err((detail, ws_end)) => {
                    log(format!("session {id} ({}): {detail}", order.agent));
                    let end = SessionEnd {
                        workspace: Some(ws_end),
                        ..not_started(detail)
                    };
                    store_end(shared, &end).await;
                    release_lease(shared, &id, &lease).await;
                    let _ = pulled.ack().await;
                    return;
                }
            }
        }
    };

    let started = SystemTime::now();
    let live_from = monotonic_ns();
    // The agent's session id, as a local session has it: the controller's
    // order says it; a bare order (no controller) has its order id.
    let agent_session = spec
        .env
        .get("AGENT_STATE_SESSION_ID")
        .cloned()
        .unwrap_or_else(|| id.clone());
    let revision = Arc::new(AtomicU64::new(lease.revision));
    let hook_socket = shared.hooks.as_ref().and_then(|h| {
        h.listen(hooks::Stamp {
            agent: order.agent.clone(),
            session: agent_session.clone(),
            order: id.clone(),
            holder: host.clone(),
            revision: revision.clone(),
        })
        .map_err(|e| {
            log(format!(
                "session {id}: cannot listen for its hook calls: {e}; they reach no controller"
            ))
        })
        .ok()
    });
    let mut command = tokio::process::Command::new(&spec.command);
    command
        .args(&spec.args)
        .envs(&spec.env)
        .env("AGENT_STATE_SESSION_ID", &agent_session)
        .env("AGENT_STATE_AGENT", &order.agent)
        .env("AGENT_STATE_WORKER", &host)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    match (&made, &spec.cwd) {
        (Some((_, ws)), _) => {
            command.current_dir(&ws.path);
        }
        (None, Some(cwd)) => {
            command.current_dir(cwd);
        }
        (None, None) => {}
    }
    match &hook_socket {
        Some(socket) => command.env(agent_state_cluster::hooks::HOOKS_ENV, &socket.path),
        None => command.env_remove(agent_state_cluster::hooks::HOOKS_ENV),
    };
    // Its output's local copy first: a session whose output could not be
    // kept does not run.
    let header = spool::Header {
        session_id: id.clone(),
        agent: order.agent.clone(),
        host: host.clone(),
        started_ms: unix_ms(started),
    };
    let spooled = match spool::SpoolFile::create(&shared.spool_dir, &header) {
        Ok(f) => Ok(f),
        Err(e) => Err(format!(
            "cannot create its output spool in {}: {e}",
            shared.spool_dir.display()
        )),
    };
    let session_cgroup = cgroup::session(&id, spec.memory_max);
    if let Some(cg) = &session_cgroup {
        cgroup::join_at_exec(&mut command, cg);
    }
    let spawned = spooled.and_then(|f| {
        command
            .spawn()
            .map(|child| (child, f))
            .map_err(|e| format!("cannot start {}: {e}", spec.command))
    });
    let (mut child, spool_file) = match spawned {
        Ok(pair) => pair,
        Err(detail) => {
            log(format!("session {id} ({}): {detail}", order.agent));
            let _ = std::fs::remove_file(spool::path(&shared.spool_dir, &id));
            cgroup::kill(session_cgroup).await;
            let end = SessionEnd {
                workspace: workspace::judge(made).await,
                ..not_started(detail)
            };
            store_end(shared, &end).await;
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.ack().await;
            return;
        }
    };
    if let (Some(cg), Some(pid)) = (&session_cgroup, child.id()) {
        cgroup::after_spawn(&id, cg, pid);
    }
    let pipes: Vec<(&'static str, Box<dyn tokio::io::AsyncRead + Unpin + Send>)> = [
        child.stdout.take().map(|p| {
            (
                "stdout",
                Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            )
        }),
        child.stderr.take().map(|p| {
            (
                "stderr",
                Box::new(p) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut relay = relay::Relay::start(
        shared.output.clone(),
        &id,
        spool_file,
        shared.options.spool_limit,
        pipes,
    );
    // The prompt, written beside the session (a child that does not read
    // it must not hold the worker up); closed once written.
    if let (Some(mut stdin), Some(text)) = (child.stdin.take(), spec.stdin.clone()) {
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(text.as_bytes()).await;
            let _ = stdin.shutdown().await;
        });
    }
    let pid = child.id().unwrap_or(0);
    log(format!(
        "session {id} of {} started: pid {pid}, lease revision {}, {:.1} ms after its pull, monotonic {live_from}",
        order.agent,
        lease.revision,
        pulled_at.elapsed().as_secs_f64() * 1000.0
    ));
    shared
        .running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            id.clone(),
            RunningSession {
                session_id: id.clone(),
                agent: order.agent.clone(),
                started_ms: unix_ms(started),
            },
        );
    if let Err(e) = pulled.ack().await {
        // The lease keeps a second copy from starting; the stored end keeps
        // it from running once this one is over.
        log(format!("session {id}: {e}"));
    }

    let (done_tx, done_rx) = oneshot::channel::<()>();
    let (kill_tx, kill_rx) = oneshot::channel::<Outcome>();
    let keeper = async {
        let end = keep_sharing(
            &shared.leases,
            shared.options.lease_timing,
            lease,
            taken_at,
            async {
                let _ = done_rx.await;
            },
            &revision,
        )
        .await;
        let detail = match &end {
            KeepEnd::Stopped(_) => None,
            KeepEnd::Lost(e) => Some(e.to_string()),
            KeepEnd::GaveUp { last_error, .. } => Some(format!(
                "no renewal went through for {:?} ({})",
                shared.options.lease_timing.worker_gives_up,
                last_error.as_deref().unwrap_or("no answer")
            )),
        };
        if let Some(detail) = detail {
            log(format!(
                "session {id}: the lease is lost: {detail}; killing it"
            ));
            let _ = kill_tx.send(Outcome::LeaseLost { detail });
        }
        end
    };
    let runner = async {
        let (outcome, last) = supervise(
            shared,
            &id,
            child,
            &spec,
            kill_rx,
            &mut relay,
            session_cgroup,
        )
        .await;
        // Its end beside its output, then its output stored (the lease
        // still renewed meanwhile: the worker is alive, only NATS is slow).
        let provisional = SessionEnd {
            session_id: id.clone(),
            agent: order.agent.clone(),
            host: host.clone(),
            outcome: outcome.clone(),
            started_ms: unix_ms(started),
            ended_ms: unix_ms(SystemTime::now()),
            last_chunk: last,
            lease_revision: 0,
            // The worktree is judged after this is kept: a restart that
            // finds only this end records the session without it.
            workspace: None,
        };
        let file = relay.spool.clone();
        let _ = tokio::task::spawn_blocking(move || {
            file.lock()
                .unwrap_or_else(|e| e.into_inner())
                .append_end(&provisional)
        })
        .await;
        let flushed = flush(shared, &id, &mut relay.publisher).await;
        let _ = done_tx.send(());
        (outcome, last, flushed)
    };
    let (kept, (outcome, last_chunk, flushed)) = tokio::join!(keeper, runner);
    // Judged once its processes are gone, before the end says so.
    let judged = workspace::judge(made).await;
    let (release, revision) = match kept {
        KeepEnd::Stopped(lease) => {
            let revision = lease.revision;
            (Some(lease), revision)
        }
        // Still ours if no one fenced it: released like a stopped one (at
        // its revision only), not left to its TTL.
        KeepEnd::GaveUp { lease, .. } => {
            let revision = lease.revision;
            (Some(lease), revision)
        }
        KeepEnd::Lost(_) => (None, 0),
    };
    let end = SessionEnd {
        session_id: id.clone(),
        agent: order.agent.clone(),
        host: host.clone(),
        outcome,
        started_ms: unix_ms(started),
        ended_ms: unix_ms(SystemTime::now()),
        last_chunk,
        lease_revision: revision,
        workspace: judged,
    };
    log(format!(
        "session {id} of {} ended: {:?}, {last_chunk} chunk(s), monotonic {}",
        order.agent,
        end.outcome,
        monotonic_ns()
    ));
    // No hook call is taken once the end is on its way.
    drop(hook_socket);
    let spool_path = relay
        .spool
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .path()
        .to_path_buf();
    drop(relay);
    if flushed && store_end(shared, &end).await {
        if let Err(e) = std::fs::remove_file(&spool_path) {
            log(format!(
                "session {id}: cannot remove {}: {e}",
                spool_path.display()
            ));
        }
    } else {
        log(format!(
            "session {id}: its output and end are kept in {} until they are stored (the next start of the worker stores them, if its lease allows)",
            spool_path.display()
        ));
    }
    if let Some(lease) = release {
        release_lease(shared, &id, &lease).await;
    }
    shared
        .running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
}

/// Waits until `rx` holds `value` (forever if its sender is gone).
async fn until(rx: &mut watch::Receiver<bool>, value: bool) {
    if rx.wait_for(|v| *v == value).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Publishes the end, retrying while NATS does not store it: until it
/// does, or, once the worker stops, for [`STOP_FLUSH`] more (its spool
/// keeps it for the next start). Whether it is stored.
async fn store_end(shared: &Shared, end: &SessionEnd) -> bool {
    let mut stop = shared.stop.clone();
    let give_up = async {
        until(&mut stop, true).await;
        tokio::time::sleep(STOP_FLUSH).await;
    };
    tokio::pin!(give_up);
    let mut said = false;
    loop {
        match shared.output.end(end).await {
            Ok(()) => return true,
            Err(e) => {
                if !said {
                    log(format!("{e}; retrying"));
                    said = true;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = &mut give_up => {
                        log(format!("{e}; given up as the worker stops"));
                        return false;
                    }
                }
            }
        }
    }
}

/// Waits for the publisher to store the session's spooled output: until it
/// has, or, once the worker stops, for [`STOP_FLUSH`] more. Whether all is
/// stored.
async fn flush(shared: &Shared, id: &str, publisher: &mut tokio::task::JoinHandle<u64>) -> bool {
    let mut stop = shared.stop.clone();
    let give_up = async {
        until(&mut stop, true).await;
        tokio::time::sleep(STOP_FLUSH).await;
    };
    tokio::select! {
        done = &mut *publisher => done.is_ok(),
        () = give_up => {
            log(format!("session {id}: its output is not all stored {STOP_FLUSH:?} after the worker was told to stop"));
            publisher.abort();
            false
        }
    }
}

/// Releases the lease, retrying while NATS does not answer (a lease left
/// behind holds its agent's next session off until its TTL, 300 s); one
/// fenced or taken since is not ours to release.
async fn release_lease(shared: &Shared, id: &str, lease: &agent_state_cluster::Lease) {
    let give_up = Instant::now() + STORE_RETRY_FOR;
    loop {
        match shared.leases.release(lease).await {
            Ok(()) => return,
            Err(e @ LeaseError::Nats { .. }) if Instant::now() < give_up => {
                log(format!(
                    "session {id}: cannot release the lease: {e}; retrying"
                ));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                log(format!("session {id}: cannot release the lease: {e}"));
                return;
            }
        }
    }
}

/// Waits for the child, its output going through `relay`, and kills its
/// group and its cgroup at the timeout, at a stall, when its spool is full,
/// when the lease is lost or when the worker stops. Returns the outcome and
/// the last chunk's number (spooled; the publisher may still be storing).
async fn supervise(
    shared: &Shared,
    id: &str,
    mut child: tokio::process::Child,
    spec: &SessionSpec,
    kill: oneshot::Receiver<Outcome>,
    relay: &mut relay::Relay,
    cgroup: Option<crate::daemon::cgroup::SessionCgroup>,
) -> (Outcome, u64) {
    let pgid = child.id().map(|p| Pid::from_raw(p as i32));
    let grace = spec
        .kill_grace_secs
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KILL_GRACE);
    let deadline = spec
        .timeout_secs
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let mut stop = shared.stop.clone();
    let timeout = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let stalled = async {
        match stall::Stall::of(spec) {
            Some(rule) => stall::watch(id, rule, relay.last_output.clone()).await,
            None => std::future::pending().await,
        }
    };
    let full = &mut relay.full;
    let outcome = tokio::select! {
        status = child.wait() => exited(status),
        () = timeout => {
            log(format!("session {id}: its timeout ({}s) is reached; ending it", spec.timeout_secs.unwrap_or(0)));
            terminate(&mut child, pgid, grace).await;
            Outcome::TimedOut
        }
        silent_for = stalled => {
            terminate(&mut child, pgid, grace).await;
            Outcome::Stalled { silent_for_secs: silent_for.as_secs() }
        }
        Ok(()) = full => {
            terminate(&mut child, pgid, grace).await;
            Outcome::SpoolFull { limit_bytes: shared.options.spool_limit }
        }
        reason = kill => {
            terminate(&mut child, pgid, grace).await;
            reason.unwrap_or(Outcome::WorkerStopped)
        }
        _ = until(&mut stop, true) => {
            terminate(&mut child, pgid, grace).await;
            Outcome::WorkerStopped
        }
    };
    // Whatever is left of the group (a background grandchild) goes too,
    // and of its cgroup (one that left the group with setsid).
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    let killed = cgroup::kill(cgroup).await;
    if killed > 0 {
        log(format!(
            "session {id}: killed {killed} process(es) left in its cgroup"
        ));
    }
    // The session's life ends here; its output may take longer to store.
    log(format!(
        "session {id}: its process group is gone, monotonic {}",
        monotonic_ns()
    ));
    let last = relay.pipes_closed(id, PIPES_CLOSE_WITHIN).await;
    (outcome, last)
}

fn exited(status: std::io::Result<std::process::ExitStatus>) -> Outcome {
    match status {
        Ok(s) => Outcome::Exited {
            code: s.code(),
            signal: s.signal(),
        },
        Err(e) => Outcome::NotStarted {
            detail: format!("cannot wait for the session's process: {e}"),
        },
    }
}

/// SIGTERM to the group, SIGKILL after `grace`.
async fn terminate(child: &mut tokio::process::Child, pgid: Option<Pid>, grace: Duration) {
    let Some(pgid) = pgid else { return };
    let _ = killpg(pgid, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn which_groups_are_pulled_and_which_checks_are_due() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let every = s(60);
        let checks: BTreeMap<String, GroupCheck> = ["a", "b"]
            .iter()
            .map(|g| {
                (
                    g.to_string(),
                    GroupCheck {
                        command: vec!["check".into()],
                        every,
                    },
                )
            })
            .collect();
        let all = groups(&["a", "b", "free"]);
        let ok = |at: Duration| Checked::after(every, None, t0 + at);
        let bad = |at: Duration| Checked::after(every, Some("logged out".into()), t0 + at);
        // (results, now, pulled, due)
        type Row = (
            Vec<(&'static str, Checked)>,
            Duration,
            Vec<&'static str>,
            Vec<&'static str>,
        );
        let table: Vec<Row> = vec![
            // At start: no check has answered; the unchecked group is pulled.
            (vec![], s(0), vec!["free"], vec!["a", "b"]),
            // a passed, b not yet answered.
            (vec![("a", ok(s(0)))], s(1), vec!["a", "free"], vec!["b"]),
            // Both passed; nothing due before `every`.
            (
                vec![("a", ok(s(0))), ("b", ok(s(0)))],
                s(59),
                vec!["a", "b", "free"],
                vec![],
            ),
            // At `every` both are due again; they still count as working.
            (
                vec![("a", ok(s(0))), ("b", ok(s(0)))],
                s(60),
                vec!["a", "b", "free"],
                vec!["a", "b"],
            ),
            // b failed: not pulled until a check passes.
            (
                vec![("a", ok(s(0))), ("b", bad(s(10)))],
                s(20),
                vec!["a", "free"],
                vec![],
            ),
            (
                vec![("a", ok(s(30))), ("b", bad(s(10)))],
                s(70),
                vec!["a", "free"],
                vec!["b"],
            ),
        ];
        for (i, (results, now, pulled, due)) in table.into_iter().enumerate() {
            let results: BTreeMap<String, Checked> = results
                .into_iter()
                .map(|(g, c)| (g.to_string(), c))
                .collect();
            assert_eq!(
                pullable(&all, &checks, &results),
                groups(&pulled),
                "row {i}"
            );
            assert_eq!(
                checks_due(&all, &checks, &results, t0 + now),
                groups(&due),
                "row {i}"
            );
        }
    }

    #[test]
    fn a_failing_check_is_run_again_within_five_minutes_and_says_why() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        assert_eq!(Checked::after(hour, None, t0).next_at, t0 + hour);
        assert_eq!(
            Checked::after(hour, Some("x".into()), t0).next_at,
            t0 + CHECK_WHILE_FAILING
        );
        let ten = Duration::from_secs(10);
        assert_eq!(Checked::after(ten, Some("x".into()), t0).next_at, t0 + ten);
        let checks = BTreeMap::from([(
            "a".to_string(),
            GroupCheck {
                command: vec!["c".into()],
                every: hour,
            },
        )]);
        let results = BTreeMap::from([(
            "a".to_string(),
            Checked::after(hour, Some("logged out".into()), t0),
        )]);
        assert_eq!(
            group_state("a", &checks, &results),
            (false, Some("its check failed: logged out".into()))
        );
        assert_eq!(
            group_state("a", &checks, &BTreeMap::new()),
            (false, Some("its check has not answered yet".into()))
        );
        assert_eq!(group_state("b", &checks, &results), (true, None));
    }
}

#[cfg(test)]
mod room_tests {
    use super::*;

    #[test]
    fn the_test_lease_timings_keep_the_order_of_the_deadlines() {
        let d = LeaseTiming::DEFAULT;
        let secs = Duration::from_secs;
        let t = timing_with(d, Some("3s"), Some("1s")).unwrap();
        assert_eq!(
            (t.renew_every, t.worker_gives_up, t.controller_fences),
            (secs(1), secs(3), secs(300))
        );
        assert_eq!(timing_with(d, None, None), Ok(d));
        for (gives_up, renews) in [
            // Renewed too rarely for the shorter give-up.
            (Some("3s"), None),
            // Given up past half the fence.
            (Some("200s"), None),
            (Some("soon"), Some("1s")),
            (None, Some("0s")),
        ] {
            assert!(
                timing_with(d, gives_up, renews).is_err(),
                "{gives_up:?} {renews:?}"
            );
        }
    }

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let table: &[(&str, Option<u64>)] = &[
            (
                "MemTotal:       16303572 kB\nMemFree:  1 kB\nMemAvailable:    8000000 kB\n",
                Some(8_000_000 * 1024),
            ),
            ("MemTotal: 1 kB\n", None),
            ("MemAvailable: lots kB\n", None),
            ("MemAvailable: 12 MB\n", None),
            ("MemAvailable: 4096\n", Some(4096)),
        ];
        for (text, want) in table {
            assert_eq!(mem_available(text), *want, "{text:?}");
        }
    }

    #[test]
    fn it_pulls_only_with_room_on_disk_and_in_memory() {
        const MIB: u64 = 1 << 20;
        let min = |disk: u64, memory: u64| Minimums {
            work_dir: "/srv/work".into(),
            disk_bytes: disk,
            memory_bytes: memory,
        };
        // (minimums, disk free, memory available, why not)
        type Row = (
            Minimums,
            std::io::Result<u64>,
            Option<u64>,
            Option<&'static str>,
        );
        let table: Vec<Row> = vec![
            (
                min(1024 * MIB, 512 * MIB),
                Ok(2048 * MIB),
                Some(1024 * MIB),
                None,
            ),
            (
                min(1024 * MIB, 512 * MIB),
                Ok(100 * MIB),
                Some(1024 * MIB),
                Some("100 MiB free on /srv/work, below --min-free-disk 1024 MiB"),
            ),
            (
                min(1024 * MIB, 512 * MIB),
                Ok(2048 * MIB),
                Some(200 * MIB),
                Some("200 MiB of memory available, below --min-free-memory 512 MiB"),
            ),
            // Exactly at the minimum is enough.
            (
                min(1024 * MIB, 512 * MIB),
                Ok(1024 * MIB),
                Some(512 * MIB),
                None,
            ),
            // Disk is said first when both are short.
            (
                min(1024 * MIB, 512 * MIB),
                Ok(0),
                Some(0),
                Some("0 MiB free on /srv/work, below --min-free-disk 1024 MiB"),
            ),
            (
                min(1024 * MIB, 0),
                Err(std::io::Error::other("ENOENT")),
                None,
                Some("cannot read the free space of /srv/work: ENOENT"),
            ),
            // 0 disables; unknown memory is not held against it.
            (min(0, 0), Ok(0), Some(0), None),
            (
                min(0, 512 * MIB),
                Err(std::io::Error::other("ENOENT")),
                None,
                None,
            ),
        ];
        for (i, (min, disk, memory, want)) in table.into_iter().enumerate() {
            assert_eq!(
                short_of_room(&min, disk, memory)
                    .as_ref()
                    .map(|(_, why)| why.as_str()),
                want,
                "row {i}"
            );
        }
    }
}
