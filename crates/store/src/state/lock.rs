//! The per-agent lock: `{agent}/.lock`, held (flock, exclusive) for every
//! read-modify-write of the agent's files by the CLI and the daemon alike.
//!
//! flock is released by the kernel when the holder dies, so a killed hook can
//! never leave an agent locked. Anyone who can open a file can flock it
//! (read access is enough), so the locks only the service user (and root)
//! take — this one, `.daemon/counters.lock`, a flow's `.lock` — are
//! [`LOCK_FILE_MODE`] (0600): a member of the inbox group, who may send
//! mail, cannot open them and so cannot hold an agent back. Whoever can
//! still open it (the service user, root) is bounded all the same:
//! the daemon waits [`DAEMON_WAIT`] and defers that agent's work (its loop
//! serves every other agent meanwhile), a command waits [`CLI_WAIT`] and then
//! fails with [`Error::LockBusy`], naming the file and how to find the holder.
//! The file is opened without following a link and must be a regular file
//! (a FIFO in its place would block the opener forever).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::AgentDir;
use crate::error::{Error, Result};

/// How long a command waits for a lock before giving up: far longer than
/// any state change holds it (milliseconds), short enough that a script is
/// not hung by somebody holding it.
pub const CLI_WAIT: Duration = Duration::from_secs(10);
/// How long the daemon's loop waits before deferring that agent's work:
/// far longer than a state change holds the lock, even on a loaded machine,
/// and paid once (the daemon tries a lock that was busy last time without
/// waiting, [`AgentDir::with_lock_wait`]).
pub const DAEMON_WAIT: Duration = Duration::from_millis(250);

/// The mode of the lock files only the service user and root take: owner
/// only, so nobody else can open (and so flock) them.
pub const LOCK_FILE_MODE: u32 = 0o600;

/// Held while alive; dropping it releases the lock.
pub struct AgentLock {
    _lock: Flock<File>,
}

/// Open (creating it with `mode` if needed) a regular file that exists to be
/// flocked; never through a link, never a FIFO; its content is never written.
pub fn open_lock_file(path: &Path, mode: u32) -> Result<File> {
    // flock needs no write access, and a lock file held open for writing
    // would keep its file system from being remounted read-only.
    crate::fsx::open_lock(path, mode)
}

/// Take an exclusive flock on `file`, trying for at most `bound` (polling
/// with a growing pause: flock has no timeout). The bound is a value its
/// caller passes: a root's or an agent's `lock_wait` ([`CLI_WAIT`] unless
/// the daemon gave it [`DAEMON_WAIT`] or less).
pub fn flock_within(mut file: File, path: &Path, bound: Duration) -> Result<Flock<File>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, Errno::EWOULDBLOCK)) => {
                let waited = started.elapsed();
                if waited >= bound {
                    return Err(Error::LockBusy {
                        path: path.to_path_buf(),
                        waited_ms: waited.as_millis() as u64,
                    });
                }
                std::thread::sleep(pause.min(bound - waited));
                pause = (pause * 2).min(Duration::from_millis(50));
                file = f;
            }
            Err((_, Errno::EINTR)) => {
                return Err(Error::io("locking", path, Errno::EINTR.into()));
            }
            Err((_, errno)) => return Err(Error::io("locking", path, errno.into())),
        }
    }
}

/// Take `agent`'s lock, waiting at most its `lock_wait`.
pub fn lock(agent: &AgentDir) -> Result<AgentLock> {
    lock_within(agent, agent.lock_wait)
}

/// Take `agent`'s lock, waiting at most `bound`.
pub fn lock_within(agent: &AgentDir, bound: Duration) -> Result<AgentLock> {
    let path = agent.lock_file();
    let file = open_private_lock(&path)?;
    Ok(AgentLock {
        _lock: flock_within(file, &path, bound)?,
    })
}

/// [`lock`], but only if nobody holds it now (`LockBusy` at once if somebody
/// does): the batched bootstrap leaves a busy agent to [`lock`]'s bounded wait.
pub fn try_lock(agent: &AgentDir) -> Result<AgentLock> {
    let path = agent.lock_file();
    let file = open_private_lock(&path)?;
    Ok(AgentLock {
        _lock: flock_within(file, &path, Duration::ZERO)?,
    })
}

/// Open (creating it if needed) a lock file only the service user and root
/// may take, and narrow an older, wider mode (0660 or 0640: the inbox
/// group could hold it) to [`LOCK_FILE_MODE`] when this user may: its
/// owner, or root.
pub fn open_private_lock(path: &Path) -> Result<File> {
    let file = open_lock_file(path, LOCK_FILE_MODE)?;
    // Best effort: a read-only file system still lets the lock be taken.
    let _ = narrow_mode(&file, path);
    Ok(file)
}

/// Set an open lock file's mode to [`LOCK_FILE_MODE`] if it is another
/// and this user may change it; whether it did.
pub fn narrow_mode(file: &File, path: &Path) -> Result<bool> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io("inspecting", path, e))?;
    let euid = nix::unistd::geteuid();
    if meta.permissions().mode() & 0o7777 == LOCK_FILE_MODE
        || !(euid.is_root() || meta.uid() == euid.as_raw())
    {
        return Ok(false);
    }
    file.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE))
        .map_err(|e| Error::io("setting the mode of", path, e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_given_up_after_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".lock");
        let held = flock_within(
            open_lock_file(&path, LOCK_FILE_MODE).unwrap(),
            &path,
            CLI_WAIT,
        )
        .unwrap();
        let t0 = Instant::now();
        let Err(e) = flock_within(
            open_lock_file(&path, LOCK_FILE_MODE).unwrap(),
            &path,
            Duration::from_millis(30),
        ) else {
            panic!("a held lock was taken");
        };
        assert!(matches!(e, Error::LockBusy { .. }), "{e}");
        assert!(e.to_string().contains("fuser -v"), "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(30));
        drop(held);
        flock_within(
            open_lock_file(&path, LOCK_FILE_MODE).unwrap(),
            &path,
            CLI_WAIT,
        )
        .unwrap();
    }
}
