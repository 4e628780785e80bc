//! `agent-state inbox AGENT`: waiting, claimed and rejected messages; and
//! the mailbox as a workflow: `inbox show AGENT MSG` (the whole message),
//! `inbox ack AGENT MSG...` (handled: to processed/, journaled), `inbox
//! redeliver AGENT MSG` (a rejected message back, once valid).

use crate::cli::display::{Line, Style, say};
use serde::Serialize;

use crate::cli::{Context, print_json};
use crate::clock::{Timestamp, ago};
use crate::error::{Result, exit};
use crate::inbox::{self, Message, RejectedFile, Verdict};

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The agent (or human mailbox) whose inbox to list
    #[arg(required = true)]
    pub agent: Option<String>,
    /// As JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print one whole message, wherever it lies (waiting, claimed, processed, rejected)
    Show {
        /// The agent (or human mailbox)
        agent: String,
        /// Its id or file name
        message: String,
        /// The message file as it is (JSON)
        #[arg(long)]
        json: bool,
    },
    /// Mark waiting messages handled: moved to processed/ and journaled (the service user or root)
    Ack {
        /// The agent (or human mailbox)
        agent: String,
        /// Their ids or file names
        #[arg(required = true)]
        messages: Vec<String>,
    },
    /// Move a rejected message back to the inbox once it is valid; its reason file is removed (the service user or root)
    Redeliver {
        /// The agent (or human mailbox)
        agent: String,
        /// Its id or file name in rejected/
        message: String,
    },
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
    match args.command {
        Some(Command::Show {
            agent,
            message,
            json,
        }) => show(ctx, &agent, &message, json),
        Some(Command::Ack { agent, messages }) => {
            let (_, dir) = ctx.agent(&agent)?;
            dir.require()?;
            writer_only(
                &dir,
                "acknowledge",
                &format!("inbox ack {agent} {}", messages.join(" ")),
            )?;
            let lock = dir.lock()?;
            let mut failed = 0;
            for m in &messages {
                match inbox::acknowledge_waiting(&dir, m, ctx.now) {
                    Ok(id) => say!("{agent}: {id} acknowledged (moved to processed/)"),
                    Err(e) => {
                        failed += 1;
                        crate::cli::warn(e);
                    }
                }
            }
            drop(lock);
            Ok(if failed == 0 { exit::OK } else { exit::DATAERR })
        }
        Some(Command::Redeliver { agent, message }) => {
            let (_, dir) = ctx.agent(&agent)?;
            dir.require()?;
            writer_only(
                &dir,
                "redeliver",
                &format!("inbox redeliver {agent} {message}"),
            )?;
            let _lock = dir.lock()?;
            let back = inbox::redeliver(&dir, &message, ctx.now)?;
            say!("{agent}: {message} is back in the inbox as {back}");
            Ok(exit::OK)
        }
        None => list(ctx, args.agent.as_deref().unwrap_or_default(), args.json),
    }
}

/// Refuse a caller who cannot write the agent's directory (moving mail
/// to processed/ and journaling it is the service user's), naming the
/// command that can.
fn writer_only(dir: &crate::state::AgentDir, what: &str, command: &str) -> Result<()> {
    crate::access::writer_only(&dir.path, |owner| {
        format!(
            "to {what} a message is to move it and journal it, which only {owner} (the service user) and root may do; run `sudo -u {owner} agent-state {command}`"
        )
    })
}

fn show(ctx: &Context, agent: &str, wanted: &str, json: bool) -> Result<u8> {
    let (_, dir) = ctx.agent(agent)?;
    dir.require()?;
    let Some(found) = inbox::find(&dir, wanted)? else {
        return Err(crate::error::Error::NotFound(format!(
            "{agent}: no message {wanted:?} waiting, claimed, processed or rejected (`agent-state inbox {agent}` lists them)"
        )));
    };
    if json {
        // The message as it is stored, escaped for the screen; a file that
        // is not JSON (a rejected one) as one JSON string, so the output is
        // always JSON.
        let text = String::from_utf8_lossy(&found.bytes);
        match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
            Ok(_) => println!("{}", crate::cli::json::escape_text(text.trim_end())),
            Err(_) => println!("{}", crate::cli::json::to_string_pretty(&text)?),
        }
        return Ok(exit::OK);
    }
    let v: serde_json::Value = serde_json::from_slice(&found.bytes).unwrap_or_default();
    let field = |k: &str| v[k].as_str().unwrap_or("").to_string();
    say!("Message:    {}", field("id"));
    say!(
        "Where:      {} ({})",
        found.place.as_str(),
        found.path.display()
    );
    say!("From:       {}", field("from"));
    say!("To:         {}", field("to"));
    say!("Date:       {}", field("created_at"));
    say!(
        "Type:       {} ({} priority)",
        field("type"),
        field("priority")
    );
    if !field("source_ref").is_empty() {
        say!("Reference:  {}", field("source_ref"));
    }
    if !field("expires_at").is_empty() {
        say!("Expires:    {}", field("expires_at"));
    }
    say!("Subject:    {}", field("subject"));
    if found.place == inbox::Place::Rejected {
        let reason = found.path.with_file_name(format!(
            "{}.reason.json",
            found.path.file_name().unwrap_or_default().to_string_lossy()
        ));
        if let Ok(Some((bytes, _))) = crate::fsx::read_limited(&reason, 1 << 20) {
            let r: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            say!("Rejected:   {}", r["reason"].as_str().unwrap_or("?"));
        }
    }
    if v.is_null() {
        say!("\n{}", String::from_utf8_lossy(&found.bytes));
    } else {
        say!("\n{}", field("body"));
    }
    Ok(exit::OK)
}

/// What `inbox AGENT --json` prints, as JSON (the web view's agent page
/// and mailbox read this).
pub fn listing_json(ctx: &Context, agent: &str) -> Result<serde_json::Value> {
    let listing = listing(ctx, agent)?;
    // Strings, numbers and lists: it always serializes.
    Ok(serde_json::to_value(&listing).unwrap_or_default())
}

fn list(ctx: &Context, agent: &str, json: bool) -> Result<u8> {
    let listing = listing(ctx, agent)?;
    if json {
        return print_json(&listing);
    }
    print_listing(&listing);
    Ok(exit::OK)
}

fn listing(ctx: &Context, agent: &str) -> Result<Listing> {
    let (agent, dir) = ctx.agent(agent)?;
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
    Ok(listing)
}

fn print_listing(listing: &Listing) {
    let now = Timestamp::now();
    // Kind, priority, sender, age, the subject (cut on a terminal), the id.
    let line = |start: Line, m: &Message| {
        let priority = match m.priority.as_str() {
            "high" => Style::Warn,
            _ => Style::Plain,
        };
        start
            .cell(Style::Plain, m.kind.as_str(), 8)
            .text(" ")
            .cell(priority, m.priority.as_str(), 6)
            .text(" from ")
            .cell(Style::Bold, m.from.as_str(), 10)
            .text(" ")
            .cell(Style::Dim, ago(&m.created_at, &now), 8)
            .text(" ")
            .free(m.subject.replace('\n', " "))
            .text("  ")
            .styled(Style::Dim, format!("({})", m.id))
    };
    Line::new()
        .styled(Style::Bold, &listing.agent)
        .text(format!(
            ": {} waiting, {} claimed, {} rejected, {} processed",
            listing.waiting.len(),
            listing.claimed.len(),
            listing.rejected.len(),
            listing.processed
        ))
        .print();
    if !listing.waiting.is_empty() {
        say!("\nwaiting:");
        for w in &listing.waiting {
            match (&w.message, &w.problem) {
                (Some(m), _) => line(Line::new().text("  "), m).print(),
                (None, Some(p)) => Line::new()
                    .text("  ")
                    .cell(Style::of(w.state), w.state, 8)
                    .text(format!(" {}: ", w.file))
                    .free(p)
                    .print(),
                (None, None) => {}
            }
        }
    }
    if !listing.claimed.is_empty() {
        say!("\nclaimed:");
        for c in &listing.claimed {
            line(
                Line::new().text(format!("  [{}] ", c.session_id)),
                &c.message,
            )
            .print();
        }
    }
    if !listing.rejected.is_empty() {
        say!("\nrejected (in inbox/rejected/):");
        for r in &listing.rejected {
            Line::new()
                .text(format!("  {}: ", r.file))
                .free(r.reason.as_deref().unwrap_or("no reason recorded"))
                .print();
        }
    }
}
