//! `agent-state doctor` on a machine missing each prerequisite in turn: the
//! service user, its git identity, an executable command, the daemon; each
//! failure named with its fix, exit 1, and exit 0 once all is in place.
//! Creates a user, so it runs only as root with AGENT_STATE_ROOT_TESTS=1.

use crate::support::*;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

fn enabled() -> bool {
    let on = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1")
        && nix::unistd::geteuid().is_root();
    if !on {
        eprintln!("SKIPPED: doctor creates a user: run as root with AGENT_STATE_ROOT_TESTS=1");
    }
    on
}

fn quiet(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct User(String);

impl Drop for User {
    fn drop(&mut self) {
        quiet("userdel", &["-r", &self.0]);
        quiet("groupdel", &["asdoctorgrp"]);
    }
}

fn doctor(env: &Env, user: &str) -> (bool, String) {
    let out = env.run(&["doctor", "--user", user]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn doctor_names_each_missing_prerequisite_with_its_fix() {
    if !enabled() {
        return;
    }
    let name = "asdoctorsvc";
    quiet("userdel", &["-r", name]);
    quiet("groupdel", &["asdoctorgrp"]);
    let env = Env::with_config("");
    let repo = env.tmp("repo");
    std::fs::create_dir(&repo).unwrap();
    assert!(quiet(
        "git",
        &["init", "-q", "-b", "main", repo.to_str().unwrap()]
    ));
    let script = env.script("agent.sh", "echo ok");
    env.set_config(&format!(
        "group = \"asdoctorgrp\"\n{}",
        daemon_config(
            &script,
            &[],
            &[],
            &format!(
                "[[agent]]\nname = \"rio\"\nworkspace = {{ repo = {:?} }}\n",
                repo.display().to_string()
            )
        )
    ));

    // No user, no group, no state root, no daemon.
    let (ok, said) = doctor(&env, name);
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!("FAIL  service user: there is no user \"{name}\"")),
        "{said}"
    );
    assert!(
        said.contains("fix: create it: systemd-sysusers agent-state.conf"),
        "{said}"
    );
    assert!(
        said.contains("FAIL  inbox group: there is no group \"asdoctorgrp\""),
        "{said}"
    );
    assert!(said.contains("FAIL  daemon: no daemon runs on"), "{said}");

    // The user and group exist; the command is root's alone (0700).
    assert!(quiet("groupadd", &["--system", "asdoctorgrp"]));
    assert!(quiet(
        "useradd",
        &[
            "--system",
            "-m",
            "-d",
            &format!("/var/tmp/{name}"),
            "-g",
            "asdoctorgrp",
            "-s",
            "/bin/sh",
            name
        ]
    ));
    let _user = User(name.to_string());
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    env.ok(&["bootstrap"]);
    assert!(quiet(
        "chown",
        &[
            "-R",
            &format!("{name}:asdoctorgrp"),
            env.root.to_str().unwrap()
        ]
    ));
    let (ok, said) = doctor(&env, name);
    assert!(!ok);
    assert!(
        said.contains(&format!("ok    service user: {name}")),
        "{said}"
    );
    assert!(said.contains("ok    inbox group: asdoctorgrp"), "{said}");
    assert!(
        said.contains(&format!("is not executable by {name}")),
        "{said}"
    );
    assert!(said.contains("fix: chmod 755"), "{said}");
    assert!(
        said.contains("the service user has no git identity"),
        "{said}"
    );
    assert!(
        said.contains("warn  repository") && said.contains("no remote `origin`"),
        "{said}"
    );

    // Mended: executable, an identity in the user's home, a daemon.
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = format!("/var/tmp/{name}");
    for (k, v) in [
        ("user.name", "Agent State"),
        ("user.email", "agent-state@localhost"),
    ] {
        assert!(
            Command::new("git")
                .args(["config", "--global", k, v])
                .env("HOME", &home)
                .status()
                .unwrap()
                .success()
        );
    }
    let (ok, said) = doctor(&env, name);
    assert!(!ok, "only the daemon is missing now: {said}");
    assert_eq!(said.matches("FAIL").count(), 1, "{said}");
    let d = env.daemon();
    d.wait_until(std::time::Duration::from_secs(10), "a heartbeat", || {
        env.root.join(".daemon/daemon.json").exists()
    });
    let (ok, said) = doctor(&env, name);
    assert!(ok, "{said}");
    assert!(said.contains("ok    daemon: pid"), "{said}");
    assert!(said.contains("0 failed"), "{said}");
}
