//! The remote executor (issue 24): a session run on a worker host instead
//! of this one, with the shape of the local runner's ([`super::runner`]):
//! [`launch`] does the checks that never wait and opens the session log,
//! [`Launch::run`] carries the run to its [`RunReport`]: steps 1–2 below
//! in `remote/dispatch.rs`, 3–5 in `remote/follow.rs`, 6 in
//! `remote/end.rs`.
//!
//! A remote run:
//!
//! 1. publishes the order (argv, env, cwd, timeout, kill grace, prompt;
//!    `AGENT_SESSION` as `Nats-Msg-Id`: session ids are per agent) and waits for the server's ack;
//! 2. waits for a worker to take the lease `run/<agent>` for it, at most
//!    `cluster.dispatch_timeout`: then the order is withdrawn (an end
//!    stored for it, which a worker finds under the lease and does not run
//!    again) and the session ends as not started, its messages back in the
//!    inbox like any session that did not run;
//! 3. follows the output stream from chunk 1, feeding each chunk to the
//!    same [`OutputObserver`] and the same capped session log as a local
//!    run (signals, progress, usage limits, the log: unchanged);
//! 4. carries out the machine's [`Orders`] by fencing the lease (deleting
//!    it at the revision last seen): the worker learns it at its next
//!    renewal (at most `renew_every`, 10 s) and ends the session with
//!    SIGTERM, SIGKILL after the grace. There is no faster channel to the
//!    worker yet; a SIGKILL order adds nothing to the fence;
//! 5. watches the lease while it runs ([`controller_lease_action`], on the
//!    monotonic clock): one not renewed for `controller_fences` (300 s) is
//!    fenced and the session recorded "interrupted: worker lost";
//! 6. reads the worker's stored end, accepts it only from the lease's
//!    holder ([`end_accepted`]), deletes the lease, and maps the worker's
//!    [`Outcome`] to the runner's [`Ending`] ([`ending_of`]).
//!
//! Before the order is published, `.daemon/remote.AGENT` records it and
//! `.daemon/remote.AGENT.order` keeps it ([`super::adopt`]): a controller
//! that stops leaves its remote sessions running, and the next one
//! [`adopt`]s them (the lease, the end and the output read again from the
//! stream, the log rewritten from chunk 1, signals already carried out
//! left out). An adopted order the servers never stored (not queued, no
//! lease, no end) is published again from the kept copy, once.
//!
//! A session's hook calls from its worker (`session begin|end|fail`,
//! `record`, `send`) are served by [`hooks`], started once connected: run
//! here, for the lease's holder only.
//!
//! The reconcile ([`Remote::reconcile`], every 5 minutes) fences leases
//! held for orders this controller does not run.
//!
//! A session with `[agent.session.workspace]` carries its planned
//! worktree in the order; its worker makes it, runs the session in it and
//! judges it, and the end's judgement is recorded as a local one's
//! ([`workspace`]). Not yet on workers, refused with the setting to
//! change: a flow cycle's worktree, and `verify` commands (they would run
//! here, not where the session worked; a later iteration would need the
//! same worker). An agent with `runs_on = "controller"` never comes here:
//! its sessions run on the controller's host with the local runner
//! (`service/start.rs`), beside the sessions on workers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_state_cluster::{
    Cluster, ClusterError, ClusterSettings, Dispatch, DispatchError, LeaseError, LeaseTiming,
    Leases, Output as OutputStreamOf, OutputError, SessionOrder,
};

mod dispatch;
mod end;
mod follow;
mod hooks;
mod workspace;
use end::Signals;
pub use end::{end_accepted, ending_of};

use super::adopt::{self, RemoteRecord};
use super::clock::Clock;
use crate::agent_name::AgentName;
use crate::clock::Timestamp;
use crate::state::StateRoot;
use crate::workspace::WorkspaceSpec;
use tokio::sync::{OnceCell, oneshot, watch};

use super::runner::{
    self, Ending, Launched, Orders, OutputObserver, RunReport, SessionSpec, SpawnFailure,
};

/// How often the lease and the end are read while an order waits for a
/// worker, and while its session runs.
const POLL_WAITING: Duration = Duration::from_millis(250);
/// The host an end the controller stores itself names (an order withdrawn,
/// a lost worker's session fenced).
const CONTROLLER_HOST: &str = "controller";
const POLL_RUNNING: Duration = Duration::from_millis(500);
/// How long the rest of the output may take to arrive once the end is
/// stored (the worker stores every chunk before its end).
const CHUNKS_AFTER_END: Duration = Duration::from_secs(10);
/// A follow that gives no chunk for this long once the end is stored is
/// taken as stalled, and the output replayed [`REPLAYS`] times at most.
const CHUNK_STALL: Duration = Duration::from_secs(3);
const REPLAYS: usize = 3;
/// After a SIGKILL order, how long past the worker's next renewal its end
/// is waited for.
const KILL_ANSWER: Duration = Duration::from_secs(5);
/// How long after a failed connection the next try is made.
const CONNECT_RETRY: Duration = Duration::from_secs(1);
/// How many times the lease is read at a session's end before it is taken
/// as unreadable.
const LEASE_READS: u32 = 3;
/// How long one NATS request may take before it counts as failed.
const ASK_WITHIN: Duration = Duration::from_secs(10);

/// The cluster this daemon dispatches its sessions to: connected on first
/// use (a daemon starts without NATS; the first session waits for it, at
/// most its dispatch timeout), then shared by every session.
pub struct Remote {
    settings: ClusterSettings,
    timing: LeaseTiming,
    /// The daemon's clock, for the times of an order it withdraws.
    clock: Clock,
    /// The config the sessions' hook calls run with.
    config: std::path::PathBuf,
    connected: OnceCell<Connected>,
    /// The orphan leases the last reconcile saw: `(agent, order)`.
    orphans: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
    /// The worker registry as last read, for the metrics.
    fleet: std::sync::Mutex<Option<super::fleet::Fleet>>,
}

/// What went wrong talking to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Workers(#[from] agent_state_cluster::workers::WorkersError),
    #[error("cannot listen for the sessions' hook calls: {0}")]
    Hooks(String),
    #[error("{what}: no answer from NATS within {within:?}")]
    NoAnswer {
        what: &'static str,
        within: Duration,
    },
}

/// Why a session cannot be ordered from a worker at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("the session command is empty")]
    NoCommand,
    #[error(
        "not started: this run's workspace was not planned for a worker; set local_sessions = true in [cluster] or remove the workspace"
    )]
    Workspace,
    #[error(
        "not started: a flow cycle's step (its worktree on branch {branch}) cannot run on a worker yet: the flow opens, publishes and removes that worktree on the controller; set runs_on = \"controller\" for this agent (its sessions run on the controller's host), local_sessions = true in [cluster], or take the agent out of the flow"
    )]
    FlowCycle { branch: String },
    #[error(
        "not started: a session with `verify` commands cannot run on a worker yet: they would run on the controller, not where the session worked; set runs_on = \"controller\" for this agent (its sessions run on the controller's host), local_sessions = true in [cluster], or remove [agent.session.iteration] verify"
    )]
    Verify,
    #[error("the session's spec names no agent or session id")]
    NoIds,
    #[error(
        "not started: the {what} {value:?} cannot be part of a NATS subject (letters, digits, - and _ only), so it cannot run on a worker"
    )]
    NotSubjectSafe { what: &'static str, value: String },
}

struct Connected {
    dispatch: Dispatch,
    leases: Leases,
    output: OutputStreamOf,
    workers: agent_state_cluster::workers::Workers,
}

impl Remote {
    /// The executor of `[cluster]` when this host runs no session itself
    /// (`local_sessions = false`); `None` otherwise.
    pub fn of(
        settings: Option<&ClusterSettings>,
        clock: Clock,
        config: &std::path::Path,
    ) -> Option<Arc<Remote>> {
        let settings = settings.filter(|s| !s.local_sessions)?;
        let mut timing = LeaseTiming::DEFAULT;
        // A test hook (a lost worker cannot be waited 300 s for in a test);
        // operators never set it.
        if let Some(fences) = std::env::var("AGENT_STATE_TEST_CONTROLLER_FENCES")
            .ok()
            .and_then(|t| humantime::parse_duration(&t).ok())
        {
            timing.controller_fences = fences;
        }
        Some(Arc::new(Remote {
            settings: settings.clone(),
            timing,
            clock,
            config: config.to_path_buf(),
            connected: OnceCell::new(),
            orphans: Default::default(),
            fleet: Default::default(),
        }))
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The reconcile (every 5 minutes): the leases held on the cluster
    /// against the sessions this controller runs (`running`: by agent, its
    /// session id). A lease held for an order
    /// it does not run is said; seen so again at the next reconcile, it is
    /// fenced, so that its worker ends that session and the agent's next
    /// order can run ([`agent_state_cluster::reconcile`]). A cluster that
    /// cannot be reached is said and left for the next time.
    pub async fn reconcile(&self, running: BTreeMap<String, String>) {
        let conn = match ask("connecting", self.connected()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "reconcile: cannot reach the cluster: {e}; tried again at the next reconcile"
                );
                return;
            }
        };
        let leases = match ask("listing the leases", conn.leases.all()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("reconcile: {e}; tried again at the next reconcile");
                return;
            }
        };
        let before = self
            .orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let found = agent_state_cluster::reconcile(&leases, &running, &before);
        for o in &found.watch {
            tracing::warn!(agent = %o.agent, host = %o.holder, "reconcile: the lease run/{} is held by {} for order {}, which this controller does not run; fenced at the next reconcile if it still is", o.agent, o.holder, o.order);
        }
        let mut remember = found.remember;
        for o in &found.fence {
            match ask("fencing the lease", conn.leases.fence(&o.agent, o.revision)).await {
                Ok(()) => {
                    tracing::warn!(agent = %o.agent, host = %o.holder, "reconcile: fenced the lease run/{} of order {} on {}, which this controller does not run (seen at two reconciles): that worker ends the session", o.agent, o.order, o.holder)
                }
                // Renewed between the read and the fence: still an orphan,
                // fenced at the next reconcile.
                Err(e) => {
                    tracing::warn!(agent = %o.agent, "reconcile: {e}; tried again at the next reconcile");
                    remember.insert((o.agent.clone(), o.order.clone()));
                }
            }
        }
        tracing::info!(
            "reconcile: {} lease(s) held, {} session(s) of this controller, {} orphan(s) seen, {} fenced",
            leases.len(),
            running.len(),
            found.watch.len(),
            found.fence.len()
        );
        *self.orphans.lock().unwrap_or_else(|e| e.into_inner()) = remember;
    }

    /// Read the worker registry for the metrics ([`super::fleet`]); a
    /// failed read is kept as such (the registry gauge says 0).
    pub async fn refresh_fleet(&self) {
        let read = match ask("connecting", self.connected()).await {
            Ok(conn) => match ask("reading the worker registry", conn.workers.list()).await {
                Ok(entries) => Ok(entries),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        let fleet = match read {
            Ok(entries) => super::fleet::Fleet {
                workers: super::fleet::view(&entries, self.clock.now().into()),
                error: None,
            },
            Err(e) => {
                tracing::debug!("the worker registry cannot be read for the metrics: {e}");
                super::fleet::Fleet {
                    workers: Vec::new(),
                    error: Some(e),
                }
            }
        };
        *self.fleet.lock().unwrap_or_else(|e| e.into_inner()) = Some(fleet);
    }

    /// The worker registry as last read (`None`: not yet).
    pub fn fleet(&self) -> Option<super::fleet::Fleet> {
        self.fleet.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn connected(&self) -> Result<&Connected, RemoteError> {
        self.connected
            .get_or_try_init(|| async {
                let name = format!(
                    "agent-state controller {}",
                    std::fs::read_to_string("/proc/sys/kernel/hostname")
                        .map(|h| h.trim().to_string())
                        .unwrap_or_default()
                );
                let cluster = Cluster::connect(&self.settings, &name).await?;
                let connected = Connected {
                    dispatch: cluster.dispatch().await?,
                    leases: cluster.leases(self.timing).await?,
                    output: cluster.output().await?,
                    workers: cluster.workers().await?,
                };
                // Before any order goes out: its session's hook calls need
                // an answer from its first line.
                hooks::HookService {
                    client: cluster.client().clone(),
                    settings: self.settings.clone(),
                    leases: connected.leases.clone(),
                    config: self.config.clone(),
                }
                .start()
                .await
                .map_err(|e| RemoteError::Hooks(e.to_string()))?;
                Ok(connected)
            })
            .await
    }
}

/// Where a session runs: this host, or a worker of `remote` that has a
/// working credential of `group`.
#[derive(Clone)]
pub struct Target {
    pub remote: Arc<Remote>,
    /// The agent's credential group (`session.credential`).
    pub group: String,
    /// Told the worker's name once one runs the session (status,
    /// daemon.json).
    pub on_host: Arc<dyn Fn(String) + Send + Sync>,
    /// Where its order is recorded for the next controller.
    pub keep: Keep,
    /// Its planned worktree, which the worker makes (none: no workspace).
    pub workspace: Option<WorkspaceSpec>,
    /// Its agent has `verify` commands: refused ([`Unfit::Verify`]).
    pub verify: bool,
}

/// `.daemon/remote.AGENT` of one session ([`super::adopt`]).
#[derive(Clone)]
pub struct Keep {
    pub root: StateRoot,
    pub agent: AgentName,
    pub session_id: String,
}

impl Keep {
    /// Before the record: what a next controller publishes again if the
    /// servers never stored it.
    fn save_order(&self, order: &SessionOrder) {
        if let Err(e) = adopt::write_order(&self.root, &self.agent, order) {
            tracing::warn!(agent = %self.agent, session_id = %self.session_id, "{e}; a controller restarted before the servers stored the order ends the session not started instead of publishing it again");
        }
    }

    fn save(&self, record: &RemoteRecord) {
        if let Err(e) = adopt::write(&self.root, &self.agent, record) {
            tracing::warn!(agent = %self.agent, session_id = %self.session_id, "{e}; a controller restarted while it runs records it interrupted instead of following it");
        }
    }
}

/// A session launched: a local process, or an order about to be published.
pub enum Launch {
    Local(Launched),
    Remote(RemoteRun),
}

/// A remote run's facts, checked by [`launch`].
pub struct RemoteRun {
    remote: Arc<Remote>,
    on_host: Arc<dyn Fn(String) + Send + Sync>,
    order: SessionOrder,
    agent: String,
    spec: SessionSpec,
    log: tokio::fs::File,
    /// Its record, kept up to date as its signals are carried out.
    record: RemoteRecord,
    keep: Keep,
    /// Adopted from a previous controller: not published again, its log
    /// rewritten from the stream.
    adopted: bool,
}

/// [`runner::launch`] on this host (`target` `None`), or the checks and
/// the log of a run on a worker. On failure, the report of a session that
/// did not run.
pub fn launch(
    spec: SessionSpec,
    orders: &watch::Receiver<Orders>,
    target: Option<&Target>,
) -> Result<Launch, Box<RunReport>> {
    let Some(target) = target else {
        return runner::launch(spec, orders).map(Launch::Local);
    };
    runner::ignore_sigpipe();
    let not_run = |ending: Ending| Box::new(RunReport::not_run(ending));
    let refused = |reason: String| {
        not_run(Ending::SpawnFailed {
            reason,
            kind: SpawnFailure::Other,
        })
    };
    if orders.borrow().stop {
        return Err(not_run(Ending::Stopped));
    }
    if target.verify {
        return Err(refused(Unfit::Verify.to_string()));
    }
    let order = order_of(&spec, &target.group, target.workspace.as_ref())
        .map_err(|e| refused(e.to_string()))?;
    let log = match runner::open_log(&spec.log_path) {
        Ok(file) => file,
        Err(e) => {
            return Err(refused(format!(
                "cannot open the session log {}: {e}",
                spec.log_path.display()
            )));
        }
    };
    let record = RemoteRecord {
        session_id: target.keep.session_id.clone(),
        order_id: order.session_id.clone(),
        group: order.credential_group.clone(),
        iteration: spec.iteration.max(1),
        published_at: Timestamp::from_datetime(target.remote.clock.now()),
        signals_through: 0,
    };
    Ok(Launch::Remote(RemoteRun {
        remote: target.remote.clone(),
        on_host: target.on_host.clone(),
        agent: order.agent.clone(),
        order,
        spec,
        log,
        record,
        keep: target.keep.clone(),
        adopted: false,
    }))
}

/// A remote session a previous controller left running, as `record` says,
/// followed again: `spec` gives its log, its output cap and its kill grace.
pub fn adopt(
    spec: SessionSpec,
    target: &Target,
    record: RemoteRecord,
) -> Result<Launch, Box<RunReport>> {
    runner::ignore_sigpipe();
    let log = runner::reopen_log(&spec.log_path).map_err(|e| {
        Box::new(RunReport::not_run(Ending::Lost {
            reason: format!(
                "interrupted: the controller restarted and cannot open the session log {}: {e}",
                spec.log_path.display()
            ),
        }))
    })?;
    // Kept to be published again if the servers never stored it; without
    // it (no spec) such a session ends "not started".
    let kept = match adopt::read_order(&target.keep.root, &target.keep.agent, &record) {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!(agent = %target.keep.agent, session_id = %record.session_id, "{e}");
            None
        }
    };
    let order = kept.unwrap_or_else(|| SessionOrder {
        session_id: record.order_id.clone(),
        agent: target.keep.agent.to_string(),
        credential_group: record.group.clone(),
        spec: serde_json::Value::Null,
    });
    Ok(Launch::Remote(RemoteRun {
        remote: target.remote.clone(),
        on_host: target.on_host.clone(),
        agent: target.keep.agent.to_string(),
        order,
        spec,
        log,
        record,
        keep: target.keep.clone(),
        adopted: true,
    }))
}

fn env_of<'a>(spec: &'a SessionSpec, name: &str) -> Option<&'a str> {
    spec.env
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The order of `spec` (in its `planned` worktree, if any) for the
/// workers of `group`, or why it cannot run on one.
fn order_of(
    spec: &SessionSpec,
    group: &str,
    planned: Option<&WorkspaceSpec>,
) -> Result<SessionOrder, Unfit> {
    let Some(command) = spec.argv.first() else {
        return Err(Unfit::NoCommand);
    };
    if let Some(unfit) = planned.and_then(workspace::refusal) {
        return Err(unfit);
    }
    if planned.is_none() && env_of(spec, "AGENT_STATE_WORKSPACE").is_some() {
        return Err(Unfit::Workspace);
    }
    let (Some(agent), Some(session)) = (
        env_of(spec, "AGENT_STATE_AGENT"),
        env_of(spec, "AGENT_STATE_SESSION_ID"),
    ) else {
        return Err(Unfit::NoIds);
    };
    // Each run (iteration) is an order of its own.
    let id = agent_state_cluster::order_id(agent, session, spec.iteration);
    let subject_safe = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    for (what, value) in [
        ("agent name", agent),
        ("session id", id.as_str()),
        ("credential group", group),
    ] {
        if !subject_safe(value) {
            return Err(Unfit::NotSubjectSafe {
                what,
                value: value.to_string(),
            });
        }
    }
    let mut env: BTreeMap<String, String> = spec.env.iter().cloned().collect();
    let (name, value) = &spec.marker;
    if !name.is_empty() {
        env.insert(name.clone(), value.clone());
    }
    let ceil_secs = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let remote = agent_state_cluster::SessionSpec {
        command: command.clone(),
        args: spec.argv[1..].to_vec(),
        env,
        cwd: Some(spec.cwd.display().to_string()),
        timeout_secs: Some(ceil_secs(spec.timeout).max(1)),
        kill_grace_secs: Some(ceil_secs(spec.kill_grace)),
        stdin: (!spec.stdin.is_empty()).then(|| String::from_utf8_lossy(&spec.stdin).into_owned()),
        workspace: planned.map(workspace::order_of),
        // The worker keeps the stall timer where the output is (this
        // controller's machine keeps its own too, as a backstop: it sees
        // the output later, through the stream).
        stall_timeout_secs: spec.agent_stall_timeout.map(|d| ceil_secs(d).max(1)),
        stall_action: spec.agent_stall_timeout.map(|_| match spec.stall_action {
            runner::StallAction::Warn => agent_state_cluster::StallAction::Warn,
            runner::StallAction::Stop => agent_state_cluster::StallAction::Stop,
        }),
        memory_max: spec.memory_max,
    };
    Ok(SessionOrder {
        session_id: id,
        agent: agent.to_string(),
        credential_group: group.to_string(),
        spec: serde_json::to_value(&remote).expect("a spec serialises"),
    })
}

impl Launch {
    /// The second half: the run to its end, carrying out the `orders`.
    /// `spawned` hears the pid of a local run (a remote one has none here).
    pub async fn run(
        self,
        observer: &mut dyn OutputObserver,
        orders: watch::Receiver<Orders>,
        spawned: Option<oneshot::Sender<u32>>,
    ) -> RunReport {
        match self {
            Launch::Local(launched) => launched.run(observer, orders, spawned).await,
            Launch::Remote(run) => run.run(observer, orders).await,
        }
    }
}

/// How the run ended, before the report.
enum Finish {
    /// It never ran on a worker.
    NotRun(Ending),
    /// It ran (or may have); the ending.
    Ran(Ending),
}

/// The lease of a running remote session as the controller last saw it.
struct Seen {
    holder: String,
    revision: u64,
    /// When this revision was first seen (monotonic).
    at: Instant,
}

impl RemoteRun {
    async fn run(
        self,
        observer: &mut dyn OutputObserver,
        mut orders: watch::Receiver<Orders>,
    ) -> RunReport {
        let RemoteRun {
            remote,
            on_host,
            order,
            agent,
            spec,
            log,
            record,
            keep,
            adopted,
        } = self;
        let id = order.session_id.clone();
        let started = Instant::now();
        // Adopted, its log (emptied by `reopen_log`) is written again from
        // the stream's first chunk: it equals the worker's output,
        // whatever the last controller wrote.
        if !adopted {
            keep.save_order(&order);
            keep.save(&record);
        }
        observer.hold_signals();
        let mut output = runner::Output::new(log, &spec.log_path, spec.max_output, observer);
        let mut signals = Signals {
            record,
            keep,
            workspace: None,
        };
        // Until a worker holds the lease, then to the end.
        let taken = dispatch::until_taken(
            &remote,
            &order,
            &agent,
            &spec,
            &mut output,
            &mut orders,
            &*on_host,
            adopted,
            &mut signals,
        )
        .await;
        let finish = match taken {
            Ok((conn, seen)) => {
                follow::to_end(
                    &remote,
                    conn,
                    &order,
                    &agent,
                    &spec,
                    &mut output,
                    &mut orders,
                    seen,
                    &mut signals,
                )
                .await
            }
            Err(finish) => finish,
        };
        output.observer.release_signals(true);
        let finished = output.finish().await;
        let (ending, ran) = match finish {
            Finish::NotRun(ending) => (ending, false),
            Finish::Ran(ending) => (ending, true),
        };
        tracing::info!(agent = %agent, session_id = %id, "remote session ended: {ending}");
        RunReport {
            ending,
            pid: None,
            output_bytes: finished.output_bytes,
            logged_bytes: finished.logged_bytes,
            truncated: finished.truncated,
            duration: if ran {
                started.elapsed()
            } else {
                Duration::ZERO
            },
            leftovers_killed: 0,
            log_error: finished.log_error,
            stalls: finished.stalls,
            oom: None,
            workspace: signals.workspace.take().map(Box::new),
        }
    }
}

/// Bounds one NATS request.
async fn ask<T, E: Into<RemoteError>>(
    what: &'static str,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, RemoteError> {
    match tokio::time::timeout(ASK_WITHIN, work).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(RemoteError::NoAnswer {
            what,
            within: ASK_WITHIN,
        }),
    }
}

#[cfg(test)]
mod tests;
