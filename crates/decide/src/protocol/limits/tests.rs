//! The limit forms, their resets and their bounds (`protocol::limits`).

use super::*;

use chrono::NaiveDate;

/// A UTC time.
fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(y, mo, d)
        .and_then(|date| date.and_hms_opt(h, mi, 0))
        .expect("a valid time")
        .and_utc()
}

/// The reference time of the fixtures (the repository's
/// tests/fixtures/claude/limits/README.md, shared with tests/it).
fn fixture_now() -> DateTime<Utc> {
    utc(2026, 11, 24, 12, 0)
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../tests/fixtures/claude/limits/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn limit_in_text(text: &str, now: DateTime<Utc>) -> Limit {
    match from_text(text, now) {
        Some(Finding::Limit(limit)) => limit,
        other => panic!("no limit in {text:?}: {other:?}"),
    }
}

/// The reset read from `You've hit your limit · resets {clock} ({zone})`.
fn reset_of(clock_and_zone: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    limit_in_text(
        &format!("You've hit your limit · resets {clock_and_zone}"),
        now,
    )
    .resets_at
}

/// What a file should read as: kind, window, reset.
type Reading<'a> = (LimitKind, Option<&'a str>, Option<DateTime<Utc>>);

/// A line and what it should read as: kind, window, reset.
type Case<'a> = (&'a str, LimitKind, Option<&'a str>, Option<DateTime<Utc>>);

// ---- the forms, as Claude Code prints them ----

#[test]
fn every_text_form_is_recognised_with_its_kind_window_and_reset() {
    let now = fixture_now();
    use LimitKind::*;
    let cases: &[Case] = &[
        (
            "You've hit your limit · resets 1pm (Europe/Lisbon)",
            UsageLimit,
            None,
            Some(utc(2026, 11, 24, 13, 0)),
        ),
        (
            "You've hit your session limit · resets 6:30pm (UTC)",
            UsageLimit,
            Some("five_hour"),
            Some(utc(2026, 11, 24, 18, 30)),
        ),
        (
            "You've hit your weekly limit · resets Nov 27, 9am (America/New_York)",
            UsageLimit,
            Some("seven_day"),
            Some(utc(2026, 11, 27, 14, 0)),
        ),
        (
            "You've hit your Opus limit · resets 10:30pm (Europe/Berlin)",
            UsageLimit,
            Some("seven_day_opus"),
            Some(utc(2026, 11, 24, 21, 30)),
        ),
        (
            "You've hit your Sonnet limit · resets Mon 12:00am (UTC)",
            UsageLimit,
            Some("seven_day_sonnet"),
            Some(utc(2026, 11, 30, 0, 0)),
        ),
        (
            // The hyphen and the `/login` hint glued to the zone (#22976).
            "You've hit your limit - resets Nov 26, 11am (Asia/Seoul)/login to switch to an API usage-billed account.",
            UsageLimit,
            None,
            Some(utc(2026, 11, 26, 2, 0)),
        ),
        (
            "You've hit your limit · resets Nov 25 at 4pm (America/Recife)",
            UsageLimit,
            None,
            Some(utc(2026, 11, 25, 19, 0)),
        ),
        (
            "You’ve hit your session limit · resets 3:20am (Asia/Calcutta) · progress saved",
            UsageLimit,
            Some("five_hour"),
            Some(utc(2026, 11, 24, 21, 50)),
        ),
        (
            "You're out of extra usage · resets 5pm (America/Los_Angeles)",
            ExtraUsageExhausted,
            None,
            Some(utc(2026, 11, 25, 1, 0)),
        ),
        (
            "You're out of extra usage · resets Nov 26, 8pm (Europe/Budapest)",
            ExtraUsageExhausted,
            None,
            Some(utc(2026, 11, 26, 19, 0)),
        ),
        (
            "You're out of usage credits · resets 10am (America/Cordoba) · progress saved",
            ExtraUsageExhausted,
            None,
            Some(utc(2026, 11, 24, 13, 0)),
        ),
        (
            "Claude AI usage limit reached|1795532400",
            UsageLimit,
            None,
            Some(utc(2026, 11, 24, 15, 0)),
        ),
        (
            "Claude usage limit reached. Your limit will reset at 5pm (Europe/Warsaw).",
            UsageLimit,
            None,
            Some(utc(2026, 11, 24, 16, 0)),
        ),
        (
            "5-hour limit reached ∙ resets 5am",
            UsageLimit,
            Some("five_hour"),
            None,
        ),
        ("API Error: Rate limit reached", ApiRateLimit, None, None),
        (
            "  ⎿  API Error: Request rejected (429) · Rate limited. Please try again later.",
            ApiRateLimit,
            None,
            None,
        ),
        (
            r#"API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Please try again later."},"request_id":"req_011CX7eaUogx5Ydze6weYKWm"}"#,
            ApiRateLimit,
            None,
            None,
        ),
        (
            r#"Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit. Please try again later."}}"#,
            ApiRateLimit,
            None,
            None,
        ),
        (
            "Your usage allocation has been disabled by your admin",
            AdminDisabled,
            None,
            None,
        ),
        (
            "Your usage allocation has been disabled by your admin · run /usage-credits to ask your admin for a higher limit",
            AdminDisabled,
            None,
            None,
        ),
        (
            "Your group's usage limit is set to $0 · ask your admin for a higher limit",
            AdminDisabled,
            None,
            None,
        ),
        (
            "Your org is out of usage · contact your admin",
            AdminDisabled,
            None,
            None,
        ),
        (
            "You've hit your org's monthly spend limit · ask your admin to raise it at claude.ai/settings/usage?from=cc_cli_limit_message · your session limit resets 5pm (UTC)",
            AdminDisabled,
            None,
            None,
        ),
        (
            "You've hit your usage limit · contact your admin to increase it",
            AdminDisabled,
            None,
            None,
        ),
    ];
    for (line, kind, window, resets_at) in cases {
        let limit = limit_in_text(line, now);
        assert_eq!(limit.kind, *kind, "{line}");
        assert_eq!(limit.window.as_deref(), *window, "{line}");
        assert_eq!(limit.resets_at, *resets_at, "{line}: {:?}", limit.note);
        assert!(!limit.evidence.is_empty(), "{line}");
        if kind.is_timed() && resets_at.is_none() {
            assert!(limit.note.is_some(), "{line}: an unknown reset says why");
        }
        if *kind == AdminDisabled {
            assert_eq!(limit.resets_at, None, "{line}: never waited on");
        }
    }
}

#[test]
fn the_old_limit_without_epoch_and_a_reset_without_zone_are_unknown_with_a_note() {
    let now = fixture_now();
    for (line, says) in [
        ("Claude AI usage limit reached", "names no reset"),
        (
            "You're out of extra usage · resets 9pm",
            "names no time zone",
        ),
        (
            "You've hit your limit for Claude messages. Limits will reset at 9:30 AM.",
            "names no time zone",
        ),
        (
            "You're out of extra usage. Add more at claude.ai/settings/usage and keep going.",
            "names no reset",
        ),
        ("You've hit your limit · resets soon (UTC)", "cannot read"),
    ] {
        let limit = limit_in_text(line, now);
        assert_eq!(limit.resets_at, None, "{line}");
        let note = limit.note.unwrap_or_default();
        assert!(note.contains(says), "{line}: {note}");
    }
}

#[test]
fn an_unknown_zone_is_an_unknown_reset_never_a_panic() {
    let limit = limit_in_text(
        "You've hit your limit · resets 1pm (Mars/Olympus_Mons)",
        fixture_now(),
    );
    assert_eq!(limit.kind, LimitKind::UsageLimit);
    assert_eq!(limit.resets_at, None);
    assert!(limit.note.unwrap().contains("unknown time zone"));
    for zone in ["", "UTC+2", "Europe/", "../../etc/passwd", "é"] {
        let text = format!("You've hit your limit · resets 1pm ({zone})");
        assert_eq!(
            limit_in_text(&text, fixture_now()).resets_at,
            None,
            "{zone}"
        );
    }
}

#[test]
fn a_fast_limit_an_upsell_line_and_other_api_errors_are_no_limit() {
    let now = fixture_now();
    for line in [
        "You've hit your fast limit · resets 2pm (UTC)",
        "/upgrade to increase your usage limit.",
        "/extra-usage to request more usage from your admin",
        "Rate limit reached",
        "the API said rate_limit_error and 429",
        // Other API errors stay output.rs's: overload, network, login.
        r#"API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        "API Error: Unable to connect to API (ENOTFOUND)",
        "Invalid API key · Please run /login",
        "Prompt is too long",
    ] {
        assert_eq!(from_text(line, now), None, "{line}");
    }
}

#[test]
fn warnings_are_information_not_limits() {
    let now = fixture_now();
    match from_text(
        "You've used 90% of your weekly limit · resets Nov 27, 9am (America/New_York)",
        now,
    ) {
        Some(Finding::Warning(w)) => {
            assert_eq!(w.window.as_deref(), Some("seven_day"));
            assert_eq!(w.utilization, Some(0.9));
            assert_eq!(w.resets_at, Some(utc(2026, 11, 27, 14, 0)));
        }
        other => panic!("{other:?}"),
    }
    match from_text("Approaching Opus limit · resets 6pm (UTC)", now) {
        Some(Finding::Warning(w)) => assert_eq!(w.window.as_deref(), Some("seven_day_opus")),
        other => panic!("{other:?}"),
    }
    // A limit on a later line wins over a warning.
    let both = "You've used 99% of your session limit\nYou've hit your session limit · resets 6:30pm (UTC)";
    assert!(matches!(from_text(both, now), Some(Finding::Limit(_))));
}

// ---- stream-json ----

#[test]
fn the_rate_limit_event_is_a_limit_only_when_rejected() {
    let now = fixture_now();
    let rejected = br#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":"org_level_disabled","isUsingOverage":false},"uuid":"1d41b14e-4652-4f9e-8f45-bada98ee0553","session_id":"e89ee32d-c257-468d-c90b-5549c606b8bd"}"#;
    let limit = from_stream_line(rejected, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.kind, LimitKind::UsageLimit);
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    assert_eq!(limit.window.as_deref(), Some("five_hour"));
    assert!(
        limit.evidence.contains("status=rejected"),
        "{}",
        limit.evidence
    );

    let warning = br#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1795545000,"rateLimitType":"seven_day","utilization":0.91,"isUsingOverage":false,"surpassedThreshold":0.75},"uuid":"u","session_id":"s"}"#;
    match from_stream_line(warning, now) {
        Some(Finding::Warning(w)) => {
            assert_eq!(w.window.as_deref(), Some("seven_day"));
            assert_eq!(w.utilization, Some(0.91));
            assert_eq!(w.resets_at, Some(utc(2026, 11, 24, 18, 30)));
        }
        other => panic!("{other:?}"),
    }

    let allowed = br#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":"org_level_disabled","isUsingOverage":false}}"#;
    assert_eq!(from_stream_line(allowed, now), None);
    let bare = br#"{"type":"rate_limit_event"}"#;
    assert_eq!(from_stream_line(bare, now), None);

    // The window is spent, but the session goes on with extra usage.
    let on_overage = br#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"allowed","isUsingOverage":true}}"#;
    match from_stream_line(on_overage, now) {
        Some(Finding::Warning(w)) => assert_eq!(w.window.as_deref(), Some("overage")),
        other => panic!("{other:?}"),
    }
    let overage_spent = br#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":"out_of_credits","isUsingOverage":true}}"#;
    let limit = from_stream_line(overage_spent, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.kind, LimitKind::ExtraUsageExhausted);
}

#[test]
fn the_rate_limit_event_tells_extra_usage_and_admin_apart() {
    let now = fixture_now();
    let event = |info: &str| {
        let line = format!(r#"{{"type":"rate_limit_event","rate_limit_info":{info}}}"#);
        from_stream_line(line.as_bytes(), now)
            .and_then(Finding::limit)
            .unwrap()
    };
    let overage = event(r#"{"status":"rejected","resetsAt":1795545000,"rateLimitType":"overage"}"#);
    assert_eq!(overage.kind, LimitKind::ExtraUsageExhausted);
    let credits = event(
        r#"{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":"out_of_credits"}"#,
    );
    assert_eq!(credits.kind, LimitKind::ExtraUsageExhausted);
    for reason in ADMIN_DISABLED_REASONS {
        let admin = event(&format!(
            r#"{{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageDisabledReason":"{reason}"}}"#
        ));
        assert_eq!(admin.kind, LimitKind::AdminDisabled, "{reason}");
        assert_eq!(admin.resets_at, None, "{reason}");
    }
    // Milliseconds and strings are read too; no reset is unknown.
    let millis = event(r#"{"status":"rejected","resetsAt":1795545000000}"#);
    assert_eq!(millis.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    let string = event(r#"{"status":"rejected","resetsAt":"1795545000"}"#);
    assert_eq!(string.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    let none = event(r#"{"status":"rejected","resetsAt":null}"#);
    assert_eq!((none.resets_at, none.note.is_some()), (None, true));
}

#[test]
fn resets_in_the_past_or_too_far_ahead_are_not_believed() {
    let now = fixture_now();
    for (resets_at, says) in [
        (1_795_500_000_i64, "not after now"), // 2026-11-24T06:00Z
        (1_795_521_600, "not after now"),     // exactly now
        (1_796_300_000, "more than 8 days"),  // 2026-12-03
        (4_102_444_800, "more than 8 days"),  // 2100
    ] {
        let line = format!(
            r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{resets_at}}}}}"#
        );
        let limit = from_stream_line(line.as_bytes(), now)
            .and_then(Finding::limit)
            .unwrap();
        assert_eq!(limit.resets_at, None, "{resets_at}");
        assert!(
            limit.note.as_deref().unwrap_or("").contains(says),
            "{resets_at}: {:?}",
            limit.note
        );
    }
    let old = limit_in_text("Claude AI usage limit reached|1753441200", now);
    assert_eq!(old.resets_at, None);
    assert!(old.note.unwrap().contains("not after now"));
}

#[test]
fn synthetic_turns_and_error_results_are_read_and_the_models_words_are_not() {
    let now = fixture_now();
    let synthetic = br#"{"type":"assistant","message":{"id":"a2645b97","model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"You've hit your session limit \u00b7 resets 6:30pm (UTC)"}]},"error":"rate_limit","session_id":"e89ee32d","uuid":"1f7d9873"}"#;
    let limit = from_stream_line(synthetic, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(
        (limit.kind, limit.resets_at),
        (LimitKind::UsageLimit, Some(utc(2026, 11, 24, 18, 30)))
    );
    // A synthetic rate_limit turn with words we do not know: an API limit.
    let unknown = br#"{"type":"assistant","message":{"model":"<synthetic>","content":[]},"error":"rate_limit"}"#;
    let limit = from_stream_line(unknown, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.kind, LimitKind::ApiRateLimit);

    let result = br#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"You've hit your session limit \u00b7 resets 6:30pm (UTC)","stop_reason":"stop_sequence","session_id":"e89ee32d","terminal_reason":"api_error"}"#;
    let limit = from_stream_line(result, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    let bare_429 = br#"{"type":"result","subtype":"error","is_error":true,"api_error_status":"429","result":"rate limited"}"#;
    let limit = from_stream_line(bare_429, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.kind, LimitKind::ApiRateLimit);
    let api_error = br#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your per-minute rate limit"}}"#;
    let limit = from_stream_line(api_error, now)
        .and_then(Finding::limit)
        .unwrap();
    assert_eq!(limit.kind, LimitKind::ApiRateLimit);

    for line in [
        br#"{"type":"assistant","message":{"model":"claude-sonnet-4-6","content":[{"type":"text","text":"You've hit your limit \u00b7 resets 1pm (Europe/Lisbon)"}]}}"#.as_slice(),
        br#"{"type":"user","message":{"content":[{"type":"tool_result","content":"Claude AI usage limit reached|1795532400"}]}}"#,
        br#"{"type":"result","subtype":"success","is_error":false,"result":"You've hit your limit \u00b7 resets 1pm (Europe/Lisbon)"}"#,
        br#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":581.4,"error_status":429,"error":"rate_limit","session_id":"s"}"#,
        b"You've hit your limit \xc2\xb7 resets 1pm (Europe/Lisbon)",
        b"{not json",
        b"[1,2,3]",
    ] {
        assert_eq!(from_stream_line(line, now), None, "{}", String::from_utf8_lossy(line));
    }
}

// ---- whole outputs ----

#[test]
fn every_fixture_reads_as_its_readme_says() {
    let now = fixture_now();
    use LimitKind::*;
    let cases: &[(&str, Option<Reading>)] = &[
        (
            "hit-your-limit.txt",
            Some((UsageLimit, None, Some(utc(2026, 11, 24, 13, 0)))),
        ),
        (
            "hit-your-limit.json",
            Some((UsageLimit, None, Some(utc(2026, 11, 24, 13, 0)))),
        ),
        (
            "session-limit.stream.jsonl",
            Some((
                UsageLimit,
                Some("five_hour"),
                Some(utc(2026, 11, 24, 18, 30)),
            )),
        ),
        (
            "weekly-limit-dated.txt",
            Some((
                UsageLimit,
                Some("seven_day"),
                Some(utc(2026, 11, 27, 14, 0)),
            )),
        ),
        (
            "extra-usage.txt",
            Some((ExtraUsageExhausted, None, Some(utc(2026, 11, 25, 1, 0)))),
        ),
        (
            "usage-limit-epoch.json",
            Some((UsageLimit, None, Some(utc(2026, 11, 24, 15, 0)))),
        ),
        ("api-rate-limit.txt", Some((ApiRateLimit, None, None))),
        ("api-429.json", Some((ApiRateLimit, None, None))),
        ("admin-disabled.txt", Some((AdminDisabled, None, None))),
        (
            "admin-disabled.stream.jsonl",
            Some((AdminDisabled, None, None)),
        ),
        ("warning.stream.jsonl", None),
        ("self-mention.stream.jsonl", None),
    ];
    for (name, expected) in cases {
        let found =
            scan_output(&fixture(name), b"", now).map(|l| (l.kind, l.window.clone(), l.resets_at));
        let expected = expected.map(|(k, w, r)| (k, w.map(str::to_owned), r));
        assert_eq!(found, expected, "{name}");
    }
    // The stderr form, on stderr.
    let limit = scan_output(b"", &fixture("api-429.stderr.txt"), now).unwrap();
    assert_eq!(limit.kind, ApiRateLimit);
}

#[test]
fn the_streaming_scanner_sees_the_same_in_any_chunking() {
    let now = fixture_now();
    let output = fixture("session-limit.stream.jsonl");
    let whole = scan_output(&output, b"", now);
    for size in [1, 2, 7, 64, 4096] {
        let mut scanner = LineScanner::new();
        let mut warnings = 0;
        let mut limits = 0;
        for chunk in output.chunks(size) {
            for finding in scanner.push(chunk, now) {
                match finding {
                    Finding::Warning(_) => warnings += 1,
                    Finding::Limit(_) => limits += 1,
                }
            }
        }
        assert_eq!(scanner.finish(now), None);
        // The warning, the event, the synthetic turn, the result.
        assert_eq!((warnings, limits), (1, 3), "chunks of {size}");
        assert_eq!(scanner.limit(), whole.as_ref(), "chunks of {size}");
    }
    // A last line without a newline is read by finish.
    let mut scanner = LineScanner::new();
    assert!(
        scanner
            .push(b"API Error: Rate limit reached", now)
            .is_empty()
    );
    assert!(matches!(scanner.finish(now), Some(Finding::Limit(_))));
    assert_eq!(
        scanner.into_limit().map(|l| l.kind),
        Some(LimitKind::ApiRateLimit)
    );
}

#[test]
fn the_most_specific_limit_wins() {
    let now = fixture_now();
    // The event's exact epoch and the text's kind combine.
    let out = concat!(
        r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795545000,"rateLimitType":"five_hour","overageStatus":"rejected","isUsingOverage":false}}"#,
        "\n",
        "You're out of extra usage. Add more at claude.ai/settings/usage and keep going.\n",
    );
    let limit = scan_output(out.as_bytes(), b"", now).unwrap();
    assert_eq!(limit.kind, LimitKind::ExtraUsageExhausted);
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    assert_eq!(limit.window.as_deref(), Some("five_hour"));
    assert_eq!(limit.note, None);

    // A known reset beats an unknown one, in either order.
    let known = "You've hit your limit · resets 1pm (Europe/Lisbon)";
    let unknown = "API Error: Rate limit reached";
    for (first, second) in [(known, unknown), (unknown, known)] {
        let limit = scan_output(format!("{first}\n").as_bytes(), second.as_bytes(), now).unwrap();
        assert_eq!(limit.kind, LimitKind::UsageLimit);
        assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 13, 0)));
    }
    // An epoch beats a wall-clock time.
    let both = "You've hit your limit · resets 1pm (Europe/Lisbon)\nClaude AI usage limit reached|1795532400\n";
    let limit = scan_output(both.as_bytes(), b"", now).unwrap();
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 15, 0)));
    // AdminDisabled beats all, wherever it is.
    let admin =
        format!("{known}\nYour usage allocation has been disabled by your admin\n{known}\n");
    let limit = scan_output(admin.as_bytes(), b"", now).unwrap();
    assert_eq!(
        (limit.kind, limit.resets_at),
        (LimitKind::AdminDisabled, None)
    );
    let limit = scan_output(known.as_bytes(), &fixture("admin-disabled.txt"), now).unwrap();
    assert_eq!(limit.kind, LimitKind::AdminDisabled);
    // Nothing at all.
    assert_eq!(scan_output(b"", b"", now), None);
    assert_eq!(scan_output(b"all done\n", b"warning: x\n", now), None);
}

#[test]
fn a_pretty_printed_or_verbose_json_document_is_read_too() {
    let now = fixture_now();
    let pretty = r#"{
  "type": "result",
  "subtype": "success",
  "is_error": true,
  "result": "You've hit your limit · resets 1pm (Europe/Lisbon)"
}"#;
    let limit = scan_output(pretty.as_bytes(), b"", now).unwrap();
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 13, 0)));
    let verbose = r#"[
  {"type": "system", "subtype": "init"},
  {"type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "resetsAt": 1795545000, "rateLimitType": "seven_day"}},
  {"type": "result", "is_error": true, "result": "You've hit your weekly limit"}
]"#;
    let limit = scan_output(verbose.as_bytes(), b"", now).unwrap();
    assert_eq!(limit.window.as_deref(), Some("seven_day"));
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 18, 30)));
    // The same array printed compactly, on one line, as it streams.
    let compact: String = verbose.lines().map(str::trim).collect();
    let mut scanner = LineScanner::new();
    scanner.push(compact.as_bytes(), now);
    assert!(matches!(scanner.finish(now), Some(Finding::Limit(_))));
    assert_eq!(scanner.into_limit(), Some(limit));
}

#[test]
fn the_first_versions_wordings_are_read() {
    let now = fixture_now();
    for (line, window) in [
        ("5 hour limit reached", Some("five_hour")),
        (
            "Weekly limit reached · resets Nov 27, 9am (America/New_York)",
            Some("seven_day"),
        ),
        (
            "Opus weekly limit reached ∙ resets Mon 9am (UTC)",
            Some("seven_day_opus"),
        ),
        ("Session limit reached", Some("five_hour")),
    ] {
        let limit = limit_in_text(line, now);
        assert_eq!(
            (limit.kind, limit.window.as_deref()),
            (LimitKind::UsageLimit, window),
            "{line}"
        );
    }
    let weekly = limit_in_text(
        "Weekly limit reached · resets Nov 27, 9am (America/New_York)",
        now,
    );
    assert_eq!(weekly.resets_at, Some(utc(2026, 11, 27, 14, 0)));
    assert_eq!(from_text("Context limit reached", now), None);
}

#[test]
fn extreme_clocks_do_not_panic() {
    let lines = [
        "You've hit your limit · resets 1pm (Europe/Lisbon)",
        "You've hit your limit · resets Dec 31, 11:59pm (Pacific/Kiritimati)",
        "You've hit your limit · resets Jan 1, 12am (Etc/GMT+12)",
        "You've hit your limit · resets Sun 2:30am (America/New_York)",
        "Claude AI usage limit reached|99999999999999",
    ];
    for now in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
        for line in lines {
            if let Some(Finding::Limit(limit)) = from_text(line, now) {
                let _ = hold_until(&limit, now, u64::MAX, DEFAULT_JITTER);
            }
        }
    }
}

// ---- reset times ----

#[test]
fn a_time_alone_is_the_next_such_time_in_the_zone() {
    // 2026-11-24 12:00Z is 12:00 in Lisbon, 04:00 in Los Angeles.
    let now = fixture_now();
    let cases = [
        ("1pm (Europe/Lisbon)", utc(2026, 11, 24, 13, 0)),
        ("11am (Europe/Lisbon)", utc(2026, 11, 25, 11, 0)), // passed an hour ago: tomorrow
        ("1:30pm (Europe/Lisbon)", utc(2026, 11, 24, 13, 30)),
        ("13:00 (Europe/Lisbon)", utc(2026, 11, 24, 13, 0)),
        ("9:30 AM (Europe/Lisbon)", utc(2026, 11, 25, 9, 30)),
        ("9:30\u{202f}PM (Europe/Lisbon)", utc(2026, 11, 24, 21, 30)),
        ("12am (America/Los_Angeles)", utc(2026, 11, 25, 8, 0)),
        ("3am (America/Los_Angeles)", utc(2026, 11, 25, 11, 0)),
        ("5am (America/Los_Angeles)", utc(2026, 11, 24, 13, 0)),
        // 21:00 in Tokyo: 7:30pm passed 90 minutes ago, so tomorrow.
        ("7:30pm (Asia/Tokyo)", utc(2026, 11, 25, 10, 30)),
    ];
    for (text, expected) in cases {
        assert_eq!(reset_of(text, now), Some(expected), "{text}");
    }
}

#[test]
fn a_time_that_just_passed_is_past_not_tomorrow() {
    let now = utc(2026, 11, 24, 13, 0) + TimeDelta::seconds(20);
    let limit = limit_in_text("You've hit your limit · resets 1pm (Europe/Lisbon)", now);
    assert_eq!(limit.resets_at, None);
    assert!(limit.note.unwrap().contains("not after now"));
    // Exactly now is not after now.
    assert_eq!(
        reset_of("1pm (Europe/Lisbon)", utc(2026, 11, 24, 13, 0)),
        None
    );
    // Over an hour ago: tomorrow.
    let later = utc(2026, 11, 24, 14, 1);
    assert_eq!(
        reset_of("1pm (Europe/Lisbon)", later),
        Some(utc(2026, 11, 25, 13, 0))
    );
}

#[test]
fn resets_across_midnight_and_the_new_year() {
    // 23:30 in Lisbon: 12:30am is tomorrow, half an hour ahead.
    let late = utc(2026, 12, 31, 23, 30);
    assert_eq!(
        reset_of("12:30am (Europe/Lisbon)", late),
        Some(utc(2027, 1, 1, 0, 30))
    );
    assert_eq!(
        reset_of("12am (Europe/Lisbon)", late),
        Some(utc(2027, 1, 1, 0, 0))
    );
    // A date just after new year is next year's.
    assert_eq!(
        reset_of("Jan 2, 9am (Europe/Lisbon)", late),
        Some(utc(2027, 1, 2, 9, 0))
    );
    // Midnight UTC is already tomorrow in Tokyo.
    let tokyo_morning = utc(2026, 11, 24, 23, 0); // 08:00 on the 25th in Tokyo
    assert_eq!(
        reset_of("Nov 25, 1pm (Asia/Tokyo)", tokyo_morning),
        Some(utc(2026, 11, 25, 4, 0))
    );
    // A weekday that is today but whose time passed is next week's:
    // 2026-11-24 is a Tuesday.
    assert_eq!(
        reset_of("Tue 9am (UTC)", fixture_now()),
        Some(utc(2026, 12, 1, 9, 0))
    );
    assert_eq!(
        reset_of("Tue 3pm (UTC)", fixture_now()),
        Some(utc(2026, 11, 24, 15, 0))
    );
}

#[test]
fn resets_across_dst_changes() {
    // Los Angeles leaves DST on 2026-11-01 at 2am PDT. At 1am PDT
    // (08:00Z) "3pm" is 3pm PST, 23:00Z, not 22:00Z.
    let before_fall_back = utc(2026, 11, 1, 8, 0);
    assert_eq!(
        reset_of("3pm (America/Los_Angeles)", before_fall_back),
        Some(utc(2026, 11, 1, 23, 0))
    );
    // 1:30am occurs twice that night: the first (PDT) is taken.
    let before = utc(2026, 11, 1, 7, 0); // 00:00 PDT
    assert_eq!(
        reset_of("1:30am (America/Los_Angeles)", before),
        Some(utc(2026, 11, 1, 8, 30))
    );
    // Lisbon enters DST on 2027-03-28 at 1am: 1:30am does not exist
    // and is read an hour later (2:30 WEST = 01:30Z).
    let spring = utc(2027, 3, 28, 0, 30);
    assert_eq!(
        reset_of("1:30am (Europe/Lisbon)", spring),
        Some(utc(2027, 3, 28, 1, 30))
    );
    // And 3pm that day is WEST: 14:00Z.
    assert_eq!(
        reset_of("3pm (Europe/Lisbon)", spring),
        Some(utc(2027, 3, 28, 14, 0))
    );
    // A dated reset over the change: Nov 2 9am PST is 17:00Z.
    let october = utc(2026, 10, 30, 12, 0);
    assert_eq!(
        reset_of("Nov 2, 9am (America/Los_Angeles)", october),
        Some(utc(2026, 11, 2, 17, 0))
    );
}

#[test]
fn unreadable_clocks_are_unknown() {
    let now = fixture_now();
    for clock in [
        "13pm",
        "0am",
        "25:00",
        "12:60pm",
        "1:5pm",
        "13",
        "pm",
        "Feb 30, 1pm",
        "Foo 3, 1pm",
        "Nov 1pm",
        "Mon Tue 1pm",
        "1pm 2pm",
        "tomorrow",
        "in 2 hours",
        "Nov 0, 1pm",
    ] {
        let text = format!("You've hit your limit · resets {clock} (UTC)");
        let limit = limit_in_text(&text, now);
        assert_eq!(limit.resets_at, None, "{clock}");
        assert!(limit.note.is_some(), "{clock}");
    }
}

// ---- holding ----

#[test]
fn hold_until_is_the_reset_plus_a_deterministic_jitter() {
    let now = fixture_now();
    let limit = limit_in_text("You've hit your limit · resets 1pm (Europe/Lisbon)", now);
    let reset = limit.resets_at.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..500u64 {
        let until = hold_until(&limit, now, seed, DEFAULT_JITTER).unwrap();
        let jitter = (until - reset).num_seconds();
        assert!((30..=120).contains(&jitter), "{seed}: {jitter}");
        assert_eq!(
            hold_until(&limit, now, seed, DEFAULT_JITTER),
            Some(until),
            "deterministic"
        );
        seen.insert(jitter);
    }
    assert!(seen.len() > 40, "the jitter spreads: {}", seen.len());
    // A reset already past (the daemon decided late) counts from now.
    let late = reset + TimeDelta::minutes(5);
    let until = hold_until(&limit, late, 7, DEFAULT_JITTER).unwrap();
    assert!(until > late && until - late <= TimeDelta::seconds(120));
    // No known reset, or an admin's: no hold time.
    let unknown = limit_in_text("API Error: Rate limit reached", now);
    assert_eq!(hold_until(&unknown, now, 1, DEFAULT_JITTER), None);
    let admin = Limit {
        kind: LimitKind::AdminDisabled,
        resets_at: Some(reset),
        ..limit
    };
    assert_eq!(hold_until(&admin, now, 1, DEFAULT_JITTER), None);
}

#[test]
fn a_limit_serialises_as_the_journal_writes_it() {
    let limit = limit_in_text(
        "You've hit your session limit · resets 6:30pm (UTC)",
        fixture_now(),
    );
    let json = serde_json::to_value(&limit).unwrap();
    assert_eq!(json["kind"], "usage_limit");
    assert_eq!(json["resets_at"], "2026-11-24T18:30:00Z");
    assert_eq!(json["window"], "five_hour");
    let back: Limit = serde_json::from_value(json).unwrap();
    assert_eq!(back, limit);
}

// ---- hostile input ----

#[test]
fn evidence_is_truncated_on_a_character_boundary() {
    let long = format!(
        "You've hit your limit · resets 1pm (Europe/Lisbon) {}",
        "é".repeat(1000)
    );
    let limit = limit_in_text(&long, fixture_now());
    assert!(limit.evidence.chars().count() <= EVIDENCE_CHARS + 1);
    assert!(limit.evidence.ends_with('…'));
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 13, 0)));
}

#[test]
fn very_long_input_is_bounded_work() {
    let now = fixture_now();
    // One 8 MiB line, then a limit: the line is cut, the limit found.
    let mut output = vec![b'x'; 8 * 1024 * 1024];
    output.extend_from_slice(b"\nYou've hit your limit \xc2\xb7 resets 1pm (Europe/Lisbon)\n");
    let started = std::time::Instant::now();
    let limit = scan_output(&output, b"", now).unwrap();
    assert_eq!(limit.resets_at, Some(utc(2026, 11, 24, 13, 0)));
    let mut scanner = LineScanner::new();
    for chunk in output.chunks(65536) {
        scanner.push(chunk, now);
    }
    assert_eq!(scanner.limit().map(|l| l.kind), Some(LimitKind::UsageLimit));
    // A huge JSON line is not parsed, and a limit at the start of a
    // huge text line is still read.
    let mut huge_json = br#"{"type":"result","is_error":true,"result":""#.to_vec();
    huge_json.extend(std::iter::repeat_n(b'a', 2 * MAX_JSON_LINE_BYTES));
    huge_json.extend_from_slice(b"\"}\n");
    assert_eq!(scan_output(&huge_json, b"", now), None);
    let mut huge_text = b"API Error: Rate limit reached ".to_vec();
    huge_text.extend(std::iter::repeat_n(b'z', 4 * MAX_JSON_LINE_BYTES));
    let mut scanner = LineScanner::new();
    scanner.push(&huge_text, now);
    assert!(matches!(scanner.finish(now), Some(Finding::Limit(_))));
    // Many short lines: linear.
    let many = "You've used 10% of your session limit\n".repeat(100_000);
    assert_eq!(scan_output(many.as_bytes(), b"", now), None);
    // Not a speed target, a guard against a quadratic scan (seconds).
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// A small deterministic generator (no dependency for property tests).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn no_input_panics() {
    let now = fixture_now();
    let pieces: &[&[u8]] = &[
        b"You've hit your ",
        b"limit",
        b" \xc2\xb7 resets ",
        b"1pm",
        b"12:",
        b"Nov 31, ",
        b"(Europe/Lisbon)",
        b"(",
        b")",
        b"Claude AI usage limit reached|",
        b"99999999999999999999",
        b"-1",
        b"API Error: ",
        b"429 ",
        b"rate_limit_error",
        b"{\"type\":\"rate_limit_event\",\"rate_limit_info\":{\"status\":\"rejected\",\"resetsAt\":",
        b"1e308",
        b"}}",
        b"{\"type\":\"result\",\"is_error\":true,\"result\":\"",
        b"\"",
        b"\n",
        b"\xff\xfe",
        b"\xe2\x80",
        "é’ ⎿ ∙".as_bytes(),
        b"You're out of extra usage",
        b"Your usage allocation has been disabled by your admin",
        b"You've used 1",
        b"% of your ",
        b"Approaching ",
        b"\t \r",
    ];
    let mut rng = Rng(42);
    let nows = [
        now,
        DateTime::<Utc>::MIN_UTC,
        DateTime::<Utc>::MAX_UTC,
        DateTime::from_timestamp(0, 0).unwrap(),
    ];
    for round in 0..20_000 {
        let mut input = Vec::new();
        for _ in 0..rng.below(12) {
            input.extend_from_slice(pieces[rng.below(pieces.len())]);
        }
        let now = nows[round % nows.len()];
        let text = String::from_utf8_lossy(&input);
        let _ = from_text(&text, now);
        let _ = from_stream_line(&input, now);
        if let Some(limit) = scan_output(&input, &input, now) {
            let _ = hold_until(&limit, now, rng.next(), DEFAULT_JITTER);
            assert!(limit.evidence.chars().count() <= EVIDENCE_CHARS + 1);
            if let Some(at) = limit.resets_at {
                assert!(at > now && at - now <= MAX_RESET_AHEAD, "{text:?}");
            }
        }
        let mut scanner = LineScanner::new();
        for chunk in input.chunks(rng.below(7) + 1) {
            let _ = scanner.push(chunk, now);
        }
        let _ = scanner.finish(now);
    }
    // Random bytes, too.
    for _ in 0..2_000 {
        let input: Vec<u8> = (0..rng.below(300)).map(|_| rng.next() as u8).collect();
        let _ = scan_output(&input, &input, now);
        let _ = from_text(&String::from_utf8_lossy(&input), now);
    }
}
