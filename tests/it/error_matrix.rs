//! Seed 002's error matrix, the rows issue 22 found missing, through the
//! real daemon: a session the kernel's OOM killer ended (`SESSION_OOM`:
//! retried, one session fewer at once for `daemon.oom_lower_for`).
//!
//! An OOM kill cannot be caused safely on a shared test machine, and this
//! one has no cgroup v2 memory controller (sdbox says MemoryMax= is not
//! enforced in its boxes; the host's memory controller is cgroup v1). So
//! the session kills itself with SIGKILL — what the OOM killer does — and
//! the kernel's `oom_kill` count it reads from `/proc/vmstat` comes from
//! the file `AGENT_STATE_TEST_VMSTAT` names, which the session raises as
//! the kernel would. Everything else is the real daemon's: the runner's
//! reading, the rule, the retry, the limit, daemon.json and `status`. The
//! cgroup side (`memory.events`) is unit-tested as tables (`memory`,
//! `cgroup`).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, Env, daemon_config};

/// Error records of `code` (`errors --json`).
fn records(env: &Env, code: &str) -> Vec<Value> {
    let out = env.ok(&["errors", "--json"]);
    serde_json::from_str::<Vec<Value>>(&out)
        .expect("errors --json")
        .into_iter()
        .filter(|r| r["code"] == code)
        .collect()
}

/// rio's first session is SIGKILLed; if `oom` the kernel's count (the
/// vmstat file) rises first. Its second exits 0. `a` and `b` wait for the
/// file `release` in the temp dir.
fn oom_env(oom: bool) -> (Env, std::path::PathBuf) {
    let env = Env::with_config("");
    let vmstat = env.tmp("vmstat");
    std::fs::write(&vmstat, "pgfault 100\noom_kill 4\n").unwrap();
    let runs = env.tmp("rio-runs");
    let release = env.tmp("release");
    let raise = if oom {
        format!(
            "printf 'pgfault 200\\noom_kill 5\\n' > {vmstat:?}.new && mv {vmstat:?}.new {vmstat:?}"
        )
    } else {
        String::new()
    };
    let script = env.script(
        "agent.sh",
        &format!(
            r#"cat > /dev/null
case "$1" in
rio)
  echo run >> {runs:?}
  if [ "$(wc -l < {runs:?})" -eq 1 ]; then
    echo "allocating"
    {raise}
    kill -KILL $$
  fi
  echo "done" ;;
*)
  echo "$1 working"
  while [ ! -e {release:?} ]; do sleep 0.05; done ;;
esac"#,
            runs = runs.display().to_string(),
            release = release.display().to_string(),
        ),
    );
    env.set_config(&daemon_config(
        &script,
        &[("max_concurrent_sessions", "2"), ("oom_lower_for", "\"1h\"")],
        &[
            ("retry_delay", "\"300ms\""),
            ("max_backoff", "\"1h\""),
            ("memory_max", "\"64MiB\""),
        ],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"a\"\n\n[[agent]]\nname = \"b\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    (env, vmstat)
}

fn start(env: &Env, vmstat: &Path) -> Daemon {
    Daemon::start(
        env,
        &[("AGENT_STATE_TEST_VMSTAT", vmstat.to_str().unwrap())],
    )
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["agent"].as_str().or(x.as_str()).unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_oom_killed_session_is_session_oom_retried_and_lowers_the_limit_for_an_hour() {
    let (env, vmstat) = oom_env(true);
    let d = start(&env, &vmstat);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
    });
    let oom = records(&env, "SESSION_OOM");
    assert_eq!(oom.len(), 1, "{oom:?}");
    let message = oom[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("OOM killer"), "{message}");
    assert!(message.contains("from 4 to 5"), "{message}");
    assert_eq!(oom[0]["severity"], "high", "{}", oom[0]);
    assert!(records(&env, "SESSION_FAILED").is_empty());
    // One session ended in error (the OOM kill), its retry completed.
    let errors = env.events("rio", "error");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["code"], "SESSION_OOM", "{}", errors[0]);
    assert_eq!(env.events("rio", "session_end").len(), 1);
    // The limit: one session fewer, for the hour, in daemon.json.
    let lowered = d.heartbeat()["concurrency_lowered"].clone();
    assert_eq!(lowered["limit"], 1, "{lowered}");
    assert_eq!(lowered["configured"], 2, "{lowered}");
    assert!(lowered["until"].is_string(), "{lowered}");
    let status = env.ok(&["status"]);
    assert!(
        status
            .contains("concurrency: lowered to 1 session(s) at once (max_concurrent_sessions = 2)"),
        "{status}"
    );
    assert!(d.log_text().contains("the OOM killer ended a session"));
    // memory_max cannot apply here (no per-session cgroups): said.
    assert!(
        d.log_text().contains("memory_max is not applied"),
        "{}",
        d.log_text()
    );
    // And it holds: of two agents woken, one runs and one waits for a slot.
    env.ok(&["wake", "a"]);
    env.ok(&["wake", "b"]);
    d.wait_until(Duration::from_secs(20), "one runs, one waits", || {
        let hb = d.heartbeat();
        names(&hb["running"]).len() == 1 && names(&hb["waiting"]).len() == 1
    });
    std::fs::write(env.tmp("release"), "").unwrap();
    d.wait_until(
        Duration::from_secs(30),
        "both ran, one after the other",
        || env.events("a", "session_end").len() == 1 && env.events("b", "session_end").len() == 1,
    );
}

#[test]
fn a_sigkill_without_the_kernel_s_oom_count_rising_is_no_oom() {
    let (env, vmstat) = oom_env(false);
    let d = start(&env, &vmstat);
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "rio's failure recorded", || {
        !records(&env, "SESSION_FAILED").is_empty()
    });
    assert!(records(&env, "SESSION_OOM").is_empty());
    let failed = &records(&env, "SESSION_FAILED")[0];
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("SIGKILL"),
        "{failed}"
    );
    assert!(d.heartbeat()["concurrency_lowered"].is_null());
    assert!(!env.ok(&["status"]).contains("concurrency: lowered"));
}

// ---- invalid_commits ---------------------------------------------------------

/// rio works in a worktree of a real repository. Each run records the
/// commit it started on (`start-N`), then does what line N of `plan` says:
/// `orphan` (HEAD reset to a commit of unrelated history, a rewrite below
/// the base), `detach` (a commit on a detached HEAD), anything else (a good
/// commit on its branch).
fn workspace_env(plan: &[&str]) -> (Env, std::path::PathBuf) {
    let env = Env::with_config("");
    let repo = crate::support::git_repo(&env);
    let d = env.dir.path().display().to_string();
    std::fs::write(env.tmp("plan"), plan.join("\n") + "\n").unwrap();
    let script = env.script(
        "agent.sh",
        &format!(
            r#"cat > /dev/null
D={d:?}
echo run >> "$D/runs"
N=$(wc -l < "$D/runs")
git rev-parse HEAD > "$D/start-$N"
ls > "$D/files-$N"
G="git -c user.name=a -c user.email=a@x -c commit.gpgsign=false"
echo "run $N" > "work-$N.txt"
git add "work-$N.txt" && $G commit -q -m "run $N"
case "$(sed -n "${{N}}p" "$D/plan")" in
  orphan) T=$(git mktree < /dev/null); C=$(echo unrelated | $G commit-tree "$T"); git reset -q --hard "$C" ;;
  detach) git checkout -q --detach && echo x > x.txt && git add x.txt && $G commit -q -m detached ;;
esac
echo "run $N done""#
        ),
    );
    let ws = format!(
        "{{ repo = {:?}, base = \"main\" }}",
        repo.display().to_string()
    );
    env.set_config(&daemon_config(
        &script,
        &[],
        &[
            ("retry_delay", "\"300ms\""),
            ("max_backoff", "\"1h\""),
            ("workspace", &ws),
        ],
        "[[agent]]\nname = \"rio\"\n\n[[agent]]\nname = \"marcus\"\nkind = \"human\"\n",
    ));
    (env, repo)
}

fn branches(repo: &Path) -> Vec<String> {
    crate::support::git(repo, &["branch", "--format=%(refname:short)"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn invalid_commits_reset_the_workspace_to_the_base_and_retry_once() {
    let (env, repo) = workspace_env(&["orphan", "good"]);
    let base = crate::support::git(&repo, &["rev-parse", "main"]);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(Duration::from_secs(30), "the retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
    });
    let recs = records(&env, "WORKSPACE_INVALID_COMMITS");
    assert_eq!(recs.len(), 1, "{recs:?}");
    let message = recs[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the base commit is not in HEAD's history"),
        "{message}"
    );
    assert!(message.contains("reset to the base"), "{message}");
    assert_ne!(recs[0]["escalated"], true, "{}", recs[0]);
    // The retry started from the base, without the first run's work.
    let read = |f: &str| std::fs::read_to_string(env.tmp(f)).unwrap_or_default();
    assert_eq!(read("start-2").trim(), base);
    assert!(
        !read("files-2").contains("work-1.txt"),
        "{}",
        read("files-2")
    );
    // Nothing lost: the first run's branch is set aside, not deleted.
    let all = branches(&repo);
    let aside: Vec<&String> = all.iter().filter(|b| b.contains("-invalid")).collect();
    assert_eq!(aside.len(), 1, "{all:?}");
    assert!(message.contains(aside[0].as_str()), "{message} {all:?}");
    let kept = crate::support::git(&repo, &["log", "--format=%s", aside[0]]);
    assert_eq!(kept, "unrelated", "the rewritten head is kept: {kept}");
    // The retry's good commit is on its own branch, kept.
    let session = crate::support::read_json(&env.path("rio", "session.json"));
    assert_eq!(session["workspace"]["state"], "kept", "{session:#}");
    assert_eq!(session["workspace"]["commits_ahead"], 1, "{session:#}");
}

#[test]
fn invalid_commits_twice_in_a_row_are_escalated() {
    let (env, repo) = workspace_env(&["detach", "detach"]);
    let d = env.daemon();
    env.ok(&["wake", "rio"]);
    d.wait_until(
        Duration::from_secs(30),
        "the second invalid run escalated",
        || {
            records(&env, "WORKSPACE_INVALID_COMMITS")
                .iter()
                .any(|r| r["escalated"] == true)
        },
    );
    let recs = records(&env, "WORKSPACE_INVALID_COMMITS");
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert!(
        recs[1]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("HEAD is detached"),
        "{}",
        recs[1]
    );
    // Each run's branch commit and its detached commit set aside: 4 branches.
    let all = branches(&repo);
    assert_eq!(
        all.iter().filter(|b| b.contains("-invalid")).count(),
        4,
        "{all:?}"
    );
    assert_eq!(env.events("rio", "session_end").len(), 0);
}
