//! The session's machine fed live by the daemon's loop (issue 21): it
//! decides when a session's runs get SIGTERM and SIGKILL (each run's own
//! timeout, a stall, a stop, a shutdown), the runner obeys, and the health
//! monitor's backstop asks it when a session should have ended — each
//! run's timeout and grace, never the time a verification takes.

use serde_json::Value;

use crate::support::{Env, daemon_config, secs, state};

/// rio runs `run` (a shell fragment) each iteration and is verified by
/// `verify`; `defaults` are more `[defaults]` keys. Bootstrapped.
fn setup(run: &str, verify: &str, defaults: &[(&str, &str)]) -> Env {
    let env = Env::with_config("");
    let d = env.dir.path().display().to_string();
    let script = env.script(
        "agent.sh",
        &format!(
            "D={d:?}\nN=$(( $(cat \"$D/runs\" 2>/dev/null || echo 0) + 1 )); echo $N > \"$D/runs\"\ncat > /dev/null\n{run}\necho \"run $N done\"\n"
        ),
    );
    let mut keys: Vec<(&str, &str)> = vec![("verify", verify)];
    keys.extend_from_slice(defaults);
    let body = daemon_config(
        &script,
        &[],
        &keys,
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&format!("{body}\n[health]\ninterval = \"1s\"\n"));
    env.ok(&["bootstrap"]);
    env
}

fn runs(env: &Env) -> u32 {
    std::fs::read_to_string(env.tmp("runs"))
        .map(|t| t.trim().parse().unwrap_or(0))
        .unwrap_or(0)
}

/// session.json once the session has ended with its iterations counted.
fn ended(env: &Env) -> Option<Value> {
    let p = env.path("rio", "session.json");
    let s = p.exists().then(|| state(env, "rio", "session.json"))?;
    (s["status"] != "running" && s["iterations"].is_object()).then_some(s)
}

/// A verification may take longer than the session's timeout (it has its
/// own `verify_timeout`): the health monitor, checking every second, does
/// not stop the session as "ran past its timeout" a minute after its
/// timeout and grace — it asks the machine, which times runs, not
/// verifications. Before, it measured from the session's start and ended
/// the verification at about 62 s.
#[test]
fn a_verification_longer_than_the_timeout_is_not_cut_by_the_health_monitor() {
    let marker = "verify-started";
    let env = setup(
        "true",
        &format!(r#"[["sh", "-c", "touch {marker}; sleep 66; echo checked"]]"#),
        &[
            ("timeout", "\"1s\""),
            ("kill_grace", "\"1s\""),
            ("verify_timeout", "\"5m\""),
        ],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(20), "rio's verification runs", || {
        state(&env, "rio", "report.json")["iteration"]["phase"] == "verifying"
    });
    d.wait_until(secs(120), "rio's session ended", || ended(&env).is_some());
    let s = ended(&env).unwrap();
    assert_eq!(s["status"], "completed", "{s:#}\n{}", d.log_text());
    assert_eq!(s["iterations"]["count"], 1, "{s:#}");
    assert_eq!(runs(&env), 1);
    d.wait_until(secs(10), "the journal's end line", || {
        !env.session_ends("rio").is_empty()
    });
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["event"], "session_end", "{ends:#?}");
    let errors = env.error_log();
    assert!(
        !errors.contains("SESSION_TIMEOUT") && !errors.contains("ran past its timeout"),
        "{errors}"
    );
}

/// Each iteration's run has its own timeout, from its own start: two runs
/// of 2 s under a 3 s timeout complete, though the session took longer.
#[test]
fn each_iteration_has_its_own_timeout() {
    let env = setup(
        "sleep 2; [ $N -ge 2 ] && touch fixed",
        r#"[["sh", "-c", "test -f fixed"]]"#,
        &[
            ("timeout", "\"3s\""),
            ("max_iterations", "3"),
            ("stuck_threshold", "3"),
        ],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60), "rio's session ended", || ended(&env).is_some());
    let s = ended(&env).unwrap();
    assert_eq!(s["status"], "completed", "{s:#}\n{}", d.log_text());
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(runs(&env), 2);
    assert!(
        !env.error_log().contains("SESSION_TIMEOUT"),
        "{}",
        env.error_log()
    );
}

/// A later iteration's run is still timed: the second run, which hangs,
/// gets SIGTERM at its own timeout and the session is recorded as a
/// timeout, once.
#[test]
fn a_later_iteration_that_hangs_times_out() {
    let env = setup(
        "[ $N -ge 2 ] && exec sleep 60",
        r#"[["sh", "-c", "exit 1"]]"#,
        &[("timeout", "\"3s\""), ("max_iterations", "3")],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60), "rio's session ended", || ended(&env).is_some());
    let s = ended(&env).unwrap();
    assert_eq!(s["status"], "timeout", "{s:#}\n{}", d.log_text());
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(runs(&env), 2);
    d.wait_until(secs(10), "the journal's end line", || {
        !env.session_ends("rio").is_empty()
    });
    assert_eq!(
        env.session_ends("rio").len(),
        1,
        "{:#?}",
        env.session_ends("rio")
    );
}

/// `agent-state stop` while the daemon verifies: the verification ends at
/// once, no further iteration runs, and the session has one record, a
/// stop (its code SESSION_STOPPED), not a failure and not retried.
#[test]
fn a_stop_during_verification_ends_it_with_one_stopped_record() {
    let marker = "verify-started";
    let env = setup(
        "true",
        &format!(r#"[["sh", "-c", "touch {marker}; sleep 60"]]"#),
        &[("max_iterations", "3")],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(20), "rio's verification runs", || {
        state(&env, "rio", "report.json")["iteration"]["phase"] == "verifying"
    });
    let started = std::time::Instant::now();
    let out = env.ok(&["stop", "rio", "--reason", "wrong task", "--wait"]);
    assert!(out.contains("stopped"), "{out}");
    assert!(
        started.elapsed() < secs(30),
        "the verification was not stopped promptly"
    );
    d.wait_until(secs(20), "rio's session ended", || ended(&env).is_some());
    let s = ended(&env).unwrap();
    assert_eq!(s["status"], "error", "{s:#}");
    assert!(
        s["errors"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["code"] == "SESSION_STOPPED")),
        "{s:#}"
    );
    assert_eq!(runs(&env), 1, "no iteration after the stop");
    d.wait_until(secs(10), "the journal's end line", || {
        !env.session_ends("rio").is_empty()
    });
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["event"], "error", "{ends:#?}");
    assert!(
        ends[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("wrong task")),
        "{ends:#?}"
    );
    d.wait_until(secs(10), "metrics.json counts the stop", || {
        state(&env, "rio", "metrics.json")["lifetime"]["sessions_stopped"] == 1
    });
    let m = state(&env, "rio", "metrics.json");
    assert_eq!(m["lifetime"]["sessions_error"], 0, "{m:#}");
}

/// rio alone, without `verify`: `run` each session, `defaults` more keys.
fn plain(run: &str, defaults: &[(&str, &str)]) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", &format!("cat > /dev/null\n{run}\n"));
    let body = daemon_config(
        &script,
        &[],
        defaults,
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&body);
    env.ok(&["bootstrap"]);
    env
}

fn stalled_records(env: &Env) -> usize {
    env.error_log()
        .lines()
        .filter(|l| l.contains("SESSION_STALLED"))
        .count()
}

fn seconds(s: &Value, field: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s[field].as_str().unwrap())
        .unwrap()
        .timestamp()
}

/// The stall timer counts from the last output, which the machine is told
/// at its timers: a session that prints for 4 s and then falls silent is
/// stopped as stalled 2 s after its last output, not 2 s after its start.
#[test]
fn a_stall_counts_from_the_last_output() {
    let env = plain(
        "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.5; done\nexec sleep 60",
        &[
            ("stall_timeout", "\"2s\""),
            ("stall_action", "\"stop\""),
            ("timeout_retries", "0"),
        ],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30), "rio's session ended", || {
        state(&env, "rio", "session.json")["status"] == "error"
    });
    let s = state(&env, "rio", "session.json");
    assert!(
        s["reason"].as_str().unwrap_or("").contains("stalled"),
        "{s:#}\n{}",
        d.log_text()
    );
    let took = seconds(&s, "ended_at") - seconds(&s, "started_at");
    assert!(took >= 5, "stopped {took} s after its start: {s:#}");
    d.wait_until(secs(10), "SESSION_STALLED is recorded", || {
        stalled_records(&env) >= 1
    });
}

/// `stall_action = "warn"`: each silence is said once, the session goes on
/// and completes.
#[test]
fn each_silence_is_warned_once_and_the_session_goes_on() {
    let env = plain(
        "echo one; sleep 4; echo two; sleep 4; echo three",
        &[("stall_timeout", "\"2s\""), ("stall_action", "\"warn\"")],
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(40), "rio's session completed", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    d.wait_until(secs(10), "two SESSION_STALLED records", || {
        stalled_records(&env) >= 2
    });
    assert_eq!(stalled_records(&env), 2, "{}", env.error_log());
}
