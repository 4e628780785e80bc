//! A claim's renames from the inbox into `.claimed/S/`: made at once, or for
//! a big claim by a helper thread while the claim reads the next file.

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
    helper: Option<(
        std::sync::mpsc::Sender<String>,
        std::thread::ScopedJoinHandle<'scope, Result<()>>,
    )>,
    /// Set when the claim gives up (an error of its own): the helper stops
    /// before its next rename, and what was queued stays in the inbox.
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

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
            abandoned: Default::default(),
        };
        // Without a second handle of `.claimed/S/`, the renames stay here.
        if let (true, Ok(to)) = (threaded, mover.to.try_clone()) {
            let (tx, rx) = std::sync::mpsc::channel::<String>();
            let (inbox, claimed) = (mover.inbox.clone(), mover.claimed.clone());
            let abandoned = mover.abandoned.clone();
            let done = scope.spawn(move || {
                for name in rx {
                    if abandoned.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    move_claimed(from, to.as_fd(), &inbox, &claimed, &name)?;
                }
                Ok(())
            });
            mover.helper = Some((tx, done));
        }
        mover
    }

    /// Claim `name`: renamed now, or queued for the helper. An error of
    /// the helper's is returned here (its renames stop at it) or by
    /// [`Mover::finish`].
    pub(super) fn claim(&mut self, name: &str) -> Result<()> {
        match &self.helper {
            None => move_claimed(self.from, self.to.as_fd(), &self.inbox, &self.claimed, name),
            Some((tx, _)) => match tx.send(name.to_string()) {
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
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
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

/// Rename `name` from the inbox into `.claimed/S/`, by the two handles.
fn move_claimed(
    from: std::os::fd::BorrowedFd<'_>,
    to: std::os::fd::BorrowedFd<'_>,
    inbox: &Path,
    claimed: &Path,
    name: &str,
) -> Result<()> {
    fsx::rename_at(from, name.as_ref(), to, name.as_ref(), false).map_err(|e| {
        Error::io(
            "renaming",
            inbox.join(name),
            std::io::Error::new(
                e.kind(),
                format!("to {}: {e}", claimed.join(name).display()),
            ),
        )
    })
}
