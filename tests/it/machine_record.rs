//! A session's record decided by its live machine (issue 21): a script's
//! own `session end` is heard by the daemon as it happens (a watch on the
//! agent's directory while its session runs), so whichever ends the session
//! first — its script or the daemon's timeout, stop or shutdown — the
//! session gets one record, and it is the first one.

use crate::support::{BIN, Env, daemon_config, secs, state};

/// rio's script ends its own session (`session end`), says so in
/// `ended`, then runs `then` (a shell fragment). `defaults`: more
/// `[defaults]` keys. Bootstrapped.
fn setup(then: &str, defaults: &[(&str, &str)]) -> Env {
    setup_with(
        "session end \"$1\" --summary 'done by the script'",
        then,
        defaults,
    )
}

/// rio's script runs `agent-state HOOK` (its arguments: `$1` is the
/// agent), says so in `ended`, then runs `then`.
fn setup_with(hook: &str, then: &str, defaults: &[(&str, &str)]) -> Env {
    let env = Env::with_config("");
    let d = env.dir.path().display().to_string();
    let script = env.script(
        "agent.sh",
        &format!(
            "cat > /dev/null\necho working\n{BIN:?} --config \"$AGENT_STATE_CONFIG\" {hook} >/dev/null || exit 9\ntouch {d:?}/ended\n{then}\n"
        ),
    );
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

/// The script ended its session, then its process lingered (`sleep 30`)
/// past its 2 s timeout: the daemon ends the process (SIGTERM) but the
/// session is what its script recorded first — completed, once; no
/// `SESSION_TIMEOUT`, no retry. Before, the daemon heard of the script's
/// end only at the exit, after its timeout's SIGTERM, and judged the
/// session a timeout: a `SESSION_TIMEOUT` error record, report.json
/// "retrying", a second session 30 s later — for a session.json that says
/// completed.
#[test]
fn a_script_ended_session_that_lingers_past_its_timeout_is_completed_once() {
    let env = setup(
        "sleep 30",
        &[("timeout", "\"2s\""), ("kill_grace", "\"1s\"")],
    );
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(20), "rio's script ended its session", || {
        env.tmp("ended").exists()
    });
    let sid = state(&env, "rio", "session.json")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.wait_until(secs(30), "the daemon is done with rio's session", || {
        d.idle() && d.log_text().contains(&format!("session {sid} "))
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    assert_eq!(s["status"], "completed", "{s:#}");
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["event"], "session_end", "{ends:#?}");
    let errors = env.error_log();
    assert!(!errors.contains("SESSION_TIMEOUT"), "{errors}");
    let r = state(&env, "rio", "report.json");
    assert_eq!(r["summary"], "done by the script", "{r:#}");
    assert!(
        r["error"].is_null(),
        "no error, no retry: {:#}\n{}",
        r["error"],
        d.log_text()
    );
    let log = d.log_text();
    assert!(!log.contains("retrying in"), "{log}");
    // Its process was ended all the same.
    assert!(log.contains("sending SIGTERM"), "{log}");
}

/// The same with the script's own `session fail`: the session is the
/// failure its script recorded (SESSION_FAILED, in its words), once; not a
/// timeout. Before, it was judged a timeout (SESSION_TIMEOUT) though its
/// record said error with the script's reason.
#[test]
fn a_script_failed_session_that_lingers_past_its_timeout_is_its_failure() {
    let env = setup_with(
        "session fail \"$1\" --outcome error --reason 'no work tree'",
        "sleep 30",
        &[("timeout", "\"2s\""), ("kill_grace", "\"1s\"")],
    );
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(20), "rio's script failed its session", || {
        env.tmp("ended").exists()
    });
    let sid = state(&env, "rio", "session.json")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.wait_until(secs(30), "the daemon raised the session's error", || {
        d.idle() && env.error_log().contains("SESSION_")
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    assert_eq!(s["status"], "error", "{s:#}");
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["event"], "error", "{ends:#?}");
    let errors = env.error_log();
    assert!(!errors.contains("SESSION_TIMEOUT"), "{errors}");
    assert!(
        errors.contains("SESSION_FAILED") && errors.contains("no work tree"),
        "{errors}"
    );
}

/// With `verify`, the daemon holds the session's end: the script's own
/// `session end` in each run is its word, heard as it happens and kept;
/// the second run passes the verification and the daemon ends the session
/// once: one `session_end` under the daemon's id, the iterations and the
/// script's summary in session.json, each run's usage counted once.
#[test]
fn with_verify_a_script_that_ends_its_session_itself_is_one_session() {
    let result = r#"{"type":"result","subtype":"success","is_error":false,"result":"ok","total_cost_usd":0.25,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20}}"#;
    // The temp dir (the config's).
    let d = r#""$(dirname "$AGENT_STATE_CONFIG")""#;
    let env = setup(
        &format!(
            "N=$(( $(cat {d}/runs 2>/dev/null || echo 0) + 1 )); echo $N > {d}/runs\n[ $N -ge 2 ] && touch {d}/fixed\necho '{result}'"
        ),
        &[
            (
                "verify",
                r#"[["sh", "-c", "test -f \"$(dirname \"$AGENT_STATE_CONFIG\")/fixed\""]]"#,
            ),
            ("max_iterations", "3"),
        ],
    );
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(60), "rio's session ended with its iterations", || {
        let p = env.path("rio", "session.json");
        p.exists() && {
            let s = state(&env, "rio", "session.json");
            s["status"] != "running" && s["iterations"].is_object()
        }
    });
    d.wait_until(secs(20), "the daemon is done with rio's session", || {
        d.idle()
    });
    let s = state(&env, "rio", "session.json");
    let sid = s["session_id"].as_str().unwrap().to_string();
    assert_eq!(s["status"], "completed", "{s:#}\n{}", d.log_text());
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(s["iterations"]["verify_failures"], 1, "{s:#}");
    let journal = env.journal("rio");
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{journal:#?}");
    assert_eq!(ends[0]["event"], "session_end", "{journal:#?}");
    assert_eq!(ends[0]["session_id"], sid.as_str(), "{journal:#?}");
    assert_eq!(env.events("rio", "session_start").len(), 1, "{journal:#?}");
    // Each run's usage once: two runs of 120 tokens.
    assert_eq!(s["tokens_used"], 240, "{s:#}");
    let errors = env.error_log();
    assert!(errors.is_empty(), "{errors}");
}

/// What the daemon learned about the session it ends — the iterations,
/// the cost and token breakdown from Claude Code's result, the signal
/// block at the end of the output — is in the same write of session.json
/// as the end. Before, each came in its own write after it, and a pipeline
/// that read session.json as soon as it said `completed` (watching the
/// directory, as this test does) saw the end without its cost.
#[test]
fn the_end_the_daemon_records_carries_what_it_learned_in_one_write() {
    use notify::Watcher;
    let result = r#"{"type":"result","subtype":"success","is_error":false,"result":"done\nAgent=Actor | Cycle=7 | Step=1 | Confidence=4 | Risk=low | Next=Judge","total_cost_usd":0.5,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":20}}"#;
    let env = Env::with_config("");
    let script = env.script(
        "agent.sh",
        &format!("cat > /dev/null\nprintf '%s\\n' '{result}'\n"),
    );
    let body = daemon_config(
        &script,
        &[],
        &[("verify", r#"[["true"]]"#)],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&body);
    env.ok(&["bootstrap"]);
    let dir = env.path("rio", "");
    let file = dir.join("session.json");
    // Every version of session.json, read as soon as it is renamed in.
    let (tx, versions) = std::sync::mpsc::channel();
    let mut watch = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(e) = e
            && e.paths.iter().any(|p| p.ends_with("session.json"))
            && let Ok(text) = std::fs::read_to_string(&file)
        {
            let _ = tx.send(text);
        }
    })
    .unwrap();
    watch
        .watch(&dir, notify::RecursiveMode::NonRecursive)
        .unwrap();
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    // Until one says the session ended.
    let mut seen: Vec<serde_json::Value> = Vec::new();
    while let Ok(text) = versions.recv_timeout(secs(120)) {
        let Ok(s) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let ended = s["status"].is_string() && s["status"] != "running";
        seen.push(s);
        if ended {
            break;
        }
    }
    drop(watch);
    let first = seen.last().expect("session.json was written");
    assert_eq!(first["status"], "completed", "{seen:#?}\n{}", d.log_text());
    assert_eq!(first["cost_usd"], 0.5, "{first:#}");
    assert_eq!(first["tokens_used"], 120, "{first:#}");
    assert_eq!(first["usage"]["input_tokens"], 100, "{first:#}");
    assert_eq!(first["iterations"]["count"], 1, "{first:#}");
    assert_eq!(first["signal_block"]["agent"], "Actor", "{first:#}");
    // And its usage journaled once, beside the end.
    d.wait_until(secs(20), "the daemon is done with rio's session", || {
        d.idle()
    });
    assert_eq!(
        env.events("rio", "session_usage").len(),
        1,
        "{:#?}",
        env.journal("rio")
    );
    assert_eq!(state(&env, "rio", "session.json"), *first);
}
