//! How many hook calls one remote session may make (pure, the clock passed
//! in): [`CallRate::burst`] at once, then one every [`CallRate::every`] (a
//! token bucket, [`CallBudget`]). A session's script calls a handful of
//! hooks; a loop gone wrong on a worker must not queue thousands of hook
//! runs on the controller, which serves every agent's sessions.

use std::time::{Duration, Instant};

/// A session's allowance of hook calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRate {
    /// Calls allowed at once (the bucket's size).
    pub burst: u32,
    /// One more call allowed after each such period.
    pub every: Duration,
}

impl CallRate {
    /// 60 calls at once, then one a second: far above what a session
    /// script calls (begin, a few records and sends, end).
    pub const DEFAULT: CallRate = CallRate {
        burst: 60,
        every: Duration::from_secs(1),
    };

    /// `BURST/PERIOD` (`3/60s`), as the worker's test hook
    /// `AGENT_STATE_TEST_HOOK_RATE` writes it.
    pub fn parse(text: &str) -> Result<CallRate, RateError> {
        let bad = |why: &str| RateError {
            text: text.to_string(),
            why: why.to_string(),
        };
        let (burst, every) = text.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let burst: u32 = burst
            .trim()
            .parse()
            .map_err(|e| bad(&format!("{burst:?} is not a number of calls: {e}")))?;
        let every = humantime::parse_duration(every.trim())
            .map_err(|e| bad(&format!("{every:?} is not a duration: {e}")))?;
        if burst == 0 || every.is_zero() {
            return Err(bad("both figures must be above 0"));
        }
        Ok(CallRate { burst, every })
    }
}

/// A rate that does not read as `BURST/PERIOD`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not BURST/PERIOD (3/60s): {why}")]
pub struct RateError {
    pub text: String,
    pub why: String,
}

/// One session's bucket.
#[derive(Debug, Clone)]
pub struct CallBudget {
    rate: CallRate,
    tokens: u32,
    /// When the bucket was last refilled (whole periods counted from it).
    since: Instant,
}

impl CallBudget {
    pub fn new(rate: CallRate, now: Instant) -> CallBudget {
        CallBudget {
            rate,
            tokens: rate.burst,
            since: now,
        }
    }

    pub fn rate(&self) -> CallRate {
        self.rate
    }

    /// Takes one call at `now`; refused: how long until the next one is
    /// allowed.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let every = self.rate.every.max(Duration::from_nanos(1));
        let elapsed = now.saturating_duration_since(self.since);
        let periods = elapsed.as_nanos() / every.as_nanos();
        if periods > 0 {
            let added = u32::try_from(periods).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(added).min(self.rate.burst);
            self.since = self
                .since
                .checked_add(every.saturating_mul(added))
                .unwrap_or(now);
        }
        if self.tokens == self.rate.burst {
            // Full: the next period counts from now, not from long ago.
            self.since = now;
        }
        if self.tokens == 0 {
            return Err(every.saturating_sub(now.saturating_duration_since(self.since)));
        }
        self.tokens -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_period() {
        let t0 = Instant::now();
        let rate = CallRate {
            burst: 3,
            every: Duration::from_secs(10),
        };
        let mut b = CallBudget::new(rate, t0);
        let s = Duration::from_secs;
        // (seconds after t0, allowed?, wait when refused)
        let table: &[(u64, bool, u64)] = &[
            (0, true, 0),
            (0, true, 0),
            (1, true, 0),
            (2, false, 8),
            (9, false, 1),
            (10, true, 0),
            (11, false, 9),
            (25, true, 0),
            (26, false, 4),
            // Long idle: the bucket is full again, never fuller.
            (1000, true, 0),
            (1000, true, 0),
            (1000, true, 0),
            (1000, false, 10),
        ];
        for &(at, allowed, wait) in table {
            let got = b.take(t0 + s(at));
            if allowed {
                assert_eq!(got, Ok(()), "at {at} s");
            } else {
                assert_eq!(got, Err(s(wait)), "at {at} s");
            }
        }
    }

    #[test]
    fn a_clock_that_goes_back_takes_nothing_away() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut b = CallBudget::new(
            CallRate {
                burst: 1,
                every: Duration::from_secs(5),
            },
            t0,
        );
        assert_eq!(b.take(t0), Ok(()));
        assert!(b.take(t0 - Duration::from_secs(50)).is_err());
        assert_eq!(b.take(t0 + Duration::from_secs(5)), Ok(()));
    }

    #[test]
    fn rates_parse_or_say_why() {
        assert_eq!(
            CallRate::parse("3/60s"),
            Ok(CallRate {
                burst: 3,
                every: Duration::from_secs(60)
            })
        );
        for bad in ["3", "x/1s", "3/soon", "0/1s", "3/0s"] {
            assert!(CallRate::parse(bad).is_err(), "{bad}");
        }
    }
}
