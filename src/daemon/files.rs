//! Daemon-wide files under `{state_root}/.daemon/`: the lock that keeps one
//! daemon per root, the last fire time of every schedule, and the
//! `daemon.json` heartbeat (the instance counters, which session scripts
//! take too, are the store's: [`crate::state::counters`]). JSON files are written through
//! `state::atomic` like every other state file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::clock::Timestamp;
use std::os::unix::fs::OpenOptionsExt;

use crate::error::{Error, IoContext, Result};
use crate::state::lock::{LOCK_FILE_MODE, open_private_lock};
use crate::state::{StateRoot, atomic};

/// Held for the daemon's whole life: a second daemon on the same root finds
/// it taken and exits.
///
/// `.daemon/lock` is the service user's alone ([`LOCK_FILE_MODE`], 0600):
/// anyone who can open a file can flock it, and a member of the inbox group
/// holding a shared lock on it kept the next daemon from starting ("another
/// daemon is already running", exit 64, which the unit does not restart).
/// An older, wider mode is narrowed at start. The others learn that a daemon
/// runs from `.daemon/alive.lock` ([`ALIVE`]), which each daemon makes anew
/// and locks before anyone else can open it (see [`raise_alive`]): holding
/// an old one holds nobody back.
///
/// `.daemon/lock` alone does not survive the root being removed and made
/// again (`rm -rf` and `bootstrap`, as a demo or an operator may do): the
/// new root has a new lock file that nobody holds. So the daemon also holds
/// a lock keyed by the root's canonical path in the runtime directory (the
/// unit's `RuntimeDirectory=`, `$XDG_RUNTIME_DIR/agent-state/`, or
/// `/run/agent-state/` for root), which the new root does not reset, and it checks ([`DaemonLock::check`]) that
/// `.daemon/lock` is still the file it locked, to stop when it is not.
pub struct DaemonLock {
    lock: Flock<File>,
    path: PathBuf,
    _alive: Option<Flock<File>>,
    _runtime: Option<RuntimeLock>,
}

impl DaemonLock {
    /// Err once `.daemon/lock` is no longer the file this daemon locked:
    /// the root (or its `.daemon/`) was removed or replaced, and the daemon
    /// no longer owns what is at its path.
    pub fn check(&self) -> std::result::Result<(), RootLost> {
        let held = nix::sys::stat::fstat(&*self.lock)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        let now = nix::sys::stat::stat(&self.path)
            .ok()
            .map(|s| (s.st_dev, s.st_ino));
        if held.is_some() && held == now {
            return Ok(());
        }
        Err(RootLost {
            path: self.path.clone(),
        })
    }
}

/// `.daemon/lock` is no longer the lock this daemon took: it stops.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{} is no longer the lock this daemon took (the state root was removed or replaced \
     under it): the daemon stops rather than run on a root it does not own; start it again",
    path.display()
)]
pub struct RootLost {
    /// The lock's path.
    pub path: PathBuf,
}

impl RootLost {
    /// The catalogue code it is raised with.
    pub fn code(&self) -> crate::catalogue::Code {
        crate::catalogue::Code::IoError
    }
}

/// `.daemon/alive.lock`: held (exclusively) by the running daemon for the
/// group's readers, who may not open `.daemon/lock`.
pub const ALIVE: &str = "alive.lock";
/// Its mode: the group may open it to probe it.
const ALIVE_MODE: u32 = 0o640;

pub fn lock_root(root: &StateRoot) -> Result<DaemonLock> {
    let dir = root.daemon_dir();
    atomic::create_dir(&dir, 0o750)?;
    // The runtime lock first: it still stands when the root was made again
    // under a daemon that runs on it.
    let runtime = RuntimeLock::take(root)?;
    let path = dir.join("lock");
    // A file replaced after we opened it (by a daemon's `take_over`) is
    // not the lock any more: locked, it is checked to be the one at the
    // path, else the one there now is tried.
    for _ in 0..10 {
        let lock = match lock_exclusive(root, &path)? {
            Taken::Locked(lock) => lock,
            Taken::Shared(shared) => take_over(root, &path, shared)?,
        };
        if !still_at(&lock, &path) {
            continue;
        }
        let alive = raise_alive(root)
            .inspect_err(|e| {
                tracing::warn!(
                    "{e}: members of the inbox group cannot tell that the daemon runs \
                     (`wake` says there is none)"
                )
            })
            .ok();
        return Ok(DaemonLock {
            lock,
            path,
            _alive: alive,
            _runtime: runtime,
        });
    }
    Err(Error::Unavailable(format!(
        "{} keeps being replaced while this daemon tries to lock it; try again",
        path.display()
    )))
}

/// What [`lock_exclusive`] got.
enum Taken {
    /// The lock: no daemon runs.
    Locked(Flock<File>),
    /// A shared lock on a file that somebody other than a daemon holds.
    Shared(Flock<File>),
}

fn lock_exclusive(root: &StateRoot, path: &Path) -> Result<Taken> {
    // 0600, and an older 0640 narrowed: only the service user and root can
    // open it from now on.
    let mut file = open_private_lock(path)?;
    // The service user's and root's `wake`, `status`, `health` probe the
    // lock with a shared lock held for microseconds; a live daemon holds it
    // for good. Try for half a second before concluding that another
    // daemon runs.
    let mut tries = 0;
    let result = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if tries < 50 => {
                tries += 1;
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other,
        }
    };
    match result {
        Ok(lock) => Ok(Taken::Locked(lock)),
        // Held for half a second. A daemon holds it exclusively; a shared
        // lock held that long is somebody else's: a member of the group who
        // opened it while it was 0640 (an install from before), which
        // narrowing its mode does not take away. Such a file is replaced.
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            match Flock::lock(file, FlockArg::LockSharedNonblock) {
                Ok(shared) => Ok(Taken::Shared(shared)),
                Err(_) => Err(already_running(root)),
            }
        }
        Err((_, errno)) => Err(Error::io("locking", path, errno.into())),
    }
}

/// Is the file `lock` holds the one at `path`?
fn still_at(lock: &Flock<File>, path: &Path) -> bool {
    let held = nix::sys::stat::fstat(&**lock).map(|s| (s.st_dev, s.st_ino));
    let now = nix::sys::stat::stat(path).map(|s| (s.st_dev, s.st_ino));
    held.is_ok() && held == now
}

/// A new `.daemon/lock` in place of one that somebody other than a daemon
/// holds (`shared`, our shared lock on it, proves that no daemon holds it
/// and keeps one from taking it meanwhile): a fresh file, locked
/// exclusively before anyone else can open it, exchanged with the old one
/// in one step (`RENAME_EXCHANGE`); the old one is removed, its holder left
/// holding a file nobody looks at. Had another daemon put its own lock there
/// meanwhile, it is put back and this daemon does not run.
fn take_over(root: &StateRoot, path: &Path, shared: Flock<File>) -> Result<Flock<File>> {
    use std::os::fd::AsFd;
    let dir_path = root.daemon_dir();
    let dir = crate::fsx::dir(&dir_path)?;
    let (lock, name) = fresh_locked(dir.as_fd(), &dir_path)?;
    let old = nix::sys::stat::fstat(&*shared).map(|s| (s.st_dev, s.st_ino));
    let exchange = |a: &std::ffi::OsStr, b: &std::ffi::OsStr| {
        nix::fcntl::renameat2(
            dir.as_fd(),
            a,
            dir.as_fd(),
            b,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
    };
    let lock_name = std::ffi::OsStr::new("lock");
    if let Err(errno) = exchange(&name, lock_name) {
        crate::fsx::discard_at(dir.as_fd(), &name);
        return Err(Error::io("replacing", path, errno.into()));
    }
    let displaced = crate::fsx::stat_at(dir.as_fd(), &name, &dir_path.join(&name))
        .ok()
        .flatten()
        .map(|s| (s.st_dev, s.st_ino));
    if old.is_ok() && displaced == old.ok() {
        crate::fsx::discard_at(dir.as_fd(), &name);
        tracing::warn!(
            "{} was held by a process other than a daemon (a shared lock, taken while the file \
             was open to the group); it is replaced by a new one only the service user can open",
            path.display()
        );
        return Ok(lock);
    }
    // Not the file we looked at: another daemon's. Put it back.
    let _ = exchange(&name, lock_name);
    crate::fsx::discard_at(dir.as_fd(), &name);
    Err(already_running(root))
}

/// A new file in `dir` under a temp name, mode 0600, open for reading only
/// (a file held open for writing keeps its file system from being
/// remounted read-only) and locked exclusively: nobody else can have
/// opened it.
fn fresh_locked(
    dir: std::os::fd::BorrowedFd<'_>,
    dir_path: &Path,
) -> Result<(Flock<File>, std::ffi::OsString)> {
    let (written, name) = crate::fsx::create_temp(dir, dir_path, LOCK_FILE_MODE)?;
    let temp = dir_path.join(&name);
    drop(written);
    let file = match crate::fsx::open_read_at(dir, &name, &temp) {
        Ok(Some(file)) => file,
        Ok(None) => {
            return Err(Error::io(
                "opening",
                &temp,
                std::io::ErrorKind::NotFound.into(),
            ));
        }
        Err(e) => {
            crate::fsx::discard_at(dir, &name);
            return Err(e);
        }
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok((lock, name)),
        Err((_, errno)) => {
            crate::fsx::discard_at(dir, &name);
            Err(Error::io("locking", &temp, errno.into()))
        }
    }
}

/// Make `.daemon/alive.lock` anew, locked: created 0600 under a temp name,
/// locked exclusively (nobody else can have opened it), then opened to the
/// group (0640) and renamed over the last daemon's. A member who holds the
/// old one (it may: it could open it) holds a file nobody looks at any
/// more, so nothing a member does can keep a daemon from starting. Called
/// under `.daemon/lock`, so two daemons never race here.
fn raise_alive(root: &StateRoot) -> Result<Flock<File>> {
    use std::os::fd::AsFd;
    let dir_path = root.daemon_dir();
    let dir = crate::fsx::dir(&dir_path)?;
    let (lock, name) = fresh_locked(dir.as_fd(), &dir_path)?;
    let temp = dir_path.join(&name);
    let opened =
        nix::sys::stat::fchmod(&*lock, nix::sys::stat::Mode::from_bits_truncate(ALIVE_MODE))
            .map_err(|e| Error::io("setting the mode of", &temp, e.into()))
            .and_then(|()| {
                crate::fsx::rename_at(
                    dir.as_fd(),
                    &name,
                    dir.as_fd(),
                    std::ffi::OsStr::new(ALIVE),
                    true,
                )
                .map_err(|e| Error::io("renaming", &temp, e))
            });
    if let Err(e) = opened {
        crate::fsx::discard_at(dir.as_fd(), &name);
        return Err(e);
    }
    Ok(lock)
}

fn already_running(root: &StateRoot) -> Error {
    let pid = read_heartbeat(root)
        .ok()
        .flatten()
        .map(|h| h.pid.to_string());
    Error::Usage(format!(
        "another agent-state daemon is already running on {} (pid {}); one daemon per state root \
         (if none runs, `fuser -v {}` shows who holds its lock)",
        root.path.display(),
        pid.unwrap_or_else(|| "unknown".into()),
        root.daemon_dir().join("lock").display()
    ))
}

/// The lock keyed by the root's canonical path in the runtime directory.
/// Its file is removed when the daemon ends (under the lock, and a taker
/// checks that the file it locked is still the one at the path).
struct RuntimeLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl RuntimeLock {
    /// None when there is no runtime directory we may use (a system service
    /// without `RuntimeDirectory=`): `.daemon/lock` and the check remain.
    fn take(root: &StateRoot) -> Result<Option<RuntimeLock>> {
        let Some(dir) = runtime_dir(
            std::env::var_os("RUNTIME_DIRECTORY").map(PathBuf::from),
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            nix::unistd::geteuid().is_root(),
        ) else {
            return Ok(None);
        };
        let canonical = std::fs::canonicalize(&root.path).at("resolving", &root.path)?;
        if let Err(e) = std::fs::create_dir(&dir)
            && e.kind() != std::io::ErrorKind::AlreadyExists
        {
            tracing::debug!("no runtime lock in {}: {e}", dir.display());
            return Ok(None);
        }
        let path = dir.join(runtime_lock_name(&canonical));
        // Held only for a moment by something else (a child forked by a
        // daemon SIGKILLed an instant ago keeps the descriptor until its
        // exec closes it): tried for a second before concluding.
        let mut busy = 0;
        for _ in 0..150 {
            let file = match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!("no runtime lock at {}: {e}", path.display());
                    return Ok(None);
                }
            };
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    // The previous holder may have removed the file between
                    // our open and our lock: then lock the new one.
                    let held = nix::sys::stat::fstat(&*lock).map(|s| (s.st_dev, s.st_ino));
                    let now = nix::sys::stat::stat(&path).map(|s| (s.st_dev, s.st_ino));
                    if held.is_ok() && held == now {
                        use std::io::Write;
                        let _ = lock.set_len(0);
                        let _ = writeln!(&*lock, "{}", canonical.display());
                        return Ok(Some(RuntimeLock { _lock: lock, path }));
                    }
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if busy < 100 => busy += 1,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(Error::Usage(format!(
                        "another agent-state daemon is already running on {} (it holds {}, \
                         taken when it started on that root, which has been removed or made \
                         again since); stop it first: one daemon per state root",
                        canonical.display(),
                        path.display()
                    )));
                }
                Err((_, errno)) => return Err(Error::io("locking", &path, errno.into())),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(Error::Unavailable(format!(
            "{} keeps being replaced while this daemon tries to lock it; try again",
            path.display()
        )))
    }
}

impl Drop for RuntimeLock {
    fn drop(&mut self) {
        // Removed while still held, so a daemon that locks it next checks
        // that the file is gone and makes a new one.
        // (`_lock` is released after this, when the fields are dropped.)
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where the runtime lock goes: the unit's `RuntimeDirectory=` (systemd
/// names it in `$RUNTIME_DIRECTORY`), else `$XDG_RUNTIME_DIR/agent-state`,
/// else `/run/agent-state` for root, else nowhere.
fn runtime_dir(unit: Option<PathBuf>, xdg: Option<PathBuf>, is_root: bool) -> Option<PathBuf> {
    // systemd may list several, separated by ':'; the first is ours.
    if let Some(first) = unit.as_ref().and_then(|u| {
        u.to_str()
            .and_then(|s| s.split(':').next())
            .map(PathBuf::from)
    }) && first.is_absolute()
    {
        return Some(first);
    }
    match xdg {
        Some(dir) if dir.is_absolute() => Some(dir.join("agent-state")),
        _ if is_root => Some(PathBuf::from("/run/agent-state")),
        _ => None,
    }
}

/// `root-<FNV-1a 64 of the canonical path>.lock`: short, fixed length, and
/// the same in every version of the program.
fn runtime_lock_name(canonical: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.as_os_str().as_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("root-{hash:016x}.lock")
}

/// What one lock file showed to a non-waiting try of a shared lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Somebody holds it exclusively.
    Held,
    /// Nobody holds it exclusively.
    Free,
    /// There is no such file.
    Missing,
    /// This user may not open it (or it is not a plain file).
    Denied,
}

/// What this process can tell of the heartbeat's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    /// That process exists, and it started when the heartbeat says.
    Same,
    /// No such process, or another one (a different start time), in the
    /// daemon's own PID namespace.
    Gone,
    /// Not knowable here: no heartbeat, another PID namespace, a start time
    /// this user may not read, a heartbeat from before they were written.
    Unknown,
}

/// Does a daemon run on this root? `None`: not knowable by this user
/// (outside the inbox group). Pure.
///
/// `.daemon/lock`, where this user can open it (the service user, root; any
/// member on an install from before), is the truth: the daemon holds it for
/// its whole life. Others look at `.daemon/alive.lock`, which the daemon
/// holds too. A member can hold *that* one exclusively once the daemon is
/// gone, and make its group believe a daemon runs (never keep one from
/// starting): so a held `alive.lock` counts only while the heartbeat's pid
/// is not seen gone.
pub fn judge_running(root_lock: Probe, alive: Probe, pid: Pid) -> Option<bool> {
    match (root_lock, alive, pid) {
        (Probe::Held, _, _) => Some(true),
        (Probe::Free | Probe::Missing, _, _) => Some(false),
        (Probe::Denied, Probe::Held, Pid::Gone) => Some(false),
        (Probe::Denied, Probe::Held, Pid::Same | Pid::Unknown) => Some(true),
        (Probe::Denied, Probe::Free | Probe::Missing, _) => Some(false),
        (Probe::Denied, Probe::Denied, _) => None,
    }
}

/// Try a shared lock on `path` without waiting, creating nothing.
fn probe(path: &Path) -> Probe {
    match crate::fsx::open_read(path) {
        Ok(None) => Probe::Missing,
        Err(_) => Probe::Denied,
        Ok(Some(file)) => match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_) => Probe::Free,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Probe::Held,
            Err(_) => Probe::Denied,
        },
    }
}

/// The heartbeat's pid as this process sees it.
fn heartbeat_pid(root: &StateRoot) -> Pid {
    let Ok(Some(hb)) = read_heartbeat(root) else {
        return Pid::Unknown;
    };
    let me = this_process();
    let (Some(ns), Some(mine)) = (hb.pid_ns, me.ns) else {
        return Pid::Unknown;
    };
    let Ok(pid) = i32::try_from(hb.pid) else {
        return Pid::Unknown;
    };
    if ns != mine || pid <= 0 {
        return Pid::Unknown;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Err(nix::errno::Errno::ESRCH) => Pid::Gone,
        Ok(()) | Err(nix::errno::Errno::EPERM) => {
            match (hb.pid_start, crate::owner::process_start(pid)) {
                (Some(recorded), Some(seen)) if recorded != seen => Pid::Gone,
                (Some(_), Some(_)) => Pid::Same,
                _ => Pid::Unknown,
            }
        }
        Err(_) => Pid::Unknown,
    }
}

/// Is a daemon running on this root? `None` if this user cannot tell (a
/// monitoring user outside the group). See [`judge_running`].
pub fn daemon_lock_state(root: &StateRoot) -> Option<bool> {
    let dir = root.daemon_dir();
    let root_lock = probe(&dir.join("lock"));
    if root_lock != Probe::Denied {
        return judge_running(root_lock, Probe::Denied, Pid::Unknown);
    }
    let alive = probe(&dir.join(ALIVE));
    let pid = if alive == Probe::Held {
        heartbeat_pid(root)
    } else {
        Pid::Unknown
    };
    judge_running(root_lock, alive, pid)
}

/// Is a daemon running on this root (as far as this user can tell)?
pub fn daemon_running(root: &StateRoot) -> bool {
    daemon_lock_state(root) == Some(true)
}

/// This process's start time (clock ticks since boot) and PID namespace,
/// for the heartbeat: what lets a reader tell the daemon's pid from a
/// reused one.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThisProcess {
    pub start: Option<u64>,
    pub ns: Option<u64>,
}

pub fn this_process() -> ThisProcess {
    use std::os::unix::fs::MetadataExt;
    static ME: std::sync::OnceLock<ThisProcess> = std::sync::OnceLock::new();
    *ME.get_or_init(|| ThisProcess {
        start: crate::owner::process_start(std::process::id() as i32),
        ns: std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()),
    })
}

// ---- schedule state ------------------------------------------------------------

/// `.daemon/schedule.json`: the last time each agent's schedule fired.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ScheduleState {
    #[serde(default)]
    pub last_fire: BTreeMap<String, Timestamp>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

pub fn schedule_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("schedule.json")
}

pub fn read_schedule_state(root: &StateRoot) -> ScheduleState {
    match atomic::read_json::<ScheduleState>(&schedule_path(root)) {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            // Losing it costs at most one missed catch-up; say so and go on.
            tracing::warn!(
                error_code = "STATE_CORRUPT",
                "{e}; starting without last fire times"
            );
            ScheduleState::default()
        }
    }
}

pub fn write_schedule_state(root: &StateRoot, state: &ScheduleState) -> Result<()> {
    atomic::write_json(&root.store, &schedule_path(root), state)
}

// ---- heartbeat ----------------------------------------------------------------

/// `.daemon/daemon.json`: what the daemon is doing, for other programs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heartbeat {
    pub pid: u32,
    /// The daemon's start time, in clock ticks since boot (/proc/PID/stat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    /// The inode of the daemon's PID namespace (/proc/self/ns/pid): its
    /// pid means something only to a reader in the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    pub version: String,
    pub started_at: Timestamp,
    pub updated_at: Timestamp,
    pub state_root: String,
    pub config: String,
    pub agents: Vec<String>,
    pub running: Vec<RunningEntry>,
    pub waiting: Vec<String>,
    pub next_wakes: BTreeMap<String, Timestamp>,
    pub paused: Option<String>,
    pub stopping: bool,
    /// The health monitor's last look at the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::health::HealthState>,
    /// Agents whose sessions fail: retrying, backing off or disabled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failing: BTreeMap<String, String>,
    /// Credentials whose agents are held (a usage limit, an admin's cap, a
    /// failed login check), by credential name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, HeldEntry>,
    /// A session's OOM kill lowered the concurrent-session limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_lowered: Option<Lowered>,
}

/// `max_concurrent_sessions` lowered after an OOM kill: to `limit` (from
/// `configured`) until `until` (past: no longer lowered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lowered {
    pub limit: usize,
    pub configured: usize,
    pub until: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeldEntry {
    /// `usage_limit`, `disabled` or `credential`.
    pub cause: HeldCause,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunningEntry {
    pub agent: String,
    pub session_id: String,
    pub instance: String,
    pub pid: Option<u32>,
    pub started_at: Timestamp,
    /// The worker host it runs on (`[cluster]`, `local_sessions = false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Why a credential is held, as the heartbeat says: one of the economy's
/// causes, or a word this build does not know (a newer daemon's), kept as
/// written and deciding nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeldCause {
    Known(crate::daemon::economy::Cause),
    Unknown(String),
}

/// The start of a `failing` entry whose agent is disabled (the others say
/// how many failures in a row): written by the daemon, read by `health`.
pub const FAILING_DISABLED: &str = "disabled: ";

/// Whether a heartbeat's `failing` entry says the agent is disabled.
pub fn failing_disabled(why: &str) -> bool {
    why.starts_with(FAILING_DISABLED)
}

/// [`Heartbeat`] as the daemon writes it: the two lists that can hold every
/// agent (`agents`, `next_wakes`) are JSON made once and kept while they do
/// not change. At 10,000 agents, building and serializing them at every
/// session start and end was most of the daemon's CPU per wake. They are
/// written on one line each; the file reads back as a [`Heartbeat`].
#[derive(Debug, Serialize)]
pub struct HeartbeatOut<'a> {
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    pub version: &'a str,
    pub started_at: Timestamp,
    pub updated_at: Timestamp,
    pub state_root: &'a str,
    pub config: &'a str,
    pub agents: &'a serde_json::value::RawValue,
    pub running: Vec<RunningEntry>,
    pub waiting: Vec<String>,
    pub next_wakes: &'a serde_json::value::RawValue,
    pub paused: Option<String>,
    pub stopping: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<&'a super::health::HealthState>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub failing: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held: BTreeMap<String, HeldEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_lowered: Option<Lowered>,
}

/// JSON text kept with the key it was made for: made again only when the
/// key changes.
#[derive(Debug, Default)]
pub struct CachedJson {
    key: Option<u64>,
    json: Option<Box<serde_json::value::RawValue>>,
}

impl CachedJson {
    pub fn get(&mut self, key: u64, make: impl FnOnce() -> String) -> &serde_json::value::RawValue {
        if self.key != Some(key) || self.json.is_none() {
            let text = make();
            self.json = Some(
                serde_json::value::RawValue::from_string(text).unwrap_or_else(|_| {
                    serde_json::value::RawValue::from_string("null".into()).expect("valid JSON")
                }),
            );
            self.key = Some(key);
        }
        self.json.as_deref().expect("set above")
    }
}

pub fn heartbeat_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("daemon.json")
}

/// The heartbeat is a status snapshot, rewritten at every change: replaced
/// atomically but neither fsynced nor pushed to the disk by the replacement
/// ([`atomic::write_file_unsynced`]): after a crash an old one is harmless,
/// and after a power failure it may be empty (see [`read_heartbeat`]).
pub fn write_heartbeat(root: &StateRoot, hb: &HeartbeatOut) -> Result<()> {
    atomic::write_json_unsynced(&root.store, &heartbeat_path(root), hb)
}

/// daemon.json as written, `None` if there is none. An empty one is none
/// too: what a power failure leaves of a heartbeat whose data the disk never
/// got (it is not made durable), not a damaged file.
pub fn read_heartbeat(root: &StateRoot) -> Result<Option<Heartbeat>> {
    let path = heartbeat_path(root);
    match atomic::read_json(&path) {
        Err(e @ Error::Corrupt { .. }) => match crate::fsx::metadata(&path) {
            Ok(Some(m)) if m.st_size == 0 => Ok(None),
            _ => Err(e),
        },
        other => other,
    }
}

/// Where wake requests are dropped: `{agent}/inbox/.wake-{uuid}`. A dotfile,
/// so message scans ignore it; in the inbox, so the inbox watch sees it.
pub fn is_wake_request(name: &str) -> bool {
    name.starts_with(".wake-")
}

pub fn wake_request_path(inbox: &Path) -> PathBuf {
    inbox.join(format!(".wake-{}", uuid::Uuid::new_v4()))
}

/// `.daemon/economy.json`: the credentials' holds and the day's budget
/// notices, kept across restarts (`service/economy.rs` writes it).
pub fn economy_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("economy.json")
}

// ---- the limit an OOM kill lowered ----------------------------------------------

/// `.daemon/oom.json`: the concurrent-session limit the last OOM kill
/// lowered, and until when, kept across a restart or a crash (written at
/// each OOM kill, fsynced; read at start, where a time that has passed
/// means nothing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OomLowering {
    /// `max_concurrent_sessions` is one lower until then.
    pub lowered_until: Timestamp,
    /// The OOM kill that lowered it (for a human reading the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

pub fn oom_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("oom.json")
}

/// `Ok(None)` without the file; an error naming it if it is damaged.
pub fn read_oom_lowering(root: &StateRoot) -> Result<Option<OomLowering>> {
    atomic::read_json(&oom_path(root))
}

pub fn write_oom_lowering(root: &StateRoot, lowering: &OomLowering) -> Result<()> {
    atomic::write_json(&root.store, &oom_path(root), lowering)
}

// ---- the verdict on the last config (re)load ---------------------------------

/// `.daemon/reload.json`: what the daemon made of the config file when it
/// started and at its last reload, for `agent-state reload` (systemd's
/// `ExecReload=`) to wait for and report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReloadVerdict {
    /// One more at every start and reload, across restarts.
    pub generation: u64,
    pub pid: u32,
    pub at: Timestamp,
    /// The file read.
    pub config: String,
    pub accepted: bool,
    /// Why it was refused (each problem), empty if accepted.
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

pub fn reload_verdict_path(root: &StateRoot) -> PathBuf {
    root.daemon_dir().join("reload.json")
}

pub fn read_reload_verdict(root: &StateRoot) -> Option<ReloadVerdict> {
    atomic::read_json(&reload_verdict_path(root)).ok().flatten()
}

/// Record the verdict on the config just read (generation one past the last
/// recorded), and on acceptance the text accepted
/// ([`crate::config::accepted_copy`]), which the CLI falls back to while
/// the file on disk is invalid.
pub fn record_reload_verdict(
    root: &StateRoot,
    config: &Path,
    accepted_text: Option<&str>,
    reasons: Vec<String>,
    at: Timestamp,
) -> Result<ReloadVerdict> {
    if let Some(text) = accepted_text {
        atomic::write_file(
            &root.store,
            &crate::config::accepted_copy(&root.path),
            text.as_bytes(),
            0o640,
        )?;
    }
    let generation = read_reload_verdict(root).map_or(0, |v| v.generation) + 1;
    let verdict = ReloadVerdict {
        generation,
        pid: std::process::id(),
        at,
        config: config.display().to_string(),
        accepted: accepted_text.is_some(),
        reasons,
        extra: Map::new(),
    };
    atomic::write_json(&root.store, &reload_verdict_path(root), &verdict)?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_cause_reads_the_economy_words_and_keeps_unknown_ones() {
        use crate::daemon::economy::Cause;
        let table = [
            ("usage_limit", HeldCause::Known(Cause::UsageLimit)),
            ("disabled", HeldCause::Known(Cause::Disabled)),
            ("credential", HeldCause::Known(Cause::Credential)),
            ("quota", HeldCause::Unknown("quota".into())),
        ];
        for (word, want) in table {
            let json = serde_json::Value::String(word.into());
            let got: HeldCause = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(got, want, "{word:?}");
            assert_eq!(serde_json::to_value(&got).unwrap(), json, "{word:?} back");
        }
    }

    #[test]
    fn failing_disabled_reads_what_the_daemon_writes() {
        assert!(failing_disabled(&format!("{FAILING_DISABLED}bad key")));
        assert!(!failing_disabled("3 failure(s) in a row; held back"));
        assert!(!failing_disabled(
            "3 failure(s) in a row; held back until 2026-01-01T00:00:00Z"
        ));
    }

    #[test]
    fn the_heartbeat_as_written_reads_back_and_its_lists_are_made_once() {
        let mut agents = CachedJson::default();
        let mut made = 0;
        for _ in 0..3 {
            agents.get(7, || {
                made += 1;
                r#"["clay","rio"]"#.to_string()
            });
        }
        assert_eq!(made, 1, "made again although its key did not change");
        let wakes = r#"{"rio":"2026-11-24T12:00:00Z"}"#.to_string();
        let mut wakes_json = CachedJson::default();
        let t = Timestamp::parse("2026-11-24T10:00:00Z").unwrap();
        let out = HeartbeatOut {
            pid: 42,
            pid_start: Some(7),
            pid_ns: None,
            version: "0.1.0",
            started_at: t,
            updated_at: t,
            state_root: "/var/lib/x",
            config: "/etc/x.toml",
            agents: agents.get(7, String::new),
            running: vec![RunningEntry {
                agent: "rio".into(),
                session_id: "20261124-100000".into(),
                instance: "rio-001".into(),
                pid: Some(9),
                started_at: t,
                host: None,
            }],
            waiting: vec!["clay".into()],
            next_wakes: wakes_json.get(1, || wakes),
            paused: None,
            stopping: false,
            health: None,
            failing: BTreeMap::from([("clay".to_string(), "disabled: x".to_string())]),
            held: BTreeMap::new(),
            concurrency_lowered: None,
        };
        let text = serde_json::to_string_pretty(&out).unwrap();
        let back: Heartbeat = serde_json::from_str(&text).unwrap();
        assert_eq!(back.agents, ["clay", "rio"]);
        assert_eq!(back.next_wakes["rio"].to_string(), "2026-11-24T12:00:00Z");
        assert_eq!(back.running[0].instance, "rio-001");
        assert_eq!(back.waiting, ["clay"]);
        assert_eq!(back.failing["clay"], "disabled: x");
        // Changed key: made again.
        assert_eq!(agents.get(8, || "[]".into()).get(), "[]");
    }

    /// An empty daemon.json (a power failure's leftover: it is never made
    /// durable) is no heartbeat; any other unreadable one is an error.
    #[test]
    fn an_empty_heartbeat_is_none_and_a_damaged_one_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        std::fs::create_dir_all(root.daemon_dir()).unwrap();
        assert!(read_heartbeat(&root).unwrap().is_none(), "missing");
        std::fs::write(heartbeat_path(&root), b"").unwrap();
        assert!(read_heartbeat(&root).unwrap().is_none(), "empty");
        std::fs::write(heartbeat_path(&root), b"{\"pid\": 1,").unwrap();
        assert!(matches!(read_heartbeat(&root), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn the_runtime_lock_goes_to_the_runtime_dir_or_to_run_for_root() {
        let xdg = Some(PathBuf::from("/run/user/1000"));
        assert_eq!(
            runtime_dir(None, xdg.clone(), false),
            xdg.map(|x| x.join("agent-state"))
        );
        assert_eq!(
            runtime_dir(None, None, true),
            Some(PathBuf::from("/run/agent-state"))
        );
        assert_eq!(runtime_dir(None, Some("relative".into()), false), None);
        assert_eq!(runtime_dir(None, None, false), None);
        let unit = Some(PathBuf::from("/run/agent-state:/run/other"));
        assert_eq!(
            runtime_dir(unit, None, false),
            Some(PathBuf::from("/run/agent-state"))
        );
    }

    #[test]
    fn the_runtime_lock_name_is_fixed_per_root() {
        let a = runtime_lock_name(Path::new("/var/lib/agent-state"));
        assert_eq!(a, runtime_lock_name(Path::new("/var/lib/agent-state")));
        assert_ne!(a, runtime_lock_name(Path::new("/var/lib/agent-state2")));
        assert_eq!(a.len(), "root-.lock".len() + 16);
        // FNV-1a's published value for the empty input.
        assert_eq!(
            runtime_lock_name(Path::new("")),
            "root-cbf29ce484222325.lock"
        );
    }
    #[test]
    fn whether_a_daemon_runs_is_judged_from_the_locks_and_the_pid() {
        use Pid::*;
        use Probe::*;
        // (.daemon/lock, .daemon/alive.lock, the heartbeat's pid) → verdict
        let table = [
            // Who can open .daemon/lock (the service user, root; a member on
            // an install from before) takes its word, whatever else says.
            (Held, Denied, Unknown, Some(true)),
            (Held, Free, Gone, Some(true)),
            (Free, Held, Same, Some(false)),
            (Free, Denied, Unknown, Some(false)),
            (Missing, Missing, Unknown, Some(false)),
            // A member: the daemon's alive.lock.
            (Denied, Held, Same, Some(true)),
            (Denied, Held, Unknown, Some(true)),
            (Denied, Free, Same, Some(false)),
            (Denied, Free, Unknown, Some(false)),
            (Denied, Missing, Unknown, Some(false)),
            // Held, but the daemon it stood for is gone (or its pid is
            // another process now): a member holds an old one.
            (Denied, Held, Gone, Some(false)),
            // Outside the group: not knowable.
            (Denied, Denied, Unknown, None),
            (Denied, Denied, Same, None),
        ];
        for (root_lock, alive, pid, want) in table {
            assert_eq!(
                judge_running(root_lock, alive, pid),
                want,
                "{root_lock:?} {alive:?} {pid:?}"
            );
        }
    }

    #[test]
    fn the_alive_lock_is_made_anew_and_held_whoever_held_the_old_one() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        atomic::create_dir(&root.daemon_dir(), 0o750).unwrap();
        let path = root.daemon_dir().join(ALIVE);
        // Somebody holds the last daemon's file.
        std::fs::write(&path, "").unwrap();
        let old = Flock::lock(File::open(&path).unwrap(), FlockArg::LockSharedNonblock).unwrap();
        assert_eq!(probe(&path), Probe::Free);
        let alive = raise_alive(&root).unwrap();
        assert_eq!(probe(&path), Probe::Held);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, ALIVE_MODE);
        drop(alive);
        assert_eq!(probe(&path), Probe::Free);
        drop(old);
        assert_eq!(probe(&root.daemon_dir().join("none")), Probe::Missing);
        // Only the alive lock is left in .daemon/ (no temp).
        let names = crate::fsx::list(&root.daemon_dir()).unwrap();
        assert_eq!(names, [std::ffi::OsString::from(ALIVE)]);
    }

    #[test]
    fn the_root_lock_is_the_service_users_alone_and_narrowed_at_start() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = StateRoot::new(tmp.path());
        atomic::create_dir(&root.daemon_dir(), 0o750).unwrap();
        let path = root.daemon_dir().join("lock");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(daemon_lock_state(&root), Some(false));
        let held = lock_root(&root).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, LOCK_FILE_MODE);
        assert_eq!(daemon_lock_state(&root), Some(true));
        assert!(held.check().is_ok());
        // A second daemon: refused while the first holds it.
        let e = lock_root(&root).err().expect("a second daemon");
        assert!(e.to_string().contains("already running"), "{e}");
        drop(held);
        assert_eq!(daemon_lock_state(&root), Some(false));

        // Somebody who opened it while it was open to the group holds a
        // shared lock on it for good: the daemon replaces it and runs.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let member = Flock::lock(File::open(&path).unwrap(), FlockArg::LockSharedNonblock).unwrap();
        let held = lock_root(&root).unwrap();
        assert!(held.check().is_ok());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, LOCK_FILE_MODE);
        assert_eq!(daemon_lock_state(&root), Some(true));
        let names = crate::fsx::list(&root.daemon_dir()).unwrap();
        let mut names: Vec<_> = names
            .iter()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [ALIVE, "lock"],
            "the old one is removed, no temp is left"
        );
        drop(member);
        drop(held);
    }
}
