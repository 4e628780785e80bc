//! `agent-state workspaces [--agent A] [--json]`: the git worktrees kept
//! after their sessions (they hold uncommitted changes or commits not on
//! the base), and any session's worktree still there, per agent with a
//! `workspace`. Read-only: git status in each, nothing changed.

use serde::Serialize;

use crate::cli::{Context, print_json};
use crate::config::AgentConfig;
use crate::daemon::workspaces::root_of;
use crate::error::{Error, Result, exit};
use crate::workspace::{self, Workspace};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One agent (default: every agent with a workspace)
    #[arg(long)]
    pub agent: Option<String>,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Entry {
    agent: String,
    path: String,
    branch: Option<String>,
    head: String,
    /// Uncommitted changes.
    dirty: bool,
    /// Commits not on the base.
    commits_ahead: u32,
    /// Why it could not be looked at, if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let agents: Vec<&AgentConfig> = match &args.agent {
        Some(a) => {
            let agent = ctx.working_agent(a)?.0;
            if agent.session.workspace.is_none() {
                return Err(Error::Usage(format!(
                    "{a} has no workspace: add workspace = {{ repo = \"/path/to/repo\" }} to its [[agent]] (or [defaults])"
                )));
            }
            vec![agent]
        }
        None => ctx
            .config
            .working_agents()
            .filter(|a| a.session.workspace.is_some())
            .collect(),
    };
    let mut entries = Vec::new();
    for agent in agents {
        let Some(settings) = &agent.session.workspace else {
            continue;
        };
        let root = root_of(settings, agent, &ctx.root.agent(&agent.name));
        let listed = workspace::list(&settings.repo)
            .map_err(|e| Error::Unavailable(format!("{}: {e}", agent.name)))?;
        for w in listed {
            if !w.path.starts_with(&root)
                && !std::fs::canonicalize(&root).is_ok_and(|r| w.path.starts_with(r))
            {
                continue;
            }
            let mut entry = Entry {
                agent: agent.name.to_string(),
                path: w.path.display().to_string(),
                branch: w.branch.clone(),
                head: w.head.clone(),
                dirty: false,
                commits_ahead: 0,
                error: None,
            };
            let ws = Workspace {
                path: w.path.clone(),
                branch: w.branch.clone().unwrap_or_default(),
                base_commit: settings.base.clone(),
            };
            match workspace::finish(&ws, &settings.base) {
                Ok(f) => {
                    entry.dirty = f.dirty;
                    entry.commits_ahead = f.commits_ahead;
                }
                Err(e) => entry.error = Some(e.to_string()),
            }
            entries.push(entry);
        }
    }
    if args.json {
        return print_json(&entries);
    }
    if entries.is_empty() {
        println!("no workspaces");
        return Ok(exit::OK);
    }
    println!(
        "{:<12} {:<40} {:<12} {:<6} {:>5}  PATH",
        "AGENT", "BRANCH", "HEAD", "DIRTY", "AHEAD"
    );
    for e in &entries {
        println!(
            "{:<12} {:<40} {:<12} {:<6} {:>5}  {}{}",
            e.agent,
            e.branch.as_deref().unwrap_or("(detached)"),
            &e.head[..e.head.len().min(12)],
            if e.dirty { "yes" } else { "no" },
            e.commits_ahead,
            e.path,
            e.error
                .as_deref()
                .map(|x| format!("  ({x})"))
                .unwrap_or_default()
        );
    }
    Ok(exit::OK)
}
