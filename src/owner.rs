//! Who owns a running session, known across PID namespaces and sandboxes.
//!
//! A session is owned by the process that began it: the daemon, or a
//! session script run by cron. Under the shipped unit (`PrivateUsers=`,
//! `ProtectProc=invisible`) or in a PID namespace the daemon cannot see a
//! script's process, so liveness is never decided from a pid alone. The
//! owner holds an exclusive `flock` on `{agent}/sessions/{id}.owner` for the
//! session's life:
//!
//! * the daemon keeps the lock with the running session;
//! * a script's `session begin` is a short-lived command, so it hands the
//!   locked descriptor to a small detached keeper (`agent-state session
//!   keep`, no terminal, no inherited output) that holds it until the
//!   script exits or the session ends (the lock file is removed).
//!
//! Anyone can then ask: the file is locked → the owner is alive; it exists
//! and is not locked → the owner is gone (the kernel released the lock when
//! it died); there is no file (a session begun by an older version, or by
//! hand) → decided from the pid where that is sound, otherwise the session
//! is taken to be alive until its timeout.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};
use crate::state::AgentDir;

/// The owner lock of `session_id`.
pub fn lock_path(dir: &AgentDir, session_id: &str) -> PathBuf {
    dir.sessions_dir().join(format!("{session_id}.owner"))
}

/// An owner lock, held while this value (or the descriptor it became) lives.
#[derive(Debug)]
pub struct OwnerLock {
    lock: Flock<File>,
}

impl OwnerLock {
    /// The locked descriptor, to hand to a keeper process. The lock belongs
    /// to the open file, so it stays held while any copy of the descriptor
    /// is open: a copy is made and the `Flock` is forgotten (dropping it
    /// would unlock the open file). For the short-lived `session begin` only.
    pub fn into_fd(self) -> Result<OwnedFd> {
        let dup = nix::unistd::dup(self.lock.as_fd())
            .map_err(|e| Error::io("duplicating", "the owner lock", e.into()))?;
        std::mem::forget(self.lock);
        Ok(dup)
    }
}

/// Create and lock the owner lock of a new session.
pub fn take(dir: &AgentDir, session_id: &str) -> Result<OwnerLock> {
    let path = lock_path(dir, session_id);
    crate::state::atomic::create_dir(&dir.sessions_dir(), crate::state::bootstrap::AGENT_DIR_MODE)?;
    let file = crate::fsx::open_create(&path, 0o644, false)?;
    // Opened for writing only to create it; flock needs no mode.
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(OwnerLock { lock }),
        Err((_, Errno::EWOULDBLOCK)) => Err(Error::Data(format!(
            "{} is held by another process: session {session_id} has an owner already",
            path.display()
        ))),
        Err((_, e)) => Err(Error::io("locking", &path, e.into())),
    }
}

/// Remove the owner lock of an ended session (whoever holds it: a keeper
/// notices and exits).
pub fn release(dir: &AgentDir, session_id: &str) {
    let _ = crate::fsx::remove_file(&lock_path(dir, session_id));
}

/// What is known of a running session's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// It holds its lock (or, without one, its process is seen running).
    Alive,
    /// Its lock is free (or its process is known to be gone).
    Gone,
    /// It cannot be known: taken to be alive until the session's timeout.
    Unknown,
}

/// The state of `session_id`'s owner, `pid`/`start` as session.json
/// recorded them (used only for sessions without an owner lock).
pub fn state(dir: &AgentDir, session_id: &str, pid: Option<i32>, start: Option<u64>) -> State {
    let path = lock_path(dir, session_id);
    match crate::fsx::open_read(&path) {
        Ok(Some(file)) => match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_) => State::Gone,
            // Held: alive, unless its pid is known for certain to be gone
            // (its keeper notices within a second and lets go).
            Err((_, Errno::EWOULDBLOCK)) => match pid {
                Some(pid) if by_pid(pid, start) == State::Gone => State::Gone,
                _ => State::Alive,
            },
            Err(_) => State::Unknown,
        },
        Ok(None) => match pid {
            Some(pid) => by_pid(pid, start),
            None => State::Unknown,
        },
        // A link or a FIFO in its place: nothing can be concluded.
        Err(_) => State::Unknown,
    }
}

/// A session without an owner lock (begun by an older version): its pid.
/// `kill(pid, 0)` sees processes `/proc` hides (`ProtectProc=invisible`);
/// "no such process" means gone only in the first PID namespace: in any
/// other the owner may live outside it.
fn by_pid(pid: i32, start: Option<u64>) -> State {
    if pid <= 0 {
        return State::Unknown;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => match (crate::hooks::process_start(pid), start) {
            (Some(now), Some(then)) if now != then => State::Gone,
            _ => State::Alive,
        },
        Err(Errno::ESRCH) if in_initial_pid_namespace() => State::Gone,
        Err(_) => State::Unknown,
    }
}

/// Whether this process lives in the system's first PID namespace.
fn in_initial_pid_namespace() -> bool {
    // PROC_PID_INIT_INO: the inode of the initial PID namespace.
    const INIT: u64 = 0xEFFF_FFFC;
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m) == INIT)
        .unwrap_or(false)
}

/// Hand `lock` to a detached keeper that holds it while `owner` (the
/// script, seen from here) runs. The keeper is `agent-state session keep`:
/// its own session (no terminal), stdin/stdout/stderr on /dev/null (so a
/// `$(agent-state session begin …)` does not wait for it).
pub fn spawn_keeper(lock: OwnerLock, owner: i32, path: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let fd = lock.into_fd()?;
    let raw = fd.as_raw_fd();
    let exe = std::env::current_exe().map_err(|e| Error::io("finding", "agent-state", e))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["session", "keep", "--fd", "3", "--pid"])
        .arg(owner.to_string())
        .arg("--lock")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            // The locked descriptor becomes fd 3 (dup2 clears CLOEXEC).
            if nix::libc::dup2(raw, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("starting the session's owner keeper", path, e))?;
    drop(fd);
    // Reaped by init once we exit; do not wait for it.
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// The keeper: hold descriptor `fd` (the locked owner lock) until `owner`
/// exits or the lock file is removed (the session ended). Polls once a
/// second: it has nothing else to do and must not need anything the
/// sandbox may deny.
pub fn keep(fd: i32, owner: i32) -> u8 {
    let file = unsafe { File::from_raw_fd(fd) };
    loop {
        let alive = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(owner), None),
            Ok(()) | Err(Errno::EPERM)
        );
        let linked = file
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::nlink(&m) > 0)
            .unwrap_or(false);
        if !alive || !linked {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(file);
    0
}
