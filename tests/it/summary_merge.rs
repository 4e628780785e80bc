//! The Context Summary does not overwrite what the agent said itself
//! (issue 22, seed 001): a BLOCKED signal then "Blockers: None" leaves
//! `blocked_by` set; "Next Agent: Judge" is routing, not `next_priority`;
//! a RESOLVED after the BLOCKED lets the summary clear it.

use std::time::Duration;

use crate::support::*;

#[test]
fn the_agents_own_blocked_stands_and_next_agent_is_no_priority() {
    let env = Env::with_config("");
    let second = env.tmp("second");
    let script = env.script(
        "agent.sh",
        &format!(
            r#"cat >/dev/null
echo "<axiom>BLOCKED:waiting for the API key</axiom>"
[ -e {second:?} ] && echo "<axiom>RESOLVED</axiom>"
touch {second:?}
printf '## Context Summary\n**Goal**: Map the forks\n**Current State**: Half done\n**Next Agent**: Judge\n**Blockers**: None\n\n<axiom>COMPLETE</axiom>\n'"#,
            second = second.display().to_string()
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
    let ended = |n: usize| {
        d.wait_until(
            Duration::from_secs(20),
            &format!("session {n} recorded"),
            || {
                env.events("rio", "session_end").len() == n
                    && env.json("rio", "report.json")["summary"]
                        .as_str()
                        .is_some_and(|s| s.contains("Half done"))
            },
        )
    };
    env.ok(&["wake", "rio"]);
    ended(1);
    let r = env.json("rio", "report.json");
    assert_eq!(r["blocked_by"], "waiting for the API key", "{r:#}");
    assert!(r["next_priority"].is_null(), "Next Agent is routing: {r:#}");

    // This time it says RESOLVED after BLOCKED: the summary's None stands.
    std::fs::write(env.path("rio", "report.json"), {
        let mut r = r.clone();
        r["summary"] = serde_json::Value::Null;
        serde_json::to_string(&r).unwrap()
    })
    .unwrap();
    env.ok(&["wake", "rio"]);
    ended(2);
    let r = env.json("rio", "report.json");
    assert!(r["blocked_by"].is_null(), "{r:#}");
}
