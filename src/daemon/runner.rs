//! The session runner: runs one session process and makes sure that, when it
//! is over, nothing of it is left running.
//!
//! It owns the process side of a session: spawning the configured command in
//! its own process group with the prompt on stdin, copying stdout and stderr
//! (interleaved as they arrive) into the capped session log while handing
//! every chunk to an [`OutputObserver`] (the parsers; the daemon's also notes
//! when the session last printed, for its machine's stall timer), carrying
//! out the daemon's [`Orders`] (SIGTERM to the group, later SIGKILL: the
//! session's machine decides when, for a timeout, a stall, a stop or a
//! shutdown; the runner keeps no timer of its own, beyond an optional
//! silence notice its own tests use), and the sweep after the main process
//! exits: the process group and every process that carries the session's
//! marker in its environment (which finds grandchildren that left the group
//! with `setsid` or a double fork) get SIGKILL. Under systemd with a
//! delegated cgroup (`Delegate=yes`), each session also runs in a cgroup of
//! its own ([`super::cgroup`]), killed whole after the sweep: that catches
//! even a grandchild that cleared its environment *and* left the group.
//! Without one (the embedded default), the process group and the marker are
//! all there is.
//!
//! It learns that the main process exited from a pidfd, which does not reap
//! it, sweeps while the process is a zombie (so its pid, the group id the
//! sweep signals, cannot yet be another process's), and only then reaps it;
//! without pidfds (Linux before 5.3) it reaps first, as said once in the log.
//!
//! It decides nothing about the session (that is its machine's job) and
//! never touches state files. It never reaps processes that are not its own
//! child: a `waitpid(-1)` would steal the exit statuses tokio waits for.
//! Escaped grandchildren are reparented to init (or the nearest subreaper),
//! which reaps them after the sweep kills them.

mod sweep;
#[cfg(test)]
mod timed;
mod types;
use sweep::sweep_blocking;
pub use sweep::{kill_marked, kill_marked_all};
pub use types::*;

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{oneshot, watch};
use tokio::time::Sleep;

use super::cgroup::{self, SessionCgroup};
use super::memory::{self, MemoryReadings};

/// How much is read from a pipe at a time. Output is handled chunk by chunk
/// and never accumulated, so this (twice, for stdout and stderr) plus the
/// log file's write buffer is all the memory a session's output costs.
const READ_CHUNK: usize = 64 * 1024;

/// After the main process has exited and the leftovers are killed, how long
/// the runner keeps reading until both pipes reach end-of-file. A process
/// that escaped the sweep (it cleared its environment *and* left the group)
/// can hold a pipe open forever; after this the runner stops listening.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Run one session to its end, and kill whatever it left behind, keeping
/// its own time (the spec's timeout, stall action and kill grace), for the
/// tests of the runner and the parsers: the daemon gives [`Orders`] from
/// the session's machine instead ([`launch`], [`Launched::run`]).
///
/// `stop` flipping to `true` terminates the session like a timeout does; a
/// closed channel means no stop will come.
#[cfg(test)]
pub async fn run(
    spec: SessionSpec,
    observer: &mut dyn OutputObserver,
    stop: watch::Receiver<bool>,
    spawned: Option<oneshot::Sender<u32>>,
) -> RunReport {
    timed::run(spec, observer, stop, spawned).await
}

/// A session process just spawned by [`launch`], not yet supervised.
pub struct Launched {
    // Fields drop in order: the guard (killing the group) before the child,
    // which is not reaped yet, so its pid (the group id) cannot be reused.
    guard: SessionGuard,
    child: Child,
    spec: SessionSpec,
    log: tokio::fs::File,
    started: Instant,
    pid: u32,
}

/// The first half of a session's run, which never waits: the checks, the
/// log, the spawn (none once the `orders` stop the session: it did not run,
/// [`Ending::Stopped`]). The daemon calls it in the loop itself, so the agent starts before
/// the loop goes on to publish its state (daemon.json, STATUS=) and to other
/// agents; [`Launched::run`] then supervises it in a task. Needs a tokio
/// runtime (the child's pipes). On failure, the report of a session that
/// did not run.
pub fn launch(
    spec: SessionSpec,
    orders: &watch::Receiver<Orders>,
) -> std::result::Result<Launched, Box<RunReport>> {
    ignore_sigpipe();
    let not_run = |ending: Ending| Box::new(RunReport::not_run(ending));
    if orders.borrow().stop {
        return Err(not_run(Ending::Stopped));
    }
    let Some(program) = spec.argv.first() else {
        return Err(not_run(Ending::SpawnFailed {
            reason: "the session command is empty".into(),
            kind: SpawnFailure::Other,
        }));
    };
    if let Err(bad) = check_cwd(&spec.cwd) {
        return Err(not_run(Ending::SpawnFailed {
            reason: bad.to_string(),
            kind: SpawnFailure::Other,
        }));
    }
    let log = match open_log(&spec.log_path) {
        Ok(file) => file,
        Err(e) => {
            return Err(not_run(Ending::SpawnFailed {
                reason: format!(
                    "cannot open the session log {}: {e}",
                    spec.log_path.display()
                ),
                kind: SpawnFailure::Other,
            }));
        }
    };

    let cgroup = session_cgroup(&spec.marker);
    limit_memory(&spec, cgroup.as_ref());
    let kernel_oom_kills = kernel_oom_kills();
    let mut cmd = command(&spec);
    if let Some(cgroup) = &cgroup {
        let procs = cgroup.procs_path().to_owned();
        // SAFETY: the closure only opens, writes and closes a file (see
        // `cgroup::join_self`), which is async-signal-safe. A failure is
        // ignored: the parent moves the child below as well.
        unsafe {
            cmd.pre_exec(move || {
                let _ = cgroup::join_self(&procs);
                Ok(())
            });
        }
    }
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            if let Some(cgroup) = &cgroup {
                cgroup.remove();
            }
            return Err(Box::new(RunReport::not_run(spawn_failure(program, &e))));
        }
    };
    let started = Instant::now();
    let pid = child.id().expect("a child that was just spawned has a pid");
    // (ESRCH: it has exited already, from inside the cgroup or not.)
    if let Some(cgroup) = &cgroup
        && let Err(e) = cgroup.add(pid)
        && e.raw_os_error() != Some(nix::libc::ESRCH)
    {
        tracing::warn!(pid, cgroup = %cgroup.dir.display(), "cannot move the session into its cgroup: {e}");
    }
    let guard = SessionGuard {
        pgid: pid as i32,
        marker: spec.marker.clone(),
        cgroup,
        armed: true,
        kernel_oom_kills,
    };
    tracing::debug!(pid, command = ?spec.argv, "session process started");
    Ok(Launched {
        spec,
        child,
        log,
        started,
        pid,
        guard,
    })
}

impl Launched {
    /// The second half: supervise the process to its end, carrying out the
    /// `orders` as they change, and kill whatever it left behind.
    pub async fn run(
        self,
        observer: &mut dyn OutputObserver,
        mut orders: watch::Receiver<Orders>,
        spawned: Option<oneshot::Sender<u32>>,
    ) -> RunReport {
        // Fields in this order: `guard` dropped before `child` on
        // cancellation, so the group is killed while the child is not yet
        // reaped and its pid (the group id) cannot have been reused.
        let Launched {
            mut spec,
            mut child,
            log,
            started,
            pid,
            guard,
        } = self;
        let mut guard = guard;
        supervised(
            &mut spec,
            &mut child,
            log,
            started,
            pid,
            &mut guard,
            observer,
            &mut orders,
            spawned,
        )
        .await
    }
}

#[allow(clippy::too_many_arguments)]
async fn supervised(
    spec: &mut SessionSpec,
    child: &mut Child,
    log: tokio::fs::File,
    started: Instant,
    pid: u32,
    guard: &mut SessionGuard,
    observer: &mut dyn OutputObserver,
    orders: &mut watch::Receiver<Orders>,
    spawned: Option<oneshot::Sender<u32>>,
) -> RunReport {
    if let Some(spawned) = spawned {
        // The caller may have stopped listening; the run goes on regardless.
        let _ = spawned.send(pid);
    }

    let prompt = std::mem::take(&mut spec.stdin);
    let mut output = Output::new(log, &spec.log_path, spec.max_output, observer);
    let mut pipes = Pipes::new(child);
    let (exit, ending_by_us) =
        supervise(child, spec, prompt, &mut pipes, &mut output, orders).await;
    let duration = started.elapsed();
    // Read before the cgroup is killed and removed.
    let memory = MemoryReadings {
        cgroup_oom_kills: guard
            .cgroup
            .as_ref()
            .filter(|_| cgroup::available().is_some_and(|c| c.no_memory.is_none()))
            .and_then(SessionCgroup::oom_kills),
        kernel_before: guard.kernel_oom_kills,
        kernel_after: kernel_oom_kills(),
    };

    let leftovers_killed =
        sweep(pid as i32, &spec.marker).await + kill_cgroup(guard.cgroup.take()).await;
    guard.armed = false;
    if leftovers_killed > 0 {
        tracing::warn!(
            pid,
            leftovers_killed,
            "the session left processes running after it ended; killed them"
        );
    }
    // Only now, the group swept, may the main process's pid (the group id)
    // be freed for reuse.
    let status = match exit {
        MainExit::Unreaped => child.wait().await,
        MainExit::Reaped(status) => status,
    };
    drain(&mut pipes, &mut output).await;
    let finished = output.finish().await;

    let ending = match (ending_by_us.clone(), status) {
        (Some(ending), _) => ending,
        (None, Ok(status)) => ending_of(status),
        (None, Err(e)) => {
            // Only possible if something else reaped our child (a
            // waitpid(-1) elsewhere in the process). The sweep has SIGKILLed
            // the group, so that is the best account of its end.
            tracing::error!(pid, "lost the exit status of the session process: {e}");
            Ending::Signaled {
                signal: Signal::SIGKILL as i32,
            }
        }
    };
    let oom = memory::oom_evidence(
        &memory,
        ending
            == (Ending::Signaled {
                signal: Signal::SIGKILL as i32,
            }),
        ending_by_us.is_some(),
    );
    if let Some(evidence) = &oom {
        tracing::warn!(pid, "the kernel's OOM killer ended the session: {evidence}");
    }
    RunReport {
        oom,
        ending,
        pid: Some(pid),
        output_bytes: finished.output_bytes,
        logged_bytes: finished.logged_bytes,
        truncated: finished.truncated,
        duration,
        leftovers_killed,
        log_error: finished.log_error,
        stalls: finished.stalls,
        workspace: None,
    }
}

/// How [`supervise`] saw the main process end.
enum MainExit {
    /// It exited and is a zombie, not yet reaped: its pid, the session's
    /// group id, cannot be reused until `child.wait()` reaps it.
    Unreaped,
    /// Reaped already (no pidfd on this kernel), with its status.
    Reaped(io::Result<ExitStatus>),
}

/// How the runner learns that the main process exited.
enum ExitWatch {
    /// A pidfd (`pidfd_open`, Linux 5.3), readable once the process has
    /// exited; polling it does not reap.
    Pidfd(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    /// `child.wait()`, which reaps: the fallback without pidfds.
    Reaping,
}

impl ExitWatch {
    /// Call only while `pid` is an unreaped child of this process, so that
    /// the pid cannot name another process.
    fn new(pid: u32) -> ExitWatch {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: pidfd_open takes a pid and flags and returns a new file
        // descriptor or -1; no memory is passed.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as i32, 0) };
        let opened = if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            // SAFETY: a descriptor just returned by the kernel, owned by
            // nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            // SAFETY: an OwnedFd keeps its descriptor open and unchanged
            // for as long as it lives, here inside the AsyncFd.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .map_err(io::Error::from)
        };
        match opened {
            Ok(fd) => ExitWatch::Pidfd(fd),
            Err(e) => {
                // Said once per daemon: the same reason holds for every session.
                static SAID: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        pid,
                        "no pidfd for the session process (said once): {e}; the sweep after \
                         each session runs after its main process is reaped, when its group \
                         id could in principle be reused"
                    );
                }
                ExitWatch::Reaping
            }
        }
    }

    /// Once the main process has exited.
    async fn exited(&self, child: &mut Child) -> MainExit {
        match self {
            ExitWatch::Pidfd(fd) => match fd.readable().await {
                // Readiness is left set: the process stays exited.
                Ok(_ready) => MainExit::Unreaped,
                Err(e) => {
                    tracing::warn!(
                        "polling the session's pidfd failed: {e}; waiting for it instead"
                    );
                    MainExit::Reaped(child.wait().await)
                }
            },
            ExitWatch::Reaping => MainExit::Reaped(child.wait().await),
        }
    }
}

/// Until the main process exits: copy output, feed stdin, notice stalls,
/// carry out the orders. Returns how it ended (not reaped yet, if this
/// kernel has pidfds) and, if the runner ended the process, why (as
/// ordered).
async fn supervise(
    child: &mut Child,
    spec: &SessionSpec,
    prompt: Vec<u8>,
    pipes: &mut Pipes,
    output: &mut Output<'_>,
    orders: &mut watch::Receiver<Orders>,
) -> (MainExit, Option<Ending>) {
    let pid = child
        .id()
        .expect("the child is not reaped before this returns");
    // tokio reaps a child only through its `Child` (wait, try_wait, drop),
    // never with waitpid(-1), so until this function's caller waits, `pid`
    // is ours.
    let watch = ExitWatch::new(pid);
    // Fed concurrently with everything else, so a child that never reads its
    // stdin cannot block the runner; dropped (closing the pipe) when the
    // child exits.
    let feed = feed_stdin(child.stdin.take(), prompt);
    tokio::pin!(feed);
    let mut fed = false;

    // Reset by every chunk of output; `stalled` once it fired, until the
    // next output (a completed `Sleep` stays ready).
    let mut stall_timer: Option<Pin<Box<Sleep>>> = spec
        .stall_timeout
        .map(|after| Box::pin(tokio::time::sleep(after)));
    let mut stalled = false;
    let mut obeying = Obeying {
        pid,
        iteration: spec.iteration,
        kill_grace: spec.kill_grace,
        terminating: None,
        terminated_at: None,
        kill_at: None,
        killed: false,
    };
    // Orders given before the run was supervised (between its launch and
    // now) count too.
    let now = orders.borrow_and_update().clone();
    obeying.obey(&now, output);
    let mut orders_open = true;

    loop {
        tokio::select! {
            exit = watch.exited(child) => return (exit, obeying.terminating),
            Some((stream, chunk)) = pipes.read(), if pipes.is_open() => {
                if let (Some(timer), Some(after)) = (&mut stall_timer, spec.stall_timeout) {
                    timer.as_mut().reset(tokio::time::Instant::now() + after);
                    stalled = false;
                }
                output.take(stream, chunk).await;
            }
            () = fire(&mut stall_timer), if !stalled && obeying.terminating.is_none() => {
                stalled = true;
                let silent_for = spec.stall_timeout.unwrap_or_default();
                tracing::warn!(
                    pid,
                    silent_for = %humantime::format_duration(silent_for),
                    "the session printed nothing for its stall timeout"
                );
                output.stall(silent_for);
            }
            () = &mut feed, if !fed => fed = true,
            () = kill_when(obeying.kill_at), if obeying.kill_at.is_some() => obeying.kill_now(),
            changed = orders.changed(), if orders_open => match changed {
                Ok(()) => {
                    let now = orders.borrow_and_update().clone();
                    obeying.obey(&now, output);
                }
                Err(_) => orders_open = false,
            },
        }
    }
}

/// What the runner did of its orders so far: each signal once.
struct Obeying {
    pid: u32,
    iteration: u32,
    /// The least time between its SIGTERM and its SIGKILL.
    kill_grace: Duration,
    /// SIGTERM sent, for this.
    terminating: Option<Ending>,
    /// When it was sent (the grace counts from here).
    terminated_at: Option<tokio::time::Instant>,
    /// A SIGKILL ordered before the grace since this runner's own SIGTERM
    /// ran out: sent then.
    kill_at: Option<tokio::time::Instant>,
    killed: bool,
}

impl Obeying {
    fn obey(&mut self, orders: &Orders, output: &mut Output<'_>) {
        let pid = self.pid;
        if self.terminating.is_none()
            && let Some(why) = orders.end_of(self.iteration)
        {
            // The last moment to note that the end is the daemon's, before
            // the session's own traps react to the signal.
            output.observer.on_terminate(&why);
            tracing::warn!(pid, "session {why}; sending SIGTERM to its process group");
            signal_group(pid, Signal::SIGTERM);
            self.terminating = Some(why);
            self.terminated_at = Some(tokio::time::Instant::now());
        }
        if !self.killed && self.kill_at.is_none() && orders.kills(self.iteration) {
            // The order's grace was counted from when it was given; the
            // signal may have gone out later (the ending note's write waits
            // for the agent's lock and the disk), and the session is owed
            // its whole grace after the SIGTERM it really got.
            match self.terminated_at.map(|t| t + self.kill_grace) {
                Some(at) if at > tokio::time::Instant::now() => self.kill_at = Some(at),
                _ => self.kill_now(),
            }
        }
    }

    fn kill_now(&mut self) {
        self.kill_at = None;
        if self.killed {
            return;
        }
        tracing::warn!(
            pid = self.pid,
            "session still running after SIGTERM and its grace; sending SIGKILL to its process group"
        );
        signal_group(self.pid, Signal::SIGKILL);
        self.killed = true;
    }
}

/// Ready at `at` (never, without one).
async fn kill_when(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// After the main process exited and the sweep ran: read what is left in the
/// pipes, until end-of-file or [`DRAIN_LIMIT`].
async fn drain(pipes: &mut Pipes, output: &mut Output<'_>) {
    let limit = tokio::time::sleep(DRAIN_LIMIT);
    tokio::pin!(limit);
    loop {
        tokio::select! {
            chunk = pipes.read() => match chunk {
                Some((stream, chunk)) => output.take(stream, chunk).await,
                None => return,
            },
            () = &mut limit => {
                tracing::warn!(
                    "a process outside the session's group and without its marker \
                     still holds the output pipes open; no longer reading them"
                );
                return;
            }
        }
    }
}

/// The child's stdout and stderr, read into one fixed buffer each.
struct Pipes {
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    out_buf: Vec<u8>,
    err_buf: Vec<u8>,
}

impl Pipes {
    fn new(child: &mut Child) -> Pipes {
        Pipes {
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            out_buf: vec![0; READ_CHUNK],
            err_buf: vec![0; READ_CHUNK],
        }
    }

    fn is_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }

    /// The next chunk from either pipe, whichever has one first; `None` once
    /// both reached end-of-file (or failed). Cancel-safe: nothing read is
    /// lost when the future is dropped.
    async fn read(&mut self) -> Option<(OutputStream, &[u8])> {
        while self.is_open() {
            let (stream, read) = tokio::select! {
                read = read_some(&mut self.stdout, &mut self.out_buf) => (OutputStream::Stdout, read),
                read = read_some(&mut self.stderr, &mut self.err_buf) => (OutputStream::Stderr, read),
            };
            if let Err(e) = &read {
                tracing::warn!("reading the session's {stream:?}: {e}; no longer reading it");
            }
            match (stream, read) {
                (OutputStream::Stdout, Ok(n)) if n > 0 => {
                    return Some((stream, &self.out_buf[..n]));
                }
                (OutputStream::Stderr, Ok(n)) if n > 0 => {
                    return Some((stream, &self.err_buf[..n]));
                }
                (OutputStream::Stdout, _) => self.stdout = None,
                (OutputStream::Stderr, _) => self.stderr = None,
            }
        }
        None
    }
}

/// Reads from a pipe that may already be closed (then never ready).
async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Completes when the timer is set and expires; never if it is not set.
async fn fire(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn feed_stdin(stdin: Option<ChildStdin>, prompt: Vec<u8>) {
    let Some(mut stdin) = stdin else { return };
    // A child that exits or closes its stdin before reading everything makes
    // this fail with EPIPE; that is its business, not an error of the run.
    match stdin.write_all(&prompt).await {
        Ok(()) => {
            let _ = stdin.shutdown().await;
        }
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            tracing::debug!("the session closed its stdin before reading the whole prompt");
        }
        Err(e) => tracing::warn!("writing the prompt to the session's stdin: {e}"),
    }
    // Dropping `stdin` closes it: the child sees end-of-file.
}

/// SIGTERM or SIGKILL to the group, and to the main process itself in case
/// it moved to another group. Only called while the main process is not yet
/// reaped, so `pid` still names it and its group.
fn signal_group(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(pid as i32);
    let _ = killpg(pid, signal);
    let _ = kill(pid, signal);
}

fn ending_of(status: ExitStatus) -> Ending {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Ending::Exited { code },
        (None, Some(signal)) => Ending::Signaled { signal },
        // Stopped/continued statuses are not reported by wait(); keep a
        // value rather than panic.
        (None, None) => Ending::Exited { code: -1 },
    }
}

fn command(spec: &SessionSpec) -> Command {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .current_dir(&spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so one signal reaches the whole session and none
        // reaches the daemon.
        .process_group(0)
        // A safety net if `run` is cancelled; the guard kills the group.
        .kill_on_drop(true);
    for name in &spec.env_remove {
        cmd.env_remove(name);
    }
    for (name, value) in &spec.env {
        cmd.env(name, value);
    }
    let (name, value) = &spec.marker;
    if !name.is_empty() {
        cmd.env(name, value);
    }
    cmd
}

fn spawn_failure(program: &str, e: &io::Error) -> Ending {
    let (kind, reason) = match e.kind() {
        io::ErrorKind::NotFound if program.contains('/') && Path::new(program).is_file() => (
            SpawnFailure::NotFound,
            format!("command not found: the interpreter on the #! line of {program}"),
        ),
        io::ErrorKind::NotFound => (
            SpawnFailure::NotFound,
            format!("command not found: {program}"),
        ),
        io::ErrorKind::PermissionDenied => (
            SpawnFailure::PermissionDenied,
            format!("permission denied: {program} (is it executable?)"),
        ),
        _ => (SpawnFailure::Other, format!("cannot run {program}: {e}")),
    };
    Ending::SpawnFailed { reason, kind }
}

/// A missing working directory makes the spawn fail with the same errors as
/// a missing command; check it first so the message names the right path.
fn check_cwd(cwd: &Path) -> Result<(), BadCwd> {
    let bad = |why| BadCwd {
        dir: cwd.to_path_buf(),
        why,
    };
    match std::fs::metadata(cwd) {
        Err(e) => Err(bad(CwdFault::Stat(e))),
        Ok(meta) if !meta.is_dir() => Err(bad(CwdFault::NotADirectory)),
        Ok(_) => nix::unistd::access(cwd, nix::unistd::AccessFlags::X_OK)
            .map_err(|e| bad(CwdFault::NoAccess(e))),
    }
}

/// A session's working directory that cannot be entered (the reason of the
/// session's spawn failure).
#[derive(Debug, thiserror::Error)]
#[error("working directory {}{why}", dir.display())]
struct BadCwd {
    dir: PathBuf,
    why: CwdFault,
}

#[derive(Debug, thiserror::Error)]
enum CwdFault {
    #[error(": {0}")]
    Stat(io::Error),
    #[error(" is not a directory")]
    NotADirectory,
    #[error(": {0}")]
    NoAccess(nix::Error),
}

pub(crate) fn open_log(path: &Path) -> io::Result<tokio::fs::File> {
    // A new file, always: a session id is never reused, so an existing log
    // is another session's, and it is never appended to.
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o640)
        // The log is ours to write; never follow a link planted in its place.
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    Ok(tokio::fs::File::from_std(file))
}

/// The log of a session followed again by a restarted controller
/// ([`crate::daemon::adopt`]): the same file (or a new one), emptied, as it
/// is written again from the output stream. Only a plain file with one
/// name: no link followed, and a FIFO or a device planted in its place is
/// refused without blocking on it.
pub(crate) fn reopen_log(path: &Path) -> io::Result<tokio::fs::File> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.nlink() > 1 {
        return Err(io::Error::other(
            "not a plain file with one name, so not a session log",
        ));
    }
    file.set_len(0)?;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND))
        .map_err(io::Error::from)?;
    Ok(tokio::fs::File::from_std(file))
}

/// The daemon must never die because a session closed its stdin early:
/// `main` restores SIGPIPE's default action for the CLI's quiet broken
/// pipes, so the runner ignores it again; writes to a closed pipe then fail
/// with EPIPE instead. Children do not inherit this: the standard library
/// resets SIGPIPE to its default in every child it spawns.
pub(crate) fn ignore_sigpipe() {
    // SAFETY: SIG_IGN installs no handler code, so no async-signal-safety
    // question arises; the disposition is process-wide by nature and ignoring
    // SIGPIPE is what the daemon wants everywhere.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) };
}

/// The log and the observer: every chunk goes to both, the log up to the cap.
pub(crate) struct Output<'a> {
    log: Option<tokio::fs::File>,
    log_path: &'a Path,
    cap: u64,
    pub(crate) observer: &'a mut dyn OutputObserver,
    output_bytes: u64,
    logged_bytes: u64,
    truncated: bool,
    log_error: Option<LogError>,
    stalls: u32,
}

pub(crate) struct Finished {
    pub(crate) output_bytes: u64,
    pub(crate) logged_bytes: u64,
    pub(crate) truncated: bool,
    pub(crate) log_error: Option<LogError>,
    pub(crate) stalls: u32,
}

impl<'a> Output<'a> {
    pub(crate) fn new(
        log: tokio::fs::File,
        log_path: &'a Path,
        cap: u64,
        observer: &'a mut dyn OutputObserver,
    ) -> Self {
        Output {
            log: Some(log),
            log_path,
            cap,
            observer,
            output_bytes: 0,
            logged_bytes: 0,
            truncated: false,
            log_error: None,
            stalls: 0,
        }
    }

    fn stall(&mut self, silent_for: Duration) {
        self.stalls += 1;
        self.observer.on_stall(silent_for);
    }

    pub(crate) async fn take(&mut self, stream: OutputStream, chunk: &[u8]) {
        self.output_bytes += chunk.len() as u64;
        self.observer.on_stream_output(stream, chunk);
        if self.truncated {
            return;
        }
        let room = self.cap - self.logged_bytes;
        let kept = &chunk[..chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
        if !kept.is_empty() && self.write(kept).await {
            self.logged_bytes += kept.len() as u64;
        }
        if kept.len() < chunk.len() {
            self.truncated = true;
            tracing::warn!(
                log = %self.log_path.display(),
                cap = self.cap,
                "session output reached the log cap; the rest is read but dropped"
            );
            let notice = format!(
                "\n[agent-state: output truncated after {} bytes; the rest was dropped]\n",
                self.cap
            );
            self.write(notice.as_bytes()).await;
        }
    }

    /// Whether `bytes` went to the log.
    async fn write(&mut self, bytes: &[u8]) -> bool {
        let Some(log) = &mut self.log else {
            return false;
        };
        match log.write_all(bytes).await {
            Ok(()) => true,
            Err(e) => {
                self.fail(e);
                false
            }
        }
    }

    fn fail(&mut self, e: io::Error) {
        tracing::warn!(log = %self.log_path.display(), "cannot write the session log, output is no longer logged: {e}");
        self.log = None;
        self.log_error.get_or_insert_with(|| LogError {
            message: format!("writing {}: {e}", self.log_path.display()),
            kind: e.kind(),
        });
    }

    pub(crate) async fn finish(mut self) -> Finished {
        // tokio writes files in the background; flushing waits for the last
        // write and reports its error.
        if let Some(log) = &mut self.log
            && let Err(e) = log.flush().await
        {
            self.fail(e);
        }
        Finished {
            output_bytes: self.output_bytes,
            logged_bytes: self.logged_bytes,
            truncated: self.truncated,
            log_error: self.log_error,
            stalls: self.stalls,
        }
    }
}

/// Kills the session's processes if `run` is cancelled before its sweep.
struct SessionGuard {
    pgid: i32,
    marker: (String, String),
    cgroup: Option<SessionCgroup>,
    armed: bool,
    /// `/proc/vmstat`'s `oom_kill` when the session started.
    kernel_oom_kills: Option<u64>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if self.armed {
            // Blocking, but only on cancellation, and a /proc scan is quick.
            let mut killed = sweep_blocking(Some(self.pgid), &self.marker);
            if let Some(cgroup) = self.cgroup.take() {
                killed += cgroup.kill();
                cgroup.remove();
            }
            tracing::warn!(
                pid = self.pgid,
                killed,
                "session run cancelled; killed its processes"
            );
        }
    }
}

/// The session's own cgroup, when the daemon runs in a delegated one; None
/// (the process-group path alone) otherwise, or if it cannot be made.
fn session_cgroup(marker: &(String, String)) -> Option<SessionCgroup> {
    let cgroups = cgroup::available()?;
    match cgroups.session(&marker.1) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(
                "cannot create the session's cgroup (its process group is still swept): {e}"
            );
            None
        }
    }
}

/// Apply the agent's `memory_max` to the session's cgroup, or say (in the
/// daemon's log) why it cannot be; said once per daemon either way (the
/// same holds for every session).
fn limit_memory(spec: &SessionSpec, cgroup: Option<&SessionCgroup>) {
    let Some(max) = spec.memory_max else {
        return;
    };
    let why_not = match (cgroup, cgroup::available()) {
        (Some(c), Some(all)) if all.no_memory.is_none() => match c.limit_memory(max) {
            Ok(written) => {
                static APPLIED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !APPLIED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(
                        session = %spec.marker.1,
                        "memory_max is applied to sessions' cgroups (said once): {}",
                        applied_note(&written)
                    );
                }
                return;
            }
            Err(e) => e.to_string(),
        },
        (Some(_), Some(all)) => all.no_memory.clone().unwrap_or_default(),
        _ => "the session has no cgroup of its own (the daemon does not run under systemd with Delegate=yes)".into(),
    };
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            session = %spec.marker.1,
            memory_max = max,
            "memory_max is not applied (said once): {why_not}"
        );
    }
}

/// The log's words for what [`SessionCgroup::limit_memory`] wrote: the
/// files and values, and what swap does.
fn applied_note(written: &[(&str, u64)]) -> String {
    let files: Vec<String> = written.iter().map(|(f, v)| format!("{f} = {v}")).collect();
    let swap = if written.iter().any(|(f, _)| *f == "memory.swap.max") {
        "a session past it is OOM-killed, not swapped"
    } else {
        "no memory.swap.max (the kernel does not account swap per cgroup): a session may swap before it is OOM-killed"
    };
    format!("{}; {swap}", files.join(", "))
}

/// The kernel's count of OOM kills so far (`oom_kill` in `/proc/vmstat`).
/// `AGENT_STATE_TEST_VMSTAT` names another file to read it from (a test
/// hook: an OOM kill cannot be caused safely on a shared machine).
fn kernel_oom_kills() -> Option<u64> {
    let path = std::env::var_os("AGENT_STATE_TEST_VMSTAT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/proc/vmstat"));
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| memory::oom_kill_count(&t))
}

/// Kill what is left in the session's cgroup and remove it, off the async
/// threads. Returns how many processes it held.
async fn kill_cgroup(cgroup: Option<SessionCgroup>) -> usize {
    let Some(cgroup) = cgroup else {
        return 0;
    };
    let done = tokio::task::spawn_blocking(move || {
        let killed = cgroup.kill();
        cgroup.remove();
        killed
    });
    match done.await {
        Ok(killed) => killed,
        Err(e) => {
            tracing::error!("the cgroup kill task failed: {e}");
            0
        }
    }
}

/// Kill every remaining process of the session (see [`sweep_blocking`]) off
/// the async threads.
async fn sweep(pgid: i32, marker: &(String, String)) -> usize {
    let marker = marker.clone();
    match tokio::task::spawn_blocking(move || sweep_blocking(Some(pgid), &marker)).await {
        Ok(killed) => killed,
        Err(e) => {
            tracing::error!("the leftover sweep task failed: {e}");
            0
        }
    }
}

#[cfg(test)]
mod tests;
