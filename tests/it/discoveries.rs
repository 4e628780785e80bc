//! A discovery found again is not written twice (issue 22, seed 001's
//! memory.md): the same `DISCOVERY_LOCAL` twice in one session and again in
//! the next leaves one entry under "Discoveries"; a new one is added.

use std::time::Duration;

use crate::support::*;

#[test]
fn the_same_discovery_is_one_entry_in_memory() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        r#"echo "<axiom>DISCOVERY_LOCAL:the archive mirrors lag by a day</axiom>"
echo "<axiom>DISCOVERY_LOCAL:  the archive mirrors lag by a day </axiom>"
[ -e "$0.second" ] && echo "<axiom>DISCOVERY_LOCAL:the mirrors recovered</axiom>"
touch "$0.second"
echo "<axiom>COMPLETE</axiom>""#,
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    for n in 1..=2 {
        env.ok(&["wake", "rio"]);
        d.wait_until(
            Duration::from_secs(20),
            &format!("session {n} ended"),
            || {
                env.events("rio", "session_end").len() == n
                    && env.json("rio", "session.json")["status"] == "completed"
            },
        );
    }
    let memory = std::fs::read_to_string(env.path("rio", "memory.md")).unwrap();
    assert_eq!(
        memory.matches("the archive mirrors lag by a day").count(),
        1,
        "one entry for one discovery:\n{memory}"
    );
    assert_eq!(
        memory.matches("the mirrors recovered").count(),
        1,
        "{memory}"
    );
    // What became of each signal is journaled: the repeats say why.
    let effects: Vec<String> = env
        .events("rio", "signal")
        .iter()
        .filter_map(|e| e["effect"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        effects
            .iter()
            .filter(|e| e.contains("already under Discoveries"))
            .count(),
        3,
        "{effects:#?}"
    );
}
