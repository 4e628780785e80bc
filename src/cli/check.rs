//! `agent-state check [--repair]`

use crate::check;
use crate::cli::{Context, print_json};
use crate::error::{Result, exit};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Set corrupt files aside and rebuild them, recover abandoned sessions, reject malformed messages
    #[arg(long)]
    pub repair: bool,
    /// Print JSON instead of text (`findings`, `notes`, and `needs`: what the
    /// config names that the daemon will need, each with its `level`)
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Context, args: Args) -> Result<u8> {
    let report = check::check(
        &ctx.config,
        args.repair,
        ctx.now,
        crate::clock::FileClock::Real,
    )?;
    let code = if report.unrepaired() == 0 && report.config_errors() == 0 {
        exit::OK
    } else {
        exit::DATAERR
    };
    if args.json {
        print_json(&report)?;
        return Ok(code);
    }
    println!(
        "config {}: ok ({} agents)",
        ctx.config.source.display(),
        ctx.config.agents.len()
    );
    for w in &ctx.config.warnings {
        println!("WARNING  config: {}: {}", w.field, w.message);
    }
    for n in &report.needs {
        match n.level() {
            check::needs::Level::Error => println!("ERROR    {n}"),
            check::needs::Level::Warning => println!("WARNING  {n}"),
        }
    }
    for f in &report.findings {
        match &f.repaired {
            Some(done) => println!("REPAIRED {}: {}: {} — {done}", f.agent, f.file, f.problem),
            None => println!("PROBLEM  {}: {}: {}", f.agent, f.file, f.problem),
        }
    }
    for n in &report.notes {
        println!("note     {n}");
    }
    if report.config_errors() > 0 {
        println!(
            "{} config error(s): the daemon cannot work with them as they stand",
            report.config_errors()
        );
    }
    let problems = report.findings.len();
    match (problems, report.unrepaired()) {
        (0, _) if report.config_errors() > 0 => println!("no problems found in the state"),
        (0, _) => println!("no problems found"),
        (n, 0) => println!("{n} problem(s) found, all repaired"),
        (n, left) if args.repair => println!("{n} problem(s) found, {left} could not be repaired"),
        (n, _) => println!("{n} problem(s) found; run `agent-state check --repair` to mend them"),
    }
    Ok(code)
}
