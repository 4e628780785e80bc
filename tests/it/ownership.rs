//! One session per agent, whoever started it (issue 9 §3), through the real
//! binary:
//!
//! * a session script's session under a daemon that cannot see the script
//!   (the daemon in a PID namespace of its own, `unshare`; root-gated with
//!   `AGENT_STATE_ROOT_TESTS=1`): a `wake` neither interrupts it nor starts
//!   a second session, the script's `end` succeeds, and once the script is
//!   killed the daemon does recover its session;
//! * `session end`/`fail` naming no session (or an empty one) leave a
//!   session another live process owns alone, and its real end still works;
//! * negative numbers given to the hooks are bad arguments (exit 65, the rest
//!   recorded), not refused by the argument parser;
//! * a clock that steps back (`AGENT_STATE_FAKE_NOW`) never re-fires a run,
//!   reuses a session id or appends to a session log.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{BIN, Daemon, Env, daemon_config, list, poll_until, read_json};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn root_tests_enabled() -> bool {
    let enabled = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1");
    if enabled && nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: needs root (AGENT_STATE_ROOT_TESTS=1)");
    false
}

/// A config whose agents run `agent.sh` (appends `start SESSION` to `runs`).
fn env_with(agents: &str) -> Env {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_SESSION_ID\" >> '{}'\necho \"session $AGENT_STATE_SESSION_ID at work\"",
            runs.display()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        agents,
    ));
    env.ok(&["bootstrap"]);
    env
}

const RIO: &str = "[[agent]]\nname = \"rio\"\n";

fn events(env: &Env, agent: &str, event: &str) -> Vec<Value> {
    if !env.path(agent, "journal.jsonl").exists() {
        return vec![];
    }
    env.events(agent, event)
}

fn daemon_runs(env: &Env) -> Vec<String> {
    std::fs::read_to_string(env.tmp("runs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A session script run by something other than the daemon (cron, a
/// person): `begin`, print the id, wait until the file `go` exists, then
/// `end` with `--session END_ARG` and print `end=STATUS`.
struct Script {
    child: Child,
    out: BufReader<ChildStdout>,
    id: String,
}

impl Script {
    fn start(env: &Env, go: &Path, end_arg: &str) -> Script {
        let body = format!(
            r#"S=$('{BIN}' --config '{cfg}' session begin rio) || exit 9
echo "$S"
while [ ! -e '{go}' ]; do sleep 0.05; done
'{BIN}' --config '{cfg}' session end rio --session "{end_arg}" --sources-archived 2 >/dev/null
echo "end=$?"
"#,
            cfg = env.config.display(),
            go = go.display(),
        );
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(&body)
            .env_remove("AGENT_STATE_SESSION_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the script");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let id = line.trim().to_string();
        assert!(!id.is_empty(), "the script's begin printed its session id");
        Script { child, out, id }
    }

    /// Let it end; its `end`'s exit status.
    fn finish(mut self, go: &Path) -> String {
        std::fs::write(go, "").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        self.child.wait().unwrap();
        line.trim().to_string()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keepers (`agent-state session keep ID`) still running for session `id`.
fn keepers(id: &str) -> Vec<i32> {
    list(Path::new("/proc"))
        .into_iter()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                    args.windows(3)
                        .any(|w| w[0] == b"session" && w[1] == b"keep" && w[2] == id.as_bytes())
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Is the owner lock of session `id` held by someone (try it, as the
/// daemon does, without waiting)?
fn owner_lock_held(env: &Env, id: &str) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(file) = std::fs::File::open(env.path("rio", &format!("sessions/{id}.owner"))) else {
        return false;
    };
    Flock::lock(file, FlockArg::LockSharedNonblock).is_err()
}

// ---- a daemon that cannot see the script -------------------------------------------

/// `agent-state daemon` in a PID namespace of its own (`unshare --pid
/// --fork --mount-proc`): the session scripts the test runs are invisible to
/// it, as cron's are to the daemon under the shipped unit.
struct NamespacedDaemon {
    unshare: Child,
    log: PathBuf,
    root: PathBuf,
}

impl NamespacedDaemon {
    fn start(env: &Env) -> NamespacedDaemon {
        let heartbeat = env.root.join(".daemon/daemon.json");
        let _ = std::fs::remove_file(&heartbeat);
        let log = env.tmp("ns-daemon.log");
        let file = std::fs::File::create(&log).unwrap();
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"])
            .arg(BIN)
            .arg("--config")
            .arg(&env.config)
            .arg("daemon")
            .env_remove("AGENT_STATE_FAKE_NOW")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("run unshare");
        let d = NamespacedDaemon {
            unshare,
            log,
            root: env.root.clone(),
        };
        d.wait_until(
            secs(10.0),
            "the daemon in its PID namespace is ready",
            || {
                std::fs::read_to_string(&heartbeat)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .is_some_and(|hb| hb["pid"].as_i64().is_some())
            },
        );
        d
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_until(&self, timeout: Duration, what: &str, cond: impl FnMut() -> bool) {
        if !poll_until(timeout, cond) {
            panic!(
                "timed out after {timeout:?} waiting until {what}\n---- daemon log ----\n{}",
                self.log_text()
            );
        }
    }
}

impl Drop for NamespacedDaemon {
    fn drop(&mut self) {
        // unshare passes its death on to the daemon as SIGTERM
        // (--kill-child); the daemon is gone once the root lock is free.
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        let lock = self.root.join(".daemon/lock");
        poll_until(secs(10.0), || {
            std::fs::File::open(&lock).is_ok_and(|f| {
                nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock).is_ok()
            })
        });
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log_text());
        }
    }
}

#[test]
fn a_wake_from_a_daemon_that_cannot_see_the_script_leaves_its_session_alone() {
    if !root_tests_enabled() {
        return;
    }
    let env = env_with(RIO);
    let d = NamespacedDaemon::start(&env);
    let go = env.tmp("go");
    let script = Script::start(&env, &go, "$S");
    let sid = script.id.clone();
    assert!(
        owner_lock_held(&env, &sid),
        "the script's keeper holds the lock"
    );

    env.ok(&["wake", "rio"]);
    d.wait_until(secs(10.0), "the daemon skipped the wake", || {
        !events(&env, "rio", "wake_skipped").is_empty()
    });
    assert_eq!(
        events(&env, "rio", "wake_skipped")[0]["running_session"],
        sid.as_str()
    );
    assert_eq!(
        events(&env, "rio", "session_start").len(),
        1,
        "no second session: {:?}",
        env.journal("rio")
    );
    assert!(events(&env, "rio", "error").is_empty(), "not interrupted");
    assert!(daemon_runs(&env).is_empty(), "the daemon ran nothing");
    let s = env.json("rio", "session.json");
    assert_eq!(
        (s["session_id"].as_str(), s["status"].as_str()),
        (Some(sid.as_str()), Some("running"))
    );

    // The script ends its own session: exit 0, completed, nothing left over.
    assert_eq!(script.finish(&go), "end=0");
    let s = env.json("rio", "session.json");
    assert_eq!(s["session_id"], sid.as_str());
    assert_eq!(s["status"], "completed");
    assert_eq!(s["sources_archived"], 2);
    assert!(!env.path("rio", &format!("sessions/{sid}.owner")).exists());
    assert!(
        poll_until(secs(5.0), || keepers(&sid).is_empty()),
        "the keeper exits when the session ends"
    );

    // A script killed outright: its keeper lets go, and the daemon (which
    // still cannot see anything of it) recovers the session at the next wake.
    std::fs::remove_file(&go).unwrap();
    let mut killed = Script::start(&env, &go, "$S");
    let sid2 = killed.id.clone();
    killed.child.kill().unwrap();
    killed.child.wait().unwrap();
    assert!(
        poll_until(secs(5.0), || !owner_lock_held(&env, &sid2)),
        "the keeper let go of the lock once its script was killed"
    );
    assert!(keepers(&sid2).is_empty());
    env.ok(&["wake", "rio"]);
    d.wait_until(
        secs(10.0),
        "the daemon recovered the dead script's session",
        || {
            events(&env, "rio", "error")
                .iter()
                .any(|e| e["session_id"] == sid2.as_str())
        },
    );
    let err = events(&env, "rio", "error")
        .into_iter()
        .find(|e| e["session_id"] == sid2.as_str())
        .unwrap();
    assert!(
        err["reason"].as_str().unwrap().starts_with("interrupted"),
        "{err}"
    );
    d.wait_until(secs(10.0), "the daemon ran its own session", || {
        daemon_runs(&env).len() == 1
    });
}

// ---- end or fail without a session id ------------------------------------------------

#[test]
fn end_without_a_session_id_leaves_another_live_owners_session_alone() {
    let env = env_with(RIO);
    let go = env.tmp("go");
    let script = Script::start(&env, &go, "$S");
    let sid = script.id.clone();

    // A script whose $SESSION was lost, run beside it: refused, exit 77.
    let err = env.fails(&["session", "end", "rio"], 77);
    assert!(
        err.contains(&sid) && err.contains(&format!("--session {sid}")),
        "{err}"
    );
    env.fails(&["session", "end", "rio", "--session", ""], 77);
    env.fails(&["session", "end", "rio", "--session", "  "], 77);
    env.fails(
        &[
            "session",
            "fail",
            "rio",
            "--outcome",
            "error",
            "--reason",
            "x",
        ],
        77,
    );
    env.fails(
        &[
            "session",
            "fail",
            "rio",
            "--session",
            "",
            "--outcome",
            "error",
            "--reason",
            "x",
        ],
        77,
    );
    // Nothing changed.
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "running");
    assert_eq!(s["session_id"], sid.as_str());
    assert!(events(&env, "rio", "session_end").is_empty());
    assert!(events(&env, "rio", "error").is_empty());

    // The real end works (not "already ended").
    assert_eq!(script.finish(&go), "end=0");
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "completed");
    let ends = events(&env, "rio", "session_end");
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0]["session_id"], sid.as_str());
}

#[test]
fn the_owner_itself_may_end_its_session_without_naming_it() {
    let env = env_with(RIO);
    let go = env.tmp("go");
    // The script lost $S: it passes --session "" and is still the owner.
    let script = Script::start(&env, &go, "");
    let sid = script.id.clone();
    assert_eq!(script.finish(&go), "end=0");
    let s = env.json("rio", "session.json");
    assert_eq!(
        (s["session_id"].as_str(), s["status"].as_str()),
        (Some(sid.as_str()), Some("completed"))
    );
}

// ---- negative numbers ------------------------------------------------------------------

#[test]
fn negative_numbers_are_bad_arguments_and_everything_else_is_recorded() {
    let env = env_with(RIO);
    let out = env.run(&[
        "session",
        "begin",
        "rio",
        "--sources-expected",
        "-1",
        "--timeout",
        "-5",
    ]);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    let sid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "running");
    assert_eq!(s["session_id"], sid.as_str());

    let out = env.run(&[
        "session",
        "end",
        "rio",
        "--cost-usd",
        "-1",
        "--tokens-used",
        "-5",
        "--sources-archived",
        "-3",
        "--pr",
        "-2",
        "--summary",
        "done despite the numbers",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // A warning, exit 0: the session ended (a script under `set -e` goes on).
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("--cost-usd \"-1\""), "{stderr}");
    let s = env.json("rio", "session.json");
    assert_eq!(s["status"], "completed", "the session ended: {s:#}");
    assert_eq!(s["cost_usd"], Value::Null);
    assert_eq!(s["tokens_used"], Value::Null);
    let flags: Vec<&str> = s["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["argument"].as_str().unwrap())
        .collect();
    for flag in [
        "--sources-expected",
        "--timeout",
        "--cost-usd",
        "--tokens-used",
        "--sources-archived",
        "--pr",
    ] {
        assert!(flags.contains(&flag), "{flag} noted in {flags:?}");
    }
    assert_eq!(
        env.json("rio", "report.json")["summary"],
        "done despite the numbers"
    );
}

// ---- a clock that steps back -----------------------------------------------------------

#[test]
fn a_clock_that_steps_back_never_refires_reuses_an_id_or_appends_to_a_log() {
    let env = env_with("[[agent]]\nname = \"rio\"\nschedule = \"0 22 * * *\"\n");
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T21:59:58Z")]);
    d.wait_until(secs(10.0), "the 22:00 run has ended", || {
        events(&env, "rio", "session_end").len() == 1
    });
    // Its end journaled is not yet its end carried out by the loop (a
    // manual wake until then is skipped, served by the running session):
    // the log line says the loop is done with it.
    let scheduled = events(&env, "rio", "session_end")[0]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d.wait_until(secs(10.0), "the daemon is done with the 22:00 run", || {
        d.log_text()
            .contains(&format!("session {scheduled} completed"))
    });
    // A wake after it, so the last id is not the scheduled run's.
    env.ok(&["wake", "rio", "--wait", "10s"]);
    d.wait_until(secs(10.0), "the woken session has ended", || {
        events(&env, "rio", "session_end").len() == 2
    });
    drop(d);
    let first: Vec<String> = events(&env, "rio", "session_start")
        .iter()
        .map(|e| e["session_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(first.len(), 2);
    assert!(first[0].starts_with("20260331-2200"), "{first:?}");
    let logs: Vec<(String, Vec<u8>)> = first
        .iter()
        .map(|id| {
            let log = env.read("rio", &format!("sessions/{id}.log")).into_bytes();
            (id.clone(), log)
        })
        .collect();
    let last_fire = read_json(&env.root.join(".daemon/schedule.json"))["last_fire"]["rio"].clone();
    assert_eq!(last_fire, "2026-03-31T22:00:00Z");

    // The clock goes back (NTP, a VM resumed) to before that run.
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T21:59:58Z")]);
    // Kept: the (fake) clock must pass 22:00 again, the time under test.
    std::thread::sleep(secs(2.5));
    // A session begun now gets an id after every earlier one, and a log of
    // its own. Its turn fires what is due before it starts anything: a
    // 22:00 run fired again would start there (and say so in the log).
    env.ok(&["wake", "rio", "--wait", "10s"]);
    d.wait_until(secs(10.0), "the new session has ended", || {
        events(&env, "rio", "session_end").len() == 3
    });
    assert_eq!(
        events(&env, "rio", "session_start").len(),
        3,
        "the 22:00 run that already fired did not fire again: {:?}",
        daemon_runs(&env)
    );
    assert!(
        d.log_text().matches(" started (").count() == 1
            && d.log_text().contains("started (manual)"),
        "the 22:00 run that already fired did not fire again:\n{}",
        d.log_text()
    );
    let next = env.json("rio", "report.json")["next_wake_at"].clone();
    assert_eq!(next, "2026-04-01T22:00:00Z", "the next run is tomorrow's");
    let ids: Vec<String> = events(&env, "rio", "session_start")
        .iter()
        .map(|e| e["session_id"].as_str().unwrap().to_string())
        .collect();
    let new = &ids[2];
    assert!(!first.contains(new), "{new} is not reused: {ids:?}");
    assert!(
        new.as_str() > first[1].as_str(),
        "ids only grow, whatever the clock says: {ids:?}"
    );
    for (id, before) in &logs {
        assert_eq!(
            &env.read("rio", &format!("sessions/{id}.log")).into_bytes(),
            before,
            "the log of {id} was not appended to"
        );
    }
    assert!(env.path("rio", &format!("sessions/{new}.log")).exists());
}
