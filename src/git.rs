//! Every git command the daemon and the CLI run in a repository (workspaces,
//! a flow's measured change, `doctor`'s checks), run so that the repository
//! cannot make it run anything else.
//!
//! The repositories are written by agents: a session can set a key in
//! `.git/config`, in `.git/info/attributes`, in a committed `.gitattributes`,
//! or in the service user's `~/.gitconfig` (sessions run as the service
//! user). A git run by the daemon would then run that command as the service
//! user, outside any session's process group, cgroup and time limit. So each
//! command is built here with a cleared environment (nothing like `GIT_DIR`,
//! `GIT_SSH_COMMAND` or `GIT_EXTERNAL_DIFF` is inherited), no system config,
//! and command-scope config (which wins over the repository's) that turns off
//! each key that names a program: hooks (`core.hooksPath`), `core.fsmonitor`,
//! `core.sshCommand`, `core.askPass`, `core.pager`, credential helpers,
//! `core.gitProxy` (through `GIT_PROXY_COMMAND`), the `ext::` transport,
//! submodule recursion, and every filter driver (`filter.NAME.clean`,
//! `smudge`, `process`) whose name the repository's config defines, read just
//! before the command. Diffs are asked with `--no-ext-diff --no-textconv` by
//! their callers. The command runs in its own process group, killed whole
//! past [`TIMEOUT`], its output bounded. A git older than 2.31 (which
//! ignores `GIT_CONFIG_COUNT`, hence all of the above) is refused.
//!
//! The filter names are read from the config and from every file an include
//! names, its condition aside (`includeIf "onbranch:…"` may hold only in the
//! worktree being checked out). Left open (see README, "Permission model"):
//! a submodule's own config, and a name added between the read and the
//! command (a race another session of the same repository could run).
//! This module must never run git through a shell nor inherit the caller's
//! environment.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Time limit of one git command.
pub const TIMEOUT: Duration = Duration::from_secs(60);
const MAX_OUTPUT: usize = 1 << 20;
/// How many included config files are read for filter names, at most.
const MAX_INCLUDES: usize = 32;

/// Command-scope config that disables each key naming a program. Set through
/// `GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` (never parsed from `key=value`),
/// so a filter name with `=` or spaces is overridden exactly.
const OVERRIDES: &[(&str, &str)] = &[
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.sshCommand", "ssh"),
    ("core.askPass", ""),
    ("core.pager", "cat"),
    ("core.attributesFile", "/dev/null"),
    // An empty value empties the list of helpers read so far.
    ("credential.helper", ""),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
    ("log.showSignature", "false"),
];

/// The environment kept from the caller's (everything else is dropped).
const KEPT_ENV: &[&str] = &["PATH", "HOME", "TMPDIR", "USER", "LOGNAME"];

/// A finished git command.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub ok: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Output {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Why a git command gave no exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// git could not be started (not installed, not on PATH).
    Spawn(String),
    /// Killed (with its process group) past the time limit.
    Timeout(Duration),
    /// A git too old to take config through `GIT_CONFIG_COUNT` (2.31):
    /// its hardening would be silently ignored, so nothing is run.
    TooOld(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Spawn(e) => write!(f, "cannot run git: {e}"),
            RunError::Timeout(t) => write!(f, "killed after {} s", t.as_secs()),
            RunError::TooOld(v) => write!(
                f,
                "{v} is older than 2.31: it would ignore the settings that keep the repository's hooks and filters from running, so agent-state runs no git with it; install git 2.31 or later"
            ),
        }
    }
}

/// Extra environment for one command (e.g. a temporary `GIT_INDEX_FILE`).
pub type Env<'a> = &'a [(&'a str, &'a Path)];

/// `git ARGS` in `dir`, hardened (see the module doc), waited for up to [`TIMEOUT`].
pub fn run(dir: &Path, args: &[&str], env: Env) -> Result<Output, RunError> {
    check_version()?;
    let filters = filter_names(dir, env);
    let mut cmd = base(dir, env, &filters);
    cmd.args(args);
    wait(cmd, TIMEOUT)
}

/// Refuse a git older than 2.31 (asked once per process).
fn check_version() -> Result<(), RunError> {
    static VERSION: std::sync::OnceLock<Result<(), RunError>> = std::sync::OnceLock::new();
    VERSION
        .get_or_init(|| {
            let mut cmd = Command::new("git");
            cmd.arg("--version")
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(path) = std::env::var_os("PATH") {
                cmd.env("PATH", path);
            }
            let out = wait(cmd, TIMEOUT)?;
            let text = out.stdout_text().trim().to_string();
            if version_at_least(&text, (2, 31)) {
                Ok(())
            } else {
                Err(RunError::TooOld(text))
            }
        })
        .clone()
}

/// `git version 2.47.3` (or `2.39.5.windows.1`) at least `min`?
fn version_at_least(text: &str, min: (u32, u32)) -> bool {
    let Some(v) = text.strip_prefix("git version ") else {
        return false;
    };
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= min
}

/// The hardened command, without its arguments.
fn base(dir: &Path, env: Env, filters: &[String]) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir).env_clear();
    for key in KEPT_ENV {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_PAGER", "cat")
        .env("PAGER", "cat")
        // Set and empty: git then ignores `core.gitProxy` from any config.
        .env("GIT_PROXY_COMMAND", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut pairs: Vec<(String, String)> = OVERRIDES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // The directory is trusted for this command whoever owns it: `doctor`
    // and `workspaces` run as root over repositories the service user owns
    // ("dubious ownership" otherwise). What git's ownership check guards
    // against, a repository's config running programs, is turned off above
    // for every command run here.
    pairs.push(("safe.directory".into(), dir.display().to_string()));
    for name in filters {
        for (key, value) in [
            ("clean", ""),
            ("smudge", ""),
            ("process", ""),
            ("required", "false"),
        ] {
            pairs.push((format!("filter.{name}.{key}"), value.to_string()));
        }
    }
    cmd.env("GIT_CONFIG_COUNT", pairs.len().to_string());
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k);
        cmd.env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    cmd
}

/// The filter drivers the config seen from `dir` defines (`filter.NAME.*`),
/// also in every file an include names, whether or not its condition holds
/// now: `includeIf "onbranch:…"` may hold in the worktree a checkout makes.
fn filter_names(dir: &Path, env: Env) -> Vec<String> {
    let filters = ["--name-only", "--get-regexp", r"^filter\."];
    let mut names = parse_filter_names(&config(dir, env, None, &filters));
    let mut files = include_paths(dir, env, None);
    let mut seen: Vec<PathBuf> = Vec::new();
    while let Some(file) = files.pop() {
        if seen.contains(&file) || seen.len() >= MAX_INCLUDES {
            continue;
        }
        seen.push(file.clone());
        if !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
            continue;
        }
        for name in parse_filter_names(&config(dir, env, Some(&file), &filters)) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        files.extend(include_paths(dir, env, Some(&file)));
    }
    names
}

/// `git config -z ARGS`, of the repository's config seen from `dir` or of
/// one `file` alone (its includes not followed); stdout, empty on failure.
fn config(dir: &Path, env: Env, file: Option<&Path>, args: &[&str]) -> Vec<u8> {
    let mut cmd = base(dir, env, &[]);
    cmd.args(["config", "-z"]);
    if let Some(file) = file {
        cmd.arg("--no-includes").arg("--file").arg(file);
    }
    cmd.args(args);
    wait(cmd, TIMEOUT).map(|o| o.stdout).unwrap_or_default()
}

/// The files the `include.path` and `includeIf.*.path` keys name.
fn include_paths(dir: &Path, env: Env, file: Option<&Path>) -> Vec<PathBuf> {
    let raw = config(
        dir,
        env,
        file,
        &["--show-origin", "--get-regexp", r"^include(if\..*)?\.path$"],
    );
    let home = env
        .iter()
        .find(|(k, _)| *k == "HOME")
        .map(|(_, v)| v.to_path_buf())
        .or_else(|| std::env::var_os("HOME").map(PathBuf::from));
    parse_include_paths(&raw, dir, home.as_deref())
}

/// `file:ORIGIN\0KEY\nVALUE\0…` → each VALUE as a path: `~/` under `home`,
/// relative to ORIGIN's directory (itself relative to `dir`).
fn parse_include_paths(raw: &[u8], dir: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let fields: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    let mut out = Vec::new();
    for pair in fields.chunks(2) {
        let [origin, entry] = pair else { continue };
        let (Some(origin), Some((_, value))) =
            (origin.strip_prefix("file:"), entry.split_once('\n'))
        else {
            continue;
        };
        let path = if let Some(rest) = value.strip_prefix("~/") {
            match home {
                Some(h) => h.join(rest),
                None => continue,
            }
        } else {
            let origin_dir = dir.join(origin).parent().map(Path::to_path_buf);
            match origin_dir {
                Some(o) => o.join(value),
                None => continue,
            }
        };
        out.push(path);
    }
    out
}

/// `filter.NAME.KEY\0…` → the distinct NAMEs (a NAME may hold dots).
fn parse_filter_names(raw: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for entry in raw.split(|b| *b == 0) {
        let entry = String::from_utf8_lossy(entry);
        let Some(rest) = entry.trim_end_matches('\n').strip_prefix("filter.") else {
            continue;
        };
        if let Some((name, _key)) = rest.rsplit_once('.')
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
    }
    names
}

fn read_bounded(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if buf.len() < MAX_OUTPUT {
                buf.extend_from_slice(&chunk[..n.min(MAX_OUTPUT - buf.len())]);
            }
        }
        buf
    })
}

fn wait(mut cmd: Command, limit: Duration) -> Result<Output, RunError> {
    let mut child = cmd.spawn().map_err(|e| RunError::Spawn(e.to_string()))?;
    let out = read_bounded(child.stdout.take().expect("piped"));
    let err = read_bounded(child.stderr.take().expect("piped"));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > limit => {
                // The whole group: git and anything it started.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                return Err(RunError::Timeout(limit));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(RunError::Spawn(e.to_string())),
        }
    };
    Ok(Output {
        ok: status.success(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_names_are_read_whole_and_once() {
        let raw = b"filter.lfs.clean\0filter.lfs.smudge\0filter.a.b.process\0filter.x=y z.clean\0";
        assert_eq!(parse_filter_names(raw), vec!["lfs", "a.b", "x=y z"]);
        assert!(parse_filter_names(b"").is_empty());
    }

    #[test]
    fn git_before_2_31_is_refused() {
        for (text, ok) in [
            ("git version 2.47.3", true),
            ("git version 2.31.0", true),
            ("git version 3.0.0", true),
            ("git version 2.30.9", false),
            ("git version 1.9", false),
            ("", false),
        ] {
            assert_eq!(version_at_least(text, (2, 31)), ok, "{text}");
        }
    }

    #[test]
    fn include_paths_resolve_against_their_file_and_home() {
        let raw = b"file:.git/config\0includeif.onbranch:x.path\nevil.cfg\0file:/etc/g\0include.path\n/abs/c\0file:.git/config\0include.path\n~/h.cfg\0command line:\0include.path\nz\0";
        assert_eq!(
            parse_include_paths(raw, Path::new("/r"), Some(Path::new("/home/s"))),
            vec![
                PathBuf::from("/r/.git/evil.cfg"),
                PathBuf::from("/abs/c"),
                PathBuf::from("/home/s/h.cfg"),
            ]
        );
    }
}
