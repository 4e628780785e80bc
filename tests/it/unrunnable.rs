//! An agent whose command cannot be executed (missing, not executable):
//! its messages wait in `inbox/` untouched — not claimed, no attempt
//! counted, never set aside as undeliverable — while the agent is held,
//! and are delivered once the command can run (after a reload, a `wake`, or
//! by the health check alone). Through the real daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{Daemon, Env, state};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The most automatic wakes wait after a failure (`max_backoff`): the
/// messages must outlast several of these untouched.
const MAX_BACKOFF_MS: u64 = 200;

/// rio (under test, running `rio_command`), theseus (a healthy neighbour
/// whose sessions prove that time passed: each logs a line to `runs` and
/// takes 0.3 s) and marcus (the human mailbox); fast retries and backoff.
fn config(env: &Env, rio_command: &Path, rio: &str, health: &str) -> PathBuf {
    let runs = env.tmp("runs");
    let theseus = env.script(
        "theseus.sh",
        &format!(
            "echo \"$AGENT_STATE_SESSION_ID\" >> {:?}\nsleep 0.3\necho done",
            runs
        ),
    );
    env.set_config(&format!(
        r#"
[daemon]
max_concurrent_sessions = 2
shutdown_grace = "2s"

[defaults]
command = [{rio_command:?}, "{{agent}}"]
timeout = "30s"
kill_grace = "1s"
wake_on_inbox = "any"
inbox_debounce = "100ms"
retry_delay = "100ms"
spawn_retry_delay = "100ms"
max_backoff = "{MAX_BACKOFF_MS}ms"

[[agent]]
name = "rio"
{rio}

[[agent]]
name = "theseus"
command = [{theseus:?}, "{{agent}}"]

[[agent]]
name = "marcus"
kind = "human"

[health]
interval = "{health}"
"#,
        rio_command = rio_command.display().to_string(),
        theseus = theseus.display().to_string(),
    ));
    runs
}

/// rio's agent script: it records that it ran and with which prompt.
fn rio_body(env: &Env) -> String {
    format!(
        "cp \"$AGENT_STATE_PROMPT_FILE\" {:?}\necho done",
        env.tmp("rio-prompt")
    )
}

/// A message to rio, sent before the daemon starts; its id and its bytes
/// as `send` wrote them.
fn message_before_the_daemon(env: &Env, subject: &str) -> (String, Vec<u8>) {
    let id = env.send("theseus", "rio", &["--body", subject]);
    let bytes = inbox_bytes(env, &id).expect("the message is in the inbox");
    (id, bytes)
}

fn inbox_bytes(env: &Env, id: &str) -> Option<Vec<u8>> {
    std::fs::read(env.path("rio", &format!("inbox/{id}.json"))).ok()
}

/// Every record: some tests run the daemon on a faked clock (March 2026),
/// and records carry the daemon's time.
fn errors(env: &Env, code: &str) -> Vec<Value> {
    let out = env.ok(&["errors", "--json", "--since", "3650d"]);
    serde_json::from_str::<Vec<Value>>(&out)
        .expect("errors --json")
        .into_iter()
        .filter(|r| r["code"] == code)
        .collect()
}

/// rio's `wake_skipped` lines that refused a start for `cause`.
fn refusals(env: &Env, cause: &str) -> Vec<Value> {
    env.events("rio", "wake_skipped")
        .into_iter()
        .filter(|e| e["cause"] == cause)
        .collect()
}

/// Nothing of rio's mail was touched: each message in `inbox/` with the
/// bytes `send` wrote, nothing claimed, processed or set aside, no session.
fn untouched(env: &Env, messages: &[(String, Vec<u8>)]) {
    for (id, bytes) in messages {
        assert_eq!(
            inbox_bytes(env, id).as_ref(),
            Some(bytes),
            "message {id} in inbox/, byte for byte"
        );
    }
    assert!(
        env.files("rio", "inbox/rejected").is_empty(),
        "nothing in rejected/"
    );
    assert!(
        env.files("rio", "inbox/processed").is_empty(),
        "nothing processed"
    );
    assert!(
        env.files("rio", "inbox/.claimed").is_empty(),
        "nothing claimed: {:?}",
        env.files("rio", "inbox/.claimed")
    );
    assert!(
        env.events("rio", "session_start").is_empty(),
        "no session began"
    );
}

/// Time passes while the daemon runs: `n` sessions of theseus, one after
/// the other, each at least 0.3 s. Returns how long they took.
fn theseus_sessions(env: &Env, d: &Daemon, runs: &Path, n: usize) -> Duration {
    let t0 = Instant::now();
    let before = lines(runs);
    let done = d.log_text().matches(" completed agent=theseus").count();
    for i in 1..=n {
        env.ok(&["wake", "theseus", "--wait", "10s"]);
        d.wait_until(secs(10.0), "theseus's session ran", || {
            lines(runs) >= before + i
        });
        // Ended as the daemon sees it (its end recorded, the slot free):
        // a wake while it records would be skipped as for a running one.
        d.wait_until(secs(10.0), "the daemon recorded theseus's end", || {
            d.log_text().matches(" completed agent=theseus").count() >= done + i
        });
    }
    t0.elapsed()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// rio's session delivered `ids` and completed.
fn delivered(env: &Env, d: &Daemon, ids: &[&str]) {
    d.wait_until(secs(15.0), "rio's session completed", || {
        env.events("rio", "session_end").len() == 1
    });
    // Acknowledged after the session_end line (its commit point).
    d.wait_until(secs(10.0), "the messages are in processed/", || {
        let processed = env.files("rio", "inbox/processed");
        ids.iter()
            .all(|id| processed.contains(&format!("{id}.json")))
    });
    assert!(env.waiting("rio").is_empty(), "{:?}", env.waiting("rio"));
    assert!(env.files("rio", "inbox/rejected").is_empty());
    let prompt = std::fs::read_to_string(env.tmp("rio-prompt")).expect("rio ran");
    assert!(
        prompt.contains("first"),
        "the prompt quotes the message:\n{prompt}"
    );
    d.wait_until(secs(10.0), "the success clears the error", || {
        state(env, "rio", "report.json")["error"].is_null()
    });
}

#[test]
fn a_missing_command_claims_nothing_and_its_mail_waits_until_a_reload_after_the_install() {
    let env = Env::with_config("");
    let command = env.tmp("rio-agent.sh");
    // The health check is too far away to matter here: the reload releases.
    let runs = config(&env, &command, "", "1h");
    env.ok(&["bootstrap"]);
    let first = message_before_the_daemon(&env, "first");
    let d = env.daemon();
    d.wait_until(secs(10.0), "the refused start is journaled", || {
        !refusals(&env, "agent_not_found").is_empty()
    });
    // The journal line comes last: the error and report.json are written.
    let recorded = errors(&env, "AGENT_NOT_FOUND");
    assert_eq!(recorded.len(), 1, "{recorded:#?}");
    let message = recorded[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&command.display().to_string()),
        "names the path: {message}"
    );
    assert!(message.contains("wait in the inbox"), "{message}");
    let report = state(&env, "rio", "report.json");
    assert_eq!(report["error"]["code"], "AGENT_NOT_FOUND", "{report}");
    assert_eq!(report["error"]["state"], "disabled", "held: {report}");
    assert!(
        report["next_wake_at"].is_null(),
        "no automatic wake: {report}"
    );
    untouched(&env, std::slice::from_ref(&first));

    // More mail, and several backoff periods: nothing is claimed, nothing
    // recorded again, nothing becomes undeliverable.
    let second = message_before_the_daemon(&env, "second");
    let took = theseus_sessions(&env, &d, &runs, 3);
    assert!(
        took > Duration::from_millis(4 * MAX_BACKOFF_MS),
        "several backoff periods passed: {took:?}"
    );
    untouched(&env, &[first.clone(), second.clone()]);
    assert_eq!(errors(&env, "AGENT_NOT_FOUND").len(), 1, "recorded once");
    d.wait_until(secs(10.0), "daemon.json says rio is held", || {
        d.heartbeat()["failing"]["rio"]
            .as_str()
            .unwrap_or_default()
            .starts_with("disabled")
    });

    // An operator's wake is answered: it could not start, nothing claimed.
    let out = env.run(&["wake", "rio", "--wait", "10s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("could not start (AGENT_NOT_FOUND)"), "{err}");
    assert!(out.stdout.is_empty(), "no session id: no session began");
    untouched(&env, &[first.clone(), second.clone()]);
    assert_eq!(errors(&env, "AGENT_NOT_FOUND").len(), 2);
    let mailbox: Value = serde_json::from_str(&env.ok(&["inbox", "marcus", "--json"])).unwrap();
    let escalations: Vec<&Value> = mailbox["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["message"]["subject"]
                .as_str()
                .is_some_and(|s| s.contains("AGENT_NOT_FOUND"))
        })
        .collect();
    assert_eq!(
        escalations.len(),
        1,
        "escalated once per streak: {mailbox:#}"
    );

    // Installed, then a reload: both messages are delivered in one session.
    env.script("rio-agent.sh", &rio_body(&env));
    env.ok(&["reload"]);
    delivered(&env, &d, &[&first.0, &second.0]);
}

#[test]
fn a_command_without_execute_permission_is_released_by_the_health_check_after_chmod() {
    let env = Env::with_config("");
    let command = env.tmp("rio-agent.sh");
    let runs = config(&env, &command, "", "1s");
    env.script("rio-agent.sh", &rio_body(&env));
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o644)).unwrap();
    env.ok(&["bootstrap"]);
    let first = message_before_the_daemon(&env, "first");
    let d = env.daemon();
    d.wait_until(secs(10.0), "the refused start is journaled", || {
        !refusals(&env, "agent_permission_denied").is_empty()
    });
    assert_eq!(errors(&env, "AGENT_PERMISSION_DENIED").len(), 1);
    assert_eq!(
        state(&env, "rio", "report.json")["error"]["state"],
        "disabled"
    );
    untouched(&env, std::slice::from_ref(&first));
    // Health checks (every second) and backoff periods pass: still held,
    // the error not recorded again, the message untouched.
    let took = theseus_sessions(&env, &d, &runs, 4);
    assert!(took > secs(1.2), "a health check came meanwhile: {took:?}");
    untouched(&env, std::slice::from_ref(&first));
    assert_eq!(errors(&env, "AGENT_PERMISSION_DENIED").len(), 1);

    // chmod +x and nothing else: the next health check releases rio.
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).unwrap();
    delivered(&env, &d, &[&first.0]);
    assert!(
        d.log_text().contains("its command can run now"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_scheduled_wake_of_an_agent_whose_command_is_missing_claims_nothing() {
    let env = Env::with_config("");
    let command = env.tmp("rio-agent.sh");
    config(
        &env,
        &command,
        "schedule = \"0 22 * * *\"\nwake_on_inbox = \"never\"",
        "1h",
    );
    env.ok(&["bootstrap"]);
    let first = message_before_the_daemon(&env, "first");
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T21:59:58Z")]);
    d.wait_until(secs(10.0), "the scheduled start is refused", || {
        refusals(&env, "agent_not_found")
            .iter()
            .any(|e| e["reason"] == "schedule")
    });
    untouched(&env, std::slice::from_ref(&first));
    assert_eq!(errors(&env, "AGENT_NOT_FOUND").len(), 1);
}

#[test]
fn a_spawn_that_fails_after_the_claim_returns_the_messages_without_counting_an_attempt() {
    let env = Env::with_config("");
    // rio's command exists and is executable, and so is the interpreter
    // its #! line names; that interpreter's own interpreter does not exist.
    // The check before the claim looks one level deep: the claim happens,
    // the exec fails (as when the file vanishes between check and exec).
    let interpreter = env.tmp("interp");
    std::fs::write(&interpreter, "#!/no/such/interpreter\n").unwrap();
    std::fs::set_permissions(&interpreter, std::fs::Permissions::from_mode(0o755)).unwrap();
    let command = env.tmp("rio-agent");
    std::fs::write(
        &command,
        format!("#!{}\n{}\n", interpreter.display(), rio_body(&env)),
    )
    .unwrap();
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runs = config(&env, &command, "", "1s");
    env.ok(&["bootstrap"]);
    let first = message_before_the_daemon(&env, "first");
    let d = env.daemon();
    d.wait_until(secs(10.0), "the failed spawn is recorded", || {
        errors(&env, "AGENT_NOT_FOUND").len() == 1
    });
    d.wait_until(secs(10.0), "the session's end is recorded", || {
        env.events("rio", "error").len() == 1
    });
    let ended = &env.events("rio", "error")[0];
    assert_eq!(ended["code"], "AGENT_NOT_FOUND", "{ended}");
    assert_eq!(
        inbox_bytes(&env, &first.0).as_ref(),
        Some(&first.1),
        "back in inbox/ as it was: no attempt counted"
    );
    // Held: backoff periods and health checks pass without another try.
    theseus_sessions(&env, &d, &runs, 4);
    assert_eq!(env.events("rio", "session_start").len(), 1, "no retry");
    assert_eq!(inbox_bytes(&env, &first.0).as_ref(), Some(&first.1));
    assert!(env.files("rio", "inbox/rejected").is_empty());
    assert_eq!(errors(&env, "AGENT_NOT_FOUND").len(), 1);

    // The interpreter fixed (rio's own file unchanged), an operator's wake.
    std::fs::write(&interpreter, "#!/bin/sh\nexec /bin/sh \"$@\"\n").unwrap();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(15.0), "rio's second session completed", || {
        env.events("rio", "session_end").len() == 1
    });
    d.wait_until(secs(10.0), "the message is delivered", || {
        env.files("rio", "inbox/processed")
            .contains(&format!("{}.json", first.0))
    });
    assert!(env.files("rio", "inbox/rejected").is_empty());
}
