//! Issue 21's operator-facing behaviours under the shipped unit (its
//! sandbox, its delegated cgroup, the service user, the inbox group), as an
//! operator and a member of the inbox group meet them on a real systemd:
//!
//! - mail dropped with `cat >` by a group member wakes an agent whose session
//!   leaves a grandchild in a session of its own (`setsid`);
//! - the group member cannot stop it (exit 77); `stop --wait` as root kills
//!   the whole session, grandchild included (its cgroup), records it as
//!   stopped — no error in metrics, status or the journal's WARN lines — and
//!   the message waits in the inbox again, attempts untouched;
//! - an agent whose command is not installed leaves its mail unclaimed, says
//!   so once; once the operator installs the command, the next health check
//!   runs the session and the mail is processed.
//!
//! Gated like `systemd.rs` (AGENT_STATE_SYSTEMD_TESTS=1, root, sdbox).

use std::time::Duration;

use serde_json::Value;

use crate::sdbox::{CONFIG, STATE, SdBox, UNIT_BIN, describe, sdbox_tool, text};

/// rio's session: a grandchild that leaves the process group, then a long
/// wait: only the cgroup (or the stop's SIGKILL) ends both.
const LONG_AGENT: &str = r#"#!/bin/sh
setsid sleep 1001 </dev/null >/dev/null 2>&1 &
echo "rio at work"
exec sleep 900
"#;

const LEO_AGENT: &str = "#!/bin/sh\necho \"leo answered\"\n";

const LEO_COMMAND: &str = "/opt/teleo-eval/leo-agent.sh";

const BOX_CONFIG: &str = r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[defaults]
timeout = "10m"
kill_grace = "2s"
wake_on_inbox = "any"
inbox_debounce = "1s"

[health]
interval = "1s"

[[agent]]
name = "rio"
domain = "internet-finance"
command = ["/opt/teleo-eval/long-agent.sh", "{agent}"]

[[agent]]
name = "leo"
domain = "grand-strategy"
command = ["/opt/teleo-eval/leo-agent.sh", "{agent}"]

[[agent]]
name = "marcus"
kind = "human"
"#;

fn as_user(sdbox: &SdBox, user: &str, script: &str) -> std::process::Output {
    sdbox.exec(&["runuser", "-u", user, "--", "sh", "-c", script])
}

fn as_user_ok(sdbox: &SdBox, user: &str, script: &str) -> String {
    let out = as_user(sdbox, user, script);
    assert!(
        out.status.success(),
        "as {user}: {script}\n{}",
        describe(&out)
    );
    text(&out.stdout)
}

/// Pids of `sleep 1001` in the box.
fn grandchildren(sdbox: &SdBox) -> Vec<String> {
    let out = sdbox.ok(&[
        "sh",
        "-c",
        r#"for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); [ "$c" = "sleep 1001 " ] && echo "${p#/proc/}"; done; true"#,
    ]);
    out.lines().map(str::to_string).collect()
}

/// Names of the files directly in an agent's inbox (messages waiting).
fn waiting(sdbox: &SdBox, agent: &str) -> Vec<String> {
    let out = sdbox.ok(&[
        "sh",
        "-c",
        &format!("cd {STATE}/{agent}/inbox && for f in *.json; do [ -f \"$f\" ] && echo \"$f\"; done; true"),
    ]);
    out.lines().map(str::to_string).collect()
}

fn journal_events(sdbox: &SdBox, agent: &str, event: &str) -> Vec<Value> {
    sdbox
        .read(&format!("{STATE}/{agent}/journal.jsonl"))
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == event)
        .collect()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn under_systemd_an_operator_stops_a_session_and_an_uninstalled_command_leaves_mail_waiting() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    sdbox.install_package_files();
    sdbox.write("/opt/teleo-eval/long-agent.sh", LONG_AGENT, 0o755);
    sdbox.write(CONFIG, BOX_CONFIG, 0o644);
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    sdbox.ok(&["useradd", "-m", "-G", "teleo", "-s", "/bin/sh", "maria"]);

    // ---- mail by hand wakes rio; its session leaves a grandchild -----------
    as_user_ok(
        &sdbox,
        "maria",
        &format!(
            r#"cat > {STATE}/rio/inbox/job.json <<'EOF'
{{"from":"marcus","subject":"a long job","body":"take your time"}}
EOF"#
        ),
    );
    let session = format!("{STATE}/rio/session.json");
    sdbox.wait_until(secs(30), "rio's session runs with its grandchild", || {
        sdbox.json(&session)["status"] == "running" && !grandchildren(&sdbox).is_empty()
    });
    let sid = sdbox.json(&session)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    assert!(
        waiting(&sdbox, "rio").is_empty(),
        "the session claimed job.json"
    );

    // ---- a member of the inbox group may send mail, not stop sessions ------
    let refused = as_user(
        &sdbox,
        "maria",
        &format!("{UNIT_BIN} --config {CONFIG} stop rio"),
    );
    assert_eq!(refused.status.code(), Some(77), "{}", describe(&refused));
    assert!(
        text(&refused.stderr).contains("operator"),
        "the refusal says whose it is: {}",
        describe(&refused)
    );
    assert_eq!(sdbox.json(&session)["status"], "running");

    // ---- the operator stops it: every process ends, nothing is a failure ---
    let out = sdbox.exec(&[
        UNIT_BIN,
        "--config",
        CONFIG,
        "stop",
        "rio",
        "--reason",
        "wrong prompt",
        "--wait",
    ]);
    assert!(out.status.success(), "stop --wait: {}", describe(&out));
    assert!(
        text(&out.stdout).contains(&format!("session {sid} stopped")),
        "{}",
        describe(&out)
    );
    assert!(
        grandchildren(&sdbox).is_empty(),
        "the grandchild outlived the stop (its cgroup was not killed): {:?}",
        grandchildren(&sdbox)
    );
    let s = sdbox.json(&session);
    assert_eq!(s["status"], "error", "{s:#}");
    assert!(
        s["errors"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["code"] == "SESSION_STOPPED" && e["outcome"] == "stopped")),
        "{s:#}"
    );
    // The message waits again, no attempt counted.
    sdbox.wait_until(secs(10), "job.json is back in rio's inbox", || {
        waiting(&sdbox, "rio").iter().any(|f| f.contains("job"))
    });
    let back_name = waiting(&sdbox, "rio")
        .into_iter()
        .find(|f| f.contains("job"))
        .unwrap();
    let back = sdbox.json(&format!("{STATE}/rio/inbox/{back_name}"));
    assert_eq!(back["attempts"].as_u64().unwrap_or(0), 0, "{back:#}");
    let metrics = sdbox.json(&format!("{STATE}/rio/metrics.json"));
    assert_eq!(metrics["lifetime"]["sessions_stopped"], 1, "{metrics:#}");
    assert_eq!(metrics["lifetime"]["sessions_error"], 0, "{metrics:#}");
    let journal = sdbox.journal(&[]);
    assert!(
        journal.contains(&format!("rio: session {sid} stopped (not a failure")),
        "journald has the stop as no failure, naming the agent:\n{journal}"
    );
    // Every line about an agent names it; journald's AGENT= field stays.
    let by_field = sdbox.journal(&["AGENT=rio", "-o", "cat"]);
    assert!(
        by_field.contains(&format!("rio: session {sid} started")),
        "{by_field}"
    );
    // The group member reads the outcome with `status`.
    let status = as_user_ok(
        &sdbox,
        "maria",
        &format!("{UNIT_BIN} --config {CONFIG} status rio"),
    );
    let row = status.lines().find(|l| l.starts_with("rio ")).unwrap_or("");
    assert!(
        row.contains("stopped") && !row.contains("error"),
        "status as a group member:\n{status}"
    );

    // ---- leo's command is not installed: its mail waits, unclaimed ---------
    as_user_ok(
        &sdbox,
        "maria",
        &format!(
            r#"cat > {STATE}/leo/inbox/question.json <<'EOF'
{{"from":"marcus","subject":"a question","body":"what next?"}}
EOF"#
        ),
    );
    sdbox.wait_until(secs(30), "leo's refused start is journaled", || {
        journal_events(&sdbox, "leo", "wake_skipped")
            .iter()
            .any(|e| e["cause"] == "agent_not_found")
    });
    assert_eq!(
        waiting(&sdbox, "leo"),
        ["question.json"],
        "the message waits where maria put it"
    );
    let q = sdbox.json(&format!("{STATE}/leo/inbox/question.json"));
    assert_eq!(q["attempts"].as_u64().unwrap_or(0), 0, "{q:#}");
    assert!(
        journal_events(&sdbox, "leo", "session_start").is_empty(),
        "no session began"
    );
    let report = sdbox.json(&format!("{STATE}/leo/report.json"));
    assert_eq!(report["error"]["code"], "AGENT_NOT_FOUND", "{report:#}");
    assert!(
        report["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(LEO_COMMAND)),
        "the report names the missing command: {report:#}"
    );

    // ---- the operator installs it: the next health check runs the session --
    sdbox.write(LEO_COMMAND, LEO_AGENT, 0o755);
    sdbox.wait_until(secs(30), "leo's session ended", || {
        !journal_events(&sdbox, "leo", "session_end").is_empty()
    });
    let end = journal_events(&sdbox, "leo", "session_end").pop().unwrap();
    assert_eq!(end["outcome"], "completed", "{end:#}");
    sdbox.wait_until(secs(10), "question.json is processed", || {
        waiting(&sdbox, "leo").is_empty()
            && sdbox
                .path(&format!("{STATE}/leo/inbox/processed"))
                .read_dir()
                .is_ok_and(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().contains("question"))
                })
    });
    let errors = sdbox.ok(&[UNIT_BIN, "--config", CONFIG, "errors", "--json"]);
    let not_found = serde_json::from_str::<Vec<Value>>(&errors)
        .expect("errors --json")
        .into_iter()
        .filter(|r| r["code"] == "AGENT_NOT_FOUND")
        .count();
    assert_eq!(
        not_found, 1,
        "the missing command is recorded once, not at every health check: {errors}"
    );
    let journal = sdbox.journal(&[]);
    assert!(
        journal.contains("its command can run now"),
        "journald says leo can run again:\n{journal}"
    );
}
