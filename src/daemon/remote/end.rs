//! A remote run's end (issue 24): the output fed chunk by chunk, once
//! ([`feed`]); a stored end read with the rest of the output, the lease's
//! holder checked and the lease deleted ([`ended`]); an order the
//! controller gives up on withdrawn ([`withdraw`]); and the pure rules
//! deciding what the end is worth ([`end_accepted`], [`ending_of`]).

use std::time::{Duration, Instant};

use agent_state_cluster::{
    LeaseRecord, Outcome, SessionEnd, SessionOrder, WorkspaceEnd, end_is_from_holder,
};

use super::adopt::RemoteRecord;
use super::{
    CHUNK_STALL, CHUNKS_AFTER_END, CONTROLLER_HOST, Connected, Finish, KILL_ANSWER, Keep,
    LEASE_READS, POLL_WAITING, REPLAYS, Remote, Seen, ask, workspace,
};
use crate::daemon::runner::{self, Ending, OutputStream, SpawnFailure};

/// The session's record and how far its signals went; and its worktree
/// as its worker judged it, once its end is read.
pub(super) struct Signals {
    pub(super) record: RemoteRecord,
    pub(super) keep: Keep,
    pub(super) workspace: Option<crate::daemon::workspaces::Outcome>,
}

/// One chunk to the log and the observer, once and in order. Its signals
/// are carried out unless a previous controller did (`signals_through`);
/// the record says they are before they go.
pub(super) async fn feed(
    output: &mut runner::Output<'_>,
    fed: &mut u64,
    chunk: agent_state_cluster::Chunk,
    signals: &mut Signals,
) {
    if chunk.number <= *fed {
        return;
    }
    *fed = chunk.number;
    let stream = match chunk.pipe.as_str() {
        "stderr" => OutputStream::Stderr,
        _ => OutputStream::Stdout,
    };
    output.take(stream, &chunk.data).await;
    if output.observer.held_signals() == 0 {
        return;
    }
    let done_before = chunk.number <= signals.record.signals_through;
    if !done_before {
        signals.record.signals_through = chunk.number;
        let (keep, record) = (signals.keep.clone(), signals.record.clone());
        let _ = tokio::task::spawn_blocking(move || keep.save(&record)).await;
    }
    output.observer.release_signals(!done_before);
}

/// The end is stored: the rest of the output, the holder's check, the
/// lease deleted, the ending. `fed`: the last chunk `follow` gave.
#[allow(clippy::too_many_arguments)]
pub(super) async fn ended(
    conn: &Connected,
    agent: &str,
    id: &str,
    end: SessionEnd,
    seen: Option<&Seen>,
    follow: Option<&mut agent_state_cluster::Follow>,
    fed: &mut u64,
    output: &mut runner::Output<'_>,
    signals: &mut Signals,
) -> Finish {
    // The chunks not yet read: followed to the last while they come, then
    // replayed afresh (from chunk 1: `feed` skips what was taken already).
    // A follow can stall without an error when a NATS server dies under
    // it, while every chunk is stored before the end (the worker's order of
    // things): a replay reads them from the stream's other servers.
    if let Some(follow) = follow {
        read_rest(follow, fed, end.last_chunk, output, signals, CHUNK_STALL).await;
    }
    for _ in 0..REPLAYS {
        if *fed >= end.last_chunk {
            break;
        }
        match ask("replaying the output", conn.output.follow(id)).await {
            Ok(mut follow) => {
                read_rest(
                    &mut follow,
                    fed,
                    end.last_chunk,
                    output,
                    signals,
                    CHUNKS_AFTER_END,
                )
                .await
            }
            Err(e) => tracing::warn!(agent, session_id = id, "{e}"),
        }
    }
    if *fed < end.last_chunk {
        tracing::warn!(
            agent,
            session_id = id,
            "read {fed} of its {} output chunks",
            end.last_chunk
        );
    }
    // Read again while NATS does not answer (a leader election takes
    // seconds): an unread lease would be taken for a released one, and one
    // left at a revision the end does not carry would not be deleted.
    let mut lease = None;
    for attempt in 1..=LEASE_READS {
        match ask("reading the lease", conn.leases.current(agent)).await {
            Ok(l) => {
                lease = l;
                break;
            }
            Err(e) if attempt < LEASE_READS => {
                tracing::info!(agent, session_id = id, "{e}; reading it again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => tracing::warn!(agent, session_id = id, "{e}"),
        }
    }
    let accepted = end_accepted(&end, lease.as_ref(), seen.map(|s| s.revision));
    // A lease naming this session is deleted even when its end is refused:
    // a worker stores an end only once the session's process is gone, and
    // a renewal stored without its answer reaching the worker leaves the
    // lease at a revision its end does not carry (left alone, it would hold
    // the agent's next sessions off until its TTL).
    if let Some(rec) = lease.as_ref().filter(|r| r.value.session == end.session_id)
        && let Err(e) = ask("deleting the lease", conn.leases.fence(agent, rec.revision)).await
    {
        tracing::debug!(
            agent,
            session_id = id,
            "the lease was released meanwhile: {e}"
        );
    }
    let mut ending = ending_of(&end, accepted, lease.as_ref().map(|r| r.revision));
    // Its worktree, as a local run's: the failure's code when it could not
    // be made, else its judgement (a fact about the worktree, recorded
    // whichever way the session ended).
    match &end.workspace {
        Some(WorkspaceEnd::NotMade { code, .. }) => {
            if let Ending::SpawnFailed { kind, .. } = &mut ending {
                *kind = SpawnFailure::Workspace(workspace::code_of(code));
            }
        }
        Some(WorkspaceEnd::Judged(judged)) => {
            signals.workspace = Some(workspace::outcome_of(judged))
        }
        None => {}
    }
    match end.outcome {
        Outcome::NotStarted { .. } => Finish::NotRun(ending),
        _ => Finish::Ran(ending),
    }
}

/// Feeds `follow`'s chunks until chunk `last`, or until none came for
/// `stall`, or the follow ends.
async fn read_rest(
    follow: &mut agent_state_cluster::Follow,
    fed: &mut u64,
    last: u64,
    output: &mut runner::Output<'_>,
    signals: &mut Signals,
    stall: Duration,
) {
    while *fed < last {
        match tokio::time::timeout(stall, follow.next()).await {
            Ok(Some(Ok(chunk))) => feed(output, fed, chunk, signals).await,
            _ => return,
        }
    }
}

/// The end the controller stores for an order it gave up on: never run
/// (`Withdrawn::NotStarted`), or ended by the controller after it fenced
/// the lease at `revision` (`Withdrawn::Lost`).
pub(super) enum Withdrawn<'a> {
    NotStarted(&'a str),
    Lost { reason: &'a str, revision: u64 },
}

/// The daemon no longer wants the order: an end stored for it (which a
/// worker reads under the lease and does not run, however late the order
/// comes back to one: a worker that gave it back before it started, a
/// redelivery after a cut), and a lease already taken for it fenced.
/// `grace`: the session's kill grace (a started one is waited for).
pub(super) async fn withdraw(
    remote: &Remote,
    conn: &Connected,
    order: &SessionOrder,
    agent: &str,
    why: Withdrawn<'_>,
    grace: Duration,
) {
    let now = u64::try_from(remote.clock.now().timestamp_millis()).unwrap_or(0);
    let (outcome, lease_revision) = match why {
        Withdrawn::NotStarted(why) => (
            Outcome::NotStarted {
                detail: format!("withdrawn by the controller: {why}"),
            },
            0,
        ),
        Withdrawn::Lost { reason, revision } => (
            Outcome::LeaseLost {
                detail: reason.to_string(),
            },
            revision,
        ),
    };
    let end = SessionEnd {
        session_id: order.session_id.clone(),
        agent: agent.to_string(),
        host: CONTROLLER_HOST.into(),
        outcome,
        started_ms: now,
        ended_ms: now,
        last_chunk: 0,
        lease_revision,
        workspace: None,
    };
    if let Err(e) = ask("withdrawing the order", conn.output.end(&end)).await {
        tracing::warn!(agent, session_id = %order.session_id, "{e}");
    }
    if let Ok(Some(rec)) = ask("reading the lease", conn.leases.current(agent)).await
        && rec.value.session == order.session_id
    {
        tracing::warn!(agent, session_id = %order.session_id, "worker {} took the order as it was withdrawn; fencing its lease", rec.value.holder);
        let _ = ask("fencing the lease", conn.leases.fence(agent, rec.revision)).await;
        // It may have started the session: the worker ends it at its next
        // renewal and stores its end once the session's processes are gone.
        // That end is waited for (bounded), so the agent's next session
        // never runs beside this one.
        let from = Instant::now();
        let until = from + remote.timing.renew_every + grace + KILL_ANSWER;
        loop {
            if let Ok(Some(end)) =
                ask("reading the end", conn.output.ended(&order.session_id)).await
                && end.host != CONTROLLER_HOST
            {
                tracing::info!(agent, session_id = %order.session_id, "worker {} ended the withdrawn order: {:?}", end.host, end.outcome);
                break;
            }
            if Instant::now() >= until {
                tracing::warn!(agent, session_id = %order.session_id, "worker {} stored no end for the withdrawn order within {:?}; it ends the session when it cannot renew the lease", rec.value.holder, from.elapsed());
                break;
            }
            tokio::time::sleep(POLL_WAITING).await;
        }
    }
}

/// Whether the controller records the worker's end: from the lease's
/// current holder ([`end_is_from_holder`]), or, the holder having released
/// the lease after storing its end (the worker's order of things), carrying
/// a revision no older than the last this controller saw. A session that
/// never started holds no lease and has nothing to prove.
pub fn end_accepted(end: &SessionEnd, lease: Option<&LeaseRecord>, last_seen: Option<u64>) -> bool {
    if matches!(end.outcome, Outcome::NotStarted { .. }) && end.lease_revision == 0 {
        return true;
    }
    let ours = lease.filter(|r| r.value.session == end.session_id);
    if end_is_from_holder(end.lease_revision, ours.map(|r| r.revision)) {
        return true;
    }
    ours.is_none() && end.lease_revision > 0 && end.lease_revision >= last_seen.unwrap_or(0)
}

/// The runner's ending for a worker's end. `accepted`: from the lease's
/// holder ([`end_accepted`]); `lease_now`: the lease's revision when read.
pub fn ending_of(end: &SessionEnd, accepted: bool, lease_now: Option<u64>) -> Ending {
    let host = &end.host;
    if !accepted {
        return Ending::Lost {
            reason: format!(
                "interrupted: worker lost: the end from {host} carries lease revision {}, but the lease is {}",
                end.lease_revision,
                lease_now.map_or("gone".to_string(), |r| format!("at revision {r}"))
            ),
        };
    }
    match &end.outcome {
        Outcome::Exited {
            code: Some(code), ..
        } => Ending::Exited { code: *code },
        Outcome::Exited {
            code: None,
            signal: Some(signal),
        } => Ending::Signaled { signal: *signal },
        Outcome::Exited {
            code: None,
            signal: None,
        } => Ending::Exited { code: -1 },
        Outcome::TimedOut => Ending::TimedOut,
        // As the local path records its stall: the machine's stall stop.
        Outcome::Stalled { silent_for_secs } => Ending::Stalled {
            silent_for: Duration::from_secs(*silent_for_secs),
        },
        Outcome::WorkerRestarted => Ending::Lost {
            reason: format!(
                "interrupted: worker restarted: {host} restarted while the session ran and killed what was left of it"
            ),
        },
        Outcome::SpoolFull { limit_bytes } => Ending::Lost {
            reason: format!(
                "interrupted: output not stored: {host} ended the session when its output spool passed {} MiB while NATS stored none of it",
                limit_bytes >> 20
            ),
        },
        // Stored by the controller itself: its own reason, as it recorded it.
        Outcome::LeaseLost { detail } if host == CONTROLLER_HOST => Ending::Lost {
            reason: detail.clone(),
        },
        Outcome::LeaseLost { detail } => Ending::Lost {
            reason: format!("interrupted: worker lost: {host} lost the session's lease: {detail}"),
        },
        Outcome::WorkerStopped => Ending::Lost {
            reason: format!(
                "interrupted: worker lost: {host} was stopped and ended the session (SIGTERM)"
            ),
        },
        Outcome::NotStarted { detail } => Ending::SpawnFailed {
            reason: format!("not started on {host}: {detail}"),
            kind: SpawnFailure::Other,
        },
        Outcome::Unknown => Ending::Lost {
            reason: format!(
                "interrupted: {host} ended the session in a way this controller does not know (a newer worker's end): upgrade the controller to the workers' version"
            ),
        },
    }
}
