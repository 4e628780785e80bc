//! The daemon's instance counters (issue 21, performance): it keeps what it
//! last wrote to `.daemon/counters.json` instead of reading and parsing the
//! whole file for every session. An id taken by anyone else in between (a
//! cron script's `session begin`) is in the file, not in what the daemon
//! kept: the daemon's next id must come after it, never repeat it.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, state};

fn instances(env: &Env, agent: &str) -> Vec<String> {
    env.events(agent, "session_start")
        .iter()
        .filter_map(|e| e["instance"].as_str().map(str::to_string))
        .collect()
}

fn counters(env: &Env) -> Value {
    serde_json::from_str(&std::fs::read_to_string(env.root.join(".daemon/counters.json")).unwrap())
        .unwrap()
}

#[test]
fn ids_a_script_takes_while_the_daemon_runs_are_never_given_again() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo working\ntrue");
    env.set_config(&format!(
        "[defaults]\ncommand = [{:?}, \"{{agent}}\"]\nwake_on_inbox = \"never\"\n[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"leo\"\n",
        script.display().to_string()
    ));
    let d = env.daemon();
    let daemon_session = |n: usize| {
        env.ok(&["wake", "rio"]);
        d.wait_until(
            Duration::from_secs(10),
            &format!("the daemon's session rio-{n:03} completed"),
            || {
                state(&env, "rio", "report.json")["instance"] == format!("rio-{n:03}").as_str()
                    && state(&env, "rio", "session.json")["status"] == "completed"
            },
        );
    };
    let script_session = |agent: &str| {
        let id = env.ok(&["session", "begin", agent]);
        env.ok(&["session", "end", agent, "--session", id.trim()]);
    };
    daemon_session(1);
    // A cron script's sessions, outside the daemon: of the same agent, and
    // of another one (whose count the daemon's next write must keep).
    script_session("rio");
    script_session("leo");
    daemon_session(3);
    script_session("leo");
    daemon_session(4);
    assert_eq!(
        instances(&env, "rio"),
        ["rio-001", "rio-002", "rio-003", "rio-004"]
    );
    assert_eq!(instances(&env, "leo"), ["leo-001", "leo-002"]);
    let c = counters(&env);
    assert_eq!(
        (c["rio"].as_u64(), c["leo"].as_u64()),
        (Some(4), Some(2)),
        "{c}"
    );

    // Replaced by hand while the daemon runs (an operator restoring a
    // backup): the daemon counts on from the file.
    let tmp = env.tmp("counters.json");
    std::fs::write(&tmp, "{\"rio\": 40, \"leo\": 2}\n").unwrap();
    std::fs::rename(&tmp, env.root.join(".daemon/counters.json")).unwrap();
    daemon_session(41);
    let c = counters(&env);
    assert_eq!(
        (c["rio"].as_u64(), c["leo"].as_u64()),
        (Some(41), Some(2)),
        "{c}"
    );
}
