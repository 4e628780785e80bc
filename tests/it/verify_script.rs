//! `verify` (the iteration loop) with the shipped session script, which
//! calls `session begin` / `session end` itself (issue 21): the script's own
//! end and the daemon's are two events into one session. Its first run's
//! `session end` does not close the session before verification; the
//! second run's `session begin` joins it; the daemon ends it once, after
//! verification, with the workspace and iteration data in session.json and
//! each run's usage counted once. The real daemon, the real
//! `ops/research-session.example.sh`, a fake `claude`, a real git repository.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// What the fake `claude` reports for each run: 1200 + 10 + 3000 + 800
/// tokens, $0.4213.
const RESULT_JSON: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"Archived a source on conditional AMMs.","session_id":"3f1c9a52-0d4e-4f57-9a0e-2b8f6f0e7a11","total_cost_usd":0.4213,"usage":{"input_tokens":1200,"cache_creation_input_tokens":10,"cache_read_input_tokens":3000,"output_tokens":800}}"#;
const RUN_TOKENS: u64 = 1200 + 10 + 3000 + 800;
const RUN_COST: f64 = 0.4213;

/// A stand-in for `claude -p PROMPT --model M --output-format json`, run by
/// the script in the session's worktree: each run counts itself in
/// `$FAKE_DIR/runs`, adds a note, and from its second run on writes
/// `fixed`, which the verification looks for. With `$FAKE_DIR/hang` it
/// hangs instead.
fn fake_claude() -> String {
    format!(
        r#"#!/bin/sh
N=$(( $(cat "$FAKE_DIR/runs" 2>/dev/null || echo 0) + 1 )); echo $N > "$FAKE_DIR/runs"
[ -e "$FAKE_DIR/hang" ] && exec sleep 60
echo "run $N" >> notes.md
[ $N -ge 2 ] && echo fixed > fixed
cat <<'JSON'
{RESULT_JSON}
JSON
"#
    )
}

/// A verification that says it runs (`$FAKE_DIR/verifying`), then waits
/// for `$FAKE_DIR/go` (at most 30 s), then passes.
const WAIT_FOR_GO: &str = r#"verify = [["sh", "-c", "touch \"$FAKE_DIR/verifying\"; i=0; while [ ! -e \"$FAKE_DIR/go\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"]]"#;

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("command -v {t}"))
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if !missing.is_empty() {
        eprintln!("SKIPPED: this test needs {missing:?} on PATH");
    }
    missing.is_empty()
}

/// rio runs `ops/research-session.example.sh rio` with a fake `claude`, in
/// a worktree of a fresh repository, with `defaults` added to its
/// `[defaults]` (e.g. `verify`). The daemon, started.
struct Lab {
    env: Env,
    fake: PathBuf,
}

impl Lab {
    fn new(defaults: &str) -> Option<Lab> {
        Lab::with_timeout(defaults, "120s")
    }

    fn with_timeout(defaults: &str, timeout: &str) -> Option<Lab> {
        if !have(&["bash", "git", "flock", "timeout"]) {
            return None;
        }
        let env = Env::with_config("");
        let repo = git_repo(&env);
        let fake = env.tmp("fake");
        for d in [&fake, &env.tmp("tmp"), &env.tmp("locks")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let claude = fake.join("claude");
        std::fs::write(&claude, fake_claude()).unwrap();
        std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = repo_file("ops/research-session.example.sh");
        env.set_config(&format!(
            r#"
[daemon]
shutdown_grace = "5s"

[defaults]
command = [{script:?}, "{{agent}}"]
timeout = "{timeout}"
kill_grace = "10s"
retry_delay = "1h"
workspace = {{ repo = {repo:?} }}
{defaults}

[[agent]]
name = "rio"

[[agent]]
name = "marcus"
kind = "human"
"#,
            script = script.display().to_string(),
            repo = repo.display().to_string(),
        ));
        env.ok(&["bootstrap"]);
        Some(Lab { env, fake })
    }

    fn daemon(&self) -> Daemon {
        let path = format!(
            "{}:{}",
            self.fake.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let tmp = self.env.tmp("tmp").display().to_string();
        let locks = self.env.tmp("locks").display().to_string();
        let fake = self.fake.display().to_string();
        Daemon::start(
            &self.env,
            &[
                ("PATH", path.as_str()),
                ("AGENT_STATE_BIN", BIN),
                ("LOCK_DIR", locks.as_str()),
                ("TMPDIR", tmp.as_str()),
                ("FAKE_DIR", fake.as_str()),
                ("KILL_GRACE", "2s"),
                ("GIT_AUTHOR_NAME", "Rio Agent"),
                ("GIT_AUTHOR_EMAIL", "rio@teleo.example"),
                ("GIT_COMMITTER_NAME", "Rio Agent"),
                ("GIT_COMMITTER_EMAIL", "rio@teleo.example"),
                ("GIT_CONFIG_GLOBAL", "/dev/null"),
                ("GIT_CONFIG_NOSYSTEM", "1"),
            ],
        )
    }

    fn runs(&self) -> u32 {
        std::fs::read_to_string(self.fake.join("runs"))
            .map(|t| t.trim().parse().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Wake rio and wait until the daemon has finished with its session:
    /// session.json ended, report.json no longer running it, the daemon's
    /// heartbeat naming no session. Its session.json.
    fn wake_and_wait(&self, d: &Daemon) -> Value {
        self.env.ok(&["wake", "rio"]);
        let env = &self.env;
        d.wait_until(Duration::from_secs(90), "rio's session ended", || {
            let s = state(env, "rio", "session.json");
            s["ended_at"].is_string() && s["status"] != "running"
        });
        d.wait_until(Duration::from_secs(20), "the daemon saw the end", || {
            state(env, "rio", "report.json")
                .get("lifecycle")
                .is_some_and(|l| l != "running")
                && !std::fs::read_to_string(env.root.join(".daemon/daemon.json"))
                    .unwrap_or_default()
                    .contains("\"session_id\"")
        });
        env.json("rio", "session.json")
    }

    fn errors(&self) -> Vec<Value> {
        serde_json::from_str(&self.env.ok(&["errors", "--json"])).expect("errors --json")
    }
}

/// Every journal line that names a session (`session_id`).
fn session_lines(env: &Env) -> Vec<Value> {
    env.journal("rio")
        .into_iter()
        .filter(|l| l.get("session_id").is_some())
        .collect()
}

fn near(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn verify_with_the_shipped_script_is_one_session_of_two_iterations() {
    let Some(lab) = Lab::new(
        r#"verify = [["sh", "-c", "test -f fixed || { echo 'fixed is missing' >&2; exit 1; }"]]
max_iterations = 3"#,
    ) else {
        return;
    };
    let message = lab.env.send("marcus", "rio", &[]);
    let d = lab.daemon();
    let s = lab.wake_and_wait(&d);
    let env = &lab.env;
    let journal = env.journal("rio");

    assert_eq!(lab.runs(), 2, "two runs of claude: {journal:#?}");
    assert_eq!(s["status"], "completed", "{s:#}");
    let sid = s["session_id"].as_str().unwrap().to_string();

    // One session: one start, one end, every line of it under the daemon's id.
    let starts = env.events("rio", "session_start");
    assert_eq!(starts.len(), 1, "one session_start: {journal:#?}");
    assert_eq!(starts[0]["session_id"], sid.as_str());
    let ends = env.events("rio", "session_end");
    assert_eq!(ends.len(), 1, "one session_end: {journal:#?}");
    assert_eq!(ends[0]["session_id"], sid.as_str());
    for line in session_lines(env) {
        assert_eq!(line["session_id"], sid.as_str(), "{journal:#?}");
    }
    assert!(env.events("rio", "error").is_empty(), "{journal:#?}");
    let errors = lab.errors();
    assert!(errors.is_empty(), "no error recorded: {errors:#?}");

    // The iterations, the workspace and the script's own record, together.
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(s["iterations"]["verify_failures"], 1, "{s:#}");
    assert_eq!(s["workspace"]["state"], "kept", "{s:#}");
    let branch = s["workspace"]["branch"].as_str().unwrap_or_default();
    assert!(!branch.is_empty(), "{s:#}");
    assert_eq!(
        s["branch"], branch,
        "the script's branch is the worktree's: {s:#}"
    );
    assert!(
        s["handoff_notes"]
            .as_str()
            .is_some_and(|h| h.contains("Archived a source")),
        "the script's handoff: {s:#}"
    );
    assert_eq!(ends[0]["messages_processed"], serde_json::json!([message]));
    assert!(env.waiting("rio").is_empty());
    let report = env.json("rio", "report.json");
    assert_eq!(report["last_session"]["id"], sid.as_str(), "{report:#}");
    assert_eq!(report["last_session"]["outcome"], "completed", "{report:#}");
    assert!(report["current_session"].is_null(), "{report:#}");

    // Usage: each of the two runs once.
    assert_eq!(s["tokens_used"], 2 * RUN_TOKENS, "{s:#}");
    assert!(near(&s["cost_usd"], 2.0 * RUN_COST), "{s:#}");
    assert_eq!(s["usage"]["output_tokens"], 2 * 800, "{s:#}");
    let usage = env.events("rio", "session_usage");
    assert!(usage.len() <= 1, "{usage:#?}");
    let used: Value =
        serde_json::from_str(&env.ok(&["usage", "--agent", "rio", "--json"])).unwrap();
    let text = used.to_string();
    assert!(
        text.contains(&format!("{}", 2 * RUN_TOKENS)),
        "`usage` counts both runs once each: {used:#}"
    );
    assert!(
        !text.contains(&format!("{}", 3 * RUN_TOKENS))
            && !text.contains(&format!("{}", 4 * RUN_TOKENS)),
        "{used:#}"
    );
    let metrics = env.json("rio", "metrics.json");
    assert_eq!(metrics["lifetime"]["sessions_total"], 1, "{metrics:#}");
    assert_eq!(metrics["lifetime"]["sessions_completed"], 1, "{metrics:#}");
    drop(d);
}

#[test]
fn verify_script_ended_session_without_verify_records_one_end() {
    let Some(lab) = Lab::new("") else { return };
    let d = lab.daemon();
    let s = lab.wake_and_wait(&d);
    let env = &lab.env;
    let journal = env.journal("rio");
    assert_eq!(lab.runs(), 1);
    assert_eq!(s["status"], "completed", "{s:#}");
    let sid = s["session_id"].as_str().unwrap();
    let ends = env.events("rio", "session_end");
    assert_eq!(ends.len(), 1, "one session_end: {journal:#?}");
    assert_eq!(ends[0]["session_id"], sid);
    // The script recorded it (its handoff, its figures), the daemon kept
    // the workspace beside it.
    assert!(ends[0]["handoff"].is_string(), "{journal:#?}");
    assert_eq!(ends[0]["tokens_used"], RUN_TOKENS, "{journal:#?}");
    assert_eq!(s["workspace"]["state"], "kept", "{s:#}");
    assert_eq!(s["tokens_used"], RUN_TOKENS, "{s:#}");
    for line in session_lines(env) {
        assert_eq!(line["session_id"], sid, "{journal:#?}");
    }
    assert!(s.get("iterations").is_none(), "{s:#}");
    assert!(lab.errors().is_empty());
}

/// Verification that never passes: the daemon gives up at `max_iterations`
/// and records the session's failure once, under its own id, though each
/// run's script said it completed; the message goes back to the inbox.
#[test]
fn verify_failing_with_the_shipped_script_records_one_failure_under_the_daemons_id() {
    let Some(lab) = Lab::new(
        r#"verify = [["sh", "-c", "echo 'never passes' >&2; exit 1"]]
max_iterations = 2"#,
    ) else {
        return;
    };
    let message = lab.env.send("marcus", "rio", &[]);
    let d = lab.daemon();
    let s = lab.wake_and_wait(&d);
    let env = &lab.env;
    let journal = env.journal("rio");
    assert_eq!(lab.runs(), 2, "{journal:#?}");
    assert_eq!(s["status"], "error", "{s:#}");
    let sid = s["session_id"].as_str().unwrap();
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("verification still failed after 2 iteration(s)")),
        "{s:#}"
    );
    assert_eq!(env.events("rio", "session_start").len(), 1, "{journal:#?}");
    assert!(env.events("rio", "session_end").is_empty(), "{journal:#?}");
    let failed = env.events("rio", "error");
    assert_eq!(failed.len(), 1, "{journal:#?}");
    assert_eq!(failed[0]["code"], "VERIFY_FAILED", "{journal:#?}");
    for line in session_lines(env) {
        assert_eq!(line["session_id"], sid, "{journal:#?}");
    }
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(s["workspace"]["state"], "kept", "{s:#}");
    assert_eq!(s["tokens_used"], 2 * RUN_TOKENS, "{s:#}");
    assert_eq!(env.waiting("rio"), vec![format!("{message}.json")]);
    d.wait_until(Duration::from_secs(10), "VERIFY_FAILED is recorded", || {
        std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
            .is_ok_and(|t| t.contains("VERIFY_FAILED"))
    });
    let errors = lab.errors();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0]["code"], "VERIFY_FAILED", "{errors:#?}");
    assert_eq!(errors[0]["context"]["session"], sid, "{errors:#?}");
}

/// While the daemon verifies, a person's `session fail` (not a process the
/// daemon started) ends the session at once, as before: only the session's
/// own script has its ends kept for the daemon.
#[test]
fn verify_script_a_hand_fail_while_the_daemon_verifies_ends_the_session() {
    let Some(lab) = Lab::new(WAIT_FOR_GO) else {
        return;
    };
    let d = lab.daemon();
    lab.env.ok(&["wake", "rio"]);
    let env = &lab.env;
    d.wait_until(Duration::from_secs(60), "the first run is verified", || {
        lab.fake.join("verifying").exists()
    });
    let s = env.json("rio", "session.json");
    assert_eq!(
        s["status"], "running",
        "held, not ended by the script: {s:#}"
    );
    assert_eq!(s["script_end"]["outcome"], "completed", "{s:#}");
    let sid = s["session_id"].as_str().unwrap().to_string();
    env.ok(&[
        "session",
        "fail",
        "rio",
        "--session",
        &sid,
        "--outcome",
        "error",
        "--reason",
        "stopped by hand",
    ]);
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "error", "{s:#}");
    assert_eq!(s["reason"], "stopped by hand", "{s:#}");
    assert!(s.get("script_end").is_none(), "{s:#}");
    std::fs::write(lab.fake.join("go"), "").unwrap();
    let s = lab.wake_and_wait(&d);
    assert_eq!(s["session_id"], sid.as_str());
    assert_eq!(s["status"], "error", "{s:#}");
    let journal = env.journal("rio");
    assert_eq!(env.events("rio", "error").len(), 1, "{journal:#?}");
    assert!(env.events("rio", "session_end").is_empty(), "{journal:#?}");
    assert_eq!(env.events("rio", "session_start").len(), 1, "{journal:#?}");
}

/// By hand (no daemon), the script ends its session itself, as always.
#[test]
fn verify_script_run_by_hand_ends_its_own_session() {
    let Some(lab) = Lab::new(r#"verify = [["false"]]"#) else {
        return;
    };
    let env = &lab.env;
    let path = format!(
        "{}:{}",
        lab.fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(repo_file("ops/research-session.example.sh"))
        .arg("rio")
        .env("PATH", path)
        .env("AGENT_STATE_BIN", BIN)
        .env("AGENT_STATE_CONFIG", &env.config)
        .env("REPO_DIR", env.tmp("repo"))
        .env("LOCK_DIR", env.tmp("locks"))
        .env("LOG_DIR", env.tmp("tmp"))
        .env("TMPDIR", env.tmp("tmp"))
        .env("FAKE_DIR", &lab.fake)
        .env("GIT_AUTHOR_NAME", "Rio Agent")
        .env("GIT_AUTHOR_EMAIL", "rio@teleo.example")
        .env("GIT_COMMITTER_NAME", "Rio Agent")
        .env("GIT_COMMITTER_EMAIL", "rio@teleo.example")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("AGENT_STATE_SESSION_ID")
        .env_remove("AGENT_STATE_PROMPT_FILE")
        .env_remove("AGENT_STATE_WORKSPACE")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "completed", "{s:#}");
    assert!(s.get("end_held_by_daemon").is_none(), "{s:#}");
    assert!(s.get("script_end").is_none(), "{s:#}");
    let ends = env.events("rio", "session_end");
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["session_id"], s["session_id"]);
    assert_eq!(ends[0]["tokens_used"], RUN_TOKENS);
}

/// The daemon's timeout in a held session: the script's trap records the
/// failure first (kept, in the daemon's outcome with both reasons), the
/// daemon's end records it once.
#[test]
fn verify_script_a_timeout_is_recorded_once_with_both_reasons() {
    let Some(lab) = Lab::with_timeout(r#"verify = [["true"]]"#, "3s") else {
        return;
    };
    std::fs::write(lab.fake.join("hang"), "").unwrap();
    let message = lab.env.send("marcus", "rio", &[]);
    let d = lab.daemon();
    let s = lab.wake_and_wait(&d);
    let env = &lab.env;
    let journal = env.journal("rio");
    assert_eq!(s["status"], "timeout", "{s:#}");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("timed out after 3s"), "{reason}");
    assert!(
        reason.contains("the session script reported") && reason.contains("SIGTERM"),
        "the script's words too: {reason}"
    );
    let sid = s["session_id"].as_str().unwrap();
    let timeouts = env.events("rio", "timeout");
    assert_eq!(timeouts.len(), 1, "{journal:#?}");
    assert!(env.events("rio", "error").is_empty(), "{journal:#?}");
    for line in session_lines(env) {
        assert_eq!(line["session_id"], sid, "{journal:#?}");
    }
    for key in ["script_end", "end_held_by_daemon", "ending_by_daemon"] {
        assert!(s.get(key).is_none(), "{key} is gone: {s:#}");
    }
    assert_eq!(env.waiting("rio"), vec![format!("{message}.json")]);
}

/// The daemon killed while it verifies a held session whose script said it
/// completed: the next daemon records the session as interrupted (no
/// verification passed), once, under its id, the script's kept word and
/// the hold gone, the message back in the inbox.
#[test]
fn verify_script_a_daemon_killed_while_verifying_leaves_an_interrupted_session() {
    let Some(lab) = Lab::new(WAIT_FOR_GO) else {
        return;
    };
    let message = lab.env.send("marcus", "rio", &[]);
    let mut d = lab.daemon();
    lab.env.ok(&["wake", "rio"]);
    let env = &lab.env;
    d.wait_until(Duration::from_secs(60), "the first run is verified", || {
        lab.fake.join("verifying").exists()
    });
    let s = env.json("rio", "session.json");
    assert_eq!(s["script_end"]["outcome"], "completed", "{s:#}");
    let sid = s["session_id"].as_str().unwrap().to_string();
    d.kill9();
    std::fs::write(lab.fake.join("go"), "").unwrap();
    let d = lab.daemon();
    d.wait_until(Duration::from_secs(30), "the session is recovered", || {
        state(env, "rio", "session.json")["status"] == "error"
    });
    let s = env.json("rio", "session.json");
    let journal = env.journal("rio");
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("interrupted")),
        "{s:#}"
    );
    for key in ["script_end", "end_held_by_daemon"] {
        assert!(s.get(key).is_none(), "{key} is gone: {s:#}");
    }
    assert_eq!(env.events("rio", "session_start").len(), 1, "{journal:#?}");
    assert_eq!(env.events("rio", "error").len(), 1, "{journal:#?}");
    assert!(env.events("rio", "session_end").is_empty(), "{journal:#?}");
    for line in session_lines(env) {
        assert_eq!(line["session_id"], sid.as_str(), "{journal:#?}");
    }
    assert_eq!(env.waiting("rio"), vec![format!("{message}.json")]);
}
