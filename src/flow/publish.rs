//! Publishing an approved cycle (`[[flow]] publish = { into, remote }`):
//! agent-state lands the cycle's branch on the remote's branch itself, and
//! each way that fails is its own catalogue code with seed 002's recovery
//! ("Merge Errors"): a conflict (classified SIMPLE / MEDIUM / COMPLEX as the
//! seed's `classifyConflict`), nothing to merge, not mergeable, a protected
//! branch; anything else is `PUBLISH_FAILED`.
//!
//! The steps, every git command through [`crate::git`] in the Actor's
//! worktree: what is left uncommitted there is committed ("flow F cycle
//! C"); the remote's branch is read (`ls-remote`, then fetched into a
//! private ref); the branch already in its history → nothing to merge; no
//! common history → not mergeable; the remote's branch behind → pushed as
//! it is; diverged → the seed's "rebase attempt", in a temporary worktree:
//! clean → pushed rebased; conflicts → classified, and a SIMPLE one
//! (whitespace only: the rebase ignoring whitespace succeeds) is published
//! that way. The push is `--porcelain`: git's machine-readable status says
//! whether the remote refused it (`[remote rejected]`: protected) or found
//! it behind (`[rejected]`: it moved meanwhile, not mergeable). The Actor's
//! branch itself is never rewritten.

use std::path::{Path, PathBuf};

use crate::catalogue::Code;
use crate::config::PublishSettings;

/// The seed's conflict levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Simple,
    Medium,
    Complex,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Simple => "SIMPLE",
            Level::Medium => "MEDIUM",
            Level::Complex => "COMPLEX",
        }
    }
}

/// What a rebase's conflicts were.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conflict {
    /// Conflicted paths.
    pub files: Vec<String>,
    /// A path renamed or deleted on one side (an unmerged entry other than
    /// both-modified).
    pub renamed_or_deleted: bool,
    /// Lines between the conflict markers, all files.
    pub lines: usize,
    /// The rebase ignoring whitespace went through.
    pub whitespace_only: bool,
}

/// The seed's `classifyConflict`. Pure.
pub fn classify(c: &Conflict) -> Level {
    if c.whitespace_only {
        Level::Simple
    } else if c.renamed_or_deleted || c.lines > 50 {
        Level::Complex
    } else {
        Level::Medium
    }
}

/// A publish that did what it should.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The remote's branch now points at `commit`. `rebased`: the branch
    /// was rebased onto it first; `resolved`: a SIMPLE conflict resolved.
    Pushed {
        commit: String,
        rebased: bool,
        resolved: Option<Conflict>,
    },
    /// Already in the remote's branch (`MERGE_NOTHING_TO_MERGE`).
    NothingToMerge,
}

/// A publish that did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub code: Code,
    pub message: String,
    pub conflict: Option<Conflict>,
}

impl Failed {
    fn new(code: Code, message: impl Into<String>) -> Failed {
        Failed {
            code,
            message: message.into(),
            conflict: None,
        }
    }
}

/// What a `git push --porcelain` said of the one ref it pushed. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushStatus {
    Pushed,
    /// `[remote rejected]`: the remote's own refusal (protection, hook).
    RemoteRejected,
    /// `[rejected]`: not a fast-forward (the remote's branch moved).
    Rejected,
    /// No status line for the ref (unreachable, git failed).
    Unknown,
}

/// Read `git push --porcelain`'s line for `dst` (`FLAG\tFROM:TO\tSUMMARY`).
pub fn push_status(stdout: &str, dst: &str) -> PushStatus {
    for line in stdout.lines() {
        let mut parts = line.splitn(3, '\t');
        let (Some(flag), Some(refs), summary) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if !refs.ends_with(&format!(":{dst}")) {
            continue;
        }
        let summary = summary.unwrap_or("");
        return match flag {
            " " | "+" | "*" | "=" | "-" => PushStatus::Pushed,
            "!" if summary.starts_with("[remote rejected]") => PushStatus::RemoteRejected,
            "!" => PushStatus::Rejected,
            _ => PushStatus::Unknown,
        };
    }
    PushStatus::Unknown
}

/// Count the lines between `<<<<<<<` and `>>>>>>>` markers. Pure.
pub fn conflict_lines(text: &str) -> usize {
    let mut inside = false;
    let mut n = 0;
    for line in text.lines() {
        if line.starts_with("<<<<<<<") {
            inside = true;
        } else if line.starts_with(">>>>>>>") {
            inside = false;
        } else if inside && !line.starts_with("=======") && !line.starts_with("|||||||") {
            n += 1;
        }
    }
    n
}

/// Commit the user's identity-free way: agent-state is the committer.
const IDENTITY: [&str; 4] = [
    "-c",
    "user.name=agent-state",
    "-c",
    "user.email=agent-state@localhost",
];

struct Git<'a> {
    dir: &'a Path,
}

struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Git<'_> {
    fn run(&self, args: &[&str]) -> Result<Ran, Failed> {
        match crate::git::run(self.dir, args, &[]) {
            Ok(o) => Ok(Ran {
                ok: o.ok,
                stdout: o.stdout_text(),
                stderr: o.stderr_text(),
            }),
            Err(e) => Err(Failed::new(
                Code::PublishFailed,
                format!("`git {}`: {e}", args.join(" ")),
            )),
        }
    }

    /// Must succeed, else `PUBLISH_FAILED` naming the command.
    fn must(&self, args: &[&str]) -> Result<String, Failed> {
        let r = self.run(args)?;
        if r.ok {
            Ok(r.stdout.trim().to_string())
        } else {
            Err(Failed::new(
                Code::PublishFailed,
                format!("`git {}` failed: {}", args.join(" "), last_line(&r.stderr)),
            ))
        }
    }
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(500)
        .collect()
}

/// Publish `branch` (checked out in `worktree`) as `settings` says;
/// `message` for a commit of what was left uncommitted.
pub fn publish(
    worktree: &Path,
    branch: &str,
    settings: &PublishSettings,
    message: &str,
) -> Result<Published, Failed> {
    if !worktree.is_dir() {
        return Err(Failed::new(
            Code::PublishFailed,
            format!("the Actor's worktree {} is gone", worktree.display()),
        ));
    }
    let git = Git { dir: worktree };
    // What the Actor left uncommitted is its work too.
    if !git.must(&["status", "--porcelain", "-uall"])?.is_empty() {
        git.must(&["add", "-A"])?;
        let mut args = IDENTITY.to_vec();
        args.extend(["commit", "-q", "--no-verify", "-m", message]);
        git.must(&args)?;
    }
    let head = git.must(&[
        "rev-parse",
        "--verify",
        &format!("refs/heads/{branch}^{{commit}}"),
    ])?;
    let remote = settings.remote.as_str();
    let dst = format!("refs/heads/{}", settings.into);
    let listed = git.run(&["ls-remote", "--heads", "--", remote, &dst])?;
    if !listed.ok {
        return Err(Failed::new(
            Code::PublishFailed,
            format!("cannot read {remote}: {}", last_line(&listed.stderr)),
        ));
    }
    let target = if listed.stdout.trim().is_empty() {
        None
    } else {
        let private = format!("refs/agent-state/publish/{}", settings.into);
        git.must(&[
            "fetch",
            "--quiet",
            "--no-tags",
            "--",
            remote,
            &format!("+{dst}:{private}"),
        ])?;
        Some(git.must(&["rev-parse", "--verify", &format!("{private}^{{commit}}")])?)
    };
    let (commit, rebased, resolved) = match &target {
        None => (head.clone(), false, None),
        Some(t) => {
            if git.run(&["merge-base", "--is-ancestor", &head, t])?.ok {
                return Ok(Published::NothingToMerge);
            }
            if !git.run(&["merge-base", &head, t])?.ok {
                return Err(Failed::new(
                    Code::MergeNotMergeable,
                    format!(
                        "{branch} shares no history with {remote} {}: nothing to rebase it onto",
                        settings.into
                    ),
                ));
            }
            if git.run(&["merge-base", "--is-ancestor", t, &head])?.ok {
                (head.clone(), false, None)
            } else {
                let (commit, resolved) = rebase(&git, worktree, &head, t, branch, settings)?;
                (commit, true, resolved)
            }
        }
    };
    let pushed = git.run(&[
        "push",
        "--porcelain",
        "--",
        remote,
        &format!("{commit}:{dst}"),
    ])?;
    match push_status(&pushed.stdout, &dst) {
        PushStatus::Pushed if pushed.ok => Ok(Published::Pushed {
            commit,
            rebased,
            resolved,
        }),
        PushStatus::RemoteRejected => Err(Failed::new(
            Code::MergeProtectedBranch,
            format!(
                "{remote} refused the push to {}: {}",
                settings.into,
                refusal(&pushed)
            ),
        )),
        PushStatus::Rejected => Err(Failed::new(
            Code::MergeNotMergeable,
            format!(
                "{remote} {} moved while {branch} was published (not a fast-forward)",
                settings.into
            ),
        )),
        _ => Err(Failed::new(
            Code::PublishFailed,
            format!("`git push {remote}` failed: {}", last_line(&pushed.stderr)),
        )),
    }
}

/// The remote's words for its refusal (its hook's output, git's summary).
fn refusal(r: &Ran) -> String {
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("remote: "))
        .filter(|l| !l.trim().is_empty())
        .collect();
    if said.is_empty() {
        last_line(&r.stdout)
    } else {
        said.join(" / ").chars().take(500).collect()
    }
}

/// The seed's "rebase attempt", in a temporary detached worktree (the
/// Actor's branch is never rewritten): the rebased commit, and the SIMPLE
/// conflict it resolved if it had to.
fn rebase(
    git: &Git<'_>,
    worktree: &Path,
    head: &str,
    target: &str,
    branch: &str,
    settings: &PublishSettings,
) -> Result<(String, Option<Conflict>), Failed> {
    let tmp = temp_worktree(worktree);
    let tmp_s = tmp.to_string_lossy().into_owned();
    git.must(&["worktree", "add", "--detach", "--quiet", &tmp_s, head])?;
    let result = (|| {
        let t = Git { dir: &tmp };
        let mut args = IDENTITY.to_vec();
        args.extend(["rebase", "--quiet", target]);
        if t.run(&args)?.ok {
            return Ok((t.must(&["rev-parse", "HEAD"])?, None));
        }
        let mut conflict = conflicts(&t, &tmp)?;
        let _ = t.run(&["rebase", "--abort"]);
        let mut args = IDENTITY.to_vec();
        args.extend(["rebase", "--quiet", "-Xignore-all-space", target]);
        if t.run(&args)?.ok {
            conflict.whitespace_only = true;
            return Ok((t.must(&["rev-parse", "HEAD"])?, Some(conflict)));
        }
        let _ = t.run(&["rebase", "--abort"]);
        let level = classify(&conflict);
        Err(Failed {
            code: Code::MergeConflict,
            message: format!(
                "{branch} conflicts with {} {} ({} level: {} file(s): {}; {} conflicting line(s)){}",
                settings.remote,
                settings.into,
                level.as_str(),
                conflict.files.len(),
                conflict.files.join(", "),
                conflict.lines,
                if conflict.renamed_or_deleted {
                    "; a file renamed or deleted"
                } else {
                    ""
                }
            ),
            conflict: Some(conflict),
        })
    })();
    let _ = git.run(&["worktree", "remove", "--force", "--force", &tmp_s]);
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = git.run(&["worktree", "prune"]);
    result
}

fn temp_worktree(worktree: &Path) -> PathBuf {
    let name = worktree
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    worktree.with_file_name(format!(".{name}.publish-{}", std::process::id()))
}

/// The conflicts a stopped rebase left in `dir`.
fn conflicts(t: &Git<'_>, dir: &Path) -> Result<Conflict, Failed> {
    let status = t.must(&["status", "--porcelain=v2", "-z"])?;
    let mut c = Conflict::default();
    for entry in status.split('\0') {
        // u XY sub m1 m2 m3 mW h1 h2 h3 path
        let Some(rest) = entry.strip_prefix("u ") else {
            continue;
        };
        let fields: Vec<&str> = rest.splitn(10, ' ').collect();
        let (Some(xy), Some(path)) = (fields.first(), fields.get(9)) else {
            continue;
        };
        if *xy != "UU" {
            c.renamed_or_deleted = true;
        }
        c.files.push(path.to_string());
        if let Ok(text) = std::fs::read_to_string(dir.join(path)) {
            c.lines += conflict_lines(&text);
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_are_classified_as_the_seed_says() {
        let c = |whitespace_only, renamed_or_deleted, lines| Conflict {
            files: vec!["a".into()],
            renamed_or_deleted,
            lines,
            whitespace_only,
        };
        let table = [
            (c(true, false, 3), Level::Simple),
            (c(true, true, 300), Level::Simple),
            (c(false, true, 1), Level::Complex),
            (c(false, false, 51), Level::Complex),
            (c(false, false, 50), Level::Medium),
            (c(false, false, 1), Level::Medium),
        ];
        for (conflict, want) in table {
            assert_eq!(classify(&conflict), want, "{conflict:?}");
        }
    }

    #[test]
    fn conflict_lines_are_the_lines_between_the_markers() {
        let text = "a\n<<<<<<< HEAD\nours 1\nours 2\n=======\ntheirs\n>>>>>>> x\nb\n<<<<<<< HEAD\n||||||| base\n=======\nt\n>>>>>>> y\n";
        assert_eq!(conflict_lines(text), 4);
        assert_eq!(conflict_lines("no markers\n"), 0);
    }

    #[test]
    fn the_push_status_is_read_from_git_s_porcelain_output() {
        let dst = "refs/heads/main";
        let table = [
            (
                "To /r.git\n \tabc:refs/heads/main\t[new branch]\nDone\n",
                PushStatus::Pushed,
            ),
            (
                "To /r.git\n \t1a2b:refs/heads/main\t1..2\nDone\n",
                PushStatus::Pushed,
            ),
            (
                "To /r.git\n!\tabc:refs/heads/main\t[remote rejected] (pre-receive hook declined)\nDone\n",
                PushStatus::RemoteRejected,
            ),
            (
                "To /r.git\n!\tabc:refs/heads/main\t[rejected] (fetch first)\nDone\n",
                PushStatus::Rejected,
            ),
            (
                "To /r.git\n!\tabc:refs/heads/other\t[remote rejected] (x)\nDone\n",
                PushStatus::Unknown,
            ),
            ("", PushStatus::Unknown),
        ];
        for (out, want) in table {
            assert_eq!(push_status(out, dst), want, "{out:?}");
        }
    }

    /// Real repositories: a bare remote and a clone with a branch.
    mod git {
        use super::super::*;
        use std::process::Command;

        fn sh(dir: &Path, args: &[&str]) -> String {
            let out = Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@x",
                    "-c",
                    "commit.gpgsign=false",
                ])
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }

        /// A bare remote with `main` (notes.md), a clone of it at `work`
        /// on branch `cycle` from main.
        fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, PublishSettings) {
            let d = tempfile::tempdir().unwrap();
            let seed = d.path().join("seed");
            std::fs::create_dir(&seed).unwrap();
            sh(&seed, &["init", "-q", "-b", "main"]);
            std::fs::write(seed.join("notes.md"), "one\ntwo\nthree\n").unwrap();
            sh(&seed, &["add", "-A"]);
            sh(&seed, &["commit", "-qm", "base"]);
            let remote = d.path().join("remote.git");
            sh(d.path(), &["clone", "-q", "--bare", "seed", "remote.git"]);
            sh(d.path(), &["clone", "-q", "remote.git", "work"]);
            let work = d.path().join("work");
            sh(&work, &["checkout", "-q", "-b", "cycle"]);
            let settings = PublishSettings {
                into: "main".into(),
                remote: remote.display().to_string(),
            };
            (d, work, seed, settings)
        }

        #[test]
        fn nothing_to_merge_and_a_fast_forward() {
            let (d, work, _, s) = setup();
            assert_eq!(
                publish(&work, "cycle", &s, "m"),
                Ok(Published::NothingToMerge)
            );
            // Uncommitted work is committed, then pushed as it is.
            std::fs::write(work.join("notes.md"), "one\ntwo\nthree\nfour\n").unwrap();
            let Ok(Published::Pushed {
                commit, rebased, ..
            }) = publish(&work, "cycle", &s, "flow x")
            else {
                panic!()
            };
            assert!(!rebased);
            assert_eq!(
                sh(&d.path().join("remote.git"), &["rev-parse", "main"]),
                commit
            );
            assert_eq!(sh(&work, &["log", "-1", "--format=%s"]), "flow x");
            assert_eq!(
                publish(&work, "cycle", &s, "m"),
                Ok(Published::NothingToMerge)
            );
        }

        #[test]
        fn unrelated_histories_are_not_mergeable() {
            let (_d, work, _, s) = setup();
            sh(&work, &["checkout", "-q", "--orphan", "other"]);
            std::fs::write(work.join("x"), "x\n").unwrap();
            sh(&work, &["add", "-A"]);
            sh(&work, &["commit", "-qm", "unrelated"]);
            let e = publish(&work, "other", &s, "m").unwrap_err();
            assert_eq!(e.code, Code::MergeNotMergeable, "{e:?}");
            assert!(e.message.contains("shares no history"), "{}", e.message);
        }

        #[test]
        fn diverged_branches_are_rebased_and_conflicts_classified() {
            let (d, work, _, s) = setup();
            // The remote's main moves on: another file, and line two.
            let other = d.path().join("other");
            sh(d.path(), &["clone", "-q", "remote.git", "other"]);
            std::fs::write(other.join("more.md"), "more\n").unwrap();
            sh(&other, &["add", "-A"]);
            sh(&other, &["commit", "-qm", "more"]);
            sh(&other, &["push", "-q", "origin", "main"]);
            // A change elsewhere: rebased and pushed.
            std::fs::write(work.join("mine.md"), "mine\n").unwrap();
            let Ok(Published::Pushed {
                rebased: true,
                resolved: None,
                ..
            }) = publish(&work, "cycle", &s, "mine")
            else {
                panic!()
            };
            // Now both change line two: MEDIUM, nothing pushed.
            sh(&other, &["pull", "-q", "--rebase", "origin", "main"]);
            std::fs::write(other.join("notes.md"), "one\nTWO (theirs)\nthree\n").unwrap();
            sh(&other, &["commit", "-qam", "theirs"]);
            sh(&other, &["push", "-q", "origin", "main"]);
            let before = sh(&d.path().join("remote.git"), &["rev-parse", "main"]);
            std::fs::write(work.join("notes.md"), "one\ntwo (mine)\nthree\n").unwrap();
            let e = publish(&work, "cycle", &s, "ours").unwrap_err();
            assert_eq!(e.code, Code::MergeConflict, "{e:?}");
            let c = e.conflict.clone().unwrap();
            assert_eq!(c.files, ["notes.md"]);
            assert_eq!(classify(&c), Level::Medium, "{c:?}");
            assert!(e.message.contains("MEDIUM level"), "{}", e.message);
            assert_eq!(
                sh(&d.path().join("remote.git"), &["rev-parse", "main"]),
                before
            );
            assert_eq!(
                sh(&work, &["branch", "--show-current"]),
                "cycle",
                "never rewritten"
            );
        }
    }
}
