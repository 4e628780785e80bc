//! Two messages with one id (seed 002, "duplicate id": generate a new id):
//! both are delivered, the second under a new id with the one it came with
//! in `original_id`; a message whose id names one already processed too.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

#[test]
fn a_second_message_with_a_taken_id_is_delivered_under_a_new_one() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "cat >/dev/null; echo '<axiom>COMPLETE</axiom>'");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let inbox = env.root.join("rio/inbox");
    let write = |file: &str, subject: &str| {
        std::fs::write(
            inbox.join(file),
            format!(r#"{{"id":"q1","from":"marcus","subject":"{subject}"}}"#),
        )
        .unwrap();
    };
    write("first.json", "the first");
    write("second.json", "the second");
    let d = env.daemon();
    let ended = |n: usize| {
        d.wait_until(
            Duration::from_secs(20),
            &format!("session {n} ended"),
            || {
                env.events("rio", "session_end").len() == n
                    && env.json("rio", "session.json")["status"] == "completed"
            },
        )
    };
    env.ok(&["wake", "rio"]);
    ended(1);
    let session = env.json("rio", "session.json");
    let ids: Vec<&str> = session["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(ids.len(), 2, "both delivered: {session:#}");
    assert!(ids.contains(&"q1"), "{ids:?}");
    let renamed = ids.iter().find(|i| **i != "q1").unwrap().to_string();
    // The processed copy of the renamed one carries both ids.
    let processed = env.root.join("rio/inbox/processed");
    let copies: Vec<Value> = std::fs::read_dir(&processed)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            serde_json::from_slice(&std::fs::read(p).ok()?).ok()
        })
        .collect();
    let copy = copies
        .iter()
        .find(|c| c["id"] == renamed.as_str())
        .unwrap_or_else(|| panic!("{renamed} in processed/: {copies:#?}"));
    assert_eq!(copy["original_id"], "q1", "{copy:#}");
    let end = env.events("rio", "session_end").pop().unwrap();
    assert_eq!(
        end["messages_processed"].as_array().map(Vec::len),
        Some(2),
        "{end:#}"
    );

    // Later, a message that reuses the id of one processed under that name.
    std::fs::write(
        inbox.join("late.json"),
        r#"{"id":"first","from":"marcus","subject":"late"}"#,
    )
    .unwrap();
    std::fs::write(
        inbox.join("q2.json"),
        r#"{"from":"marcus","subject":"no id: its file's stem"}"#,
    )
    .unwrap();
    // `first.json` was processed under its file name: its id is taken.
    assert!(processed.join("first.json").exists());
    env.ok(&["wake", "rio"]);
    ended(2);
    let session = env.json("rio", "session.json");
    let ids: Vec<&str> = session["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(ids.contains(&"q2"), "{ids:?}");
    assert!(
        !ids.contains(&"first"),
        "the taken id is not reused: {ids:?}"
    );
    assert_eq!(ids.len(), 2, "{ids:?}");
}
