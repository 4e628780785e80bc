//! Many writers at once, readers that never stop, and files other tools
//! touched: what a pipeline or an operator sees must always be whole.

use std::collections::BTreeSet;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Env, keys, read_json};

/// What one of the concurrent processes did.
enum Op {
    Task(String),
    Inbound(String),
    Flag(String),
    Record,
}

#[test]
fn fifty_concurrent_writers_lose_nothing() {
    let env = Env::standard();
    let journal_before = env.journal("rio").len();

    let mut ops = Vec::new();
    for i in 0..50 {
        ops.push(match i % 4 {
            0 => Op::Task(format!("concurrent task {i}")),
            1 => Op::Inbound(format!("leo to rio {i}")),
            2 => Op::Flag(format!("rio flags leo {i}")),
            _ => Op::Record,
        });
    }
    // Start all of them before waiting for any.
    let children: Vec<(String, Child)> = ops
        .iter()
        .map(|op| {
            let args: Vec<&str> = match op {
                Op::Task(d) => vec!["task", "add", "rio", "--description", d],
                Op::Inbound(s) => vec!["send", "--from", "leo", "--to", "rio", "--subject", s],
                Op::Flag(s) => vec![
                    "send",
                    "--from",
                    "rio",
                    "--to",
                    "leo",
                    "--type",
                    "flag",
                    "--subject",
                    s,
                ],
                Op::Record => vec!["record", "rio", "--claims-proposed", "1"],
            };
            let child = env
                .command(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn agent-state");
            (format!("{args:?}"), child)
        })
        .collect();
    for (args, child) in children {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{args} exited {:?}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let want_tasks: BTreeSet<String> = ops
        .iter()
        .filter_map(|o| {
            if let Op::Task(d) = o {
                Some(d.clone())
            } else {
                None
            }
        })
        .collect();
    let want_inbound: BTreeSet<String> = ops
        .iter()
        .filter_map(|o| {
            if let Op::Inbound(s) = o {
                Some(s.clone())
            } else {
                None
            }
        })
        .collect();
    let want_flags: BTreeSet<String> = ops
        .iter()
        .filter_map(|o| {
            if let Op::Flag(s) = o {
                Some(s.clone())
            } else {
                None
            }
        })
        .collect();
    let records = ops.iter().filter(|o| matches!(o, Op::Record)).count() as u64;
    assert_eq!(
        (
            want_tasks.len(),
            want_inbound.len(),
            want_flags.len(),
            records
        ),
        (13, 13, 12, 12)
    );

    // tasks.json: every task, ids task-001..task-013, each once.
    let tasks = env.json("rio", "tasks.json");
    let tasks = tasks["tasks"].as_array().expect("tasks array");
    let ids: Vec<String> = tasks
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    let want_ids: Vec<String> = (1..=want_tasks.len())
        .map(|n| format!("task-{n:03}"))
        .collect();
    assert_eq!(
        sorted, want_ids,
        "task ids must be unique and contiguous: {ids:?}"
    );
    let descriptions: BTreeSet<String> = tasks
        .iter()
        .map(|t| t["description"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(descriptions, want_tasks);

    // rio's inbox holds every message leo sent; leo's every flag rio sent.
    let subjects = |agent: &str| -> BTreeSet<String> {
        env.waiting(agent)
            .iter()
            .map(|n| {
                read_json(&env.path(agent, &format!("inbox/{n}")))["subject"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(env.waiting("rio").len(), want_inbound.len());
    assert_eq!(subjects("rio"), want_inbound);
    assert_eq!(env.waiting("leo").len(), want_flags.len());
    assert_eq!(subjects("leo"), want_flags);

    // Metrics counted every call.
    let m = env.json("rio", "metrics.json");
    assert_eq!(m["lifetime"]["claims_proposed"], json!(records), "{m:#}");
    assert_eq!(
        m["lifetime"]["cross_agent_flags_sent"],
        json!(want_flags.len()),
        "{m:#}"
    );
    let leo = env.json("leo", "metrics.json");
    assert_eq!(
        leo["lifetime"]["cross_agent_flags_sent"],
        json!(want_inbound.len()),
        "{leo:#}"
    );

    // The journal: one whole, valid line per event.
    let text = env.read("rio", "journal.jsonl");
    assert!(text.ends_with('\n'));
    for (n, line) in text.lines().enumerate() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok_and(|v| v.is_object()),
            "journal line {} is not a JSON object: {line:?}",
            n + 1
        );
    }
    let added = env.events("rio", "task_added");
    let sent = env.events("rio", "message_sent");
    let recorded = env.events("rio", "record");
    assert_eq!(added.len(), want_tasks.len());
    assert_eq!(sent.len(), want_flags.len());
    assert_eq!(recorded.len() as u64, records);
    // A delivery journals `message_received` when the recipient's lock is
    // free that instant (the daemon's intake or the claim does otherwise):
    // at most one per message, each naming a message that is there.
    let received = env.events("rio", "message_received");
    let received_subjects: BTreeSet<String> = received
        .iter()
        .map(|e| e["subject"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(received_subjects.len(), received.len(), "{received:#?}");
    assert!(received_subjects.is_subset(&want_inbound), "{received:#?}");
    assert_eq!(
        env.journal("rio").len(),
        journal_before + want_tasks.len() + want_flags.len() + records as usize + received.len()
    );
    let journaled_ids: BTreeSet<&str> = added
        .iter()
        .map(|e| e["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        journaled_ids.len(),
        want_tasks.len(),
        "task_added ids repeat"
    );
    assert_eq!(env.events("leo", "message_sent").len(), want_inbound.len());
}

#[test]
fn readers_never_see_a_half_written_report() {
    let env = Env::standard();
    let path = env.path("rio", "report.json");
    let stop = Arc::new(AtomicBool::new(false));
    // The reader's count so far: the writer goes on until the reader has
    // read enough while it wrote (however slow a busy machine makes
    // either), not for a fixed time.
    let reads_so_far = Arc::new(AtomicU64::new(0));

    let reader = {
        let stop = stop.clone();
        let reads_so_far = reads_so_far.clone();
        let path = path.clone();
        let metrics = env.path("rio", "metrics.json");
        std::thread::spawn(move || {
            let (mut reads, mut researching, mut idle, mut metrics_reads) =
                (0u64, 0u64, 0u64, 0u64);
            let mut problems: Vec<String> = Vec::new();
            let parse = |path: &std::path::Path, problems: &mut Vec<String>| -> Option<Value> {
                match std::fs::read(path) {
                    Err(e) => problems.push(format!("{}: {e}", path.display())),
                    Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                        Err(e) => problems.push(format!(
                            "{}: invalid JSON ({e}): {:?}",
                            path.display(),
                            String::from_utf8_lossy(&bytes)
                        )),
                        Ok(v) => return Some(v),
                    },
                }
                None
            };
            while !stop.load(Ordering::Relaxed) {
                if let Some(v) = parse(&path, &mut problems) {
                    match v["status"].as_str() {
                        Some("researching") => researching += 1,
                        Some("idle") => idle += 1,
                        other => {
                            problems.push(format!("report.json read #{reads}: status {other:?}"))
                        }
                    }
                }
                reads += 1;
                reads_so_far.store(reads, Ordering::Relaxed);
                // Pipelines read metrics.json too; every end rewrites it.
                if reads % 4 == 0 {
                    if let Some(v) = parse(&metrics, &mut problems)
                        && !v["lifetime"].is_object()
                    {
                        problems.push(format!("metrics.json without lifetime: {v}"));
                    }
                    metrics_reads += 1;
                }
                if problems.len() > 20 {
                    break;
                }
            }
            (reads, researching, idle, metrics_reads, problems)
        })
    };

    // Every begin and every end replaces report.json: at least 1,000
    // rewrites, and on until the reader has read 2,000 times meanwhile (a
    // bound only against a reader that is stuck).
    let started = Instant::now();
    let mut rewrites = 0u64;
    while rewrites < 1000 || reads_so_far.load(Ordering::Relaxed) < 2000 {
        env.ok(&["session", "begin", "rio"]);
        env.ok(&["session", "end", "rio", "--sources-archived", "1"]);
        rewrites += 2;
        // A reader that gave up (too many bad reads) is reported below.
        if reader.is_finished() || started.elapsed() > Duration::from_secs(600) {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, researching, idle, metrics_reads, problems) = reader.join().expect("reader thread");

    assert!(
        problems.is_empty(),
        "the reader saw {} bad reads, first ones:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(
        rewrites >= 1000,
        "only {rewrites} rewrites in {:?}",
        started.elapsed()
    );
    assert!(
        reads >= 2000,
        "only {reads} reads during {rewrites} rewrites"
    );
    assert!(
        metrics_reads >= 500,
        "only {metrics_reads} reads of metrics.json"
    );
    // The reader really watched the file change, not one stale copy.
    assert!(
        researching > 0 && idle > 0,
        "researching {researching}, idle {idle}"
    );
    let m = env.json("rio", "metrics.json");
    assert_eq!(m["lifetime"]["sessions_completed"], json!(rewrites / 2));
    eprintln!(
        "{reads} reads ({researching} researching, {idle} idle, {metrics_reads} of metrics.json) during {rewrites} rewrites in {:?}",
        started.elapsed()
    );
}

/// Fields another tool wrote into report.json and tasks.json.
fn add_foreign_fields(env: &Env) {
    let mut report = env.json("rio", "report.json");
    report["pipeline_score"] = json!({"value": 0.87, "by": "teleo-pipeline"});
    env.write(
        "rio",
        "report.json",
        &serde_json::to_string_pretty(&report).unwrap(),
    );
    let mut tasks = env.json("rio", "tasks.json");
    tasks["queue_owner"] = json!("teleo-pipeline");
    tasks["tasks"][0]["weight"] = json!([3, "heavy"]);
    env.write(
        "rio",
        "tasks.json",
        &serde_json::to_string_pretty(&tasks).unwrap(),
    );
}

fn assert_foreign_fields(env: &Env, after: &str) {
    let report = env.json("rio", "report.json");
    assert_eq!(
        report["pipeline_score"],
        json!({"value": 0.87, "by": "teleo-pipeline"}),
        "report.json lost pipeline_score after {after}: {report:#}"
    );
    let tasks = env.json("rio", "tasks.json");
    assert_eq!(
        tasks["queue_owner"],
        json!("teleo-pipeline"),
        "tasks.json lost queue_owner after {after}: {tasks:#}"
    );
    let first = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "task-001")
        .expect("task-001");
    assert_eq!(
        first["weight"],
        json!([3, "heavy"]),
        "task-001 lost weight after {after}: {tasks:#}"
    );
}

#[test]
fn fields_added_by_other_tools_survive_every_rewrite() {
    let env = Env::standard();
    env.ok(&["task", "add", "rio", "--description", "first"]);
    add_foreign_fields(&env);
    assert_foreign_fields(&env, "setup");

    let steps: Vec<Vec<&str>> = vec![
        vec!["session", "begin", "rio"],
        vec![
            "session",
            "end",
            "rio",
            "--sources-archived",
            "3",
            "--summary",
            "ok",
        ],
        vec!["session", "begin", "rio"],
        vec![
            "session",
            "fail",
            "rio",
            "--outcome",
            "error",
            "--reason",
            "boom",
        ],
        vec!["task", "add", "rio", "--description", "second"],
        vec!["task", "set", "rio", "task-001", "--status", "active"],
        vec![
            "record",
            "rio",
            "--claims-proposed",
            "2",
            "--claims-accepted",
            "1",
        ],
        vec![
            "send",
            "--from",
            "leo",
            "--to",
            "rio",
            "--type",
            "task",
            "--subject",
            "look into X",
        ],
        vec!["session", "begin", "rio"],
        vec![
            "task",
            "set",
            "rio",
            "task-001",
            "--status",
            "completed",
            "--outcome",
            "done",
        ],
        vec!["session", "end", "rio"],
    ];
    for step in &steps {
        env.ok(step);
        assert_foreign_fields(&env, &format!("{step:?}"));
    }
    // The commands did what they say (so the files really were rewritten).
    let tasks = env.json("rio", "tasks.json");
    let descriptions: Vec<&str> = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["description"].as_str().unwrap())
        .collect();
    assert_eq!(descriptions, ["first", "second", "look into X"]);
    assert_eq!(tasks["tasks"][0]["status"], "completed");
    let report = env.json("rio", "report.json");
    assert_eq!(report["last_session"]["outcome"], "completed");
    assert_eq!(
        env.json("rio", "metrics.json")["lifetime"]["sessions_total"],
        3
    );
}

#[test]
fn minimal_old_files_load_and_are_completed() {
    let env = Env::standard();
    for file in ["report.json", "tasks.json", "session.json", "metrics.json"] {
        env.write("rio", file, "{\"agent\":\"rio\"}");
    }
    let out = env.ok(&["status", "rio"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("rio "))
        .unwrap_or_else(|| panic!("no rio line in {out}"));
    assert!(line.contains("idle"), "{out}");
    let status: Value = serde_json::from_str(&env.ok(&["status", "rio", "--json"])).unwrap();
    assert_eq!(status[0]["status"], "idle", "{status:#}");
    assert_eq!(status[0]["tasks_pending"], 0);
    assert!(env.ok(&["task", "list", "rio"]).contains("no tasks"));
    let check = env.ok(&["check"]);
    assert!(
        check.contains("no problems found"),
        "old files reported as damage: {check}"
    );

    let sid = env.ok(&["session", "begin", "rio"]).trim().to_string();
    assert_eq!(env.json("rio", "report.json")["status"], "researching");
    env.ok(&["session", "end", "rio", "--sources-archived", "5"]);

    let report = env.json("rio", "report.json");
    for k in [
        "agent",
        "updated_at",
        "status",
        "summary",
        "current_task",
        "last_session",
        "blocked_by",
        "next_priority",
    ] {
        assert!(
            keys(&report).contains(&k.to_string()),
            "report.json lacks {k}: {report:#}"
        );
    }
    assert_eq!(report["status"], "idle");
    assert_eq!(report["last_session"]["id"], json!(sid));
    assert_eq!(report["last_session"]["outcome"], "completed");
    assert_eq!(report["last_session"]["sources_archived"], 5);

    let session = env.json("rio", "session.json");
    for k in [
        "agent",
        "session_id",
        "started_at",
        "ended_at",
        "type",
        "status",
        "model",
        "timeout_seconds",
        "errors",
    ] {
        assert!(
            keys(&session).contains(&k.to_string()),
            "session.json lacks {k}: {session:#}"
        );
    }
    assert_eq!(session["session_id"], json!(sid));
    assert_eq!(session["status"], "completed");

    let metrics = env.json("rio", "metrics.json");
    for k in ["agent", "updated_at", "lifetime", "rolling_30d"] {
        assert!(
            keys(&metrics).contains(&k.to_string()),
            "metrics.json lacks {k}: {metrics:#}"
        );
    }
    assert_eq!(metrics["lifetime"]["sessions_total"], 1);
    assert_eq!(metrics["lifetime"]["sources_archived"], 5);
    assert_eq!(metrics["rolling_30d"]["sessions"], 1);

    let set_aside: Vec<String> = crate::support::list(&env.agent("rio"))
        .into_iter()
        .filter(|n| n.contains(".corrupt-"))
        .collect();
    assert!(
        set_aside.is_empty(),
        "old files were treated as corrupt: {set_aside:?}"
    );

    env.ok(&["task", "add", "rio", "--description", "after the upgrade"]);
    let tasks = env.json("rio", "tasks.json");
    for k in ["agent", "updated_at", "tasks"] {
        assert!(
            keys(&tasks).contains(&k.to_string()),
            "tasks.json lacks {k}: {tasks:#}"
        );
    }
    assert_eq!(tasks["tasks"][0]["id"], "task-001");
    assert_eq!(tasks["tasks"][0]["status"], "pending");
}
