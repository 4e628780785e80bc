//! `agent-state prompt AGENT`: print the rehydration prompt the agent's next
//! session gets — the same function and options as the daemon — and, on
//! stderr, what was cut to fit the budget.

use crate::cli::{Context, warn};
use crate::error::{Result, exit};
use crate::prompt::{self, PromptOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent
    pub agent: String,
    /// Size budget instead of the configured one (`200KiB`, `1MiB`, `50000`)
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub budget: Option<usize>,
}

/// Why `--budget` is not a size (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
enum BadBudget {
    #[error(transparent)]
    Size(#[from] crate::config::SizeError),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

fn parse_budget(text: &str) -> std::result::Result<usize, BadBudget> {
    let n = crate::config::parse_size(text)?;
    usize::try_from(n).map_err(|_| BadBudget::TooLarge(text.to_string()))
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (agent, dir) = ctx.working_agent(&args.agent)?;
    let mut options = PromptOptions::for_agent(&ctx.config, agent);
    if let Some(budget) = args.budget {
        options.budget_bytes = budget;
    }
    let assembled = prompt::assemble_with(&ctx.root, &dir, &options, ctx.now)?;
    print!("{}", assembled.text);
    for c in &assembled.cut {
        eprintln!(
            "agent-state: cut {} ({} bytes): {}",
            c.section, c.bytes_dropped, c.reason
        );
    }
    if assembled.over_budget {
        warn(format!(
            "the prompt is {} bytes, over its budget of {} bytes: the rules and identity, never cut, are too large",
            assembled.text.len(),
            options.budget_bytes
        ));
    }
    if assembled.waiting_messages > 0 {
        eprintln!(
            "agent-state: no session is running: the {} message(s) shown are waiting, and the next session claims them",
            assembled.waiting_messages
        );
    }
    Ok(exit::OK)
}
