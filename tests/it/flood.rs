//! A member of the inbox group floods one agent's inbox with wake requests
//! and junk: every other agent is still served at once, and the daemon
//! still stops promptly at SIGTERM. The flood is made while the daemon
//! watches (every file an inotify event), as a hostile member would.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::{Daemon, Env, daemon_config};

const AGENTS: &str = "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"leo\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n";

/// Wake requests and junk files dropped into rio's inbox (each).
const FLOOD: usize = 20_000;

fn setup() -> Env {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $(date +%s.%N)\" >> {:?}\n\
             # rio's session outlasts the flood: every request waits for it.\n\
             if [ \"$AGENT_STATE_AGENT\" = rio ]; then sleep 600; fi\n\
             echo done",
            runs.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        // Its timeout too, however long a busy machine takes to make and
        // serve the flood (the test's SIGTERM ends it).
        &[("inbox_debounce", "\"0s\""), ("timeout", "\"15m\"")],
        AGENTS,
    ));
    env.ok(&["bootstrap"]);
    env
}

fn started(env: &Env, agent: &str) -> usize {
    std::fs::read_to_string(env.tmp("runs"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(agent))
        .count()
}

#[test]
fn a_flooded_inbox_delays_no_other_agent_nor_the_stop() {
    let env = setup();
    let mut daemon = env.daemon();
    let inbox = env.path("rio", "inbox");
    let made = Instant::now();
    for i in 0..FLOOD {
        std::fs::File::create(inbox.join(format!(".wake-flood-{i:06}"))).expect("wake request");
        std::fs::File::create(inbox.join(format!("junk-{i:06}.txt"))).expect("junk");
    }
    let made = made.elapsed();
    // Leo's mail is served as it would be without the flood: within
    // seconds, not after the daemon has worked through rio's inbox.
    let sent = Instant::now();
    env.send("marcus", "leo", &[]);
    daemon.wait_until(
        Duration::from_secs(20),
        "leo's session starts despite rio's flooded inbox",
        || started(&env, "leo") >= 1,
    );
    let served_in = sent.elapsed();
    // The flood is one wake of rio, however many requests it holds.
    daemon.wait_until(
        Duration::from_secs(20),
        "rio's wake requests are served",
        || started(&env, "rio") >= 1,
    );
    daemon.wait_until(
        Duration::from_secs(60),
        "every wake request is removed from rio's inbox",
        || {
            std::fs::read_dir(&inbox)
                .map(|d| {
                    !d.flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with(".wake-"))
                })
                .unwrap_or(false)
        },
    );
    let stop = Instant::now();
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "the daemon stops cleanly: {status:?}");
    let stopped_in = stop.elapsed();
    assert_eq!(
        started(&env, "rio"),
        1,
        "{FLOOD} wake requests made during one session of rio wait for it (and the stop ends them)"
    );
    let skipped = env.events("rio", "wake_skipped").len();
    assert!(
        skipped <= 10,
        "the requests made while rio's session ran are a few journal lines, not {skipped}"
    );
    eprintln!(
        "flood of {FLOOD} wake requests and {FLOOD} junk files made in {made:?}; leo served in {served_in:?}; stopped in {stopped_in:?}"
    );
}

/// Invalid `.json` files dropped into rio's inbox.
const JUNK: usize = 5_000;

#[test]
fn junk_messages_in_one_inbox_are_rejected_a_few_at_a_time() {
    let env = setup();
    let mut daemon = env.daemon();
    let inbox = env.path("rio", "inbox");
    // Complete JSON with a field missing: judged at once, rejected (a
    // rename, a reason file, their syncs each). Written aside and renamed
    // in, as a sender would, so that they arrive together.
    let aside = env.tmp("junk");
    std::fs::create_dir(&aside).expect("junk dir");
    for i in 0..JUNK {
        std::fs::write(
            aside.join(format!("junk-{i:05}.json")),
            "{\"subject\": \"no from\"}",
        )
        .expect("junk");
    }
    for i in 0..JUNK {
        let name = format!("junk-{i:05}.json");
        std::fs::rename(aside.join(&name), inbox.join(&name)).expect("rename in");
    }
    let rejected = inbox.join("rejected");
    daemon.wait_until(
        Duration::from_secs(60),
        "the daemon starts rejecting rio's junk",
        || std::fs::read_dir(&rejected).is_ok_and(|mut d| d.next().is_some()),
    );
    let sent = Instant::now();
    env.send("marcus", "leo", &[]);
    daemon.wait_until(
        Duration::from_secs(10),
        "leo's session starts while rio's junk is rejected",
        || started(&env, "leo") >= 1,
    );
    let served_in = sent.elapsed();
    let stop = Instant::now();
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "the daemon stops cleanly: {status:?}");
    let stopped_in = stop.elapsed();
    let left = std::fs::read_dir(&inbox)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("junk-"))
                .count()
        })
        .unwrap_or(0);
    eprintln!(
        "{JUNK} junk messages: leo served in {served_in:?}; stopped in {stopped_in:?} with {left} not yet rejected"
    );
}

/// Junk files that make rio's inbox directory big (past the daemon's
/// `inbox::BIG_INBOX_BYTES`, 256 KiB: about 7,000 entries on ext4).
const BIG: usize = 20_000;

#[test]
fn a_big_inbox_is_listed_off_the_loop_and_its_mail_claimed_once() {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $(date +%s.%N)\" >> {:?}\necho done",
            runs.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"0s\"")],
        AGENTS,
    ));
    env.ok(&["bootstrap"]);
    let inbox = env.path("rio", "inbox");
    for i in 0..BIG {
        std::fs::File::create(inbox.join(format!("junk-{i:06}.txt"))).expect("junk");
    }
    let mut daemon = Daemon::start(&env, &[("AGENT_STATE_LOG", "debug")]);
    let ids: Vec<String> = (0..3).map(|_| env.send("marcus", "rio", &[])).collect();
    let processed = inbox.join("processed");
    daemon.wait_until(
        Duration::from_secs(30),
        "rio's three messages are claimed and acknowledged",
        || std::fs::read_dir(&processed).is_ok_and(|d| d.flatten().count() >= 3),
    );
    env.send("marcus", "leo", &[]);
    daemon.wait_until(Duration::from_secs(20), "leo is served", || {
        started(&env, "leo") >= 1
    });
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "the daemon stops cleanly: {status:?}");
    let log = daemon.log_text();
    assert!(
        log.contains("its inbox is big: listed off the loop"),
        "rio's inbox was listed off the loop:\n{log}"
    );
    // Each message claimed by exactly one session, none set aside.
    let mut claimed: Vec<String> = env
        .events("rio", "session_start")
        .iter()
        .flat_map(|e| {
            e["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|m| m.as_str().map(str::to_string))
        })
        .collect();
    claimed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(claimed, want, "every message claimed once");
    let rejected = std::fs::read_dir(inbox.join("rejected"))
        .map(|d| d.flatten().count())
        .unwrap_or(0);
    assert_eq!(rejected, 0, "nothing set aside");
    assert!(
        env.events("rio", "wake_skipped")
            .iter()
            .all(|e| e["running_session"] != ""),
        "no wake journaled as skipped for a session not begun yet"
    );
}

/// Messages trickled into rio's inbox while its session runs.
const TRICKLE: usize = 200;

#[test]
fn mail_to_a_running_session_is_looked_at_once_a_second_and_followed_up_once() {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let first = env.tmp("first");
    let release = env.tmp("release");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT $(date +%s.%N)\" >> {runs:?}\n\
             # rio's first session runs until the test releases it.\n\
             if [ \"$AGENT_STATE_AGENT\" = rio ] && [ ! -e {first:?} ]; then\n\
               touch {first:?}\n\
               while [ ! -e {release:?} ]; do sleep 0.05; done\n\
             fi\n\
             echo done",
            runs = runs.display().to_string(),
            first = first.display().to_string(),
            release = release.display().to_string(),
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"0s\""), ("timeout", "\"15m\"")],
        AGENTS,
    ));
    env.ok(&["bootstrap"]);
    let daemon = env.daemon();
    env.ok(&["wake", "rio"]);
    daemon.wait_until(Duration::from_secs(30), "rio's first session runs", || {
        first.exists()
    });
    // A steady trickle, as senders in the inbox group make it: each
    // message written aside and renamed in, a few milliseconds apart.
    let inbox = env.path("rio", "inbox");
    let aside = env.tmp("aside");
    std::fs::create_dir(&aside).expect("aside");
    let ids: Vec<String> = (0..TRICKLE).map(|i| format!("trickle-{i:04}")).collect();
    let began = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let name = format!("{id}.json");
        std::fs::write(
            aside.join(&name),
            format!("{{\"from\": \"leo\", \"subject\": \"note {i}\"}}"),
        )
        .expect("message");
        std::fs::rename(aside.join(&name), inbox.join(&name)).expect("rename in");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&release, "").expect("release");
    let ran = began.elapsed();
    let processed = inbox.join("processed");
    daemon.wait_until(
        Duration::from_secs(60),
        "a follow-up session has claimed and acknowledged the trickle",
        || {
            daemon.idle()
                && std::fs::read_dir(&processed).is_ok_and(|d| d.flatten().count() >= TRICKLE)
        },
    );
    // Looked at once a second at most while the session ran, and once
    // more at its end: a few journal lines, not one per message.
    let skipped = env.events("rio", "wake_skipped");
    let bound = ran.as_secs_f64().ceil() as usize + 2;
    assert!(
        !skipped.is_empty() && skipped.len() <= bound,
        "{} wake_skipped lines for {TRICKLE} messages in {ran:?} (at most {bound}): {skipped:?}",
        skipped.len()
    );
    // Every message journaled as received once, claimed by the one
    // follow-up session, and acknowledged.
    let received: Vec<String> = env
        .events("rio", "message_received")
        .iter()
        .filter_map(|e| e["message_id"].as_str().map(str::to_string))
        .collect();
    for id in &ids {
        assert_eq!(
            received.iter().filter(|r| *r == id).count(),
            1,
            "{id} journaled as received once: {received:?}"
        );
    }
    let starts = env.events("rio", "session_start");
    assert_eq!(
        starts.len(),
        2,
        "the first session and one follow-up: {starts:?}"
    );
    let mut claimed: Vec<String> = starts[1]["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect();
    claimed.sort();
    assert_eq!(claimed, ids, "the follow-up claimed the whole trickle");
    assert_eq!(
        env.files("rio", "inbox/processed").len(),
        TRICKLE,
        "each message acknowledged once"
    );
}
