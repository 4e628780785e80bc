//! The daemon's and doctor's own git runs no program the repository names
//! (issue 20): a repository set up as an agent could set it (hooks through
//! `core.hooksPath`, `core.fsmonitor`, filter drivers by `.gitattributes`,
//! diff drivers and textconv, `core.sshCommand`, `core.gitProxy`, the `ext::`
//! transport, `remote.origin.uploadpack`), each key's program touching its
//! own marker; through the real workspace, flow and doctor paths, no marker
//! appears. Each test first proves its trap live: a plain `git` run by the
//! test touches the marker.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// `trap-KEY.sh`: touches `fired-KEY` in the temp dir, then passes its
/// input through (as a filter must) and exits `status` (a filter 0, anything
/// else 1 without reading its input).
fn trap(env: &Env, key: &str, status: u8) -> String {
    let marker = env.tmp(&format!("fired-{key}"));
    let pass = if status == 0 { "cat 2>/dev/null" } else { "" };
    env.script(
        &format!("trap-{key}.sh"),
        &format!(
            "touch {:?}\n{pass}\nexit {status}",
            marker.display().to_string()
        ),
    )
    .display()
    .to_string()
}

fn fired(env: &Env) -> Vec<String> {
    list(env.dir.path())
        .into_iter()
        .filter(|n| n.starts_with("fired-"))
        .collect()
}

fn clear_fired(env: &Env) {
    for n in fired(env) {
        std::fs::remove_file(env.tmp(&n)).unwrap();
    }
}

/// `git config KEY VALUE` in `repo` (the repository's own config, as an agent writes it).
fn set(repo: &Path, key: &str, value: &str) {
    git(repo, &["config", key, value]);
}

/// Plain git, as an agent or an operator would run it (the user's config and
/// the repository's; nothing disabled); whether it succeeded is not asked.
fn plain_git(dir: &Path, args: &[&str]) {
    plain_git_env(dir, args, &[]);
}

/// [`plain_git`] with environment variables.
fn plain_git_env(dir: &Path, args: &[&str], vars: &[(&str, String)]) {
    let _ = Command::new("git")
        .args(args)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
}

/// A repository whose every file goes through the filter and diff driver
/// `evil` (README through `sneaky`, defined in a file included only on the
/// agent's branches), with hooks; the agent's session sets
/// `core.fsmonitor`, leaves a changed file and ends.
fn workspace_lab() -> (Env, PathBuf) {
    let env = Env::with_config("");
    let repo = git_repo(&env);
    std::fs::write(
        repo.join(".gitattributes"),
        "* filter=evil diff=evil\nREADME filter=sneaky\n",
    )
    .unwrap();
    git(&repo, &["add", ".gitattributes"]);
    git(&repo, &["commit", "-q", "-m", "attributes"]);
    // A driver defined only where the agent's branches are checked out.
    std::fs::write(
        repo.join(".git/sneaky.cfg"),
        format!(
            "[filter \"sneaky\"]\n\tsmudge = {}\n\tclean = {}\n",
            trap(&env, "sneaky-smudge", 0),
            trap(&env, "sneaky-clean", 0)
        ),
    )
    .unwrap();
    set(&repo, "includeIf.onbranch:rio/**.path", "sneaky.cfg");
    let hooks = env.tmp("hooks");
    std::fs::create_dir(&hooks).unwrap();
    for hook in [
        "post-checkout",
        "reference-transaction",
        "post-index-change",
    ] {
        let t = trap(&env, &format!("hook-{hook}"), 0);
        std::fs::copy(&t, hooks.join(hook)).unwrap();
    }
    set(&repo, "core.hooksPath", hooks.to_str().unwrap());
    set(&repo, "filter.evil.smudge", &trap(&env, "smudge", 0));
    set(&repo, "filter.evil.clean", &trap(&env, "clean", 0));
    set(&repo, "filter.evil.required", "true");
    set(&repo, "diff.evil.textconv", &trap(&env, "textconv", 0));
    set(&repo, "diff.evil.command", &trap(&env, "diff-command", 0));
    set(&repo, "diff.external", &trap(&env, "diff-external", 0));
    let fsmonitor = trap(&env, "fsmonitor", 1);
    let script = env.script(
        "agent.sh",
        &format!(
            "git config core.fsmonitor {fsmonitor:?}\necho changed >> README\necho new > new.txt\necho done"
        ),
    );
    let body = daemon_config(
        &script,
        &[],
        &[(
            "workspace",
            &format!(
                "{{ repo = {:?}, base = \"main\" }}",
                repo.display().to_string()
            ),
        )],
        "[[agent]]\nname = \"rio\"\n",
    );
    env.set_config(&body);
    (env, repo)
}

#[test]
fn a_workspace_session_runs_no_hook_filter_diff_driver_or_fsmonitor_of_the_repository() {
    let (env, repo) = workspace_lab();
    // The trap is live: a plain `git worktree add` runs the hook and the smudge filter.
    let probe = env.tmp("probe");
    plain_git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "rio/probe",
            probe.to_str().unwrap(),
            "main",
        ],
    );
    let live = fired(&env);
    assert!(
        live.contains(&"fired-hook-post-checkout".to_string())
            && live.contains(&"fired-smudge".to_string())
            && live.contains(&"fired-sneaky-smudge".to_string()),
        "the trap must be live: {live:?}"
    );
    plain_git(
        &repo,
        &["worktree", "remove", "--force", probe.to_str().unwrap()],
    );
    clear_fired(&env);

    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "the session ended, its worktree kept",
        || {
            let p = env.path("rio", "session.json");
            p.exists() && read_json(&p)["workspace"]["state"] == "kept"
        },
    );
    let session = read_json(&env.path("rio", "session.json"));
    assert_eq!(session["status"], "completed", "{session}");
    assert_eq!(session["workspace"]["dirty"], true, "{session}");
    drop(d);
    assert_eq!(
        fired(&env),
        Vec::<String>::new(),
        "the daemon's git ran a program the repository named"
    );

    // What the session left set: a plain `git status` in its worktree runs
    // its fsmonitor (the daemon's did not).
    let ws = PathBuf::from(session["workspace"]["path"].as_str().unwrap());
    plain_git(&ws, &["status", "--porcelain"]);
    assert!(
        fired(&env).contains(&"fired-fsmonitor".to_string()),
        "the fsmonitor trap must be live: {:?}",
        fired(&env)
    );
}

/// A repository whose `origin` would run `key`'s program when reached.
fn remote_repo(env: &Env, name: &str, url: &str, config: &[(&str, String)]) -> PathBuf {
    let repo = env.tmp(name);
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    set(&repo, "remote.origin.url", url);
    for (k, v) in config {
        set(&repo, k, v);
    }
    repo
}

#[test]
fn doctor_reaching_origin_runs_no_ssh_command_proxy_transport_or_upload_pack_of_the_repository() {
    let env = Env::with_config("");
    let upstream = git_repo(&env);
    let repos = [
        remote_repo(
            &env,
            "repo-ssh",
            "ssh://git.invalid/x.git",
            &[("core.sshCommand", trap(&env, "ssh-command", 1))],
        ),
        remote_repo(
            &env,
            "repo-proxy",
            "git://127.0.0.1:9/x.git",
            &[("core.gitProxy", trap(&env, "git-proxy", 1))],
        ),
        remote_repo(
            &env,
            "repo-ext",
            &format!("ext::{} %S", trap(&env, "ext-transport", 1)),
            &[("protocol.ext.allow", "always".into())],
        ),
        remote_repo(
            &env,
            "repo-upload-pack",
            upstream.to_str().unwrap(),
            &[("remote.origin.uploadpack", trap(&env, "upload-pack", 1))],
        ),
    ];
    // The traps are live: a plain `git ls-remote origin` runs each.
    for repo in &repos {
        plain_git(repo, &["ls-remote", "--heads", "origin"]);
    }
    assert_eq!(
        fired(&env),
        vec![
            "fired-ext-transport",
            "fired-git-proxy",
            "fired-ssh-command",
            "fired-upload-pack"
        ],
        "the traps must be live"
    );
    clear_fired(&env);

    let script = env.script("agent.sh", "echo ok");
    let agents: String = repos
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "[[agent]]\nname = \"a{i}\"\nworkspace = {{ repo = {:?} }}\n\n",
                r.display().to_string()
            )
        })
        .collect();
    env.set_config(&daemon_config(&script, &[], &[], &agents));
    let out = env.run(&["doctor", "--user", "root"]);
    let said = String::from_utf8_lossy(&out.stdout);
    for repo in &repos {
        assert!(
            said.contains(&format!("repository {}", repo.display())),
            "doctor checked each repository: {said}"
        );
    }
    assert_eq!(
        fired(&env),
        Vec::<String>::new(),
        "doctor's git ran a program the repository named: {said}"
    );
    assert!(
        said.contains(&format!("remote origin {} reachable", upstream.display())),
        "a plain local origin is still reached: {said}"
    );
}

/// One flow cycle up to the Judge in a repository whose `notes.md` has the
/// `.gitattributes` line `attributes` and whose config sets `keys` (each
/// value a trap's key; a `GIT_*` key is the daemon's environment instead,
/// `GIT_CONFIG_PARAMETERS` setting `filter.evil.clean`): the markers fired, by a plain `git diff` first (the
/// trap is live) and then by the daemon.
fn flow_diff_case(attributes: &str, keys: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let lab = crate::flows::lab("");
    let env = &lab.env;
    std::fs::write(lab.repo.join(".gitattributes"), format!("{attributes}\n")).unwrap();
    std::fs::write(lab.repo.join("notes.md"), "first\n").unwrap();
    git(&lab.repo, &["add", ".gitattributes", "notes.md"]);
    git(&lab.repo, &["commit", "-q", "-m", "attributes"]);
    let mut vars = Vec::new();
    for (key, trap_key) in keys {
        if *key == "GIT_CONFIG_PARAMETERS" {
            let t = trap(env, trap_key, 0);
            vars.push((*key, format!("'filter.evil.clean'='{t}'")));
        } else if key.starts_with("GIT_") {
            vars.push((*key, trap(env, trap_key, 0)));
        } else {
            set(&lab.repo, key, &trap(env, trap_key, 0));
        }
    }
    std::fs::write(lab.repo.join("notes.md"), "changed\n").unwrap();
    plain_git_env(&lab.repo, &["diff"], &vars);
    plain_git(&lab.repo, &["checkout", "--", "notes.md"]);
    let live = fired(env);
    clear_fired(env);

    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-medium"]);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let d = Daemon::start(env, &vars);
    let cycle = lab.start("three notes");
    d.wait_until(Duration::from_secs(60), "the Judge's session", || {
        lab.played("leo").len() == 1
    });
    drop(d);
    let after = fired(env);
    let file = std::fs::read_to_string(lab.flow_dir().join("current_cycle.md")).unwrap();
    assert!(
        after.is_empty() || !file.is_empty(),
        "cycle {cycle}: no cycle file"
    );
    if after.is_empty() {
        assert!(
            file.contains("+note 3"),
            "the cycle {cycle} file holds git's own diff: {file}"
        );
    }
    (live, after)
}

/// The Actor's diff, measured by the daemon for the Judge, runs no diff
/// driver command, textconv, `diff.external` or filter of the repository
/// (each key in a repository of its own: a driver's command hides its
/// textconv and `diff.external`), nor one the daemon's environment names.
#[test]
fn a_flows_measured_diff_runs_no_diff_driver_textconv_or_filter_of_the_repository() {
    let cases: [(&str, &[(&str, &str)]); 6] = [
        (
            "notes.md diff=evil",
            &[("diff.evil.command", "diff-command")],
        ),
        ("notes.md diff=evil", &[("diff.evil.textconv", "textconv")]),
        ("README -diff", &[("diff.external", "diff-external")]),
        (
            "README -diff",
            &[("GIT_EXTERNAL_DIFF", "env-external-diff")],
        ),
        (
            "notes.md filter=evil",
            &[("GIT_CONFIG_PARAMETERS", "env-config-clean")],
        ),
        (
            "notes.md filter=evil",
            &[
                ("filter.evil.clean", "clean"),
                ("filter.evil.smudge", "smudge"),
            ],
        ),
    ];
    let mut ran = Vec::new();
    for (attributes, keys) in cases {
        let (live, after) = flow_diff_case(attributes, keys);
        assert!(!live.is_empty(), "{keys:?}: the trap must be live");
        ran.extend(after);
    }
    assert_eq!(
        ran,
        Vec::<String>::new(),
        "the daemon's git ran programs the repository named"
    );
}
