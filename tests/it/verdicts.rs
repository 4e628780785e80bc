//! A session's verdict as the operator sees it: an exit 0 is completed
//! whatever the command wrote on stderr, and a session that failed — even
//! by its own word, with no catalogue code — backs off instead of burning
//! its messages in a second.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

const MARCUS: &str = "\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// rio runs `body` (after reading its prompt); `defaults` override the
/// test config's `[defaults]`.
fn env_with(body: &str, defaults: &[(&str, &str)]) -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", &format!("cat >/dev/null\n{body}"));
    env.set_config(&daemon_config(
        &script,
        &[],
        defaults,
        &format!("[[agent]]\nname = \"rio\"\n{MARCUS}"),
    ));
    env.ok(&["bootstrap"]);
    env
}

/// The timestamps of rio's `session_start` lines.
fn starts(env: &Env) -> Vec<chrono::DateTime<chrono::Utc>> {
    env.events("rio", "session_start")
        .iter()
        .map(|e| {
            chrono::DateTime::parse_from_rfc3339(e["ts"].as_str().unwrap())
                .unwrap()
                .to_utc()
        })
        .collect()
}

#[test]
fn exit_0_with_a_warning_on_stderr_is_completed_and_its_message_processed() {
    // Claude Code, git and npm write to stderr when all is well.
    let env = env_with("echo out\necho \"some warning\" >&2\nexit 0", &[]);
    let d = env.daemon();
    let id = env.send("marcus", "rio", &[]);
    let message = format!("{id}.json");
    d.wait_until(secs(20), "the message is processed or rejected", || {
        !env.files("rio", "inbox/processed").is_empty()
            || !env.files("rio", "inbox/rejected").is_empty()
    });
    assert_eq!(env.files("rio", "inbox/processed"), [message]);
    assert!(env.files("rio", "inbox/rejected").is_empty());
    d.wait_until(secs(10), "report.json says idle", || {
        state(&env, "rio", "report.json")["status"] == "idle"
    });
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "completed", "{session:#}");
    assert!(
        !session.to_string().contains("some warning"),
        "stderr is no reason on a success: {session:#}"
    );
    let report = env.json("rio", "report.json");
    assert_eq!(report["last_session"]["outcome"], "completed", "{report:#}");
    assert!(report["error"].is_null(), "{report:#}");
    let metrics = env.json("rio", "metrics.json");
    assert_eq!(metrics["lifetime"]["sessions_completed"], 1, "{metrics:#}");
    assert_eq!(metrics["lifetime"]["sessions_error"], 0, "{metrics:#}");
    assert_eq!(starts(&env).len(), 1, "one session");
    assert!(env.events("rio", "error").is_empty());
}

#[test]
fn a_session_that_records_its_own_failure_and_exits_0_backs_off() {
    // The script says it failed (`session fail`), in its own words and with
    // no catalogue code, then exits 0 with output.
    let env = env_with(
        &format!(
            "echo working\n{BIN:?} session fail rio --outcome error --reason \"no work tree\"\nexit 0"
        ),
        &[("retry_delay", "\"2s\""), ("max_backoff", "\"1h\"")],
    );
    let d = env.daemon();
    let id = env.send("marcus", "rio", &[]);
    // Its message is tried three times (the third failure sets it aside),
    // each after the backoff: 2 s, then 4 s.
    d.wait_until(
        secs(60),
        "the message is set aside after three failures",
        || {
            !env.files("rio", "inbox/rejected").is_empty()
                && state(&env, "rio", "report.json")["error"]["failures"] == 3
        },
    );
    let t = starts(&env);
    assert_eq!(t.len(), 3, "three sessions: {t:?}");
    let gaps: Vec<i64> = t.windows(2).map(|w| (w[1] - w[0]).num_seconds()).collect();
    assert!(
        gaps[0] >= 2 && gaps[1] >= 4,
        "backoff 2 s then 4 s: {gaps:?} s"
    );
    let report = env.json("rio", "report.json");
    assert_eq!(report["error"]["code"], "SESSION_FAILED", "{report:#}");
    assert_eq!(report["error"]["state"], "backoff", "{report:#}");
    assert_eq!(report["error"]["failures"], 3, "{report:#}");
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "error");
    assert_eq!(session["reason"], "no work tree", "{session:#}");
    assert!(
        env.files("rio", "inbox/rejected")
            .contains(&format!("{id}.json")),
        "{:?}",
        env.files("rio", "inbox/rejected")
    );
    // The error is raised after report.json has the verdict: waited for.
    let failed = || {
        std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["code"] == "SESSION_FAILED")
            .count()
    };
    d.wait_until(secs(10), "three SESSION_FAILED records", || failed() >= 3);
    assert_eq!(failed(), 3);
}
