//! The tests of `protocol::signals`: seed 000's examples and codes, the
//! streaming scanner under every split and chunking, its limit and non-UTF-8
//! input, and the signals.jsonl record.

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
    assert!(message("<axiom>PROGRESS:150</axiom>").starts_with("PROGRESS payload must be 0-100"));
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
