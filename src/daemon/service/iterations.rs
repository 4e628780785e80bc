//! The iteration loop of a session (issue 12, seed 000): after a run that
//! ended well, the agent's `verify` commands run in its working directory;
//! a failure starts the next iteration at once with the failure in its
//! prompt, until they pass, `max_iterations` is reached (`VERIFY_FAILED`)
//! or iterations stop changing the workspace (`SESSION_STUCK`, after one
//! nudge). What follows each run and each verification is its session's
//! machine's decision (issue 21): the session's task reports them to the
//! loop and carries out its order ([`Order`]); it computes only what needs
//! IO (the verification, the workspace's fingerprint). Never on the loop;
//! tells the loop which iteration and phase it is in (`Event::Iteration`).

use std::path::{Path, PathBuf};

use super::*;
use crate::config::IterationSettings;
use crate::daemon::runner::SessionSpec;
use crate::daemon::verify;

/// Said to an agent whose iterations changed nothing.
pub(super) const NUDGE: &str = "\nYour last iterations changed nothing in the workspace. \
Do not repeat them: find what you have not tried (read the failing output again, check \
your assumptions), make a change, or say why you cannot.\n";

/// How a session's iterations went.
#[derive(Debug, Clone, Default)]
pub(super) struct Tally {
    /// Iterations run (1 without `verify`).
    pub count: u32,
    pub verify_failures: u32,
    /// Claude Code's result of each run the loop saw, once per run (empty
    /// without `verify`: the session's output has the one run's).
    pub runs: Vec<ClaudeResult>,
    /// The session's stdout bytes when the last run's result was taken: a
    /// run that printed nothing adds no result (never the last one again).
    pub(super) stdout_seen: u64,
}

impl Tally {
    /// A run ended: its result, if it printed anything.
    pub(super) fn note_run(&mut self, output: &SessionOutput) {
        let bytes = output.stdout_bytes();
        if bytes > self.stdout_seen
            && let Some(result) = output.claude_result()
        {
            self.runs.push(result);
        }
        self.stdout_seen = bytes;
    }

    /// Each run's result, once: the loop's, or (without it) `last`, the
    /// session's output's.
    pub(super) fn results<'a>(&'a self, last: Option<&'a ClaudeResult>) -> Vec<&'a ClaudeResult> {
        if self.runs.is_empty() {
            last.into_iter().collect()
        } else {
            self.runs.iter().collect()
        }
    }
}

/// What the runs used in all, each once (pure): cost, tokens and their
/// breakdown, each `None` when no run reported it.
pub(super) fn usage_of(
    results: &[&ClaudeResult],
) -> (Option<f64>, Option<u64>, Option<output::Usage>) {
    let mut cost = None;
    let mut tokens = None;
    let mut usage: Option<output::Usage> = None;
    for r in results {
        if let Some(c) = r.total_cost_usd {
            cost = Some(cost.unwrap_or(0.0) + c);
        }
        if let Some(u) = r.usage {
            tokens = Some(tokens.unwrap_or(0u64).saturating_add(u.total()));
            let sum = usage.get_or_insert_with(Default::default);
            sum.input_tokens = sum.input_tokens.saturating_add(u.input_tokens);
            sum.output_tokens = sum.output_tokens.saturating_add(u.output_tokens);
            sum.cache_creation_input_tokens = sum
                .cache_creation_input_tokens
                .saturating_add(u.cache_creation_input_tokens);
            sum.cache_read_input_tokens = sum
                .cache_read_input_tokens
                .saturating_add(u.cache_read_input_tokens);
        }
    }
    (cost, tokens, usage)
}

/// What `more` needs besides the first run's report.
pub(super) struct Plan<'a> {
    pub settings: &'a IterationSettings,
    /// The first iteration's spec (prompt, log, cwd): later ones derive.
    pub spec: SessionSpec,
    pub agent: &'a AgentName,
    pub tx: &'a mpsc::UnboundedSender<Event>,
    /// The session's worktree, for stuck detection, and its fingerprint
    /// before the first iteration.
    pub workspace: Option<(PathBuf, Option<String>)>,
    /// With `resume`: later iterations continue the conversation.
    pub resume_argv: Option<Vec<String>>,
    /// The daemon's store, for the prompt file each iteration writes.
    pub store: crate::state::Store,
}

/// The log of iteration `n`: `sessions/ID.log`, then `ID.iter-N.log`.
pub(super) fn log_of(first: &Path, n: u32) -> PathBuf {
    if n <= 1 {
        return first.to_path_buf();
    }
    let name = first
        .file_name()
        .map(|f| f.to_string_lossy().trim_end_matches(".log").to_string())
        .unwrap_or_default();
    first.with_file_name(format!("{name}.iter-{n}.log"))
}

async fn fingerprint(path: &Path) -> Option<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || crate::workspace::fingerprint(&path).ok())
        .await
        .ok()
        .flatten()
}

/// What the loop orders a session's task after a run or a verification:
/// its machine's action ([`machine::Action::StartVerify`],
/// [`machine::Action::Launch`]), or nothing more (its record is decided, or
/// the machine is not the task's to ask any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    Verify,
    Launch { nudge: bool },
    Finish,
}

/// Send the loop an event that carries a reply, and wait for its order (a
/// loop gone, or an event dropped: nothing more).
async fn ask(
    tx: &mpsc::UnboundedSender<Event>,
    event: impl FnOnce(tokio::sync::oneshot::Sender<Order>) -> Event,
) -> Order {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if tx.send(event(reply)).is_err() {
        return Order::Finish;
    }
    answer.await.unwrap_or(Order::Finish)
}

/// The last 600 bytes of a failed verification's output (the give-up's
/// reason quotes them).
fn tail_of(t: &str) -> String {
    let t = t.trim_end();
    let start = t.len().saturating_sub(600);
    let start = (start..t.len())
        .find(|i| t.is_char_boundary(*i))
        .unwrap_or(t.len());
    t[start..].to_string()
}

/// After the first run: carry out what the session's machine orders. Each
/// run that ended well (or said COMPLETE) is reported to the loop
/// ([`Event::RunEnded`]), whose machine orders its verification or decides
/// the record; each verification is reported with whether the workspace
/// changed ([`Event::IterationVerified`]), and the machine orders the next
/// iteration (with the nudge or not) or decides the record (passed,
/// `VERIFY_FAILED`, `SESSION_STUCK`). Returns the last run's report;
/// `tally` counts the runs and the failed verifications.
pub(super) async fn more(
    mut report: RunReport,
    plan: Plan<'_>,
    observer: &mut Observer,
    orders: watch::Receiver<runner::Orders>,
    tally: &mut Tally,
) -> RunReport {
    let s = plan.settings;
    let (ws_path, mut last_fp) = match plan.workspace {
        Some((p, fp)) => (Some(p), fp),
        None => (None, None),
    };
    let mut n = 1u32;
    loop {
        tally.count = n;
        tally.note_run(&observer.output);
        // A run that failed, or one being stopped, is judged at the
        // session's end (with its usage limit, its worktree).
        let done = report.ending.is_success()
            || (observer.completed
                && !matches!(report.ending, Ending::Stopped | Ending::SpawnFailed { .. }));
        if s.verify.is_empty() || !done || orders.borrow().stop {
            return report;
        }
        let order = ask(plan.tx, |reply| Event::RunEnded {
            agent: plan.agent.clone(),
            report: Box::new(report.clone()),
            output: Box::new(observer.summary()),
            reply,
        })
        .await;
        if order != Order::Verify {
            return report;
        }
        let _ = plan.tx.send(Event::Iteration {
            agent: plan.agent.clone(),
            n,
            of: s.max_iterations,
            phase: Phase::Verifying,
        });
        let v = verify::run(&verify::Plan {
            commands: s.verify.clone(),
            cwd: plan.spec.cwd.clone(),
            timeout: s.verify_timeout,
            kill_grace: plan.spec.kill_grace,
            env: plan.spec.env.clone(),
            log: Some(log_of(&plan.spec.log_path, n)),
            stop: Some(orders.clone()),
        })
        .await;
        if v.stopped {
            // The daemon is stopping: the session ends as a stopped one.
            report.ending = Ending::Stopped;
            return report;
        }
        let verified = match v.failure() {
            None => {
                tracing::info!(agent = %plan.agent, "iteration {n}: verification passed");
                machine::Verified::Passed
            }
            Some(failed) => {
                tally.verify_failures += 1;
                tracing::warn!(agent = %plan.agent, "iteration {n}: verification failed: {}", failed.describe());
                // Without a workspace there is nothing to compare: changed.
                let changed_workspace = match &ws_path {
                    Some(p) => {
                        let fp = fingerprint(p).await;
                        let same = fp.is_some() && fp == last_fp;
                        last_fp = fp;
                        !same
                    }
                    None => true,
                };
                machine::Verified::Failed {
                    changed_workspace,
                    describe: failed.describe(),
                    tail: tail_of(&failed.tail),
                }
            }
        };
        let order = ask(plan.tx, |reply| Event::IterationVerified {
            agent: plan.agent.clone(),
            n,
            of: s.max_iterations,
            failure: v.failure().map(|f| f.describe()),
            verified,
            reply,
        })
        .await;
        let Order::Launch { nudge } = order else {
            return report;
        };
        n += 1;
        let mut feedback = verify::feedback(&v, n - 1, s.max_iterations);
        if nudge {
            feedback.push_str(NUDGE);
        }
        let mut spec = plan.spec.clone();
        spec.stdin = [plan.spec.stdin.as_slice(), b"\n\n", feedback.as_bytes()].concat();
        spec.log_path = log_of(&plan.spec.log_path, n);
        spec.iteration = n;
        if let Some(argv) = &plan.resume_argv {
            spec.argv = argv.clone();
        }
        // A command that reads {prompt_file} sees this iteration's prompt.
        if let Some((_, file)) = spec
            .env
            .iter()
            .find(|(k, _)| k == "AGENT_STATE_PROMPT_FILE")
            && let Err(e) = crate::state::atomic::write_file_unsynced(
                &plan.store,
                Path::new(file),
                &spec.stdin,
                0o640,
            )
        {
            tracing::warn!(agent = %plan.agent, "cannot write iteration {n}'s prompt file: {e}");
        }
        // Its machine is told the run launched (its timeout from now).
        let _ = plan.tx.send(Event::Iteration {
            agent: plan.agent.clone(),
            n,
            of: s.max_iterations,
            phase: Phase::Executing,
        });
        tracing::info!(agent = %plan.agent, "iteration {n} of {} starts with the verification feedback", s.max_iterations);
        observer.completed = false;
        // On this host: a session with `verify` is never ordered from a
        // worker (`remote::Unfit::Verify`).
        report = match runner::launch(spec, &orders) {
            Ok(launched) => launched.run(observer, orders.clone(), None).await,
            Err(report) => *report,
        };
    }
}

/// A run the iteration loop reported ([`Event::RunEnded`]) told to its
/// session's machine: what its script said, COMPLETE, then its exit with
/// what its output showed. A run whose output shows a usage limit is left
/// for the session's end, where the economy judges it with its credential.
pub(super) fn run_ended(
    r: &mut Running,
    dir: &AgentDir,
    report: &RunReport,
    out: &OutputSummary,
    now: DateTime<Utc>,
) -> Order {
    let claude = out.claude.as_ref().and_then(output::classify);
    let claude_error = out.claude.as_ref().is_some_and(|c| c.is_error);
    if economy::limit_in(report, out, claude_error || claude.is_some(), now).is_some() {
        return Order::Finish;
    }
    let facts = machine::Facts {
        empty: out.empty,
        fingerprint: out.fingerprint,
        claude,
        claude_error,
        stderr_last_words: output::last_words(&out.stderr_tail),
        oom: report.oom,
        invalid_commits: None,
    };
    let script = session::script_end(dir, &r.session_id).map(script_record);
    let end = machine::Event::ChildExited {
        ending: report.ending.clone(),
        facts,
    };
    let actions = r.tell_end(script, None, Some(end));
    r.order_of(actions)
}

/// What a script said of its session, as its machine reads it.
pub(super) fn script_record(end: session::ScriptEnd) -> machine::ScriptRecord {
    match end {
        session::ScriptEnd::Completed => machine::ScriptRecord::Ended,
        session::ScriptEnd::Failed { reason } => machine::ScriptRecord::Failed { reason },
    }
}

/// What an iteration is doing, as report.json's `iteration.phase` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The agent's command runs.
    Executing,
    /// The verification command runs.
    Verifying,
}

impl Phase {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Phase::Executing => "executing",
            Phase::Verifying => "verifying",
        }
    }
}

/// report.json says which iteration runs and whether it is executing or
/// verifying (seed 000's states).
pub(super) fn iteration(
    running: Option<&mut Running>,
    dir: &AgentDir,
    n: u32,
    of: u32,
    phase: Phase,
) {
    let agent = &dir.name;
    // A new run: what the last one signalled does not count for it.
    let session_id = running.map(|r| {
        if phase == Phase::Executing {
            r.completed_by_signal = false;
        }
        r.session_id.clone()
    });
    let value = serde_json::json!({"n": n, "of": of, "phase": phase.as_str()});
    let result = dir.update(Timestamp::now(), |r: &mut Report| {
        r.extra
            .insert(hooks::REPORT_ITERATION.into(), value.clone());
    });
    if let Err(e) = result {
        tracing::warn!(agent = %agent, "cannot record the iteration in report.json: {e}");
    }
    // The journal follows the loop: each later iteration's start.
    if phase == Phase::Executing
        && let Some(session_id) = session_id
    {
        journal_line(
            dir,
            crate::state::journal::Event::IterationStart(crate::state::journal::IterationStart {
                session_id,
                n,
                of,
            }),
        );
    }
}

/// Iteration `n`'s verification ended: `iteration_end` in the journal.
pub(super) fn verified(
    running: Option<&Running>,
    dir: &AgentDir,
    n: u32,
    of: u32,
    failure: Option<String>,
) {
    let Some(r) = running else {
        return;
    };
    journal_line(
        dir,
        crate::state::journal::Event::IterationEnd(crate::state::journal::IterationEnd {
            session_id: r.session_id.clone(),
            n,
            of,
            verify: if failure.is_some() {
                "failed"
            } else {
                "passed"
            }
            .into(),
            failure,
        }),
    );
}

/// One journal line of the loop's, under the agent's lock.
fn journal_line(dir: &AgentDir, event: crate::state::journal::Event) {
    let result = dir
        .lock()
        .and_then(|lock| dir.journal_append(&lock, Timestamp::now(), event));
    if let Err(e) = result {
        tracing::warn!(agent = %dir.name, "cannot journal the iteration: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: &str) -> ClaudeResult {
        output::parse_claude_result(json.as_bytes()).expect("a result")
    }

    #[test]
    fn each_run_counts_once() {
        let run = result(
            r#"{"type":"result","total_cost_usd":0.5,"usage":{"input_tokens":10,"output_tokens":5,"cache_creation_input_tokens":1,"cache_read_input_tokens":4}}"#,
        );
        let bare = result(r#"{"type":"result","result":"no usage"}"#);
        let mut output = SessionOutput::new();
        let mut tally = Tally::default();
        // Run 1 prints its result; run 2 prints nothing; run 3 prints one.
        output.on_output(serde_json::to_string(&serde_json::json!({"type":"result","total_cost_usd":0.5,"usage":{"input_tokens":10,"output_tokens":5,"cache_creation_input_tokens":1,"cache_read_input_tokens":4}})).unwrap().as_bytes());
        tally.note_run(&output);
        tally.note_run(&output);
        output.on_output(b"\n{\"type\":\"result\",\"result\":\"no usage\"}\n");
        tally.note_run(&output);
        assert_eq!(tally.runs, vec![run.clone(), bare.clone()]);
        let (cost, tokens, usage) = usage_of(&tally.results(None));
        assert_eq!((cost, tokens), (Some(0.5), Some(20)));
        assert_eq!(usage.map(|u| u.output_tokens), Some(5));
        // Without the loop: the session's last result.
        let none = Tally::default();
        assert_eq!(none.results(Some(&bare)), vec![&bare]);
        let (cost, tokens, usage) = usage_of(&[&run, &run]);
        assert_eq!((cost, tokens), (Some(1.0), Some(40)));
        assert_eq!(usage.map(|u| u.input_tokens), Some(20));
        assert_eq!(usage_of(&[&bare]), (None, None, None));
    }

    #[test]
    fn each_iteration_has_its_own_log() {
        let first = std::path::Path::new("/s/rio/sessions/20261124-100000.log");
        assert_eq!(log_of(first, 1), first);
        assert_eq!(
            log_of(first, 3),
            std::path::Path::new("/s/rio/sessions/20261124-100000.iter-3.log")
        );
    }
}
