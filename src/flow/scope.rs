//! The Actor's change, measured by the daemon with git (not taken from the
//! Actor's word): changed lines and files of its worktree against the
//! worktree's base commit, commits and uncommitted changes alike, new
//! untracked files included; and the unified diff for the cycle file.

use std::path::{Path, PathBuf};

use super::route::Scope;

/// Why the Actor's change could not be measured (the reason the cycle
/// stops with: "the Actor's change could not be measured: …").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("the Actor's session had no worktree (does its agent have a workspace?)")]
    NoWorktree,
    /// git gave no exit status (not installed, too old, killed).
    #[error("git in {}: {error}", dir.display())]
    Git {
        dir: PathBuf,
        error: crate::git::RunError,
    },
    /// `git diff --numstat` failed, saying this.
    #[error("git diff --numstat {base} in {}: {said}", dir.display())]
    Diff {
        base: String,
        dir: PathBuf,
        said: String,
    },
}

/// The measured change and its diff.
pub struct Measured {
    pub scope: Scope,
    pub diff: String,
}

/// git in `dir` through the hardened runner ([`crate::git`]): (exit 0, stdout,
/// or stdout and stderr on failure).
fn git(dir: &Path, args: &[&str]) -> Result<(bool, String), ScopeError> {
    let mut full = vec!["-c", "core.quotepath=off"];
    full.extend_from_slice(args);
    let out = crate::git::run(dir, &full, &[]).map_err(|error| ScopeError::Git {
        dir: dir.to_path_buf(),
        error,
    })?;
    Ok((
        out.ok,
        out.stdout_text()
            + &if out.ok {
                String::new()
            } else {
                out.stderr_text()
            },
    ))
}

/// Measure the change in `worktree` against `base`. A worktree that is gone
/// (removed at the session's end because it held nothing) changed nothing.
pub fn measure(worktree: &Path, base: &str) -> Result<Measured, ScopeError> {
    if !worktree.exists() {
        return Ok(Measured {
            scope: Scope { lines: 0, files: 0 },
            diff: String::new(),
        });
    }
    let (ok, numstat) = git(
        worktree,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--numstat",
            "--no-renames",
            base,
        ],
    )?;
    if !ok {
        return Err(ScopeError::Diff {
            base: base.to_string(),
            dir: worktree.to_path_buf(),
            said: numstat.trim().to_string(),
        });
    }
    let mut lines = 0u64;
    let mut files = 0u64;
    for row in numstat.lines() {
        let mut parts = row.split('\t');
        let (added, removed) = (parts.next().unwrap_or("-"), parts.next().unwrap_or("-"));
        files += 1;
        // Binary files (`-`) count as one changed line.
        lines += added.parse::<u64>().unwrap_or(1) + removed.parse::<u64>().unwrap_or(0);
    }
    let (_, mut diff) = git(
        worktree,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-color",
            "--no-renames",
            base,
        ],
    )?;
    let (ok, untracked) = git(worktree, &["ls-files", "--others", "--exclude-standard"])?;
    if ok {
        for name in untracked.lines().filter(|l| !l.is_empty()) {
            files += 1;
            let path = worktree.join(name);
            // Only a regular file is read, and only its first MiB: a link, a
            // FIFO or a huge file is the Actor's input, counted as one line.
            let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
            if !regular {
                lines += 1;
                continue;
            }
            let text = read_head(&path);
            lines += match std::str::from_utf8(&text) {
                Ok(t) => t.lines().count().max(1) as u64,
                Err(_) => 1,
            };
            // `git diff --no-index` exits 1 when the files differ.
            let (_, d) = git(
                worktree,
                &[
                    "diff",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--no-color",
                    "--no-index",
                    "--",
                    "/dev/null",
                    name,
                ],
            )
            .unwrap_or_default();
            diff.push_str(&d);
        }
    }
    Ok(Measured {
        scope: Scope { lines, files },
        diff,
    })
}

/// The first MiB of the regular file `path`, opened without following a link
/// nor blocking on a FIFO swapped in since it was checked.
fn read_head(path: &Path) -> Vec<u8> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    let mut text = Vec::new();
    if let Ok(f) = file
        && f.metadata().is_ok_and(|m| m.is_file())
    {
        let _ = f.take(1 << 20).read_to_end(&mut text);
    }
    text
}
