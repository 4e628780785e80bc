//! One cgroup per session, when the daemon runs in a delegated cgroup v2
//! subtree (systemd `Delegate=yes`): ending a session then ends every
//! process in it, including a grandchild that cleared its environment and
//! left the process group (`setsid`, a double fork, `env -i`), which the
//! runner's process-group and environment sweep cannot find.
//!
//! Layout, under the service's own cgroup (`…/agent-state.service`):
//! the daemon moves itself into `daemon/` (cgroup v2 lets a cgroup with
//! children hold no processes of its own once controllers are enabled, and
//! systemd expects a delegated unit to keep that rule), and each session
//! gets `session-AGENT-ID/`, which its process joins between fork and exec.
//! When the session ends its cgroup is killed (`cgroup.kill`, or SIGKILL to
//! every pid in `cgroup.procs` until it is empty on kernels before 5.14) and
//! removed.
//!
//! Used only when it is really ours: cgroup v2 mounted at /sys/fs/cgroup
//! (or /sys/fs/cgroup/unified beside the v1 hierarchies, the hybrid layout),
//! our cgroup not the root of the hierarchy, writable by us, and marked as
//! delegated by systemd (the `user.delegate` or `trusted.delegate` extended
//! attribute). Anywhere else (the embedded default: a daemon run from a
//! terminal, in a container, under a unit without `Delegate=yes`) nothing
//! here is used and the runner's process-group path is the only one.
//!
//! Never decides anything about a session; never touches state files.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where cgroup v2 is mounted: the unified layout, or the hybrid one
/// (v1 controllers, and v2 beside them, as systemd 252 may boot).
const CGROUP2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// How long killing a session's cgroup waits for it to be empty, and then
/// for its removal.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// The delegated subtree the daemon runs in, set up once per process.
#[derive(Debug)]
pub struct Cgroups {
    /// The service's cgroup directory (`/sys/fs/cgroup/system.slice/agent-state.service`).
    base: PathBuf,
    /// Why sessions' cgroups have no memory controller (`memory_max`
    /// cannot be applied, `memory.events` cannot be read); `None` when
    /// they have it.
    pub no_memory: Option<String>,
}

/// Per-session cgroups, if this process may use them: set up (the daemon
/// moved into `daemon/`, leftovers of a previous daemon killed) on the first
/// call, which logs which path is used.
pub fn available() -> Option<&'static Cgroups> {
    setup_once().as_ref().ok()
}

/// [`available`], or why not (`agent-state worker` says it in its own log).
pub fn why_unavailable() -> Option<String> {
    setup_once().as_ref().err().map(ToString::to_string)
}

fn setup_once() -> &'static Result<Cgroups, NoCgroups> {
    static CGROUPS: OnceLock<Result<Cgroups, NoCgroups>> = OnceLock::new();
    CGROUPS.get_or_init(|| match Cgroups::setup() {
        Ok(c) => {
            tracing::info!(
                cgroup = %c.base.display(),
                "sessions run in cgroups of their own under the delegated cgroup"
            );
            Ok(c)
        }
        Err(why) => {
            tracing::info!("sessions run in process groups only (no per-session cgroups: {why})");
            Err(why)
        }
    })
}

impl Cgroups {
    /// The delegated cgroup the sessions' cgroups are made in.
    pub fn base(&self) -> &Path {
        &self.base
    }
}

/// Why sessions get no cgroups of their own (logged once at start: they
/// run in process groups only; not an error).
#[derive(Debug, thiserror::Error)]
enum NoCgroups {
    #[error("cannot read /proc/self/cgroup: {0}")]
    ReadOwn(io::Error),
    #[error("no cgroup v2 hierarchy in /proc/self/cgroup: {0:?}")]
    NoV2(String),
    #[error("cgroup v2 is not mounted at {}", CGROUP2_MOUNTS.join(" or "))]
    NotMounted,
    #[error("this process is in the root cgroup")]
    RootCgroup,
    #[error("{} is not delegated to this service (no Delegate=yes)", .0.display())]
    NotDelegated(PathBuf),
    #[error("{} is not writable: {error}", dir.display())]
    NotWritable { dir: PathBuf, error: nix::Error },
    #[error("cannot create {}: {error}", dir.display())]
    Create { dir: PathBuf, error: io::Error },
    #[error("cannot move the daemon into {}: {error}", dir.display())]
    MoveDaemon { dir: PathBuf, error: io::Error },
}

impl Cgroups {
    fn setup() -> Result<Cgroups, NoCgroups> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(NoCgroups::ReadOwn)?;
        let relative = unified_path(&own).ok_or_else(|| NoCgroups::NoV2(own.clone()))?;
        let root = CGROUP2_MOUNTS
            .iter()
            .map(Path::new)
            .find(|m| {
                nix::sys::statfs::statfs(*m)
                    .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
            })
            .ok_or(NoCgroups::NotMounted)?;
        let base = root.join(relative.trim_start_matches('/'));
        if relative == "/" {
            return Err(NoCgroups::RootCgroup);
        }
        if !is_delegated(&base) {
            return Err(NoCgroups::NotDelegated(base));
        }
        nix::unistd::access(&base, nix::unistd::AccessFlags::W_OK).map_err(|error| {
            NoCgroups::NotWritable {
                dir: base.clone(),
                error,
            }
        })?;
        let mut cgroups = Cgroups {
            base,
            no_memory: None,
        };
        // Sessions of a daemon that ended without killing them: under
        // systemd they were killed with the unit, so this finds empty
        // directories at most.
        for dir in cgroups.session_dirs() {
            let leftover = SessionCgroup::at(dir);
            let killed = leftover.kill();
            if killed > 0 {
                tracing::warn!(cgroup = %leftover.dir.display(), killed, "killed the processes of an earlier session");
            }
            leftover.remove();
        }
        let daemon = cgroups.base.join("daemon");
        make_dir(&daemon)?;
        std::fs::write(daemon.join("cgroup.procs"), std::process::id().to_string()).map_err(
            |error| NoCgroups::MoveDaemon {
                dir: daemon.clone(),
                error,
            },
        )?;
        // The children (sessions) get the memory controller, for
        // `memory_max` and `memory.events`: possible now that the base
        // holds no process of its own.
        cgroups.no_memory = enable_memory(&cgroups.base).err().map(|e| e.to_string());
        if let Some(why) = &cgroups.no_memory {
            tracing::info!(
                "sessions' cgroups have no memory controller: {why}; memory_max is not applied and OOM kills are judged from /proc/vmstat"
            );
        }
        Ok(cgroups)
    }

    /// A new cgroup for the session marked `marker` (the runner's
    /// `AGENT_STATE_SESSION_ID` value, e.g. `rio/20261122-120000`).
    pub fn session(&self, marker: &str) -> io::Result<SessionCgroup> {
        let dir = self.base.join(session_dir_name(marker, std::process::id()));
        if dir.exists() {
            // The same session run again (a retry reuses nothing, but be safe).
            let old = SessionCgroup::at(dir.clone());
            old.kill();
            old.remove();
        }
        std::fs::create_dir(&dir)?;
        SessionCgroup::new(dir)
    }

    fn session_dirs(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(&self.base) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_name().as_bytes().starts_with(b"session-"))
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    }
}

/// One session's cgroup.
#[derive(Debug)]
pub struct SessionCgroup {
    pub dir: PathBuf,
    /// `DIR/cgroup.procs` as a C string, made before the fork so that the
    /// child only has to open and write it.
    procs: CString,
}

impl SessionCgroup {
    fn new(dir: PathBuf) -> io::Result<SessionCgroup> {
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a cgroup path"))?;
        Ok(SessionCgroup { dir, procs })
    }

    fn at(dir: PathBuf) -> SessionCgroup {
        let procs =
            CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).unwrap_or_default();
        SessionCgroup { dir, procs }
    }

    /// Limit the session's memory ([`memory_limits`]): `memory.high`,
    /// `memory.max`, and `memory.swap.max` 0 where the kernel accounts
    /// swap per cgroup (the file exists). Returns what was written, for
    /// the log; an error names the file.
    pub fn limit_memory(&self, max: u64) -> io::Result<Vec<(&'static str, u64)>> {
        let swap_accounted = self.dir.join(SWAP_MAX).exists();
        let limits = memory_limits(max, swap_accounted);
        for (file, value) in &limits {
            let path = self.dir.join(file);
            std::fs::write(&path, value.to_string()).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()))
            })?;
        }
        Ok(limits)
    }

    /// The `oom_kill` count of the cgroup's `memory.events` (its processes
    /// and its descendants'); `None` without the memory controller.
    pub fn oom_kills(&self) -> Option<u64> {
        std::fs::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|t| super::memory::oom_kill_count(&t))
    }

    /// The path the child writes "0" to (itself) before exec.
    pub fn procs_path(&self) -> &CStr {
        &self.procs
    }

    /// Move process `pid` into the cgroup (the session's main process, from
    /// the parent, in case the child could not join it itself).
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    /// Kill every process in the cgroup and wait (briefly) until it is
    /// empty. Returns how many processes were found in it.
    pub fn kill(&self) -> usize {
        let found = self.pids().len();
        let deadline = Instant::now() + EMPTY_WAIT;
        let by_kernel = std::fs::write(self.dir.join("cgroup.kill"), "1").is_ok();
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if !by_kernel {
                // Before Linux 5.14: freeze so nothing forks between the
                // read and the kills (ignored where there is no freezer),
                // then SIGKILL what is there, until nothing is.
                let _ = std::fs::write(self.dir.join("cgroup.freeze"), "1");
                for pid in pids {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            if Instant::now() >= deadline {
                tracing::warn!(cgroup = %self.dir.display(), "processes of the session's cgroup are not dead yet");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        found
    }

    /// Remove the (empty) cgroup; retried briefly, as the last process may
    /// still be on its way out.
    pub fn remove(&self) {
        let deadline = Instant::now() + EMPTY_WAIT;
        loop {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!(cgroup = %self.dir.display(), "cannot remove the session's cgroup: {e}");
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| parse_pids(&t))
            .unwrap_or_default()
    }
}

/// Move the calling process into the cgroup whose `cgroup.procs` is
/// `procs`. Meant for the child between fork and exec: only open, write and
/// close, no allocation.
pub fn join_self(procs: &CStr) -> io::Result<()> {
    use nix::libc;
    // SAFETY: plain system calls on a NUL-terminated path and a static
    // buffer; all async-signal-safe.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
        let result = if written == 1 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// `memory.high` for a `memory_max`: 90% of it, so the kernel reclaims and
/// throttles before it kills.
fn memory_high(max: u64) -> u64 {
    max / 10 * 9
}

/// The cgroup file of the session's swap limit; absent when the kernel does
/// not account swap per cgroup (no swap controller: `swapaccount=0`, or a
/// kernel without `CONFIG_MEMCG_SWAP`).
const SWAP_MAX: &str = "memory.swap.max";

/// What a `memory_max` of `max` bytes writes in a session's cgroup, in
/// order: where swap is accounted (`swap_accounted`: the file exists)
/// `memory.swap.max` 0, so that on a host with swap a session past its
/// limit is OOM-killed (and recorded as `SESSION_OOM`) instead of swapping
/// the host slow; `memory.high` (the kernel reclaims and throttles past
/// it) at 90%; `memory.max` (the OOM killer acts past it) last, so that
/// when a write fails the limit is not applied at all, or applied whole.
/// Pure.
fn memory_limits(max: u64, swap_accounted: bool) -> Vec<(&'static str, u64)> {
    let swap = swap_accounted.then_some((SWAP_MAX, 0));
    swap.into_iter()
        .chain([("memory.high", memory_high(max)), ("memory.max", max)])
        .collect()
}

/// Enable the memory controller for the children of `base`, if the parent
/// gives it to `base` (systemd's `Delegate=yes` does with memory
/// accounting); says why not otherwise.
fn enable_memory(base: &Path) -> Result<(), NoMemory> {
    let controllers = base.join("cgroup.controllers");
    let have = std::fs::read_to_string(&controllers).map_err(|source| NoMemory::Unreadable {
        path: controllers.clone(),
        source,
    })?;
    if !have.split_whitespace().any(|c| c == "memory") {
        return Err(NoMemory::NotGiven { path: controllers });
    }
    let control = base.join("cgroup.subtree_control");
    std::fs::write(&control, "+memory").map_err(|source| NoMemory::NotEnabled {
        path: control,
        source,
    })
}

/// Why sessions' cgroups have no memory controller.
#[derive(Debug, thiserror::Error)]
enum NoMemory {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} does not list the memory controller (cgroup v1 memory, or no MemoryAccounting)",
        path.display()
    )]
    NotGiven { path: PathBuf },
    #[error("cannot write +memory to {}: {source}", path.display())]
    NotEnabled {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The cgroup v2 path in `/proc/self/cgroup` (its `0::/path` line; the
/// other lines are v1 hierarchies of a hybrid layout).
fn unified_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// systemd marks a cgroup it delegated with the `trusted.delegate` extended
/// attribute, and (from v251) `user.delegate`, readable without privilege.
fn is_delegated(dir: &Path) -> bool {
    ["user.delegate", "trusted.delegate"]
        .iter()
        .any(|name| xattr_is_one(dir, name))
}

fn xattr_is_one(dir: &Path, name: &str) -> bool {
    use nix::libc;
    let (Ok(path), Ok(name)) = (CString::new(dir.as_os_str().as_bytes()), CString::new(name))
    else {
        return false;
    };
    let mut value = [0u8; 8];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n > 0 && value[..n as usize].starts_with(b"1")
}

/// `session-AGENT-ID` from the session's marker (`rio/20261122-120000`);
/// anything but letters, digits, `-` and `_` becomes `-`. Without a marker,
/// a name unique in this daemon.
fn session_dir_name(marker: &str, daemon_pid: u32) -> String {
    if marker.is_empty() {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return format!("session-{daemon_pid}-{n}");
    }
    let clean: String = marker
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(200)
        .collect();
    format!("session-{clean}")
}

fn parse_pids(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .collect()
}

fn make_dir(dir: &Path) -> Result<(), NoCgroups> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(NoCgroups::Create {
            dir: dir.to_path_buf(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v2_hierarchy_is_found_unified_or_hybrid() {
        let table = [
            (
                "0::/system.slice/agent-state.service\n",
                Some("/system.slice/agent-state.service"),
            ),
            ("0::/\n", Some("/")),
            (
                "12:pids:/x\n1:name=systemd:/a.service\n0::/a.service\n",
                Some("/a.service"),
            ),
            ("1:name=systemd:/x\n", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(unified_path(text), want, "{text:?}");
        }
    }

    #[test]
    fn session_cgroups_are_named_after_the_session() {
        assert_eq!(
            session_dir_name("rio/20261122-120000", 7),
            "session-rio-20261122-120000"
        );
        assert_eq!(session_dir_name("a b/../c", 7), "session-a-b----c");
        let first = session_dir_name("", 7);
        assert!(first.starts_with("session-7-"));
        assert_ne!(first, session_dir_name("", 7));
    }

    #[test]
    fn memory_high_is_nine_tenths_of_memory_max() {
        assert_eq!(memory_high(2 << 30), 1_932_735_276);
        assert_eq!(memory_high(100), 90);
        assert_eq!(memory_high(0), 0);
    }

    #[test]
    fn memory_max_writes_high_max_and_no_swap_where_swap_is_accounted() {
        const GIB: u64 = 1 << 30;
        // (memory_max, memory.swap.max exists, what is written in order)
        type Row = (u64, bool, &'static [(&'static str, u64)]);
        let table: &[Row] = &[
            (
                2 * GIB,
                true,
                &[
                    ("memory.swap.max", 0),
                    ("memory.high", 1_932_735_276),
                    ("memory.max", 2 * GIB),
                ],
            ),
            (
                2 * GIB,
                false,
                &[("memory.high", 1_932_735_276), ("memory.max", 2 * GIB)],
            ),
            (
                64 << 20,
                true,
                &[
                    ("memory.swap.max", 0),
                    ("memory.high", 60_397_974),
                    ("memory.max", 64 << 20),
                ],
            ),
        ];
        for &(max, swap, want) in table {
            assert_eq!(memory_limits(max, swap), want, "{max} swap {swap}");
        }
    }

    #[test]
    fn limit_memory_writes_the_files_of_the_session_cgroup() {
        for swap in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            if swap {
                std::fs::write(dir.path().join("memory.swap.max"), "max\n").unwrap();
            }
            let cg = SessionCgroup::at(dir.path().to_path_buf());
            let written = cg.limit_memory(1000).unwrap();
            assert_eq!(written, memory_limits(1000, swap));
            let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).ok();
            assert_eq!(read("memory.high").as_deref(), Some("900"));
            assert_eq!(read("memory.max").as_deref(), Some("1000"));
            // Never created where the kernel does not account swap.
            assert_eq!(
                read("memory.swap.max").as_deref(),
                swap.then_some("0"),
                "swap {swap}"
            );
        }
    }

    #[test]
    fn pids_are_read_one_a_line() {
        assert_eq!(parse_pids("12\n345\n\n"), vec![12, 345]);
    }
}
