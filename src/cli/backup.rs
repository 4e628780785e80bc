//! `agent-state backup DEST.tar.zst` and `agent-state restore ARCHIVE
//! [--into ROOT] [--owner USER]` (`crate::backup`).

use std::path::PathBuf;

use crate::cli::Context;
use crate::cli::display::say;
use crate::error::{Result, exit};

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    /// Where the snapshot goes (a .tar.zst outside the state root)
    pub dest: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// A backup made by `agent-state backup`
    pub archive: PathBuf,
    /// The root to restore into: it must not exist or be an empty directory, not a link (default: the config's state root)
    #[arg(long)]
    pub into: Option<PathBuf>,
    /// As root: the service user the restored state goes to (default: the
    /// owner of the existing empty root, else `agent-state`)
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,
}

pub fn backup(ctx: &Context, args: BackupArgs) -> Result<u8> {
    let s = crate::backup::backup(&ctx.root, &args.dest)?;
    for skipped in &s.skipped {
        crate::cli::warn(format!("left out: {skipped}"));
    }
    say!(
        "{}: {} files and {} directories of {} ({} bytes before compression)",
        args.dest.display(),
        s.files,
        s.dirs,
        ctx.root.path.display(),
        s.bytes
    );
    Ok(exit::OK)
}

pub fn restore(ctx: &Context, args: RestoreArgs) -> Result<u8> {
    let into = args.into.clone().unwrap_or_else(|| ctx.root.path.clone());
    let opts = crate::backup::RestoreOptions {
        cap: ctx.config.health.restore_limit,
        margin: ctx.config.health.disk_pause,
        user: args.owner.clone(),
        group: ctx.config.group.clone(),
    };
    let s = crate::backup::restore(&args.archive, &into, &opts)?;
    say!(
        "{}: {} files and {} directories restored from {}",
        into.display(),
        s.files,
        s.dirs,
        args.archive.display()
    );
    // Checked as `check` would: the restored root with this config.
    let mut config = ctx.config.clone();
    config.state_root = into.clone();
    let report = crate::check::check(&config, false, ctx.now, crate::clock::FileClock::Real)?;
    for f in &report.findings {
        say!("PROBLEM  {}: {}: {}", f.agent, f.file, f.problem);
    }
    for n in &report.notes {
        say!("note     {n}");
    }
    if report.findings.is_empty() {
        say!("check: no problems found");
        Ok(exit::OK)
    } else {
        say!(
            "check: {} problem(s); `agent-state check --repair` mends them",
            report.findings.len()
        );
        Ok(exit::DATAERR)
    }
}
