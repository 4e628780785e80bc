//! Agent signals: `<axiom>TYPE</axiom>` and `<axiom>TYPE:payload</axiom>`
//! found in a session's output, with the types, payload rules and error
//! codes of seed 000 ("Signal Validation"). Pure functions over text; the
//! only IO is [`append`], one line of `.daemon/signals.jsonl` per invalid
//! signal.
//!
//! # The rules, and where they live
//!
//! | seed 000 | here |
//! |---|---|
//! | seven types, protocol fixed | [`SignalType`], [`SignalType::parse`] (exact spelling, case-sensitive) |
//! | `COMPLETE`, `RESOLVED`: payload "None" | not required; one given anyway is kept, as the seed's `validateSignal` does |
//! | `BLOCKED`, `PENDING`: reason (required) | [`SignalType::requires_payload`], [`Signal::reason`] |
//! | `DISCOVERY_LOCAL`, `DISCOVERY_GLOBAL`: content (required) | [`SignalType::requires_payload`], [`Signal::discovery`] |
//! | `PROGRESS`: percentage 0-100 | `strconv.Atoi` rules (optional sign, ASCII digits), [`Signal::progress`] |
//! | regex `<axiom>([A-Z_]+)(?::(.+?))?</axiom>` | [`parse_one`]: exact tags, payload up to the first `</axiom>`, no line break, not empty |
//! | `SIGNAL_MALFORMED`, `SIGNAL_UNKNOWN_TYPE`, `SIGNAL_MISSING_PAYLOAD`, `SIGNAL_INVALID_PAYLOAD`, checked in that order | [`SignalErrorCode`] |
//! | every invalid signal: level `warn`, ignored, never stops the agent | [`SignalErrorCode::level`]; the scanner reports and goes on |
//! | log fields `ts level code agent task raw type` | [`SignalRecord`] (plus optional `session`, `message`) |
//!
//! # What a signal candidate is
//!
//! The [`SignalScanner`] looks for three openers, the tag in any letter case:
//!
//! - `<axiom>` exactly: a signal. It ends at the first `</axiom>` and is
//!   then validated by [`parse_one`].
//! - `<axiom>` in another case (`<AXIOM>`, `<Axiom>`): `SIGNAL_MALFORMED`,
//!   "wrong case in tag" (seed: `<AXIOM>COMPLETE</AXIOM>`). It ends at a
//!   closing tag in any case.
//! - `[axiom:` in any case: `SIGNAL_MALFORMED`, "wrong delimiter format"
//!   (seed: `[AXIOM:COMPLETE]`). It ends at `]`.
//!
//! A candidate that is not closed is `SIGNAL_MALFORMED` and dropped when:
//!
//! - the line ends first (the seed's regex has no `(?s)`, so its `.` never
//!   crosses a line break);
//! - another `<axiom>` (any case) begins first: nested tags. The open
//!   candidate is reported and scanning restarts at the new opener, so
//!   `<axiom>oops <axiom>COMPLETE</axiom>` yields a warning and a COMPLETE;
//! - it grows past [`MAX_SIGNAL_BYTES`] (the seed sets no limit);
//! - the output ends ([`SignalScanner::finish`]).
//!
//! A stray `</axiom>` with no opener is ordinary text.
//!
//! # Cost
//!
//! The scanner does a constant amount of work per byte (it compares the last
//! eight bytes with a closing or opening tag) and validates each finished
//! candidate once, in time linear in its length; every byte belongs to at
//! most one candidate. So a whole output costs O(n) whatever it contains,
//! and memory is bounded by [`MAX_SIGNAL_BYTES`] whatever the chunking.
//! Bytes that are not UTF-8 are kept in the candidate and turned into
//! U+FFFD when it is finished: a signal is never lost to a stray byte, and
//! no input panics.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::Result;

/// The longest candidate, opening and closing tags included, in bytes of
/// output. Longer ones are reported as `SIGNAL_MALFORMED` with their first
/// `MAX_SIGNAL_BYTES` bytes and never buffered further.
pub const MAX_SIGNAL_BYTES: usize = 4096;

const OPEN: &str = "<axiom>";
const CLOSE: &str = "</axiom>";
const BRACKET_OPEN: &str = "[axiom:";
/// Both openers are this long.
const OPENER_LEN: usize = 7;

/// The seven signal types of seed 000. The protocol is fixed ("Signal
/// Types: No - protocol is fixed"), so this is a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SignalType {
    /// Task finished successfully. No payload.
    Complete,
    /// External blocker. Payload: the reason (required).
    Blocked,
    /// Human intervention required. Payload: the reason (required).
    Pending,
    /// Progress update. Payload: a percentage, 0-100 (required).
    Progress,
    /// Merge conflict resolved. No payload.
    Resolved,
    /// Agent-specific discovery. Payload: the content (required).
    DiscoveryLocal,
    /// Project-wide discovery. Payload: the content (required).
    DiscoveryGlobal,
}

impl SignalType {
    pub const ALL: [SignalType; 7] = [
        SignalType::Complete,
        SignalType::Blocked,
        SignalType::Pending,
        SignalType::Progress,
        SignalType::Resolved,
        SignalType::DiscoveryLocal,
        SignalType::DiscoveryGlobal,
    ];

    /// The type as the agent writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SignalType::Complete => "COMPLETE",
            SignalType::Blocked => "BLOCKED",
            SignalType::Pending => "PENDING",
            SignalType::Progress => "PROGRESS",
            SignalType::Resolved => "RESOLVED",
            SignalType::DiscoveryLocal => "DISCOVERY_LOCAL",
            SignalType::DiscoveryGlobal => "DISCOVERY_GLOBAL",
        }
    }

    /// The type spelled exactly (case-sensitive: `complete` is no type).
    pub fn parse(text: &str) -> Option<SignalType> {
        SignalType::ALL.into_iter().find(|t| t.as_str() == text)
    }

    /// Must the signal carry a payload? All but COMPLETE and RESOLVED.
    /// (The seed marks PROGRESS's percentage as a rule rather than
    /// "(required)", but no PROGRESS is valid without one.)
    pub fn requires_payload(self) -> bool {
        !matches!(self, SignalType::Complete | SignalType::Resolved)
    }
}

impl fmt::Display for SignalType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a discovery applies (seed 000, "Discovery Case Creation").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiscoveryScope {
    /// DISCOVERY_LOCAL: injected into the same agent only.
    Local,
    /// DISCOVERY_GLOBAL: injected into all agents.
    Global,
}

impl DiscoveryScope {
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryScope::Local => "local",
            DiscoveryScope::Global => "global",
        }
    }
}

/// A valid signal. Only [`parse_one`] and [`SignalScanner`] make one, so the
/// type's payload rules always hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    kind: SignalType,
    payload: Option<String>,
    raw: String,
}

impl Signal {
    pub fn kind(&self) -> SignalType {
        self.kind
    }

    /// The text after the first `:`, verbatim (not trimmed), if any.
    pub fn payload(&self) -> Option<&str> {
        self.payload.as_deref()
    }

    /// The signal as it appeared, tags included.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// PROGRESS: the percentage, 0-100. None for every other type.
    pub fn progress(&self) -> Option<u8> {
        match self.kind {
            SignalType::Progress => self.payload.as_deref().and_then(|p| percentage(p).ok()),
            _ => None,
        }
    }

    /// BLOCKED or PENDING: the reason. None for every other type.
    pub fn reason(&self) -> Option<&str> {
        match self.kind {
            SignalType::Blocked | SignalType::Pending => self.payload(),
            _ => None,
        }
    }

    /// DISCOVERY_LOCAL or DISCOVERY_GLOBAL: the scope and the content.
    pub fn discovery(&self) -> Option<(DiscoveryScope, &str)> {
        let scope = match self.kind {
            SignalType::DiscoveryLocal => DiscoveryScope::Local,
            SignalType::DiscoveryGlobal => DiscoveryScope::Global,
            _ => return None,
        };
        self.payload().map(|p| (scope, p))
    }
}

/// The seed's four error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SignalErrorCode {
    /// Does not match `<axiom>TYPE</axiom>` / `<axiom>TYPE:payload</axiom>`.
    #[serde(rename = "SIGNAL_MALFORMED")]
    Malformed,
    /// Well formed, but the type is not one of the seven (case-sensitive).
    #[serde(rename = "SIGNAL_UNKNOWN_TYPE")]
    UnknownType,
    /// A type that requires a payload has none.
    #[serde(rename = "SIGNAL_MISSING_PAYLOAD")]
    MissingPayload,
    /// The payload breaks the type's rule (PROGRESS not an integer 0-100).
    #[serde(rename = "SIGNAL_INVALID_PAYLOAD")]
    InvalidPayload,
}

impl SignalErrorCode {
    pub const ALL: [SignalErrorCode; 4] = [
        SignalErrorCode::Malformed,
        SignalErrorCode::UnknownType,
        SignalErrorCode::MissingPayload,
        SignalErrorCode::InvalidPayload,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SignalErrorCode::Malformed => "SIGNAL_MALFORMED",
            SignalErrorCode::UnknownType => "SIGNAL_UNKNOWN_TYPE",
            SignalErrorCode::MissingPayload => "SIGNAL_MISSING_PAYLOAD",
            SignalErrorCode::InvalidPayload => "SIGNAL_INVALID_PAYLOAD",
        }
    }

    pub fn parse(text: &str) -> Option<SignalErrorCode> {
        SignalErrorCode::ALL
            .into_iter()
            .find(|c| c.as_str() == text)
    }

    /// The log level: always `warn` ("Invalid signals are logged but never
    /// crash the agent or block execution").
    pub fn level(self) -> &'static str {
        "warn"
    }
}

impl fmt::Display for SignalErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An invalid signal: what the seed's `SignalError` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalError {
    pub code: SignalErrorCode,
    /// The candidate as it appeared (at most [`MAX_SIGNAL_BYTES`] bytes of
    /// output; bytes that were not UTF-8 read as U+FFFD).
    pub raw: String,
    /// The type as written, when the signal was well formed enough to have
    /// one (every code but `SIGNAL_MALFORMED`).
    pub kind: Option<String>,
    /// The seed's message, with what exactly was wrong for a malformed one.
    pub message: String,
}

impl SignalError {
    pub fn level(&self) -> &'static str {
        self.code.level()
    }

    fn malformed(raw: impl Into<String>, detail: &str) -> SignalError {
        SignalError {
            code: SignalErrorCode::Malformed,
            raw: raw.into(),
            kind: None,
            message: format!("Signal does not match expected format: {detail}"),
        }
    }
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({:?})", self.code, self.message, self.raw)
    }
}

impl std::error::Error for SignalError {}

/// What the scanner yields for each candidate.
pub type SignalResult = std::result::Result<Signal, SignalError>;

/// Validate one complete candidate, `<axiom>…</axiom>` and nothing else
/// (no text before or after). Checks in the seed's order: format
/// (`SIGNAL_MALFORMED`), type (`SIGNAL_UNKNOWN_TYPE`), payload presence
/// (`SIGNAL_MISSING_PAYLOAD`), payload value (`SIGNAL_INVALID_PAYLOAD`).
pub fn parse_one(raw: &str) -> SignalResult {
    if raw.len() > MAX_SIGNAL_BYTES {
        let mut end = MAX_SIGNAL_BYTES;
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        return Err(SignalError::malformed(
            &raw[..end],
            &format!("longer than {MAX_SIGNAL_BYTES} bytes"),
        ));
    }
    classify(raw)
}

/// [`parse_one`] without the length limit (the scanner enforces it on the
/// bytes of output, before U+FFFD replacement may lengthen the text).
fn classify(raw: &str) -> SignalResult {
    let malformed = |detail: &str| Err(SignalError::malformed(raw, detail));
    let Some(body) = raw.strip_prefix(OPEN) else {
        return if starts_with_ci(raw.as_bytes(), OPEN) {
            malformed("wrong case in tag (the tag is <axiom>, lowercase)")
        } else if starts_with_ci(raw.as_bytes(), "[axiom") {
            malformed("wrong delimiter format (a signal is <axiom>TYPE</axiom>, not [AXIOM:TYPE])")
        } else {
            malformed("a signal starts with <axiom>")
        };
    };
    let Some(end) = body.find(CLOSE) else {
        return if find_ci(body.as_bytes(), CLOSE).is_some() {
            malformed("wrong case in closing tag (the tag is </axiom>, lowercase)")
        } else {
            malformed("no closing </axiom>")
        };
    };
    if end + CLOSE.len() != body.len() {
        return malformed("text after the closing </axiom>");
    }
    let inner = &body[..end];
    if inner.contains('\n') {
        return malformed("a line break inside the signal");
    }
    if find_ci(inner.as_bytes(), OPEN).is_some() {
        return malformed("a nested <axiom> tag");
    }
    if find_ci(inner.as_bytes(), CLOSE).is_some() {
        return malformed("wrong case in closing tag (the tag is </axiom>, lowercase)");
    }
    let (ty, payload) = match inner.split_once(':') {
        Some((ty, payload)) => (ty, Some(payload)),
        None => (inner, None),
    };
    if ty.is_empty() {
        return malformed("no type");
    }
    if !ty
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return malformed("the type must be one word, like COMPLETE or PROGRESS:75");
    }
    if payload == Some("") {
        return malformed("nothing after ':' (leave out the ':' or give a payload)");
    }
    let error = |code, message: String| {
        Err(SignalError {
            code,
            raw: raw.to_string(),
            kind: Some(ty.to_string()),
            message,
        })
    };
    let Some(kind) = SignalType::parse(ty) else {
        return error(
            SignalErrorCode::UnknownType,
            format!("Unknown signal type: {ty}"),
        );
    };
    let Some(payload) = payload else {
        if kind.requires_payload() {
            return error(
                SignalErrorCode::MissingPayload,
                format!("{ty} requires a payload"),
            );
        }
        return Ok(Signal {
            kind,
            payload: None,
            raw: raw.to_string(),
        });
    };
    if kind == SignalType::Progress
        && let Err(why) = percentage(payload)
    {
        return error(
            SignalErrorCode::InvalidPayload,
            format!("PROGRESS payload must be 0-100 ({why})"),
        );
    }
    Ok(Signal {
        kind,
        payload: Some(payload.to_string()),
        raw: raw.to_string(),
    })
}

/// A PROGRESS payload as Go's `strconv.Atoi` reads it (an optional `+` or
/// `-`, then ASCII digits, nothing else), then 0-100.
fn percentage(payload: &str) -> std::result::Result<u8, &'static str> {
    let (negative, digits) = match payload.as_bytes().first() {
        Some(b'-') => (true, &payload[1..]),
        Some(b'+') => (false, &payload[1..]),
        _ => (false, payload),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a number");
    }
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    if negative || significant.len() > 3 {
        return Err("out of range");
    }
    match significant.parse::<u16>() {
        Ok(n) if n <= 100 => Ok(n as u8),
        _ => Err("out of range"),
    }
}

fn starts_with_ci(text: &[u8], prefix: &str) -> bool {
    text.len() >= prefix.len() && text[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn ends_with_ci(text: &[u8], suffix: &str) -> bool {
    text.len() >= suffix.len()
        && text[text.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
}

fn find_ci(text: &[u8], needle: &str) -> Option<usize> {
    text.windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Which opener began the open candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `<axiom>` in any case; ends at `</axiom>` in any case.
    Angle,
    /// `[axiom:` in any case; ends at `]`.
    Bracket,
}

impl Form {
    fn opener(self) -> &'static [u8] {
        match self {
            Form::Angle => OPEN.as_bytes(),
            Form::Bracket => BRACKET_OPEN.as_bytes(),
        }
    }

    fn closer(self) -> &'static str {
        match self {
            Form::Angle => CLOSE,
            Form::Bracket => "]",
        }
    }
}

/// Finds signals in output as it streams, whatever the chunking: feeding a
/// stream in one piece, one byte at a time or split anywhere gives the same
/// results in the same order. Holds at most [`MAX_SIGNAL_BYTES`] bytes.
#[derive(Debug, Clone)]
pub struct SignalScanner {
    /// The open candidate, opener included; empty when there is none.
    candidate: Vec<u8>,
    form: Form,
    /// While no candidate is open: a proper prefix of an opener just seen
    /// (at most six bytes).
    partial: Vec<u8>,
    partial_form: Form,
}

impl Default for SignalScanner {
    fn default() -> Self {
        SignalScanner::new()
    }
}

impl SignalScanner {
    pub fn new() -> SignalScanner {
        SignalScanner {
            candidate: Vec::new(),
            form: Form::Angle,
            partial: Vec::with_capacity(OPENER_LEN),
            partial_form: Form::Angle,
        }
    }

    /// The next piece of output; the signals and invalid signals it
    /// completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SignalResult> {
        let mut out = Vec::new();
        for &b in chunk {
            self.step(b, &mut out);
        }
        out
    }

    /// The output has ended: an open candidate is `SIGNAL_MALFORMED`. The
    /// scanner is then empty and can be used for another stream.
    pub fn finish(&mut self) -> Vec<SignalResult> {
        self.partial.clear();
        if self.candidate.is_empty() {
            return Vec::new();
        }
        let detail = format!(
            "no closing {} before the end of the output",
            self.form.closer()
        );
        vec![Err(self.drop_candidate(&detail))]
    }

    /// Bytes held between calls (never more than [`MAX_SIGNAL_BYTES`]).
    pub fn buffered(&self) -> usize {
        self.candidate.len() + self.partial.len()
    }

    fn step(&mut self, b: u8, out: &mut Vec<SignalResult>) {
        if self.candidate.is_empty() {
            self.idle(b);
            return;
        }
        if b == b'\n' {
            if self.candidate.last() == Some(&b'\r') {
                self.candidate.pop();
            }
            let detail = format!(
                "no closing {} before the end of the line",
                self.form.closer()
            );
            out.push(Err(self.drop_candidate(&detail)));
            return;
        }
        if self.candidate.len() >= MAX_SIGNAL_BYTES {
            let detail = format!(
                "no closing {} within {MAX_SIGNAL_BYTES} bytes",
                self.form.closer()
            );
            // The last bytes may begin the next opener: look at them again.
            let tail = self.candidate[self.candidate.len() - (OPENER_LEN - 1)..].to_vec();
            out.push(Err(self.drop_candidate(&detail)));
            for t in tail {
                self.idle(t);
            }
            self.idle(b);
            return;
        }
        self.candidate.push(b);
        let closed = match self.form {
            Form::Angle => ends_with_ci(&self.candidate, CLOSE),
            Form::Bracket => b == b']',
        };
        if closed {
            out.push(classify(&String::from_utf8_lossy(&self.candidate)));
            self.candidate.clear();
        } else if ends_with_ci(&self.candidate, OPEN) {
            let start = self.candidate.len() - OPENER_LEN;
            let raw = String::from_utf8_lossy(&self.candidate[..start]).into_owned();
            let detail = format!(
                "a new <axiom> began before {} closed it",
                self.form.closer()
            );
            out.push(Err(SignalError::malformed(raw, &detail)));
            self.candidate.drain(..start);
            self.form = Form::Angle;
        }
    }

    /// No candidate open: track a possible opener.
    fn idle(&mut self, b: u8) {
        if !self.partial.is_empty() {
            let expected = self.partial_form.opener()[self.partial.len()];
            if b.eq_ignore_ascii_case(&expected) {
                self.partial.push(b);
                if self.partial.len() == OPENER_LEN {
                    self.candidate.extend_from_slice(&self.partial);
                    self.form = self.partial_form;
                    self.partial.clear();
                }
                return;
            }
            self.partial.clear();
        }
        // Neither '<' nor '[' occurs later in an opener, so a mismatch can
        // only restart here.
        let form = match b {
            b'<' => Form::Angle,
            b'[' => Form::Bracket,
            _ => return,
        };
        self.partial.push(b);
        self.partial_form = form;
    }

    fn drop_candidate(&mut self, detail: &str) -> SignalError {
        let mut detail = detail.to_string();
        if self.form == Form::Bracket {
            detail = format!("wrong delimiter format ([AXIOM:…]), and {detail}");
        } else if !self.candidate.starts_with(OPEN.as_bytes()) {
            detail = format!("wrong case in tag (the tag is <axiom>, lowercase), and {detail}");
        }
        let raw = String::from_utf8_lossy(&self.candidate).into_owned();
        self.candidate.clear();
        SignalError::malformed(raw, &detail)
    }
}

/// Every signal and invalid signal in a whole output.
pub fn scan(output: &[u8]) -> Vec<SignalResult> {
    let mut scanner = SignalScanner::new();
    let mut out = scanner.feed(output);
    out.extend(scanner.finish());
    out
}

/// One line of `.daemon/signals.jsonl`: an invalid signal, with seed 000's
/// fields (`ts`, `level`, `code`, `agent`, `task`, `raw`, `type`). Seed 000
/// names the current task; a daemon session has a session id, so both are
/// optional and written when known. `message` is an addition: what exactly
/// was wrong. Fields are plain strings so that a reader accepts any line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRecord {
    pub ts: Timestamp,
    /// Always `warn` for invalid signals.
    pub level: String,
    /// `SIGNAL_MALFORMED`, `SIGNAL_UNKNOWN_TYPE`, ...
    pub code: String,
    /// The agent that printed the signal (seed's `echo-001`: its name or
    /// its instance id).
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The original signal string.
    pub raw: String,
    /// The parsed type, if available.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl SignalRecord {
    /// The record of `error`, printed by `agent` at `ts`.
    pub fn new(ts: Timestamp, agent: &str, error: &SignalError) -> SignalRecord {
        SignalRecord {
            ts,
            level: error.level().to_string(),
            code: error.code.as_str().to_string(),
            agent: agent.to_string(),
            task: None,
            session: None,
            raw: error.raw.clone(),
            kind: error.kind.clone(),
            message: Some(error.message.clone()),
        }
    }

    pub fn with_task(mut self, task: impl Into<String>) -> SignalRecord {
        self.task = Some(task.into());
        self
    }

    pub fn with_session(mut self, session: impl Into<String>) -> SignalRecord {
        self.session = Some(session.into());
        self
    }
}

/// Append one record as one whole line (`state::journal::append_lines`:
/// `O_APPEND`, fsynced, never glued to a torn last line).
pub fn append(path: &Path, rec: &SignalRecord) -> Result<()> {
    let mut line = serde_json::to_vec(rec).unwrap_or_default();
    line.push(b'\n');
    let _rotation = crate::state::rotation::daemon_logs();
    crate::state::journal::append_lines(path, &line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use SignalErrorCode::{InvalidPayload, Malformed, MissingPayload, UnknownType};

    /// Every valid signal that seed 000 shows, with its type and payload.
    const SEED_VALID: &[(&str, SignalType, Option<&str>)] = &[
        // "Valid Signal Types" table.
        ("<axiom>COMPLETE</axiom>", SignalType::Complete, None),
        (
            "<axiom>BLOCKED:Database locked</axiom>",
            SignalType::Blocked,
            Some("Database locked"),
        ),
        (
            "<axiom>PENDING:Need API key</axiom>",
            SignalType::Pending,
            Some("Need API key"),
        ),
        (
            "<axiom>PROGRESS:75</axiom>",
            SignalType::Progress,
            Some("75"),
        ),
        ("<axiom>RESOLVED</axiom>", SignalType::Resolved, None),
        (
            "<axiom>DISCOVERY_LOCAL:API uses JWT</axiom>",
            SignalType::DiscoveryLocal,
            Some("API uses JWT"),
        ),
        (
            "<axiom>DISCOVERY_GLOBAL:Rate limit 100/min</axiom>",
            SignalType::DiscoveryGlobal,
            Some("Rate limit 100/min"),
        ),
        // signal-types.md examples.
        (
            "<axiom>BLOCKED:Database schema mismatch</axiom>",
            SignalType::Blocked,
            Some("Database schema mismatch"),
        ),
        (
            "<axiom>PENDING:Cannot determine correct API version</axiom>",
            SignalType::Pending,
            Some("Cannot determine correct API version"),
        ),
        (
            "<axiom>DISCOVERY_GLOBAL:All API endpoints require rate limiting</axiom>",
            SignalType::DiscoveryGlobal,
            Some("All API endpoints require rate limiting"),
        ),
        // discovery-format.md.
        (
            "<axiom>DISCOVERY_LOCAL:content</axiom>",
            SignalType::DiscoveryLocal,
            Some("content"),
        ),
        (
            "<axiom>DISCOVERY_GLOBAL:content</axiom>",
            SignalType::DiscoveryGlobal,
            Some("content"),
        ),
        // api-integration.md and conflict-resolution.md skills.
        (
            "<axiom>DISCOVERY_GLOBAL:API X requires header Y for Z</axiom>",
            SignalType::DiscoveryGlobal,
            Some("API X requires header Y for Z"),
        ),
        (
            "<axiom>PENDING:Conflict too complex - structural changes in auth module</axiom>",
            SignalType::Pending,
            Some("Conflict too complex - structural changes in auth module"),
        ),
        // The execution log's {"event":"signal","type":"PROGRESS","payload":"50"}.
        (
            "<axiom>PROGRESS:50</axiom>",
            SignalType::Progress,
            Some("50"),
        ),
    ];

    /// Every invalid signal that seed 000 shows, with its code and type.
    const SEED_INVALID: &[(&str, SignalErrorCode, Option<&str>)] = &[
        // "Common Invalid Signal Examples".
        ("<axiom>COMPLET</axiom>", UnknownType, Some("COMPLET")),
        ("<axiom>complete</axiom>", UnknownType, Some("complete")),
        ("<axiom>BLOCKED</axiom>", MissingPayload, Some("BLOCKED")),
        (
            "<axiom>PROGRESS:abc</axiom>",
            InvalidPayload,
            Some("PROGRESS"),
        ),
        (
            "<axiom>PROGRESS:150</axiom>",
            InvalidPayload,
            Some("PROGRESS"),
        ),
        ("[AXIOM:COMPLETE]", Malformed, None),
        ("<AXIOM>COMPLETE</AXIOM>", Malformed, None),
        // The format templates are not types.
        ("<axiom>TYPE</axiom>", UnknownType, Some("TYPE")),
        ("<axiom>TYPE:payload</axiom>", UnknownType, Some("TYPE")),
        // Ava's "Emits <axiom>AVA_COMPLETE</axiom>" is not in the fixed list
        // of types, so by the seed's own validation it is unknown.
        (
            "<axiom>AVA_COMPLETE</axiom>",
            UnknownType,
            Some("AVA_COMPLETE"),
        ),
    ];

    /// Payload and format rules beyond the seed's examples.
    const MORE: &[(&str, std::result::Result<Option<&str>, SignalErrorCode>)] = &[
        // PROGRESS: strconv.Atoi, then 0-100.
        ("<axiom>PROGRESS:0</axiom>", Ok(Some("0"))),
        ("<axiom>PROGRESS:100</axiom>", Ok(Some("100"))),
        ("<axiom>PROGRESS:+75</axiom>", Ok(Some("+75"))),
        ("<axiom>PROGRESS:075</axiom>", Ok(Some("075"))),
        ("<axiom>PROGRESS:-0</axiom>", Ok(Some("-0"))),
        ("<axiom>PROGRESS:101</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS:-1</axiom>", Err(InvalidPayload)),
        (
            "<axiom>PROGRESS:00000000000000000000050</axiom>",
            Ok(Some("00000000000000000000050")),
        ),
        (
            "<axiom>PROGRESS:99999999999999999999999</axiom>",
            Err(InvalidPayload),
        ),
        ("<axiom>PROGRESS:7.5</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS:75%</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS: 75</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS:+</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS:٣</axiom>", Err(InvalidPayload)),
        ("<axiom>PROGRESS</axiom>", Err(MissingPayload)),
        // Required payloads.
        ("<axiom>PENDING</axiom>", Err(MissingPayload)),
        ("<axiom>DISCOVERY_LOCAL</axiom>", Err(MissingPayload)),
        ("<axiom>DISCOVERY_GLOBAL</axiom>", Err(MissingPayload)),
        // `.+?`: a payload is at least one character, kept verbatim.
        ("<axiom>BLOCKED:</axiom>", Err(Malformed)),
        ("<axiom>COMPLETE:</axiom>", Err(Malformed)),
        ("<axiom>BLOCKED: spaced </axiom>", Ok(Some(" spaced "))),
        ("<axiom>BLOCKED:a:b:c</axiom>", Ok(Some("a:b:c"))),
        (
            "<axiom>BLOCKED:x < y and [z]</axiom>",
            Ok(Some("x < y and [z]")),
        ),
        ("<axiom>BLOCKED:ünïcødé ✓</axiom>", Ok(Some("ünïcødé ✓"))),
        ("<axiom>BLOCKED:carriage\r</axiom>", Ok(Some("carriage\r"))),
        // A payload on a type without one is kept, as validateSignal does.
        (
            "<axiom>COMPLETE:all tests pass</axiom>",
            Ok(Some("all tests pass")),
        ),
        ("<axiom>RESOLVED:kept both</axiom>", Ok(Some("kept both"))),
        // Unknown types: the type check comes before the payload checks.
        ("<axiom>PROGRES:abc</axiom>", Err(UnknownType)),
        ("<axiom>Complete</axiom>", Err(UnknownType)),
        ("<axiom>progress:50</axiom>", Err(UnknownType)),
        ("<axiom>Discovery_Local:x</axiom>", Err(UnknownType)),
        ("<axiom>PROGRESS2:50</axiom>", Err(UnknownType)),
        ("<axiom>AVA-COMPLETE</axiom>", Err(UnknownType)),
        // Malformed shapes.
        ("<axiom></axiom>", Err(Malformed)),
        ("<axiom>:payload</axiom>", Err(Malformed)),
        ("<axiom> COMPLETE</axiom>", Err(Malformed)),
        ("<axiom>COMPLETE </axiom>", Err(Malformed)),
        ("<axiom>TASK COMPLETE</axiom>", Err(Malformed)),
        ("<axiom>COMPLETE!</axiom>", Err(Malformed)),
        ("<axiom>BLOCKED:two\nlines</axiom>", Err(Malformed)),
        ("<axiom>COMPLETE</AXIOM>", Err(Malformed)),
        ("<AXIOM>COMPLETE</axiom>", Err(Malformed)),
        ("<Axiom>COMPLETE</Axiom>", Err(Malformed)),
        ("<axiom>COMPLETE", Err(Malformed)),
        ("<axiom>COMPLETE</axiom> trailing", Err(Malformed)),
        ("text <axiom>COMPLETE</axiom>", Err(Malformed)),
        ("<axiom>COMPLETE</axiom></axiom>", Err(Malformed)),
        ("<axiom>BLOCKED:see <axiom>X</axiom>", Err(Malformed)),
        ("<axiom>BLOCKED:a</AXIOM>b</axiom>", Err(Malformed)),
        ("[axiom:COMPLETE]", Err(Malformed)),
        ("", Err(Malformed)),
        ("COMPLETE", Err(Malformed)),
    ];

    #[test]
    fn seed_valid_examples_parse() {
        for &(raw, kind, payload) in SEED_VALID {
            let signal = parse_one(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(signal.kind(), kind, "{raw}");
            assert_eq!(signal.payload(), payload, "{raw}");
            assert_eq!(signal.raw(), raw);
        }
    }

    #[test]
    fn seed_invalid_examples_have_the_seed_codes() {
        for &(raw, code, kind) in SEED_INVALID {
            let error = parse_one(raw).expect_err(raw);
            assert_eq!(error.code, code, "{raw}: {error}");
            assert_eq!(error.kind.as_deref(), kind, "{raw}");
            assert_eq!(error.raw, raw);
            assert_eq!(error.level(), "warn");
        }
    }

    #[test]
    fn seed_messages() {
        let message = |raw| parse_one(raw).unwrap_err().message;
        assert_eq!(
            message("<axiom>COMPLET</axiom>"),
            "Unknown signal type: COMPLET"
        );
        assert_eq!(
            message("<axiom>BLOCKED</axiom>"),
            "BLOCKED requires a payload"
        );
        assert!(
            message("<axiom>PROGRESS:150</axiom>").starts_with("PROGRESS payload must be 0-100")
        );
        assert!(message("[AXIOM:COMPLETE]").starts_with("Signal does not match expected format"));
        assert!(message("[AXIOM:COMPLETE]").contains("wrong delimiter"));
        assert!(message("<AXIOM>COMPLETE</AXIOM>").contains("wrong case in tag"));
    }

    #[test]
    fn payload_and_format_rules() {
        for &(raw, expected) in MORE {
            match (parse_one(raw), expected) {
                (Ok(signal), Ok(payload)) => assert_eq!(signal.payload(), payload, "{raw:?}"),
                (Err(error), Err(code)) => {
                    assert_eq!(error.code, code, "{raw:?}: {error}");
                    assert_eq!(error.kind.is_none(), code == Malformed, "{raw:?}");
                }
                (got, _) => panic!("{raw:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn typed_accessors() {
        let p = parse_one("<axiom>PROGRESS:75</axiom>").unwrap();
        assert_eq!(p.progress(), Some(75));
        assert_eq!(p.reason(), None);
        assert_eq!(p.discovery(), None);
        assert_eq!(
            parse_one("<axiom>PROGRESS:+075</axiom>")
                .unwrap()
                .progress(),
            Some(75)
        );
        assert_eq!(
            parse_one("<axiom>PROGRESS:-0</axiom>").unwrap().progress(),
            Some(0)
        );
        let b = parse_one("<axiom>BLOCKED:Database locked</axiom>").unwrap();
        assert_eq!(b.reason(), Some("Database locked"));
        assert_eq!(b.progress(), None);
        let p = parse_one("<axiom>PENDING:Need API key</axiom>").unwrap();
        assert_eq!(p.reason(), Some("Need API key"));
        let d = parse_one("<axiom>DISCOVERY_LOCAL:API uses JWT</axiom>").unwrap();
        assert_eq!(d.discovery(), Some((DiscoveryScope::Local, "API uses JWT")));
        let d = parse_one("<axiom>DISCOVERY_GLOBAL:Rate limit 100/min</axiom>").unwrap();
        assert_eq!(
            d.discovery(),
            Some((DiscoveryScope::Global, "Rate limit 100/min"))
        );
        assert_eq!(DiscoveryScope::Global.as_str(), "global");
        let c = parse_one("<axiom>COMPLETE</axiom>").unwrap();
        assert_eq!(
            (c.progress(), c.reason(), c.discovery()),
            (None, None, None)
        );
    }

    #[test]
    fn types_and_codes_are_case_sensitive_and_round_trip() {
        for t in SignalType::ALL {
            assert_eq!(SignalType::parse(t.as_str()), Some(t));
            assert_eq!(SignalType::parse(&t.as_str().to_lowercase()), None);
            assert_eq!(
                serde_json::to_string(&t).unwrap(),
                format!("\"{}\"", t.as_str())
            );
            let raw = match t.requires_payload() {
                true => format!("<axiom>{t}:50</axiom>"),
                false => format!("<axiom>{t}</axiom>"),
            };
            assert_eq!(parse_one(&raw).unwrap().kind(), t);
            // Every other spelling of the type is unknown, every other
            // spelling of the tag malformed.
            for variant in [t.as_str().to_lowercase(), capitalize(t.as_str())] {
                let raw = raw.replacen(t.as_str(), &variant, 1);
                assert_eq!(parse_one(&raw).unwrap_err().code, UnknownType, "{raw}");
            }
            for (open, close) in [
                ("<AXIOM>", "</AXIOM>"),
                ("<Axiom>", "</Axiom>"),
                ("<axiom>", "</aXiom>"),
                ("<axioM>", "</axiom>"),
            ] {
                let raw = raw.replace("<axiom>", open).replace("</axiom>", close);
                assert_eq!(parse_one(&raw).unwrap_err().code, Malformed, "{raw}");
                assert_eq!(scan(raw.as_bytes()), vec![parse_one(&raw)], "{raw}");
            }
        }
        for c in SignalErrorCode::ALL {
            assert_eq!(SignalErrorCode::parse(c.as_str()), Some(c));
            assert_eq!(SignalErrorCode::parse(&c.as_str().to_lowercase()), None);
            assert_eq!(c.level(), "warn");
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
        }
    }

    fn capitalize(s: &str) -> String {
        s[..1].to_string() + &s[1..].to_lowercase()
    }

    #[test]
    fn the_scanner_agrees_with_parse_one_on_every_single_candidate() {
        let candidates = SEED_VALID
            .iter()
            .map(|v| v.0)
            .chain(SEED_INVALID.iter().map(|v| v.0))
            .chain(MORE.iter().map(|v| v.0));
        for raw in candidates {
            // Those the scanner reads differently by design: several
            // candidates, or none, or one ended by a line break.
            let differs = [
                "",
                "COMPLETE",
                "text <axiom>COMPLETE</axiom>",
                "<axiom>COMPLETE",
                "<axiom>COMPLETE</axiom> trailing",
                "<axiom>COMPLETE</axiom></axiom>",
                "<axiom>BLOCKED:see <axiom>X</axiom>",
                "<axiom>BLOCKED:a</AXIOM>b</axiom>",
            ];
            if differs.contains(&raw) || raw.contains('\n') {
                continue;
            }
            let framed = format!("before {raw} after\n");
            assert_eq!(scan(framed.as_bytes()), vec![parse_one(raw)], "{raw:?}");
        }
    }

    /// Several signals, valid and invalid, in prose, with what the scanner
    /// finds in them.
    const STREAM: &[u8] = b"Starting task-042.\r\n\
        <axiom>PROGRESS:25</axiom> working <axiom>PROGRESS:50</axiom>\r\n\
        a stray </axiom> and <axi not a tag, <axiomatic> neither, x<y\n\
        <axiom>BLOCKED:Database locked</axiom><axiom>COMPLET</axiom>\n\
        [AXIOM:COMPLETE] <AXIOM>COMPLETE</AXIOM>\n\
        <axiom>oops <axiom>DISCOVERY_LOCAL:API uses JWT \xe2\x9c\x93</axiom>\n\
        <axiom>PENDING:multi\nline</axiom>\n\
        bytes \xff\xfe\x00 <axiom>BLOCKED:bad \xff byte</axiom>\n\
        <axiom>PROGRESS:150</axiom><axiom>COMPLETE</axiom>\n\
        <axiom>RESOLVED";

    /// A result reduced to what the stream test checks: the type and
    /// payload of a signal, the code and raw text of an error.
    type Found<'a> = std::result::Result<(SignalType, Option<&'a str>), (SignalErrorCode, &'a str)>;

    fn stream_expected() -> Vec<Found<'static>> {
        vec![
            Ok((SignalType::Progress, Some("25"))),
            Ok((SignalType::Progress, Some("50"))),
            Ok((SignalType::Blocked, Some("Database locked"))),
            Err((UnknownType, "<axiom>COMPLET</axiom>")),
            Err((Malformed, "[AXIOM:COMPLETE]")),
            Err((Malformed, "<AXIOM>COMPLETE</AXIOM>")),
            Err((Malformed, "<axiom>oops ")),
            Ok((SignalType::DiscoveryLocal, Some("API uses JWT ✓"))),
            Err((Malformed, "<axiom>PENDING:multi")),
            Ok((SignalType::Blocked, Some("bad \u{fffd} byte"))),
            Err((InvalidPayload, "<axiom>PROGRESS:150</axiom>")),
            Ok((SignalType::Complete, None)),
            Err((Malformed, "<axiom>RESOLVED")),
        ]
    }

    fn summary(results: &[SignalResult]) -> Vec<Found<'_>> {
        results
            .iter()
            .map(|r| match r {
                Ok(s) => Ok((s.kind(), s.payload())),
                Err(e) => Err((e.code, e.raw.as_str())),
            })
            .collect()
    }

    #[test]
    fn the_scanner_finds_every_signal_in_a_stream() {
        let results = scan(STREAM);
        assert_eq!(summary(&results), stream_expected());
        let nested = results[6].as_ref().unwrap_err();
        assert!(nested.message.contains("new <axiom>"), "{nested}");
        let last = results.last().unwrap().as_ref().unwrap_err();
        assert!(last.message.contains("end of the output"), "{last}");
    }

    fn chunked(input: &[u8], cuts: &[usize]) -> Vec<SignalResult> {
        let mut scanner = SignalScanner::new();
        let mut out = Vec::new();
        let mut start = 0;
        for &cut in cuts {
            out.extend(scanner.feed(&input[start..cut]));
            start = cut;
        }
        out.extend(scanner.feed(&input[start..]));
        out.extend(scanner.finish());
        out
    }

    #[test]
    fn a_split_at_any_byte_positions_changes_nothing() {
        let whole = scan(STREAM);
        for i in 0..=STREAM.len() {
            assert_eq!(chunked(STREAM, &[i]), whole, "split at {i}");
            for j in i..=STREAM.len() {
                assert_eq!(chunked(STREAM, &[i, j]), whole, "split at {i} and {j}");
            }
        }
    }

    #[test]
    fn one_byte_at_a_time_and_random_chunkings_change_nothing() {
        let whole = scan(STREAM);
        let every: Vec<usize> = (1..STREAM.len()).collect();
        assert_eq!(chunked(STREAM, &every), whole);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let mut cuts: Vec<usize> = (0..rng.below(40))
                .map(|_| rng.below(STREAM.len() + 1))
                .collect();
            cuts.sort_unstable();
            assert_eq!(chunked(STREAM, &cuts), whole, "cuts {cuts:?}");
        }
    }

    #[test]
    fn an_unterminated_tag_is_dropped_at_the_limit_and_never_buffered_further() {
        let mut scanner = SignalScanner::new();
        let mut results = scanner.feed(b"<axiom>BLOCKED:");
        for _ in 0..256 {
            results.extend(scanner.feed(&[b'A'; 4096]));
            assert!(scanner.buffered() <= MAX_SIGNAL_BYTES);
        }
        results.extend(scanner.feed(b"</axiom> <axiom>COMPLETE</axiom>"));
        results.extend(scanner.finish());
        assert_eq!(results.len(), 2, "{results:?}");
        let dropped = results[0].as_ref().unwrap_err();
        assert_eq!(dropped.code, Malformed);
        assert_eq!(dropped.raw.len(), MAX_SIGNAL_BYTES);
        assert!(dropped.message.contains("within 4096 bytes"), "{dropped}");
        assert_eq!(results[1].as_ref().unwrap().kind(), SignalType::Complete);
        assert_eq!(scanner.buffered(), 0);
    }

    #[test]
    fn the_limit_is_exact_and_an_opener_across_it_is_found() {
        let fill = |n: usize| format!("<axiom>BLOCKED:{}</axiom>", "r".repeat(n - 23));
        let longest = fill(MAX_SIGNAL_BYTES);
        assert_eq!(longest.len(), MAX_SIGNAL_BYTES);
        assert!(parse_one(&longest).is_ok());
        assert!(scan(longest.as_bytes())[0].is_ok());
        let too_long = fill(MAX_SIGNAL_BYTES + 1);
        assert_eq!(parse_one(&too_long).unwrap_err().code, Malformed);
        assert_eq!(
            scan(too_long.as_bytes())[0].as_ref().unwrap_err().code,
            Malformed
        );
        // The bytes at the limit start a real signal: it is still found.
        for shift in 0..OPENER_LEN + 2 {
            let mut input = b"<axiom>BLOCKED:".to_vec();
            input.resize(MAX_SIGNAL_BYTES - 3 + shift, b'r');
            input.extend_from_slice(b"<axiom>COMPLETE</axiom>");
            let results = scan(&input);
            assert_eq!(results.len(), 2, "shift {shift}: {results:?}");
            assert_eq!(results[0].as_ref().unwrap_err().code, Malformed);
            assert_eq!(results[1].as_ref().unwrap().kind(), SignalType::Complete);
        }
    }

    #[test]
    fn non_utf8_bytes_never_panic_and_never_hide_a_signal() {
        let input = b"\xff\xfe<axiom>PENDING:\xc3</axiom>\x80\x80<axiom>COMPLETE</axiom>\xf0\x9f";
        let results = scan(input);
        assert_eq!(results[0].as_ref().unwrap().reason(), Some("\u{fffd}"));
        assert_eq!(results[1].as_ref().unwrap().kind(), SignalType::Complete);
        assert_eq!(results.len(), 2);
        // A multi-byte character split across reads survives.
        let text = "<axiom>DISCOVERY_GLOBAL:naïve ✓ 🦀</axiom>".as_bytes();
        for i in 0..=text.len() {
            let r = chunked(text, &[i]);
            assert_eq!(
                r[0].as_ref().unwrap().payload(),
                Some("naïve ✓ 🦀"),
                "split at {i}"
            );
        }
    }

    #[test]
    fn a_scanner_is_reusable_after_finish() {
        let mut scanner = SignalScanner::default();
        assert!(scanner.feed(b"<axiom>COMPLE").is_empty());
        assert_eq!(scanner.finish().len(), 1);
        assert!(scanner.finish().is_empty());
        assert!(scanner.feed(b"TE</axiom>").is_empty());
        assert_eq!(scanner.feed(b"<axiom>RESOLVED</axiom>").len(), 1);
    }

    /// xorshift64: enough randomness for fuzzing, no crate.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    const FRAGMENTS: &[&[u8]] = &[
        b"<axiom>",
        b"</axiom>",
        b"<AXIOM>",
        b"</Axiom>",
        b"[AXIOM:",
        b"[axiom:",
        b"]",
        b":",
        b"<",
        b"<axi",
        b"om>",
        b"</ax",
        b"COMPLETE",
        b"RESOLVED",
        b"BLOCKED",
        b"PENDING",
        b"PROGRESS",
        b"DISCOVERY_LOCAL",
        b"DISCOVERY_GLOBAL",
        b"complete",
        b"75",
        b"150",
        b"-0",
        b" ",
        b"\n",
        b"\r\n",
        b"\xff",
        b"\xe2\x9c",
        b"\x93",
        b"\x00",
        b"<axiom>COMPLETE</axiom>",
        b"<axiom>PROGRESS:42</axiom>",
        b"<axiom>BLOCKED:",
        b"<axiom>DISCOVERY_GLOBAL:",
        b"a reason",
    ];

    /// 20 000 random inputs of up to 4 KiB, most of them built from signal
    /// fragments. Nothing may panic; the output is bounded by the input (each
    /// result owns at least one 7-byte opener) and by the limit; chunking
    /// changes nothing; every signal found re-parses to itself. Time is not
    /// asserted: the scanner is linear (see the module docs).
    #[test]
    fn fuzz_arbitrary_bytes() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        let mut input = Vec::with_capacity(4096);
        let (mut valid, mut invalid) = (0, 0);
        for round in 0..20_000 {
            input.clear();
            let len = rng.below(4097);
            let biased = rng.below(8) != 0;
            while input.len() < len {
                if biased && rng.below(3) != 0 {
                    input.extend_from_slice(FRAGMENTS[rng.below(FRAGMENTS.len())]);
                } else {
                    input.push(rng.next() as u8);
                }
            }
            input.truncate(len);

            let mut scanner = SignalScanner::new();
            let mut results = Vec::new();
            let mut start = 0;
            while start < input.len() {
                let end = (start + 1 + rng.below(600)).min(input.len());
                results.extend(scanner.feed(&input[start..end]));
                assert!(scanner.buffered() <= MAX_SIGNAL_BYTES);
                start = end;
            }
            results.extend(scanner.finish());
            assert_eq!(scanner.buffered(), 0);

            assert!(results.len() <= input.len() / OPENER_LEN, "round {round}");
            for result in &results {
                match result {
                    Ok(signal) => {
                        assert_eq!(parse_one(signal.raw()).as_ref(), Ok(signal));
                        if let Some(p) = signal.progress() {
                            assert!(p <= 100);
                        }
                        if signal.kind().requires_payload() {
                            assert!(signal.payload().is_some_and(|p| !p.is_empty()));
                        }
                    }
                    Err(error) => {
                        // U+FFFD is 3 bytes for at most 1 byte of output.
                        assert!(error.raw.len() <= 3 * MAX_SIGNAL_BYTES);
                        assert_eq!(error.kind.is_none(), error.code == Malformed);
                    }
                }
            }
            if round % 16 == 0 {
                assert_eq!(scan(&input), results, "round {round}");
            }
            valid += results.iter().filter(|r| r.is_ok()).count();
            invalid += results.iter().filter(|r| r.is_err()).count();
        }
        // The inputs did reach every path.
        assert!(valid > 10_000 && invalid > 10_000, "{valid} {invalid}");
    }

    #[test]
    fn the_record_is_the_seeds_line() {
        let lines = [
            r#"{"ts":"2026-01-25T10:00:00Z","level":"warn","code":"SIGNAL_UNKNOWN_TYPE","agent":"echo-001","task":"task-042","raw":"<axiom>COMPLET</axiom>","type":"COMPLET"}"#,
            r#"{"ts":"2026-01-25T10:00:05Z","level":"warn","code":"SIGNAL_MISSING_PAYLOAD","agent":"echo-001","task":"task-042","raw":"<axiom>BLOCKED</axiom>","type":"BLOCKED"}"#,
        ];
        for line in lines {
            let record: SignalRecord = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&record).unwrap(), line);
            // And the same line comes from the error itself.
            let error = parse_one(&record.raw).unwrap_err();
            let mut made = SignalRecord::new(record.ts, "echo-001", &error).with_task("task-042");
            assert_eq!(made.message.take(), Some(error.message.clone()));
            assert_eq!(made, record);
        }
        // A malformed signal has no type; a daemon session has an id.
        let error = parse_one("[AXIOM:COMPLETE]").unwrap_err();
        let ts = Timestamp::parse("2026-03-31T22:00:00Z").unwrap();
        let record = SignalRecord::new(ts, "rio", &error).with_session("20260331-220000");
        let json: serde_json::Value = serde_json::to_value(&record).unwrap();
        assert_eq!(json["level"], "warn");
        assert_eq!(json["code"], "SIGNAL_MALFORMED");
        assert_eq!(json["session"], "20260331-220000");
        assert!(json.get("type").is_none() && json.get("task").is_none());
        assert_eq!(
            json.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["ts", "level", "code", "agent", "session", "raw", "message"]
        );
    }

    #[test]
    fn append_writes_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signals.jsonl");
        let ts = Timestamp::parse("2026-03-31T22:00:00Z").unwrap();
        let inputs = ["<axiom>COMPLET</axiom>", "<axiom>BLOCKED:a\nb</axiom>"];
        for raw in inputs {
            let record = SignalRecord::new(ts, "rio", &parse_one(raw).unwrap_err());
            append(&path, &record).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(text.ends_with('\n'));
        for (line, raw) in lines.iter().zip(inputs) {
            let record: SignalRecord = serde_json::from_str(line).unwrap();
            assert_eq!(record.raw, raw);
        }
    }
}
