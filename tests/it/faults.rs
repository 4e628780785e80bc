//! The error matrix through the real daemon: fake agents that fail in every
//! way the catalogue (docs/errors.md) names, and what an operator sees —
//! `.daemon/errors.jsonl`, the on-error hook, the human mailbox, report.json,
//! `agent-state status` and `errors`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, Env, poll_until, state};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// rio (the agent under test), theseus (a healthy neighbour) and marcus
/// (the human mailbox), with fast retries; `agent` is rio's extra settings.
fn setup(script_body: &str, rio: &str, hooks: &str) -> (Env, PathBuf) {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $AGENT_STATE_SESSION_ID\" >> {runs:?}\n{script_body}",
            runs = runs.display().to_string()
        ),
    );
    env.set_config(&config(&script, rio, hooks));
    (env, runs)
}

fn config(script: &Path, rio: &str, hooks: &str) -> String {
    format!(
        r#"
[daemon]
max_concurrent_sessions = 2
shutdown_grace = "2s"

[defaults]
command = [{script:?}, "{{agent}}"]
timeout = "30s"
kill_grace = "1s"
wake_on_inbox = "any"
inbox_debounce = "100ms"
retry_delay = "300ms"
spawn_retry_delay = "100ms"
max_backoff = "1h"

[[agent]]
name = "rio"
{rio}

[[agent]]
name = "theseus"

[[agent]]
name = "marcus"
kind = "human"

[health]
interval = "1s"

[hooks]
{hooks}
"#,
        script = script.display().to_string()
    )
}

/// The records of `.daemon/errors.jsonl` (via the CLI, as an operator reads them).
fn errors(env: &Env) -> Vec<Value> {
    let out = env.ok(&["errors", "--json"]);
    serde_json::from_str::<Vec<Value>>(&out).expect("errors --json")
}

fn codes(env: &Env) -> Vec<String> {
    errors(env)
        .iter()
        .map(|r| r["code"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn count(env: &Env, code: &str) -> usize {
    codes(env).iter().filter(|c| *c == code).count()
}

fn starts(runs: &Path, agent: &str) -> usize {
    std::fs::read_to_string(runs)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("start {agent} ")))
        .count()
}

/// `agent-state send` of a one-character body (the command a person or a
/// script uses), failing the test if it fails.
fn send(env: &Env, from: &str, to: &str, subject: &str) {
    env.ok(&[
        "send",
        "--from",
        from,
        "--to",
        to,
        "--subject",
        subject,
        "--body",
        "x",
    ]);
}

/// The daemon has handled what came before: a message sent to theseus now
/// (through the same inbox watcher as anything sent before it) has started
/// theseus's next session. The positive proof behind "nothing else
/// happened" checks, instead of a sleep.
fn theseus_ran_after(env: &Env, d: &Daemon, runs: &Path) {
    let before = starts(runs, "theseus");
    send(env, "marcus", "theseus", "later");
    d.wait_until(secs(15.0), "theseus ran after what came before", || {
        starts(runs, "theseus") > before
    });
}

/// rio's failures are over for now: report.json's error is no longer
/// `retrying` (it is held back or disabled), so no further attempt is planned.
fn retries_over(env: &Env, d: &Daemon) {
    d.wait_until(
        secs(15.0),
        "report.json says rio is no longer retrying",
        || {
            let state = state(env, "rio", "report.json")["error"]["state"].clone();
            state == "backoff" || state == "disabled"
        },
    );
}

/// Messages waiting in marcus's mailbox, as `agent-state inbox marcus --json` lists them.
fn mailbox(env: &Env) -> Vec<Value> {
    let out = env.ok(&["inbox", "marcus", "--json"]);
    let v: Value = serde_json::from_str(&out).expect("inbox --json");
    v["waiting"]
        .as_array()
        .map(|w| w.iter().map(|e| e["message"].clone()).collect())
        .unwrap_or_default()
}

// ---- spawn failures --------------------------------------------------------------------

#[test]
fn a_missing_command_is_agent_not_found_escalated_once_and_held_without_a_retry_storm() {
    let env = Env::with_config("");
    let missing = env.tmp("no-such-claude");
    env.set_config(&config(&missing, "retry_delay = \"1m\"", ""));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "AGENT_NOT_FOUND is recorded", || {
        count(&env, "AGENT_NOT_FOUND") == 1
    });
    // A burst of messages does not turn into a burst of failed spawns.
    for i in 0..5 {
        send(&env, "theseus", "rio", &format!("n{i}"));
    }
    // Proof the daemon handled those messages: one sent to theseus after
    // them (same command, so also not found) is recorded.
    send(&env, "marcus", "theseus", "later");
    d.wait_until(secs(10.0), "theseus's AGENT_NOT_FOUND", || {
        errors(&env)
            .iter()
            .any(|r| r["code"] == "AGENT_NOT_FOUND" && r["context"]["agent"] == "theseus")
    });
    let rio_not_found = errors(&env)
        .into_iter()
        .filter(|r| r["code"] == "AGENT_NOT_FOUND" && r["context"]["agent"] == "rio")
        .count();
    assert_eq!(rio_not_found, 1, "{:#?}", errors(&env));
    let record = errors(&env)
        .into_iter()
        .find(|r| r["code"] == "AGENT_NOT_FOUND")
        .unwrap();
    assert_eq!(record["severity"], "high");
    assert_eq!(record["context"]["agent"], "rio");
    assert!(
        record["message"]
            .as_str()
            .unwrap()
            .contains(&missing.display().to_string()),
        "names the path: {record}"
    );
    assert!(
        record["suggestions"][0]
            .as_str()
            .unwrap()
            .contains("npm install"),
        "an install hint: {record}"
    );
    assert_eq!(record["escalated"], true);
    // (theseus's own escalation, from the proof above, is from theseus.)
    let mail: Vec<Value> = mailbox(&env)
        .into_iter()
        .filter(|m| m["from"] != "theseus")
        .collect();
    assert_eq!(mail.len(), 1, "{mail:#?}");
    assert!(
        mail[0]["subject"]
            .as_str()
            .unwrap()
            .contains("AGENT_NOT_FOUND")
    );
    assert_eq!(mail[0]["from"], "rio", "answerable with send --to rio");
    // report.json's verdict is the final state: waited for, not read
    // once after the error (written before it, but read here on a busy
    // machine it must not hang on that ordering alone).
    d.wait_until(secs(10.0), "report.json says rio is held", || {
        state(&env, "rio", "report.json")["error"]["state"] == "disabled"
    });
    let report = state(&env, "rio", "report.json");
    assert_eq!(report["status"], "error");
    assert_eq!(report["error"]["code"], "AGENT_NOT_FOUND");
    // Held until the command can run: no automatic wake, and the messages
    // wait in the inbox unclaimed (unrunnable:: has the rest).
    assert_eq!(report["error"]["state"], "disabled", "{report}");
    assert!(report["next_wake_at"].is_null(), "{report}");
    assert_eq!(env.waiting("rio").len(), 5);
}

#[test]
fn a_command_without_execute_permission_disables_the_agent_until_a_manual_wake() {
    use std::os::unix::fs::PermissionsExt;
    let (env, runs) = setup("echo hi", "", "");
    let script = env.tmp("agent.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "AGENT_PERMISSION_DENIED is recorded", || {
        count(&env, "AGENT_PERMISSION_DENIED") == 1
    });
    // The final state is report.json's verdict: waited for (the error
    // before it is an earlier state).
    d.wait_until(secs(10.0), "report.json says rio is disabled", || {
        state(&env, "rio", "report.json")["error"]["state"] == "disabled"
    });
    let report = state(&env, "rio", "report.json");
    assert_eq!(
        report["error"]["code"], "AGENT_PERMISSION_DENIED",
        "{report}"
    );
    assert!(
        report["next_wake_at"].is_null(),
        "no automatic wake: {report}"
    );
    // Messages do not wake a disabled agent.
    send(&env, "theseus", "rio", "s");
    // Proof the daemon handled it: a message sent to theseus after it (the
    // same unrunnable command) is recorded as theseus's error.
    send(&env, "marcus", "theseus", "later");
    d.wait_until(secs(10.0), "theseus's AGENT_PERMISSION_DENIED", || {
        count(&env, "AGENT_PERMISSION_DENIED") == 2
    });
    let rio_denied = errors(&env)
        .into_iter()
        .filter(|r| r["code"] == "AGENT_PERMISSION_DENIED" && r["context"]["agent"] == "rio")
        .count();
    assert_eq!(rio_denied, 1, "{:#?}", errors(&env));
    assert_eq!(starts(&runs, "rio"), 0);
    d.wait_until(secs(10.0), "daemon.json says rio is disabled", || {
        d.heartbeat()["failing"]["rio"]
            .as_str()
            .unwrap_or_default()
            .starts_with("disabled")
    });
    // The operator fixes it and wakes it: it runs.
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "the fixed agent runs", || {
        starts(&runs, "rio") == 1
    });
    d.wait_until(secs(10.0), "success clears the error", || {
        state(&env, "rio", "report.json")["error"].is_null()
    });
}

// ---- how sessions end ------------------------------------------------------------------

#[test]
fn a_timeout_is_retried_twice_then_escalated_and_held_back() {
    let (env, runs) = setup(
        "echo \"attempt $(date +%s%N)\"\nsleep 30",
        "timeout = \"1s\"\nkill_grace = \"200ms\"",
        "",
    );
    let d = env.daemon();
    let t0 = Instant::now();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(15.0), "three attempts timed out", || {
        count(&env, "SESSION_TIMEOUT") == 3
    });
    retries_over(&env, &d);
    assert_eq!(starts(&runs, "rio"), 3, "one session and two retries");
    assert!(
        t0.elapsed() >= secs(3.9),
        "retries wait: {:?}",
        t0.elapsed()
    );
    let recs: Vec<Value> = errors(&env)
        .into_iter()
        .filter(|r| r["code"] == "SESSION_TIMEOUT")
        .collect();
    let attempts: Vec<u64> = recs
        .iter()
        .map(|r| r["context"]["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts, [1, 2, 3]);
    assert_eq!(recs[2]["escalated"], true);
    assert_ne!(recs[0]["escalated"], true);
    d.wait_until(secs(10.0), "report.json says rio backs off", || {
        state(&env, "rio", "report.json")["error"]["state"] == "backoff"
    });
    let report = state(&env, "rio", "report.json");
    assert_eq!(report["status"], "error");
    assert_eq!(report["error"]["failures"], 3);
    assert_eq!(report["last_session"]["outcome"], "timeout");
    assert_eq!(mailbox(&env).len(), 1);
}

#[test]
fn an_agent_that_prints_nothing_is_retried_three_times_then_an_error() {
    let (env, runs) = setup("exit 0", "", "");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(15.0), "four silent attempts", || {
        count(&env, "SESSION_EMPTY_OUTPUT") == 4
    });
    retries_over(&env, &d);
    assert_eq!(starts(&runs, "rio"), 4);
    d.wait_until(secs(10.0), "report.json says rio is in error", || {
        state(&env, "rio", "report.json")["status"] == "error"
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(
        s["status"], "error",
        "exit 0 with no output is not a success"
    );
    assert!(
        s["reason"].as_str().unwrap().contains("printed nothing"),
        "{s}"
    );
}

#[test]
fn the_same_output_on_a_retry_is_a_loop_stopped_and_escalated_at_once() {
    let (env, runs) = setup(
        "echo 'I will now think very hard.'\nsleep 30",
        "timeout = \"1s\"\nkill_grace = \"200ms\"\ntimeout_retries = 5",
        "",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "SESSION_LOOP", || {
        count(&env, "SESSION_LOOP") == 1
    });
    retries_over(&env, &d);
    assert_eq!(
        starts(&runs, "rio"),
        2,
        "stopped after the repeat, not 6 attempts"
    );
    let r = errors(&env)
        .into_iter()
        .find(|r| r["code"] == "SESSION_LOOP")
        .unwrap();
    assert_eq!(r["escalated"], true);
    assert_eq!(r["severity"], "high");
    assert!(
        mailbox(&env)
            .iter()
            .any(|m| m["subject"].as_str().unwrap().contains("SESSION_LOOP"))
    );
}

#[test]
fn a_silent_session_is_reported_stalled_and_stopped() {
    let (env, runs) = setup(
        "echo working\nsleep 30",
        "stall_timeout = \"1s\"\nstall_action = \"stop\"\ntimeout_retries = 0",
        "",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "the stalled session ended", || {
        state(&env, "rio", "session.json")["status"] == "error"
    });
    assert!(count(&env, "SESSION_STALLED") >= 1, "{:#?}", errors(&env));
    assert_eq!(starts(&runs, "rio"), 1);
    let s = state(&env, "rio", "session.json");
    assert!(s["reason"].as_str().unwrap().contains("stalled"), "{s}");
}

#[test]
fn a_flood_of_gigabytes_is_truncated_and_recorded_low() {
    let (env, _runs) = setup(
        "head -c 1073741824 /dev/zero | tr '\\0' 'x'\necho done",
        // A gigabyte through `tr` takes over 30 s on a loaded 2-core
        // machine: the session's own timeout must not be what is tested.
        "max_output = \"64KiB\"\ntimeout = \"15m\"",
        "",
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(900.0), "the flooding session completed", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    d.wait_until(secs(5.0), "OUTPUT_TRUNCATED is recorded", || {
        count(&env, "OUTPUT_TRUNCATED") == 1
    });
    let r = errors(&env)
        .into_iter()
        .find(|r| r["code"] == "OUTPUT_TRUNCATED")
        .unwrap();
    assert_eq!(r["severity"], "low");
    assert!(r["message"].as_str().unwrap().contains("1073741829"), "{r}");
    let log = std::fs::metadata(env.root.join("rio/sessions").join(format!(
        "{}.log",
        state(&env, "rio", "session.json")["session_id"].as_str().unwrap()
    )))
    .unwrap();
    assert!(log.len() < 70 * 1024, "the log is capped: {}", log.len());
    // The daemon's memory stayed small while it read a gigabyte.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid)).unwrap();
    let hwm: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(hwm < 64 * 1024, "peak RSS {hwm} KiB");
}

#[test]
fn plain_failures_back_off_escalate_after_three_and_a_success_clears_them() {
    let flag = "fail-flag";
    let (env, runs) = setup(
        &format!(
            "echo trying\n[ -e {flag} ] && {{ echo 'cd: /work/rio: No such file or directory' >&2; echo >&2; exit 3; }}\necho fine"
        ),
        "",
        "",
    );
    // The script runs in rio's directory: the flag lives there.
    let flag_path = env.root.join("rio").join(flag);
    let d = env.daemon();
    std::fs::write(&flag_path, "").unwrap();
    for n in 1..=3 {
        env.ok(&["wake", "rio"]);
        d.wait_until(secs(5.0), "the failure is recorded", || {
            count(&env, "SESSION_FAILED") == n
        });
    }
    let recs: Vec<Value> = errors(&env)
        .into_iter()
        .filter(|r| r["code"] == "SESSION_FAILED")
        .collect();
    let escalated: Vec<bool> = recs.iter().map(|r| r["escalated"] == true).collect();
    assert_eq!(escalated, [false, false, true]);
    // session.json says why in the command's own last words on stderr.
    let session = state(&env, "rio", "session.json");
    assert_eq!(
        session["reason"],
        "the session command exited with status 3; its stderr ends: cd: /work/rio: No such file or directory",
        "{session:#}"
    );
    d.wait_until(secs(10.0), "report.json says rio backs off", || {
        let r = state(&env, "rio", "report.json");
        r["error"]["state"] == "backoff" && r["error"]["failures"] == 3
    });
    let report = state(&env, "rio", "report.json");
    assert!(report["error"]["until"].is_string(), "{report}");
    assert!(
        report["next_wake_at"].is_null(),
        "rio has no schedule: {report}"
    );
    // Messages wait out the backoff (300ms, 600ms, 1.2s: held ~1.2 s now).
    std::fs::remove_file(&flag_path).unwrap();
    send(&env, "theseus", "rio", "s");
    d.wait_until(secs(10.0), "the held-back wake ran and succeeded", || {
        state(&env, "rio", "session.json")["status"] == "completed"
            && state(&env, "rio", "report.json")["error"].is_null()
    });
    assert_eq!(starts(&runs, "rio"), 4);
    let report = state(&env, "rio", "report.json");
    assert!(report["error"].is_null(), "{report}");
    assert_eq!(report["status"], "idle");
    // status shows the errors of the last 30 days.
    let status: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rio = status
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "rio")
        .unwrap();
    assert_eq!(rio["error_records_30d"], 3);
    assert_eq!(rio["last_error"]["code"], "SESSION_FAILED");
    let text = env.ok(&["status"]);
    assert!(text.contains("ERRORS/30D"), "{text}");
}

// ---- the on-error hook -----------------------------------------------------------------

#[test]
fn the_on_error_hook_gets_the_error_and_its_own_failure_is_logged_not_fatal() {
    let env = Env::with_config("");
    let seen = env.tmp("hook-seen");
    let hook = env.script(
        "on-error.sh",
        &format!(
            "env | grep '^AGENT_STATE_ERROR_' | sort > {seen:?}.$$\nmv {seen:?}.$$ {seen:?}\nexit 7",
            seen = seen.display().to_string()
        ),
    );
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $AGENT_STATE_SESSION_ID\" >> {:?}\necho oops\n[ \"$1\" = theseus ] || exit 3",
            runs.display().to_string()
        ),
    );
    env.set_config(&config(
        &script,
        "",
        &format!(
            "on_error = {:?}\ntimeout = \"5s\"",
            hook.display().to_string()
        ),
    ));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the hook ran", || seen.exists());
    let text = std::fs::read_to_string(&seen).unwrap();
    assert!(
        text.contains("AGENT_STATE_ERROR_CODE=SESSION_FAILED"),
        "{text}"
    );
    assert!(text.contains("AGENT_STATE_ERROR_AGENT=rio"), "{text}");
    assert!(text.contains("AGENT_STATE_ERROR_SEVERITY=medium"), "{text}");
    assert!(text.contains("AGENT_STATE_ERROR_SESSION=2"), "{text}");
    assert!(
        text.contains("AGENT_STATE_ERROR_MESSAGE=rio: the session command exited with code 3"),
        "{text}"
    );
    d.wait_until(secs(5.0), "HOOK_FAILED is recorded", || {
        count(&env, "HOOK_FAILED") == 1
    });
    let r = errors(&env)
        .into_iter()
        .find(|r| r["code"] == "HOOK_FAILED")
        .unwrap();
    assert!(r["details"].as_str().unwrap().contains("7"), "{r}");
    // Not run for its own failure: one hook run, one HOOK_FAILED.
    // And the daemon goes on: theseus still runs (after which a second
    // HOOK_FAILED would have been recorded).
    theseus_ran_after(&env, &d, &runs);
    assert_eq!(count(&env, "HOOK_FAILED"), 1);
}

#[test]
fn a_hook_that_hangs_is_killed_at_its_time_limit() {
    let env = Env::with_config("");
    let pidfile = env.tmp("hook.pid");
    let hook = env.script(
        "on-error.sh",
        &format!(
            "echo $$ > {:?}\nexec sleep 300",
            pidfile.display().to_string()
        ),
    );
    let script = env.script("agent.sh", "echo oops\nexit 3");
    env.set_config(&config(
        &script,
        "",
        &format!(
            "on_error = {:?}\ntimeout = \"1s\"",
            hook.display().to_string()
        ),
    ));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(8.0), "HOOK_FAILED for the time limit", || {
        errors(&env).iter().any(|r| {
            r["code"] == "HOOK_FAILED"
                && r["details"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("hooks.timeout")
        })
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        poll_until(secs(2.0), || !crate::support::process_alive(pid)),
        "the hook was killed"
    );
}

// ---- state faults ----------------------------------------------------------------------

#[test]
fn corrupt_state_files_are_set_aside_and_rebuilt_while_other_agents_run_on() {
    let (env, runs) = setup("echo working", "", "");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // Its end fully carried out (report.json, metrics.json) before they
    // are torn below.
    d.wait_until(secs(5.0), "a first session", || {
        state(&env, "rio", "session.json")["status"] == "completed" && d.idle()
    });
    env.ok(&["task", "add", "rio", "--description", "keep me"]);
    let first_instance = state(&env, "rio", "report.json")["instance"].clone();
    assert_eq!(first_instance, "rio-001");
    for f in ["report.json", "tasks.json", "metrics.json"] {
        std::fs::write(env.root.join("rio").join(f), "{ torn").unwrap();
    }
    std::fs::write(env.root.join(".daemon/counters.json"), "garbage").unwrap();
    env.ok(&["wake", "theseus"]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "both ran again", || {
        starts(&runs, "rio") == 2 && starts(&runs, "theseus") == 1
    });
    d.wait_until(secs(5.0), "rio's second session completed", || {
        state(&env, "rio", "report.json")["last_session"]["outcome"] == "completed"
            && state(&env, "rio", "report.json")["instance"] == "rio-002"
    });
    // Set aside, not lost.
    let aside: Vec<String> = std::fs::read_dir(env.root.join("rio"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".corrupt-"))
        .collect();
    for f in ["report.json", "tasks.json", "metrics.json"] {
        assert!(
            aside.iter().any(|a| a.starts_with(f)),
            "{f} set aside: {aside:?}"
        );
    }
    let tasks = env.json("rio", "tasks.json");
    assert!(
        tasks["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["description"] == "keep me"),
        "tasks rebuilt from the journal: {tasks}"
    );
    d.wait_until(secs(3.0), "STATE_CORRUPT recorded", || {
        count(&env, "STATE_CORRUPT") >= 4
    });
}

#[test]
fn an_invalid_config_on_reload_is_config_invalid_and_lists_every_problem() {
    let (env, _runs) = setup("echo hi", "", "");
    let d = env.daemon();
    let good = std::fs::read_to_string(&env.config).unwrap();
    let bad = good
        .replace("timeout = \"30s\"", "timeout = \"soon\"")
        .replace("max_concurrent_sessions = 2", "max_concurrent_sessions = 0");
    std::fs::write(&env.config, bad).unwrap();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    // The CLI refuses the broken config too: read the log file itself.
    let log = env.root.join(".daemon/errors.jsonl");
    let config_invalid = || -> Vec<Value> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["code"] == "CONFIG_INVALID")
            .collect()
    };
    d.wait_until(secs(5.0), "CONFIG_INVALID recorded", || {
        config_invalid().len() == 1
    });
    let r = config_invalid().remove(0);
    std::fs::write(&env.config, &good).unwrap();
    let details = r["details"].as_str().unwrap();
    assert!(details.contains("defaults.timeout"), "{details}");
    assert!(
        details.contains("daemon.max_concurrent_sessions"),
        "{details}"
    );
    // The old config stays in force.
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "rio still runs", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
}

// ---- the real Claude Code CLI ----------------------------------------------------------

/// `claude -p --output-format json` without credentials: `is_error` with
/// "Not logged in". Needs the CLI from npm (`.ci/run` installs it and sets
/// AGENT_STATE_CLAUDE_BIN).
#[test]
fn the_real_claude_cli_without_credentials_is_login_required_never_retried() {
    let Ok(claude) = std::env::var("AGENT_STATE_CLAUDE_BIN") else {
        eprintln!(
            "SKIPPED: set AGENT_STATE_CLAUDE_BIN to the Claude Code CLI (npm install @anthropic-ai/claude-code)"
        );
        return;
    };
    let env = Env::with_config("");
    let home = env.tmp("home");
    std::fs::create_dir(&home).unwrap();
    // HOME without credentials; no API key in the environment.
    let script = env.script(
        "claude-session.sh",
        &format!(
            "unset ANTHROPIC_API_KEY CLAUDE_CODE_OAUTH_TOKEN\nexport HOME={home:?}\nexec {claude:?} -p --output-format json --model \"$1\"",
            home = home.display().to_string()
        ),
    );
    let body = config(&script, "", "").replace("\"{agent}\"]", "\"{model}\"]");
    env.set_config(&body);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(60.0), "AGENT_LOGIN_REQUIRED", || {
        count(&env, "AGENT_LOGIN_REQUIRED") == 1
    });
    d.wait_until(secs(10.0), "report.json says rio is held", || {
        let state = state(&env, "rio", "report.json")["error"]["state"].clone();
        state == "backoff" || state == "disabled"
    });
    assert_eq!(count(&env, "AGENT_LOGIN_REQUIRED"), 1, "no retries");
    let r = errors(&env)
        .into_iter()
        .find(|r| r["code"] == "AGENT_LOGIN_REQUIRED")
        .unwrap();
    assert_eq!(r["severity"], "critical");
    assert!(
        r["message"].as_str().unwrap().contains("Not logged in"),
        "{r}"
    );
    assert_eq!(r["escalated"], true);
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "error");
    assert_eq!(s["cost_usd"], 0.0, "the JSON result's total_cost_usd: {s}");
    assert_eq!(s["tokens_used"], 0);
    assert!(s["usage"].is_object(), "{s}");
    assert!(mailbox(&env).iter().any(|m| {
        m["subject"]
            .as_str()
            .unwrap()
            .contains("AGENT_LOGIN_REQUIRED")
    }));
}

#[test]
fn a_backoff_pushes_the_scheduled_wake_back() {
    let (env, _runs) = setup(
        "echo trying\nexit 3",
        "schedule = \"* * * * *\"\nretry_delay = \"10m\"",
        "",
    );
    let d = env.daemon();
    let before = state(&env, "rio", "report.json")["next_wake_at"].clone();
    assert!(before.is_string(), "scheduled: {before}");
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the failure is recorded", || {
        count(&env, "SESSION_FAILED") == 1
    });
    d.wait_until(secs(5.0), "report.json shows the backoff", || {
        state(&env, "rio", "report.json")["error"]["state"] == "backoff"
    });
    let report = state(&env, "rio", "report.json");
    let until = report["error"]["until"].as_str().unwrap();
    assert_eq!(
        report["next_wake_at"].as_str(),
        Some(until),
        "the next wake is after the 10-minute backoff, not the next minute: {report}"
    );
    assert!(until > before.as_str().unwrap());
}

#[test]
fn a_torn_journal_line_is_reported_skipped_and_appended_after() {
    let (env, _runs) = setup("echo working", "", "");
    env.ok(&["bootstrap"]);
    let journal = env.root.join("rio/journal.jsonl");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"{\"ts\":\"2026-11-2"))
        .unwrap();
    let d = env.daemon();
    d.wait_until(secs(5.0), "JOURNAL_TORN is recorded", || {
        count(&env, "JOURNAL_TORN") == 1
    });
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the session completed", || {
        state(&env, "rio", "session.json")["status"] == "completed"
    });
    let text = std::fs::read_to_string(&journal).unwrap();
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).is_err())
        .collect();
    assert_eq!(bad, ["{\"ts\":\"2026-11-2"], "only the torn line is bad");
    assert!(text.ends_with('\n'));
}

// ---- Claude Code JSON results from a stand-in ------------------------------------------

/// A stand-in for `claude -p --output-format json` that prints `result` as
/// its JSON result line (with a fresh session id, as the real one has) and
/// exits with `code`.
fn fake_claude(env: &Env, result: &str, code: i32) -> PathBuf {
    env.script(
        "fake-claude.sh",
        &format!(
            "cat > /dev/null\nprintf '%s\\n' '{{\"type\":\"result\",\"session_id\":\"'$$-$(date +%s%N)'\",{result}}}'\nexit {code}"
        ),
    )
}

#[test]
fn an_api_overload_is_retried_with_backoff_then_escalated() {
    // (A 429 rate limit is not retried: it holds the credential, see
    // tests/it/economy.rs.)
    let env = Env::with_config("");
    let script = fake_claude(
        &env,
        r#""subtype":"success","is_error":true,"api_error_status":529,"result":"API Error: 529 overloaded_error","total_cost_usd":0"#,
        1,
    );
    env.set_config(&config(&script, "api_retries = 2", ""));
    let d = env.daemon();
    let t0 = Instant::now();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "three API errors", || {
        count(&env, "AGENT_API_ERROR") == 3
    });
    // retry_delay 300 ms, doubling: the retries come 0.3 s and 0.6 s apart.
    assert!(t0.elapsed() >= secs(0.9), "{:?}", t0.elapsed());
    let recs: Vec<Value> = errors(&env)
        .into_iter()
        .filter(|r| r["code"] == "AGENT_API_ERROR")
        .collect();
    assert_eq!(recs[2]["escalated"], true);
    assert!(
        recs[0]["message"].as_str().unwrap().contains("529"),
        "{}",
        recs[0]
    );
    retries_over(&env, &d);
    assert_eq!(count(&env, "AGENT_API_ERROR"), 3, "no fourth attempt");
}

#[test]
fn the_cost_and_tokens_of_a_json_result_go_into_session_json() {
    let env = Env::with_config("");
    let script = fake_claude(
        &env,
        r#""subtype":"success","is_error":false,"result":"Archived 2 sources.","total_cost_usd":0.4213,"num_turns":23,"usage":{"input_tokens":1200,"cache_creation_input_tokens":10,"cache_read_input_tokens":3000,"output_tokens":800}"#,
        0,
    );
    env.set_config(&config(&script, "", ""));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the session completed with its cost", || {
        let s = state(&env, "rio", "session.json");
        s["status"] == "completed" && s["cost_usd"].is_number()
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["cost_usd"], 0.4213);
    assert_eq!(s["tokens_used"], 5010);
    assert_eq!(s["usage"]["output_tokens"], 800);
    assert!(errors(&env).is_empty(), "{:#?}", errors(&env));
}

// ---- the health monitor and sessions run by scripts -----------------------------------

#[test]
fn a_script_session_whose_process_died_is_found_and_finished_by_the_monitor() {
    let (env, _runs) = setup("echo hi", "wake_on_inbox = \"never\"", "");
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    send(&env, "theseus", "rio", "s");
    // A session script (run by cron, not the daemon) that began a session,
    // claimed the message, and was then killed.
    let mut script = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = script.id().to_string();
    env.ok(&["session", "begin", "rio", "--owner-pid", &pid]);
    assert!(env.waiting("rio").is_empty(), "claimed by the session");
    script.kill().unwrap();
    script.wait().unwrap();
    d.wait_until(secs(5.0), "SESSION_INTERRUPTED", || {
        count(&env, "SESSION_INTERRUPTED") == 1
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "error", "{s}");
    assert!(
        s["reason"].as_str().unwrap().contains("process is gone"),
        "{s}"
    );
    assert_eq!(
        env.waiting("rio").len(),
        1,
        "its message is back in the inbox"
    );
}

#[test]
fn an_escalation_is_not_repeated_after_a_daemon_restart() {
    let env = Env::with_config("");
    let missing = env.tmp("no-such-claude");
    env.set_config(&config(&missing, "", ""));
    {
        let d = env.daemon();
        env.ok(&["wake", "rio"]);
        d.wait_until(secs(5.0), "AGENT_NOT_FOUND is escalated", || {
            mailbox(&env).len() == 1
        });
    }
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(5.0), "the second AGENT_NOT_FOUND", || {
        count(&env, "AGENT_NOT_FOUND") == 2
    });
    retries_over(&env, &d);
    assert_eq!(
        mailbox(&env).len(),
        1,
        "escalated once per failure streak, restart or not"
    );
}
