//! The one writer of state files: atomic and durable replacement.
//!
//! write a temp file in the same directory → fsync it → set its mode →
//! rename it over the target → fsync the directory, all through a handle on
//! the directory opened without following links ([`crate::fsx`]), with a
//! short fixed-length temp name (`.as-XXXXXXXXXXXX.tmp`) whatever the
//! target's name. A reader sees the old
//! file or the new one, never a mix, and after a crash the rename is either
//! there or not. Nothing else in the crate writes a JSON state file.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::replaced::Pending;
use super::store::Store;
use crate::error::{Error, IoContext, Result};
use crate::fsx;

/// Run a write, and run it once more when that may help: after `ENOSPC` if
/// `store`'s reclaimer (the daemon's prunes what retention allows; see
/// [`Store::with_reclaimer`]) freed something, after `EIO` (transient
/// device trouble) always. `EROFS` and everything else fail at once. A
/// failed attempt of a write through this module leaves the previous file
/// intact (the temp file is removed), so a retry is safe.
pub fn retrying<T>(store: &Store, mut op: impl FnMut() -> Result<T>) -> Result<T> {
    match op() {
        Err(e) if matches!(e.errno(), Some(n) if n == nix::libc::ENOSPC || n == nix::libc::EDQUOT) =>
        {
            let freed = store.reclaim();
            if freed > 0 {
                tracing::warn!("{e}; freed {freed} bytes by pruning, writing again");
                op()
            } else {
                Err(e)
            }
        }
        Err(e) if e.errno() == Some(nix::libc::EIO) => {
            tracing::warn!("{e}; trying once more");
            op()
        }
        other => other,
    }
}

/// Replace `path` with `bytes`, atomically and durably, with file mode
/// `mode` (on a full disk as `store` says: [`retrying`]).
pub fn write_file(store: &Store, path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    retrying(store, || durable_temp(path, bytes, mode)?.commit())
}

/// A temp file beside `path` (same directory, so the rename is atomic): its
/// directory handle (opened without following links), its short fixed-length
/// name, and the target. Removed on drop unless renamed into place.
struct Temp {
    dir: OwnedFd,
    name: Option<OsString>,
    target: PathBuf,
}

impl Temp {
    fn dir_path(&self) -> &Path {
        parent(&self.target)
    }

    /// Rename over the target (`replace`) or only if nothing is there
    /// (`Ok(false)` if something is).
    fn rename(&mut self, replace: bool) -> Result<bool> {
        let name = self.name.take().expect("a temp is renamed once");
        let target = self.target.file_name().unwrap_or_default();
        match fsx::rename_at(self.dir.as_fd(), &name, self.dir.as_fd(), target, replace) {
            Ok(()) => Ok(true),
            Err(e) => {
                fsx::discard_at(self.dir.as_fd(), &name);
                if !replace && e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(false)
                } else {
                    Err(Error::io("renaming a temp file over", &self.target, e))
                }
            }
        }
    }

    /// Put the temp file in the target's place by exchanging the two names
    /// (`RENAME_EXCHANGE`: a reader sees the old file or the new one, as with
    /// a rename) and keep the old version, now under the temp name, in
    /// `pending` for removal later ([`super::replaced`]). No target yet, or
    /// a file system without the exchange: a plain rename. A target a
    /// rename could not have replaced (a directory) is swapped back and the
    /// write fails as the rename would.
    fn exchange(&mut self, pending: &Pending) -> Result<()> {
        let name = self.name.take().expect("a temp is renamed once");
        let target = self.target.file_name().unwrap_or_default();
        let dir = self.dir.as_fd();
        match fsx::exchange_at(dir, &name, target) {
            Ok(()) => {
                let old = nix::sys::stat::fstatat(
                    dir,
                    name.as_os_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                );
                let is_dir =
                    old.is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR);
                if is_dir {
                    let back = fsx::exchange_at(dir, &name, target);
                    fsx::discard_at(dir, &name);
                    return Err(Error::io(
                        "renaming a temp file over",
                        &self.target,
                        back.err()
                            .unwrap_or_else(|| io::Error::from_raw_os_error(nix::libc::EISDIR)),
                    ));
                }
                pending.push(&self.dir, name);
                Ok(())
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(
                        nix::libc::ENOENT
                            | nix::libc::EINVAL
                            | nix::libc::ENOSYS
                            | nix::libc::EOPNOTSUPP
                    )
                ) =>
            {
                self.name = Some(name);
                self.rename(true).map(drop)
            }
            Err(e) => {
                fsx::discard_at(dir, &name);
                Err(Error::io("renaming a temp file over", &self.target, e))
            }
        }
    }

    /// Put the temp file in the target's place without making its data
    /// durable, for the unsynced writes: the two names are exchanged
    /// ([`Temp::exchange`]) and the old file, now under the temp name, is
    /// removed at once. A plain rename over an existing file makes ext4
    /// (`auto_da_alloc`) allocate and start writing the new file's blocks
    /// inside the `rename` call; the heartbeat, rewritten at every session
    /// start and end and 150 KB at 10,000 agents, then paid that per write,
    /// and most versions are replaced before writeback would ever have
    /// written them.
    fn replace_unsynced(&mut self) -> Result<()> {
        let old = Pending::default();
        self.exchange(&old)?;
        old.take().remove();
        Ok(())
    }

    /// Rename over the target and fsync the directory.
    fn commit(mut self) -> Result<()> {
        self.rename(true)?;
        fsx::sync_fd(&self.dir, self.dir_path())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            fsx::discard_at(self.dir.as_fd(), &name);
        }
    }
}

/// A temp file beside `path` holding `bytes` with `mode`, already fsynced:
/// what is left is to rename it into place.
fn durable_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<Temp> {
    filled_temp(path, bytes, mode, true)
}

/// A temp file beside `path` holding `bytes` with `mode`, fsynced if `sync`.
fn filled_temp(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> Result<Temp> {
    let dir_path = parent(path);
    let dir = fsx::dir(dir_path)?;
    let (mut file, name) = fsx::create_temp(dir.as_fd(), dir_path, mode)?;
    let temp = Temp {
        dir,
        name: Some(name),
        target: path.to_path_buf(),
    };
    // Errors name the file being replaced (the temp name means nothing to
    // an operator), and the temp file beside it.
    file.write_all(bytes)
        .at("writing the new version (a temp file beside it) of", path)?;
    if sync {
        file.sync_all()
            .at("syncing the new version (a temp file beside it) of", path)?;
    }
    Ok(temp)
}

/// A replacement written and fsynced but not yet renamed into place: the
/// bytes are on disk before anything that depends on them (the journal
/// line) is written, so a full disk fails the whole change, not half of it.
/// Dropped without [`Staged::commit`], it is removed and `path` unchanged.
/// Staged for a store that defers removals ([`Store::deferring_removals`]),
/// its commit keeps the old version for [`Store::take_replaced`].
pub struct Staged {
    temp: Temp,
    removals: Option<Arc<Pending>>,
}

impl Staged {
    /// Rename into place and fsync the directory.
    pub fn commit(self) -> Result<()> {
        commit_all([self])
    }

    /// Put the new version in place: a rename over the target, or where
    /// the store defers removals, an exchange of the two names.
    fn replace(&mut self) -> Result<()> {
        match &self.removals {
            Some(pending) => self.temp.exchange(pending),
            None => self.temp.rename(true).map(drop),
        }
    }
}

/// Rename every staged file into place, then fsync each directory once
/// (after its last rename): a change that replaces several files of one
/// directory (a session's begin or end) pays one directory sync, not one per
/// file. Until that sync any subset of the renames may be lost by a power
/// failure, exactly as between two [`Staged::commit`]s; callers commit after
/// the journal line that makes the change recoverable.
pub fn commit_all(staged: impl IntoIterator<Item = Staged>) -> Result<()> {
    let mut dirs: Vec<Staged> = Vec::new();
    for mut s in staged {
        s.replace()?;
        if !dirs.iter().any(|d| d.temp.dir_path() == s.temp.dir_path()) {
            dirs.push(s);
        }
    }
    for d in &dirs {
        fsx::sync_fd(&d.temp.dir, d.temp.dir_path())?;
    }
    Ok(())
}

/// Stage `bytes` for `path` with file mode `mode` (see [`Staged`]).
pub fn stage_file(store: &Store, path: &Path, bytes: &[u8], mode: u32) -> Result<Staged> {
    let temp = retrying(store, || durable_temp(path, bytes, mode))?;
    Ok(Staged {
        temp,
        removals: store.removals(),
    })
}

/// Stage `value` as pretty JSON for `path` (see [`Staged`]).
pub fn stage_json<T: Serialize>(store: &Store, path: &Path, value: &T) -> Result<Staged> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    stage_file(store, path, &bytes, super::STATE_FILE_MODE)
}

/// Serialize `value` as pretty JSON (plus a final newline) and replace `path`.
pub fn write_json<T: Serialize>(store: &Store, path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    write_file(store, path, &bytes, super::STATE_FILE_MODE)
}

/// Replace `path` with `value` as JSON atomically (temp file + rename) but
/// without fsync: for snapshots such as the daemon's heartbeat, rewritten
/// often and worthless after a crash. Never for state that must survive one.
pub fn write_json_unsynced<T: Serialize>(store: &Store, path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    write_file_unsynced(store, path, &bytes, super::STATE_FILE_MODE)
}

/// [`write_json_unsynced`] for bytes: atomic replacement, no fsync, and
/// no writeback forced by the replacement either (see
/// `Temp::replace_unsynced`).
pub fn write_file_unsynced(store: &Store, path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    retrying(store, || {
        filled_temp(path, bytes, mode, false)?.replace_unsynced()
    })
}

/// Read a JSON state file. `Ok(None)` if it does not exist; a
/// [`Error::Corrupt`] naming the file if it does not parse; an
/// [`Error::Unsafe`] if it is a link, a FIFO or a directory.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let Some(bytes) = fsx::read_limited(path, MAX_STATE_FILE)? else {
        return Ok(None);
    };
    let (bytes, more) = bytes;
    if more {
        return Err(Error::Corrupt {
            path: path.to_path_buf(),
            reason: format!(
                "it is over {} MiB, larger than any state file",
                MAX_STATE_FILE >> 20
            ),
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// The largest JSON state file read: far above any real one (tasks.json
/// with thousands of tasks is a few MiB), so a huge file planted in the
/// place of one is not read into memory.
pub const MAX_STATE_FILE: u64 = 64 << 20;

/// Create `path` with `bytes` only if it does not exist yet, durably.
/// Returns whether it was created.
pub fn create_new(path: &Path, bytes: &[u8], mode: u32) -> Result<bool> {
    // Already there (every start after the first): nothing to write or sync.
    if fsx::metadata(path)?.is_some() {
        return Ok(false);
    }
    // Written under a temp name and linked into place, so a crash never
    // leaves a half-written file under the real name.
    let mut tmp = durable_temp(path, bytes, mode)?;
    if tmp.rename(false)? {
        fsx::sync_fd(&tmp.dir, tmp.dir_path())?;
        Ok(true)
    } else {
        Ok(false)
    }
}

/// A new file written under a temp name beside its target and not synced,
/// for a caller that makes many durable together: write each
/// ([`unsynced_new`]), [`sync_file_system`], [`NewFile::rename_new`] each,
/// [`sync_file_system`] again before anyone is told (the batched
/// bootstrap). Holds no file descriptor (a batch may hold thousands);
/// dropped before its rename, the temp file is removed.
pub struct NewFile {
    name: Option<OsString>,
    target: PathBuf,
}

/// Write `bytes` with `mode` to a temp file beside `path` (which it does not
/// look at), unsynced: see [`NewFile`].
pub fn unsynced_new(path: &Path, bytes: &[u8], mode: u32) -> Result<NewFile> {
    let mut temp = filled_temp(path, bytes, mode, false)?;
    Ok(NewFile {
        name: temp.name.take(),
        target: path.to_path_buf(),
    })
}

impl NewFile {
    /// The file it will become.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Rename into place unless something is there already (`Ok(false)`, and
    /// the temp file removed). Not synced: the caller syncs the file system.
    pub fn rename_new(mut self) -> Result<bool> {
        let dir_path = parent(&self.target).to_path_buf();
        let dir = fsx::dir(&dir_path)?;
        let mut temp = Temp {
            dir,
            name: self.name.take(),
            target: self.target.clone(),
        };
        temp.rename(false)
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if let Some(name) = self.name.take()
            && let Ok(dir) = fsx::dir(parent(&self.target))
        {
            fsx::discard_at(dir.as_fd(), &name);
        }
    }
}

/// `syncfs(2)` of the file system that holds `dir`: every file written
/// there, and every directory entry changed, on disk.
pub fn sync_file_system(dir: &Path) -> Result<()> {
    let fd = fsx::dir(dir)?;
    nix::unistd::syncfs(fd.as_fd())
        .map_err(|e| Error::io("syncing the file system of", dir, e.into()))
}

/// Rename `from` to `to` (neither followed through a link) and make both
/// directory entries durable.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    fsx::rename(from, to, true)?;
    sync_dir(parent(to))?;
    if parent(from) != parent(to) {
        sync_dir(parent(from))?;
    }
    Ok(())
}

/// [`rename`], but an existing `to` is left alone and reported as
/// `Ok(false)`.
pub fn rename_new(from: &Path, to: &Path) -> Result<bool> {
    match fsx::rename(from, to, false) {
        Ok(()) => {}
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::AlreadyExists => {
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    sync_dir(parent(to))?;
    if parent(from) != parent(to) {
        sync_dir(parent(from))?;
    }
    Ok(true)
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    fsx::sync_dir(dir)
}

/// `mkdir -p` with a mode for the directories it creates (exactly that mode,
/// whatever the umask: inbox directories must be group-writable whoever
/// created them). Never through a link.
pub fn create_dir(path: &Path, mode: u32) -> Result<bool> {
    fsx::create_dir_all(path, mode)
}

/// Read at most `limit` bytes of a file without following a symlink and
/// without blocking on a FIFO. Returns the bytes and whether there was more.
pub fn read_limited(path: &Path, limit: u64) -> Result<(Vec<u8>, bool)> {
    fsx::read_limited(path, limit)?
        .ok_or_else(|| Error::io("reading", path, io::Error::from(io::ErrorKind::NotFound)))
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn full() -> Error {
        Error::io(
            "writing",
            "/state/rio/report.json",
            io::Error::from_raw_os_error(nix::libc::ENOSPC),
        )
    }

    /// A write that hits ENOSPC runs the reclaimer of the store it was
    /// given, and only that one, and is tried again only if it freed space.
    #[test]
    fn a_full_disk_runs_the_given_stores_reclaimer_and_no_other() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let daemon = Store::default().with_reclaimer(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            4096
        });
        let cli = Store::default();
        let nothing_freed = Store::default().with_reclaimer(|| 0);

        let mut tries = 0;
        let r = retrying(&cli, || {
            tries += 1;
            Err::<(), _>(full())
        });
        assert!(r.is_err());
        assert_eq!((tries, calls.load(Ordering::SeqCst)), (1, 0));

        let mut tries = 0;
        let r = retrying(&nothing_freed, || {
            tries += 1;
            Err::<(), _>(full())
        });
        assert!(r.is_err());
        assert_eq!((tries, calls.load(Ordering::SeqCst)), (1, 0));

        let mut tries = 0;
        let r = retrying(&daemon, || {
            tries += 1;
            if tries == 1 { Err(full()) } else { Ok(tries) }
        });
        assert_eq!(r.unwrap(), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[cfg(test)]
mod unsynced_tests {
    use super::*;

    pub(super) fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The unsynced replacement (names exchanged, the old file removed)
    /// leaves the new bytes in place with their mode, and nothing else: not
    /// the old file under the temp name, whether the target was there or
    /// not; a directory in the target's place stays, the write fails.
    #[test]
    fn an_unsynced_replacement_leaves_the_new_file_alone_in_place() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::default();
        let path = tmp.path().join("daemon.json");
        write_file_unsynced(&store, &path, b"first", 0o640).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        let old = std::fs::File::open(&path).unwrap();
        for i in 0..3 {
            let text = format!("version {i}");
            write_file_unsynced(&store, &path, text.as_bytes(), 0o644).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
            assert_eq!(names(tmp.path()), ["daemon.json"]);
        }
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        // The old file was replaced, not rewritten: an open reader keeps it.
        let mut seen = String::new();
        std::io::Read::read_to_string(&mut &old, &mut seen).unwrap();
        assert_eq!(seen, "first");

        let dir = tmp.path().join("a-dir");
        std::fs::create_dir(&dir).unwrap();
        let err = write_file_unsynced(&store, &dir, b"x", 0o644).unwrap_err();
        assert!(err.to_string().contains("a-dir"), "{err}");
        assert!(dir.is_dir());
        assert_eq!(names(tmp.path()), ["a-dir", "daemon.json"]);
    }
}

#[cfg(test)]
mod deferred_tests {
    use super::unsynced_tests::names;
    use super::*;

    fn temps(dir: &Path) -> Vec<String> {
        names(dir)
            .into_iter()
            .filter(|n| n.starts_with(".as-") && n.ends_with(".tmp"))
            .collect()
    }

    /// A deferring store's commit puts every new version in place and
    /// keeps each old one under a temp name until it is taken and removed;
    /// a plain store leaves nothing behind and has nothing to hand over.
    #[test]
    fn a_deferring_commit_keeps_the_old_versions_until_they_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            tmp.path().join("session.json"),
            tmp.path().join("report.json"),
            tmp.path().join("metrics.json"),
        );
        std::fs::write(&a, "old a").unwrap();
        std::fs::write(&b, "old b").unwrap();
        let store = Store::default().deferring_removals();
        commit_all([
            stage_file(&store, &a, b"new a", 0o644).unwrap(),
            stage_file(&store, &b, b"new b", 0o644).unwrap(),
            // No old version: a plain rename, nothing kept.
            stage_file(&store, &c, b"new c", 0o644).unwrap(),
        ])
        .unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"new a");
        assert_eq!(std::fs::read(&b).unwrap(), b"new b");
        assert_eq!(std::fs::read(&c).unwrap(), b"new c");
        let kept = temps(tmp.path());
        assert_eq!(kept.len(), 2, "{:?}", names(tmp.path()));
        let mut old: Vec<String> = kept
            .iter()
            .map(|n| std::fs::read_to_string(tmp.path().join(n)).unwrap())
            .collect();
        old.sort();
        assert_eq!(old, ["old a", "old b"]);

        let replaced = store.take_replaced();
        assert_eq!(replaced.len(), 2);
        assert!(store.take_replaced().is_empty(), "taken once");
        replaced.remove();
        assert_eq!(
            names(tmp.path()),
            ["metrics.json", "report.json", "session.json"]
        );

        let plain = Store::default();
        stage_file(&plain, &a, b"newer a", 0o644)
            .unwrap()
            .commit()
            .unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"newer a");
        assert!(temps(tmp.path()).is_empty());
        assert!(plain.take_replaced().is_empty());
    }

    /// A directory where a file is written is swapped back: it stays with
    /// what it holds, the write fails naming it, no temp file is left.
    #[test]
    fn a_deferring_commit_over_a_directory_fails_and_leaves_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("report.json");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("inside"), "kept").unwrap();
        let store = Store::default().deferring_removals();
        let err = commit_all([stage_file(&store, &dir, b"x", 0o644).unwrap()]).unwrap_err();
        assert!(err.to_string().contains("report.json"), "{err}");
        assert_eq!(std::fs::read(dir.join("inside")).unwrap(), b"kept");
        assert_eq!(names(tmp.path()), ["report.json"]);
        assert!(store.take_replaced().is_empty());
    }

    /// Old versions nobody took go with the last clone of their store (a
    /// hook that failed after its commit leaves no temp file behind).
    #[test]
    fn old_versions_nobody_took_go_with_the_store() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("session.json");
        std::fs::write(&path, "old").unwrap();
        let store = Store::default().deferring_removals();
        let clone = store.clone();
        stage_file(&clone, &path, b"new", 0o644)
            .unwrap()
            .commit()
            .unwrap();
        drop(clone);
        assert_eq!(temps(tmp.path()).len(), 1, "kept while a clone lives");
        drop(store);
        assert_eq!(names(tmp.path()), ["session.json"]);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }
}
