//! What a session printed, kept small: the observer the daemon hands to the
//! runner, and the reading of Claude Code's result object.
//!
//! A session may print gigabytes; [`SessionOutput`] keeps a fixed amount of
//! it whatever the size: byte counts per stream, the last
//! [`STDOUT_TAIL`] bytes of stdout (where Claude Code prints its result), the
//! last [`STDERR_TAIL`] bytes of stderr (for an error message when there is no
//! result), and a 64-bit FNV-1a hash of everything, which lets the daemon see
//! that two consecutive retries printed exactly the same thing.
//!
//! [`SessionOutput::claude_result`] finds the result object of
//! `claude -p --output-format json` (one object, possibly pretty-printed),
//! `--output-format json --verbose` (an array of messages, the result last)
//! and `--output-format stream-json` (one message per line, the result
//! last), and [`classify`] sorts a failed result into "log in again", "API
//! trouble, maybe retry" and the rest. Both are pure and never fail: output
//! that is not Claude Code's gives `None`.

use serde::Serialize;
use serde_json::Value;

use super::runner::{OutputObserver, OutputStream};

/// How much of the end of stdout is kept for parsing. Claude Code's result
/// object is a few KiB unless the final answer is long; this leaves room for
/// long answers while bounding the memory of a session that floods.
pub const STDOUT_TAIL: usize = 256 * 1024;

/// How much of the end of stderr is kept, for an error message when the
/// session printed no result.
pub const STDERR_TAIL: usize = 8 * 1024;

/// Messages kept in a [`ClaudeFailure`] are cut to this many characters.
pub const MESSAGE_LIMIT: usize = 500;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The observer of a daemon session: counts, tails and a fingerprint, in
/// bounded memory.
#[derive(Debug, Clone)]
pub struct SessionOutput {
    stdout_bytes: u64,
    stderr_bytes: u64,
    stdout_tail: Tail,
    stderr_tail: Tail,
    hash: u64,
    printed: bool,
}

impl Default for SessionOutput {
    fn default() -> Self {
        SessionOutput::new()
    }
}

impl SessionOutput {
    pub fn new() -> SessionOutput {
        SessionOutput {
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_tail: Tail::new(STDOUT_TAIL),
            stderr_tail: Tail::new(STDERR_TAIL),
            hash: FNV_OFFSET,
            printed: false,
        }
    }

    /// Bytes seen on stdout, all of them.
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout_bytes
    }

    /// Bytes seen on stderr, all of them.
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr_bytes
    }

    /// FNV-1a (64-bit) over every byte of both streams in the order they
    /// arrived; `None` if the session printed nothing at all. Stable across
    /// daemon versions and restarts (no random seed), so it can be stored.
    ///
    /// The interleaving of stdout and stderr depends on timing, so the same
    /// program printing to both streams may hash differently from run to run;
    /// a session that prints the same thing to one stream hashes the same.
    pub fn fingerprint(&self) -> Option<u64> {
        (self.stdout_bytes + self.stderr_bytes > 0).then_some(self.hash)
    }

    /// No byte other than ASCII whitespace was printed, on either stream.
    pub fn is_empty(&self) -> bool {
        !self.printed
    }

    /// The last (at most [`STDOUT_TAIL`]) bytes of stdout. If more was
    /// printed, the first line may be cut anywhere, even inside a UTF-8
    /// character.
    pub fn stdout_tail(&self) -> Vec<u8> {
        self.stdout_tail.contents()
    }

    /// The last (at most [`STDERR_TAIL`]) bytes of stderr.
    pub fn stderr_tail(&self) -> Vec<u8> {
        self.stderr_tail.contents()
    }

    /// Claude Code's result object, if stdout ends with one (see
    /// [`parse_claude_result`]).
    pub fn claude_result(&self) -> Option<ClaudeResult> {
        parse_claude_result(&self.stdout_tail.contents())
    }

    #[cfg(test)]
    fn memory(&self) -> usize {
        self.stdout_tail.buf.capacity() + self.stderr_tail.buf.capacity()
    }
}

impl OutputObserver for SessionOutput {
    /// Only reached if called directly (the runner calls
    /// [`on_stream_output`](OutputObserver::on_stream_output)): counted as
    /// stdout.
    fn on_output(&mut self, chunk: &[u8]) {
        self.on_stream_output(OutputStream::Stdout, chunk);
    }

    fn on_stream_output(&mut self, stream: OutputStream, chunk: &[u8]) {
        match stream {
            OutputStream::Stdout => {
                self.stdout_bytes += chunk.len() as u64;
                self.stdout_tail.push(chunk);
            }
            OutputStream::Stderr => {
                self.stderr_bytes += chunk.len() as u64;
                self.stderr_tail.push(chunk);
            }
        }
        let mut hash = self.hash;
        for &byte in chunk {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(FNV_PRIME);
        }
        self.hash = hash;
        if !self.printed {
            self.printed = chunk.iter().any(|b| !b.is_ascii_whitespace());
        }
    }
}

/// The last `cap` bytes of a stream: a ring buffer that grows up to `cap`
/// and never beyond it.
#[derive(Debug, Clone)]
struct Tail {
    buf: Vec<u8>,
    /// Once `buf` is full: where the oldest byte is (and the next write goes).
    head: usize,
    cap: usize,
}

impl Tail {
    fn new(cap: usize) -> Tail {
        Tail {
            buf: Vec::new(),
            head: 0,
            cap,
        }
    }

    fn push(&mut self, mut chunk: &[u8]) {
        if chunk.len() >= self.cap {
            chunk = &chunk[chunk.len() - self.cap..];
            self.buf.clear();
            self.reserve(self.cap);
            self.buf.extend_from_slice(chunk);
            self.head = 0;
            return;
        }
        if self.buf.len() < self.cap {
            let n = chunk.len().min(self.cap - self.buf.len());
            self.reserve(self.buf.len() + n);
            self.buf.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
        }
        while !chunk.is_empty() {
            let n = chunk.len().min(self.cap - self.head);
            self.buf[self.head..self.head + n].copy_from_slice(&chunk[..n]);
            self.head = (self.head + n) % self.cap;
            chunk = &chunk[n..];
        }
    }

    /// Grows the buffer to hold `needed` bytes: doubling, but never past
    /// `cap` (the standard growth could double past it).
    fn reserve(&mut self, needed: usize) {
        if needed > self.buf.capacity() {
            let target = needed.max((self.buf.capacity() * 2).min(self.cap));
            self.buf.reserve_exact(target - self.buf.len());
        }
    }

    fn contents(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len());
        out.extend_from_slice(&self.buf[self.head..]);
        out.extend_from_slice(&self.buf[..self.head]);
        out
    }
}

/// Claude Code's result object (`"type": "result"`), the fields the daemon
/// uses. Every field is optional in the input; unknown ones are ignored, and
/// a field of an unexpected type counts as absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClaudeResult {
    /// `is_error`; absent counts as false.
    pub is_error: bool,
    /// `success`, `error_max_turns`, `error_during_execution`, ... (Claude
    /// Code may say `success` with `is_error: true`, e.g. when not logged in.)
    pub subtype: Option<String>,
    /// The final answer, or the error message.
    pub result: Option<String>,
    pub total_cost_usd: Option<f64>,
    pub usage: Option<Usage>,
    pub num_turns: Option<u64>,
    pub duration_ms: Option<u64>,
    /// The conversation's id (`claude --resume ID`).
    pub session_id: Option<String>,
    /// The HTTP status of the API error that ended the session, when Claude
    /// Code reports one (`null` counts as absent).
    pub api_error_status: Option<u16>,
    /// `permission_denials`: the tools the session was refused, by name (at
    /// most [`DENIALS_KEPT`]; `denied` counts them all).
    pub denied_tools: Vec<String>,
    pub denied: usize,
}

/// How many denied tools' names a result keeps.
pub const DENIALS_KEPT: usize = 10;

/// Token counts of a session; absent counts are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl Usage {
    /// All four counts added up.
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_creation_input_tokens)
            .saturating_add(self.cache_read_input_tokens)
    }
}

impl ClaudeResult {
    /// Every token of the session (input, output, cache writes and reads);
    /// `None` if the result had no `usage`.
    pub fn tokens_total(&self) -> Option<u64> {
        self.usage.map(|usage| usage.total())
    }

    fn from_value(value: &Value) -> Option<ClaudeResult> {
        let object = value.as_object()?;
        if object.get("type").and_then(Value::as_str) != Some("result") {
            return None;
        }
        let string = |name: &str| object.get(name).and_then(Value::as_str).map(str::to_owned);
        let number = |name: &str| object.get(name).and_then(Value::as_u64);
        let usage = object.get("usage").and_then(Value::as_object).map(|usage| {
            let count = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
            Usage {
                input_tokens: count("input_tokens"),
                output_tokens: count("output_tokens"),
                cache_creation_input_tokens: count("cache_creation_input_tokens"),
                cache_read_input_tokens: count("cache_read_input_tokens"),
            }
        });
        let denials = object
            .get("permission_denials")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        Some(ClaudeResult {
            is_error: object
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            subtype: string("subtype"),
            result: string("result"),
            total_cost_usd: object.get("total_cost_usd").and_then(Value::as_f64),
            usage,
            num_turns: number("num_turns"),
            duration_ms: number("duration_ms"),
            session_id: string("session_id"),
            api_error_status: number("api_error_status").and_then(|s| u16::try_from(s).ok()),
            denied_tools: denials
                .iter()
                .filter_map(|d| d.get("tool_name").and_then(Value::as_str))
                .take(DENIALS_KEPT)
                .map(|n| truncate(n, 64))
                .collect(),
            denied: denials.len(),
        })
    }
}

/// Claude Code's result object at the end of `stdout`:
///
/// - the whole (trimmed) text is one object with `"type": "result"`
///   (`--output-format json`, compact or pretty-printed), or an array whose
///   last such object is taken (`--output-format json --verbose`);
/// - otherwise the last line that is such an object (`--output-format
///   stream-json`; also finds the result after other output, or at the end
///   of a tail that starts in the middle of a line).
///
/// `None` for anything else, plain text (`--output-format text`) included.
pub fn parse_claude_result(stdout: &[u8]) -> Option<ClaudeResult> {
    let whole = stdout.trim_ascii();
    if whole.first().is_some_and(|&b| b == b'{' || b == b'[')
        && let Ok(value) = serde_json::from_slice::<Value>(whole)
    {
        let found = match &value {
            Value::Array(items) => items.iter().rev().find_map(ClaudeResult::from_value),
            _ => ClaudeResult::from_value(&value),
        };
        if found.is_some() {
            return found;
        }
    }
    stdout
        .split(|&b| b == b'\n')
        .rev()
        .map(<[u8]>::trim_ascii)
        .filter(|line| line.starts_with(b"{") && line.ends_with(b"}"))
        .find_map(|line| {
            serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|value| ClaudeResult::from_value(&value))
        })
}

/// Why a session that printed an error result failed, and whether its
/// message says the network failed: values of the pure decisions
/// (crates/decide's `ending`), which judge them.
pub use crate::ending::{ClaudeFailure, is_network_error};

/// Phrases of an authentication failure (compared in lower case).
const LOGIN_PHRASES: &[&str] = &[
    "not logged in",
    "please run /login",
    "invalid api key",
    "invalid x-api-key",
    "oauth token has expired",
    "oauth token has been revoked",
    "authentication_error",
    "authentication_failed",
    "authentication failed",
];

/// Phrases of a passing API or network problem.
const RETRYABLE_PHRASES: &[&str] = &[
    "rate_limit",
    "rate limit",
    "overloaded",
    "request timed out",
    "connection error",
    "econnreset",
    "econnrefused",
    "connection refused",
    "etimedout",
    "socket hang up",
];

/// Phrases of a request the API will refuse again.
const REFUSED_PHRASES: &[&str] = &["prompt is too long", "credit balance is too low"];

/// Sorts a result into a failure; `None` if it is not an error.
///
/// The HTTP status decides when there is one (`api_error_status`, or the
/// `API Error: NNN` Claude Code prefixes its messages with): 401 means log
/// in, 408, 429, 529 and 5xx may pass, other 4xx will not (unless the text
/// says to log in). Without a status the text decides, case-insensitively.
pub fn classify(result: &ClaudeResult) -> Option<ClaudeFailure> {
    if !result.is_error {
        // Claude Code also ends runs that did not do the work with exit 0
        // and `is_error: false`: a turn or budget limit, an error during
        // execution, or no turn at all.
        return match result.subtype.as_deref() {
            Some(sub) if sub.starts_with("error") => Some(ClaudeFailure::Other {
                message: stopped_by(sub),
            }),
            _ if result.num_turns == Some(0) => Some(ClaudeFailure::Other {
                message: "Claude Code reported success after no turn at all: nothing was done"
                    .into(),
            }),
            _ => None,
        };
    }
    if let Some(sub) = result
        .subtype
        .as_deref()
        .filter(|s| s.starts_with("error_"))
        && result.result.as_deref().is_none_or(|r| r.trim().is_empty())
    {
        return Some(ClaudeFailure::Other {
            message: stopped_by(sub),
        });
    }
    let text = result
        .result
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .or(result.subtype.as_deref())
        .unwrap_or("the session reported an error without a message");
    let lower = text.to_lowercase();
    let message = truncate(text, MESSAGE_LIMIT);
    let says = |phrases: &[&str]| phrases.iter().any(|p| lower.contains(p));
    let login = says(LOGIN_PHRASES);
    let status = result.api_error_status.or_else(|| api_error_status(&lower));
    let failure = match status {
        Some(401) => ClaudeFailure::LoginRequired { message },
        Some(408 | 429 | 529 | 500..=599) => ClaudeFailure::Api {
            message,
            retryable: true,
        },
        Some(400..=499) if login => ClaudeFailure::LoginRequired { message },
        Some(400..=499) => ClaudeFailure::Api {
            message,
            retryable: false,
        },
        _ if login => ClaudeFailure::LoginRequired { message },
        _ if says(RETRYABLE_PHRASES) => ClaudeFailure::Api {
            message,
            retryable: true,
        },
        _ if says(REFUSED_PHRASES) => ClaudeFailure::Api {
            message,
            retryable: false,
        },
        _ => ClaudeFailure::Other { message },
    };
    Some(failure)
}

/// What an error subtype means, for the error record.
fn stopped_by(subtype: &str) -> String {
    let what = match subtype {
        "error_max_turns" => "it reached its turn limit (--max-turns) before finishing",
        "error_max_budget_usd" => "it reached its spending limit (--max-budget-usd)",
        "error_during_execution" => "an error during execution ended the run",
        _ => "it reported an error",
    };
    format!("Claude Code stopped ({}): {what}", truncate(subtype, 64))
}

/// Why a session that ended well is still doubtful: tools it was refused
/// (its work may be half done). Empty if nothing is.
pub fn doubts(result: &ClaudeResult) -> Option<String> {
    if result.denied == 0 || result.is_error {
        return None;
    }
    let more = result.denied.saturating_sub(result.denied_tools.len());
    let mut names = result.denied_tools.join(", ");
    if more > 0 {
        names.push_str(&format!(" and {more} more"));
    }
    Some(format!(
        "the session was refused {} tool use(s) ({names}): its work may be incomplete",
        result.denied
    ))
}

/// The status in `api error: 429 …` or `api error (529 …)` (lower case).
fn api_error_status(lower: &str) -> Option<u16> {
    const PREFIX: &str = "api error";
    lower.match_indices(PREFIX).find_map(|(at, _)| {
        let rest = lower[at + PREFIX.len()..].trim_start_matches([':', '(', ' ']);
        let digits = rest.as_bytes().get(..3)?;
        let after = rest.as_bytes().get(3);
        (digits.iter().all(u8::is_ascii_digit) && !after.is_some_and(u8::is_ascii_digit))
            .then(|| std::str::from_utf8(digits).ok()?.parse().ok())
            .flatten()
    })
}

/// At most `limit` characters of `text`, with `…` if it was longer.
fn truncate(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The most a reason quotes of a failed command's last line on stderr.
pub const LAST_WORDS_CHARS: usize = 300;

/// The last non-blank line a failed command printed on stderr (lossy
/// UTF-8, trimmed, control characters dropped, at most
/// [`LAST_WORDS_CHARS`]): what an operator needs in session.json's reason
/// when nothing better is known ("cd: /opt/…/leo: No such file or
/// directory").
pub fn last_words(stderr_tail: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stderr_tail);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let clean: String = line.chars().filter(|c| !c.is_control()).collect();
    let clean = clean.trim();
    if clean.is_empty() {
        return None;
    }
    Some(match clean.char_indices().nth(LAST_WORDS_CHARS) {
        Some((i, _)) => format!("{}…", &clean[..i]),
        None => clean.to_string(),
    })
}

#[cfg(test)]
mod tests;
