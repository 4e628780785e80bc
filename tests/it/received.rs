//! `message_received` (issue 22, seed 003 "both sides of every
//! conversation"): a message landing in any inbox — an agent's or the human
//! mailbox — is journaled once in its recipient's journal, whether the
//! daemon's intake or a session's claim saw it first, across a restart of
//! the daemon and a session that returned it.

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

fn received(env: &Env, agent: &str) -> Vec<Value> {
    env.events(agent, "message_received")
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["message_id"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn mail_dropped_with_cat_is_journaled_once_in_the_recipients_journal() {
    let env = Env::with_config("");
    // The first session fails (its message goes back to the inbox); the
    // second completes.
    let marker = env.tmp("failed-once");
    let script = env.script(
        "agent.sh",
        &format!(
            "cat >/dev/null\nif [ ! -e {m} ]; then touch {m}; exit 3; fi\necho '<axiom>COMPLETE</axiom>'",
            m = marker.display()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let mut d = env.daemon();
    // A person's `cat >`: no id, no time (the file's name and mtime).
    std::fs::write(
        env.root.join("rio/inbox/from-marcus.json"),
        r#"{"from":"marcus","type":"question","subject":"<b>where</b> are the notes?"}"#,
    )
    .unwrap();
    d.wait_until(
        Duration::from_secs(20),
        "rio's journal has message_received",
        || !received(&env, "rio").is_empty(),
    );
    let got = received(&env, "rio");
    assert_eq!(ids(&got), ["from-marcus"], "{got:#?}");
    assert_eq!(got[0]["from"], "marcus");
    assert_eq!(got[0]["type"], "question");
    assert_eq!(got[0]["subject"], "<b>where</b> are the notes?");
    // `events` shows it, with its summary.
    let shown = env.ok(&["events", "--agent", "rio"]);
    assert!(
        shown.contains("message_received") && shown.contains("from-marcus"),
        "{shown}"
    );

    // A restart: the daemon reads every waiting message again, journals
    // none of them twice.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_exit(Duration::from_secs(20));
    std::fs::write(
        env.root.join("rio/inbox/second.json"),
        r#"{"id":"second","from":"marcus","subject":"and this"}"#,
    )
    .unwrap();
    let d = env.daemon();
    d.wait_until(
        Duration::from_secs(20),
        "the second message journaled",
        || received(&env, "rio").len() >= 2,
    );

    // A session that fails returns both; the next one takes them: each is
    // still received once.
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "a failed then a completed session",
        || {
            env.events("rio", "session_end").len() + env.events("rio", "error").len() >= 1
                && marker.exists()
        },
    );
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "a completed session with both",
        || {
            env.events("rio", "session_end")
                .iter()
                .any(|e| e["messages_processed"].as_array().map(Vec::len) == Some(2))
        },
    );
    let mut got = ids(&received(&env, "rio"));
    got.sort();
    assert_eq!(got, ["from-marcus", "second"], "{:#?}", env.journal("rio"));
}

#[test]
fn a_script_without_a_daemon_journals_what_its_session_claimed() {
    let env = Env::standard();
    // One sent (journaled at delivery), one dropped by hand (journaled by
    // the claim of the session that takes it).
    let id = env.send("leo", "rio", &["--type", "flag"]);
    std::fs::write(
        env.root.join("rio/inbox/by-hand.json"),
        r#"{"from":"marcus","subject":"dropped by hand"}"#,
    )
    .unwrap();
    env.ok(&["session", "begin", "rio"]);
    let journal = env.journal("rio");
    let kinds: Vec<&str> = journal
        .iter()
        .filter_map(|e| e["event"].as_str())
        .filter(|k| *k == "message_received" || *k == "session_start")
        .collect();
    // The sent one at its delivery; the one dropped by hand once the
    // session that claimed it has begun.
    assert_eq!(
        kinds,
        ["message_received", "session_start", "message_received"],
        "{journal:#?}"
    );
    let got = received(&env, "rio");
    assert_eq!(ids(&got), [id.trim(), "by-hand"], "{got:#?}");
    assert_eq!(got[0]["from"], "leo");
    assert_eq!(got[1]["from"], "marcus");
    // Its sender's side: message_sent in leo's journal, same id.
    let sent = env.events("leo", "message_sent");
    assert_eq!(sent[0]["message_id"], got[0]["message_id"], "{sent:#?}");
    // The record command refuses to forge it.
    env.fails(&["record", "rio", "message_received", "message_id=x"], 64);
}

#[test]
fn the_human_mailbox_journals_what_lands_in_it() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "cat >/dev/null; echo '<axiom>COMPLETE</axiom>'");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let id = env.send("rio", "marcus", &["--type", "question"]);
    d.wait_until(Duration::from_secs(20), "marcus's journal has it", || {
        !received(&env, "marcus").is_empty()
    });
    let got = received(&env, "marcus");
    assert_eq!(ids(&got), [id.trim().to_string()], "{got:#?}");
    assert_eq!(got[0]["from"], "rio");
}
