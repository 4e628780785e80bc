//! Claude Code's usage and rate limits, recognised in what a session prints:
//! pure functions over text and stream-json values, `now` passed in, no IO.
//! This module says *what* limit was hit and *when* it lifts; what to do
//! about it (hold the agents that share the credential, escalate, probe) is
//! the daemon's. It never reads the clock, the environment or a file, and it
//! never panics, whatever the input.
//!
//! # The forms, and where they come from
//!
//! Claude Code reports a limit in several shapes, which changed between
//! versions; all of them are recognised.
//!
//! | form | kind | reset | seen in |
//! |---|---|---|---|
//! | stream-json `{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1784399400,"rateLimitType":"five_hour",...}}` | [`LimitKind::UsageLimit`] (`rateLimitType` `overage`: [`LimitKind::ExtraUsageExhausted`]) | `resetsAt`, epoch seconds | captured logs quoted in paperclipai/paperclip#5776, unfence-labs/hive#87, framework/the-framework#517, anthropics/claude-code#38673 |
//! | the same with `"status":"allowed_warning"` (`utilization`, `surpassedThreshold`), or `rejected` while `isUsingOverage` (the session goes on with extra usage) | a [`Warning`], not a limit | `resetsAt` | openclaw/openclaw#80528 (a request that was served); Claude Code's own message logic as quoted by launchers |
//! | the synthetic assistant turn `{"type":"assistant","message":{"model":"<synthetic>",...,"content":[{"type":"text","text":"You've hit your session limit · resets 6:30pm (UTC)"}]},"error":"rate_limit",...}` and the result `{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"You've hit your session limit · resets 6:30pm (UTC)",...}` | from the text | from the text | gptme/gptme-contrib#1582; the same captured sequence in several launchers' tests |
//! | `You've hit your limit · resets 1pm (Europe/Lisbon)`, `… your session limit …`, `… weekly limit …`, `… Opus limit …`, `… Sonnet limit …`; `resets Jan 30, 11:30am (Asia/Calcutta)`, `resets Apr 23 at 4pm (America/Recife)`; `-` for `·`, `/login …` glued after the zone | [`LimitKind::UsageLimit`] | the next such wall-clock time in that zone | anthropics/claude-code#18190, #21562, #22976, #51981, #54698, #74079, #79136, #94390 |
//! | `You're out of extra usage · resets 5pm (America/Los_Angeles)`, `You're out of extra usage · resets Feb 4, 8pm (Europe/Budapest)`, `You're out of usage credits` | [`LimitKind::ExtraUsageExhausted`] | from the text, when it names one | anthropics/claude-code#22603, #29741, #42654, #55417; frankbria/ralph-claude-code#100 (no zone: `resets 9pm`) |
//! | `Claude AI usage limit reached\|1755615600` (Claude Code 1.0) | [`LimitKind::UsageLimit`] | the epoch | anthropics/claude-code#4375, #6119, #9046, #11429 |
//! | `Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).`, `5-hour limit reached ∙ resets 5am` (1.0 text) | [`LimitKind::UsageLimit`] | from the text | anthropics/claude-code#6119, #6392, #7641, #10188 |
//! | `API Error: Rate limit reached`, `API Error: Request rejected (429) · Rate limited…`, `Error: 429 {"type":"error","error":{"type":"rate_limit_error",…}}` | [`LimitKind::ApiRateLimit`] | unknown: the API says "try again later" | anthropics/claude-code#30723, #34413, #36154, #69023 |
//! | `Your usage allocation has been disabled by your admin`, `Your group's usage limit is set to $0`, `Your seat type doesn't include …`, `This service is disabled for your org`, `Your org is out of usage …`, `You've hit your … spend limit`, `You've hit your org's …` | [`LimitKind::AdminDisabled`] | none: only an admin (or money) lifts it | Claude Code's limit messages (`overageDisabledReason` `member_level_disabled`, `member_zero_credit_limit`, `group_zero_credit_limit`, …) and the SDK's `USAGE_LIMIT_ERROR_PREFIXES`, as quoted by launchers that match them |
//!
//! `You've hit your fast limit` is not a limit of the session (Claude Code
//! leaves fast mode and goes on) and is ignored; `You've used 90% of your
//! weekly limit · resets …` and `Approaching …` are warnings.
//!
//! # Trusting what is read
//!
//! An agent that works on this very code prints these phrases itself (a
//! test, a fixture, a commit message). So:
//!
//! - text forms count only at the start of a line (after terminal
//!   decorations such as `⎿` and an `API Error:` or `Error:` prefix), and
//!   the API rate-limit forms only after such a prefix;
//! - in stream-json, only Claude Code's own records count: the
//!   `rate_limit_event`, an assistant turn Claude Code made up itself
//!   (model `<synthetic>` or a top-level `error`), a result with
//!   `is_error: true`, and an `error` record. The model's own turns, tool
//!   results and a successful result (which echoes the last turn) are never
//!   read as limits.
//!
//! # Reset times
//!
//! An epoch (`resetsAt`, `…reached|<epoch>`) is taken as is (milliseconds
//! are recognised by their size). A wall-clock time is read in the IANA zone
//! in parentheses: `1pm`, `1:30pm`, `12am` (midnight), `13:00`, `9:30 AM`,
//! with an optional date (`Nov 25,`, `Apr 23 at`) or weekday (`Mon`). A time
//! alone is the next such time after `now` in that zone (today or tomorrow,
//! through DST changes and midnight); one that passed less than
//! [`JUST_PASSED`] ago is read as that past time, since "resets 1pm" printed
//! at 1:00:20pm means the reset just happened, not that it is a day away. A
//! date is taken in the year that puts it nearest to `now`. A wall-clock
//! time that a DST change skips is read one hour later; one that occurs
//! twice is the first.
//!
//! A reset that is not after `now`, or more than [`MAX_RESET_AHEAD`] ahead,
//! is not believed: [`Limit::resets_at`] is `None` and [`Limit::note`] says
//! why. So is a wall-clock time without a zone or with a zone the time zone
//! database (tzdata, [`crate::zone`]) does not have. Without a reset the daemon waits a capped time and probes.
//!
//! # Cost
//!
//! Every function does work linear in its input and bounded per line: only
//! the first [`MAX_TEXT_LINE_BYTES`] of a text line are read, a stream-json
//! line longer than [`MAX_JSON_LINE_BYTES`] is not parsed (a limit record is
//! a few hundred bytes), and [`scan_output`] reads the last
//! [`MAX_SCAN_BYTES`] of each stream (a limit ends a session). The streaming
//! [`LineScanner`] keeps at most [`MAX_JSON_LINE_BYTES`] of a line (so it
//! reads `--output-format stream-json` and text, while a whole
//! `--output-format json --verbose` array is for [`scan_output`]). A line
//! with none of the words every form has (`limit`, `usage`, `rate`, `429`,
//! …; for JSON `rate_limit`, `"is_error":true`, `<synthetic>`, `"error"`)
//! is dropped before it is copied or parsed: on this machine the scanner
//! reads ordinary stream-json at about 200 MB/s.

use std::fmt;

use crate::zone::Zone;
use chrono::{
    DateTime, Datelike, Days, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeDelta,
    TimeZone, Utc, Weekday,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A reset further ahead than this is not believed (no window is longer
/// than a week; a day of slack).
pub const MAX_RESET_AHEAD: TimeDelta = TimeDelta::days(8);

/// A time-only reset that passed less than this long ago is read as past
/// (so unknown), not as the same time tomorrow.
pub const JUST_PASSED: TimeDelta = TimeDelta::hours(1);

/// The part of a text line that is read.
pub const MAX_TEXT_LINE_BYTES: usize = 2048;

/// Longer stream-json lines are not parsed.
pub const MAX_JSON_LINE_BYTES: usize = 64 * 1024;

/// [`scan_output`] reads this much of the end of each stream.
pub const MAX_SCAN_BYTES: usize = 1024 * 1024;

/// [`Limit::evidence`] keeps at most this many characters.
pub const EVIDENCE_CHARS: usize = 300;

/// The jitter [`hold_until`] adds to a known reset, in seconds (inclusive):
/// agents that share a credential do not all start in the same second.
pub const JITTER_SECONDS: (u64, u64) = (30, 120);

/// The default longest jitter after a reset (`JITTER_SECONDS.1`).
pub const DEFAULT_JITTER: std::time::Duration = std::time::Duration::from_secs(JITTER_SECONDS.1);

/// What kind of limit stopped the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// The plan's usage window (five-hour session, weekly, Opus, Sonnet) is
    /// spent. Timed: it lifts at the reset.
    UsageLimit,
    /// Extra usage (or usage credits) bought beyond the plan is spent.
    /// Timed when Claude Code names a reset.
    ExtraUsageExhausted,
    /// The API refused a request for its rate (HTTP 429, `rate_limit_error`).
    /// Short, and the reset is usually unknown.
    ApiRateLimit,
    /// An admin disabled the usage allocation, or a spend cap only an admin
    /// or money lifts. Not timed: never waited on, escalated to a human.
    AdminDisabled,
}

impl LimitKind {
    /// The snake_case name, as in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::UsageLimit => "usage_limit",
            LimitKind::ExtraUsageExhausted => "extra_usage_exhausted",
            LimitKind::ApiRateLimit => "api_rate_limit",
            LimitKind::AdminDisabled => "admin_disabled",
        }
    }

    /// Whether waiting can lift it (all but [`LimitKind::AdminDisabled`]).
    pub fn is_timed(self) -> bool {
        self != LimitKind::AdminDisabled
    }

    /// Which kind says more when two findings disagree.
    fn specificity(self) -> u8 {
        match self {
            LimitKind::ApiRateLimit => 0,
            LimitKind::UsageLimit => 1,
            LimitKind::ExtraUsageExhausted => 2,
            LimitKind::AdminDisabled => 3,
        }
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit that stopped (or will stop) the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub kind: LimitKind,
    /// When it lifts; `None` when unknown or not believed (see `note`).
    #[serde(with = "optional_time")]
    pub resets_at: Option<DateTime<Utc>>,
    /// Claude Code's `rateLimitType`: `five_hour`, `seven_day`,
    /// `seven_day_opus`, `seven_day_sonnet`, `overage`, … (from the event,
    /// or from the text's "session limit", "weekly limit", …).
    pub window: Option<String>,
    /// The text (or a summary of the record) it was recognised in, at most
    /// [`EVIDENCE_CHARS`] characters.
    pub evidence: String,
    /// Why a reset that was printed is not in `resets_at`.
    pub note: Option<String>,
}

/// Claude Code says a limit is near (`allowed_warning`, `You've used 90% of
/// your weekly limit`): information for the log, not a limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Warning {
    pub window: Option<String>,
    #[serde(with = "optional_time")]
    pub resets_at: Option<DateTime<Utc>>,
    /// The share of the window used, 0 to 1, when known.
    pub utilization: Option<f64>,
    pub evidence: String,
}

/// `resets_at` as the state files write times (RFC 3339, UTC, `Z`).
mod optional_time {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::clock::Timestamp;

    pub fn serialize<S: Serializer>(
        time: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        time.map(Timestamp::from_datetime).serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        Ok(Option::<Timestamp>::deserialize(deserializer)?.map(|t| t.0))
    }
}

/// What one line or record says about limits.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    Limit(Limit),
    Warning(Warning),
}

impl Finding {
    pub fn limit(self) -> Option<Limit> {
        match self {
            Finding::Limit(limit) => Some(limit),
            Finding::Warning(_) => None,
        }
    }
}

// ---- entry points --------------------------------------------------------------

/// The limit or warning in plain text (a result's text, a line of stderr,
/// `--output-format text` output): each line is read on its own, and the
/// most specific limit wins over any warning (the last warning otherwise).
pub fn from_text(text: &str, now: DateTime<Utc>) -> Option<Finding> {
    let mut verdict = Verdict::default();
    let mut warning = None;
    for line in text.lines() {
        match text_line(line, now) {
            Some(Found::Limit(candidate)) => verdict.add(candidate),
            Some(Found::Warning(w)) => warning = Some(w),
            None => {}
        }
    }
    verdict
        .into_limit()
        .map(Finding::Limit)
        .or(warning.map(Finding::Warning))
}

/// The limit or warning in one line of `--output-format stream-json` (or
/// the one line of `--output-format json`). A line that is not such a JSON
/// record is `None`: use [`from_text`] for text.
pub fn from_stream_line(line: &[u8], now: DateTime<Utc>) -> Option<Finding> {
    let line = line.trim_ascii();
    if line.len() > MAX_JSON_LINE_BYTES || !line.starts_with(b"{") {
        return None;
    }
    let value: Value = serde_json::from_slice(line).ok()?;
    from_stream_value(&value, now)
}

/// [`from_stream_line`] for a record already parsed (a stream-json line, or
/// the result object of `--output-format json`).
pub fn from_stream_value(value: &Value, now: DateTime<Utc>) -> Option<Finding> {
    record(value, now).map(Found::into_finding)
}

/// The most specific limit in a whole session's output, stdout and stderr,
/// in any output format: `None` if there is none. Reads the last
/// [`MAX_SCAN_BYTES`] of each stream.
///
/// Most specific: [`LimitKind::AdminDisabled`] beats everything (it is
/// never waited on); otherwise the kind is the most specific one seen (extra
/// usage over the plan's limit over an API rate limit) and the reset the
/// most precise known one of any usage limit seen (an epoch from a
/// `rate_limit_event` over an epoch in text over a wall-clock time), so a
/// known reset beats an unknown one. An API rate limit lends no reset.
pub fn scan_output(stdout: &[u8], stderr: &[u8], now: DateTime<Utc>) -> Option<Limit> {
    let mut verdict = Verdict::default();
    for stream in [stdout, stderr] {
        let tail = &stream[stream.len().saturating_sub(MAX_SCAN_BYTES)..];
        // `--output-format json` pretty-printed (or, with --verbose, an
        // array of records) is one document, not one record per line.
        let whole = tail.trim_ascii();
        if whole.first().is_some_and(|&b| b == b'{' || b == b'[')
            && whole.contains(&b'\n')
            && let Ok(value) = serde_json::from_slice::<Value>(whole)
        {
            let records = match &value {
                Value::Array(items) => items.iter().collect(),
                _ => vec![&value],
            };
            for item in records {
                if let Some(Found::Limit(candidate)) = record(item, now) {
                    verdict.add(candidate);
                }
            }
        }
        for line in tail.split(|&b| b == b'\n') {
            if let Some(Found::Limit(candidate)) = any_line(line, now) {
                verdict.add(candidate);
            }
        }
    }
    verdict.into_limit()
}

/// When to try again after `limit`: its reset plus a jitter between a
/// quarter of `max_jitter` and `max_jitter` ([`JITTER_SECONDS`] by default,
/// `[usage_limits] jitter`), the same for the same `jitter_seed` (e.g. a
/// hash of the agent's name). `None` for a limit without a known reset (the caller
/// waits a capped time, then probes) and for [`LimitKind::AdminDisabled`]
/// (never waited on). A reset already past counts from `now`.
pub fn hold_until(
    limit: &Limit,
    now: DateTime<Utc>,
    jitter_seed: u64,
    max_jitter: std::time::Duration,
) -> Option<DateTime<Utc>> {
    if !limit.kind.is_timed() {
        return None;
    }
    let reset = limit.resets_at?.max(now);
    let high = max_jitter.as_secs().min(3600);
    let low = high / 4;
    let jitter = low + splitmix64(jitter_seed) % (high - low + 1);
    reset.checked_add_signed(TimeDelta::seconds(i64::try_from(jitter).ok()?))
}

fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---- streaming -----------------------------------------------------------------

/// Lines of one output stream as it arrives in chunks (split anywhere), each
/// read as a stream-json record or as text; keeps the most specific limit
/// so far. One per stream. Memory: at most [`MAX_JSON_LINE_BYTES`] of the
/// current line; a longer line is read by its first bytes only.
#[derive(Debug, Default)]
pub struct LineScanner {
    line: Vec<u8>,
    /// Bytes of the current line that were not kept.
    dropped: bool,
    verdict: Verdict,
}

impl LineScanner {
    pub fn new() -> LineScanner {
        LineScanner::default()
    }

    /// Feeds a chunk; returns what the lines it completed say, in order.
    pub fn push(&mut self, mut chunk: &[u8], now: DateTime<Utc>) -> Vec<Finding> {
        let mut found = Vec::new();
        while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
            self.keep(&chunk[..at]);
            found.extend(self.end_line(now));
            chunk = &chunk[at + 1..];
        }
        self.keep(chunk);
        found
    }

    /// Reads the last line if it had no newline; returns what it says.
    pub fn finish(&mut self, now: DateTime<Utc>) -> Option<Finding> {
        if self.line.is_empty() && !self.dropped {
            return None;
        }
        self.end_line(now)
    }

    /// The most specific limit seen so far.
    pub fn limit(&self) -> Option<&Limit> {
        self.verdict.best.as_ref().map(|c| &c.limit)
    }

    /// The most specific limit seen, consuming the scanner.
    pub fn into_limit(self) -> Option<Limit> {
        self.verdict.into_limit()
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = MAX_JSON_LINE_BYTES.saturating_sub(self.line.len());
        self.line.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.dropped |= bytes.len() > room;
    }

    fn end_line(&mut self, now: DateTime<Utc>) -> Option<Finding> {
        // A truncated line is no JSON record; its start may still be text.
        let found = if self.dropped {
            text_line(&String::from_utf8_lossy(head(&self.line)), now)
        } else {
            any_line(&self.line, now)
        };
        self.line.clear();
        self.dropped = false;
        if let Some(Found::Limit(candidate)) = &found {
            self.verdict.add(candidate.clone());
        }
        found.map(Found::into_finding)
    }
}

// ---- the most specific limit ---------------------------------------------------

/// Combines the limits found in one output into the most specific one:
///
/// - [`LimitKind::AdminDisabled`] beats everything (it is never waited on);
/// - otherwise the kind is the most specific one seen (extra usage over
///   the plan's limit over an API rate limit), and the reset the most
///   precise known one of any usage limit seen (an epoch from a
///   `rate_limit_event` over an epoch in text over a wall-clock time): a
///   known reset beats an unknown one, so "You're out of extra usage" with
///   no time and a rejected `rate_limit_event` with `resetsAt` give extra
///   usage exhausted until `resetsAt`. An API rate limit lends no reset.
#[derive(Debug, Default, Clone)]
struct Verdict {
    best: Option<Candidate>,
}

#[derive(Debug, Clone, PartialEq)]
struct Candidate {
    limit: Limit,
    /// How exact `limit.resets_at` is: 0 none, 1 wall clock, 2 epoch in
    /// text, 3 epoch in a structured record.
    precision: u8,
}

impl Verdict {
    fn add(&mut self, new: Candidate) {
        let Some(old) = self.best.take() else {
            self.best = Some(new);
            return;
        };
        self.best = Some(combine(old, new));
    }

    fn into_limit(self) -> Option<Limit> {
        self.best.map(|c| c.limit)
    }
}

fn combine(old: Candidate, new: Candidate) -> Candidate {
    if old.limit.kind == LimitKind::AdminDisabled {
        return old;
    }
    if new.limit.kind == LimitKind::AdminDisabled {
        return new;
    }
    // The base gives the kind and the evidence; ties go to the newer one.
    let (mut base, other) = if new.limit.kind.specificity() >= old.limit.kind.specificity() {
        (new, old)
    } else {
        (old, new)
    };
    let lends_reset = other.limit.kind != LimitKind::ApiRateLimit
        && other.limit.resets_at.is_some()
        && other.precision > base.precision;
    if lends_reset {
        base.limit.resets_at = other.limit.resets_at;
        base.limit.note = None;
        base.precision = other.precision;
        if other.limit.window.is_some() {
            base.limit.window = other.limit.window.clone();
        }
    }
    if base.limit.window.is_none() && other.limit.kind != LimitKind::ApiRateLimit {
        base.limit.window = other.limit.window;
    }
    if base.limit.resets_at.is_none() && base.limit.note.is_none() {
        base.limit.note = other.limit.note;
    }
    base
}

// ---- one line, one record ------------------------------------------------------

enum Found {
    Limit(Candidate),
    Warning(Warning),
}

impl Found {
    fn into_finding(self) -> Finding {
        match self {
            Found::Limit(candidate) => Finding::Limit(candidate.limit),
            Found::Warning(warning) => Finding::Warning(warning),
        }
    }
}

/// A line of output: a stream-json record if it is one, text otherwise.
fn any_line(line: &[u8], now: DateTime<Utc>) -> Option<Found> {
    let trimmed = line.trim_ascii();
    // A JSON record is read by its fields, never as text: its text may be
    // the model's own words. A line that only looks like JSON (or is too
    // long to parse) is read as text: a bare API error body such as
    // `{"type":"error","error":{"type":"rate_limit_error",…}}` cut off.
    if trimmed.starts_with(b"{") || trimmed.starts_with(b"[") {
        // Most stream-json lines are the model's turns and tool results:
        // not parsed unless they carry a field a limit record has.
        if !mentions_any(trimmed, JSON_MARKERS, false) {
            return None;
        }
        if trimmed.len() <= MAX_JSON_LINE_BYTES
            && let Ok(value) = serde_json::from_slice::<Value>(trimmed)
        {
            return match &value {
                // `--output-format json --verbose`, compact: one array.
                Value::Array(items) => {
                    let mut verdict = Verdict::default();
                    let mut warning = None;
                    for item in items {
                        match record(item, now) {
                            Some(Found::Limit(candidate)) => verdict.add(candidate),
                            Some(Found::Warning(w)) => warning = Some(w),
                            None => {}
                        }
                    }
                    verdict
                        .best
                        .map(Found::Limit)
                        .or(warning.map(Found::Warning))
                }
                _ => record(&value, now),
            };
        }
    }
    text_line(&String::from_utf8_lossy(head(trimmed)), now)
}

/// Fields without one of which a JSON line is no limit record.
const JSON_MARKERS: &[&[u8]] = &[
    b"rate_limit",
    b"\"is_error\":true",
    b"\"is_error\": true",
    b"<synthetic>",
    b"\"error\"",
];

/// Words without one of which a text line is no limit (compared ASCII-case-
/// insensitively): every form above has one.
const TEXT_MARKERS: &[&[u8]] = &[
    b"limit",
    b"usage",
    b"rate",
    b"429",
    b"seat",
    b"service",
    b"too many",
];

/// Whether `haystack` contains one of `needles` (`any_case`: ASCII letters
/// compared case-insensitively). A cheap filter before any allocation.
fn mentions_any(haystack: &[u8], needles: &[&[u8]], any_case: bool) -> bool {
    needles.iter().any(|needle| {
        haystack.windows(needle.len()).any(|window| {
            if any_case {
                window.eq_ignore_ascii_case(needle)
            } else {
                window == *needle
            }
        })
    })
}

/// The first [`MAX_TEXT_LINE_BYTES`] of a line (a cut character becomes
/// U+FFFD when decoded).
fn head(line: &[u8]) -> &[u8] {
    &line[..line.len().min(MAX_TEXT_LINE_BYTES)]
}

/// A stream-json record (or the result object of `--output-format json`).
fn record(value: &Value, now: DateTime<Utc>) -> Option<Found> {
    let object = value.as_object()?;
    let str_field = |name: &str| object.get(name).and_then(Value::as_str);
    match str_field("type")? {
        "rate_limit_event" => rate_limit_event(object.get("rate_limit_info")?.as_object()?, now),
        "assistant" => {
            let message = object.get("message").and_then(Value::as_object);
            let error = str_field("error");
            let synthetic = error.is_some()
                || message
                    .and_then(|m| m.get("model"))
                    .and_then(Value::as_str)
                    .is_some_and(|model| model == "<synthetic>");
            if !synthetic {
                return None;
            }
            let texts = message
                .and_then(|m| m.get("content"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|block| block.get("text").and_then(Value::as_str));
            let mut verdict = Verdict::default();
            let mut evidence = None;
            for text in texts {
                evidence.get_or_insert(text);
                for line in text.lines() {
                    if let Some(Found::Limit(candidate)) = text_line(line, now) {
                        verdict.add(candidate);
                    }
                }
            }
            match verdict.best {
                Some(candidate) => Some(Found::Limit(candidate)),
                None if error == Some("rate_limit") => Some(api_rate_limit(
                    evidence.unwrap_or("synthetic assistant turn with error \"rate_limit\""),
                )),
                None => None,
            }
        }
        "result" => {
            // A successful result echoes the model's last turn: not read.
            if object.get("is_error").and_then(Value::as_bool) != Some(true) {
                return None;
            }
            let mut verdict = Verdict::default();
            for name in ["result", "error"] {
                for line in str_field(name).unwrap_or("").lines() {
                    if let Some(Found::Limit(candidate)) = text_line(line, now) {
                        verdict.add(candidate);
                    }
                }
            }
            let status = object.get("api_error_status").and_then(|s| {
                s.as_u64()
                    .or_else(|| s.as_str().and_then(|s| s.trim().parse().ok()))
            });
            match verdict.best {
                Some(candidate) => Some(Found::Limit(candidate)),
                None if status == Some(429) => Some(api_rate_limit(
                    str_field("result").unwrap_or("result with api_error_status 429"),
                )),
                None => None,
            }
        }
        "error" => {
            let error = object.get("error").and_then(Value::as_object);
            let kind = error.and_then(|e| e.get("type")).and_then(Value::as_str);
            let message = error.and_then(|e| e.get("message")).and_then(Value::as_str);
            if let Some(Found::Limit(candidate)) = message.and_then(|m| text_line(m, now)) {
                return Some(Found::Limit(candidate));
            }
            (kind == Some("rate_limit_error"))
                .then(|| api_rate_limit(message.unwrap_or("rate_limit_error")))
        }
        _ => None,
    }
}

fn api_rate_limit(evidence: &str) -> Found {
    Found::Limit(Candidate {
        limit: Limit {
            kind: LimitKind::ApiRateLimit,
            resets_at: None,
            window: None,
            evidence: truncate(evidence),
            note: Some("an API rate limit names no reset".into()),
        },
        precision: 0,
    })
}

/// `overageDisabledReason`s whose rejection is "Your usage allocation has
/// been disabled by your admin" or "Your group's usage limit is set to $0".
const ADMIN_DISABLED_REASONS: &[&str] = &[
    "member_level_disabled",
    "member_zero_credit_limit",
    "group_zero_credit_limit",
];

fn rate_limit_event(info: &Map<String, Value>, now: DateTime<Utc>) -> Option<Found> {
    let str_field = |name: &str| info.get(name).and_then(Value::as_str);
    let status = str_field("status")?;
    let window = str_field("rateLimitType").map(str::to_owned);
    let resets_at = info.get("resetsAt").and_then(epoch_value);
    let mut evidence = format!("rate_limit_event status={status}");
    for name in [
        "rateLimitType",
        "resetsAt",
        "overageStatus",
        "overageDisabledReason",
    ] {
        if let Some(value) = info.get(name).filter(|v| !v.is_null()) {
            let shown = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            evidence.push_str(&format!(" {name}={shown}"));
        }
    }
    let evidence = truncate(&evidence);
    let using_overage = info.get("isUsingOverage").and_then(Value::as_bool) == Some(true);
    let overage_status = str_field("overageStatus");
    let overage_warning = || {
        Some(Found::Warning(Warning {
            window: Some("overage".into()),
            resets_at: info
                .get("overageResetsAt")
                .and_then(epoch_value)
                .and_then(|at| believe(at, now).0),
            utilization: None,
            evidence: evidence.clone(),
        }))
    };
    match status {
        // The plan's window is spent but the session goes on with extra
        // usage ("You're now using extra usage"): worth a log line only.
        "rejected" if using_overage && overage_status != Some("rejected") => overage_warning(),
        "rejected" => {
            let reason = str_field("overageDisabledReason").unwrap_or("");
            let kind = if ADMIN_DISABLED_REASONS.contains(&reason) {
                LimitKind::AdminDisabled
            } else if window.as_deref() == Some("overage") || reason == "out_of_credits" {
                LimitKind::ExtraUsageExhausted
            } else {
                LimitKind::UsageLimit
            };
            // An admin's block is not the window's: neither is shown.
            let window = window.filter(|_| kind != LimitKind::AdminDisabled);
            let (resets_at, note) = match (kind, resets_at) {
                (LimitKind::AdminDisabled, _) => (None, None),
                (_, Some(at)) => believe(at, now),
                (_, None) => (None, Some("the event names no reset".into())),
            };
            let precision = if resets_at.is_some() { 3 } else { 0 };
            Some(Found::Limit(Candidate {
                limit: Limit {
                    kind,
                    resets_at,
                    window,
                    evidence,
                    note,
                },
                precision,
            }))
        }
        "allowed_warning" => Some(Found::Warning(Warning {
            window,
            resets_at: resets_at.and_then(|at| believe(at, now).0),
            utilization: info.get("utilization").and_then(Value::as_f64),
            evidence,
        })),
        "allowed" if using_overage && overage_status == Some("allowed_warning") => {
            overage_warning()
        }
        _ => None,
    }
}

/// Epoch seconds (or milliseconds, told apart by size) as a number or a
/// string of digits.
fn epoch_value(value: &Value) -> Option<DateTime<Utc>> {
    let n = value
        .as_i64()
        .or_else(|| value.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
        .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))?;
    epoch(n)
}

fn epoch(n: i64) -> Option<DateTime<Utc>> {
    if n <= 0 {
        return None;
    }
    if n >= 100_000_000_000 {
        DateTime::from_timestamp_millis(n)
    } else {
        DateTime::from_timestamp(n, 0)
    }
}

/// A reset as believed: `(Some(at), None)`, or `(None, why not)`.
fn believe(at: DateTime<Utc>, now: DateTime<Utc>) -> (Option<DateTime<Utc>>, Option<String>) {
    let shown = at.format("%Y-%m-%dT%H:%M:%SZ");
    if at <= now {
        (
            None,
            Some(format!("the reset it names, {shown}, is not after now")),
        )
    } else if at - now > MAX_RESET_AHEAD {
        (
            None,
            Some(format!(
                "the reset it names, {shown}, is more than {} days ahead",
                MAX_RESET_AHEAD.num_days()
            )),
        )
    } else {
        (Some(at), None)
    }
}

mod text;
use text::*;

#[cfg(test)]
mod tests;
