//! File access below the state root that never follows a link and never
//! blocks on a special file.
//!
//! Everything under `{state_root}` is somebody's input: the inbox is
//! group-writable, and a link, a FIFO, a directory in the place of a file or
//! a hard link to another user's file must not make the daemon read, write or
//! move anything outside the root, nor wait forever. So every operation here
//! resolves its path with `openat2(RESOLVE_NO_SYMLINKS)` (a walk of
//! `O_NOFOLLOW|O_DIRECTORY` handles where the kernel lacks it), opens the
//! last component with `O_NOFOLLOW|O_NONBLOCK`, checks with `fstat` that it
//! is what it should be, and renames, creates and removes through directory
//! handles (`renameat`, `mkdirat`, `unlinkat`).
//!
//! The state root itself is the operator's choice and may sit behind a link
//! (`/opt` → `/srv/opt`): [`trusted`] resolves it once, and every path below
//! it is then built from the resolved form (see `StateRoot::new`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::error::{Error, Result};

/// What a path below the root must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// The resolved form of a trusted path (the state root): links above and in
/// it are followed once, here; a path that does not exist yet keeps its
/// missing tail as given, under the resolved form of its deepest existing
/// ancestor.
pub fn trusted(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        match std::env::current_dir() {
            Ok(cwd) => cwd.join(path),
            Err(_) => return path.to_path_buf(),
        }
    };
    let mut tail = Vec::new();
    let mut head = abs.as_path();
    loop {
        if let Ok(real) = head.canonicalize() {
            let mut out = real;
            for c in tail.iter().rev() {
                out.push(c);
            }
            return out;
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                head = parent;
            }
            _ => return abs,
        }
    }
}

/// Whether `openat2` works here (0 unknown, 1 yes, 2 no).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// Open `path` with `flags`, following no link anywhere on its way.
fn open_raw(path: &Path, flags: OFlag, mode: Mode) -> std::result::Result<OwnedFd, Errno> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        let how = OpenHow::new()
            .flags(flags)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        match nix::fcntl::openat2(AT_FDCWD, path, how) {
            // ENOSYS: an old kernel; EPERM: a seccomp filter that predates it.
            Err(Errno::ENOSYS) | Err(Errno::EPERM) if OPENAT2.load(Ordering::Relaxed) == 0 => {
                OPENAT2.store(2, Ordering::Relaxed);
            }
            other => {
                OPENAT2.store(1, Ordering::Relaxed);
                return other;
            }
        }
    }
    open_walking(path, flags, mode)
}

/// The same without `openat2`: one `O_NOFOLLOW|O_DIRECTORY` handle per
/// component.
fn open_walking(path: &Path, flags: OFlag, mode: Mode) -> std::result::Result<OwnedFd, Errno> {
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut parts: Vec<&OsStr> = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => parts.push(n),
            Component::ParentDir => return Err(Errno::ELOOP),
            Component::Prefix(_) => return Err(Errno::EINVAL),
        }
    }
    let start = if path.is_absolute() { "/" } else { "." };
    let Some(last) = parts.pop() else {
        return nix::fcntl::open(start, flags, mode);
    };
    let mut dir = nix::fcntl::open(start, dir_flags, Mode::empty())?;
    for part in parts {
        dir = nix::fcntl::openat(&dir, part, dir_flags, Mode::empty())?;
    }
    nix::fcntl::openat(&dir, last, flags, mode)
}

/// The error for a path that is not what it should be, naming the fix.
pub fn unsafe_path(path: &Path, what: &str) -> Error {
    Error::Unsafe {
        path: path.to_path_buf(),
        reason: what.to_string(),
    }
}

/// Map an open's errno to an error naming the path (and, for a link or a
/// non-directory on the way, the component that is wrong).
fn open_error(op: &'static str, path: &Path, e: Errno, want: Kind) -> Error {
    match e {
        Errno::ELOOP | Errno::ENOTDIR => diagnose(path, want)
            .unwrap_or_else(|| unsafe_path(path, "is a symbolic link, or has one on its path")),
        Errno::EISDIR if want == Kind::File => unsafe_path(path, "is a directory, not a file"),
        // Opening a FIFO for writing without blocking and without a reader.
        Errno::ENXIO => unsafe_path(path, "is a FIFO or a device, not a regular file"),
        e => Error::io(op, path, io::Error::from(e)),
    }
}

/// Find the first component of `path` that is a link or not a directory
/// (by `lstat`, for the message only: nothing is opened).
fn diagnose(path: &Path, want: Kind) -> Option<Error> {
    let ancestors: Vec<&Path> = path.ancestors().collect();
    for (i, p) in ancestors.iter().rev().enumerate() {
        if p.as_os_str().is_empty() || *p == Path::new("/") {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return None;
        };
        let ft = meta.file_type();
        let last = i == ancestors.len() - 1;
        if ft.is_symlink() {
            return Some(unsafe_path(p, "is a symbolic link"));
        }
        if !ft.is_dir() && (!last || want == Kind::Dir) {
            let what = describe(SFlag::from_bits_truncate(
                std::os::unix::fs::MetadataExt::mode(&meta) & SFlag::S_IFMT.bits(),
            ));
            return Some(unsafe_path(p, &format!("is {what}, not a directory")));
        }
    }
    None
}

/// Check what an open handle really is.
fn check_kind(path: &Path, st: &FileStat, want: Kind) -> Result<()> {
    let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    let ok = match want {
        Kind::File => fmt == SFlag::S_IFREG,
        Kind::Dir => fmt == SFlag::S_IFDIR,
    };
    if ok {
        return Ok(());
    }
    let found = describe(fmt);
    let wanted = match want {
        Kind::File => "a regular file",
        Kind::Dir => "a directory",
    };
    Err(unsafe_path(path, &format!("is {found}, not {wanted}")))
}

fn describe(fmt: SFlag) -> &'static str {
    match fmt {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        _ => "a special file",
    }
}

/// Open a regular file for reading: `Ok(None)` if it does not exist.
pub fn open_read(path: &Path) -> Result<Option<File>> {
    match open_raw(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty()) {
        Ok(fd) => Ok(Some(regular(path, fd)?)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(open_error("opening", path, e, Kind::File)),
    }
}

/// [`open_read`] of `name` (one component) in an open directory: for a
/// pass over many files of one directory, which is opened once. No link is
/// followed, no FIFO blocked on. `path` is for messages only.
pub fn open_read_at(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<Option<File>> {
    Ok(open_read_at_stat(dir, name, path)?.map(|(file, _)| file))
}

/// [`open_read_at`] with the handle's own `fstat` (the one that checked it
/// is a regular file): a pass over many messages stats each once.
///
/// The handle keeps `O_NONBLOCK`: Linux ignores it for reads of a regular
/// file (POSIX leaves it unspecified), and this path is taken once per
/// message, where clearing it cost two `fcntl` calls of about fifteen.
pub fn open_read_at_stat(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
) -> Result<Option<(File, FileStat)>> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => {
            let st =
                nix::sys::stat::fstat(&fd).map_err(|e| Error::io("inspecting", path, e.into()))?;
            check_kind(path, &st, Kind::File)?;
            Ok(Some((File::from(fd), st)))
        }
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(open_error("opening", path, e, Kind::File)),
    }
}

/// Read a regular file whose size a `fstat` of the same handle told:
/// one `read(2)` when it returns that size (the file ends there, as far as
/// this handle can tell: a writer still at it is what settling is for),
/// otherwise to the end, at most `limit + 1` bytes.
pub fn read_sized(file: &mut File, size: u64, limit: u64) -> io::Result<Vec<u8>> {
    let want = size.min(limit + 1) as usize;
    let mut bytes = vec![0u8; want];
    let n = loop {
        match file.read(&mut bytes) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    bytes.truncate(n);
    if size <= limit && n as u64 == size {
        return Ok(bytes);
    }
    file.take(limit + 1 - n as u64).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A checked regular file with `O_NONBLOCK` cleared again.
fn regular(path: &Path, fd: OwnedFd) -> Result<File> {
    let st = nix::sys::stat::fstat(&fd).map_err(|e| Error::io("inspecting", path, e.into()))?;
    check_kind(path, &st, Kind::File)?;
    clear_nonblock(&fd);
    Ok(File::from(fd))
}

fn clear_nonblock(fd: &OwnedFd) {
    if let Ok(bits) = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(bits) - OFlag::O_NONBLOCK;
        let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags));
    }
}

/// Read a whole regular file: `Ok(None)` if it does not exist.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    let Some(mut f) = open_read(path)? else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .map_err(|e| Error::io("reading", path, e))?;
    Ok(Some(buf))
}

/// Read at most `limit` bytes of a regular file; the flag says whether there
/// was more. `Ok(None)` if it does not exist.
pub fn read_limited(path: &Path, limit: u64) -> Result<Option<(Vec<u8>, bool)>> {
    let Some(f) = open_read(path)? else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io("reading", path, e))?;
    let more = buf.len() as u64 > limit;
    buf.truncate(limit as usize);
    Ok(Some((buf, more)))
}

/// The last `n` bytes of a regular file (all of it when shorter), read the
/// way [`read_limited`] reads: no link followed, no FIFO blocked on.
/// `Ok(None)` if it does not exist.
pub fn read_tail(path: &Path, n: u64) -> Result<Option<Vec<u8>>> {
    use std::io::{Seek, SeekFrom};
    let Some(mut f) = open_read(path)? else {
        return Ok(None);
    };
    let len = f
        .metadata()
        .map_err(|e| Error::io("inspecting", path, e))?
        .len();
    f.seek(SeekFrom::Start(len.saturating_sub(n)))
        .map_err(|e| Error::io("reading", path, e))?;
    let mut buf = Vec::new();
    f.take(n)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io("reading", path, e))?;
    Ok(Some(buf))
}

/// Run as root (a cron-era script, an operator's shell), a file or directory
/// this process creates below the state root is given the owner and group of
/// the directory it is in: the service user must go on appending to a
/// journal, taking a lock or replacing a file that root made. For any other
/// user, and in a directory root owns, nothing changes.
fn adopt(fd: BorrowedFd<'_>, dir: BorrowedFd<'_>, path: &Path) -> Result<()> {
    if !as_root() {
        return Ok(());
    }
    let st = nix::sys::stat::fstat(fd).map_err(|e| Error::io("inspecting", path, e.into()))?;
    if st.st_uid != 0 {
        return Ok(());
    }
    let d = nix::sys::stat::fstat(dir).map_err(|e| Error::io("inspecting", path, e.into()))?;
    if d.st_uid == 0 {
        return Ok(());
    }
    nix::unistd::fchown(fd, Some(d.st_uid.into()), Some(d.st_gid.into()))
        .map_err(|e| Error::io("giving the service user", path, e.into()))
}

fn as_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| nix::unistd::geteuid().is_root())
}

/// [`adopt`] for a file opened by path.
fn adopt_path(fd: BorrowedFd<'_>, path: &Path) -> Result<()> {
    if !as_root() {
        return Ok(());
    }
    let (dir, _) = parent(path)?;
    adopt(fd, dir.as_fd(), path)
}

/// Open a regular file for appending (and reading), creating it with `mode`
/// if missing.
pub fn open_append(path: &Path, mode: u32) -> Result<File> {
    let flags = OFlag::O_RDWR | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK;
    match open_raw(path, flags, Mode::from_bits_truncate(mode)) {
        Ok(fd) => {
            let file = regular(path, fd)?;
            adopt_path(file.as_fd(), path)?;
            Ok(file)
        }
        Err(e) => Err(open_error("opening for append", path, e, Kind::File)),
    }
}

/// Create a regular file for writing with `mode` (only if it does not exist
/// when `exclusive`, else appending to it), never through a link.
pub fn open_create(path: &Path, mode: u32, exclusive: bool) -> Result<File> {
    let mut flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK;
    flags |= if exclusive {
        OFlag::O_EXCL
    } else {
        OFlag::O_APPEND
    };
    match open_raw(path, flags, Mode::from_bits_truncate(mode)) {
        Ok(fd) => {
            let file = regular(path, fd)?;
            adopt_path(file.as_fd(), path)?;
            Ok(file)
        }
        Err(Errno::EEXIST) => Err(Error::io(
            "creating",
            path,
            io::Error::from(io::ErrorKind::AlreadyExists),
        )),
        Err(e) => Err(open_error("creating", path, e, Kind::File)),
    }
}

/// Open (creating it with `mode` if missing) a regular file that exists to
/// be flocked, for reading only.
pub fn open_lock(path: &Path, mode: u32) -> Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK;
    match open_raw(path, flags, Mode::empty()) {
        Ok(fd) => return regular(path, fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(open_error("opening lock file", path, e, Kind::File)),
    }
    let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK;
    match open_raw(path, create, Mode::from_bits_truncate(mode)) {
        Ok(fd) => {
            let file = regular(path, fd)?;
            adopt_path(file.as_fd(), path)?;
        }
        Err(e) => return Err(open_error("creating lock file", path, e, Kind::File)),
    }
    match open_raw(path, flags, Mode::empty()) {
        Ok(fd) => regular(path, fd),
        Err(e) => Err(open_error("opening lock file", path, e, Kind::File)),
    }
}

/// Open a directory (never through a link): `Ok(None)` if it does not exist.
pub fn open_dir(path: &Path) -> Result<Option<OwnedFd>> {
    match open_raw(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(open_error("opening directory", path, e, Kind::Dir)),
    }
}

/// [`open_dir`] for a directory that must exist.
pub fn dir(path: &Path) -> Result<OwnedFd> {
    open_dir(path)?.ok_or_else(|| {
        Error::io(
            "opening directory",
            path,
            io::Error::from(io::ErrorKind::NotFound),
        )
    })
}

/// The parent directory's handle and the last component of `path`.
pub fn parent(path: &Path) -> Result<(OwnedFd, &OsStr)> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{} has no file name", path.display())))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((dir(parent)?, name))
}

/// `lstat` a path without following links anywhere: `Ok(None)` if missing.
pub fn metadata(path: &Path) -> Result<Option<FileStat>> {
    let (dir, name) = match parent(path) {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    stat_at(dir.as_fd(), name, path)
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)` of `name` in `dir`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<Option<FileStat>> {
    match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(Error::io("inspecting", path, e.into())),
    }
}

/// The file type bits of a stat.
pub fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// The modification time of a stat, to the nanosecond.
pub fn modified(st: &FileStat) -> std::time::SystemTime {
    std::time::SystemTime::UNIX_EPOCH
        + std::time::Duration::new(
            st.st_mtime.max(0) as u64,
            st.st_mtime_nsec.clamp(0, 999_999_999) as u32,
        )
}

/// What a stat says the thing is ("a FIFO", "a symbolic link", ...).
pub fn describe_stat(st: &FileStat) -> &'static str {
    describe(file_type(st))
}

/// Whether `path` is a real directory (not a link to one).
pub fn is_dir(path: &Path) -> bool {
    matches!(metadata(path), Ok(Some(st)) if file_type(&st) == SFlag::S_IFDIR)
}

/// Whether anything (a link included) is at `path`.
pub fn exists(path: &Path) -> bool {
    matches!(metadata(path), Ok(Some(_)))
}

/// `mkdir -p` with `mode` for the directories it creates (set exactly,
/// whatever the umask); an existing component must be a real directory.
/// Returns whether the last one was created.
pub fn create_dir_all(path: &Path, mode: u32) -> Result<bool> {
    match open_dir(path) {
        Ok(Some(_)) => return Ok(false),
        Ok(None) => {}
        Err(e) => return Err(e),
    }
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        create_dir_all(parent, mode)?;
    }
    let (dir, name) = parent(path)?;
    match nix::sys::stat::mkdirat(&dir, name, Mode::from_bits_truncate(mode)) {
        Ok(()) => {}
        Err(Errno::EEXIST) => {
            // Raced with another creator, or something else is there.
            self::dir(path)?;
            return Ok(false);
        }
        Err(e) => return Err(Error::io("creating directory", path, e.into())),
    }
    // The umask narrows mkdir's mode; set it exactly through the new handle
    // (after a change of owner, which may clear the setgid bit).
    let fd = self::dir(path)?;
    adopt(fd.as_fd(), dir.as_fd(), path)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))
        .map_err(|e| Error::io("setting the mode of", path, e.into()))?;
    Ok(true)
}

/// Rename `from` to `to`, both resolved without following links. With
/// `replace` false an existing `to` is an `AlreadyExists` error.
pub fn rename(from: &Path, to: &Path, replace: bool) -> Result<()> {
    let (fd, fname) = parent(from)?;
    let (td, tname) = parent(to)?;
    rename_at(fd.as_fd(), fname, td.as_fd(), tname, replace).map_err(|e| {
        Error::io(
            "renaming",
            from,
            io::Error::new(e.kind(), format!("to {}: {e}", to.display())),
        )
    })
}

/// `renameat` / `renameat2(RENAME_NOREPLACE)` between two directory handles.
pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &OsStr,
    to_dir: BorrowedFd<'_>,
    to: &OsStr,
    replace: bool,
) -> io::Result<()> {
    let r = if replace {
        nix::fcntl::renameat(from_dir, from, to_dir, to)
    } else {
        nix::fcntl::renameat2(
            from_dir,
            from,
            to_dir,
            to,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
    };
    r.map_err(io::Error::from)
}

/// Swap two names of one directory atomically (`renameat2` with
/// `RENAME_EXCHANGE`): both must exist. `ENOENT` when one does not;
/// `EINVAL` (or `ENOSYS`) where the file system (or kernel) cannot.
pub fn exchange_at(dir: BorrowedFd<'_>, a: &OsStr, b: &OsStr) -> io::Result<()> {
    nix::fcntl::renameat2(dir, a, dir, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
        .map_err(io::Error::from)
}

/// Remove a file (or a link: never what it points to). `Ok(false)` if it
/// was not there.
pub fn remove_file(path: &Path) -> Result<bool> {
    let (dir, name) = match parent(path) {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e),
    };
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::io("removing", path, e.into())),
    }
}

/// Remove an empty directory. `Ok(false)` if it was not there.
pub fn remove_dir(path: &Path) -> Result<bool> {
    let (dir, name) = parent(path)?;
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::RemoveDir) {
        Ok(()) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::io("removing directory", path, e.into())),
    }
}

/// The names in a directory (never through a link), without `.` and `..`,
/// as raw bytes: a name that is not UTF-8 is still a name.
pub fn list(path: &Path) -> Result<Vec<OsString>> {
    let Some(fd) = open_dir(path)? else {
        return Ok(Vec::new());
    };
    list_fd(fd, path)
}

/// [`list`] of an open directory handle.
pub fn list_fd(fd: OwnedFd, path: &Path) -> Result<Vec<OsString>> {
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(|e| Error::io("listing", path, e.into()))?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| Error::io("listing", path, e.into()))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(names)
}

/// fsync a directory (never through a link).
pub fn sync_dir(path: &Path) -> Result<()> {
    let fd = dir(path)?;
    sync_fd(&fd, path)
}

/// fsync an open directory handle.
pub fn sync_fd(fd: impl AsFd, path: &Path) -> Result<()> {
    nix::unistd::fsync(fd).map_err(|e| Error::io("syncing directory", path, e.into()))
}

/// Length of the random part of a temp name.
const TEMP_RANDOM: usize = 12;
/// Prefix and suffix of every temp file this crate writes: short and fixed,
/// whatever the target's name (a 255-byte target name must not make a
/// 270-byte temp name).
pub const TEMP_PREFIX: &str = ".as-";
pub const TEMP_SUFFIX: &str = ".tmp";

/// Whether `name` is a temp file of [`create_temp`].
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|r| r.len() == TEMP_RANDOM && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A new, empty temp file in `dir` (`O_CREAT|O_EXCL|O_NOFOLLOW`) with `mode`
/// set exactly; returns it and its name.
pub fn create_temp(dir: BorrowedFd<'_>, dir_path: &Path, mode: u32) -> Result<(File, OsString)> {
    for _ in 0..16 {
        let random = uuid::Uuid::new_v4().simple().to_string();
        let name = OsString::from(format!(
            "{TEMP_PREFIX}{}{TEMP_SUFFIX}",
            &random[..TEMP_RANDOM]
        ));
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(dir, name.as_os_str(), flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => {
                adopt(fd.as_fd(), dir, &dir_path.join(&name))?;
                nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| {
                    Error::io("setting the mode of", dir_path.join(&name), e.into())
                })?;
                return Ok((File::from(fd), name));
            }
            Err(Errno::EEXIST) => continue,
            Err(e) => {
                return Err(Error::io(
                    "creating a temp file in",
                    dir_path,
                    io::Error::from(e),
                ));
            }
        }
    }
    Err(Error::io(
        "creating a temp file in",
        dir_path,
        io::Error::from(io::ErrorKind::AlreadyExists),
    ))
}

/// Remove `name` from `dir`, ignoring errors (a temp file being given up).
pub fn discard_at(dir: BorrowedFd<'_>, name: &OsStr) {
    let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_anywhere_on_the_path_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = trusted(tmp.path());
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        symlink(&outside, root.join("inbox")).unwrap();
        symlink(outside.join("secret"), root.join("file")).unwrap();

        let e = read(&root.join("inbox/secret")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = read(&root.join("file")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = open_append(&root.join("inbox/new"), 0o644).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!outside.join("new").exists());
        let e = rename(&outside.join("secret"), &root.join("inbox/moved"), true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(outside.join("secret").exists());
        let e = create_dir_all(&root.join("inbox/sub"), 0o755).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(!outside.join("sub").exists());
        // Removing a link removes the link, never its target.
        assert!(remove_file(&root.join("file")).unwrap());
        assert!(outside.join("secret").exists());
    }

    #[test]
    fn fifos_and_directories_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = trusted(tmp.path());
        let fifo = root.join("journal.jsonl");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        let e = read(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_append(&fifo, 0o644).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_lock(&fifo, 0o644).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        std::fs::create_dir(root.join("report.json")).unwrap();
        let e = read(&root.join("report.json")).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        std::fs::write(root.join("inbox"), "").unwrap();
        let e = list(&root.join("inbox")).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn the_walk_is_as_strict_as_openat2() {
        let tmp = tempfile::tempdir().unwrap();
        let root = trusted(tmp.path());
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "x").unwrap();
        symlink(root.join("d"), root.join("l")).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        assert!(open_walking(&root.join("d/f"), flags, Mode::empty()).is_ok());
        let e = open_walking(&root.join("l/f"), flags, Mode::empty()).unwrap_err();
        assert!(matches!(e, Errno::ELOOP | Errno::ENOTDIR), "{e}");
        assert_eq!(
            open_walking(&root.join("l"), flags, Mode::empty()).unwrap_err(),
            Errno::ELOOP
        );
    }

    #[test]
    fn temp_names_are_short_and_recognised() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dir(tmp.path()).unwrap();
        let (_f, name) = create_temp(d.as_fd(), tmp.path(), 0o600).unwrap();
        let name = name.to_str().unwrap();
        assert!(is_temp_name(name), "{name}");
        assert_eq!(
            name.len(),
            TEMP_PREFIX.len() + TEMP_RANDOM + TEMP_SUFFIX.len()
        );
        assert!(!is_temp_name(".report.json.abc.tmp"));
    }

    #[test]
    fn trusted_resolves_links_above_and_keeps_a_missing_tail() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        symlink(&real, tmp.path().join("alias")).unwrap();
        let t = trusted(&tmp.path().join("alias/not/yet"));
        assert_eq!(t, real.canonicalize().unwrap().join("not/yet"));
    }
}
