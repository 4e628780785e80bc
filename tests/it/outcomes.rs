//! What a session's end counts as, and what `wake --wait` says happened
//! (issue 21): a usage limit is its own outcome, not an error (metrics.json,
//! `status`, the daemon's log), and `wake --wait` tells a refusal that will
//! pass (a budget, a held credential, a locked workspace: 75) from a
//! session that could not start (1) and from no daemon (69).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done","total_cost_usd":0.01}"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// What Claude Code prints when the subscription's limit is hit (the text
/// form `protocol/limits.rs` recognises; the reset, 1pm in Lisbon, is hours
/// away unless the clock is faked).
fn limit_fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/claude/limits/hit-your-limit.txt")
        .display()
        .to_string()
}

/// rio's command prints the usage limit and exits 1, every time.
fn limited_env() -> Env {
    let env = Env::with_config("");
    let script = env.script(
        "claude.sh",
        &format!("cat >/dev/null\ncat {:?}\nexit 1", limit_fixture()),
    );
    let config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    env
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

// ---- a usage limit is not an error ---------------------------------------------------------

#[test]
fn a_usage_limit_is_its_own_outcome_never_counted_as_an_error() {
    let env = limited_env();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // The end's journal line, then metrics.json counts it (same change).
    d.wait_until(secs(20), "the session's end is journaled", || {
        !env.events("rio", "error").is_empty()
    });
    d.wait_until(secs(10), "metrics.json counts the end", || {
        env.json("rio", "metrics.json")["lifetime"]["sessions_total"] == 1
    });
    let end = &env.events("rio", "error")[0];
    assert_eq!(end["code"], "USAGE_LIMIT", "{end}");
    assert_eq!(end["verdict"], "usage_limit", "{end}");

    // session.json keeps the seed's status, and says what it was.
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "error", "{session:#}");
    assert_eq!(session["verdict"], "usage_limit", "{session:#}");

    let metrics = env.json("rio", "metrics.json");
    let (lifetime, rolling) = (&metrics["lifetime"], &metrics["rolling_30d"]);
    assert_eq!(lifetime["sessions_error"], 0, "{metrics:#}");
    assert_eq!(lifetime["sessions_timeout"], 0, "{metrics:#}");
    assert_eq!(lifetime["sessions_usage_limited"], 1, "{metrics:#}");
    assert_eq!(rolling["sessions"], 1, "{metrics:#}");
    assert_eq!(rolling["usage_limited"], 1, "{metrics:#}");
    assert_eq!(rolling["error_rate"], 0.0, "{metrics:#}");
    // `metrics rebuild` (from the journal alone) agrees.
    env.ok(&["metrics", "rebuild", "rio"]);
    let rebuilt = env.json("rio", "metrics.json");
    assert_eq!(rebuilt["lifetime"]["sessions_error"], 0, "{rebuilt:#}");
    assert_eq!(rebuilt["lifetime"]["sessions_usage_limited"], 1);
    assert_eq!(rebuilt["rolling_30d"]["error_rate"], 0.0);

    // `status`: no failure in FAIL/30D, the agent not in error, the last
    // session named for what it was.
    d.wait_until(secs(10), "report.json says rio is held", || {
        env.json("rio", "report.json")["error"]["state"] == "held"
    });
    let report = env.json("rio", "report.json");
    assert_eq!(report["status"], "idle", "{report:#}");
    assert_eq!(
        report["last_session"]["verdict"], "usage_limit",
        "{report:#}"
    );
    let json: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rio = json
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "rio")
        .unwrap();
    assert_eq!(rio["errors_30d"], 0, "{rio:#}");
    assert_eq!(rio["usage_limited_30d"], 1, "{rio:#}");
    assert_eq!(rio["sessions_30d"], 1, "{rio:#}");
    let text = env.ok(&["status"]);
    // The credential's line comes first: rio waits for the limit's reset.
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.starts_with("credential default: held (usage limit)")),
        "{text}"
    );
    let header = text
        .lines()
        .find(|l| l.starts_with("AGENT "))
        .unwrap_or_else(|| panic!("{text}"));
    let row = text
        .lines()
        .find(|l| l.starts_with("rio "))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[1], "held", "{text}");
    assert_eq!(words[2], "usage_limit", "{text}");
    // FAIL/30D, right-aligned under its header (piped: nothing is cut).
    assert_eq!(column(header, row, "FAIL/30D"), "0", "{text}");
    assert_eq!(column(header, row, "SESS/30D"), "1", "{text}");

    // The daemon's log: a calm line saying what it was, no "error" line.
    let sid = session["session_id"].as_str().unwrap();
    d.wait_until(secs(5), "the end is logged", || {
        d.log_text()
            .contains(&format!("session {sid} stopped at the usage limit"))
    });
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(&format!("session {sid} stopped at the usage limit")))
        .unwrap();
    assert!(
        line.contains("not a failure") && line.contains("INFO"),
        "{line}"
    );
    assert!(
        !log.contains(&format!("session {sid} error")),
        "logged as an error: {log}"
    );
}

/// session.json is written from the session's typed outcome: a usage limit's
/// record carries the hold's own reason, and the message the session had
/// claimed goes back to the inbox without an attempt counted (the limit is
/// not the message's fault: three of them must not send it to rejected/).
#[test]
fn a_usage_limited_session_returns_its_message_without_counting_an_attempt() {
    let env = limited_env();
    let d = env.daemon();
    let id = env.send("marcus", "rio", &[]);
    d.wait_until(secs(20), "the session's end is journaled", || {
        !env.events("rio", "error").is_empty()
    });
    let end = &env.events("rio", "error")[0];
    assert_eq!(end["code"], "USAGE_LIMIT", "{end}");
    assert_eq!(end["messages_returned"], serde_json::json!([id]), "{end:#}");
    let back = env
        .files("rio", "inbox")
        .into_iter()
        .find(|f| f.contains(&id))
        .map(|f| read_json(&env.path("rio", &format!("inbox/{f}"))))
        .unwrap_or_else(|| panic!("{id} is not back in inbox/"));
    assert_eq!(back["attempts"].as_u64().unwrap_or(0), 0, "{back:#}");
    // The record says what it was, in the outcome's words, not the exit
    // status's (session.json is renamed in just after the journal line).
    d.wait_until(secs(10), "session.json records the end", || {
        env.json("rio", "session.json")["status"] != "running"
    });
    let session = env.json("rio", "session.json");
    let reason = session["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("limit"), "{session:#}");
    assert!(!reason.contains("exited with status"), "{session:#}");
    assert_eq!(session["verdict"], "usage_limit", "{session:#}");
}

/// The shipped session script's way: its EXIT trap records the failure
/// (`session fail`) before the daemon sees the output. The daemon's verdict
/// is added, and the counters follow it.
#[test]
fn a_usage_limit_its_script_recorded_as_a_failure_is_counted_as_one() {
    let env = Env::with_config("");
    let script = env.script(
        "session.sh",
        &format!(
            "cat >/dev/null
{bin:?} session begin rio >/dev/null
trap '{bin:?} session fail rio --session \"$AGENT_STATE_SESSION_ID\" --outcome error --reason \"claude exited 1\"' EXIT
cat {f:?}
exit 1",
            bin = BIN,
            f = limit_fixture()
        ),
    );
    let config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(20), "the daemon's verdict is journaled", || {
        !env.events("rio", "session_verdict").is_empty()
    });
    let end = &env.events("rio", "error")[0];
    assert_eq!(
        end["reason"], "claude exited 1",
        "the script's own record: {end}"
    );
    let amended = &env.events("rio", "session_verdict")[0];
    assert_eq!(amended["was"], "error", "{amended}");
    assert_eq!(amended["verdict"], "usage_limit", "{amended}");
    // Journaled first, then the files of the change renamed in together.
    d.wait_until(secs(10), "metrics.json counts the verdict", || {
        env.json("rio", "metrics.json")["lifetime"]["sessions_usage_limited"] == 1
    });
    let metrics = env.json("rio", "metrics.json");
    assert_eq!(metrics["lifetime"]["sessions_error"], 0, "{metrics:#}");
    assert_eq!(metrics["rolling_30d"]["error_rate"], 0.0, "{metrics:#}");
    env.ok(&["metrics", "rebuild", "rio"]);
    let rebuilt = env.json("rio", "metrics.json");
    assert_eq!(rebuilt["lifetime"]["sessions_error"], 0, "{rebuilt:#}");
    assert_eq!(
        rebuilt["lifetime"]["sessions_usage_limited"], 1,
        "{rebuilt:#}"
    );
    assert_eq!(env.json("rio", "session.json")["verdict"], "usage_limit");
    let json: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    let rio = json
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["agent"] == "rio")
        .unwrap();
    assert_eq!(rio["errors_30d"], 0, "{rio:#}");
    assert_eq!(rio["usage_limited_30d"], 1, "{rio:#}");
}

/// The cell of `row` under the right-aligned `title` of `header`.
fn column<'a>(header: &str, row: &'a str, title: &str) -> &'a str {
    let end = header.find(title).unwrap() + title.len();
    let start = header[..end - title.len()].trim_end().len();
    row.get(start..end).unwrap_or_default().trim()
}

// ---- wake --wait says what happened -------------------------------------------------------

#[test]
fn wake_wait_refused_by_a_budget_exits_75_naming_the_budget_and_its_end() {
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("cat >/dev/null\nprintf '%s\\n' '{RESULT}'\n"),
    );
    let config = daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\nbudget = { max_sessions = 1 }\n",
    );
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    env.ok(&["wake", "rio", "--wait", "10s"]);
    // Its end journaled and the daemon done with it (a wake before that
    // finds the session running: see the next test).
    d.wait_until(secs(10), "the first session is counted", || {
        env.events("rio", "session_end").len() == 1 && d.idle()
    });
    // Each later wake is refused, and each gets its answer (not only the
    // first: the daemon says a refused manual wake again).
    for n in 1..=2 {
        // (--wait returns with the answer; its bound is for a loaded machine.)
        let out = env.run(&["wake", "rio", "--wait", "60s"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(75), "wake {n}: {err}");
        assert!(
            err.contains("wake refused (budget)")
                && err.contains("max_sessions reached: 1 of 1")
                && err.contains("it runs at "),
            "wake {n}: {err}"
        );
        assert!(!err.contains("slots busy"), "{err}");
    }
    let refused: Vec<Value> = env
        .events("rio", "wake_skipped")
        .into_iter()
        .filter(|e| e["cause"] == "budget" && e["reason"] == "manual")
        .collect();
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert!(refused[0]["until"].is_string(), "{:#}", refused[0]);
    assert_eq!(env.events("rio", "session_start").len(), 1);
}

/// A wake while the agent's session runs is skipped (one follow-up comes
/// only if messages wait); `wake --wait` says so at once, naming the
/// session, instead of waiting out its bound and calling the wake queued.
#[test]
fn wake_wait_while_a_session_runs_exits_75_naming_it() {
    let env = Env::with_config("");
    let go = env.tmp("go");
    let script = env.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\nwhile [ ! -e {go:?} ]; do sleep 0.05; done\nprintf '%s\\n' '{RESULT}'\n"
        ),
    );
    let config = daemon_config(&script, &[], &[], "[[agent]]\nname = \"rio\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let first = env.ok(&["wake", "rio", "--wait", "30s"]);
    let first = first.trim();
    let asked = std::time::Instant::now();
    let out = env.run(&["wake", "rio", "--wait", "120s"]);
    let waited = asked.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains(&format!("session {first} is running"))
            && err.contains("this wake was skipped"),
        "{err}"
    );
    assert!(
        waited < secs(120),
        "answered by the journal, not the bound: {waited:?}"
    );
    std::fs::write(&go, "").unwrap();
    d.wait_until(secs(30), "the session ends", || {
        env.events("rio", "session_end").len() == 1 && d.idle()
    });
    // Nothing waited in the inbox: no follow-up session.
    assert_eq!(env.events("rio", "session_start").len(), 1);
}

#[test]
fn wake_wait_on_a_held_credential_exits_75_when_the_limit_still_holds() {
    let env = limited_env();
    let d = env.daemon();
    // The first session finds the limit: the credential is held (the reset
    // is hours away).
    env.run(&["wake", "rio", "--wait", "10s"]);
    d.wait_until(secs(20), "the usage limit holds the credential", || {
        std::fs::read_to_string(env.root.join(".daemon/economy.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|v| v["holds"]["groups"]["default"]["cause"] == "usage_limit")
    });
    // The operator tries (a manual wake runs through a hold): the session
    // finds the limit again, and `wake --wait` says the hold stands.
    // (--wait ends with the session; 20 s ran out on a loaded machine.)
    let out = env.run(&["wake", "rio", "--wait", "60s"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("stopped at the usage limit")
            && err.contains("credential default is still held until"),
        "{err}"
    );
    assert_eq!(env.events("rio", "session_start").len(), 2);
}

#[test]
fn wake_wait_on_a_locked_workspace_exits_75_naming_the_lock() {
    let env = Env::with_config("");
    let repo = git_repo(&env);
    let script = env.script("agent.sh", "cat >/dev/null\necho done");
    let config = daemon_config(
        &script,
        &[],
        &[(
            "workspace",
            &format!(
                "{{ repo = {:?}, branch = \"stuck\" }}",
                repo.display().to_string()
            ),
        )],
        "[[agent]]\nname = \"rio\"\n",
    );
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    // Somebody's git holds the new branch's ref lock, for good.
    std::fs::write(repo.join(".git/refs/heads/stuck.lock"), "").unwrap();
    let _d = env.daemon();
    let out = env.run(&["wake", "rio", "--wait", "60s"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("its workspace was refused (WORKSPACE_LOCKED)") && err.contains("stuck.lock"),
        "{err}"
    );
}

#[test]
fn wake_wait_exits_1_when_the_command_cannot_start_and_69_only_without_a_daemon() {
    let env = Env::with_config("");
    let missing = env.tmp("no-such-claude");
    let config = daemon_config(&missing, &[], &[], "[[agent]]\nname = \"rio\"\n");
    env.set_config(&config);
    env.ok(&["bootstrap"]);
    let out = env.run(&["wake", "rio", "--wait", "5s"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(stderr(&out).contains("no agent-state daemon is running"));
    let d = env.daemon();
    let out = env.run(&["wake", "rio", "--wait", "10s"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("could not start (AGENT_NOT_FOUND)"), "{err}");
    drop(d);
}
