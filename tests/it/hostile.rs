//! Hostile input: names that try to leave the state root, inbox files that
//! are links, pipes, directories, huge, half-written or addressed elsewhere,
//! and messages no session manages to handle.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::support::{Env, read_json};

/// Every path under `dir` (not following links) with its size, sorted.
fn tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path(), if meta.is_dir() { 0 } else { meta.len() }));
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

const HOSTILE: [(&str, &str); 6] = [
    ("../etc", "path separator"),
    ("a/b", "path separator"),
    ("", "empty"),
    ("Rio", "uppercase"),
    (".daemon", "reserved for daemon files"),
    ("..", "would leave the state root"),
];

#[test]
fn hostile_agent_names_are_refused_everywhere() {
    let env = Env::standard();
    env.send("leo", "rio", &[]);
    let before = tree(env.dir.path());

    for (name, why) in HOSTILE {
        let commands: Vec<Vec<&str>> = vec![
            vec!["session", "begin", name],
            vec!["session", "end", name],
            vec![
                "session",
                "fail",
                name,
                "--outcome",
                "error",
                "--reason",
                "x",
            ],
            vec!["task", "add", name, "--description", "d"],
            vec!["task", "list", name],
            vec!["task", "set", name, "task-001", "--status", "active"],
            vec!["send", "--from", "leo", "--to", name, "--subject", "s"],
            vec!["send", "--from", name, "--to", "rio", "--subject", "s"],
            vec!["send", "--from", name, "--to", "all", "--subject", "s"],
            vec!["inbox", name],
            vec!["status", name],
            vec!["record", name, "--claims-proposed", "1"],
            vec!["prompt", name],
            vec!["bootstrap", name],
            vec!["metrics", "rebuild", name],
        ];
        for cmd in &commands {
            let out = env.run(cmd);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let code = out.status.code();
            assert!(
                code == Some(64) || code == Some(67),
                "{cmd:?}: expected exit 64 or 67, got {code:?}\nstdout: {}\nstderr: {stderr}",
                String::from_utf8_lossy(&out.stdout)
            );
            assert!(
                stderr.contains(&format!("{name:?}")),
                "{cmd:?}: the message does not name {name:?}: {stderr}"
            );
            assert!(
                stderr.contains(why),
                "{cmd:?}: the message does not say {why:?}: {stderr}"
            );
        }
    }
    // A valid name that is not configured is "unknown agent".
    for cmd in [
        vec!["session", "begin", "ghost"],
        vec!["send", "--from", "leo", "--to", "ghost", "--subject", "s"],
        vec!["status", "ghost"],
    ] {
        let stderr = env.fails(&cmd, 67);
        assert!(
            stderr.contains("ghost") && stderr.contains("not configured"),
            "{cmd:?}: {stderr}"
        );
    }

    let after = tree(env.dir.path());
    assert_eq!(before, after, "refused commands changed files");
    assert_eq!(
        crate::support::list(env.dir.path()),
        ["config.toml", "state"]
    );
}

#[test]
fn a_hostile_name_in_the_config_is_refused() {
    let env = Env::with_config(
        r#"
[[agent]]
name = "rio"

[[agent]]
name = "../x"

[[agent]]
name = ".daemon"
"#,
    );
    for cmd in [
        vec!["bootstrap"],
        vec!["status"],
        vec!["check", "--repair"],
        vec!["session", "begin", "rio"],
    ] {
        let stderr = env.fails(&cmd, 78);
        assert!(
            stderr.contains("agent[1].name") && stderr.contains("\"../x\""),
            "{cmd:?}: {stderr}"
        );
        assert!(
            stderr.contains("agent[2].name") && stderr.contains("\".daemon\""),
            "{cmd:?}: {stderr}"
        );
    }
    assert_eq!(
        crate::support::list(env.dir.path()),
        ["config.toml"],
        "something was created"
    );
}

/// Set a file's mtime `secs` seconds into the past.
fn age(path: &Path, secs: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open to set mtime");
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .expect("set mtime");
}

/// Run, but fail the test (and kill the process) if it takes over `limit`.
fn run_within(env: &Env, args: &[&str], limit: Duration) -> std::process::Output {
    let mut child = env
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{args:?} hung for {limit:?} (killed)\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn hostile_inbox_files_are_set_aside_at_begin() {
    let env = Env::standard();
    let inbox = env.path("rio", "inbox");

    // A link to a file outside the state root, with tempting content.
    let outside = env.dir.path().join("outside.json");
    let outside_text = "{\"from\": \"leo\", \"subject\": \"from outside the root\"}\n";
    std::fs::write(&outside, outside_text).unwrap();
    std::os::unix::fs::symlink(&outside, inbox.join("x.json")).unwrap();
    // A FIFO: opening it for reading would block forever.
    nix::unistd::mkfifo(
        &inbox.join("p.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o660),
    )
    .unwrap();
    std::fs::create_dir(inbox.join("d.json")).unwrap();
    let big = format!(
        "{{\"from\":\"leo\",\"subject\":\"big\",\"body\":\"{}\"}}",
        "a".repeat(2 << 20)
    );
    std::fs::write(inbox.join("big.json"), &big).unwrap();
    std::fs::write(
        inbox.join("elsewhere.json"),
        r#"{"from":"leo","to":"theseus","subject":"not for rio"}"#,
    )
    .unwrap();
    std::fs::write(inbox.join("old.json"), "{\"from\": \"leo\", \"subj").unwrap();
    age(&inbox.join("old.json"), 60);
    std::fs::write(inbox.join("nofrom.json"), r#"{"subject":"who sent this?"}"#).unwrap();
    std::fs::write(
        inbox.join("badfrom.json"),
        r#"{"from":"../etc","subject":"spoofed"}"#,
    )
    .unwrap();
    std::fs::write(
        inbox.join("good.json"),
        r#"{"from":"leo","subject":"a real message"}"#,
    )
    .unwrap();
    // Valid, but its id is a path: it is only ever text, never a file name.
    std::fs::write(
        inbox.join("pathid.json"),
        r#"{"id":"../../../escaped","from":"leo","subject":"id is a path","type":"task"}"#,
    )
    .unwrap();
    let leftovers = [".x.json.swp", "x.json~", "#x.json#", "4913", "notes.txt"];
    for name in leftovers {
        std::fs::write(inbox.join(name), format!("editor leftover {name}")).unwrap();
    }
    // Being written right now: not valid yet, but not broken either.
    std::fs::write(
        inbox.join("fresh.json"),
        "{\"from\": \"leo\", \"subject\": \"half",
    )
    .unwrap();

    let out = run_within(&env, &["session", "begin", "rio"], Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "begin failed:\n{stderr}");
    let sid = String::from_utf8_lossy(&out.stdout).trim().to_string();

    // The valid message was claimed, and only it.
    let session = env.json("rio", "session.json");
    let mut claimed: Vec<String> = session["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    claimed.sort();
    assert_eq!(claimed, ["../../../escaped", "good"], "{session:#}");
    assert!(
        env.path("rio", &format!("inbox/.claimed/{sid}/good.json"))
            .exists()
    );
    assert!(
        env.path("rio", &format!("inbox/.claimed/{sid}/pathid.json"))
            .exists()
    );

    // Each hostile file is in rejected/ with a reason naming the problem.
    let rejected = env.path("rio", "inbox/rejected");
    let cases = [
        ("x.json", "symbolic link"),
        ("p.json", "FIFO"),
        ("d.json", "directory"),
        ("big.json", "limit"),
        ("elsewhere.json", "field `to`"),
        ("old.json", "not valid JSON"),
        ("nofrom.json", "field `from` is missing"),
        (
            "badfrom.json",
            "field `from` \"../etc\" is not an agent name",
        ),
    ];
    for (name, why) in cases {
        assert!(
            std::fs::symlink_metadata(rejected.join(name)).is_ok(),
            "{name} is not in rejected/: {:?}",
            crate::support::list(&rejected)
        );
        assert!(
            std::fs::symlink_metadata(inbox.join(name)).is_err(),
            "{name} is still in inbox/"
        );
        let reason = read_json(&rejected.join(format!("{name}.reason.json")));
        let text = reason["reason"].as_str().unwrap_or_default();
        assert!(
            text.contains(why),
            "{name}: reason {text:?} does not say {why:?}"
        );
        assert!(
            stderr.contains(name),
            "begin's stderr does not mention {name}: {stderr}"
        );
    }
    let journaled: Vec<String> = env
        .events("rio", "message_rejected")
        .iter()
        .map(|e| e["file"].as_str().unwrap().to_string())
        .collect();
    for (name, _) in cases {
        assert!(
            journaled.contains(&name.to_string()),
            "{name} rejection not journaled: {journaled:?}"
        );
    }

    // Moved, not followed: the link is still a link to the untouched target.
    let link = rejected.join("x.json");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), outside);
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        outside_text,
        "the link's target was changed"
    );
    assert!(
        std::fs::symlink_metadata(rejected.join("p.json"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(rejected.join("d.json").is_dir());
    assert_eq!(
        std::fs::read_to_string(rejected.join("big.json"))
            .unwrap()
            .len(),
        big.len(),
        "the big file was not kept whole"
    );

    // Editor leftovers are left alone.
    for name in leftovers {
        assert_eq!(
            std::fs::read_to_string(inbox.join(name)).ok(),
            Some(format!("editor leftover {name}")),
            "{name} was touched"
        );
        assert!(!rejected.join(name).exists(), "{name} was rejected");
    }

    // The fresh file waits, and begin says so.
    assert!(
        inbox.join("fresh.json").exists(),
        "a file being written was moved"
    );
    assert!(
        !rejected.join("fresh.json").exists(),
        "a file being written was rejected"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("fresh.json") && l.contains("does not parse yet")),
        "begin's stderr does not say fresh.json is waiting: {stderr}"
    );
    assert_eq!(env.waiting("rio"), ["fresh.json"]);

    // Ending the session files both claimed messages under their own names,
    // and nothing appeared outside the state root.
    env.ok(&["session", "end", "rio"]);
    assert_eq!(
        crate::support::list(&env.path("rio", "inbox/processed")),
        ["good.json", "pathid.json"]
    );
    assert_eq!(
        crate::support::list(env.dir.path()),
        ["config.toml", "outside.json", "state"]
    );
    assert_eq!(
        env.json("rio", "tasks.json")["tasks"][0]["source_message"],
        "../../../escaped"
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), outside_text);
}

#[test]
fn failed_sessions_return_messages_until_they_are_undeliverable() {
    let env = Env::standard();
    let id = env.send("leo", "rio", &["--body", "the body", "--priority", "high"]);
    let file = format!("{id}.json");

    for attempt in 1..=3u64 {
        let sid = env.ok(&["session", "begin", "rio"]).trim().to_string();
        assert_eq!(
            env.json("rio", "session.json")["messages"],
            json!([id]),
            "attempt {attempt}"
        );
        assert!(
            env.path("rio", &format!("inbox/.claimed/{sid}/{file}"))
                .exists()
        );
        assert!(env.waiting("rio").is_empty());
        let out = env.ok(&[
            "session",
            "fail",
            "rio",
            "--outcome",
            "error",
            "--reason",
            &format!("crash {attempt}"),
        ]);
        let event = env.events("rio", "error").pop().expect("error event");
        assert_eq!(event["session_id"], json!(sid));
        assert!(
            !env.path("rio", &format!("inbox/.claimed/{sid}")).exists(),
            "claim dir left behind"
        );
        if attempt < 3 {
            assert!(out.contains("1 message(s) returned to the inbox"), "{out}");
            assert_eq!(env.waiting("rio"), vec![file.clone()], "attempt {attempt}");
            let m: Value = read_json(&env.path("rio", &format!("inbox/{file}")));
            assert_eq!(m["attempts"], attempt, "{m:#}");
            assert_eq!(m["body"], "the body");
            assert_eq!(m["priority"], "high");
            assert_eq!(event["messages_returned"], json!([id]));
        } else {
            assert!(
                out.contains("1 message(s) set aside as undeliverable"),
                "{out}"
            );
            assert!(env.waiting("rio").is_empty(), "{:?}", env.waiting("rio"));
            let m = read_json(&env.path("rio", &format!("inbox/rejected/{file}")));
            assert_eq!(m["attempts"], 3, "{m:#}");
            assert_eq!(m["body"], "the body");
            let reason = read_json(&env.path("rio", &format!("inbox/rejected/{file}.reason.json")));
            assert!(
                reason["reason"].as_str().unwrap().contains("undeliverable"),
                "{reason:#}"
            );
            assert_eq!(event["messages_undeliverable"], json!([id]));
        }
    }
    // A fourth session has nothing to claim, and nothing was processed.
    env.ok(&["session", "begin", "rio"]);
    assert!(
        env.json("rio", "session.json")
            .get("messages")
            .is_none_or(|m| m == &json!([]))
    );
    env.ok(&["session", "end", "rio"]);
    assert!(crate::support::list(&env.path("rio", "inbox/processed")).is_empty());
    assert_eq!(
        env.json("rio", "metrics.json")["lifetime"]["sessions_error"],
        3
    );
}

/// A session id in session.json names paths (`inbox/.claimed/ID/`,
/// `sessions/ID.log`): one that is a path trick makes the file unreadable
/// (rebuilt from the journal), never a recovery of another directory.
#[test]
fn a_session_id_that_is_a_path_is_never_followed() {
    let env = Env::standard();
    let id = env.send("leo", "rio", &["--body", "done already"]);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&["session", "end", "rio"]);
    let processed = env.path("rio", &format!("inbox/processed/{id}.json"));
    assert!(processed.exists());
    let waiting = env.send("leo", "rio", &["--body", "still waiting"]);
    // As if the session had been begun under that id and its owner died.
    let mut session = env.json("rio", "session.json");
    session["session_id"] = json!("../processed");
    session["status"] = json!("running");
    session["owner_pid"] = json!(999_999_999);
    env.write("rio", "session.json", &session.to_string());

    let out = env.run(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("session.json") && said.contains("\"../processed\" is not a session id"),
        "{said}"
    );
    // The next session recovers from the journal; nothing processed comes
    // back, the waiting message is claimed once, with no attempt counted.
    let sid = env.ok(&["session", "begin", "rio"]).trim().to_string();
    assert_ne!(sid, "../processed");
    assert!(processed.exists(), "a processed message was moved");
    assert_eq!(
        env.json("rio", "session.json")["messages"],
        json!([waiting])
    );
    let claimed: Value =
        read_json(&env.path("rio", &format!("inbox/.claimed/{sid}/{waiting}.json")));
    assert!(
        claimed.get("attempts").is_none_or(|a| a == 0),
        "{claimed:#}"
    );
    env.ok(&["session", "end", "rio"]);
    env.ok(&["check"]);
}
