//! The monitor's rotation of the append-only logs (`[logs]`): each
//! agent's `journal.jsonl` under its lock, the daemon's own `errors.jsonl`
//! and `signals.jsonl` under [`rotation::daemon_logs`], and the pruning of
//! old segments. Runs off the loop (compressing 16 MiB takes tens of
//! milliseconds), one job at a time; the format and its guarantees are
//! `crate::state::rotation`'s.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::clock::Timestamp;
use crate::config::LogSettings;
use crate::state::{AgentDir, rotation};

/// How long a rotation waits for an agent's lock before leaving that
/// journal for the next round (a hook holds it for milliseconds).
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// One round of rotation.
pub struct Job {
    pub agents: Vec<AgentDir>,
    /// `errors.jsonl` and `signals.jsonl`.
    pub daemon_logs: Vec<PathBuf>,
    pub settings: LogSettings,
    /// Prune segments past retention too (hourly).
    pub prune: bool,
    /// What the daemon logs' writes do on a full disk (the daemon's).
    pub store: crate::state::Store,
}

/// What a round did, for the daemon's log.
#[derive(Debug, Default)]
pub struct Outcome {
    /// "rio/journal.jsonl: 16.0 MiB into journal.jsonl.000000000000.zst"
    pub rotated: Vec<String>,
    /// Segments removed by retention, and their bytes.
    pub pruned: (usize, u64),
    /// Journals whose lock was busy: left for the next round.
    pub deferred: Vec<String>,
    pub errors: Vec<String>,
}

/// Rotate every log over the size and, with `job.prune`, remove old
/// segments, past retention as of `now` (the daemon's clock). Blocking.
pub fn run(job: &Job, now: Timestamp) -> Outcome {
    let mut out = Outcome::default();
    let wall: SystemTime = now.0.into();
    let max = job.settings.rotate_size;
    for dir in &job.agents {
        let path = dir.journal();
        let shown = format!("{}/journal.jsonl", dir.name);
        let over = matches!(crate::fsx::metadata(&path), Ok(Some(st)) if st.st_size as u64 > max);
        if over {
            let lock = crate::state::lock::lock_within(dir, LOCK_WAIT);
            match lock {
                Ok(held) => note(&mut out, &shown, dir.rotate_journal(&held, max, now)),
                Err(crate::error::Error::LockBusy { .. }) => out.deferred.push(shown.clone()),
                Err(e) => out.errors.push(format!("{shown}: {e}")),
            }
        }
        if job.prune
            && let Some(keep) = job.settings.journal_retention
        {
            prune(&mut out, &shown, &path, keep, wall);
        }
    }
    for path in &job.daemon_logs {
        let shown = format!(
            ".daemon/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        let result = {
            let _writers = rotation::daemon_logs();
            rotation::rotate_if_over(&job.store, path, max, now)
        };
        note(&mut out, &shown, result);
        if job.prune
            && let Some(keep) = job.settings.daemon_log_retention
        {
            prune(&mut out, &shown, path, keep, wall);
        }
    }
    out
}

fn note(out: &mut Outcome, shown: &str, result: crate::error::Result<Option<rotation::Rotated>>) {
    match result {
        Ok(Some(r)) => out.rotated.push(format!(
            "{shown}: {} into {}",
            crate::daemon::health::format_bytes(r.bytes),
            r.segment.file_name().unwrap_or_default().to_string_lossy()
        )),
        Ok(None) => {}
        Err(e) => out.errors.push(format!("{shown}: {e}")),
    }
}

fn prune(out: &mut Outcome, shown: &str, path: &std::path::Path, keep: Duration, now: SystemTime) {
    let cutoff = now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH);
    match rotation::prune(path, cutoff) {
        Ok((n, bytes)) => {
            out.pruned.0 += n;
            out.pruned.1 += bytes;
        }
        Err(e) => out
            .errors
            .push(format!("{shown}: pruning old segments: {e}")),
    }
}
