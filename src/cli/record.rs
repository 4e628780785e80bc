//! `agent-state record AGENT`: outcomes the review pipeline learns later.

use crate::cli::{Context, print_notes};
use crate::error::{Error, Result, exit};
use crate::state::journal::{Event, Record};
use crate::state::metrics;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent
    pub agent: String,
    /// Claims the agent proposed, to add to metrics.json
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_proposed: u64,
    /// Of them, accepted by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_accepted: u64,
    /// Challenged by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_challenged: u64,
    /// Rejected by review
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub claims_rejected: u64,
    /// Beliefs the agent found disconfirmed
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub disconfirmation_hits: u64,
}

pub fn run(ctx: &Context, a: Args) -> Result<u8> {
    let (_, dir) = ctx.working_agent(&a.agent)?;
    let record = Record {
        claims_proposed: a.claims_proposed,
        claims_accepted: a.claims_accepted,
        claims_challenged: a.claims_challenged,
        claims_rejected: a.claims_rejected,
        disconfirmation_hits: a.disconfirmation_hits,
    };
    if record == Record::default() {
        return Err(Error::Usage(
            "nothing to record: give at least one of --claims-proposed, --claims-accepted, --claims-challenged, --claims-rejected, --disconfirmation-hits".into(),
        ));
    }
    let lock = dir.lock()?;
    let mut notes = Vec::new();
    let event = Event::Record(record);
    dir.journal_append(&lock, ctx.now, event.clone())?;
    let m = metrics::apply(&dir, &lock, &event, ctx.now, &mut notes)?;
    print_notes(&notes);
    println!(
        "{}: claims proposed {}, accepted {}, challenged {}, rejected {}; disconfirmation hits {}",
        dir.name,
        m.lifetime.claims_proposed,
        m.lifetime.claims_accepted,
        m.lifetime.claims_challenged,
        m.lifetime.claims_rejected,
        m.lifetime.disconfirmation_hits
    );
    Ok(exit::OK)
}
