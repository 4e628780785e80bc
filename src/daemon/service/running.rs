//! A running session as the loop holds it ([`Running`]): its ids and
//! process, its typed state machine (`machine::Session`) fed with the
//! clock as a value, the stop asked of it, and what it is waiting for.

use super::*;

pub(super) struct Running {
    pub(super) session_id: String,
    pub(super) instance: String,
    pub(super) pid: Option<u32>,
    pub(super) started_at: Timestamp,
    /// When it began on `clock`'s line (the health monitor's expiry of a
    /// process that never started).
    pub(super) began: DateTime<Utc>,
    /// Its lifecycle, fed live: it decides when the session's runs get
    /// SIGTERM and SIGKILL (a timeout, a stall, a stop, a shutdown).
    pub(super) machine: machine::Session,
    /// The time its machine is told: the sessions' monotonic line (a wall
    /// clock step moves none of its timers).
    pub(super) clock: SessionClock,
    /// When the machine asked to be told the time again (its timeout, the
    /// grace after SIGTERM), on `clock`'s line: a deadline of the loop.
    pub(super) timer: Option<DateTime<Utc>>,
    /// What the runner is told (the machine's signals): the runner only
    /// obeys.
    pub(super) orders: watch::Sender<runner::Orders>,
    /// When it last printed (its observer stores it), and how much of that
    /// its machine was told.
    pub(super) activity: std::sync::Arc<observer::Activity>,
    pub(super) output_seen: u64,
    /// Why the daemon stopped it, if it did for another reason than shutdown.
    pub(super) stop_reason: Option<String>,
    /// The same, for the session's observer, which notes it in session.json
    /// before the runner signals the session.
    pub(super) stop_note: StopNote,
    /// Whether its ending note went into its session's file before its
    /// script's own end (see [`observer::Noted`]).
    pub(super) noted: observer::Noted,
    /// The session signalled COMPLETE.
    pub(super) completed_by_signal: bool,
    /// Signals (valid or not) handled so far, and the last PROGRESS value:
    /// an agent that prints signals in a loop must not turn the daemon's
    /// loop into a stream of fsyncs.
    pub(super) signals_seen: u32,
    /// `DISCOVERY_GLOBAL` signals shared with every agent so far.
    pub(super) global_discoveries: u32,
    pub(super) last_progress: Option<u8>,
    /// The session's owner lock: held while the daemon owns the session.
    pub(super) owner_lock: Option<crate::owner::OwnerLock>,
    /// What the claim read (bodies dropped), for the end.
    pub(super) claimed: Vec<crate::inbox::Message>,
    /// Claude Code's conversation id, and whether the session continued it.
    pub(super) conversation: Option<(String, bool)>,
    /// Its runner ended; its end is being recorded off the loop
    /// ([`Event::EndRecorded`] follows).
    pub(super) recording: bool,
    /// Its record, when its machine decided it before its task ended (a
    /// verification passed, the iterations gave up, a run judged failed).
    pub(super) decided: Option<(machine::Outcome, failure::Verdict)>,
    /// The worker it runs on, when it runs on one (the lease's holder).
    pub(super) host: Option<String>,
    /// It runs (or is ordered) on a worker: a controller that stops
    /// leaves it running for the next one. A session of an agent with
    /// `runs_on = "controller"` runs on this host and is stopped.
    pub(super) on_worker: bool,
}

/// Why the daemon stops a session, shared with its [`Observer`].
pub(super) type StopNote = std::sync::Arc<std::sync::Mutex<Option<StopWhy>>>;

/// Why the daemon stops a session (not a shutdown): the reason recorded,
/// and the catalogue code when the reason is not the agent's failure
/// (`SESSION_STOPPED`: an operator's `agent-state stop`).
#[derive(Debug, Clone)]
pub(super) struct StopWhy {
    pub(super) reason: String,
    pub(super) code: Option<Code>,
}

impl Running {
    /// Stop the session for `why` (not a shutdown): recorded as an error
    /// with this reason.
    pub(super) fn stop_for(&mut self, why: String) {
        self.stop_with(why, None);
    }

    /// Stop it for `why`, typed by `code` (see [`StopWhy`]): its machine's
    /// path of a timeout (SIGTERM to the group and the cgroup, SIGKILL
    /// after `kill_grace`).
    pub(super) fn stop_with(&mut self, why: String, code: Option<Code>) {
        if let Ok(mut note) = self.stop_note.lock() {
            *note = Some(StopWhy {
                reason: why.clone(),
                code,
            });
        }
        self.stop_reason = Some(why.clone());
        let by = match code {
            Some(Code::SessionStopped) => machine::StopBy::Operator,
            _ => machine::StopBy::Daemon,
        };
        self.feed(machine::Event::StopRequested { by, reason: why });
        // A stop the machine did not act on (its run is being ended for its
        // time): no run of it starts any more all the same.
        self.orders
            .send_if_modified(|o| !std::mem::replace(&mut o.stop, true));
    }

    /// Feed the session's machine what happened now (on its clock), and
    /// carry out what is the session's own: the runner's orders, its timer,
    /// no run once its record is decided. Returns the other actions (a
    /// stall's error record) for the caller.
    pub(super) fn feed(&mut self, event: machine::Event) -> Vec<machine::Action> {
        let now = self.clock.now();
        self.feed_at(event, now)
    }

    /// [`Running::feed`], `now` on its clock's line.
    pub(super) fn feed_at(
        &mut self,
        event: machine::Event,
        now: DateTime<Utc>,
    ) -> Vec<machine::Action> {
        let mut rest = Vec::new();
        for action in self.machine.on(event, now) {
            match action {
                machine::Action::ArmTimer { at } => self.timer = Some(at),
                machine::Action::Signal(sig) => self.order(sig),
                other => rest.push(other),
            }
        }
        if self.machine.is_over() {
            self.orders
                .send_if_modified(|o| !std::mem::replace(&mut o.stop, true));
        }
        rest
    }

    /// The machine's signal, as the runner's order.
    pub(super) fn order(&mut self, sig: machine::Sig) {
        let Some((stop, n)) = self.machine.stopping() else {
            return;
        };
        let end = match stop {
            machine::Stop::Timeout => Some(Ending::TimedOut),
            machine::Stop::Stalled { silent_for } => Some(Ending::Stalled {
                silent_for: *silent_for,
            }),
            machine::Stop::Requested { .. } | machine::Stop::Shutdown => None,
        };
        self.orders.send_modify(|o| match (sig, end) {
            (machine::Sig::Kill, _) => o.kill = Some(n),
            (machine::Sig::Term, None) => o.stop = true,
            (machine::Sig::Term, Some(why)) => {
                if o.end.as_ref().map(|(i, _)| *i) != Some(n) {
                    o.end = Some((n, why));
                }
            }
        });
    }

    /// Its agent's session.json was replaced while it runs: what its script
    /// said of its end (`session end|fail`, or its word kept for the
    /// daemon's end), told to its machine as it happens. Said before the
    /// daemon begins to stop the run, an unheld script's end is the
    /// session's record (see `machine::Run::script_first`).
    pub(super) fn script_said(&mut self, dir: &crate::state::AgentDir) {
        if self.recording {
            return;
        }
        let Some(end) = session::script_end(dir, &self.session_id) else {
            return;
        };
        self.tell_end(Some(iterations::script_record(end)), None, None);
    }

    /// Its task ended (the runs and the iteration loop are over): tell its
    /// machine what is known only now (the script's own end if it was not
    /// heard, COMPLETE, a usage limit) and how the last run ended, and take
    /// the one record it decides: the outcome and the error matrix's
    /// verdict, the machine's streak advanced. A record it decided while
    /// the task ran (the iterations) is that one.
    pub(super) fn ended(
        &mut self,
        script: Option<machine::ScriptRecord>,
        held: Option<machine::Held>,
        ending: Ending,
        facts: machine::Facts,
    ) -> (machine::Outcome, failure::Verdict) {
        use machine::{Event as E, SessionState as S};
        if let Some(decided) = self.decided.take() {
            return decided;
        }
        // A verification the daemon stopped: its task ends without a
        // verdict; the stop is what the session was.
        let end = match self.machine.state() {
            S::Verifying(_)
            | S::Stopping {
                verifying: true, ..
            } => E::VerifyFinished(machine::Verified::Passed),
            _ => E::ChildExited { ending, facts },
        };
        let actions = self.tell_end(script, held, Some(end));
        let record = actions.into_iter().find_map(|a| match a {
            machine::Action::Record { outcome, verdict } => Some((outcome, verdict)),
            _ => None,
        });
        record.unwrap_or_else(|| {
            // The state did not expect the end: never so far; an
            // interruption is what a session without a record amounts to.
            tracing::warn!(session_id = %self.session_id, state = ?self.machine.state(), "the session's machine decided no record at its end; recorded as interrupted");
            let outcome = machine::Outcome::Interrupted(machine::Interruption::Shutdown);
            let verdict = failure::Verdict {
                code: None,
                message: outcome.reason(),
                attempt: self.machine.streak().retries + 1,
                next: Next::Nothing,
                escalate: false,
            };
            (outcome, verdict)
        })
    }

    /// What its script said of its end (read from its session file; when,
    /// by the evidence of its ending note), then, with an `end`, COMPLETE,
    /// a usage limit and that end (a run's or a verification's): the
    /// actions its machine decides.
    pub(super) fn tell_end(
        &mut self,
        script: Option<machine::ScriptRecord>,
        held: Option<machine::Held>,
        end: Option<machine::Event>,
    ) -> Vec<machine::Action> {
        use machine::Event as E;
        let said = self.noted.said();
        let mut actions = Vec::new();
        match script {
            Some(machine::ScriptRecord::Ended) => {
                actions.extend(self.feed(E::ScriptEnded { said }))
            }
            Some(machine::ScriptRecord::Failed { reason }) => {
                actions.extend(self.feed(E::ScriptFailed { reason, said }))
            }
            None => {}
        }
        let Some(end) = end else {
            return actions;
        };
        if self.completed_by_signal {
            let complete = E::Output(machine::OutputSignal::Complete);
            actions.extend(self.feed(complete));
        }
        if let Some(held) = held {
            actions.extend(self.feed(E::UsageLimitSeen(held)));
        }
        actions.extend(self.feed(end));
        actions
    }

    /// What its task is ordered after its machine's `actions`: verify, the
    /// next iteration, or nothing more (a record decided is kept for its
    /// end).
    pub(super) fn order_of(&mut self, actions: Vec<machine::Action>) -> iterations::Order {
        let mut order = iterations::Order::Finish;
        for action in actions {
            match action {
                machine::Action::StartVerify { .. } => order = iterations::Order::Verify,
                machine::Action::Launch { nudge, .. } => {
                    order = iterations::Order::Launch { nudge }
                }
                machine::Action::Record { outcome, verdict } => {
                    self.decided = Some((outcome, verdict));
                    order = iterations::Order::Finish;
                }
                _ => {}
            }
        }
        order
    }

    /// Its machine's timer came: tell it when the session last printed (if
    /// it did since it was last told), then the time.
    pub(super) fn due(&mut self) -> Vec<machine::Action> {
        let now = self.clock.now();
        match self.timer {
            Some(at) if at <= now => {
                self.timer = None;
                let mut actions = Vec::new();
                if let Some(ago) = self.activity.since(&mut self.output_seen) {
                    let printed = chrono::Duration::from_std(ago)
                        .ok()
                        .and_then(|ago| now.checked_sub_signed(ago))
                        .unwrap_or(now);
                    let output = machine::Event::Output(machine::OutputSignal::Output);
                    actions.extend(self.feed_at(output, printed));
                }
                actions.extend(self.feed_at(machine::Event::Deadline, now));
                actions
            }
            _ => Vec::new(),
        }
    }
}
