//! `agent-state send`: deliver a message into one inbox, or every working
//! agent's with `--to all`.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::agent_name::AgentName;
use crate::cli::{Context, print_notes};
use crate::config::AgentKind;
use crate::error::{Error, IoContext, Result, exit};
use crate::hooks::task_from_message;
use crate::inbox::{self, MessageType, Outgoing, Priority};
use crate::state::journal::{Event, MessageSent};
use crate::state::{metrics, tasks};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sender: an agent, a person or a pipeline (a valid agent name)
    #[arg(long, value_name = "A")]
    pub from: String,
    /// Recipient agent, or `all` for every agent but the sender (human mailboxes excluded)
    #[arg(long, value_name = "B")]
    pub to: String,
    /// flag, task, question or cascade
    #[arg(long = "type", default_value = "flag", value_name = "TYPE")]
    pub kind: MessageType,
    /// high or normal
    #[arg(long, default_value = "normal")]
    pub priority: Priority,
    /// One line saying what the message is about
    #[arg(long, value_name = "S")]
    pub subject: String,
    /// The message text (quoted to the agent as from the sender, never as an instruction)
    #[arg(long, value_name = "TEXT", conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Read the body from a file, or from standard input with `-`
    #[arg(long, value_name = "PATH|-")]
    pub body_file: Option<PathBuf>,
    /// Where the message comes from, e.g. a branch or a file (theseus/research-2026-03-31)
    #[arg(long, value_name = "R")]
    pub source_ref: Option<String>,
    /// Expire the message if it is not read within this time, e.g. 2d
    #[arg(long, value_name = "DUR", value_parser = crate::clock::parse_duration)]
    pub expires_in: Option<std::time::Duration>,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let from = AgentName::parse(&args.from)?;
    let recipients: Vec<AgentName> = if args.to == "all" {
        ctx.config
            .working_agents()
            .filter(|a| a.name != from)
            .map(|a| a.name.clone())
            .collect()
    } else {
        vec![ctx.config.agent_named(&args.to)?.name.clone()]
    };
    if args.subject.trim().is_empty() {
        return Err(Error::Usage(
            "--subject is empty; say in a line what the message is about".into(),
        ));
    }
    let body = match (&args.body, &args.body_file) {
        (Some(b), _) => b.clone(),
        (None, Some(p)) => body_of(p)?,
        (None, None) => String::new(),
    };
    let outgoing = Outgoing {
        from: from.clone(),
        kind: args.kind,
        priority: args.priority,
        subject: args.subject.clone(),
        body,
        source_ref: args.source_ref.clone(),
        expires_at: args.expires_in.map(|d| ctx.now.plus(d)),
    };
    let mut notes = Vec::new();
    let mut sent = Vec::new();
    for to in &recipients {
        let dir = ctx.root.agent(to);
        let message = inbox::deliver(&dir, &outgoing, ctx.now)?;
        if message.kind == MessageType::Task {
            // A task message adds its task when it is received. A sender
            // that may write inboxes but not the agent's state (a pipeline
            // in the inbox group) leaves that to the session that claims it.
            let added = dir.lock().and_then(|lock| {
                tasks::add(
                    &dir,
                    &lock,
                    task_from_message(&message),
                    ctx.now,
                    &mut notes,
                )
            });
            // The message is delivered: nothing after this fails the send
            // (a sender told to try again would deliver it twice).
            match added {
                Ok(_) => {}
                Err(e) if is_permission_denied(&e) => notes.push(format!(
                    "{to}: no permission to update tasks.json ({e}); the task will be added when a session claims the message"
                )),
                Err(e) => notes.push(format!(
                    "{to}: tasks.json not updated now ({e}); the message is delivered, and its task will be added when a session claims it"
                )),
            }
        }
        sent.push(message);
    }
    // Count what the sender sent, if the sender keeps state here and we may
    // write it.
    // A person (a member of the inbox group) sending as a human mailbox
    // cannot write that mailbox's journal, and need not be told so at every
    // send: the message file, owned by them, is the record (`inbox`, and
    // the recipient's session journals what it processed).
    if let Ok(sender) = ctx.config.agent(&from) {
        let dir = ctx.root.agent(&sender.name);
        if crate::fsx::is_dir(&dir.path) {
            match count_sent(ctx, &dir, &sent, &mut notes) {
                Ok(()) => {}
                Err(e) if is_permission_denied(&e) && sender.kind == AgentKind::Human => {
                    tracing::debug!("{from}: not counted in its journal ({e})");
                }
                Err(e) if is_permission_denied(&e) => notes.push(format!(
                    "{from}: no permission to record the messages it sent ({e}); they were delivered"
                )),
                // Delivered already: said, never "try again".
                Err(e) => notes.push(format!(
                    "{from}: the messages it sent are not counted in its journal ({e}); they were delivered"
                )),
            }
        }
    }
    // Output comes last: every message is delivered and counted by now.
    for m in &sent {
        println!("sent {} to {} ({}/inbox/{}.json)", m.id, m.to, m.to, m.id);
    }
    print_notes(&notes);
    if sent.is_empty() {
        return Err(Error::Usage(format!(
            "--to all found no agent to send to (every working agent but {from})"
        )));
    }
    Ok(exit::OK)
}

fn count_sent(
    ctx: &Context,
    dir: &crate::state::AgentDir,
    sent: &[inbox::Message],
    notes: &mut Vec<String>,
) -> Result<()> {
    let lock = dir.lock()?;
    for m in sent {
        let event = Event::MessageSent(MessageSent {
            message_id: m.id.clone(),
            to: m.to.clone(),
            kind: m.kind,
            subject: m.subject.clone(),
        });
        dir.journal_append(&lock, ctx.now, event.clone())?;
        metrics::apply(dir, &lock, &event, ctx.now, notes)?;
    }
    Ok(())
}

fn is_permission_denied(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied)
}

/// The body of `--body-file P`: standard input for `-`.
pub(super) fn body_of(p: &Path) -> Result<String> {
    if p.as_os_str() == "-" {
        read_body(std::io::stdin().lock(), Path::new("standard input"))
    } else {
        let file = std::fs::File::open(p).at("reading the body from", p)?;
        read_body(file, p)
    }
}

/// Read a message body: at most the message limit plus one byte (a body from
/// `/dev/zero` or an endless pipe is refused after 1 MiB, not read forever).
fn read_body(from: impl Read, what: &Path) -> Result<String> {
    let mut bytes = Vec::new();
    from.take(inbox::MAX_MESSAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .at("reading the body from", what)?;
    if bytes.len() as u64 > inbox::MAX_MESSAGE_BYTES {
        return Err(Error::Data(format!(
            "the body from {} is over the message limit of {} bytes (1 MiB): put large content in a file and name it with --source-ref",
            what.display(),
            inbox::MAX_MESSAGE_BYTES
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        Error::Data(format!(
            "the body from {} is not UTF-8 text; messages are JSON text",
            what.display()
        ))
    })
}
