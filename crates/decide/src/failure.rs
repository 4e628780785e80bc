//! The error matrix for sessions, as a pure function: how a session ended
//! (and what its output said) → an error code, whether and when to retry,
//! whether to escalate. No IO; the clock is passed in (`Observed::now`);
//! `docs/errors.md` is the table this implements.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::catalogue::Code;
use crate::ending::{ClaudeFailure, Ending, OomEvidence, SpawnFailure, is_network_error};

/// How failed sessions are retried (the error matrix, docs/errors.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after a timeout (or a stall stopped), before escalation.
    pub timeout: u32,
    /// Retries after a session that printed nothing.
    pub empty_output: u32,
    /// Retries after an API error (overload, 5xx; a usage limit is waited out).
    pub api: u32,
    /// Retries after a spawn failure other than not-found / permission.
    pub spawn: u32,
    /// Failures in a row before a plain failure is escalated.
    pub escalate_after: u32,
    /// The first delay before a retry (timeout, stall, empty output, API
    /// error) and the first step of the backoff after failures; each doubles.
    pub retry_delay: Duration,
    /// The first delay before retrying a failed spawn; doubles.
    pub spawn_retry_delay: Duration,
    /// The longest the backoff after failures gets.
    pub max_backoff: Duration,
    /// How long network failures (connection refused, reset) are retried,
    /// from the first of a streak, before escalation.
    pub network_retry_for: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            timeout: 2,
            empty_output: 3,
            api: 5,
            spawn: 3,
            escalate_after: 3,
            retry_delay: Duration::from_secs(30),
            spawn_retry_delay: Duration::from_secs(2),
            max_backoff: Duration::from_secs(3600),
            network_retry_for: Duration::from_secs(600),
        }
    }
}

/// What the daemon saw of one session.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub ending: &'a Ending,
    /// Not one non-blank byte on stdout or stderr.
    pub empty: bool,
    /// A hash of the whole output; `None` if there was none.
    pub fingerprint: Option<u64>,
    /// Claude Code's JSON result reported an error.
    pub claude: Option<&'a ClaudeFailure>,
    /// The session script recorded its own successful end (`session end`):
    /// then its silence is its business (it may send claude's output to a
    /// file of its own).
    pub ended_by_script: bool,
    /// The session script recorded its own failure (`session fail`), with
    /// this reason: a failure whatever the exit status, so that it backs off
    /// like any other (its messages went back to the inbox).
    pub failed_by_script: Option<&'a str>,
    /// The agent must signal COMPLETE (`require_complete`) and did not.
    pub incomplete: bool,
    /// When the session ended (the clock of network-failure retries).
    pub now: DateTime<Utc>,
    /// The kernel's OOM killer ended it (`memory`'s rule).
    pub oom: Option<&'a OomEvidence>,
    /// Its workspace was left with invalid commits (why), and was reset.
    pub invalid_commits: Option<&'a str>,
}

/// An agent's run of failures, carried from one session to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Streak {
    /// Failed sessions in a row.
    pub failures: u32,
    /// What the retries in progress are for.
    pub retrying: Option<Code>,
    /// Retries already made for it.
    pub retries: u32,
    /// The output hash of the last failed attempt.
    pub last_fingerprint: Option<u64>,
    /// When the first of the network failures in a row happened: they are
    /// retried until `network_retry_for` has passed since, not a count.
    pub network_since: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Success: the streak is over.
    Clear,
    /// Run the session again after this delay.
    Retry { after: Duration },
    /// No retry; automatic wakes are held back this long.
    Backoff { hold: Duration },
    /// The agent gets no automatic wakes until the config is reloaded or
    /// someone runs `agent-state wake`.
    Disable,
    /// Nothing to decide (the daemon stopped the session to shut down).
    Nothing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` for a success or a shutdown.
    pub code: Option<Code>,
    /// One sentence for the error record.
    pub message: String,
    /// This session's attempt number in its retry chain (1 = not a retry).
    pub attempt: u32,
    pub next: Next,
    /// Send it to the human mailbox (the daemon escalates each code once
    /// per failure streak).
    pub escalate: bool,
}

/// How long automatic wakes wait after `failures` failures in a row:
/// `retry_delay`, doubling per failure, at most `max_backoff`.
pub fn backoff(failures: u32, r: &RetrySettings) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    doubling(r.retry_delay, failures - 1).min(r.max_backoff)
}

fn doubling(base: Duration, n: u32) -> Duration {
    base.saturating_mul(1u32 << n.min(20))
}

/// How a code is retried: how many times, and the first delay (doubling).
fn retry_policy(code: Code, r: &RetrySettings) -> (u32, Duration) {
    match code {
        Code::AgentSpawnFailed | Code::WorkspaceLocked | Code::WorkspaceFailed => {
            (r.spawn, r.spawn_retry_delay)
        }
        Code::SessionTimeout | Code::SessionStalled => (r.timeout, r.retry_delay),
        Code::SessionEmptyOutput => (r.empty_output, r.retry_delay),
        Code::AgentApiError => (r.api, r.retry_delay),
        // Once, with one session fewer beside it; a second is "recurring".
        Code::SessionOom => (1, r.retry_delay),
        // Once, from the base: a second in a row is escalated (seed 002).
        Code::WorkspaceInvalidCommits => (1, r.retry_delay),
        _ => (0, Duration::ZERO),
    }
}

/// The iteration loop gave up (`VERIFY_FAILED`, `SESSION_STUCK`): a
/// failure of the agent, not retried (the loop was the retrying), escalated
/// at once with the last failure; automatic wakes back off.
pub fn gave_up(streak: &mut Streak, r: &RetrySettings, code: Code, message: String) -> Verdict {
    streak.failures += 1;
    streak.retrying = None;
    streak.retries = 0;
    Verdict {
        code: Some(code),
        message,
        attempt: 1,
        next: Next::Backoff {
            hold: backoff(streak.failures, r),
        },
        escalate: true,
    }
}

/// Judge one ended session and advance the agent's streak.
pub fn judge(obs: &Observed<'_>, streak: &mut Streak, r: &RetrySettings) -> Verdict {
    let attempt = streak.retries + 1;
    let (code, message) = match classify(obs) {
        Classified::Success => {
            *streak = Streak::default();
            return Verdict {
                code: None,
                message: "completed".into(),
                attempt,
                next: Next::Clear,
                escalate: false,
            };
        }
        Classified::Shutdown => {
            return Verdict {
                code: None,
                message: obs.ending.to_string(),
                attempt,
                next: Next::Nothing,
                escalate: false,
            };
        }
        Classified::Failure(code, message) => (code, message),
    };
    streak.failures += 1;
    let network = code == Code::AgentApiError
        && matches!(obs.claude, Some(ClaudeFailure::Api { message, .. }) if is_network_error(message));
    if network {
        return network_failure(obs.now, streak, r, message, attempt);
    }
    streak.network_since = None;
    let same_chain = streak.retrying == Some(code);
    let repeated = same_chain
        && streak.retries > 0
        && obs.fingerprint.is_some()
        && obs.fingerprint == streak.last_fingerprint;
    streak.last_fingerprint = obs.fingerprint;
    if repeated {
        streak.retrying = None;
        streak.retries = 0;
        return Verdict {
            code: Some(Code::SessionLoop),
            message: format!(
                "attempt {attempt} printed exactly the same output as attempt {} ({message}); retries stopped",
                attempt - 1
            ),
            attempt,
            next: Next::Backoff {
                hold: backoff(streak.failures, r),
            },
            escalate: true,
        };
    }
    if !same_chain {
        streak.retrying = Some(code);
        streak.retries = 0;
    }
    let (limit, first_delay) = retry_policy(code, r);
    // What an operator must fix before anything can run (a missing or
    // non-executable command, a workspace that is no repository): held,
    // not backed off, so no wake spends its messages meanwhile.
    if matches!(
        code,
        Code::AgentNotFound | Code::AgentPermissionDenied | Code::WorkspaceNotARepo
    ) {
        streak.retrying = None;
        streak.retries = 0;
        return Verdict {
            code: Some(code),
            message,
            attempt,
            next: Next::Disable,
            escalate: true,
        };
    }
    if streak.retries < limit {
        let after = doubling(first_delay, streak.retries).min(r.max_backoff);
        streak.retries += 1;
        return Verdict {
            code: Some(code),
            message: format!("{message}; retry {} of {limit}", streak.retries),
            attempt,
            next: Next::Retry { after },
            escalate: false,
        };
    }
    let exhausted = limit > 0;
    let escalate = match code {
        Code::AgentNotFound | Code::AgentLoginRequired => true,
        Code::SessionFailed | Code::SessionIncomplete => streak.failures >= r.escalate_after,
        _ => exhausted,
    };
    let message = if exhausted {
        format!("{message}; all {limit} retries failed")
    } else {
        message
    };
    streak.retrying = None;
    streak.retries = 0;
    Verdict {
        code: Some(code),
        message,
        attempt,
        next: Next::Backoff {
            hold: backoff(streak.failures, r),
        },
        escalate,
    }
}

/// A network failure (connection refused, reset): retried with the
/// doubling delay until `network_retry_for` has passed since the first of
/// the streak (the seed's "after 10 minutes"), then escalated.
fn network_failure(
    now: DateTime<Utc>,
    streak: &mut Streak,
    r: &RetrySettings,
    message: String,
    attempt: u32,
) -> Verdict {
    let since = *streak.network_since.get_or_insert(now);
    let failing_for = (now - since).to_std().unwrap_or(Duration::ZERO);
    if streak.retrying != Some(Code::AgentApiError) {
        streak.retrying = Some(Code::AgentApiError);
        streak.retries = 0;
    }
    if failing_for < r.network_retry_for {
        let after = doubling(r.retry_delay, streak.retries).min(r.max_backoff);
        streak.retries += 1;
        return Verdict {
            code: Some(Code::AgentApiError),
            message: format!(
                "network error: {message}; retry {} (failing for {}s of {}s)",
                streak.retries,
                failing_for.as_secs(),
                r.network_retry_for.as_secs()
            ),
            attempt,
            next: Next::Retry { after },
            escalate: false,
        };
    }
    streak.retrying = None;
    streak.retries = 0;
    streak.network_since = None;
    Verdict {
        code: Some(Code::AgentApiError),
        message: format!(
            "network error: {message}; still failing after {}s of retries",
            failing_for.as_secs()
        ),
        attempt,
        next: Next::Backoff {
            hold: backoff(streak.failures, r),
        },
        escalate: true,
    }
}

/// What the daemon saw of a session's end beyond its verdict: what
/// [`recorded_reason`] words a failure from (the machine's, only).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen<'a> {
    pub ending: &'a Ending,
    /// Claude Code's JSON result reported a failure.
    pub claude_failed: bool,
    /// The session script recorded its own end (`session end`).
    pub ended_by_script: bool,
    /// The session script recorded its own failure (`session fail`).
    pub failed_by_script: bool,
    /// The last non-blank line the command wrote on stderr.
    pub stderr_last_words: Option<&'a str>,
    /// How the ending reads in session.json (`session::describe`).
    pub described: &'a str,
}

/// The reason session.json records for a session where the daemon knows
/// better than the exit status; `None` leaves the exit status (or the
/// script's own words) to say it. A session that succeeded has no reason:
/// Claude Code, git and npm write to stderr when all is well, so what a
/// command wrote there is said for a failure only.
pub(crate) fn recorded_reason(seen: &Seen<'_>, verdict: &Verdict) -> Option<String> {
    let exited = matches!(seen.ending, Ending::Exited { .. } | Ending::Signaled { .. });
    match seen.ending {
        // A stop is worded from its outcome (`Outcome::Stopped`).
        Ending::Stopped => None,
        // A success, or the session's own record of its failure in its own
        // words (the verdict quotes them).
        _ if verdict.code.is_none() || seen.failed_by_script && seen.ending.is_success() => None,
        // Exit 0 that the daemon judged a failure (no output, Claude Code's
        // error, no COMPLETE signal).
        e if e.is_success() => Some(verdict.message.clone()),
        // What the error matrix made of it ("Claude Code is not logged in:
        // ..."), not only the exit status.
        _ if exited && (seen.claude_failed || verdict.code != Some(Code::SessionFailed)) => {
            Some(verdict.message.clone())
        }
        // A plain failure the session did not record itself: its last words
        // on stderr say more than the exit status.
        _ if exited && !seen.ended_by_script => seen
            .stderr_last_words
            .map(|words| format!("{}; its stderr ends: {words}", seen.described)),
        _ => None,
    }
}

enum Classified {
    Success,
    Shutdown,
    Failure(Code, String),
}

fn classify(obs: &Observed<'_>) -> Classified {
    use Classified::*;
    match obs.ending {
        Ending::Stopped => return Shutdown,
        Ending::SpawnFailed { reason, kind } => {
            return Failure(
                match kind {
                    SpawnFailure::NotFound => Code::AgentNotFound,
                    SpawnFailure::PermissionDenied => Code::AgentPermissionDenied,
                    SpawnFailure::Other => Code::AgentSpawnFailed,
                    SpawnFailure::Workspace(code) => *code,
                },
                reason.clone(),
            );
        }
        Ending::TimedOut => return Failure(Code::SessionTimeout, "the session timed out".into()),
        Ending::Stalled { .. } => {
            return Failure(Code::SessionStalled, format!("the session {}", obs.ending));
        }
        Ending::Lost { reason } => return Failure(Code::SessionInterrupted, reason.clone()),
        Ending::Exited { .. } | Ending::Signaled { .. } => {}
    }
    if let Some(evidence) = obs.oom
        && !obs.ending.is_success()
    {
        return Failure(
            Code::SessionOom,
            format!(
                "the kernel's OOM killer ended the session ({}): {evidence}",
                obs.ending
            ),
        );
    }
    if let Some(why) = obs.invalid_commits {
        return Failure(
            Code::WorkspaceInvalidCommits,
            format!(
                "the session left invalid commits in its workspace ({why}); the workspace was reset to the base"
            ),
        );
    }
    match obs.claude {
        Some(ClaudeFailure::LoginRequired { message }) => {
            return Failure(
                Code::AgentLoginRequired,
                format!("Claude Code is not logged in: {message}"),
            );
        }
        Some(ClaudeFailure::Api {
            message,
            retryable: true,
        }) => return Failure(Code::AgentApiError, format!("API error: {message}")),
        Some(ClaudeFailure::Api { message, .. }) | Some(ClaudeFailure::Other { message }) => {
            return Failure(
                Code::SessionFailed,
                format!("Claude Code reported an error: {message}"),
            );
        }
        None => {}
    }
    if let Some(why) = obs.failed_by_script {
        return Failure(
            Code::SessionFailed,
            format!("the session recorded its own failure: {why}"),
        );
    }
    if obs.empty && !obs.ended_by_script {
        return Failure(
            Code::SessionEmptyOutput,
            format!("the session printed nothing and {}", obs.ending),
        );
    }
    match obs.ending {
        Ending::Exited { code: 0 } if obs.incomplete => Failure(
            Code::SessionIncomplete,
            "the session exited 0 without a COMPLETE signal (require_complete = true)".into(),
        ),
        Ending::Exited { code: 0 } => Success,
        other => Failure(Code::SessionFailed, format!("the session command {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(ending: &Ending) -> Observed<'_> {
        Observed {
            ending,
            empty: false,
            fingerprint: Some(1),
            claude: None,
            ended_by_script: false,
            failed_by_script: None,
            incomplete: false,
            now: DateTime::UNIX_EPOCH,
            oom: None,
            invalid_commits: None,
        }
    }

    fn r() -> RetrySettings {
        RetrySettings::default()
    }

    /// Connection refused is retried until `network_retry_for` (10 min)
    /// has passed since the first failure, however many attempts that
    /// takes; then escalated once; anything else starts the clock afresh.
    #[test]
    fn network_failures_escalate_after_ten_minutes_not_a_count() {
        let refused = ClaudeFailure::Api {
            message: "API Error: Connection error. (connect ECONNREFUSED 127.0.0.1:443)".into(),
            retryable: true,
        };
        let overloaded = ClaudeFailure::Api {
            message: "Overloaded".into(),
            retryable: true,
        };
        let ended = Ending::Exited { code: 1 };
        let at = |secs: i64| DateTime::UNIX_EPOCH + chrono::Duration::seconds(secs);
        // (seconds since the epoch, failure, escalate, retried)
        let table: &[(i64, &ClaudeFailure, bool, bool)] = &[
            (0, &refused, false, true),
            (30, &refused, false, true),
            (90, &refused, false, true),
            (210, &refused, false, true),
            (450, &refused, false, true),
            (451, &refused, false, true),
            (452, &refused, false, true), // 7 attempts: more than api_retries (5)
            (599, &refused, false, true),
            (600, &refused, true, false), // 10 minutes since the first
            (700, &refused, false, true), // a new streak of network failures
            (1000, &overloaded, false, true), // not network: the clock resets
            (1001, &refused, false, true),
            (1601, &refused, true, false),
        ];
        let mut s = Streak::default();
        for (n, &(secs, claude, escalate, retried)) in table.iter().enumerate() {
            let mut o = obs(&ended);
            o.claude = Some(claude);
            o.fingerprint = Some(n as u64);
            o.now = at(secs);
            let v = judge(&o, &mut s, &r());
            assert_eq!(v.code, Some(Code::AgentApiError), "row {n}");
            assert_eq!(v.escalate, escalate, "row {n}: {}", v.message);
            assert_eq!(
                matches!(v.next, Next::Retry { .. }),
                retried,
                "row {n}: {:?}",
                v.next
            );
        }
    }

    /// SESSION_OOM needs the kernel's word (the runner's evidence): then
    /// it is retried once and escalated when it recurs; the same SIGKILL
    /// without it is a plain failure; an exit 0 is a success.
    #[test]
    fn an_oom_kill_is_retried_once_then_escalated() {
        let killed = Ending::Signaled { signal: 9 };
        let shell = Ending::Exited { code: 137 };
        let ok = Ending::Exited { code: 0 };
        let cg = OomEvidence::Cgroup { oom_kills: 1 };
        let kernel = OomEvidence::Kernel {
            before: 1,
            after: 2,
        };
        // (what, ending, evidence, code, retried, escalated)
        type Row<'a> = (
            &'a str,
            &'a Ending,
            Option<&'a OomEvidence>,
            Code,
            bool,
            bool,
        );
        let table: &[Row<'_>] = &[
            (
                "first, cgroup",
                &shell,
                Some(&cg),
                Code::SessionOom,
                true,
                false,
            ),
            (
                "recurs",
                &killed,
                Some(&kernel),
                Code::SessionOom,
                false,
                true,
            ),
            (
                "SIGKILL alone",
                &killed,
                None,
                Code::SessionFailed,
                false,
                true, // the third failure in a row: `escalate_after`
            ),
            (
                "again, kernel",
                &killed,
                Some(&kernel),
                Code::SessionOom,
                true,
                false,
            ),
        ];
        let mut s = Streak::default();
        for (n, &(what, ending, oom, code, retried, escalated)) in table.iter().enumerate() {
            let mut o = obs(ending);
            o.oom = oom;
            o.fingerprint = Some(n as u64);
            let v = judge(&o, &mut s, &r());
            assert_eq!(v.code, Some(code), "{what}: {}", v.message);
            assert_eq!(matches!(v.next, Next::Retry { .. }), retried, "{what}");
            assert_eq!(v.escalate, escalated, "{what}");
            if oom.is_some() {
                assert!(v.message.contains("OOM killer"), "{what}: {}", v.message);
            }
        }
        let mut o = obs(&ok);
        o.oom = Some(&cg);
        assert_eq!(judge(&o, &mut s, &r()).next, Next::Clear, "exit 0 wins");
    }

    /// Invalid commits: retried once (from the base), escalated at the
    /// second in a row; whatever the exit status; a timeout keeps its code.
    #[test]
    fn invalid_commits_are_retried_once_then_escalated() {
        let ok = Ending::Exited { code: 0 };
        let failed = Ending::Exited { code: 1 };
        let why = "HEAD is detached, not on the branch rio/x";
        // (ending, invalid, code, retried, escalated)
        type Row<'a> = (&'a Ending, Option<&'a str>, Option<Code>, bool, bool);
        let table: &[Row<'_>] = &[
            (
                &ok,
                Some(why),
                Some(Code::WorkspaceInvalidCommits),
                true,
                false,
            ),
            (
                &failed,
                Some(why),
                Some(Code::WorkspaceInvalidCommits),
                false,
                true,
            ),
            (&ok, None, None, false, false),
            (
                &Ending::TimedOut,
                Some(why),
                Some(Code::SessionTimeout),
                true,
                false,
            ),
        ];
        let mut s = Streak::default();
        for (n, &(ending, invalid, code, retried, escalated)) in table.iter().enumerate() {
            let mut o = obs(ending);
            o.invalid_commits = invalid;
            o.fingerprint = Some(n as u64);
            let v = judge(&o, &mut s, &r());
            assert_eq!(v.code, code, "row {n}: {}", v.message);
            assert_eq!(matches!(v.next, Next::Retry { .. }), retried, "row {n}");
            assert_eq!(v.escalate, escalated, "row {n}");
            if code == Some(Code::WorkspaceInvalidCommits) {
                assert!(v.message.contains(why), "{}", v.message);
            }
        }
    }

    #[test]
    fn success_clears_the_streak() {
        let mut s = Streak {
            failures: 4,
            retrying: Some(Code::SessionTimeout),
            retries: 1,
            last_fingerprint: Some(9),
            network_since: Some(DateTime::UNIX_EPOCH),
        };
        let v = judge(&obs(&Ending::Exited { code: 0 }), &mut s, &r());
        assert_eq!(v.next, Next::Clear);
        assert_eq!(v.code, None);
        assert_eq!(v.attempt, 2);
        assert_eq!(s, Streak::default());
    }

    #[test]
    fn an_exit_0_without_complete_fails_where_complete_is_required() {
        let ok = Ending::Exited { code: 0 };
        let mut s = Streak::default();
        let mut o = obs(&ok);
        o.incomplete = true;
        for n in 1..=r().escalate_after {
            let v = judge(&o, &mut s, &r());
            assert_eq!(v.code, Some(Code::SessionIncomplete));
            assert!(matches!(v.next, Next::Backoff { .. }));
            assert!(
                v.message.contains("without a COMPLETE signal"),
                "{}",
                v.message
            );
            assert_eq!(v.escalate, n == r().escalate_after, "failure {n}");
        }
        assert_eq!(judge(&obs(&ok), &mut s, &r()).next, Next::Clear);
    }

    #[test]
    fn a_command_that_cannot_be_executed_holds_the_agent_and_escalates() {
        let table = [
            (SpawnFailure::NotFound, Code::AgentNotFound),
            (SpawnFailure::PermissionDenied, Code::AgentPermissionDenied),
        ];
        for (kind, code) in table {
            let e = Ending::SpawnFailed {
                reason: "command not found: /usr/bin/claude".into(),
                kind,
            };
            let mut s = Streak::default();
            let v = judge(&obs(&e), &mut s, &r());
            assert_eq!(v.code, Some(code), "{kind:?}");
            assert_eq!(v.next, Next::Disable, "{kind:?}: held, not backed off");
            assert!(v.escalate, "{kind:?}");
            assert!(v.message.contains("/usr/bin/claude"), "{kind:?}");
            assert_eq!(
                (s.retrying, s.retries),
                (None, 0),
                "{kind:?}: never retried"
            );
        }
    }

    /// Runs `ending` until the verdict is not a retry; returns the verdicts.
    fn chain(ending: &Ending, fingerprints: impl Fn(u32) -> Option<u64>) -> Vec<Verdict> {
        let mut s = Streak::default();
        let mut out = Vec::new();
        for i in 0..20 {
            let mut o = obs(ending);
            o.fingerprint = fingerprints(i);
            o.empty = o.fingerprint.is_none();
            let v = judge(&o, &mut s, &r());
            let retry = matches!(v.next, Next::Retry { .. });
            out.push(v);
            if !retry {
                break;
            }
        }
        out
    }

    #[test]
    fn spawn_failures_retry_three_times_with_growing_delays_then_escalate() {
        let e = Ending::SpawnFailed {
            reason: "cannot open the session log".into(),
            kind: SpawnFailure::Other,
        };
        let v = chain(&e, |i| Some(i as u64));
        let delays: Vec<_> = v
            .iter()
            .filter_map(|v| match v.next {
                Next::Retry { after } => Some(after.as_secs()),
                _ => None,
            })
            .collect();
        assert_eq!(delays, [2, 4, 8]);
        let last = v.last().unwrap();
        assert_eq!(last.code, Some(Code::AgentSpawnFailed));
        assert!(last.escalate);
        assert_eq!(last.attempt, 4);
        assert!(last.message.contains("all 3 retries failed"));
    }

    #[test]
    fn timeouts_retry_twice_then_escalate() {
        let v = chain(&Ending::TimedOut, |i| Some(100 + i as u64));
        assert_eq!(v.len(), 3);
        assert!(v[..2].iter().all(|v| !v.escalate));
        assert!(v[2].escalate && matches!(v[2].next, Next::Backoff { .. }));
        assert_eq!(v[2].code, Some(Code::SessionTimeout));
    }

    #[test]
    fn empty_output_retries_three_times_then_is_an_error() {
        let v = chain(&Ending::Exited { code: 0 }, |_| None);
        assert_eq!(v.len(), 4);
        assert!(v.iter().all(|v| v.code == Some(Code::SessionEmptyOutput)));
        assert!(v[3].escalate);
    }

    #[test]
    fn silence_is_fine_when_the_script_ended_the_session_itself() {
        let e = Ending::Exited { code: 0 };
        let mut o = obs(&e);
        o.empty = true;
        o.fingerprint = None;
        o.ended_by_script = true;
        assert_eq!(judge(&o, &mut Streak::default(), &r()).next, Next::Clear);
    }

    #[test]
    fn the_same_output_twice_is_a_loop_stopped_at_once() {
        let v = chain(&Ending::TimedOut, |_| Some(42));
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].code, Some(Code::SessionLoop));
        assert!(v[1].escalate);
        assert!(matches!(v[1].next, Next::Backoff { .. }));
    }

    #[test]
    fn login_required_is_never_retried() {
        let e = Ending::Exited { code: 1 };
        let f = ClaudeFailure::LoginRequired {
            message: "Not logged in · Please run /login".into(),
        };
        let mut o = obs(&e);
        o.claude = Some(&f);
        let v = judge(&o, &mut Streak::default(), &r());
        assert_eq!(v.code, Some(Code::AgentLoginRequired));
        assert!(v.escalate);
        assert!(matches!(v.next, Next::Backoff { .. }));
    }

    #[test]
    fn api_errors_back_off_exponentially() {
        let e = Ending::Exited { code: 1 };
        let f = ClaudeFailure::Api {
            message: "API Error: 529 overloaded".into(),
            retryable: true,
        };
        let mut s = Streak::default();
        let mut delays = Vec::new();
        for i in 0..10 {
            let mut o = obs(&e);
            o.claude = Some(&f);
            o.fingerprint = Some(i);
            let v = judge(&o, &mut s, &r());
            match v.next {
                Next::Retry { after } => delays.push(after.as_secs()),
                _ => {
                    assert!(v.escalate);
                    break;
                }
            }
        }
        assert_eq!(delays, [30, 60, 120, 240, 480]);
    }

    #[test]
    fn plain_failures_escalate_after_three_in_a_row() {
        let e = Ending::Exited { code: 2 };
        let mut s = Streak::default();
        let esc: Vec<bool> = (0..4)
            .map(|i| {
                let mut o = obs(&e);
                o.fingerprint = Some(i);
                judge(&o, &mut s, &r()).escalate
            })
            .collect();
        assert_eq!(esc, [false, false, true, true]);
        assert_eq!(s.failures, 4);
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let b: Vec<u64> = (0..10).map(|n| backoff(n, &r()).as_secs()).collect();
        assert_eq!(b, [0, 30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
    }

    #[test]
    fn shutdown_decides_nothing() {
        let mut s = Streak {
            failures: 1,
            ..Streak::default()
        };
        let v = judge(&obs(&Ending::Stopped), &mut s, &r());
        assert_eq!(v.next, Next::Nothing);
        assert_eq!(s.failures, 1);
    }

    #[test]
    fn a_failure_the_script_recorded_backs_off_whatever_the_exit_status() {
        let ok = Ending::Exited { code: 0 };
        let mut s = Streak::default();
        let mut o = obs(&ok);
        o.failed_by_script = Some("no work tree");
        let v = judge(&o, &mut s, &r());
        assert_eq!(v.code, Some(Code::SessionFailed));
        assert_eq!(
            v.message,
            "the session recorded its own failure: no work tree"
        );
        assert_eq!(
            v.next,
            Next::Backoff {
                hold: backoff(1, &r())
            }
        );
        // Claude Code's own verdict says more (a login, an API error).
        let f = ClaudeFailure::LoginRequired {
            message: "Not logged in".into(),
        };
        o.claude = Some(&f);
        let v = judge(&o, &mut Streak::default(), &r());
        assert_eq!(v.code, Some(Code::AgentLoginRequired));
    }

    #[test]
    fn the_recorded_reason_quotes_stderr_for_a_failure_only() {
        let ok = Ending::Exited { code: 0 };
        let three = Ending::Exited { code: 3 };
        let seen = |ending| Seen {
            ending,
            claude_failed: false,
            ended_by_script: false,
            failed_by_script: false,
            stderr_last_words: Some("some warning"),
            described: "the session command exited with status 3",
        };
        let verdict = |code: Option<Code>| Verdict {
            code,
            message: "judged".into(),
            attempt: 1,
            next: Next::Nothing,
            escalate: false,
        };
        let failed = verdict(Some(Code::SessionFailed));
        let cases: &[(&str, Seen<'_>, Verdict, Option<&str>)] = &[
            ("exit 0, stderr, success", seen(&ok), verdict(None), None),
            (
                "exit 0 judged a failure",
                seen(&ok),
                verdict(Some(Code::SessionEmptyOutput)),
                Some("judged"),
            ),
            (
                "exit 0, the script's own failure",
                Seen {
                    failed_by_script: true,
                    ..seen(&ok)
                },
                failed.clone(),
                None,
            ),
            (
                "exit 3, stderr",
                seen(&three),
                failed.clone(),
                Some("the session command exited with status 3; its stderr ends: some warning"),
            ),
            (
                "exit 3, no stderr",
                Seen {
                    stderr_last_words: None,
                    ..seen(&three)
                },
                failed.clone(),
                None,
            ),
            (
                "exit 3, Claude Code's error",
                Seen {
                    claude_failed: true,
                    ..seen(&three)
                },
                failed.clone(),
                Some("judged"),
            ),
            (
                "exit 1, a login",
                seen(&Ending::Exited { code: 1 }),
                verdict(Some(Code::AgentLoginRequired)),
                Some("judged"),
            ),
            (
                "stopped: the stop's outcome words it",
                seen(&Ending::Stopped),
                verdict(None),
                None,
            ),
            (
                "timed out",
                seen(&Ending::TimedOut),
                verdict(Some(Code::SessionTimeout)),
                None,
            ),
        ];
        for (what, seen, verdict, want) in cases {
            assert_eq!(recorded_reason(seen, verdict).as_deref(), *want, "{what}");
        }
    }
}
