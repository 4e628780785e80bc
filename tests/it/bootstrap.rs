//! `bootstrap`: the files a new agent starts with, exactly in the seed's shape,
//! and idempotence.

use std::os::unix::fs::PermissionsExt;

use crate::support::{Env, STANDARD_AGENTS, keys, kind};

const REPORT_KEYS: [&str; 8] = [
    "agent",
    "updated_at",
    "status",
    "summary",
    "current_task",
    "last_session",
    "blocked_by",
    "next_priority",
];
/// Seed 001's keys, then the addition `sessions_usage_limited`.
const LIFETIME_KEYS: [&str; 14] = [
    "sessions_total",
    "sessions_completed",
    "sessions_timeout",
    "sessions_error",
    "sources_archived",
    "claims_proposed",
    "claims_accepted",
    "claims_challenged",
    "claims_rejected",
    "disconfirmation_attempts",
    "disconfirmation_hits",
    "cross_agent_flags_sent",
    "cross_agent_flags_received",
    "sessions_usage_limited",
];
/// Seed 001's keys, then the additions `error_rate` and `usage_limited`
/// (README: schema additions).
const ROLLING_KEYS: [&str; 7] = [
    "sessions",
    "sources_archived",
    "claims_proposed",
    "acceptance_rate",
    "avg_sources_per_session",
    "error_rate",
    "usage_limited",
];

#[test]
fn bootstrap_writes_the_seed_files() {
    let env = Env::standard();

    let report = env.json("rio", "report.json");
    assert_eq!(keys(&report), REPORT_KEYS);
    assert_eq!(report["agent"], "rio");
    assert_eq!(report["status"], "idle");
    assert_eq!(kind(&report["updated_at"]), "string");
    assert!(report["updated_at"].as_str().unwrap().ends_with('Z'));
    for k in [
        "summary",
        "current_task",
        "last_session",
        "blocked_by",
        "next_priority",
    ] {
        assert!(report[k].is_null(), "{k}");
    }

    let tasks = env.json("rio", "tasks.json");
    assert_eq!(keys(&tasks), ["agent", "updated_at", "tasks"]);
    assert_eq!(tasks["tasks"], serde_json::json!([]));

    let metrics = env.json("rio", "metrics.json");
    assert_eq!(
        keys(&metrics),
        ["agent", "updated_at", "lifetime", "rolling_30d"]
    );
    assert_eq!(keys(&metrics["lifetime"]), LIFETIME_KEYS);
    for k in LIFETIME_KEYS {
        assert_eq!(metrics["lifetime"][k], 0, "{k}");
        assert_eq!(kind(&metrics["lifetime"][k]), "integer");
    }
    assert_eq!(keys(&metrics["rolling_30d"]), ROLLING_KEYS);
    assert_eq!(kind(&metrics["rolling_30d"]["acceptance_rate"]), "float");
    assert_eq!(
        kind(&metrics["rolling_30d"]["avg_sources_per_session"]),
        "float"
    );
    assert_eq!(kind(&metrics["rolling_30d"]["sessions"]), "integer");

    let memory = env.read("rio", "memory.md");
    assert!(
        memory.starts_with("# Rio — Operational Memory\n"),
        "{memory}"
    );
    for section in [
        "## Cross-Session Patterns",
        "## Dead Ends (don't re-investigate)",
        "## Open Questions",
        "## Corrections",
        "## Cross-Agent Flags Received",
    ] {
        assert!(memory.lines().any(|l| l == section), "missing {section}");
    }

    let journal = env.journal("rio");
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0]["event"], "bootstrap");

    // No session yet: session.json appears with the first session.
    assert!(!env.path("rio", "session.json").exists());

    // Whatever the umask: inbox/ and .tmp/ are group-writable, setgid and
    // sticky; the daemon's own inbox directories are read-only to the group.
    for (d, wanted) in [
        ("inbox", 0o3770),
        ("inbox/.tmp", 0o3770),
        ("inbox/processed", 0o2750),
        ("inbox/rejected", 0o2750),
        ("inbox/.claimed", 0o2750),
    ] {
        let mode = std::fs::metadata(env.path("rio", d))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, wanted, "{d}: {mode:o}");
    }
    assert!(env.root.join(".daemon").is_dir());
    assert!(env.root.join(".shared/rules").is_dir());
}

#[test]
fn a_human_gets_a_mailbox_only() {
    let env = Env::standard();
    assert!(env.path("marcus", "inbox").is_dir());
    assert!(env.path("marcus", "journal.jsonl").exists());
    assert!(!env.path("marcus", "report.json").exists());
    assert!(!env.path("marcus", "memory.md").exists());
}

#[test]
fn bootstrap_is_idempotent_and_repairs_what_is_missing() {
    let env = Env::standard();
    env.ok(&["task", "add", "rio", "--description", "keep me"]);
    let report_before = env.read("rio", "report.json");
    let tasks_before = env.read("rio", "tasks.json");

    let out = env.ok(&["bootstrap"]);
    assert!(out.contains("rio: complete, nothing to do"), "{out}");
    assert_eq!(env.read("rio", "report.json"), report_before);
    assert_eq!(env.read("rio", "tasks.json"), tasks_before);

    std::fs::remove_file(env.path("rio", "metrics.json")).unwrap();
    std::fs::remove_dir(env.path("rio", "inbox/rejected")).unwrap();
    let out = env.ok(&["bootstrap", "rio"]);
    assert!(
        out.contains("metrics.json") && out.contains("inbox/rejected/"),
        "{out}"
    );
    assert_eq!(
        env.json("rio", "metrics.json")["lifetime"]["sessions_total"],
        0
    );
    assert_eq!(
        env.read("rio", "tasks.json"),
        tasks_before,
        "existing files are never overwritten"
    );
    assert_eq!(env.events("rio", "bootstrap").len(), 2);
}

#[test]
fn bootstrap_of_an_unconfigured_agent_is_refused() {
    let env = Env::with_config(STANDARD_AGENTS);
    let err = env.fails(&["bootstrap", "vida"], 67);
    assert!(err.contains("agent `vida` is not configured"), "{err}");
    assert!(!env.root.join("vida").exists());
}

#[test]
fn commands_on_an_agent_that_was_never_bootstrapped_say_how_to_fix_it() {
    let env = Env::with_config(STANDARD_AGENTS);
    let err = env.fails(&["session", "begin", "rio"], 66);
    assert!(err.contains("run `agent-state bootstrap rio`"), "{err}");
}

#[test]
fn a_missing_config_names_the_file_and_the_fix() {
    let env = Env::with_config(STANDARD_AGENTS);
    let out = std::process::Command::new(crate::support::BIN)
        .args(["--config", "/nonexistent/agent-state.toml", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/agent-state.toml") && err.contains("--config"),
        "{err}"
    );
    // AGENT_STATE_CONFIG is honoured.
    let out = std::process::Command::new(crate::support::BIN)
        .arg("status")
        .env("AGENT_STATE_CONFIG", &env.config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
