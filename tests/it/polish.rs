//! CLI polish a first-time user asks for (issue 14): `events --tail` and
//! `--since`, `errors` naming its log, `wake --wait` failing when the
//! session it waited for failed at once.

use crate::support::*;
use std::time::Duration;

#[test]
fn events_tail_and_since_show_the_last_ones_and_the_recent_ones() {
    let env = Env::standard();
    env.ok(&["bootstrap"]);
    for n in 0..4 {
        env.send("marcus", "rio", &["--body", &format!("note {n}")]);
    }
    let all = env.ok(&["events", "--json", "--agent", "marcus"]);
    let count = all.lines().count();
    assert!(count >= 4, "{all}");
    let tail = env.ok(&["events", "--json", "--agent", "marcus", "--tail", "2"]);
    let last_two: Vec<&str> = all.lines().skip(count - 2).collect();
    assert_eq!(tail.lines().collect::<Vec<_>>(), last_two);
    let future = (chrono::Utc::now() + chrono::Duration::hours(1))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert_eq!(
        env.ok(&["events", "--agent", "marcus", "--since", &future]),
        ""
    );
    assert_eq!(
        env.ok(&["events", "--json", "--agent", "marcus", "--since", "1h"])
            .lines()
            .count(),
        count
    );
    let bad = env.fails(&["events", "--since", "yesterday-ish"], 64);
    assert!(bad.contains("--since"), "{bad}");
}

#[test]
fn errors_names_its_log_and_wake_wait_fails_when_the_session_failed_at_once() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo ok");
    let agents = "[[agent]]\nname = \"rio\"\ncommand = [\"/no/such/agent\", \"{agent}\"]\n\n[[agent]]\nname = \"clay\"\n";
    env.set_config(&daemon_config(&script, &[], &[], agents));
    let said = env.ok(&["errors"]);
    assert!(said.contains(".daemon/errors.jsonl"), "{said}");
    let d = env.daemon();
    let out = env.run(&["wake", "rio", "--wait", "10s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("could not start (AGENT_NOT_FOUND)"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "the id is printed"
    );
    // A session that runs well is 0.
    let out = env.run(&["wake", "clay", "--wait", "10s"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_until(Duration::from_secs(10), "an error is recorded", || {
        env.ok(&["errors"]).contains("error(s) in")
    });
    let said = env.ok(&["errors"]);
    assert!(said.contains(".daemon/errors.jsonl (the last"), "{said}");
}
