//! The one writer of state files: atomic and durable replacement.
//!
//! write a temp file in the same directory → fsync it → set its mode →
//! rename it over the target → fsync the directory. A reader sees the old
//! file or the new one, never a mix, and after a crash the rename is either
//! there or not. Nothing else in the crate writes a JSON state file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, IoContext, Result};

/// Frees disk space when a write fails with `ENOSPC` (the daemon installs
/// one that prunes what retention allows); returns the bytes freed.
type Reclaimer = Box<dyn Fn() -> u64 + Send + Sync>;
static RECLAIMER: OnceLock<Reclaimer> = OnceLock::new();

/// Install the process's reclaimer (once; later calls are ignored).
pub fn set_reclaimer(f: impl Fn() -> u64 + Send + Sync + 'static) {
    let _ = RECLAIMER.set(Box::new(f));
}

/// Run a write, and run it once more when that may help: after `ENOSPC` if
/// the reclaimer freed something, after `EIO` (transient device trouble)
/// always. `EROFS` and everything else fail at once. A failed attempt of a
/// write through this module leaves the previous file intact (the temp file
/// is removed), so a retry is safe.
pub fn retrying<T>(mut op: impl FnMut() -> Result<T>) -> Result<T> {
    match op() {
        Err(e) if matches!(e.errno(), Some(n) if n == nix::libc::ENOSPC || n == nix::libc::EDQUOT) =>
        {
            let freed = RECLAIMER.get().map(|r| r()).unwrap_or(0);
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

/// Replace `path` with `bytes`, atomically and durably, with file mode `mode`.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    retrying(|| write_file_once(path, bytes, mode))
}

fn write_file_once(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let tmp = durable_temp(path, bytes, mode)?;
    tmp.persist(path)
        .map_err(|e| Error::io("renaming a temp file over", path, e.error))?;
    sync_dir(parent(path))
}

/// A temp file beside `path` holding `bytes` with `mode`, already fsynced:
/// what is left is to rename it into place.
fn durable_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<tempfile::NamedTempFile> {
    let tmp = filled_temp(path, bytes, mode)?;
    tmp.as_file().sync_all().at("syncing", tmp.path())?;
    Ok(tmp)
}

/// A temp file beside `path` (same directory, so the rename is atomic)
/// holding `bytes` with `mode`, not yet synced.
fn filled_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<tempfile::NamedTempFile> {
    let dir = parent(path);
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .at("creating a temp file in", dir)?;
    tmp.write_all(bytes).at("writing", tmp.path())?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .at("setting the mode of", tmp.path())?;
    Ok(tmp)
}

/// A replacement written and fsynced but not yet renamed into place: the
/// bytes are on disk before anything that depends on them (the journal
/// line) is written, so a full disk fails the whole change, not half of it.
/// Dropped without [`Staged::commit`], it is removed and `path` unchanged.
pub struct Staged {
    tmp: tempfile::NamedTempFile,
    path: std::path::PathBuf,
}

impl Staged {
    /// Rename into place and fsync the directory.
    pub fn commit(self) -> Result<()> {
        let path = self.path;
        self.tmp
            .persist(&path)
            .map_err(|e| Error::io("renaming a temp file over", &path, e.error))?;
        sync_dir(parent(&path))
    }
}

/// Stage `value` as pretty JSON for `path` (see [`Staged`]).
pub fn stage_json<T: Serialize>(path: &Path, value: &T) -> Result<Staged> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    let tmp = retrying(|| durable_temp(path, &bytes, super::STATE_FILE_MODE))?;
    Ok(Staged {
        tmp,
        path: path.to_path_buf(),
    })
}

/// Serialize `value` as pretty JSON (plus a final newline) and replace `path`.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    write_file(path, &bytes, super::STATE_FILE_MODE)
}

/// Replace `path` with `value` as JSON atomically (temp file + rename) but
/// without fsync: for snapshots such as the daemon's heartbeat, rewritten
/// often and worthless after a crash. Never for state that must survive one.
pub fn write_json_unsynced<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| Error::Data(format!("cannot serialize {}: {e}", path.display())))?;
    bytes.push(b'\n');
    write_file_unsynced(path, &bytes, super::STATE_FILE_MODE)
}

/// [`write_json_unsynced`] for bytes: atomic replacement, no fsync.
pub fn write_file_unsynced(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    retrying(|| {
        filled_temp(path, bytes, mode)?
            .persist(path)
            .map_err(|e| Error::io("renaming a temp file over", path, e.error))?;
        Ok(())
    })
}

/// Read a JSON state file. `Ok(None)` if it does not exist; a
/// [`Error::Corrupt`] naming the file if it does not parse.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("reading", path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Create `path` with `bytes` only if it does not exist yet (O_EXCL), durably.
/// Returns whether it was created.
pub fn create_new(path: &Path, bytes: &[u8], mode: u32) -> Result<bool> {
    // Already there (every start after the first): nothing to write or sync.
    if fs::symlink_metadata(path).is_ok() {
        return Ok(false);
    }
    // Written under a temp name and linked into place, so a crash never
    // leaves a half-written file under the real name.
    let tmp = durable_temp(path, bytes, mode)?;
    match tmp.persist_noclobber(path) {
        Ok(_) => {
            sync_dir(parent(path))?;
            Ok(true)
        }
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io("creating", path, e.error)),
    }
}

/// Rename `from` to `to` and make both directory entries durable.
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(|e| {
        Error::io(
            "renaming",
            from,
            io::Error::new(e.kind(), format!("to {}: {e}", to.display())),
        )
    })?;
    sync_dir(parent(to))?;
    if parent(from) != parent(to) {
        sync_dir(parent(from))?;
    }
    Ok(())
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .at("syncing directory", dir)
}

/// `mkdir -p` with a mode for the directories it creates.
pub fn create_dir(path: &Path, mode: u32) -> Result<bool> {
    if path.is_dir() {
        return Ok(false);
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .at("creating directory", path)?;
    // The umask narrows the mode given to mkdir; inbox directories must be
    // group-writable whatever the umask of whoever created them.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).at("setting the mode of", path)?;
    Ok(true)
}

/// Read at most `limit` bytes of a file without following a symlink and
/// without blocking on a FIFO. Returns the bytes and whether there was more.
pub fn read_limited(path: &Path, limit: u64) -> io::Result<(Vec<u8>, bool)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc_flags())
        .open(path)?;
    let mut buf = Vec::new();
    file.take(limit + 1).read_to_end(&mut buf)?;
    let more = buf.len() as u64 > limit;
    buf.truncate(limit as usize);
    Ok((buf, more))
}

fn libc_flags() -> i32 {
    (nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits()
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
