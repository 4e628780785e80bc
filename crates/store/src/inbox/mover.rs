//! A claim's renames from the inbox into `.claimed/S/`: made at once, or for
//! a big claim by a helper thread while the claim reads the next file.
//!
//! Each rename moves whatever has the name by then. A sender who can write
//! the inbox could swap the checked file for another (a link, a FIFO,
//! other words) between the check and the rename: so after each rename the
//! file in `.claimed/S/` (private to the daemon: no one swaps there) is
//! compared with the one checked (see `Stamp::still`). One that is not it
//! goes back to the inbox, to be judged like any new file, and its name is
//! reported as swapped: the claim writes the checked message in its place.

use super::*;

/// From how many listed names a claim's renames are made by a helper
/// thread: the next file is then read and validated on the caller's thread
/// while this one is renamed. A claim is serialized with every other
/// cross-directory rename of the file system by its rename lock; what the
/// claim does between its renames need not be.
pub(super) const MOVER_BATCH: usize = 32;

/// Moves claimed files from the inbox into `.claimed/S/`, in the order
/// given: at once, or by a helper thread (see [`MOVER_BATCH`]).
pub(super) struct Mover<'scope, 'a> {
    from: std::os::fd::BorrowedFd<'a>,
    to: std::os::fd::OwnedFd,
    inbox: PathBuf,
    claimed: PathBuf,
    helper: Option<Helper<'scope>>,
    /// Names whose claimed file was not the one checked (see the module).
    swapped: Vec<String>,
    /// Set when the claim gives up (an error of its own): the helper stops
    /// before its next rename, and what was queued stays in the inbox.
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The helper thread: the names to rename, with the files checked; it
/// returns the names found swapped.
type Helper<'scope> = (
    std::sync::mpsc::Sender<(String, Option<Stamp>)>,
    std::thread::ScopedJoinHandle<'scope, Result<Vec<String>>>,
);

impl<'scope, 'a: 'scope> Mover<'scope, 'a> {
    pub(super) fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        threaded: bool,
        from: std::os::fd::BorrowedFd<'a>,
        to: std::os::fd::OwnedFd,
        agent: &AgentDir,
        claimed: &Path,
    ) -> Mover<'scope, 'a> {
        let mut mover = Mover {
            from,
            to,
            inbox: agent.inbox(),
            claimed: claimed.to_path_buf(),
            helper: None,
            swapped: Vec::new(),
            abandoned: Default::default(),
        };
        // Without a second handle of `.claimed/S/`, the renames stay here.
        if let (true, Ok(to)) = (threaded, mover.to.try_clone()) {
            let (tx, rx) = std::sync::mpsc::channel::<(String, Option<Stamp>)>();
            let (inbox, claimed) = (mover.inbox.clone(), mover.claimed.clone());
            let abandoned = mover.abandoned.clone();
            let done = scope.spawn(move || {
                let mut swapped = Vec::new();
                for (name, checked) in rx {
                    if abandoned.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    if move_claimed(from, to.as_fd(), &inbox, &claimed, &name, checked)? {
                        swapped.push(name);
                    }
                }
                Ok(swapped)
            });
            mover.helper = Some((tx, done));
        }
        mover
    }

    /// Claim `name`, checked as the file `checked`: renamed now, or queued
    /// for the helper. An error of the helper's is returned here (its
    /// renames stop at it) or by [`Mover::finish`].
    pub(super) fn claim(&mut self, name: &str, checked: Option<Stamp>) -> Result<()> {
        match &self.helper {
            None => {
                #[cfg(test)]
                BEFORE_RENAME.with(|hook| hook.borrow().as_ref().map(|h| h(name)));
                let (from, to) = (self.from, self.to.as_fd());
                if move_claimed(from, to, &self.inbox, &self.claimed, name, checked)? {
                    self.swapped.push(name.to_string());
                }
                Ok(())
            }
            Some((tx, _)) => match tx.send((name.to_string(), checked)) {
                Ok(()) => Ok(()),
                // The helper stopped at an error: that error.
                Err(_) => {
                    self.finish()?;
                    Err(Error::io(
                        "renaming",
                        self.inbox.join(name),
                        std::io::Error::other("the claim's renames stopped"),
                    ))
                }
            },
        }
    }

    /// Wait for every queued rename.
    pub(super) fn finish(&mut self) -> Result<()> {
        match self.helper.take() {
            None => Ok(()),
            Some((tx, done)) => {
                drop(tx);
                match done.join() {
                    Ok(result) => {
                        self.swapped.extend(result?);
                        Ok(())
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
    }

    /// The names claimed whose file was swapped before its rename (put
    /// back in the inbox), once [`Mover::finish`] returned.
    pub(super) fn swapped(&self) -> &[String] {
        &self.swapped
    }

    /// `.claimed/S/`, for its sync.
    pub(super) fn to(&self) -> std::os::fd::BorrowedFd<'_> {
        self.to.as_fd()
    }
}

/// Dropped before [`Mover::finish`]: the claim failed on its own side.
impl Drop for Mover<'_, '_> {
    fn drop(&mut self) {
        if self.helper.is_some() {
            self.abandoned
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
pub(super) type Hook = Box<dyn Fn(&str)>;

#[cfg(test)]
thread_local! {
    /// Run before each rename made on the caller's thread: a unit test's
    /// way to swap a file between the claim's check and its rename.
    pub(super) static BEFORE_RENAME: std::cell::RefCell<Option<Hook>> =
        const { std::cell::RefCell::new(None) };
}

/// Rename `name` from the inbox into `.claimed/S/`, by the two handles.
/// `true`: what was renamed is not the file `checked`; it went back to the
/// inbox. (`None`: not compared.)
fn move_claimed(
    from: std::os::fd::BorrowedFd<'_>,
    to: std::os::fd::BorrowedFd<'_>,
    inbox: &Path,
    claimed: &Path,
    name: &str,
    checked: Option<Stamp>,
) -> Result<bool> {
    let path = claimed.join(name);
    fsx::rename_at(from, name.as_ref(), to, name.as_ref(), false).map_err(|e| {
        Error::io(
            "renaming",
            inbox.join(name),
            std::io::Error::new(e.kind(), format!("to {}: {e}", path.display())),
        )
    })?;
    let Some(checked) = checked else {
        return Ok(false);
    };
    match fsx::stat_at(to, name.as_ref(), &path)? {
        Some(st) if checked.still(&st) => Ok(false),
        Some(_) => {
            move_unique_unsynced(&path, inbox, name)?;
            Ok(true)
        }
        None => Ok(true),
    }
}
