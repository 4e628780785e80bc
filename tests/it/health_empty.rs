//! `health` on a daemon with nothing to wake (issue 23): only a human
//! mailbox configured is CRITICAL, naming the config file and the fix;
//! adding an agent and reloading makes it OK.

use std::time::Duration;

use crate::support::*;

#[test]
fn health_is_critical_while_no_agent_is_configured() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo ok");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let out = env.run(&["health", "--success-within", "off"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.starts_with("CRITICAL: no agents are configured in ")
            && said.contains(&env.config.display().to_string())
            && said.contains("[[agent]]"),
        "{said}"
    );

    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    env.ok(&["reload"]);
    d.wait_until(Duration::from_secs(20), "health is OK with rio", || {
        env.run(&["health", "--success-within", "off"])
            .status
            .code()
            == Some(0)
    });
}
