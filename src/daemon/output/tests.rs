//! The tests of `daemon::output`: the bounded tails and fingerprint, and
//! Claude Code's result found and classified in recorded outputs
//! (`tests/fixtures/claude/`).

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
        iteration: 1,
        max_output: 1024 * 1024,
        timeout: Duration::from_secs(120),
        kill_grace: Duration::from_secs(5),
        stall_timeout: None,
        stall_action: StallAction::Warn,
        marker: (
            "AGENT_STATE_SESSION_ID".into(),
            format!("test/{}", uuid::Uuid::new_v4()),
        ),
        agent_stall_timeout: None,
        memory_max: None,
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
        last_words(b"warming up\nscript: line 9: cd: /opt/x: No such file or directory\n\n  \n"),
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
