//! Old versions of state files, kept under their temp names for a moment
//! and removed off a hook's path.
//!
//! Replacing a small synced file costs what freeing its old version's
//! blocks costs, inside the `rename` (`bench/hooks/frees.py`: 1.1 ms on an
//! ext4 mounted `discard`, against 0.016 ms when another link keeps it). A
//! session hook replaces several, and its caller waits for every one. A
//! store that defers removals ([`crate::state::Store::deferring_removals`])
//! puts each staged file in place by exchanging the two names
//! (`RENAME_EXCHANGE`, as atomic as the rename: a reader sees the old file or
//! the new one), so the old version stays linked under the temp name; the
//! hook hands them to [`Replaced::remove_detached`], a forked child that
//! unlinks them after the hook has exited. One left by a crash is a temp
//! name, which the daemon's prune removes (`prune::is_temp_name`).

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::sync::Mutex;

use nix::libc;

/// The old versions a deferring store's commits left behind, shared by the
/// store's clones.
#[derive(Default)]
pub(crate) struct Pending(Mutex<Vec<Old>>);

/// One old version: its directory (a handle, never a path that could be
/// swapped for a link) and its temp name there.
struct Old {
    dir: OwnedFd,
    name: CString,
}

impl Pending {
    /// Remember the old version now named `name` in `dir`. Without a
    /// handle of its own on the directory it is removed at once.
    pub(crate) fn push(&self, dir: &OwnedFd, name: OsString) {
        let Ok(name) = CString::new(name.into_vec()) else {
            return;
        };
        match dir.try_clone() {
            Ok(dir) => self.lock().push(Old { dir, name }),
            Err(_) => unlink(dir.as_raw_fd(), &name),
        }
    }

    pub(crate) fn take(&self) -> Replaced {
        Replaced(std::mem::take(&mut *self.lock()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Old>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Old versions nobody took (a hook that failed after its commit): removed
/// with the last clone of their store.
impl Drop for Pending {
    fn drop(&mut self) {
        drop(Replaced(std::mem::take(&mut *self.lock())));
    }
}

/// Old versions to remove. Dropped, they are removed at once.
#[must_use = "dropped, the old versions are removed at once, on the caller's path"]
pub struct Replaced(Vec<Old>);

impl Replaced {
    pub(crate) fn none() -> Replaced {
        Replaced(Vec::new())
    }

    /// How many old versions wait.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Remove them now.
    pub fn remove(mut self) {
        for old in self.0.drain(..) {
            unlink(old.dir.as_raw_fd(), &old.name);
        }
    }

    /// Remove them in a forked child, so that the caller (a session
    /// script waiting for its hook) does not wait for the frees. The child
    /// has no stdin, stdout or stderr (a `$(agent-state session begin …)`
    /// waits for every writer of its pipe) and no other file of this
    /// process. Where no child can be forked, they are removed here.
    ///
    /// Only for a single-threaded process (a hook starts no thread): the
    /// child makes only async-signal-safe calls, on memory prepared before
    /// the fork.
    pub fn remove_detached(mut self) {
        if self.0.is_empty() {
            return;
        }
        let dev_null = c"/dev/null";
        let keep: Vec<RawFd> = self.0.iter().map(|o| o.dir.as_raw_fd()).collect();
        let highest = keep.iter().copied().max().unwrap_or(2);
        // SAFETY: fork() in a single-threaded process; the child below only
        // makes async-signal-safe calls and leaves by _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            self.remove();
            return;
        }
        if pid == 0 {
            // SAFETY: in the child, on fds and strings prepared above.
            unsafe {
                let null = libc::open(dev_null.as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    for std_fd in 0..3 {
                        libc::dup2(null, std_fd);
                    }
                    if null > 2 && !keep.contains(&null) {
                        libc::close(null);
                    }
                }
                for fd in 3..highest {
                    if !keep.contains(&fd) {
                        libc::close(fd);
                    }
                }
                libc::syscall(libc::SYS_close_range, highest + 1, libc::c_uint::MAX, 0);
                for old in &self.0 {
                    libc::unlinkat(old.dir.as_raw_fd(), old.name.as_ptr(), 0);
                }
                libc::_exit(0);
            }
        }
        // The child removes them; this process only closes its handles.
        self.0.clear();
    }
}

impl Drop for Replaced {
    fn drop(&mut self) {
        for old in self.0.drain(..) {
            unlink(old.dir.as_raw_fd(), &old.name);
        }
    }
}

fn unlink(dir: RawFd, name: &CString) {
    // SAFETY: a directory fd this process owns and a NUL-terminated name.
    unsafe {
        libc::unlinkat(dir, name.as_ptr(), 0);
    }
}
