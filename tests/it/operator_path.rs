//! The operator's path end to end (issue 23), as one run on a fresh Debian
//! box under a real systemd: install the package, log the CLI in as the
//! service user, migrate root's crontab, doctor clean, the first scheduled
//! session, typed mail from a member of the inbox group, that member's
//! acknowledgement, a backup, a restore as the README says, an upgrade and a
//! purge. Each step has its own test elsewhere; this one walks them in the
//! order an operator does, on the files the package installs.
//!
//! Gated like every sdbox test by AGENT_STATE_SYSTEMD_TESTS=1 (root), and
//! needs the two packages `.ci/run` builds (AGENT_STATE_DEBS).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::package::packages;
use crate::sdbox::{SdBox, describe, sdbox_tool, text};

const STATE: &str = "/opt/teleo-eval/agent-state";
const WORK: &str = "/opt/teleo-eval/workspaces";
const SCRIPT: &str = "/usr/share/agent-state/research-session.sh";

/// Claude Code for the session script: it works in the work tree and
/// answers with a result, signals and a Context Summary.
const FAKE_CLAUDE: &str = r#"#!/bin/sh
cat >/dev/null
me=$(basename "$PWD")
echo "note by $me" >> notes.md
cat <<'EOF'
{"type":"result","subtype":"success","is_error":false,"num_turns":3,"total_cost_usd":0.25,"usage":{"input_tokens":1000,"output_tokens":200,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"result":"Read the inbox and wrote a note.\n\n## Context Summary\n\n**Goal**: Answer the inbox\n**Current State**: Wrote a note\n**Next Agent**: none\n**Confidence**: 4\n**Risk Level**: low\n**Blockers**: none\n\n<axiom>COMPLETE</axiom>"}
EOF
"#;

struct Box_ {
    sdbox: SdBox,
}

impl Box_ {
    fn sh(&self, script: &str) -> String {
        let out = self.sdbox.exec(&["sh", "-c", script]);
        assert!(out.status.success(), "{script}\n{}", describe(&out));
        text(&out.stdout)
    }

    fn as_user(&self, user: &str, script: &str) -> std::process::Output {
        self.sdbox
            .exec(&["runuser", "-u", user, "--", "sh", "-c", script])
    }

    fn as_user_ok(&self, user: &str, script: &str) -> String {
        let out = self.as_user(user, script);
        assert!(
            out.status.success(),
            "as {user}: {script}\n{}",
            describe(&out)
        );
        text(&out.stdout)
    }

    fn apt(&self, args: &str) -> String {
        self.sh(&format!(
            "cd /root && DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends {args} 2>&1"
        ))
    }

    fn json(&self, path: &str) -> Value {
        self.sdbox.json(path)
    }

    fn events(&self, agent: &str, event: &str) -> Vec<Value> {
        self.sdbox
            .read(&format!("{STATE}/{agent}/journal.jsonl"))
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == event)
            .collect()
    }

    fn waiting(&self, agent: &str) -> Vec<String> {
        self.sh(&format!(
            "cd {STATE}/{agent}/inbox && for f in *.json; do [ -f \"$f\" ] && echo \"${{f%.json}}\"; done; true"
        ))
        .lines()
        .map(str::to_string)
        .collect()
    }
}

#[test]
fn the_operators_path_from_install_to_purge() {
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let Some((first, second)) = packages() else {
        return;
    };
    let b = Box_ {
        sdbox: SdBox::up(tool),
    };
    let sdbox = &b.sdbox;
    for deb in [&first, &second] {
        let name = deb.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(deb, sdbox.path(&format!("/root/{name}"))).unwrap();
    }
    let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();

    // ---- install ------------------------------------------------------------
    b.apt("update");
    b.apt("install git jq cron");
    let said = b.apt(&format!("install ./{}", name(&first)));
    assert!(said.contains("sudo -u agent-state -H claude"), "{said}");
    sdbox.write("/usr/local/bin/claude", FAKE_CLAUDE, 0o755);

    // ---- log in, as the install message says (a stand-in's login: the
    // credentials file the real one writes) -----------------------------------
    b.as_user_ok(
        "agent-state",
        "cd && mkdir -p .claude && umask 077 && echo '{}' > .claude/.credentials.json && git config --global user.name agent-state && git config --global user.email agent-state@localhost",
    );

    // ---- the agents' work trees, then root's crontab migrated ----------------
    for agent in ["rio", "clay"] {
        b.sh(&format!(
            "install -d -o agent-state -g teleo {WORK}/{agent} && runuser -u agent-state -- sh -c 'cd {WORK}/{agent} && git init -q -b main && git commit -q --allow-empty -m init'"
        ));
    }
    // The next run a few minutes ahead, so the daemon (started after the
    // migration) runs it as scheduled.
    let fire = chrono::Utc::now() + chrono::Duration::minutes(3);
    let (m, h) = (fire.format("%M"), fire.format("%H"));
    let crontab = format!(
        "CRON_TZ=UTC\nMAILTO=\"\"\n{m} {h} * * * cd /usr/share/agent-state && timeout 2h ./research-session.sh rio >> /var/log/rio.log 2>&1\n{m} {h} * * * {SCRIPT} clay\n0 3 * * * /usr/local/bin/backup-db.sh\n"
    );
    sdbox.write("/root/crontab.txt", &crontab, 0o600);
    b.sh("crontab /root/crontab.txt");
    let dry = b.sh("agent-state migrate-crontab");
    assert!(
        dry.contains("name = \"rio\"") && dry.contains("timeout = \"2h\""),
        "{dry}"
    );
    let applied = b.sh("agent-state migrate-crontab --apply");
    assert!(applied.contains("2 agent(s) added"), "{applied}");
    let left = b.sh("crontab -l");
    assert!(
        left.contains("0 3 * * * /usr/local/bin/backup-db.sh"),
        "{left}"
    );
    assert_eq!(
        left.matches("# agent-state migrate-crontab").count(),
        2,
        "{left}"
    );
    let kept = b.sh("stat -c '%a %n' /etc/agent-state/crontab.bak-*");
    assert!(
        kept.starts_with("600 "),
        "the crontab's copy is root's only: {kept}"
    );
    // The human mailbox, by hand.
    b.sh("printf '\\n[[agent]]\\nname = \"marcus\"\\nkind = \"human\"\\n' >> /etc/agent-state/config.toml");
    b.sh("agent-state check");

    // ---- start; doctor clean --------------------------------------------------
    b.sh("systemctl start agent-state");
    let doctor = sdbox.exec(&["agent-state", "doctor"]);
    let said = text(&doctor.stdout);
    assert!(doctor.status.success(), "doctor is clean:\n{said}");
    for line in [
        "ok    claude: /usr/local/bin/claude",
        &format!("ok    rio work tree: {WORK}/rio"),
        "ok    Claude Code login: /var/lib/agent-state/.claude/.credentials.json",
    ] {
        assert!(said.contains(line), "{line}\n{said}");
    }

    // ---- the first scheduled session -------------------------------------------
    sdbox.wait_until(
        Duration::from_secs(300),
        "rio's scheduled session completed",
        || b.json(&format!("{STATE}/rio/report.json"))["last_session"]["outcome"] == "completed",
    );
    let journal = sdbox.journal(&[]);
    assert!(
        journal.contains("started (schedule), instance rio-"),
        "the session was the schedule's:\n{journal}"
    );

    // ---- typed mail from a member of the inbox group (high priority: the
    // packaged defaults wake on it, after the 30 s debounce) -------------------
    b.sh("useradd -m -G teleo -s /bin/sh maria");
    b.as_user_ok(
        "maria",
        &format!(
            r#"{{ printf '{{"from":"marcus","type":"question",'; sleep 2; printf '"subject":"typed","priority":"high","body":"what moved?"}}\n'; }} > {STATE}/rio/inbox/typed.json"#
        ),
    );
    sdbox.wait_until(
        Duration::from_secs(120),
        "rio answered the typed mail",
        || {
            b.json(&format!("{STATE}/rio/session.json"))["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|s| s == "typed"))
                && b.json(&format!("{STATE}/rio/session.json"))["status"] == "completed"
        },
    );
    // The shipped script ends its session itself, with the cost and tokens
    // it read in Claude Code's result; the token breakdown the daemon read
    // in the same result follows in one more write of session.json (waited
    // for: the script's end alone already says completed, with the cost).
    sdbox.wait_until(
        Duration::from_secs(30),
        "rio's session has the token breakdown its result said",
        || b.json(&format!("{STATE}/rio/session.json"))["usage"]["input_tokens"] == 1000,
    );
    let s = b.json(&format!("{STATE}/rio/session.json"));
    assert_eq!(s["cost_usd"], 0.25, "{s:#}");
    assert_eq!(s["tokens_used"], 1200, "{s:#}");

    // ---- maria acknowledges what waits for marcus --------------------------------
    b.as_user_ok(
        "agent-state",
        "agent-state send --from rio --to marcus --type question --priority high --subject 'which market first?'",
    );
    let id = b.waiting("marcus").pop().expect("a question for marcus");
    let listed = b.as_user_ok("maria", "agent-state inbox marcus");
    assert!(listed.contains("which market first?"), "{listed}");
    let ack = b.as_user(
        "maria",
        &format!("agent-state inbox ack marcus {}", &id[..8]),
    );
    if ack.status.success() {
        assert!(
            text(&ack.stdout).contains("acknowledged"),
            "{}",
            describe(&ack)
        );
    } else {
        // Refused with the command that can: the operator runs it.
        assert_eq!(ack.status.code(), Some(77), "{}", describe(&ack));
        let err = text(&ack.stderr);
        let command = err
            .split('`')
            .find(|c| c.starts_with("sudo -u agent-state agent-state inbox ack"))
            .unwrap_or_else(|| panic!("the refusal names the command: {err}"));
        b.sh(&command.replacen("sudo -u agent-state ", "runuser -u agent-state -- ", 1));
    }
    sdbox.wait_until(
        Duration::from_secs(30),
        "the question is acknowledged",
        || !b.waiting("marcus").contains(&id),
    );
    assert!(
        b.events("marcus", "message_acknowledged")
            .iter()
            .any(|e| e["message_id"] == id.as_str())
    );

    // ---- backup, then restore as the README says -------------------------------
    b.as_user_ok(
        "agent-state",
        "agent-state backup /var/backups/agent-state/$(date +%F).tar.zst",
    );
    let archive = b
        .sh("ls /var/backups/agent-state/*.tar.zst")
        .trim()
        .to_string();
    let sessions_before = b.events("rio", "session_end").len();
    b.sh("systemctl stop agent-state");
    b.sh(&format!("mv {STATE} {STATE}.old"));
    // Without root, as the README's second way: the root made for the
    // service user, the restore run as it.
    b.sh(&format!(
        "install -d -o agent-state -g teleo -m 0755 {STATE}"
    ));
    b.as_user_ok("agent-state", &format!("agent-state restore {archive}"));
    assert_eq!(
        b.sh(&format!("stat -c '%U:%G %a' {STATE} {STATE}/rio/inbox")),
        "agent-state:teleo 755\nagent-state:teleo 3770\n"
    );
    assert_eq!(b.events("rio", "session_end").len(), sessions_before);
    b.sh("systemctl start agent-state");
    // A new agent after the restore: the reload creates its directory.
    b.sh("printf '\\n[[agent]]\\nname = \"vida\"\\ndomain = \"health\"\\n' >> /etc/agent-state/config.toml");
    b.sh("systemctl reload agent-state");
    assert!(sdbox.path(&format!("{STATE}/vida/inbox")).is_dir());
    let status = b.as_user_ok("maria", "agent-state status");
    assert!(!status.contains("missing"), "{status}");

    // ---- upgrade ------------------------------------------------------------------
    let before = sdbox.prop("MainPID");
    b.apt(&format!("install ./{}", name(&second)));
    assert_ne!(sdbox.prop("MainPID"), before, "restarted on the new binary");
    assert_eq!(sdbox.prop("ActiveState"), "active");
    b.as_user_ok("agent-state", "agent-state check");

    // ---- purge: the state and the migration's backups stay, named -----------------
    let said = b.apt("purge agent-state");
    assert!(said.contains("is kept (the agents' memory"), "{said}");
    assert!(said.contains("/etc/agent-state/crontab.bak-"), "{said}");
    assert!(sdbox.path(&format!("{STATE}/rio/journal.jsonl")).exists());
}
