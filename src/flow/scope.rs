//! The Actor's change, measured by the daemon with git (not taken from the
//! Actor's word): changed lines, files and paths, and the unified diff for
//! the cycle file. On a cycle's branch, between commits
//! ([`measure_commits`]: the step, committed by the daemon, against the
//! previous step's head; the cycle against its base); in any other
//! worktree, against its base commit, commits and uncommitted changes
//! alike, new untracked files included ([`measure`]).

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
    /// The step could not be committed on the cycle's branch.
    #[error("{0}")]
    Branch(String),
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
    /// The changed paths, relative to the repository.
    pub paths: Vec<String>,
}

/// The change between two commits of a cycle's branch (a step against the
/// previous one, or the cycle so far against its base): every change is
/// committed by then ([`crate::workspace::snapshot`]).
pub fn measure_commits(dir: &Path, from: &str, to: &str) -> Result<Measured, ScopeError> {
    let (ok, numstat) = git(
        dir,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--numstat",
            "--no-renames",
            from,
            to,
        ],
    )?;
    if !ok {
        return Err(ScopeError::Diff {
            base: from.to_string(),
            dir: dir.to_path_buf(),
            said: numstat.trim().to_string(),
        });
    }
    let (lines, files, paths) = numstat_figures(&numstat);
    let (_, diff) = git(
        dir,
        &[
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-color",
            "--no-renames",
            from,
            to,
        ],
    )?;
    Ok(Measured {
        scope: Scope { lines, files },
        diff,
        paths,
    })
}

/// Lines, files and paths of `git diff --numstat` (binary files, `-`, count
/// as one line). Pure.
fn numstat_figures(numstat: &str) -> (u64, u64, Vec<String>) {
    let mut lines = 0u64;
    let mut paths = Vec::new();
    for row in numstat.lines() {
        let mut parts = row.splitn(3, '\t');
        let (added, removed) = (parts.next().unwrap_or("-"), parts.next().unwrap_or("-"));
        lines = lines
            .saturating_add(added.parse::<u64>().unwrap_or(1))
            .saturating_add(removed.parse::<u64>().unwrap_or(0));
        paths.push(parts.next().unwrap_or("").to_string());
    }
    (lines, paths.len() as u64, paths)
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
            paths: Vec::new(),
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
    let (mut lines, mut files, mut paths) = numstat_figures(&numstat);
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
            paths.push(name.to_string());
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
        paths,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numstat_rows_give_lines_files_and_paths() {
        type Figures = (u64, u64, &'static [&'static str]);
        let table: &[(&str, Figures)] = &[
            ("", (0, 0, &[])),
            ("3\t0\tnotes.md\n", (3, 1, &["notes.md"])),
            (
                "2\t1\tdocs/a b.md\n-\t-\tlogo.png\n",
                (4, 2, &["docs/a b.md", "logo.png"]),
            ),
        ];
        for (text, (lines, files, paths)) in table {
            let (l, f, p) = numstat_figures(text);
            assert_eq!((l, f), (*lines, *files), "{text:?}");
            assert_eq!(p, *paths, "{text:?}");
        }
    }
}
