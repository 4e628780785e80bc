//! When a lease counts as lost: the worker's side (renew, or kill the
//! session) and the controller's side (wait, or fence the lease), as pure
//! functions over monotonic instants the caller passes in.
//!
//! The two clocks are on different hosts and never compared. What keeps two
//! copies of one agent's session from overlapping is the order of the
//! deadlines, each measured from the same event as seen by each side:
//!
//! - the worker counts from the instant it *sent* the last renewal the
//!   server confirmed (not from the confirmation: the server stored the
//!   write after it was sent, so the worker's count starts earlier);
//! - the controller counts from the instant it *saw* the lease's revision
//!   change (which is after the server stored it).
//!
//! So the worker's 120 s end before the controller's 300 s begin to run
//! out, with 180 s to spare for a slow kill and for the two clocks' rates.
//! The per-key TTL the server keeps (nats-server 2.11 and later) is set to
//! the controller's fence time: the backstop when the controller is down.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::lease::LeaseRecord;

/// The three times of issue 24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// A worker renews its lease this often.
    pub renew_every: Duration,
    /// A worker that has not renewed for this long kills its session.
    pub worker_gives_up: Duration,
    /// The controller fences a lease not renewed for this long, and records
    /// the session "interrupted: worker lost".
    pub controller_fences: Duration,
}

impl LeaseTiming {
    /// The figures: renew every 10 s, a worker gives up at 120 s,
    /// the controller fences at 300 s.
    pub const DEFAULT: LeaseTiming = LeaseTiming {
        renew_every: Duration::from_secs(10),
        worker_gives_up: Duration::from_secs(120),
        controller_fences: Duration::from_secs(300),
    };

    /// The order the deadlines must keep: a worker renews several times
    /// before it gives up, and gives up well before the controller fences.
    pub fn check(&self) -> Result<(), TimingError> {
        if self.renew_every.is_zero() || self.renew_every * 3 > self.worker_gives_up {
            return Err(TimingError::RenewTooRare(*self));
        }
        if self.controller_fences < Duration::from_secs(1) {
            return Err(TimingError::FenceTooSoon(*self));
        }
        if self.worker_gives_up * 2 > self.controller_fences {
            return Err(TimingError::GiveUpTooLate(*self));
        }
        Ok(())
    }
}

/// Lease timings out of the order they must keep ([`LeaseTiming::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "renew_every ({:?}) must be at most a third of worker_gives_up ({:?}): a worker must be able to miss two renewals",
        .0.renew_every, .0.worker_gives_up
    )]
    RenewTooRare(LeaseTiming),
    #[error(
        "controller_fences ({:?}) must be at least 1 s: it is also the lease's TTL on the server, counted in whole seconds",
        .0.controller_fences
    )]
    FenceTooSoon(LeaseTiming),
    #[error(
        "worker_gives_up ({:?}) must be at most half of controller_fences ({:?}): the session must be dead before the lease is fenced",
        .0.worker_gives_up, .0.controller_fences
    )]
    GiveUpTooLate(LeaseTiming),
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming::DEFAULT
    }
}

/// What a worker does about its lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerLeaseAction {
    /// Nothing until `until`.
    Hold { until: Instant },
    /// Send a renewal (compare-and-set on the lease's revision).
    Renew,
    /// The lease may be someone else's by now: kill the session.
    KillSession,
}

/// The worker's decision. `renewed_at` is the instant the last *confirmed*
/// renewal (or the take) was sent; a renewal that failed or is still in
/// flight does not move it.
pub fn worker_lease_action(
    timing: &LeaseTiming,
    renewed_at: Instant,
    now: Instant,
) -> WorkerLeaseAction {
    let since = now.saturating_duration_since(renewed_at);
    if since >= timing.worker_gives_up {
        WorkerLeaseAction::KillSession
    } else if since >= timing.renew_every {
        WorkerLeaseAction::Renew
    } else {
        WorkerLeaseAction::Hold {
            until: renewed_at + timing.renew_every,
        }
    }
}

/// What the controller does about one running remote session's lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerLeaseAction {
    /// Nothing until `until` (or until the revision changes).
    Wait { until: Instant },
    /// Delete the lease if it still has `revision`, and record the session
    /// "interrupted: worker lost".
    Fence { revision: u64 },
}

/// The controller's decision: `revision` is the lease's revision it last
/// saw and `seen_at` the instant it first saw that revision.
pub fn controller_lease_action(
    timing: &LeaseTiming,
    revision: u64,
    seen_at: Instant,
    now: Instant,
) -> ControllerLeaseAction {
    if now.saturating_duration_since(seen_at) >= timing.controller_fences {
        ControllerLeaseAction::Fence { revision }
    } else {
        ControllerLeaseAction::Wait {
            until: seen_at + timing.controller_fences,
        }
    }
}

/// Whether the controller records a session's end: only if it comes from
/// the lease's current holder, i.e. the lease still has the revision the
/// end carries. A worker whose lease was fenced (or expired and taken by
/// another) reports into the void.
pub fn end_is_from_holder(end_revision: u64, lease_now: Option<u64>) -> bool {
    lease_now == Some(end_revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn the_worker_renews_then_kills() {
        let t = LeaseTiming::DEFAULT;
        let base = Instant::now();
        let table: &[(u64, WorkerLeaseAction)] = &[
            (
                0,
                WorkerLeaseAction::Hold {
                    until: base + s(10),
                },
            ),
            (
                9,
                WorkerLeaseAction::Hold {
                    until: base + s(10),
                },
            ),
            (10, WorkerLeaseAction::Renew),
            (60, WorkerLeaseAction::Renew),
            (119, WorkerLeaseAction::Renew),
            (120, WorkerLeaseAction::KillSession),
            (301, WorkerLeaseAction::KillSession),
        ];
        for (after, want) in table {
            assert_eq!(
                worker_lease_action(&t, base, base + s(*after)),
                *want,
                "{after} s after the last confirmed renewal"
            );
        }
    }

    #[test]
    fn a_clock_read_before_the_renewal_counts_as_no_time() {
        let t = LeaseTiming::DEFAULT;
        let base = Instant::now() + s(5);
        assert_eq!(
            worker_lease_action(&t, base, base - s(5)),
            WorkerLeaseAction::Hold {
                until: base + s(10)
            }
        );
    }

    #[test]
    fn the_controller_waits_then_fences_the_revision_it_saw() {
        let t = LeaseTiming::DEFAULT;
        let base = Instant::now();
        let table: &[(u64, ControllerLeaseAction)] = &[
            (
                0,
                ControllerLeaseAction::Wait {
                    until: base + s(300),
                },
            ),
            (
                120,
                ControllerLeaseAction::Wait {
                    until: base + s(300),
                },
            ),
            (
                299,
                ControllerLeaseAction::Wait {
                    until: base + s(300),
                },
            ),
            (300, ControllerLeaseAction::Fence { revision: 7 }),
            (1000, ControllerLeaseAction::Fence { revision: 7 }),
        ];
        for (after, want) in table {
            assert_eq!(
                controller_lease_action(&t, 7, base, base + s(*after)),
                *want,
                "{after} s after revision 7 was seen"
            );
        }
    }

    /// The invariant, walked second by second: from one renewal, the worker
    /// has decided to kill long before the controller decides to fence.
    #[test]
    fn the_worker_gives_up_before_the_controller_fences() {
        let t = LeaseTiming::DEFAULT;
        let sent = Instant::now();
        // The controller saw the write some time after it was sent.
        for seen_delay in [0, 1, 30] {
            let seen = sent + s(seen_delay);
            for at in 0..400 {
                let now = sent + s(at);
                if let ControllerLeaseAction::Fence { .. } =
                    controller_lease_action(&t, 1, seen, now)
                {
                    assert_eq!(
                        worker_lease_action(
                            &t,
                            sent,
                            now - (t.controller_fences - t.worker_gives_up)
                        ),
                        WorkerLeaseAction::KillSession,
                        "at {at} s the controller fences, and 180 s earlier the worker had given up"
                    );
                }
            }
        }
    }

    #[test]
    fn timings_that_break_the_order_are_refused() {
        let table: &[(u64, u64, u64, bool)] = &[
            (10, 120, 300, true),
            (1, 3, 6, true),
            (0, 0, 0, false),
            (0, 120, 300, false),
            (50, 120, 300, false),
            (10, 120, 200, false),
            (10, 300, 120, false),
        ];
        for &(renew, give_up, fence, ok) in table {
            let t = LeaseTiming {
                renew_every: s(renew),
                worker_gives_up: s(give_up),
                controller_fences: s(fence),
            };
            assert_eq!(t.check().is_ok(), ok, "{t:?}: {:?}", t.check());
        }
    }

    #[test]
    fn an_end_counts_only_from_the_current_holder() {
        let table: &[(u64, Option<u64>, bool)] = &[
            (5, Some(5), true),
            (5, Some(6), false),
            (5, None, false),
            (6, Some(5), false),
        ];
        for &(end, now, want) in table {
            assert_eq!(
                end_is_from_holder(end, now),
                want,
                "end {end}, lease {now:?}"
            );
        }
    }
}

/// A lease held for an order the controller does not run: an orphan (a
/// session of a controller that could not follow it again, an order taken
/// after it was withdrawn, a session run by hand on the cluster).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan {
    pub agent: String,
    /// The order's id (the lease's `session`).
    pub order: String,
    pub holder: String,
    pub revision: u64,
}

/// What the controller's reconcile does this time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Orphans seen at the last reconcile too: fenced now.
    pub fence: Vec<Orphan>,
    /// Orphans seen for the first time: said, fenced at the next reconcile
    /// if still so (an order being started as the leases were read is
    /// never one twice, 5 minutes apart).
    pub watch: Vec<Orphan>,
    /// The orphans to remember for the next reconcile: `(agent, order)`.
    pub remember: BTreeSet<(String, String)>,
}

/// Pure: the leases held now, the sessions the controller runs (by agent,
/// the session id: any run of it, [`crate::order_of_session`]), and the orphans
/// the last reconcile saw.
pub fn reconcile(
    leases: &[(String, LeaseRecord)],
    running: &BTreeMap<String, String>,
    seen_before: &BTreeSet<(String, String)>,
) -> Reconciled {
    let mut out = Reconciled::default();
    for (agent, record) in leases {
        let order = &record.value.session;
        let ours = running
            .get(agent)
            .is_some_and(|session| crate::order_of_session(order, agent, session));
        if ours {
            continue;
        }
        let orphan = Orphan {
            agent: agent.clone(),
            order: order.clone(),
            holder: record.value.holder.clone(),
            revision: record.revision,
        };
        let key = (agent.clone(), order.clone());
        if seen_before.contains(&key) {
            out.fence.push(orphan);
        } else {
            out.remember.insert(key);
            out.watch.push(orphan);
        }
    }
    out
}

#[cfg(test)]
mod reconcile_tests {
    use super::*;
    use crate::lease::LeaseValue;

    fn lease(agent: &str, order: &str, revision: u64) -> (String, LeaseRecord) {
        (
            agent.to_string(),
            LeaseRecord {
                value: LeaseValue {
                    holder: "w1".into(),
                    session: order.into(),
                    renewal: 3,
                    run: String::new(),
                },
                revision,
            },
        )
    }

    fn orphan(agent: &str, order: &str, revision: u64) -> Orphan {
        Orphan {
            agent: agent.into(),
            order: order.into(),
            holder: "w1".into(),
            revision,
        }
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(a, o)| (a.to_string(), o.to_string()))
            .collect()
    }

    #[test]
    fn an_orphan_lease_is_watched_once_and_fenced_when_seen_again() {
        let running: BTreeMap<String, String> = [
            ("rio".to_string(), "20261127-100000".to_string()),
            ("vida".to_string(), "20261127-100000".to_string()),
        ]
        .into();
        let leases = vec![
            // Ours: the run, and a later iteration of it.
            lease("rio", "rio_20261127-100000", 7),
            lease("vida", "vida_20261127-100000-it2", 9),
            // Not ours: no session of clay runs here; rio's old order.
            lease("clay", "clay_20261127-090000", 4),
            lease("leo", "leo_20261127-090000", 5),
        ];
        // First sighting: watched, remembered, nothing fenced.
        let first = reconcile(&leases, &running, &BTreeSet::new());
        assert_eq!(first.fence, vec![]);
        assert_eq!(
            first.watch,
            vec![
                orphan("clay", "clay_20261127-090000", 4),
                orphan("leo", "leo_20261127-090000", 5)
            ]
        );
        assert_eq!(
            first.remember,
            set(&[
                ("clay", "clay_20261127-090000"),
                ("leo", "leo_20261127-090000")
            ])
        );
        // Seen again (renewed since: another revision): fenced at the
        // revision read now. leo's lease is another order now: watched anew.
        let again = vec![
            lease("clay", "clay_20261127-090000", 40),
            lease("leo", "leo_20261127-095000", 2),
        ];
        let second = reconcile(&again, &running, &first.remember);
        assert_eq!(
            second.fence,
            vec![orphan("clay", "clay_20261127-090000", 40)]
        );
        assert_eq!(second.watch, vec![orphan("leo", "leo_20261127-095000", 2)]);
        assert_eq!(second.remember, set(&[("leo", "leo_20261127-095000")]));
        // A prefix is not a match: rio_20261127-1000001 is another session.
        let other = vec![lease("rio", "rio_20261127-1000001", 1)];
        assert_eq!(reconcile(&other, &running, &BTreeSet::new()).watch.len(), 1);
    }
}
