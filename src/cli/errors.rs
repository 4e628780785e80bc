//! `agent-state errors`: the error log (`.daemon/errors.jsonl`), filtered,
//! or with `--catalogue` every error code with its severity, recovery and
//! escalation (the table of docs/errors.md).

use crate::cli::display::{Line, Style, say};
use std::time::Duration;

use crate::catalogue::{self, Severity};
use crate::cli::{Context, print_json};
use crate::clock::ago;
use crate::error::{Error, Result, exit};
use crate::state::error_log;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only this agent's errors
    #[arg(long)]
    pub agent: Option<String>,
    /// Only errors of this code, e.g. SESSION_TIMEOUT
    #[arg(long)]
    pub code: Option<String>,
    /// Only this severity or worse: low, medium, high, critical
    #[arg(long, value_name = "SEVERITY")]
    pub min_severity: Option<String>,
    /// How far back to look
    #[arg(long, default_value = "30d", value_parser = crate::clock::parse_duration, value_name = "DUR")]
    pub since: Duration,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
    /// Print the catalogue of error codes (Markdown) instead; needs no config
    #[arg(long)]
    pub catalogue: bool,
}

/// The catalogue needs no config or state root.
pub fn catalogue() -> u8 {
    print!("{}", catalogue::markdown_table());
    exit::OK
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    if args.catalogue {
        return Ok(catalogue());
    }
    if let Some(a) = &args.agent {
        ctx.config.agent_named(a)?;
    }
    if let Some(c) = &args.code
        && catalogue::Code::parse(c).is_none()
    {
        return Err(Error::Usage(format!(
            "--code {c}: not an error code; `agent-state errors --catalogue` lists them"
        )));
    }
    let min = match args.min_severity.as_deref() {
        None | Some("low") => Severity::Low,
        Some("medium") => Severity::Medium,
        Some("high") => Severity::High,
        Some("critical") => Severity::Critical,
        Some(other) => {
            return Err(Error::Usage(format!(
                "--min-severity {other}: use low, medium, high or critical"
            )));
        }
    };
    let path = error_log::log_path(&ctx.root);
    let records: Vec<catalogue::ErrorRecord> =
        error_log::read_since(&ctx.root.store, &path, ctx.now.minus(args.since))?
            .into_iter()
            .filter(|r| args.agent.is_none() || r.context.agent == args.agent)
            .filter(|r| args.code.as_ref().is_none_or(|c| &r.code == c))
            .filter(|r| r.severity >= min)
            .collect();
    if args.json {
        return print_json(&records);
    }
    if records.is_empty() {
        say!(
            "no errors in {} (the last {})",
            path.display(),
            crate::clock::length(args.since)
        );
        return Ok(exit::OK);
    }
    say!(
        "{} error(s) in {} (the last {}):",
        records.len(),
        path.display(),
        crate::clock::length(args.since)
    );
    for r in &records {
        let ctx_text = match (&r.context.agent, &r.context.session, r.context.attempt) {
            (Some(a), Some(s), Some(n)) => format!(" [{a} {s} attempt {n}]"),
            (Some(a), Some(s), None) => format!(" [{a} {s}]"),
            (Some(a), None, _) => format!(" [{a}]"),
            _ => String::new(),
        };
        Line::new()
            .styled(Style::Dim, format!("{} ({})", r.ts, ago(&r.ts, &ctx.now)))
            .text(" ")
            .cell(Style::of(r.severity.as_str()), r.severity.as_str(), 8)
            .text(" ")
            .text(format!("{}{ctx_text}", r.code))
            .styled(Style::Warn, if r.escalated { " escalated" } else { "" })
            .text(" ")
            .free(&r.message)
            .print();
        // The details in full, even on a terminal: they are what to read.
        if let Some(d) = &r.details {
            say!("    {d}");
        }
    }
    Ok(exit::OK)
}
