//! Issue 9 §3: one session per agent, whoever started it. The liveness of a
//! session's owner comes from its owner lock, not from seeing its process:
//! a daemon in a PID namespace of its own (as far from the script as a
//! sandbox can put it) never takes a script's live session for dead, and
//! does take a killed one for dead. `session end` without a session never
//! ends another live process's session; negative numbers are recorded as
//! bad arguments.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{BIN, Env, poll_until};

fn root_tests() -> bool {
    if std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() != Ok("1") {
        eprintln!("SKIPPED: set AGENT_STATE_ROOT_TESTS=1 (needs root: unshare --pid)");
        return false;
    }
    true
}

fn setup() -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo \"$1 at work\"");
    env.set_config(&format!(
        r#"[defaults]
command = [{script:?}, "{{agent}}"]
timeout = "60s"
kill_grace = "1s"
wake_on_inbox = "never"

[[agent]]
name = "rio"

[[agent]]
name = "marcus"
kind = "human"
"#,
        script = script.display().to_string()
    ));
    env.ok(&["bootstrap"]);
    env
}

/// The daemon in a PID namespace of its own: it cannot see (or signal)
/// any process outside, as under a sandbox.
struct NsDaemon(Child);

impl NsDaemon {
    fn start(env: &Env) -> NsDaemon {
        let log = std::fs::File::create(env.tmp("ns-daemon.log")).unwrap();
        let child = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                BIN,
                "--config",
            ])
            .arg(&env.config)
            .arg("daemon")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("AGENT_STATE_FAKE_NOW")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare(1)");
        let hb = env.root.join(".daemon/daemon.json");
        assert!(
            poll_until(Duration::from_secs(10), || hb.exists()),
            "the daemon in its namespace did not start:\n{}",
            std::fs::read_to_string(env.tmp("ns-daemon.log")).unwrap_or_default()
        );
        // Inside its namespace it is pid 1, and sees nobody else.
        let pid = crate::support::read_json(&hb)["pid"].as_i64();
        assert_eq!(pid, Some(1), "not in a PID namespace of its own");
        NsDaemon(child)
    }
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

/// A cron-style script: begin, sleep, end; prints its session id.
fn script(env: &Env, sleep: u32) -> (Child, String) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "SID=$('{BIN}' --config '{cfg}' session begin rio) || exit 9; echo \"$SID\"; sleep {sleep}; '{BIN}' --config '{cfg}' session end rio --session \"$SID\" --outcome completed >/dev/null",
            cfg = env.config.display()
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, line.trim().to_string())
}

#[test]
fn a_daemon_that_cannot_see_a_scripts_session_never_takes_it_for_dead() {
    if !root_tests() {
        return;
    }
    let env = setup();
    let _daemon = NsDaemon::start(&env);
    let (mut child, sid) = script(&env, 4);
    assert!(!sid.is_empty());
    // A wake while the script's session runs: skipped, not a second session.
    env.ok(&["wake", "rio"]);
    std::thread::sleep(Duration::from_secs(2));
    let session = env.json("rio", "session.json");
    assert_eq!(session["session_id"], sid.as_str(), "{session}");
    assert_eq!(session["status"], "running", "{session}");
    assert!(
        env.events("rio", "error").is_empty(),
        "{:?}",
        env.events("rio", "error")
    );
    assert_eq!(env.events("rio", "session_start").len(), 1);
    assert!(!env.events("rio", "wake_skipped").is_empty());
    // The script's own end succeeds and is the one recorded.
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the script's session end failed: {status:?}"
    );
    let session = env.json("rio", "session.json");
    assert_eq!(session["status"], "completed");
    assert_eq!(session["session_id"], sid.as_str());

    // A script killed mid-session: its owner lock is freed, and the next
    // wake records the session as interrupted and runs a new one.
    let (mut child, killed) = script(&env, 60);
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    env.ok(&["wake", "rio"]);
    assert!(
        poll_until(Duration::from_secs(10), || {
            env.events("rio", "error")
                .iter()
                .any(|e| e["session_id"] == killed.as_str())
                && env.events("rio", "session_end").len() >= 2
        }),
        "the killed script's session was not recovered:\n{:#?}",
        env.journal("rio")
    );
}

#[test]
fn end_without_a_session_never_ends_another_live_processs_session() {
    let env = setup();
    let (mut child, sid) = script(&env, 30);
    // Another process (a script that lost $SESSION) ends "the running one".
    for args in [
        vec!["session", "end", "rio", "--outcome", "completed"],
        vec![
            "session",
            "end",
            "rio",
            "--session",
            "",
            "--outcome",
            "completed",
        ],
        vec![
            "session",
            "fail",
            "rio",
            "--outcome",
            "error",
            "--reason",
            "x",
        ],
    ] {
        let err = env.fails(&args, 75);
        assert!(err.contains(&sid) && err.contains("--session"), "{err}");
    }
    assert_eq!(env.json("rio", "session.json")["status"], "running");
    // The real end, by name, is recorded (not "already ended").
    let out = env.ok(&[
        "session",
        "end",
        "rio",
        "--session",
        &sid,
        "--outcome",
        "completed",
    ]);
    assert!(!out.contains("already"), "{out}");
    assert_eq!(env.json("rio", "session.json")["status"], "completed");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn negative_numbers_are_bad_arguments_recorded_not_refused() {
    let env = setup();
    let sid = env.ok(&["session", "begin", "rio"]).trim().to_string();
    let out = env.run(&[
        "session",
        "end",
        "rio",
        "--session",
        &sid,
        "--outcome",
        "completed",
        "--cost-usd",
        "-1",
        "--tokens-used",
        "-5",
        "--sources-archived",
        "-3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let session = env.json("rio", "session.json");
    assert_eq!(
        session["status"], "completed",
        "the session was ended: {session}"
    );
    let bad: Vec<&str> = session["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["argument"].as_str())
        .collect();
    for flag in ["--cost-usd", "--tokens-used", "--sources-archived"] {
        assert!(bad.contains(&flag), "{flag} not recorded: {session}");
    }
}

#[test]
fn a_script_session_has_an_owner_lock_held_by_a_detached_keeper() {
    let env = setup();
    let (mut child, sid) = script(&env, 30);
    let lock = env.path("rio", &format!("sessions/{sid}.owner"));
    assert!(lock.exists());
    let held = || {
        !Command::new("flock")
            .args(["--nonblock", "--shared"])
            .arg(&lock)
            .arg("true")
            .status()
            .unwrap()
            .success()
    };
    assert!(held(), "the owner lock is not held while the script runs");
    // `$(session begin)` returned: the keeper kept no pipe open.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        poll_until(Duration::from_secs(5), || !held()),
        "the keeper still holds the lock after its script died"
    );
}
