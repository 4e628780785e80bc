//! The worktrees this worker made: the ones its sessions still run in
//! ([`Live`]), and the pruning of the rest as the controller prunes its own
//! (`crate::daemon::workspaces::prune`: clean ones at once, kept ones past
//! the agent's `retention`, never one with unpushed commits unless
//! `prune_unpushed`), at the worker's start and every hour.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::{Shared, log, until};

/// How often the worker prunes its worktrees.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The worktrees of the sessions running here, and the gate a pruning
/// holds while it runs: a session's worktree is registered under the gate,
/// before it is made, so a pruning never sees it half-made and unclaimed.
#[derive(Default)]
pub(super) struct Worktrees {
    live: Mutex<Vec<PathBuf>>,
    gate: tokio::sync::Mutex<()>,
}

/// A worktree a session runs in: never pruned while this is held.
pub(super) struct Live<'a> {
    worktrees: &'a Worktrees,
    path: PathBuf,
}

impl Worktrees {
    /// Registers `path` as live (waiting for a pruning under way).
    pub(super) async fn hold(&self, path: PathBuf) -> Live<'_> {
        let _gate = self.gate.lock().await;
        self.lock().push(path.clone());
        Live {
            worktrees: self,
            path,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        let mut live = self.worktrees.lock();
        if let Some(i) = live.iter().position(|p| *p == self.path) {
            live.swap_remove(i);
        }
    }
}

/// Prunes the worktrees of the agents in this worker's config at start
/// and every [`PRUNE_EVERY`] until the worker stops; one log line per
/// worktree removed and per error.
pub(super) async fn worktrees(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let jobs = shared.options.prune.clone();
    if jobs.is_empty() {
        return;
    }
    loop {
        {
            let _gate = shared.worktrees.gate.lock().await;
            let live = shared.worktrees.lock().clone();
            let jobs = jobs.clone();
            let pruned = tokio::task::spawn_blocking(move || {
                crate::daemon::workspaces::prune(&jobs, &live, SystemTime::now())
            })
            .await;
            match pruned {
                Ok((removed, errors)) => {
                    for line in removed {
                        log(format!("worktrees: {line}"));
                    }
                    for e in errors {
                        log(format!("worktrees: cannot prune: {e}"));
                    }
                }
                Err(e) => log(format!("worktrees: the pruning failed: {e}")),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_EVERY) => {}
            () = until(&mut stop, true) => return,
        }
    }
}
