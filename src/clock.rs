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
    pub fn parse(text: &str) -> Result<Self, String> {
        DateTime::parse_from_rfc3339(text)
            .map(|t| Timestamp::from_datetime(t.with_timezone(&Utc)))
            .map_err(|e| {
                format!("{text:?} is not an RFC 3339 time like 2026-03-31T22:00:00Z ({e})")
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

    pub fn minus(&self, d: std::time::Duration) -> Timestamp {
        Timestamp(self.0 - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::zero()))
    }

    pub fn plus(&self, d: std::time::Duration) -> Timestamp {
        Timestamp(self.0 + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::zero()))
    }
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
}
