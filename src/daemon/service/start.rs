//! Starting sessions: recovery of sessions left running at start, a wake
//! turned into a begun session and a spawned runner, and the bounded wait
//! for an agent's lock (busy: the agent's work is deferred, never the loop).

use super::*;
use crate::daemon::remote;

/// How long recovery at start waits for an agent's lock.
pub(super) const RECOVERY_WAIT: Duration = Duration::from_secs(5);

/// How long work deferred by a busy agent lock waits before it is tried again.
pub(super) const LOCK_RETRY: Duration = Duration::from_secs(2);

impl Daemon {
    pub(super) fn start(&mut self, agent: &AgentName, reason: WakeReason) {
        let Some(cfg) = self.agent_config(agent).cloned() else {
            self.core
                .session_ended(agent, InboxSummary::default(), self.clock.now());
            return;
        };
        // A command that cannot be executed claims nothing: the messages
        // wait, untouched, until it can run.
        if self.refuse_unrunnable(agent, &cfg, reason) {
            return;
        }
        // A big inbox (a flood of junk beside the mail: its listing costs
        // tens of milliseconds) is listed on a blocking thread first, the
        // slot kept meanwhile; the start goes on when the listing is back
        // (`inbox_listed`), and the claim goes through its names. A small
        // one is listed by the claim, on the loop (a thread hop would cost
        // every wake about 1 ms).
        // Back-to-back sessions of such an agent (a flood of wake requests)
        // reuse the listing while no message has arrived since.
        let listed = match self.intake.listed.remove(agent) {
            Some(listed) => listed,
            None if inbox::is_big(&self.root.agent(agent)) => {
                match self.intake.reusable_listing(agent) {
                    Some(l) => Some(l),
                    None => {
                        self.intake.list_inbox(&self.root, &self.tx, agent, reason);
                        return;
                    }
                }
            }
            None => None,
        };
        if !self.economy_allows(agent, &cfg, reason) {
            return;
        }
        let now = Timestamp::from_datetime(self.clock.now());
        // Never join a session of our own whose end was not recorded.
        if let Ok(Some(s)) = self.root.agent(agent).read::<Session>()
            && s.is_running()
            && began_here(&s)
        {
            let record =
                ending::finish_orphan(&self.root, &mut self.orphan_locks, &cfg, &s.session_id, now);
            self.raise_each(record);
            if matches!(self.root.agent(agent).read::<Session>(), Ok(Some(s)) if s.is_running()) {
                tracing::warn!(agent = %agent, "{} wake deferred: the end of session {} is not recorded yet", reason.as_str(), s.session_id);
                self.core
                    .defer(self.clock.now(), agent, reason, self.config.health.interval);
                return;
            }
        }
        let wait = self.lock_busy.wait(agent);
        let writing = self.intake.writing.get(agent).cloned().unwrap_or_default();
        let continue_conversation = conversation_to_continue(&self.root.agent(agent), &cfg, reason);
        let prepared = match session::prepare(
            &self.config,
            &cfg,
            &self.root.clone().with_lock_wait(wait),
            now,
            session::InboxSeen {
                writing: writing.clone(),
                known: self.intake.known.get(agent).cloned(),
                listed: listed.clone(),
            },
            continue_conversation.clone(),
        ) {
            Ok(p) => {
                self.lock_busy.free(agent);
                p
            }
            Err(Error::SessionBusy { session, pid, .. }) => {
                // A session script run by something else (cron) holds it.
                tracing::info!(agent = %agent, session_id = %session, "{} wake skipped: session {session} is running (pid {pid}) outside the daemon", reason.as_str());
                publish::journal(
                    &self.root,
                    agent,
                    journal::Event::WakeSkipped(WakeSkipped {
                        reason: reason.as_str().to_string(),
                        running_session: session,
                        ..Default::default()
                    }),
                );
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                return;
            }
            Err(e @ Error::LockBusy { .. }) => {
                // Somebody holds the agent's lock: try again shortly, not
                // a failure of the agent.
                self.lock_busy
                    .busy(agent, &format!("{} wake deferred: {e}", reason.as_str()));
                self.core.defer(self.clock.now(), agent, reason, LOCK_RETRY);
                return;
            }
            Err(e) => {
                // Nothing ran: judged like a failed spawn (retried with
                // backoff), recorded under the code of what went wrong.
                let code = match e.code() {
                    Code::IoError | Code::StateCorrupt => Code::AgentSpawnFailed,
                    other => other,
                };
                let ending = Ending::SpawnFailed {
                    reason: format!("cannot begin a session: {e}"),
                    kind: runner::SpawnFailure::Other,
                };
                self.core
                    .session_ended(agent, InboxSummary::default(), self.clock.now());
                let verdict = ending::judge_not_run(
                    &mut self.streaks,
                    agent,
                    &cfg,
                    &ending,
                    &OutputSummary::none(),
                    Some(code),
                    self.clock.now(),
                );
                let report = RunReport::not_run(ending.clone());
                self.apply_verdict(agent, &cfg, None, verdict, &report);
                if matches!(code, Code::DiskFull | Code::FsReadonly) {
                    self.check_health(true);
                    // An operator who installs or `chmod +x`es a held agent's command
                    // need do nothing else: it is released within one interval.
                    self.recheck_unrunnable();
                }
                return;
            }
        };
        tracing::info!(
            agent = %agent,
            session_id = %prepared.session_id,
            instance = %prepared.instance,
            "session {} started ({}), instance {}",
            prepared.session_id,
            reason.as_str(),
            prepared.instance
        );
        *self
            .tally
            .wakes
            .entry((agent.clone(), reason.as_str()))
            .or_default() += 1;
        self.tally
            .claimed
            .insert(agent.clone(), prepared.claimed.len());
        for r in &prepared.rejected {
            *self.tally.rejected.entry(agent.clone()).or_default() += 1;
            self.raise(
                rejected(agent, r).session(prepared.session_id.clone()),
                false,
            );
        }
        self.core.session_started(agent, &prepared.session_id);
        self.economy.manual_refusals.remove(agent);
        let (mut running, side) = Running::begun(
            Begun {
                session_id: prepared.session_id.clone(),
                instance: prepared.instance.clone(),
                started_at: now,
                owner_lock: prepared.owner_lock,
                claimed: prepared.claimed,
                conversation: Some(prepared.conversation.clone()),
            },
            &cfg,
            self.streaks.get(agent).cloned().unwrap_or_default(),
            self.session_clock,
        );
        // On this host, or on a worker (`[cluster]`, `local_sessions =
        // false`, and the agent's `runs_on` is not "controller").
        let remote = self
            .remote
            .clone()
            .filter(|_| cfg.session.runs_on == crate::config::RunsOn::Workers);
        running.on_worker = remote.is_some();
        self.running.insert(agent.clone(), running);
        let orders_rx = side.orders.clone();
        let tx = self.tx.clone();
        let name = agent.clone();
        let dir = self.root.agent(agent);
        // Its script's own `session end|fail`, heard as it happens (else
        // only at its exit).
        if let Err(e) = self.watcher.watch_session(agent, &dir.path) {
            tracing::warn!(agent = %agent, session_id = %prepared.session_id, "its script's own session end is heard only when it exits: {e}");
        }
        let session_id = prepared.session_id.clone();
        // Spawned here, in the loop: the agent runs before the loop goes on
        // to other agents and to publishing (daemon.json, STATUS=). Its
        // start is committed already (the journal line of `session begin`).
        // With a workspace, its worktree is made first, in the session's
        // task (git may wait seconds for a lock; the loop never does).
        let planned = prepared.workspace;
        // With `verify`, later iterations start from the first one's spec.
        let again = (!cfg.session.iteration.verify.is_empty()).then(|| prepared.spec.clone());
        let resume_argv = prepared.resume_argv.clone();
        let iteration_store = dir.store.clone();
        let target = remote.map(|remote| {
            let keep = remote::Keep {
                root: self.root.clone(),
                agent: agent.clone(),
                session_id: session_id.clone(),
            };
            let (tx, agent) = (self.tx.clone(), agent.clone());
            remote::Target {
                remote,
                group: cfg.session.credential.clone(),
                on_host: std::sync::Arc::new(move |host| {
                    let agent = agent.clone();
                    let _ = tx.send(Event::SessionHost { agent, host });
                }),
                keep,
                // On a worker, which makes the worktree itself.
                workspace: planned.clone(),
                verify: again.is_some(),
            }
        });
        let (launched, spec) = match (&planned, &target) {
            (Some(_), None) => (None, Some(prepared.spec)),
            _ => (
                Some(remote::launch(prepared.spec, &orders_rx, target.as_ref())),
                None,
            ),
        };
        if let Some(Ok(_)) = &launched
            && let Some(r) = self.running.get_mut(agent)
        {
            // Its run starts now: its timeout from now.
            r.feed(machine::Event::Launched);
        }
        if let Some(Err(report)) = &launched
            && !crate::daemon::runnable::counts_as_attempt(&report.ending)
        {
            unrunnable::note_unrunnable_spawn(
                &self.config,
                &self.root,
                &mut self.unrunnable,
                agent,
                &cfg,
            );
        }
        tokio::spawn(async move {
            let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<u32>();
            let pid_forward = {
                let tx = tx.clone();
                let name = name.clone();
                async move {
                    if let Ok(pid) = pid_rx.await {
                        let _ = tx.send(Event::SessionPid { agent: name, pid });
                    }
                }
            };
            let mut made: Option<crate::workspace::Workspace> = None;
            let mut fp0: Option<String> = None;
            let launched = match (launched, spec, planned) {
                (Some(l), _, _) => l,
                (None, Some(spec), Some(plan)) => {
                    let repo = plan.repo.clone();
                    match tokio::task::spawn_blocking(move || workspaces::create(&plan)).await {
                        Ok(Ok(ws)) => {
                            if again.is_some() {
                                let p = ws.path.clone();
                                fp0 = tokio::task::spawn_blocking(move || {
                                    crate::workspace::fingerprint(&p).ok()
                                })
                                .await
                                .ok()
                                .flatten();
                            }
                            tracing::info!(agent = %name, session_id = %session_id, "workspace {} on branch {} (from {} of {})", ws.path.display(), ws.branch, &ws.base_commit[..ws.base_commit.len().min(12)], repo.display());
                            made = Some(ws);
                            remote::launch(spec, &orders_rx, target.as_ref())
                        }
                        Ok(Err(e)) => Err(Box::new(RunReport::not_run(Ending::SpawnFailed {
                            reason: format!("the session's workspace could not be made: {e}"),
                            kind: runner::SpawnFailure::Workspace(workspaces::code_of(&e)),
                        }))),
                        Err(e) => Err(Box::new(RunReport::not_run(Ending::SpawnFailed {
                            reason: format!("the session's workspace could not be made: {e}"),
                            kind: runner::SpawnFailure::Workspace(Code::WorkspaceFailed),
                        }))),
                    }
                }
                _ => unreachable!("a session is launched now or has a workspace plan"),
            };
            let settings = cfg.session.iteration.clone();
            let repo = cfg.session.workspace.as_ref().map(|w| w.repo.clone());
            let mut observer = Observer::new(cfg, dir, session_id, tx.clone(), &side);
            let orders_again = orders_rx.clone();
            let run = async {
                match launched {
                    Ok(l) => l.run(&mut observer, orders_rx, Some(pid_tx)).await,
                    Err(report) => *report,
                }
            };
            let (mut report, ()) = tokio::join!(run, pid_forward);
            let mut tally = iterations::Tally {
                count: 1,
                ..Default::default()
            };
            if let Some(spec) = again {
                let plan = iterations::Plan {
                    settings: &settings,
                    spec,
                    agent: &name,
                    tx: &tx,
                    workspace: made.as_ref().map(|w| (w.path.clone(), fp0.clone())),
                    resume_argv,
                    store: iteration_store,
                };
                report =
                    iterations::more(report, plan, &mut observer, orders_again, &mut tally).await;
            }
            observer.finish();
            let output = observer.summary();
            // Its worktree judged (and removed when it holds nothing); on
            // a worker, by the worker.
            let workspace = match (made, repo) {
                (Some(ws), Some(repo)) => {
                    tokio::task::spawn_blocking(move || workspaces::finish(&repo, &ws))
                        .await
                        .ok()
                        .map(Box::new)
                }
                _ => report.workspace.take(),
            };
            let _ = tx.send(Event::SessionDone {
                agent: name,
                report: Box::new(report),
                output: Box::new(output),
                workspace,
                iterations: tally,
            });
        });
    }

    /// A big inbox's listing is back: its session starts now (unless the
    /// daemon is stopping, or the agent went away meanwhile).
    pub(super) fn inbox_listed(
        &mut self,
        agent: AgentName,
        reason: Option<WakeReason>,
        listed: Option<std::sync::Arc<inbox::Listed>>,
        arrivals: u64,
    ) {
        if let Some(l) = &listed {
            self.intake
                .reusable
                .insert(agent.clone(), (arrivals, l.clone()));
        }
        let Some(reason) = reason else {
            // For a scan: made at the next loop turn, through this listing
            // while no message has arrived since (else on the loop, as
            // for a small inbox).
            self.intake.scan_listing.remove(&agent);
            if self.core.contains(&agent) {
                self.intake.dirty.insert(agent);
            }
            return;
        };
        self.intake.listing.remove(&agent);
        let ours = self
            .core
            .slot(&agent)
            .is_some_and(|s| s.running.as_deref() == Some(""));
        if !ours {
            return;
        }
        if self.stopping.is_some() {
            self.core
                .session_ended(&agent, InboxSummary::default(), self.clock.now());
            return;
        }
        self.intake.listed.insert(agent.clone(), listed);
        self.start(&agent, reason);
    }
}

/// A session's marker in its processes' environment (`AGENT_STATE_RUN`).
type Marker = (String, String);

/// An agent's recovery at start: a torn journal noted, the processes of a
/// session of a daemon that died ended, a session left running recorded,
/// messages claimed by no running session returned. The errors to raise.
fn recover_agent(agent: &AgentConfig, root: &StateRoot, remote: bool, now: Timestamp) -> Recovered {
    let dir = &root.agent(&agent.name);
    let mut records = Vec::new();
    let mut swept = None;
    if !crate::fsx::is_dir(&dir.path) {
        return (records, swept, None);
    }
    // A crash in the middle of an append leaves a torn last line:
    // readers skip it and the next append starts on a fresh line.
    if crate::state::journal::ends_torn(&dir.journal()) {
        records.push(
            ErrorRecord::new(
                Code::JournalTorn,
                format!(
                    "{}: the journal's last line is incomplete (a crash mid-append); it is skipped",
                    agent.name
                ),
            )
            .details(dir.journal().display().to_string())
            .agent(&agent.name),
        );
    }
    // A daemon killed outright (SIGKILL, OOM) leaves its sessions'
    // processes running: end them before their session is recorded,
    // or the agent would run twice.
    let session = dir.read::<Session>();
    // A session on a worker that may still run (cluster mode): followed
    // again, not recorded interrupted (see `daemon::adopt`).
    if let Some(record) = remote_at_start(agent, root, remote, &session, &mut records) {
        return (records, None, Some(record));
    }
    if let Ok(Some(s)) = &session
        && hooks::stale(dir, s, agent.session.timeout, now).is_some()
        && let Some(owner) = s.owner_pid
    {
        let marker = (
            "AGENT_STATE_RUN".to_string(),
            format!("{owner}:{}:{}", agent.name, s.session_id),
        );
        let killed = runner::kill_marked(&marker);
        if killed > 0 {
            tracing::warn!(agent = %agent.name, session_id = %s.session_id, "killed {killed} process(es) left running by the session of a daemon that died (pid {owner})");
        }
        swept = Some(marker);
    }
    // Recovery at start may wait longer for a lock than the loop
    // does (a hook of a script still finishing on a loaded machine),
    // but never without a bound: a lock held for good still lets the
    // daemon start, and that agent's recovery is retried later.
    // Nothing to recover (nearly every agent): no lock at all.
    if !nothing_to_recover(dir, session) {
        let result = hooks::recover_stale(
            agent,
            &dir.clone().with_lock_wait(RECOVERY_WAIT),
            "interrupted: daemon restarted",
            now,
        );
        records.extend(recovered(agent, result, "the daemon restarted"));
    }
    // Messages claimed by sessions that are not running go back (or, with
    // the lock held past the wait, at the health monitor's next check).
    match return_orphan_claims(dir, RECOVERY_WAIT, now) {
        Ok(returned) => log_returned(&agent.name, &returned, "the daemon restarted"),
        Err(e) => tracing::warn!(
            agent = %agent.name,
            "{}: messages claimed by a session that is not running stay claimed for now ({e}); the health monitor returns them at its next check",
            agent.name
        ),
    }
    (records, swept, None)
}

/// What an agent's recovery at start came to: the errors to raise, the
/// marker of a dead daemon's session to sweep again, a remote session to
/// adopt.
type Recovered = (
    Vec<ErrorRecord>,
    Option<Marker>,
    Option<crate::daemon::adopt::RemoteRecord>,
);

/// `agent`'s remote session record at start ([`adopt::at_start`]): the
/// record of a session to adopt, or `None` (the record removed when it
/// served, its problems noted in `records`).
fn remote_at_start(
    agent: &AgentConfig,
    root: &StateRoot,
    remote: bool,
    session: &Result<Option<Session>>,
    records: &mut Vec<ErrorRecord>,
) -> Option<crate::daemon::adopt::RemoteRecord> {
    use crate::daemon::adopt::{self, AtStart};
    let record = match adopt::read(root, &agent.name) {
        Ok(r) => r,
        Err(e) => {
            records.push(
                ErrorRecord::new(Code::StateCorrupt, format!("{}: {e}", agent.name))
                    .agent(&agent.name),
            );
            let _ = adopt::remove(root, &agent.name);
            return None;
        }
    };
    let session = session.as_ref().ok().and_then(Option::as_ref);
    let end_journaled = session.filter(|s| s.is_running()).is_some_and(|s| {
        matches!(
            hooks::journaled_end(&root.agent(&agent.name), &s.session_id),
            Ok(Some(_))
        )
    });
    let mode = adopt::Mode {
        remote,
        verify: !agent.session.iteration.verify.is_empty(),
        end_journaled,
    };
    let forget = match adopt::at_start(session, record, mode) {
        AtStart::Adopt(record) => return Some(record),
        AtStart::Recover { forget } => forget,
        AtStart::Cannot { why, forget } => {
            tracing::warn!(agent = %agent.name, "{why}: recorded interrupted; its worker ends it when its lease is fenced or it ends by itself");
            forget
        }
    };
    if forget && let Err(e) = adopt::remove(root, &agent.name) {
        tracing::warn!(agent = %agent.name, "cannot remove {}: {e}", adopt::path(root, &agent.name).display());
    }
    None
}

/// Return to the inbox, without counting an attempt, the messages claimed
/// by sessions that are not running: a session of a daemon that died, or of
/// a script killed between its `session begin` and its end. Under the
/// agent's lock (waited for at most `wait`), so session.json reads as the
/// hooks leave it and the one session it names as running keeps its
/// claims. Returns the sessions whose messages went back.
pub(super) fn return_orphan_claims(
    dir: &AgentDir,
    wait: Duration,
    now: Timestamp,
) -> Result<Vec<String>> {
    if inbox::claimed_sessions(dir)?.is_empty() {
        return Ok(Vec::new());
    }
    let _lock = dir.lock_within(wait)?;
    let running = dir
        .read::<Session>()?
        .filter(|s| s.is_running())
        .map(|s| s.session_id);
    let mut returned = Vec::new();
    for sid in inbox::claimed_sessions(dir)? {
        if running.as_deref() == Some(sid.as_str()) {
            continue;
        }
        inbox::return_claimed_counting(dir, &sid, now, false)?;
        returned.push(sid);
    }
    Ok(returned)
}

/// One log line per session whose claimed messages went back.
pub(super) fn log_returned(agent: &AgentName, sessions: &[String], why: &str) {
    for sid in sessions {
        tracing::info!(
            agent = %agent,
            session_id = %sid,
            "{agent}: messages claimed by session {sid}, which is not running ({why}), returned to the inbox"
        );
    }
}

/// Whether [`hooks::recover_stale`] would find nothing to do for `dir`,
/// decided on reads without the agent's lock: no session running (`session`,
/// its session.json as read just before), report.json
/// not still naming the last session as current, metrics.json having counted
/// the journal's last session end. Each file is replaced whole, and they are
/// read in the order a session's end commits them (journal, session.json,
/// report.json, metrics.json), so an end under way reads as something to do;
/// anything unreadable or missing that the locked path would rebuild or mark
/// does too. At 10,000 agents the lock, its `flock` and the locked reads
/// were a third of a second start.
fn nothing_to_recover(dir: &AgentDir, session: Result<Option<Session>>) -> bool {
    use crate::state::StateDoc;
    let session = match session {
        Ok(Some(s)) if !s.is_running() => s,
        Ok(None) => Session::fresh(dir.name.as_str()),
        _ => return false,
    };
    match dir.read::<Report>() {
        Ok(Some(r)) if r.current_session.as_deref() == Some(session.session_id.as_str()) => {
            return false;
        }
        Ok(_) => {}
        Err(_) => return false,
    }
    // metrics::catch_up: the last end in the journal, counted already? A
    // start after it (journaled, its files not renamed in: a crash) is
    // something to do (`hooks::unrecorded_start`).
    let mut last_end = None;
    let mut started_last = false;
    if crate::state::journal::scan_backwards(&dir.store, &dir.journal(), |e| {
        if matches!(e.event, crate::state::journal::Event::SessionStart(_)) {
            started_last = true;
            return std::ops::ControlFlow::Break(());
        }
        match e.event.ended_session() {
            Some(id) => {
                last_end = Some(id.to_string());
                std::ops::ControlFlow::Break(())
            }
            None => std::ops::ControlFlow::Continue(()),
        }
    })
    .is_err()
        || started_last
    {
        return false;
    }
    let Some(last_end) = last_end else {
        return true;
    };
    matches!(
        dir.read::<crate::state::metrics::Metrics>(),
        Ok(Some(m)) if m.counted_session.as_deref() == Some(last_end.as_str())
    )
}

/// Did this daemon process begin `session`? By pid and start time: a
/// script in another PID namespace can have the daemon's pid, not also
/// its start time.
pub(super) fn began_here(session: &Session) -> bool {
    hooks::Owner::me().is(session.owner_pid, session.owner_start) && session.owner_start.is_some()
}

/// What recovering `agent`'s stale session came to: the error to raise (the
/// session was interrupted, or the recovery failed), or nothing when there
/// was nothing to do or its end had been journaled and was completed.
pub(super) fn recovered(
    agent: &AgentConfig,
    result: Result<Option<hooks::FinishResult>>,
    why: &str,
) -> Option<ErrorRecord> {
    match result {
        Ok(None) => None,
        Ok(Some(r)) if r.replayed => {
            tracing::warn!(
                agent = %agent.name,
                session_id = %r.session_id,
                "session {}: its end was journaled but not fully recorded ({why}); completed from the journal",
                r.session_id
            );
            None
        }
        Ok(Some(r)) => Some(
            ErrorRecord::new(
                Code::SessionInterrupted,
                format!(
                    "{}: session {} was left running ({why}); recorded as an error, {} message(s) returned to the inbox",
                    agent.name,
                    r.session_id,
                    r.returned.len()
                ),
            )
            .agent(&agent.name)
            .session(r.session_id.clone()),
        ),
        Err(e) => Some(
            ErrorRecord::new(e.code(), format!("{}: cannot finish a stale session ({why})", agent.name))
                .details(e.to_string())
                .agent(&agent.name),
        ),
    }
}

/// Agents whose lock was busy at the last try: logged once when that starts
/// and once when it ends, not at every retry.
#[derive(Default)]
pub(super) struct BusyLocks(std::collections::BTreeSet<AgentName>);

impl BusyLocks {
    /// Log that `agent`'s work waits for its lock: at warning level once,
    /// then quietly at every retry (every [`LOCK_RETRY`]).
    pub(super) fn busy(&mut self, agent: &AgentName, what: &str) {
        if self.0.insert(agent.clone()) {
            tracing::warn!(agent = %agent, error_code = "LOCK_BUSY", "{what}; retried every {}s, every other agent is served meanwhile", LOCK_RETRY.as_secs());
        } else {
            tracing::debug!(agent = %agent, error_code = "LOCK_BUSY", "{what}");
        }
    }

    /// How long to wait for `agent`'s lock: not at all if it was busy at
    /// the last try (a lock held for good must cost the loop nothing).
    pub(super) fn wait(&self, agent: &AgentName) -> Duration {
        if self.0.contains(agent) {
            Duration::ZERO
        } else {
            crate::state::lock::DAEMON_WAIT
        }
    }

    /// `agent`'s lock was had: say so if it had been busy.
    pub(super) fn free(&mut self, agent: &AgentName) {
        if self.0.remove(agent) {
            tracing::info!(agent = %agent, "its lock is free again; deferred work goes on");
        }
    }
}

/// With `resume`, what the next session may continue: a retry after a
/// timeout continues the timed-out session's conversation; a reply to
/// the last session's escalation (a message whose `source_ref` names
/// it, seen at the claim) continues that session's. Never one that
/// ended in a login or usage-limit failure (`claude_resumable`).
fn conversation_to_continue(
    dir: &AgentDir,
    cfg: &AgentConfig,
    reason: WakeReason,
) -> session::Continuation {
    let mut c = session::Continuation::default();
    if !cfg.session.iteration.resume {
        return c;
    }
    let Some(last) = dir.read::<Session>().ok().flatten() else {
        return c;
    };
    let resumable = last
        .extra
        .get("claude_resumable")
        .and_then(|v| v.as_bool())
        .unwrap_or(true);
    let Some(conversation) = last
        .extra
        .get("claude_session_id")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .filter(|_| resumable)
    else {
        return c;
    };
    if reason == WakeReason::Retry
        && last.status == Some(crate::state::session::SessionStatus::Timeout)
    {
        c.retry = Some(conversation);
    } else {
        c.reply = Some((last.session_id.clone(), conversation));
    }
    c
}

/// Sessions left `running` by a process that is gone (a previous daemon
/// killed, a crashed script) become errors; their messages go back.
/// (Returns the records to raise.)
pub(super) fn recover(
    config: &Config,
    root: &StateRoot,
) -> (
    Vec<ErrorRecord>,
    Vec<(AgentName, crate::daemon::adopt::RemoteRecord)>,
) {
    let now = Timestamp::now();
    let remote = config.cluster.as_ref().is_some_and(|c| !c.local_sessions);
    // Each agent's recovery touches its own files only: on a few
    // threads (at 10,000 agents this was a fifth of a start).
    let agents: Vec<&AgentConfig> = config.working_agents().collect();
    let recovered: Vec<Recovered> =
        crate::daemon::fanout::map(&agents, |agent| recover_agent(agent, root, remote, now));
    let mut records = Vec::new();
    let mut markers = Vec::new();
    let mut adopt = Vec::new();
    for ((r, m, a), agent) in recovered.into_iter().zip(&agents) {
        records.extend(r);
        markers.extend(m);
        adopt.extend(a.map(|a| (agent.name.clone(), a)));
    }
    // A child the dead daemon forked an instant before it died carries
    // its marker only once it has exec'd (until then /proc shows the
    // daemon's environment): every marker is swept again a little later,
    // twice, in one pass over /proc each.
    if !markers.is_empty() {
        let mut killed = 0;
        for pause in [30, 100] {
            std::thread::sleep(Duration::from_millis(pause));
            killed += runner::kill_marked_all(&markers);
        }
        if killed > 0 {
            tracing::warn!(
                "killed {killed} more process(es) of sessions of a daemon that died (they started late)"
            );
        }
    }
    (records, adopt)
}

/// A session just begun (by `session begin` or adopted from a previous
/// controller): what its [`Running`] starts from.
pub(super) struct Begun {
    pub(super) session_id: String,
    pub(super) instance: String,
    pub(super) started_at: Timestamp,
    pub(super) owner_lock: Option<crate::owner::OwnerLock>,
    pub(super) claimed: Vec<crate::inbox::Message>,
    pub(super) conversation: Option<(String, bool)>,
}

/// What a session's task shares with its [`Running`].
pub(super) struct TaskSide {
    pub(super) orders: watch::Receiver<runner::Orders>,
    pub(super) activity: std::sync::Arc<observer::Activity>,
    pub(super) stop_note: StopNote,
    pub(super) noted: observer::Noted,
}

impl Running {
    /// A session begun: its machine told so (on `clock`), nothing run yet.
    pub(super) fn begun(
        begun: Begun,
        cfg: &AgentConfig,
        streak: Streak,
        clock: SessionClock,
    ) -> (Running, TaskSide) {
        let (orders_tx, orders_rx) = watch::channel(runner::Orders::default());
        let stop_note = StopNote::default();
        let noted = observer::Noted::default();
        // Its lifecycle, fed live. Its output is told at its timers (the
        // stall timer); with `verify`, it orders the session's task what
        // follows each run and each verification (`iterations::more`).
        let activity = observer::Activity::new();
        let mut live = machine::Session::new(machine::Settings::of(cfg), streak);
        live.on(
            machine::Event::Begin {
                session_id: begun.session_id.clone(),
            },
            clock.now(),
        );
        let running = Running {
            session_id: begun.session_id,
            instance: begun.instance,
            pid: None,
            started_at: begun.started_at,
            began: clock.now(),
            machine: live,
            clock,
            timer: None,
            orders: orders_tx,
            activity: activity.clone(),
            output_seen: 0,
            stop_reason: None,
            stop_note: stop_note.clone(),
            noted: noted.clone(),
            completed_by_signal: false,
            signals_seen: 0,
            global_discoveries: 0,
            last_progress: None,
            owner_lock: begun.owner_lock,
            claimed: begun.claimed,
            conversation: begun.conversation,
            recording: false,
            decided: None,
            host: None,
            on_worker: false,
        };
        let side = TaskSide {
            orders: orders_rx,
            activity,
            stop_note,
            noted,
        };
        (running, side)
    }
}
