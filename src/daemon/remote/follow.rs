//! A remote run's second part (issue 24): a worker holds the lease, the
//! session runs. Its output is fed as it comes; the daemon's orders (a
//! timeout, a stop) fence the lease so the worker ends it; a lease not
//! renewed for `controller_fences` is fenced and the session recorded
//! "interrupted: worker lost"; a stored end is read ([`super::end`]).

use std::time::{Duration, Instant};

use agent_state_cluster::{
    ControllerLeaseAction, LeaseError, SessionOrder, controller_lease_action,
};
use tokio::sync::watch;

use super::end::{Signals, Withdrawn, ended, feed, withdraw};
use super::{Connected, Finish, KILL_ANSWER, POLL_RUNNING, Remote, RemoteError, Seen, ask};
use crate::daemon::runner::{self, Ending, Orders, SessionSpec};

/// Follows the session `seen` holds until its end.
#[allow(clippy::too_many_arguments)]
pub(super) async fn to_end(
    remote: &Remote,
    conn: &Connected,
    order: &SessionOrder,
    agent: &str,
    spec: &SessionSpec,
    output: &mut runner::Output<'_>,
    orders: &mut watch::Receiver<Orders>,
    mut seen: Seen,
    signals: &mut Signals,
) -> Finish {
    let id = order.session_id.as_str();
    let mut follow = match ask("following the output", conn.output.follow(id)).await {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(agent, session_id = id, "{e}; its output is read at its end");
            None
        }
    };
    let mut fed = 0u64;
    // Why the daemon ended it (its fence), as the local runner's SIGTERM.
    let mut ordered: Option<Ending> = None;
    let mut fenced_at: Option<Instant> = None;
    // When waiting for the fenced session's end stops.
    let mut give_up_at: Option<Instant> = None;
    let mut orders_open = true;
    let mut poll = tokio::time::interval(POLL_RUNNING);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            chunk = next_chunk(&mut follow) => match chunk {
                Some(Ok(chunk)) => feed(output, &mut fed, chunk, signals).await,
                Some(Err(e)) => {
                    tracing::warn!(agent, session_id = id, "{e}; its output is read at its end");
                    follow = None;
                }
                None => follow = None,
            },
            changed = orders.changed(), if orders_open => {
                if changed.is_err() {
                    orders_open = false;
                    continue;
                }
                let now = orders.borrow_and_update().clone();
                if ordered.is_none() && let Some(why) = now.end_of(spec.iteration) {
                    output.observer.on_terminate(&why);
                    tracing::warn!(agent, session_id = id, host = %seen.holder, "session {why}; fencing its lease (revision {}) so that worker {} ends it", seen.revision, seen.holder);
                    fence_for_order(conn, agent, id, seen.revision).await;
                    ordered = Some(why);
                    fenced_at = Some(Instant::now());
                    give_up_at = Some(Instant::now() + remote.timing.worker_gives_up + spec.kill_grace);
                }
                if now.kills(spec.iteration) && fenced_at.is_some() {
                    // The grace ran out: the worker ends it at its next
                    // renewal at the latest; waited for that long only.
                    let soon = Instant::now() + remote.timing.renew_every + KILL_ANSWER;
                    if give_up_at.is_none_or(|g| g > soon) {
                        give_up_at = Some(soon);
                    }
                }
            }
            _ = poll.tick() => {
                match ask("reading the end", conn.output.ended(id)).await {
                    Ok(Some(end)) => {
                        let finish = ended(conn, agent, id, end, Some(&seen), follow.as_mut(), &mut fed, output, signals).await;
                        return match (ordered, finish) {
                            (Some(why), Finish::Ran(_)) => Finish::Ran(why),
                            (_, finish) => finish,
                        };
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(agent, session_id = id, "{e}"),
                }
                if let (Some(at), Some(until)) = (fenced_at, give_up_at) {
                    // Fenced for an order: the worker ends it at its next
                    // renewal; one that does not say so in time is taken
                    // as ended as ordered (it kills the session itself
                    // once it cannot renew).
                    if Instant::now() >= until {
                        tracing::warn!(agent, session_id = id, host = %seen.holder, "worker {} stored no end within {:?} of the fence", seen.holder, humantime::format_duration(Duration::from_secs(at.elapsed().as_secs())));
                        let ending = ordered.unwrap_or(Ending::Stopped);
                        // Its end, stored by the controller: an order that
                        // comes back to a worker later is not run.
                        let reason = format!("{ending} (ended by the controller: worker {} stored no end within {:?} of the fence)", seen.holder, humantime::format_duration(Duration::from_secs(at.elapsed().as_secs())));
                        withdraw(remote, conn, order, agent, Withdrawn::Lost { reason: &reason, revision: seen.revision }, spec.kill_grace).await;
                        return Finish::Ran(ending);
                    }
                    continue;
                }
                match ask("reading the lease", conn.leases.current(agent)).await {
                    Ok(Some(rec)) if rec.value.session == id && rec.revision != seen.revision => {
                        seen = Seen { holder: rec.value.holder, revision: rec.revision, at: Instant::now() };
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(agent, session_id = id, "{e}"),
                }
                if let ControllerLeaseAction::Fence { revision } =
                    controller_lease_action(&remote.timing, seen.revision, seen.at, Instant::now())
                {
                    match ask("fencing the lease", conn.leases.fence(agent, revision)).await {
                        // Renewed after all (our reads missed it): alive.
                        Err(RemoteError::Lease(LeaseError::Stale { current: Some(now), .. })) => {
                            seen = Seen { holder: seen.holder, revision: now, at: Instant::now() };
                            continue;
                        }
                        Err(e) => tracing::warn!(agent, session_id = id, "{e}"),
                        Ok(()) => {}
                    }
                    let reason = format!(
                        "interrupted: worker lost: {} did not renew the lease run/{agent} for {}; the lease was fenced",
                        seen.holder,
                        humantime::format_duration(remote.timing.controller_fences)
                    );
                    tracing::warn!(agent, session_id = id, "{reason}");
                    // Its end, stored by the controller before the agent's
                    // next session: the lost worker may have given the
                    // order back unstarted (a read that timed out under the
                    // lease), and a worker pulling it again reads that end
                    // and does not run it; one that took the lease for it
                    // meanwhile is fenced and waited for.
                    withdraw(remote, conn, order, agent, Withdrawn::Lost { reason: &reason, revision }, spec.kill_grace).await;
                    return Finish::Ran(Ending::Lost { reason });
                }
            }
        }
    }
}

/// Deletes the lease of session `id` so that its worker ends it: at the
/// revision last seen, or, renewed since, at its current one.
async fn fence_for_order(conn: &Connected, agent: &str, id: &str, revision: u64) {
    let mut revision = revision;
    for _ in 0..3 {
        match ask("fencing the lease", conn.leases.fence(agent, revision)).await {
            Ok(()) => return,
            Err(RemoteError::Lease(LeaseError::Stale { .. })) => {
                match ask("reading the lease", conn.leases.current(agent)).await {
                    Ok(Some(rec)) if rec.value.session == id => revision = rec.revision,
                    // Gone already (released at its end, or fenced).
                    _ => return,
                }
            }
            Err(e) => {
                tracing::warn!(agent, session_id = id, "{e}");
                return;
            }
        }
    }
}

async fn next_chunk(
    follow: &mut Option<agent_state_cluster::Follow>,
) -> Option<Result<agent_state_cluster::Chunk, agent_state_cluster::OutputError>> {
    match follow {
        Some(f) => f.next().await,
        None => std::future::pending().await,
    }
}
