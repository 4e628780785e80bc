//! Who owns a running session, and whether that owner is still there.
//!
//! A session's owner (the daemon, or the script that called `session
//! begin`) holds an exclusive `flock` on `sessions/{id}.owner` for the
//! session's whole life; the kernel drops it the moment the holder dies.
//! Anyone else — the daemon, another hook, `check` — learns whether the owner
//! is alive by trying a shared lock on that file, without waiting: refused
//! means alive, granted means gone. A lock is a fact about the file, not
//! about a process, so it holds across PID namespaces, `ProtectProc=`,
//! `PrivateUsers=` and users: the daemon never decides that an owner is dead
//! because it cannot see its pid.
//!
//! `session begin` is a short-lived process, so it hands its lock to a
//! *keeper* (`agent-state session keep`, started detached) that holds it
//! until the script that owns the session exits (it watches it through a
//! pidfd, which works because the keeper runs beside the script, in its PID
//! namespace) or the session's end removes the lock file.
//!
//! This module never waits for a lock and never decides from a pid alone.
//! When the lock cannot be checked (no lock file: an older session, a file
//! it could not create), the session counts as alive until its timeout.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::libc;

use crate::clock::Timestamp;
use crate::error::{Error, IoContext, Result};
use crate::fsx;
use crate::state::lock::LOCK_FILE_MODE;
use crate::state::{AgentDir, atomic};

// ---- the owning process ------------------------------------------------------

/// The process that owns a session: its pid and start time (clock ticks since
/// boot, from /proc), so that a reused pid is not taken for the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    pub start: Option<u64>,
}

impl Owner {
    pub fn of(pid: i32) -> Owner {
        Owner {
            pid,
            start: process_start(pid),
        }
    }

    /// This process.
    pub fn me() -> Owner {
        Owner::of(std::process::id() as i32)
    }

    /// The session script that ran this hook. That is our parent, unless the
    /// parent is a subshell the script forked to run us (`ID=$(agent-state
    /// session begin …)` under `set -E`, or with a pipe): a subshell is a
    /// fork, with the same program and command line as the script, and it
    /// exits at once, so we walk up through such forks to the script itself.
    pub fn parent() -> Owner {
        let mut pid = nix::unistd::getppid().as_raw();
        while let Some(up) = parent_pid(pid) {
            if up <= 1 || !same_program(pid, up) {
                break;
            }
            pid = up;
        }
        Owner::of(pid)
    }

    /// Our parent, its parent, … up to (not including) pid 1: the processes
    /// a hook was called from, as far as this process can see them.
    pub fn ancestors() -> Vec<Owner> {
        let mut chain = Vec::new();
        let mut pid = nix::unistd::getppid().as_raw();
        while pid > 1 && chain.len() < 64 {
            // One read of /proc/PID/stat gives both the start and the parent.
            match stat_of(pid) {
                Some(st) => {
                    chain.push(Owner {
                        pid,
                        start: Some(st.start),
                    });
                    pid = st.ppid;
                }
                None => {
                    chain.push(Owner { pid, start: None });
                    break;
                }
            }
        }
        chain
    }

    /// Is this the owner a session recorded (`owner_pid`, `owner_start`)?
    pub fn is(&self, pid: Option<i32>, start: Option<u64>) -> bool {
        pid == Some(self.pid) && (start.is_none() || start == self.start)
    }
}

/// The parent of `pid` (field 4 of /proc/PID/stat).
fn parent_pid(pid: i32) -> Option<i32> {
    stat_of(pid).map(|st| st.ppid)
}

/// What a hook needs of /proc/PID/stat.
struct ProcStat {
    /// Field 4.
    ppid: i32,
    /// Field 22: the start time in clock ticks since boot.
    start: u64,
}

/// /proc/PID/stat in one read into a fixed buffer (the file is a few
/// hundred bytes; the kernel gives it whole to one read that can hold it),
/// if this process can see `pid`.
fn stat_of(pid: i32) -> Option<ProcStat> {
    use std::io::Read;
    if pid <= 0 {
        return None;
    }
    let mut buf = [0u8; 4096];
    let n = File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .read(&mut buf)
        .ok()?;
    parse_stat(&buf[..n])
}

/// Fields 4 and 22 of a /proc/PID/stat line. The command name (field 2)
/// may hold any bytes, spaces and parentheses included; the fields after
/// the last `)` are plain. Pure.
fn parse_stat(line: &[u8]) -> Option<ProcStat> {
    let close = line.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let ppid = fields.nth(1)?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some(ProcStat { ppid, start })
}

/// Are two processes the same program with the same arguments (one a fork
/// of the other that did not exec)?
fn same_program(a: i32, b: i32) -> bool {
    let exe = |p: i32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    let cmdline = |p: i32| std::fs::read(format!("/proc/{p}/cmdline")).ok();
    let (ea, eb) = (exe(a), exe(b));
    ea.is_some() && ea == eb && cmdline(a) == cmdline(b)
}

/// Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat),
/// if this process can see it.
pub fn process_start(pid: i32) -> Option<u64> {
    stat_of(pid).map(|st| st.start)
}

// ---- the lock file -------------------------------------------------------------

/// `sessions/{id}.owner`.
pub fn lock_path(dir: &AgentDir, session_id: &str) -> PathBuf {
    dir.sessions_dir().join(lock_name(session_id))
}

fn lock_name(session_id: &str) -> String {
    format!("{session_id}.owner")
}

/// The owner's exclusive lock on `sessions/{id}.owner`, held while this
/// value (or a keeper it was handed to) lives. Dropping it closes the file,
/// which releases the lock unless a keeper shares it.
#[derive(Debug)]
pub struct OwnerLock {
    pub session_id: String,
    fd: OwnedFd,
}

/// Is `file` a regular file with exactly one name (a hard link to something
/// else is not an owner lock)?
fn single_link(file: &File, path: &Path) -> Result<bool> {
    Ok(file.metadata().at("checking", path)?.nlink() == 1)
}

/// Create `sessions/{id}.owner` and take its exclusive lock, for `owner`.
/// Call under the agent lock, before the session is recorded as running.
pub fn acquire(dir: &AgentDir, session_id: &str, owner: &Owner) -> Result<OwnerLock> {
    atomic::create_dir(&dir.sessions_dir(), 0o750)?;
    let path = lock_path(dir, session_id);
    // The service user's alone (like every lock only it and root take,
    // [`LOCK_FILE_MODE`]): a held owner lock means "alive" for good, and a
    // reader who could open it could hold a dead session's lock and keep
    // its agent from ever having another session.
    let mut file = fsx::open_create(&path, LOCK_FILE_MODE, false)?;
    let _ = crate::state::lock::narrow_mode(&file, &path);
    if !single_link(&file, &path)? {
        return Err(fsx::unsafe_path(
            &path,
            "has more than one name (a hard link)",
        ));
    }
    // SAFETY: flock on an fd we own; LOCK_NB never waits.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(Error::io("locking", &path, std::io::Error::last_os_error()));
    }
    // For people: who holds it. Nobody reads it to decide anything.
    let text = format!(
        "{{\"session_id\":\"{session_id}\",\"owner_pid\":{},\"owner_start\":{}}}\n",
        owner.pid,
        owner
            .start
            .map(|s| s.to_string())
            .unwrap_or_else(|| "null".into())
    );
    let _ = file
        .set_len(0)
        .and_then(|()| file.write_all(text.as_bytes()));
    Ok(OwnerLock {
        session_id: session_id.to_string(),
        fd: OwnedFd::from(file),
    })
}

/// Remove `sessions/{id}.owner` once the session has ended (its keeper, if
/// any, sees the file go and exits). A missing file is fine.
pub fn release(dir: &AgentDir, session_id: &str) -> Result<()> {
    fsx::remove_file(&lock_path(dir, session_id)).map(|_| ())
}

/// What the owner lock of a session says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Someone holds it: the owner is alive.
    Held,
    /// Nobody holds it: the owner is gone.
    Free,
    /// It cannot tell (no lock file, not a plain file, an error): why.
    Unknown(String),
}

/// Try a shared lock on `sessions/{id}.owner`, without waiting, and let go
/// at once.
pub fn probe(dir: &AgentDir, session_id: &str) -> Probe {
    let path = lock_path(dir, session_id);
    let file = match fsx::open_read(&path) {
        Ok(Some(file)) => file,
        Ok(None) => return Probe::Unknown("it has no owner lock".into()),
        Err(e) => return Probe::Unknown(format!("cannot open its owner lock: {e}")),
    };
    match single_link(&file, &path) {
        Ok(true) => {}
        Ok(false) => return Probe::Unknown("its owner lock is not a plain file".into()),
        Err(e) => return Probe::Unknown(format!("cannot check its owner lock: {e}")),
    }
    // SAFETY: flock on an fd we own; LOCK_NB never waits. Closing the file
    // (on drop) releases a lock we were granted.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        return Probe::Free;
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Probe::Held
    } else {
        Probe::Unknown(format!("cannot try its owner lock: {e}"))
    }
}

/// Is a session's owner alive? Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Gone, and why we believe so (for reasons and messages).
    Gone(String),
}

/// The verdict on a running session from its lock and its timeout: a held
/// lock is alive, a free one gone; one that cannot be checked is alive until
/// `timeout` after `started_at`.
pub fn judge(
    probe: &Probe,
    started_at: Option<Timestamp>,
    timeout: Duration,
    now: Timestamp,
) -> Liveness {
    match probe {
        Probe::Held => Liveness::Alive,
        Probe::Free => {
            Liveness::Gone("its owner lock is free: the process that held it exited".into())
        }
        Probe::Unknown(why) => match started_at {
            Some(start) if now.seconds_since(&start) < timeout.as_secs() as i64 => Liveness::Alive,
            _ => Liveness::Gone(format!(
                "its owner cannot be checked ({why}) and it ran past its timeout of {}",
                humantime::format_duration(timeout)
            )),
        },
    }
}

// ---- the keeper ------------------------------------------------------------------

/// The fd number the keeper finds the lock on.
pub const KEEPER_FD: RawFd = 3;

/// Hand `lock` to a detached keeper process that holds it until `owner`
/// exits or the session ends. The keeper has no stdin, stdout or stderr (a
/// `$(agent-state session begin …)` must not wait for it) and runs in a
/// session of its own (a signal to the script's process group does not
/// reach it; the script's exit does, through its pidfd).
///
/// The keeper is forked and execs `agent-state session keep` (so `ps` names
/// it) without this process waiting for the exec: the lock is the child's
/// from the fork on, and begin's path pays the fork only, not the exec and
/// the loading of a second program (issue 10: 0.65 ms of a hook pair). Were
/// the exec to fail, the child keeps the lock itself, in this program's
/// image: a hook is single-threaded, so the forked child may run it.
pub fn spawn_keeper(lock: OwnerLock, owner: &Owner) -> Result<u32> {
    let fd = lock.fd.as_raw_fd();
    // Everything the child needs before its exec is made here: between the
    // fork and the exec it makes only async-signal-safe calls.
    let cstring = |s: &str| CString::new(s).expect("no NUL in keeper arguments");
    let mut args = vec![
        cstring("agent-state"),
        cstring("session"),
        cstring("keep"),
        cstring(&lock.session_id),
        cstring("--owner-pid"),
        cstring(&owner.pid.to_string()),
    ];
    if let Some(start) = owner.start {
        args.push(cstring("--owner-start"));
        args.push(cstring(&start.to_string()));
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let exe = cstring("/proc/self/exe");
    let dev_null = cstring("/dev/null");
    let root = cstring("/");
    // SAFETY: fork() in a single-threaded process (a hook starts no
    // thread); the child runs only async-signal-safe calls on memory
    // prepared above until execv, and `keep` (plain syscalls) after a
    // failed one.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io(
            "starting the owner keeper",
            "/proc/self/exe",
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        // SAFETY: in the child, on fds it owns, with the strings above.
        unsafe {
            if fd == KEEPER_FD {
                libc::fcntl(fd, libc::F_SETFD, 0);
            } else {
                libc::dup2(fd, KEEPER_FD);
            }
            libc::setsid();
            let null = libc::open(dev_null.as_ptr(), libc::O_RDWR);
            if null >= 0 {
                for std_fd in 0..3 {
                    libc::dup2(null, std_fd);
                }
            }
            // Nothing else of the hook's stays open in the keeper (its
            // stdout pipe above all: `$(…)` waits for every writer).
            libc::syscall(libc::SYS_close_range, KEEPER_FD + 1, libc::c_uint::MAX, 0);
            libc::chdir(root.as_ptr());
            libc::execv(exe.as_ptr(), argv.as_ptr());
        }
        keep(owner.pid, owner.start);
        // SAFETY: leaving the child without running the parent's exit code.
        unsafe { libc::_exit(0) }
    }
    // The keeper shares our open file: closing ours keeps its lock.
    drop(lock);
    Ok(pid as u32)
}

/// The keeper's life: hold the lock on fd [`KEEPER_FD`] until the process
/// `owner_pid` (started at `owner_start`) exits or the lock file is removed
/// (the session ended). Never returns an error: whatever goes wrong, it ends,
/// and with it the lock (the session then counts as its owner gone, which
/// is right when the owner is gone and otherwise noticed by the owner's own
/// `session end`).
pub fn keep(owner_pid: i32, owner_start: Option<u64>) {
    // SAFETY: fd 3 was handed to us by `spawn_keeper`; we own it from here.
    let lock = unsafe { OwnedFd::from_raw_fd(KEEPER_FD) };
    let unlinked = || {
        nix::sys::stat::fstat(&lock)
            .map(|st| st.st_nlink == 0)
            .unwrap_or(true)
    };
    let owner_is_there = || {
        let now = process_start(owner_pid);
        now.is_some() && (owner_start.is_none() || now == owner_start)
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, owner_pid, 0) } as RawFd;
    // SAFETY: a new fd nothing else owns.
    let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
    // The pid could have been reused between `begin` and now: only the
    // process that started at `owner_start` is the owner.
    if !owner_is_there() {
        return;
    }
    // SAFETY: inotify_init1 returns a new fd or -1.
    let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    let inotify = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
    if let Some(i) = &inotify {
        let path = CString::new(format!("/proc/self/fd/{KEEPER_FD}").as_bytes()).unwrap();
        // SAFETY: a valid inotify fd and a NUL-terminated path.
        unsafe {
            libc::inotify_add_watch(
                i.as_raw_fd(),
                path.as_ptr(),
                libc::IN_ATTRIB | libc::IN_DELETE_SELF,
            )
        };
    }
    // With a pidfd and inotify, poll wakes us when it matters; the timeout
    // is only a backstop (and the way to notice the owner without a pidfd).
    let backstop_ms = if pidfd.is_some() { 60_000 } else { 1_000 };
    loop {
        if unlinked() {
            return;
        }
        let mut fds = Vec::new();
        if let Some(p) = &pidfd {
            fds.push(libc::pollfd {
                fd: p.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if let Some(i) = &inotify {
            fds.push(libc::pollfd {
                fd: i.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, backstop_ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if pidfd.is_some() && fds[0].revents != 0 {
            return;
        }
        if let Some(i) = &inotify {
            let mut buf = [0u8; 4096];
            // SAFETY: reads into a buffer we own; non-blocking.
            while unsafe { libc::read(i.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
        if pidfd.is_none() && !owner_is_there() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_parent_and_the_start_whatever_the_name() {
        // Field 2 with spaces, parentheses and a byte that is not UTF-8.
        let mut line = b"4242 (we(ir) d\xff) S 17 4242 17 0 -1 4194560 90 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200".to_vec();
        line.push(b'\n');
        let st = parse_stat(&line).unwrap();
        assert_eq!(st.ppid, 17);
        assert_eq!(st.start, 987654);
        assert!(parse_stat(b"4242 (short) S 17").is_none());
        let me = stat_of(std::process::id() as i32).unwrap();
        assert_eq!(me.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(Some(me.start), process_start(std::process::id() as i32));
    }

    fn at(s: &str) -> Timestamp {
        Timestamp::parse(s).unwrap()
    }

    #[test]
    fn a_lock_decides_and_an_unknown_owner_lives_until_its_timeout() {
        let start = Some(at("2026-01-01T10:00:00Z"));
        let hour = Duration::from_secs(3600);
        let now = at("2026-01-01T10:30:00Z");
        assert_eq!(judge(&Probe::Held, start, hour, now), Liveness::Alive);
        assert!(matches!(
            judge(&Probe::Free, start, hour, now),
            Liveness::Gone(_)
        ));
        let unknown = Probe::Unknown("it has no owner lock".into());
        assert_eq!(judge(&unknown, start, hour, now), Liveness::Alive);
        let later = at("2026-01-01T11:00:01Z");
        assert!(
            matches!(judge(&unknown, start, hour, later), Liveness::Gone(w) if w.contains("timeout"))
        );
        // Held past the timeout is still alive: the timeout path (SIGTERM,
        // SESSION_TIMEOUT) deals with it, not the owner check.
        assert_eq!(judge(&Probe::Held, start, hour, later), Liveness::Alive);
    }

    #[test]
    fn our_own_process_has_a_start_time() {
        let me = Owner::me();
        assert!(me.start.is_some());
        assert!(me.is(Some(me.pid), me.start));
        assert!(!me.is(Some(me.pid), me.start.map(|s| s + 1)));
        assert!(!me.is(None, None));
    }
}
