//! A session's end: the runner's report and the output's summary judged by
//! the error matrix (`failure`), recorded through the hooks, and the verdict
//! carried out (retry, backoff, disable). Also what streams in while it runs:
//! signals and stalls.

use super::*;
use crate::daemon::machine;

/// Signals handled per session; the rest are counted and ignored.
pub(super) const SIGNALS_PER_SESSION: u32 = 1000;

/// A session's end between its judgement and what follows its record, both
/// on the loop: what [`Daemon::session_done`] decided, carried to
/// [`Daemon::end_recorded`] while `session::finish` records the end on a
/// blocking thread. Recording is mostly renames of the claimed messages into
/// `processed/` and their syncs (a thousand of them in a burst): off the
/// loop, the loop claims other agents' messages and starts their sessions
/// meanwhile.
pub(super) struct Recorded {
    agent: AgentName,
    report: RunReport,
    workspace: Option<workspaces::Outcome>,
    iterations: iterations::Tally,
    now: Timestamp,
    dir: AgentDir,
    cfg: Option<AgentConfig>,
    sid: String,
    limit: Option<crate::protocol::limits::Limit>,
    verdict: failure::Verdict,
    /// What the session was (its log line's level).
    decided: machine::Outcome,
    succeeded: bool,
    flows: Vec<AgentName>,
    /// What the record carries besides the end (see `facts`).
    facts: hooks::Facts,
}

impl Daemon {
    /// A session's runner ended: judge it, keep a flow's answer, and record
    /// its end off the loop. The agent stays in `running` (its slot busy, a
    /// shutdown waiting for it) until [`Daemon::end_recorded`].
    pub(super) fn session_done(
        &mut self,
        agent: AgentName,
        mut report: RunReport,
        output: OutputSummary,
        workspace: Option<workspaces::Outcome>,
        iterations: iterations::Tally,
    ) {
        let Some(mut running) = self.running.remove(&agent) else {
            return;
        };
        // What its script says of its end is read below, once more.
        self.watcher.unwatch_session(&agent);
        if running.recording {
            // A runner ends once: never here.
            self.running.insert(agent, running);
            return;
        }
        if running.completed_by_signal
            && !report.ending.is_success()
            && !matches!(report.ending, Ending::SpawnFailed { .. })
        {
            // The agent said it finished its work: that counts, whatever
            // became of the process afterwards.
            tracing::warn!(
                agent = %agent, session_id = %running.session_id,
                "the session signalled COMPLETE; counted as completed although the command {}",
                report.ending
            );
            report.ending = Ending::Exited { code: 0 };
        }
        let now = Timestamp::from_datetime(self.clock.now());
        let dir = self.root.agent(&agent);
        let cfg = self.agent_config(&agent).cloned();
        let sid = running.session_id.clone();
        let claude_failure = output.claude.as_ref().and_then(output::classify);
        // Each run's usage once (an iteration loop's runs each).
        for result in iterations.results(output.claude.as_ref()) {
            self.tally.usage(&agent, result);
        }
        let by_script = session::script_end(&dir, &sid);
        let claude_failed = output.claude.as_ref().is_some_and(|r| r.is_error);
        // A usage limit is not the agent's failure: its credential waits.
        let limit = economy::limit_in(
            &report,
            &output,
            claude_failed || claude_failure.is_some(),
            self.clock.now(),
        );
        // `usage_limit_hit` holds the credential itself (the machine's
        // `HoldCredential` is not carried out yet): no `until` needed here.
        let held = limit.as_ref().map(|l| {
            let now = self.clock.now();
            let (v, raise) = (self.economy).usage_limit_hit(
                &self.root,
                &self.config,
                now,
                economy::LimitHit {
                    agent: &agent,
                    group: &economy::group_of(cfg.as_ref()),
                    session_id: &sid,
                    limit: l,
                },
            );
            if let Some((record, escalate)) = raise {
                self.raise(record, escalate);
            }
            machine::Held {
                until: None,
                admin_cap: v.code == Some(Code::UsageDisabled),
                reason: v.message,
            }
        });
        let stderr_last_words = output::last_words(&output.stderr_tail);
        // What the session was: its live machine's answer to its end (its
        // outcome, and the error matrix's verdict for its error record),
        // the agent's streak advanced (issue 21).
        let (decided, verdict) = running.ended(
            by_script.clone().map(iterations::script_record),
            held,
            report.ending.clone(),
            machine::Facts {
                empty: output.empty,
                fingerprint: output.fingerprint,
                claude: claude_failure.clone(),
                claude_error: claude_failed,
                stderr_last_words: stderr_last_words.clone(),
                oom: report.oom,
                invalid_commits: workspace.as_ref().and_then(|w| w.invalid.clone()),
            },
        );
        self.streaks
            .insert(agent.clone(), running.machine.streak().clone());
        if verdict.code == Some(Code::SessionOom) {
            oom_killed(
                &mut self.core,
                &self.root,
                self.config.daemon.oom_lower_for,
                &agent,
                &sid,
                now.0,
            );
        }
        let succeeded = decided.is_completed();
        if succeeded && let Some(doubt) = output.claude.as_ref().and_then(output::doubts) {
            self.raise(
                ErrorRecord::new(Code::SessionSuspect, format!("{agent}: {doubt}"))
                    .agent(&agent)
                    .session(&sid),
                false,
            );
        }
        self.tally.session_ended(
            &agent,
            report.duration.as_secs_f64(),
            succeeded.then_some(now),
        );
        // A flow's hand-off answered: kept before the end acknowledges it.
        let flows = if succeeded {
            let (flows, errors) = flows::keep_flow_answers(
                &self.root,
                &self.config,
                &agent,
                &running,
                &output,
                workspace.as_ref(),
                now,
            );
            self.raise_each(errors);
            flows
        } else {
            Vec::new()
        };
        let facts = facts::gather(&facts::Learned {
            root: &self.root,
            agent: &agent,
            session_id: &sid,
            cfg: cfg.as_ref(),
            output: &output,
            workspace: workspace.as_ref(),
            iterations: &iterations,
            conversation: running.conversation.as_ref(),
            resumable: limit.is_none() && verdict.code != Some(Code::AgentLoginRequired),
            now,
        });
        let claimed = std::mem::take(&mut running.claimed);
        running.recording = true;
        self.running.insert(agent.clone(), running);
        let recorded = Recorded {
            agent,
            report,
            workspace,
            iterations,
            now,
            dir,
            cfg,
            sid,
            limit,
            verdict,
            decided,
            succeeded,
            flows,
            facts,
        };
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || {
            let r = &recorded;
            let record = || match &r.cfg {
                Some(cfg) => session::finish(
                    cfg,
                    &r.dir,
                    &r.sid,
                    &session::Judged {
                        outcome: &r.decided,
                        code: r.verdict.code,
                    },
                    Some(claimed),
                    r.facts.clone(),
                    r.now,
                ),
                // Removed from the config while it ran: record it all the same.
                None => Err(Error::Usage("agent no longer configured".into())),
            };
            // A panic here must still reach the loop: the agent would stay
            // `recording` for good, and a shutdown would wait for it forever.
            // Its end is then not recorded: the session stays running on
            // disk, ours, until `finish_orphan` records it.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(record))
                .unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(Error::Data(format!("recording the end panicked: {what}")))
                });
            // The loop runs until `running` is empty: it is there to
            // receive this.
            let _ = tx.send(Event::EndRecorded(Box::new((recorded, outcome))));
        });
    }

    /// A session's end is recorded (or could not be): say so, and carry out
    /// the rest (workspace, conversation, cost, the verdict, the next wake).
    pub(super) fn end_recorded(&mut self, recorded: Recorded, outcome: Result<session::Finished>) {
        let Recorded {
            agent,
            report,
            workspace,
            iterations,
            now,
            dir,
            cfg,
            sid,
            limit,
            verdict,
            decided,
            succeeded,
            flows,
            facts,
        } = recorded;
        let Some(running) = self.running.remove(&agent) else {
            return;
        };
        // A remote session's order record has served: its end is recorded
        // (or, not recorded, the session stays ours until `finish_orphan`).
        if self.remote.is_some() && outcome.is_ok() {
            forget_remote(&self.root, &agent, &sid);
        }
        // Its script recorded the end first: what the daemon learned, its
        // verdict (a usage limit in the output of a session the trap's
        // `session fail` recorded as a failure) and its reason (in front of
        // the script's words), in one more write.
        let outcome = match outcome {
            Ok(mut finished) if finished.by_script => {
                let usage_limit = matches!(decided, machine::Outcome::UsageHeld { .. })
                    && finished.verdict.is_failure();
                let reason = (!decided.is_completed()
                    && matches!(
                        report.ending,
                        Ending::Exited { .. } | Ending::Signaled { .. }
                    ))
                .then(|| decided.reason());
                let amendment = hooks::Amendment {
                    verdict: usage_limit.then_some(SessionVerdict::UsageLimit),
                    reason: reason.as_deref(),
                    facts,
                };
                match hooks::amend_ended(&dir, &sid, &amendment, now) {
                    Ok(done) if done.verdict => finished.verdict = SessionVerdict::UsageLimit,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(agent = %agent, session_id = %sid, "cannot add what the daemon learned to the end its script recorded: {e}")
                    }
                }
                Ok(finished)
            }
            other => other,
        };
        match &outcome {
            // Completed in the record and in the machine's outcome (a
            // script's own `session end` of a run the daemon judged failed
            // is a warning).
            Ok(session::Finished {
                verdict: SessionVerdict::Completed,
                text,
                ..
            }) if decided.is_completed() => tracing::info!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} {text}"
            ),
            // Not a failure: said calmly, once, with the hold.
            Ok(session::Finished {
                verdict: SessionVerdict::UsageLimit,
                ..
            }) => tracing::info!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} stopped at the usage limit (not a failure: its credential is held, the session runs again when the hold ends): {}",
                verdict.message
            ),
            // An operator's stop: not a failure either.
            Ok(session::Finished {
                verdict: SessionVerdict::Stopped,
                text,
                ..
            }) => tracing::info!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} stopped (not a failure: its messages wait for the next wake): {}",
                text.strip_prefix("error: ").unwrap_or(text)
            ),
            Ok(session::Finished { text, .. }) => tracing::warn!(
                agent = %agent, session_id = %sid, instance = %running.instance,
                "session {sid} {text}"
            ),
            Err(e) => self.raise(
                ErrorRecord::new(e.code(), format!("cannot record the end of session {sid}"))
                    .details(e.to_string())
                    .agent(&agent)
                    .session(&sid),
                false,
            ),
        }
        if let Some(ws) = &workspace
            && let Some(record) = facts::workspace_said(&agent, &sid, ws)
        {
            self.raise(record, false);
        }
        if cfg
            .as_ref()
            .is_some_and(|c| !c.session.iteration.verify.is_empty())
        {
            self.tally
                .iterations(&agent, iterations.count, iterations.verify_failures);
        }
        flows::apply_flows(&self.root, &self.config, self.clock.now(), &flows, &self.tx);
        if report.truncated {
            self.raise(
                ErrorRecord::new(
                    Code::OutputTruncated,
                    format!(
                        "session output truncated at {} bytes ({} printed)",
                        report.logged_bytes, report.output_bytes
                    ),
                )
                .agent(&agent)
                .session(&sid),
                false,
            );
        }
        if let Some(e) = &report.log_error {
            // The code of any I/O error (ENOSPC → DISK_FULL, EROFS → FS_READONLY).
            let code = Error::io("writing", "the session log", std::io::Error::from(e.kind)).code();
            self.raise(
                ErrorRecord::new(code, "the session log could not be written".to_string())
                    .details(e.message.clone())
                    .agent(&agent)
                    .session(&sid),
                false,
            );
        }
        // Its end not recorded (a full disk): it stays ours, lock and all,
        // until `finish_orphan` records it.
        if let Some(lock) = running.owner_lock
            && matches!(dir.read::<Session>(), Ok(Some(s)) if s.is_running() && s.session_id == sid)
        {
            self.orphan_locks.insert(agent.clone(), lock);
        }
        // The scan owed by the window of a running agent's scans is this
        // one: what it finds is what the session would have skipped. A scan
        // timed meanwhile stays timed: it may be the one that watches a
        // replaced inbox again (`WatchEvent::Lost`), which `receive` does not.
        self.intake.scanned_running.remove(&agent);
        let owed = self.intake.owed.remove(&agent);
        let waiting = self.receive(&agent).unwrap_or_default();
        if owed {
            let now = self.clock.now();
            let (core, tally) = (&mut self.core, &mut self.tally);
            intake::skip_for_running(core, &self.root, tally, &agent, &waiting, now);
        }
        self.core.session_ended(&agent, waiting, self.clock.now());
        match (&cfg, &limit) {
            (Some(cfg), Some(_)) => self.after_usage_limit(&agent, cfg),
            (Some(cfg), None) => {
                if let Some(group) = self.economy.session_ended(&agent, cfg, succeeded) {
                    self.released(&group);
                }
                let login = verdict.code == Some(Code::AgentLoginRequired);
                self.apply_verdict(&agent, cfg, Some(&sid), verdict, &report);
                if login {
                    let now = self.clock.now();
                    let check =
                        self.economy
                            .login_failed(&self.root, &self.config, &agent, cfg, now);
                    if let Some(group) = check {
                        self.economy
                            .start_check(&self.config, &self.root, &self.tx, &group);
                    }
                }
            }
            (None, _) => {}
        }
        publish::refresh_rank(&self.root, &mut self.core, &agent);
        if !self
            .config
            .agents
            .iter()
            .any(|a| a.name == agent && a.kind == AgentKind::Agent)
        {
            self.core.remove(&agent);
        }
    }

    /// Carry out what the verdict decided (a retry, a backoff, disabling the
    /// agent, or clearing its failures), then raise its error. In that
    /// order: whoever reacts to the error (errors.jsonl, journald, the
    /// on-error hook, the human mailbox) and then reads report.json finds
    /// the agent's state that goes with it, never the session's end without
    /// its verdict.
    pub(super) fn apply_verdict(
        &mut self,
        agent: &AgentName,
        cfg: &AgentConfig,
        session_id: Option<&str>,
        verdict: failure::Verdict,
        report: &RunReport,
    ) {
        let record = verdict_record(&self.root, agent, session_id, &verdict, report);
        let escalate = verdict.escalate;
        let _ = cfg;
        self.carry_out_verdict(agent, verdict);
        if let Some(record) = record {
            self.raise(record, escalate);
        }
    }

    /// The state a verdict decided, in the core and in report.json (the
    /// error, its state and the next wake in one write).
    fn carry_out_verdict(&mut self, agent: &AgentName, verdict: failure::Verdict) {
        let now = self.clock.now();
        let failures = self.streaks.get(agent).map(|s| s.failures).unwrap_or(0);
        if !self.core.contains(agent) {
            return;
        }
        let mut set = |f: &dyn Fn(&mut crate::daemon::core::AgentSlot)| {
            if let Some(mut slot) = self.core.slot_mut(agent) {
                f(&mut slot);
            }
        };
        let (state, until) = match verdict.next {
            Next::Nothing => return,
            Next::Clear => {
                set(&|s| s.backoff_until = None);
                self.escalated.clear(Some(agent));
                self.published
                    .publish_agent(&self.root, &self.core, self.clock.now(), agent, None);
                return;
            }
            Next::Retry { after } => {
                let at = crate::clock::later(now, after);
                set(&|s| s.backoff_until = Some(at));
                self.core
                    .request(agent, WakeReason::Retry, Priority::Normal, now);
                tracing::info!(agent = %agent, "retrying in {}", humantime::format_duration(after));
                (ErrorState::Retrying, Some(at))
            }
            Next::Backoff { hold } => {
                let at = crate::clock::later(now, hold);
                set(&|s| s.backoff_until = Some(at));
                tracing::warn!(agent = %agent, "{failures} failed session(s) in a row: automatic wakes held back until {}", Timestamp::from_datetime(at));
                (ErrorState::Backoff, Some(at))
            }
            Next::Disable => {
                let why = verdict.message.clone();
                set(&|s| s.disabled = Some(why.clone()));
                if matches!(
                    verdict.code,
                    Some(Code::AgentNotFound | Code::AgentPermissionDenied)
                ) {
                    // The command is checked again by itself (runnable.rs):
                    // the message says when.
                    tracing::error!(agent = %agent, "held: {}", verdict.message);
                } else {
                    tracing::error!(agent = %agent, "disabled until the config is reloaded or `agent-state wake {agent}` is run: {}", verdict.message);
                }
                (ErrorState::Disabled, None)
            }
        };
        let since = publish::report_error_since(&self.root, agent);
        let error = ReportError {
            code: verdict
                .code
                .map(|c| c.as_str().to_string())
                .unwrap_or_default(),
            message: verdict.message,
            failures,
            state,
            until: until.map(Timestamp::from_datetime),
            since: Some(since.unwrap_or_else(|| Timestamp::from_datetime(now))),
        };
        self.published
            .publish_agent(&self.root, &self.core, self.clock.now(), agent, Some(error));
    }
}

/// A session printed nothing for `stall_timeout`.
/// (Returns the record to raise: none if it is not running.)
pub(super) fn session_stalled(
    running: Option<&Running>,
    cfg: Option<&AgentConfig>,
    agent: &AgentName,
    silent_for: Duration,
) -> Option<ErrorRecord> {
    let running = running.filter(|r| !r.recording)?;
    let action = cfg.map(|c| c.session.stall_action).unwrap_or_default();
    let then = match action {
        crate::config::StallAction::Warn => "it goes on (stall_action = \"warn\")",
        crate::config::StallAction::Stop => "ending it (stall_action = \"stop\")",
    };
    let record = ErrorRecord::new(
        Code::SessionStalled,
        format!(
            "{agent}: session {} printed nothing for {}; {then}",
            running.session_id,
            humantime::format_duration(silent_for)
        ),
    )
    .agent(agent)
    .session(running.session_id.clone());
    Some(record)
}

/// A session this daemon began that is not running (its end could not
/// be written): recorded as an error now, its messages returned.
/// (Returns the record to raise; the orphan's owner lock is dropped from
/// `orphan_locks` once its end is recorded.)
pub(super) fn finish_orphan(
    root: &StateRoot,
    orphan_locks: &mut BTreeMap<AgentName, crate::owner::OwnerLock>,
    agent: &AgentConfig,
    session_id: &str,
    now: Timestamp,
) -> Option<ErrorRecord> {
    let dir = root.agent(&agent.name);
    let req = hooks::FailRequest {
        session: Some(session_id.to_string()),
        outcome: "error".into(),
        reason: "interrupted: its end could not be recorded when it ended (see errors.jsonl)"
            .into(),
        ..hooks::FailRequest::default()
    };
    match hooks::fail(agent, &dir, &req, now) {
        Ok(r) => {
            orphan_locks.remove(&agent.name);
            Some(
            ErrorRecord::new(
                Code::SessionInterrupted,
                format!(
                    "{}: session {session_id} ended while its end could not be written; recorded now, {} message(s) returned",
                    agent.name,
                    r.returned.len()
                ),
            )
            .agent(&agent.name)
            .session(session_id.to_string()),
        )
        }
        Err(e) => {
            tracing::warn!(agent = %agent.name, session_id, "cannot record the end of session {session_id} yet: {e}");
            None
        }
    }
}

impl Running {
    /// A signal from a running session: carry it out, or log it as invalid.
    /// (Returns the error to raise, if it could not be carried out.)
    pub(super) fn signal(
        &mut self,
        root: &StateRoot,
        config: &Config,
        agent: &AgentName,
        signal: crate::protocol::signals::SignalResult,
    ) -> Option<ErrorRecord> {
        let running = self;
        let (session_id, instance) = (running.session_id.clone(), running.instance.clone());
        if let Ok(s) = &signal {
            if s.kind() == crate::protocol::signals::SignalType::Complete {
                running.completed_by_signal = true;
            }
            // The same progress again changes nothing.
            if s.kind() == crate::protocol::signals::SignalType::Progress {
                if s.progress() == running.last_progress {
                    return None;
                }
                running.last_progress = s.progress();
            }
        }
        running.signals_seen += 1;
        if running.signals_seen > SIGNALS_PER_SESSION {
            if running.signals_seen == SIGNALS_PER_SESSION + 1 {
                tracing::warn!(
                    agent = %agent, session_id = %session_id,
                    "more than {SIGNALS_PER_SESSION} signals in one session: the rest are ignored (COMPLETE still counts)"
                );
            }
            return None;
        }
        let may_fan_out = running.global_discoveries < effects::GLOBAL_DISCOVERIES_PER_SESSION;
        if matches!(&signal, Ok(s) if s.kind() == crate::protocol::signals::SignalType::DiscoveryGlobal)
        {
            running.global_discoveries += 1;
        }
        let origin = effects::Origin {
            may_fan_out,
            agent,
            session_id: &session_id,
            instance: &instance,
        };
        let now = Timestamp::now();
        match signal {
            Err(e) => effects::record_invalid(root, &origin, &e, now),
            Ok(s) => match effects::apply(root, config, &origin, &s, now) {
                Ok(effect) => tracing::info!(
                    agent = %agent, session_id = %session_id,
                    "signal {}: {effect}", s.raw()
                ),
                Err(e) => {
                    return Some(
                        ErrorRecord::new(
                            e.code(),
                            format!("{agent}: cannot carry out the signal {}", s.raw()),
                        )
                        .details(e.to_string())
                        .agent(agent)
                        .session(session_id.clone()),
                    );
                }
            },
        }
        None
    }
}

/// The verdict on a session that never ran (nothing to finish), `code`
/// naming its error; the caller applies it with
/// `RunReport::not_run(ending)`.
pub(super) fn judge_not_run(
    streaks: &mut BTreeMap<AgentName, Streak>,
    agent: &AgentName,
    cfg: &AgentConfig,
    ending: &Ending,
    output: &OutputSummary,
    code: Option<Code>,
    now: chrono::DateTime<chrono::Utc>,
) -> failure::Verdict {
    let streak = streaks.entry(agent.clone()).or_default();
    let mut verdict = failure::judge(
        &Observed {
            ending,
            empty: output.empty,
            fingerprint: output.fingerprint,
            claude: None,
            ended_by_script: false,
            failed_by_script: None,
            incomplete: false,
            now,
            oom: None,
            invalid_commits: None,
        },
        streak,
        &cfg.session.retries,
    );
    if let (Some(c), Some(_)) = (code, verdict.code) {
        verdict.code = Some(c);
    }
    verdict
}

/// The error a verdict raises, if any: its code and message, the attempt,
/// the ending, and where the session's log is.
fn verdict_record(
    root: &StateRoot,
    agent: &AgentName,
    session_id: Option<&str>,
    verdict: &failure::Verdict,
    report: &RunReport,
) -> Option<ErrorRecord> {
    verdict.code.map(|code| {
        let mut record = ErrorRecord::new(code, format!("{agent}: {}", verdict.message))
            .agent(agent)
            .attempt(verdict.attempt)
            .details(if verdict.message.contains(&report.ending.to_string()) {
                // The ending is the message already (a command that could
                // not start): not said twice.
                format!("{} bytes of output", report.output_bytes)
            } else {
                format!("{}; {} bytes of output", report.ending, report.output_bytes)
            });
        if let Some(sid) = session_id {
            record = record.session(sid);
        }
        if let (Some(sid), Some(_)) = (session_id, report.pid) {
            record = record.suggest(format!(
                "Read the session log: {}",
                root.agent(agent)
                    .sessions_dir()
                    .join(format!("{sid}.log"))
                    .display()
            ));
        }
        record
    })
}

/// A session was OOM-killed: one session fewer at once for
/// `daemon.oom_lower_for` (seed 002: "reduce maxParallel"), kept in
/// `.daemon/oom.json` so that a restart or a crash within that time does
/// not forget it.
fn oom_killed(
    core: &mut crate::daemon::core::Core,
    root: &StateRoot,
    lower_for: std::time::Duration,
    agent: &AgentName,
    sid: &str,
    now: chrono::DateTime<chrono::Utc>,
) {
    let Some(until) = crate::daemon::memory::lowered_until(now, lower_for) else {
        return;
    };
    core.oom_lowered_until = Some(until);
    let until = Timestamp::from_datetime(until);
    tracing::warn!(
        agent = %agent, session_id = %sid,
        "the OOM killer ended a session: at most {} session(s) at once (max_concurrent_sessions = {}) until {until}",
        core.concurrent_limit(now),
        core.max_concurrent,
    );
    // Fields a later version (or a human) added are kept.
    let extra = files::read_oom_lowering(root)
        .ok()
        .flatten()
        .map(|o| o.extra)
        .unwrap_or_default();
    let saved = files::OomLowering {
        lowered_until: until,
        oom_at: Some(Timestamp::from_datetime(now)),
        agent: Some(agent.to_string()),
        session_id: Some(sid.to_string()),
        extra,
    };
    if let Err(e) = files::write_oom_lowering(root, &saved) {
        tracing::warn!(
            error_code = %e.code(),
            "cannot save the lowered limit: {e}; a restart before {until} forgets it"
        );
    }
}

/// At start: the limit an OOM kill lowered before the restart (or crash),
/// from `.daemon/oom.json`, while it still holds at `now`
/// ([`crate::daemon::memory::lowered_at_start`]). A damaged file is a
/// warning naming it, and the limit as configured; never a failed start.
pub(super) fn saved_oom_lowering(
    root: &StateRoot,
    lower_for: std::time::Duration,
    max_concurrent: usize,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let saved = match files::read_oom_lowering(root) {
        Ok(saved) => saved?,
        Err(e) => {
            // Not `check --repair`'s business: the file is written anew at
            // the next OOM kill, and nothing else reads it.
            let why = match &e {
                crate::error::Error::Corrupt { path, reason } => {
                    format!("{} is damaged ({reason})", path.display())
                }
                other => other.to_string(),
            };
            tracing::warn!(
                error_code = %e.code(),
                "{why}; starting with max_concurrent_sessions as configured (a limit an OOM kill lowered is forgotten); the file is replaced at the next OOM kill, or remove it"
            );
            return None;
        }
    };
    let until =
        crate::daemon::memory::lowered_at_start(Some(saved.lowered_until.0), now, lower_for)?;
    tracing::warn!(
        "an OOM kill before this start ({}) lowered the limit: at most {} session(s) at once (max_concurrent_sessions = {max_concurrent}) until {}",
        files::oom_path(root).display(),
        crate::daemon::memory::concurrent_limit(max_concurrent, Some(until), now),
        Timestamp::from_datetime(until)
    );
    Some(until)
}

/// Remove `agent`'s remote session record if it names session `sid`.
pub(super) fn forget_remote(root: &StateRoot, agent: &AgentName, sid: &str) {
    use crate::daemon::adopt;
    match adopt::read(root, agent) {
        Ok(Some(r)) if r.session_id != sid => return,
        Ok(None) => return,
        _ => {}
    }
    if let Err(e) = adopt::remove(root, agent) {
        tracing::warn!(agent = %agent, session_id = %sid, "cannot remove {}: {e}", adopt::path(root, agent).display());
    }
}
