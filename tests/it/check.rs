//! `check` finds damage and `check --repair` mends it without losing a byte;
//! hooks survive damage on their own; metrics can be recomputed; a bad config
//! stops every command with every problem named.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::support::{Env, list};

/// Set a file's mtime `secs` seconds into the past.
fn age(path: &Path, secs: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open to set mtime");
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .expect("set mtime");
}

/// The pid of a process that has exited (and been reaped).
fn dead_pid() -> i32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id() as i32;
    child.wait().expect("wait true");
    pid
}

/// The one file in `dir` whose name starts with `prefix`.
fn one_named(dir: &Path, prefix: &str) -> String {
    let found: Vec<String> = list(dir)
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {prefix}* in {}: {:?}",
        dir.display(),
        list(dir)
    );
    found[0].clone()
}

#[test]
fn check_finds_every_kind_of_damage_and_repair_mends_it() {
    let env = Env::standard();
    let clean = env.ok(&["check"]);
    assert!(clean.contains("no problems found"), "{clean}");

    // rio: history in the journal, then damaged files.
    assert_eq!(
        env.ok(&["task", "add", "rio", "--description", "first task"])
            .trim(),
        "task-001"
    );
    assert_eq!(
        env.ok(&[
            "task",
            "add",
            "rio",
            "--description",
            "second task",
            "--priority",
            "high"
        ])
        .trim(),
        "task-002"
    );
    env.ok(&[
        "task",
        "set",
        "rio",
        "task-002",
        "--status",
        "completed",
        "--outcome",
        "done",
    ]);
    let sid = env.ok(&["session", "begin", "rio"]).trim().to_string();
    env.ok(&[
        "session",
        "end",
        "rio",
        "--sources-archived",
        "4",
        "--summary",
        "did things",
    ]);
    // A torn line in the middle of the journal: a crash mid-append, then a
    // normal command appends after it.
    std::fs::OpenOptions::new()
        .append(true)
        .open(env.path("rio", "journal.jsonl"))
        .unwrap()
        .write_all(b"{\"ts\":\"2026-")
        .unwrap();
    env.ok(&["record", "rio", "--claims-proposed", "1"]);
    let report_bytes = {
        let full = env.read("rio", "report.json");
        full[..full.len() / 2].to_string()
    };
    env.write("rio", "report.json", &report_bytes);
    let tasks_bytes = "{\"agent\":\"rio\",\"tasks\":[{\"id\":\"task-0";
    env.write("rio", "tasks.json", tasks_bytes);

    // theseus: a session left running by a process that is gone, with a
    // claimed message; and a malformed inbox file that is not fresh.
    let msg = env.send("leo", "theseus", &["--body", "please look"]);
    let stale = "20260101-000000";
    std::fs::create_dir_all(env.path("theseus", &format!("inbox/.claimed/{stale}"))).unwrap();
    std::fs::rename(
        env.path("theseus", &format!("inbox/{msg}.json")),
        env.path("theseus", &format!("inbox/.claimed/{stale}/{msg}.json")),
    )
    .unwrap();
    let pid = dead_pid();
    let session = json!({
        "agent": "theseus",
        "session_id": stale,
        "started_at": "2026-01-01T00:00:00Z",
        "type": "research",
        "status": "running",
        "owner_pid": pid,
        "messages": [msg],
    });
    env.write("theseus", "session.json", &session.to_string());
    let bad = "{\"from\": \"leo\", \"subject\": ";
    env.write("theseus", "inbox/bad.json", bad);
    age(&env.path("theseus", "inbox/bad.json"), 60);

    // check: exit 65, every problem listed, nothing touched.
    let out = env.run(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(65),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "rio: report.json: corrupt",
        "rio: tasks.json: corrupt",
        "rio: journal.jsonl: torn line",
        "theseus: session.json: session 20260101-000000",
        "theseus: inbox/bad.json: malformed message",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("PROBLEM") && l.contains(want)),
            "`check` does not list {want:?}:\n{stdout}"
        );
    }
    assert!(stdout.contains(&format!("pid {pid}")), "{stdout}");
    assert_eq!(
        env.read("rio", "report.json"),
        report_bytes,
        "check without --repair changed report.json"
    );
    assert_eq!(env.read("rio", "tasks.json"), tasks_bytes);
    assert_eq!(env.json("theseus", "session.json")["status"], "running");
    assert!(env.path("theseus", "inbox/bad.json").exists());

    // check --json parses and says the same.
    let out = env.run(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(65));
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json is JSON");
    let findings: Vec<(String, String)> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            (
                f["agent"].as_str().unwrap().to_string(),
                f["file"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (agent, file) in [
        ("rio", "report.json"),
        ("rio", "tasks.json"),
        ("rio", "journal.jsonl"),
        ("theseus", "session.json"),
        ("theseus", "inbox/bad.json"),
    ] {
        assert!(
            findings.contains(&(agent.into(), file.into())),
            "{agent} {file} missing in {report:#}"
        );
    }
    assert_eq!(findings.len(), 5, "{report:#}");
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.get("repaired").is_none())
    );

    // check --repair.
    let out = env.run(&["check", "--repair"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("REPAIRED")).count(),
        5,
        "{stdout}"
    );

    // Corrupt files set aside with their original bytes.
    let rio = env.agent("rio");
    let aside = one_named(&rio, "report.json.corrupt-");
    assert_eq!(env.read("rio", &aside), report_bytes);
    let aside = one_named(&rio, "tasks.json.corrupt-");
    assert_eq!(env.read("rio", &aside), tasks_bytes);

    // ...and rebuilt from the journal.
    let tasks = env.json("rio", "tasks.json");
    let tasks = tasks["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 2, "{tasks:#?}");
    assert_eq!(
        (tasks[0]["id"].as_str(), tasks[0]["description"].as_str()),
        (Some("task-001"), Some("first task"))
    );
    assert_eq!(tasks[0]["status"], "pending");
    assert_eq!(
        (tasks[1]["id"].as_str(), tasks[1]["priority"].as_str()),
        (Some("task-002"), Some("high"))
    );
    assert_eq!(tasks[1]["status"], "completed");
    assert_eq!(tasks[1]["outcome"], "done");
    let report = env.json("rio", "report.json");
    assert_eq!(report["agent"], "rio");
    assert_eq!(report["status"], "idle");
    assert_eq!(report["last_session"]["id"], json!(sid), "{report:#}");
    assert_eq!(report["last_session"]["outcome"], "completed");
    assert_eq!(report["last_session"]["sources_archived"], 4);
    assert_eq!(report["summary"], "did things");

    // The torn line went to a side file; the lines after it were kept.
    let torn = one_named(&rio, "journal.jsonl.torn-");
    assert_eq!(env.read("rio", &torn).trim_end(), "{\"ts\":\"2026-");
    let journal = env.journal("rio"); // panics on any line that is not JSON
    assert!(
        !env.read("rio", "journal.jsonl")
            .contains("{\"ts\":\"2026-\n")
    );
    assert_eq!(env.events("rio", "record").len(), 1);
    assert_eq!(env.events("rio", "task_added").len(), 2);
    let repaired: Vec<&str> = journal
        .iter()
        .filter(|e| e["event"] == "state_repaired")
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert!(
        repaired.contains(&"report.json") && repaired.contains(&"tasks.json"),
        "{repaired:?}"
    );

    // The abandoned session is an error and its message is back.
    let session = env.json("theseus", "session.json");
    assert_eq!(session["session_id"], stale);
    assert_eq!(session["status"], "error", "{session:#}");
    assert!(
        session["reason"]
            .as_str()
            .unwrap_or("")
            .contains("interrupted"),
        "{session:#}"
    );
    assert!(
        env.waiting("theseus").contains(&format!("{msg}.json")),
        "{:?}",
        env.waiting("theseus")
    );
    let returned = crate::support::read_json(&env.path("theseus", &format!("inbox/{msg}.json")));
    assert!(
        returned["attempts"].is_null(),
        "an interrupted session is not a failed delivery attempt: {returned:#}"
    );
    assert_eq!(returned["body"], "please look");
    assert!(
        !env.path("theseus", &format!("inbox/.claimed/{stale}"))
            .exists()
    );
    let errors = env.events("theseus", "error");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0]["session_id"], stale);
    assert_eq!(errors[0]["messages_returned"], json!([msg]));
    let treport = env.json("theseus", "report.json");
    assert_eq!(treport["status"], "error");
    assert_eq!(treport["last_session"]["id"], stale);
    assert_eq!(treport["last_session"]["outcome"], "error");
    assert_eq!(
        env.json("theseus", "metrics.json")["lifetime"]["sessions_error"],
        1
    );

    // The malformed inbox file is in rejected/ with its reason.
    assert!(!env.path("theseus", "inbox/bad.json").exists());
    assert_eq!(env.read("theseus", "inbox/rejected/bad.json"), bad);
    let reason =
        crate::support::read_json(&env.path("theseus", "inbox/rejected/bad.json.reason.json"));
    assert!(
        reason["reason"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{reason:#}"
    );

    // All mended.
    let again = env.ok(&["check"]);
    assert!(again.contains("no problems found"), "{again}");
    let out = env.run(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json is JSON");
    assert_eq!(report["findings"], json!([]), "{report:#}");
}

#[test]
fn a_hook_survives_a_corrupt_report() {
    let env = Env::standard();
    env.ok(&["session", "begin", "rio"]);
    env.ok(&["session", "end", "rio", "--summary", "before the crash"]);
    let broken = "{\"agent\": \"rio\", \"status\": \"idle\", \"last_sess";
    env.write("rio", "report.json", broken);

    let out = env.run(&["session", "begin", "rio"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "begin failed on a corrupt report.json:\n{stderr}"
    );
    let sid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(stderr.contains("report.json was corrupt"), "{stderr}");
    let aside = one_named(&env.agent("rio"), "report.json.corrupt-");
    assert!(
        stderr.contains(&aside),
        "stderr does not name {aside}: {stderr}"
    );
    assert_eq!(env.read("rio", &aside), broken);

    let report = env.json("rio", "report.json");
    assert_eq!(report["status"], "researching");
    assert_eq!(report["current_session"], json!(sid));
    assert_eq!(
        report["summary"], "before the crash",
        "rebuilt report lost the summary: {report:#}"
    );
    assert_eq!(env.events("rio", "state_repaired").len(), 1);
    env.ok(&["session", "end", "rio"]);
    assert!(env.ok(&["check"]).contains("no problems found"));
}

#[test]
fn metrics_rebuild_matches_the_incremental_counts() {
    let env = Env::standard();
    env.send("leo", "rio", &["--type", "flag"]);
    env.ok(&[
        "session",
        "begin",
        "rio",
        "--disconfirmation-target",
        "belief 3",
    ]);
    env.ok(&["session", "end", "rio", "--sources-archived", "4"]);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&[
        "session",
        "fail",
        "rio",
        "--outcome",
        "error",
        "--reason",
        "api down",
    ]);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&[
        "session",
        "fail",
        "rio",
        "--outcome",
        "timeout",
        "--reason",
        "5400s",
    ]);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&[
        "session",
        "begin",
        "rio",
        "--disconfirmation-target",
        "belief 4",
    ]); // joins
    env.ok(&["session", "end", "rio", "--sources-archived", "7"]);
    env.ok(&[
        "record",
        "rio",
        "--claims-proposed",
        "5",
        "--claims-accepted",
        "3",
    ]);
    env.ok(&[
        "record",
        "rio",
        "--claims-challenged",
        "1",
        "--claims-rejected",
        "1",
        "--disconfirmation-hits",
        "1",
    ]);
    env.send("rio", "leo", &["--type", "flag"]);
    env.send("rio", "theseus", &["--type", "flag"]);
    env.send("rio", "leo", &["--type", "question"]);

    let before = env.json("rio", "metrics.json");
    let lifetime = &before["lifetime"];
    let want = json!({
        "sessions_total": 4, "sessions_completed": 2, "sessions_timeout": 1, "sessions_error": 1,
        "sources_archived": 11, "claims_proposed": 5, "claims_accepted": 3, "claims_challenged": 1,
        "claims_rejected": 1, "disconfirmation_attempts": 2, "disconfirmation_hits": 1,
        "cross_agent_flags_sent": 2, "cross_agent_flags_received": 1,
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&lifetime[k], v, "incremental {k}: {before:#}");
    }

    let out = env.ok(&["metrics", "rebuild", "rio"]);
    assert!(out.contains("rio: rebuilt"), "{out}");
    let after = env.json("rio", "metrics.json");
    assert_eq!(
        after["lifetime"], before["lifetime"],
        "metrics rebuild disagrees with the hooks"
    );
    assert_eq!(
        after["rolling_30d"], before["rolling_30d"],
        "rolling window disagrees"
    );
    assert_eq!(after["rolling_30d"]["sessions"], 4);
    assert_eq!(after["rolling_30d"]["claims_proposed"], 5);
}

#[test]
fn a_bad_config_stops_every_command_and_names_every_field() {
    let env = Env::with_config(
        r#"
[daemon]
max_concurrent_sessions = 0

[[agent]]
name = "rio"
schedule = "0 25 * * *"

[[agent]]
name = "leo"
schedule = "every day"
timezone = "Mars/Olympus"

[[agent]]
name = "Theseus"
"#,
    );
    let fields = [
        "daemon.max_concurrent_sessions",
        "agent[0] (rio).schedule",
        "agent[1] (leo).schedule",
        "agent[1] (leo).timezone",
        "agent[2].name",
    ];
    let commands: Vec<Vec<&str>> = vec![
        vec!["bootstrap"],
        vec!["status"],
        vec!["status", "rio"],
        vec!["check"],
        vec!["check", "--repair"],
        vec!["session", "begin", "rio"],
        vec!["session", "end", "rio"],
        vec![
            "session",
            "fail",
            "rio",
            "--outcome",
            "error",
            "--reason",
            "x",
        ],
        vec!["task", "add", "rio", "--description", "d"],
        vec!["task", "list", "rio"],
        vec!["send", "--from", "leo", "--to", "rio", "--subject", "s"],
        vec!["inbox", "rio"],
        vec!["record", "rio", "--claims-proposed", "1"],
        vec!["metrics", "rebuild"],
        vec!["prompt", "rio"],
    ];
    for cmd in &commands {
        let stderr = env.fails(cmd, 78);
        for f in fields {
            assert!(
                stderr.contains(f),
                "{cmd:?}: stderr does not name {f}:\n{stderr}"
            );
        }
        assert!(
            stderr.contains(&env.config.display().to_string()),
            "{cmd:?}: config path not named:\n{stderr}"
        );
    }
    assert!(
        !env.root.exists(),
        "a command created the state root despite a bad config"
    );
}

#[test]
fn hooks_survive_a_corrupt_metrics_file_without_counting_twice() {
    let env = Env::standard();
    env.ok(&["record", "rio", "--claims-proposed", "2"]);
    env.ok(&["session", "begin", "rio"]);
    env.ok(&["session", "end", "rio", "--sources-archived", "3"]);

    // Each command below journals its event and then finds metrics.json
    // corrupt: the rebuilt file must count that event once, not twice.
    let steps: Vec<(Vec<&str>, &str, u64)> = vec![
        (
            vec!["record", "rio", "--claims-proposed", "1"],
            "claims_proposed",
            3,
        ),
        (
            vec![
                "send",
                "--from",
                "rio",
                "--to",
                "leo",
                "--type",
                "flag",
                "--subject",
                "s",
            ],
            "cross_agent_flags_sent",
            1,
        ),
        (vec!["session", "begin", "rio"], "sessions_total", 1),
        (
            vec!["session", "end", "rio", "--sources-archived", "4"],
            "sessions_total",
            2,
        ),
        (vec!["session", "begin", "rio"], "sessions_total", 2),
        (
            vec![
                "session",
                "fail",
                "rio",
                "--outcome",
                "error",
                "--reason",
                "x",
            ],
            "sessions_error",
            1,
        ),
    ];
    let mut wrong = Vec::new();
    for (cmd, counter, want) in steps {
        env.write("rio", "metrics.json", "{\"agent\": \"rio\", \"lifet");
        let out = env.run(&cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{cmd:?} failed on a corrupt metrics.json: {stderr}"
        );
        assert!(
            stderr.contains("metrics.json was corrupt"),
            "{cmd:?}: {stderr}"
        );
        let got = env.json("rio", "metrics.json")["lifetime"][counter].clone();
        // The journal's count (and a clean file for the next step).
        env.ok(&["metrics", "rebuild", "rio"]);
        let journal = env.json("rio", "metrics.json")["lifetime"][counter].clone();
        assert_eq!(journal, want, "{cmd:?}: the journal's {counter}");
        if got != journal {
            wrong.push(format!(
                "{cmd:?}: lifetime.{counter} = {got}, the journal says {journal}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "events counted twice when metrics.json was corrupt:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn check_finds_old_temp_files_of_interrupted_writes_and_repair_removes_them() {
    let env = Env::standard();
    let old = env.path("rio", ".report.json.Ab12Cd.tmp");
    let fresh = env.path("rio", ".tasks.json.Ef34Gh.tmp");
    for p in [&old, &fresh] {
        std::fs::write(p, "{ half").unwrap();
    }
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let out = env.run(&["check"]);
    assert_eq!(out.status.code(), Some(65));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains(".report.json.Ab12Cd.tmp"), "{text}");
    assert!(
        !text.contains(".tasks.json.Ef34Gh.tmp"),
        "a fresh one may be a write in progress: {text}"
    );
    env.ok(&["check", "--repair"]);
    assert!(!old.exists());
    assert!(fresh.exists(), "never a write that may be in progress");
    env.ok(&["check"]);
}

/// Before the daemon's first start, the state root and the agents'
/// directories it will create are not problems: `check` says so and exits 0;
/// once the daemon has run, a missing directory is a problem again.
#[test]
fn check_before_the_first_daemon_start_does_not_count_what_the_daemon_will_create() {
    let env = Env::with_config(crate::support::STANDARD_AGENTS);
    assert!(!env.root.exists());
    let out = env.run(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("does not exist yet; the daemon creates it"),
        "{said}"
    );
    assert!(said.contains("no problems found"), "{said}");
    // Bootstrapped but for one agent, still before the first start.
    env.ok(&["bootstrap"]);
    std::fs::remove_dir_all(env.agent("rio")).unwrap();
    let said = env.ok(&["check"]);
    assert!(said.contains("rio: not bootstrapped yet"), "{said}");
    assert!(said.contains("no problems found"), "{said}");
    // After a daemon has run here, a missing directory is damage.
    {
        let _d = env.daemon();
    }
    std::fs::remove_dir_all(env.agent("rio")).unwrap();
    let out = env.run(&["check"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("PROBLEM  rio: .: not bootstrapped"), "{said}");
}

#[test]
fn check_lists_a_daemon_lock_open_to_the_group_and_repair_narrows_it() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::standard();
    // An install from before: `.daemon/lock` 0640, which a member of the
    // inbox group can flock to keep the daemon from starting.
    let lock = env.root.join(".daemon/lock");
    std::fs::create_dir_all(env.root.join(".daemon")).unwrap();
    std::fs::write(&lock, "").unwrap();
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = env.run(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.lines().any(
            |l| l.starts_with("PROBLEM") && l.contains(".daemon/lock: mode 640, should be 600")
        ),
        "{stdout}"
    );
    let mode = || std::fs::metadata(&lock).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(), 0o640, "check without --repair changed it");
    env.run(&["check", "--repair"]);
    assert_eq!(mode(), 0o600);
    let clean = env.ok(&["check"]);
    assert!(!clean.contains(".daemon/lock"), "{clean}");
}
