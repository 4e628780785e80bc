//! Whether an agent's command can run, checked before a session claims its
//! messages: a missing or non-executable command is the operator's problem,
//! not the mail's, so the messages stay in `inbox/` untouched (not claimed,
//! no attempt counted) and the agent is held until the command can run.
//!
//! [`probe`] is the one piece of IO: it resolves the program as the runner's
//! `exec` will (a path with a `/`, relative to the working directory, or a
//! search of `PATH`), and looks at the file (a regular file, executable by
//! this process's effective user, the interpreter on its `#!` line present
//! and executable). The decisions — start or refuse, release a held agent
//! or keep it, count a failed spawn as a delivery attempt or not — are pure
//! functions of what was probed. Nothing here reads or writes state files.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::runner::{Ending, SpawnFailure};
use crate::catalogue::Code;

/// The identity of a command file as it was probed: a new file (installed,
/// replaced), a `chmod` or an edit changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mode: meta.mode(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }
}

/// What [`probe`] found of an agent's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A regular file this process may execute (and its `#!` interpreter
    /// too, if it names one).
    Runnable { path: PathBuf, stamp: Stamp },
    /// It cannot be told before the session begins (the program names
    /// `{workspace}`, a worktree made after the claim; a lookup relative to
    /// a working directory that does not exist yet): the spawn decides.
    Unknown,
    /// Nothing by that name: `program` as configured, `searched` where.
    Missing { program: String, searched: String },
    /// The file exists; the interpreter its `#!` line names does not.
    MissingInterpreter { path: PathBuf, interpreter: PathBuf },
    /// Found, but not a regular file executable by this process (or its
    /// `#!` interpreter is not).
    NotExecutable { path: PathBuf, why: String },
}

impl Probe {
    /// The code and the sentence of an error, when the command cannot run.
    /// The wording is the runner's for the same failure at `exec`.
    pub fn failure(&self) -> Option<(Code, String)> {
        match self {
            Probe::Runnable { .. } | Probe::Unknown => None,
            Probe::Missing { program, searched } => Some((
                Code::AgentNotFound,
                format!("command not found: {program} ({searched})"),
            )),
            Probe::MissingInterpreter { path, interpreter } => Some((
                Code::AgentNotFound,
                format!(
                    "command not found: the interpreter on the #! line of {} ({} does not exist)",
                    path.display(),
                    interpreter.display()
                ),
            )),
            Probe::NotExecutable { path, why } => Some((
                Code::AgentPermissionDenied,
                format!("permission denied: {} ({why})", path.display()),
            )),
        }
    }

    /// The runner's ending for this failure: what the error matrix judges.
    pub fn ending(&self) -> Option<Ending> {
        let (code, reason) = self.failure()?;
        let kind = match code {
            Code::AgentPermissionDenied => SpawnFailure::PermissionDenied,
            _ => SpawnFailure::NotFound,
        };
        Some(Ending::SpawnFailed { reason, kind })
    }
}

/// What to do with a wake, given what was probed just before the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeClaim {
    /// Claim the messages and start the session.
    Start,
    /// Claim nothing, start nothing, hold the agent; `record`: raise the
    /// error (and journal the refusal) — not when the same failure is
    /// already recorded for this hold.
    Refuse { record: bool },
}

/// Who asked for the session being started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// `agent-state wake`: always answered with the error, held or not.
    Operator,
    /// A schedule, the inbox, a retry, a follow-up.
    Automatic,
}

/// Before the claim: start, or refuse (and whether to record the error).
/// `held`: what was probed when the agent was held, if it is.
pub fn before_claim(now: &Probe, held: Option<&Probe>, asker: Asker) -> BeforeClaim {
    if now.failure().is_none() {
        return BeforeClaim::Start;
    }
    let same = held.is_some_and(|h| h == now);
    BeforeClaim::Refuse {
        record: asker == Asker::Operator || !same,
    }
}

/// A held agent's command, probed again (the health monitor's timer, a
/// reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// It can run now: release the hold; its waiting messages wake it.
    Release,
    /// Nothing changed: stay held, say nothing.
    Keep,
    /// It fails differently (another path, now present but not
    /// executable): stay held, record the new error.
    Record,
}

/// Release, keep or record, from what the hold was for (`held`) and what is
/// probed `now`. A hold taken although the probe found the command
/// runnable (its spawn failed after the claim: a missing `#!` interpreter
/// the probe could not see, a file replaced in between) is released only
/// once the file changes, so an unchanged command is not spawned again at
/// every check.
pub fn recheck(held: &Probe, now: &Probe) -> Recheck {
    match (now.failure(), held) {
        (Some(_), h) if h == now => Recheck::Keep,
        (Some(_), _) => Recheck::Record,
        (None, h) if h == now => Recheck::Keep,
        (None, _) => Recheck::Release,
    }
}

/// Whether a session that ended this way counts as a delivery attempt of
/// the messages it claimed: not when its command could not be executed at
/// all (the agent never saw them; the operator's problem, not the mail's).
pub fn counts_as_attempt(ending: &Ending) -> bool {
    !matches!(
        ending,
        Ending::SpawnFailed {
            kind: SpawnFailure::NotFound | SpawnFailure::PermissionDenied,
            ..
        }
    )
}

/// `PATH` when the environment has none: what `execvp` uses.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// How much of a script is read for its `#!` line (the kernel reads 256
/// bytes).
const SHEBANG_MAX: usize = 256;

/// Resolve `program` as `exec` will in a child whose working directory is
/// `cwd` (`None`: not known yet) with this `PATH` (`None`: unset), and look
/// at what it finds.
pub fn probe(program: &str, cwd: Option<&Path>, path_var: Option<&OsStr>) -> Probe {
    if program.is_empty() || program.contains("{workspace}") {
        return Probe::Unknown;
    }
    if program.contains('/') {
        let path = Path::new(program);
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            match cwd {
                Some(cwd) => cwd.join(path),
                None => return Probe::Unknown,
            }
        };
        let searched = if path.as_os_str() == program {
            "no such file".to_string()
        } else {
            format!("no such file: {}", path.display())
        };
        return match look_at(&path, cwd) {
            Found::Missing => Probe::Missing {
                program: program.to_string(),
                searched,
            },
            Found::Probe(p) => p,
        };
    }
    // Searched like execvp: the first executable file wins; a file found
    // but not executable is the error only if nothing later is.
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_PATH));
    let mut denied = None;
    let mut unknown = false;
    for entry in std::env::split_paths(path_var) {
        let entry = if entry.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            entry
        };
        let candidate = if entry.is_absolute() {
            entry.join(program)
        } else {
            match cwd {
                Some(cwd) => cwd.join(entry).join(program),
                None => {
                    unknown = true;
                    continue;
                }
            }
        };
        match look_at(&candidate, cwd) {
            Found::Missing => {}
            Found::Probe(p @ (Probe::NotExecutable { .. } | Probe::MissingInterpreter { .. })) => {
                denied.get_or_insert(p);
            }
            Found::Probe(p) => return p,
        }
    }
    match denied {
        Some(p) => p,
        None if unknown => Probe::Unknown,
        None => Probe::Missing {
            program: program.to_string(),
            searched: format!("not in PATH {}", path_var.to_string_lossy()),
        },
    }
}

enum Found {
    Missing,
    Probe(Probe),
}

fn look_at(path: &Path, cwd: Option<&Path>) -> Found {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOENT | nix::libc::ENOTDIR)
            ) =>
        {
            return Found::Missing;
        }
        Err(e) => {
            return Found::Probe(Probe::NotExecutable {
                path: path.to_path_buf(),
                why: e.to_string(),
            });
        }
    };
    if !meta.is_file() {
        return Found::Probe(Probe::NotExecutable {
            path: path.to_path_buf(),
            why: "not a regular file".into(),
        });
    }
    if let Err(e) = executable(path) {
        return Found::Probe(Probe::NotExecutable {
            path: path.to_path_buf(),
            why: format!("not executable by this user: {e}; is it executable?"),
        });
    }
    if let Some(interpreter) = shebang(path) {
        let interpreter = match (interpreter.is_absolute(), cwd) {
            (true, _) => interpreter,
            (false, Some(cwd)) => cwd.join(interpreter),
            (false, None) => return Found::Probe(Probe::Unknown),
        };
        match std::fs::metadata(&interpreter) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(nix::libc::ENOENT | nix::libc::ENOTDIR)
                ) =>
            {
                return Found::Probe(Probe::MissingInterpreter {
                    path: path.to_path_buf(),
                    interpreter,
                });
            }
            Ok(m) if m.is_file() && executable(&interpreter).is_ok() => {}
            _ => {
                return Found::Probe(Probe::NotExecutable {
                    path: path.to_path_buf(),
                    why: format!(
                        "the interpreter on its #! line, {}, is not executable",
                        interpreter.display()
                    ),
                });
            }
        }
    }
    Found::Probe(Probe::Runnable {
        path: path.to_path_buf(),
        stamp: Stamp::of(&meta),
    })
}

/// `execve`'s own test: executable by the effective user.
fn executable(path: &Path) -> nix::Result<()> {
    nix::unistd::eaccess(path, nix::unistd::AccessFlags::X_OK)
}

/// The interpreter a script's `#!` line names, if it has one and it can be
/// read (a file that cannot be read is left to the spawn). Opened without
/// blocking: a FIFO put in its place between the check and the open does
/// not hang the loop.
fn shebang(path: &Path) -> Option<PathBuf> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut head = [0u8; SHEBANG_MAX];
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let interpreter = line
        .split(|b| *b == b' ' || *b == b'\t')
        .find(|w| !w.is_empty())?;
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(OsStr::from_bytes(interpreter)))
}

#[cfg(test)]
mod tests;
