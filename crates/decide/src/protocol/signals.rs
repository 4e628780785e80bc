//! Agent signals: `<axiom>TYPE</axiom>` and `<axiom>TYPE:payload</axiom>`
//! found in a session's output, with the types, payload rules and error
//! codes of seed 000 ("Signal Validation"). Pure functions over text, no
//! IO: the daemon writes the invalid ones to `.daemon/signals.jsonl`
//! (`daemon::effects::append_signal`).
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

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

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

#[cfg(test)]
mod tests;
