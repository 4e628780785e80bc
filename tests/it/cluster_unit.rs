//! The controller and a worker under their shipped units (issue 24), as an
//! operator runs them: a real systemd (sdbox), the package's files, the
//! units' sandboxes, a real three-server NATS cluster on the host's
//! loopback (the box shares the host's network). The session script calls
//! the hooks itself (forwarded by the worker), and the controller is
//! restarted by systemctl while the session runs on the worker.
//! Gated by both AGENT_STATE_SYSTEMD_TESTS=1 (root, sdbox) and
//! AGENT_STATE_NATS_TESTS=1.

use crate::cluster_executor::{nats, wait_ready};
use crate::sdbox::*;
use crate::support::poll_until;
use std::time::Duration;

const SESSION: &str = r#"#!/bin/sh
# A session script as an operator writes one: its own hooks.
id=$(agent-state session begin "$AGENT_STATE_AGENT" --research-question "what runs where")
echo "$AGENT_STATE_AGENT on ${AGENT_STATE_WORKER:-the controller} in session $id"
echo "<axiom>PROGRESS:40</axiom>"
while [ ! -e /opt/teleo-eval/go ]; do sleep 0.1; done
echo "<axiom>PROGRESS:100</axiom>"
agent-state session end "$AGENT_STATE_AGENT" --summary "ran on $AGENT_STATE_WORKER"
"#;

fn config(urls: &[String]) -> String {
    format!(
        r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[defaults]
command = ["/opt/teleo-eval/session.sh"]
timeout = "5m"
wake_on_inbox = "never"

[[agent]]
name = "rio"

[cluster]
urls = {urls:?}
replicas = 3
local_sessions = false
dispatch_timeout = "120s"
"#
    )
}

fn session_json(sdbox: &SdBox) -> serde_json::Value {
    std::fs::read_to_string(sdbox.path(&format!("{STATE}/rio/session.json")))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn worker_journal(sdbox: &SdBox) -> String {
    text(
        &sdbox
            .exec(&[
                "journalctl",
                "--no-pager",
                "-u",
                "agent-state-worker.service",
            ])
            .stdout,
    )
}

#[test]
fn under_systemd_a_worker_runs_the_sessions_and_a_controller_restart_keeps_them() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let Some(binary) = nats::server_binary("cluster_unit") else {
        return;
    };
    let servers = nats::NatsCluster::start(&binary, 3);
    wait_ready(&servers);
    let sdbox = SdBox::up(tool);
    sdbox.install_package_files();
    sdbox.install(
        &repo_file("systemd/agent-state-worker.service"),
        "/usr/lib/systemd/system/agent-state-worker.service",
        0o644,
    );
    sdbox.write("/opt/teleo-eval/session.sh", SESSION, 0o755);
    sdbox.write(CONFIG, &config(&servers.urls()), 0o644);
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state-worker.service"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    sdbox.wait_until(Duration::from_secs(60), "the worker is registered", || {
        worker_journal(&sdbox).contains("registered")
    });
    assert_eq!(
        sdbox.prop_of("agent-state-worker.service", "ActiveState"),
        "active"
    );

    let woke = sdbox.agent_state(&["wake", "rio"]);
    assert!(woke.status.success(), "{}", describe(&woke));
    let began = poll_until(Duration::from_secs(90), || {
        let s = session_json(&sdbox);
        s["status"] == "running" && s["research_question"] == "what runs where"
    });
    if !began {
        let s = session_json(&sdbox);
        let sid = s["session_id"].as_str().unwrap_or_default();
        let log = std::fs::read_to_string(sdbox.path(&format!("{STATE}/rio/sessions/{sid}.log")))
            .unwrap_or_default();
        panic!(
            "rio's session did not begin on the worker with its question\n{s:#}\n---- its log ----\n{log}\n---- worker ----\n{}",
            worker_journal(&sdbox)
        );
    }
    let sid = session_json(&sdbox)["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let host = sdbox.ok(&["hostname"]).trim().to_string();
    sdbox.wait_until(Duration::from_secs(30), "status names the worker", || {
        let out = sdbox.agent_state(&["status"]);
        text(&out.stdout).contains(&format!("running ({sid} on {host})"))
    });

    // The controller restarted under systemd: the session goes on.
    sdbox.ok(&["systemctl", "restart", "agent-state.service"]);
    sdbox.wait_until(
        Duration::from_secs(60),
        "the new controller follows it",
        || {
            sdbox
                .journal(&[])
                .contains("followed again after the controller's restart")
        },
    );
    assert!(
        sdbox.journal(&[]).contains("left running on"),
        "{}",
        sdbox.journal(&["-n", "40"])
    );
    sdbox.ok(&["touch", "/opt/teleo-eval/go"]);
    sdbox.wait_until(Duration::from_secs(90), "rio's session completed", || {
        session_json(&sdbox)["status"] == "completed"
    });
    let s = session_json(&sdbox);
    assert_eq!(s["session_id"], sid.as_str(), "{s:#}");
    let log = std::fs::read_to_string(sdbox.path(&format!("{STATE}/rio/sessions/{sid}.log")))
        .unwrap_or_default();
    assert_eq!(
        log.matches(&format!("rio on {host} in session {sid}"))
            .count(),
        1,
        "the script's own `session begin` joined the daemon's session, once in the log:\n{log}"
    );
    let journal = std::fs::read_to_string(sdbox.path(&format!("{STATE}/rio/journal.jsonl")))
        .unwrap_or_default();
    let of_it = |event: &str| {
        journal
            .lines()
            .filter(|l| l.contains(&format!("\"session_id\":\"{sid}\"")))
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .count()
    };
    assert_eq!(of_it("session_start"), 1, "{journal}");
    assert_eq!(of_it("session_end"), 1, "{journal}");
    let worker = worker_journal(&sdbox);
    assert_eq!(
        worker.matches("of rio started").count(),
        1,
        "the worker ran it once:\n{worker}"
    );
    assert!(
        poll_until(Duration::from_secs(1), || !sdbox
            .path(&format!("{STATE}/.daemon/remote.rio"))
            .exists()),
        "the order record is removed"
    );

    // An operator starts a second worker on this host, forgetting --host:
    // it has the unit's worker's name (the machine's), watches that record
    // for two of its 5 s heartbeats, and refuses (64, which the unit's
    // RestartPreventExitStatus would not restart); the unit's worker goes on.
    sdbox.ok(&["install", "-d", "-o", "agent-state", "/tmp/second-worker"]);
    let second = sdbox.agent_state(&["worker", "--work-dir", "/tmp/second-worker"]);
    assert_eq!(second.status.code(), Some(64), "{}", describe(&second));
    assert!(
        text(&second.stderr).contains(&format!("another worker runs as --host {host}")),
        "{}",
        describe(&second)
    );
    assert_eq!(
        sdbox.prop_of("agent-state-worker.service", "ActiveState"),
        "active"
    );
}
