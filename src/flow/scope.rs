//! The Actor's change, measured by the daemon with git (not taken from the
//! Actor's word): changed lines and files of its worktree against the
//! worktree's base commit, commits and uncommitted changes alike, new
//! untracked files included; and the unified diff for the cycle file.

use std::path::Path;
use std::process::{Command, Stdio};

use super::route::Scope;

/// The measured change and its diff.
pub struct Measured {
    pub scope: Scope,
    pub diff: String,
}

fn git(dir: &Path, args: &[&str]) -> Result<(bool, String), String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "core.quotepath=off"])
        .args(args)
        .env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned()
            + &if out.status.success() {
                String::new()
            } else {
                String::from_utf8_lossy(&out.stderr).into_owned()
            },
    ))
}

/// Measure the change in `worktree` against `base`. A worktree that is gone
/// (removed at the session's end because it held nothing) changed nothing.
pub fn measure(worktree: &Path, base: &str) -> Result<Measured, String> {
    if !worktree.exists() {
        return Ok(Measured {
            scope: Scope { lines: 0, files: 0 },
            diff: String::new(),
        });
    }
    let (ok, numstat) = git(worktree, &["diff", "--numstat", "--no-renames", base])?;
    if !ok {
        return Err(format!(
            "git diff --numstat {base} in {}: {}",
            worktree.display(),
            numstat.trim()
        ));
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
    let (_, mut diff) = git(worktree, &["diff", "--no-color", "--no-renames", base])?;
    let (ok, untracked) = git(worktree, &["ls-files", "--others", "--exclude-standard"])?;
    if ok {
        for name in untracked.lines().filter(|l| !l.is_empty()) {
            files += 1;
            let path = worktree.join(name);
            let text = std::fs::read(&path).unwrap_or_default();
            lines += match std::str::from_utf8(&text) {
                Ok(t) => t.lines().count().max(1) as u64,
                Err(_) => 1,
            };
            // `git diff --no-index` exits 1 when the files differ.
            let (_, d) = git(
                worktree,
                &["diff", "--no-color", "--no-index", "--", "/dev/null", name],
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
