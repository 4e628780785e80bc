//! `agent-state task add|list|set`

use crate::cli::display::{Line, Style, say};
use clap::Subcommand;

use crate::cli::{Context, print_json, print_notes};
use crate::error::{Result, exit};
use crate::state::tasks::{self, NewTask, TaskFile, TaskPriority, TaskStatus, TaskType};

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Add a pending task; prints its id (task-001, task-002, …)
    Add(AddArgs),
    /// List an agent's tasks
    List(ListArgs),
    /// Change a task's status
    Set(SetArgs),
}

#[derive(clap::Args, Debug)]
pub struct AddArgs {
    /// The agent
    pub agent: String,
    /// What is to be done (one line)
    #[arg(long, value_name = "D")]
    pub description: String,
    /// research, extract, evaluate, follow-up or disconfirm
    #[arg(long = "type", default_value = "research", value_name = "T")]
    pub kind: TaskType,
    /// high, medium or low
    #[arg(long, default_value = "medium", value_name = "P")]
    pub priority: TaskPriority,
    /// Background the agent needs
    #[arg(long, value_name = "C")]
    pub context: Option<String>,
    /// The task or session this follows up on
    #[arg(long, value_name = "ID")]
    pub follow_up_from: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The agent
    pub agent: String,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct SetArgs {
    /// The agent
    pub agent: String,
    /// The task (task-001, …)
    pub id: String,
    /// pending, active, completed or dropped
    #[arg(long, value_name = "S")]
    pub status: TaskStatus,
    /// What came of it
    #[arg(long, value_name = "O")]
    pub outcome: Option<String>,
}

pub fn run(ctx: &Context, command: Command) -> Result<u8> {
    match command {
        Command::Add(a) => {
            let (_, dir) = ctx.working_agent(&a.agent)?;
            if a.description.trim().is_empty() {
                return Err(crate::error::Error::Usage(
                    "--description is empty; say what the task is".into(),
                ));
            }
            let lock = dir.lock()?;
            let mut notes = Vec::new();
            let task = tasks::add(
                &dir,
                &lock,
                NewTask {
                    kind: a.kind,
                    description: a.description,
                    priority: a.priority,
                    context: a.context,
                    follow_up_from: a.follow_up_from,
                    source_message: None,
                },
                ctx.now,
                &mut notes,
            )?;
            print_notes(&notes);
            say!("{}", task.id);
            Ok(exit::OK)
        }
        Command::List(a) => {
            let (_, dir) = ctx.working_agent(&a.agent)?;
            dir.require()?;
            let file: TaskFile = dir
                .read()?
                .unwrap_or_else(|| TaskFile::new(dir.name.as_str()));
            if a.json {
                return print_json(&file.tasks);
            }
            if file.tasks.is_empty() {
                say!("{}: no tasks", dir.name);
            }
            for t in &file.tasks {
                let outcome = t
                    .outcome
                    .as_ref()
                    .map(|o| format!(" → {o}"))
                    .unwrap_or_default();
                Line::new()
                    .cell(Style::Plain, &t.id, 9)
                    .text(" ")
                    .cell(Style::of(t.status.as_str()), t.status.as_str(), 9)
                    .text(" ")
                    .cell(Style::Plain, t.priority.as_str(), 6)
                    .text(" ")
                    .cell(Style::Plain, t.kind.as_str(), 10)
                    .text(" ")
                    .free(format!("{}{outcome}", t.description))
                    .print();
            }
            Ok(exit::OK)
        }
        Command::Set(a) => {
            let (_, dir) = ctx.working_agent(&a.agent)?;
            let lock = dir.lock()?;
            let mut notes = Vec::new();
            let task = tasks::update(&dir, &lock, &a.id, a.status, a.outcome, ctx.now, &mut notes)?;
            print_notes(&notes);
            say!("{} {}", task.id, task.status);
            Ok(exit::OK)
        }
    }
}
