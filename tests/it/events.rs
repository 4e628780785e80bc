//! `agent-state events`: every journal and the daemon's logs as one ordered
//! stream with cursors. Checked as a reader would: the order, that a cursor
//! resumes exactly after its event (every event once, while sessions run and
//! other writers append), that bad cursors are refused, and `--follow`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::Env;

/// The `--json` lines of `events ARGS`.
fn stream(env: &Env, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["events", "--json"];
    all.extend_from_slice(args);
    parse_lines(&env.ok(&all))
}

fn parse_lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn cursor(event: &Value) -> &str {
    event["cursor"].as_str().expect("a cursor")
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes()).expect("append");
}

/// Journals and daemon logs whose times interleave across files and, in
/// rio's journal, go backwards once; a line that is not JSON; leo without
/// a journal.
fn fixture() -> Env {
    let env = Env::standard();
    env.write(
        "rio",
        "journal.jsonl",
        concat!(
            "{\"ts\":\"2026-03-01T10:00:01Z\",\"event\":\"a1\"}\n",
            "{\"ts\":\"2026-03-01T10:00:05Z\",\"event\":\"a2\"}\n",
            "not json at all\n",
            "{\"ts\":\"2026-03-01T10:00:03Z\",\"event\":\"a3\"}\n",
        ),
    );
    env.write(
        "theseus",
        "journal.jsonl",
        concat!(
            "{\"ts\":\"2026-03-01T10:00:02Z\",\"event\":\"t1\"}\n",
            "{\"ts\":\"2026-03-01T10:00:04Z\",\"event\":\"t2\"}\n",
        ),
    );
    // Another offset: 10:00:03.5Z.
    env.write(
        "marcus",
        "journal.jsonl",
        "{\"ts\":\"2026-03-01T11:00:03.5+01:00\",\"event\":\"m1\",\"note\":\"by hand\"}\n",
    );
    std::fs::remove_file(env.path("leo", "journal.jsonl")).expect("remove leo's journal");
    let daemon = env.root.join(".daemon");
    std::fs::create_dir_all(&daemon).expect("mkdir .daemon");
    std::fs::write(
        daemon.join("errors.jsonl"),
        "{\"ts\":\"2026-03-01T10:00:02Z\",\"code\":\"SESSION_FAILED\",\"message\":\"boom\",\"severity\":\"medium\",\"recoverable\":true,\"suggestions\":[],\"context\":{\"agent\":\"rio\"}}\n",
    )
    .expect("write errors.jsonl");
    std::fs::write(
        daemon.join("signals.jsonl"),
        "{\"ts\":\"2026-03-01T10:00:06Z\",\"level\":\"warn\",\"code\":\"SIGNAL_UNKNOWN_TYPE\",\"agent\":\"theseus\",\"raw\":\"<axiom>FOO</axiom>\"}\n",
    )
    .expect("write signals.jsonl");
    env
}

/// The order `fixture` must come out in: by time, ties agents first, and
/// rio's a3 after its a2 (a source never reorders).
const FIXTURE_ORDER: [(&str, &str); 8] = [
    ("rio", "a1"),
    ("theseus", "t1"),
    ("daemon", "error"),
    ("marcus", "m1"),
    ("theseus", "t2"),
    ("rio", "a2"),
    ("rio", "a3"),
    ("daemon", "signal"),
];

#[test]
fn the_stream_is_ordered_complete_and_resumes_after_any_event() {
    let env = fixture();
    let all = stream(&env, &[]);
    let got: Vec<(String, String)> = all
        .iter()
        .map(|e| {
            (
                e["source"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = FIXTURE_ORDER
        .iter()
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .collect();
    assert_eq!(got, want);
    // The original line, untouched, and its time as written.
    assert_eq!(
        crate::support::keys(&all[0]),
        ["cursor", "source", "kind", "ts", "event"]
    );
    assert_eq!(all[3]["ts"], "2026-03-01T11:00:03.5+01:00");
    assert_eq!(all[3]["event"]["note"], "by hand");
    assert_eq!(all[2]["event"]["code"], "SESSION_FAILED");
    for e in &all {
        let c = cursor(e);
        assert!(
            c.starts_with("v1.")
                && c[3..]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "not shell-safe: {c}"
        );
    }

    // Resuming after the k-th event gives exactly the rest, for every k.
    for k in 0..all.len() {
        let rest = stream(&env, &["--after", cursor(&all[k])]);
        assert_eq!(kinds(&rest), kinds(&all[k + 1..]), "after event {k}");
    }

    // Text: TS  SOURCE  EVENT  summary  [cursor], same events, same cursors.
    let text = env.ok(&["events"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), all.len(), "{text}");
    for (line, e) in lines.iter().zip(&all) {
        assert!(line.starts_with(e["ts"].as_str().unwrap()), "{line}");
        assert!(line.ends_with(&format!("  [{}]", cursor(e))), "{line}");
        let fields: Vec<&str> = line.split("  ").filter(|f| !f.is_empty()).collect();
        assert_eq!(fields[1].trim(), e["source"], "{line}");
        assert_eq!(fields[2].trim(), e["kind"], "{line}");
    }
    assert!(
        lines[2].contains("SESSION_FAILED boom [rio]"),
        "{}",
        lines[2]
    );
    assert!(lines[3].contains("note=by hand"), "{}", lines[3]);

    // A line still being written is left for later, then read once whole.
    let last = cursor(all.last().unwrap()).to_string();
    append(
        &env.path("rio", "journal.jsonl"),
        "{\"ts\":\"2026-03-01T10:00:07Z\",\"ev",
    );
    assert!(stream(&env, &["--after", &last]).is_empty());
    append(&env.path("rio", "journal.jsonl"), "ent\":\"a4\"}\n");
    let more = stream(&env, &["--after", &last]);
    assert_eq!(kinds(&more), ["a4"]);
    let last = cursor(&more[0]).to_string();

    // --limit pages, and says where to resume.
    let out = env.run(&["events", "--json", "--limit", "3"]);
    assert!(out.status.success());
    let page = parse_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(kinds(&page), kinds(&all[..3]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("--after {}", cursor(&page[2]))),
        "{stderr}"
    );

    // A journal rewritten shorter is read again from the start, with a note.
    env.write(
        "theseus",
        "journal.jsonl",
        "{\"ts\":\"2026-03-01T10:00:09Z\",\"event\":\"t9\"}\n",
    );
    let out = env.run(&["events", "--json", "--after", &last]);
    assert!(out.status.success());
    assert_eq!(
        kinds(&parse_lines(&String::from_utf8_lossy(&out.stdout))),
        ["t9"]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("theseus/journal.jsonl") && stderr.contains("again from the start"),
        "{stderr}"
    );
}

#[test]
fn agent_picks_one_journal_and_the_daemon_records_about_it() {
    let env = fixture();
    let rio = stream(&env, &["--agent", "rio"]);
    assert_eq!(kinds(&rio), ["a1", "error", "a2", "a3"]);
    let theseus = stream(&env, &["--agent", "theseus"]);
    assert_eq!(kinds(&theseus), ["t1", "t2", "signal"]);
    // Resuming with the same selection.
    let rest = stream(&env, &["--agent", "rio", "--after", cursor(&rio[1])]);
    assert_eq!(kinds(&rest), ["a2", "a3"]);
    env.fails(&["events", "--agent", "nobody"], 67);
}

#[test]
fn bad_cursors_are_refused_with_the_problem() {
    let env = fixture();
    let all = stream(&env, &[]);
    let good = cursor(&all[3]).to_string();
    let mut flipped = good.clone().into_bytes();
    let i = flipped.len() - 3;
    flipped[i] = if flipped[i] == b'x' { b'y' } else { b'x' };
    let flipped = String::from_utf8(flipped).unwrap();
    for (bad, problem) in [
        ("", "empty"),
        ("latest", "start with `v1.`"),
        ("v1.abc$def", "contains `$`"),
        (&good[..good.len() - 5], "truncated"),
        (&flipped, "damaged"),
    ] {
        let stderr = env.fails(&["events", "--after", bad], 64);
        assert!(
            stderr.contains("--after") && stderr.contains(problem),
            "{bad:?}: {stderr}"
        );
    }
}

// ---- concurrent writers and a paging reader -----------------------------------------------

/// Every event in the files now, as (source, line as JSON) with counts.
fn events_in_files(env: &Env) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    let mut files = Vec::new();
    for name in crate::support::list(&env.root) {
        let journal = env.root.join(&name).join("journal.jsonl");
        if !name.starts_with('.') && journal.is_file() {
            files.push((name, journal));
        }
    }
    for log in ["errors.jsonl", "signals.jsonl"] {
        files.push(("daemon".to_string(), env.root.join(".daemon").join(log)));
    }
    for (source, path) in files {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {line:?}: {e}", path.display()));
            *out.entry((source.clone(), v.to_string())).or_default() += 1;
        }
    }
    out
}

fn fake_agent_config(env: &Env) -> String {
    let agent = env.script(
        "agent.sh",
        r#"echo "$AGENT_STATE_AGENT: session $AGENT_STATE_SESSION_ID at work"
sleep 0.1
case "$AGENT_STATE_INSTANCE" in *[05]) echo "failing on purpose" >&2; exit 1;; esac"#,
    );
    format!(
        r#"[daemon]
max_concurrent_sessions = 2
shutdown_grace = "2s"

[defaults]
command = [{agent:?}, "{{agent}}"]
timeout = "30s"
kill_grace = "1s"
wake_on_inbox = "any"
inbox_debounce = "100ms"
retry_delay = "1s"
max_backoff = "2s"

[[agent]]
name = "rio"

[[agent]]
name = "clay"

[[agent]]
name = "marcus"
kind = "human"
"#,
        agent = agent.display().to_string()
    )
}

#[test]
fn a_paging_reader_sees_every_event_once_while_sessions_run_and_writers_append() {
    let env = Env::with_config("");
    env.set_config(&fake_agent_config(&env));
    env.ok(&["bootstrap"]);
    let daemon = env.daemon();

    let env = std::sync::Arc::new(env);
    let writers: Vec<std::thread::JoinHandle<()>> = vec![
        {
            let env = env.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let agent = if i % 2 == 0 { "rio" } else { "clay" };
                    env.ok(&["task", "add", agent, "--description", &format!("task {i}")]);
                }
            })
        },
        {
            let env = env.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let to = if i % 2 == 0 { "clay" } else { "rio" };
                    env.send("marcus", to, &["--body", &format!("message {i}")]);
                    // Kept: pacing a writer so the reader reads meanwhile.
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        },
        {
            // A writer of the daemon's signal log whose lines arrive in two
            // writes: a reader must never take half a line.
            let env = env.clone();
            std::thread::spawn(move || {
                let path = env.root.join(".daemon/signals.jsonl");
                for i in 0..25 {
                    let line = format!(
                        "{{\"ts\":\"2026-03-01T10:00:{:02}Z\",\"level\":\"warn\",\"code\":\"SIGNAL_MALFORMED\",\"agent\":\"rio\",\"raw\":\"[axiom:{i}]\"}}\n",
                        59 - i
                    );
                    let (head, tail) = line.split_at(line.len() / 2);
                    append(&path, head);
                    // Kept: a torn line is the subject (a reader between halves).
                    std::thread::sleep(Duration::from_millis(7));
                    append(&path, tail);
                }
            })
        },
    ];

    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut after: Option<String> = None;
    let mut pages_while_writing = 0;
    let mut read_page = |after: &mut Option<String>| -> usize {
        let mut args = vec!["--limit", "7"];
        if let Some(c) = after.as_deref() {
            args.extend(["--after", c]);
        }
        let page = stream(&env, &args);
        assert!(page.len() <= 7);
        for e in &page {
            let key = (
                e["source"].as_str().unwrap().to_string(),
                e["event"].to_string(),
            );
            *seen.entry(key).or_default() += 1;
        }
        if let Some(last) = page.last() {
            *after = Some(cursor(last).to_string());
        }
        page.len()
    };
    while writers.iter().any(|w| !w.is_finished()) {
        read_page(&mut after);
        pages_while_writing += 1;
    }
    for w in writers {
        w.join().expect("writer");
    }
    // The daemon's exit (drop waits for it) is the proof nothing writes
    // any more: whatever the last sessions wrote comes before it.
    drop(daemon);
    while read_page(&mut after) > 0 {}

    let want = events_in_files(&env);
    assert!(
        pages_while_writing >= 3,
        "the reader read while writers ran"
    );
    assert!(
        want.keys()
            .any(|(s, e)| s == "rio" && e.contains("session_start")),
        "sessions ran"
    );
    assert!(want.keys().any(|(s, _)| s == "daemon"));
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, n)| seen.get(*k) != Some(*n))
        .collect();
    let extra: Vec<_> = seen
        .iter()
        .filter(|(k, n)| want.get(*k) != Some(*n))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{} events in the files, {} read\nnot read as often as written: {missing:#?}\nread but not written so: {extra:#?}",
        want.values().sum::<usize>(),
        seen.values().sum::<usize>()
    );
}

// ---- --follow ---------------------------------------------------------------------------

/// `events --follow ARGS` with its stdout lines sent to a channel.
fn follower(env: &Env, args: &[&str]) -> (Child, Receiver<String>) {
    let mut all = vec!["events", "--follow"];
    all.extend_from_slice(args);
    let mut child = env
        .command(&all)
        .stdout(Stdio::piped())
        // Its notes (--limit's cursor) would land in the test runner's
        // output, outside any test's captured output.
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn events --follow");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn next_event(rx: &Receiver<String>, what: &str) -> Value {
    let line = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("no line within 10s: {what} ({e})"));
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("events --follow did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).expect("kill");
}

#[test]
fn follow_prints_events_appended_after_it_started() {
    let env = Env::standard();
    let existing = stream(&env, &[]);
    assert_eq!(existing.len(), 4, "a bootstrap event per agent");

    let (mut child, rx) = follower(&env, &["--json"]);
    let (mut limited, limited_rx) = follower(&env, &["--json", "--limit", "5"]);
    for e in &existing {
        assert_eq!(next_event(&rx, "the existing events")["event"], e["event"]);
        assert_eq!(
            next_event(&limited_rx, "the existing events")["event"],
            e["event"]
        );
    }

    // An append by another process.
    env.ok(&["task", "add", "rio", "--description", "followed"]);
    let e = next_event(&rx, "the task_added of `task add`");
    assert_eq!(
        (e["source"].as_str(), e["kind"].as_str()),
        (Some("rio"), Some("task_added"))
    );
    assert_eq!(e["event"]["description"], "followed");
    // --limit 5: that was its fifth; it ends by itself.
    assert_eq!(
        next_event(&limited_rx, "the fifth event")["kind"],
        "task_added"
    );
    assert_eq!(
        wait_exit(&mut limited, Duration::from_secs(5)).code(),
        Some(0)
    );

    // A directory that appears after it started, and the daemon's log.
    let newbie = env.root.join("newbie");
    std::fs::create_dir(&newbie).expect("mkdir");
    append(
        &newbie.join("journal.jsonl"),
        "{\"ts\":\"2026-03-01T10:00:00Z\",\"event\":\"hello\"}\n",
    );
    let e = next_event(&rx, "the new agent's first event");
    assert_eq!(
        (e["source"].as_str(), e["kind"].as_str()),
        (Some("newbie"), Some("hello"))
    );
    append(
        &env.root.join(".daemon/errors.jsonl"),
        "{\"ts\":\"2026-03-01T10:00:00Z\",\"code\":\"DISK_LOW\",\"message\":\"low\"}\n",
    );
    let e = next_event(&rx, "the daemon's error");
    assert_eq!(
        (e["source"].as_str(), e["kind"].as_str()),
        (Some("daemon"), Some("error"))
    );
    // Its cursor is where a reader that stops now resumes: nothing is left.
    assert!(stream(&env, &["--after", cursor(&e)]).is_empty());

    // Appends with nothing new to say (other files) print nothing.
    env.write("rio", "memory.md", "# memory\n");
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());

    signal(&child, Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(5)).code(),
        Some(0)
    );
}

#[test]
fn follow_ends_with_exit_0_when_stdout_closes_or_on_sigint() {
    let env = Env::standard();
    let mut child = env
        .command(&["events", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn events --follow");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read a line");
    assert!(line.contains("bootstrap"), "{line}");
    // The reader goes away; nothing is appended: it notices anyway.
    drop(stdout);
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(5)).code(),
        Some(0)
    );

    let (mut child, rx) = follower(&env, &[]);
    next_event_text(&rx);
    signal(&child, Signal::SIGINT);
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(5)).code(),
        Some(0)
    );
}

fn next_event_text(rx: &Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a line within 10s")
}
