//! A flood of wake requests for one agent (any member of the inbox group can
//! make them) starts its sessions at most once per `wake_request_interval`,
//! not one after another; another agent's wake is served at once meanwhile,
//! and a request after the flood is still served.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{Daemon, Env, daemon_config};

/// rio's `wake_request_interval` (an `[[agent]]` override of the default).
const INTERVAL_S: f64 = 5.0;
/// How long the flood goes on: long enough for two intervals.
const FLOOD_FOR: Duration = Duration::from_secs(11);

fn setup() -> Env {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $(date +%s.%N)\" >> {:?}\necho done",
            runs.display().to_string()
        ),
    );
    let agents = format!(
        "[[agent]]\nname = \"rio\"\nwake_request_interval = \"{INTERVAL_S}s\"\n\n\
         [[agent]]\nname = \"leo\"\n"
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"0s\"")],
        &agents,
    ));
    env.ok(&["bootstrap"]);
    env
}

/// When each session of `agent` started (its script's clock, seconds).
fn starts(env: &Env, agent: &str) -> Vec<f64> {
    std::fs::read_to_string(env.tmp("runs"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(agent))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect()
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// No session of `agent` running: every start journaled has its end, and
/// daemon.json lists none.
fn idle(env: &Env, d: &Daemon, agent: &str) -> bool {
    env.events(agent, "session_start").len() == env.events(agent, "session_end").len()
        && !d.heartbeat()["running"].to_string().contains(agent)
}

#[test]
fn a_flood_of_wake_requests_starts_one_session_per_interval() {
    let env = setup();
    let mut daemon = env.daemon();
    let inbox = env.path("rio", "inbox");
    // A wake request every millisecond or so, for FLOOD_FOR.
    let done = Arc::new(AtomicBool::new(false));
    let flood = {
        let inbox = inbox.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut made = 0usize;
            while t0.elapsed() < FLOOD_FOR {
                std::fs::File::create(inbox.join(format!(".wake-flood-{made:07}")))
                    .expect("wake request");
                made += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            done.store(true, Ordering::SeqCst);
            made
        })
    };
    daemon.wait_until(
        Duration::from_secs(20),
        "rio's first session starts",
        || !starts(&env, "rio").is_empty(),
    );
    // Leo is not held by rio's interval: its wake request, made just after
    // a session of rio began, is served at once.
    let asked = now_s();
    let leo = env.ok(&["wake", "leo", "--wait", "10s"]);
    assert!(!leo.trim().is_empty(), "leo's session id: {leo}");
    let leo_started = starts(&env, "leo")[0];
    let made = flood.join().expect("flood thread");
    assert!(done.load(Ordering::SeqCst));
    // After the flood: a request made while rio is idle is still served,
    // once the interval since its last request-started session has passed.
    daemon.wait_until(Duration::from_secs(20), "rio is idle", || {
        idle(&env, &daemon, "rio")
    });
    let before = starts(&env, "rio").len();
    env.ok(&["wake", "rio", "--wait", "10s"]);
    daemon.wait_until(
        Duration::from_secs(20),
        "every wake request is removed from rio's inbox",
        || {
            std::fs::read_dir(&inbox).is_ok_and(|d| {
                !d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(".wake-"))
            })
        },
    );
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "the daemon stops cleanly: {status:?}");

    let rio = starts(&env, "rio");
    assert!(rio.len() > before, "the request after the flood is served");
    // Starts are the script's clock, after the daemon's own start: allow
    // for one exec being slower than the next on a busy machine.
    let gaps: Vec<f64> = rio.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g >= INTERVAL_S * 0.8),
        "{made} wake requests over {FLOOD_FOR:?}: rio's sessions began at least {INTERVAL_S} s apart, gaps {gaps:?}"
    );
    let span = rio.last().unwrap() - rio[0];
    assert!(
        rio.len() as f64 <= span / INTERVAL_S + 1.5,
        "at most one session per interval: {} sessions over {span:.1} s",
        rio.len()
    );
    assert!(
        rio.len() >= 3,
        "the flood is served (a session per interval while it lasts), not dropped: {rio:?}"
    );
    assert!(
        leo_started - asked < INTERVAL_S * 0.6,
        "leo's wake waited {:.2} s: rio's interval holds only rio",
        leo_started - asked
    );
    eprintln!(
        "{made} wake requests over {FLOOD_FOR:?}: {} sessions of rio, gaps {gaps:?}; leo served in {:.2} s",
        rio.len(),
        leo_started - asked
    );
}

#[test]
fn wake_requests_in_a_big_inbox_at_start_are_one_wake() {
    let env = setup();
    let inbox = env.path("rio", "inbox");
    // Past the daemon's big-inbox size (256 KiB of directory): listed off
    // the loop at start, its requests served when the listing is back.
    for i in 0..12_000 {
        std::fs::File::create(inbox.join(format!("junk-{i:06}.txt"))).expect("junk");
    }
    for i in 0..3_000 {
        std::fs::File::create(inbox.join(format!(".wake-early-{i:06}"))).expect("request");
    }
    let mut daemon = Daemon::start(&env, &[("AGENT_STATE_LOG", "debug")]);
    daemon.wait_until(
        Duration::from_secs(30),
        "the requests made before the start are served and removed",
        || {
            !starts(&env, "rio").is_empty()
                && std::fs::read_dir(&inbox).is_ok_and(|d| {
                    !d.flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with(".wake-"))
                })
        },
    );
    env.ok(&["wake", "leo", "--wait", "10s"]);
    daemon.wait_until(Duration::from_secs(20), "rio is idle", || {
        idle(&env, &daemon, "rio")
    });
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "the daemon stops cleanly: {status:?}");
    assert_eq!(
        starts(&env, "rio").len(),
        1,
        "3,000 requests made while the daemon was down are one wake"
    );
    let log = daemon.log_text();
    assert!(
        log.contains("its inbox is big: listed off the loop before it is scanned"),
        "the start-up scan lists the big inbox off the loop:\n{log}"
    );
    assert!(
        !log.contains("wake requests or more"),
        "3,000 requests, removed in one batch, are no backlog to warn about:\n{log}"
    );
}
