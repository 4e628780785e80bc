//! A first start killed at any moment: the bootstrap of many agents writes
//! their files in batches (temp files, one `syncfs`, renames, one more
//! `syncfs`), and a SIGKILL anywhere in that leaves each file absent or
//! whole. The next start completes every agent and `check` finds every
//! file valid: no empty or partial report.json.
//!
//! Each round takes a fresh state root, starts a first start (`bootstrap`
//! or the daemon, in turn) and kills it after a delay spread over the time
//! a whole first start took. `AGENT_STATE_CRASH_ITERATIONS` (set by
//! `.ci/run`) asks for the long run: 2,000 agents and up to 10 rounds;
//! without it, 300 agents and 4 rounds.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{Env, daemon_config};

/// Agents and rounds: the long run when `.ci/run` asks for crash iterations.
fn size() -> (usize, usize) {
    match std::env::var("AGENT_STATE_CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        Some(n) => (2000, n.clamp(2, 10)),
        None => (300, 4),
    }
}

fn env_with(agents: usize) -> Env {
    let mut body = String::new();
    for i in 0..agents {
        body.push_str(&format!("[[agent]]\nname = \"a{i:04}\"\n\n"));
    }
    let env = Env::with_config("");
    let command = env.script("agent.sh", "exit 0");
    env.set_config(&daemon_config(&command, &[], &[], &body));
    env
}

/// Start the first start's process: `bootstrap`, or the daemon.
fn first_start(env: &Env, daemon: bool) -> std::process::Child {
    let mut cmd = env.command(if daemon { &["daemon"] } else { &["bootstrap"] });
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        cmd.env_remove(var);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn agent-state")
}

/// How long an uninterrupted first start of `agents` takes here (the
/// bootstrap's; the daemon's adds little): the range the kills spread over.
fn whole_first_start(agents: usize) -> Duration {
    let env = env_with(agents);
    let started = Instant::now();
    let out = first_start(&env, false).wait().expect("wait bootstrap");
    assert!(
        out.success(),
        "bootstrap of {agents} agents failed: {out:?}"
    );
    started.elapsed()
}

/// Every agent's state files present and whole: the JSON ones parse (an
/// empty file does not), memory.md is not empty.
fn assert_whole(root: &Path, agents: usize, round: usize) {
    for i in 0..agents {
        let dir = root.join(format!("a{i:04}"));
        for file in ["report.json", "tasks.json", "metrics.json"] {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("round {round}: {}: {e}", path.display()));
            let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!(
                    "round {round}: {} is not whole JSON ({e}): {text:?}",
                    path.display()
                )
            });
            assert_eq!(value["agent"], format!("a{i:04}"), "{}", path.display());
        }
        let memory = std::fs::read_to_string(dir.join("memory.md")).unwrap_or_default();
        assert!(
            !memory.is_empty(),
            "round {round}: a{i:04}/memory.md is empty"
        );
    }
}

#[test]
fn a_first_start_killed_at_any_moment_leaves_whole_files_and_the_next_completes_it() {
    let (agents, rounds) = size();
    let whole = whole_first_start(agents);
    let mut killed_midway = 0;
    for round in 0..rounds {
        let env = env_with(agents);
        let daemon = round % 2 == 1;
        // Spread over the whole first start, from its very beginning to
        // just before its end.
        let delay = whole.mul_f64(round as f64 / rounds as f64);
        let mut child = first_start(&env, daemon);
        let started = Instant::now();
        // The moment of the kill: a delay, not a state to wait for.
        while started.elapsed() < delay && child.try_wait().expect("try_wait").is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        child.wait().expect("reap the first start");
        // Killed partway: some agents begun, not every one complete.
        let begun = crate::support::list(&env.root)
            .iter()
            .filter(|n| n.starts_with('a'))
            .count();
        let complete = (0..agents)
            .filter(|i| env.root.join(format!("a{i:04}/journal.jsonl")).exists())
            .count();
        if begun > 0 && complete < agents {
            killed_midway += 1;
        }

        // Whatever the first start left parses or is absent.
        for i in 0..agents {
            let report = env.root.join(format!("a{i:04}/report.json"));
            if let Ok(text) = std::fs::read_to_string(&report) {
                assert!(
                    serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                    "round {round} (killed after {delay:?}): {} is partial: {text:?}",
                    report.display()
                );
            }
        }
        // The next start completes every agent, and check finds nothing wrong.
        env.ok(&["bootstrap"]);
        assert_whole(&env.root, agents, round);
        let check = env.run(&["check"]);
        assert!(
            check.status.success(),
            "round {round} (killed after {delay:?}, daemon: {daemon}): check failed\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        assert!(
            String::from_utf8_lossy(&check.stdout).contains("no problems found"),
            "round {round}: {}",
            String::from_utf8_lossy(&check.stdout)
        );
        // A second start of the daemon serves them all.
        if round == rounds - 1 {
            let d = env.daemon();
            d.wait_until(
                Duration::from_secs(60),
                "every agent is in daemon.json",
                || {
                    let hb = d.heartbeat();
                    let listed = hb["agents"].as_object().map(|a| a.len());
                    listed.or(hb["agents"].as_array().map(|a| a.len())) == Some(agents)
                },
            );
        }
    }
    assert!(
        killed_midway > 0,
        "no round killed a first start midway ({rounds} rounds over {whole:?})"
    );
}
