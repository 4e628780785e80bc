//! `[metrics]` changed by a reload (issue 23): a textfile added is written
//! from then on; a listener added is refused, naming the key and the
//! restart it needs, instead of "config reloaded" with no port open.

use std::time::Duration;

use crate::support::*;

#[test]
fn a_reload_applies_a_textfile_and_refuses_a_listener_naming_the_restart() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo ok");
    let base = daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        "[[agent]]\nname = \"rio\"\n",
    );
    env.set_config(&base);
    env.ok(&["bootstrap"]);
    let d = env.daemon();
    let prom = env.tmp("agent-state.prom");
    env.set_config(&format!(
        "{base}\n[metrics]\ntextfile = {:?}\ninterval = \"1s\"\n",
        prom.display().to_string()
    ));
    env.ok(&["reload"]);
    d.wait_until(Duration::from_secs(20), "the textfile is written", || {
        std::fs::read_to_string(&prom).is_ok_and(|t| t.contains("# TYPE agent_state_"))
    });

    env.set_config(&format!(
        "{base}\n[metrics]\ntextfile = {:?}\ninterval = \"1s\"\nlisten = \"127.0.0.1:9\"\n",
        prom.display().to_string()
    ));
    let out = env.run(&["reload"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("[metrics] listen: off -> \"127.0.0.1:9\"") && err.contains("restart"),
        "{err}"
    );
    // The old config stays in force: the textfile goes on being written.
    let before = std::fs::metadata(&prom).unwrap().modified().unwrap();
    d.wait_until(
        Duration::from_secs(20),
        "the textfile is written again",
        || std::fs::metadata(&prom).is_ok_and(|m| m.modified().unwrap() > before),
    );
}
