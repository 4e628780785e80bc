//! `agent-state stop AGENT`: an operator stops a running session through
//! the daemon. Every process of the session dies (the path of a timeout:
//! SIGTERM to the group, SIGKILL after kill_grace), the session is recorded
//! as stopped (not a failure), its message goes back to the inbox without
//! an attempt counted and waits for the next wake, and no retry starts.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Accounts, Env, account, process_alive, read_json, root_tests, run_as, state};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// The agents' script: the first session of rio or clay starts a child that
/// ignores SIGTERM (only SIGKILL ends it) and then becomes a foreground
/// `sleep`, each writing its pid; later sessions, and theseus's, complete
/// at once. clay's traps SIGTERM and records its own failure, as a session
/// script's trap does.
const SCRIPT: &str = r#"
dir=$(dirname "$0")
if [ -e "$dir/$1.once" ] || [ "$1" = "theseus" ]; then echo "$1 done"; exit 0; fi
: > "$dir/$1.once"
if [ "$1" = "clay" ]; then
  trap '"$AS" session fail "$1" --outcome error --reason "trapped SIGTERM"; exit 143' TERM
fi
( trap '' TERM; exec sleep 1000 ) &
echo $! > "$dir/$1.child.tmp" && mv "$dir/$1.child.tmp" "$dir/$1.child.pid"
echo "working"
if [ "$1" = "clay" ]; then
  echo $$ > "$dir/$1.main.tmp" && mv "$dir/$1.main.tmp" "$dir/$1.main.pid"
  sleep 1000 &
  wait $!
  exit 0
fi
echo $$ > "$dir/$1.main.tmp" && mv "$dir/$1.main.tmp" "$dir/$1.main.pid"
exec sleep 1000
"#;

fn setup() -> Env {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("AS={:?}\n{SCRIPT}", crate::support::BIN),
    );
    env.set_config(&format!(
        r#"
[daemon]
max_concurrent_sessions = 3
shutdown_grace = "2s"

[defaults]
command = [{:?}, "{{agent}}"]
wake_on_inbox = "any"
inbox_debounce = "200ms"
timeout = "5m"
kill_grace = "1s"

[[agent]]
name = "rio"
[[agent]]
name = "clay"
[[agent]]
name = "theseus"
[[agent]]
name = "leo"
[[agent]]
name = "marcus"
kind = "human"
"#,
        script.display().to_string(),
    ));
    env.ok(&["bootstrap"]);
    env
}

fn pid(env: &Env, agent: &str, which: &str) -> Option<i32> {
    std::fs::read_to_string(env.tmp(&format!("{agent}.{which}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn last(env: &Env, agent: &str, event: &str) -> Value {
    env.events(agent, event).pop().unwrap_or(Value::Null)
}

/// The message `id` in `agent`'s inbox/, as a file.
fn in_inbox(env: &Env, agent: &str, id: &str) -> Option<Value> {
    env.files(agent, "inbox")
        .into_iter()
        .find(|f| f.contains(id))
        .map(|f| read_json(&env.path(agent, &format!("inbox/{f}"))))
}

/// Send `agent` a message (its inbox wakes it) and wait until its session
/// runs with both processes started; returns the message id and the pids.
fn start_working(env: &Env, d: &crate::support::Daemon, agent: &str) -> (String, i32, i32) {
    let id = env.send("marcus", agent, &[]);
    d.wait_until(secs(20), &format!("{agent}'s session runs"), || {
        pid(env, agent, "child").is_some() && pid(env, agent, "main").is_some()
    });
    let (child, main) = (
        pid(env, agent, "child").unwrap(),
        pid(env, agent, "main").unwrap(),
    );
    assert!(process_alive(child) && process_alive(main));
    assert_eq!(state(env, agent, "session.json")["status"], "running");
    assert!(
        env.waiting(agent).is_empty(),
        "the session claimed the message"
    );
    (id, child, main)
}

#[test]
fn stop_kills_every_process_and_records_a_stop_that_is_no_failure_and_no_retry() {
    let env = setup();
    let d = env.daemon();
    let (id, child, main) = start_working(&env, &d, "rio");
    let sid = state(&env, "rio", "session.json")["session_id"]
        .as_str()
        .unwrap()
        .to_string();

    let out = env.ok(&["stop", "rio", "--reason", "operator", "--wait"]);
    assert!(out.contains(&format!("session {sid} stopped")), "{out}");
    assert!(out.contains("operator"), "{out}");

    // Both processes are gone: the foreground one and the child that
    // ignored SIGTERM (SIGKILL after kill_grace, or the sweep).
    assert!(
        !process_alive(main),
        "the session's main process {main} runs"
    );
    assert!(
        !process_alive(child),
        "the child {child} that ignored SIGTERM runs"
    );

    // The journal's end line: an `error` with the typed outcome, the reason
    // and who stopped it; the message returned.
    let end = last(&env, "rio", "error");
    assert_eq!(end["session_id"], sid.as_str(), "{end:#}");
    assert_eq!(end["code"], "SESSION_STOPPED", "{end:#}");
    let reason = end["reason"].as_str().unwrap();
    assert!(
        reason.contains("stopped by root (uid 0)") && reason.contains("operator"),
        "{reason}"
    );
    assert_eq!(end["messages_returned"], serde_json::json!([id]), "{end:#}");

    // session.json: status within the seed's enum, the stop in `errors`.
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "error", "{s:#}");
    assert!(s["reason"].as_str().unwrap().contains("operator"), "{s:#}");
    let stop = s["errors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["code"] == "SESSION_STOPPED")
        .unwrap_or_else(|| panic!("no SESSION_STOPPED in errors: {s:#}"));
    assert_eq!(stop["outcome"], "stopped");
    assert!(stop["message"].as_str().unwrap().contains("operator"));

    // The message is back in the inbox, no attempt counted.
    let back = in_inbox(&env, "rio", &id).expect("the message is back in inbox/");
    assert_eq!(back["attempts"].as_u64().unwrap_or(0), 0, "{back:#}");

    // No retry: theseus, woken by a message sent after the stop with the
    // same debounce, runs and ends; by then rio's returned message has been
    // scanned and its debounce is long over, and rio started nothing.
    env.send("marcus", "theseus", &[]);
    d.wait_until(secs(20), "theseus's session ended", || {
        !last(&env, "theseus", "session_end").is_null()
    });
    env.ok(&["check"]);
    assert_eq!(
        env.events("rio", "session_start").len(),
        1,
        "the stopped session was retried, or its messages woke it\n{}",
        d.log_text()
    );
    assert!(in_inbox(&env, "rio", &id).is_some(), "still waiting");
    // The daemon's log says it calmly, not as a session error.
    d.wait_until(secs(5), "the daemon logs the stop as no failure", || {
        d.log_text()
            .lines()
            .any(|l| l.contains(" INFO ") && l.contains("stopped (not a failure"))
    });
    assert!(
        !d.log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("error: stopped by")),
        "{}",
        d.log_text()
    );

    // status: idle, no failure, no error record.
    let v: Value = serde_json::from_str(&env.ok(&["status", "rio", "--json"])).unwrap();
    let line = &v[0];
    assert_eq!(line["status"], "idle", "{line:#}");
    assert_eq!(line["errors_30d"], 0, "{line:#}");
    assert_eq!(line["timeouts_30d"], 0, "{line:#}");
    assert_eq!(line["sessions_30d"], 1, "{line:#}");
    assert_eq!(line["error_records_30d"], 0, "{line:#}");
    assert!(line["failing"].is_null(), "{line:#}");
    assert_eq!(line["last_session"]["code"], "SESSION_STOPPED", "{line:#}");
    let table = env.ok(&["status", "rio"]);
    let row = table.lines().find(|l| l.starts_with("rio ")).unwrap();
    assert!(
        row.contains(" idle ") && row.contains(" stopped ") && !row.contains("error"),
        "{table}"
    );
    let m = state(&env, "rio", "metrics.json");
    assert_eq!(m["lifetime"]["sessions_error"], 0, "{m:#}");
    assert_eq!(m["lifetime"]["sessions_stopped"], 1, "{m:#}");
    assert_eq!(m["rolling_30d"]["error_rate"], 0.0, "{m:#}");

    // The next wake delivers the message: processed, still no attempt.
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(20), "rio's next session ended", || {
        !last(&env, "rio", "session_end").is_null()
    });
    let end = last(&env, "rio", "session_end");
    assert_eq!(
        end["messages_processed"],
        serde_json::json!([id]),
        "{end:#}"
    );
    d.wait_until(
        secs(10),
        "report.json says the next session completed",
        || state(&env, "rio", "report.json")["last_session"]["outcome"] == "completed",
    );
    let report = state(&env, "rio", "report.json");
    assert!(report["last_session"]["code"].is_null(), "{report:#}");
}

/// A session script whose trap records its own failure on SIGTERM (the
/// shipped script's way) records the stop, not an error of its own.
#[test]
fn a_script_that_traps_sigterm_records_the_stop_with_its_words() {
    let env = setup();
    let d = env.daemon();
    let (id, child, main) = start_working(&env, &d, "clay");
    // Without --wait: the daemon took the request, the end follows.
    let out = env.ok(&["stop", "clay", "--reason", "wrong task"]);
    assert!(out.contains("stopping session"), "{out}");
    d.wait_until(secs(20), "clay's end is recorded", || {
        !last(&env, "clay", "error").is_null()
    });
    let end = last(&env, "clay", "error");
    assert_eq!(end["code"], "SESSION_STOPPED", "{end:#}");
    let reason = end["reason"].as_str().unwrap();
    assert!(
        reason.contains("wrong task") && reason.contains("trapped SIGTERM"),
        "both the stop and the script's words: {reason}"
    );
    d.wait_until(secs(20), "clay's processes are gone", || {
        !process_alive(main) && !process_alive(child)
    });
    let back = in_inbox(&env, "clay", &id).expect("the message is back in inbox/");
    assert_eq!(back["attempts"].as_u64().unwrap_or(0), 0, "{back:#}");
    assert_eq!(state(&env, "clay", "report.json")["status"], "idle");
}

#[test]
fn stop_refuses_what_it_cannot_stop_and_says_when_nothing_runs() {
    let env = setup();
    // No daemon: 69.
    let err = env.fails(&["stop", "rio"], 69);
    assert!(err.contains("no agent-state daemon is running"), "{err}");
    let d = env.daemon();
    // Not in the config: 67 (as for every command); a mailbox: 64.
    let err = env.fails(&["stop", "nobody"], 67);
    assert!(err.contains("nobody"), "{err}");
    env.fails(&["stop", "marcus"], 64);
    // Nothing running: said, exit 0.
    let out = env.ok(&["stop", "rio", "--reason", "x"]);
    assert!(
        out.contains("rio: no session is running; nothing to stop"),
        "{out}"
    );
    // A session a script began (not the daemon's): 77, and what to do.
    let sid = env.ok(&["session", "begin", "leo"]).trim().to_string();
    let err = env.fails(&["stop", "leo"], 77);
    assert!(
        err.contains(&format!("session {sid} is not run by the daemon"))
            && err.contains("session fail leo"),
        "{err}"
    );
    assert_eq!(state(&env, "leo", "session.json")["status"], "running");
    drop(d);
}

/// Stopping is the operator's: a member of the inbox group (who may read
/// the state and wake agents) and a user in no group are refused with 77,
/// and the session runs on. Creates a user and a group: root with
/// AGENT_STATE_ROOT_TESTS=1.
#[test]
fn only_the_service_user_or_root_may_stop_a_session() {
    if !root_tests() {
        return;
    }
    // Names of this test process's own: two runs at once never share them.
    let (member, outsider) = (account("stopmem"), account("stopout"));
    let (member, outsider) = (member.as_str(), outsider.as_str());
    let accounts = Accounts::new(&account("stopgrp"), &[member], &[outsider]);
    let env = setup();
    let bin = accounts.share(&env);
    let d = env.daemon();
    let (_, child, main) = start_working(&env, &d, "rio");
    for user in [member, outsider] {
        let out = run_as(
            &env,
            &bin,
            user,
            &["stop", "rio", "--reason", "not mine to stop"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(77), "{user}: {err}");
        assert!(
            err.contains("stopping a session is the operator's"),
            "{user}: {err}"
        );
    }
    assert!(
        process_alive(main) && process_alive(child),
        "nothing was stopped"
    );
    assert_eq!(state(&env, "rio", "session.json")["status"], "running");
    // Root may.
    env.ok(&["stop", "rio", "--wait"]);
    assert!(!process_alive(main) && !process_alive(child));
}

/// `session fail` of a session the daemon runs records the end only (the
/// hook keeps its meaning) and says so; `stop` then ends its processes.
#[test]
fn session_fail_from_outside_says_the_processes_go_on_and_stop_ends_them() {
    let env = setup();
    let d = env.daemon();
    let (id, child, main) = start_working(&env, &d, "rio");
    let sid = state(&env, "rio", "session.json")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = env.run(&[
        "session",
        "fail",
        "rio",
        "--session",
        &sid,
        "--outcome",
        "error",
        "--reason",
        "by hand",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("its processes go on until they exit; `agent-state stop rio` stops them"),
        "{err}"
    );
    assert!(process_alive(main) && process_alive(child));
    let out = env.ok(&["stop", "rio", "--wait"]);
    assert!(out.contains("ended before the stop: by hand"), "{out}");
    assert!(!process_alive(main) && !process_alive(child));
    // Recorded once, as the hook said; no retry after the stop.
    assert_eq!(env.events("rio", "error").len(), 1);
    assert!(in_inbox(&env, "rio", &id).is_some());
}
