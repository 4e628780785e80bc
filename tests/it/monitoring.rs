//! What monitoring sees: `agent-state health` (one line, exit 0/1/2/3) against
//! a real daemon that is missing, healthy, and killed; and the metrics the
//! daemon publishes.

use std::time::Duration;

use crate::support::*;

fn agent_script(env: &Env, body: &str) -> std::path::PathBuf {
    env.script("agent.sh", &format!("#!/bin/sh\necho working\n{body}\n"))
}

const RIO: &str = "[[agent]]\nname = \"rio\"\nschedule = \"0 3 * * *\"\n";

/// `health`'s exit status and its one line of stdout.
fn health(env: &Env, args: &[&str]) -> (i32, String) {
    let mut all = vec!["health"];
    all.extend_from_slice(args);
    let out = env.run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    (out.status.code().unwrap_or(-1), stdout.trim().to_string())
}

#[test]
fn health_says_critical_without_a_daemon_ok_with_one_and_critical_once_it_is_killed() {
    let env = Env::with_config("");
    let script = agent_script(&env, "exit 0");
    env.set_config(&daemon_config(&script, &[], &[], RIO));
    env.ok(&["bootstrap"]);

    let (code, line) = health(&env, &[]);
    assert_eq!(code, 2, "{line}");
    assert!(line.starts_with("CRITICAL: no daemon is running"), "{line}");

    let mut d = env.daemon();
    let (code, line) = health(&env, &[]);
    assert_eq!(code, 0, "{line}");
    assert!(line.starts_with("OK: daemon "), "{line}");
    assert!(line.contains(&format!("(pid {})", d.pid)), "{line}");

    // A successful session, then a window shorter than its age: a warning
    // that names the agent.
    env.ok(&["wake", "rio", "--wait", "5s"]);
    d.wait_until(Duration::from_secs(10), "the session completed", || {
        env.events("rio", "session_end").len() == 1
    });
    let (code, line) = health(&env, &["--success-within", "1h"]);
    assert_eq!(code, 0, "{line}");
    std::thread::sleep(Duration::from_millis(2100));
    let (code, line) = health(&env, &["--success-within", "1s"]);
    assert_eq!(code, 1, "{line}");
    assert_eq!(line, "WARNING: rio: no successful session in the last 1s");
    let out = env.run(&["health", "--success-within", "1s", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the same exit status with --json"
    );
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["level"], "warning", "{json}");

    d.kill9();
    let (code, line) = health(&env, &["--success-within", "off"]);
    assert_eq!(code, 2, "{line}");
    assert!(
        line.contains(&format!("(pid {}) is not running", d.pid)),
        "{line}"
    );
}
