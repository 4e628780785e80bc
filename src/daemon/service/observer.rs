//! A session's output as it streams, on the runner's side: analysed with
//! bounded memory, signals passed to the loop as they happen, the time of
//! the last output kept for the session's machine (its stall timer), and
//! summarised for the session's end.

use super::*;

/// What the daemon keeps of a session's output once it ended.
pub(super) struct OutputSummary {
    pub(super) empty: bool,
    pub(super) fingerprint: Option<u64>,
    pub(super) claude: Option<ClaudeResult>,
    /// The end of stdout (at most 256 KiB), where the summary blocks are.
    pub(super) tail: String,
    /// The end of stderr, where a CLI prints a usage limit in text.
    pub(super) stderr_tail: Vec<u8>,
}

impl OutputSummary {
    /// What the session answered: Claude Code's result text when there is
    /// one (the blocks sit inside it), else the end of stdout.
    pub(super) fn answer_text(&self) -> String {
        self.claude
            .as_ref()
            .and_then(|c| c.result.clone())
            .unwrap_or_else(|| self.tail.clone())
    }

    /// For a session that never ran.
    pub(super) fn none() -> OutputSummary {
        OutputSummary {
            empty: false,
            fingerprint: None,
            claude: None,
            tail: String::new(),
            stderr_tail: Vec::new(),
        }
    }
}

/// The session's output as it streams: analysed by [`SessionOutput`]
/// (bounded memory), with signals reported to the loop as they happen.
pub(super) struct Observer {
    pub(super) output: SessionOutput,
    pub(super) agent: AgentName,
    pub(super) tx: mpsc::UnboundedSender<Event>,
    /// One signal scanner per stream: chunks of the two interleave.
    pub(super) scanners: [crate::protocol::signals::SignalScanner; 2],
    pub(super) ending: EndingNote,
    /// Tokens used so far (stream-json), against `session_budget.max_tokens`.
    pub(super) meter: crate::daemon::meter::Meter,
    /// The run signalled COMPLETE (the iteration loop verifies it then,
    /// whatever its exit status).
    pub(super) completed: bool,
    /// When it last printed, for its machine's stall timer.
    pub(super) activity: std::sync::Arc<Activity>,
    /// Signals kept back until the run says ([`OutputObserver::hold_signals`]).
    pub(super) held: Option<Vec<crate::protocol::signals::SignalResult>>,
}

/// When a session last printed: stored at each chunk (one atomic store, no
/// event), read by the loop when the session's machine's timer comes, so
/// that the machine keeps the stall timer without an event per chunk.
#[derive(Debug)]
pub(super) struct Activity {
    base: std::time::Instant,
    /// Nanoseconds after `base`, plus one, of the last output; 0: none yet.
    last: std::sync::atomic::AtomicU64,
}

impl Activity {
    pub(super) fn new() -> std::sync::Arc<Activity> {
        std::sync::Arc::new(Activity {
            base: std::time::Instant::now(),
            last: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.last
            .store(ns.saturating_add(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// Output printed since `seen` (which it updates): how long ago the
    /// last of it was.
    pub(super) fn since(&self, seen: &mut u64) -> Option<Duration> {
        let last = self.last.load(std::sync::atomic::Ordering::Relaxed);
        if last <= *seen {
            return None;
        }
        *seen = last;
        Some(
            self.base
                .elapsed()
                .saturating_sub(Duration::from_nanos(last - 1)),
        )
    }
}

impl OutputObserver for Observer {
    fn on_output(&mut self, chunk: &[u8]) {
        self.on_stream_output(OutputStream::Stdout, chunk);
    }

    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        self.activity.touch();
        self.output.on_stream_output(stream, chunk);
        let i = match stream {
            OutputStream::Stdout => 0,
            OutputStream::Stderr => 1,
        };
        if i == 0
            && let Some(tokens) = self.meter.push(chunk)
        {
            let _ = self.tx.send(Event::SessionOverBudget {
                agent: self.agent.clone(),
                tokens,
            });
        }
        for signal in self.scanners[i].feed(chunk) {
            self.send_signal(signal);
        }
    }

    fn on_terminate(&mut self, why: &Ending) {
        self.ending.note(why);
    }

    fn hold_signals(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    fn held_signals(&self) -> usize {
        self.held.as_ref().map_or(0, Vec::len)
    }

    fn release_signals(&mut self, carry_out: bool) {
        let Some(held) = self.held.as_mut() else {
            return;
        };
        let held = std::mem::take(held);
        for signal in held {
            let complete = signal
                .as_ref()
                .is_ok_and(|s| s.kind() == crate::protocol::signals::SignalType::Complete);
            if carry_out || complete {
                let _ = self.tx.send(Event::Signal {
                    agent: self.agent.clone(),
                    signal: Box::new(signal),
                });
            }
        }
    }
}

/// What an [`Observer`] needs to note in session.json that the daemon is
/// ending the session, before the runner's SIGTERM reaches its script.
pub(super) struct EndingNote {
    pub(super) agent: AgentConfig,
    pub(super) dir: AgentDir,
    pub(super) session_id: String,
    pub(super) stop_note: StopNote,
    pub(super) noted: Noted,
}

/// Whether the daemon's note of its ending went into the session's file
/// (shared by the session's [`EndingNote`] and the loop's `Running`): the
/// evidence on disk of which came first, the script's own end or the
/// daemon's stop. Its note is written under the agent's lock before every
/// SIGTERM, and only into a session file still running.
#[derive(Debug, Clone, Default)]
pub(super) struct Noted(std::sync::Arc<std::sync::atomic::AtomicU8>);

impl Noted {
    /// Not written yet.
    const NOT_YET: u8 = 0;
    /// The file was ended already (by the script): no note went in.
    const FOUND_ENDED: u8 = 1;
    /// The note went in (or its write failed: no evidence).
    const NOTED: u8 = 2;

    fn set(&self, v: u8) {
        self.0.fetch_max(v, std::sync::atomic::Ordering::SeqCst);
    }

    /// When a script's end now read from the session's file was said: before
    /// the daemon's note (none written yet, or it found the file ended), or
    /// no evidence either way.
    pub(super) fn said(&self) -> machine::Said {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Self::NOT_YET | Self::FOUND_ENDED => machine::Said::BeforeStop,
            _ => machine::Said::AsHeard,
        }
    }
}

impl EndingNote {
    pub(super) fn note(&self, why: &Ending) {
        let now = Timestamp::now();
        let stop = self.stop_note.lock().ok().and_then(|n| n.clone());
        let result = match (why, stop) {
            // A stop for a reason (not a shutdown) is recorded as an error
            // (with its code: an operator's stop is not the agent's failure).
            (Ending::Stopped, Some(stop)) => hooks::note_daemon_ending(
                &self.dir,
                &self.session_id,
                &hooks::DaemonEnding {
                    outcome: "error".into(),
                    reason: stop.reason,
                    by_pid: std::process::id(),
                    at: now,
                    code: stop.code.map(|c| c.as_str().to_string()),
                },
                now,
            ),
            _ => session::note_ending(&self.agent, &self.dir, &self.session_id, why, now),
        };
        match result {
            Ok(true) => self.noted.set(Noted::NOTED),
            Ok(false) => self.noted.set(Noted::FOUND_ENDED),
            Err(e) => {
                self.noted.set(Noted::NOTED);
                tracing::warn!(agent = %self.agent.name, session_id = %self.session_id, "cannot note in session.json that the daemon ends the session: {e}");
            }
        }
    }
}

impl Observer {
    /// The observer of `cfg`'s session `session_id`, sharing `side` with
    /// its `Running`.
    pub(super) fn new(
        cfg: AgentConfig,
        dir: AgentDir,
        session_id: String,
        tx: mpsc::UnboundedSender<Event>,
        side: &super::start::TaskSide,
    ) -> Observer {
        Observer {
            meter: crate::daemon::meter::Meter::new(cfg.session.session_budget.max_tokens),
            output: SessionOutput::new(),
            agent: cfg.name.clone(),
            tx,
            scanners: Default::default(),
            completed: false,
            activity: side.activity.clone(),
            held: None,
            ending: EndingNote {
                agent: cfg,
                dir,
                session_id,
                stop_note: side.stop_note.clone(),
                noted: side.noted.clone(),
            },
        }
    }

    pub(super) fn send_signal(&mut self, signal: crate::protocol::signals::SignalResult) {
        if signal
            .as_ref()
            .is_ok_and(|s| s.kind() == crate::protocol::signals::SignalType::Complete)
        {
            self.completed = true;
        }
        if let Some(held) = self.held.as_mut() {
            held.push(signal);
            return;
        }
        let _ = self.tx.send(Event::Signal {
            agent: self.agent.clone(),
            signal: Box::new(signal),
        });
    }

    /// The end of the output: an unterminated signal is reported.
    pub(super) fn finish(&mut self) {
        // Anything still held (none: a run releases after each chunk) goes.
        self.release_signals(true);
        self.held = None;
        let mut rest = Vec::new();
        for scanner in &mut self.scanners {
            rest.extend(scanner.finish());
        }
        for signal in rest {
            self.send_signal(signal);
        }
    }

    pub(super) fn summary(&self) -> OutputSummary {
        OutputSummary {
            empty: self.output.is_empty(),
            fingerprint: self.output.fingerprint(),
            claude: self.output.claude_result(),
            tail: String::from_utf8_lossy(&self.output.stdout_tail()).into_owned(),
            stderr_tail: self.output.stderr_tail(),
        }
    }
}
