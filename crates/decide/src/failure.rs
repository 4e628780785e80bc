//! The error matrix for sessions, as a pure function: how a session ended
//! (and what its output said) → an error code, whether and when to retry,
//! whether to escalate. No IO; the clock is passed in (`Observed::now`);
//! `docs/errors.md` is the table this implements.

use std::time::Duration;

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
