//! Typed boundaries through the real binary: `session end` and `session
//! fail` parse their arguments into typed fields leniently — a bad optional
//! argument is a warning on stderr and the hook exits 0, the session ended
//! (a script under `set -e` goes on to its next line).

use crate::support::Env;

fn begin(env: &Env) -> String {
    env.ok(&["session", "begin", "rio"]).trim().to_string()
}

fn errors_named(env: &Env) -> Vec<String> {
    env.json("rio", "session.json")["errors"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["argument"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn end_with_a_bad_number_warns_exits_0_and_ends_the_session() {
    let env = Env::standard();
    let id = begin(&env);
    let out = env.run(&[
        "session",
        "end",
        "rio",
        "--tokens-used",
        "abc",
        "--summary",
        "done",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a warning, not a failed hook: {err}"
    );
    assert!(
        err.contains("--tokens-used") && err.contains("abc"),
        "{err}"
    );
    let s = env.json("rio", "session.json");
    assert_eq!(s["session_id"], id.as_str());
    assert_eq!(s["status"], "completed");
    assert_eq!(
        env.json("rio", "report.json")["summary"],
        "done",
        "everything else recorded"
    );
    assert!(s["tokens_used"].is_null());
    assert_eq!(errors_named(&env), ["--tokens-used"]);
    assert_eq!(env.events("rio", "session_end").len(), 1);
    assert_eq!(env.json("rio", "report.json")["status"], "idle");
}

#[test]
fn end_with_an_unknown_outcome_word_warns_exits_0_and_records_completed() {
    let env = Env::standard();
    begin(&env);
    let out = env.run(&["session", "end", "rio", "--outcome", "finished"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--outcome") && err.contains("finished"),
        "{err}"
    );
    let ends = env.events("rio", "session_end");
    assert_eq!(ends.len(), 1);
    assert_eq!(
        ends[0]["outcome"], "completed",
        "the journal's word is typed"
    );
    assert_eq!(env.json("rio", "session.json")["status"], "completed");
}

#[test]
fn fail_with_an_unknown_outcome_word_warns_exits_0_and_records_an_error() {
    let env = Env::standard();
    begin(&env);
    let out = env.run(&[
        "session",
        "fail",
        "rio",
        "--outcome",
        "crashed",
        "--reason",
        "it broke",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--outcome") && err.contains("crashed"),
        "{err}"
    );
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "error");
    assert_eq!(env.events("rio", "error").len(), 1);
}

#[test]
fn a_bad_argument_to_begin_still_exits_65() {
    let env = Env::standard();
    env.fails(
        &["session", "begin", "rio", "--sources-expected", "ten"],
        65,
    );
    assert_eq!(env.json("rio", "session.json")["status"], "running");
}

#[test]
fn an_unknown_flag_to_end_or_fail_is_a_warning_and_the_session_ends() {
    let env = Env::standard();
    let id = begin(&env);
    // A newer script's flag, with a value, and one with `=`.
    let out = env.run(&[
        "session",
        "end",
        "rio",
        "--summary",
        "done",
        "--pr-url",
        "https://example.invalid/pull/3",
        "--mood=good",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning") && err.contains("--pr-url") && err.contains("--mood=good"),
        "{err}"
    );
    let s = env.json("rio", "session.json");
    assert_eq!(
        (s["session_id"].as_str(), s["status"].as_str()),
        (Some(id.as_str()), Some("completed"))
    );
    assert_eq!(env.json("rio", "report.json")["summary"], "done");

    begin(&env);
    let out = env.run(&[
        "session",
        "fail",
        "rio",
        "--outcome",
        "error",
        "--reason",
        "boom",
        "--exit-signal",
        "9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(env.json("rio", "session.json")["status"], "error");
    // Other commands keep clap's usage error.
    env.fails(&["session", "begin", "rio", "--frobnicate"], 2);
}
