//! `agent-state prompt AGENT`: print the rehydration prompt.

use crate::cli::Context;
use crate::error::{Result, exit};
use crate::prompt;

#[derive(clap::Args, Debug)]
pub struct Args {
    pub agent: String,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (_, dir) = ctx.working_agent(&args.agent)?;
    print!("{}", prompt::assemble(&ctx.root, &dir)?);
    Ok(exit::OK)
}
