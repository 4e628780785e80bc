//! The locks only the service user (and root) take — an agent's `.lock`,
//! `.daemon/counters.lock` — cannot be held by a member of the inbox group,
//! who may send mail but must not hold an agent back. An install from
//! before (`.lock` 0660) is mended when the daemon starts. With real users:
//! runs only as root with AGENT_STATE_ROOT_TESTS=1 (see permissions.rs).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::permissions::{World, enabled, show};
use crate::support::{daemon_config, poll_until};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .map(|m| m.mode() & 0o7777)
        .unwrap_or(0)
}

#[test]
fn a_group_member_cannot_hold_an_agent_or_the_session_counter() {
    if !enabled("a_group_member_cannot_hold_an_agent_or_the_session_counter") {
        return;
    }
    let w = World::new("k");
    // The agent leaves a line in a file anyone may append to.
    let out = w.base.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let runs = out.join("runs");
    let script = w.base.join("agent.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"start $AGENT_STATE_AGENT\" >> {runs:?}\necho done\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &w.config,
        format!(
            "state_root = {:?}\ngroup = {:?}\n{}",
            w.root.display().to_string(),
            w.acc.group,
            daemon_config(
                &script,
                &[],
                &[],
                "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n"
            )
        ),
    )
    .unwrap();
    // An install from before: `.lock` open to the group.
    let lock = w.root.join("rio/.lock");
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o660)).unwrap();

    let log = std::fs::File::create(w.base.join("daemon.log")).unwrap();
    let mut daemon = Command::new("runuser")
        .args(["-u", &w.acc.svc, "--"])
        .arg(&w.bin)
        .arg("--config")
        .arg(&w.config)
        .arg("daemon")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(w.base.join("daemon.log")).unwrap_or_default();
    let heartbeat = w.root.join(".daemon/daemon.json");
    let ready = poll_until(Duration::from_secs(30), || heartbeat.exists());
    assert!(ready, "the daemon is ready\n{}", log_text());

    // Mended at start, and a member of the group cannot flock it.
    assert_eq!(mode(&lock), 0o600, "rio/.lock is the service user's alone");
    let held = w.sh(&w.acc.alice, "flock -n rio/.lock true");
    assert!(
        !held.status.success(),
        "a group member could flock rio/.lock: {}",
        show(&held)
    );
    assert!(
        String::from_utf8_lossy(&held.stderr).contains("Permission denied"),
        "{}",
        show(&held)
    );
    // Mail from that member is served: the agent was not held back.
    let sent = w.run(
        &w.acc.alice,
        &["send", "--from", "marcus", "--to", "rio", "--subject", "hi"],
    );
    assert!(sent.status.success(), "{}", show(&sent));
    let served = poll_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&runs).is_ok_and(|t| t.contains("start rio"))
    });
    assert!(served, "rio's session starts\n{}", log_text());
    // The session counter every start takes is not the group's either.
    let counters = w.root.join(".daemon/counters.lock");
    assert_eq!(mode(&counters), 0o600, "{}", counters.display());
    let held = w.sh(&w.acc.alice, "flock -n .daemon/counters.lock true");
    assert!(!held.status.success(), "{}", show(&held));
    // And mail still works for the member, as does reading the state.
    let status = w.run(&w.acc.alice, &["status"]);
    assert!(status.status.success(), "{}", show(&status));

    // Stop the daemon this test started: by the pid it wrote.
    let pid = std::fs::read_to_string(&heartbeat)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_i64())
        .expect("the daemon's pid");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let stopped = poll_until(Duration::from_secs(30), || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    if !stopped {
        let _ = daemon.kill();
        let _ = daemon.wait();
        panic!("the daemon did not stop\n{}", log_text());
    }
}
