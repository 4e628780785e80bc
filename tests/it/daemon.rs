//! The daemon through the real binary: schedules (with the injected clock
//! `AGENT_STATE_FAKE_NOW`), inbox wakes, overlap, the global limit, timeouts,
//! signals, recovery after a crash, and `agent-state wake` — each checked by
//! what an operator would see in the files, the journal and the exit codes.
//!
//! The agents are small `sh` scripts in the test's temp dir that leave traces
//! in files there (`runs`: one `start`/`end` line per session).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{Daemon, Env, daemon_config, list, poll_until, process_alive, read_json};

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

const RIO: &str = "[[agent]]\nname = \"rio\"\n";
const RIO_AT_22: &str = "[[agent]]\nname = \"rio\"\nschedule = \"0 22 * * *\"\n";
const CLAY: &str = "[[agent]]\nname = \"clay\"\n";
const LEO: &str = "[[agent]]\nname = \"leo\"\n";
const MARCUS: &str = "[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";

/// The usual fake agent: appends `start AGENT SESSION INSTANCE TIME` to
/// `runs`, runs `middle`, appends `end AGENT SESSION INSTANCE TIME`.
fn agent_script(env: &Env, middle: &str) -> std::path::PathBuf {
    let runs = env.tmp("runs");
    env.script(
        "agent.sh",
        &format!(
            r#"RUNS={runs:?}
echo "start $AGENT_STATE_AGENT $AGENT_STATE_SESSION_ID $AGENT_STATE_INSTANCE $(date +%s.%N)" >> "$RUNS"
echo "$AGENT_STATE_AGENT: session $AGENT_STATE_SESSION_ID at work"
{middle}
echo "end $AGENT_STATE_AGENT $AGENT_STATE_SESSION_ID $AGENT_STATE_INSTANCE $(date +%s.%N)" >> "$RUNS"
"#,
            runs = runs.display().to_string()
        ),
    )
}

/// An environment whose agents run `agent_script(middle)` under the config
/// built by [`daemon_config`].
fn setup(middle: &str, daemon: &[(&str, &str)], defaults: &[(&str, &str)], agents: &str) -> Env {
    let env = Env::with_config("");
    let script = agent_script(&env, middle);
    env.set_config(&daemon_config(&script, daemon, defaults, agents));
    env
}

/// The `runs` lines, split into words.
fn runs(env: &Env) -> Vec<Vec<String>> {
    std::fs::read_to_string(env.tmp("runs"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn run_lines(env: &Env, what: &str) -> Vec<Vec<String>> {
    runs(env).into_iter().filter(|l| l[0] == what).collect()
}

/// session.json, or Null when there is none (yet).
fn session(env: &Env, agent: &str) -> Value {
    let path = env.path(agent, "session.json");
    if path.exists() {
        read_json(&path)
    } else {
        Value::Null
    }
}

fn session_status(env: &Env, agent: &str) -> String {
    session(env, agent)["status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The session in session.json has ended with `outcome` and every file says
/// so: report.json (written after session.json) names it as its last session.
fn ended(env: &Env, agent: &str, outcome: &str) -> bool {
    let s = session(env, agent);
    let path = env.path(agent, "report.json");
    if s["status"] != outcome || !path.exists() {
        return false;
    }
    let last = &read_json(&path)["last_session"];
    last["id"] == s["session_id"] && last["outcome"] == outcome
}

/// The journal, or nothing when the agent has none yet.
fn journal(env: &Env, agent: &str) -> Vec<Value> {
    if env.path(agent, "journal.jsonl").exists() {
        env.journal(agent)
    } else {
        vec![]
    }
}

fn events(env: &Env, agent: &str, event: &str) -> Vec<Value> {
    journal(env, agent)
        .into_iter()
        .filter(|e| e["event"] == event)
        .collect()
}

/// Proof the daemon has looked and decided: wake `other` (an agent the
/// test does not watch) and wait until that session has ended. The loop
/// handles its events one turn at a time and starts, in the turn, what the
/// turn decided (`tick`: wake requests, scans, due schedules, due inbox
/// debounces, then the starts): a session that any earlier turn decided
/// on, or that a debounce run out before this call asked for, has started
/// by the time `other`'s has ended. Asserting an absence after this is not
/// a bet on the machine being quick.
fn fence(env: &Env, d: &Daemon, other: &str) {
    // A session ends with `session_end`, `error` or `timeout`.
    let ends = || {
        journal(env, other)
            .iter()
            .filter(|e| {
                ["session_end", "error", "timeout"].contains(&e["event"].as_str().unwrap_or(""))
            })
            .count()
    };
    let before = ends();
    env.ok(&["wake", other]);
    d.wait_until(
        secs(30.0),
        &format!("{other}'s session (the fence) has ended"),
        || ends() > before,
    );
}

/// Wait until `agent`'s journal has `n` `message_received` lines: the
/// daemon's scan has read that many messages (and decided on them in the
/// same loop turn).
fn received(env: &Env, d: &Daemon, agent: &str, n: usize) {
    d.wait_until(
        secs(10.0),
        &format!("{agent} has received {n} message(s)"),
        || events(env, agent, "message_received").len() >= n,
    );
}

/// A message as a sender writes it.
fn message(from: &str, subject: &str, priority: &str) -> String {
    serde_json::json!({
        "from": from,
        "type": "cascade",
        "priority": priority,
        "subject": subject,
        "body": format!("Body of: {subject}"),
    })
    .to_string()
}

/// Deliver like a program does: write in `inbox/.tmp/`, rename into `inbox/`.
fn drop_message(env: &Env, agent: &str, name: &str, json: &str) {
    let tmp_dir = env.path(agent, "inbox/.tmp");
    std::fs::create_dir_all(&tmp_dir).expect("inbox/.tmp");
    let tmp = tmp_dir.join(name);
    std::fs::write(&tmp, json).expect("write message");
    std::fs::rename(&tmp, env.path(agent, &format!("inbox/{name}"))).expect("rename message");
}

/// Every file under a directory, recursively (relative names).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for name in list(dir) {
        let path = dir.join(&name);
        if path.is_dir() {
            out.extend(
                files_under(&path)
                    .into_iter()
                    .map(|n| format!("{name}/{n}")),
            );
        } else {
            out.push(name);
        }
    }
    out
}

fn processed(env: &Env, agent: &str) -> Vec<String> {
    env.files(agent, "inbox/processed")
        .into_iter()
        .filter(|n| n.ends_with(".json"))
        .collect()
}

fn prompt_of(env: &Env, agent: &str, session_id: &str) -> String {
    env.read(agent, &format!("sessions/{session_id}.prompt.md"))
}

/// Kills a process (and the group it leads) when dropped: agents a SIGKILLed
/// daemon left behind. Only if that pid is still the process it was when the
/// guard was made (same start time): the daemon has usually ended it long
/// before, and on a busy machine (pid_max 32768) its pid may by then belong
/// to another test's process, which must not be killed.
struct KillGroup {
    pid: i32,
    started: Option<u64>,
}

impl KillGroup {
    fn new(pid: i32) -> KillGroup {
        KillGroup {
            pid,
            started: start_time(pid),
        }
    }
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// since boot; with the pid, it names one process.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Drop for KillGroup {
    fn drop(&mut self) {
        if self.started.is_none() || start_time(self.pid) != self.started {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.pid);
        let _ = nix::sys::signal::killpg(pid, Signal::SIGKILL);
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
}

/// Messages claimed by a session that is not running (its script killed
/// between `session begin` and its end) go back to the inbox even when the
/// agent's lock is held past the recovery's wait at start: the health
/// monitor returns them once the lock is free, and they are delivered.
#[test]
fn claims_a_held_lock_kept_at_start_are_returned_by_the_monitor() {
    let env = Env::with_config("");
    let script = agent_script(&env, "");
    env.set_config(&format!(
        "{}\n[health]\ninterval = \"200ms\"\n",
        daemon_config(&script, &[], &[], RIO)
    ));
    env.ok(&["bootstrap", "rio"]);
    let id = env.send("leo", "rio", &[]);
    let stale = "20260101-000000";
    std::fs::create_dir_all(env.path("rio", &format!("inbox/.claimed/{stale}"))).unwrap();
    std::fs::rename(
        env.path("rio", &format!("inbox/{id}.json")),
        env.path("rio", &format!("inbox/.claimed/{stale}/{id}.json")),
    )
    .unwrap();
    // Another process holds rio's lock (a hook stuck on a full disk).
    let lock = env.path("rio", ".lock");
    let mut holder = std::process::Command::new("flock")
        .arg(&lock)
        .args(["sleep", "600"])
        .process_group(0)
        .spawn()
        .unwrap();
    let holder_group = KillGroup::new(holder.id() as i32);
    let held = poll_until(Duration::from_secs(10), || {
        std::process::Command::new("flock")
            .args(["-n"])
            .arg(&lock)
            .arg("true")
            .status()
            .is_ok_and(|s| !s.success())
    });
    assert!(held, "flock holds rio's lock");

    let d = env.daemon();
    d.wait_until(secs(30.0), "the start-up says the claims wait", || {
        d.log_text().contains("stay claimed for now")
    });
    assert_eq!(
        env.files("rio", &format!("inbox/.claimed/{stale}")),
        [format!("{id}.json")],
        "nothing moved while the lock was held"
    );
    drop(holder_group);
    let _ = holder.wait();
    d.wait_until(secs(30.0), "the message is delivered and processed", || {
        processed(&env, "rio") == [format!("{id}.json")]
    });
    assert!(
        d.log_text()
            .contains(&format!("messages claimed by session {stale}, which is not running (found by the health monitor), returned to the inbox")),
        "{}",
        d.log_text()
    );
    assert!(!env.path("rio", &format!("inbox/.claimed/{stale}")).exists());
    let start = events(&env, "rio", "session_start");
    assert_eq!(start.last().unwrap()["messages"], serde_json::json!([id]));
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

// ---- 1. schedules --------------------------------------------------------------

#[test]
fn a_schedule_fires_at_its_time_with_the_injected_clock() {
    let env = setup("", &[], &[], &format!("{RIO_AT_22}{MARCUS}"));
    let t0 = Instant::now();
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T21:59:58Z")]);
    d.wait_until(secs(8.0), "rio's scheduled session has completed", || {
        ended(&env, "rio", "completed")
    });
    let took = t0.elapsed();
    assert!(
        took >= secs(1.5) && took < secs(5.0),
        "the 22:00 run started 2 s after a start at 21:59:58, not after {took:?}"
    );
    assert_eq!(
        run_lines(&env, "start").len(),
        1,
        "one run: {:?}",
        runs(&env)
    );

    let s = session(&env, "rio");
    assert_eq!(s["session_id"], "20260331-220000");
    assert_eq!(s["started_at"], "2026-03-31T22:00:00Z");
    assert_eq!(s["instance"], "rio-001");
    let r = env.json("rio", "report.json");
    assert_eq!(r["status"], "idle");
    assert_eq!(r["last_session"]["id"], "20260331-220000");
    assert_eq!(r["last_session"]["outcome"], "completed");
    assert_eq!(r["instance"], "rio-001");
    assert_eq!(r["next_wake_at"], "2026-04-01T22:00:00Z");
    let sched = read_json(&env.root.join(".daemon/schedule.json"));
    assert_eq!(sched["last_fire"]["rio"], "2026-03-31T22:00:00Z");
    assert_eq!(d.heartbeat()["next_wakes"]["rio"], "2026-04-01T22:00:00Z");

    let start = events(&env, "rio", "session_start");
    assert_eq!(start.len(), 1);
    assert_eq!(start[0]["instance"], "rio-001");
    assert_eq!(start[0]["session_id"], "20260331-220000");
    let end = events(&env, "rio", "session_end");
    assert_eq!(end.len(), 1);
    assert_eq!(end[0]["outcome"], "completed");
    // The agent saw the same ids in its environment.
    let line = &run_lines(&env, "start")[0];
    assert_eq!(line[1..4], ["rio", "20260331-220000", "rio-001"]);
    // The human mailbox got nothing.
    assert!(!env.path("marcus", "session.json").exists());
}

#[test]
fn a_missed_run_within_the_catch_up_window_runs_once() {
    let env = setup(
        "",
        &[("catch_up_window", "\"2h\"")],
        &[],
        &format!("{RIO_AT_22}{CLAY}"),
    );
    std::fs::create_dir_all(env.root.join(".daemon")).unwrap();
    std::fs::write(
        env.root.join(".daemon/schedule.json"),
        r#"{"last_fire": {"rio": "2026-03-31T21:00:00Z"}}"#,
    )
    .unwrap();
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T22:30:00Z")]);
    d.wait_until(secs(30.0), "rio's catch-up session has completed", || {
        ended(&env, "rio", "completed")
    });
    let s = session(&env, "rio");
    assert!(
        s["session_id"]
            .as_str()
            .unwrap()
            .starts_with("20260331-2230"),
        "the catch-up ran at once (22:30), not at a later fire: {s}"
    );
    // Nothing more: one catch-up, not one per missed run (another would
    // have started when the first ended, before the fence's session).
    fence(&env, &d, "clay");
    assert_eq!(
        events(&env, "rio", "session_start").len(),
        1,
        "{:?}",
        runs(&env)
    );
    assert!(events(&env, "rio", "schedule_missed").is_empty());
    let sched = read_json(&env.root.join(".daemon/schedule.json"));
    assert_eq!(sched["last_fire"]["rio"], "2026-03-31T22:00:00Z");
    assert_eq!(
        env.json("rio", "report.json")["next_wake_at"],
        "2026-04-01T22:00:00Z"
    );
}

#[test]
fn a_missed_run_outside_the_catch_up_window_is_journaled_not_run() {
    let env = setup(
        "",
        &[("catch_up_window", "\"10m\"")],
        &[],
        &format!("{RIO_AT_22}{CLAY}"),
    );
    std::fs::create_dir_all(env.root.join(".daemon")).unwrap();
    std::fs::write(
        env.root.join(".daemon/schedule.json"),
        r#"{"last_fire": {"rio": "2026-03-31T21:00:00Z"}}"#,
    )
    .unwrap();
    let d = Daemon::start(&env, &[("AGENT_STATE_FAKE_NOW", "2026-03-31T22:30:00Z")]);
    d.wait_until(secs(30.0), "rio's journal has schedule_missed", || {
        !events(&env, "rio", "schedule_missed").is_empty()
    });
    let missed = &events(&env, "rio", "schedule_missed")[0];
    assert_eq!(missed["scheduled"], "2026-03-31T22:00:00Z");
    assert_eq!(missed["count"], 1);
    assert_eq!(missed["catch_up_window"], "10m");
    fence(&env, &d, "clay");
    assert!(
        run_lines(&env, "start").iter().all(|l| l[1] == "clay"),
        "{:?}",
        runs(&env)
    );
    assert!(events(&env, "rio", "session_start").is_empty());
    assert!(!env.path("rio", "session.json").exists());
    assert_eq!(
        env.json("rio", "report.json")["next_wake_at"],
        "2026-04-01T22:00:00Z"
    );
}

// ---- 2-4, 15. inbox wakes ------------------------------------------------------------

#[test]
fn a_message_renamed_into_the_inbox_wakes_the_agent() {
    let env = setup("", &[], &[("inbox_debounce", "\"500ms\"")], RIO);
    let d = env.daemon();
    let subject = "Cascade: the claim rio built on changed";
    let t0 = Instant::now();
    drop_message(
        &env,
        "rio",
        "m-cascade.json",
        &message("leo", subject, "normal"),
    );
    d.wait_until(secs(30.0), "a session of rio has started", || {
        !run_lines(&env, "start").is_empty()
    });
    let took = t0.elapsed();
    assert!(
        took < secs(2.0),
        "started {took:?} after the message: more than the 500ms debounce + 1.5s"
    );
    d.wait_until(secs(30.0), "the session has completed", || {
        ended(&env, "rio", "completed")
    });
    let s = session(&env, "rio");
    let id = s["session_id"].as_str().unwrap();
    assert!(
        prompt_of(&env, "rio", id).contains(subject),
        "the prompt quotes the message"
    );
    d.wait_until(secs(30.0), "the message is in processed/", || {
        processed(&env, "rio") == ["m-cascade.json"]
    });
    assert!(env.waiting("rio").is_empty());
    assert!(env.files("rio", "inbox/rejected").is_empty());
    let start = events(&env, "rio", "session_start");
    assert_eq!(start.len(), 1);
    assert_eq!(start[0]["messages"], serde_json::json!(["m-cascade"]));
}

#[test]
fn with_wake_on_inbox_high_only_a_high_priority_message_wakes() {
    let env = setup(
        "",
        &[],
        &[("wake_on_inbox", "\"high\"")],
        &format!("{RIO}{CLAY}"),
    );
    let d = env.daemon();
    env.ok(&[
        "send",
        "--from",
        "leo",
        "--to",
        "rio",
        "--subject",
        "normal news",
    ]);
    received(&env, &d, "rio", 1);
    // Kept: the inbox debounce (200 ms) must run out after the scan, the
    // time under test; the fence then proves a turn has looked since.
    std::thread::sleep(secs(0.2));
    fence(&env, &d, "clay");
    assert!(
        run_lines(&env, "start").iter().all(|l| l[1] == "clay")
            && !env.path("rio", "session.json").exists(),
        "a normal message does not wake an agent with wake_on_inbox = high"
    );
    let t0 = Instant::now();
    env.ok(&[
        "send",
        "--from",
        "leo",
        "--to",
        "rio",
        "--priority",
        "high",
        "--subject",
        "urgent news",
    ]);
    d.wait_until(secs(30.0), "the high message has woken rio", || {
        ended(&env, "rio", "completed")
    });
    assert!(t0.elapsed() < secs(3.0), "{:?}", t0.elapsed());
    let id = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt = prompt_of(&env, "rio", &id);
    assert!(prompt.contains("urgent news") && prompt.contains("normal news"));
    d.wait_until(secs(30.0), "both messages are processed", || {
        processed(&env, "rio").len() == 2
    });
}

#[test]
fn a_message_written_slowly_by_hand_is_delivered_not_rejected() {
    let env = setup("", &[], &[], &format!("{RIO}{CLAY}"));
    let d = env.daemon();
    let json = message("marcus", "typed by hand, slowly", "normal");
    let (first, rest) = json.split_at(json.len() / 2);
    let path = env.path("rio", "inbox/x.json");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(first.as_bytes()).unwrap();
    f.flush().unwrap();
    // The scan that the half-written file's events asked for has been done
    // (the fence's wake request came after them), and the one a second on
    // (an unsettled file is looked at again after `inbox_settle` / 4, at
    // least 1 s) as well: the fence starts after that second has passed.
    // Kept: that second is the daemon's own period, not a wait on a state.
    std::thread::sleep(secs(1.1));
    fence(&env, &d, "clay");
    assert!(
        env.files("rio", "inbox/rejected").is_empty(),
        "half a message is not rejected while it is being written"
    );
    assert!(run_lines(&env, "start").iter().all(|l| l[1] == "clay"));
    f.write_all(rest.as_bytes()).unwrap();
    drop(f);
    let closed = Instant::now();
    d.wait_until(secs(8.0), "x.json is processed", || {
        processed(&env, "rio") == ["x.json"] && ended(&env, "rio", "completed")
    });
    assert!(
        closed.elapsed() < secs(3.0),
        "delivered on close, not after the settle time: {:?}",
        closed.elapsed()
    );
    assert!(env.files("rio", "inbox/rejected").is_empty());
    let id = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(prompt_of(&env, "rio", &id).contains("typed by hand, slowly"));
}

#[test]
fn a_burst_of_thirty_messages_becomes_one_session() {
    let env = setup(
        "",
        &[],
        &[("inbox_debounce", "\"2s\"")],
        &format!("{RIO}{CLAY}"),
    );
    let d = env.daemon();
    let senders: Vec<_> = (0..30)
        .map(|i| {
            env.command(&[
                "send",
                "--from",
                "leo",
                "--to",
                "rio",
                "--subject",
                &format!("burst message {i}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn send")
        })
        .collect();
    for s in senders {
        let out = s.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    d.wait_until(secs(10.0), "the session has completed", || {
        ended(&env, "rio", "completed")
    });
    // Longer than the debounce: no second session comes. Kept: a debounce
    // a late scan could start must run out (the time under test); the
    // fence then proves a loop turn has looked since.
    std::thread::sleep(secs(2.0));
    fence(&env, &d, "clay");
    assert_eq!(
        run_lines(&env, "start")
            .iter()
            .filter(|l| l[1] == "rio")
            .count(),
        1,
        "{:?}",
        runs(&env)
    );
    let start = events(&env, "rio", "session_start");
    assert_eq!(start.len(), 1);
    assert_eq!(start[0]["messages"].as_array().map(Vec::len), Some(30));
    assert_eq!(processed(&env, "rio").len(), 30);
    assert!(env.waiting("rio").is_empty());
    let prompt = prompt_of(&env, "rio", start[0]["session_id"].as_str().unwrap());
    for i in 0..30 {
        assert!(
            prompt.contains(&format!("burst message {i}")),
            "message {i} in the prompt"
        );
    }
}

#[test]
fn a_human_mailbox_is_never_woken() {
    let env = setup("", &[], &[], &format!("{RIO}{CLAY}{MARCUS}"));
    let d = env.daemon();
    assert_eq!(d.heartbeat()["agents"], serde_json::json!(["clay", "rio"]));
    env.ok(&[
        "send",
        "--from",
        "rio",
        "--to",
        "marcus",
        "--priority",
        "high",
        "--subject",
        "for a human",
    ]);
    drop_message(
        &env,
        "marcus",
        "by-hand.json",
        &message("leo", "hi", "high"),
    );
    // Kept: the inbox debounce (200 ms), were the daemon to count the
    // messages; the fence then proves a loop turn has looked since.
    std::thread::sleep(secs(0.2));
    fence(&env, &d, "clay");
    assert!(
        run_lines(&env, "start").iter().all(|l| l[1] == "clay"),
        "{:?}",
        runs(&env)
    );
    assert!(!env.path("marcus", "session.json").exists());
    assert!(events(&env, "marcus", "session_start").is_empty());
    assert_eq!(
        env.waiting("marcus").len(),
        2,
        "the messages wait for the human"
    );
    assert!(!env.path("rio", "session.json").exists());
}

// ---- 5, 16. how sessions end -------------------------------------------------------------

#[test]
fn a_hanging_agent_is_timed_out_and_its_escaped_grandchild_killed() {
    let grandchild = "grandchild.pid";
    let env = Env::with_config("");
    let gc_file = env.tmp(grandchild);
    let script = agent_script(
        &env,
        &format!(
            "trap '' TERM\nsetsid sleep 1000 &\necho $! > {:?}\nsleep 1000",
            gc_file.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("timeout", "\"2s\""), ("kill_grace", "\"1s\"")],
        RIO,
    ));
    let d = env.daemon();
    let t0 = Instant::now();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30.0), "the agent wrote its grandchild's pid", || {
        read_pid(&gc_file).is_some()
    });
    let gc = read_pid(&gc_file).unwrap();
    let _cleanup = KillGroup::new(gc);
    assert!(process_alive(gc), "the grandchild runs during the session");
    d.wait_until(secs(10.0), "the session is recorded as timed out", || {
        ended(&env, "rio", "timeout")
    });
    let took = t0.elapsed();
    assert!(
        took >= secs(2.5) && took < secs(7.0),
        "timeout 2s + kill_grace 1s, took {took:?}"
    );
    let s = session(&env, "rio");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("timed out after 2s"),
        "{s}"
    );
    d.wait_until(secs(30.0), "report.json says a retry is coming", || {
        env.json("rio", "report.json")["error"]["state"] == "retrying"
    });
    let r = env.json("rio", "report.json");
    assert_eq!(
        r["status"], "idle",
        "a timeout with a retry coming is not an error"
    );
    assert_eq!(r["last_session"]["outcome"], "timeout");
    assert_eq!(r["error"]["code"], "SESSION_TIMEOUT");
    assert_eq!(r["error"]["state"], "retrying");
    assert_eq!(events(&env, "rio", "timeout").len(), 1);
    assert!(
        poll_until(secs(3.0), || !process_alive(gc)),
        "the grandchild that escaped with setsid (pid {gc}) is still alive"
    );
    assert!(run_lines(&env, "end").is_empty());
}

#[test]
fn a_command_that_does_not_exist_starts_no_session() {
    let env = Env::with_config("");
    env.set_config(&daemon_config(
        Path::new("/nonexistent/agent-state-test-agent"),
        &[],
        &[],
        RIO,
    ));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    // Checked before the claim: no session begins (tests/it/unrunnable.rs
    // has what becomes of the messages).
    d.wait_until(secs(30.0), "the refused wake is journaled", || {
        events(&env, "rio", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "agent_not_found")
    });
    let skipped = events(&env, "rio", "wake_skipped");
    assert!(
        skipped[0]["detail"]
            .as_str()
            .unwrap()
            .contains("command not found: /nonexistent/agent-state-test-agent"),
        "{skipped:?}"
    );
    assert!(events(&env, "rio", "session_start").is_empty());
    assert!(session(&env, "rio")["status"] != "running");
    let r = env.json("rio", "report.json");
    assert_eq!(r["error"]["code"], "AGENT_NOT_FOUND", "{r}");
    d.wait_until(secs(30.0), "the log says the command was not found", || {
        d.log_text()
            .contains("command not found: /nonexistent/agent-state-test-agent")
    });
}

#[test]
fn failing_sessions_back_off_instead_of_burning_the_messages() {
    let env = Env::with_config("");
    let script = agent_script(&env, "exit 1");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"any\""), ("inbox_debounce", "\"0s\"")],
        &format!("{RIO}{CLAY}"),
    ));
    let d = env.daemon();
    let id = env.send("leo", "rio", &[]);
    d.wait_until(secs(30.0), "the first session fails", || {
        ended(&env, "rio", "error")
    });
    // The message went back to the inbox with one attempt counted; the
    // agent is held back, so it is not retried at once (which would burn
    // its three attempts in seconds and set it aside as undeliverable).
    // A retry at once would start in the turn after the end: before the
    // fence's session.
    d.wait_until(secs(10.0), "the backoff is logged", || {
        d.log_text().contains("held back until")
    });
    fence(&env, &d, "clay");
    assert_eq!(
        events(&env, "rio", "session_start").len(),
        1,
        "no retry storm"
    );
    assert_eq!(env.waiting("rio"), [format!("{id}.json")]);
    assert!(env.files("rio", "inbox/rejected").is_empty());
    assert!(d.log_text().contains("held back until"), "{}", d.log_text());
    // A manual wake is still served during the backoff (its session ran
    // and failed: the daemon's to handle, exit 0).
    let out = env.run(&["wake", "rio", "--wait", "5s"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(events(&env, "rio", "session_start").len(), 2);
}

// ---- 6-8. crash and shutdown ---------------------------------------------------------------

#[test]
fn a_daemon_killed_mid_session_recovers_on_restart_and_loses_no_message() {
    let env = Env::with_config("");
    let slow = env.tmp("slow");
    let agent_pid = env.tmp("agent.pid");
    let script = agent_script(
        &env,
        &format!(
            "if [ -e {slow:?} ]; then echo $$ > {pid:?}; sleep 30; fi",
            slow = slow.display().to_string(),
            pid = agent_pid.display().to_string()
        ),
    );
    env.set_config(&daemon_config(&script, &[], &[], RIO));
    std::fs::write(&slow, "").unwrap();
    let mut d1 = env.daemon();
    let id = env.send("leo", "rio", &[]);
    d1.wait_until(secs(30.0), "the agent is running", || {
        read_pid(&agent_pid).is_some()
    });
    let orphan = read_pid(&agent_pid).unwrap();
    let _cleanup = KillGroup::new(orphan);
    let s1 = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(session_status(&env, "rio"), "running");
    assert_eq!(
        env.files("rio", &format!("inbox/.claimed/{s1}")),
        [format!("{id}.json")]
    );

    // A SIGKILLed daemon cannot stop its session: the agent (its own process
    // group) is reparented and keeps running until the next daemon starts,
    // which ends it before recording the session (never two at once).
    let status = d1.kill9();
    assert_eq!(status.code(), None, "killed by SIGKILL");
    let orphan_after_kill = process_alive(orphan);
    eprintln!("after the daemon's SIGKILL, its agent (pid {orphan}) alive: {orphan_after_kill}");
    drop(d1);

    std::fs::remove_file(&slow).unwrap();
    let d2 = env.daemon();
    d2.wait_until(secs(30.0), "the interrupted session is an error", || {
        events(&env, "rio", "error")
            .iter()
            .any(|e| e["session_id"] == s1.as_str())
    });
    let err = events(&env, "rio", "error")
        .into_iter()
        .find(|e| e["session_id"] == s1.as_str())
        .unwrap();
    assert!(
        err["reason"].as_str().unwrap().contains("interrupted"),
        "{err}"
    );
    assert_eq!(err["messages_returned"], serde_json::json!([id.clone()]));
    d2.wait_until(secs(8.0), "a new session processed the message", || {
        processed(&env, "rio") == [format!("{id}.json")] && ended(&env, "rio", "completed")
    });
    let s2 = session(&env, "rio");
    assert_ne!(s2["session_id"], s1.as_str());
    let starts = events(&env, "rio", "session_start");
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[1]["messages"], serde_json::json!([id.clone()]));
    assert_eq!(starts[1]["instance"], "rio-002");
    assert!(files_under(&env.path("rio", "inbox/.claimed")).is_empty());
    assert!(env.waiting("rio").is_empty());
    assert!(
        !process_alive(orphan),
        "the old agent (pid {orphan}) was ended by the restarted daemon"
    );
}

/// A daemon killed after a session's start was journaled (its commit) but
/// before session.json and report.json were renamed in: the next daemon
/// records that session interrupted, so its start has its end (chaos round
/// 2 found a start with no end), and its message is processed once.
#[test]
fn a_start_journaled_before_a_kill_without_its_files_is_recorded_interrupted() {
    let env = Env::with_config("");
    let slow = env.tmp("slow");
    let agent_pid = env.tmp("agent.pid");
    let script = agent_script(
        &env,
        &format!(
            "if [ -e {slow:?} ]; then echo $$ > {pid:?}; sleep 30; fi",
            slow = slow.display().to_string(),
            pid = agent_pid.display().to_string()
        ),
    );
    env.set_config(&daemon_config(&script, &[], &[], RIO));
    std::fs::write(&slow, "").unwrap();
    let mut d1 = env.daemon();
    // session.json and report.json as they were before the session began.
    // (No session.json yet: the agent never ran.)
    let before: Vec<(std::path::PathBuf, Option<Vec<u8>>)> = ["session.json", "report.json"]
        .iter()
        .map(|f| {
            let p = env.path("rio", f);
            let bytes = std::fs::read(&p).ok();
            (p, bytes)
        })
        .collect();
    let id = env.send("leo", "rio", &[]);
    d1.wait_until(secs(30.0), "the agent is running", || {
        read_pid(&agent_pid).is_some()
    });
    let _cleanup = KillGroup::new(read_pid(&agent_pid).unwrap());
    let s1 = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    d1.kill9();
    drop(d1);
    // The crash's window: the journal has the start, the files do not.
    for (path, bytes) in &before {
        match bytes {
            Some(bytes) => std::fs::write(path, bytes).unwrap(),
            None => std::fs::remove_file(path).unwrap(),
        }
    }

    std::fs::remove_file(&slow).unwrap();
    let d2 = env.daemon();
    d2.wait_until(secs(30.0), "the cut start is recorded an error", || {
        events(&env, "rio", "error")
            .iter()
            .any(|e| e["session_id"] == s1.as_str())
    });
    let err = events(&env, "rio", "error")
        .into_iter()
        .find(|e| e["session_id"] == s1.as_str())
        .unwrap();
    assert!(
        err["reason"].as_str().unwrap().contains("interrupted"),
        "{err}"
    );
    assert_eq!(err["messages_returned"], serde_json::json!([id.clone()]));
    d2.wait_until(secs(30.0), "a new session processed the message", || {
        processed(&env, "rio") == [format!("{id}.json")] && ended(&env, "rio", "completed")
    });
    // Every start has one end.
    let starts = events(&env, "rio", "session_start");
    for start in &starts {
        let sid = start["session_id"].as_str().unwrap();
        let ends = ["session_end", "error", "timeout"]
            .iter()
            .flat_map(|k| events(&env, "rio", k))
            .filter(|e| e["session_id"] == sid)
            .count();
        assert_eq!(ends, 1, "session {sid}: {ends} ends");
    }
}

/// One SIGTERM sent twice at once (as `timeout` does: to its child, then
/// to its process group) is one graceful stop: the running session is
/// left its shutdown grace and ends by itself, completed.
#[test]
fn a_sigterm_sent_twice_at_once_is_still_the_graceful_stop() {
    let env = Env::with_config("");
    let started = env.tmp("started");
    let go = env.tmp("go");
    let script = agent_script(
        &env,
        &format!(
            "touch {:?}\nwhile [ ! -e {:?} ]; do sleep 0.05; done\necho '<axiom>COMPLETE</axiom>'",
            started.display().to_string(),
            go.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[("shutdown_grace", "\"60s\"")],
        &[],
        RIO,
    ));
    // The window is a second; the test's second signal comes after it has
    // read that the first was taken, which a busy machine may delay.
    let mut d = Daemon::start(&env, &[("AGENT_STATE_TEST_REPEATED_SIGNAL", "60s")]);
    env.send("leo", "rio", &[]);
    d.wait_until(secs(30.0), "the agent is running", || started.exists());
    d.signal(Signal::SIGTERM);
    d.wait_until(secs(10.0), "the daemon is stopping", || {
        d.log_text().contains("SIGTERM: stopping")
    });
    d.signal(Signal::SIGTERM);
    d.wait_until(secs(10.0), "the second signal taken as the first", || {
        d.log_text()
            .contains("SIGTERM again at once: taken as the same stop")
    });
    std::fs::write(&go, "").unwrap();
    let status = d.wait_exit(secs(30.0));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    let log = d.log_text();
    assert!(!log.contains("again: ending running sessions now"), "{log}");
    assert_eq!(session(&env, "rio")["status"], "completed", "{log}");
}

#[test]
fn sigterm_waits_shutdown_grace_then_stops_the_session() {
    let env = Env::with_config("");
    let started = env.tmp("started");
    let script = agent_script(
        &env,
        &format!("touch {:?}\nsleep 30", started.display().to_string()),
    );
    env.set_config(&daemon_config(
        &script,
        &[("shutdown_grace", "\"1s\"")],
        &[("kill_grace", "\"1s\"")],
        RIO,
    ));
    let mut d = env.daemon();
    let id = env.send("leo", "rio", &[]);
    d.wait_until(secs(30.0), "the agent is running", || started.exists());
    let s1 = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(secs(10.0));
    let took = t0.elapsed();
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    assert!(
        took < secs(5.0),
        "shutdown_grace 1s + kill_grace 1s, took {took:?}"
    );
    let s = session(&env, "rio");
    assert_eq!(s["session_id"], s1.as_str());
    assert_eq!(s["status"], "timeout");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("daemon stopped"),
        "{s}"
    );
    assert_ne!(env.json("rio", "report.json")["status"], "researching");
    assert!(
        files_under(&env.path("rio", "inbox/.claimed")).is_empty(),
        "claimed: {:?}",
        files_under(&env.path("rio", "inbox/.claimed"))
    );
    assert_eq!(
        env.waiting("rio"),
        [format!("{id}.json")],
        "the message is back in the inbox for the next session"
    );
    let hb = d.heartbeat();
    assert!(
        hb["stopping"] == true || hb["running"] == serde_json::json!([]),
        "{hb}"
    );
    assert_eq!(hb["running"], serde_json::json!([]), "{hb}");
}

#[test]
fn sigterm_lets_a_short_session_complete() {
    let env = Env::with_config("");
    let started = env.tmp("started");
    let script = agent_script(
        &env,
        &format!("touch {:?}\nsleep 1", started.display().to_string()),
    );
    env.set_config(&daemon_config(
        &script,
        &[("shutdown_grace", "\"10s\"")],
        &[],
        RIO,
    ));
    let mut d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30.0), "the agent is running", || started.exists());
    let t0 = Instant::now();
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(secs(12.0));
    assert_eq!(status.code(), Some(0));
    // It exited when the session ended, before its 10 s grace ran out.
    assert!(t0.elapsed() < secs(10.0), "{:?}", t0.elapsed());
    assert_eq!(session_status(&env, "rio"), "completed");
    assert_eq!(run_lines(&env, "end").len(), 1);
    let r = env.json("rio", "report.json");
    assert_eq!(r["status"], "idle");
    assert_eq!(r["last_session"]["outcome"], "completed");
    assert_eq!(d.heartbeat()["running"], serde_json::json!([]));
}

/// A session's end is recorded off the loop (a thousand renames into
/// `processed/`): a SIGTERM landing as it ends must wait for that record,
/// whenever it lands. Every message is in `processed/` or back in the inbox,
/// none in `.claimed/`, and the session is ended in every file.
#[test]
fn sigterm_as_a_big_session_ends_waits_for_its_end_to_be_recorded() {
    let env = Env::with_config("");
    let started = env.tmp("started");
    let script = agent_script(&env, &format!("touch {:?}", started.display().to_string()));
    env.set_config(&daemon_config(
        &script,
        &[("shutdown_grace", "\"10s\"")],
        &[],
        RIO,
    ));
    env.ok(&["bootstrap"]);
    let inbox = env.path("rio", "inbox");
    let total = 3000;
    for i in 0..total {
        std::fs::write(
            inbox.join(format!("20261126T000000-{i:06}-bench.json")),
            r#"{"from":"leo","subject":"s","priority":"high"}"#,
        )
        .unwrap();
    }
    let mut d = env.daemon();
    d.wait_until(secs(20.0), "the agent ran", || started.exists());
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(secs(30.0));
    assert_eq!(status.code(), Some(0), "{}", d.log_text());
    let count = |rel: &str| {
        std::fs::read_dir(env.path("rio", rel))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                    .count()
            })
            .unwrap_or(0)
    };
    let claimed: usize = std::fs::read_dir(env.path("rio", "inbox/.claimed"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| std::fs::read_dir(e.path()).map(|f| f.count()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(claimed, 0, "messages left in .claimed/");
    assert_eq!(count("inbox") + count("inbox/processed"), total);
    assert!(
        count("inbox/processed") > 0,
        "the session's messages were acknowledged"
    );
    let s = session(&env, "rio");
    assert_ne!(s["status"], "running", "{s}");
    let r = env.json("rio", "report.json");
    assert_eq!(r["last_session"]["id"], s["session_id"], "{r}");
    let ends = journal(&env, "rio")
        .iter()
        .filter(|e| e["event"] == "session_end" || e["event"] == "error")
        .count();
    let starts = journal(&env, "rio")
        .iter()
        .filter(|e| e["event"] == "session_start")
        .count();
    assert_eq!(starts, ends, "every session started was ended");
    assert_eq!(d.heartbeat()["running"], serde_json::json!([]));
    // And the daemon said so before it said it stopped: the rest of the end
    // (the log line, the verdict) ran on the loop, not lost at exit.
    let log = d.log_text();
    let said = log
        .find(&format!(
            "session {} completed",
            s["session_id"].as_str().unwrap()
        ))
        .unwrap_or_else(|| panic!("no completed line for the session:\n{log}"));
    let stopped = log
        .find("stopped: every session has ended")
        .expect("stopped line");
    assert!(said < stopped, "{log}");
}

// ---- 9. SIGHUP ----------------------------------------------------------------------------

#[test]
fn sighup_adds_a_new_agent_and_refuses_an_invalid_config() {
    let env = Env::with_config("");
    let script = agent_script(&env, "");
    env.set_config(&daemon_config(&script, &[], &[], RIO));
    let mut d = env.daemon();
    assert_eq!(d.heartbeat()["agents"], serde_json::json!(["rio"]));

    env.set_config(&daemon_config(&script, &[], &[], &format!("{RIO}{CLAY}")));
    d.signal(Signal::SIGHUP);
    d.wait_until(secs(30.0), "daemon.json lists clay", || {
        d.heartbeat()["agents"] == serde_json::json!(["clay", "rio"])
    });
    env.send("leo", "clay", &[]);
    d.wait_until(secs(30.0), "clay's session has completed", || {
        ended(&env, "clay", "completed")
    });

    // A broken config is refused; the old one stays in force.
    env.set_config(&daemon_config(
        &script,
        &[("max_concurrent_sessions", "0")],
        &[],
        &format!("{RIO}{CLAY}{LEO}"),
    ));
    d.signal(Signal::SIGHUP);
    d.wait_until(secs(30.0), "the log says the reload was refused", || {
        d.log_text().contains("config reload refused")
    });
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("config reload refused"))
        .unwrap()
        .to_string();
    assert!(
        log.contains("daemon.max_concurrent_sessions"),
        "the log names the bad field: {line}"
    );
    assert!(d.is_running());
    assert_eq!(d.heartbeat()["agents"], serde_json::json!(["clay", "rio"]));
    // Still serving clay (the CLI cannot read the broken config: drop by hand).
    drop_message(
        &env,
        "clay",
        "after-bad-reload.json",
        &message("leo", "still there?", "high"),
    );
    d.wait_until(secs(30.0), "clay's second session has completed", || {
        events(&env, "clay", "session_end").len() == 2
    });
    assert!(
        !env.agent("leo").exists(),
        "leo was in the refused config only"
    );
}

// ---- 10. agent-state wake -------------------------------------------------------------------

#[test]
fn wake_starts_a_session_at_once_and_says_when_it_cannot() {
    let env = setup("", &[], &[], &format!("{RIO}{MARCUS}"));
    env.ok(&["bootstrap"]);
    let err = env.fails(&["wake", "rio"], 69);
    assert!(err.contains("no agent-state daemon is running"), "{err}");

    let mut d = env.daemon();
    // --wait returns once the session has started (within its bound; no
    // timed assertion on a machine that may be busy).
    let out = env.ok(&["wake", "rio", "--wait", "30s"]);
    let id = out.trim();
    assert_eq!(id.len(), 15, "prints the session id: {out:?}");
    d.wait_until(secs(30.0), "the session has completed", || {
        ended(&env, "rio", "completed")
    });
    assert_eq!(session(&env, "rio")["session_id"], id);

    let err = env.fails(&["wake", "marcus"], 64);
    assert!(err.contains("human mailbox"), "{err}");
    assert!(!env.path("marcus", "session.json").exists());

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(secs(10.0)).code(), Some(0));
    let err = env.fails(&["wake", "rio"], 69);
    assert!(err.contains("no agent-state daemon is running"), "{err}");
}

// ---- 11-13. overlap, the global limit, one daemon per root ----------------------------------

#[test]
fn wakes_while_running_are_skipped_and_coalesced_into_one_follow_up() {
    let env = Env::with_config("");
    let first = env.tmp("first-done");
    let script = agent_script(
        &env,
        &format!(
            "if [ ! -e {f:?} ]; then sleep 3; touch {f:?}; fi",
            f = first.display().to_string()
        ),
    );
    env.set_config(&daemon_config(&script, &[], &[], &format!("{RIO}{CLAY}")));
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30.0), "the first session runs", || {
        run_lines(&env, "start").len() == 1
    });
    let s1 = run_lines(&env, "start")[0][2].clone();
    for _ in 0..2 {
        env.ok(&["wake", "rio"]);
        d.wait_until(secs(30.0), "the wake request was taken", || {
            !env.files("rio", "inbox")
                .iter()
                .any(|n| n.starts_with(".wake-"))
        });
    }
    let id = env.send("leo", "rio", &[]);
    d.wait_until(secs(30.0), "three wake_skipped entries", || {
        events(&env, "rio", "wake_skipped").len() >= 3
    });
    assert!(
        run_lines(&env, "end").is_empty(),
        "the wakes came while the first session ran"
    );
    let skipped = events(&env, "rio", "wake_skipped");
    assert!(
        skipped.iter().all(|e| e["running_session"] == s1.as_str()),
        "{skipped:?}"
    );
    let reasons: Vec<&str> = skipped
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "manual").count(),
        2,
        "{reasons:?}"
    );
    assert!(reasons.contains(&"inbox"), "{reasons:?}");

    d.wait_until(secs(8.0), "the follow-up session has ended", || {
        events(&env, "rio", "session_end").len() == 2
    });
    // A follow-up per wake would start in the turn after the end: before
    // the fence's session.
    fence(&env, &d, "clay");
    let starts = events(&env, "rio", "session_start");
    assert_eq!(
        starts.len(),
        2,
        "one follow-up, not one per wake: {:?}",
        runs(&env)
    );
    assert_eq!(starts[1]["messages"], serde_json::json!([id.clone()]));
    assert_eq!(processed(&env, "rio"), [format!("{id}.json")]);
}

/// (agent, start, end) of every run, from the `runs` file.
fn intervals(env: &Env) -> Vec<(String, f64, f64)> {
    let lines = runs(env);
    let mut out: Vec<(String, f64, f64)> = lines
        .iter()
        .filter(|l| l[0] == "start")
        .map(|s| {
            let end = lines
                .iter()
                .find(|e| e[0] == "end" && e[2] == s[2] && e[1] == s[1])
                .unwrap_or_else(|| panic!("no end for {s:?}"));
            (s[1].clone(), s[4].parse().unwrap(), end[4].parse().unwrap())
        })
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

#[test]
fn max_concurrent_sessions_one_never_runs_two_at_once() {
    let env = setup(
        "sleep 0.5",
        &[("max_concurrent_sessions", "1")],
        &[],
        &format!("{RIO}{CLAY}{LEO}"),
    );
    let d = env.daemon();
    for agent in ["rio", "clay", "leo"] {
        env.ok(&["wake", agent]);
    }
    d.wait_until(secs(10.0), "all three sessions have ended", || {
        run_lines(&env, "end").len() == 3
    });
    let runs = intervals(&env);
    let mut agents: Vec<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    agents.sort();
    assert_eq!(agents, ["clay", "leo", "rio"]);
    for pair in runs.windows(2) {
        assert!(
            pair[1].1 >= pair[0].2,
            "{} started at {} before {} ended at {}",
            pair[1].0,
            pair[1].1,
            pair[0].0,
            pair[0].2
        );
    }
    for agent in ["rio", "clay", "leo"] {
        d.wait_until(secs(30.0), "every session is recorded completed", || {
            ended(&env, agent, "completed")
        });
    }
}

#[test]
fn a_high_priority_wake_is_served_before_normal_ones_that_waited() {
    let env = setup(
        "if [ \"$AGENT_STATE_AGENT\" = rio ]; then sleep 1.5; fi",
        &[("max_concurrent_sessions", "1")],
        &[],
        &format!("{RIO}{CLAY}{LEO}"),
    );
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30.0), "rio runs", || {
        run_lines(&env, "start").len() == 1
    });
    env.send("theseus", "clay", &[]);
    d.wait_until(secs(30.0), "clay waits for a slot", || {
        d.heartbeat()["waiting"]
            .as_array()
            .is_some_and(|w| w.iter().any(|a| a == "clay"))
    });
    env.send("theseus", "leo", &["--priority", "high"]);
    d.wait_until(secs(30.0), "leo waits for a slot", || {
        d.heartbeat()["waiting"]
            .as_array()
            .is_some_and(|w| w.iter().any(|a| a == "leo"))
    });
    assert_eq!(run_lines(&env, "start").len(), 1, "still only rio");
    d.wait_until(secs(10.0), "all three sessions have ended", || {
        run_lines(&env, "end").len() == 3
    });
    let order: Vec<String> = intervals(&env).into_iter().map(|r| r.0).collect();
    assert_eq!(order, ["rio", "leo", "clay"], "high priority first");
}

#[test]
fn a_second_daemon_on_the_same_root_refuses_to_start() {
    let env = setup("", &[], &[], RIO);
    let mut d = env.daemon();
    let mut second = env
        .command(&["daemon"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = poll_until(secs(10.0), || matches!(second.try_wait(), Ok(Some(_))));
    if !exited {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    assert!(exited, "the second daemon kept running");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("already running"), "{stderr}");
    assert!(d.is_running(), "the first daemon is untouched");
    assert_eq!(d.heartbeat()["pid"], d.pid);
}

#[test]
fn a_message_claimed_by_a_manual_wake_does_not_start_a_second_empty_session() {
    // The message starts a 1 s debounce; the wake starts a session at once,
    // which claims the message. When the debounce runs out there is nothing
    // left in the inbox: no second session.
    let env = setup(
        "",
        &[],
        &[("inbox_debounce", "\"1s\"")],
        &format!("{RIO}{CLAY}"),
    );
    let d = env.daemon();
    let id = env.send("leo", "rio", &[]);
    env.ok(&["wake", "rio"]);
    d.wait_until(secs(30.0), "the woken session has completed", || {
        ended(&env, "rio", "completed")
    });
    let starts = events(&env, "rio", "session_start");
    assert_eq!(starts[0]["messages"], serde_json::json!([id.clone()]));
    // Kept: the 1 s debounce the message started must run out (it began
    // before the session ended; the time under test); the fence then
    // proves a loop turn has looked since.
    std::thread::sleep(secs(1.0));
    fence(&env, &d, "clay");
    let starts = events(&env, "rio", "session_start");
    assert_eq!(
        starts.len(),
        1,
        "a second session started with an empty inbox: {starts:?}"
    );
}

#[test]
fn a_root_removed_and_made_again_under_a_daemon_still_has_one_daemon() {
    let env = Env::standard();
    // The runtime lock's directory, the test's own (as $XDG_RUNTIME_DIR).
    let runtime = env.tmp("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let xdg = [("XDG_RUNTIME_DIR", runtime.to_str().unwrap())];
    let mut first = Daemon::start(&env, &xdg);
    // As ops/demo.sh did: remove the root and bootstrap it again.
    std::fs::remove_dir_all(&env.root).unwrap();
    env.ok(&["bootstrap"]);
    // A second daemon on the new root is refused while the first still runs
    // on it; the first notices that the root it locked is gone and stops
    // (not 0: systemd restarts it on the new root). Never two at once.
    let mut second = env
        .command(&["daemon"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let refused = poll_until(secs(10.0), || second.try_wait().unwrap().is_some());
    let status = first.wait_exit(secs(20.0));
    assert_eq!(status.code(), Some(69), "{}", first.log_text());
    assert!(
        first
            .log_text()
            .contains("no longer the lock this daemon took")
    );
    if refused {
        let out = second.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(64));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("another agent-state daemon is already running"),
            "{err}"
        );
    } else {
        // The first had already stopped when the second started (its check
        // came first on a loaded machine): still one daemon at a time.
        let _ = second.kill();
        let _ = second.wait();
    }
    // Now one daemon starts on the new root.
    let _again = Daemon::start(&env, &xdg);
}

/// One pass per message: the end records what the claim read and the
/// session was given, not what the claimed file says by then.
#[test]
fn the_end_records_the_messages_as_the_session_was_given_them() {
    let middle = r#"for f in "$AGENT_STATE_DIR"/inbox/.claimed/"$AGENT_STATE_SESSION_ID"/*.json; do
  sed -i 's/the original subject/an edited subject/' "$f"
done"#;
    let env = setup(middle, &[], &[("inbox_debounce", "\"0s\"")], RIO);
    let d = env.daemon();
    let flag = serde_json::json!({
        "from": "leo",
        "type": "flag",
        "priority": "high",
        "subject": "Flag: the original subject",
        "body": "see the claim",
    })
    .to_string();
    drop_message(&env, "rio", "m-flag.json", &flag);
    d.wait_until(secs(10.0), "the session has completed", || {
        ended(&env, "rio", "completed")
    });
    d.wait_until(secs(30.0), "the message is in processed/", || {
        processed(&env, "rio") == ["m-flag.json"]
    });
    let end = events(&env, "rio", "session_end");
    assert_eq!(end.len(), 1);
    assert_eq!(end[0]["messages_processed"], serde_json::json!(["m-flag"]));
    assert_eq!(end[0]["flags_received"], 1);
    let memory = std::fs::read_to_string(env.path("rio", "memory.md")).unwrap();
    assert!(
        memory.contains("Flag: the original subject"),
        "memory.md records the flag as the session was given it:\n{memory}"
    );
    assert!(!memory.contains("an edited subject"), "{memory}");
    // The file itself went to processed/ as it was left.
    let kept = std::fs::read_to_string(env.path("rio", "inbox/processed/m-flag.json")).unwrap();
    assert!(kept.contains("an edited subject"), "{kept}");
}
