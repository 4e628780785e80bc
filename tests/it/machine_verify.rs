//! The iterations ordered by the session's live machine (issue 21): each
//! run's end and each verification are told to it, and it answers verify,
//! the next iteration (with its nudge) or the session's one record. The
//! real daemon, an agent whose command is a shell script, a `verify`
//! command that reads a file the runs make.

use crate::support::{BIN, Env, daemon_config, secs, state};

/// rio's script counts its runs in `runs` and runs `body` (a shell
/// fragment: `$N` is the run, `$D` the temp dir); its `verify` counts the
/// verifications in `verified`, waits while `hold` exists, and passes once
/// `fixed` exists. Bootstrapped.
fn setup(body: &str, max_iterations: u32) -> Env {
    let env = Env::with_config("");
    let d = env.dir.path().display().to_string();
    let script = env.script(
        "agent.sh",
        &format!(
            "cat > /dev/null\nD={d:?}\nN=$(( $(cat \"$D/runs\" 2>/dev/null || echo 0) + 1 )); echo $N > \"$D/runs\"\necho \"run $N\"\n{body}\n"
        ),
    );
    let verify = format!(
        r#"[["sh", "-c", "D={d}; echo x >> \"$D/verified\"; while [ -e \"$D/hold\" ]; do sleep 0.05; done; test -f \"$D/fixed\" || {{ echo 'fixed is missing' >&2; exit 1; }}"]]"#
    );
    let body = daemon_config(
        &script,
        &[],
        &[
            ("verify", &verify),
            ("max_iterations", &max_iterations.to_string()),
        ],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    );
    env.set_config(&body);
    env.ok(&["bootstrap"]);
    env
}

fn count(env: &Env, file: &str) -> usize {
    match std::fs::read_to_string(env.tmp(file)) {
        Ok(t) if file == "runs" => t.trim().parse().unwrap_or(0),
        Ok(t) => t.lines().count(),
        Err(_) => 0,
    }
}

/// A run whose script recorded `session fail` (and exited 0) did not end
/// well: its machine records the script's failure at once; it is neither
/// verified nor iterated. Before, the loop outside the machine verified
/// every exit 0, so the failing verification launched iterations 2 and 3
/// (three runs, three verifications) and the session was recorded as
/// VERIFY_FAILED, not as the failure its script reported (checked with the
/// previous commit's src/daemon).
#[test]
fn a_run_its_script_failed_is_neither_verified_nor_iterated() {
    let env = setup(
        &format!(
            "{BIN:?} --config \"$AGENT_STATE_CONFIG\" session fail \"$1\" --outcome error --reason 'no work tree' >/dev/null || exit 9"
        ),
        3,
    );
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(30), "the daemon raised the session's error", || {
        d.idle() && env.error_log().contains("SESSION_FAILED")
    });
    assert_eq!(count(&env, "runs"), 1, "one run");
    assert_eq!(count(&env, "verified"), 0, "no verification");
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "error", "{s:#}");
    assert_eq!(s["iterations"]["count"], 1, "{s:#}");
    assert_eq!(s["iterations"]["verify_failures"], 0, "{s:#}");
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert!(env.events("rio", "iteration_end").is_empty());
    let errors = env.error_log();
    assert!(errors.contains("no work tree"), "{errors}");
    assert!(!errors.contains("VERIFY_FAILED"), "{errors}");
}

/// A verification that fails, then one that passes: two runs, two
/// verifications, one session (completed, its iterations 2 with 1
/// failure), one `session_end`, no error record.
#[test]
fn a_verification_that_fails_then_passes_is_one_session_of_two_runs() {
    let env = setup("[ $N -ge 2 ] && touch \"$D/fixed\"\nexit 0", 3);
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(30), "the session ended", || {
        let s = state(&env, "rio", "session.json");
        d.idle() && s["status"].is_string() && s["status"] != "running"
    });
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "completed", "{s:#}");
    assert_eq!(s["iterations"]["count"], 2, "{s:#}");
    assert_eq!(s["iterations"]["verify_failures"], 1, "{s:#}");
    assert_eq!((count(&env, "runs"), count(&env, "verified")), (2, 2));
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["event"], "session_end", "{ends:#?}");
    let verdicts: Vec<String> = env
        .events("rio", "iteration_end")
        .iter()
        .map(|e| e["verify"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(verdicts, ["failed", "passed"]);
    assert_eq!(env.error_log(), "", "no error record");
}

/// `max_iterations = 1`: the one verification fails and the machine gives
/// up at once (VERIFY_FAILED, the command's failure in the reason); no
/// second run.
#[test]
fn out_of_iterations_is_verify_failed_after_the_last_run() {
    let env = setup("exit 0", 1);
    let d = env.daemon();
    env.send("marcus", "rio", &["--body", "please"]);
    d.wait_until(secs(30), "the daemon raised VERIFY_FAILED", || {
        d.idle() && env.error_log().contains("VERIFY_FAILED")
    });
    assert_eq!((count(&env, "runs"), count(&env, "verified")), (1, 1));
    let s = state(&env, "rio", "session.json");
    assert_eq!(s["status"], "error", "{s:#}");
    assert_eq!(s["iterations"]["count"], 1, "{s:#}");
    assert_eq!(env.session_ends("rio").len(), 1);
    let errors = env.error_log();
    assert!(errors.contains("fixed is missing"), "{errors}");
}

/// An operator's stop while the verification runs: the verification's
/// command is ended, the session recorded once as stopped (no failure, no
/// next iteration), its message back in the inbox.
#[test]
fn a_stop_during_verification_is_one_stopped_session_and_no_next_run() {
    let env = setup("exit 0", 3);
    std::fs::write(env.tmp("hold"), "").unwrap();
    let d = env.daemon();
    let id = env.send("marcus", "rio", &["--body", "please"]);
    let id = id.trim().to_string();
    d.wait_until(secs(30), "the verification runs", || {
        count(&env, "verified") == 1
    });
    let out = env.ok(&["stop", "rio", "--reason", "enough", "--wait"]);
    assert!(out.contains("stopped"), "{out}");
    d.wait_until(secs(30), "the session ended", || {
        let s = state(&env, "rio", "session.json");
        d.idle() && s["status"].is_string() && s["status"] != "running"
    });
    assert_eq!((count(&env, "runs"), count(&env, "verified")), (1, 1));
    let ends = env.session_ends("rio");
    assert_eq!(ends.len(), 1, "{ends:#?}");
    assert_eq!(ends[0]["code"], "SESSION_STOPPED", "{ends:#?}");
    assert!(
        ends[0]["messages_returned"].to_string().contains(&id),
        "{ends:#?} {id}"
    );
    assert!(env.events("rio", "iteration_start").is_empty());
    let errors = env.error_log();
    assert!(!errors.contains("VERIFY_FAILED"), "{errors}");
}
