//! The economy, as an operator sees it: `agent-state usage` adds up what
//! the sessions themselves recorded (the daemon's sessions from Claude
//! Code's result, a script's from `session end --tokens-used/--cost-usd`),
//! per agent and per day, with today's budgets.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.0421,"usage":{"input_tokens":12,"cache_creation_input_tokens":3000,"cache_read_input_tokens":14000,"output_tokens":250}}"#;

#[test]
fn usage_adds_up_what_each_session_recorded_and_shows_the_budget_left() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    );
    let agents = "[[agent]]\nname = \"rio\"\nbudget = { max_sessions = 5, max_tokens = 100000 }\n\n[[agent]]\nname = \"leo\"\n";
    let mut config = daemon_config(&script, &[], &[], agents);
    config.push_str("\n[budget]\ntimezone = \"Europe/Lisbon\"\nmax_sessions = 10\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);

    // A daemon session of rio: its usage comes from Claude Code's result.
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "rio's usage is journaled", || {
        env.events("rio", "session_usage").len() == 1
    });
    let session = env.json("rio", "session.json");
    drop(d);

    // A script's session of leo, with figures of its own.
    let id = env.ok(&["session", "begin", "leo"]).trim().to_string();
    env.ok(&[
        "session",
        "end",
        "leo",
        "--session",
        &id,
        "--tokens-used",
        "1000",
        "--cost-usd",
        "0.25",
    ]);

    let out = env.ok(&["usage", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["timezone"], "Europe/Lisbon", "{out}");
    let today = &v["days"][0];
    assert_eq!(today["date"], v["today"], "{out}");
    let rio = &today["agents"]["rio"];
    assert_eq!(rio["sessions"], 1, "{out}");
    assert_eq!(rio["tokens"]["total"], session["tokens_used"], "{out}");
    assert_eq!(rio["tokens"]["total"], 17262, "{out}");
    assert_eq!(rio["tokens"]["cache_read"], 14000, "{out}");
    assert_eq!(rio["cost_usd"], session["cost_usd"], "{out}");
    let leo = &today["agents"]["leo"];
    assert_eq!(leo["tokens"]["total"], 1000, "{out}");
    assert_eq!(leo["cost_usd"], 0.25, "{out}");
    assert_eq!(today["total"]["sessions"], 2, "{out}");

    let budgets = v["budgets"].as_array().unwrap();
    let rio_budget = budgets
        .iter()
        .find(|b| b["scope"] == "rio")
        .expect("rio's budget");
    assert_eq!(rio_budget["left"]["sessions"], 4, "{out}");
    assert_eq!(rio_budget["left"]["tokens"], 100000 - 17262, "{out}");
    assert!(
        rio_budget["left"]["cost_usd"].is_null(),
        "no cost limit: {out}"
    );
    let fleet = budgets
        .iter()
        .find(|b| b["scope"] == "fleet")
        .expect("the fleet's");
    assert_eq!(fleet["left"]["sessions"], 8, "{out}");
    assert!(
        budgets.iter().all(|b| b["scope"] != "leo"),
        "leo has no budget: {out}"
    );

    let text = env.ok(&["usage", "--days", "2"]);
    assert!(text.contains("days in Europe/Lisbon"), "{text}");
    assert!(text.contains("rio") && text.contains("$0.04"), "{text}");
    assert!(
        text.contains("budget rio: left today: 4 session(s), 82.7k tokens"),
        "{text}"
    );
    let err = env.fails(&["usage", "--days", "0"], 2);
    assert!(err.contains("--days"), "{err}");
}
