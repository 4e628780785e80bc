//! A cgroup per session on the worker, as on the controller's own host
//! ([`crate::daemon::cgroup`], reused whole): where the worker runs in a
//! delegated cgroup v2 subtree (systemd `Delegate=yes`, as
//! systemd/agent-state-worker.service has it), it moves itself into
//! `daemon/` of that subtree, each session gets `session-ORDER/`, which its
//! process joins between fork and exec, and the session's end (its exit,
//! its timeout, its stall, a lost lease, the worker's SIGTERM) kills the
//! whole cgroup: a grandchild that called `setsid()` and left the process
//! group dies too. The agent's `memory_max` (the order's `memory_max`) is
//! the cgroup's `memory.max` where the subtree has the memory controller.
//!
//! Without delegation (a worker run from a shell, a container, a unit
//! without `Delegate=yes`) the process group is all there is, said once at
//! start. Setting the subtree up also kills what a previous run of the
//! worker left in it (its sessions' cgroups): a restarted worker knows its
//! earlier sessions' processes are gone ([`super::recover`] relies on it).

use std::os::unix::process::CommandExt;

use crate::daemon::cgroup::{self, SessionCgroup};

/// Sets the cgroups up (once) and says which path the sessions take.
/// Returns whether sessions get cgroups.
pub(super) fn init() -> bool {
    match cgroup::available() {
        Some(c) => {
            super::log(format!(
                "sessions run in cgroups of their own under {} (killed whole at each session's end){}",
                c.base().display(),
                c.no_memory
                    .as_ref()
                    .map(|why| format!("; memory_max is not applied: {why}"))
                    .unwrap_or_default()
            ));
            true
        }
        None => {
            super::log(format!(
                "sessions run in process groups only: {}; a process that leaves its session's group (setsid) is not killed with it",
                cgroup::why_unavailable().unwrap_or_else(|| "no delegated cgroup".into())
            ));
            false
        }
    }
}

/// What the session's cgroup gets of the order's `memory_max`, for the log
/// (`None`: nothing to say). Pure.
pub fn memory_note(
    memory_max: Option<u64>,
    has_cgroup: bool,
    no_memory: Option<&str>,
    write_error: Option<&str>,
) -> Option<String> {
    let max = memory_max?;
    Some(match (has_cgroup, no_memory, write_error) {
        (false, _, _) => format!(
            "memory_max {max} is not applied: the session has no cgroup of its own (no delegated cgroup)"
        ),
        (true, Some(why), _) | (true, None, Some(why)) => {
            format!("memory_max {max} is not applied: {why}")
        }
        (true, None, None) => format!("memory_max {max} is the cgroup's memory.max"),
    })
}

/// The cgroup of order `order` (its memory limit applied, or said why
/// not); `None` without delegation, or when it cannot be made (said: the
/// process group is still killed).
pub(super) fn session(order: &str, memory_max: Option<u64>) -> Option<SessionCgroup> {
    let Some(all) = cgroup::available() else {
        if let Some(note) = memory_note(memory_max, false, None, None) {
            super::log(format!("session {order}: {note}"));
        }
        return None;
    };
    let made = match all.session(order) {
        Ok(c) => c,
        Err(e) => {
            super::log(format!(
                "session {order}: cannot make its cgroup under {}: {e}; only its process group is killed at its end",
                all.base().display()
            ));
            return None;
        }
    };
    let write_error = match (memory_max, &all.no_memory) {
        (Some(max), None) => made.limit_memory(max).err().map(|e| e.to_string()),
        _ => None,
    };
    if let Some(note) = memory_note(
        memory_max,
        true,
        all.no_memory.as_deref(),
        write_error.as_deref(),
    ) {
        super::log(format!("session {order}: {note}"));
    }
    Some(made)
}

/// Makes the child join `cgroup` between fork and exec.
pub(super) fn join_at_exec(command: &mut tokio::process::Command, cgroup: &SessionCgroup) {
    let procs = cgroup.procs_path().to_owned();
    // SAFETY: the closure only opens, writes and closes a file
    // (`cgroup::join_self`), which is async-signal-safe. A failure is
    // ignored: the worker moves the child in as well ([`after_spawn`]).
    unsafe {
        command.as_std_mut().pre_exec(move || {
            let _ = cgroup::join_self(&procs);
            Ok(())
        });
    }
}

/// Moves the child in from the worker's side too (it may have failed to).
pub(super) fn after_spawn(order: &str, cgroup: &SessionCgroup, pid: u32) {
    if let Err(e) = cgroup.add(pid)
        && e.raw_os_error() != Some(nix::libc::ESRCH)
    {
        super::log(format!(
            "session {order}: cannot move pid {pid} into its cgroup {}: {e}",
            cgroup.dir.display()
        ));
    }
}

/// Kills everything left in the session's cgroup and removes it (off the
/// async thread). Returns how many processes it held.
pub(super) async fn kill(cgroup: Option<SessionCgroup>) -> usize {
    let Some(cgroup) = cgroup else { return 0 };
    tokio::task::spawn_blocking(move || {
        let killed = cgroup.kill();
        cgroup.remove();
        killed
    })
    .await
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_said_of_the_memory_limit() {
        // (memory_max, has a cgroup, no memory controller because, the
        // write's error, said)
        type Row = (
            Option<u64>,
            bool,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let table: Vec<Row> = vec![
            (None, true, None, None, None),
            (None, false, None, None, None),
            (
                Some(1024),
                false,
                None,
                None,
                Some(
                    "memory_max 1024 is not applied: the session has no cgroup of its own (no delegated cgroup)",
                ),
            ),
            (
                Some(1024),
                true,
                Some("no memory controller"),
                None,
                Some("memory_max 1024 is not applied: no memory controller"),
            ),
            (
                Some(1024),
                true,
                None,
                Some("cannot write memory.max: EACCES"),
                Some("memory_max 1024 is not applied: cannot write memory.max: EACCES"),
            ),
            (
                Some(1024),
                true,
                None,
                None,
                Some("memory_max 1024 is the cgroup's memory.max"),
            ),
        ];
        for (i, (max, has, no_memory, error, want)) in table.into_iter().enumerate() {
            assert_eq!(
                memory_note(max, has, no_memory, error).as_deref(),
                want,
                "row {i}"
            );
        }
    }
}
