//! `agent-state bootstrap [AGENT...]`

use crate::cli::Context;
use crate::error::{Result, exit};
use crate::state::bootstrap;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Agents to bootstrap (default: every configured agent)
    #[arg(value_name = "AGENT")]
    pub agents: Vec<String>,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let agents = if args.agents.is_empty() {
        ctx.config.agents.iter().collect()
    } else {
        args.agents
            .iter()
            .map(|a| ctx.config.agent_named(a))
            .collect::<Result<Vec<_>>>()?
    };
    for created in bootstrap::root(&ctx.root)? {
        println!("created {created}");
    }
    // The instance counters list every agent from the start (seed 000).
    crate::state::counters::list_agents(
        &ctx.root,
        ctx.config.working_agents().map(|a| a.name.as_str()),
    )?;
    let dirs = agents.iter().map(|a| (*a, ctx.root.agent(&a.name)));
    for (dir, done) in bootstrap::agents_and_modes(dirs, ctx.now) {
        let (agent, done) = (&dir.name, done?);
        if done.created.is_empty() && done.modes.is_empty() {
            println!("{agent}: complete, nothing to do");
        }
        if !done.created.is_empty() {
            println!("{agent}: created {}", done.created.join(", "));
        }
        for fix in &done.modes {
            println!("{agent}: {fix}");
        }
    }
    Ok(exit::OK)
}
