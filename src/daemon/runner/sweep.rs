//! The sweep after a session: every process of its group or carrying its
//! marker in its environment stopped, then killed, and waited for (the
//! runner, after its main process exited; recovery, for the sessions of a
//! daemon that was killed). Reads `/proc`; blocking, so the runner calls it
//! through `spawn_blocking`.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The sweep stops (SIGSTOP) every process it finds, then looks again, until
/// a pass finds nothing new, so a process that forks in a loop cannot outrun
/// it. This bounds the passes.
const SWEEP_PASSES: usize = 32;

/// How long the sweep waits for the processes it killed to be dead.
const DEATH_WAIT: Duration = Duration::from_secs(1);

/// Kill every process whose environment holds `marker` (no process group):
/// used at start-up for the sessions of a daemon that was killed, whose
/// processes outlived it.
pub fn kill_marked(marker: &(String, String)) -> usize {
    sweep_blocking(None, marker)
}

/// [`kill_marked`] for several markers in one pass over `/proc`.
pub fn kill_marked_all(markers: &[(String, String)]) -> usize {
    let needles: Vec<Vec<u8>> = markers
        .iter()
        .filter(|m| !m.0.is_empty())
        .map(|m| format!("{}={}", m.0, m.1).into_bytes())
        .collect();
    if needles.is_empty() {
        return 0;
    }
    sweep_needles(None, &needles, None)
}

/// SIGKILL to every live process in group `pgid` or with `name=value` of
/// `marker` in its environment, except this process. Returns how many were
/// killed.
///
/// First every match is stopped (SIGSTOP), pass after pass until a pass finds
/// nothing new, so none can fork a new one between the scan and the kill;
/// then all get SIGKILL, and the group too for anything the scan missed.
///
/// Limits: the environment checked is the one a process was started with
/// (`/proc/PID/environ`), so a descendant that cleared its environment when it
/// exec'd (`env -i`, sudo) *and* left the group escapes. Processes of other
/// users are not readable and not killable. The group id is the main
/// process's pid: the runner sweeps while that process is an unreaped
/// zombie (it learns of the exit from a pidfd), so the kernel cannot give
/// the pid, and with it the group id, to another process before the sweep
/// is over. Without pidfds (Linux before 5.3) the runner reaps first; then
/// a reuse needs the pid space to wrap between the reap and the sweep.
///
/// Only processes started no earlier than the group leader (the session's
/// main process, still there as a zombie) can carry its marker: they are
/// its descendants. The environments of the older ones, the machine's other
/// hundreds of processes, are not read (reading one takes the owner's memory
/// lock; it was most of a busy daemon's sweep, once per session).
pub(super) fn sweep_blocking(pgid: Option<i32>, marker: &(String, String)) -> usize {
    let needles: Vec<Vec<u8>> = (!marker.0.is_empty())
        .then(|| format!("{}={}", marker.0, marker.1).into_bytes())
        .into_iter()
        .collect();
    // The leader, if it is still the process that leads the group (not a
    // pid taken again after a reap, on a kernel without pidfds).
    let since = pgid
        .and_then(|g| proc_stat(g).filter(|s| s.pgrp == g))
        .map(|s| s.started);
    sweep_needles(pgid, &needles, since)
}

fn sweep_needles(pgid: Option<i32>, needles: &[Vec<u8>], since: Option<u64>) -> usize {
    let own = std::process::id() as i32;
    let mut stopped: HashSet<i32> = HashSet::new();
    for _ in 0..SWEEP_PASSES {
        let new: Vec<i32> = session_processes(pgid, needles, since, own)
            .into_iter()
            .filter(|pid| !stopped.contains(pid))
            .collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            if kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok() {
                stopped.insert(pid);
            }
        }
    }
    let mut killed = 0;
    for &pid in &stopped {
        if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    if let Some(pgid) = pgid {
        #[cfg(test)]
        tests_hook::saw_group_leader(pgid);
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // SIGKILL is delivered asynchronously; wait (briefly: only a process
    // stuck in the kernel takes longer) until they are really dead, so that
    // nothing of the session runs once `run` has returned.
    let deadline = Instant::now() + DEATH_WAIT;
    let mut dying: Vec<i32> = stopped.into_iter().collect();
    loop {
        dying.retain(|&pid| stat_of(pid).is_some_and(|(state, _)| !is_dead(state)));
        if dying.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if !dying.is_empty() {
        tracing::warn!(pids = ?dying, "session processes got SIGKILL but are not dead yet");
    }
    killed
}

/// `Z`ombie (dead, waiting for its parent to reap it) or `X` (being reaped).
pub(super) fn is_dead(state: u8) -> bool {
    state == b'Z' || state == b'X'
}

/// Live (not zombie) processes in group `pgid` or whose environment holds
/// one of `needles` as a whole entry; with `since`, only a process started
/// at that tick or later is looked for in the environments.
fn session_processes(
    pgid: Option<i32>,
    needles: &[Vec<u8>],
    since: Option<u64>,
    own: i32,
) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = std::str::from_utf8(entry.file_name().as_bytes())
            .ok()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 1 || pid == own {
            continue;
        }
        // Gone already, or dead and waiting to be reaped: nothing to kill.
        let Some(stat) = proc_stat(pid) else {
            continue;
        };
        if is_dead(stat.state) {
            continue;
        }
        let may_carry = !needles.is_empty() && since.is_none_or(|t| stat.started >= t);
        if pgid == Some(stat.pgrp) || (may_carry && environ_holds_any(pid, needles)) {
            found.push(pid);
        }
    }
    found
}

/// State letter and process group from `/proc/PID/stat`.
pub(super) fn stat_of(pid: i32) -> Option<(u8, i32)> {
    proc_stat(pid).map(|s| (s.state, s.pgrp))
}

/// What the sweep reads of a process's `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub state: u8,
    pub pgrp: i32,
    /// When it started, in clock ticks after boot (field 22).
    pub started: u64,
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// Parse a `/proc/PID/stat` line.
pub(super) fn parse_stat(stat: &[u8]) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may hold anything,
    // spaces and parentheses included; the fields after the last ')' are
    // plain: state (3), ppid, pgrp (5), ..., starttime (22).
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.bytes().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    let started = fields.nth(16)?.parse().ok()?;
    Some(ProcStat {
        state,
        pgrp,
        started,
    })
}

fn environ_holds_any(pid: i32, needles: &[Vec<u8>]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|environ| {
            environ
                .split(|&b| b == 0)
                .any(|entry| needles.iter().any(|n| entry == n.as_slice()))
        })
        .unwrap_or(false)
}

/// What the sweeps saw of their group leader, for the runner's tests.
#[cfg(test)]
pub(super) mod tests_hook {
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// For each group swept: the state letter of `/proc/PGID/stat` (None:
    /// no such process, it was reaped) just before the final `killpg`.
    static SEEN: Mutex<Option<HashMap<i32, Option<u8>>>> = Mutex::new(None);

    pub(in super::super) fn saw_group_leader(pgid: i32) {
        let state = super::stat_of(pgid).map(|(state, _)| state);
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        seen.get_or_insert_with(HashMap::new).insert(pgid, state);
    }

    /// What the last sweep of group `pgid` saw of its leader; None if no
    /// sweep of that group ran.
    pub(in super::super) fn leader_state_at_sweep(pgid: i32) -> Option<Option<u8>> {
        let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        seen.as_ref()?.get(&pgid).copied()
    }
}
