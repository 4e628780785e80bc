//! One session order on this worker, start to end: the checks of its
//! spec and worktree, the lease, the spool and the process, its
//! supervision (timeout, stall, lease, stop) and its end, stored.

use super::*;

/// An order this worker handles, in [`Shared::handling`] while this lives.
pub(super) struct Handling<'a> {
    shared: &'a Shared,
    id: String,
}

impl<'a> Handling<'a> {
    /// `None` if the order is handled already.
    fn begin(shared: &'a Shared, id: &str) -> Option<Handling<'a>> {
        let mut set = shared.handling.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(id.to_string()).then(|| Handling {
            shared,
            id: id.to_string(),
        })
    }
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.shared
            .handling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Whether a lease held by `holder` for order `session` is one this worker
/// left behind: its own host's, for an order it does not handle now, with
/// no spool file (a spool is made before a session's process starts and
/// removed only once its end is stored; a leftover one is the recovery's).
/// No process of that session can run here, so the lease fences nothing.
fn left_behind(shared: &Shared, holder: &str, session: &str) -> bool {
    holder == shared.options.host
        && !shared
            .handling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(session)
        && agent_state_cluster::session::check_session(session).is_ok()
        && matches!(
            std::fs::symlink_metadata(super::spool::path(&shared.spool_dir, session)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        )
}

/// The order's names, for each step's log lines and ends.
struct Names<'a> {
    shared: &'a Shared,
    id: String,
    agent: String,
    host: String,
}

impl Names<'_> {
    /// Its end when it did not start.
    fn not_started(&self, detail: String) -> SessionEnd {
        SessionEnd {
            session_id: self.id.clone(),
            agent: self.agent.clone(),
            host: self.host.clone(),
            outcome: Outcome::NotStarted { detail },
            started_ms: unix_ms(SystemTime::now()),
            ended_ms: unix_ms(SystemTime::now()),
            last_chunk: 0,
            lease_revision: 0,
            workspace: None,
        }
    }

    /// Ends the order with `end` without running it: stored, then the
    /// order acknowledged.
    async fn refuse(&self, pulled: PulledOrder, end: SessionEnd) {
        store_end(self.shared, &end).await;
        let _ = pulled.ack().await;
    }
}

/// One order, from its pull to its end: its checks, its lease, its
/// worktree, its process, and [`run_to_end`].
pub(super) async fn session(shared: &Shared, pulled: PulledOrder) {
    let pulled_at = Instant::now();
    let id = pulled.order.session_id.clone();
    if let Err(e) = agent_state_cluster::session::check_session(&id) {
        log(format!("{e}; the order is dropped"));
        let _ = pulled.ack().await;
        return;
    }
    let names = Names {
        shared,
        id: id.clone(),
        agent: pulled.order.agent.clone(),
        host: shared.options.host.clone(),
    };
    // Delivered again while this worker still handles it (stopped past the
    // ack wait, then resumed: both deliveries come here). The lease cannot
    // tell the copies apart (the second reads as our own take), so the
    // second is dropped: not run, not acknowledged (the first's ack is the
    // order's).
    let Some(_handling) = Handling::begin(shared, &id) else {
        log(format!(
            "session {id} ({}): delivered again while this worker runs it; not run twice",
            names.agent
        ));
        return;
    };
    let Some((pulled, spec, planned)) = checked(&names, pulled).await else {
        return;
    };
    let taken_at = Instant::now();
    let Some((pulled, lease)) = leased(&names, pulled).await else {
        return;
    };
    // Its worktree, under the lease (one agent's are never made at once),
    // live (never pruned) until this order is done with it.
    let _live = match &planned {
        Some(plan) => Some(shared.worktrees.hold(plan.path.clone()).await),
        None => None,
    };
    let Some((pulled, made)) = worktree(&names, pulled, planned, &lease).await else {
        return;
    };

    let live_from = monotonic_ns();
    let launch = spawn::Launch {
        id: &id,
        agent: &names.agent,
        host: &names.host,
        spec: &spec,
        dir: match &made {
            Some((_, ws)) => Some(ws.path.as_path()),
            None => spec.cwd.as_deref().map(std::path::Path::new),
        },
        revision: lease.revision,
        at: SystemTime::now(),
    };
    let started = match spawn::start(shared, launch).await {
        Ok(started) => started,
        Err(e) => {
            let detail = e.to_string();
            log(format!("session {id} ({}): {detail}", names.agent));
            let end = SessionEnd {
                workspace: workspace::judge(made).await,
                ..names.not_started(detail)
            };
            store_end(shared, &end).await;
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.ack().await;
            return;
        }
    };
    let pid = started.child.id().unwrap_or(0);
    log(format!(
        "session {id} of {} started: pid {pid}, lease revision {}, {:.1} ms after its pull, monotonic {live_from}",
        names.agent,
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
                agent: names.agent.clone(),
                started_ms: unix_ms(started.at),
            },
        );
    if let Err(e) = pulled.ack().await {
        // The lease keeps a second copy from starting; the stored end keeps
        // it from running once this one is over.
        log(format!("session {id}: {e}"));
    }
    run_to_end(&names, &spec, started, made, lease, taken_at).await;
    shared
        .running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
}

/// The order's spec and planned worktree, checked; an order that fails
/// them ends "not started" here (`None`).
async fn checked(
    names: &Names<'_>,
    pulled: PulledOrder,
) -> Option<(
    PulledOrder,
    SessionSpec,
    Option<crate::workspace::WorkspaceSpec>,
)> {
    let (id, agent, shared) = (&names.id, &names.agent, names.shared);
    let spec = SessionSpec::from_order(&pulled.order.spec).and_then(|spec| {
        // A worktree's is made later, and checked there.
        if let Some(cwd) = spec.cwd.as_ref().filter(|_| spec.workspace.is_none()) {
            agent_state_cluster::session::check_cwd(std::path::Path::new(cwd))?;
        }
        Ok(spec)
    });
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => {
            let detail = e.to_string();
            log(format!("session {id} ({agent}): {detail}"));
            names.refuse(pulled, names.not_started(detail)).await;
            return None;
        }
    };
    let planned = workspace::check(
        agent,
        &spec,
        &shared.options.workspaces,
        &shared.options.config,
    )
    .and_then(|p| {
        p.as_ref()
            .map(|p| workspace::no_links(&p.path))
            .transpose()?;
        Ok(p)
    });
    match planned {
        Ok(planned) => Some((pulled, spec, planned)),
        Err(refused) => {
            log(format!("session {id} ({agent}): {refused}"));
            let end = SessionEnd {
                workspace: Some(refused.end()),
                ..names.not_started(refused.reason)
            };
            names.refuse(pulled, end).await;
            None
        }
    }
}

/// The order's worktree made, if it has one (under its lease); one that
/// cannot be made ends the order "not started" here (`None`).
async fn worktree(
    names: &Names<'_>,
    pulled: PulledOrder,
    planned: Option<crate::workspace::WorkspaceSpec>,
    lease: &agent_state_cluster::Lease,
) -> Option<(
    PulledOrder,
    Option<(std::path::PathBuf, crate::workspace::Workspace)>,
)> {
    let (id, agent) = (&names.id, &names.agent);
    let Some(plan) = planned else {
        return Some((pulled, None));
    };
    let _ = pulled.in_progress().await;
    let repo = plan.repo.clone();
    match workspace::make(plan).await {
        Ok(ws) => {
            log(format!(
                "session {id} of {agent}: worktree {} on branch {}",
                ws.path.display(),
                ws.branch
            ));
            Some((pulled, Some((repo, ws))))
        }
        Err((detail, ws_end)) => {
            log(format!("session {id} ({agent}): {detail}"));
            let end = SessionEnd {
                workspace: Some(ws_end),
                ..names.not_started(detail)
            };
            store_end(names.shared, &end).await;
            release_lease(names.shared, id, lease).await;
            let _ = pulled.ack().await;
            None
        }
    }
}

/// The lease `run/<agent>` taken for the order, which has not run yet;
/// `None`: the order went back, or ended, as the lease or its stored end
/// said.
async fn leased(
    names: &Names<'_>,
    pulled: PulledOrder,
) -> Option<(PulledOrder, agent_state_cluster::Lease)> {
    let (id, agent, shared) = (&names.id, &names.agent, names.shared);
    // The in-progress ack and the take travel together: the order stays
    // this worker's while it prepares, and the lease, not the ack, keeps a
    // second copy out (invariant 25). An order the server would not extend
    // goes back as before, its lease released.
    let (progress, lease) = tokio::join!(
        pulled.in_progress(),
        shared.leases.take(agent, &names.host, id)
    );
    if let Err(e) = progress {
        log(format!(
            "session {id} ({agent}): {e}; it will be handed out again"
        ));
        if let Ok(lease) = &lease {
            release_lease(shared, id, lease).await;
        }
        return None;
    }
    let lease = match lease {
        Ok(lease) => lease,
        Err(LeaseError::Held {
            holder,
            session,
            revision,
            ..
        }) if left_behind(shared, &holder, &session) => {
            // Ours, of a session this worker no longer runs and whose spool
            // is gone (its end stored): its release was lost. Given back at
            // its revision; the order comes again at once.
            let fenced = shared.leases.fence(agent, revision).await;
            log(format!(
                "session {id}: the lease run/{agent} is still held for {session}, which ended on this worker (its release was lost): {}; the order goes back",
                match &fenced {
                    Ok(()) => "given back".to_string(),
                    Err(e) => format!("cannot give it back: {e}"),
                }
            ));
            let _ = pulled.give_back(Some(Duration::from_millis(100))).await;
            return None;
        }
        Err(e @ LeaseError::Held { .. }) => {
            log(format!(
                "session {id}: {e}; the order goes back for {HELD_DELAY:?}"
            ));
            let _ = pulled.give_back(Some(HELD_DELAY)).await;
            return None;
        }
        Err(e @ LeaseError::InvalidAgent { .. }) => {
            log(format!("session {id}: {e}"));
            names.refuse(pulled, names.not_started(e.to_string())).await;
            return None;
        }
        Err(e) => {
            log(format!("session {id}: {e}; the order goes back"));
            let _ = pulled.give_back(Some(Duration::from_secs(1))).await;
            return None;
        }
    };
    // Under the lease: has this session already run?
    match shared.output.ended(id).await {
        Ok(None) => Some((pulled, lease)),
        Ok(Some(end)) => {
            log(format!(
                "session {id} already ended on {}; not run again",
                end.host
            ));
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.ack().await;
            None
        }
        Err(e) => {
            log(format!("session {id}: {e}; the order goes back"));
            let _ = shared.leases.release(&lease).await;
            let _ = pulled.give_back(Some(Duration::from_secs(1))).await;
            None
        }
    }
}

/// The started session supervised under its lease, kept by renewals,
/// until it ends; then its worktree judged, its end spooled, its output
/// and end stored, and its lease given back.
async fn run_to_end(
    names: &Names<'_>,
    spec: &SessionSpec,
    started: spawn::Started,
    made: Option<(std::path::PathBuf, crate::workspace::Workspace)>,
    lease: agent_state_cluster::Lease,
    taken_at: Instant,
) {
    let (id, shared) = (&names.id, names.shared);
    let spawn::Started {
        child,
        mut relay,
        hook_socket,
        cgroup: session_cgroup,
        at: started,
        revision,
    } = started;
    let end_of = |outcome: Outcome, last_chunk: u64, lease_revision: u64, workspace| SessionEnd {
        session_id: id.clone(),
        agent: names.agent.clone(),
        host: names.host.clone(),
        outcome,
        started_ms: unix_ms(started),
        ended_ms: unix_ms(SystemTime::now()),
        last_chunk,
        lease_revision,
        workspace,
    };
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
        let (outcome, last) =
            supervise(shared, id, child, spec, kill_rx, &mut relay, session_cgroup).await;
        // Its worktree judged once its processes are gone (under the
        // lease, still renewed), then its end beside its output, then its
        // output stored (the worker is alive, only NATS may be slow): a
        // worker that dies while NATS is away leaves the whole end, the
        // judgement included, for its next start. Renewals go on: the
        // stored end carries the last revision.
        let judged = workspace::judge(made).await;
        let spooled = end_of(outcome.clone(), last, 0, judged.clone());
        let file = relay.spool.clone();
        let _ = tokio::task::spawn_blocking(move || {
            file.lock()
                .unwrap_or_else(|e| e.into_inner())
                .append_end(&spooled)
        })
        .await;
        let flushed = flush(shared, id, &mut relay.publisher).await;
        let _ = done_tx.send(());
        (outcome, last, flushed, judged)
    };
    let (kept, (outcome, last_chunk, flushed, judged)) = tokio::join!(keeper, runner);
    let release = match kept {
        KeepEnd::Stopped(lease) => Some(lease),
        // Still ours if no one fenced it: released like a stopped one (at
        // its revision only), not left to its TTL.
        KeepEnd::GaveUp { lease, .. } => Some(lease),
        KeepEnd::Lost(_) => None,
    };
    let revision = release.as_ref().map_or(0, |l| l.revision);
    let end = end_of(outcome, last_chunk, revision, judged);
    log(format!(
        "session {id} of {} ended: {:?}, {last_chunk} chunk(s), monotonic {}",
        names.agent,
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
        if let Some(lease) = release {
            release_lease(shared, id, &lease).await;
        }
    } else {
        // The lease stays: the next start of this worker finishes the
        // spool under it (a lease given back would leave the end to the
        // controller's fence, "worker lost"); the controller fences it at
        // its TTL if this worker does not come back.
        log(format!(
            "session {id}: its output and end are kept in {} until they are stored (the next start of the worker stores them, if its lease allows); its lease is kept for that",
            spool_path.display()
        ));
    }
}

/// Publishes the end, retrying while NATS does not store it: until it
/// does, or, once the worker stops, for [`STOP_FLUSH`] more (its spool
/// keeps it for the next start). Whether it is stored.
pub(super) async fn store_end(shared: &Shared, end: &SessionEnd) -> bool {
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
