//! report.json `current_task` is the task being worked on (issue 22, seed
//! 001): set when a task becomes active (`task set --status active`, or a
//! session claiming a task message), null only when no task is active.

use std::time::Duration;

use crate::support::*;

#[test]
fn current_task_follows_the_active_task() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "cat >/dev/null; echo '<axiom>COMPLETE</axiom>'");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let report = || env.json("rio", "report.json");
    assert!(report()["current_task"].is_null());

    let id = env
        .ok(&["task", "add", "rio", "--description", "map the AMM forks"])
        .trim()
        .to_string();
    assert!(report()["current_task"].is_null(), "pending is not current");
    env.ok(&["task", "set", "rio", &id, "--status", "active"]);
    assert_eq!(
        report()["current_task"],
        "map the AMM forks",
        "{}",
        report()
    );
    assert_eq!(report()["current_task_id"], id.as_str());
    env.ok(&["task", "set", "rio", &id, "--status", "completed"]);
    assert!(report()["current_task"].is_null(), "{}", report());
    assert!(report()["current_task_id"].is_null(), "{}", report());

    // A task message a session claims is the task it works on.
    env.send(
        "marcus",
        "rio",
        &[
            "--type",
            "task",
            "--priority",
            "high",
            "--body",
            "the launchpad data",
        ],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(20), "rio's session ended", || {
        env.events("rio", "session_end").len() == 1
            && env.json("rio", "session.json")["status"] == "completed"
    });
    let r = report();
    assert_eq!(r["current_task"], "a subject", "{r:#}");
    let tasks = env.json("rio", "tasks.json");
    let task = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["description"] == "a subject")
        .unwrap_or_else(|| panic!("{tasks:#}"));
    assert_eq!(task["status"], "active", "{tasks:#}");
    assert_eq!(r["current_task_id"], task["id"], "{r:#}");
    assert!(
        env.events("rio", "task_updated")
            .iter()
            .any(|e| e["task_id"] == task["id"] && e["status"] == "active"),
        "the journal says it became active"
    );
}

/// tasks.json stays the size of the agent's current work over years: a
/// task finished more than 90 days ago leaves it at the next change (its
/// history stays in the journal), and its id is never handed out again.
#[test]
fn a_task_finished_long_ago_leaves_tasks_json_and_its_id_is_not_reused() {
    let env = Env::standard();
    env.ok(&["bootstrap"]);
    let first = env
        .ok(&["task", "add", "rio", "--description", "an old task"])
        .trim()
        .to_string();
    env.ok(&["task", "set", "rio", &first, "--status", "completed"]);
    // As if it were finished in 2020.
    let mut tasks = env.json("rio", "tasks.json");
    tasks["tasks"][0]["completed_at"] = serde_json::json!("2020-01-01T00:00:00Z");
    env.write("rio", "tasks.json", &tasks.to_string());

    let next = env
        .ok(&["task", "add", "rio", "--description", "a new task"])
        .trim()
        .to_string();
    assert_ne!(next, first, "an id handed out again");
    assert_eq!(next, "task-002");
    let tasks = env.json("rio", "tasks.json");
    let ids: Vec<&str> = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["task-002"], "{tasks:#}");
    assert_eq!(tasks["last_task_number"], 2, "{tasks:#}");
    // Its history is in the journal.
    let updated: Vec<_> = env
        .events("rio", "task_updated")
        .into_iter()
        .filter(|e| e["task_id"] == first.as_str())
        .collect();
    assert_eq!(updated.len(), 1, "{updated:#?}");
    env.ok(&["check"]);
    // tasks.json is input: a number at the top of u64 is no crash.
    let mut tasks = env.json("rio", "tasks.json");
    tasks["last_task_number"] = serde_json::json!(u64::MAX);
    env.write("rio", "tasks.json", &tasks.to_string());
    env.ok(&["task", "add", "rio", "--description", "after a huge number"]);
}
