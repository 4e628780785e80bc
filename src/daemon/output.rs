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

/// Why a session that printed an error result failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaudeFailure {
    /// The CLI has no valid credentials: an operator must log in (or fix the
    /// API key). Retrying does not help.
    LoginRequired { message: String },
    /// The API failed. `retryable`: rate limits, overload, server errors and
    /// network trouble, which pass; otherwise a request the API refuses
    /// (prompt too long, forbidden, ...), which retrying repeats.
    Api { message: String, retryable: bool },
    /// Anything else (`error_max_turns`, `error_during_execution`, ...).
    Other { message: String },
}

impl ClaudeFailure {
    /// The message for the error record (at most [`MESSAGE_LIMIT`]
    /// characters and an ellipsis).
    pub fn message(&self) -> &str {
        match self {
            ClaudeFailure::LoginRequired { message }
            | ClaudeFailure::Api { message, .. }
            | ClaudeFailure::Other { message } => message,
        }
    }

    /// Whether the same session may succeed if simply run again later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClaudeFailure::Api {
                retryable: true,
                ..
            }
        )
    }
}

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
mod tests {
    use super::*;

    use std::time::Duration;

    use crate::daemon::runner::{self, Ending, SessionSpec, StallAction};

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/claude/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Output as the runner hands it over, chunk by chunk.
    type Chunks<'a> = &'a [(OutputStream, &'a [u8])];

    fn feed(chunks: Chunks) -> SessionOutput {
        let mut out = SessionOutput::new();
        for (stream, chunk) in chunks {
            out.on_stream_output(*stream, chunk);
        }
        out
    }

    fn stdout(text: &str) -> SessionOutput {
        feed(&[(OutputStream::Stdout, text.as_bytes())])
    }

    fn error(text: &str) -> ClaudeResult {
        ClaudeResult {
            is_error: true,
            result: Some(text.to_string()),
            ..ClaudeResult::default()
        }
    }

    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(FNV_OFFSET, |hash, &b| {
            (hash ^ u64::from(b)).wrapping_mul(FNV_PRIME)
        })
    }

    const SUCCESS: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":2817,"num_turns":3,"result":"Done: 2 files changed.","session_id":"abc-123","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":14000,"output_tokens":250,"server_tool_use":{"web_search_requests":0}},"some_future_field":[1,2,3]}"#;

    fn success() -> ClaudeResult {
        ClaudeResult {
            is_error: false,
            subtype: Some("success".into()),
            result: Some("Done: 2 files changed.".into()),
            total_cost_usd: Some(0.0421),
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 250,
                cache_creation_input_tokens: 3000,
                cache_read_input_tokens: 14000,
            }),
            num_turns: Some(3),
            duration_ms: Some(2817),
            session_id: Some("abc-123".into()),
            api_error_status: None,
            denied_tools: vec![],
            denied: 0,
        }
    }

    #[test]
    fn counts_bytes_per_stream() {
        let out = feed(&[
            (OutputStream::Stdout, b"abc"),
            (OutputStream::Stderr, b"de"),
            (OutputStream::Stdout, b"f"),
        ]);
        assert_eq!(out.stdout_bytes(), 4);
        assert_eq!(out.stderr_bytes(), 2);
        assert_eq!(out.stdout_tail(), b"abcf");
        assert_eq!(out.stderr_tail(), b"de");
    }

    #[test]
    fn fingerprint_is_fnv1a_over_both_streams_in_arrival_order() {
        let cases: &[(Chunks, Option<u64>)] = &[
            (&[], None),
            (&[(OutputStream::Stdout, b"")], None),
            // The published FNV-1a 64 test vectors.
            (&[(OutputStream::Stdout, b"a")], Some(0xaf63dc4c8601ec8c)),
            (
                &[(OutputStream::Stderr, b"foobar")],
                Some(0x85944171f73967e8),
            ),
            (
                &[
                    (OutputStream::Stdout, b"foo"),
                    (OutputStream::Stderr, b"bar"),
                ],
                Some(0x85944171f73967e8),
            ),
            (
                &[
                    (OutputStream::Stderr, b"bar"),
                    (OutputStream::Stdout, b"foo"),
                ],
                Some(fnv(b"barfoo")),
            ),
        ];
        for (chunks, want) in cases {
            assert_eq!(feed(chunks).fingerprint(), *want, "{chunks:?}");
        }
        // Chunking does not matter.
        let whole = stdout("the same output\n").fingerprint();
        let split = feed(&[
            (OutputStream::Stdout, b"the sa"),
            (OutputStream::Stdout, b"me output\n"),
        ])
        .fingerprint();
        assert_eq!(whole, split);
        assert_ne!(whole, stdout("the same output!\n").fingerprint());
    }

    #[test]
    fn empty_means_nothing_but_whitespace() {
        let cases: &[(Chunks, bool)] = &[
            (&[], true),
            (&[(OutputStream::Stdout, b"")], true),
            (&[(OutputStream::Stdout, b" \n\t\r\n")], true),
            (
                &[(OutputStream::Stdout, b"\n"), (OutputStream::Stderr, b"  ")],
                true,
            ),
            (&[(OutputStream::Stdout, b"\nx\n")], false),
            (&[(OutputStream::Stderr, b"warning\n")], false),
            (&[(OutputStream::Stdout, b"\0")], false),
        ];
        for (chunks, want) in cases {
            assert_eq!(feed(chunks).is_empty(), *want, "{chunks:?}");
        }
    }

    #[test]
    fn tail_keeps_the_last_bytes_across_every_chunking() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        for cap in [1, 7, 100, 4096] {
            for chunk in [1, 3, 99, 100, 101, 1000, 5000] {
                let mut tail = Tail::new(cap);
                for piece in data.chunks(chunk) {
                    tail.push(piece);
                }
                assert_eq!(
                    tail.contents(),
                    &data[data.len() - cap..],
                    "cap {cap}, chunk {chunk}"
                );
                assert!(tail.buf.capacity() <= cap, "cap {cap}, chunk {chunk}");
            }
        }
        let mut tail = Tail::new(10);
        tail.push(b"short");
        assert_eq!(tail.contents(), b"short");
    }

    #[test]
    fn memory_stays_bounded_whatever_the_volume() {
        let mut out = SessionOutput::new();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..(100 * 1024 * 1024 / chunk.len()) {
            out.on_stream_output(OutputStream::Stdout, &chunk);
            out.on_stream_output(OutputStream::Stderr, &chunk[..1000]);
        }
        out.on_stream_output(OutputStream::Stdout, format!("\n{SUCCESS}\n").as_bytes());
        assert_eq!(
            out.stdout_bytes(),
            100 * 1024 * 1024 + SUCCESS.len() as u64 + 2
        );
        assert!(out.stdout_tail.buf.capacity() <= STDOUT_TAIL);
        assert!(
            out.memory() <= STDOUT_TAIL + STDERR_TAIL,
            "{}",
            out.memory()
        );
        assert_eq!(out.stdout_tail().len(), STDOUT_TAIL);
        assert_eq!(out.claude_result(), Some(success()));
    }

    #[test]
    fn claude_result_is_found_in_every_output_format() {
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<Value>(SUCCESS).unwrap()).unwrap();
        let stream = format!(
            "{}\n{}\n{SUCCESS}\n",
            r#"{"type":"system","subtype":"init","session_id":"abc-123"}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Done"}]}}"#,
        );
        let verbose_array = format!(
            r#"[{{"type":"system","subtype":"init"}},{{"type":"assistant","message":{{}}}},{SUCCESS}]"#
        );
        let cases: Vec<(&str, String, Option<ClaudeResult>)> = vec![
            ("compact json", SUCCESS.to_string(), Some(success())),
            ("json with a newline", format!("{SUCCESS}\n"), Some(success())),
            ("pretty-printed json", pretty, Some(success())),
            ("stream-json", stream.clone(), Some(success())),
            (
                "stream-json with CRLF",
                stream.replace('\n', "\r\n"),
                Some(success()),
            ),
            ("json --verbose (an array)", verbose_array, Some(success())),
            (
                "text before the result line",
                format!("some progress text\n{SUCCESS}\n"),
                Some(success()),
            ),
            (
                "text after the result line",
                format!("{SUCCESS}\nbye\n"),
                Some(success()),
            ),
            (
                "tail cut in the middle of a flood",
                format!("xxxxxxxxxxxxxxxx\"}}\n{SUCCESS}\n"),
                Some(success()),
            ),
            (
                "tail cut inside a json line",
                format!("ult\",\"is_error\":true}}\n{SUCCESS}"),
                Some(success()),
            ),
            ("text output", "Done: 2 files changed.\n".into(), None),
            ("empty", String::new(), None),
            ("an object that is not a result", r#"{"a":1}"#.into(), None),
            (
                "stream without a result yet",
                r#"{"type":"system","subtype":"init"}"#.into(),
                None,
            ),
            ("a truncated result", SUCCESS[..SUCCESS.len() - 5].into(), None),
            (
                "minimal",
                r#"{"type":"result"}"#.into(),
                Some(ClaudeResult::default()),
            ),
            (
                "wrong types count as absent",
                r#"{"type":"result","is_error":"yes","num_turns":-1,"total_cost_usd":"1","usage":{"input_tokens":"7","output_tokens":5},"api_error_status":70000}"#.into(),
                Some(ClaudeResult {
                    usage: Some(Usage {
                        output_tokens: 5,
                        ..Usage::default()
                    }),
                    ..ClaudeResult::default()
                }),
            ),
            (
                "api error status",
                r#"{"type":"result","is_error":true,"api_error_status":429,"result":"API Error: 429"}"#.into(),
                Some(ClaudeResult {
                    is_error: true,
                    result: Some("API Error: 429".into()),
                    api_error_status: Some(429),
                    ..ClaudeResult::default()
                }),
            ),
        ];
        for (name, text, want) in cases {
            assert_eq!(stdout(&text).claude_result(), want, "{name}");
        }
    }

    #[test]
    fn binary_garbage_is_no_result_and_does_not_hide_one() {
        let garbage: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut out = SessionOutput::new();
        out.on_stream_output(OutputStream::Stdout, &garbage);
        assert_eq!(out.claude_result(), None);
        assert!(!out.is_empty());
        out.on_stream_output(OutputStream::Stdout, b"\n\xff\xfe{\"type\":\"result\"\n");
        assert_eq!(out.claude_result(), None);
        out.on_stream_output(OutputStream::Stdout, format!("\n{SUCCESS}\n").as_bytes());
        assert_eq!(out.claude_result(), Some(success()));
    }

    #[test]
    fn stderr_is_not_parsed() {
        let out = feed(&[(OutputStream::Stderr, SUCCESS.as_bytes())]);
        assert_eq!(out.claude_result(), None);
    }

    #[test]
    fn tokens_total_adds_every_kind() {
        assert_eq!(success().tokens_total(), Some(12 + 250 + 3000 + 14000));
        assert_eq!(ClaudeResult::default().tokens_total(), None);
    }

    #[test]
    fn classify_sorts_failures() {
        #[derive(Debug, Clone, Copy)]
        enum Kind {
            Login,
            Retry,
            Refused,
            Other,
        }
        use Kind::*;
        let cases: &[(&str, Kind)] = &[
            ("Not logged in · Please run /login", Login),
            ("Invalid API key · Please run /login", Login),
            (
                "OAuth token has expired. Please obtain a new token or refresh your existing token.",
                Login,
            ),
            (
                r#"API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                Login,
            ),
            ("API Error: 401", Login),
            ("please RUN /LOGIN", Login),
            ("authentication_error", Login),
            (
                r#"API Error: 403 {"error":{"message":"OAuth token has been revoked. Please run /login"}}"#,
                Login,
            ),
            (
                r#"API Error: 429 {"type":"error","error":{"type":"rate_limit_error"}}"#,
                Retry,
            ),
            ("Rate limit exceeded", Retry),
            // A usage limit is protocol::limits' (the daemon holds the
            // credential instead of spending retries on it).
            ("Claude AI usage limit reached|1764000000", Other),
            (
                r#"API Error: 529 {"type":"error","error":{"type":"overloaded_error"}}"#,
                Retry,
            ),
            ("API Error (529 Overloaded) · Retrying", Retry),
            ("the API is overloaded", Retry),
            ("API Error: 500 Internal server error", Retry),
            ("API Error: 503", Retry),
            ("API Error: Request timed out.", Retry),
            ("API Error: Connection error.", Retry),
            ("fetch failed: read ECONNRESET", Retry),
            ("connect ECONNREFUSED 127.0.0.1:443", Retry),
            ("connect ETIMEDOUT", Retry),
            (
                r#"API Error: 400 {"error":{"message":"prompt is too long: 212000 tokens > 200000 maximum"}}"#,
                Refused,
            ),
            ("Prompt is too long", Refused),
            ("API Error: 403 Forbidden", Refused),
            ("API Error: 404 model not found", Refused),
            ("API Error: 413 request too large", Refused),
            ("Credit balance is too low", Refused),
            ("Reached max turns (10)", Other),
            ("API Error: 4000 things", Other),
            ("Something broke", Other),
        ];
        for &(text, kind) in cases {
            let message = text.to_string();
            let want = match kind {
                Login => ClaudeFailure::LoginRequired { message },
                Retry => ClaudeFailure::Api {
                    message,
                    retryable: true,
                },
                Refused => ClaudeFailure::Api {
                    message,
                    retryable: false,
                },
                Other => ClaudeFailure::Other { message },
            };
            assert_eq!(classify(&error(text)), Some(want), "{text}");
        }
    }

    #[test]
    fn classify_uses_the_status_field_then_the_subtype() {
        let with_status = |status: u16, text: &str| ClaudeResult {
            api_error_status: Some(status),
            ..error(text)
        };
        let cases: Vec<(ClaudeResult, Option<ClaudeFailure>)> = vec![
            (success(), None),
            (
                ClaudeResult {
                    is_error: false,
                    ..error("Not logged in")
                },
                None,
            ),
            (
                with_status(401, "Unauthorized"),
                Some(ClaudeFailure::LoginRequired {
                    message: "Unauthorized".into(),
                }),
            ),
            (
                with_status(429, "Too many requests"),
                Some(ClaudeFailure::Api {
                    message: "Too many requests".into(),
                    retryable: true,
                }),
            ),
            (
                with_status(502, "Bad gateway"),
                Some(ClaudeFailure::Api {
                    message: "Bad gateway".into(),
                    retryable: true,
                }),
            ),
            (
                with_status(400, "Bad request"),
                Some(ClaudeFailure::Api {
                    message: "Bad request".into(),
                    retryable: false,
                }),
            ),
            (
                ClaudeResult {
                    is_error: true,
                    subtype: Some("error_max_turns".into()),
                    ..ClaudeResult::default()
                },
                Some(ClaudeFailure::Other {
                    message: "Claude Code stopped (error_max_turns): it reached its turn limit (--max-turns) before finishing".into(),
                }),
            ),
            (
                ClaudeResult {
                    is_error: true,
                    result: Some("  ".into()),
                    ..ClaudeResult::default()
                },
                Some(ClaudeFailure::Other {
                    message: "the session reported an error without a message".into(),
                }),
            ),
        ];
        for (result, want) in cases {
            assert_eq!(classify(&result), want, "{result:?}");
        }
    }

    #[test]
    fn runs_that_exit_well_without_doing_the_work_are_failures_or_doubts() {
        let parse = |json: &str| parse_claude_result(json.as_bytes()).expect(json);
        // Exit 0, `is_error: false`, but stopped by a limit or an error.
        for (sub, says) in [
            ("error_max_turns", "turn limit"),
            ("error_max_budget_usd", "spending limit"),
            ("error_during_execution", "error during execution"),
        ] {
            let r = parse(&format!(
                r#"{{"type":"result","subtype":"{sub}","is_error":false,"num_turns":10}}"#
            ));
            let f = classify(&r).expect(sub);
            assert!(!f.is_retryable(), "{sub}");
            assert!(
                f.message().contains(says) && f.message().contains(sub),
                "{f:?}"
            );
        }
        // Success after no turn at all.
        let r = parse(
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":0,"result":""}"#,
        );
        assert!(classify(&r).unwrap().message().contains("no turn"));
        // Success with refused tools: not a failure, a doubt naming them.
        let r = parse(
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":4,"result":"ok","permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"rm -rf /"}},{"tool_name":"Write","tool_use_id":"t2"},{"tool_use_id":"t3"}]}"#,
        );
        assert_eq!(classify(&r), None);
        assert_eq!(r.denied, 3);
        assert_eq!(
            doubts(&r).unwrap(),
            "the session was refused 3 tool use(s) (Bash, Write and 1 more): its work may be incomplete"
        );
        assert_eq!(doubts(&success()), None);
        // `is_error: true` with `subtype: "success"` is judged by its text.
        let r = parse(
            r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login"}"#,
        );
        assert!(matches!(
            classify(&r),
            Some(ClaudeFailure::LoginRequired { .. })
        ));
    }

    #[test]
    fn failure_messages_are_truncated_on_a_character_boundary() {
        let long = format!("API Error: 500 {}", "é".repeat(1000));
        let failure = classify(&error(&long)).unwrap();
        assert!(failure.is_retryable());
        let message = failure.message();
        assert_eq!(message.chars().count(), MESSAGE_LIMIT + 1);
        assert!(message.ends_with("é…"), "{message}");
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("exactly10!", 10), "exactly10!");
        assert_eq!(truncate("eleven chrs", 10), "eleven chr…");
    }

    #[test]
    fn real_not_logged_in_outputs_are_login_required() {
        for name in ["not-logged-in.json", "not-logged-in.stream.jsonl"] {
            let mut out = SessionOutput::new();
            // In small pieces, as a pipe might deliver them.
            for piece in fixture(name).chunks(50) {
                out.on_stream_output(OutputStream::Stdout, piece);
            }
            let result = out.claude_result().unwrap_or_else(|| panic!("{name}"));
            assert!(result.is_error, "{name}");
            assert_eq!(result.api_error_status, None, "{name}");
            assert_eq!(result.tokens_total(), Some(0), "{name}");
            assert_eq!(result.total_cost_usd, Some(0.0), "{name}");
            assert_eq!(result.num_turns, Some(1), "{name}");
            assert_eq!(
                classify(&result),
                Some(ClaudeFailure::LoginRequired {
                    message: "Not logged in · Please run /login".into()
                }),
                "{name}"
            );
        }
    }

    /// Runs the real Claude Code CLI, without credentials: set
    /// `AGENT_STATE_CLAUDE_BIN` to its path (e.g. after `npm install
    /// @anthropic-ai/claude-code`, `node_modules/.bin/claude`).
    #[tokio::test]
    async fn real_claude_without_credentials_is_login_required() {
        let Some(bin) = std::env::var_os("AGENT_STATE_CLAUDE_BIN") else {
            eprintln!("SKIPPED: set AGENT_STATE_CLAUDE_BIN");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let spec = SessionSpec {
            argv: vec![
                bin.to_string_lossy().into_owned(),
                "-p".into(),
                "--output-format".into(),
                "json".into(),
            ],
            env: vec![("HOME".into(), home.display().to_string())],
            // Whatever credentials or endpoints the test's environment has
            // must not reach the CLI: the test is about having none.
            env_remove: [
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_BASE_URL",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX",
                "CLAUDE_CONFIG_DIR",
                "XDG_CONFIG_HOME",
            ]
            .map(String::from)
            .to_vec(),
            cwd: dir.path().to_path_buf(),
            stdin: b"hello\n".to_vec(),
            log_path: dir.path().join("session.log"),
            max_output: 1024 * 1024,
            timeout: Duration::from_secs(120),
            kill_grace: Duration::from_secs(5),
            stall_timeout: None,
            stall_action: StallAction::Warn,
            marker: (
                "AGENT_STATE_SESSION_ID".into(),
                format!("test/{}", uuid::Uuid::new_v4()),
            ),
        };
        let mut out = SessionOutput::new();
        let report = runner::run(spec, &mut out, tokio::sync::watch::channel(false).1, None).await;
        let stdout = String::from_utf8_lossy(&out.stdout_tail()).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr_tail()).into_owned();
        assert_eq!(
            report.ending,
            Ending::Exited { code: 1 },
            "stdout {stdout:?} stderr {stderr:?}"
        );
        let result = out
            .claude_result()
            .unwrap_or_else(|| panic!("no result in {stdout:?}"));
        let failure = classify(&result);
        assert!(
            matches!(failure, Some(ClaudeFailure::LoginRequired { .. })),
            "{failure:?} from {stdout:?}"
        );
        assert!(out.fingerprint().is_some() && !out.is_empty());
    }

    #[test]
    fn last_words_are_the_last_line_on_stderr_clean_and_short() {
        assert_eq!(
            last_words(
                b"warming up\nscript: line 9: cd: /opt/x: No such file or directory\n\n  \n"
            ),
            Some("script: line 9: cd: /opt/x: No such file or directory".into())
        );
        assert_eq!(
            last_words(b"\x1b[31mred\x1b[0m\n"),
            Some("[31mred[0m".into())
        );
        assert_eq!(last_words(b"\n \n"), None);
        assert_eq!(last_words(b""), None);
        let long = "é".repeat(LAST_WORDS_CHARS + 10);
        let cut = last_words(long.as_bytes()).unwrap();
        assert_eq!(cut.chars().count(), LAST_WORDS_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
