//! `--json` output carries no character that steers a terminal or a
//! reader's eye (issue 20): text stored with a C1 CSI (U+009B), DEL, a line
//! separator and a bidi override comes out of `events`, `inbox`, `inbox
//! show`, `status` and `task list` escaped as `\uXXXX`, and parses back to
//! exactly the stored text. The human listings escape the same characters.

use serde_json::Value;

use crate::support::Env;

/// A CSI that clears the screen, DEL, a right-to-left override and a line
/// separator: what an agent or a sender could put in a subject or reason.
const HOSTILE: &str = "evil\u{9b}2J\u{7f}\u{202e}gpj.exe\u{2028}end";

fn is_unsafe(c: char) -> bool {
    matches!(c, '\u{7f}'..='\u{9f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether `v` holds `text` as a string anywhere.
fn holds(v: &Value, text: &str) -> bool {
    match v {
        Value::String(s) => s == text,
        Value::Array(a) => a.iter().any(|x| holds(x, text)),
        Value::Object(o) => o.values().any(|x| holds(x, text)),
        _ => false,
    }
}

/// Run `args`, check the output has no unsafe character and is JSON (one
/// document, or one per line with `lines`) holding HOSTILE.
fn check(env: &Env, args: &[&str], lines: bool) {
    let out = env.ok(args);
    let bad: Vec<String> = out
        .chars()
        .filter(|c| is_unsafe(*c))
        .map(|c| format!("U+{:04X}", c as u32))
        .collect();
    assert!(
        bad.is_empty(),
        "`agent-state {}` printed raw {bad:?}:\n{out:?}",
        args.join(" ")
    );
    assert!(out.contains("\\u009b"), "{args:?}: {out}");
    let docs: Vec<Value> = if lines {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: {e}: {l}")))
            .collect()
    } else {
        vec![serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))]
    };
    assert!(
        docs.iter().any(|d| holds(d, HOSTILE)),
        "`agent-state {}` does not give back the stored text: {out}",
        args.join(" ")
    );
}

#[test]
fn json_outputs_escape_c1_del_separators_and_bidi_overrides() {
    let env = Env::standard();
    let sent = env.ok(&["send", "--from", "leo", "--to", "rio", "--subject", HOSTILE]);
    let id = sent.split_whitespace().nth(1).expect("sent ID").to_string();
    env.ok(&["task", "add", "rio", "--description", HOSTILE]);
    // A session that fails with the text as its reason: in report.json
    // (status) and the journal (events).
    env.ok(&["session", "begin", "theseus"]);
    env.ok(&[
        "session",
        "fail",
        "theseus",
        "--outcome",
        "error",
        "--reason",
        HOSTILE,
    ]);

    check(&env, &["events", "--json"], true);
    check(&env, &["inbox", "rio", "--json"], false);
    check(&env, &["inbox", "show", "rio", &id, "--json"], false);
    check(&env, &["status", "--json"], false);
    check(&env, &["task", "list", "rio", "--json"], false);

    // The human listings show them escaped too.
    for args in [&["inbox", "rio"][..], &["task", "list", "rio"], &["events"]] {
        let out = env.ok(args);
        assert!(
            !out.chars().any(is_unsafe) && out.contains(r"\u{202e}"),
            "`agent-state {}`: {out:?}",
            args.join(" ")
        );
    }
}
