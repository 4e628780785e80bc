//! What the shipped session script (`research-session.sh`, the example in
//! `ops/`) needs beyond its own file, checked the way the service will run
//! it: the `claude` it calls (`CLAUDE=`, else `claude` on the unit's PATH),
//! executable by the service user and not hidden by the unit; and the work
//! tree it `cd`s into (`REPO_DIR=`, else `/opt/teleo-eval/workspaces/AGENT`;
//! an agent with a `workspace` gets the daemon's worktree instead): a git
//! work tree the service may write.
//!
//! Where a value comes from, first found: a `NAME=VALUE` word in the
//! agent's `command` (`["/usr/bin/env", "CLAUDE=…", script, "{agent}"]`),
//! the unit's `Environment=`, its environment files.

use std::path::{Path, PathBuf};

use nix::unistd::User;

use super::{Report, executable_by, resolve, unit};
use crate::config::{AgentConfig, AgentKind};

/// The example script's default work tree, before `AGENT`.
const DEFAULT_REPO_ROOT: &str = "/opt/teleo-eval/workspaces";

/// The program `agent`'s command runs: its first word, or after
/// `env NAME=VALUE…` the first word that is neither (pure).
pub(super) fn program(agent: &AgentConfig) -> Option<&String> {
    let words = &agent.session.command;
    let first = words.first()?;
    if first != "env" && !first.ends_with("/env") {
        return Some(first);
    }
    words[1..]
        .iter()
        .find(|w| !w.contains('=') && !w.starts_with('-'))
        .or(Some(first))
}

/// Whether `agent` runs the session script (its program is
/// `research-session*.sh`).
fn runs_script(agent: &AgentConfig) -> bool {
    program(agent).is_some_and(|w| {
        let base = w.rsplit('/').next().unwrap_or(w);
        base.starts_with("research-session") && base.ends_with(".sh")
    })
}

/// `NAME`'s value for `agent`'s session: its command's `NAME=VALUE`, the
/// unit's `Environment=`, then its environment files.
fn value(agent: &AgentConfig, unit: Option<&unit::Unit>, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    if let Some(v) = from_command(agent, name) {
        return Some(v);
    }
    if let Some(v) = unit.and_then(|u| u.env(name)) {
        return Some(v.to_string());
    }
    let files = match unit {
        Some(u) => u.environment_files.clone(),
        None => vec![PathBuf::from("/etc/agent-state/environment")],
    };
    files.iter().find_map(|f| {
        std::fs::read_to_string(f).ok()?.lines().find_map(|l| {
            l.trim()
                .strip_prefix(&prefix)
                .map(|v| v.trim_matches('"').to_string())
        })
    })
}

/// `NAME=VALUE` among the words of `agent`'s command (pure).
fn from_command(agent: &AgentConfig, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    agent
        .session
        .command
        .iter()
        .find_map(|w| w.strip_prefix(&prefix))
        .map(str::to_string)
}

/// The checks for every agent that runs the script.
pub(super) fn check(
    r: &mut Report,
    agents: &[AgentConfig],
    config_dir: &Path,
    user: Option<&User>,
    unit: Option<&unit::Unit>,
) {
    let user_name = user.map(|u| u.name.as_str()).unwrap_or("the service user");
    let mut claudes: Vec<PathBuf> = Vec::new();
    for agent in agents
        .iter()
        .filter(|a| a.kind == AgentKind::Agent && runs_script(a))
    {
        // The CLI the script runs.
        let claude = value(agent, unit, "CLAUDE").unwrap_or_else(|| "claude".into());
        let what = format!("{} claude", agent.name);
        match resolve(&claude, config_dir) {
            None => r.fail(
                &what,
                format!("`{claude}` (the script's CLAUDE) is not on the service's PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)"),
                "install Claude Code where the service finds it (npm install -g @anthropic-ai/claude-code puts it in /usr/local/bin), or give its path: CLAUDE=/path/to/claude in /etc/agent-state/environment",
            ),
            Some(path) if !path.is_file() => r.fail(
                &what,
                format!("{} (the script's CLAUDE) does not exist", path.display()),
                "install Claude Code there, or fix CLAUDE= (in the command or /etc/agent-state/environment)",
            ),
            Some(path) if unit.is_some_and(|u| u.access(&path).0 == unit::Access::Hidden) => r.fail(
                &what,
                format!("{} is under a directory the unit hides ({})", path.display(), unit.map(|u| u.access(&path).1).unwrap_or_default()),
                "install it outside /home and /root (e.g. /usr/local/bin) or set CLAUDE= to such a path",
            ),
            Some(path) if !executable_by(&path, user) => r.fail(
                &what,
                format!("{} is not executable by {user_name}", path.display()),
                format!("chmod 755 {}", path.display()),
            ),
            Some(path) => {
                if !claudes.contains(&path) {
                    r.ok("claude", path.display().to_string());
                    claudes.push(path);
                }
            }
        }

        // The work tree the script `cd`s into.
        if agent.session.workspace.is_some() {
            continue;
        }
        let repo = value(agent, unit, "REPO_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(DEFAULT_REPO_ROOT).join(agent.name.as_str()));
        let what = format!("{} work tree", agent.name);
        if !repo.is_dir() {
            r.fail(
                &what,
                format!("{} (the script's REPO_DIR) does not exist", repo.display()),
                format!(
                    "make it a git work tree the service user owns: install -d -o {user_name} {0} && sudo -u {user_name} git -C {0} init (or clone the agent's repository there), or set REPO_DIR= in the command",
                    repo.display()
                ),
            );
            continue;
        }
        if !repo.join(".git").exists() {
            r.fail(
                &what,
                format!(
                    "{} is not a git work tree (no .git): the script commits there",
                    repo.display()
                ),
                format!(
                    "sudo -u {user_name} git clone REPOSITORY {} (or git init there)",
                    repo.display()
                ),
            );
            continue;
        }
        if let Some(unit) = unit
            && unit.access(&repo).0 != unit::Access::Writable
        {
            let (_, setting) = unit.access(&repo);
            r.fail(
                &what,
                format!(
                    "{} is not writable under the unit ({setting})",
                    repo.display()
                ),
                format!(
                    "systemctl edit {} → [Service] ReadWritePaths={}",
                    unit::NAME,
                    repo.display()
                ),
            );
            continue;
        }
        r.ok(&what, repo.display().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(command: &[&str]) -> AgentConfig {
        let text = format!(
            "state_root = \"/tmp/x\"\n[[agent]]\nname = \"vida\"\ncommand = [{}]\n",
            command
                .iter()
                .map(|w| format!("{w:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        crate::config::Config::parse(&text, Path::new("t.toml"))
            .unwrap()
            .agents
            .remove(0)
    }

    #[test]
    fn which_commands_run_the_script_and_what_they_set() {
        for (command, runs, claude) in [
            (
                &["/usr/share/agent-state/research-session.sh", "{agent}"][..],
                true,
                None,
            ),
            (
                &[
                    "/usr/bin/env",
                    "CLAUDE=/opt/c/claude",
                    "/x/research-session.sh",
                    "{agent}",
                ][..],
                true,
                Some("/opt/c/claude"),
            ),
            (
                &["env", "CLAUDE=c", "./research-session-v2.sh"][..],
                true,
                Some("c"),
            ),
            (&["/usr/local/bin/claude", "-p"][..], false, None),
            (&["/x/research-session.py", "{agent}"][..], false, None),
        ] {
            let a = agent(command);
            assert_eq!(runs_script(&a), runs, "{command:?}");
            assert!(!program(&a).unwrap().contains('='), "{command:?}");
            assert_eq!(from_command(&a, "CLAUDE").as_deref(), claude, "{command:?}");
        }
    }
}
