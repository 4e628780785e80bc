//! Git worktrees as sessions' workspaces (issue 12, "Workspaces"; seed 002's git rows).
//!
//! Every git call goes through [`git`], which runs it with [`crate::git`] (arguments,
//! never a shell; hooks, fsmonitor, filters and every other repository-named program
//! disabled; `LC_ALL=C`, so a held lock is recognised by git's English message; stdin
//! closed, a time limit ([`GIT_TIMEOUT`], killed past it) and bounded captured output). Every failure names the exact command line and
//! its (trimmed, bounded) stderr.
//!
//! Designed paths: not a repository → [`WorkspaceError::NotARepo`] (the session is not
//! started; user action); the path exists (orphaned worktree or plain directory inside the
//! workspaces root) → removed and recreated; the branch exists → deleted and retried once,
//! unless it is checked out elsewhere or has commits not on the base, in which case a new
//! name with a `-N` suffix is used (work is never lost); a `*.lock` held → wait 1 s, up to
//! [`LOCK_RETRIES`] times, then [`WorkspaceError::Locked`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Time limit of one git command.
pub const GIT_TIMEOUT: Duration = crate::git::TIMEOUT;
/// How many times a command refused for a held `*.lock` is retried (1 s apart).
pub const LOCK_RETRIES: u32 = 5;
const MAX_STDERR_SHOWN: usize = 2000;

/// The default branch template: `rio/research-2026-11-24`.
pub const DEFAULT_BRANCH_TEMPLATE: &str = "{agent}/{type}-{date}";

/// The branches of flows' cycles: `agent-state/flow/FLOW/CYCLE` (seed 004,
/// issue 22). Such a branch is a cycle's one branch: its worktree is opened
/// again for each step ([`open_cycle`]), kept after each session, skipped
/// by pruning, and removed when the cycle closes.
pub const CYCLE_BRANCH_PREFIX: &str = crate::config::CYCLE_BRANCH_PREFIX;

/// A cycle's branch: `agent-state/flow/docs/2026-11-24-001`.
pub fn cycle_branch(flow: &str, cycle: &str) -> String {
    format!("{CYCLE_BRANCH_PREFIX}{flow}/{cycle}")
}

/// The ref of where a cycle's branch must be when its next step starts
/// (set by the flow as each step is applied): `refs/BRANCH/head`.
pub fn cycle_head_ref(branch: &str) -> String {
    format!("refs/{branch}/head")
}

/// Whether `branch` is a flow cycle's branch.
pub fn is_cycle_branch(branch: &str) -> bool {
    branch.starts_with(CYCLE_BRANCH_PREFIX)
}

/// The directory of an agent's worktrees: `{root}/{agent}/` with a
/// configured root, else `{agent dir}/workspaces/`.
pub fn agent_root(root: Option<&Path>, agent: &str, agent_dir: &Path) -> PathBuf {
    match root {
        Some(r) => r.join(agent),
        None => agent_dir.join("workspaces"),
    }
}

/// What to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSpec {
    pub repo: PathBuf,
    pub base: String,
    pub path: PathBuf,
    pub branch: String,
}

/// A created workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub path: PathBuf,
    pub branch: String,
    pub base_commit: String,
}

/// A workspace's state at the end of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub head_commit: String,
    pub dirty: bool,
    pub commits_ahead: u32,
}

/// One entry of `git worktree list --porcelain`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorktreeInfo {
    pub path: PathBuf,
    pub branch: Option<String>,
    pub head: String,
    pub locked: bool,
    pub prunable: bool,
}

/// The errors, each with a catalogue-style code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceError {
    /// The repository is not a git repository: the session is not started.
    NotARepo {
        repo: PathBuf,
        command: String,
        stderr: String,
    },
    /// A `*.lock` stayed held through every retry.
    Locked { command: String, stderr: String },
    /// Any other failure (base not found, timeout, refused path, ...).
    Failed {
        command: String,
        stderr: String,
        fix: String,
    },
}

impl WorkspaceError {
    /// The catalogue code.
    pub fn code(&self) -> &'static str {
        match self {
            WorkspaceError::NotARepo { .. } => "WORKSPACE_NOT_A_REPO",
            WorkspaceError::Locked { .. } => "WORKSPACE_LOCKED",
            WorkspaceError::Failed { .. } => "WORKSPACE_FAILED",
        }
    }
}

impl fmt::Display for WorkspaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkspaceError::NotARepo {
                repo,
                command,
                stderr,
            } => write!(
                f,
                "{}: {} is not a git repository (`{command}`: {stderr}); fix: set the agent's \
                 workspace repo to a git repository (git init, or correct the path)",
                self.code(),
                repo.display()
            ),
            WorkspaceError::Locked { command, stderr } => write!(
                f,
                "{}: `{command}` found a git lock held after {LOCK_RETRIES} retries: {stderr}; \
                 fix: check no git process is running in that repository, then remove the \
                 stale .lock file",
                self.code()
            ),
            WorkspaceError::Failed {
                command,
                stderr,
                fix,
            } => {
                write!(
                    f,
                    "{}: `{command}` failed: {stderr}; fix: {fix}",
                    self.code()
                )
            }
        }
    }
}

impl std::error::Error for WorkspaceError {}

/// The output of a git command that exited 0.
struct Out {
    stdout: String,
}

fn quote(args: &[&str]) -> String {
    let mut s = String::from("git");
    for a in args {
        s.push(' ');
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
            s.push_str(&format!("{a:?}"));
        } else {
            s.push_str(a);
        }
    }
    s
}

fn bounded(s: &[u8]) -> String {
    let t = String::from_utf8_lossy(s);
    let t = t.trim();
    if t.len() > MAX_STDERR_SHOWN {
        let mut end = MAX_STDERR_SHOWN;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &t[..end])
    } else {
        t.to_string()
    }
}

/// Raw git run: Ok((status_ok, stdout, stderr)) or Err on spawn failure / timeout.
fn run(dir: &Path, args: &[&str]) -> Result<(bool, Vec<u8>, String), WorkspaceError> {
    run_env(dir, args, None)
}

/// [`run`] with an optional `GIT_INDEX_FILE` (the fingerprint's temporary index),
/// through the hardened runner ([`crate::git`]).
fn run_env(
    dir: &Path,
    args: &[&str],
    index: Option<&Path>,
) -> Result<(bool, Vec<u8>, String), WorkspaceError> {
    let env: Vec<(&str, &Path)> = index.map(|i| ("GIT_INDEX_FILE", i)).into_iter().collect();
    match crate::git::run(dir, args, &env) {
        Ok(out) => Ok((out.ok, out.stdout, bounded(&out.stderr))),
        Err(e @ crate::git::RunError::Spawn(_)) => Err(WorkspaceError::Failed {
            command: quote(args),
            stderr: e.to_string(),
            fix: "install git and make it reachable on PATH".into(),
        }),
        Err(e @ crate::git::RunError::TooOld(_)) => Err(WorkspaceError::Failed {
            command: quote(args),
            stderr: e.to_string(),
            fix: "install git 2.31 or later".into(),
        }),
        Err(e @ crate::git::RunError::Timeout(_)) => Err(WorkspaceError::Failed {
            command: quote(args),
            stderr: e.to_string(),
            fix: "check the repository (network remote, huge tree)".into(),
        }),
    }
}

fn is_lock_error(stderr: &str) -> bool {
    stderr.contains(".lock")
        && (stderr.contains("File exists") || stderr.contains("Unable to create"))
}

/// Run git in `dir`, retrying on a held lock; a failure is `Failed` with `fix`.
fn git(dir: &Path, args: &[&str], fix: &str) -> Result<Out, WorkspaceError> {
    let mut tries = 0;
    loop {
        let (ok, stdout, stderr) = run(dir, args)?;
        if ok {
            return Ok(Out {
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
            });
        }
        if is_lock_error(&stderr) {
            if tries < LOCK_RETRIES {
                tries += 1;
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            return Err(WorkspaceError::Locked {
                command: quote(args),
                stderr,
            });
        }
        return Err(WorkspaceError::Failed {
            command: quote(args),
            stderr,
            fix: fix.to_string(),
        });
    }
}

/// Did git exit 0? (For questions like "does this ref exist".)
fn git_ok(dir: &Path, args: &[&str]) -> Result<bool, WorkspaceError> {
    Ok(run(dir, args)?.0)
}

fn rev(dir: &Path, what: &str) -> Result<String, WorkspaceError> {
    let spec = format!("{what}^{{commit}}");
    Ok(git(
        dir,
        &["rev-parse", "--verify", "--quiet", &spec],
        &format!("check that `{what}` names a commit (branch, tag or hash) in the repository"),
    )?
    .stdout
    .trim()
    .to_string())
}

/// Check that `repo` is a git repository (the work tree's top or any directory in it).
pub fn check_repo(repo: &Path) -> Result<(), WorkspaceError> {
    let args = ["rev-parse", "--git-dir"];
    if !repo.is_dir() {
        return Err(WorkspaceError::NotARepo {
            repo: repo.to_path_buf(),
            command: quote(&args),
            stderr: "no such directory".into(),
        });
    }
    let (ok, _, stderr) = run(repo, &args)?;
    if ok {
        Ok(())
    } else {
        Err(WorkspaceError::NotARepo {
            repo: repo.to_path_buf(),
            command: quote(&args),
            stderr,
        })
    }
}

/// The branch name from a template: `{agent}`, `{instance}`, `{type}`, `{date}`.
/// The caller passes it to [`create`], which appends `-2`, `-3`, ... when the name is
/// taken by a branch it must not delete (see the module doc).
pub fn branch_name(
    template: &str,
    agent: &str,
    instance: u32,
    session_type: &str,
    date: &str,
) -> String {
    template
        .replace("{agent}", agent)
        .replace("{instance}", &instance.to_string())
        .replace("{type}", session_type)
        .replace("{date}", date)
}

/// A branch name git's check-ref-format refuses: the name and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("branch name {name:?} is not valid: {why}")]
pub struct BadBranch {
    pub name: String,
    pub why: BranchFault,
}

/// Why a branch name is not valid (its Display is the reason users read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BranchFault {
    #[error("empty")]
    Empty,
    #[error("`@` alone")]
    At,
    #[error("starts with `-`")]
    Dash,
    #[error("contains `..`, `@{{` or `//`")]
    Sequence,
    #[error("starts or ends with `/`, or ends with `.`")]
    Edge,
    #[error("contains {0:?}")]
    Char(char),
    #[error("a component starts with `.` or ends with `.lock`")]
    Component,
}

/// Validate a branch name by git's check-ref-format rules (checked here, without git).
pub fn validate_branch(name: &str) -> Result<(), BadBranch> {
    let bad = |why: BranchFault| {
        Err(BadBranch {
            name: name.to_string(),
            why,
        })
    };
    if name.is_empty() {
        return bad(BranchFault::Empty);
    }
    if name == "@" {
        return bad(BranchFault::At);
    }
    if name.starts_with('-') {
        return bad(BranchFault::Dash);
    }
    if name.contains("..") || name.contains("@{") || name.contains("//") {
        return bad(BranchFault::Sequence);
    }
    if name.starts_with('/') || name.ends_with('/') || name.ends_with('.') {
        return bad(BranchFault::Edge);
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\\u{7f}".contains(*c))
    {
        return bad(BranchFault::Char(c));
    }
    for comp in name.split('/') {
        if comp.starts_with('.') || comp.ends_with(".lock") {
            return bad(BranchFault::Component);
        }
    }
    Ok(())
}

fn branch_exists(repo: &Path, branch: &str) -> Result<bool, WorkspaceError> {
    git_ok(
        repo,
        &[
            "show-ref",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )
}

/// Remove whatever is at `path` so a worktree can be created there: a registered worktree
/// through git, a plain directory only if it is inside `root` (its parent) and not a link.
fn clear_path(repo: &Path, path: &Path) -> Result<(), WorkspaceError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => {
            git(
                repo,
                &["worktree", "prune"],
                "run `git worktree prune` by hand",
            )?;
            return Ok(());
        }
    };
    let p = path.to_string_lossy().into_owned();
    let registered = list(repo)?.iter().any(|w| same(&w.path, path));
    if !registered && std::fs::symlink_metadata(path.join(".git")).is_ok_and(|m| m.is_dir()) {
        return Err(WorkspaceError::Failed {
            command: format!("remove {}", path.display()),
            stderr: "it is a repository of its own, not an orphaned worktree".into(),
            fix: "move it away or choose another workspaces root".into(),
        });
    }
    if registered {
        git(
            repo,
            &["worktree", "remove", "--force", "--force", &p],
            "remove the worktree by hand",
        )?;
    }
    git(
        repo,
        &["worktree", "prune"],
        "run `git worktree prune` by hand",
    )?;
    if std::fs::symlink_metadata(path).is_ok() {
        if meta.file_type().is_symlink() {
            // Never follow a link out of the root: remove the link itself only.
            std::fs::remove_file(path).map_err(|e| io_fail("remove link", path, e))?;
        } else if meta.is_dir() {
            std::fs::remove_dir_all(path).map_err(|e| io_fail("remove directory", path, e))?;
        } else {
            std::fs::remove_file(path).map_err(|e| io_fail("remove file", path, e))?;
        }
    }
    Ok(())
}

fn io_fail(what: &str, path: &Path, e: std::io::Error) -> WorkspaceError {
    WorkspaceError::Failed {
        command: format!("{what} {}", path.display()),
        stderr: e.to_string(),
        fix: "remove it by hand".into(),
    }
}

fn same(a: &Path, b: &Path) -> bool {
    let ca = std::fs::canonicalize(a).unwrap_or_else(|_| a.to_path_buf());
    let cb = std::fs::canonicalize(b).unwrap_or_else(|_| b.to_path_buf());
    ca == cb || a == b
}

/// May this branch be deleted? Not if checked out in a worktree or ahead of `base`.
fn branch_deletable(repo: &Path, branch: &str, base: &str) -> Result<bool, WorkspaceError> {
    let checked_out = list(repo)?
        .iter()
        .any(|w| w.branch.as_deref() == Some(branch) && !w.prunable);
    if checked_out {
        return Ok(false);
    }
    let range = format!("{base}..refs/heads/{branch}");
    let n = git(repo, &["rev-list", "--count", &range], "check the base")?;
    Ok(n.stdout.trim() == "0")
}

/// Create the worktree of `spec` (see the module doc for the designed paths).
pub fn create(spec: &WorkspaceSpec) -> Result<Workspace, WorkspaceError> {
    check_repo(&spec.repo)?;
    validate_branch(&spec.branch).map_err(|e| WorkspaceError::Failed {
        command: "git check-ref-format".into(),
        stderr: e.to_string(),
        fix: "change the workspace branch template".into(),
    })?;
    let repo = spec.repo.as_path();
    let base_commit = rev(repo, &spec.base)?;
    clear_path(repo, &spec.path)?;
    let mut branch = spec.branch.clone();
    if branch_exists(repo, &branch)? {
        if branch_deletable(repo, &branch, &base_commit)? {
            git(
                repo,
                &["branch", "-D", &branch],
                "delete the branch by hand",
            )?;
        } else {
            let mut n = 2;
            while branch_exists(repo, &format!("{}-{n}", spec.branch))? {
                n += 1;
            }
            branch = format!("{}-{n}", spec.branch);
        }
    }
    if let Some(parent) = spec.path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_fail("create directory", parent, e))?;
    }
    let p = spec.path.to_string_lossy().into_owned();
    git(
        repo,
        &["worktree", "add", "-b", &branch, &p, &base_commit],
        "check the workspaces root is writable and the repository healthy",
    )?;
    Ok(Workspace {
        path: spec.path.clone(),
        branch,
        base_commit,
    })
}

/// Open a flow cycle's worktree for its next step (`spec.branch` is the
/// cycle's branch): the worktree already there on that branch as it is;
/// else the branch (which holds the cycle's earlier steps) checked out
/// again at `spec.path`; else a new branch from `spec.base`. The returned
/// `base_commit` is the head the step starts from, so the session's change
/// is measured against the previous step.
pub fn open_cycle(spec: &WorkspaceSpec) -> Result<Workspace, WorkspaceError> {
    check_repo(&spec.repo)?;
    validate_branch(&spec.branch).map_err(|e| WorkspaceError::Failed {
        command: "git check-ref-format".into(),
        stderr: e.to_string(),
        fix: "the cycle id of the hand-off is not a valid branch name".into(),
    })?;
    let repo = spec.repo.as_path();
    let there = list(repo)?
        .into_iter()
        .any(|w| same(&w.path, &spec.path) && w.branch.as_deref() == Some(&spec.branch));
    if !there {
        clear_path(repo, &spec.path)?;
        if let Some(parent) = spec.path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_fail("create directory", parent, e))?;
        }
        let p = spec.path.to_string_lossy().into_owned();
        let fix = "check the workspaces root is writable and the repository healthy";
        if branch_exists(repo, &spec.branch)? {
            git(repo, &["worktree", "add", &p, &spec.branch], fix)?;
        } else {
            let base_commit = rev(repo, &spec.base)?;
            git(
                repo,
                &["worktree", "add", "-b", &spec.branch, &p, &base_commit],
                fix,
            )?;
        }
    }
    set_aside_leftovers(spec)?;
    Ok(Workspace {
        path: spec.path.clone(),
        branch: spec.branch.clone(),
        base_commit: rev(&spec.path, "HEAD")?,
    })
}

/// A step starts where the flow left the branch ([`cycle_head_ref`]; before
/// the first step is applied, where the branch left the base): what a
/// session that answered nothing (failed, interrupted) left in the
/// worktree is committed under `refs/BRANCH/set-aside-N` and the worktree
/// moved back, so its retry starts from the same place.
fn set_aside_leftovers(spec: &WorkspaceSpec) -> Result<(), WorkspaceError> {
    let path = spec.path.as_path();
    let head_ref = cycle_head_ref(&spec.branch);
    let (ok, out, _) = run(
        path,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{head_ref}^{{commit}}"),
        ],
    )?;
    let start = if ok {
        String::from_utf8_lossy(&out).trim().to_string()
    } else {
        git(
            path,
            &["merge-base", &spec.base, "HEAD"],
            "check the base and the cycle's branch",
        )?
        .stdout
        .trim()
        .to_string()
    };
    let head = rev(path, "HEAD")?;
    let status = git(
        path,
        &["status", "--porcelain=v1", "-uall"],
        "check the worktree",
    )?;
    if head == start && status.stdout.trim().is_empty() {
        return Ok(());
    }
    let taken = git(
        path,
        &[
            "for-each-ref",
            "--format=%(refname)",
            &format!("refs/{}/", spec.branch),
        ],
        "check the cycle's refs",
    )?;
    let n = taken
        .stdout
        .lines()
        .filter(|l| l.contains("/set-aside-"))
        .count()
        + 1;
    snapshot(
        path,
        &format!("refs/{}/set-aside-{n}", spec.branch),
        "left by a session that answered nothing (set aside by agent-state)",
    )?;
    reset_to(path, &start)
}

/// Point the ref `name` at `commit` (from within the repository or one of
/// its worktrees).
pub fn set_ref(dir: &Path, name: &str, commit: &str) -> Result<(), WorkspaceError> {
    git(
        dir,
        &["update-ref", name, commit],
        "check the repository is writable",
    )?;
    Ok(())
}

/// The commit of a step in a cycle's worktree, made once: the ref `name`
/// if it exists (the step was taken already: a crash made it be applied
/// again), else everything in the worktree (commits, changes, new files
/// not ignored) committed by agent-state, and `name` set to it. Returns the
/// commit.
pub fn snapshot(worktree: &Path, name: &str, message: &str) -> Result<String, WorkspaceError> {
    let spec = format!("{name}^{{commit}}");
    let (ok, out, _) = run(worktree, &["rev-parse", "--verify", "--quiet", &spec])?;
    if ok {
        return Ok(String::from_utf8_lossy(&out).trim().to_string());
    }
    let fix = "check the worktree (a file git cannot add, a full disk)";
    git(worktree, &["add", "-A"], fix)?;
    let (clean, _, _) = run(
        worktree,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--cached",
            "--quiet",
        ],
    )?;
    if !clean {
        git(
            worktree,
            &[
                "-c",
                "user.name=agent-state",
                "-c",
                "user.email=agent-state@localhost",
                "-c",
                "commit.gpgsign=false",
                "commit",
                "-q",
                "--no-verify",
                "-m",
                message,
            ],
            fix,
        )?;
    }
    let head = rev(worktree, "HEAD")?;
    git(worktree, &["update-ref", name, &head], fix)?;
    Ok(head)
}

/// Move a cycle's worktree (and its branch) to `commit`, its changes and new
/// files (not ignored ones) gone: a step rolled back. What it held stays in
/// the step's ref ([`snapshot`]) and the cycle file.
pub fn reset_to(worktree: &Path, commit: &str) -> Result<(), WorkspaceError> {
    let fix = "reset the worktree by hand (`git reset --hard COMMIT`)";
    git(worktree, &["reset", "-q", "--hard", commit], fix)?;
    git(worktree, &["clean", "-q", "-f", "-d"], fix)?;
    Ok(())
}

/// The workspace's state at the end of a session, against `base` (a commit or ref).
pub fn finish(ws: &Workspace, base: &str) -> Result<Finished, WorkspaceError> {
    let head_commit = rev(&ws.path, "HEAD")?;
    let status = git(
        &ws.path,
        &["status", "--porcelain=v1", "-uall"],
        "check the worktree",
    )?;
    let range = format!("{base}..HEAD");
    let ahead = git(&ws.path, &["rev-list", "--count", &range], "check the base")?;
    Ok(Finished {
        head_commit,
        dirty: !status.stdout.trim().is_empty(),
        commits_ahead: ahead.stdout.trim().parse().unwrap_or(0),
    })
}

/// What [`invalid_commits`] judges of a workspace at the end of a session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GitState {
    /// HEAD's commit; `None` if HEAD does not resolve to one.
    pub head: Option<String>,
    /// The branch HEAD is on (`refs/heads/…` stripped); `None`: detached.
    pub branch: Option<String>,
    /// The base commit is an ancestor of HEAD (or HEAD itself).
    pub has_base: bool,
    /// Operations left half done: `merge`, `rebase`, `cherry-pick`, `revert`.
    pub in_progress: Vec<&'static str>,
    /// Paths with unmerged (conflicted) entries in the index.
    pub unmerged: usize,
}

/// Seed 002's `invalid_commits` ("broken git state"): why the commits a
/// session left in its workspace cannot be built on, or `None` when they
/// can. Invalid: HEAD names no commit; HEAD is not on the session's branch
/// (detached, or another branch: its commits are on no branch the daemon
/// keeps); the base is not in HEAD's history (rewritten below the base, or
/// reset to unrelated history); a merge, rebase, cherry-pick or revert left
/// half done; conflicted paths in the index. Pure.
pub fn invalid_commits(state: &GitState, branch: &str) -> Option<String> {
    let mut why = Vec::new();
    if state.head.is_none() {
        why.push("HEAD names no commit".to_string());
    }
    match &state.branch {
        None => why.push(format!("HEAD is detached, not on the branch {branch}")),
        Some(b) if b != branch => why.push(format!("HEAD is on the branch {b}, not {branch}")),
        Some(_) => {}
    }
    if state.head.is_some() && !state.has_base {
        why.push(
            "the base commit is not in HEAD's history (rewritten or unrelated history)".into(),
        );
    }
    if !state.in_progress.is_empty() {
        why.push(format!(
            "a {} left in progress",
            state.in_progress.join(" and a ")
        ));
    }
    if state.unmerged > 0 {
        why.push(format!(
            "{} conflicted path(s) in the index",
            state.unmerged
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The [`GitState`] of `ws` against its base commit.
pub fn git_state(ws: &Workspace) -> Result<GitState, WorkspaceError> {
    let dir = ws.path.as_path();
    let head = run(dir, &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])?;
    let head = head
        .0
        .then(|| String::from_utf8_lossy(&head.1).trim().to_string())
        .filter(|h| !h.is_empty());
    let symbolic = run(dir, &["symbolic-ref", "--quiet", "HEAD"])?;
    let branch = symbolic.0.then(|| {
        let r = String::from_utf8_lossy(&symbolic.1).trim().to_string();
        r.strip_prefix("refs/heads/").unwrap_or(&r).to_string()
    });
    let has_base = head.is_some()
        && git_ok(
            dir,
            &["merge-base", "--is-ancestor", &ws.base_commit, "HEAD"],
        )?;
    let mut in_progress = Vec::new();
    for (what, marker) in [
        ("merge", "MERGE_HEAD"),
        ("rebase", "rebase-merge"),
        ("rebase", "rebase-apply"),
        ("cherry-pick", "CHERRY_PICK_HEAD"),
        ("revert", "REVERT_HEAD"),
    ] {
        let out = git(
            dir,
            &["rev-parse", "--git-path", marker],
            "check the worktree",
        )?;
        let path = dir.join(out.stdout.trim());
        if std::fs::symlink_metadata(&path).is_ok() && !in_progress.contains(&what) {
            in_progress.push(what);
        }
    }
    let unmerged = git(dir, &["ls-files", "--unmerged", "-z"], "check the worktree")?;
    let mut paths: Vec<&str> = unmerged
        .stdout
        .split('\0')
        .filter_map(|e| e.split_once('\t').map(|(_, p)| p))
        .collect();
    paths.dedup();
    Ok(GitState {
        head,
        branch,
        has_base,
        in_progress,
        unmerged: paths.len(),
    })
}

/// Reset `ws` to its base after invalid commits: the worktree is removed
/// and its branch deleted, so the next session starts from the base. What
/// it held is set aside, never lost: the branch, if it has commits not on
/// the base, is renamed `{branch}-invalid` (`-invalid-N` if taken), and a
/// HEAD elsewhere (detached, another history) gets such a branch too.
/// Returns the branches set aside.
pub fn reset_invalid(repo: &Path, ws: &Workspace) -> Result<Vec<String>, WorkspaceError> {
    let head = run(
        &ws.path,
        &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
    )?;
    let head = head
        .0
        .then(|| String::from_utf8_lossy(&head.1).trim().to_string())
        .filter(|h| !h.is_empty() && *h != ws.base_commit);
    clear_path(repo, &ws.path)?;
    let aside = |repo: &Path| -> Result<String, WorkspaceError> {
        let mut name = format!("{}-invalid", ws.branch);
        let mut n = 2;
        while branch_exists(repo, &name)? {
            name = format!("{}-invalid-{n}", ws.branch);
            n += 1;
        }
        Ok(name)
    };
    let mut kept = Vec::new();
    let mut tip = None;
    if branch_exists(repo, &ws.branch)? {
        if branch_deletable(repo, &ws.branch, &ws.base_commit)? {
            git(
                repo,
                &["branch", "-D", &ws.branch],
                "delete the branch by hand",
            )?;
        } else {
            tip = Some(rev(repo, &format!("refs/heads/{}", ws.branch))?);
            let name = aside(repo)?;
            git(
                repo,
                &["branch", "-m", &ws.branch, &name],
                "rename the branch by hand",
            )?;
            kept.push(name);
        }
    }
    if let Some(head) = head.filter(|h| Some(h) != tip.as_ref()) {
        let name = aside(repo)?;
        git(
            repo,
            &["branch", &name, &head],
            "set the workspace's head aside by hand",
        )?;
        kept.push(name);
    }
    Ok(kept)
}

/// After a session: remove the worktree (and its branch) if clean and not ahead of the
/// base; otherwise keep it. Returns whether it was removed.
pub fn remove_if_clean(repo: &Path, ws: &Workspace) -> Result<bool, WorkspaceError> {
    let f = finish(ws, &ws.base_commit)?;
    if f.dirty || f.commits_ahead > 0 {
        return Ok(false);
    }
    remove(repo, ws)?;
    Ok(true)
}

/// Remove the worktree, and its branch if it has nothing not on the base.
pub fn remove(repo: &Path, ws: &Workspace) -> Result<(), WorkspaceError> {
    clear_path(repo, &ws.path)?;
    if branch_exists(repo, &ws.branch)? && branch_deletable(repo, &ws.branch, &ws.base_commit)? {
        git(
            repo,
            &["branch", "-D", &ws.branch],
            "delete the branch by hand",
        )?;
    }
    Ok(())
}

/// The worktrees of `repo` (`git worktree list --porcelain`).
pub fn list(repo: &Path) -> Result<Vec<WorktreeInfo>, WorkspaceError> {
    let out = git(
        repo,
        &["worktree", "list", "--porcelain"],
        "check the repository",
    )?;
    Ok(parse_worktree_list(&out.stdout))
}

/// Parse `git worktree list --porcelain` (pure).
pub fn parse_worktree_list(text: &str) -> Vec<WorktreeInfo> {
    let mut all = Vec::new();
    let mut cur: Option<WorktreeInfo> = None;
    for line in text.lines() {
        if let Some(p) = line.strip_prefix("worktree ") {
            if let Some(w) = cur.take() {
                all.push(w);
            }
            cur = Some(WorktreeInfo {
                path: PathBuf::from(p),
                ..Default::default()
            });
        } else if let Some(w) = cur.as_mut() {
            if let Some(h) = line.strip_prefix("HEAD ") {
                w.head = h.to_string();
            } else if let Some(b) = line.strip_prefix("branch ") {
                w.branch = Some(b.strip_prefix("refs/heads/").unwrap_or(b).to_string());
            } else if line == "locked" || line.starts_with("locked ") {
                w.locked = true;
            } else if line == "prunable" || line.starts_with("prunable ") {
                w.prunable = true;
            }
        }
    }
    all.extend(cur);
    all
}

/// A stable id of the working tree's content: HEAD, the index, and every tracked or
/// untracked (not ignored) file's content as git would hash it. Uses a temporary index so
/// the real one is untouched.
pub fn fingerprint(path: &Path) -> Result<String, WorkspaceError> {
    let head = rev(path, "HEAD").unwrap_or_default();
    let git_dir = git(
        path,
        &["rev-parse", "--absolute-git-dir"],
        "check the worktree",
    )?;
    let git_dir = PathBuf::from(git_dir.stdout.trim());
    let staged = git(
        path,
        &["write-tree"],
        "resolve the conflicts in the worktree",
    )
    .map(|o| o.stdout.trim().to_string())
    .unwrap_or_else(|_| "unmerged".into());
    let tmp_index = git_dir.join(format!("agent-state-fingerprint.{}", std::process::id()));
    // An empty temporary index, not a copy of the real one: a copy gets a new mtime, which
    // hides git's "racily clean" entries (a same-size edit in the same second would be
    // missed). Every file is hashed, which is the price of never missing a change.
    let _ = std::fs::remove_file(&tmp_index);
    let result = (|| {
        let (ok, _, stderr) = run_env(path, &["add", "-A"], Some(&tmp_index))?;
        if !ok {
            return Err(WorkspaceError::Failed {
                command: "git add -A (temporary index)".into(),
                stderr,
                fix: "check the worktree is readable".into(),
            });
        }
        let (ok, out, stderr) = run_env(path, &["write-tree"], Some(&tmp_index))?;
        if !ok {
            return Err(WorkspaceError::Failed {
                command: "git write-tree (temporary index)".into(),
                stderr,
                fix: "check the worktree".into(),
            });
        }
        Ok(String::from_utf8_lossy(&out).trim().to_string())
    })();
    let _ = std::fs::remove_file(&tmp_index);
    let tree = result?;
    Ok(format!("{head}:{staged}:{tree}"))
}

/// What [`prune`] did, one line per worktree under the root that is not live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub removed: Vec<(PathBuf, String)>,
    pub kept: Vec<(PathBuf, String)>,
}

/// Remove worktrees under `root` whose session is gone (not in `live`): clean ones at
/// once; kept ones (dirty or ahead of their base) only past `retention` (by the
/// directory's modification time against `now`), and never one with commits no remote
/// branch contains unless `force_unpushed`. `base` is the ref "ahead" is counted against.
pub fn prune(
    repo: &Path,
    root: &Path,
    base: &str,
    live: &[PathBuf],
    retention: Duration,
    now: std::time::SystemTime,
    force_unpushed: bool,
) -> Result<PruneReport, WorkspaceError> {
    let mut report = PruneReport::default();
    let root_c = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    for w in list(repo)? {
        let inside = w.path.starts_with(&root_c) || w.path.starts_with(root);
        if !inside || live.iter().any(|l| same(l, &w.path)) || w.locked {
            continue;
        }
        let Some(branch) = w.branch.clone() else {
            continue;
        };
        if is_cycle_branch(&branch) {
            report.kept.push((
                w.path,
                "a flow cycle's; removed when the cycle closes".into(),
            ));
            continue;
        }
        let ws = Workspace {
            path: w.path.clone(),
            branch,
            base_commit: rev(repo, base)?,
        };
        if w.prunable {
            git(
                repo,
                &["worktree", "prune"],
                "run `git worktree prune` by hand",
            )?;
            report
                .removed
                .push((w.path, "directory gone; pruned".into()));
            continue;
        }
        let f = finish(&ws, &ws.base_commit)?;
        if !f.dirty && f.commits_ahead == 0 {
            remove(repo, &ws)?;
            report.removed.push((w.path, "session gone, clean".into()));
            continue;
        }
        let age = std::fs::metadata(&w.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if age < retention {
            report
                .kept
                .push((w.path, "dirty or ahead, within retention".into()));
            continue;
        }
        if f.commits_ahead > 0 && !force_unpushed {
            let remotes = git(
                repo,
                &["branch", "-r", "--contains", &f.head_commit],
                "check remotes",
            )?;
            if remotes.stdout.trim().is_empty() {
                report
                    .kept
                    .push((w.path, "past retention but has unpushed commits".into()));
                continue;
            }
        }
        clear_path(repo, &w.path)?;
        report.removed.push((w.path, "past retention".into()));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    #[test]
    fn invalid_commits_are_a_broken_git_state_not_a_bad_change() {
        use super::{GitState, invalid_commits};
        let good = GitState {
            head: Some("abc".into()),
            branch: Some("rio/work".into()),
            has_base: true,
            in_progress: vec![],
            unmerged: 0,
        };
        let table: &[(&str, GitState, Option<&str>)] = &[
            ("commits on the branch, on the base", good.clone(), None),
            (
                "detached",
                GitState {
                    branch: None,
                    ..good.clone()
                },
                Some("HEAD is detached, not on the branch rio/work"),
            ),
            (
                "another branch",
                GitState {
                    branch: Some("main".into()),
                    ..good.clone()
                },
                Some("HEAD is on the branch main, not rio/work"),
            ),
            (
                "rewritten below the base",
                GitState {
                    has_base: false,
                    ..good.clone()
                },
                Some("the base commit is not in HEAD's history (rewritten or unrelated history)"),
            ),
            (
                "no commit at HEAD",
                GitState {
                    head: None,
                    has_base: false,
                    ..good.clone()
                },
                Some("HEAD names no commit"),
            ),
            (
                "a merge and a rebase half done, with conflicts",
                GitState {
                    in_progress: vec!["merge", "rebase"],
                    unmerged: 2,
                    ..good.clone()
                },
                Some("a merge and a rebase left in progress; 2 conflicted path(s) in the index"),
            ),
        ];
        for (what, state, want) in table {
            assert_eq!(
                invalid_commits(state, "rio/work").as_deref(),
                *want,
                "{what}"
            );
        }
    }

    use super::*;

    #[test]
    fn workspace_parses_worktree_list() {
        let text = "worktree /r\nHEAD abc\nbranch refs/heads/main\n\nworktree /w/a\nHEAD def\n\
                    branch refs/heads/rio/x\nlocked\n\nworktree /w/b\nHEAD 123\ndetached\nprunable gone\n";
        let l = parse_worktree_list(text);
        assert_eq!(l.len(), 3);
        assert_eq!(l[1].branch.as_deref(), Some("rio/x"));
        assert!(l[1].locked && !l[1].prunable);
        assert!(l[2].branch.is_none() && l[2].prunable);
    }

    #[test]
    fn workspace_errors_name_command_and_code() {
        assert_eq!(
            quote(&["worktree", "add", "a b"]),
            "git worktree add \"a b\""
        );
        let e = WorkspaceError::Locked {
            command: "git branch -D x".into(),
            stderr: "index.lock: File exists".into(),
        };
        assert!(
            e.to_string()
                .starts_with("WORKSPACE_LOCKED: `git branch -D x`")
        );
        assert!(is_lock_error(
            "fatal: Unable to create '/r/.git/index.lock': File exists."
        ));
    }

    #[test]
    fn a_bad_branch_says_the_name_and_why_as_before() {
        let table = [
            (
                "",
                BranchFault::Empty,
                "branch name \"\" is not valid: empty",
            ),
            (
                "a..b",
                BranchFault::Sequence,
                "branch name \"a..b\" is not valid: contains `..`, `@{` or `//`",
            ),
            (
                "a b",
                BranchFault::Char(' '),
                "branch name \"a b\" is not valid: contains ' '",
            ),
            (
                "a/x.lock",
                BranchFault::Component,
                "branch name \"a/x.lock\" is not valid: a component starts with `.` or ends with `.lock`",
            ),
        ];
        for (name, why, text) in table {
            let e = validate_branch(name).unwrap_err();
            assert_eq!(e.why, why, "{name:?}");
            assert_eq!(e.to_string(), text);
        }
        assert_eq!(validate_branch("rio/research-2026-11-24"), Ok(()));
    }
}
