//! `agent-state check` checks what the daemon will need before it needs
//! it: each agent's command, its `verify` commands and its workspace
//! repository. An error where it cannot work as it stands (not executable,
//! not a repository, a `verify` path that does not exist), a warning where
//! it may appear later; each line names the config file, the agent, the
//! field and the fix.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::support::{Env, git_repo};

/// The output lines that start with `level` and name `agent` and `field`.
fn line<'a>(out: &'a str, level: &str, agent: &str, field: &str) -> Option<&'a str> {
    out.lines()
        .find(|l| l.starts_with(level) && l.contains(&format!("agent {agent}: {field}: ")))
}

#[test]
fn check_names_what_the_daemon_will_need_and_counts_only_errors() {
    let env = Env::with_config("");
    let good = env.script("agent.sh", "exit 0");
    let plain = env.tmp("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let not_repo = env.tmp("not-a-repo");
    std::fs::create_dir(&not_repo).unwrap();
    let repo = git_repo(&env);
    let missing = env.tmp("not-installed-yet");
    let body = |rio_command: &str, rio_verify: &str, theseus_repo: &str| {
        format!(
            r#"
[defaults]
command = [{good:?}, "{{agent}}"]

[[agent]]
name = "rio"
command = [{rio_command:?}]
verify = {rio_verify}

[[agent]]
name = "theseus"
workspace = {{ repo = {theseus_repo:?} }}
verify = [["no-such-tool-anywhere", "--check"], ["./scripts/test.sh"]]

[[agent]]
name = "leo"
command = [{missing:?}]
workspace = {{ repo = {absent:?} }}

[[agent]]
name = "marcus"
kind = "human"
"#,
            good = good.display().to_string(),
            missing = missing.display().to_string(),
            absent = env.tmp("absent-repo").display().to_string(),
        )
    };
    let plain_s = plain.display().to_string();
    let verify_missing = format!(r#"[["{}"]]"#, env.tmp("no-verify.sh").display());
    env.set_config(&body(
        &plain_s,
        &verify_missing,
        &not_repo.display().to_string(),
    ));
    let out = env.run(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(65), "{text}");
    let config = env.config.display().to_string();
    // (level, agent, field, words the line must hold)
    let table: &[(&str, &str, &str, &[&str])] = &[
        (
            "ERROR",
            "rio",
            "command",
            &["cannot be executed", "mode 644", "chmod +x"],
        ),
        (
            "ERROR",
            "rio",
            "verify[0]",
            &[
                "no-verify.sh does not exist",
                "every session's verification would fail",
                "fix `verify[0]`",
            ],
        ),
        (
            "ERROR",
            "theseus",
            "workspace.repo",
            &[
                "not-a-repo is not a git repository",
                "point `workspace.repo` at a git repository",
            ],
        ),
        (
            "WARNING",
            "theseus",
            "verify[0]",
            &[
                "`no-such-tool-anywhere` is not on this shell's PATH",
                "the daemon searches its own PATH",
                "give its absolute path",
            ],
        ),
        (
            "WARNING",
            "theseus",
            "verify[1]",
            &[
                "./scripts/test.sh is run in each session's workspace",
                "commit ./scripts/test.sh",
            ],
        ),
        (
            "WARNING",
            "leo",
            "command",
            &[
                "not-installed-yet does not exist (yet)",
                "the daemon holds leo",
                "install",
            ],
        ),
        (
            "WARNING",
            "leo",
            "workspace.repo",
            &["absent-repo does not exist (yet)", "git init"],
        ),
    ];
    for (level, agent, field, words) in table {
        let l = line(&text, level, agent, field)
            .unwrap_or_else(|| panic!("no {level} line for {agent} {field} in:\n{text}"));
        assert!(l.contains(&format!("config {config}: ")), "{l}");
        assert!(l.contains("; fix: "), "{l}");
        for w in *words {
            assert!(l.contains(w), "{w:?} not in {l}");
        }
    }
    assert!(text.contains("3 config error(s)"), "{text}");
    assert!(!text.contains("no problems found\n"), "{text}");
    assert!(
        !text.lines().any(|l| l.contains("agent marcus")),
        "a human runs nothing: {text}"
    );
    // The same in JSON, each with its level.
    let out = env.run(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(65));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let needs = v["needs"].as_array().expect("needs");
    assert_eq!(needs.len(), table.len(), "{v}");
    assert!(needs.iter().any(|n| n["level"] == "error"
        && n["agent"] == "rio"
        && n["field"] == "command"
        && n["config"] == config.as_str()
        && n["fix"].as_str().unwrap().contains("chmod +x")));

    // Errors fixed: exit 0, the warnings still said.
    env.set_config(&body(
        &good.display().to_string(),
        r#"[["sh", "-c", "true"]]"#,
        &repo.display().to_string(),
    ));
    let text = env.ok(&["check"]);
    assert!(!text.contains("ERROR"), "{text}");
    assert!(line(&text, "WARNING", "leo", "command").is_some(), "{text}");
    assert!(
        line(&text, "WARNING", "theseus", "verify[0]").is_some(),
        "{text}"
    );
    assert!(line(&text, "WARNING", "rio", "command").is_none(), "{text}");
    assert!(
        line(&text, "ERROR", "theseus", "workspace.repo").is_none(),
        "{text}"
    );
}

#[test]
fn the_state_checks_are_unchanged_beside_them() {
    // The state's findings keep their words (now rendered from one enum).
    let env = Env::with_config("");
    let good = env.script("agent.sh", "exit 0");
    env.set_config(&format!(
        "[defaults]\ncommand = [{:?}]\n\n[[agent]]\nname = \"rio\"\n",
        good.display().to_string()
    ));
    env.ok(&["bootstrap"]);
    std::fs::write(env.path("rio", "report.json"), "{not json").unwrap();
    std::fs::remove_file(env.path("rio", "memory.md")).unwrap();
    let out = env.run(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(65), "{text}");
    assert!(
        text.contains("PROBLEM  rio: report.json: corrupt: "),
        "{text}"
    );
    assert!(
        text.contains("PROBLEM  rio: memory.md: missing\n"),
        "{text}"
    );
    assert!(
        !text.contains("ERROR") && !text.contains(": agent rio: "),
        "nothing the daemon needs is wrong: {text}"
    );
    let v: Value = serde_json::from_slice(&env.run(&["check", "--json"]).stdout).unwrap();
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["file"] == "memory.md" && f["problem"] == "missing"),
        "{v}"
    );
    let text = env.ok(&["check", "--repair"]);
    assert!(
        text.contains("REPAIRED rio: memory.md: missing — created"),
        "{text}"
    );
    assert!(
        text.contains("REPAIRED rio: report.json: corrupt: "),
        "{text}"
    );
}

/// Commands and repositories reached through a linked directory (`/bin`
/// on a merged-/usr Debian is a link to `usr/bin`; a repository under a
/// linked `/srv`) are found, as exec and git find them. On the code
/// before: `check` said `/bin/sh` "does not exist", and failed on a
/// `verify = [["/bin/sh", ...]]` and on a linked repository ("not a git
/// repository").
#[test]
fn check_follows_links_to_commands_and_repositories() {
    let env = Env::with_config("");
    let good = env.script("agent.sh", "exit 0");
    let repo = git_repo(&env);
    let linked = env.tmp("linked");
    std::os::unix::fs::symlink(env.dir.path(), &linked).unwrap();
    let through = |p: &std::path::Path| {
        linked
            .join(p.strip_prefix(env.dir.path()).unwrap())
            .display()
            .to_string()
    };
    env.set_config(&format!(
        r#"
[defaults]
command = [{command:?}, "{{agent}}"]

[[agent]]
name = "rio"
workspace = {{ repo = {repo:?} }}
verify = [[{command:?}]]

[[agent]]
name = "marcus"
kind = "human"
"#,
        command = through(&good),
        repo = through(&repo),
    ));
    let out = env.command(&["check"]).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("WARNING") || l.starts_with("ERROR")),
        "{text}"
    );
}
