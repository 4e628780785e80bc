//! What the runner is given and what it gives back: the session's spec,
//! the observer of its output, and the report of how it ended.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// What to run, and where its output goes.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// Program and arguments, placeholders already substituted. A program
    /// without a `/` is looked up in `PATH` (the one in `env` if it sets one).
    pub argv: Vec<String>,
    /// Variables set on top of the daemon's environment. They win over
    /// `env_remove`.
    pub env: Vec<(String, String)>,
    /// Variables of the daemon's environment the child must not inherit
    /// (`NOTIFY_SOCKET`: a session must never talk to systemd as if it were
    /// the daemon).
    pub env_remove: Vec<String>,
    /// Working directory; it must exist and be searchable.
    pub cwd: PathBuf,
    /// Written to the child's stdin, which is then closed.
    pub stdin: Vec<u8>,
    /// `sessions/{id}.log`: created with mode 0640 if missing, appended to.
    pub log_path: PathBuf,
    /// At most this many bytes of output go to the log; the rest is read and
    /// dropped, with a one-line notice in the log.
    pub max_output: u64,
    /// The session's iteration this run is (1: its first run): the
    /// [`Orders`] of a run name it.
    pub iteration: u32,
    /// From spawn; then the group gets SIGTERM. The runner keeps no timer
    /// of it: the session's machine decides when (`daemon::machine`), and
    /// the loop gives the [`Orders`]; read by callers without one (tests).
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL (as `timeout`: the machine's to keep).
    pub kill_grace: Duration,
    /// A session that prints nothing (on either stream) for this long, from
    /// spawn or from its last output, is stalled: the observer's
    /// [`on_stall`](OutputObserver::on_stall) is called, once per silence.
    /// `None`: the runner watches no silence. The daemon leaves it `None`:
    /// its session's machine keeps the stall timer from the times of the
    /// output (the runner's own tests use this).
    pub stall_timeout: Option<Duration>,
    /// What a stall does besides telling the observer: the runner only
    /// observes the silence; whoever reads [`OutputObserver::on_stall`]
    /// decides and gives the [`Orders`].
    pub stall_action: StallAction,
    /// The agent's `stall_timeout` as configured, whoever keeps its timer:
    /// the daemon's machine for a run on this host (so `stall_timeout`
    /// stays `None`), the worker for a run on a worker (the order carries
    /// it with `stall_action`, [`crate::daemon::remote`]).
    pub agent_stall_timeout: Option<Duration>,
    /// `(name, value)` of a variable set on the child (and so inherited by
    /// every descendant that keeps its environment), e.g.
    /// `("AGENT_STATE_SESSION_ID", "rio/20261122-120000")`. The value must be
    /// unique to this session: every process whose environment holds exactly
    /// `name=value` is killed when the session ends. An empty name disables
    /// the environment sweep (the process group is still killed).
    pub marker: (String, String),
    /// The session cgroup's `memory.max` (`memory.high` at 90% of it), where
    /// sessions get cgroups with the memory controller; logged as not
    /// applied elsewhere.
    pub memory_max: Option<u64>,
}

/// What the daemon tells a session's runner, through a `watch` channel (the
/// latest value is what counts). The runner decides nothing: it signals
/// the session's group when told, once each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Orders {
    /// The session is being stopped (`agent-state stop`, a shutdown): no run
    /// starts any more, and a running one gets SIGTERM (it ends
    /// [`Ending::Stopped`]).
    pub stop: bool,
    /// The run of iteration `.0` gets SIGTERM, for `.1` (a timeout, a stall).
    pub end: Option<(u32, Ending)>,
    /// SIGKILL to the group of iteration `.0`'s run (any run's, with
    /// `stop`): the grace after SIGTERM ran out.
    pub kill: Option<u32>,
}

impl Orders {
    /// Why the run of iteration `n` is to end, if it is.
    pub fn end_of(&self, n: u32) -> Option<Ending> {
        if self.stop {
            return Some(Ending::Stopped);
        }
        match &self.end {
            Some((i, why)) if *i == n => Some(why.clone()),
            _ => None,
        }
    }

    /// Whether the run of iteration `n` is to be killed.
    pub fn kills(&self, n: u32) -> bool {
        self.kill == Some(n) || (self.stop && self.kill.is_some())
    }
}

/// What the runner does when a session stalls (see
/// [`SessionSpec::stall_timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StallAction {
    /// Tell the observer, count it in [`RunReport::stalls`], let the session
    /// run on.
    #[default]
    Warn,
    /// Also terminate it like at the timeout (SIGTERM to the group, SIGKILL
    /// after the grace); it ends as [`Ending::Stalled`].
    Stop,
}

/// Which pipe a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// The parsing seam: sees the session's output as it streams.
///
/// The observer sees **all** output, including what the log cap dropped:
/// the parts worth parsing (Claude Code's JSON result, the last signals and
/// the context summary) come at the end, which is exactly what a cap cuts
/// off. So the observer must keep its own memory bounded (stream line by
/// line, cap its line buffer); the runner gives it borrowed chunks of at most
/// 64 KiB and keeps nothing.
pub trait OutputObserver: Send {
    /// A chunk of stdout or stderr, in the order the runner read them.
    fn on_output(&mut self, chunk: &[u8]);

    /// What the runner calls. Chunks of the two streams interleave (a stderr
    /// chunk may arrive in the middle of a stdout line); a parser that splits
    /// lines should override this and keep one line buffer per stream. The
    /// default forwards to [`on_output`](Self::on_output).
    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        let _ = stream;
        self.on_output(chunk);
    }

    /// The session printed nothing for `silent_for` (its
    /// [`stall_timeout`](SessionSpec::stall_timeout)). Called once per
    /// silence: the next output re-arms it. Called before the runner acts on
    /// [`StallAction::Stop`]. The default does nothing.
    fn on_stall(&mut self, silent_for: Duration) {
        let _ = silent_for;
    }

    /// The runner is about to end the session (`why`: the timeout, a stall,
    /// a stop request) and sends SIGTERM right after this returns: the last
    /// moment to record that the ending is the runner's, before the
    /// session's own traps react to the signal. The default does nothing.
    fn on_terminate(&mut self, why: &Ending) {
        let _ = why;
    }

    /// From now on, keep the signals found in the output instead of
    /// handing them on, until [`release_signals`](Self::release_signals):
    /// a remote run notes how far signals went before they do (see
    /// `daemon::adopt`). The default keeps nothing back.
    fn hold_signals(&mut self) {}

    /// How many signals are held.
    fn held_signals(&self) -> usize {
        0
    }

    /// Hand on the held signals (`carry_out`), or drop those a previous
    /// daemon carried out already (COMPLETE is handed on all the same: it
    /// says what the session is, not something to do).
    fn release_signals(&mut self, carry_out: bool) {
        let _ = carry_out;
    }
}

/// An observer for sessions whose output nobody parses.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiscardOutput;

impl OutputObserver for DiscardOutput {
    fn on_output(&mut self, _chunk: &[u8]) {}
}

/// How a run ended and why a spawn failed: values of the pure decisions
/// (crates/decide's `ending`), which judge them.
pub use crate::ending::{Ending, SpawnFailure};

/// Why the session log could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogError {
    /// A sentence naming the log file.
    pub message: String,
    /// What kind of failure (a full disk, a read-only file system, ...).
    pub kind: io::ErrorKind,
}

/// What happened, for session.json, the journal and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    pub ending: Ending,
    /// The main process's pid (also the process group id); `None` if it
    /// never ran.
    pub pid: Option<u32>,
    /// Bytes the session printed (stdout + stderr), all of them.
    pub output_bytes: u64,
    /// Bytes of that output written to the log (at most `max_output`; the
    /// truncation notice is not counted).
    pub logged_bytes: u64,
    /// Output was dropped because of the cap.
    pub truncated: bool,
    /// From spawn to the main process's exit.
    pub duration: Duration,
    /// Processes of the session still alive after the main process exited,
    /// killed by the sweep.
    pub leftovers_killed: usize,
    /// Writing the log failed (disk full, ...): the first error. The session
    /// kept running; its output was still read and observed.
    pub log_error: Option<LogError>,
    /// How many times the session stalled (silences of at least the stall
    /// timeout), whatever the stall action.
    pub stalls: u32,
    /// The kernel's OOM killer ended it ([`crate::daemon::memory`]'s rule).
    pub oom: Option<crate::daemon::memory::OomEvidence>,
    /// A run on a worker: its worktree as the worker judged it (a local
    /// run's is judged by the daemon, after it).
    pub workspace: Option<Box<crate::daemon::workspaces::Outcome>>,
}

impl RunReport {
    /// The report of a session that never ran (spawn failed, or stopped
    /// before the start).
    pub fn not_run(ending: Ending) -> RunReport {
        RunReport {
            ending,
            pid: None,
            output_bytes: 0,
            logged_bytes: 0,
            truncated: false,
            duration: Duration::ZERO,
            leftovers_killed: 0,
            log_error: None,
            stalls: 0,
            oom: None,
            workspace: None,
        }
    }
}
