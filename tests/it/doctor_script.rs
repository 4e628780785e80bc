//! `doctor` checks what the shipped session script needs beyond its own
//! file (issue 23): the `claude` it calls (CLAUDE=, else on the service's
//! PATH) and the work tree it `cd`s into (REPO_DIR). (The metrics
//! textfile's directory under the unit's sandbox needs the unit: the
//! package test checks it under a real systemd.)

use std::os::unix::fs::PermissionsExt;

use crate::sdbox::repo_file;
use crate::support::*;

fn doctor(env: &Env) -> String {
    let out = env.run(&["doctor", "--user", "root"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The line of `doctor`'s report that starts with `word` for `what`, and
/// the fix below it.
fn finding(said: &str, word: &str, what: &str) -> Option<String> {
    let mut lines = said.lines();
    while let Some(l) = lines.next() {
        if l.starts_with(&format!("{word:<6}{what}: ")) {
            let fix = lines.next().filter(|f| f.trim_start().starts_with("fix:"));
            return Some(format!("{l}\n{}", fix.unwrap_or_default()));
        }
    }
    None
}

#[test]
fn doctor_checks_the_scripts_claude_and_work_tree() {
    let env = Env::with_config("");
    let script = env.tmp("research-session.sh");
    std::fs::copy(repo_file("ops/research-session.example.sh"), &script).unwrap();
    let claude = env.tmp("bin/claude");
    let work = env.tmp("work/vida");
    let config = |textfile: &str| {
        format!(
            "[[agent]]\nname = \"vida\"\ncommand = [\"/usr/bin/env\", \"CLAUDE={}\", \"REPO_DIR={}\", {:?}, \"{{agent}}\"]\n\n[metrics]\ntextfile = {textfile:?}\n",
            claude.display(),
            work.display(),
            script.display().to_string(),
        )
    };
    env.set_config(&config(
        "/var/lib/prometheus/node-exporter/agent-state.prom",
    ));

    // Neither the CLI nor the work tree is there.
    let said = doctor(&env);
    let f = finding(&said, "FAIL", "vida claude").unwrap_or_else(|| panic!("{said}"));
    assert!(
        f.contains(&format!(
            "{} (the script's CLAUDE) does not exist",
            claude.display()
        )) && f.contains("fix:"),
        "{f}"
    );
    let f = finding(&said, "FAIL", "vida work tree").unwrap_or_else(|| panic!("{said}"));
    assert!(
        f.contains(&format!(
            "{} (the script's REPO_DIR) does not exist",
            work.display()
        )) && f.contains("git -C"),
        "{f}"
    );
    let f = finding(&said, "ok", "vida command").unwrap_or_else(|| panic!("{said}"));
    assert!(
        f.contains(&script.display().to_string()),
        "the script, not env: {f}"
    );

    // A directory that is no git work tree.
    std::fs::create_dir_all(&work).unwrap();
    let said = doctor(&env);
    let f = finding(&said, "FAIL", "vida work tree").unwrap_or_else(|| panic!("{said}"));
    assert!(f.contains("is not a git work tree"), "{f}");

    // Both in place: ok.
    std::fs::create_dir_all(claude.parent().unwrap()).unwrap();
    std::fs::write(&claude, "#!/bin/sh\necho claude\n").unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    let git = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(&work)
        .status()
        .unwrap();
    assert!(git.success());
    let said = doctor(&env);
    assert!(
        said.contains(&format!("ok    claude: {}", claude.display())),
        "{said}"
    );
    assert!(
        said.contains(&format!("ok    vida work tree: {}", work.display())),
        "{said}"
    );
}

/// `doctor` and `workspaces` run as root over a repository the service user
/// owns (here `nobody`): git's "dubious ownership" must not make it "not a
/// git repository", and doctor says whom the checks ran as. Root only.
#[test]
fn doctor_and_workspaces_as_root_read_a_repository_another_user_owns() {
    if !nix::unistd::geteuid().is_root()
        || std::env::var("AGENT_STATE_ROOT_TESTS").as_deref() != Ok("1")
    {
        eprintln!("SKIPPED: chowns a repository to nobody: root with AGENT_STATE_ROOT_TESTS=1");
        return;
    }
    let env = Env::with_config("");
    let repo = env.tmp("repo");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    std::fs::create_dir(&repo).unwrap();
    git(&["init", "-q", "-b", "main"]);
    git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@x",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "init",
    ]);
    let script = env.script("agent.sh", "echo ok");
    env.set_config(&daemon_config(
        &script,
        &[],
        &[],
        &format!(
            "[[agent]]\nname = \"rio\"\nworkspace = {{ repo = {:?} }}\n",
            repo.display().to_string()
        ),
    ));
    env.ok(&["bootstrap"]);
    let chown = std::process::Command::new("chown")
        .args(["-R", "nobody"])
        .arg(&repo)
        .status()
        .unwrap();
    assert!(chown.success());

    let said = doctor(&env);
    let what = format!("repository {}", repo.display());
    assert!(
        !said.contains("not a git repository") && !said.contains("dubious"),
        "{said}"
    );
    assert!(
        said.lines()
            .any(|l| l.contains(&what) && l.contains("checked as root with HOME=")),
        "doctor says whom the git checks ran as:\n{said}"
    );
    let out = env.run(&["workspaces"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "workspaces as root: {out:?}");
    assert!(!err.contains("dubious"), "{err}");
}
