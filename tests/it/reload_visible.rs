//! A reload that cannot set an agent up fails visibly (issue 23): the state
//! root given to root (a restore as root used to leave it so), a new agent
//! added, `agent-state reload` exits 73 naming the agent and the fix instead
//! of "config reloaded"; once the root is the service user's again, the
//! next reload makes the agent. Real users: root with AGENT_STATE_ROOT_TESTS=1.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::agentlock::Reaped;
use crate::permissions::{World, enabled, show};
use crate::support::poll_until;

#[test]
fn a_reload_that_cannot_make_an_agents_directory_fails_naming_it() {
    if !enabled("reload_visible") {
        return;
    }
    let w = World::new("rlv");
    let log = std::fs::File::create(w.base.join("daemon.log")).unwrap();
    let _daemon = Reaped(
        Command::new("runuser")
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
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(w.base.join("daemon.log")).unwrap_or_default();
    let heartbeat = w.root.join(".daemon/daemon.json");
    assert!(
        poll_until(Duration::from_secs(30), || heartbeat.exists()),
        "the daemon is ready\n{}",
        log_text()
    );

    // The root is root's now; vida is added.
    let chown = Command::new("chown")
        .arg("root:root")
        .arg(&w.root)
        .status()
        .unwrap();
    assert!(chown.success());
    let mut config = std::fs::read_to_string(&w.config).unwrap();
    config.push_str("\n[[agent]]\nname = \"vida\"\n");
    std::fs::write(&w.config, &config).unwrap();
    let out = w.run(&w.acc.svc, &["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(73), "{}", show(&out));
    assert!(
        err.contains("vida: cannot make its directory") && err.contains("agent-state bootstrap"),
        "{err}"
    );
    assert!(!w.root.join("vida").exists());

    // Given back: the next reload makes it.
    let chown = Command::new("chown")
        .arg(format!("{}:{}", w.acc.svc, w.acc.group))
        .arg(&w.root)
        .status()
        .unwrap();
    assert!(chown.success());
    let out = w.run(&w.acc.svc, &["reload"]);
    assert!(out.status.success(), "{}", show(&out));
    assert!(w.root.join("vida/inbox").is_dir(), "{}", log_text());
}
