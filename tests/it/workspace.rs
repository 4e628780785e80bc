//! Workspaces (issue 12): git worktrees made from real repositories in temp dirs.

use crate::support::git;
use agent_state::workspace::{self, WorkspaceError, WorkspaceSpec};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn repo() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    git(&repo, &["add", "a.txt"]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    (dir, repo)
}

fn spec(dir: &Path, repo: &Path, name: &str, branch: &str) -> WorkspaceSpec {
    WorkspaceSpec {
        repo: repo.to_path_buf(),
        base: "main".into(),
        path: dir.join("ws").join(name),
        branch: branch.into(),
    }
}

#[test]
fn workspace_two_sessions_never_see_each_others_changes() {
    let (dir, repo) = repo();
    let a = workspace::create(&spec(dir.path(), &repo, "a", "rio/research-2026-11-24")).unwrap();
    let b = workspace::create(&spec(dir.path(), &repo, "b", "rio/research-2026-11-24-2")).unwrap();
    std::fs::write(a.path.join("a.txt"), "changed by a\n").unwrap();
    git(&a.path, &["add", "a.txt"]);
    assert_eq!(
        std::fs::read_to_string(b.path.join("a.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(git(&b.path, &["status", "--porcelain"]), "");
    let fa = workspace::finish(&a, &a.base_commit).unwrap();
    let fb = workspace::finish(&b, &b.base_commit).unwrap();
    assert!(fa.dirty && !fb.dirty);
    // Dirty is kept, clean is removed.
    assert!(!workspace::remove_if_clean(&repo, &a).unwrap());
    assert!(a.path.exists());
    assert!(workspace::remove_if_clean(&repo, &b).unwrap());
    assert!(!b.path.exists());
    assert_eq!(git(&repo, &["branch", "--list", &b.branch]), "");
}

#[test]
fn workspace_stale_dir_of_a_killed_session_is_recreated() {
    let (dir, repo) = repo();
    let s = spec(dir.path(), &repo, "a", "rio/x");
    let ws = workspace::create(&s).unwrap();
    std::fs::write(ws.path.join("junk"), "left").unwrap();
    // The session was killed: the worktree and branch stay. Creating again recreates.
    let again = workspace::create(&s).unwrap();
    assert_eq!(again.branch, "rio/x");
    assert!(!again.path.join("junk").exists());
    // A plain directory (not a worktree) at the path is also replaced.
    workspace::remove(&repo, &again).unwrap();
    std::fs::create_dir_all(s.path.join("sub")).unwrap();
    let third = workspace::create(&s).unwrap();
    assert!(third.path.join("a.txt").exists());
}

#[test]
fn workspace_existing_branch_deleted_unless_it_has_work() {
    let (dir, repo) = repo();
    git(&repo, &["branch", "rio/empty"]);
    let ws = workspace::create(&spec(dir.path(), &repo, "a", "rio/empty")).unwrap();
    assert_eq!(ws.branch, "rio/empty");

    git(&repo, &["checkout", "-q", "-b", "rio/work"]);
    std::fs::write(repo.join("w.txt"), "work").unwrap();
    git(&repo, &["add", "w.txt"]);
    git(&repo, &["commit", "-q", "-m", "work"]);
    let work = git(&repo, &["rev-parse", "rio/work"]);
    git(&repo, &["checkout", "-q", "main"]);
    let ws = workspace::create(&spec(dir.path(), &repo, "b", "rio/work")).unwrap();
    assert_eq!(ws.branch, "rio/work-2");
    assert_eq!(
        git(&repo, &["rev-parse", "rio/work"]),
        work,
        "work is never lost"
    );
}

#[test]
fn workspace_held_index_lock_is_waited_out() {
    let (dir, repo) = repo();
    let lock = repo.join(".git").join("index.lock");
    let _ = dir;
    // `git branch`/worktree add lock refs; hold the ref lock of the new branch.
    let reflock = repo.join(".git/refs/heads/locked.lock");
    std::fs::write(&reflock, "").unwrap();
    std::fs::write(&lock, "").unwrap();
    let (l1, l2) = (lock.clone(), reflock.clone());
    let t = std::thread::spawn(move || {
        // Kept: another git holding its locks for 2 s is the subject.
        std::thread::sleep(Duration::from_secs(2));
        std::fs::remove_file(l1).unwrap();
        std::fs::remove_file(l2).unwrap();
    });
    let started = std::time::Instant::now();
    let ws = workspace::create(&spec(dir.path(), &repo, "a", "locked")).unwrap();
    // It could only succeed once the locks were gone: it waited and retried.
    assert!(started.elapsed() >= Duration::from_millis(1900));
    t.join().unwrap();
    assert!(ws.path.join("a.txt").exists());
}

#[test]
fn workspace_not_a_repo_is_a_user_error() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let err = workspace::create(&spec(dir.path(), &plain, "a", "rio/x")).unwrap_err();
    assert!(matches!(err, WorkspaceError::NotARepo { .. }), "{err}");
    assert_eq!(err.code(), "WORKSPACE_NOT_A_REPO");
    assert!(err.to_string().contains("git rev-parse --git-dir"), "{err}");
    let (d2, repo) = repo();
    let mut s = spec(d2.path(), &repo, "a", "rio/x");
    s.base = "nope".into();
    let err = workspace::create(&s).unwrap_err();
    assert_eq!(err.code(), "WORKSPACE_FAILED");
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn workspace_branch_names_and_fingerprint() {
    assert_eq!(
        workspace::branch_name(
            workspace::DEFAULT_BRANCH_TEMPLATE,
            "rio",
            1,
            "research",
            "2026-11-24"
        ),
        "rio/research-2026-11-24"
    );
    for bad in [
        "", "a..b", "a b", "-x", "a/", "x.lock", "a~b", "a:b", ".x/y", "a@{b",
    ] {
        assert!(workspace::validate_branch(bad).is_err(), "{bad:?}");
    }
    workspace::validate_branch("rio/research-2026-11-24").unwrap();

    let (dir, repo) = repo();
    let ws = workspace::create(&spec(dir.path(), &repo, "a", "rio/f")).unwrap();
    let f0 = workspace::fingerprint(&ws.path).unwrap();
    assert_eq!(workspace::fingerprint(&ws.path).unwrap(), f0, "stable");
    std::fs::write(ws.path.join("new.txt"), "x").unwrap();
    let f1 = workspace::fingerprint(&ws.path).unwrap();
    assert_ne!(f1, f0, "untracked file counts");
    std::fs::write(ws.path.join("a.txt"), "two\n").unwrap();
    let f2 = workspace::fingerprint(&ws.path).unwrap();
    assert_ne!(f2, f1, "unstaged change counts");
    std::fs::write(ws.path.join("a.txt"), "one\n").unwrap();
    std::fs::remove_file(ws.path.join("new.txt")).unwrap();
    assert_eq!(
        workspace::fingerprint(&ws.path).unwrap(),
        f0,
        "back to the same content"
    );
    assert_eq!(
        git(&ws.path, &["status", "--porcelain"]),
        "",
        "the real index is untouched"
    );
}

#[test]
fn workspace_prune_removes_orphans_keeps_unpushed_work() {
    let (dir, repo) = repo();
    let root = dir.path().join("ws");
    let live = workspace::create(&spec(dir.path(), &repo, "live", "rio/live")).unwrap();
    let clean = workspace::create(&spec(dir.path(), &repo, "clean", "rio/clean")).unwrap();
    let ahead = workspace::create(&spec(dir.path(), &repo, "ahead", "rio/ahead")).unwrap();
    std::fs::write(ahead.path.join("n.txt"), "n").unwrap();
    git(&ahead.path, &["add", "n.txt"]);
    git(&ahead.path, &["commit", "-q", "-m", "unpushed"]);
    let now = std::time::SystemTime::now() + Duration::from_secs(3600);
    let r = workspace::prune(
        &repo,
        &root,
        "main",
        std::slice::from_ref(&live.path),
        Duration::from_secs(60),
        now,
        false,
    )
    .unwrap();
    assert!(
        live.path.exists() && ahead.path.exists() && !clean.path.exists(),
        "{r:?}"
    );
    assert_eq!(r.removed.len(), 1, "{r:?}");
    assert!(r.kept[0].1.contains("unpushed"), "{r:?}");
    let r = workspace::prune(
        &repo,
        &root,
        "main",
        std::slice::from_ref(&live.path),
        Duration::from_secs(60),
        now,
        true,
    )
    .unwrap();
    assert!(!ahead.path.exists(), "{r:?}");
    assert!(
        !git(&repo, &["rev-parse", "rio/ahead"]).is_empty(),
        "the branch (the work) stays"
    );
}

#[test]
fn workspace_lock_held_for_good_is_workspace_locked() {
    let (dir, repo) = repo();
    std::fs::write(repo.join(".git/refs/heads/stuck.lock"), "").unwrap();
    let err = workspace::create(&spec(dir.path(), &repo, "a", "stuck")).unwrap_err();
    assert_eq!(err.code(), "WORKSPACE_LOCKED", "{err}");
    assert!(
        err.to_string().contains("git worktree add -b stuck"),
        "{err}"
    );
    assert!(err.to_string().contains("stuck.lock"), "{err}");
}
