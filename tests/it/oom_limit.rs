//! The concurrent-session limit an OOM kill lowered, across the daemon's
//! life: kept in `.daemon/oom.json` through a crash and a restart until
//! its time, then back; shown in `status` and `status --json`; a damaged
//! file is a warning, never a failed start. The OOM kill itself is
//! `error_matrix`'s (a session SIGKILLs itself while the kernel's count,
//! read from the file `AGENT_STATE_TEST_VMSTAT` names, rises).

use std::time::Duration;

use serde_json::Value;

use crate::error_matrix::{names, oom_env, start};
use crate::support::{Daemon, Env};

const LOWERED_LINE: &str =
    "concurrency: lowered to 1 session(s) at once (max_concurrent_sessions = 2)";

/// `status --json`'s line of `agent`.
fn status_line(env: &Env, agent: &str) -> Value {
    let out = env.ok(&["status", "--json"]);
    let lines: Vec<Value> = serde_json::from_str(&out).expect("status --json");
    lines
        .into_iter()
        .find(|l| l["agent"] == agent)
        .unwrap_or_else(|| panic!("no line for {agent} in {out}"))
}

/// `a` and `b` woken together: wait until `running` of them run at once
/// and the rest wait for a slot, then let them finish.
fn wake_both_and_see(env: &Env, d: &Daemon, running: usize) {
    let release = env.tmp("release");
    let _ = std::fs::remove_file(&release);
    let before = env.events("a", "session_end").len() + env.events("b", "session_end").len();
    env.ok(&["wake", "a"]);
    env.ok(&["wake", "b"]);
    d.wait_until(
        Duration::from_secs(20),
        &format!("{running} of a and b run, {} waits", 2 - running),
        || {
            let hb = d.heartbeat();
            names(&hb["running"]).len() == running && names(&hb["waiting"]).len() == 2 - running
        },
    );
    std::fs::write(&release, "").unwrap();
    d.wait_until(Duration::from_secs(30), "a and b both ran", || {
        env.events("a", "session_end").len() + env.events("b", "session_end").len() == before + 2
    });
}

#[test]
fn the_lowered_limit_survives_a_crash_and_a_restart_until_its_time_then_comes_back() {
    let (env, vmstat) = oom_env(true);
    let mut d = start(&env, &vmstat);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
    });
    let lowered = d.heartbeat()["concurrency_lowered"].clone();
    let until = lowered["until"].as_str().expect("until").to_string();
    // Written when the session was OOM-killed, before anything else.
    let saved = crate::support::read_json(&env.root.join(".daemon/oom.json"));
    assert_eq!(saved["lowered_until"], until.as_str(), "{saved}");
    assert_eq!(saved["agent"], "rio", "{saved}");

    // The daemon crashes and comes back: the limit is still lowered.
    d.kill9();
    drop(d);
    let d = start(&env, &vmstat);
    assert_eq!(d.heartbeat()["concurrency_lowered"], lowered);
    assert!(
        d.log_text().contains(&format!(
            "an OOM kill before this start ({}) lowered the limit: at most 1 session(s) at once (max_concurrent_sessions = 2) until {until}",
            env.root.join(".daemon/oom.json").display()
        )),
        "{}",
        d.log_text()
    );
    assert!(env.ok(&["status"]).contains(LOWERED_LINE));
    assert_eq!(status_line(&env, "a")["concurrency_lowered"], lowered);
    wake_both_and_see(&env, &d, 1);
    drop(d);

    // Started again after its time (the daemon's clock, AGENT_STATE_FAKE_NOW,
    // a minute past it): the limit is as configured again.
    let after =
        chrono::DateTime::parse_from_rfc3339(&until).unwrap() + chrono::Duration::minutes(1);
    let d = Daemon::start(
        &env,
        &[
            ("AGENT_STATE_TEST_VMSTAT", vmstat.to_str().unwrap()),
            ("AGENT_STATE_FAKE_NOW", &after.to_rfc3339()),
        ],
    );
    assert!(
        d.heartbeat()["concurrency_lowered"].is_null(),
        "{}",
        d.heartbeat()
    );
    assert!(!d.log_text().contains("an OOM kill before this start"));
    wake_both_and_see(&env, &d, 2);
}

#[test]
fn status_json_shows_the_lowered_limit_on_every_agent_s_line_while_it_holds() {
    let (env, vmstat) = oom_env(true);
    let d = start(&env, &vmstat);
    assert!(status_line(&env, "a").get("concurrency_lowered").is_none());
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
    });
    let lowered = d.heartbeat()["concurrency_lowered"].clone();
    for agent in ["rio", "a", "b"] {
        let line = status_line(&env, agent);
        assert_eq!(line["concurrency_lowered"]["limit"], 1, "{line}");
        assert_eq!(line["concurrency_lowered"]["configured"], 2, "{line}");
        assert_eq!(line["concurrency_lowered"], lowered, "{line}");
    }
    // A person's mailbox runs no sessions: not on its line.
    assert!(
        status_line(&env, "marcus")
            .get("concurrency_lowered")
            .is_none()
    );
    // One agent asked for: on its line too.
    let one: Vec<Value> = serde_json::from_str(&env.ok(&["status", "--json", "a"])).unwrap();
    assert_eq!(one[0]["concurrency_lowered"], lowered);
}

#[test]
fn a_damaged_oom_file_is_a_warning_naming_it_and_the_limit_as_configured() {
    let (env, vmstat) = oom_env(false);
    env.ok(&["bootstrap"]);
    let file = env.root.join(".daemon/oom.json");
    std::fs::write(&file, "{\"lowered_until\": \"tomorrow\"").unwrap();
    let d = start(&env, &vmstat);
    let log = d.log_text();
    assert!(
        log.contains(&format!("{} is damaged", file.display()))
            && log.contains("STATE_CORRUPT")
            && log.contains("starting with max_concurrent_sessions as configured"),
        "{log}"
    );
    assert!(d.heartbeat()["concurrency_lowered"].is_null());
    wake_both_and_see(&env, &d, 2);
}
