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

/// One order, from its pull to its end.
pub(super) async fn session(shared: &Shared, pulled: PulledOrder) {
    let order = pulled.order.clone();
    let id = order.session_id.clone();
    let host = shared.options.host.clone();
    let pulled_at = Instant::now();
    if let Err(e) = agent_state_cluster::session::check_session(&id) {
        log(format!("{e}; the order is dropped"));
        let _ = pulled.ack().await;
        return;
    }
    // Delivered again while this worker still handles it (stopped past the
    // ack wait, then resumed: both deliveries come here). The lease cannot
    // tell the copies apart (the second reads as our own take), so the
    // second is dropped: not run, not acknowledged (the first's ack is the
    // order's).
    let Some(_handling) = Handling::begin(shared, &id) else {
        log(format!(
            "session {id} ({}): delivered again while this worker runs it; not run twice",
            order.agent
        ));
        return;
    };
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
        Err(LeaseError::Held {
            holder,
            session,
            revision,
            ..
        }) if left_behind(shared, &holder, &session) => {
            // Ours, of a session this worker no longer runs and whose spool
            // is gone (its end stored): its release was lost. Given back at
            // its revision; the order comes again at once.
            let fenced = shared.leases.fence(&order.agent, revision).await;
            log(format!(
                "session {id}: the lease run/{} is still held for {session}, which ended on this worker (its release was lost): {}; the order goes back",
                order.agent,
                match &fenced {
                    Ok(()) => "given back".to_string(),
                    Err(e) => format!("cannot give it back: {e}"),
                }
            ));
            let _ = pulled.give_back(Some(Duration::from_millis(100))).await;
            return;
        }
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
    // Its worktree, under the lease (one agent's are never made at once),
    // live (never pruned) until this order is done with it.
    let _live = match &planned {
        Some(plan) => Some(shared.worktrees.hold(plan.path.clone()).await),
        None => None,
    };
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
        // Its worktree judged once its processes are gone (under the
        // lease, still renewed), then its end beside its output, then its
        // output stored (the worker is alive, only NATS may be slow): a
        // worker that dies while NATS is away leaves the whole end, the
        // judgement included, for its next start.
        let judged = workspace::judge(made).await;
        let spooled = SessionEnd {
            session_id: id.clone(),
            agent: order.agent.clone(),
            host: host.clone(),
            outcome: outcome.clone(),
            started_ms: unix_ms(started),
            ended_ms: unix_ms(SystemTime::now()),
            last_chunk: last,
            // Renewals go on: the stored end carries the last revision.
            lease_revision: 0,
            workspace: judged.clone(),
        };
        let file = relay.spool.clone();
        let _ = tokio::task::spawn_blocking(move || {
            file.lock()
                .unwrap_or_else(|e| e.into_inner())
                .append_end(&spooled)
        })
        .await;
        let flushed = flush(shared, &id, &mut relay.publisher).await;
        let _ = done_tx.send(());
        (outcome, last, flushed, judged)
    };
    let (kept, (outcome, last_chunk, flushed, judged)) = tokio::join!(keeper, runner);
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
