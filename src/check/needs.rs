//! What the daemon will need, checked by `agent-state check` before it
//! needs it (seed 002's configuration errors: "Command not found" for each
//! verification command, "invalid path" for a non-existent path): each
//! agent's `command`, its `verify` commands and its workspace repository.
//!
//! [`look_at_program`] and [`look_at_repo`] are the IO; whether a finding is
//! an error or a warning ([`level`]) and its sentence ([`Need`]'s
//! `Display`) are pure. The rule: a warning where the thing may still
//! appear and the daemon waits for it without harm (a command that is not
//! installed yet: the daemon holds the agent, its messages untouched, until
//! it can run; a repository not cloned yet; a name the daemon searches on
//! its own `PATH`, which may differ from this shell's); an error where it
//! cannot work as it stands (a file that is not executable, a directory
//! that is not a git repository) or where the daemon would spend sessions
//! on it (a `verify` command at a path that does not exist fails every
//! session's verification after the session ran).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::{AgentConfig, AgentKind, Config};

/// How bad a [`Need`] is: errors make `check` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Error,
    Warning,
}

/// Which setting a finding is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Command,
    /// `verify[i]`.
    Verify(usize),
    /// `workspace.repo`.
    Repo,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Command => f.write_str("command"),
            Field::Verify(i) => write!(f, "verify[{i}]"),
            Field::Repo => f.write_str("workspace.repo"),
        }
    }
}

/// What was found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A program given by path that does not exist.
    NoSuchFile { path: PathBuf },
    /// A bare name not on this process's `PATH`.
    NotOnPath { program: String, path_var: String },
    /// Relative to each session's workspace, and not in the repository's
    /// working tree now.
    NotInRepo { program: String, repo: PathBuf },
    /// There, but not a regular file this user may execute.
    NotExecutable { path: PathBuf, why: String },
    /// The repository's path does not exist.
    RepoMissing { repo: PathBuf },
    /// The path exists but git does not take it for a repository.
    NotARepo { repo: PathBuf, why: String },
}

/// Error or warning: see the module doc for the rule.
pub fn level(field: &Field, found: &Found) -> Level {
    match (field, found) {
        (_, Found::NotExecutable { .. } | Found::NotARepo { .. }) => Level::Error,
        (Field::Verify(_), Found::NoSuchFile { .. }) => Level::Error,
        (Field::Command | Field::Repo, Found::NoSuchFile { .. }) => Level::Warning,
        (_, Found::NotOnPath { .. } | Found::NotInRepo { .. } | Found::RepoMissing { .. }) => {
            Level::Warning
        }
    }
}

/// One finding: the config file, the agent, the field, what and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub config: PathBuf,
    pub agent: String,
    pub field: Field,
    pub found: Found,
}

impl Need {
    pub fn level(&self) -> Level {
        level(&self.field, &self.found)
    }

    /// What it is and why it is an error or a warning.
    pub fn problem(&self) -> String {
        let agent = &self.agent;
        match &self.found {
            Found::NoSuchFile { path } => match self.field {
                Field::Verify(_) => format!(
                    "{} does not exist: every session's verification would fail after the session ran",
                    path.display()
                ),
                _ => format!(
                    "{} does not exist (yet): the daemon holds {agent}, its messages untouched, until it can run",
                    path.display()
                ),
            },
            Found::NotOnPath { program, path_var } => format!(
                "`{program}` is not on this shell's PATH ({path_var}); the daemon searches its own PATH, which may differ"
            ),
            Found::NotInRepo { program, repo } => format!(
                "{program} is run in each session's workspace (a worktree of {}) and is not in the repository's working tree now",
                repo.display()
            ),
            Found::NotExecutable { path, why } => {
                format!("{} cannot be executed: {why}", path.display())
            }
            Found::RepoMissing { repo } => format!(
                "{} does not exist (yet): every session of {agent} fails to make its workspace until it does",
                repo.display()
            ),
            Found::NotARepo { repo, why } => format!(
                "{} is not a git repository ({why}): every session of {agent} would fail to make its workspace",
                repo.display()
            ),
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> String {
        let field = &self.field;
        match &self.found {
            Found::NoSuchFile { path } => {
                format!("install {}, or fix `{field}`", path.display())
            }
            Found::NotOnPath { program, .. } => format!(
                "install `{program}`, or give its absolute path in `{field}` (`agent-state doctor` checks the unit's PATH)"
            ),
            Found::NotInRepo { program, .. } => format!(
                "commit {program} to the workspace's base, or give an absolute path in `{field}`"
            ),
            Found::NotExecutable { path, .. } => format!(
                "`chmod +x {}` (or point `{field}` at an executable)",
                path.display()
            ),
            Found::RepoMissing { repo } => format!(
                "clone or `git init` the repository at {}, or fix `{field}`",
                repo.display()
            ),
            Found::NotARepo { .. } => format!("point `{field}` at a git repository"),
        }
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config {}: agent {}: {}: {}; fix: {}",
            self.config.display(),
            self.agent,
            self.field,
            self.problem(),
            self.fix()
        )
    }
}

impl Serialize for Need {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Need", 6)?;
        st.serialize_field("level", &self.level())?;
        st.serialize_field("config", &self.config)?;
        st.serialize_field("agent", &self.agent)?;
        st.serialize_field("field", &self.field.to_string())?;
        st.serialize_field("problem", &self.problem())?;
        st.serialize_field("fix", &self.fix())?;
        st.end()
    }
}

/// Every need of every agent (humans run nothing).
pub fn check(config: &Config) -> Vec<Need> {
    let path_var = std::env::var_os("PATH");
    let mut out = Vec::new();
    for agent in config.agents.iter().filter(|a| a.kind == AgentKind::Agent) {
        for (field, found) in agent_needs(agent, path_var.as_deref()) {
            out.push(Need {
                config: config.source.clone(),
                agent: agent.name.to_string(),
                field,
                found,
            });
        }
    }
    out
}

fn agent_needs(agent: &AgentConfig, path_var: Option<&std::ffi::OsStr>) -> Vec<(Field, Found)> {
    let mut out = Vec::new();
    let repo = agent.session.workspace.as_ref().map(|w| w.repo.as_path());
    if let Some(program) = command_program(&agent.session.command)
        && let Some(found) = look_at_program(program, None, path_var)
    {
        out.push((Field::Command, found));
    }
    for (i, argv) in agent.session.iteration.verify.iter().enumerate() {
        if let Some(program) = argv.first()
            && let Some(found) = look_at_program(program, repo, path_var)
        {
            out.push((Field::Verify(i), found));
        }
    }
    if let Some(repo) = repo
        && let Some(found) = look_at_repo(repo)
    {
        out.push((Field::Repo, found));
    }
    out
}

/// The program of a command: `/usr/bin/env NAME=VALUE… PROGRAM` runs PROGRAM.
fn command_program(words: &[String]) -> Option<&String> {
    let first = words.first()?;
    if first != "env" && !first.ends_with("/env") {
        return Some(first);
    }
    words[1..]
        .iter()
        .find(|w| !w.contains('=') && !w.starts_with('-'))
        .or(Some(first))
}

/// Paths here are the operator's own, outside the state root, and are
/// looked at with their links followed (`Path::exists`, `is_dir`), as exec
/// and git follow them: `/bin/sh` on a merged-/usr system, a repository
/// under a linked `/srv` (`fsx` follows none: it is for the state root).
///
/// What is wrong with `program`, if anything can be told now: an absolute
/// path is looked at, a bare name searched on `path_var`, a relative path
/// looked for in `repo` (the workspace it runs in) if there is one. A
/// placeholder (`{workspace}`...) is told only when the session runs.
pub fn look_at_program(
    program: &str,
    repo: Option<&Path>,
    path_var: Option<&std::ffi::OsStr>,
) -> Option<Found> {
    if program.is_empty() || program.contains('{') {
        return None;
    }
    let path = Path::new(program);
    if path.is_absolute() {
        return match path.exists() {
            false => Some(Found::NoSuchFile {
                path: path.to_path_buf(),
            }),
            true => not_executable(path),
        };
    }
    if program.contains('/') {
        let repo = repo?;
        let path = repo.join(path);
        return match path.exists() {
            false => Some(Found::NotInRepo {
                program: program.to_string(),
                repo: repo.to_path_buf(),
            }),
            true => not_executable(&path),
        };
    }
    let path_var = path_var.unwrap_or_default();
    let mut denied = None;
    for dir in std::env::split_paths(path_var).filter(|d| d.is_absolute()) {
        let candidate = dir.join(program);
        if !candidate.exists() {
            continue;
        }
        match not_executable(&candidate) {
            None => return None,
            Some(why) => {
                denied.get_or_insert(why);
            }
        }
    }
    denied.or_else(|| {
        Some(Found::NotOnPath {
            program: program.to_string(),
            path_var: path_var.to_string_lossy().into_owned(),
        })
    })
}

/// `None` if `path` is a regular file this user may execute.
fn not_executable(path: &Path) -> Option<Found> {
    let why = match std::fs::metadata(path) {
        Err(e) => e.to_string(),
        Ok(m) if !m.is_file() => "not a regular file".to_string(),
        Ok(m) => match nix::unistd::access(path, nix::unistd::AccessFlags::X_OK) {
            Ok(()) => return None,
            Err(e) => {
                use std::os::unix::fs::PermissionsExt;
                format!("mode {:o}: {}", m.permissions().mode() & 0o7777, e.desc())
            }
        },
    };
    Some(Found::NotExecutable {
        path: path.to_path_buf(),
        why,
    })
}

/// What is wrong with a workspace repository, if anything.
pub fn look_at_repo(repo: &Path) -> Option<Found> {
    if !repo.exists() {
        return Some(Found::RepoMissing {
            repo: repo.to_path_buf(),
        });
    }
    if !repo.is_dir() {
        return Some(Found::NotARepo {
            repo: repo.to_path_buf(),
            why: "not a directory".into(),
        });
    }
    match crate::git::run(repo, &["rev-parse", "--git-dir"], &[]) {
        Ok(out) if out.ok => None,
        Ok(out) => Some(Found::NotARepo {
            repo: repo.to_path_buf(),
            why: out
                .stderr_text()
                .lines()
                .next()
                .unwrap_or("git rev-parse failed")
                .trim()
                .to_string(),
        }),
        // No git to ask: the daemon's workspace step says so itself.
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_where_it_cannot_work_warnings_where_it_may_appear() {
        let p = || PathBuf::from("/x");
        let nx = || Found::NotExecutable {
            path: p(),
            why: String::new(),
        };
        use Level::*;
        let table = [
            (Field::Command, Found::NoSuchFile { path: p() }, Warning),
            (Field::Verify(0), Found::NoSuchFile { path: p() }, Error),
            (Field::Command, nx(), Error),
            (Field::Verify(1), nx(), Error),
            (
                Field::Command,
                Found::NotOnPath {
                    program: "claude".into(),
                    path_var: "/usr/bin".into(),
                },
                Warning,
            ),
            (
                Field::Verify(0),
                Found::NotOnPath {
                    program: "cargo".into(),
                    path_var: "/usr/bin".into(),
                },
                Warning,
            ),
            (
                Field::Verify(0),
                Found::NotInRepo {
                    program: "./t.sh".into(),
                    repo: p(),
                },
                Warning,
            ),
            (Field::Repo, Found::RepoMissing { repo: p() }, Warning),
            (
                Field::Repo,
                Found::NotARepo {
                    repo: p(),
                    why: String::new(),
                },
                Error,
            ),
        ];
        for (field, found, want) in table {
            assert_eq!(level(&field, &found), want, "{field} {found:?}");
        }
    }

    #[test]
    fn a_need_names_the_file_the_agent_the_field_and_the_fix() {
        let need = Need {
            config: "/etc/agent-state/config.toml".into(),
            agent: "rio".into(),
            field: Field::Verify(1),
            found: Found::NotExecutable {
                path: "/opt/t.sh".into(),
                why: "mode 644: Permission denied".into(),
            },
        };
        assert_eq!(
            need.to_string(),
            "config /etc/agent-state/config.toml: agent rio: verify[1]: /opt/t.sh cannot be executed: mode 644: Permission denied; fix: `chmod +x /opt/t.sh` (or point `verify[1]` at an executable)"
        );
    }

    #[test]
    fn the_program_of_a_command() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let table: &[(&[&str], Option<&str>)] = &[
            (&["/bin/claude", "-p"], Some("/bin/claude")),
            (&["/usr/bin/env", "A=1", "-i", "claude"], Some("claude")),
            (&["env"], Some("env")),
            (&[], None),
        ];
        for (words, want) in table {
            assert_eq!(
                command_program(&w(words)).map(String::as_str),
                *want,
                "{words:?}"
            );
        }
    }

    #[test]
    fn what_a_program_lookup_finds() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("exe");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path_var = dir.path().as_os_str();
        let kind = |program: &str, repo: Option<&Path>| {
            look_at_program(program, repo, Some(path_var)).map(|f| match f {
                Found::NoSuchFile { .. } => "no such file",
                Found::NotOnPath { .. } => "not on PATH",
                Found::NotInRepo { .. } => "not in repo",
                Found::NotExecutable { .. } => "not executable",
                _ => "other",
            })
        };
        let exe_s = exe.display().to_string();
        let plain_s = plain.display().to_string();
        let missing = dir.path().join("missing").display().to_string();
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path(), bin.path().join("bin")).unwrap();
        let linked_s = bin.path().join("bin/exe").display().to_string();
        let table: &[(&str, Option<&Path>, Option<&str>)] = &[
            (&exe_s, None, None),
            ("exe", None, None),
            (&plain_s, None, Some("not executable")),
            ("plain", None, Some("not executable")),
            (&missing, None, Some("no such file")),
            ("missing", None, Some("not on PATH")),
            ("./exe", Some(dir.path()), None),
            ("./missing", Some(dir.path()), Some("not in repo")),
            ("./missing", None, None),
            ("{workspace}/t.sh", None, None),
            // Through a linked directory, as /bin/sh is on a merged-/usr
            // system: found, as exec finds it.
            (&linked_s, None, None),
        ];
        // (root may execute a 0644 file: access(2) says so for root only if
        // some x bit is set, so the table holds for root too.)
        for (program, repo, want) in table {
            assert_eq!(kind(program, *repo), *want, "{program}");
        }
    }

    #[test]
    fn a_repository_through_a_linked_directory_is_found_as_git_finds_it() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let ok = std::process::Command::new("git")
            .args(["init", "-q"])
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(ok.success());
        let srv = dir.path().join("srv");
        std::os::unix::fs::symlink(dir.path(), &srv).unwrap();
        assert_eq!(look_at_repo(&srv.join("repo")), None);
        assert!(matches!(
            look_at_repo(&srv.join("missing")),
            Some(Found::RepoMissing { .. })
        ));
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            look_at_repo(&srv.join("file")),
            Some(Found::NotARepo { .. })
        ));
    }
}
