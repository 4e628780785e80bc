//! Continuing Claude Code's conversation (issue 12, `resume = true`): a
//! fake `claude` records its arguments; a verification retry and a retry
//! after a timeout pass `--resume` with the first run's id, a new session
//! after a login failure starts a new conversation.

use crate::support::*;
use std::time::Duration;

/// `mode`: `verify` (the check passes from the second run), `timeout` (the
/// first run outlives the timeout), `login` (the first run is not logged in).
fn setup(mode: &str) -> Env {
    let env = Env::with_config("");
    let d = env.dir.path().display().to_string();
    let script = env.script(
        "claude.sh",
        &format!(
            r#"D={d:?}
N=$(( $(cat "$D/runs" 2>/dev/null || echo 0) + 1 ))
echo "$@" > "$D/args-$N"
echo $N > "$D/runs"
cat > /dev/null
case {mode:?} in
  verify) [ $N -ge 2 ] && touch "$D/fixed" ;;
  timeout) [ $N = 1 ] && sleep 5 ;;
  fail1) if [ $N = 1 ]; then echo "it broke"; exit 1; fi ;;
  login) if [ $N = 1 ]; then
           echo '{{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login"}}'
           exit 1
         fi ;;
esac
echo '{{"type":"result","subtype":"success","is_error":false,"result":"done","num_turns":2}}'
"#
        ),
    );
    let fixed = env.tmp("fixed").display().to_string();
    let verify = format!(r#"[["sh", "-c", "test -f {fixed}"]]"#);
    let mut defaults = vec![
        (
            "command",
            format!(
                "[{:?}, \"-p\", \"{{claude_session}}\"]",
                script.display().to_string()
            ),
        ),
        ("resume", "true".to_string()),
        ("retry_delay", "\"200ms\"".to_string()),
        ("timeout", "\"1s\"".to_string()),
        ("kill_grace", "\"200ms\"".to_string()),
    ];
    if mode == "verify" {
        defaults.push(("verify", verify));
    }
    if mode == "fail1" {
        defaults.push(("escalate_after", "1".to_string()));
    }
    let defaults: Vec<(&str, &str)> = defaults.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.set_config(&daemon_config(
        &script,
        &[],
        &defaults,
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env
}

fn args(env: &Env, n: u32) -> Vec<String> {
    std::fs::read_to_string(env.tmp(&format!("args-{n}")))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn runs(env: &Env) -> u32 {
    std::fs::read_to_string(env.tmp("runs"))
        .map(|t| t.trim().parse().unwrap_or(0))
        .unwrap_or(0)
}

#[test]
fn resume_a_verification_retry_continues_the_conversation() {
    let env = setup("verify");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(15), "the session completed", || {
        let p = env.path("rio", "session.json");
        p.exists()
            && read_json(&p)["status"] == "completed"
            && read_json(&p)["claude_session_id"].is_string()
            && read_json(&p)["iterations"].is_object()
    });
    let first = args(&env, 1);
    assert_eq!(first[..2], ["-p", "--session-id"], "{first:?}");
    let id = first[2].clone();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(args(&env, 2), ["-p", "--resume", id.as_str()]);
    let s = read_json(&env.path("rio", "session.json"));
    assert_eq!(s["claude_session_id"], id.as_str());
    assert_eq!(s["iterations"]["count"], 2);
}

#[test]
fn resume_a_retry_after_a_timeout_continues_and_a_login_failure_does_not() {
    let env = setup("timeout");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(15), "the retry ran", || runs(&env) >= 2);
    d.wait_until(Duration::from_secs(10), "the retry completed", || {
        let p = env.path("rio", "session.json");
        p.exists()
            && read_json(&p)["status"] == "completed"
            && read_json(&p)["claude_resumed"] == true
    });
    let first = args(&env, 1);
    assert_eq!(first[1], "--session-id", "{first:?}");
    assert_eq!(args(&env, 2), ["-p", "--resume", first[2].as_str()]);
    drop(d);

    let env = setup("login");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(10),
        "the login failure is recorded",
        || {
            let p = env.path("rio", "session.json");
            p.exists() && read_json(&p)["status"] == "error"
        },
    );
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(10), "a second session ran", || {
        runs(&env) >= 2
    });
    let first = args(&env, 1);
    let second = args(&env, 2);
    assert_eq!(second[1], "--session-id", "a new conversation: {second:?}");
    assert_ne!(second[2], first[2]);
}

#[test]
fn resume_a_reply_to_a_sessions_escalation_continues_its_conversation() {
    let env = setup("fail1");
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // The failure is escalated to marcus, naming the session.
    let mut escalation = serde_json::Value::Null;
    d.wait_until(
        Duration::from_secs(10),
        "the failure reached marcus",
        || {
            let inbox = env.path("marcus", "inbox");
            std::fs::read_dir(inbox).is_ok_and(|dir| {
                dir.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .any(|e| {
                        escalation = read_json(&e.path());
                        true
                    })
            })
        },
    );
    let sid = read_json(&env.path("rio", "session.json"))["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let reference = format!("agent-state/session/{sid}");
    assert_eq!(escalation["source_ref"], reference.as_str(), "{escalation}");
    assert!(
        escalation["body"]
            .as_str()
            .unwrap()
            .contains(&format!("--source-ref {reference}")),
        "the escalation says how to reply: {escalation}"
    );
    let first = args(&env, 1);
    assert_eq!(first[1], "--session-id", "{first:?}");
    // marcus replies; the session it wakes continues the failed one's conversation.
    env.ok(&[
        "send",
        "--from",
        "marcus",
        "--to",
        "rio",
        "--subject",
        "Re: try the other source",
        "--source-ref",
        &reference,
    ]);
    d.wait_until(Duration::from_secs(10), "the reply woke rio", || {
        runs(&env) >= 2
    });
    assert_eq!(args(&env, 2), ["-p", "--resume", first[2].as_str()]);
    d.wait_until(Duration::from_secs(10), "it completed", || {
        read_json(&env.path("rio", "session.json"))["claude_resumed"] == true
    });
    // A message that is not a reply starts a new conversation.
    env.ok(&[
        "send",
        "--from",
        "marcus",
        "--to",
        "rio",
        "--subject",
        "something else",
    ]);
    d.wait_until(Duration::from_secs(10), "a third session ran", || {
        runs(&env) >= 3
    });
    let third = args(&env, 3);
    assert_eq!(third[1], "--session-id", "{third:?}");
    assert_ne!(third[2], first[2]);
}
