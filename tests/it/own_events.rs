//! A session's own journal events (issue 22, seed 001's `orient_complete`,
//! `sources_archived`): `agent-state record AGENT EVENT KEY=VALUE...` from
//! the session writes one line with the session's id, which `events` shows;
//! agent-state's own events cannot be forged that way.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

#[test]
fn a_session_records_its_own_events_and_cannot_forge_the_tools() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!(
            r#"cat >/dev/null
"{BIN}" --config "{config}" record "$1" orient_complete 'files_read=["identity.md","beliefs.md"]'
"{BIN}" --config "{config}" record "$1" sources_archived count=5 domain=internet-finance
echo '<axiom>COMPLETE</axiom>'"#,
            config = env.config.display()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(20), "rio's session ended", || {
        env.events("rio", "session_end").len() == 1
    });
    let sid = env.json("rio", "session.json")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let orient = env.events("rio", "orient_complete");
    assert_eq!(orient.len(), 1, "{orient:#?}");
    assert_eq!(orient[0]["session_id"], sid.as_str());
    assert_eq!(
        orient[0]["files_read"],
        serde_json::json!(["identity.md", "beliefs.md"])
    );
    let archived = env.events("rio", "sources_archived");
    assert_eq!(archived[0]["count"], 5, "{archived:#?}");
    assert_eq!(archived[0]["domain"], "internet-finance");
    // `events` shows them among the session's own lines.
    let out = env.ok(&["events", "--agent", "rio", "--json"]);
    let kinds: Vec<String> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"]["session_id"] == sid.as_str())
        .filter_map(|e| e["kind"].as_str().map(str::to_string))
        .collect();
    for k in [
        "session_start",
        "orient_complete",
        "sources_archived",
        "session_end",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} in {kinds:?}");
    }

    // The tool's own events are not the session's to write.
    let metrics_before = env.json("rio", "metrics.json");
    let forged = env.run(&["record", "rio", "session_end", "outcome=completed"]);
    assert_eq!(forged.status.code(), Some(64), "{forged:?}");
    assert!(
        String::from_utf8_lossy(&forged.stderr).contains("agent-state's own events"),
        "{forged:?}"
    );
    assert_eq!(env.events("rio", "session_end").len(), 1);
    assert_eq!(env.json("rio", "metrics.json"), metrics_before);
    // Outside a session: no session id.
    env.ok(&["record", "rio", "note_taken", "by=operator"]);
    let note = env.events("rio", "note_taken");
    assert!(note[0]["session_id"].is_null(), "{note:#?}");
}
