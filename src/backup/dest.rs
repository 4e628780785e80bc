//! Where a backup is written: `DEST.partial`, created in DEST's directory
//! with `O_CREAT|O_EXCL|O_NOFOLLOW` and mode `0600`, renamed onto DEST when
//! whole. A link or anything else planted at `DEST.partial` is refused, never
//! followed (a victim file would be overwritten, DEST become a link to it);
//! the archive holds every inbox, so nobody but its writer may read it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};

use crate::error::{Error, Result};

/// The mode of an archive: its writer's only.
pub const ARCHIVE_MODE: u32 = 0o600;

/// `DEST.partial`, open for writing, and the directory both are in.
pub struct Partial {
    pub file: File,
    pub path: PathBuf,
    dir: OwnedFd,
}

/// Create `DEST.partial`. A regular file of this user's there is a backup
/// that did not finish (removed and created anew); anything else there is
/// somebody's input, refused with its name.
pub fn create(dest: &Path) -> Result<Partial> {
    let name = dest
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{} names no file", dest.display())))?;
    let mut partial_name = name.to_os_string();
    partial_name.push(".partial");
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let path = parent.join(&partial_name);
    // The destination's directory is the operator's choice: opened as named.
    let dir: OwnedFd = File::open(parent)
        .map_err(|e| Error::io("opening the backup's directory", parent, e))?
        .into();
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mode = Mode::from_bits_truncate(ARCHIVE_MODE);
    let open = || nix::fcntl::openat(dir.as_fd(), partial_name.as_os_str(), flags, mode);
    let fd = match open() {
        Err(Errno::EEXIST) if leftover(&dir, &partial_name) => {
            nix::unistd::unlinkat(
                dir.as_fd(),
                partial_name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )
            .map_err(|e| Error::io("removing the unfinished", &path, e.into()))?;
            open()
        }
        other => other,
    };
    let fd = fd.map_err(|e| match e {
        Errno::EEXIST => Error::Usage(format!(
            "{} exists and is not an unfinished backup of this user's (a link or somebody's file): never written through; remove it or choose another DEST",
            path.display()
        )),
        e => Error::io("creating", &path, e.into()),
    })?;
    // The umask only narrows; set exactly.
    nix::sys::stat::fchmod(&fd, mode)
        .map_err(|e| Error::io("setting the mode of", &path, e.into()))?;
    Ok(Partial {
        file: File::from(fd),
        path,
        dir,
    })
}

/// Whether `name` in `dir` is a regular file of this user's (not a link):
/// an earlier backup's `DEST.partial` that did not finish.
fn leftover(dir: &OwnedFd, name: &std::ffi::OsStr) -> bool {
    let Ok(st) =
        nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
    else {
        return false;
    };
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG
        && st.st_uid == nix::unistd::geteuid().as_raw()
        && st.st_nlink == 1
}

impl Partial {
    /// Remove it (a backup that failed), through the directory's handle.
    pub fn discard(self) {
        crate::fsx::discard_at(
            self.dir.as_fd(),
            self.path.file_name().expect("made in create"),
        );
    }

    /// Rename onto `dest` (a link at DEST is replaced, not followed), and
    /// sync the directory.
    pub fn finish(self, dest: &Path) -> Result<()> {
        let name = dest.file_name().expect("checked in create");
        let partial_name = self.path.file_name().expect("made in create");
        crate::fsx::rename_at(self.dir.as_fd(), partial_name, self.dir.as_fd(), name, true)
            .map_err(|e| {
                Error::io(
                    "renaming",
                    &self.path,
                    io::Error::new(e.kind(), format!("to {}: {e}", dest.display())),
                )
            })?;
        crate::fsx::sync_fd(&self.dir, dest)
    }
}
