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
mod credentials;
mod hooks;
mod prune;
mod recover;
mod relay;
mod room;
mod run;
mod spawn;
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

use credentials::check_credentials;
pub use credentials::{Checked, GroupCheck, checks_due, group_state, pullable};
pub use room::{Minimums, mem_available, short_of_room};
use room::{ROOM_RECHECK, room_now};
use run::{session, store_end};

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
    /// Its config's agents with a workspace: the worktrees it prunes.
    pub prune: Vec<crate::daemon::workspaces::PruneJob>,
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
    /// The orders this worker handles now, from their pull to their end
    /// ([`run::Handling`]): a second delivery of one (the server's ack wait
    /// passed while the worker was stopped) is never run beside it.
    handling: Mutex<std::collections::BTreeSet<String>>,
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
    /// The worktrees its sessions run in (never pruned meanwhile).
    worktrees: prune::Worktrees,
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
    #[error(
        "another worker runs as --host {host}: its record worker/{host} in the registry was written again while this one started (agent-state {version}, {slots} slot(s)); give every worker a host name of its own (the leases and the spool recovery count on it)"
    )]
    DuplicateHost {
        host: String,
        version: String,
        slots: usize,
    },
}

/// Whether another live worker has this worker's host name
/// ([`agent_state_cluster::name_check`]): a recent record is watched, and
/// one written again meanwhile (not a clean stop) is another worker's.
/// `Ok(false)`: told to stop while watching. A registry that cannot be
/// read is said and not checked (NATS is the worker's to wait for).
async fn name_is_ours(
    workers: &Workers,
    host: &str,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, WorkerError> {
    let first = match workers.get(host).await {
        Ok(entry) => entry,
        Err(e) => {
            log(format!(
                "cannot read the registry: {e}; the host name is not checked"
            ));
            return Ok(true);
        }
    };
    let agent_state_cluster::NameCheck::Watch(window) =
        agent_state_cluster::name_check(first.as_ref(), SystemTime::now())
    else {
        return Ok(true);
    };
    log(format!(
        "the registry has a recent record of {host}: watching it for {window:?} in case another worker runs under this name"
    ));
    notify(&[sd_notify::NotifyState::Status(
        "starting: checking that no other worker runs under this host name",
    )]);
    tokio::select! {
        _ = tokio::time::sleep(window) => {}
        _ = until(stop, true) => return Ok(false),
    }
    match (first, workers.get(host).await) {
        (Some(before), Ok(Some(now))) if now.revision != before.revision && !now.record.stopped => {
            Err(WorkerError::DuplicateHost {
                host: host.to_string(),
                version: now.record.version,
                slots: now.record.slots,
            })
        }
        _ => Ok(true),
    }
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
    // Before its leases or spools are touched: a second worker of one
    // name would take the first one's leases for its own.
    if !name_is_ours(&workers, &options.host, &mut stop).await? {
        return Ok(());
    }
    let hooks = match hooks::Hooks::new(
        cluster.client().clone(),
        settings.clone(),
        SystemTime::now(),
    ) {
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
        handling: Mutex::new(Default::default()),
        checks: Mutex::new(BTreeMap::new()),
        not_pulling: Mutex::new(None),
        drained: drained_rx,
        stop: stop_rx.clone(),
        spool_dir,
        hooks,
        worktrees: prune::Worktrees::default(),
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
    let pruner = tokio::spawn(prune::worktrees(shared.clone(), stop_rx.clone()));
    pull(&shared, &queues).await;
    let _ = checker.await;
    let _ = pruner.await;
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

/// Waits until `rx` holds `value` (forever if its sender is gone).
async fn until(rx: &mut watch::Receiver<bool>, value: bool) {
    if rx.wait_for(|v| *v == value).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
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
}
