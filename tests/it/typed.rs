//! Issue 9 §4: what a person types is delivered. A message written slowly
//! into `inbox/` (`cat >`, an editor, a pipeline that pauses) is judged only
//! once no writer has it open and it has not changed for `inbox_settle`; a
//! file rejected as unfinished and finished later is delivered; `inbox`
//! shows what is settling; an inbox directory replaced under the daemon is
//! watched again.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, Env, daemon_config, read_json, state};

/// rio runs a script that says it is at work; settle time 3 s.
fn setup() -> Env {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo \"$1 at work\"");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"100ms\""), ("inbox_settle", "\"3s\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    env
}

fn processed(env: &Env) -> Vec<String> {
    env.files("rio", "inbox/processed")
}

fn errors(env: &Env) -> String {
    std::fs::read_to_string(env.root.join(".daemon/errors.jsonl")).unwrap_or_default()
}

/// `sh -c SCRIPT` in rio's inbox, in the background.
fn shell_in_inbox(env: &Env, script: &str) -> std::process::Child {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(env.path("rio", "inbox"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_message_typed_with_a_pause_longer_than_the_settle_time_is_delivered_once() {
    let env = setup();
    let d = Daemon::start(&env, &[]);
    // A person typing into `cat >`: the first half, a pause longer than
    // inbox_settle with the file still open, then the rest.
    let mut writer = shell_in_inbox(
        &env,
        r#"{ printf '{"from":"marcus",'; sleep 6; printf '"subject":"typed by hand","priority":"high"}\n'; } > typed.json"#,
    );
    // Kept: the subject (5 s of an open, half-typed file must not be judged).
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        env.files("rio", "inbox/rejected").is_empty(),
        "judged while still being typed"
    );
    assert!(processed(&env).is_empty());
    writer.wait().unwrap();
    d.wait_until(
        Duration::from_secs(10),
        "the typed message is delivered",
        || processed(&env) == ["typed.json"],
    );
    let m = read_json(&env.path("rio", "inbox/processed/typed.json"));
    assert_eq!(m["subject"], "typed by hand");
    assert!(env.files("rio", "inbox/rejected").is_empty());
    assert!(!errors(&env).contains("INBOX_REJECTED"), "{}", errors(&env));
    // Exactly once: one session claimed it.
    let claimed: usize = env
        .events("rio", "session_start")
        .iter()
        .filter(|e| e["messages"].as_array().is_some_and(|m| !m.is_empty()))
        .count();
    assert_eq!(claimed, 1);
}

#[test]
fn a_closed_broken_file_is_rejected_after_settling_and_delivered_once_finished() {
    let env = setup();
    let d = Daemon::start(&env, &[]);
    let mut w = shell_in_inbox(&env, r#"printf '{"from": ' > late.json"#);
    w.wait().unwrap();
    // Not before the settle time (kept: an absence before a deadline is the
    // subject)...
    std::thread::sleep(Duration::from_millis(1500));
    assert!(env.files("rio", "inbox/rejected").is_empty());
    // ...but after it.
    d.wait_until(
        Duration::from_secs(10),
        "the broken file is rejected",
        || {
            env.files("rio", "inbox/rejected")
                .contains(&"late.json".to_string())
        },
    );
    let reason = read_json(&env.path("rio", "inbox/rejected/late.json.reason.json"));
    assert_eq!(reason["retry_when_valid"], true, "{reason}");
    // The writer comes back and finishes it where it now is.
    let mut w = shell_in_inbox(
        &env,
        r#"printf '"marcus", "subject": "finished late"}\n' >> rejected/late.json"#,
    );
    w.wait().unwrap();
    d.wait_until(
        Duration::from_secs(10),
        "the finished message is delivered",
        || processed(&env) == ["late.json"],
    );
    assert!(!env.path("rio", "inbox/rejected/late.json").exists());
    let retried = env.events("rio", "message_retried");
    assert_eq!(retried.len(), 1, "{retried:?}");
}

#[test]
fn inbox_lists_files_that_are_settling() {
    let env = setup();
    std::fs::write(env.path("rio", "inbox/half.json"), r#"{"from":"#).unwrap();
    let out = env.ok(&["inbox", "rio", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let w = &v["waiting"][0];
    assert_eq!(w["file"], "half.json");
    assert_eq!(w["state"], "unsettled", "{v}");
    assert!(
        w["problem"]
            .as_str()
            .unwrap()
            .contains("does not parse yet"),
        "{v}"
    );
    let text = env.ok(&["inbox", "rio"]);
    assert!(text.contains("half.json"), "{text}");
}

#[test]
fn an_inbox_directory_replaced_under_the_daemon_is_watched_again() {
    let env = setup();
    let d = Daemon::start(&env, &[]);
    let inbox = env.path("rio", "inbox");
    std::fs::rename(&inbox, env.path("rio", "inbox.old")).unwrap();
    std::fs::create_dir(&inbox).unwrap();
    let watched = |n: usize| {
        d.wait_until(
            Duration::from_secs(10),
            "the daemon logs that rio's inbox is watched again",
            || d.log_text().matches("its inbox is watched again").count() >= n,
        )
    };
    watched(1);
    env.send("marcus", "rio", &[]);
    d.wait_until(
        Duration::from_secs(10),
        "mail to the new inbox is delivered",
        || processed(&env).len() == 1,
    );
    // And once more, removed and made anew.
    std::fs::remove_dir_all(&inbox).unwrap();
    std::fs::create_dir(&inbox).unwrap();
    watched(2);
    env.send("marcus", "rio", &[]);
    d.wait_until(
        Duration::from_secs(10),
        "mail to the remade inbox is delivered",
        || {
            processed(&env).len() == 1
                && env.files("rio", "inbox/processed").len() == 1
                && env.events("rio", "session_end").len() >= 2
        },
    );
    assert!(d.log_text().contains("watched again"), "{}", d.log_text());
}

/// The inbox replaced while its agent's session runs, the session ending
/// within the second after: the scan the watcher's loss timed is what
/// watches the new inbox, and the session's end must not drop it (it did
/// for a day: nothing watched the inbox until the five-minute reconcile).
#[test]
fn an_inbox_replaced_while_its_session_runs_is_watched_again_after_the_end() {
    let env = Env::with_config("");
    let go = env.tmp("GO");
    let script = env.script(
        "agent.sh",
        &format!("while [ ! -e {go:?} ]; do sleep 0.05; done\necho done"),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"100ms\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = Daemon::start(&env, &[]);
    env.send("marcus", "rio", &[]);
    d.wait_until(Duration::from_secs(10), "rio's session runs", || {
        state(&env, "rio", "session.json")["status"] == "running"
    });
    let inbox = env.path("rio", "inbox");
    std::fs::rename(&inbox, env.path("rio", "inbox.old")).unwrap();
    std::fs::create_dir(&inbox).unwrap();
    d.wait_until(
        Duration::from_secs(10),
        "the daemon saw the inbox go",
        || d.log_text().contains("removed or moved away"),
    );
    std::fs::write(&go, "").unwrap();
    d.wait_until(
        Duration::from_secs(10),
        "the daemon logs that rio's inbox is watched again",
        || d.log_text().contains("its inbox is watched again"),
    );
}
