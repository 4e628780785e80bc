//! Workspaces under the daemon (issue 12): each session of an agent with a
//! `workspace` runs in its own git worktree of a real repository made by
//! the test; what is kept, removed and pruned, and a repository that is not
//! one.

use crate::support::*;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The fake agent: records where it ran and what it saw, then does what
/// `ACTION-{agent}` in the temp dir says: `dirty` (an uncommitted file),
/// `commit` (a commit), `wait` (until `go-{agent}` exists), nothing else.
fn agent(env: &Env) -> PathBuf {
    let d = env.dir.path().display().to_string();
    env.script(
        "agent.sh",
        &format!(
            r#"D={d:?}
A="$AGENT_STATE_AGENT"
{{ echo "cwd=$(pwd -P)"; echo "ws=$AGENT_STATE_WORKSPACE"; echo "arg=$2";
   echo "branch=$(git branch --show-current)"; ls -A | grep -v '^.git$' | sed 's/^/file=/'; }} > "$D/.seen-$A"
mv "$D/.seen-$A" "$D/seen-$A-$AGENT_STATE_SESSION_ID"
echo "mine: $A" > "own-$A.txt"
case "$(cat "$D/ACTION-$A" 2>/dev/null)" in
  dirty) ;;
  commit) git add "own-$A.txt" && git -c user.name=a -c user.email=a@x commit -q -m "$A's work" ;;
  wait) git add "own-$A.txt"; while [ ! -e "$D/go-$A" ]; do sleep 0.05; done ;;
  *) rm -f "own-$A.txt" ;;
esac
echo "$A: done"
"#
        ),
    )
}

fn setup(workspace: &str, agents: &str) -> (Env, PathBuf) {
    let env = Env::with_config("");
    let repo = git_repo(&env);
    let script = agent(&env);
    let ws = workspace.replace("REPO", &repo.display().to_string());
    let body = daemon_config(
        &script,
        &[],
        &[
            (
                "command",
                &format!(
                    "[{:?}, \"{{agent}}\", \"{{workspace}}\"]",
                    script.display().to_string()
                ),
            ),
            ("workspace", &ws),
        ],
        agents,
    );
    env.set_config(&format!("{body}\n[health]\ninterval = \"200ms\"\n"));
    (env, repo)
}

fn seen(env: &Env, agent: &str, session: &str) -> Vec<String> {
    std::fs::read_to_string(env.tmp(&format!("seen-{agent}-{session}")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn session(env: &Env, agent: &str) -> Value {
    read_json(&env.path(agent, "session.json"))
}

fn ended(env: &Env, agent: &str) -> bool {
    let p = env.path(agent, "session.json");
    p.exists() && read_json(&p)["status"] == "completed" && read_json(&p)["workspace"].is_object()
}

const TWO: &str = "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"clay\"\n";

#[test]
fn workspace_sessions_of_two_agents_run_in_their_own_worktrees_at_once() {
    let (env, repo) = setup(r#"{ repo = "REPO", base = "main" }"#, TWO);
    for a in ["rio", "clay"] {
        std::fs::write(env.tmp(&format!("ACTION-{a}")), "wait").unwrap();
    }
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    env.ok(&["wake", "clay"]);
    d.wait_until(Duration::from_secs(15), "both sessions run", || {
        std::fs::read_dir(env.dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("seen-")
            })
            .count()
            == 2
    });
    // Both are running at once, each in its own worktree, seeing only the
    // base and its own file.
    let rio_sid = session(&env, "rio")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let clay_sid = session(&env, "clay")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    for (a, sid, other) in [("rio", &rio_sid, "clay"), ("clay", &clay_sid, "rio")] {
        let s = seen(&env, a, sid);
        let ws = env.path(a, &format!("workspaces/{sid}"));
        let ws_real = ws.canonicalize().unwrap();
        assert!(
            s.contains(&format!("cwd={}", ws_real.display())),
            "{a}: {s:?}"
        );
        assert!(s.contains(&format!("ws={}", ws.display())), "{a}: {s:?}");
        assert!(
            s.contains(&format!("arg={}", ws.display())),
            "{{workspace}} is filled: {s:?}"
        );
        assert!(
            s.iter()
                .any(|l| l.starts_with(&format!("branch={a}/research-"))),
            "{s:?}"
        );
        assert!(s.contains(&"file=README".to_string()), "{s:?}");
        assert!(
            !s.iter().any(|l| l.contains(other)),
            "{a} saw {other}'s work: {s:?}"
        );
        assert!(!ws.join(format!("own-{other}.txt")).exists());
    }
    assert!(
        !repo.join("own-rio.txt").exists(),
        "the main work tree is untouched"
    );
    for a in ["rio", "clay"] {
        std::fs::write(env.tmp(&format!("go-{a}")), "").unwrap();
    }
    d.wait_until(
        Duration::from_secs(15),
        "both ended with their workspace recorded",
        || ended(&env, "rio") && ended(&env, "clay"),
    );
    let w = &session(&env, "rio")["workspace"];
    assert_eq!(w["state"], "kept", "{w}");
    assert_eq!(w["dirty"], true, "an added, uncommitted file: {w}");
    assert_eq!(w["base_commit"], git(&repo, &["rev-parse", "main"]));
    assert!(w["head_commit"].as_str().unwrap().len() == 40, "{w}");
    assert!(w["branch"].as_str().unwrap().starts_with("rio/research-"));
}

#[test]
fn workspace_with_work_is_kept_and_listed_and_a_clean_one_removed() {
    let (env, repo) = setup(r#"{ repo = "REPO" }"#, TWO);
    std::fs::write(env.tmp("ACTION-rio"), "commit").unwrap();
    std::fs::write(env.tmp("ACTION-clay"), "nothing").unwrap();
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    env.ok(&["wake", "clay"]);
    d.wait_until(Duration::from_secs(20), "both ended", || {
        ended(&env, "rio") && ended(&env, "clay")
    });
    let rio = session(&env, "rio");
    let w = &rio["workspace"];
    assert_eq!(w["state"], "kept", "{w}");
    assert_eq!(w["commits_ahead"], 1, "{w}");
    assert_eq!(w["dirty"], false, "{w}");
    let path = PathBuf::from(w["path"].as_str().unwrap());
    assert!(path.join("own-rio.txt").exists(), "kept with its work");
    let branch = w["branch"].as_str().unwrap();
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", branch]),
        "rio's work"
    );
    let clay = session(&env, "clay");
    assert_eq!(
        clay["workspace"]["state"], "removed",
        "{}",
        clay["workspace"]
    );
    let clay_path = PathBuf::from(clay["workspace"]["path"].as_str().unwrap());
    assert!(!clay_path.exists(), "a clean worktree is removed");
    let clay_branch = clay["workspace"]["branch"].as_str().unwrap();
    assert!(
        !git(&repo, &["branch", "--list", clay_branch]).contains(clay_branch),
        "and its branch"
    );
    // Listed: the kept one, not the removed one.
    let text = env.ok(&["workspaces"]);
    assert!(
        text.contains(branch) && text.contains(&path.display().to_string()),
        "{text}"
    );
    assert!(!text.contains(clay_branch), "{text}");
    let listed: Value = serde_json::from_str(&env.ok(&["workspaces", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["agent"], "rio");
    assert_eq!(listed[0]["commits_ahead"], 1);
    // status says so too.
    let status = env.ok(&["status"]);
    assert!(
        status.contains("rio: 1 worktree(s) kept or in use"),
        "{status}"
    );
    assert!(!status.contains("clay: 1 worktree"), "{status}");
    drop(d);
}

#[test]
fn workspace_orphans_are_pruned_by_the_monitor() {
    let (env, repo) = setup(r#"{ repo = "REPO" }"#, "[[agent]]\nname = \"rio\"\n");
    env.ok(&["bootstrap"]);
    // A clean worktree left by a session that is gone (a crash).
    let orphan = env.path("rio", "workspaces/20260101-000000");
    git(
        &repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "rio/research-old",
            &orphan.display().to_string(),
            "main",
        ],
    );
    assert!(orphan.exists());
    let d = env.daemon();
    // Logged once the prune is done: `git worktree remove` removes the
    // directory before git's own record of it, so the directory gone
    // proves nothing about git.
    d.wait_until(Duration::from_secs(10), "the prune is logged", || {
        d.log_text().contains("workspace pruned: rio: removed")
    });
    assert!(!orphan.exists(), "the orphan is pruned");
    assert!(
        !git(&repo, &["worktree", "list"]).contains("20260101-000000"),
        "git forgets it too"
    );
}

#[test]
fn workspace_of_a_plain_directory_never_starts_the_session() {
    let env = Env::with_config("");
    let plain = env.tmp("not-a-repo");
    std::fs::create_dir(&plain).unwrap();
    let script = agent(&env);
    let body = daemon_config(
        &script,
        &[],
        &[(
            "workspace",
            &format!("{{ repo = {:?} }}", plain.display().to_string()),
        )],
        "[[agent]]\nname = \"rio\"\n",
    );
    env.set_config(&body);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(10), "the session failed", || {
        let p = env.path("rio", "session.json");
        p.exists() && read_json(&p)["status"] == "error"
    });
    let s = session(&env, "rio");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("WORKSPACE_NOT_A_REPO") && reason.contains("not a git repository"),
        "{reason}"
    );
    // It never ran.
    assert!(
        !std::fs::read_dir(env.dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("seen-")),
        "the command ran without its workspace"
    );
    // Recorded beside session.json, not necessarily before it.
    d.wait_until(Duration::from_secs(10), "the error is recorded", || {
        std::fs::read_to_string(env.root.join(".daemon/errors.jsonl"))
            .unwrap_or_default()
            .contains("WORKSPACE_NOT_A_REPO")
    });
    // User action: disabled, not retried. report.json's verdict is the
    // final state (the error and session.json come before it).
    d.wait_until(
        Duration::from_secs(10),
        "report.json says rio is disabled",
        || read_json(&env.path("rio", "report.json"))["error"]["state"] == "disabled",
    );
    d.wait_until(Duration::from_secs(10), "the agent is disabled", || {
        d.heartbeat()["failing"]["rio"]
            .as_str()
            .is_some_and(|f| f.starts_with("disabled"))
    });
}

#[test]
fn workspace_config_errors_name_the_field_and_the_fix() {
    let env = Env::with_config(
        "[[agent]]\nname = \"rio\"\nworkspace = { repo = \"relative/repo\", branch = \"a..b\" }\n",
    );
    let out = env.run(&["check"]);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("workspace.repo") && text.contains("absolute path"),
        "{text}"
    );
    assert!(text.contains("workspace.branch"), "{text}");
    let env = Env::with_config("[[agent]]\nname = \"rio\"\nworkspace = { base = \"main\" }\n");
    let out = env.run(&["check"]);
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("workspace.repo") && text.contains("is missing"),
        "{text}"
    );
}
