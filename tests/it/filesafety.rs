//! Issue 9 §1–§2: nothing below the state root is trusted to be what it
//! claims. Every directory and state file of an agent replaced by a link, a
//! FIFO or the wrong kind of file; hard links, long and non-UTF-8 names in
//! the inbox; a held or FIFO `.lock`, and a FIFO journal with a writer —
//! through the real binary, each checked by what an operator would notice:
//! the command ends (nothing blocks), nothing outside the root is read,
//! created, moved or written, the error names the path and the fix, `check`
//! finds it and `check --repair` mends it.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::notify::NotifySocket;
use crate::support::{Daemon, Env, daemon_config, poll_until, read_json};

/// Longer than any command takes; a command still running then is blocked.
const LIMIT: Duration = Duration::from_secs(15);

/// Run `agent-state ARGS` and fail the test if it does not end within
/// [`LIMIT`] (it is killed then, so a blocked command cannot hang the test).
fn run_bounded(env: &Env, args: &[&str]) -> Output {
    let mut child = env
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agent-state");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "agent-state {args:?} was still running after {LIMIT:?}: it blocked\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every path under `dir` with its kind and content (files), sorted: what
/// must not change outside the root.
fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let what = if meta.is_dir() {
                stack.push(e.path());
                "dir".to_string()
            } else {
                format!("{:?}", std::fs::read(e.path()).unwrap_or_default())
            };
            out.push((e.path(), what));
        }
    }
    out.sort();
    out
}

#[derive(Debug, Clone, Copy)]
enum Replacement {
    /// A symbolic link to a directory (or file) outside the root.
    Link,
    /// A FIFO, with nobody at the other end.
    Fifo,
    /// A regular file where a directory belongs, or a directory where a
    /// file belongs.
    WrongKind,
}

/// What an agent has, and whether it is a directory.
const TARGETS: [(&str, bool); 11] = [
    ("", true),
    ("inbox", true),
    ("inbox/.tmp", true),
    ("inbox/.claimed", true),
    ("inbox/processed", true),
    ("inbox/rejected", true),
    ("sessions", true),
    ("memory.md", false),
    ("journal.jsonl", false),
    ("report.json", false),
    (".lock", false),
];

fn replace(path: &Path, is_dir: bool, how: Replacement, outside: &Path) {
    if is_dir {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
    match how {
        Replacement::Link if is_dir => symlink(outside, path).unwrap(),
        Replacement::Link => symlink(outside.join("secret.json"), path).unwrap(),
        Replacement::Fifo => {
            nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap()
        }
        Replacement::WrongKind if is_dir => std::fs::write(path, "not a directory").unwrap(),
        Replacement::WrongKind => std::fs::create_dir(path).unwrap(),
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// An environment with an outside directory holding a secret (a valid
/// message, so that reading it would be noticed) and rio with a waiting
/// message and a settled broken one (so claiming and rejecting happen).
fn hostile_env() -> (Env, PathBuf) {
    let env = Env::standard();
    let outside = env.tmp("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(
        outside.join("secret.json"),
        r#"{"from":"leo","subject":"SECRET-SUBJECT","body":"SECRET-BODY"}"#,
    )
    .unwrap();
    env.send("leo", "rio", &[]);
    (env, outside)
}

fn settled_broken_message(env: &Env) {
    let bad = env.path("rio", "inbox/broken.json");
    std::fs::write(&bad, "{ not json").unwrap();
    settle(&bad);
}

#[test]
fn a_link_fifo_or_wrong_kind_in_place_of_any_agent_path_is_refused_and_nothing_outside_changes() {
    for (rel, is_dir) in TARGETS {
        for how in [Replacement::Link, Replacement::Fifo, Replacement::WrongKind] {
            let (env, outside) = hostile_env();
            let before = snapshot(&outside);
            let path = if rel.is_empty() {
                env.agent("rio")
            } else {
                env.path("rio", rel)
            };
            replace(&path, is_dir, how, &outside);
            let case = format!("rio/{rel} replaced by {how:?}");

            // Everything a script, a sender and an operator would run.
            let mut outs = Vec::new();
            if !rel.is_empty() {
                settled_broken_message_if_possible(&env);
            }
            outs.push(run_bounded(
                &env,
                &["send", "--from", "leo", "--to", "rio", "--subject", "s"],
            ));
            let begin = run_bounded(&env, &["session", "begin", "rio"]);
            let id = String::from_utf8_lossy(&begin.stdout).trim().to_string();
            outs.push(begin);
            outs.push(run_bounded(&env, &["prompt", "rio"]));
            let session = if id.is_empty() {
                "none".to_string()
            } else {
                id
            };
            outs.push(run_bounded(
                &env,
                &[
                    "session",
                    "end",
                    "rio",
                    "--session",
                    &session,
                    "--outcome",
                    "completed",
                ],
            ));
            outs.push(run_bounded(
                &env,
                &["task", "add", "rio", "--description", "d"],
            ));
            outs.push(run_bounded(&env, &["status"]));
            outs.push(run_bounded(&env, &["inbox", "rio"]));
            for out in &outs {
                assert_ne!(
                    out.status.code(),
                    Some(101),
                    "{case}: a panic\n{}",
                    text(out)
                );
                assert!(
                    !String::from_utf8_lossy(&out.stdout).contains("SECRET-"),
                    "{case}: the secret outside the root was read\n{}",
                    text(out)
                );
            }
            assert_eq!(
                snapshot(&outside),
                before,
                "{case}: something outside the root changed"
            );

            // Refused with the path and the fix, unless nothing needed it.
            let shown = if rel.is_empty() {
                "rio ".to_string()
            } else {
                format!("rio/{rel}")
            };
            let named = outs.iter().any(|o| {
                let e = String::from_utf8_lossy(&o.stderr);
                e.contains(&shown) && e.contains("never follows a link")
            });
            let check = run_bounded(&env, &["check"]);
            let report = String::from_utf8_lossy(&check.stdout).to_string()
                + &String::from_utf8_lossy(&check.stderr);
            assert_ne!(
                check.status.code(),
                Some(0),
                "{case}: check found nothing\n{report}"
            );
            assert!(
                report.contains(rel.trim_start_matches("inbox/")) && report.contains("unsafe"),
                "{case}: check does not name it as unsafe\n{report}"
            );
            if rel != "sessions" {
                assert!(
                    named,
                    "{case}: no command named the path and the fix:\n{}",
                    { outs.iter().map(text).collect::<Vec<_>>().join("\n---\n") }
                );
            }

            // --repair sets it aside (the input kept) and recreates it.
            let repair = run_bounded(&env, &["check", "--repair"]);
            assert_eq!(
                repair.status.code(),
                Some(0),
                "{case}: repair\n{}",
                text(&repair)
            );
            let parent = path.parent().unwrap();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let aside: Vec<_> = std::fs::read_dir(parent)
                .unwrap()
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{name}.unsafe-"))
                })
                .collect();
            assert_eq!(aside.len(), 1, "{case}: not set aside as {name}.unsafe-*");
            let kept = std::fs::symlink_metadata(aside[0].path())
                .unwrap()
                .file_type();
            match how {
                Replacement::Link => assert!(kept.is_symlink(), "{case}"),
                Replacement::Fifo => {
                    use std::os::unix::fs::FileTypeExt;
                    assert!(kept.is_fifo(), "{case}")
                }
                Replacement::WrongKind => assert_eq!(kept.is_dir(), !is_dir, "{case}"),
            }
            assert_eq!(
                snapshot(&outside),
                before,
                "{case}: repair changed the outside"
            );
            let begin = run_bounded(&env, &["session", "begin", "rio"]);
            assert_eq!(
                begin.status.code(),
                Some(0),
                "{case}: after repair\n{}",
                text(&begin)
            );
            let id = String::from_utf8_lossy(&begin.stdout).trim().to_string();
            let end = run_bounded(
                &env,
                &[
                    "session",
                    "end",
                    "rio",
                    "--session",
                    &id,
                    "--outcome",
                    "completed",
                ],
            );
            assert_eq!(
                end.status.code(),
                Some(0),
                "{case}: after repair\n{}",
                text(&end)
            );
        }
    }
}

/// A settled broken message, where the inbox is still a directory.
fn settled_broken_message_if_possible(env: &Env) {
    if std::fs::symlink_metadata(env.path("rio", "inbox")).is_ok_and(|m| m.is_dir()) {
        settled_broken_message(env);
    }
}

#[test]
fn a_hard_link_in_the_inbox_is_rejected_unread() {
    let (env, outside) = hostile_env();
    let secret = outside.join("secret.json");
    std::fs::hard_link(&secret, env.path("rio", "inbox/linked.json")).unwrap();
    // A fresh second link is given the settle time (a sender that links a
    // file in removes its temp name right after); this one is old.
    settle(&secret);
    let begin = run_bounded(&env, &["session", "begin", "rio"]);
    assert_eq!(begin.status.code(), Some(0), "{}", text(&begin));
    let id = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    let prompt = run_bounded(&env, &["prompt", "rio"]);
    assert!(!String::from_utf8_lossy(&prompt.stdout).contains("SECRET-"));
    let reason = read_json(&env.path("rio", "inbox/rejected/linked.json.reason.json"));
    assert!(
        reason["reason"].as_str().unwrap().contains("hard links"),
        "{reason}"
    );
    let session = env.json("rio", "session.json");
    assert_eq!(session["session_id"], id.as_str());
    assert_eq!(
        session["messages"].as_array().map(Vec::len),
        Some(1),
        "{session}"
    );
    // The other name of the file is untouched.
    assert!(
        std::fs::read_to_string(&secret)
            .unwrap()
            .contains("SECRET-BODY")
    );
}

#[test]
fn long_and_non_utf8_names_never_wedge_an_agent() {
    let env = Env::standard();
    let inbox = env.path("rio", "inbox");
    let valid =
        |subject: &str| format!(r#"{{"from":"leo","subject":"{subject}","priority":"high"}}"#);
    // 250 bytes: legal, but `-2` or `.reason.json` would pass 255.
    let long_ok = format!("{}.json", "a".repeat(245));
    let long_bad = format!("{}.json", "b".repeat(245));
    std::fs::write(inbox.join(&long_ok), valid("long-name")).unwrap();
    std::fs::write(inbox.join(&long_bad), "{ broken").unwrap();
    settle(&inbox.join(&long_bad));
    let raw = std::ffi::OsStr::from_bytes(b"caf\xe9-\xff.json");
    std::fs::write(inbox.join(raw), valid("latin1-name")).unwrap();

    // Shown before anything happens, escaped.
    let listing = run_bounded(&env, &["inbox", "rio"]);
    let shown = String::from_utf8_lossy(&listing.stdout);
    assert!(shown.contains(r"caf\xe9-\xff.json"), "{shown}");
    let check = run_bounded(&env, &["check"]);
    let found = String::from_utf8_lossy(&check.stdout);
    assert!(
        found.contains(r"caf\xe9-\xff.json") && found.contains("not UTF-8"),
        "{found}"
    );

    let begin = run_bounded(&env, &["session", "begin", "rio"]);
    assert_eq!(begin.status.code(), Some(0), "{}", text(&begin));
    let id = String::from_utf8_lossy(&begin.stdout).trim().to_string();
    let end = run_bounded(
        &env,
        &[
            "session",
            "end",
            "rio",
            "--session",
            &id,
            "--outcome",
            "completed",
        ],
    );
    assert_eq!(end.status.code(), Some(0), "{}", text(&end));

    // The long valid message was delivered and processed.
    let processed = env.files("rio", "inbox/processed");
    assert_eq!(processed.len(), 1, "{processed:?}");
    let kept = read_json(&env.path("rio", &format!("inbox/processed/{}", processed[0])));
    assert_eq!(kept["subject"], "long-name");

    // The long broken one and the non-UTF-8 one were put aside, under names
    // that fit, with their original names in the reason files.
    let rejected = env.files("rio", "inbox/rejected");
    let reasons: Vec<Value> = rejected
        .iter()
        .filter(|n| n.ends_with(".reason.json"))
        .map(|n| read_json(&env.path("rio", &format!("inbox/rejected/{n}"))))
        .collect();
    assert_eq!(reasons.len(), 2, "{rejected:?}");
    assert!(rejected.iter().all(|n| n.len() <= 255));
    let long = reasons
        .iter()
        .find(|r| r["original_name"] == long_bad.as_str())
        .unwrap_or_else(|| panic!("no reason names {long_bad}: {reasons:?}"));
    assert!(long["file"].as_str().unwrap().len() < long_bad.len());
    let latin = reasons
        .iter()
        .find(|r| r["original_name_bytes"].is_string())
        .unwrap_or_else(|| panic!("no reason records the bytes: {reasons:?}"));
    assert_eq!(latin["original_name_bytes"], "636166e92dff2e6a736f6e");
    assert_eq!(latin["original_name"], r"caf\xe9-\xff.json");

    // Nothing left to repair; the listing shows both rejections.
    let check = run_bounded(&env, &["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    let listing = run_bounded(&env, &["inbox", "rio", "--json"]);
    let listing: Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(
        listing["rejected"].as_array().unwrap().len(),
        2,
        "{listing}"
    );
}

fn settle(path: &Path) {
    let old = nix::sys::time::TimeSpec::new(1_000_000_000, 0);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

// ---- locks and FIFOs under a running daemon --------------------------------

/// rio and theseus run `agent.sh` (prints a line, touches `ran-AGENT`).
fn daemon_env() -> Env {
    let env = Env::with_config("");
    let marks = env.tmp("marks");
    std::fs::create_dir(&marks).unwrap();
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"$1 at work\"\ntouch {:?}/ran-$1",
            marks.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("inbox_debounce", "\"100ms\"")],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"theseus\"\n\n\
         [[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    env
}

fn ran(env: &Env, agent: &str) -> bool {
    env.tmp("marks").join(format!("ran-{agent}")).exists()
}

/// Hold `path` with `flock(1)` (any user who can read the file can) until
/// the child is killed.
fn hold(path: &Path) -> Child {
    // -o: the lock is held by flock itself, not by `sleep`, so killing
    // flock releases it.
    let child = Command::new("flock")
        .arg("-o")
        .arg(path)
        .args(["sleep", "300"])
        .stdin(Stdio::null())
        .spawn()
        .expect("flock(1) (util-linux) is needed");
    // Wait until it holds it.
    let probe = || {
        Command::new("flock")
            .args(["--nonblock", "--shared"])
            .arg(path)
            .arg("true")
            .status()
            .map(|s| !s.success())
            .unwrap_or(false)
    };
    assert!(
        poll_until(Duration::from_secs(5), probe),
        "flock did not take {path:?}"
    );
    child
}

fn start(env: &Env, notify: &NotifySocket) -> Daemon {
    let vars = notify.vars();
    let all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Daemon::start(env, &all)
}

#[test]
fn a_held_lock_defers_only_its_agent_and_ready_and_the_watchdog_keep_coming() {
    let env = daemon_env();
    let mut holder = hold(&env.path("rio", ".lock"));
    let mut notify = NotifySocket::bind(&env);
    let daemon = start(&env, &notify);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));

    env.send("marcus", "rio", &[]);
    env.send("marcus", "theseus", &[]);
    daemon.wait_until(Duration::from_secs(10), "theseus is served", || {
        ran(&env, "theseus")
    });
    assert!(!ran(&env, "rio"), "rio ran while its lock was held");
    assert!(
        notify.pings_during(Duration::from_secs(1)) >= 3,
        "the watchdog stopped while a lock was held\n{}",
        notify.transcript()
    );
    daemon.wait_until(Duration::from_secs(10), "the deferral is logged", || {
        daemon.log_text().contains("LOCK_BUSY")
    });
    assert!(
        daemon.log_text().contains("rio/.lock"),
        "{}",
        daemon.log_text()
    );

    // Released: rio's mail is served without anything else happening.
    holder.kill().unwrap();
    holder.wait().unwrap();
    daemon.wait_until(
        Duration::from_secs(15),
        "rio is served once the lock is free",
        || ran(&env, "rio"),
    );
}

#[test]
fn a_fifo_lock_is_refused_and_every_other_agent_is_served() {
    let env = daemon_env();
    let lock = env.path("rio", ".lock");
    std::fs::remove_file(&lock).unwrap();
    nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let mut notify = NotifySocket::bind(&env);
    let daemon = start(&env, &notify);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));
    env.send("marcus", "theseus", &[]);
    // A sender cannot deliver to rio (its lock is not a file), but is told.
    let out = env.run(&["send", "--from", "marcus", "--to", "rio", "--subject", "s"]);
    let _ = out;
    daemon.wait_until(Duration::from_secs(10), "theseus is served", || {
        ran(&env, "theseus")
    });
    assert!(
        notify.pings_during(Duration::from_secs(1)) >= 3,
        "{}",
        notify.transcript()
    );
    // rio's work is refused with the path and the fix, in errors.jsonl.
    let errors = env.root.join(".daemon/errors.jsonl");
    daemon.wait_until(Duration::from_secs(10), "PATH_UNSAFE recorded", || {
        std::fs::read_to_string(&errors).is_ok_and(|t| t.contains("PATH_UNSAFE"))
    });
    let text = std::fs::read_to_string(&errors).unwrap();
    assert!(
        text.contains("rio/.lock") && text.contains("FIFO"),
        "{text}"
    );
    assert!(!ran(&env, "rio"));
}

#[test]
fn a_fifo_journal_with_a_writer_blocks_neither_a_hook_nor_the_daemon() {
    let env = daemon_env();
    let journal = env.path("rio", "journal.jsonl");
    std::fs::remove_file(&journal).unwrap();
    nix::unistd::mkfifo(&journal, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    // Somebody keeps the FIFO open and writes lines over 64 KiB into it.
    let mut writer = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while :; do head -c 100000 /dev/zero | tr '\\0' x; echo; done > {:?}",
            journal.display().to_string()
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let begin = run_bounded(&env, &["session", "begin", "rio"]);
    assert_ne!(begin.status.code(), Some(0));
    let err = String::from_utf8_lossy(&begin.stderr);
    assert!(
        err.contains("rio/journal.jsonl") && err.contains("FIFO"),
        "{err}"
    );
    let _ = run_bounded(&env, &["events", "--agent", "rio"]);

    let mut notify = NotifySocket::bind(&env);
    let mut daemon = start(&env, &notify);
    notify.wait_for(0, "READY=1", Duration::from_secs(10));
    env.send("marcus", "theseus", &[]);
    daemon.wait_until(Duration::from_secs(10), "theseus is served", || {
        ran(&env, "theseus")
    });
    // SIGTERM is honoured at once.
    let t0 = Instant::now();
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status:?}\n{}", daemon.log_text());
    assert!(t0.elapsed() < Duration::from_secs(10));
    let _ = writer.kill();
    let _ = writer.wait();
}

#[test]
fn the_state_root_itself_may_sit_behind_a_link() {
    // The operator's choice (`/opt` → `/srv/opt`): resolved once, trusted.
    let env = Env::with_config(crate::support::STANDARD_AGENTS);
    let real = env.tmp("real-root");
    std::fs::create_dir(&real).unwrap();
    symlink(&real, &env.root).unwrap();
    env.ok(&["bootstrap"]);
    assert!(real.join("rio/report.json").is_file());
    env.send("leo", "rio", &[]);
    let id = env.ok(&["session", "begin", "rio"]).trim().to_string();
    env.ok(&[
        "session",
        "end",
        "rio",
        "--session",
        &id,
        "--outcome",
        "completed",
    ]);
    assert_eq!(env.files("rio", "inbox/processed").len(), 1);
    let check = env.run(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
}
