//! `agent-state inbox AGENT`: waiting, claimed and rejected messages.

use crate::cli::display::say;
use serde::Serialize;

use crate::cli::{Context, print_json};
use crate::clock::{Timestamp, ago};
use crate::error::{Result, exit};
use crate::inbox::{self, Message, RejectedFile, Verdict};

#[derive(clap::Args, Debug)]
pub struct Args {
    pub agent: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Listing {
    agent: String,
    waiting: Vec<Waiting>,
    claimed: Vec<Claimed>,
    rejected: Vec<RejectedFile>,
    processed: usize,
}

#[derive(Serialize)]
struct Waiting {
    file: String,
    /// valid, unsettled (still being written) or invalid
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
}

#[derive(Serialize)]
struct Claimed {
    session_id: String,
    message: Message,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let (agent, dir) = ctx.agent(&args.agent)?;
    dir.require()?;
    let now = std::time::SystemTime::now();
    let intake = inbox::Intake::settle(agent.session.inbox_settle);
    let mut waiting = Vec::new();
    for name in inbox::waiting_names(&dir)? {
        let w = match inbox::inspect(&dir, &name, now, intake) {
            Verdict::Valid(m) => Waiting {
                file: name,
                state: "valid",
                message: Some(*m),
                problem: None,
            },
            Verdict::Unsettled(p) => Waiting {
                file: name,
                state: "unsettled",
                message: None,
                problem: Some(p),
            },
            Verdict::Invalid(r) => Waiting {
                file: name,
                state: "invalid",
                message: None,
                problem: Some(r.reason),
            },
        };
        waiting.push(w);
    }
    for name in inbox::undecodable_names(&dir)? {
        waiting.push(Waiting {
            file: inbox::escaped_name(&name),
            state: "invalid",
            message: None,
            problem: Some(
                "its name is not UTF-8 (shown escaped); it is rejected under a safe name at the next scan".into(),
            ),
        });
    }
    waiting.sort_by(|a, b| match (&a.message, &b.message) {
        (Some(x), Some(y)) => Message::delivery_order(x, y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.file.cmp(&b.file),
    });
    let mut claimed = Vec::new();
    for session in inbox::claimed_sessions(&dir)? {
        for (_, message) in inbox::claimed(&dir, &session)? {
            claimed.push(Claimed {
                session_id: session.clone(),
                message,
            });
        }
    }
    let listing = Listing {
        agent: dir.name.to_string(),
        waiting,
        claimed,
        rejected: inbox::rejected_files(&dir)?,
        processed: inbox::count_files(&dir.processed()),
    };
    if args.json {
        return print_json(&listing);
    }
    let now = Timestamp::now();
    let line = |m: &Message| {
        format!(
            "{:<8} {:<6} from {:<10} {:<8} {}  ({})",
            m.kind.as_str(),
            m.priority.as_str(),
            m.from,
            ago(&m.created_at, &now),
            m.subject.replace('\n', " "),
            m.id
        )
    };
    say!(
        "{}: {} waiting, {} claimed, {} rejected, {} processed",
        listing.agent,
        listing.waiting.len(),
        listing.claimed.len(),
        listing.rejected.len(),
        listing.processed
    );
    if !listing.waiting.is_empty() {
        say!("\nwaiting:");
        for w in &listing.waiting {
            match (&w.message, &w.problem) {
                (Some(m), _) => say!("  {}", line(m)),
                (None, Some(p)) => say!("  {:<8} {}: {p}", w.state, w.file),
                (None, None) => {}
            }
        }
    }
    if !listing.claimed.is_empty() {
        say!("\nclaimed:");
        for c in &listing.claimed {
            say!("  [{}] {}", c.session_id, line(&c.message));
        }
    }
    if !listing.rejected.is_empty() {
        say!("\nrejected (in inbox/rejected/):");
        for r in &listing.rejected {
            say!(
                "  {}: {}",
                r.file,
                r.reason.as_deref().unwrap_or("no reason recorded")
            );
        }
    }
    Ok(exit::OK)
}
