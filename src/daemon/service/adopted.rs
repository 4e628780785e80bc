//! Remote sessions a previous controller left running, followed again
//! ([`crate::daemon::adopt`]): the daemon takes the session over (its
//! owner lock, session.json's owner, its claimed messages), gives it a
//! [`Running`] and a task, and the task follows the order on the cluster
//! ([`remote::adopt`]) to its end, recorded as any session's. And the
//! other half: a controller that stops leaves them running.

use super::start::{Begun, RECOVERY_WAIT};
use super::*;
use crate::daemon::adopt::RemoteRecord;
use crate::daemon::remote;
use crate::owner::{self, Owner, OwnerLock};

/// Follow again `agent`'s remote session of `record`. One that cannot
/// be taken over is recovered as before: interrupted, its messages
/// returned. (At start, before the loop: a function of the daemon's parts,
/// not one more method of it.)
pub(super) fn adopt(daemon: &mut Daemon, agent: &AgentName, record: RemoteRecord) {
    let (Some(cfg), Some(remote)) = (daemon.agent_config(agent).cloned(), daemon.remote.clone())
    else {
        return;
    };
    let dir = daemon.root.agent(agent);
    let now = Timestamp::from_datetime(daemon.clock.now());
    let (session, owner_lock, claimed) = match take_over(&dir, &record) {
        Ok(taken) => taken,
        Err(e) => {
            tracing::warn!(agent = %agent, session_id = %record.session_id, "cannot follow again the session a previous controller ran on a worker: {e}; recorded interrupted");
            let result = hooks::recover_stale(
                &cfg,
                &dir.clone().with_lock_wait(RECOVERY_WAIT),
                "interrupted: daemon restarted",
                now,
            );
            daemon.raise_each(recovered(&cfg, result, "the daemon restarted"));
            ending::forget_remote(&daemon.root, agent, &record.session_id);
            return;
        }
    };
    let sid = session.session_id.clone();
    tracing::info!(
        agent = %agent,
        session_id = %sid,
        order = %record.order_id,
        "session {sid} runs on a worker (order {}): followed again after the controller's restart",
        record.order_id
    );
    daemon.core.session_started(agent, &sid);
    let (mut running, side) = Running::begun(
        Begun {
            session_id: sid.clone(),
            instance: session.instance.clone().unwrap_or_default(),
            started_at: session.started_at.unwrap_or(now),
            owner_lock: Some(owner_lock),
            claimed,
            conversation: None,
        },
        &cfg,
        daemon.streaks.get(agent).cloned().unwrap_or_default(),
        daemon.session_clock,
    );
    // Its timeout from now: the worker keeps the session's own (the
    // order carries it); this one is the controller's backstop.
    running.feed(machine::Event::Launched);
    running.on_worker = true;
    daemon.running.insert(agent.clone(), running);
    if let Err(e) = daemon.watcher.watch_session(agent, &dir.path) {
        tracing::warn!(agent = %agent, session_id = %sid, "its script's own session end is heard only when it exits: {e}");
    }
    let spec = runner::SessionSpec {
        argv: Vec::new(),
        env: Vec::new(),
        env_remove: Vec::new(),
        cwd: PathBuf::new(),
        stdin: Vec::new(),
        log_path: dir.sessions_dir().join(format!("{sid}.log")),
        max_output: cfg.session.max_output,
        iteration: record.iteration.max(1),
        timeout: cfg.session.timeout,
        kill_grace: cfg.session.kill_grace,
        stall_timeout: None,
        stall_action: Default::default(),
        marker: (String::new(), String::new()),
        agent_stall_timeout: None,
        memory_max: None,
    };
    let tx = daemon.tx.clone();
    let target = remote::Target {
        remote,
        group: record.group.clone(),
        on_host: {
            let (tx, agent) = (tx.clone(), agent.clone());
            std::sync::Arc::new(move |host| {
                let agent = agent.clone();
                let _ = tx.send(Event::SessionHost { agent, host });
            })
        },
        keep: remote::Keep {
            root: daemon.root.clone(),
            agent: agent.clone(),
            session_id: sid.clone(),
        },
        // Its order carries it already; its end, the judgement.
        workspace: None,
        verify: false,
    };
    let launched = remote::adopt(spec, &target, record);
    let name = agent.clone();
    tokio::spawn(async move {
        let mut observer = Observer::new(cfg, dir, sid, tx.clone(), &side);
        let mut report = match launched {
            Ok(l) => l.run(&mut observer, side.orders, None).await,
            Err(report) => *report,
        };
        observer.finish();
        let output = observer.summary();
        // Its worktree as its worker judged it (a workspace session).
        let workspace = report.workspace.take();
        let _ = tx.send(Event::SessionDone {
            agent: name,
            report: Box::new(report),
            output: Box::new(output),
            workspace,
            iterations: iterations::Tally {
                count: 1,
                ..Default::default()
            },
        });
    });
}

/// A controller stopping in cluster mode: its remote sessions are left
/// running on their workers (the next controller adopts them), except
/// those being ended (stopped, or their end being recorded), which it
/// waits for, and those on this host (`runs_on = "controller"`), which
/// stop with it. Returns how many it left.
pub(super) fn leave_remote_sessions(running: &mut BTreeMap<AgentName, Running>) -> usize {
    let leave: Vec<AgentName> = running
        .iter()
        .filter(|(_, r)| r.on_worker && !r.recording && r.stop_reason.is_none())
        .map(|(a, _)| a.clone())
        .collect();
    for agent in &leave {
        if let Some(r) = running.remove(agent) {
            tracing::info!(agent = %agent, session_id = %r.session_id, host = r.host.as_deref().unwrap_or(""), "session {} left running on {} for the next controller", r.session_id, r.host.as_deref().unwrap_or("its worker (not started yet)"));
        }
    }
    leave.len()
}

/// Take over `record`'s session under the agent's lock: still running,
/// its owner gone; its owner lock taken and session.json naming this
/// daemon as its owner. Returns the session, the lock and what it claimed
/// (bodies dropped).
fn take_over(
    dir: &AgentDir,
    record: &RemoteRecord,
) -> Result<(Session, OwnerLock, Vec<crate::inbox::Message>)> {
    let lock = dir.lock_within(RECOVERY_WAIT)?;
    let sid = &record.session_id;
    let mut session = dir
        .read::<Session>()?
        .filter(|s| s.is_running() && &s.session_id == sid)
        .ok_or_else(|| Error::Data(format!("session {sid} is no longer running")))?;
    if owner::probe(dir, sid) == owner::Probe::Held {
        return Err(Error::Data(format!(
            "the owner lock of session {sid} is held by another process"
        )));
    }
    let me = Owner::me();
    let owner_lock = owner::acquire(dir, sid, &me)?;
    session.owner_pid = Some(me.pid);
    session.owner_start = me.start;
    dir.save(&lock, &session)?;
    let claimed = crate::inbox::claimed(dir, sid)?
        .into_iter()
        .map(|(_, m)| crate::inbox::Message {
            body: String::new(),
            extra: Default::default(),
            ..m
        })
        .collect();
    Ok((session, owner_lock, claimed))
}
