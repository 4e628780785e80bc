//! Seed 002's error matrix, the rows issue 22 found missing, through the
//! real daemon: a session the kernel's OOM killer ended (`SESSION_OOM`:
//! retried, one session fewer at once for `daemon.oom_lower_for`).
//!
//! A real OOM kill is in `oom_real` (root, a cgroup v1 memory cgroup);
//! these run anywhere. This host has no cgroup v2 memory controller (sdbox says MemoryMax= is not
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
pub(crate) fn oom_env(oom: bool) -> (Env, std::path::PathBuf) {
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

pub(crate) fn start(env: &Env, vmstat: &Path) -> Daemon {
    Daemon::start(
        env,
        &[("AGENT_STATE_TEST_VMSTAT", vmstat.to_str().unwrap())],
    )
}

pub(crate) fn names(v: &Value) -> Vec<String> {
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
        d.log_text()
            .contains("memory_max is not applied (said once)"),
        "{}",
        d.log_text()
    );
    // `check` says where memory_max can apply (this host or not).
    let check = env.run(&["check"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        said.contains("rio, a, b: memory_max applies where")
            || said.contains("rio, a, b: memory_max cannot apply on this host"),
        "{said}"
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
    // session.json's `workspace` is written after the journal's end.
    d.wait_until(Duration::from_secs(30), "the retry completed", || {
        env.events("rio", "session_end")
            .iter()
            .any(|e| e["outcome"] == "completed")
            && crate::support::read_json(&env.path("rio", "session.json"))["workspace"]["state"]
                == "kept"
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
    // The reset is no failure of the workspace's own.
    assert!(records(&env, "WORKSPACE_FAILED").is_empty());
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

// ---- merge and publish errors ------------------------------------------------

/// A flow whose approved cycles agent-state publishes to `origin` (a bare
/// clone of the lab's repository) `main`; `on_approve` leaves a file when
/// it runs. `hook`: the remote's pre-receive hook, if any.
fn publishing_lab(hook: Option<&str>) -> (crate::flows::Lab, std::path::PathBuf) {
    let probe = "on_approve = [\"sh\", \"-c\", \"touch ../../../on-approve-ran\"]";
    let lab = crate::flows::lab(&format!(
        "publish = {{ into = \"main\", remote = \"origin\" }}\n{probe}"
    ));
    // notes.md in the base, so the Actor's lines and the remote's meet.
    std::fs::write(lab.repo.join("notes.md"), "# Notes\n").unwrap();
    crate::support::git(&lab.repo, &["add", "notes.md"]);
    crate::support::git(&lab.repo, &["commit", "-q", "-m", "notes"]);
    let remote = lab.env.tmp("remote.git");
    crate::support::git(
        lab.env.dir.path(),
        &["clone", "-q", "--bare", "repo", "remote.git"],
    );
    crate::support::git(
        &lab.repo,
        &["remote", "add", "origin", remote.to_str().unwrap()],
    );
    if let Some(body) = hook {
        use std::os::unix::fs::PermissionsExt;
        let path = remote.join("hooks/pre-receive");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-low"]);
    (lab, remote)
}

fn published(lab: &crate::flows::Lab) -> Option<Value> {
    lab.journal()
        .into_iter()
        .find(|e| e["event"] == "published")
}

const FLOW_WAIT: Duration = Duration::from_secs(90);

#[test]
fn an_approved_cycle_is_published_then_on_approve_runs() {
    let (lab, remote) = publishing_lab(None);
    let d = lab.env.daemon();
    lab.start("Add three notes");
    d.wait_until(FLOW_WAIT, "the cycle is published", || {
        published(&lab).is_some() && lab.journal().iter().any(|e| e["event"] == "on_approve")
    });
    let p = published(&lab).unwrap();
    assert_eq!(p["ok"], true, "{p}");
    let notes = crate::support::git(&remote, &["show", "main:notes.md"]);
    assert!(notes.contains("note 3"), "{notes}");
    assert!(records(&lab.env, "PUBLISH_FAILED").is_empty());
}

#[test]
fn a_protected_branch_refuses_the_push_escalated_and_on_approve_does_not_run() {
    let (lab, remote) = publishing_lab(Some("echo 'main is protected' >&2\nexit 1"));
    let before = crate::support::git(&remote, &["rev-parse", "main"]);
    let d = lab.env.daemon();
    lab.start("Add three notes");
    d.wait_until(FLOW_WAIT, "the refusal is raised", || {
        !records(&lab.env, "MERGE_PROTECTED_BRANCH").is_empty()
    });
    let rec = &records(&lab.env, "MERGE_PROTECTED_BRANCH")[0];
    let message = rec["message"].as_str().unwrap_or_default();
    assert!(message.contains("main is protected"), "{rec}");
    assert_eq!(rec["escalated"], true, "{rec}");
    assert_eq!(rec["context"]["agent"], "rio", "{rec}");
    assert_eq!(crate::support::git(&remote, &["rev-parse", "main"]), before);
    let p = published(&lab).expect("journaled");
    assert_eq!(p["code"], "MERGE_PROTECTED_BRANCH", "{p}");
    assert!(!lab.journal().iter().any(|e| e["event"] == "on_approve"));
    assert!(!lab.env.tmp("on-approve-ran").exists());
}

#[test]
fn a_conflict_with_the_remote_is_classified_in_the_record_and_escalated() {
    let (lab, remote) = publishing_lab(None);
    // Someone else adds other lines at the end of notes.md on the remote.
    let other = lab.env.tmp("other");
    crate::support::git(lab.env.dir.path(), &["clone", "-q", "remote.git", "other"]);
    std::fs::write(other.join("notes.md"), "# Notes\ntheir note\n").unwrap();
    crate::support::git(&other, &["commit", "-q", "-am", "theirs"]);
    crate::support::git(&other, &["push", "-q", "origin", "main"]);
    let before = crate::support::git(&remote, &["rev-parse", "main"]);
    let d = lab.env.daemon();
    lab.start("Add three notes");
    d.wait_until(FLOW_WAIT, "the conflict is raised", || {
        !records(&lab.env, "MERGE_CONFLICT").is_empty()
    });
    let rec = &records(&lab.env, "MERGE_CONFLICT")[0];
    let details = rec["details"].as_str().unwrap_or_default();
    assert!(
        details.starts_with("conflict level MEDIUM: 1 file(s) (notes.md)"),
        "{rec}"
    );
    assert_eq!(rec["escalated"], true, "{rec}");
    let p = published(&lab).expect("journaled");
    assert_eq!(p["level"], "MEDIUM", "{p}");
    assert_eq!(p["files"], serde_json::json!(["notes.md"]), "{p}");
    assert_eq!(crate::support::git(&remote, &["rev-parse", "main"]), before);
}

// ---- memory_max under a real systemd (sdbox) -----------------------------------

/// Allocates 200 MiB in a child (python3, in sdbox's base), past a 64 MiB
/// memory_max.
const MEMORY_HOG: &str = r#"#!/bin/sh
cat > /dev/null
echo "allocating 200 MiB"
python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'
echo "python3 exited with $?"
exit 0
"#;

/// Under systemd with `Delegate=yes`: where the box's cgroup v2 has the
/// memory controller, a session past `memory_max` is OOM-killed in its
/// cgroup and recorded as SESSION_OOM (read from memory.events); where it
/// has not (sdbox on a host whose memory controller is cgroup v1, as the
/// machine this was written on), the daemon says at the session that
/// memory_max is not applied and why, and the session is no OOM. Gated by
/// AGENT_STATE_SYSTEMD_TESTS=1.
#[test]
fn under_systemd_memory_max_limits_the_session_cgroup_or_says_why_not() {
    use crate::sdbox::{CONFIG, SdBox, sdbox_tool};
    let Some(tool) = sdbox_tool() else {
        return;
    };
    let sdbox = SdBox::up(tool);
    sdbox.install_package_files();
    sdbox.write("/opt/teleo-eval/memory-hog.sh", MEMORY_HOG, 0o755);
    sdbox.write(
        CONFIG,
        r#"state_root = "/opt/teleo-eval/agent-state"
group = "teleo"

[daemon]
max_concurrent_sessions = 2

[defaults]
command = ["/opt/teleo-eval/memory-hog.sh", "{agent}"]
timeout = "2m"
kill_grace = "5s"
wake_on_inbox = "never"
memory_max = "64MiB"
retry_delay = "1h"

[[agent]]
name = "rio"

[[agent]]
name = "marcus"
kind = "human"
"#,
        0o644,
    );
    sdbox.ok(&["systemd-sysusers"]);
    sdbox.ok(&["systemd-tmpfiles", "--create", "agent-state.conf"]);
    sdbox.ok(&["systemctl", "daemon-reload"]);
    sdbox.ok(&["systemctl", "start", "agent-state.service"]);
    let controllers = sdbox.ok(&[
        "sh",
        "-c",
        "cat /sys/fs/cgroup/system.slice/agent-state.service/cgroup.controllers /sys/fs/cgroup/unified/system.slice/agent-state.service/cgroup.controllers 2>/dev/null; true",
    ]);
    let enforced = controllers.split_whitespace().any(|c| c == "memory");
    eprintln!("the unit's cgroup controllers: {controllers:?}; memory enforced: {enforced}");
    let out = sdbox.agent_state(&["wake", "rio"]);
    assert!(out.status.success(), "{}", crate::sdbox::describe(&out));
    let errors = "/opt/teleo-eval/agent-state/.daemon/errors.jsonl";
    let session = "/opt/teleo-eval/agent-state/rio/session.json";
    sdbox.wait_until(Duration::from_secs(60), "rio's session ended", || {
        let s = sdbox.json(session);
        s["status"].is_string() && s["status"] != "running"
    });
    let journal = sdbox.journal(&[]);
    let records = sdbox.read(errors);
    if enforced {
        assert!(records.contains("SESSION_OOM"), "{records}\n{journal}");
        assert!(records.contains("memory.events"), "{records}");
    } else {
        assert!(
            journal.contains("memory_max is not applied (said once)")
                && journal.contains("memory controller"),
            "{journal}"
        );
        assert!(!records.contains("SESSION_OOM"), "{records}");
    }
}

#[test]
fn flow_approve_by_a_person_says_and_records_the_refused_push() {
    let (lab, remote) = publishing_lab(Some("echo 'main is protected' >&2\nexit 1"));
    lab.script("leo", &["* pass-medium"]);
    let before = crate::support::git(&remote, &["rev-parse", "main"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Medium risk");
    d.wait_until(FLOW_WAIT, "the cycle waits for approval", || {
        lab.current()["status"] == "awaiting_approval"
    });
    let out = lab.env.run(&["flow", "approve", &cycle]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("MERGE_PROTECTED_BRANCH: flow notes cycle")
            && said.contains("main is protected"),
        "{said}"
    );
    let recs = records(&lab.env, "MERGE_PROTECTED_BRANCH");
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(crate::support::git(&remote, &["rev-parse", "main"]), before);
    assert!(!lab.journal().iter().any(|e| e["event"] == "on_approve"));
}
