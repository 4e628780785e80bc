//! `agent-state credential release NAME`: lift a credential's hold (a login
//! found dead, a usage limit, an admin's cap) once the operator has dealt
//! with it, without waiting for a check or a session to prove it.
//!
//! The request is a file in `.daemon/` ([`crate::daemon::release`]) that
//! the daemon carries out at once when this sends it SIGUSR1, or at its
//! next start when none runs. `.daemon/` is the service user's: only it and
//! root can ask.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cli::Context;
use crate::daemon::{files, release};
use crate::error::{Error, Result, exit};

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Lift the hold on credential NAME (its agents' held wakes go now), after logging in again or lifting a cap; run as the service user or root
    ///
    /// The running daemon carries it out at once (it is sent SIGUSR1), or,
    /// if none runs, when it starts. If the login is still dead, the
    /// credential's next check or session holds it again. A session of the
    /// credential that succeeds releases it too: `agent-state wake AGENT`
    /// tries one.
    Release(ReleaseArgs),
}

#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {
    /// The credential: "default", or a [credential.NAME] of the config
    pub name: String,
    /// How long to wait for the running daemon to carry it out
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
}

pub fn run(ctx: &Context, command: Command) -> Result<u8> {
    let Command::Release(args) = command;
    let result = release(ctx, &args);
    if let Err(e) = &result
        && crate::access::is_denied(e)
    {
        crate::cli::warn(format!(
            "releasing a credential is the operator's: run it as the service user that owns {} (e.g. `sudo -u agent-state agent-state credential release {}`) or as root",
            ctx.root.daemon_dir().display(),
            args.name
        ));
    }
    result
}

fn release(ctx: &Context, args: &ReleaseArgs) -> Result<u8> {
    let known = release::known(&ctx.config);
    if !known.contains(&args.name) {
        return Err(Error::Usage(format!(
            "no credential {:?} in the config: its credentials are {} (\"default\" is every agent's without `credential = \"NAME\"`)",
            args.name,
            known.join(", ")
        )));
    }
    let name = &args.name;
    let Some(hold) = release::saved_hold(&ctx.root, name)? else {
        println!("credential {name} is not held: nothing to release");
        return Ok(exit::OK);
    };
    // Refused to anyone but the service user and root (`.daemon/` is
    // theirs): main prints which directory refused and who may write it.
    let path = release::request(
        &ctx.root,
        name,
        &format!("asked at {} by uid {}", ctx.now, nix::unistd::getuid()),
    )?;
    if !files::daemon_running(&ctx.root) {
        println!(
            "credential {name}: no daemon is running on {}; its hold ({}) is lifted when the daemon starts",
            ctx.root.path.display(),
            hold.reason
        );
        return Ok(exit::OK);
    }
    let pid = files::read_heartbeat(&ctx.root)?
        .map(|h| h.pid as i32)
        .ok_or_else(|| {
            Error::Unavailable(format!(
                "the daemon on {} has written no daemon.json yet; the request ({}) is carried out when it has started",
                ctx.root.path.display(),
                path.display()
            ))
        })?;
    kill(Pid::from_raw(pid), Signal::SIGUSR1).map_err(|e| {
        Error::Unavailable(format!(
            "cannot signal the daemon (pid {pid}): {e}; the request ({}) is carried out at its next start or within 5 minutes",
            path.display()
        ))
    })?;
    let deadline = Instant::now() + args.wait;
    while crate::fsx::metadata(&path)?.is_some() {
        if Instant::now() >= deadline {
            return Err(Error::Unavailable(format!(
                "the daemon (pid {pid}) did not take the request within {}; it stays in {} and is carried out within 5 minutes or at the next start",
                humantime::format_duration(args.wait),
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "credential {name} released: its agents' held wakes go now (the hold was: {})",
        hold.reason
    );
    Ok(exit::OK)
}
