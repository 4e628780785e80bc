//! Seed 002's error format through the real daemon: with
//! `[hooks] format = "seed"`, `.daemon/errors.jsonl` holds
//! `{"ts", "error": {code, message, details, severity, recoverable,
//! suggestions, context: {agentId, taskId}}}` lines and the on-error hook
//! gets `AXIOM_ERROR_*`; the default stays agent-state's flat record, and
//! `errors`/`status` read either.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, daemon_config};

fn config(script: &Path, hooks: &str) -> String {
    daemon_config(
        script,
        &[],
        &[("retry_delay", "\"1h\""), ("max_backoff", "\"1h\"")],
        &format!(
            "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n\n[health]\ninterval = \"1s\"\n\n[hooks]\ntimeout = \"5s\"\n{hooks}\n"
        ),
    )
}

/// The lines of `.daemon/errors.jsonl` as JSON, as the daemon wrote them.
fn raw_lines(env: &Env) -> Vec<Value> {
    std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A failing rio with an on-error hook that saves its environment; returns
/// the environment, the saved hook environment's path.
fn failing_rio(format: &str) -> (Env, std::path::PathBuf) {
    let env = Env::with_config("");
    let seen = env.tmp("hook-seen");
    let hook = env.script(
        "on-error.sh",
        &format!(
            "env | grep -E '^(AXIOM|AGENT_STATE)_ERROR_' | sort > {seen:?}.$$\nmv {seen:?}.$$ {seen:?}",
            seen = seen.display().to_string()
        ),
    );
    let script = env.script("agent.sh", "echo oops\nexit 3");
    env.set_config(&config(
        &script,
        &format!("on_error = {:?}\n{format}", hook.display().to_string()),
    ));
    (env, seen)
}

#[test]
fn seed_format_writes_the_seeds_record_and_gives_the_hook_axiom_variables() {
    let (env, seen) = failing_rio("format = \"seed\"");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(10), "the hook ran", || seen.exists());
    let lines = raw_lines(&env);
    let line = lines
        .iter()
        .find(|l| l["error"]["code"] == "SESSION_FAILED")
        .unwrap_or_else(|| panic!("no seed-format SESSION_FAILED in {lines:?}"));
    let e = &line["error"];
    assert_eq!(e["context"]["agentId"], "rio", "{line}");
    let task = e["context"]["taskId"].as_str().expect("taskId").to_string();
    assert_eq!(e["severity"], "medium", "{line}");
    assert!(e["recoverable"].is_boolean(), "{line}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 3"),
        "{line}"
    );
    assert!(
        e["suggestions"].as_array().is_some_and(|s| !s.is_empty()),
        "{line}"
    );
    assert!(line["ts"].is_string(), "{line}");
    assert!(line.get("code").is_none(), "not the flat record: {line}");
    let text = std::fs::read_to_string(&seen).unwrap();
    for want in [
        "AXIOM_ERROR_CODE=SESSION_FAILED".to_string(),
        "AXIOM_ERROR_AGENT=rio".to_string(),
        format!("AXIOM_ERROR_TASK={task}"),
        "AXIOM_ERROR_SEVERITY=medium".to_string(),
        // The agent-state variables too: a hook written for them keeps working.
        "AGENT_STATE_ERROR_CODE=SESSION_FAILED".to_string(),
    ] {
        assert!(text.contains(&want), "{want} in:\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("AXIOM_ERROR_MESSAGE=") && l.contains("exited with code 3")),
        "{text}"
    );
    // The CLI reads the seed's records as its own.
    let errors: Vec<Value> = serde_json::from_str(&env.ok(&["errors", "--json"])).unwrap();
    assert!(
        errors
            .iter()
            .any(|r| r["code"] == "SESSION_FAILED" && r["context"]["agent"] == "rio"),
        "{errors:?}"
    );
}

#[test]
fn the_default_format_is_unchanged() {
    let (env, seen) = failing_rio("");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(10), "the hook ran", || seen.exists());
    let lines = raw_lines(&env);
    assert!(
        lines
            .iter()
            .any(|l| l["code"] == "SESSION_FAILED" && l["context"]["agent"] == "rio"),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");
    let text = std::fs::read_to_string(&seen).unwrap();
    assert!(!text.contains("AXIOM_"), "{text}");
    assert!(
        text.contains("AGENT_STATE_ERROR_CODE=SESSION_FAILED"),
        "{text}"
    );
}

#[test]
fn an_unknown_format_is_refused_naming_the_key_and_the_words() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "exit 0");
    env.set_config(&config(&script, "format = \"axiom\""));
    let out = env.run(&["check"]);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hooks.format"), "{text}");
    assert!(text.contains("\"axiom\""), "{text}");
    assert!(
        text.contains("seed") && text.contains("agent-state"),
        "{text}"
    );
    assert!(text.contains(&env.config.display().to_string()), "{text}");
}
