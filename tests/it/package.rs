//! The Debian package (issue 14) on a fresh Debian 12 with a real systemd
//! (sdbox): `apt install ./agent-state_*.deb` puts the user, group,
//! directories, unit, man pages and completions in place and enables the
//! unit without starting it; two agents configured, a session runs; a
//! second package with a higher version installed while a session runs
//! restarts the daemon after that session, state intact; `apt remove` and
//! `apt purge` keep the state root.
//!
//! The packages are built by `packaging/build-deb.sh` (cargo-deb); `.ci/run`
//! builds two (the second with `--deb-version 0.1.1-1`) into a directory it
//! names in AGENT_STATE_DEBS. Gated like every sdbox test by
//! AGENT_STATE_SYSTEMD_TESTS=1, and skipped loudly without the packages.

use std::path::PathBuf;
use std::time::Duration;

use crate::sdbox::{SdBox, describe, sdbox_tool, text};

const STATE: &str = "/opt/teleo-eval/agent-state";

pub(crate) fn packages() -> Option<(PathBuf, PathBuf)> {
    let Some(dir) = std::env::var_os("AGENT_STATE_DEBS").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: set AGENT_STATE_DEBS to a directory with two packages built by packaging/build-deb.sh \
             (the second with --deb-version 0.1.1-1), as .ci/run does"
        );
        return None;
    };
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("AGENT_STATE_DEBS={}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort();
    assert!(
        debs.len() >= 2,
        "AGENT_STATE_DEBS={} must hold two packages of different versions: {debs:?}",
        dir.display()
    );
    Some((debs[0].clone(), debs[debs.len() - 1].clone()))
}

const CONFIG: &str = r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
shutdown_grace = "30s"

[defaults]
command = ["/usr/share/agent-state/demo-agent.sh", "{agent}"]
wake_on_inbox = "never"

[[agent]]
name = "rio"

[[agent]]
name = "clay"

[[agent]]
name = "marcus"
kind = "human"
"#;

fn apt(sdbox: &SdBox, args: &str) -> String {
    let out = sdbox.exec(&[
        "sh",
        "-c",
        &format!("cd /root && DEBIAN_FRONTEND=noninteractive apt-get -y --no-install-recommends {args} 2>&1"),
    ]);
    assert!(out.status.success(), "apt-get {args}:\n{}", describe(&out));
    text(&out.stdout)
}

#[test]
fn the_package_installs_upgrades_under_a_running_session_and_removes_keeping_the_state() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let Some((first, second)) = packages() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    for deb in [&first, &second] {
        let name = deb.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(deb, sdbox.path(&format!("/root/{name}"))).unwrap();
    }
    let first_name = first.file_name().unwrap().to_string_lossy().into_owned();
    let second_name = second.file_name().unwrap().to_string_lossy().into_owned();

    // ---- install ----------------------------------------------------------
    let said = apt(&sdbox, &format!("install ./{first_name}"));
    assert!(
        said.contains("installed and enabled, not started"),
        "{said}"
    );
    // The login comes before the first start: the service user's home is
    // there, the message says how.
    assert!(
        said.contains("sudo -u agent-state -H claude"),
        "the install message gives the login command: {said}"
    );
    assert_eq!(
        sdbox
            .ok(&["stat", "-c", "%U:%G %a", "/var/lib/agent-state"])
            .trim(),
        "agent-state:teleo 700",
        "the service user's home exists before the first start"
    );
    sdbox.ok(&[
        "runuser",
        "-u",
        "agent-state",
        "--",
        "sh",
        "-c",
        "cd && mkdir -p .claude && test \"$PWD\" = /var/lib/agent-state",
    ]);
    // The package's fields as apt shows them.
    let fields = sdbox.ok(&[
        "dpkg-query",
        "-W",
        "-f",
        "${Description}\n${Recommends}",
        "agent-state",
    ]);
    let summary = fields.lines().next().unwrap_or_default();
    assert!(
        summary.len() <= 80,
        "the description's first line fits 80 columns ({}): {summary}",
        summary.len()
    );
    assert!(
        fields.lines().last().is_some_and(|l| l.contains("zstd")),
        "zstd (zstdcat, for rotated logs) is recommended: {fields}"
    );
    assert_eq!(
        sdbox.ok(&["id", "-un", "agent-state"]).trim(),
        "agent-state"
    );
    assert_eq!(sdbox.ok(&["id", "-gn", "agent-state"]).trim(), "teleo");
    assert_eq!(
        sdbox.ok(&["stat", "-c", "%U:%G %a", STATE]).trim(),
        "agent-state:teleo 755"
    );
    assert_eq!(
        sdbox
            .ok(&["stat", "-c", "%U:%G %a", "/etc/agent-state/config.toml"])
            .trim(),
        "root:teleo 644"
    );
    let enabled = sdbox.exec(&["systemctl", "is-enabled", "agent-state.service"]);
    assert_eq!(text(&enabled.stdout).trim(), "enabled");
    assert_eq!(
        sdbox.prop("ActiveState"),
        "inactive",
        "not started before it is configured"
    );
    for path in [
        "/usr/bin/agent-state",
        "/usr/share/man/man1/agent-state.1.gz",
        "/usr/share/man/man1/agent-state-session-begin.1.gz",
        "/usr/share/man/man1/agent-state-flow-start.1.gz",
        "/usr/share/man/man5/agent-state.toml.5.gz",
        "/usr/share/bash-completion/completions/agent-state",
        "/usr/share/zsh/vendor-completions/_agent-state",
        "/usr/share/fish/vendor_completions.d/agent-state.fish",
        "/usr/share/agent-state/research-session.sh",
        "/usr/share/agent-state/demo-agent.sh",
        "/usr/share/doc/agent-state/README.md",
        "/usr/share/doc/agent-state/CHANGELOG.md",
    ] {
        assert!(sdbox.path(path).exists(), "{path} is installed");
    }
    // The man pages read as man pages: no Markdown, and a command's page
    // says what it does, not only its options.
    let toml5 = sdbox.ok(&["sh", "-c", "zcat /usr/share/man/man5/agent-state.toml.5.gz"]);
    assert!(
        toml5.contains("state_root") && !toml5.contains("](#") && !toml5.contains("**"),
        "agent-state.toml(5) without Markdown links or emphasis:\n{toml5}"
    );
    let migrate1 = sdbox.ok(&[
        "sh",
        "-c",
        "zcat /usr/share/man/man1/agent-state-migrate-crontab.1.gz",
    ]);
    assert!(
        migrate1.contains("Each crontab line") && migrate1.contains("commented out"),
        "migrate-crontab(1) describes what it does:\n{migrate1}"
    );
    let version = sdbox.ok(&["agent-state", "--version"]);
    assert!(
        version.starts_with("agent-state ") && version.contains("(commit "),
        "--version names the version and the commit: {version}"
    );
    let conffiles = sdbox.ok(&["dpkg-query", "-W", "-f", "${Conffiles}", "agent-state"]);
    assert!(
        conffiles.contains("/etc/agent-state/config.toml"),
        "{conffiles}"
    );

    // doctor on the fresh install: the daemon is not running yet.
    let doctor = sdbox.exec(&["agent-state", "doctor"]);
    let said = text(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(said.contains("ok    service user: agent-state"), "{said}");
    assert!(said.contains("ok    inbox group: teleo"), "{said}");
    assert!(said.contains("FAIL  daemon: no daemon runs"), "{said}");

    // ---- configured, started: a session runs -------------------------------
    sdbox.write("/etc/agent-state/config.toml", CONFIG, 0o644);
    sdbox.write(
        "/etc/agent-state/environment",
        "DEMO_STEP_SECONDS=1\nDEMO_FAIL_RATE=0\n",
        0o640,
    );
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    let wake = |agent: &str| {
        let out = sdbox.exec(&[
            "runuser",
            "-u",
            "agent-state",
            "--",
            "agent-state",
            "wake",
            agent,
            "--wait",
            "15s",
        ]);
        assert!(out.status.success(), "wake {agent}:\n{}", describe(&out));
        text(&out.stdout).trim().to_string()
    };
    let rio = wake("rio");
    sdbox.wait_until(Duration::from_secs(30), "rio's session completed", || {
        let s = sdbox.json(&format!("{STATE}/rio/session.json"));
        s["session_id"] == rio.as_str() && s["status"] == "completed"
    });

    // doctor, once configured and started: everything a session needs.
    let doctor = sdbox.exec(&["agent-state", "doctor"]);
    let said = text(&doctor.stdout);
    assert!(doctor.status.success(), "{said}");
    assert!(
        said.contains("ok    rio command: /usr/share/agent-state/demo-agent.sh"),
        "{said}"
    );
    assert!(said.contains("ok    daemon: pid"), "{said}");
    // A node_exporter textfile where the README puts it needs the unit to
    // let the service write there: doctor says so, with the drop-in.
    sdbox.write(
        "/etc/agent-state/config.toml",
        &format!("{CONFIG}\n[metrics]\ntextfile = \"/var/lib/prometheus/node-exporter/agent-state.prom\"\n"),
        0o644,
    );
    let doctor = sdbox.exec(&["agent-state", "doctor"]);
    let said = text(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(
        said.contains("the metrics textfile's directory /var/lib/prometheus/node-exporter is read-only for the service")
            && said.contains("ReadWritePaths=/var/lib/prometheus/node-exporter"),
        "{said}"
    );
    sdbox.write("/etc/agent-state/config.toml", CONFIG, 0o644);

    // ---- upgraded while clay's session runs --------------------------------
    let before = sdbox.prop("MainPID");
    let clay = wake("clay");
    let said = apt(&sdbox, &format!("install ./{second_name}"));
    assert!(
        !said.contains("not started"),
        "an upgrade is not a first install: {said}"
    );
    let after = sdbox.prop("MainPID");
    assert_ne!(before, after, "the daemon was restarted on the new binary");
    assert_eq!(sdbox.prop("ActiveState"), "active");
    let session = sdbox.json(&format!("{STATE}/clay/session.json"));
    assert_eq!(session["session_id"], clay.as_str());
    assert_ne!(
        session["status"], "running",
        "recorded as a stop records it: {session:#}"
    );
    let journal = sdbox.read(&format!("{STATE}/clay/journal.jsonl"));
    assert!(
        journal.contains(&format!("\"session_id\":\"{clay}\"")) && journal.contains("session_end"),
        "{journal}"
    );
    // The state the old version wrote is read by the new one.
    let status = sdbox.exec(&["agent-state", "status", "--json"]);
    assert!(status.status.success(), "{}", describe(&status));
    let check = sdbox.exec(&["runuser", "-u", "agent-state", "--", "agent-state", "check"]);
    assert!(
        check.status.success(),
        "check after the upgrade:\n{}",
        describe(&check)
    );
    assert_eq!(
        sdbox.json(&format!("{STATE}/rio/session.json"))["session_id"],
        rio.as_str()
    );

    // ---- removed, then purged: the state root stays ------------------------
    apt(&sdbox, "remove agent-state");
    assert!(!sdbox.path("/usr/bin/agent-state").exists());
    assert_eq!(sdbox.prop("ActiveState"), "inactive");
    assert!(sdbox.path(&format!("{STATE}/rio/journal.jsonl")).exists());
    assert!(
        sdbox.path("/etc/agent-state/config.toml").exists(),
        "remove keeps the conffile"
    );
    // A backup migrate-crontab --apply made: the operator's, kept and named.
    sdbox.write(
        "/etc/agent-state/crontab.bak-20261126T120000Z",
        "30 2 * * * /opt/teleo-eval/research-session.sh rio\n",
        0o600,
    );
    let said = apt(&sdbox, "purge agent-state");
    assert!(said.contains("is kept (the agents' memory"), "{said}");
    assert!(
        said.contains("/etc/agent-state/crontab.bak-20261126T120000Z")
            && said.contains("rm -r /etc/agent-state"),
        "purge says where the migration's backups are: {said}"
    );
    assert!(
        sdbox
            .path("/etc/agent-state/crontab.bak-20261126T120000Z")
            .exists()
    );
    assert!(sdbox.path(&format!("{STATE}/rio/journal.jsonl")).exists());
    assert!(
        !sdbox.path("/etc/agent-state/config.toml").exists(),
        "purge removes the conffile"
    );
}
