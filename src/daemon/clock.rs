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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::daemon::machine::{Action, Event, Session, Settings, Sig};
    use crate::failure::Streak;

    /// The loop tells a session's machine (crates/decide's `machine`) the
    /// time of the sessions' clock, which follows the monotonic clock from
    /// the daemon's start: a step of the wall clock (NTP, an operator's
    /// `date -s`) moves no timeout. Each row: seconds on the monotonic
    /// clock, the wall clock then (relative to T0), the event, the answer.
    /// The machine, told the wall clock instead, would time the run out at
    /// the forward step (checked on a copy).
    #[test]
    fn a_wall_clock_step_does_not_move_a_timeout() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-26T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let brief = |a: &Action| match a {
            Action::Launch { iteration, .. } => format!("launch {iteration}"),
            Action::ArmTimer { at } => format!("timer +{}s", (*at - t0).num_seconds()),
            Action::Signal(Sig::Term) => "TERM".into(),
            Action::Signal(Sig::Kill) => "KILL".into(),
            other => format!("{other:?}"),
        };
        let clock = SessionClock::starting(t0);
        let mono = |s: u64| clock.at(Duration::from_secs(s));
        let settings = Settings {
            timeout: Duration::from_secs(600),
            kill_grace: Duration::from_secs(10),
            ..Settings::default()
        };
        let mut m = Session::new(settings, Streak::default());
        let begin = Event::Begin {
            session_id: "20261126-120000-rio".into(),
        };
        let rows: Vec<(u64, i64, Event, &[&str])> = vec![
            (0, 0, begin, &["launch 1"]),
            (0, 0, Event::Launched, &["timer +600s"]),
            // The wall clock stepped an hour back at +250 s.
            (300, 300 - 3600, Event::Deadline, &["timer +600s"]),
            // Then two hours forward: its timeout is still 200 s away.
            (400, 400 + 3600, Event::Deadline, &["timer +600s"]),
            (600, 600 + 3600, Event::Deadline, &["TERM", "timer +610s"]),
            (610, 610 + 3600, Event::Deadline, &["KILL"]),
        ];
        for (secs, wall, event, want) in rows {
            if secs == 400 {
                let mut told_the_wall = m.clone();
                let wall_now = t0 + chrono::Duration::seconds(wall);
                let got: Vec<String> = told_the_wall
                    .on(Event::Deadline, wall_now)
                    .iter()
                    .map(brief)
                    .collect();
                assert_eq!(got, ["TERM", "timer +4010s"], "the wall clock's answer");
            }
            let got: Vec<String> = m.on(event.clone(), mono(secs)).iter().map(brief).collect();
            assert_eq!(got, want, "+{secs}s (wall {wall:+}s): {event:?}");
        }
    }
}
