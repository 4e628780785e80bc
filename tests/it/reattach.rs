//! An inbox replaced under the running daemon (`rm -r inbox && mkdir
//! inbox`, as the service user might) is watched again and mended as
//! bootstrap would: its modes set, its parts made, without a restart.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::{Env, daemon_config};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0)
}

#[test]
fn an_inbox_made_again_by_hand_is_mended_without_a_restart() {
    let env = Env::with_config("");
    let runs = env.tmp("runs");
    let script = env.script(
        "agent.sh",
        &format!(
            "echo \"start $AGENT_STATE_AGENT\" >> {:?}; echo done",
            runs.display().to_string()
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        "[[agent]]\nname = \"rio\"\n",
    ));
    env.ok(&["bootstrap"]);
    let daemon = env.daemon();
    let inbox = env.path("rio", "inbox");
    std::fs::remove_dir_all(&inbox).expect("rm -r inbox");
    std::fs::create_dir(&inbox).expect("mkdir inbox");
    std::fs::set_permissions(&inbox, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    daemon.wait_until(
        Duration::from_secs(30),
        "its inbox is watched again",
        || daemon.log_text().contains("its inbox is watched again"),
    );
    assert_eq!(
        mode(&inbox),
        0o3770,
        "inbox/ is the group's again (setgid, sticky)"
    );
    assert_eq!(mode(&inbox.join(".tmp")), 0o3770, "inbox/.tmp/");
    for part in ["rejected", "processed", ".claimed"] {
        assert_eq!(
            mode(&inbox.join(part)),
            0o2750,
            "inbox/{part}/ is there, the daemon's"
        );
    }
    // And it works: junk sent now is rejected into the new rejected/, a
    // message wakes rio.
    std::fs::write(inbox.join("junk.json"), "{\"from\": \"leo\"}").expect("junk");
    env.send("leo", "rio", &[]);
    daemon.wait_until(Duration::from_secs(30), "rio's session starts", || {
        std::fs::read_to_string(&runs).is_ok_and(|t| t.contains("start rio"))
    });
    daemon.wait_until(Duration::from_secs(30), "the junk is rejected", || {
        inbox.join("rejected/junk.json").exists()
    });
}
