//! A remote run's first part (issue 24): reaching the cluster, publishing
//! the order (or, followed again, publishing again one the servers never
//! stored), and waiting for a worker to take its lease, at most the
//! dispatch timeout. It can end here: stopped by the daemon, no cluster,
//! no worker in time (the order withdrawn), or an end already stored (a
//! session that ran while no controller followed it).

use std::time::Instant;

use agent_state_cluster::SessionOrder;
use tokio::sync::watch;

use super::end::{Signals, Withdrawn, ended, withdraw};
use super::{CONNECT_RETRY, Connected, Finish, POLL_WAITING, Remote, Seen, ask};
use crate::daemon::runner::{self, Ending, Orders, SessionSpec, SpawnFailure};

/// Until a worker holds the lease for `order`: the connection and the
/// lease as first seen; else how the run ended before that.
#[allow(clippy::too_many_arguments)]
pub(super) async fn until_taken<'r>(
    remote: &'r Remote,
    order: &SessionOrder,
    agent: &str,
    spec: &SessionSpec,
    output: &mut runner::Output<'_>,
    orders: &mut watch::Receiver<Orders>,
    on_host: &(dyn Fn(String) + Send + Sync),
    adopted: bool,
    signals: &mut Signals,
) -> Result<(&'r Connected, Seen), Finish> {
    let id = order.session_id.as_str();
    let dispatch_timeout = remote.settings.dispatch_timeout;
    let not_started = |why: String| {
        Finish::NotRun(Ending::SpawnFailed {
            reason: format!("not started: {why}"),
            kind: SpawnFailure::Other,
        })
    };
    // A cluster electing its leaders, or not up yet: tried again until the
    // dispatch timeout.
    let give_up = tokio::time::Instant::now() + dispatch_timeout;
    let conn = loop {
        let tried = tokio::select! {
            c = tokio::time::timeout_at(give_up, remote.connected()) => c,
            () = stopped(orders, spec.iteration) => return Err(Finish::NotRun(Ending::Stopped)),
        };
        let why = match tried {
            Ok(Ok(conn)) => break conn,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer".into(),
        };
        if tokio::time::Instant::now() + CONNECT_RETRY >= give_up {
            return Err(not_started(format!(
                "cannot reach the cluster at {} within the dispatch timeout ({}): {why}",
                remote.settings.urls.join(","),
                humantime::format_duration(dispatch_timeout)
            )));
        }
        tracing::warn!(
            agent,
            session_id = id,
            "cannot reach the cluster: {why}; trying again"
        );
        tokio::select! {
            () = tokio::time::sleep(CONNECT_RETRY) => {}
            () = stopped(orders, spec.iteration) => return Err(Finish::NotRun(Ending::Stopped)),
        }
    };
    if adopted {
        // Published by the controller before this one: its lease, its end
        // and its output are where they were.
        tracing::info!(
            agent,
            session_id = id,
            "following again the order {id} a previous controller published"
        );
    } else {
        // Test-only: the order recorded, never published (a controller
        // killed in between: tests/it/cluster_adopt.rs).
        if std::env::var_os("AGENT_STATE_TEST_HOLD_PUBLISH").is_some() {
            std::future::pending::<()>().await;
        }
        // Published again until the dispatch timeout while the servers do
        // not store it (a stream electing its leader answers "no stream
        // found" for seconds); the order's id is its `Nats-Msg-Id`, so a
        // publish stored without its answer arriving is not stored twice.
        let published = loop {
            match ask("publishing the order", conn.dispatch.publish(order)).await {
                Ok(published) => break published,
                Err(e) if tokio::time::Instant::now() + CONNECT_RETRY < give_up => {
                    tracing::warn!(agent, session_id = id, "{e}; publishing it again");
                    tokio::select! {
                        () = tokio::time::sleep(CONNECT_RETRY) => {}
                        () = stopped(orders, spec.iteration) => return Err(Finish::NotRun(Ending::Stopped)),
                    }
                }
                Err(e) => return Err(not_started(format!("the order was not stored: {e}"))),
            }
        };
        tracing::info!(
            agent,
            session_id = id,
            sequence = published.sequence,
            duplicate = published.duplicate,
            "order published to the workers of credential group {}",
            order.credential_group
        );
    }
    // Waiting for a worker to take the lease for it.
    let deadline = give_up;
    // Followed again with its order kept (`.daemon/remote.AGENT.order`):
    // published again, once stored, if the servers never stored it.
    let mut republish = adopted && !order.spec.is_null();
    let mut republished = false;
    let seen = loop {
        // Followed again: a previous controller may have recorded the order
        // and died before the servers stored it. Read first (see
        // `Dispatch::queued`): the order not in the stream, then no end and
        // no lease for it below, and it never will run.
        let mut none_queued = adopted
            && matches!(
                ask(
                    "reading the orders",
                    conn.dispatch
                        .queued(&order.credential_group, &order.session_id)
                )
                .await,
                Ok(false)
            );
        let ended_by_daemon = orders.borrow().end_of(spec.iteration);
        if let Some(why) = ended_by_daemon {
            withdraw(
                remote,
                conn,
                order,
                agent,
                Withdrawn::NotStarted("the daemon ended it before it started"),
                spec.kill_grace,
            )
            .await;
            return Err(Finish::NotRun(why));
        }
        // The lease before the end: a worker stores a session's end before
        // it gives the lease back, so an order taken (and so no longer
        // queued) whose lease is gone by now has its end stored.
        match ask("reading the lease", conn.leases.current(agent)).await {
            Ok(Some(rec)) if rec.value.session == id => {
                tracing::info!(agent, session_id = id, host = %rec.value.holder, revision = rec.revision, "the session runs on worker {}", rec.value.holder);
                on_host(rec.value.holder.clone());
                break Seen {
                    holder: rec.value.holder,
                    revision: rec.revision,
                    at: Instant::now(),
                };
            }
            Ok(_) => {}
            Err(e) => {
                none_queued = false;
                tracing::warn!(agent, session_id = id, "{e}")
            }
        }
        match ask("reading the end", conn.output.ended(id)).await {
            Ok(Some(end)) => {
                return Err(ended(conn, agent, id, end, None, None, &mut 0, output, signals).await);
            }
            Ok(None) => {}
            Err(e) => {
                none_queued = false;
                tracing::warn!(agent, session_id = id, "{e}")
            }
        }
        let gave_up = if none_queued && republish && tokio::time::Instant::now() < deadline {
            match ask("publishing the order again", conn.dispatch.publish(order)).await {
                Ok(published) => {
                    (republish, republished) = (false, true);
                    tracing::warn!(
                        agent,
                        session_id = id,
                        sequence = published.sequence,
                        duplicate = published.duplicate,
                        "the previous controller stopped before the servers stored this order: published it again to the workers of credential group {}",
                        order.credential_group
                    );
                }
                Err(e) => tracing::warn!(agent, session_id = id, "{e}; publishing it again"),
            }
            None
        } else if none_queued && republished {
            Some("the order, published again after a controller restart, is neither queued nor held nor ended: the servers had it already".to_string())
        } else if none_queued {
            Some("the previous controller stopped before the servers stored its order".to_string())
        } else if tokio::time::Instant::now() >= deadline {
            Some(format!(
                "no worker of credential group {} started it within the dispatch timeout ({}; dispatch_timeout in [cluster])",
                order.credential_group,
                humantime::format_duration(dispatch_timeout)
            ))
        } else {
            None
        };
        if let Some(why) = gave_up {
            tracing::warn!(agent, session_id = id, "{why}; the order is withdrawn");
            withdraw(
                remote,
                conn,
                order,
                agent,
                Withdrawn::NotStarted(&why),
                spec.kill_grace,
            )
            .await;
            return Err(not_started(why));
        }
        tokio::select! {
            () = tokio::time::sleep(POLL_WAITING) => {}
            _ = orders.changed() => {}
        }
    };

    Ok((conn, seen))
}

/// Resolves once the orders stop the run of `iteration` (never if the
/// channel closes).
async fn stopped(orders: &mut watch::Receiver<Orders>, iteration: u32) {
    loop {
        let ended_by_daemon = orders.borrow_and_update().end_of(iteration).is_some();
        if ended_by_daemon {
            return;
        }
        if orders.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
