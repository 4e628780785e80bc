//! One branch per flow cycle, and the roles' limits (issue 22, seed 004)
//! through the real daemon: fake agents (a shell script) play the Planner
//! (theseus), the Actor (rio, with a workspace in a real git repository)
//! and the Judge (leo), ending their answers with seed 004's Context
//! Summary and SIGNAL BLOCK; marcus is the human.

use crate::flows::archive_name;
use crate::support::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(90);

/// The role player: its role, cycle and step from the last hand-off in its
/// prompt, its behaviour for the step from `SCRIPT-{agent}` (`STEP WHAT` or
/// `* WHAT`). Before acting it notes `STEP DIR LINES` in `seen-{agent}`:
/// the directory it works in and the lines notes.md has there. `plan`;
/// `longplan` (a 60-line plan); `small` (3 lines in notes.md, named after
/// the step); `fail-once` (the first time a line in notes.md and exit 3,
/// then `small`); `docs` (3 lines in docs/faq.md); `pass-low`, `pass-medium`,
/// `insufficient`; `write-pass` (a Judge that writes judge.txt, then
/// passes at low risk).
fn player(env: &Env) -> PathBuf {
    let d = env.dir.path().display().to_string();
    env.script(
        "branch-player.sh",
        &format!(
            r###"D={d:?}
A="$AGENT_STATE_AGENT"
P=$(grep -o 'You are the [A-Za-z]* of flow [a-z0-9_-]*, cycle [0-9-]*, step [0-9]*' "$AGENT_STATE_PROMPT_FILE" | tail -n 1)
ROLE=$(echo "$P" | sed 's/You are the \([A-Za-z]*\) .*/\1/')
CYCLE=$(echo "$P" | sed 's/.*cycle \([0-9-]*\), step.*/\1/')
STEP=$(echo "$P" | sed 's/.*step \([0-9]*\)$/\1/')
B=$(sed -n "s/^$STEP //p" "$D/SCRIPT-$A" | head -n 1)
[ -n "$B" ] || B=$(sed -n 's/^\* //p' "$D/SCRIPT-$A" | head -n 1)
N=0; [ -f notes.md ] && N=$(wc -l < notes.md | tr -d ' ')
echo "$STEP $(pwd) $N" >> "$D/seen-$A"
echo "$STEP $B" >> "$D/played-$A"
RISK=low; NEXT=Actor; SV=$STEP; BLOCKERS=None; STATE="did $B"
case "$B" in
  plan) echo "1. Add three notes." ;;
  longplan) seq 1 60 | sed 's/^/- plan line /' ;;
  small) seq 1 3 | sed "s/^/note $STEP./" >> notes.md; NEXT=Judge ;;
  fail-once)
    if [ ! -f "$D/failed-$STEP" ]; then touch "$D/failed-$STEP"; echo "half done" >> notes.md; exit 3; fi
    seq 1 3 | sed "s/^/note $STEP./" >> notes.md; NEXT=Judge ;;
  docs) mkdir -p docs; seq 1 3 | sed "s/^/faq $STEP./" >> docs/faq.md; NEXT=Judge ;;
  pass-*) SV=PASS; NEXT=Human; RISK=${{B#pass-}} ;;
  write-pass) echo "a fix" > judge.txt; SV=PASS; NEXT=Human ;;
  insufficient) SV=INSUFFICIENT; NEXT=Planner; BLOCKERS="the notes need more" ;;
esac
echo
echo "## Context Summary"
echo "**Goal**: notes"
echo "**Current State**: $STATE"
echo "**Next Agent**: $NEXT"
echo "**Confidence**: 4"
echo "**Risk Level**: $RISK"
echo "**Blockers**: $BLOCKERS"
echo
echo "Agent=$ROLE | Cycle=$CYCLE | Step=$SV | Confidence=4 | Risk=$RISK | Next=$NEXT"
"###
        ),
    )
}

struct Lab {
    env: Env,
    repo: PathBuf,
}

/// The roles and marcus. `judge_workspace`: leo gets a workspace in the
/// Actor's repository; `flow`: extra settings of the flow.
fn lab(judge_workspace: bool, flow: &str) -> Lab {
    let env = Env::with_config("");
    let repo = git_repo(&env);
    let script = player(&env);
    let repo_text = repo.display().to_string();
    let leo = if judge_workspace {
        format!("workspace = {{ repo = {repo_text:?}, base = \"main\" }}")
    } else {
        String::new()
    };
    let agents = format!(
        r#"
[[agent]]
name = "theseus"

[[agent]]
name = "rio"
workspace = {{ repo = {repo_text:?}, base = "main" }}

[[agent]]
name = "leo"
{leo}

[[agent]]
name = "marcus"
kind = "human"

[[flow]]
name = "notes"
planner = "theseus"
actor = "rio"
judge = "leo"
{flow}
"#
    );
    let body = daemon_config(
        &script,
        &[],
        &[
            ("wake_on_inbox", "\"high\""),
            ("inbox_debounce", "\"50ms\""),
            ("retry_delay", "\"100ms\""),
        ],
        &agents,
    );
    env.set_config(&body);
    Lab { env, repo }
}

impl Lab {
    fn script(&self, agent: &str, lines: &[&str]) {
        std::fs::write(
            self.env.tmp(&format!("SCRIPT-{agent}")),
            lines.join("\n") + "\n",
        )
        .unwrap();
    }

    fn lines_of(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.env.tmp(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `STEP WHAT` of each session the agent played.
    fn played(&self, agent: &str) -> Vec<String> {
        self.lines_of(&format!("played-{agent}"))
    }

    /// `(step, directory, lines of notes.md)` as each session found them.
    fn seen(&self, agent: &str) -> Vec<(u32, String, u32)> {
        self.lines_of(&format!("seen-{agent}"))
            .iter()
            .map(|l| {
                let mut w = l.split(' ');
                let step = w.next().unwrap().parse().unwrap();
                let dir = w.next().unwrap().to_string();
                (step, dir, w.next().unwrap().parse().unwrap())
            })
            .collect()
    }

    fn start(&self, goal: &str) -> String {
        self.env
            .ok(&["flow", "start", "notes", "--goal", goal])
            .trim()
            .to_string()
    }

    fn flow_dir(&self) -> PathBuf {
        self.env.root.join(".flows/notes")
    }

    fn current(&self) -> Value {
        read_json(&self.flow_dir().join("state.json"))["current"].clone()
    }

    fn archived(&self, name: &str) -> String {
        std::fs::read_to_string(self.flow_dir().join("archive").join(name)).unwrap_or_default()
    }

    fn cycle_file(&self) -> String {
        std::fs::read_to_string(self.flow_dir().join("current_cycle.md")).unwrap_or_default()
    }

    fn journal(&self) -> Vec<Value> {
        std::fs::read_to_string(self.flow_dir().join("journal.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Where the cycle's one worktree is (the Actor's workspaces root).
    fn worktree(&self, cycle: &str) -> PathBuf {
        self.env
            .agent("rio")
            .join(format!("workspaces/flow-notes-{cycle}"))
    }

    /// The repository's branches other than main.
    fn branches(&self) -> Vec<String> {
        git(&self.repo, &["branch", "--format=%(refname:short)"])
            .lines()
            .filter(|b| *b != "main")
            .map(str::to_string)
            .collect()
    }

    /// The paths of the repository's worktrees besides its own.
    fn worktrees(&self) -> Vec<String> {
        git(&self.repo, &["worktree", "list", "--porcelain"])
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .skip(1)
            .map(str::to_string)
            .collect()
    }

    /// Wait for the cycle to be archived (approved) and journaled.
    fn wait_approved(&self, d: &Daemon, cycle: &str) -> String {
        let name = archive_name(cycle, false);
        d.wait_until(LONG, "the cycle is approved and archived", || {
            !self.archived(&name).is_empty()
                && self.current().is_null()
                && self.journal().iter().any(|e| e["event"] == "approved")
        });
        self.archived(&name)
    }
}

/// `text` holds each of `parts`, in this order.
fn in_order(text: &str, parts: &[&str]) {
    let mut from = 0;
    for p in parts {
        match text[from..].find(p) {
            Some(i) => from += i + p.len(),
            None => panic!("{p:?} not found (in order) in:\n{text}"),
        }
    }
}

fn file_in(repo: &Path, rev_path: &str) -> String {
    git(repo, &["show", rev_path])
}

#[test]
fn a_three_step_flow_where_the_actors_second_step_extends_the_first_ends_in_an_archive_with_one_branch()
 {
    let lab = lab(
        false,
        r#"on_approve = ["sh", "-c", "echo branch={branch} head=$(git rev-parse --abbrev-ref HEAD) notes=$(wc -l < notes.md)"]"#,
    );
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["3 pass-medium", "* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Six notes, in two steps");
    d.wait_until(LONG, "the Judge's first PASS waits for the human", || {
        lab.current()["status"] == "awaiting_approval"
    });
    // The human wants more: back to the Planner, then the Actor again.
    lab.env
        .ok(&["flow", "reject", &cycle, "--feedback", "three more notes"]);
    lab.wait_approved(&d, &cycle);
    // on_approve's outcome comes after the approval's line, the worktree's
    // removal after it.
    d.wait_until(LONG, "the cycle's worktree is removed", || {
        lab.journal()
            .iter()
            .any(|e| e["event"] == "worktree_removed")
    });
    let file = lab.archived(&archive_name(&cycle, false));
    let branch = format!("agent-state/flow/notes/{cycle}");
    let worktree = lab.worktree(&cycle).display().to_string();

    // Both Actor steps worked in the cycle's one worktree, the second from
    // where the first left it.
    assert_eq!(
        lab.seen("rio"),
        [(2, worktree.clone(), 0), (5, worktree.clone(), 3)],
        "{file}"
    );
    // Each step's diff is against the previous step, the cycle's total
    // beside it.
    in_order(
        &file,
        &[
            "## Step 2 — Actor (rio",
            "### Diff (3 changed line(s) in 1 file(s) against ",
            "; the cycle so far: 3 line(s) in 1 file(s))",
            "+note 2.1",
            &format!("**Branch**: {branch} at "),
            "## Step 5 — Actor (rio",
            "### Diff (3 changed line(s) in 1 file(s) against ",
            "; the cycle so far: 6 line(s) in 1 file(s))",
            "+note 5.1",
            "## Step 6 — Judge (leo",
            "PASS at low risk: approved",
            "## Approved",
            "## on_approve",
            &format!("branch={branch} head={branch} notes=6"),
        ],
    );
    assert!(
        !file[file.find("## Step 5").unwrap()..].contains("+note 2.1"),
        "{file}"
    );
    // One branch, holding both steps; its worktree gone with the cycle.
    assert_eq!(lab.branches(), std::slice::from_ref(&branch));
    assert_eq!(
        file_in(&lab.repo, &format!("{branch}:notes.md"))
            .lines()
            .count(),
        6
    );
    assert_eq!(
        git(
            &lab.repo,
            &["rev-list", "--count", &format!("main..{branch}")]
        ),
        "2"
    );
    assert!(!lab.worktree(&cycle).exists());
    assert!(lab.worktrees().is_empty(), "{:?}", lab.worktrees());
    let events: Vec<String> = lab
        .journal()
        .iter()
        .map(|e| e["event"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        &events[events.len() - 3..],
        ["approved", "on_approve", "worktree_removed"]
    );
}

#[test]
fn an_insufficient_step_is_rolled_back_to_the_last_pass_by_default_or_kept() {
    // The default: the next Actor step starts again from the cycle's base.
    let lab = lab(false, "");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["3 insufficient", "* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Rolled back");
    let file = lab.wait_approved(&d, &cycle);
    let branch = format!("agent-state/flow/notes/{cycle}");
    let worktree = lab.worktree(&cycle).display().to_string();
    assert_eq!(
        lab.seen("rio"),
        [(2, worktree.clone(), 0), (5, worktree.clone(), 0)],
        "{file}"
    );
    in_order(
        &file,
        &[
            "## Step 3 — Judge (leo",
            &format!("**Branch**: {branch} rolled back to the last PASS ("),
            "the step's commit ",
            &format!(" is kept under refs/agent-state/flow/notes/{cycle}/\n"),
            "INSUFFICIENT: the notes need more",
            "## Step 5 — Actor (rio",
            "; the cycle so far: 3 line(s) in 1 file(s))",
        ],
    );
    let notes = file_in(&lab.repo, &format!("{branch}:notes.md"));
    assert_eq!(notes, "note 5.1\nnote 5.2\nnote 5.3", "{file}");
    // What was rolled back is kept under the step's ref.
    let kept = file_in(
        &lab.repo,
        &format!("refs/agent-state/flow/notes/{cycle}/step-2:notes.md"),
    );
    assert_eq!(kept, "note 2.1\nnote 2.2\nnote 2.3");
    drop(d);

    // on_insufficient = "keep": the next step continues the judged one.
    let lab = lab_keep();
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["3 insufficient", "* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Kept");
    let file = lab.wait_approved(&d, &cycle);
    let worktree = lab.worktree(&cycle).display().to_string();
    assert_eq!(
        lab.seen("rio"),
        [(2, worktree.clone(), 0), (5, worktree, 3)],
        "{file}"
    );
    assert!(
        file.contains("(on_insufficient = \"keep\"): the next Actor step continues it"),
        "{file}"
    );
    let branch = format!("agent-state/flow/notes/{cycle}");
    assert_eq!(
        file_in(&lab.repo, &format!("{branch}:notes.md"))
            .lines()
            .count(),
        6
    );
}

fn lab_keep() -> Lab {
    lab(false, "on_insufficient = \"keep\"")
}

#[test]
fn the_cycles_worktree_is_removed_when_it_is_stopped() {
    let lab = lab(false, "");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-medium"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Stopped halfway");
    d.wait_until(LONG, "the Actor's step is on the cycle's branch", || {
        lab.current()["branch"]["head"].is_string()
            && lab.current()["status"] == "awaiting_approval"
    });
    assert!(lab.worktree(&cycle).is_dir());
    let out = lab.env.run(&["flow", "stop", &cycle]);
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("worktree") && said.contains("removed"),
        "{said}"
    );
    assert!(!lab.worktree(&cycle).exists());
    assert!(lab.worktrees().is_empty(), "{:?}", lab.worktrees());
    // The branch holds the stopped cycle's work: kept for a human.
    let branch = format!("agent-state/flow/notes/{cycle}");
    assert_eq!(lab.branches(), [branch]);
    assert!(
        lab.archived(&archive_name(&cycle, true))
            .contains("## Stopped")
    );
}

#[test]
fn a_plan_over_its_lines_goes_back_to_the_planner_before_the_actor() {
    let lab = lab(false, "");
    lab.script("theseus", &["1 longplan", "* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Plan briefly");
    let file = lab.wait_approved(&d, &cycle);
    in_order(
        &file,
        &[
            "## Step 1 — Planner (theseus",
            "INSUFFICIENT: the Planner's plan is 60 line(s); the limit is 50 (limits.plan_lines, checked by the daemon, before the Actor)",
            "## Step 2 — Planner (theseus",
            "## Step 3 — Actor (rio",
        ],
    );
    assert_eq!(lab.played("rio"), ["3 small"]);
    assert!(
        lab.journal()
            .iter()
            .any(|e| e["event"] == "insufficient" && e["role"] == "Planner")
    );
}

#[test]
fn an_actor_outside_its_paths_goes_back_to_the_planner_and_its_step_is_rolled_back() {
    let lab = lab(false, r#"limits = { actor_paths = ["docs/**"] }"#);
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["2 small", "* docs"]);
    lab.script("leo", &["* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Docs only");
    let file = lab.wait_approved(&d, &cycle);
    in_order(
        &file,
        &[
            "## Step 2 — Actor (rio",
            "INSUFFICIENT: the Actor changed 1 path(s) outside limits.actor_paths (docs/**): notes.md (checked by the daemon, before the Judge)",
            "## Step 3 — Planner",
            "## Step 4 — Actor (rio",
            "## Step 5 — Judge (leo",
        ],
    );
    assert_eq!(lab.played("leo"), ["5 pass-low"]);
    let branch = format!("agent-state/flow/notes/{cycle}");
    let tree = git(&lab.repo, &["ls-tree", "-r", "--name-only", &branch]);
    assert_eq!(tree.lines().collect::<Vec<_>>(), ["README", "docs/faq.md"]);
}

#[test]
fn a_judge_that_writes_code_is_insufficient_and_its_change_not_kept() {
    let lab = lab(true, "");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["3 write-pass", "* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("A Judge judges");
    let file = lab.wait_approved(&d, &cycle);
    let worktree = lab.worktree(&cycle).display().to_string();
    // The Judge tested the Actor's change where it is.
    assert_eq!(lab.seen("leo")[0], (3, worktree, 3), "{file}");
    in_order(
        &file,
        &[
            "## Step 3 — Judge (leo",
            "INSUFFICIENT: the Judge changed 1 line(s) in 1 file(s) of its workspace; a Judge writes no code (limits.judge_writes_code = false)",
            "## Step 6 — Judge (leo",
            "PASS at low risk: approved",
        ],
    );
    let branch = format!("agent-state/flow/notes/{cycle}");
    let tree = git(&lab.repo, &["ls-tree", "-r", "--name-only", &branch]);
    assert!(!tree.contains("judge.txt"), "{tree}");
    assert!(lab.cycle_file().is_empty());
}

/// SIGKILLs at random moments while a cycle rolls a step back and goes on:
/// the branch ends with the second Actor step's notes only, each step is
/// in the cycle file once, and the worktree is gone. The seed is printed;
/// AGENT_STATE_CRASH_SEED replays one.
#[test]
fn a_daemon_killed_at_random_moments_commits_and_rolls_back_each_step_once() {
    let (seed, mut rand) = crash_rng("flow_branch");
    let lab = lab(false, "");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["* small"]);
    lab.script("leo", &["3 insufficient", "6 pass-low"]);
    let mut d = lab.env.daemon();
    let cycle = lab.start("Survive a rollback");
    let name = archive_name(&cycle, false);
    let mut kills = 0;
    let mut window = 250;
    let mut last = String::new();
    while lab.archived(&name).is_empty() {
        let now = lab.current().to_string();
        if now == last {
            window += 200;
        } else {
            window = 250;
            last = now;
        }
        std::thread::sleep(Duration::from_millis(rand(window)));
        if !lab.archived(&name).is_empty() {
            break;
        }
        d.kill9();
        kills += 1;
        assert!(kills < 500, "no progress (seed {seed})");
        d = lab.env.daemon();
    }
    d.wait_until(LONG, "the cycle's worktree is removed", || {
        lab.journal()
            .iter()
            .any(|e| e["event"] == "worktree_removed")
    });
    eprintln!("flow_branch crash harness: {kills} SIGKILLs");
    let file = lab.archived(&name);
    for step in 1..=6 {
        assert_eq!(
            file.matches(&format!("## Step {step} — ")).count(),
            1,
            "step {step} once (seed {seed}):\n{file}"
        );
    }
    let branch = format!("agent-state/flow/notes/{cycle}");
    assert_eq!(
        file_in(&lab.repo, &format!("{branch}:notes.md")),
        "note 5.1\nnote 5.2\nnote 5.3",
        "seed {seed}:\n{file}"
    );
    assert_eq!(
        git(
            &lab.repo,
            &["rev-list", "--count", &format!("main..{branch}")]
        ),
        "1",
        "seed {seed}"
    );
    assert!(!lab.worktree(&cycle).exists(), "seed {seed}");
}

#[test]
fn a_retry_of_a_failed_actor_session_starts_where_the_step_started() {
    let lab = lab(false, "");
    lab.script("theseus", &["* plan"]);
    lab.script("rio", &["2 fail-once", "* small"]);
    lab.script("leo", &["* pass-low"]);
    let d = lab.env.daemon();
    let cycle = lab.start("Fail, then succeed");
    let file = lab.wait_approved(&d, &cycle);
    let worktree = lab.worktree(&cycle).display().to_string();
    // The failed session answered nothing; the retry got the hand-off again,
    // in the same worktree, without what the failed one left there.
    assert_eq!(
        lab.seen("rio"),
        [(2, worktree.clone(), 0), (2, worktree, 0)],
        "{file}"
    );
    let branch = format!("agent-state/flow/notes/{cycle}");
    assert_eq!(
        file_in(&lab.repo, &format!("{branch}:notes.md")),
        "note 2.1\nnote 2.2\nnote 2.3"
    );
    // What it left is set aside, not lost.
    assert_eq!(
        file_in(
            &lab.repo,
            &format!("refs/agent-state/flow/notes/{cycle}/set-aside-1:notes.md")
        ),
        "half done"
    );
}

/// A hand-off is a message: one naming a cycle that is not the flow's open
/// cycle (forged by a member of the inbox group) gets the Actor's own
/// session worktree, never a worktree or branch for that cycle.
#[test]
fn a_forged_hand_off_for_a_cycle_that_is_not_open_makes_no_cycle_worktree() {
    let lab = lab(false, "");
    lab.script("rio", &["* small"]);
    let d = lab.env.daemon();
    let forged = "2026-01-01-001";
    lab.env.ok(&[
        "send",
        "--from",
        "theseus",
        "--to",
        "rio",
        "--subject",
        "You are the Actor",
        "--priority",
        "high",
        "--source-ref",
        &format!("agent-state/flow/notes/{forged}/2"),
    ]);
    // (No step in its prompt: its `seen` line is " DIR LINES".)
    d.wait_until(LONG, "rio's session ran", || {
        !lab.lines_of("seen-rio").is_empty()
    });
    let seen = lab.lines_of("seen-rio").join("\n");
    assert!(
        seen.contains("/workspaces/") && !seen.contains(&format!("flow-notes-{forged}")),
        "the forged cycle got a worktree: {seen}"
    );
    assert!(!lab.worktree(forged).exists());
    assert!(
        !lab.branches()
            .iter()
            .any(|b| b.contains(&format!("agent-state/flow/notes/{forged}"))),
        "{:?}",
        lab.branches()
    );
}
