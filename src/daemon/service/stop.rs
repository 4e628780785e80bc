//! `agent-state stop AGENT`: an operator's stop of a running session,
//! carried out through its machine's path of a timeout (SIGTERM to the
//! session's process group and cgroup, SIGKILL after `kill_grace`), and
//! recorded as `SESSION_STOPPED`: not retried, no backoff, no escalation,
//! its messages returned without counting an attempt (the hooks do that
//! from the code the observer notes in session.json before the SIGTERM),
//! and waiting for the next wake (`Core::stop_requested`).

use super::*;
use crate::daemon::stop::{self, StopRequest};

/// Carry out the requests of `agent-state stop` waiting in `.daemon/`
/// (at SIGUSR1, and on the reconcile scan): each is removed once looked
/// at, whether it stopped a session or named one that is not running.
pub(super) fn stop_requests(
    root: &StateRoot,
    core: &mut Core,
    running: &mut BTreeMap<AgentName, Running>,
    now: DateTime<Utc>,
) {
    let pending = match stop::pending(root) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!("cannot read the stop requests: {e}");
            return;
        }
    };
    for agent in pending {
        match stop::read(root, &agent) {
            Ok(Some(request)) => stop_request(root, core, running, now, &agent, request),
            Ok(None) => {}
            Err(e) => tracing::warn!(agent = %agent, "{e}; request dropped"),
        }
        if let Err(e) = stop::done(root, &agent) {
            tracing::warn!(agent = %agent, "cannot remove the stop request: {e}");
        }
    }
}

fn stop_request(
    root: &StateRoot,
    core: &mut Core,
    running: &mut BTreeMap<AgentName, Running>,
    now: DateTime<Utc>,
    agent: &AgentName,
    request: StopRequest,
) {
    let sid = &request.session_id;
    let Some(running) = running.get_mut(agent) else {
        tracing::info!(agent = %agent, "a stop of session {sid} was asked, but the daemon runs no session of {agent}; request dropped");
        return;
    };
    if &running.session_id != sid {
        tracing::info!(agent = %agent, "a stop of session {sid} was asked, but the session running is {}; request dropped", running.session_id);
        return;
    }
    if running.recording {
        tracing::info!(agent = %agent, session_id = %sid, "a stop was asked, but the session has ended already (its end is being recorded)");
        return;
    }
    if let Some(why) = &running.stop_reason {
        tracing::info!(agent = %agent, session_id = %sid, "a stop was asked, but the session is being stopped already: {why}");
        return;
    }
    let why = request.describe();
    tracing::warn!(agent = %agent, session_id = %sid, "stopping the session: {why}");
    // Its process not started yet (a worktree being made), or its
    // verification running (its machine says): no runner will note the
    // stop before a SIGTERM, so it is noted here, for the record to carry
    // the code.
    let unstarted =
        (running.pid.is_none() && running.host.is_none()) || running.machine.is_verifying();
    running.stop_with(why.clone(), Some(Code::SessionStopped));
    core.stop_requested(agent);
    if unstarted {
        let now = Timestamp::from_datetime(now);
        let note = hooks::DaemonEnding {
            outcome: "error".into(),
            reason: why,
            by_pid: std::process::id(),
            at: now,
            code: Some(Code::SessionStopped.as_str().to_string()),
        };
        if let Err(e) = hooks::note_daemon_ending(&root.agent(agent), sid, &note, now) {
            tracing::warn!(agent = %agent, session_id = %sid, "cannot note the stop in session.json: {e}");
        }
    }
}
