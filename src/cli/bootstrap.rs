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
    for agent in agents {
        let dir = ctx.root.agent(&agent.name);
        let done = bootstrap::agent_and_modes(agent, &dir, ctx.now)?;
        if done.created.is_empty() && done.modes.is_empty() {
            println!("{}: complete, nothing to do", agent.name);
        }
        if !done.created.is_empty() {
            println!("{}: created {}", agent.name, done.created.join(", "));
        }
        for fix in &done.modes {
            println!("{}: {fix}", agent.name);
        }
    }
    Ok(exit::OK)
}
