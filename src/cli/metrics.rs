//! `agent-state metrics rebuild [AGENT...]`

use clap::Subcommand;

use crate::cli::{Context, print_notes};
use crate::error::{Result, exit};
use crate::state::journal;
use crate::state::metrics::Metrics;
use crate::state::rebuild::metrics_from_journal;

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Recompute metrics.json (lifetime and rolling 30 days) from the journal
    Rebuild(RebuildArgs),
}

#[derive(clap::Args, Debug)]
pub struct RebuildArgs {
    /// Agents (default: every working agent)
    #[arg(value_name = "AGENT")]
    pub agents: Vec<String>,
}

pub fn run(ctx: &Context, command: Command) -> Result<u8> {
    let Command::Rebuild(args) = command;
    let agents = if args.agents.is_empty() {
        ctx.config.working_agents().collect()
    } else {
        args.agents
            .iter()
            .map(|a| ctx.config.agent_named(a))
            .collect::<Result<Vec<_>>>()?
    };
    for agent in agents {
        let dir = ctx.root.agent(&agent.name);
        let lock = dir.lock()?;
        let mut notes = Vec::new();
        let old: Metrics = dir.load(&lock, ctx.now, &mut notes)?;
        let scan = journal::read(&dir.store, &dir.journal())?;
        let mut new = metrics_from_journal(dir.name.as_str(), &scan.entries, ctx.now);
        // Fields other tools added survive the rebuild.
        new.extra = old.extra.clone();
        new.lifetime.extra = old.lifetime.extra.clone();
        new.rolling_30d.extra = old.rolling_30d.extra.clone();
        dir.save(&lock, &new)?;
        print_notes(&notes);
        let torn = if scan.torn.is_empty() {
            String::new()
        } else {
            format!(" ({} torn line(s) skipped)", scan.torn.len())
        };
        println!(
            "{}: rebuilt from {} journal entries{torn}: sessions_total {} → {}, sources_archived {} → {}",
            dir.name,
            scan.entries.len(),
            old.lifetime.sessions_total,
            new.lifetime.sessions_total,
            old.lifetime.sources_archived,
            new.lifetime.sources_archived
        );
    }
    Ok(exit::OK)
}
