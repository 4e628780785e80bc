//! One session's lifecycle as a pure state machine (issue 21), in the shape
//! of ntpd-rs's `NtpSource::handle_*`: the daemon feeds it what happened
//! ([`Event`]) with the time (`now`, a value), and it answers what to do
//! ([`Action`]s). It must never do IO, read the clock or the environment,
//! or decide on a reason string: the IO side carries the actions out and
//! reports back what came of them (`Launched`, `ChildExited`, `Recorded`,
//! ...).
//!
//! It decides, for one session: its launch, its iterations (verify), its
//! timeout and stall, a stop (SIGTERM, grace, SIGKILL), its one record and
//! the typed [`Outcome`] it records, what becomes of its messages (returned
//! with or without counting an attempt, or acknowledged), and what follows
//! (a retry, a backoff, disabling the agent, holding a credential, an
//! escalation). The error matrix in `failure` is one part of it: a session
//! that ended by itself is judged by [`failure::judge`] (the agent's
//! [`Streak`] lives in the machine while the session runs).
//!
//! The reason text is rendered from the typed outcome ([`Outcome::reason`]);
//! no decision reads it. A script's own `session end|fail` and the child's
//! exit are two events into the same machine: whichever comes first, the
//! session gets exactly one [`Action::Record`], and `verify` still runs
//! after a script that ended its session itself.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::catalogue::Code;
use crate::clock::later;
use crate::ending::{ClaudeFailure, Ending, OomEvidence, describe_with};
use crate::failure::{self, Next, Observed, RetrySettings, Seen, Streak, Verdict};
use crate::session_status::SessionStatus;

#[cfg(test)]
mod tests;

/// What the machine reads of the agent's config.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Each run's (iteration's) timeout.
    pub timeout: Duration,
    /// Silence after which a run is stalled; `None`: no stall detection.
    pub stall_timeout: Option<Duration>,
    /// A stall ends the run (`stall_action = "stop"`); else only a warning.
    pub stall_stops: bool,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Exit 0 without a COMPLETE signal is a failure.
    pub require_complete: bool,
    /// `verify` is configured: the iteration loop runs in the machine.
    pub verify: Option<IterationLimits>,
    /// The daemon holds the session's end (`verify` is configured, wherever
    /// its loop runs): a script's own `session end|fail` is only its word,
    /// kept in session.json, and the daemon's end records the session.
    /// Otherwise the script's end is the session's record.
    pub holds_end: bool,
    pub retries: RetrySettings,
}

/// The bounds of the iteration loop (`[session.iteration]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationLimits {
    pub max_iterations: u32,
    /// Verify failures in a row with the workspace unchanged before the
    /// nudge; one more is `SESSION_STUCK`.
    pub stuck_threshold: u32,
}

impl Settings {
    /// The settings of an agent's config. This crate cannot name the
    /// config (it is above the decisions): `agent-state` converts its
    /// `AgentConfig` (`impl From<&AgentConfig> for Settings`, in
    /// `config::agent`).
    pub fn of<'a, C: ?Sized>(cfg: &'a C) -> Settings
    where
        Settings: From<&'a C>,
    {
        Settings::from(cfg)
    }
}

/// Who asked for a session to stop (not its timeout, not a shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopBy {
    /// `agent-state stop` (an operator).
    Operator,
    /// The daemon itself: a session budget spent (`budget_action = "stop"`),
    /// the health monitor (disk, overdue, a process that never started).
    Daemon,
}

impl fmt::Display for StopBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StopBy::Operator => "an operator",
            StopBy::Daemon => "the daemon",
        })
    }
}

/// Why the daemon is ending a running session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    Timeout,
    Stalled {
        silent_for: Duration,
    },
    Requested {
        by: StopBy,
        reason: String,
    },
    /// The daemon is shutting down.
    Shutdown,
}

/// How a session was interrupted rather than ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// The daemon shut down while it ran.
    Shutdown,
    /// Found running at the daemon's start, or its end could not be written
    /// when it ended: recorded now.
    Orphan,
}

/// What the session's own script recorded (`session end|fail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptRecord {
    Ended,
    Failed { reason: String },
}

/// When a script's own end was said, by the evidence the IO side read, not
/// by when the loop heard of it (the watcher's event may be handled after
/// the daemon began to stop the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// Before the daemon noted in the session's file that it ends the run
    /// (its note is written before every SIGTERM, under the agent's lock,
    /// and finds the file ended already, or was not written yet): the
    /// script's own end, whenever it is heard.
    BeforeStop,
    /// After that note, or no evidence either way: a script's end heard
    /// while the run is being stopped is its trap's answer to the stop.
    AsHeard,
}

/// A usage limit the session ran into, as the economy judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// When the credential's hold ends; `None` when unknown.
    pub until: Option<DateTime<Utc>>,
    /// An admin disabled the allocation (or a cap only an admin lifts).
    pub admin_cap: bool,
    /// The hold's reason, as the economy words it.
    pub reason: String,
}

/// What a session was: one value, recorded once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Timeout {
        after: Duration,
    },
    Stalled {
        silent_for: Duration,
    },
    /// A failure with its catalogue code; `reason` is the error matrix's
    /// sentence for it (with the command's last words on stderr for a plain
    /// failure).
    Error {
        code: Code,
        reason: String,
    },
    /// A usage limit: not the agent's failure; its credential waits.
    UsageHeld {
        until: Option<DateTime<Utc>>,
        admin_cap: bool,
        reason: String,
    },
    LoginRequired {
        message: String,
    },
    Stopped {
        by: StopBy,
        reason: String,
    },
    Interrupted(Interruption),
}

impl Outcome {
    /// The human text for session.json and the journal, rendered here once.
    pub fn reason(&self) -> String {
        match self {
            Outcome::Completed => "completed".into(),
            Outcome::Timeout { after } => {
                format!("timed out after {}", humantime::format_duration(*after))
            }
            Outcome::Stalled { silent_for } => format!(
                "stalled: no output for {}",
                humantime::format_duration(*silent_for)
            ),
            Outcome::Error { reason, .. } => reason.clone(),
            Outcome::UsageHeld { reason, .. } => reason.clone(),
            Outcome::LoginRequired { message } => message.clone(),
            // The stop's own sentence names who stopped it and why
            // ("stopped by root (uid 0) with `agent-state stop`: ...").
            Outcome::Stopped { reason, .. } => reason.clone(),
            Outcome::Interrupted(Interruption::Shutdown) => {
                "interrupted: the daemon stopped before the session ended".into()
            }
            Outcome::Interrupted(Interruption::Orphan) => {
                "interrupted: its end could not be recorded when it ended (see errors.jsonl)".into()
            }
        }
    }

    /// The catalogue code of its error record; `None` for a success, a stop
    /// someone asked for and a shutdown.
    pub fn code(&self) -> Option<Code> {
        match self {
            Outcome::Completed | Outcome::Stopped { .. } => None,
            Outcome::Timeout { .. } => Some(Code::SessionTimeout),
            Outcome::Stalled { .. } => Some(Code::SessionStalled),
            Outcome::Error { code, .. } => Some(*code),
            Outcome::UsageHeld {
                admin_cap: true, ..
            } => Some(Code::UsageDisabled),
            Outcome::UsageHeld { .. } => Some(Code::UsageLimit),
            Outcome::LoginRequired { .. } => Some(Code::AgentLoginRequired),
            // The daemon's own shutdown is no one's error.
            Outcome::Interrupted(Interruption::Shutdown) => None,
            Outcome::Interrupted(Interruption::Orphan) => Some(Code::SessionInterrupted),
        }
    }

    /// session.json's `status` (the seed's enum: running, completed,
    /// timeout, error). An interruption is `timeout` (the session's time
    /// ended under it, as a shutdown records it today); a usage limit and a
    /// stop are `error`: the session did not do its work (metrics do not
    /// count them as errors, see [`Outcome::counts_as_error`]).
    pub fn status(&self) -> SessionStatus {
        match self {
            Outcome::Completed => SessionStatus::Completed,
            Outcome::Timeout { .. } | Outcome::Interrupted(_) => SessionStatus::Timeout,
            _ => SessionStatus::Error,
        }
    }

    /// Counted as a failed session in metrics (`sessions_error`, the error
    /// rate, FAIL/30D): not a usage limit, not a stop someone asked for.
    pub fn counts_as_error(&self) -> bool {
        !matches!(
            self,
            Outcome::Completed | Outcome::UsageHeld { .. } | Outcome::Stopped { .. }
        )
    }

    pub fn is_completed(&self) -> bool {
        *self == Outcome::Completed
    }

    /// Whether the messages it claimed count an attempt when they go back
    /// to the inbox: not for a usage limit, a stop, an interruption or a
    /// command that cannot run (none of them the message's fault).
    pub fn counts_attempt(&self) -> bool {
        match self {
            Outcome::Completed => false,
            Outcome::UsageHeld { .. } | Outcome::Stopped { .. } | Outcome::Interrupted(_) => false,
            Outcome::Error { code, .. } => !cannot_run(*code),
            _ => true,
        }
    }
}

/// What the session printed that matters while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputSignal {
    /// Any output (resets the stall timer).
    Output,
    /// PROGRESS: output too.
    Progress,
    /// COMPLETE: the agent says its work is done; that counts, whatever
    /// becomes of the process afterwards.
    Complete,
}

/// What the runner saw of a run's output when it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Not one non-blank byte on stdout or stderr.
    pub empty: bool,
    pub fingerprint: Option<u64>,
    /// Claude Code's JSON result, classified.
    pub claude: Option<ClaudeFailure>,
    /// Claude Code's JSON result said `is_error`.
    pub claude_error: bool,
    /// The last non-blank line on stderr.
    pub stderr_last_words: Option<String>,
    /// The kernel's OOM killer ended it (the runner's evidence).
    pub oom: Option<OomEvidence>,
    /// The workspace was left with invalid commits (why) and reset.
    pub invalid_commits: Option<String>,
}

/// How one verification went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    Passed,
    Failed {
        /// The workspace changed since the previous iteration (`true`
        /// without a workspace: nothing to compare).
        changed_workspace: bool,
        /// The failed command and its status ("`npm test`: exit 1").
        describe: String,
        /// The end of its output.
        tail: String,
    },
}

#[derive(Debug, Clone)]
pub enum Event {
    /// A wake was granted: the session begins (claim, workspace, launch).
    Begin {
        session_id: String,
    },
    /// Another session of the agent holds its lock: nothing was claimed.
    LockBusy,
    /// The IO side started the run's process.
    Launched,
    /// The script ran `session begin` (its `AGENT_STATE_SESSION_ID`).
    ScriptBegan {
        session_id: String,
    },
    /// The script ran `session end`; `said`: when, as the IO side found.
    ScriptEnded {
        said: Said,
    },
    /// The script ran `session fail` (or its trap did).
    ScriptFailed {
        reason: String,
        said: Said,
    },
    Output(OutputSignal),
    /// The output showed a usage limit (judged by the economy).
    UsageLimitSeen(Held),
    /// The run's process ended, as the runner reports it.
    ChildExited {
        ending: Ending,
        facts: Facts,
    },
    VerifyFinished(Verified),
    /// A timer armed by [`Action::ArmTimer`] fired (or any wake-up: the
    /// machine checks what is due at `now`).
    Deadline,
    StopRequested {
        by: StopBy,
        reason: String,
    },
    /// The grace after SIGTERM ran out.
    GraceExpired,
    /// The daemon is shutting down.
    Shutdown,
    /// The record was written.
    Recorded,
    /// The record could not be written (a full disk): the session stays
    /// the daemon's until it is recorded as an orphan.
    RecordFailed,
    /// At the daemon's start: this session was left running on disk.
    OrphanFound {
        session_id: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Kill,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start iteration `iteration` (1: claim the messages, make the
    /// workspace, take the lock; later: the verification's feedback in the
    /// prompt, with the nudge if its iterations stopped changing anything).
    Launch {
        iteration: u32,
        nudge: bool,
    },
    StartVerify {
        iteration: u32,
    },
    /// To the session's process group (and cgroup).
    Signal(Sig),
    /// Feed [`Event::Deadline`] at `at` (replacing the session's timer).
    ArmTimer {
        at: DateTime<Utc>,
    },
    /// Record the session's end (once). `verdict` is the error matrix's
    /// word for the error record; what follows it is in the actions after
    /// [`Event::Recorded`].
    Record {
        outcome: Outcome,
        verdict: Verdict,
    },
    /// Back to the inbox, counting a delivery attempt or not.
    ReturnMessages {
        count_attempt: bool,
    },
    AcknowledgeMessages,
    /// An error record, not escalated.
    Raise {
        code: Code,
    },
    Retry {
        after: Duration,
    },
    Backoff {
        hold: Duration,
    },
    /// No automatic wakes until the config is reloaded or `wake` is run.
    Disable,
    /// The failure streak is over (report.json's error cleared).
    ClearFailures,
    HoldCredential {
        until: Option<DateTime<Utc>>,
    },
    /// A success lifts the credential's hold.
    ReleaseHold,
    /// To the human mailbox.
    Escalate {
        code: Code,
    },
    /// Its end is not written: keep its lock, record it as an orphan later.
    KeepOrphan,
}

/// A session's data from its begin to its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub session_id: String,
    /// Its attempt in the agent's retry chain (1: not a retry).
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    /// The iteration running (or being verified), from 1.
    pub iteration: u32,
    /// This iteration's timeout.
    pub deadline: Option<DateTime<Utc>>,
    pub last_output: DateTime<Utc>,
    pub stall_warned: bool,
    /// Verify failures in a row with the workspace unchanged.
    pub unchanged: u32,
    /// The script joined the session (`session begin` with its id).
    pub script_began: bool,
    /// The script recorded its own end (the first of end|fail counts).
    pub script: Option<ScriptRecord>,
    /// It did before the daemon began to stop the run: its end, not the
    /// stop, is what the session was (unless the daemon holds the end). A
    /// script's end heard while the run is being stopped is its trap's
    /// answer to the stop.
    pub script_first: bool,
    pub completed_signal: bool,
    pub limit: Option<Held>,
}

impl Run {
    fn new(session_id: String, attempt: u32, now: DateTime<Utc>) -> Run {
        Run {
            session_id,
            attempt,
            started_at: now,
            iteration: 1,
            deadline: None,
            last_output: now,
            stall_warned: false,
            unchanged: 0,
            script_began: false,
            script: None,
            script_first: false,
            completed_signal: false,
            limit: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    Queued,
    /// Claiming, making the workspace, launching (iteration `run.iteration`).
    Preparing(Run),
    Running(Run),
    /// Verifying iteration `run.iteration`.
    Verifying(Run),
    /// SIGTERM sent for `stop`; SIGKILL at `grace_until` unless it ends.
    /// `verifying`: what is being stopped is a verification (the run's
    /// process had ended): `VerifyFinished` ends the stop, not `ChildExited`.
    Stopping {
        run: Run,
        stop: Stop,
        grace_until: DateTime<Utc>,
        killed: bool,
        verifying: bool,
    },
    /// Its one record is being written; `then` follows it.
    Recording {
        session_id: String,
        outcome: Outcome,
        then: Vec<Action>,
    },
    /// `outcome` is `None` for a session that never began (its lock busy).
    Ended {
        session_id: Option<String>,
        outcome: Option<Outcome>,
    },
}

/// One session of one agent.
#[derive(Debug, Clone)]
pub struct Session {
    state: SessionState,
    settings: Settings,
    streak: Streak,
}

impl Session {
    /// A session not begun, with the agent's failure streak so far.
    pub fn new(settings: Settings, streak: Streak) -> Session {
        Session {
            state: SessionState::Queued,
            settings,
            streak,
        }
    }

    /// A session already running (its process launched at `started_at`),
    /// in its iteration `iteration`.
    pub fn running(
        settings: Settings,
        streak: Streak,
        session_id: String,
        started_at: DateTime<Utc>,
        iteration: u32,
    ) -> Session {
        let mut run = Run::new(session_id, streak.retries + 1, started_at);
        run.iteration = iteration.max(1);
        run.deadline = Some(later(started_at, settings.timeout));
        Session {
            state: SessionState::Running(run),
            settings,
            streak,
        }
    }

    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// What a [`Action::Signal`] is for: the stop under way and the
    /// iteration whose run it ends.
    pub fn stopping(&self) -> Option<(&Stop, u32)> {
        match &self.state {
            SessionState::Stopping { run, stop, .. } => Some((stop, run.iteration)),
            _ => None,
        }
    }

    /// When the session should have ended at the latest by its timers: its
    /// run's timeout and the kill grace after it, or the grace of a stop
    /// under way. `None` while nothing of it is timed here (preparing, a
    /// verification: it has its own timeout; a record being written).
    pub fn due_to_end(&self) -> Option<DateTime<Utc>> {
        match &self.state {
            SessionState::Running(run) => run.deadline.map(|d| later(d, self.settings.kill_grace)),
            SessionState::Stopping {
                grace_until,
                verifying: false,
                ..
            } => Some(*grace_until),
            _ => None,
        }
    }

    /// A verification runs (no run of it does).
    pub fn is_verifying(&self) -> bool {
        matches!(self.state, SessionState::Verifying(_))
    }

    /// Its record is decided (or written): no run of it may start.
    pub fn is_over(&self) -> bool {
        matches!(
            self.state,
            SessionState::Recording { .. } | SessionState::Ended { .. }
        )
    }

    pub fn streak(&self) -> &Streak {
        &self.streak
    }

    /// The agent's streak after the session, for its next one.
    pub fn into_streak(self) -> Streak {
        self.streak
    }

    /// What happened, at `now`: the actions that follow. An event the state
    /// does not expect (a second exit, a record of a session not ending)
    /// changes nothing and asks for nothing.
    pub fn on(&mut self, event: Event, now: DateTime<Utc>) -> Vec<Action> {
        use Event as E;
        match event {
            E::ScriptBegan { .. }
            | E::ScriptEnded { .. }
            | E::ScriptFailed { .. }
            | E::Output(_)
            | E::UsageLimitSeen(_) => return self.note(event, now),
            _ => {}
        }
        let state = std::mem::replace(
            &mut self.state,
            SessionState::Ended {
                session_id: None,
                outcome: None,
            },
        );
        let (state, actions) = self.step(state, event, now);
        self.state = state;
        actions
    }

    /// The run the session's process (or script) is part of, if any.
    fn live_run(&mut self) -> Option<&mut Run> {
        match &mut self.state {
            SessionState::Preparing(run)
            | SessionState::Running(run)
            | SessionState::Verifying(run)
            | SessionState::Stopping { run, .. } => Some(run),
            _ => None,
        }
    }

    /// Facts noted on the run; only a stall warning's end re-arms a timer.
    fn note(&mut self, event: Event, now: DateTime<Utc>) -> Vec<Action> {
        let running = matches!(self.state, SessionState::Running(_));
        // Its process prints (COMPLETE counts) until it is gone.
        let printing = running
            || matches!(
                self.state,
                SessionState::Stopping {
                    verifying: false,
                    ..
                }
            );
        let stall = self.settings.stall_timeout;
        let stopping = matches!(self.state, SessionState::Stopping { .. });
        let Some(run) = self.live_run() else {
            return Vec::new();
        };
        match event {
            Event::ScriptBegan { session_id } if session_id == run.session_id => {
                run.script_began = true;
            }
            Event::ScriptEnded { said } if run.script.is_none() => {
                run.script = Some(ScriptRecord::Ended);
                run.script_first = !stopping || said == Said::BeforeStop;
            }
            Event::ScriptFailed { reason, said } if run.script.is_none() => {
                run.script = Some(ScriptRecord::Failed { reason });
                run.script_first = !stopping || said == Said::BeforeStop;
            }
            Event::Output(signal) if printing => {
                // Output reported late (an IO side that is asked at the
                // timers) never moves it back before the run's start.
                run.last_output = run.last_output.max(now);
                if signal == OutputSignal::Complete {
                    run.completed_signal = true;
                }
                // Stopping, the grace timer stays the session's timer.
                if running
                    && std::mem::take(&mut run.stall_warned)
                    && let Some(at) = next_due(run, stall)
                {
                    return vec![Action::ArmTimer { at }];
                }
            }
            Event::UsageLimitSeen(held) => run.limit = Some(held),
            _ => {}
        }
        Vec::new()
    }

    fn step(
        &mut self,
        state: SessionState,
        event: Event,
        now: DateTime<Utc>,
    ) -> (SessionState, Vec<Action>) {
        use Event as E;
        use SessionState as S;
        match (state, event) {
            (S::Queued, E::Begin { session_id }) => (
                S::Preparing(Run::new(session_id, self.streak.retries + 1, now)),
                vec![Action::Launch {
                    iteration: 1,
                    nudge: false,
                }],
            ),
            (S::Queued, E::OrphanFound { session_id }) => {
                let run = Run::new(session_id, self.streak.retries + 1, now);
                self.record(&run, Outcome::Interrupted(Interruption::Orphan), None)
            }
            (S::Queued, E::Shutdown) => (
                S::Ended {
                    session_id: None,
                    outcome: None,
                },
                Vec::new(),
            ),
            // Nothing claimed, nothing recorded: the wake comes back.
            (S::Preparing(run), E::LockBusy) if run.iteration == 1 => (
                S::Ended {
                    session_id: Some(run.session_id),
                    outcome: None,
                },
                vec![Action::Retry {
                    after: self.settings.retries.spawn_retry_delay,
                }],
            ),
            (S::Preparing(mut run), E::Launched) => {
                run.deadline = Some(later(now, self.settings.timeout));
                run.last_output = now;
                run.stall_warned = false;
                let arm = next_due(&run, self.settings.stall_timeout)
                    .map(|at| Action::ArmTimer { at })
                    .into_iter()
                    .collect();
                (S::Running(run), arm)
            }
            (S::Preparing(run) | S::Running(run), E::ChildExited { ending, facts }) => {
                self.exited(run, ending, facts, true, now)
            }
            // Its process may be starting (its launch not yet reported):
            // stopped like a running one, SIGKILL after the grace included.
            // A run that never started reports `ChildExited` all the same
            // (`Ending::Stopped`), and the stop is what it was.
            (S::Preparing(run), E::StopRequested { by, reason }) => {
                self.stop(run, Stop::Requested { by, reason }, now, Vec::new())
            }
            (S::Preparing(run), E::Shutdown) => self.stop(run, Stop::Shutdown, now, Vec::new()),
            (S::Running(run), E::Deadline) => self.deadline(run, now),
            (S::Running(run), E::StopRequested { by, reason }) => {
                self.stop(run, Stop::Requested { by, reason }, now, Vec::new())
            }
            (S::Running(run), E::Shutdown) => self.stop(run, Stop::Shutdown, now, Vec::new()),
            // A stop asked (or a shutdown) while the run is ended for its
            // time: SIGTERM is sent already, but no iteration may follow.
            (
                S::Stopping {
                    run,
                    stop: Stop::Timeout | Stop::Stalled { .. },
                    grace_until,
                    killed,
                    verifying,
                },
                event @ (E::StopRequested { .. } | E::Shutdown),
            ) => {
                let stop = match event {
                    E::StopRequested { by, reason } => Stop::Requested { by, reason },
                    _ => Stop::Shutdown,
                };
                (
                    S::Stopping {
                        run,
                        stop,
                        grace_until,
                        killed,
                        verifying,
                    },
                    vec![Action::Signal(Sig::Term)],
                )
            }
            (S::Verifying(run), E::StopRequested { by, reason }) => {
                let (state, actions) =
                    self.stop(run, Stop::Requested { by, reason }, now, Vec::new());
                (verifying(state), actions)
            }
            (S::Verifying(run), E::Shutdown) => {
                let (state, actions) = self.stop(run, Stop::Shutdown, now, Vec::new());
                (verifying(state), actions)
            }
            (S::Verifying(run), E::VerifyFinished(v)) => self.verified(run, v),
            (
                S::Stopping {
                    run,
                    stop,
                    grace_until,
                    killed: false,
                    verifying,
                },
                E::GraceExpired,
            ) => (
                S::Stopping {
                    run,
                    stop,
                    grace_until,
                    killed: true,
                    verifying,
                },
                vec![Action::Signal(Sig::Kill)],
            ),
            (
                S::Stopping {
                    run,
                    stop,
                    grace_until,
                    killed: false,
                    verifying,
                },
                E::Deadline,
            ) if now >= grace_until => (
                S::Stopping {
                    run,
                    stop,
                    grace_until,
                    killed: true,
                    verifying,
                },
                vec![Action::Signal(Sig::Kill)],
            ),
            // The run ended by itself before the runner signalled it (an
            // exit racing the stop's SIGTERM): judged by its own exit; no
            // iteration follows a stop someone asked for or a shutdown.
            (
                S::Stopping {
                    run,
                    stop,
                    verifying: false,
                    ..
                },
                E::ChildExited { ending, facts },
            ) if !by_daemon(&ending) => {
                let may_verify = matches!(stop, Stop::Timeout | Stop::Stalled { .. });
                self.exited(run, ending, facts, may_verify, now)
            }
            (
                S::Stopping {
                    run,
                    stop,
                    verifying: false,
                    ..
                },
                E::ChildExited { ending, facts },
            ) => self.stopped(run, stop, ending, facts, now),
            // A verification stopped: the run before it ended well, so
            // neither COMPLETE nor a usage limit changes what the stop was.
            (
                S::Stopping {
                    run,
                    stop,
                    verifying: true,
                    ..
                },
                E::VerifyFinished(_),
            ) => self.record(&run, stop_outcome(stop), None),
            (
                S::Recording {
                    session_id,
                    outcome,
                    then,
                },
                E::Recorded,
            ) => (
                S::Ended {
                    session_id: Some(session_id),
                    outcome: Some(outcome),
                },
                then,
            ),
            (
                S::Recording {
                    session_id,
                    outcome,
                    then,
                },
                E::RecordFailed,
            ) => (
                S::Ended {
                    session_id: Some(session_id),
                    outcome: Some(outcome),
                },
                std::iter::once(Action::KeepOrphan).chain(then).collect(),
            ),
            // Anything else: not expected in this state (a second exit, a
            // stop of a session already stopping, a shutdown while its
            // record is written — that record is the one).
            (state, _) => (state, Vec::new()),
        }
    }

    /// A timer fired while the run runs: its timeout, its stall.
    fn deadline(&mut self, mut run: Run, now: DateTime<Utc>) -> (SessionState, Vec<Action>) {
        if run.deadline.is_some_and(|d| now >= d) {
            return self.stop(run, Stop::Timeout, now, Vec::new());
        }
        let mut actions = Vec::new();
        if let Some(stall) = self.settings.stall_timeout
            && !run.stall_warned
            && now >= later(run.last_output, stall)
        {
            run.stall_warned = true;
            actions.push(Action::Raise {
                code: Code::SessionStalled,
            });
            if self.settings.stall_stops {
                // Its stall timeout, as the record words it (not the
                // moment the timer was served).
                let silent_for = stall;
                return self.stop(run, Stop::Stalled { silent_for }, now, actions);
            }
        }
        // A warned silence is looked at again one stall timeout later: an IO
        // side that reports output only when asked (at this timer) has
        // then said whether the run printed since.
        let recheck = self
            .settings
            .stall_timeout
            .filter(|_| run.stall_warned)
            .map(|s| later(now, s));
        let due = match (next_due(&run, self.settings.stall_timeout), recheck) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = due {
            actions.push(Action::ArmTimer { at });
        }
        (SessionState::Running(run), actions)
    }

    fn stop(
        &mut self,
        run: Run,
        stop: Stop,
        now: DateTime<Utc>,
        mut actions: Vec<Action>,
    ) -> (SessionState, Vec<Action>) {
        let grace_until = later(now, self.settings.kill_grace);
        actions.push(Action::Signal(Sig::Term));
        actions.push(Action::ArmTimer { at: grace_until });
        (
            SessionState::Stopping {
                run,
                stop,
                grace_until,
                killed: false,
                verifying: false,
            },
            actions,
        )
    }

    /// The run ended after the daemon began to stop it: the stop says what
    /// it was, unless the agent said COMPLETE first or a usage limit
    /// explains it.
    fn stopped(
        &mut self,
        run: Run,
        stop: Stop,
        ending: Ending,
        facts: Facts,
        now: DateTime<Utc>,
    ) -> (SessionState, Vec<Action>) {
        // Its script recorded the session's end before the stop began (and
        // the daemon does not hold the end): that record is the session's;
        // the stop only ended a process that lingered after it.
        if run.script_first && !self.settings.holds_end {
            return self.exited(run, Ending::Exited { code: 0 }, facts, false, now);
        }
        if run.completed_signal && !matches!(ending, Ending::SpawnFailed { .. }) {
            // No verification after a stop someone asked for or a shutdown:
            // the session is ending.
            let verify = matches!(stop, Stop::Timeout | Stop::Stalled { .. });
            return self.exited(run, Ending::Exited { code: 0 }, facts, verify, now);
        }
        if let Some(held) = run.limit.clone() {
            return self.held(&run, held);
        }
        match stop {
            Stop::Timeout => self.exited(run, Ending::TimedOut, facts, true, now),
            Stop::Stalled { silent_for } => {
                self.exited(run, Ending::Stalled { silent_for }, facts, true, now)
            }
            stop => self.record(&run, stop_outcome(stop), None),
        }
    }

    /// The run ended by itself (or the runner says how the daemon ended
    /// it): judged by the error matrix; a success is verified if `verify`
    /// is configured and `may_verify`.
    fn exited(
        &mut self,
        run: Run,
        ending: Ending,
        facts: Facts,
        may_verify: bool,
        now: DateTime<Utc>,
    ) -> (SessionState, Vec<Action>) {
        // The agent said it finished its work: that counts.
        let ending = if run.completed_signal
            && !ending.is_success()
            && !matches!(ending, Ending::SpawnFailed { .. })
        {
            Ending::Exited { code: 0 }
        } else {
            ending
        };
        if let Some(held) = run.limit.clone()
            && (!ending.is_success() || facts.claude_error || facts.claude.is_some())
        {
            return self.held(&run, held);
        }
        if ending == Ending::Stopped {
            // The runner stopped it before the machine asked (a stop
            // requested before the start): a shutdown.
            return self.record(&run, Outcome::Interrupted(Interruption::Shutdown), None);
        }
        let script_failed = match &run.script {
            Some(ScriptRecord::Failed { reason }) => Some(reason.as_str()),
            _ => None,
        };
        let ended_by_script = run.script == Some(ScriptRecord::Ended);
        let verdict = failure::judge(
            &Observed {
                ending: &ending,
                empty: facts.empty,
                fingerprint: facts.fingerprint,
                claude: facts.claude.as_ref(),
                ended_by_script,
                failed_by_script: script_failed,
                incomplete: self.settings.require_complete && !run.completed_signal,
                now,
                oom: facts.oom.as_ref(),
                invalid_commits: facts.invalid_commits.as_deref(),
            },
            &mut self.streak,
            &self.settings.retries,
        );
        let Some(code) = verdict.code else {
            // A success: verified, or done.
            if let Some(limits) = self.settings.verify
                && limits.max_iterations > 0
                && may_verify
            {
                let iteration = run.iteration;
                return (
                    SessionState::Verifying(run),
                    vec![Action::StartVerify { iteration }],
                );
            }
            return self.record(&run, Outcome::Completed, Some(verdict));
        };
        let outcome = match code {
            Code::SessionTimeout => Outcome::Timeout {
                after: self.settings.timeout,
            },
            Code::SessionStalled => Outcome::Stalled {
                silent_for: match ending {
                    Ending::Stalled { silent_for } => silent_for,
                    _ => self.settings.stall_timeout.unwrap_or_default(),
                },
            },
            Code::AgentLoginRequired => Outcome::LoginRequired {
                message: verdict.message.clone(),
            },
            code => {
                let described = describe_with(&ending, self.settings.timeout).1;
                let seen = Seen {
                    ending: &ending,
                    claude_failed: facts.claude.is_some(),
                    ended_by_script,
                    failed_by_script: script_failed.is_some(),
                    stderr_last_words: facts.stderr_last_words.as_deref(),
                    described: &described,
                };
                let reason = failure::recorded_reason(&seen, &verdict)
                    .or_else(|| script_failed.map(str::to_string))
                    .unwrap_or(described);
                Outcome::Error { code, reason }
            }
        };
        self.record(&run, outcome, Some(verdict))
    }

    /// A verification's result: the session is done, or the next
    /// iteration runs, or the loop gives up.
    fn verified(&mut self, mut run: Run, v: Verified) -> (SessionState, Vec<Action>) {
        let limits = self.settings.verify.unwrap_or(IterationLimits {
            max_iterations: 1,
            stuck_threshold: 0,
        });
        let (changed, describe, tail) = match v {
            Verified::Passed => {
                // A success ends the failure streak (as the matrix's does).
                self.streak = Streak::default();
                let verdict = Verdict {
                    code: None,
                    message: "completed".into(),
                    attempt: run.attempt,
                    next: Next::Clear,
                    escalate: false,
                };
                return self.record(&run, Outcome::Completed, Some(verdict));
            }
            Verified::Failed {
                changed_workspace,
                describe,
                tail,
            } => (changed_workspace, describe, tail),
        };
        run.unchanged = if changed { 0 } else { run.unchanged + 1 };
        let n = run.iteration;
        if run.unchanged > limits.stuck_threshold {
            let why = format!(
                "{} iterations in a row changed nothing in the workspace, the last after a nudge; last verification: {describe}",
                run.unchanged
            );
            return self.give_up(&run, Code::SessionStuck, why);
        }
        if n >= limits.max_iterations {
            let why = format!(
                "verification still failed after {n} iteration(s): {describe}; its output ends: {tail}"
            );
            return self.give_up(&run, Code::VerifyFailed, why);
        }
        run.iteration += 1;
        run.script = None;
        run.script_first = false;
        run.completed_signal = false;
        let nudge = run.unchanged == limits.stuck_threshold && run.unchanged > 0;
        (
            SessionState::Preparing(run),
            vec![Action::Launch {
                iteration: n + 1,
                nudge,
            }],
        )
    }

    fn give_up(&mut self, run: &Run, code: Code, why: String) -> (SessionState, Vec<Action>) {
        let verdict = failure::gave_up(&mut self.streak, &self.settings.retries, code, why.clone());
        self.record(run, Outcome::Error { code, reason: why }, Some(verdict))
    }

    /// A usage limit: not a failure (no streak), the credential held.
    fn held(&mut self, run: &Run, held: Held) -> (SessionState, Vec<Action>) {
        let outcome = Outcome::UsageHeld {
            until: held.until,
            admin_cap: held.admin_cap,
            reason: held.reason.clone(),
        };
        let verdict = Verdict {
            code: outcome.code(),
            message: held.reason,
            attempt: 1,
            next: Next::Nothing,
            escalate: false,
        };
        self.record(run, outcome, Some(verdict))
    }

    /// The one record, what becomes of the messages, and what follows.
    /// `verdict`: the matrix's, where it judged the session.
    fn record(
        &mut self,
        run: &Run,
        outcome: Outcome,
        verdict: Option<Verdict>,
    ) -> (SessionState, Vec<Action>) {
        let verdict = verdict.unwrap_or_else(|| Verdict {
            code: outcome.code(),
            message: outcome.reason(),
            attempt: run.attempt,
            next: Next::Nothing,
            escalate: false,
        });
        let messages = match &outcome {
            Outcome::Completed => Action::AcknowledgeMessages,
            _ => Action::ReturnMessages {
                count_attempt: outcome.counts_attempt(),
            },
        };
        let then = follows(&outcome, &verdict);
        (
            SessionState::Recording {
                session_id: run.session_id.clone(),
                outcome: outcome.clone(),
                then,
            },
            vec![Action::Record { outcome, verdict }, messages],
        )
    }
}

/// A stop that began while a verification ran.
fn verifying(state: SessionState) -> SessionState {
    match state {
        SessionState::Stopping {
            run,
            stop,
            grace_until,
            killed,
            ..
        } => SessionState::Stopping {
            run,
            stop,
            grace_until,
            killed,
            verifying: true,
        },
        other => other,
    }
}

/// What a stop the run did not outlive was, where nothing judged it.
fn stop_outcome(stop: Stop) -> Outcome {
    match stop {
        Stop::Requested { by, reason } => Outcome::Stopped { by, reason },
        // Timeouts and stalls are the run's, never a verification's (it
        // has its own `verify_timeout`).
        Stop::Timeout | Stop::Stalled { .. } | Stop::Shutdown => {
            Outcome::Interrupted(Interruption::Shutdown)
        }
    }
}

/// The runner ended the run on the daemon's order (it sent the SIGTERM, or
/// started nothing): not an exit of the run's own.
fn by_daemon(ending: &Ending) -> bool {
    matches!(
        ending,
        Ending::Stopped | Ending::TimedOut | Ending::Stalled { .. }
    )
}

/// The agent's command cannot run (missing, not executable): its
/// messages are not its failure, and nothing runs until it is fixed.
fn cannot_run(code: Code) -> bool {
    matches!(code, Code::AgentNotFound | Code::AgentPermissionDenied)
}

/// What follows a session's record.
fn follows(outcome: &Outcome, verdict: &Verdict) -> Vec<Action> {
    let mut out = Vec::new();
    match outcome {
        Outcome::Completed => {
            out.push(Action::ClearFailures);
            out.push(Action::ReleaseHold);
            return out;
        }
        Outcome::Stopped { .. } | Outcome::Interrupted(_) => return out,
        Outcome::UsageHeld {
            until, admin_cap, ..
        } => {
            out.push(Action::HoldCredential { until: *until });
            if *admin_cap {
                out.push(Action::Escalate {
                    code: Code::UsageDisabled,
                });
            }
            return out;
        }
        Outcome::Error { code, .. } if cannot_run(*code) => {
            out.push(Action::Disable);
            out.push(Action::Escalate { code: *code });
            return out;
        }
        Outcome::LoginRequired { .. } => out.push(Action::HoldCredential { until: None }),
        _ => {}
    }
    match verdict.next {
        Next::Retry { after } => out.push(Action::Retry { after }),
        Next::Backoff { hold } => out.push(Action::Backoff { hold }),
        Next::Disable => out.push(Action::Disable),
        Next::Clear => out.push(Action::ClearFailures),
        Next::Nothing => {}
    }
    if verdict.escalate
        && let Some(code) = verdict.code
    {
        out.push(Action::Escalate { code });
    }
    out
}

/// The run's next timer: its timeout, or its stall check if sooner.
fn next_due(run: &Run, stall: Option<Duration>) -> Option<DateTime<Utc>> {
    let stall_at = stall
        .filter(|_| !run.stall_warned)
        .map(|s| later(run.last_output, s));
    match (run.deadline, stall_at) {
        (Some(d), Some(s)) => Some(d.min(s)),
        (d, s) => d.or(s),
    }
}
