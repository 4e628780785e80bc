//! One agent's damaged or unsafe file never stops the others, nor the
//! agent's own recording: a rotated journal segment that does not
//! decompress is skipped by every reader, set aside by the daemon and by
//! `check --repair`; `status` and `usage` show an agent whose files cannot
//! be read as unreadable, with the reason, and everyone else as usual.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// The rotated segments of `agent`'s journal.
fn segments(env: &Env, agent: &str) -> Vec<String> {
    list(&env.agent(agent))
        .into_iter()
        .filter(|n| n.starts_with("journal.jsonl.") && n.ends_with(".zst"))
        .collect()
}

/// Sessions of `agent` under the daemon `d` until its journal has been
/// rotated into a segment at least once (the config rotates at 1 KiB).
fn run_until_rotated(env: &Env, d: &Daemon, agent: &str) {
    for _ in 0..30 {
        if !segments(env, agent).is_empty() {
            return;
        }
        let ends = env.events(agent, "session_end").len();
        env.ok(&["wake", agent, "--wait", "60s"]);
        // Ended in the journal, and no longer the daemon's (it finishes the
        // end after the journal line: a wake before that is skipped).
        d.wait_until(Duration::from_secs(30), "the session ended", || {
            (env.events(agent, "session_end").len() > ends && d.idle())
                || !segments(env, agent).is_empty()
        });
    }
    d.wait_until(Duration::from_secs(30), "a rotated segment", || {
        !segments(env, agent).is_empty()
    });
}

/// Flip four bytes of `path` from `at`.
fn flip_bytes(path: &std::path::Path, at: impl Fn(usize) -> usize) {
    let mut bytes = std::fs::read(path).unwrap();
    assert!(bytes.len() > 24, "a segment of {} bytes", bytes.len());
    let at = at(bytes.len());
    for b in &mut bytes[at..at + 4] {
        *b ^= 0xff;
    }
    std::fs::write(path, bytes).unwrap();
}

fn env_with_rotation() -> Env {
    let env = Env::with_config("");
    let agent = env.script("agent.sh", "echo \"worked on $1\"");
    let sections = "[health]\ninterval = \"1s\"\n\n[logs]\nrotate_size = \"1KiB\"\n\n[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"leo\"\n";
    env.set_config(&daemon_config(&agent, &[], &[], sections));
    env.ok(&["bootstrap"]);
    env
}

#[test]
fn a_corrupt_rotated_segment_is_set_aside_and_recording_goes_on() {
    // On main: "cannot record the end of session … yet" every second for
    // ever, the agent `running`, `check --repair` exit 74 mending nothing,
    // and `status`/`usage`/`metrics rebuild` failing for the whole fleet.
    let env = env_with_rotation();
    let d = env.daemon();
    run_until_rotated(&env, &d, "rio");
    run_until_rotated(&env, &d, "leo");
    drop(d);
    let rio_segment = env.agent("rio").join(&segments(&env, "rio")[0]);
    let leo_segment = env.agent("leo").join(&segments(&env, "leo")[0]);
    // rio's frame header (what main could not decompress either), leo's
    // content (found by the checksum segments now carry).
    flip_bytes(&rio_segment, |_| 0);
    flip_bytes(&leo_segment, |len| len / 2);

    // Every reader of the fleet goes on, without the damaged history.
    let status = env.ok(&["status"]);
    assert!(status.contains("rio") && status.contains("leo"), "{status}");
    env.ok(&["usage"]);
    env.ok(&["metrics", "rebuild"]);
    env.ok(&["events", "--json"]);

    // `check` names the segment; it changes nothing.
    let out = env.run(&["check"]);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let leo_name = leo_segment
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    assert!(
        text.contains(&leo_name) && text.contains("cannot be read"),
        "{text}"
    );
    assert!(leo_segment.exists() && rio_segment.exists());

    // The daemon records rio's next session to its end, and sets the bad
    // segment aside, saying so in errors.jsonl.
    let d = env.daemon();
    let ends = env.events("rio", "session_end").len();
    env.ok(&["wake", "rio", "--wait", "60s"]);
    d.wait_until(
        Duration::from_secs(30),
        "rio's session end recorded",
        || {
            env.events("rio", "session_end").len() > ends
                && env.json("rio", "report.json")["status"] != "running"
        },
    );
    d.wait_until(Duration::from_secs(30), "the segment set aside", || {
        !rio_segment.exists()
    });
    let aside: Vec<String> = list(&env.agent("rio"))
        .into_iter()
        .filter(|n| n.contains(".zst.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{:?}", list(&env.agent("rio")));
    // The daemon notes the repair after the rename (its notes are written
    // to errors.jsonl by its loop): wait for the line itself.
    d.wait_until(
        Duration::from_secs(30),
        "STATE_CORRUPT \"set aside as\" in `errors --json`",
        || {
            let errors: Value =
                serde_json::from_str(&env.ok(&["errors", "--json"])).expect("errors --json");
            errors.as_array().unwrap().iter().any(|e| {
                e["code"] == "STATE_CORRUPT"
                    && e["message"].as_str().unwrap_or("").contains("set aside as")
            })
        },
    );
    drop(d);

    // `check --repair` sets leo's aside; then `check` is clean, and says
    // what was set aside.
    let out = env.run(&["check", "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("set aside as"), "{text}");
    assert!(!leo_segment.exists());
    let clean = env.ok(&["check"]);
    assert!(clean.contains("set aside as unreadable"), "{clean}");
}

#[test]
fn status_and_usage_show_an_agent_with_an_unsafe_file_as_unreadable_and_the_rest_as_usual() {
    // On main, one link or FIFO among one agent's files made `status` and
    // `usage` fail for every agent.
    let env = Env::with_config(
        "[[agent]]\nname = \"rio\"\n[[agent]]\nname = \"leo\"\n[[agent]]\nname = \"vida\"\n",
    );
    env.ok(&["bootstrap"]);
    let id = env.ok(&["session", "begin", "rio"]).trim().to_string();
    env.ok(&[
        "session",
        "end",
        "rio",
        "--session",
        &id,
        "--cost-usd",
        "0.25",
    ]);
    // leo's journal is a link to a file it must never read; vida's
    // report.json is a FIFO that would block a reader for ever.
    let journal = env.path("leo", "journal.jsonl");
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &journal).unwrap();
    let report = env.path("vida", "report.json");
    std::fs::remove_file(&report).unwrap();
    nix::unistd::mkfifo(&report, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();

    let out = env.run(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(65), "{text}");
    let row = |agent: &str| {
        text.lines()
            .find(|l| l.starts_with(agent))
            .unwrap_or_default()
            .to_string()
    };
    assert!(row("rio").contains("completed"), "{text}");
    assert!(row("leo").contains("unreadable"), "{text}");
    assert!(row("vida").contains("corrupt"), "{text}");
    assert!(
        text.contains("leo: unreadable: ") && text.contains("journal.jsonl"),
        "{text}"
    );
    assert!(
        text.contains("vida: unreadable: ") && text.contains("report.json"),
        "{text}"
    );

    let out = env.run(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(65));
    let lines: Value = serde_json::from_slice(&out.stdout).unwrap();
    let of = |agent: &str| {
        lines
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["agent"] == agent)
            .cloned()
            .unwrap()
    };
    assert!(of("rio")["unreadable"].is_null(), "{lines}");
    assert_eq!(of("rio")["today"]["sessions"], 1, "{lines}");
    assert_eq!(of("leo")["status"], "unreadable", "{lines}");
    assert!(
        of("leo")["unreadable"]
            .as_str()
            .unwrap()
            .contains("journal.jsonl"),
        "{lines}"
    );
    assert!(
        of("vida")["unreadable"]
            .as_str()
            .unwrap()
            .contains("report.json"),
        "{lines}"
    );

    let out = env.run(&["usage"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(65), "{text}");
    assert!(text.contains("rio") && text.contains("$0.25"), "{text}");
    assert!(
        text.contains("leo: ? (its journal cannot be read: ") && text.contains("journal.jsonl"),
        "{text}"
    );
    let out = env.run(&["usage", "--json"]);
    assert_eq!(out.status.code(), Some(65));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unreadable"], serde_json::json!(["leo"]), "{v}");
    assert!(
        v["unreadable_reasons"]["leo"]
            .as_str()
            .unwrap()
            .contains("journal.jsonl"),
        "{v}"
    );
    assert_eq!(v["days"][0]["agents"]["rio"]["cost_usd"], 0.25, "{v}");
}
