//! The per-agent lock: `{agent}/.lock`, held (flock, exclusive) for every
//! read-modify-write of the agent's files by the CLI and the daemon alike.
//!
//! flock is released by the kernel when the holder dies, so a killed hook can
//! never leave an agent locked.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::AgentDir;
use crate::error::{Error, IoContext, Result};

/// Held while alive; dropping it releases the lock.
pub struct AgentLock {
    _lock: Flock<File>,
}

/// Open (creating it with `mode` if needed) a file that exists to be
/// flocked; its content is never written.
pub fn open_lock_file(path: &Path, mode: u32) -> Result<File> {
    // flock needs no write access, and a lock file held open for writing
    // would keep its file system from being remounted read-only: open it
    // for reading, creating it first if it is missing.
    match OpenOptions::new().read(true).open(path) {
        Ok(file) => return Ok(file),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(crate::error::Error::io("opening lock file", path, e));
        }
        Err(_) => {}
    }
    drop(
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(mode)
            .open(path)
            .at("creating lock file", path)?,
    );
    OpenOptions::new()
        .read(true)
        .open(path)
        .at("opening lock file", path)
}

/// Block until `agent`'s lock is ours.
pub fn lock(agent: &AgentDir) -> Result<AgentLock> {
    let path = agent.lock_file();
    let file = open_lock_file(&path, 0o660)?;
    // Every writer in the agent's group must be able to take the lock; the
    // umask may have narrowed the mode it was created with.
    if let Ok(meta) = file.metadata()
        && meta.permissions().mode() & 0o777 != 0o660
        && meta.uid() == nix::unistd::geteuid().as_raw()
    {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o660));
    }
    let lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| Error::io("locking", &path, errno.into()))?;
    Ok(AgentLock { _lock: lock })
}
