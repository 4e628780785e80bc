//! `agent-state flow start|status|approve|reject|stop`: a human's side of a
//! Planner → Actor → Judge flow (`crate::flow`). The daemon routes between
//! the roles; these commands open a cycle and answer it.

use serde::Serialize;

use crate::cli::{Context, display, print_json};
use crate::config::FlowSettings;
use crate::error::{Error, Result, exit};
use crate::flow::authority::{self, UnixUser};
use crate::flow::{self, Applied, FlowState};
use crate::inbox::{self, MessageType, Outgoing, Priority};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Open a cycle: its file, and a task to the Planner
    Start {
        /// The flow (its [[flow]] name)
        flow: String,
        /// What the cycle is for (one line)
        #[arg(long)]
        goal: String,
        /// Who opens it (default: the flow's human mailbox)
        #[arg(long)]
        by: Option<String>,
    },
    /// Each flow's open cycle: its step, the role at work, the INSUFFICIENT streak, what waits for a human
    Status {
        /// One flow (default: every flow)
        flow: Option<String>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Approve a cycle the Judge passed (awaiting approval, or blocked): archived, published (`publish`), on_approve run.
    /// Root and the service user only, or a user in the flow's `approvers` (whose answer is left
    /// as a reply the daemon carries out); anyone else exits 77
    Approve {
        /// The cycle (2026-11-24-001)
        cycle: String,
        /// The name recorded as answering (default: the flow's human mailbox); a label, not an identity
        #[arg(long)]
        by: Option<String>,
    },
    /// Send a cycle back to the Planner with your feedback (awaiting approval, blocked or paused).
    /// Who may: as for approve
    Reject {
        /// The cycle (2026-11-24-001)
        cycle: String,
        /// What the Planner should change (it reaches its next prompt)
        #[arg(long)]
        feedback: String,
        /// Who answers (default: the flow's human mailbox)
        #[arg(long)]
        by: Option<String>,
    },
    /// Stop a cycle, whatever its state: archived as stopped. Who may: as for approve
    Stop {
        /// The cycle (2026-11-24-001)
        cycle: String,
        /// Who answers (default: the flow's human mailbox)
        #[arg(long)]
        by: Option<String>,
    },
}

pub fn run(ctx: &Context, command: Command) -> Result<u8> {
    match command {
        Command::Start { flow, goal, by } => {
            let settings = flow::settings(&ctx.config, &flow)?;
            let by = by.unwrap_or_else(|| settings.human.to_string());
            let (cycle, applied) = flow::start(&ctx.root, settings, &goal, &by, ctx.now)?;
            print_lines(&applied);
            println!("{}", cycle.id);
            Ok(exit::OK)
        }
        Command::Status { flow, json } => status(ctx, flow.as_deref(), json),
        Command::Approve { cycle, by } => {
            let settings = flow::flow_of_cycle(&ctx.root, &ctx.config, &cycle)?;
            if may_answer(ctx, settings, "approve", &cycle)? == Way::ByReply {
                return answer_by_reply(ctx, settings, &cycle, "approve", "");
            }
            let by = by.unwrap_or_else(|| settings.human.to_string());
            let applied = flow::approve(&ctx.root, settings, &cycle, &by, ctx.now)?;
            print_lines(&applied);
            record_errors(ctx, &applied);
            Ok(exit::OK)
        }
        Command::Reject {
            cycle,
            feedback,
            by,
        } => {
            let settings = flow::flow_of_cycle(&ctx.root, &ctx.config, &cycle)?;
            if may_answer(ctx, settings, "reject", &cycle)? == Way::ByReply {
                return answer_by_reply(ctx, settings, &cycle, "reject", &feedback);
            }
            let by = by.unwrap_or_else(|| settings.human.to_string());
            print_lines(&flow::reject(
                &ctx.root, settings, &cycle, &feedback, &by, ctx.now,
            )?);
            Ok(exit::OK)
        }
        Command::Stop { cycle, by } => {
            let settings = flow::flow_of_cycle(&ctx.root, &ctx.config, &cycle)?;
            if may_answer(ctx, settings, "stop", &cycle)? == Way::ByReply {
                return answer_by_reply(ctx, settings, &cycle, "stop", "");
            }
            let by = by.unwrap_or_else(|| settings.human.to_string());
            print_lines(&flow::stop(&ctx.root, settings, &cycle, &by, ctx.now)?);
            Ok(exit::OK)
        }
    }
}

/// How the caller's answer is carried out.
#[derive(Debug, PartialEq, Eq)]
enum Way {
    /// Root or the service user: the command changes the flow's state.
    Direct,
    /// An approver, who may not write the state: the command leaves a reply
    /// in the Judge's inbox (the approver's own file), which the daemon
    /// carries out.
    ByReply,
}

/// Refuse (exit 77) a caller who may not answer a cycle: only root, the
/// service user (the state root's owner) and the flow's approvers may
/// (`crate::flow::authority`); `--by` is a label, not an identity.
fn may_answer(ctx: &Context, settings: &FlowSettings, verb: &str, cycle: &str) -> Result<Way> {
    let me = UnixUser::current();
    let service = UnixUser::owner_of(&ctx.root.path).map_err(|e| {
        Error::NotPermitted(format!(
            "flow {verb}: cannot tell the service user (the owner of the state root {}): {e}",
            ctx.root.path.display()
        ))
    })?;
    if me.uid == 0 || me.uid == service.uid {
        return Ok(Way::Direct);
    }
    if authority::may_command(&me, service.uid, &settings.approvers) {
        return Ok(Way::ByReply);
    }
    let service_name = service.name.clone().unwrap_or_else(|| "agent-state".into());
    Err(Error::NotPermitted(format!(
        "flow {verb} {cycle}: you are {}; a cycle of flow {} is answered only by root, the service user {} (the owner of {}) or a user in the flow's approvers ({:?}). Run `sudo -u {service_name} agent-state flow {verb} {cycle} …`, or ask the operator to add your unix user to `approvers` in the flow's [[flow]] of the config",
        me.describe(),
        settings.name,
        service.describe(),
        ctx.root.path.display(),
        settings.approvers
    )))
}

/// An approver's answer: a reply naming the open cycle's question key, left
/// in the Judge's inbox as the approver's own file.
fn answer_by_reply(
    ctx: &Context,
    settings: &FlowSettings,
    cycle: &str,
    verb: &str,
    feedback: &str,
) -> Result<u8> {
    let state = flow::load(&flow::FlowDir::new(&ctx.root, &settings.name))?;
    let Some(c) = state.and_then(|s| s.current).filter(|c| c.id == cycle) else {
        return Err(Error::Usage(format!(
            "no open cycle {cycle:?}; `agent-state flow status` lists them"
        )));
    };
    let mut reference = flow::message_id(settings.name.as_str(), cycle, c.step, "answer");
    if !c.question_key.is_empty() {
        reference = format!("{reference}-{}", c.question_key);
    }
    let out = Outgoing {
        from: settings.human.clone(),
        kind: MessageType::Flag,
        priority: Priority::Normal,
        subject: format!("Re: {verb}"),
        body: feedback.trim().to_string(),
        source_ref: Some(reference),
        expires_at: None,
    };
    let message = inbox::deliver(&ctx.root.agent(&settings.judge), &out, ctx.now)?;
    eprintln!(
        "your answer ({verb}) is left as reply {} in {}'s inbox; the daemon carries it out (`agent-state flow status {}`)",
        message.id, settings.judge, settings.name
    );
    Ok(exit::OK)
}

/// A publish that failed under `flow approve`: its record appended to
/// `.daemon/errors.jsonl` (what `errors` and `status` read) and said here.
/// The CLI runs no on-error hook and sends no escalation: the person who
/// approved is reading this.
fn record_errors(ctx: &Context, applied: &Applied) {
    let path = crate::state::error_log::log_path(&ctx.root);
    for (record, _) in &applied.errors {
        let mut record = record.clone();
        record.stamp(ctx.now);
        eprintln!("{}: {}", record.code, display::clean(&record.message));
        if let Err(e) = crate::state::error_log::append_as(
            &ctx.root.store,
            &path,
            &record,
            ctx.config.hooks.format,
        ) {
            eprintln!("cannot append to {}: {e}", path.display());
        }
    }
}

fn print_lines(applied: &Applied) {
    for line in &applied.lines {
        eprintln!("{}", display::clean(line));
    }
}

#[derive(Serialize)]
struct Row<'a> {
    flow: &'a str,
    planner: &'a str,
    actor: &'a str,
    judge: &'a str,
    human: &'a str,
    max_insufficient: u32,
    state: Option<&'a FlowState>,
    /// The questions of the open cycle waiting in the human's mailbox
    /// (approve, blocked): what the human is asked, not only the status.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    questions: Vec<Question>,
}

/// A question to a flow's human, waiting in their inbox (its body is left
/// to `agent-state inbox show`).
#[derive(Serialize)]
struct Question {
    id: String,
    subject: String,
    created_at: String,
}

/// The questions of `state`'s open cycle still waiting in the human's inbox;
/// a file that cannot be read or is not a message is left out (the inbox
/// commands name it).
fn questions(ctx: &Context, f: &FlowSettings, state: Option<&FlowState>) -> Vec<Question> {
    let Some(c) = state.and_then(|s| s.current.as_ref()) else {
        return Vec::new();
    };
    if c.awaiting.is_some() {
        return Vec::new();
    }
    let inbox = ctx.root.agent(&f.human).inbox();
    flow::question_ids(f.name.as_str(), &c.id, c.step, &c.question_key)
        .into_iter()
        .filter_map(|id| {
            let path = inbox.join(format!("{id}.json"));
            let (bytes, _) = crate::fsx::read_limited(&path, inbox::MAX_MESSAGE_BYTES)
                .ok()
                .flatten()?;
            let m: inbox::Message = serde_json::from_slice(&bytes).ok()?;
            Some(Question {
                id: m.id,
                subject: m.subject,
                created_at: m.created_at.to_string(),
            })
        })
        .collect()
}

/// What `flow status --json` prints, as JSON (the web view's flows page
/// reads this).
pub fn status_json(ctx: &Context) -> Result<serde_json::Value> {
    let all = flow::status_of(&ctx.root, &ctx.config)?;
    let all: Vec<_> = all.iter().collect();
    // Strings, numbers and options: it always serializes.
    Ok(serde_json::to_value(rows(ctx, &all)).unwrap_or_default())
}

fn rows<'a>(ctx: &Context, all: &[&'a (FlowSettings, Option<FlowState>)]) -> Vec<Row<'a>> {
    all.iter()
        .map(|(f, s)| Row {
            questions: questions(ctx, f, s.as_ref()),
            flow: f.name.as_str(),
            planner: f.planner.as_str(),
            actor: f.actor.as_str(),
            judge: f.judge.as_str(),
            human: f.human.as_str(),
            max_insufficient: f.max_insufficient,
            state: s.as_ref(),
        })
        .collect()
}

fn status(ctx: &Context, only: Option<&str>, json: bool) -> Result<u8> {
    if let Some(name) = only {
        flow::settings(&ctx.config, name)?;
    }
    let all = flow::status_of(&ctx.root, &ctx.config)?;
    let all: Vec<_> = all
        .iter()
        .filter(|(f, _)| only.is_none_or(|n| f.name.as_str() == n))
        .collect();
    if json {
        print_json(&rows(ctx, &all))?;
        return Ok(exit::OK);
    }
    if all.is_empty() {
        println!("no flows configured (add a [[flow]] to the config)");
        return Ok(exit::OK);
    }
    println!(
        "{:<12} {:<16} {:<18} {:>4}  {:<22} {:>12}  GOAL",
        "FLOW", "CYCLE", "STATUS", "STEP", "AT WORK", "INSUFFICIENT"
    );
    for (f, s) in &all {
        let current = s.as_ref().and_then(|s| s.current.as_ref());
        match current {
            Some(c) => {
                let at_work = c
                    .awaiting
                    .as_ref()
                    .map(|w| format!("{} ({})", w.role.as_str(), w.agent))
                    .unwrap_or_else(|| format!("human ({})", f.human));
                println!(
                    "{:<12} {:<16} {:<18} {:>4}  {:<22} {:>12}  {}",
                    f.name.as_str(),
                    c.id,
                    c.status.as_str(),
                    c.step,
                    display::clean(&at_work),
                    format!("{}/{}", c.insufficient, f.max_insufficient),
                    display::clean(&flow::route::one_line(&c.goal, 60))
                );
                if let Some(r) = &c.reason {
                    println!("{:<12} {}", "", display::clean(r));
                }
                for q in questions(ctx, f, s.as_ref()) {
                    println!(
                        "{:<12} asks {}: {} (`agent-state inbox show {} {}`)",
                        "",
                        f.human,
                        display::clean(&q.subject),
                        f.human,
                        q.id
                    );
                }
            }
            None => {
                let last = s
                    .as_ref()
                    .and_then(|s| s.closed.last())
                    .map(|l| match &l.reason {
                        Some(r) => format!("last: {} {} — {}", l.id, l.outcome, display::clean(r)),
                        None => format!("last: {} {}", l.id, l.outcome),
                    })
                    .unwrap_or_else(|| "no cycle yet".into());
                println!(
                    "{:<12} {:<16} {:<18} {:>4}  {:<22} {:>12}  ({last}; `agent-state flow start {} --goal ...`)",
                    f.name.as_str(),
                    "-",
                    "idle",
                    "-",
                    "-",
                    "-",
                    f.name
                );
            }
        }
    }
    Ok(exit::OK)
}
