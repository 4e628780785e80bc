//! Timestamps as every state file writes them: RFC 3339, UTC, whole seconds,
//! with a `Z` (`2026-03-31T22:00:00Z`), and session ids derived from them.

use std::fmt;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub DateTime<Utc>);

impl Timestamp {
    pub fn now() -> Self {
        Timestamp(Utc::now().trunc_subsecs(0))
    }

    pub fn from_datetime(t: DateTime<Utc>) -> Self {
        Timestamp(t.trunc_subsecs(0))
    }

    /// Parse any RFC 3339 time (any offset) into UTC.
    pub fn parse(text: &str) -> Result<Self, ClockError> {
        DateTime::parse_from_rfc3339(text)
            .map(|t| Timestamp::from_datetime(t.with_timezone(&Utc)))
            .map_err(|cause| ClockError::NotATime {
                text: text.to_string(),
                cause,
            })
    }

    /// The session id for a session starting at this time: `YYYYMMDD-HHMMSS`.
    pub fn session_id(&self) -> String {
        self.0.format("%Y%m%d-%H%M%S").to_string()
    }

    /// A compact form for file-name suffixes: `20260331T220000Z`.
    pub fn compact(&self) -> String {
        self.0.format("%Y%m%dT%H%M%SZ").to_string()
    }

    pub fn date(&self) -> String {
        self.0.format("%Y-%m-%d").to_string()
    }

    pub fn seconds_since(&self, earlier: &Timestamp) -> i64 {
        (self.0 - earlier.0).num_seconds()
    }

    /// `d` before this time, never before [`earliest`].
    pub fn minus(&self, d: std::time::Duration) -> Timestamp {
        Timestamp(earlier(self.0, d))
    }

    /// `d` after this time, never after [`latest`].
    pub fn plus(&self, d: std::time::Duration) -> Timestamp {
        Timestamp(later(self.0, d))
    }
}

/// The clock a file's age is measured by. A file's mtime is the kernel's
/// real time to the nanosecond, so settling an inbox file needs the real
/// time, read when the file is judged (after a lock wait, not before it):
/// never the daemon's [`Timestamp`]s (whole seconds, and a test may shift
/// the daemon's clock). The loop and the CLI pass [`FileClock::Real`]; a
/// test may fix the time with [`FileClock::At`]. It is a value the caller
/// hands down, so nothing below the loop reads the wall clock by itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FileClock {
    /// The system's real time, read at each [`FileClock::now`].
    #[default]
    Real,
    /// Always this time.
    At(std::time::SystemTime),
}

impl FileClock {
    /// The time now, by this clock.
    pub fn now(self) -> std::time::SystemTime {
        match self {
            FileClock::Real => std::time::SystemTime::now(),
            FileClock::At(t) => t,
        }
    }
}

/// The longest length of time any setting or flag accepts: 100 years
/// (36,525 days). Every duration is bounded here, when it is read, so that
/// no date computed from one can leave the calendar; longer is refused with
/// the field or flag that gave it.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(36_525 * 86_400);

/// Parse a length of time as people write it (`90m`, `2h 30m`, `30d`),
/// at most [`MAX_DURATION`]. The error says what to write instead; the
/// caller adds the field or flag.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, ClockError> {
    let d = humantime::parse_duration(text).map_err(|cause| ClockError::NotADuration {
        text: text.to_string(),
        cause,
    })?;
    bounded(text, d)
}

/// `d`, if it is at most [`MAX_DURATION`]; else an error saying the bound.
pub fn bounded(text: &str, d: std::time::Duration) -> Result<std::time::Duration, ClockError> {
    if d > MAX_DURATION {
        return Err(ClockError::TooLong {
            text: text.to_string(),
        });
    }
    Ok(d)
}

/// A time or a length of time that does not read: what was written, and
/// what to write instead (the caller adds the field or flag).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClockError {
    #[error("{text:?} is not an RFC 3339 time like 2026-03-31T22:00:00Z ({cause})")]
    NotATime {
        text: String,
        cause: chrono::ParseError,
    },
    #[error("{text:?} is not a duration ({cause}); write e.g. \"90m\", \"30s\", \"2h\"")]
    NotADuration {
        text: String,
        cause: humantime::DurationError,
    },
    #[error("{text:?} is longer than the maximum of 100 years (36525d); write a shorter duration")]
    TooLong { text: String },
}

/// Callers that still carry their errors as text.
impl From<ClockError> for String {
    fn from(e: ClockError) -> Self {
        e.to_string()
    }
}

/// The earliest time any computation here yields: 0001-01-01T00:00:00Z, so
/// that every result still writes as RFC 3339 with a four-digit year.
pub fn earliest() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(-62_135_596_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The latest time any computation here yields: 9999-12-31T23:59:59Z.
pub fn latest() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `t + d`, saturating at [`latest`] rather than panicking on overflow.
pub fn later(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .map_or_else(latest, |r| r.min(latest()))
}

/// `t - d`, saturating at [`earliest`] rather than panicking on overflow.
pub fn earlier(t: DateTime<Utc>, d: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .map_or_else(earliest, |r| r.max(earliest()))
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(SecondsFormat::Secs, true))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// "3h ago", "2d ago": how `status` shows past times.
pub fn ago(then: &Timestamp, now: &Timestamp) -> String {
    match now.seconds_since(then) {
        s if s < 0 => "in the future".into(),
        s => format!("{} ago", span(s)),
    }
}

/// "in 3h", "in 2d": how `status` shows future times ("due" once passed).
pub fn in_time(then: &Timestamp, now: &Timestamp) -> String {
    match then.seconds_since(now) {
        s if s <= 0 => "due".into(),
        s => format!("in {}", span(s)),
    }
}

/// A configured length of time for people, whole units from days down:
/// `30d`, `1d 12h`, `1h 30m`, `45s`, `250ms` (humantime writes `30days`).
pub fn length(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.subsec_millis());
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs % 86_400 / 3600, "h"),
        (secs % 3600 / 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A length of time in its largest sensible unit: `45s`, `12m`, `5h`, `3d`.
fn span(secs: i64) -> String {
    let (n, unit) = match secs {
        s if s < 90 => (s, "s"),
        s if s < 90 * 60 => (s / 60, "m"),
        s if s < 36 * 3600 => (s / 3600, "h"),
        s => (s / 86400, "d"),
    };
    format!("{n}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_read_like_the_config() {
        let l = |secs: u64| length(std::time::Duration::from_secs(secs));
        assert_eq!(l(30 * 86_400), "30d");
        assert_eq!(l(86_400 + 12 * 3600), "1d 12h");
        assert_eq!(l(5400), "1h 30m");
        assert_eq!(l(45), "45s");
        assert_eq!(length(std::time::Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn formats_like_the_seed() {
        let t = Timestamp::parse("2026-03-31T22:00:00.123+00:00").unwrap();
        assert_eq!(t.to_string(), "2026-03-31T22:00:00Z");
        assert_eq!(t.session_id(), "20260331-220000");
        let t = Timestamp::parse("2026-04-01T00:30:00+02:00").unwrap();
        assert_eq!(t.to_string(), "2026-03-31T22:30:00Z");
        assert!(Timestamp::parse("yesterday").is_err());
    }

    /// A seeded generator of duration texts: every unit humantime reads,
    /// numbers at the edges (0, 1, the 100-year bound and one past it,
    /// u32/u64/i64 limits) and random ones of every size.
    fn duration_texts(count: usize) -> Vec<String> {
        const UNITS: [&str; 9] = ["ns", "ms", "s", "m", "h", "d", "w", "M", "y"];
        const EDGES: [u64; 12] = [
            0,
            1,
            59,
            36_525,
            36_526,
            3_155_760_000,
            3_155_760_001,
            9_999_999_999,
            u32::MAX as u64,
            i64::MAX as u64,
            u64::MAX / 1000,
            u64::MAX,
        ];
        let mut state = 0x2026_1126_u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut texts = Vec::new();
        for n in EDGES {
            for unit in UNITS {
                texts.push(format!("{n}{unit}"));
            }
        }
        while texts.len() < count {
            let n = next() >> (next() % 64);
            let unit = UNITS[(next() % UNITS.len() as u64) as usize];
            let text = match next() % 3 {
                0 => format!("{n}{unit}"),
                1 => format!("{n}{unit} {}s", next() % 1000),
                _ => format!("{n}"),
            };
            texts.push(text);
        }
        texts
    }

    #[test]
    fn no_duration_panics_or_leaves_the_calendar() {
        let now = Timestamp::parse("2026-11-26T14:00:00Z").unwrap();
        let starts = [
            now.0,
            earliest(),
            latest(),
            DateTime::<Utc>::MIN_UTC,
            DateTime::<Utc>::MAX_UTC,
        ];
        let (mut accepted, mut refused) = (0, 0);
        for text in duration_texts(20_000) {
            match parse_duration(&text) {
                Ok(d) => {
                    accepted += 1;
                    assert!(d <= MAX_DURATION, "{text}: {d:?}");
                    for t in starts {
                        let (a, b) = (later(t, d), earlier(t, d));
                        assert!(
                            a >= t.min(latest()) && a <= latest().max(t),
                            "{text} after {t}"
                        );
                        assert!(
                            b <= t.max(earliest()) && b >= earliest().min(t),
                            "{text} before {t}"
                        );
                    }
                    // Within the bound, nothing saturates from today.
                    assert_eq!(
                        later(now.0, d) - now.0,
                        chrono::Duration::from_std(d).unwrap()
                    );
                    assert_eq!(
                        now.0 - earlier(now.0, d),
                        chrono::Duration::from_std(d).unwrap()
                    );
                    assert!(Timestamp::parse(&now.plus(d).to_string()).is_ok(), "{text}");
                }
                Err(e) => {
                    refused += 1;
                    let e = e.to_string();
                    assert!(e.contains(&format!("{text:?}")), "{e}");
                    assert!(
                        e.contains("maximum of 100 years") || e.contains("is not a duration"),
                        "{e}"
                    );
                }
            }
            // Unchecked durations (any std Duration) saturate, never panic.
            if let Ok(d) = humantime::parse_duration(&text) {
                for t in starts {
                    let _ = (later(t, d), earlier(t, d));
                }
            }
        }
        assert!(
            accepted > 1000 && refused > 1000,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn clock_errors_say_what_they_said_as_text() {
        let e = Timestamp::parse("soon").unwrap_err();
        assert!(matches!(e, ClockError::NotATime { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("\"soon\" is not an RFC 3339 time like 2026-03-31T22:00:00Z ("),
            "{e}"
        );
        let e = parse_duration("later").unwrap_err();
        assert!(matches!(e, ClockError::NotADuration { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("\"later\" is not a duration ("),
            "{e}"
        );
        assert!(
            e.to_string()
                .ends_with("); write e.g. \"90m\", \"30s\", \"2h\""),
            "{e}"
        );
        assert_eq!(String::from(e.clone()), e.to_string());
    }

    #[test]
    fn the_bound_is_a_hundred_years_and_the_edges_write_as_rfc3339() {
        assert!(parse_duration("36525d").is_ok());
        let e = parse_duration("36526d").unwrap_err();
        assert_eq!(
            e,
            ClockError::TooLong {
                text: "36526d".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "\"36526d\" is longer than the maximum of 100 years (36525d); write a shorter duration"
        );
        assert_eq!(Timestamp(latest()).to_string(), "9999-12-31T23:59:59Z");
        assert_eq!(Timestamp(earliest()).to_string(), "0001-01-01T00:00:00Z");
        let far = std::time::Duration::from_secs(u64::MAX);
        assert_eq!(later(Utc::now(), far), latest());
        assert_eq!(earlier(Utc::now(), far), earliest());
        for t in [earliest(), latest()] {
            assert_eq!(Timestamp::parse(&Timestamp(t).to_string()).unwrap().0, t);
        }
    }
}
