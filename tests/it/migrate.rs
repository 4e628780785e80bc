//! Moving from cron (issue 14): `migrate-crontab` on the origin's six lines
//! (with CRON_TZ, comments and another job), `--apply` with its backups, and
//! the first daemon start after it catching up a run missed earlier today.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

const CRONTAB: &str = "\
# teleo research agents (m h dom mon dow command)
MAILTO=ops@example.com
0 22 * * * /opt/teleo-eval/research-session.sh rio >> /opt/teleo-eval/logs/rio.log 2>&1
30 23 * * * /opt/teleo-eval/research-session.sh clay >> /opt/teleo-eval/logs/clay.log 2>&1
0 1 * * * /opt/teleo-eval/research-session.sh theseus >> /opt/teleo-eval/logs/theseus.log 2>&1
CRON_TZ=Europe/Lisbon
30 2 * * * cd /opt/teleo-eval && timeout 2h ./research-session.sh vida >> logs/vida.log 2>&1
0 4 * * * /opt/teleo-eval/research-session.sh astra >> /opt/teleo-eval/logs/astra.log 2>&1
30 5 * * * /opt/teleo-eval/research-session.sh leo >> /opt/teleo-eval/logs/leo.log 2>&1
*/15 * * * * /usr/local/bin/backup-state.sh
";

fn env_with_crontab() -> (Env, std::path::PathBuf) {
    let env = Env::with_config("[[agent]]\nname = \"marcus\"\nkind = \"human\"\n");
    let crontab = env.tmp("crontab");
    std::fs::write(&crontab, CRONTAB).unwrap();
    (env, crontab)
}

fn backups(dir: &Path, prefix: &str) -> Vec<String> {
    list(dir)
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}.bak-")))
        .collect()
}

#[test]
fn migrate_crontab_prints_the_agents_and_the_lines_to_remove() {
    let (env, crontab) = env_with_crontab();
    let out = env.ok(&["migrate-crontab", crontab.to_str().unwrap()]);
    assert_eq!(out.matches("\n[[agent]]\n").count(), 6, "{out}");
    assert!(
        out.contains("name = \"vida\"\nschedule = \"30 2 * * *\"\ntimezone = \"Europe/Lisbon\""),
        "CRON_TZ honoured: {out}"
    );
    assert!(
        out.contains("name = \"rio\"\nschedule = \"0 22 * * *\""),
        "{out}"
    );
    // The line's `timeout 2h` is vida's limit, not the default's 90m.
    assert!(
        out.contains(
            "command = [\"/opt/teleo-eval/research-session.sh\", \"{agent}\"]\ntimeout = \"2h\"\n"
        ),
        "vida keeps its timeout: {out}"
    );
    assert_eq!(out.matches("timeout = ").count(), 1, "{out}");
    assert!(
        out.contains("#   3: 0 22 * * * /opt/teleo-eval/research-session.sh rio"),
        "{out}"
    );
    assert!(
        !out.contains("backup-state"),
        "other jobs are left alone: {out}"
    );
    // Nothing written.
    assert_eq!(std::fs::read_to_string(&crontab).unwrap(), CRONTAB);
    // The same from standard input.
    let mut cmd = env.command(&["migrate-crontab", "-"]);
    let out = {
        use std::io::Write;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(CRONTAB.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .matches("\n[[agent]]\n")
            .count(),
        6
    );
}

#[test]
fn migrate_crontab_apply_writes_the_config_and_comments_the_lines_out_with_backups() {
    let (env, crontab) = env_with_crontab();
    let config_before = std::fs::read_to_string(&env.config).unwrap();
    env.ok(&["migrate-crontab", crontab.to_str().unwrap(), "--apply"]);
    // The config has the six agents, valid, and its old text is kept.
    let check = env.run(&["check"]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.contains("ok (7 agents)"), "{said}");
    let dir = env.config.parent().unwrap();
    let kept = backups(dir, env.config.file_name().unwrap().to_str().unwrap());
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join(&kept[0])).unwrap(),
        config_before
    );
    // The crontab: the six lines commented out, the rest as it was.
    let edited = std::fs::read_to_string(&crontab).unwrap();
    assert_eq!(
        edited.matches("# agent-state migrate-crontab").count(),
        6,
        "{edited}"
    );
    for line in CRONTAB
        .lines()
        .filter(|l| !l.contains("research-session.sh"))
    {
        assert!(
            edited.contains(&format!("{line}\n")),
            "{line:?} kept:\n{edited}"
        );
    }
    let kept = backups(crontab.parent().unwrap(), "crontab");
    let copy = crontab.parent().unwrap().join(&kept[0]);
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), CRONTAB);
    // The crontab was 0644; its copy (crontabs carry secrets) is 0600.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // vida's limit came with it into the config.
    let config = std::fs::read_to_string(&env.config).unwrap();
    let vida = &config[config.find("name = \"vida\"").expect("vida migrated")..];
    let vida = &vida[..vida.find("[[agent]]").unwrap_or(vida.len())];
    assert!(vida.contains("timeout = \"2h\"\n"), "{config}");
    // Again: nothing left to migrate.
    let again = env.ok(&["migrate-crontab", crontab.to_str().unwrap(), "--apply"]);
    assert!(
        again.contains("no `research-session.sh` lines to migrate"),
        "{again}"
    );
}

#[test]
fn lines_that_cannot_be_migrated_stop_apply_and_change_nothing() {
    let (env, crontab) = env_with_crontab();
    std::fs::write(
        &crontab,
        format!("{CRONTAB}0 9 * * * /opt/teleo-eval/research-session.sh rio\n"),
    )
    .unwrap();
    let said = env.fails(
        &["migrate-crontab", crontab.to_str().unwrap(), "--apply"],
        65,
    );
    assert!(
        said.contains("line 11: rio is also started on line 3"),
        "{said}"
    );
    assert!(backups(env.config.parent().unwrap(), "config.toml").is_empty());
    assert!(
        !std::fs::read_to_string(&crontab)
            .unwrap()
            .contains("# agent-state")
    );
}

/// The first start after a migration has no schedule.json: the agent's last
/// session (its cron script's) stands for its last fire, so today's run,
/// missed since the cron line went, is caught up; an agent whose script ran
/// after the fire time is not run again.
#[test]
fn the_first_start_after_migration_catches_up_a_run_missed_earlier_today() {
    let env = Env::with_config("");
    let script = env.script("agent.sh", "echo working; echo '<axiom>COMPLETE</axiom>'");
    let fire = chrono::Utc::now() - chrono::Duration::minutes(10);
    let schedule = format!("{} {} * * *", fire.format("%M"), fire.format("%H"));
    let agents = format!(
        "[[agent]]\nname = \"rio\"\nschedule = \"{schedule}\"\ntimezone = \"UTC\"\n\n[[agent]]\nname = \"clay\"\nschedule = \"{schedule}\"\ntimezone = \"UTC\"\n"
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[("wake_on_inbox", "\"never\"")],
        &agents,
    ));
    env.ok(&["bootstrap"]);
    // Both ran from cron before: rio yesterday (its run today was missed),
    // clay a moment ago (after today's fire time).
    for agent in ["rio", "clay"] {
        let id = env.ok(&["session", "begin", agent]).trim().to_string();
        env.ok(&["session", "end", agent, "--session", &id]);
    }
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m-%dT")
        .to_string();
    let today = chrono::Utc::now().format("%Y-%m-%dT").to_string();
    let journal = env.path("rio", "journal.jsonl");
    let text = std::fs::read_to_string(&journal)
        .unwrap()
        .replace(&today, &yesterday);
    std::fs::write(&journal, text).unwrap();
    assert!(!env.root.join(".daemon/schedule.json").exists());

    let d = env.daemon();
    d.wait_until(
        Duration::from_secs(20),
        "rio's missed run is caught up",
        || env.events("rio", "session_start").len() == 2,
    );
    assert!(
        d.log_text().contains("catching up the run scheduled at"),
        "{}",
        d.log_text()
    );
    // The start's turn decided every catch-up (clay's would have started
    // in it, beside rio's); rio's session ending is handled in a later one.
    d.wait_until(
        Duration::from_secs(20),
        "rio's caught-up session has ended",
        || env.events("rio", "session_end").len() == 2,
    );
    assert_eq!(
        env.events("clay", "session_start").len(),
        1,
        "clay ran after the fire: not again"
    );
}
