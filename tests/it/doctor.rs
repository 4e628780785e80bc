//! `agent-state doctor` on a machine missing each prerequisite in turn: the
//! service user, its git identity, an executable command, the daemon; each
//! failure named with its fix, exit 1, and exit 0 once all is in place.
//! Creates a user, so it runs only as root with AGENT_STATE_ROOT_TESTS=1.
//! Under a real systemd (sdbox, AGENT_STATE_SYSTEMD_TESTS=1): the unit's
//! settings as systemd runs them, an operator's drop-in included.

use crate::support::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn enabled() -> bool {
    let on = std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() == Ok("1")
        && nix::unistd::geteuid().is_root();
    if !on {
        eprintln!("SKIPPED: doctor creates a user: run as root with AGENT_STATE_ROOT_TESTS=1");
    }
    on
}

fn quiet(program: &str, args: &[&str]) -> bool {
    run_tool(program, args).status.success()
}

struct User(String, String);

impl Drop for User {
    fn drop(&mut self) {
        quiet("userdel", &["-r", &self.0]);
        quiet("groupdel", &[&self.1]);
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
    let name = &account("asdoctorsvc");
    let group = &account("asdoctorgrp");
    quiet("userdel", &["-r", name]);
    quiet("groupdel", &[group]);
    let env = Env::with_config("");
    let repo = env.tmp("repo");
    std::fs::create_dir(&repo).unwrap();
    assert!(quiet(
        "git",
        &["init", "-q", "-b", "main", repo.to_str().unwrap()]
    ));
    let script = env.script("agent.sh", "echo ok");
    env.set_config(&format!(
        "group = \"{group}\"\n{}",
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
        said.contains(&format!("FAIL  inbox group: there is no group \"{group}\"")),
        "{said}"
    );
    assert!(said.contains("FAIL  daemon: no daemon runs on"), "{said}");

    // The user and group exist; the command is root's alone (0700).
    assert!(quiet("groupadd", &["--system", group]));
    assert!(quiet(
        "useradd",
        &[
            "--system",
            "-m",
            "-d",
            &format!("/var/tmp/{name}"),
            "-g",
            group,
            "-s",
            "/bin/sh",
            name
        ]
    ));
    let _user = User(name.to_string(), group.to_string());
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    env.ok(&["bootstrap"]);
    assert!(quiet(
        "chown",
        &["-R", &format!("{name}:{group}"), env.root.to_str().unwrap()]
    ));
    let (ok, said) = doctor(&env, name);
    assert!(!ok);
    assert!(
        said.contains(&format!("ok    service user: {name}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("ok    inbox group: {group}")),
        "{said}"
    );
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

/// Under systemd, doctor judges by the unit's effective settings (`systemctl
/// show`): a repository outside the shipped ReadWritePaths= fails until a
/// drop-in adds it, and a drop-in's User= is the service user doctor checks.
#[test]
fn under_systemd_doctor_judges_by_the_unit_with_its_drop_ins() {
    use crate::sdbox::{CONFIG, STATE, SdBox, describe, sdbox_tool, text};
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    sdbox.install_package_files();
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.write(
        CONFIG,
        &format!(
            "state_root = \"{STATE}\"\ngroup = \"teleo\"\n\n[[agent]]\nname = \"rio\"\n\
             command = [\"/bin/true\"]\nworkspace = {{ repo = \"/srv/extra/repo\" }}\n"
        ),
        0o644,
    );
    let doctor = || {
        let out = sdbox.exec(&["agent-state", "doctor"]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{}",
            describe(&out)
        );
        text(&out.stdout)
    };
    let refused = "FAIL  unit sandbox: the repository /srv/extra/repo is read-only for the service (ProtectSystem=strict)";

    let said = doctor();
    assert!(
        said.contains("ok    unit: agent-state.service as systemd runs it (systemctl show, drop-ins included): User=agent-state Group=teleo ProtectSystem=strict ProtectHome=yes; writable: /opt/teleo-eval, /var/lib/agent-state, /tmp, /var/tmp"),
        "{said}"
    );
    assert!(said.contains(refused), "{said}");
    assert!(
        said.contains("fix: let the service write it with a drop-in: systemctl edit agent-state.service → [Service] ReadWritePaths=/srv/extra/repo"),
        "{said}"
    );
    assert!(said.contains("ok    service user: agent-state"), "{said}");

    // `systemctl edit agent-state`: the repository's directory writable, and
    // another service user.
    sdbox.write(
        "/etc/systemd/system/agent-state.service.d/rw.conf",
        "[Service]\nReadWritePaths=/srv/extra\nUser=daemon\n",
        0o644,
    );
    sdbox.ok(&["systemctl", "daemon-reload"]);
    let said = doctor();
    assert!(!said.contains(refused), "{said}");
    assert!(!said.contains("unit sandbox"), "{said}");
    assert!(
        said.contains("User=daemon Group=teleo")
            && said.contains("writable: /opt/teleo-eval, /srv/extra,"),
        "{said}"
    );
    assert!(said.contains("ok    service user: daemon"), "{said}");
    // --user still names another.
    let out = sdbox.exec(&["agent-state", "doctor", "--user", "agent-state"]);
    assert!(
        text(&out.stdout).contains("ok    service user: agent-state"),
        "{}",
        describe(&out)
    );
}
