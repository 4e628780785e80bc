//! The worker's side of a lease while its session runs: renew on time, and
//! return the moment the session must die. The decisions are
//! [`crate::liveness::worker_lease_action`]'s; this is the thin async layer
//! that carries them out, sleeping until the next deadline (never a tick).
//!
//! [`keep`] returns only when the lease is lost, or when `stop` resolves
//! (the session ended: the caller then releases the lease it gets back).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::lease::{Lease, LeaseError, Leases};
use crate::liveness::{LeaseTiming, WorkerLeaseAction, worker_lease_action};

/// How long a failed renewal waits before the next try (NATS unreachable,
/// a leader being elected); the give-up deadline bounds the tries.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why [`keep`] returned.
#[derive(Debug)]
pub enum KeepEnd {
    /// `stop` resolved: the lease as last renewed, for the end's revision
    /// and the release.
    Stopped(Lease),
    /// The lease was fenced or taken by another: kill the session now.
    Lost(LeaseError),
    /// No renewal went through for `worker_gives_up`: kill the session now
    /// (the controller fences the lease later, at `controller_fences`).
    GaveUp {
        lease: Lease,
        last_error: Option<String>,
    },
}

/// Keeps `lease` (taken at `taken_at`, the instant read before the take)
/// until `stop` resolves or the lease is lost.
pub async fn keep(
    leases: &Leases,
    timing: LeaseTiming,
    lease: Lease,
    taken_at: Instant,
    stop: impl Future<Output = ()>,
) -> KeepEnd {
    keep_sharing(leases, timing, lease, taken_at, stop, &AtomicU64::new(0)).await
}

/// [`keep`], storing each revision it holds in `revision` (the worker
/// stamps a session's hook calls with it).
pub async fn keep_sharing(
    leases: &Leases,
    timing: LeaseTiming,
    mut lease: Lease,
    taken_at: Instant,
    stop: impl Future<Output = ()>,
    revision: &AtomicU64,
) -> KeepEnd {
    revision.store(lease.revision, Ordering::SeqCst);
    let mut renewed_at = taken_at;
    let mut last_error = None;
    let mut retry_at: Option<Instant> = None;
    tokio::pin!(stop);
    loop {
        let now = Instant::now();
        let wake = match worker_lease_action(&timing, renewed_at, now) {
            WorkerLeaseAction::KillSession => {
                return KeepEnd::GaveUp { lease, last_error };
            }
            WorkerLeaseAction::Hold { until } => until,
            WorkerLeaseAction::Renew if retry_at.is_some_and(|at| at > now) => {
                retry_at.expect("checked")
            }
            WorkerLeaseAction::Renew => {
                let sent = Instant::now();
                // A renewal stuck past the give-up deadline must not keep
                // the session alive: it is bounded by what is left.
                let left = (renewed_at + timing.worker_gives_up).saturating_duration_since(sent);
                match tokio::time::timeout(left, leases.renew(&lease)).await {
                    Ok(Ok(renewed)) => {
                        lease = renewed;
                        revision.store(lease.revision, Ordering::SeqCst);
                        renewed_at = sent;
                        retry_at = None;
                        continue;
                    }
                    Ok(Err(e @ LeaseError::Stale { .. })) => return KeepEnd::Lost(e),
                    Ok(Err(e)) => last_error = Some(e.to_string()),
                    Err(_) => last_error = Some(format!("no answer within {left:?}")),
                }
                let at = Instant::now() + RETRY_AFTER;
                retry_at = Some(at);
                at
            }
        };
        let deadline = wake.min(renewed_at + timing.worker_gives_up);
        tokio::select! {
            () = &mut stop => return KeepEnd::Stopped(lease),
            () = tokio::time::sleep_until(deadline.into()) => {}
        }
    }
}
