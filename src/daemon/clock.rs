//! The daemon's clock. Real time, unless `AGENT_STATE_FAKE_NOW` gives the
//! time the daemon should believe it started at: then it runs from there at
//! real speed. Tests use it to reach a schedule's time without waiting for it
//! (an injected clock, through the real binary); operators never set it.

use chrono::{DateTime, Utc};

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    offset: chrono::Duration,
}

impl Clock {
    pub fn from_env() -> Clock {
        let offset = std::env::var("AGENT_STATE_FAKE_NOW")
            .ok()
            .and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
            .map(|t| t.with_timezone(&Utc) - Utc::now())
            .unwrap_or_else(chrono::Duration::zero);
        Clock { offset }
    }

    pub fn now(&self) -> DateTime<Utc> {
        // Checked: the offset comes from the environment; past the calendar
        // the clock stops at its end rather than panicking.
        Utc::now()
            .checked_add_signed(self.offset)
            .unwrap_or_else(crate::clock::latest)
    }

    /// How long from now until `t` (zero if it has passed).
    pub fn until(&self, t: DateTime<Utc>) -> std::time::Duration {
        (t - self.now()).to_std().unwrap_or_default()
    }
}

/// The sessions' clock: the time line their machines live on. It starts
/// at the daemon's clock ([`Clock::now`]) when the daemon starts and then
/// follows the monotonic clock only, so a step of the wall clock (NTP, an
/// operator's `date -s`) never moves a session's timeout, stall or grace,
/// as the runner's own timers never did. Its times are shown as dates
/// (they are close to the wall clock's) but are compared only with each
/// other.
#[derive(Debug, Clone, Copy)]
pub struct SessionClock {
    base: DateTime<Utc>,
    start: std::time::Instant,
}

impl SessionClock {
    /// From now: `wall` is the daemon's clock at this moment.
    pub fn starting(wall: DateTime<Utc>) -> SessionClock {
        SessionClock {
            base: wall,
            start: std::time::Instant::now(),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.at(self.start.elapsed())
    }

    /// The time `elapsed` after its start (pure).
    pub fn at(&self, elapsed: std::time::Duration) -> DateTime<Utc> {
        crate::clock::later(self.base, elapsed)
    }

    /// How long from now until `t` on this line (zero if it has passed).
    pub fn until(&self, t: DateTime<Utc>) -> std::time::Duration {
        (t - self.now()).to_std().unwrap_or_default()
    }
}
