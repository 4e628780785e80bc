//! An operator's first day with agent-state, as one run under a real systemd
//! (issue 9): the shipped unit with its sandbox, the example session script
//! as every agent's command, a cron-era script still running one agent from
//! outside the unit, a person of the inbox group dropping mail by hand (a
//! pause while typing, `cp`, an editor's leftovers, then a symbolic link and
//! a FIFO), a pipeline reading the state as an unrelated user, and a config
//! typo while the cron script's session runs. Each part has its own test
//! elsewhere; this one finds what breaks only when they meet.
//!
//! Gated like every sdbox test by `AGENT_STATE_SYSTEMD_TESTS=1` (root). The
//! box gets `git` and `jq` from Debian's archive (`apt-get`), as the
//! operator's server would have them.

use std::time::Duration;

use serde_json::Value;

use crate::sdbox::{CONFIG, STATE, SdBox, UNIT_BIN, describe, repo_file, sdbox_tool, text};

/// Where a package puts the example session script (issue 14).
const SCRIPT: &str = "/usr/share/agent-state/research-session.sh";
const WORK: &str = "/opt/teleo-eval/workspaces";
const HOME: &str = "/var/lib/agent-state";

/// The real Claude Code CLI, if this run has it (a native program since
/// 2.x; a hard link into the box when it is on the same file system).
fn real_claude() -> Option<std::path::PathBuf> {
    let Some(bin) = std::env::var_os("AGENT_STATE_CLAUDE_BIN") else {
        eprintln!(
            "note: AGENT_STATE_CLAUDE_BIN is not set; the trial runs without the real Claude Code CLI"
        );
        return None;
    };
    std::fs::canonicalize(bin).ok()
}

/// `claude -p PROMPT --model M --output-format json`, as the session script
/// runs it: writes a note and archives a source in the work tree, waits
/// while `/opt/teleo-eval/hold-<work tree>` exists, and prints Claude Code's
/// JSON result ending with signals and a Context Summary Block.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
me=$(basename "$PWD")
echo "note by $me on $(git branch --show-current)" >> notes.md
mkdir -p inbox/archive && echo source > "inbox/archive/source-$$.md"
while [ -e "/opt/teleo-eval/hold-$me" ]; do sleep 0.1; done
cat <<'EOF'
{"type":"result","subtype":"success","is_error":false,"num_turns":3,"total_cost_usd":0.25,"usage":{"input_tokens":1000,"output_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"result":"Answered the question in the inbox.\n<axiom>PROGRESS:100</axiom>\n\n## Context Summary\n\n**Goal**: Answer the questions in the inbox\n**Current State**: Wrote a note on conditional markets\n**Next Agent**: none\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: none\n\n<axiom>COMPLETE</axiom>"}
EOF
"#;

/// The operator's config: rio and clay run the example script; rio is the
/// daemon's (woken by any message), clay still runs from cron, so the
/// daemon has no schedule for it.
const OPERATOR_CONFIG: &str = r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
max_concurrent_sessions = 2

[defaults]
command = ["/usr/share/agent-state/research-session.sh", "{agent}"]
timeout = "5m"
wake_on_inbox = "any"
inbox_debounce = "8s"
inbox_settle = "10s"

# Logs rotated at every health check past 1 KiB: the day's journals are
# read through their rotations (events), as pipelines will.
[health]
interval = "2s"

[logs]
rotate_size = "1KiB"

[[agent]]
name = "rio"
domain = "internet-finance"

[[agent]]
name = "clay"
domain = "entertainment"

[[agent]]
name = "marcus"
kind = "human"
"#;

/// With the real Claude Code CLI (AGENT_STATE_CLAUDE_BIN), never logged in:
/// leo runs it through the same script, on a login of its own.
const LEO: &str = r#"
[[agent]]
name = "leo"
domain = "grand-strategy"
credential = "leo"
command = ["/usr/bin/env", "CLAUDE=/usr/local/lib/claude-code/claude", "/usr/share/agent-state/research-session.sh", "{agent}"]

[credential.leo]
"#;

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

struct Day {
    sdbox: SdBox,
    /// The config as installed.
    config: String,
}

impl Day {
    /// `sh -c SCRIPT` as `user` inside the box.
    fn as_user(&self, user: &str, script: &str) -> std::process::Output {
        self.sdbox
            .exec(&["runuser", "-u", user, "--", "sh", "-c", script])
    }

    fn as_user_ok(&self, user: &str, script: &str) -> String {
        let out = self.as_user(user, script);
        assert!(
            out.status.success(),
            "as {user}: {script}\n{}",
            describe(&out)
        );
        text(&out.stdout)
    }

    /// The agent's whole journal, rotated segments included, as `events`
    /// reads it for the service user.
    fn journal(&self, agent: &str) -> Vec<Value> {
        let out = self
            .sdbox
            .agent_state(&["events", "--agent", agent, "--json", "--color", "never"]);
        assert!(out.status.success(), "events: {}", describe(&out));
        text(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["source"] == agent)
            .map(|e| e["event"].clone())
            .collect()
    }

    fn count(&self, agent: &str, event: &str) -> usize {
        self.journal(agent)
            .iter()
            .filter(|e| e["event"] == event)
            .count()
    }

    fn session(&self, agent: &str) -> Value {
        self.sdbox.json(&format!("{STATE}/{agent}/session.json"))
    }

    /// Wait until `agent` has `n` ended sessions, recorded in session.json
    /// and report.json (renamed in that order); returns session.json.
    fn ended(&self, agent: &str, n: usize) -> Value {
        self.sdbox.wait_until(
            Duration::from_secs(60),
            &format!("{agent} has {n} ended session(s)"),
            || {
                let s = self.session(agent);
                let r = self.sdbox.json(&format!("{STATE}/{agent}/report.json"));
                self.count(agent, "session_end") + self.count(agent, "error") >= n
                    && s["status"] != "running"
                    && r["last_session"]["id"] == s["session_id"]
            },
        );
        self.session(agent)
    }

    fn running(&self, agent: &str) {
        self.sdbox.wait_until(
            Duration::from_secs(60),
            &format!("{agent}'s session is running"),
            || self.session(agent)["status"] == "running",
        );
    }

    /// A cron job: the script in a transient unit of its own, outside
    /// agent-state.service, as the service user with its home (as cron
    /// gives it), kept after it exits so its status can be read.
    fn cron(&self, unit: &str, agent: &str, env: &[&str]) {
        let mut args = vec![
            "systemd-run",
            "--unit",
            unit,
            "--uid",
            "agent-state",
            "--gid",
            "teleo",
            "--remain-after-exit",
            "--quiet",
            "--setenv",
            "HOME=/var/lib/agent-state",
        ];
        for e in env {
            args.extend_from_slice(&["--setenv", e]);
        }
        args.extend_from_slice(&[SCRIPT, agent]);
        self.sdbox.ok(&args);
    }

    /// The exit status of a cron job once it has exited.
    fn cron_status(&self, unit: &str) -> String {
        let service = format!("{unit}.service");
        self.sdbox.wait_until(
            Duration::from_secs(60),
            &format!("{service} has exited"),
            || {
                self.sdbox
                    .prop_of(&service, "ExecMainExitTimestampMonotonic")
                    != "0"
            },
        );
        self.sdbox.prop_of(&service, "ExecMainStatus")
    }

    fn cron_log(&self, unit: &str) -> String {
        text(
            &self
                .sdbox
                .exec(&["journalctl", "--no-pager", "-u", &format!("{unit}.service")])
                .stdout,
        )
    }

    fn git(&self, agent: &str, args: &str) -> String {
        self.as_user_ok(
            "agent-state",
            &format!("cd {WORK}/{agent} && HOME={HOME} git {args}"),
        )
    }
}

/// The box as the operator leaves it after installing: the package's files,
/// the config, the unit enabled and started, a git work tree per agent with
/// the service user's identity, a person in the inbox group and a pipeline
/// user outside it.
fn install() -> Option<Day> {
    let tool = sdbox_tool()?;
    let sdbox = SdBox::up(tool);
    let apt = sdbox.exec(&[
        "sh",
        "-c",
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git jq",
    ]);
    assert!(
        apt.status.success(),
        "the box needs git and jq from Debian's archive (apt-get):\n{}",
        describe(&apt)
    );
    sdbox.install_package_files();
    sdbox.install(&repo_file("ops/research-session.example.sh"), SCRIPT, 0o755);
    sdbox.write("/usr/local/bin/claude", FAKE_CLAUDE, 0o755);
    let config = match real_claude() {
        Some(claude) => {
            let inside = sdbox.path("/usr/local/lib/claude-code/claude");
            std::fs::create_dir_all(inside.parent().expect("parent")).expect("mkdir");
            if std::fs::hard_link(&claude, &inside).is_err() {
                std::fs::copy(&claude, &inside).expect("copy claude into the box");
            }
            format!("{OPERATOR_CONFIG}{LEO}")
        }
        None => OPERATOR_CONFIG.to_string(),
    };
    sdbox.write(CONFIG, &config, 0o644);
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "enable", "--now", "agent-state.service"]);
    assert_eq!(sdbox.prop("ActiveState"), "active");
    let day = Day { sdbox, config };
    let agents: &[&str] = if day.config.contains("name = \"leo\"") {
        &["rio", "clay", "leo"]
    } else {
        &["rio", "clay"]
    };
    for agent in agents {
        day.sdbox.ok(&[
            "install",
            "-d",
            "-o",
            "agent-state",
            "-g",
            "teleo",
            &format!("{WORK}/{agent}"),
        ]);
        day.git(agent, "init -q -b main");
        day.git(agent, "config --global user.name 'agent-state'");
        day.git(agent, "config --global user.email agent-state@localhost");
        day.git(agent, "commit -q --allow-empty -m init");
    }
    day.sdbox
        .ok(&["useradd", "-m", "-G", "teleo", "-s", "/bin/sh", "maria"]);
    day.sdbox
        .ok(&["useradd", "-m", "-s", "/bin/sh", "pipeline"]);
    Some(day)
}

#[test]
fn an_operators_first_day_under_the_shipped_unit() {
    let Some(day) = install() else {
        return;
    };
    let sdbox = &day.sdbox;
    let inbox = format!("{STATE}/rio/inbox");

    // ---- mail by hand, from a member of the inbox group --------------------
    // Copied from her home, written by an editor that leaves its probe file
    // and swap file in the directory meanwhile, and typed with a pause (the
    // debounce makes one session of the three).
    day.as_user_ok(
        "maria",
        &format!(
            r#"cd {inbox} &&
            echo '{{"from":"marcus","subject":"copied","body":"see the attached numbers"}}' > ~/m.json &&
            cp ~/m.json copied.json &&
            : > 4913 && rm 4913 && echo 'swap' > .edited.json.swp &&
            printf '{{"from":"marcus",' > edited.json && printf '"subject":"edited"}}\n' >> edited.json &&
            rm .edited.json.swp &&
            {{ printf '{{"from":"marcus","type":"question",'; sleep 3; printf '"subject":"typed","priority":"high","body":"what moved the markets?"}}\n'; }} > typed.json"#
        ),
    );
    let session = day.ended("rio", 1);
    assert_eq!(session["status"], "completed", "{session:#}");
    let mut subjects: Vec<&str> = session["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    subjects.sort();
    if subjects != ["copied", "edited", "typed"] {
        let inbox_now = sdbox.agent_state(&["inbox", "rio"]);
        panic!(
            "the first session claimed {subjects:?}, not the three messages\n{session:#}\n---- inbox rio ----\n{}\n---- ls -la --full-time ----\n{}",
            describe(&inbox_now),
            sdbox.ok(&["ls", "-la", "--full-time", &inbox])
        );
    }
    assert_eq!(
        session["cost_usd"], 0.25,
        "Claude's cost reached session.json"
    );
    assert_eq!(
        session["branch"],
        format!("rio/research-{}", today()).as_str()
    );
    // The script's `session end` records first; the daemon reads the
    // Context Summary from its output once it has exited.
    let report_path = format!("{STATE}/rio/report.json");
    sdbox.wait_until(
        Duration::from_secs(20),
        "report.json's summary is the Context Summary's",
        || {
            sdbox.json(&report_path)["summary"]
                .as_str()
                .is_some_and(|s| s.contains("Wrote a note on conditional markets"))
        },
    );
    let report = sdbox.json(&report_path);
    assert!(
        !report["summary"]
            .as_str()
            .unwrap_or_default()
            .contains("<axiom>"),
        "{report:#}"
    );
    assert_eq!(report["progress"], 100, "{report:#}");
    assert_eq!(
        day.as_user_ok("agent-state", &format!("ls {inbox}/rejected | wc -l"))
            .trim(),
        "0",
        "nothing of what she wrote, nor the editor's files, was rejected"
    );
    let log = day.git("rio", "log --oneline rio/research-$(date -u +%F)");
    assert!(log.contains("rio: research session"), "committed: {log}");

    // ---- pipelines and people read the state, without the group -----------
    let read = day.as_user_ok(
        "pipeline",
        &format!("cat {STATE}/rio/report.json && {UNIT_BIN} status --json"),
    );
    assert!(read.contains("\"idle\""), "{read}");
    let listed = day.as_user_ok("maria", &format!("{UNIT_BIN} inbox rio"));
    assert!(listed.contains("3 processed"), "{listed}");

    // ---- the cron era beside the daemon ------------------------------------
    // clay still runs from cron; a wake while its script's session runs is
    // skipped, not a second session.
    sdbox.write("/opt/teleo-eval/hold-clay", "", 0o644);
    day.cron("cron-clay", "clay", &[]);
    day.running("clay");
    let clay_session = day.session("clay")["session_id"].clone();
    let out = sdbox.agent_state(&["wake", "clay"]);
    assert!(out.status.success(), "{}", describe(&out));
    sdbox.wait_until(
        Duration::from_secs(20),
        "the daemon skipped the wake of clay",
        || day.count("clay", "wake_skipped") == 1,
    );
    assert_eq!(day.count("clay", "session_start"), 1);
    assert_eq!(day.session("clay")["session_id"], clay_session);

    // A cron line for rio, left in place by mistake, fires while the
    // daemon's session of rio runs: refused (75), the work tree untouched.
    sdbox.write("/opt/teleo-eval/hold-rio", "", 0o644);
    let out = sdbox.agent_state(&["wake", "rio"]);
    assert!(out.status.success(), "{}", describe(&out));
    day.running("rio");
    // session.json says "running" as the daemon starts the script, before
    // the script has taken its lock: a cron run in between would take the
    // lock first and both would be refused. The second note in the work
    // tree is written by Claude, so the daemon's script holds the lock.
    sdbox.wait_until(
        Duration::from_secs(60),
        "the daemon's second rio session has its lock and runs Claude",
        || {
            sdbox
                .read(&format!("{WORK}/rio/notes.md"))
                .matches("note by rio")
                .count()
                >= 2
        },
    );
    day.cron("cron-rio", "rio", &["BRANCH=rio/from-cron"]);
    assert_eq!(
        day.cron_status("cron-rio"),
        "75",
        "{}",
        day.cron_log("cron-rio")
    );
    assert_eq!(
        day.git("rio", "branch --show-current").trim(),
        format!("rio/research-{}", today()),
        "{}",
        day.cron_log("cron-rio")
    );
    assert_eq!(day.git("rio", "branch --list rio/from-cron").trim(), "");
    sdbox.ok(&["rm", "/opt/teleo-eval/hold-rio"]);
    let session = day.ended("rio", 2);
    assert_eq!(session["status"], "completed", "{session:#}");

    // ---- a config typo while the cron script's session runs ---------------
    let typo = day
        .config
        .replace("timeout = \"5m\"", "timeout = \"five minutes\"");
    sdbox.write(CONFIG, &typo, 0o644);
    let out = sdbox.exec(&["systemctl", "reload", "agent-state.service"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let said = format!("{}{}", describe(&out), sdbox.journal(&["-n", "40"]));
    assert!(said.contains("five minutes"), "{said}");
    sdbox.ok(&["rm", "/opt/teleo-eval/hold-clay"]);
    assert_eq!(
        day.cron_status("cron-clay"),
        "0",
        "{}",
        day.cron_log("cron-clay")
    );
    let clay = day.ended("clay", 1);
    assert_eq!(clay["session_id"], clay_session);
    assert_eq!(clay["status"], "completed", "{clay:#}");
    assert_eq!(clay["cost_usd"], 0.25, "{clay:#}");
    assert!(
        day.cron_log("cron-clay")
            .contains("using the last configuration the daemon accepted"),
        "{}",
        day.cron_log("cron-clay")
    );
    sdbox.write(CONFIG, &day.config, 0o644);
    sdbox.ok(&["systemctl", "reload", "agent-state.service"]);

    // ---- hostile files from the group --------------------------------------
    day.as_user_ok(
        "maria",
        &format!("cd {inbox} && ln -s /etc/shadow shadow.json && mkfifo fifo.json"),
    );
    let refused = day.as_user(
        "maria",
        &format!("cd {inbox} && mv processed p && ln -s /tmp processed"),
    );
    assert!(!refused.status.success(), "{}", describe(&refused));
    day.as_user_ok(
        "maria",
        &format!(r#"echo '{{"from":"marcus","subject":"after"}}' > {inbox}/after.json"#),
    );
    let session = day.ended("rio", 3);
    assert_eq!(session["status"], "completed", "{session:#}");
    assert_eq!(session["messages"], serde_json::json!(["after"]));
    let rejected = day.as_user_ok("maria", &format!("{UNIT_BIN} inbox rio"));
    assert!(
        rejected.contains("shadow.json: is a symbolic link")
            && rejected.contains("fifo.json: is a FIFO"),
        "{rejected}"
    );
    let shadow = sdbox.read("/etc/shadow");
    assert!(
        !sdbox
            .read(&format!(
                "{STATE}/rio/sessions/{}.prompt.md",
                session["session_id"].as_str().unwrap_or_default()
            ))
            .contains(shadow.lines().next().unwrap_or("root:")),
        "the link's target never reached a prompt"
    );

    // ---- the real Claude Code CLI under the sandbox, never logged in ------
    if day.config.contains("name = \"leo\"") {
        let out = sdbox.agent_state(&["wake", "leo"]);
        assert!(out.status.success(), "{}", describe(&out));
        let leo = day.ended("leo", 1);
        let log = sdbox.read(&format!(
            "{STATE}/leo/sessions/{}.log",
            leo["session_id"].as_str().unwrap_or_default()
        ));
        assert_eq!(leo["status"], "error", "{leo:#}\n{log}");
        // The script's trap records the failure first, in its words; the
        // daemon then judges Claude's output and puts its own words first.
        let report_path = format!("{STATE}/leo/report.json");
        sdbox.wait_until(
            Duration::from_secs(20),
            "the daemon's verdict on leo's session is recorded",
            || sdbox.json(&report_path)["error"]["code"] == "AGENT_LOGIN_REQUIRED",
        );
        let leo = day.session("leo");
        let reason = leo["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("Claude Code is not logged in")
                && reason.contains("the session script reported"),
            "the error matrix's words, then the script's: {leo:#}\n---- session log ----\n{log}"
        );
        assert!(log.contains("Not logged in"), "{log}");
    }

    // ---- what the operator watches -----------------------------------------
    let by_agent = sdbox.journal(&["AGENT=rio", "-o", "cat"]);
    assert!(by_agent.contains("completed"), "{by_agent}");
    let by_code = sdbox.journal(&["ERROR_CODE=INBOX_REJECTED", "-o", "cat"]);
    assert!(by_code.contains("shadow.json"), "{by_code}");
    assert_eq!(sdbox.prop("ActiveState"), "active");
    assert_eq!(sdbox.prop("NRestarts"), "0");
    let roots = sdbox.ok(&[
        "find", STATE, "(", "-user", "root", "-o", "-group", "root", ")",
    ]);
    assert_eq!(roots.trim(), "", "nothing below the state root is root's");

    // ---- the journals rotated under the unit, and read whole by others ----
    let segments = sdbox.ok(&["sh", "-c", &format!("ls {STATE}/rio/journal.jsonl.*.zst")]);
    assert!(segments.contains(".zst"), "{segments}");
    let by_pipeline = day.as_user_ok(
        "pipeline",
        &format!("{UNIT_BIN} events --agent rio --json | grep -c '\"kind\":\"session_end\"'"),
    );
    assert_eq!(
        by_pipeline.trim(),
        day.count("rio", "session_end").to_string(),
        "a pipeline reads the rotated history as the service user does"
    );
}
