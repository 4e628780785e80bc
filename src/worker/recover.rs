//! At start, the spool files an earlier run of this worker left behind
//! (killed, or stopped while NATS stored nothing): sessions whose end is
//! not stored. Each is finished — its unstored chunks published in order,
//! then its end, then the file removed and the lease released — only where
//! that is safe under the lease rules ([`decide`], pure); otherwise the file
//! is kept and the reason logged at every start.
//!
//! Why this is safe, and only then:
//!
//! - **The lease is still this worker's.** The lease `run/<agent>` must
//!   name this host and this session, and this worker must renew it by
//!   compare-and-set at the revision it reads. A lease gone or held by
//!   another means the controller fenced it (it has recorded the session
//!   "interrupted: worker lost" and reads nothing more of it) or the order
//!   runs again elsewhere, whose chunks carry the same numbers: publishing
//!   then could only mix two runs' output. The renewal is the fence: a
//!   controller that fences concurrently fails against it, or it fails
//!   against the controller's fence, never both succeed.
//! - **The session's processes are gone.** An end is stored only once the
//!   session's processes are gone (the controller records the end and may
//!   start the agent's next session at once). Either the spool holds the
//!   end (written after the session's group and cgroup were killed), or
//!   the worker runs with per-session cgroups, whose setup killed every
//!   session cgroup the earlier run left ([`super::cgroup`]). Without
//!   cgroups and without a spooled end, a session started from a shell may
//!   still run (it is in its own process group, outside the worker's):
//!   the file is kept, the lease left to the controller's fence (300 s).
//! - **The end is what happened.** A spooled end is stored as written; a
//!   session the restart interrupted ends
//!   [`agent_state_cluster::Outcome::WorkerRestarted`], its last chunk the
//!   last one spooled. Chunks the stream has already are not sent again
//!   ([`agent_state_cluster::Output::last_chunk`]); one sent twice within
//!   the stream's duplicate window is stored once, and the controller
//!   skips a number it has.
//! - **Host names are unique.** A file is finished only by a worker of the
//!   host name that wrote it (two workers must never share `--host`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use agent_state_cluster::{KeepEnd, Lease, LeaseRecord, Outcome, SessionEnd, keep_sharing};
use tokio::sync::oneshot;

use super::spool::{Header, Record, SpoolFile};
use super::{Shared, log, relay, store_end};

/// What to do with a leftover spool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Renew the lease at this revision, store the rest and the end.
    Finish { revision: u64 },
    /// Keep the file; why.
    Keep(String),
}

/// The decision for a leftover spool of `header`, on worker `host`: the
/// lease `lease` as read, whether its end is in the spool, whether this
/// worker runs with per-session cgroups. Pure.
pub fn decide(
    host: &str,
    header: &Header,
    lease: Option<&LeaseRecord>,
    end_spooled: bool,
    has_cgroups: bool,
) -> Verdict {
    if header.host != host {
        return Verdict::Keep(format!(
            "it was written by worker {}, not by this one ({host})",
            header.host
        ));
    }
    let revision = match lease {
        Some(r) if r.value.holder == host && r.value.session == header.session_id => r.revision,
        Some(r) => {
            return Verdict::Keep(format!(
                "the lease run/{} is held by {} for session {} now: not this worker's to store it under",
                header.agent, r.value.holder, r.value.session
            ));
        }
        None => {
            return Verdict::Keep(format!(
                "the lease run/{} is gone (the controller fenced it and recorded the session as worker lost): not this worker's to store it under",
                header.agent
            ));
        }
    };
    if !end_spooled && !has_cgroups {
        return Verdict::Keep(
            "its processes may still run (no end in the spool, and no per-session cgroups killed them at this start); the controller fences its lease".into(),
        );
    }
    Verdict::Finish { revision }
}

/// Finishes or keeps each leftover spool file, one after the other.
pub(super) async fn leftovers(shared: Arc<Shared>, has_cgroups: bool) {
    let dir = shared.spool_dir.clone();
    let listed = tokio::task::spawn_blocking(move || list(&dir)).await;
    let Ok(files) = listed else { return };
    for path in files {
        if *shared.stop.borrow() {
            return;
        }
        one(&shared, &path, has_cgroups).await;
    }
}

fn list(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "spool"))
        .collect();
    files.sort();
    files
}

async fn one(shared: &Shared, path: &Path, has_cgroups: bool) {
    let show = path.display().to_string();
    let owned = path.to_path_buf();
    let opened = match tokio::task::spawn_blocking(move || SpoolFile::open(&owned)).await {
        Ok(o) => o,
        Err(_) => return,
    };
    let (file, header, records, bad) = match opened {
        Ok(o) => o,
        Err(e) => {
            log(format!(
                "{show}: {e}; kept (no spool file this worker can read)"
            ));
            return;
        }
    };
    if let Some(bad) = bad {
        log(format!("{show}: read up to a bad record: {bad}"));
    }
    let id = header.session_id.clone();
    match shared.output.ended(&id).await {
        Ok(Some(_)) => {
            log(format!(
                "{show}: the end of session {id} is stored already; removed"
            ));
            let _ = file.remove();
            return;
        }
        Ok(None) => {}
        Err(e) => {
            log(format!("{show}: {e}; kept, tried again at the next start"));
            return;
        }
    }
    let spooled_end = records.iter().find_map(|r| match r {
        Record::End(e) => Some((**e).clone()),
        Record::Chunk { .. } => None,
    });
    let lease = match shared.leases.current(&header.agent).await {
        Ok(l) => l,
        Err(e) => {
            log(format!("{show}: {e}; kept, tried again at the next start"));
            return;
        }
    };
    let revision = match decide(
        &shared.options.host,
        &header,
        lease.as_ref(),
        spooled_end.is_some(),
        has_cgroups,
    ) {
        Verdict::Keep(why) => {
            log(format!(
                "{show}: session {id} of {} ended when the worker did, its end not stored; kept: {why}",
                header.agent
            ));
            return;
        }
        Verdict::Finish { revision } => revision,
    };
    let held = Lease {
        agent: header.agent.clone(),
        value: lease.expect("decided on it").value,
        revision,
    };
    let taken_at = Instant::now();
    let held = match shared.leases.renew(&held).await {
        Ok(l) => l,
        Err(e) => {
            log(format!("{show}: {e}; kept"));
            return;
        }
    };
    log(format!(
        "{show}: session {id} of {} was left by an earlier run of this worker; storing its spooled output and its end under its lease (revision {})",
        header.agent, held.revision
    ));
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let shared_revision = AtomicU64::new(held.revision);
    let keeper = keep_sharing(
        &shared.leases,
        shared.options.lease_timing,
        held,
        taken_at,
        async {
            let _ = done_rx.await;
        },
        &shared_revision,
    );
    let work = async {
        let stored = shared.output.last_chunk(&id).await.unwrap_or(0);
        let mut last = stored;
        let mut sent = 0usize;
        for record in &records {
            if let Record::Chunk { number, pipe, data } = record {
                last = last.max(*number);
                if *number > stored {
                    let mut stop = shared.stop.clone();
                    tokio::select! {
                        () = relay::store_chunk(&shared.output, &id, *number, pipe, data.clone().into()) => sent += 1,
                        _ = super::until(&mut stop, true) => return None,
                    }
                }
            }
        }
        let _ = done_tx.send(());
        Some((last, sent))
    };
    let (kept, worked) = tokio::join!(keeper, work);
    let Some((last, sent)) = worked else {
        log(format!("{show}: the worker stops; kept for its next start"));
        return;
    };
    let lease = match kept {
        KeepEnd::Stopped(l) | KeepEnd::GaveUp { lease: l, .. } => l,
        KeepEnd::Lost(e) => {
            log(format!("{show}: {e}; kept"));
            return;
        }
    };
    let end = match spooled_end {
        Some(end) => SessionEnd {
            lease_revision: lease.revision,
            ..end
        },
        None => SessionEnd {
            session_id: id.clone(),
            agent: header.agent.clone(),
            host: header.host.clone(),
            outcome: Outcome::WorkerRestarted,
            started_ms: header.started_ms,
            ended_ms: super::now_ms(),
            last_chunk: last,
            lease_revision: lease.revision,
            // A worktree left by a killed worker is not judged here: its
            // session is recorded without one.
            workspace: None,
        },
    };
    if !store_end(shared, &end).await {
        log(format!("{show}: its end is not stored; kept"));
        return;
    }
    log(format!(
        "{show}: session {id} of {} finished: {sent} chunk(s) stored from the spool, then its end ({:?})",
        header.agent, end.outcome
    ));
    let _ = file.remove();
    if let Err(e) = shared.leases.release(&lease).await {
        log(format!("session {id}: cannot release the lease: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_state_cluster::LeaseValue;

    #[test]
    fn a_leftover_spool_is_finished_only_under_its_own_lease_with_its_processes_gone() {
        let header = Header {
            session_id: "rio_s1".into(),
            agent: "rio".into(),
            host: "w1".into(),
            started_ms: 1,
        };
        let lease = |holder: &str, session: &str| {
            Some(LeaseRecord {
                value: LeaseValue {
                    holder: holder.into(),
                    session: session.into(),
                    renewal: 3,
                    run: String::new(),
                },
                revision: 42,
            })
        };
        // (host, lease, end spooled, cgroups, finished?, why kept contains)
        type Row = (
            &'static str,
            Option<LeaseRecord>,
            bool,
            bool,
            Result<u64, &'static str>,
        );
        let table: Vec<Row> = vec![
            ("w1", lease("w1", "rio_s1"), true, false, Ok(42)),
            ("w1", lease("w1", "rio_s1"), false, true, Ok(42)),
            ("w1", lease("w1", "rio_s1"), true, true, Ok(42)),
            // Its processes may still run.
            (
                "w1",
                lease("w1", "rio_s1"),
                false,
                false,
                Err("its processes may still run"),
            ),
            // Fenced by the controller.
            ("w1", None, true, true, Err("the lease run/rio is gone")),
            // Taken for another session, or by another worker.
            (
                "w1",
                lease("w1", "rio_s2"),
                true,
                true,
                Err("held by w1 for session rio_s2"),
            ),
            (
                "w1",
                lease("w2", "rio_s1"),
                true,
                true,
                Err("held by w2 for session rio_s1"),
            ),
            // Another worker's file.
            (
                "w2",
                lease("w1", "rio_s1"),
                true,
                true,
                Err("written by worker w1, not by this one (w2)"),
            ),
        ];
        for (i, (host, lease, ended, cgroups, want)) in table.into_iter().enumerate() {
            let got = decide(host, &header, lease.as_ref(), ended, cgroups);
            match (got, want) {
                (Verdict::Finish { revision }, Ok(r)) => assert_eq!(revision, r, "row {i}"),
                (Verdict::Keep(why), Err(part)) => assert!(why.contains(part), "row {i}: {why}"),
                (got, want) => panic!("row {i}: {got:?}, want {want:?}"),
            }
        }
    }
}
