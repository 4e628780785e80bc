//! What the agents used: sessions, runtime, tokens and cost per agent and
//! per day, read from the journals (the record of every session), and the
//! daily budgets they are held to.
//!
//! Pure at the core: [`sessions`] turns journal entries into one
//! [`SessionUse`] per session, [`by_day`] adds them up per day in a time
//! zone, [`Budget::first_exceeded`] says which limit a day's use has reached.
//! [`read`] is the only IO: one journal's entries since a time.
//!
//! Where the figures come from, per session: runtime from the ending line's
//! `duration_seconds` (`session_end`, `error`, `timeout`); tokens and cost
//! from the daemon's `session_usage` line (Claude Code's result), else from
//! the `tokens_used` / `cost_usd` a script passed to `session end`. A session
//! counts on the day it started, in the budget's time zone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::zone::Zone;
use chrono::NaiveDate;
use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::Result;
use crate::state::Store;
use crate::state::journal::{self, Entry, Event};
use crate::state::session::SessionStatus;

/// The bounds on one session's cost and tokens, kept where the hooks refuse
/// larger values at input (`state::caps`).
pub use crate::state::caps::{MAX_SESSION_COST_USD, MAX_SESSION_TOKENS};

/// A cost as it counts: at most [`MAX_SESSION_COST_USD`], never negative
/// or NaN.
fn counted_cost(c: f64) -> f64 {
    if c.is_nan() || c < 0.0 {
        0.0
    } else {
        c.min(MAX_SESSION_COST_USD)
    }
}

/// Two costs added; a sum past what `f64` holds stays at its largest value.
fn add_cost(a: f64, b: f64) -> f64 {
    let sum = a + b;
    if sum.is_finite() { sum } else { f64::MAX }
}

/// Token counts; absent counts are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_creation: u64,
    pub cache_read: u64,
    /// Every token: the four above, or the total a script reported alone.
    pub total: u64,
}

impl Tokens {
    fn add(&mut self, o: &Tokens) {
        self.input = self.input.saturating_add(o.input);
        self.output = self.output.saturating_add(o.output);
        self.cache_creation = self.cache_creation.saturating_add(o.cache_creation);
        self.cache_read = self.cache_read.saturating_add(o.cache_read);
        self.total = self.total.saturating_add(o.total);
    }
}

/// One session, as its journal lines tell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionUse {
    pub session_id: String,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// `completed`, `error`, `timeout`; `None` while running.
    pub outcome: Option<SessionStatus>,
    pub runtime_seconds: u64,
    pub tokens: Tokens,
    pub cost_usd: Option<f64>,
}

impl SessionUse {
    fn new(session_id: &str) -> SessionUse {
        SessionUse {
            session_id: session_id.to_string(),
            started_at: None,
            ended_at: None,
            outcome: None,
            runtime_seconds: 0,
            tokens: Tokens::default(),
            cost_usd: None,
        }
    }

    /// When it counts: its start, else its end.
    pub fn counted_at(&self) -> Option<Timestamp> {
        self.started_at.or(self.ended_at)
    }
}

/// One session per id, in the order they started (pure).
pub fn sessions<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<SessionUse> {
    let mut order: Vec<String> = Vec::new();
    let mut reported: BTreeMap<String, bool> = BTreeMap::new();
    let mut by_id: BTreeMap<String, SessionUse> = BTreeMap::new();
    for entry in entries {
        let id = match &entry.event {
            Event::SessionStart(e) => &e.session_id,
            Event::SessionEnd(e) => &e.session_id,
            Event::Error(e) | Event::Timeout(e) => &e.session_id,
            Event::SessionUsage(e) => &e.session_id,
            _ => continue,
        };
        if !by_id.contains_key(id) {
            order.push(id.clone());
        }
        let s = by_id
            .entry(id.clone())
            .or_insert_with(|| SessionUse::new(id));
        match &entry.event {
            Event::SessionStart(_) => s.started_at = Some(entry.ts),
            Event::SessionEnd(e) => {
                s.ended_at = Some(entry.ts);
                s.outcome = Some(e.outcome);
                s.runtime_seconds = e.duration_seconds.unwrap_or(0).max(0) as u64;
                if !reported.get(id).copied().unwrap_or(false) {
                    if let Some(t) = e.tokens_used {
                        s.tokens.total = t.min(MAX_SESSION_TOKENS);
                    }
                    if e.cost_usd.is_some() {
                        s.cost_usd = e.cost_usd.map(counted_cost);
                    }
                }
            }
            Event::Error(e) | Event::Timeout(e) => {
                s.ended_at = Some(entry.ts);
                s.outcome = Some(if matches!(entry.event, Event::Timeout(_)) {
                    SessionStatus::Timeout
                } else {
                    SessionStatus::Error
                });
                s.runtime_seconds = e.duration_seconds.unwrap_or(0).max(0) as u64;
            }
            Event::SessionUsage(u) => {
                reported.insert(id.clone(), true);
                let count = |n: Option<u64>| n.unwrap_or(0).min(MAX_SESSION_TOKENS);
                let t = Tokens {
                    input: count(u.input_tokens),
                    output: count(u.output_tokens),
                    cache_creation: count(u.cache_creation_input_tokens),
                    cache_read: count(u.cache_read_input_tokens),
                    total: 0,
                };
                let parts = t.input + t.output + t.cache_creation + t.cache_read;
                s.tokens = Tokens {
                    total: u.tokens_used.unwrap_or(parts).max(parts),
                    ..t
                };
                if u.cost_usd.is_some() {
                    s.cost_usd = u.cost_usd.map(counted_cost);
                }
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect()
}

/// One day's use (of one agent, or of the fleet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DayUse {
    pub sessions: u64,
    pub runtime_seconds: u64,
    pub tokens: Tokens,
    pub cost_usd: f64,
}

impl DayUse {
    pub fn add_session(&mut self, s: &SessionUse) {
        self.sessions = self.sessions.saturating_add(1);
        self.runtime_seconds = self.runtime_seconds.saturating_add(s.runtime_seconds);
        self.tokens.add(&s.tokens);
        self.cost_usd = add_cost(self.cost_usd, s.cost_usd.unwrap_or(0.0));
    }

    pub fn add(&mut self, o: &DayUse) {
        self.sessions = self.sessions.saturating_add(o.sessions);
        self.runtime_seconds = self.runtime_seconds.saturating_add(o.runtime_seconds);
        self.tokens.add(&o.tokens);
        self.cost_usd = add_cost(self.cost_usd, o.cost_usd);
    }
}

/// The day `t` falls on in `tz`.
pub fn day_of(t: Timestamp, tz: Zone) -> NaiveDate {
    t.0.with_timezone(&tz).date_naive()
}

/// Sessions added up per day (in `tz`) of the time they count at (pure).
pub fn by_day(sessions: &[SessionUse], tz: Zone) -> BTreeMap<NaiveDate, DayUse> {
    let mut out: BTreeMap<NaiveDate, DayUse> = BTreeMap::new();
    for s in sessions {
        if let Some(t) = s.counted_at() {
            out.entry(day_of(t, tz)).or_default().add_session(s);
        }
    }
    out
}

/// One journal's sessions that counted at or after `since` (and those
/// still running that started since).
pub fn read(store: &Store, journal_path: &Path, since: Timestamp) -> Result<Vec<SessionUse>> {
    // A session started before `since` may end after it: read a little
    // further back than asked (sessions are at most a day long in any sane
    // config), then keep what counts since.
    let entries = journal::read_since(
        store,
        journal_path,
        since.minus(Duration::from_secs(86_400)),
    )?;
    Ok(sessions(&entries)
        .into_iter()
        .filter(|s| s.counted_at().is_some_and(|t| t >= since))
        .collect())
}

/// Daily limits (per agent, or for the whole fleet), as configured.
pub use crate::config::Budget;

/// A limit a day's use has reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exceeded {
    /// `max_sessions`, `max_runtime`, `max_cost_usd` or `max_tokens`.
    pub limit: &'static str,
    pub used: String,
    pub allowed: String,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} reached: {} of {}",
            self.limit, self.used, self.allowed
        )
    }
}

/// What is left of a budget today; `None` where there is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Left {
    pub sessions: Option<u64>,
    pub runtime_seconds: Option<u64>,
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
}

impl Budget {
    pub fn is_unlimited(&self) -> bool {
        *self == Budget::default()
    }

    /// The first limit `used` has reached (a wake would start one more
    /// session: `max_sessions` is reached at equality, the others once the
    /// use is at or over them).
    pub fn first_exceeded(&self, used: &DayUse) -> Option<Exceeded> {
        if let Some(max) = self.max_sessions
            && used.sessions >= max
        {
            return Some(Exceeded {
                limit: "max_sessions",
                used: used.sessions.to_string(),
                allowed: max.to_string(),
            });
        }
        if let Some(max) = self.max_runtime
            && used.runtime_seconds >= max.as_secs()
        {
            return Some(Exceeded {
                limit: "max_runtime",
                used: humantime::format_duration(Duration::from_secs(used.runtime_seconds))
                    .to_string(),
                allowed: humantime::format_duration(max).to_string(),
            });
        }
        if let Some(max) = self.max_tokens
            && used.tokens.total >= max
        {
            return Some(Exceeded {
                limit: "max_tokens",
                used: used.tokens.total.to_string(),
                allowed: max.to_string(),
            });
        }
        if let Some(max) = self.max_cost_usd
            && used.cost_usd >= max
        {
            return Some(Exceeded {
                limit: "max_cost_usd",
                used: format!("${:.2}", used.cost_usd),
                allowed: format!("${max:.2}"),
            });
        }
        None
    }

    pub fn left(&self, used: &DayUse) -> Left {
        Left {
            sessions: self.max_sessions.map(|m| m.saturating_sub(used.sessions)),
            runtime_seconds: self
                .max_runtime
                .map(|m| m.as_secs().saturating_sub(used.runtime_seconds)),
            cost_usd: self.max_cost_usd.map(|m| (m - used.cost_usd).max(0.0)),
            tokens: self.max_tokens.map(|m| m.saturating_sub(used.tokens.total)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ts: &str, event: serde_json::Value) -> Entry {
        let mut v = event;
        v["ts"] = serde_json::Value::String(ts.into());
        serde_json::from_value(v).unwrap()
    }

    fn journal() -> Vec<Entry> {
        vec![
            entry(
                "2026-11-23T23:30:00Z",
                serde_json::json!({"event": "session_start", "session_id": "a", "type": "research"}),
            ),
            entry(
                "2026-11-24T00:10:00Z",
                serde_json::json!({"event": "session_end", "session_id": "a", "outcome": "completed", "duration_seconds": 2400, "tokens_used": 999, "cost_usd": 9.0}),
            ),
            entry(
                "2026-11-24T00:10:01Z",
                serde_json::json!({"event": "session_usage", "session_id": "a", "input_tokens": 10, "output_tokens": 20, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 40, "tokens_used": 100, "cost_usd": 0.5}),
            ),
            entry(
                "2026-11-24T08:00:00Z",
                serde_json::json!({"event": "session_start", "session_id": "b", "type": "research"}),
            ),
            entry(
                "2026-11-24T09:30:00Z",
                serde_json::json!({"event": "timeout", "session_id": "b", "reason": "timed out", "duration_seconds": 5400}),
            ),
            entry(
                "2026-11-24T10:00:00Z",
                serde_json::json!({"event": "session_start", "session_id": "c", "type": "research"}),
            ),
            entry(
                "2026-11-24T10:05:00Z",
                serde_json::json!({"event": "session_end", "session_id": "c", "outcome": "completed", "duration_seconds": 300, "tokens_used": 1000, "cost_usd": 0.25}),
            ),
        ]
    }

    #[test]
    fn sessions_take_runtime_from_the_end_and_usage_from_the_daemon_over_the_script() {
        let s = sessions(&journal());
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].session_id, "a");
        assert_eq!(s[0].runtime_seconds, 2400);
        assert_eq!(
            s[0].tokens.total, 100,
            "session_usage wins over session_end's figures"
        );
        assert_eq!(s[0].tokens.cache_read, 40);
        assert_eq!(s[0].cost_usd, Some(0.5));
        assert_eq!(s[1].outcome, Some(SessionStatus::Timeout));
        assert_eq!(s[1].runtime_seconds, 5400);
        assert_eq!(
            s[2].tokens.total, 1000,
            "a script's figures when the daemon reported none"
        );
        assert_eq!(s[2].cost_usd, Some(0.25));
    }

    #[test]
    fn a_session_counts_on_the_day_it_started_in_the_zone() {
        let s = sessions(&journal());
        let utc = by_day(&s, crate::zone::Zone::UTC);
        let d23 = NaiveDate::from_ymd_opt(2026, 11, 23).unwrap();
        let d24 = NaiveDate::from_ymd_opt(2026, 11, 24).unwrap();
        assert_eq!(utc[&d23].sessions, 1);
        assert_eq!(utc[&d24].sessions, 2);
        assert_eq!(utc[&d24].runtime_seconds, 5700);
        // In Lisbon (UTC+0 in November) the same; in Tokyo (UTC+9) all three
        // started on the 24th.
        let tokyo = by_day(&s, crate::zone::Zone::get("Asia/Tokyo").unwrap());
        assert_eq!(tokyo.len(), 1);
        assert_eq!(tokyo[&d24].sessions, 3);
        assert_eq!(tokyo[&d24].tokens.total, 1100);
        assert!((tokyo[&d24].cost_usd - 0.75).abs() < 1e-9);
    }

    #[test]
    fn a_budget_names_the_first_limit_reached_and_what_is_left() {
        let used = DayUse {
            sessions: 3,
            runtime_seconds: 3600,
            tokens: Tokens {
                total: 5000,
                ..Tokens::default()
            },
            cost_usd: 1.5,
        };
        assert_eq!(Budget::default().first_exceeded(&used), None);
        let b = Budget {
            max_sessions: Some(3),
            ..Budget::default()
        };
        assert_eq!(
            b.first_exceeded(&used).unwrap().to_string(),
            "max_sessions reached: 3 of 3"
        );
        let b = Budget {
            max_sessions: Some(4),
            max_runtime: Some(Duration::from_secs(7200)),
            max_tokens: Some(5000),
            max_cost_usd: Some(1.0),
        };
        assert_eq!(b.first_exceeded(&used).unwrap().limit, "max_tokens");
        let left = b.left(&used);
        assert_eq!(left.sessions, Some(1));
        assert_eq!(left.runtime_seconds, Some(3600));
        assert_eq!(left.tokens, Some(0));
        assert_eq!(left.cost_usd, Some(0.0));
        let b = Budget {
            max_cost_usd: Some(1.0),
            ..Budget::default()
        };
        assert_eq!(
            b.first_exceeded(&used).unwrap().to_string(),
            "max_cost_usd reached: $1.50 of $1.00"
        );
    }

    #[test]
    fn costs_count_within_their_bound_and_sums_stay_finite() {
        for (cost, counted) in [
            (0.25, 0.25),
            (-1.0, 0.0),
            (f64::NAN, 0.0),
            (1e308, MAX_SESSION_COST_USD),
            (f64::INFINITY, MAX_SESSION_COST_USD),
        ] {
            assert_eq!(counted_cost(cost), counted, "{cost}");
        }
        for (a, b, sum) in [
            (1.0, 2.0, 3.0),
            (f64::MAX, f64::MAX, f64::MAX),
            (f64::MAX, 1e300, f64::MAX),
        ] {
            assert_eq!(add_cost(a, b), sum);
        }
        let mut day = DayUse {
            sessions: u64::MAX,
            runtime_seconds: u64::MAX,
            tokens: Tokens {
                total: u64::MAX,
                ..Tokens::default()
            },
            cost_usd: f64::MAX,
        };
        day.add(&day.clone());
        assert_eq!(
            (day.sessions, day.tokens.total, day.cost_usd),
            (u64::MAX, u64::MAX, f64::MAX)
        );
    }
}
