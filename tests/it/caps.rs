//! Texts over their documented caps are cut with a marker, never refused:
//! the hook still records the session.

use crate::support::Env;

fn marker(over: usize, limit: usize) -> String {
    format!("… [cut: {over} bytes over the limit of {limit}]")
}

#[test]
fn oversized_hook_and_task_texts_are_cut_with_a_marker_and_recorded() {
    let env = Env::standard();
    let summary = "s".repeat(100 * 1024);
    let handoff = "h".repeat(64 * 1024 + 10);
    let session = env.ok(&["session", "begin", "rio"]);
    env.ok(&[
        "session",
        "end",
        "rio",
        "--session",
        session.trim(),
        "--summary",
        &summary,
        "--handoff-notes",
        &handoff,
    ]);
    let report = env.json("rio", "report.json");
    let kept = report["summary"].as_str().unwrap();
    assert_eq!(
        kept,
        format!("{}{}", &summary[..4096], marker(100 * 1024 - 4096, 4096))
    );
    let notes = env.json("rio", "session.json")["handoff_notes"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        notes.ends_with(&marker(10, 64 * 1024)),
        "{}",
        &notes[notes.len() - 80..]
    );
    let end = &env.events("rio", "session_end")[0];
    assert_eq!(end["summary"], kept, "the journal keeps the cut text too");

    // A failure reason, from a script's trap.
    let reason = "r".repeat(20 * 1024);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&[
        "session",
        "fail",
        "rio",
        "--outcome",
        "error",
        "--reason",
        &reason,
    ]);
    let session = env.json("rio", "session.json");
    let text = serde_json::to_string(&session).unwrap();
    assert!(
        text.contains(&marker(4 * 1024, 16 * 1024)),
        "{}",
        &text[..200]
    );
    assert!(!text.contains(&reason), "the whole reason is not stored");

    // Tasks: description, context, outcome.
    let description = "d".repeat(5000);
    let context = "c".repeat(70 * 1024);
    env.ok(&[
        "task",
        "add",
        "rio",
        "--description",
        &description,
        "--context",
        &context,
    ]);
    let outcome = "o".repeat(4097);
    env.ok(&[
        "task",
        "set",
        "rio",
        "task-001",
        "--status",
        "completed",
        "--outcome",
        &outcome,
    ]);
    let task = &env.json("rio", "tasks.json")["tasks"][0];
    assert!(
        task["description"]
            .as_str()
            .unwrap()
            .ends_with(&marker(904, 4096))
    );
    assert!(
        task["context"]
            .as_str()
            .unwrap()
            .ends_with(&marker(6 * 1024, 64 * 1024))
    );
    assert!(
        task["outcome"]
            .as_str()
            .unwrap()
            .ends_with(&marker(1, 4096))
    );
}
